//! `kpc cache path|stats|ls|verify|prune|clear`, run as the real binary against a real cache directory.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, SystemTime};

use common::disk::*;
use filetime::FileTime;
use kpc::Digest;
use kpc::StoreKey;
use serde_json::Value;

fn kpc(root: Option<&Path>, args: &[&str]) -> Output {
    let mut c = common::cli::kpc_command();
    c.env_clear().args(args);
    if let Some(r) = root {
        c.env("KPC_CACHE_DIR", r);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", text(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(o)))
}

/// Two devices: three entries on a Vulkan one, one on an OpenCL one.
fn populate(root: &Path) {
    let c = cache(root);
    for i in 0..3 {
        c.put(&key(i), &payload(i, 2000), Duration::from_millis(25));
    }
    let cl = "backend=opencl\nkpc_format=1\ndevice_name=pthread-cpu\n";
    let k = StoreKey::new(
        cl,
        Digest::of(cl.as_bytes()),
        Digest::of(b"cl"),
        999,
        b"",
        "-cl-fast-relaxed-math",
    )
    .with_label("decode.cl");
    c.put(&k, &payload(9, 500), Duration::ZERO);
}

#[test]
fn path_stats_and_ls() {
    let t = TempDir::new("cli");
    let root = t.join("cache");
    populate(&root);

    let o = kpc(Some(&root), &["cache", "path"]);
    assert!(o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        root.to_string_lossy()
    );

    let o = kpc(Some(&root), &["cache", "stats"]);
    let s = text(&o);
    assert!(o.status.success(), "{s}");
    assert!(
        s.contains("Fake Device 9000") && s.contains("pthread-cpu"),
        "{s}"
    );
    let v = json(&kpc(Some(&root), &["cache", "stats", "--json"]));
    assert_eq!(v["entries"], 4);
    assert_eq!(v["bytes"], entry_bytes(&root));
    assert_eq!(v["tracked_size"], entry_bytes(&root));
    let mut per: Vec<(String, u64)> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["backend"].as_str().unwrap().to_string(),
                d["entries"].as_u64().unwrap(),
            )
        })
        .collect();
    per.sort();
    assert_eq!(per, [("fake".to_string(), 3), ("opencl".to_string(), 1)]);

    let o = kpc(Some(&root), &["cache", "ls"]);
    let s = text(&o);
    assert!(o.status.success(), "{s}");
    let rows: Vec<&str> = s.lines().filter(|l| l.contains(" ago)")).collect();
    assert_eq!(rows.len(), 4, "{s}");
    assert!(
        s.contains("image0.spv") && s.contains("decode.cl") && s.contains("-cl-fast-relaxed-math"),
        "{s}"
    );
    let v = json(&kpc(Some(&root), &["cache", "ls", "--json"]));
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let r = rows.iter().find(|r| r["image"] == "decode.cl").unwrap();
    assert_eq!(
        (r["options"].as_str(), r["image_len"].as_u64()),
        (Some("-cl-fast-relaxed-math"), Some(999))
    );
    assert!(
        rows.iter()
            .all(|r| r["last_access_unix"].as_u64().unwrap() > 1_600_000_000)
    );
}

