//! `kpc attention --layer mha --check` on each backend, with and without cross-attention: the run
//! passes the float64 reference check of the whole layer, lists the projection kernels with the cache
//! layer that served them, and splits the step time into projections and attention.

// The support code all of the workspace's integration tests share.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::disk::TempDir;
use common::drivers::{opencl_device, vulkan_device};

fn mha_check(backend: &str, cross: bool) {
    let cache = TempDir::new(&format!("mha-cli-{backend}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpc"));
    cmd.args([
        "attention",
        "--layer",
        "mha",
        "--check",
        "--backend",
        backend,
    ])
    .args(["--heads", "4", "--kv-heads", "2", "--head-dim", "16"])
    .args(["--prompt", "10", "--steps", "3"])
    .env("KPC_CACHE_DIR", cache.path())
    .env("KPC_CACHE_PERSISTENT", "1")
    .env_remove("KPC_DEVICE")
    .env_remove("KPC_CACHE_REMOTE_KEY");
    if cross {
        cmd.args(["--cross", "6"]);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("check:") && text.contains(": ok"), "{text}");
    for kernel in ["mha_gemm", "mha_gemv", "attn_append"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(kernel)),
            "{kernel}: {text}"
        );
    }
    assert!(
        text.contains("self: ") && text.contains("projections"),
        "{text}"
    );
    assert_eq!(text.contains("cross: "), cross, "{text}");
}

#[test]
fn vulkan_mha_layer_checks() {
    if vulkan_device("vulkan_mha_cli").is_some() {
        mha_check("vulkan", false);
        mha_check("vulkan", true);
    }
}

#[test]
fn opencl_mha_layer_checks() {
    if opencl_device("opencl_mha_cli").is_some() {
        mha_check("opencl", false);
        mha_check("opencl", true);
    }
}
