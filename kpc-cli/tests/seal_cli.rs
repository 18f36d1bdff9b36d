//! `kpc attention` with `KPC_CACHE_SEAL` on each backend, as a user runs it: after a first run
//! remembered its kernels (`KPC_CACHE_PREFETCH`), a sealed run waits for its warm start and serves
//! them all from memory; a shape that needs other kernel variants is refused (`error`, exit status
//! 1, the kernel and the spec constant that differs named) or built with one warning line per
//! kernel (`warn`). A malformed value is a configuration error naming the variable.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::cli::{attention_check, kernel_sources};
use common::disk::TempDir;

const APP: &str = "seal-cli";

/// `kpc attention --check` at head dim 32 (the first run used the default) with `seal`, returning
/// the whole output, whatever the exit status.
fn other_shape(backend: &str, cache: &Path, seal: &str) -> Output {
    common::cli::kpc_command()
        .args([
            "attention",
            "--backend",
            backend,
            "--check",
            "--prompt",
            "40",
        ])
        .args([
            "--steps",
            "4",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "32",
        ])
        .env("KPC_CACHE_DIR", cache)
        .env("KPC_CACHE_PERSISTENT", "1")
        .env("KPC_CACHE_PREFETCH", APP)
        .env("KPC_CACHE_SEAL", seal)
        .env_remove("KPC_DEVICE")
        .env_remove("KPC_CACHE_REMOTE")
        .env_remove("KPC_CACHE_TRACE")
        .output()
        .unwrap()
}

fn sealed_runs(backend: &str) {
    let cache = TempDir::new(&format!("seal-cli-{backend}"));
    let with = |vars: &'static [(&'static str, &'static str)]| {
        move |c: &mut Command| {
            c.env("KPC_CACHE_PREFETCH", APP)
                .env_remove("KPC_CACHE_REMOTE");
            for (k, v) in vars {
                c.env(k, v);
            }
        }
    };
    let first = attention_check(backend, cache.path(), 4, with(&[]));
    assert!(
        kernel_sources(&first).iter().all(|s| *s == "built"),
        "{first}"
    );
    assert!(!first.contains("sealed"), "{first}");

    let sealed = attention_check(
        backend,
        cache.path(),
        4,
        with(&[("KPC_CACHE_SEAL", "error")]),
    );
    let sources = kernel_sources(&sealed);
    assert!(
        !sources.is_empty() && sources.iter().all(|s| *s == "memory"),
        "{sealed}"
    );
    let n = sealed
        .lines()
        .find_map(|l| l.strip_prefix("sealed (error) after warm start: "))
        .unwrap_or_else(|| panic!("no warm-start line:\n{sealed}"));
    let (loaded, rest) = n.split_once(" of ").unwrap();
    assert!(
        rest.starts_with(&format!("{loaded} remembered kernels loaded")),
        "{n}"
    );
    assert!(
        sealed.contains("sealed (error): 0 builds after sealing, 0 refused"),
        "{sealed}"
    );

    let refused = other_shape(backend, cache.path(), "error");
    let (out, err) = (
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr),
    );
    assert_eq!(refused.status.code(), Some(1), "{out}\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("kpc: sealed: attn_"))
        .unwrap_or_else(|| panic!("no sealed error:\n{err}"));
    assert!(
        line.contains(
            "is not cached and this context does not build after sealing (spec-changed: "
        ) && line.contains(" → "),
        "{line}"
    );
    assert!(
        out.contains("sealed (error): 0 builds after sealing, 1 refused"),
        "{out}"
    );

    let warned = other_shape(backend, cache.path(), "warn");
    let (out, err) = (
        String::from_utf8_lossy(&warned.stdout),
        String::from_utf8_lossy(&warned.stderr),
    );
    assert!(warned.status.success(), "{out}\n{err}");
    let built = kernel_sources(&out)
        .iter()
        .filter(|s| **s == "built")
        .count();
    assert!(built >= 1, "{out}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("kpc::seal: sealed context built attn_"))
        .collect();
    assert_eq!(lines.len(), built, "one line per build:\n{err}");
    // The decode kernel exists at head dim 64 (the spec constants differ); the small shape's prefill
    // kernel was never built at all.
    assert!(
        lines
            .iter()
            .all(|l| l.contains(" ms: spec-changed: ") || l.contains(" ms: new-key: ")),
        "{err}"
    );
    assert!(
        lines.iter().any(|l| l.contains("spec constant 3: 64 → 32")),
        "{err}"
    );
    assert!(
        out.contains(&format!(
            "sealed (warn): {built} builds after sealing, 0 refused"
        )),
        "{out}"
    );
}

crate::backend_tests! {
    fn attention_sealed_after_warm_start(backend, test) {
        if crate::common::drivers::device(backend, test).is_some() {
            sealed_runs(&backend.to_string());
        }
    }
}

#[test]
fn a_malformed_seal_value_is_a_configuration_error() {
    let o = common::cli::kpc_command()
        .arg("status")
        .env("KPC_CACHE_SEAL", "strict")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("kpc: KPC_CACHE_SEAL=\"strict\" is not valid: expected off")
            && err.contains("warn")
            && err.contains("error"),
        "{err}"
    );
}
