//! Cluster storage on a real S3-compatible server (s3s-fs, tests/common/s3.rs), with machines that
//! are processes of their own (this test binary re-run, with the counting fake backend and the AWS
//! credentials in its environment): `kpc cache gc --remote` by age and dry run, keeping what was
//! served; and a cold fleet of eight processes sharing one bucket that builds each kernel once (the
//! create-once fleet lock).
#![cfg(feature = "remote")]

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::disk::{TempDir, child, child_role, wait_for_file};
use common::fake_backend::{FakeBackend, image};
use common::s3::S3Server;
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, SpecConstants, StoreKind};

/// One machine: asks for the programs in `KPC_TEST_PROGRAMS` (after `KPC_TEST_GO` exists, when
/// given) with the configuration of its environment, and prints what happened on one line.
#[test]
fn child_machine() {
    let Some(role) = child_role() else { return };
    assert_eq!(role, "machine");
    let env = |n: &str| std::env::var(n).ok();
    let programs: Vec<usize> = env("KPC_TEST_PROGRAMS")
        .unwrap()
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let config = kpc::Config::from_env().unwrap();
    let delay = env("KPC_TEST_BUILD_MS").map_or(0, |v| v.parse().unwrap());
    let be = Arc::new(FakeBackend::new().build_delay(Duration::from_millis(delay)));
    let pm = ProgramManager::new(be.clone(), &config);
    if let (Some(ready), Some(go)) = (env("KPC_TEST_READY"), env("KPC_TEST_GO")) {
        std::fs::write(ready, b"").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while !Path::new(&go).exists() {
            assert!(std::time::Instant::now() < deadline, "no go from the test");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let sources: Vec<&str> = programs
        .iter()
        .map(|&i| {
            let img = image(&format!("k{i}.cl"), &["main"]);
            pm.program(&img, &SpecConstants::new(), &BuildOptions::new("-O2"))
                .unwrap()
                .source
                .name()
        })
        .collect();
    let remote = pm
        .store_stats()
        .into_iter()
        .find(|l| l.kind == StoreKind::Remote)
        .expect("a remote level")
        .store;
    println!(
        "MACHINE builds={} hits={} errors={} sources={}",
        be.builds(),
        remote.hits,
        remote.errors,
        sources.join(",")
    );
}

/// A machine with its local cache at `dir`, the remote at `url`, asking for `programs`.
fn machine(dir: &Path, url: &str, programs: &[usize]) -> Command {
    let list: Vec<String> = programs.iter().map(|i| i.to_string()).collect();
    let mut c = child("child_machine", "machine");
    c.env("KPC_TEST_PROGRAMS", list.join(","))
        .env("KPC_CACHE_DIR", dir)
        .env("KPC_CACHE_PERSISTENT", "1")
        .env("KPC_CACHE_REMOTE", url)
        .env("KPC_CACHE_REMOTE_TIMEOUT", "5s")
        .env("KPC_CACHE_LOCK_TIMEOUT", "60s")
        .env_remove("KPC_CACHE_REMOTE_KEY")
        .env_remove("KPC_CACHE_SIGNING_KEY")
        .env_remove("KPC_CACHE_TRUSTED_KEYS")
        .env_remove("KPC_CACHE_READONLY_DIRS")
        .stdout(Stdio::piped());
    S3Server::credentials(&mut c);
    c
}

/// What one machine reported: its builds, remote hits and errors, and each program's source.
#[derive(Debug)]
struct Report {
    builds: usize,
    hits: u64,
    errors: u64,
    sources: Vec<String>,
}

fn report(ch: Child) -> Report {
    let out = ch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("MACHINE "))
        .unwrap_or_else(|| panic!("no report: {text}"));
    let field = |name: &str| -> &str {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    Report {
        builds: field("builds=").parse().unwrap(),
        hits: field("hits=").parse().unwrap(),
        errors: field("errors=").parse().unwrap(),
        sources: field("sources=").split(',').map(str::to_owned).collect(),
    }
}

fn run(dir: &Path, url: &str, programs: &[usize]) -> Report {
    report(machine(dir, url, programs).spawn().unwrap())
}

/// `kpc cache gc --remote ARGS` against `url`.
fn gc(url: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut c = common::cli::kpc_command();
    c.env_clear()
        .env("KPC_CACHE_PERSISTENT", "0")
        .env("KPC_CACHE_REMOTE", url)
        .args(["cache", "gc", "--remote"])
        .args(args);
    S3Server::credentials(&mut c);
    let o = c.output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
    )
}

#[test]
fn gc_on_a_bucket_removes_what_nobody_was_served_and_keeps_the_rest() {
    let Some(r) = S3Server::start("gc_on_a_bucket_removes_what_nobody_was_served") else {
        return;
    };
    let t = TempDir::new("s3-gc");
    let url = r.url("fleet");
    let a = run(&t.join("a"), &url, &[0, 1, 2, 3]);
    assert_eq!(a.builds, 4, "{a:?}");
    let entries = r.keys("fleet/kpc/");
    let records = r.keys("fleet/kpc-served/");
    assert_eq!((entries.len(), records.len()), (4, 4), "{records:?}");
    // Everything last served ten days ago (the server reports the records' file times).
    let old = SystemTime::now() - Duration::from_secs(10 * 86_400);
    for k in entries.iter().chain(&records) {
        r.backdate(k, old);
    }
    // A machine is served programs 0 and 1 now: their records are written again.
    let b = run(&t.join("b"), &url, &[0, 1]);
    assert_eq!((b.hits, b.builds), (2, 0), "{b:?}");
    // A dry run says what would go and removes nothing.
    let (code, out) = gc(&url, &["--older-than", "1d", "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("4 entries") && out.contains("would remove 2 entries"),
        "{out}"
    );
    assert_eq!(r.keys("fleet/kpc/").len(), 4);
    let (code, out) = gc(&url, &["--older-than", "1d", "--json"]);
    assert_eq!(code, Some(0), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (v["removed_by_age"].as_u64(), v["kept_served"].as_u64()),
        (Some(2), Some(0)),
        "{out}"
    );
    assert_eq!(r.keys("fleet/kpc/").len(), 2);
    assert_eq!(r.keys("fleet/kpc-served/").len(), 2);
    // A fresh machine is served what stayed and builds what went.
    let c = run(&t.join("c"), &url, &[0, 1, 2, 3]);
    assert_eq!(c.sources, ["remote", "remote", "built", "built"], "{c:?}");
    assert_eq!(c.errors, 0);
    // No argument saying what to collect: a usage error.
    let (code, _) = gc(&url, &[]);
    assert_eq!(code, Some(2));
}
/// The objects under `prefix` that are fleet locks.
fn locks(r: &S3Server, prefix: &str) -> Vec<String> {
    r.keys(&format!("{prefix}/kpc-lock/"))
}

/// Eight cold machines with their own local caches start at once against `url` and ask for the same
/// four kernels in different orders; returns their reports.
fn herd(t: &TempDir, url: &str) -> Vec<Report> {
    let go = t.join("go");
    let mut members = Vec::new();
    for i in 0..8 {
        // Each member asks in its own order, so keys are contended from different directions.
        let order: Vec<usize> = (0..KEYS).map(|j| (j + i) % KEYS).collect();
        let ready: PathBuf = t.join(format!("ready{i}"));
        let ch = machine(&t.join(format!("local{i}")), url, &order)
            .env("KPC_TEST_BUILD_MS", "300")
            .env("KPC_TEST_READY", &ready)
            .env("KPC_TEST_GO", &go)
            .spawn()
            .unwrap();
        members.push((ch, ready));
    }
    for (ch, ready) in &mut members {
        wait_for_file(ready, ch);
    }
    std::fs::write(&go, b"").unwrap();
    let reports: Vec<Report> = members.into_iter().map(|(ch, _)| report(ch)).collect();
    for m in &reports {
        eprintln!("{m:?}");
    }
    let builds: usize = reports.iter().map(|m| m.builds).sum();
    let hits: u64 = reports.iter().map(|m| m.hits).sum();
    assert_eq!(builds, KEYS, "each kernel built once in the fleet");
    assert_eq!(hits as usize, 8 * KEYS - KEYS);
    assert!(reports.iter().all(|m| m.errors == 0));
    reports
}

const KEYS: usize = 4;

#[test]
fn eight_cold_processes_on_one_bucket_build_each_kernel_once() {
    let Some(r) = S3Server::start("eight_cold_processes_on_one_bucket") else {
        return;
    };
    let t = TempDir::new("s3-herd");
    herd(&t, &r.url("herd"));
    assert_eq!(r.keys("herd/kpc/").len(), KEYS);
    assert!(locks(&r, "herd").is_empty(), "{:?}", locks(&r, "herd"));
}

#[test]
fn eight_cold_processes_on_one_fs_remote_build_each_kernel_once() {
    let t = TempDir::new("fs-herd");
    let root = t.join("remote");
    std::fs::create_dir_all(&root).unwrap();
    herd(&t, &format!("fs://{}", root.display()));
    let leases: Vec<_> = walkdir::WalkDir::new(root.join("kpc-lock"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .collect();
    assert!(leases.is_empty(), "{leases:?}");
}

#[test]
fn a_dead_holders_lease_is_broken_and_a_live_one_waited_for() {
    let Some(r) = S3Server::start("a_dead_holders_lease_is_broken") else {
        return;
    };
    let t = TempDir::new("s3-lease");
    let url = r.url("lease");
    // Where program 0's lease lives: its entry's name under kpc-lock/.
    let probe = run(&t.join("probe"), &url, &[0]);
    assert_eq!(probe.builds, 1);
    let entry = r.keys("lease/kpc/v1/")[0].clone();
    let lease_of = |e: &str| e.replacen("lease/kpc/", "lease/kpc-lock/", 1);
    // Program 1's lease, left by a holder that died: expired long ago.
    let one = run(&t.join("one"), &url, &[1]);
    assert_eq!(one.builds, 1);
    let entries = r.keys("lease/kpc/v1/");
    let e1 = entries.iter().find(|e| **e != entry).unwrap().clone();
    // Remove program 1's entry and plant a dead lease: a new machine breaks it and builds at once.
    r.remove(&e1);
    r.put(&lease_of(&e1), b"kpc-lease dead-holder 1000\n");
    let m = report(
        machine(&t.join("m"), &url, &[1])
            .env("KPC_CACHE_LOCK_TIMEOUT", "60s")
            .spawn()
            .unwrap(),
    );
    assert_eq!(
        (m.builds, m.sources.as_slice()),
        (1, &["built".to_string()][..]),
        "{m:?}"
    );
    assert!(
        !r.exists(&lease_of(&e1)),
        "the dead lease was broken and the new one released"
    );
    // A live lease (its holder renews it far into the future): a machine waits for the entry until
    // KPC_CACHE_LOCK_TIMEOUT, then builds without it (one warning, counted).
    r.remove(&entry);
    r.put(&lease_of(&entry), b"kpc-lease live-holder 99999999999999\n");
    let w = report(
        machine(&t.join("w"), &url, &[0])
            .env("KPC_CACHE_LOCK_TIMEOUT", "1s")
            .spawn()
            .unwrap(),
    );
    assert_eq!(w.builds, 1, "{w:?}");
    assert!(w.errors >= 1, "the timeout is counted: {w:?}");
    assert!(r.exists(&lease_of(&entry)), "a live lease is not broken");
}
