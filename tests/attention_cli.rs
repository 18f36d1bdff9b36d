//! `kpc attention --check` on each backend: the run passes the reference check, the first run builds
//! the kernels and a second process loads them from the disk cache.

mod common;

use std::process::Command;

use common::disk::TempDir;
use common::drivers::{opencl_device, vulkan_device};

fn run(backend: &str, cache: &TempDir) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kpc"))
        .args([
            "attention",
            "--backend",
            backend,
            "--check",
            "--prompt",
            "40",
        ])
        .args(["--steps", "8", "--heads", "4", "--kv-heads", "2"])
        .env("KPC_CACHE_DIR", cache.path())
        .env("KPC_CACHE_PERSISTENT", "1")
        .env_remove("KPC_DEVICE")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("check:") && text.contains(": ok"), "{text}");
    text
}

fn kernel_sources(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.trim_start().starts_with("attn_"))
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect()
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

#[test]
fn vulkan_attention_checks_then_loads_from_disk() {
    if vulkan_device("vulkan_attention_checks_then_loads_from_disk").is_some() {
        built_then_disk("vulkan");
    }
}

#[test]
fn opencl_attention_checks_then_loads_from_disk() {
    if opencl_device("opencl_attention_checks_then_loads_from_disk").is_some() {
        built_then_disk("opencl");
    }
}
