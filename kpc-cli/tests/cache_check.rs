//! `kpc cache check PATH` (preflight) on each backend, as a user runs it: a cache directory and a
//! bundle made on this machine serve every kernel of the app that recorded them (exit 0); the same
//! entries keyed for another driver version (what a driver update looks like) are each reported with
//! the field that differs and the app's coverage drops to 0 (exit 1); a damaged entry is reported as
//! such; `--json` carries the same.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::Path;
use std::process::Output;

use common::cli::attention_check;
use common::disk::TempDir;
use kpc::Config;
use kpc::Digest;
use kpc::StoreKey;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};

const APP: &str = "check-cli";

fn cache_at(dir: &Path) -> PersistentCache {
    PersistentCache::new(DiskCacheSettings::from_config_at(&Config::default(), dir))
}

/// `kpc cache check ARGS` for `backend`'s first device, with the configured cache at `home`.
fn check(home: &Path, backend: &str, args: &[&str]) -> Output {
    common::cli::kpc_command()
        .args(["cache", "check"])
        .args(args)
        .args(["--device", &format!("{backend}:0")])
        .env("KPC_CACHE_DIR", home)
        .env_remove("KPC_CACHE_REMOTE_KEY")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Copies every entry of `from` into `to` keyed for the same device with its driver version
/// replaced by `driver`; returns this device's driver version as the keys held it.
fn rekey_for_another_driver(from: &Path, to: &Path, driver: &str) -> String {
    let (src, dst) = (cache_at(from), cache_at(to));
    let mut current = String::new();
    for e in src.entries().unwrap() {
        let key = e.record.unwrap().to_key().unwrap();
        let hit = src.get_read_only(&key).unwrap();
        let mut desc = String::new();
        for line in key.device().lines() {
            match line.strip_prefix("driver_version=") {
                Some(v) => {
                    current = v.to_owned();
                    desc.push_str(&format!("driver_version={driver}\n"));
                }
                None => desc.push_str(&format!("{line}\n")),
            }
        }
        let old = StoreKey::new(
            &desc,
            Digest::of(desc.as_bytes()),
            key.image_digest(),
            key.image_len(),
            key.spec(),
            key.options(),
        )
        .with_label(key.label());
        dst.put(&old, hit.bytes(), hit.build_time());
    }
    assert!(!current.is_empty(), "no driver_version field in the keys");
    current
}

fn preflight(backend: &str) {
    let home = TempDir::new(&format!("check-cli-{backend}"));
    attention_check(backend, home.path(), 2, |c| {
        c.env("KPC_CACHE_PREFETCH", APP);
    });
    let home_s = home.path().display().to_string();

    // The directory that recorded the app serves all of it.
    let o = check(home.path(), backend, &[&home_s, "--app", APP]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains(&format!(
            "kpc cache check: cache directory {home_s} for {backend}:0"
        )),
        "{t}"
    );
    let served = t.lines().filter(|l| l.starts_with("  served ")).count();
    assert!(served >= 2, "{t}");
    assert!(
        t.contains(&format!(
            "app {APP}: {served} of {served} kernels would be served"
        )),
        "{t}"
    );
    assert!(
        t.contains("ok: every requested kernel would be served"),
        "{t}"
    );

    // So does a bundle of it.
    let bundle = home.join("app.kpcb").display().to_string();
    let export = common::cli::kpc_command()
        .args(["cache", "export", &bundle])
        .env("KPC_CACHE_DIR", home.path())
        .env_remove("KPC_CACHE_REMOTE_KEY")
        .output()
        .unwrap();
    assert!(export.status.success(), "{}", text(&export));
    let o = check(home.path(), backend, &[&bundle, "--app", APP]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("bundle {bundle} (unsigned)")),
        "{}",
        text(&o)
    );

    // Entries built by another driver version: each named with the field, nothing served.
    let shipped = TempDir::new(&format!("check-cli-old-{backend}"));
    let current = rekey_for_another_driver(home.path(), shipped.path(), "OLD-DRIVER");
    let shipped_s = shipped.path().display().to_string();
    let o = check(home.path(), backend, &[&shipped_s, "--app", APP]);
    let t = text(&o);
    println!("{t}");
    assert_eq!(o.status.code(), Some(1), "{t}");
    let field = format!("driver_version OLD-DRIVER → {current}");
    let entries: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("  other-device "))
        .collect();
    assert!(!entries.is_empty(), "{t}");
    assert!(
        entries.iter().all(|l| l.ends_with(&format!(": {field}"))),
        "{t}"
    );
    assert!(
        t.contains(&format!("app {APP}: 0 of {served} kernels would be served")),
        "{t}"
    );
    let missing: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("  not served "))
        .collect();
    assert_eq!(missing.len(), served, "{t}");
    assert!(
        missing
            .iter()
            .all(|l| l.ends_with(&format!(": device-changed: {field}"))),
        "{t}"
    );
    assert!(
        t.contains("NOT OK: some requested kernels would not be served"),
        "{t}"
    );

    // Without --app every entry is requested: the same verdict. With --json, the same facts.
    let o = check(home.path(), backend, &[&shipped_s, "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["usable"], 0);
    let first = &v["entries"][0];
    assert_eq!(first["verdict"], "other-device");
    assert_eq!(first["diffs"][0]["field"], "driver_version");
    assert_eq!(first["diffs"][0]["old"], "OLD-DRIVER");
    assert_eq!(first["diffs"][0]["new"], current.as_str());

    // A damaged binary in the directory.
    let bin = common::disk::files_named(home.path(), ".bin")[0].clone();
    common::disk::flip_byte(&bin, -1);
    let o = check(home.path(), backend, &[&home_s]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.lines().any(|l| l.starts_with("  damaged ")
            && l.ends_with(": its binary does not verify (corrupt or incomplete)")),
        "{t}"
    );
}

crate::backend_tests! {
    fn cache_check_preflight(backend, test) {
        if crate::common::drivers::device(backend, test).is_some() {
            preflight(&backend.to_string());
        }
    }
}

#[test]
fn a_file_that_is_not_a_bundle_and_a_bad_app_name_are_errors() {
    let dir = TempDir::new("check-cli-bad");
    let junk = dir.join("junk.kpcb");
    std::fs::write(&junk, b"not a bundle at all").unwrap();
    let o = common::cli::kpc_command()
        .args([
            "cache",
            "check",
            &junk.display().to_string(),
            "--device",
            "any:0",
        ])
        .env("KPC_CACHE_DIR", dir.path())
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("is not a usable kpc bundle: it does not start with a kpc bundle header"),
        "{t}"
    );
    let o = common::cli::kpc_command()
        .args([
            "cache",
            "check",
            &dir.path().display().to_string(),
            "--app",
            "../x",
        ])
        .args(["--device", "any:0"])
        .env("KPC_CACHE_DIR", dir.path())
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("--app \"../x\": expected 1 to 64 letters"),
        "{t}"
    );
}
