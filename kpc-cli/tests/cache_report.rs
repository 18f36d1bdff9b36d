//! `kpc cache stats` with what eviction cost and the limit that would have served it, and `kpc cache
//! report` ranking the miss journal, locally and across two machines (two cache directories) sharing
//! a real redis-server or an fs remote; run as the real binary.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use common::disk::*;
use common::fake_backend::{FakeBackend, image};
use kpc::Config;
use kpc::Source;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, SpecConstants};
use serde_json::Value;

fn kpc(root: &Path, envs: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = common::cli::kpc_command();
    c.env_clear().args(args).env("KPC_CACHE_DIR", root);
    for (k, v) in envs {
        c.env(k, v);
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

#[test]
fn stats_prints_what_eviction_cost_and_the_limit_that_would_have_served_it() {
    let t = TempDir::new("stats-eviction");
    let root = t.join("cache");
    let limit = 7 * 1024;
    let c = PersistentCache::new(settings(&root).max_size(limit));
    for i in 0..6 {
        c.put(&key(i), &payload(i, 2000), Duration::from_millis(30));
    }
    c.wait_for_eviction();
    let evicted: Vec<u64> = (0..6)
        .filter(|&i| c.get_read_only(&key(i)).is_none())
        .collect();
    assert!(!evicted.is_empty());
    // Requested again: two misses on evicted entries.
    for &i in &evicted[..evicted.len().min(2)] {
        assert!(c.get(&key(i)).is_none());
    }
    let misses = evicted.len().min(2) as u64;

    let env = [("KPC_CACHE_MAX_SIZE", "7K")];
    let v = json(&kpc(&root, &env, &["cache", "stats", "--json"]));
    let e = &v["eviction"];
    assert_eq!(e["evictions"], evicted.len() as u64, "{v}");
    assert_eq!(e["misses"], misses, "{v}");
    let miss_bytes = e["miss_bytes"].as_u64().unwrap();
    assert!(miss_bytes > 2000 * misses, "{v}");
    let suggested = e["suggested_max_size"].as_u64().expect("advice");
    assert!(suggested > limit + miss_bytes / misses, "{v}");

    let o = kpc(&root, &env, &["cache", "stats"]);
    let s = text(&o);
    assert!(o.status.success(), "{s}");
    assert!(
        s.contains(&format!("{misses} misses")) && s.contains("on evicted entries"),
        "{s}"
    );
    let advice = format!(
        "KPC_CACHE_MAX_SIZE={} would have served them",
        kpc::admin::disk::size_arg(suggested)
    );
    assert!(s.contains(&advice), "{s}");

    // --since a period that excludes nothing recent still counts them; a bad one is a usage error.
    let v = json(&kpc(
        &root,
        &env,
        &["cache", "stats", "--json", "--since", "1h"],
    ));
    assert_eq!(v["eviction"]["misses"], misses);
    let o = kpc(&root, &env, &["cache", "stats", "--since", "soon"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--since"), "{}", text(&o));
    let o = kpc(&root, &env, &["cache", "report", "--since", "-3d"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[cfg(feature = "remote")]
fn machine(root: &Path, host: &str, remote: &str, max_size: u64) -> Config {
    Config::builder()
        .cache_dir(root)
        .host_id(host.to_string())
        .max_size(max_size)
        .remote(kpc::RemoteUrl::parse(remote).unwrap())
        .remote_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

#[cfg(feature = "remote")]
fn build(be: &Arc<FakeBackend>, cfg: &Config, names: &[&str]) -> Vec<Source> {
    // Eviction inline, so that a put's eviction is done when the build returns.
    let disk = PersistentCache::new(
        DiskCacheSettings::from_config_dir(cfg)
            .unwrap()
            .background_eviction(false),
    );
    let pm = ProgramManager::with_disk_cache(be.clone(), cfg, Some(disk));
    let out = names
        .iter()
        .map(|n| {
            pm.program(
                &image(n, &["main"]),
                &SpecConstants::new(),
                &BuildOptions::new("-O2"),
            )
            .unwrap()
            .source
        })
        .collect();
    // Waits for publishing and eviction, and records the hits.
    drop(pm);
    out
}

#[cfg(feature = "remote")]
#[test]
fn report_ranks_causes_and_kernels_built_more_than_once_across_two_machines() {
    let Some(r) = common::redis::RedisServer::start(
        "report_ranks_causes_and_kernels_built_more_than_once_across_two_machines",
    ) else {
        return;
    };
    two_machines(&r.url(), &|| {
        for k in r.keys("kpc/v*") {
            let _: i64 = r.cmd(&[b"DEL", k.as_bytes()]);
        }
    });
    // The remote journal is a capped stream.
    let len: u64 = r.cmd(&[b"XLEN", b"kpc-journal/v1"]);
    assert!(len >= 6, "{len}");
}

/// The same fleet on an fs remote, which has no append: each machine keeps one object of its own.
#[cfg(feature = "remote")]
#[test]
fn an_fs_remote_shares_the_journal_as_one_object_per_machine() {
    let remote = TempDir::new("report-fs-remote");
    let url = format!("fs://{}", remote.path().display());
    two_machines(&url, &|| {
        std::fs::remove_dir_all(remote.join("kpc")).unwrap();
    });
    let objects = std::fs::read_dir(remote.join("kpc-journal").join("v1"))
        .unwrap()
        .count();
    assert_eq!(objects, 2, "one journal object per machine");
}

/// Two machines sharing `url`; `wipe` removes every entry the remote holds (its own eviction, a
/// flush) and leaves its journal.
#[cfg(feature = "remote")]
fn two_machines(url: &str, wipe: &dyn Fn()) {
    let (a, b) = (TempDir::new("report-a"), TempDir::new("report-b"));
    let be = Arc::new(
        FakeBackend::new()
            .binary_size(3000)
            .build_delay(Duration::from_millis(20)),
    );
    // Machine A, with room for about two entries: k0, k1, k2 are built, k0 is evicted.
    let ca = machine(a.path(), "machine-a", url, 7 * 1024);
    let s = build(&be, &ca, &["k0.cl", "k1.cl", "k2.cl"]);
    assert_eq!(s, [Source::Built; 3]);
    // The remote loses every entry (its own eviction, a flush): the fleet must build again.
    wipe();
    // A asks for k0 again: evicted here, so built again, and published.
    assert_eq!(build(&be, &ca, &["k0.cl"]), [Source::Built]);
    // Machine B: k0 comes from the remote (a hit that saved A's compile); k1 is built again.
    let cb = machine(b.path(), "machine-b", url, 0);
    let s = build(&be, &cb, &["k0.cl", "k1.cl"]);
    assert_eq!(s, [Source::Remote, Source::Built]);

    let env = [("KPC_CACHE_REMOTE", url)];
    let v = json(&kpc(
        a.path(),
        &env,
        &["cache", "report", "--remote", "--json"],
    ));
    assert_eq!(
        v["hosts"],
        serde_json::json!(["machine-a", "machine-b"]),
        "{v}"
    );
    assert_eq!(v["builds"], 5, "{v}");
    let causes: Vec<(String, u64)> = v["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["cause"].as_str().unwrap().to_owned(),
                c["builds"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        causes,
        [("new-key".to_string(), 4), ("evicted".to_string(), 1)],
        "{v}"
    );
    let rebuilt: Vec<(String, u64, Vec<String>)> = v["rebuilt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["label"].as_str().unwrap().to_owned(),
                k["builds"].as_u64().unwrap(),
                k["hosts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| h.as_str().unwrap().to_owned())
                    .collect(),
            )
        })
        .collect();
    let mut labels: Vec<&str> = rebuilt.iter().map(|k| k.0.as_str()).collect();
    labels.sort();
    assert_eq!(labels, ["k0.cl", "k1.cl"], "{v}");
    for (label, builds, hosts) in &rebuilt {
        assert_eq!(*builds, 2, "{v}");
        let want: &[&str] = if label == "k0.cl" {
            &["machine-a"]
        } else {
            &["machine-a", "machine-b"]
        };
        assert_eq!(hosts, want, "{v}");
    }
    // Compile time: each build slept 20 ms; B's hit saved A's recorded build of k0.
    assert!(v["spent_ms"].as_u64().unwrap() >= 5 * 20, "{v}");
    assert_eq!(v["hits"], 1, "{v}");
    assert!(v["saved_ms"].as_u64().unwrap() >= 20, "{v}");

    // Each machine's local journal holds its own records only.
    let v = json(&kpc(b.path(), &[], &["cache", "report", "--json"]));
    assert_eq!(v["hosts"], serde_json::json!(["machine-b"]), "{v}");
    assert_eq!(v["builds"], 1, "{v}");
    // And the text a user reads.
    let o = kpc(a.path(), &env, &["cache", "report", "--remote"]);
    let s = text(&o);
    assert!(o.status.success(), "{s}");
    assert!(
        s.contains("kernels built more than once") && s.contains("evicted"),
        "{s}"
    );
}