#[test]
fn verify_finds_a_byte_flipped_by_hand_and_fix_quarantines_it() {
    let t = TempDir::new("cli");
    let root = t.join("cache");
    populate(&root);
    let o = kpc(Some(&root), &["cache", "verify"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("4 valid, 0 bad"));

    let bad = cache(&root).entry_dir(&key(1)).join("0.bin");
    flip_byte(&bad, 1000);
    let o = kpc(Some(&root), &["cache", "verify"]);
    let s = text(&o);
    assert_eq!(o.status.code(), Some(1), "{s}");
    assert!(
        s.contains(&*bad.to_string_lossy()) && s.contains("checksum mismatch"),
        "{s}"
    );
    assert!(bad.exists(), "plain verify changes nothing");
    let v: Value =
        serde_json::from_slice(&kpc(Some(&root), &["cache", "verify", "--json"]).stdout).unwrap();
    assert_eq!(v["bad"].as_array().unwrap().len(), 1);
    assert_eq!(v["valid"], 3);

    let o = kpc(Some(&root), &["cache", "verify", "--fix"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the run that found it still reports it"
    );
    assert!(text(&o).contains("[quarantined]"), "{}", text(&o));
    assert!(!bad.exists());
    let q: Vec<_> = files_under(&root.join("quarantine"));
    assert_eq!(q.len(), 2, "{q:?}");
    let o = kpc(Some(&root), &["cache", "verify"]);
    assert!(o.status.success(), "{}", text(&o));
    let v = json(&kpc(Some(&root), &["cache", "stats", "--json"]));
    assert_eq!(v["quarantine"]["files"], 2);
    assert_eq!(v["entries"], 3);
    assert_eq!(v["tracked_size"], entry_bytes(&root));
}

#[test]
fn prune_and_clear() {
    let t = TempDir::new("cli");
    let root = t.join("cache");
    populate(&root);
    let c = cache(&root);
    let old = FileTime::from_system_time(SystemTime::now() - Duration::from_secs(10 * 86_400));
    filetime::set_file_atime(c.entry_dir(&key(0)).join("0.bin"), old).unwrap();

    let v = json(&kpc(
        Some(&root),
        &["cache", "prune", "--older-than", "7d", "--json"],
    ));
    assert_eq!(v["removed"], 1);
    assert!(c.get(&key(0)).is_none());

    let o = kpc(Some(&root), &["cache", "prune"]);
    assert!(
        !o.status.success(),
        "prune needs --max-size or --older-than"
    );

    let v = json(&kpc(
        Some(&root),
        &["cache", "prune", "--max-size", "3K", "--json"],
    ));
    assert!(v["remaining_bytes"].as_u64().unwrap() <= 3072, "{v}");
    assert_eq!(v["remaining_bytes"], entry_bytes(&root));

    let left = c.entries().unwrap();
    assert!(!left.is_empty());
    flip_byte(&left[0].leaf.join(format!("{}.bin", left[0].slot)), -1);
    kpc(Some(&root), &["cache", "verify", "--fix"]);
    let o = kpc(Some(&root), &["cache", "clear"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(entry_bytes(&root), 0);
    assert!(!root.join("quarantine").exists());
    let v = json(&kpc(Some(&root), &["cache", "stats", "--json"]));
    assert_eq!(
        (v["entries"].as_u64(), v["tracked_size"].as_u64()),
        (Some(0), Some(0))
    );
}

#[test]
fn without_a_cache_directory() {
    // env_clear: no KPC_CACHE_DIR, XDG_CACHE_HOME or HOME.
    let o = kpc(None, &["cache", "stats"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("no cache directory"), "{}", text(&o));
    let o = kpc(None, &["status"]);
    assert!(o.status.success());
    assert!(text(&o).contains("disk cache: off"), "{}", text(&o));

    // KPC_CACHE_PERSISTENT=0: the cache is off for builds, but its directory can still be inspected.
    let t = TempDir::new("cli");
    populate(t.path());
    let o = common::cli::kpc_command()
        .env_clear()
        .env("KPC_CACHE_DIR", t.path())
        .env("KPC_CACHE_PERSISTENT", "0")
        .args(["cache", "ls", "--json"])
        .output()
        .unwrap();
    assert_eq!(json(&o).as_array().unwrap().len(), 4);
    assert!(text(&o).contains("disabled"));
}

#[test]
fn limits_for_shared_file_systems_are_shown_and_checked() {
    let t = TempDir::new("cli-limits");
    let run = |vars: &[(&str, &str)], args: &[&str]| {
        let mut c = common::cli::kpc_command();
        c.env_clear().env("KPC_CACHE_DIR", t.path());
        for (k, v) in vars {
            c.env(k, v);
        }
        c.args(args).output().unwrap()
    };
    let o = run(
        &[
            ("KPC_CACHE_MAX_ENTRIES", "5000"),
            ("KPC_CACHE_MIN_FREE", "0.5%"),
            ("KPC_CACHE_LOCK_DIR", "/run/kpc-locks"),
        ],
        &["status"],
    );
    let s = text(&o);
    assert!(o.status.success(), "{s}");
    assert!(
        s.contains("KPC_CACHE_MAX_ENTRIES               = 5000 entries"),
        "{s}"
    );
    assert!(
        s.contains("KPC_CACHE_MIN_FREE                  = 0.50% of the file system"),
        "{s}"
    );
    assert!(
        s.contains("KPC_CACHE_LOCK_DIR                  = /run/kpc-locks"),
        "{s}"
    );
    let o = run(&[], &["status"]);
    assert!(text(&o).contains("KPC_CACHE_MIN_FREE                  = 1% of the file system"));
    // Strict: the variable named, the value, what is accepted; exit status 2.
    for (var, bad, says) in [
        ("KPC_CACHE_MAX_ENTRIES", "5K", "whole number"),
        ("KPC_CACHE_MIN_FREE", "60%", "percentage"),
        ("KPC_CACHE_LOCK_DIR", "relative/locks", "absolute"),
    ] {
        let o = run(&[(var, bad)], &["status"]);
        let s = text(&o);
        assert_eq!(o.status.code(), Some(2), "{var}: {s}");
        assert!(
            s.contains(var) && s.contains(bad) && s.contains(says),
            "{s}"
        );
    }
    // `cache stats` shows the entry limit.
    populate(t.path());
    let o = run(
        &[("KPC_CACHE_MAX_ENTRIES", "100")],
        &["cache", "stats", "--json"],
    );
    let v = json(&o);
    assert_eq!(
        (v["max_entries"].as_u64(), v["tracked_entries"].as_u64()),
        (Some(100), Some(4))
    );
}
