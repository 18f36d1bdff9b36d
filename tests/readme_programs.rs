//! README "Embedding kpc": its programs are examples/embed.rs, examples/embed_blob.rs and
//! examples/embed_vulkan.rs. This test checks that the README shows the first two verbatim, and runs
//! each on every backend with a driver (each in a child process of this test binary, with
//! `KPC_DEVICE` set as a user would set it, and a disk cache in a temporary directory).

mod common;

use common::disk::{TempDir, child, child_role};
use common::drivers::{opencl_device, vulkan_device};

mod embed {
    include!("../examples/embed.rs");
    pub fn run() -> kpc::Result<()> {
        main()
    }
}
mod embed_blob {
    include!("../examples/embed_blob.rs");
    pub fn run() -> kpc::Result<()> {
        main()
    }
}
mod embed_vulkan {
    include!("../examples/embed_vulkan.rs");
    pub fn run() -> Result<(), Box<dyn std::error::Error>> {
        main()
    }
}

const README: &str = include_str!("../README.md");

/// The program's text from its first `use` line to the end: what the README must show.
fn program(source: &str) -> &str {
    &source[source.find("\nuse ").expect("a program with a use line") + 1..]
}

#[test]
fn the_readme_shows_the_programs_the_tests_run() {
    for (name, source) in [
        ("examples/embed.rs", include_str!("../examples/embed.rs")),
        (
            "examples/embed_blob.rs",
            include_str!("../examples/embed_blob.rs"),
        ),
    ] {
        let body = program(source);
        assert!(
            README.contains(&format!("```rust\n{body}```")),
            "README.md does not show {name} verbatim (from its first `use` line to its end)"
        );
    }
    assert!(README.contains("examples/embed_vulkan.rs"));
}

/// Runs `main` of one example in a child process on `device` (`vulkan:0`, `opencl:0`, ...), with a
/// disk cache under a temporary directory; returns its standard output.
fn run_child(test: &str, role: &str, device: &str) -> String {
    let dir = TempDir::new("readme");
    let out = child(test, role)
        .env("KPC_DEVICE", device)
        .env("KPC_CACHE_DIR", dir.path())
        .env_remove("KPC_CACHE_REMOTE")
        .env_remove("KPC_CACHE_PREFETCH")
        .output()
        .expect("start the child");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{role} on {device} failed: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The devices to run on: `vulkan:i` and `opencl:i` where a driver is installed (skips reported).
fn devices(test: &str) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(d) = vulkan_device(test) {
        v.push(format!("vulkan:{}", d.index));
    }
    if let Some(d) = opencl_device(test) {
        v.push(format!("opencl:{}", d.index));
    }
    v
}

#[test]
fn embed_runs_on_each_backend() {
    const TEST: &str = "embed_runs_on_each_backend";
    if let Some(role) = child_role() {
        assert_eq!(role, "embed");
        embed::run().expect("examples/embed.rs");
        return;
    }
    for device in devices(TEST) {
        let out = run_child(TEST, "embed", &device);
        assert!(out.contains("saxpy on "), "{device}: {out}");
        assert!(out.contains("from built"), "a fresh cache builds: {out}");
    }
}

#[test]
fn embed_blob_runs_on_each_backend() {
    const TEST: &str = "embed_blob_runs_on_each_backend";
    if let Some(role) = child_role() {
        assert_eq!(role, "embed_blob");
        embed_blob::run().expect("examples/embed_blob.rs");
        return;
    }
    for device in devices(TEST) {
        let out = run_child(TEST, "embed_blob", &device);
        assert!(out.contains("saxpy from blob"), "{device}: {out}");
    }
}

#[test]
fn embed_vulkan_runs() {
    const TEST: &str = "embed_vulkan_runs";
    if let Some(role) = child_role() {
        assert_eq!(role, "embed_vulkan");
        embed_vulkan::run().expect("examples/embed_vulkan.rs");
        return;
    }
    if let Some(d) = vulkan_device(TEST) {
        run_child(TEST, "embed_vulkan", &format!("vulkan:{}", d.index));
    }
}
