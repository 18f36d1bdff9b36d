//! Test support shared by the integration tests: a counting fake backend.
#![allow(dead_code)]

pub mod fake_backend;
