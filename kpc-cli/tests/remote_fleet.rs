//! A fleet of real processes sharing one real redis-server: a second machine (another local cache
//! directory) runs `kpc attention` with every kernel served by the remote, on lavapipe and on PoCL;
//! eight processes with eight local directories start cold at once and each key is built once across
//! all of them (the fleet build lock).
#![cfg(feature = "remote")]

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::cli::{attention_check, kernel_sources};
use common::disk::{TempDir, child, child_role};
use common::fake_backend::{FakeBackend, image};
use common::redis::RedisServer;
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, SpecConstants, StoreKind};

const KEYS: usize = 4;
const PROCESSES: usize = 8;

fn attention(backend: &str, cache: &TempDir, remote: &str) -> String {
    attention_check(backend, cache.path(), 8, |c| {
        c.env("KPC_CACHE_REMOTE", remote);
    })
}

fn second_machine_is_served_by_the_remote(backend: &str, test: &str) {
    let Some(r) = RedisServer::start(test) else {
        return;
    };
    let (a, b) = (
        TempDir::new(&format!("fleet-a-{backend}")),
        TempDir::new(&format!("fleet-b-{backend}")),
    );
    let first = attention(backend, &a, &r.url());
    let built = kernel_sources(&first);
    assert!(
        built.len() >= 2 && built.iter().all(|s| *s == "built"),
        "{first}"
    );
    // Every program the run built was published (the attention kernels, and the copy kernel the run
    // measures bandwidth with).
    assert!(r.keys("kpc/v1/*").len() > built.len(), "{first}");
    let second = attention(backend, &b, &r.url());
    let served = kernel_sources(&second);
    assert!(
        served.len() == built.len() && served.iter().all(|s| *s == "remote"),
        "{second}"
    );
    assert!(
        second.contains("remote:"),
        "the run reports the remote: {second}"
    );
    // And the hit was copied to the second machine's disk.
    let third = attention(backend, &b, &r.url());
    assert!(
        kernel_sources(&third).iter().all(|s| *s == "disk"),
        "{third}"
    );
}

crate::backend_tests! {
    fn second_machine_is_served_by_the_remote(backend, test) {
        let t = test;
        if crate::common::drivers::device(backend, t).is_some() {
            second_machine_is_served_by_the_remote(&backend.to_string(), t);
        }
    }
}

#[test]
fn child_fleet_member() {
    let Some(role) = child_role() else { return };
    assert_eq!(role, "member");
    let env = |n: &str| std::env::var(n).unwrap();
    let index: usize = env("KPC_TEST_INDEX").parse().unwrap();
    let go = PathBuf::from(env("KPC_TEST_GO"));
    let config = kpc::Config::from_env().unwrap();
    // Every member sees the same fake device; a build takes long enough for the others to pile up.
    let be = Arc::new(FakeBackend::new().build_delay(Duration::from_millis(300)));
    let pm = ProgramManager::new(be.clone(), &config);
    std::fs::write(env("KPC_TEST_READY"), b"").unwrap();
    while !go.exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut sources = Vec::new();
    // Each member asks in its own order, so keys are contended from different directions.
    for j in 0..KEYS {
        let i = (j + index) % KEYS;
        let img = image(&format!("fleet{i}.cl"), &["main"]);
        let p = pm
            .program(&img, &SpecConstants::new(), &BuildOptions::new("-O2"))
            .unwrap();
        sources.push(p.source);
    }
    let remote = pm
        .store_stats()
        .into_iter()
        .find(|l| l.kind == StoreKind::Remote)
        .unwrap();
    println!(
        "MEMBER builds={} remote_hits={} sources={:?}",
        be.builds(),
        remote.hits,
        sources
    );
}

#[test]
fn eight_cold_processes_build_each_key_once_across_the_fleet() {
    let Some(r) = RedisServer::start("eight_cold_processes_build_each_key_once") else {
        return;
    };
    let t = TempDir::new("fleet8");
    let go = t.join("go");
    let mut members = Vec::new();
    for i in 0..PROCESSES {
        let ready = t.join(format!("ready{i}"));
        let ch = child("child_fleet_member", "member")
            .env("KPC_TEST_INDEX", i.to_string())
            .env("KPC_TEST_GO", &go)
            .env("KPC_TEST_READY", &ready)
            .env("KPC_CACHE_DIR", t.join(format!("local{i}")))
            .env("KPC_CACHE_PERSISTENT", "1")
            .env("KPC_CACHE_REMOTE", r.url())
            .env("KPC_CACHE_LOCK_TIMEOUT", "60s")
            .env_remove("KPC_CACHE_REMOTE_KEY")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        members.push((ch, ready));
    }
    for (ch, ready) in &mut members {
        common::disk::wait_for_file(ready, ch);
    }
    std::fs::write(&go, b"").unwrap();
    let mut builds = 0;
    let mut remote_served = 0;
    for (ch, _) in members {
        let out = ch.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}");
        let line = text
            .lines()
            .find(|l| l.starts_with("MEMBER "))
            .unwrap_or_else(|| panic!("no report: {text}"));
        let field = |name: &str| -> usize {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .unwrap()
                .parse()
                .unwrap()
        };
        builds += field("builds=");
        remote_served += field("remote_hits=");
        eprintln!("{line}");
    }
    // Each key built exactly once in the whole fleet; every other request served by the remote.
    assert_eq!(builds, KEYS);
    assert_eq!(remote_served, PROCESSES * KEYS - KEYS);
    assert_eq!(r.keys("kpc/v1/*").len(), KEYS);
    assert!(r.keys("kpc-lock/*").is_empty());
}
