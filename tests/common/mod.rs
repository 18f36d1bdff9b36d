//! Test support shared by the integration tests: a counting fake backend, the gate and helpers for
//! tests that need a real driver, and real-file helpers for the disk cache tests.
#![allow(dead_code)]

pub mod cli;
pub mod disk;
pub mod drivers;
pub mod fake_backend;
pub mod redis;
pub mod s3;
pub mod shipped;
pub mod validation;
pub mod vk_counting;
pub mod vk_device;
pub mod vk_engine;
