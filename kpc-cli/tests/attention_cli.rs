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

/// `kpc attention --lazy`: under `KPC_CACHE_SEAL=generic` every call runs on attn_generic and
/// passes the check; unsealed on a cold cache, the first requests are served the fallback (each
/// queues its specialized build) and the run passes the check whichever kernels it ran on.
fn lazy_runs(backend: &str) {
    let sealed = TempDir::new(&format!("attention-cli-lazy-sealed-{backend}"));
    let out = attention_check(backend, sealed.path(), 4, |c| {
        c.arg("--lazy").env("KPC_CACHE_SEAL", "generic");
    });
    assert!(
        out.contains("on attn_generic, 0 on the specialized kernels, 0 of 2 paths swapped"),
        "{out}"
    );
    assert!(
        out.contains(
            "under the generic seal), 0 specialized kernels swapped in, 0 background builds"
        ),
        "{out}"
    );
    let cold = TempDir::new(&format!("attention-cli-lazy-{backend}"));
    let out = attention_check(backend, cold.path(), 4, |c| {
        c.arg("--lazy").env_remove("KPC_CACHE_SEAL");
    });
    assert!(
        out.contains("lazy:") && out.contains("generic fallbacks: served"),
        "{out}"
    );
}

crate::backend_tests! {
    fn attention_lazy_answers_through_the_generic_kernel(backend, test) {
        if crate::common::drivers::device(backend, test).is_some() {
            lazy_runs(&backend.to_string());
        }
    }
}
