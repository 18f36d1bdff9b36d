//! Test support shared by the integration tests: a counting fake backend, and the gate and helpers
//! for tests that need a real driver.
#![allow(dead_code)]

pub mod drivers;
pub mod fake_backend;
