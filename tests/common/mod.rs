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

use std::sync::Arc;

use kpc::Warning;
use parking_lot::Mutex;

/// A warning callback (for `on_warning` or `kpc::set_warning_callback`) that records every
/// warning it receives, and the record.
pub fn warning_recorder() -> (
    Arc<Mutex<Vec<Warning>>>,
    impl Fn(&Warning) + Send + Sync + 'static,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    (seen, move |w: &Warning| s.lock().push(w.clone()))
}

/// Polls `done` until it holds, failing the test after a minute (a deadline for a hung peer, not a
/// timing assumption: the condition is what the test waits for).
pub fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        std::thread::yield_now();
    }
}

/// A kernel request with these spec constants and build options (tests that hold them apart).
pub fn req(
    image: &kpc::DeviceImage,
    entry: &str,
    spec: &kpc::SpecConstants,
    options: &kpc::BuildOptions,
) -> kpc::KernelRequest {
    kpc::KernelRequest::new(image, entry)
        .spec(spec.clone())
        .options(options.clone())
}
