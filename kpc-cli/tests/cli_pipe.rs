//! The `kpc` binary ends quietly (status 0, nothing on stderr about it) when its standard output is a
//! closed pipe: `kpc cache ls | head -1` and `kpc devices | head -1` as a shell runs them, and every
//! printing subcommand with its output closed before it writes a byte.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::disk::{TempDir, cache, key, payload, settings};
use kpc::admin::disk::PersistentCache;

fn kpc_path() -> &'static str {
    env!("CARGO_BIN_EXE_kpc")
}

/// Enough entries that `kpc cache ls` prints more than a pipe holds (64 KiB) plus what `head`
/// reads at once: kpc is then certainly still writing when `head` exits.
fn populate(root: &Path) {
    // No fsync: durability is not what this test is about, and 2000 fsyncs take a minute here.
    let c = PersistentCache::new(settings(root).sync(false));
    // 2000 rows: `cache ls` sizes its columns to its values, about 100 bytes a row here.
    for i in 0..2000 {
        c.put(&key(i), &payload(i, 64), Duration::ZERO);
    }
}

fn assert_quiet_success(what: &str, o: &Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "{what}: exit {:?}, stderr: {err}",
        o.status.code()
    );
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe") && !err.contains("os error 32"),
        "{what}: {err}"
    );
}

/// `bash -c 'set -o pipefail; kpc ARGS | head -1'`: with pipefail the pipeline's status is kpc's
/// when kpc fails, so a panic (101) or any error shows.
fn pipeline(root: &Path, args: &str) -> (Output, String) {
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!("set -o pipefail; \"$KPC\" {args} | head -1"))
        .env("KPC", kpc_path())
        .env("KPC_CACHE_DIR", root)
        .env_remove("KPC_DEVICE")
        .env_remove("KPC_CACHE_REMOTE")
        .output()
        .unwrap();
    let first = String::from_utf8_lossy(&o.stdout).into_owned();
    (o, first)
}

#[test]
fn cache_ls_into_head_ends_quietly() {
    let t = TempDir::new("pipe-ls");
    let root = t.join("cache");
    populate(&root);
    // The listing really is longer than the pipe and head's read together.
    let full = Command::new(kpc_path())
        .args(["cache", "ls"])
        .env("KPC_CACHE_DIR", &root)
        .output()
        .unwrap();
    assert!(full.status.success());
    assert!(full.stdout.len() > 128 << 10, "{} bytes", full.stdout.len());

    let (o, first) = pipeline(&root, "cache ls");
    assert_quiet_success("kpc cache ls | head -1", &o);
    assert_eq!(first.lines().count(), 1, "{first}");
    assert_eq!(
        first.lines().next(),
        String::from_utf8_lossy(&full.stdout).lines().next()
    );
}

#[test]
fn devices_into_head_ends_quietly() {
    let t = TempDir::new("pipe-devices");
    let (o, first) = pipeline(&t.join("cache"), "devices");
    assert_quiet_success("kpc devices | head -1", &o);
    assert_eq!(first.lines().count(), 1, "{first}");
}

/// Runs `kpc ARGS` with stdout a pipe whose read end is closed before kpc starts: its first write
/// fails with EPIPE, whatever the output's length.
fn closed_stdout(root: &Path, args: &[&str]) -> Output {
    // The pipe's only reader is `true`, which has exited by the time kpc starts.
    let mut sink = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
    let writer = sink.stdin.take().unwrap();
    sink.wait().unwrap();
    let child = Command::new(kpc_path())
        .args(args)
        .env("KPC_CACHE_DIR", root)
        .env_remove("KPC_DEVICE")
        .env_remove("KPC_CACHE_REMOTE")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn every_printing_subcommand_ends_quietly_on_a_closed_stdout() {
    let t = TempDir::new("pipe-closed");
    let root = t.join("cache");
    let c = cache(&root);
    for i in 0..3 {
        c.put(&key(i), &payload(i, 64), Duration::ZERO);
    }
    let runs: &[&[&str]] = &[
        &["devices"],
        &["status"],
        &["cache", "path"],
        &["cache", "stats"],
        &["cache", "stats", "--json"],
        &["cache", "ls"],
        &["cache", "ls", "--json"],
        &["cache", "verify"],
        &["cache", "prune", "--older-than", "7d"],
    ];
    for args in runs {
        let o = closed_stdout(&root, args);
        assert_quiet_success(&format!("kpc {}", args.join(" ")), &o);
    }
    // Nothing was lost on the way: the entries are all still there.
    assert_eq!(c.entries().unwrap().len(), 3);
}
