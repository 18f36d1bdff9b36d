//! Running the `kpc` command as a user runs it: `kpc attention --check` with the disk cache at a given
//! directory, and the cache source of each attention kernel it reports.

use std::path::Path;
use std::process::Command;

/// `kpc attention --backend BACKEND --check` on a small shape (prompt 40, `steps` decode steps, 4 query
/// and 2 KV heads) with its disk cache at `cache` and no device selector or remote key from the test's
/// environment; `configure` adds what the test needs. Asserts that it succeeded and passed the reference
/// check; returns its stdout.
pub fn attention_check(
    backend: &str,
    cache: &Path,
    steps: u32,
    configure: impl FnOnce(&mut Command),
) -> String {
    let mut cmd = kpc_command();
    cmd.args([
        "attention",
        "--backend",
        backend,
        "--check",
        "--prompt",
        "40",
    ])
    .args([
        "--steps",
        &steps.to_string(),
        "--heads",
        "4",
        "--kv-heads",
        "2",
    ])
    .env("KPC_CACHE_DIR", cache)
    .env("KPC_CACHE_PERSISTENT", "1")
    .env_remove("KPC_DEVICE")
    .env_remove("KPC_CACHE_REMOTE_KEY");
    configure(&mut cmd);
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("check:") && text.contains(": ok"), "{text}");
    text
}

/// The source (`built`, `disk`, `remote`, ...) of each attention kernel line of a `kpc attention` run.
pub fn kernel_sources(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.trim_start().starts_with("attn_"))
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect()
}

/// The `kpc` command, isolated the one way every CLI test isolates it: no `KPC_*` variable of the
/// test's own environment reaches it (a developer's `KPC_DEVICE` or remote must not change a test),
/// except `KPC_VULKAN_VALIDATION`, so that CI's validation layer watches the command too. The case then
/// sets what it tests.
pub fn kpc_command() -> Command {
    let mut c = Command::new(kpc_bin());
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("KPC_") && name != "KPC_VULKAN_VALIDATION" {
            c.env_remove(&*name);
        }
    }
    c
}

/// The `kpc` binary cargo built for this test run: only the CLI package's tests (kpc-cli/tests) have
/// one, so a test elsewhere that reaches for it is a bug in where that test lives.
pub fn kpc_bin() -> &'static str {
    match option_env!("CARGO_BIN_EXE_kpc") {
        Some(p) => p,
        None => panic!(
            "the kpc binary is built for kpc-cli's tests only; move this test to kpc-cli/tests"
        ),
    }
}
