//! The remote tier against a real S3-compatible server (s3s-fs, its own per test, started on a
//! loopback port and killed afterwards: tests/common/s3.rs). Each machine is a process of its own with
//! its own local cache directory and the AWS credentials in its environment, as a fleet member has
//! them: the test binary re-run as a child (the counting fake backend), or `kpc` itself (Vulkan
//! attention, `kpc cache ls --remote`). Covered: two machines sharing the bucket, a server down at
//! start, a server killed mid-run, garbage and truncated objects, a wrong secret (the server checks
//! each request's signature), and the listing.
#![cfg(feature = "remote")]

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;

use common::cli::{attention_check, kernel_sources};
use common::disk::{TempDir, capture, child, child_role, wait_for_file};
use common::drivers::vulkan_device;
use common::fake_backend::{FakeBackend, image};
use common::s3::{S3Server, dead_url};
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, SpecConstants, StoreKind};

/// The fake device's program `i`, as every machine asks for it.
fn program_key(pm: &ProgramManager, i: usize) -> kpc::StoreKey {
    pm.disk_key(
        &image(&format!("k{i}.cl"), &["main"]),
        &SpecConstants::new(),
        &BuildOptions::new("-O2"),
    )
}

/// One machine of the fleet: builds or fetches the programs in `KPC_TEST_PROGRAMS` with the fake
/// backend and the configuration of its environment, and prints what happened on one line. With
/// `KPC_TEST_READY` and `KPC_TEST_GO` it stops after the first program until the test says go.
#[test]
fn child_s3_machine() {
    let Some(role) = child_role() else { return };
    assert_eq!(role, "machine");
    let env = |n: &str| std::env::var(n).ok();
    let programs: Vec<usize> = env("KPC_TEST_PROGRAMS")
        .unwrap()
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let config = kpc::Config::from_env().unwrap();
    let be = Arc::new(FakeBackend::new());
    // With KPC_TEST_ROUNDS, the programs are asked for again by a new manager (a new remote store)
    // after the last one was dropped, as an embedder's successive contexts would.
    let rounds: usize = env("KPC_TEST_ROUNDS").map_or(1, |r| r.parse().unwrap());
    let (report, events) = capture(|| {
        let mut sources = Vec::new();
        for _ in 1..rounds {
            let pm = ProgramManager::new(be.clone(), &config);
            for &i in &programs {
                let img = image(&format!("k{i}.cl"), &["main"]);
                let p = pm.program(&img, &SpecConstants::new(), &BuildOptions::new("-O2"));
                sources.push(p.unwrap().source.name());
            }
        }
        let pm = ProgramManager::new(be.clone(), &config);
        for (n, &i) in programs.iter().enumerate() {
            let img = image(&format!("k{i}.cl"), &["main"]);
            let p = pm
                .program(&img, &SpecConstants::new(), &BuildOptions::new("-O2"))
                .unwrap();
            sources.push(p.source.name());
            if let (0, Some(ready), Some(go)) = (n, env("KPC_TEST_READY"), env("KPC_TEST_GO")) {
                std::fs::write(ready, b"").unwrap();
                // Bounded: a test that failed before saying go must not leave this process behind.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
                while !Path::new(&go).exists() {
                    assert!(std::time::Instant::now() < deadline, "no go from the test");
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
        }
        let remote = pm
            .store_stats()
            .into_iter()
            .find(|l| l.kind == StoreKind::Remote)
            .expect("a remote level")
            .store;
        (sources, remote)
    });
    let warnings: Vec<String> = events
        .iter()
        .filter(|e| {
            e.level == tracing::Level::WARN
                // The message names the store first (`remote:<url>: ...`).
                && e.fields
                    .get("message")
                    .is_some_and(|s| s.starts_with("remote:"))
        })
        .map(|e| {
            eprintln!("warning: {:?}", e.fields);
            e.fields.get("cause").cloned().unwrap_or_default()
        })
        .collect();
    let (sources, s) = report;
    println!(
        "MACHINE builds={} hits={} misses={} errors={} trips={} puts={} sources={} warnings={}",
        be.builds(),
        s.hits,
        s.misses,
        s.errors,
        s.trips,
        s.puts,
        sources.join(","),
        warnings.join(",")
    );
}

/// What one machine reported.
#[derive(Debug)]
struct Report {
    builds: usize,
    hits: u64,
    errors: u64,
    trips: u64,
    puts: u64,
    sources: Vec<String>,
    warnings: Vec<String>,
}

/// A machine with its local cache at `dir`, the remote at `url`, asking for `programs`.
fn machine(dir: &Path, url: &str, programs: &[usize]) -> Command {
    let list: Vec<String> = programs.iter().map(|i| i.to_string()).collect();
    let mut c = child("child_s3_machine", "machine");
    c.env("KPC_TEST_PROGRAMS", list.join(","))
        .env("KPC_CACHE_DIR", dir)
        .env("KPC_CACHE_PERSISTENT", "1")
        .env("KPC_CACHE_REMOTE", url)
        .env("KPC_CACHE_REMOTE_TIMEOUT", "2s")
        .env_remove("KPC_CACHE_REMOTE_KEY")
        .env_remove("KPC_CACHE_SIGNING_KEY")
        .env_remove("KPC_CACHE_TRUSTED_KEYS")
        .env_remove("KPC_CACHE_READONLY_DIRS")
        .stdout(Stdio::piped());
    S3Server::credentials(&mut c);
    c
}

/// Waits for a machine and parses its report.
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
    let list = |name: &str| -> Vec<String> {
        field(name)
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    Report {
        builds: field("builds=").parse().unwrap(),
        hits: field("hits=").parse().unwrap(),
        errors: field("errors=").parse().unwrap(),
        trips: field("trips=").parse().unwrap(),
        puts: field("puts=").parse().unwrap(),
        sources: list("sources="),
        warnings: list("warnings="),
    }
}

/// Runs a machine to its end.
fn run(dir: &Path, url: &str, programs: &[usize]) -> Report {
    report(machine(dir, url, programs).spawn().unwrap())
}

fn all(source: &str, n: usize) -> Vec<String> {
    vec![source.to_owned(); n]
}

/// The fake device's namespace in the bucket: `PREFIX/kpc/v1/<device digest>/`.
fn namespace(prefix: &str) -> String {
    let cfg = kpc::Config::builder().persistent(false).build().unwrap();
    let pm = ProgramManager::new(Arc::new(FakeBackend::new()), &cfg);
    let dev = program_key(&pm, 0).device_digest().to_hex();
    format!("{prefix}/kpc/v1/{dev}/")
}

/// The object name of the fake device's program `i` under `prefix`.
fn object(prefix: &str, i: usize) -> String {
    let cfg = kpc::Config::builder().persistent(false).build().unwrap();
    let pm = ProgramManager::new(Arc::new(FakeBackend::new()), &cfg);
    format!(
        "{}{}",
        namespace(prefix),
        program_key(&pm, i).digest().to_hex()
    )
}

#[test]
fn two_machines_share_one_bucket_and_the_second_is_served_by_it() {
    let Some(r) = S3Server::start("two_machines_share_one_bucket") else {
        return;
    };
    let t = TempDir::new("s3-two");
    let url = r.url("fleet");
    let a = run(&t.join("a"), &url, &[0, 1, 2]);
    assert_eq!(a.sources, all("built", 3), "{a:?}");
    assert_eq!((a.builds, a.puts, a.errors), (3, 3, 0), "{a:?}");
    assert!(a.warnings.is_empty(), "{a:?}");
    // Published under the prefix, the format version and the device's digest; beside them, the
    // machine's share of the miss journal (one object per host).
    assert_eq!(r.keys("fleet/kpc-journal/v1/").len(), 1);
    let keys = r.keys("fleet/kpc/");
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(
        keys.iter().all(|k| k.starts_with(&namespace("fleet"))),
        "{keys:?}"
    );
    // The second machine: its own empty disk, the same bucket. Nothing is built.
    let b = run(&t.join("b"), &url, &[0, 1, 2]);
    assert_eq!(b.sources, all("remote", 3), "{b:?}");
    assert_eq!((b.builds, b.hits, b.errors, b.puts), (0, 3, 0, 0), "{b:?}");
    // What it fetched was copied to its disk: its next process does not ask the remote.
    let b2 = run(&t.join("b"), &url, &[0, 1, 2]);
    assert_eq!(b2.sources, all("disk", 3), "{b2:?}");
    assert_eq!(b2.builds, 0);
}

#[test]
fn successive_stores_in_one_process_share_nothing_that_dies_with_the_first() {
    let Some(r) = S3Server::start("successive_stores_in_one_process") else {
        return;
    };
    let t = TempDir::new("s3-successive");
    let url = r.url("fleet");
    // One process, no disk cache: 24 managers in turn, each with its own remote store. The first
    // builds and publishes, the others are served by the bucket (with OpenDAL's process-wide HTTP
    // client, a store could be handed a pooled connection of an earlier store's runtime, dropped with
    // it: a failed lookup, about one run in four of this test).
    let m = report(
        machine(&t.join("b"), &url, &[0, 1])
            .env("KPC_CACHE_PERSISTENT", "0")
            .env("KPC_TEST_ROUNDS", "24")
            .spawn()
            .unwrap(),
    );
    let mut want = all("built", 2);
    want.extend(all("remote", 46));
    assert_eq!(m.sources, want, "{m:?}");
    assert!(m.warnings.is_empty(), "{m:?}");
    assert_eq!((m.builds, m.errors), (2, 0), "{m:?}");
}

#[test]
fn compressed_and_uncompressed_objects_share_a_bucket() {
    let Some(r) = S3Server::start("compressed_and_uncompressed_objects_share_a_bucket") else {
        return;
    };
    let t = TempDir::new("s3-compress");
    let url = r.url("z");
    // Machine A publishes uncompressed (as kpc before compression did), B compressed (the default).
    let a = report(
        machine(&t.join("a"), &url, &[0])
            .env("KPC_CACHE_REMOTE_COMPRESS", "0")
            .spawn()
            .unwrap(),
    );
    let b = run(&t.join("b"), &url, &[1]);
    assert_eq!((a.puts, b.puts), (1, 1), "{a:?} {b:?}");
    let (plain, packed) = (r.get(&object("z", 0)), r.get(&object("z", 1)));
    assert_eq!(kpc::admin::store::is_compressed(&plain), Some(false));
    assert_eq!(kpc::admin::store::is_compressed(&packed), Some(true));
    assert!(
        packed.len() < plain.len(),
        "{} {}",
        packed.len(),
        plain.len()
    );
    // Readers of either setting are served both from the bucket.
    for (tag, level) in [("c", "3"), ("d", "0")] {
        let m = report(
            machine(&t.join(tag), &url, &[0, 1])
                .env("KPC_CACHE_REMOTE_COMPRESS", level)
                .spawn()
                .unwrap(),
        );
        assert_eq!(m.sources, all("remote", 2), "{tag}: {m:?}");
        assert_eq!((m.builds, m.errors), (0, 0), "{tag}: {m:?}");
    }
    // A compressed object that declares more than a reader decompresses is refused, once, and built.
    let mut bomb = packed.clone();
    let prov_len = u32::from_le_bytes(bomb[8..12].try_into().unwrap()) as usize;
    bomb[12 + prov_len..12 + prov_len + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    r.put(&object("z", 1), &bomb);
    let e = run(&t.join("e"), &url, &[1]);
    assert_eq!((&e.sources, e.builds), (&all("built", 1), 1), "{e:?}");
    assert_eq!((e.errors, e.warnings), (1, vec!["corrupt".to_string()]));
}

#[test]
fn a_server_down_at_start_is_one_warning_and_local_builds() {
    // A server that ran and is gone: its port is known and refuses connections.
    let Some(mut r) = S3Server::start("a_s3_server_down_at_start") else {
        return;
    };
    let url = r.url("fleet");
    r.kill();
    let t = TempDir::new("s3-down");
    let a = run(&t.join("a"), &url, &[0, 1, 2, 3, 4]);
    assert_eq!(a.sources, all("built", 5), "{a:?}");
    assert_eq!(a.builds, 5);
    assert!(a.errors >= 1, "{a:?}");
    // A refused connection is the server being down: it opens the circuit breaker, so the run does
    // not pay one failed call per kernel.
    assert!(a.trips >= 1, "{a:?}");
    assert_eq!(a.warnings, vec!["unavailable"], "{a:?}");
    // A port nobody ever listened on says the same.
    let b = run(&t.join("b"), &dead_url("fleet"), &[0]);
    assert_eq!(
        (b.sources, b.warnings),
        (all("built", 1), vec!["unavailable".into()])
    );
    // The local disk still serves the first machine.
    let a2 = run(&t.join("a"), &url, &[0, 1, 2, 3, 4]);
    assert_eq!(a2.sources, all("disk", 5), "{a2:?}");
}

#[test]
fn a_server_killed_mid_run_degrades_to_builds_with_one_warning() {
    let Some(mut r) = S3Server::start("a_s3_server_killed_mid_run") else {
        return;
    };
    let t = TempDir::new("s3-killed");
    let url = r.url("fleet");
    let (ready, go) = (t.join("ready"), t.join("go"));
    let mut ch = machine(&t.join("a"), &url, &[0, 1, 2, 3, 4, 5])
        .env("KPC_TEST_READY", &ready)
        .env("KPC_TEST_GO", &go)
        .spawn()
        .unwrap();
    wait_for_file(&ready, &mut ch);
    // Program 0 was built and published before the kill.
    assert_eq!(r.keys("fleet/kpc/").len(), 1);
    r.kill();
    std::fs::write(&go, b"").unwrap();
    let a = report(ch);
    assert_eq!(a.sources, all("built", 6), "{a:?}");
    assert_eq!((a.builds, a.puts), (6, 1), "{a:?}");
    assert!(a.errors >= 1 && a.trips >= 1, "{a:?}");
    assert_eq!(a.warnings, vec!["unavailable"], "{a:?}");
}

#[test]
fn garbage_and_truncated_objects_are_refused_and_rebuilt() {
    let Some(r) = S3Server::start("garbage_and_truncated_s3_objects") else {
        return;
    };
    let t = TempDir::new("s3-garbage");
    let url = r.url("fleet");
    let a = run(&t.join("a"), &url, &[0, 1]);
    assert_eq!((a.builds, a.puts), (2, 2), "{a:?}");
    let target = object("fleet", 0);
    let good = r.get(&target);
    let cases: [(&str, Vec<u8>); 2] = [
        ("garbage", b"not an entry at all".to_vec()),
        ("truncated", good[..good.len() / 2].to_vec()),
    ];
    for (tag, bad) in cases {
        r.put(&target, &bad);
        let m = run(&t.join(tag), &url, &[0, 1]);
        // Program 0 is refused (counted, warned once) and built; program 1 still comes from the bucket.
        assert_eq!(m.sources, vec!["built", "remote"], "{tag}: {m:?}");
        assert_eq!((m.builds, m.hits, m.errors), (1, 1, 1), "{tag}: {m:?}");
        assert_eq!(m.warnings, vec!["corrupt"], "{tag}: {m:?}");
        // What the machine keeps is its own build, never the bad object.
        let again = run(&t.join(tag), &url, &[0, 1]);
        assert_eq!(again.sources, all("disk", 2), "{tag}: {again:?}");
        assert_eq!(again.builds, 0, "{tag}");
    }
}

#[test]
fn a_wrong_secret_is_one_permission_warning_and_nothing_is_published() {
    let Some(r) = S3Server::start("a_wrong_s3_secret") else {
        return;
    };
    let t = TempDir::new("s3-creds");
    let mut c = machine(&t.join("a"), &r.url("fleet"), &[0, 1, 2]);
    c.env("AWS_SECRET_ACCESS_KEY", "not-the-secret");
    let a = report(c.spawn().unwrap());
    assert_eq!(a.sources, all("built", 3), "{a:?}");
    assert_eq!(a.puts, 0, "{a:?}");
    assert_eq!(a.warnings, vec!["permission-denied"], "{a:?}");
    assert!(r.keys("fleet/").is_empty());
}

/// `kpc` with its local cache at `cache`, the bucket's URL and the server's credentials.
fn kpc(cache: &Path, url: &str) -> Command {
    let mut c = common::cli::kpc_command();
    c.env("KPC_CACHE_DIR", cache)
        .env("KPC_CACHE_PERSISTENT", "1")
        .env("KPC_CACHE_REMOTE", url)
        .env_remove("KPC_CACHE_REMOTE_KEY")
        .env_remove("KPC_CACHE_SIGNING_KEY")
        .env_remove("KPC_CACHE_TRUSTED_KEYS");
    S3Server::credentials(&mut c);
    c
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `kpc cache ls --remote` for the Vulkan device: its exit code and stdout.
fn ls_remote(cache: &Path, url: &str) -> (Option<i32>, String) {
    let out = kpc(cache, url)
        .args(["cache", "ls", "--remote"])
        .env("KPC_DEVICE", "vulkan:0")
        .output()
        .unwrap();
    eprintln!("{}", text(&out));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The listing's rows that end in `verdict` (`ok`, `REFUSED`).
fn rows(ls: &str, verdict: &str) -> usize {
    ls.lines()
        .filter(|l| l.trim_end().ends_with(&format!("  {verdict}")))
        .count()
}

#[test]
fn kpc_attention_on_two_machines_and_cache_ls_remote_on_a_bucket() {
    let test = "kpc_attention_and_cache_ls_remote_on_s3";
    if vulkan_device(test).is_none() {
        return;
    }
    let Some(r) = S3Server::start(test) else {
        return;
    };
    let t = TempDir::new("s3-cli");
    let url = r.url("cli");
    let attention = |dir: PathBuf| {
        attention_check("vulkan", &dir, 2, |c| {
            c.env("KPC_CACHE_REMOTE", &url);
            S3Server::credentials(c);
        })
    };
    let first = attention(t.join("a"));
    let built = kernel_sources(&first);
    assert!(
        built.len() >= 2 && built.iter().all(|s| *s == "built"),
        "{first}"
    );
    let published = r.keys("cli/kpc/");
    assert!(published.len() > built.len(), "{published:?}\n{first}");
    // The listing: every published entry, each verified as a lookup would verify it.
    let (code, ls) = ls_remote(&t.join("ls"), &url);
    assert_eq!(code, Some(0), "{ls}");
    assert_eq!(rows(&ls, "ok"), published.len(), "{ls}");
    assert!(
        ls.contains(&format!("{} entries, 0 refused", published.len())),
        "{ls}"
    );
    // A second machine is served every attention kernel by the bucket.
    let second = attention(t.join("b"));
    let served = kernel_sources(&second);
    assert!(
        served.len() == built.len() && served.iter().all(|s| *s == "remote"),
        "{second}"
    );
    // A damaged object (one flipped bit in its binary) is listed as refused, and the exit status
    // says so.
    let mut damaged = r.get(&published[0]);
    *damaged.last_mut().unwrap() ^= 1;
    r.put(&published[0], &damaged);
    let (code, ls) = ls_remote(&t.join("ls"), &url);
    assert_eq!(code, Some(1), "{ls}");
    assert_eq!(rows(&ls, "REFUSED"), 1, "{ls}");
    assert_eq!(rows(&ls, "ok"), published.len() - 1, "{ls}");
    assert!(ls.contains(", 1 refused"), "{ls}");
}
