//! `kpc attention --check` on each backend: the run passes the reference check, the first run builds
//! the kernels and a second process loads them from the disk cache.

// The support code all of the workspace's integration tests share.
use crate::common;

use common::cli::{attention_check, kernel_sources};
use common::disk::TempDir;

fn run(backend: &str, cache: &TempDir) -> String {
    attention_check(backend, cache.path(), 8, |_| {})
}

fn built_then_disk(backend: &str) {
    let cache = TempDir::new(&format!("attention-cli-{backend}"));
    // Prefill and decode at least; the generic decode path adds an append and a reduce.
    let first = run(backend, &cache);
    let built = kernel_sources(&first);
    assert!(
        built.len() >= 2 && built.iter().all(|s| *s == "built"),
        "{first}"
    );
    let second = run(backend, &cache);
    let loaded = kernel_sources(&second);
    assert!(
        loaded.len() == built.len() && loaded.iter().all(|s| *s == "disk"),
        "{second}"
    );
}

crate::backend_tests! {
    fn attention_checks_then_loads_from_disk(backend, test) {
        if crate::common::drivers::device(backend, test).is_some() {
            built_then_disk(&backend.to_string());
        }
    }
}
