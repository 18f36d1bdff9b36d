//! `kpc cache prebuild` on each backend, as a user runs it: after `kpc cache clear` (entries gone,
//! the warm-start manifest kept), prebuild builds every kernel the app's manifest names, a second
//! prebuild finds them all present, and a sealed `kpc attention` run then builds nothing.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::Path;
use std::process::Output;

use common::cli::{attention_check, kernel_sources};
use common::disk::TempDir;

const APP: &str = "prebuild-cli";

fn kpc(home: &Path, args: &[&str]) -> Output {
    common::cli::kpc_command()
        .args(args)
        .env("KPC_CACHE_DIR", home)
        .env_remove("KPC_CACHE_PREFETCH")
        .env_remove("KPC_CACHE_REMOTE")
        .env_remove("KPC_CACHE_SEAL")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    let s = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{s}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    s
}

fn prebuild_then_sealed(backend: &str) {
    let home = TempDir::new(&format!("prebuild-cli-{backend}"));
    let first = attention_check(backend, home.path(), 2, |c| {
        c.env("KPC_CACHE_PREFETCH", APP);
    });
    let n = kernel_sources(&first).len();
    stdout(&kpc(home.path(), &["cache", "clear"]));
    let dev = format!("{backend}:0");
    let args = ["cache", "prebuild", "--app", APP, "--device", &dev];
    let out = stdout(&kpc(home.path(), &args));
    let line = out.lines().nth(1).unwrap_or_default().to_owned();
    let built: usize = line
        .strip_prefix("built ")
        .and_then(|r| r.split(',').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(built >= n, "{out}");
    assert!(line.contains(", already present 0, failed 0, in "), "{out}");
    let again = stdout(&kpc(home.path(), &args));
    assert!(
        again.contains(&format!("built 0, already present {built}, failed 0")),
        "{again}"
    );
    let sealed = attention_check(backend, home.path(), 2, |c| {
        c.env("KPC_CACHE_PREFETCH", APP)
            .env("KPC_CACHE_SEAL", "error");
    });
    assert!(
        kernel_sources(&sealed).iter().all(|s| *s == "memory"),
        "{sealed}"
    );
    assert!(
        sealed.contains("sealed (error): 0 builds after sealing, 0 refused"),
        "{sealed}"
    );
}

crate::backend_tests! {
    fn prebuild_after_clear_then_sealed_run(backend, test) {
        if crate::common::drivers::device(backend, test).is_some() {
            prebuild_then_sealed(&backend.to_string());
        }
    }
}

#[test]
fn prebuild_without_an_app_or_a_manifest_says_what_to_do() {
    let home = TempDir::new("prebuild-cli-none");
    let o = kpc(home.path(), &["cache", "prebuild", "--device", "any:0"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no application: give --app NAME"), "{err}");
    let o = kpc(
        home.path(),
        &[
            "cache",
            "prebuild",
            "--app",
            "nothing-here",
            "--device",
            "any:0",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--app nothing-here: no warm-start manifest"),
        "{err}"
    );
}
