//! Remote retention against a real redis-server (tests/common/redis.rs): last-served records written
//! on publish and on hits (once per period per store), garbage collection by age, by quota and of
//! dead fingerprint namespaces that keeps an entry served after the plan was made, and the
//! `KPC_CACHE_REMOTE_NOT_BEFORE` cut-off.
#![cfg(feature = "remote")]

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::disk::{TempDir, capture};
use common::fake_backend::{FakeBackend, key, program};
use common::redis::RedisServer;
use kpc::Config;
use kpc::RemoteUrl;
use kpc::Source;
use kpc::StoreKind;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::store::{GcPolicy, GcReason, RemoteStore};
use kpc::{Access, Store, StoreKey};

fn config(root: &Path, url: &str) -> Config {
    Config::builder()
        .cache_dir(root)
        .remote(RemoteUrl::parse(url).unwrap())
        .remote_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

fn entry(k: &StoreKey) -> String {
    format!(
        "kpc/v1/{}/{}",
        k.device_digest().to_hex(),
        k.digest().to_hex()
    )
}

fn record(k: &StoreKey) -> String {
    format!("kpc-served/{}", &entry(k)[4..])
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

const DAY: u64 = 86_400;

/// The time a last-served record holds, `None` if there is none.
fn served(r: &RedisServer, k: &StoreKey) -> Option<u64> {
    let v: Option<String> = r.cmd(&[b"GET", record(k).as_bytes()]);
    v.map(|s| s.parse().unwrap())
}

/// Waits (bounded) until `k`'s record says at least `t`: the records are written in the background.
fn served_since(r: &RedisServer, k: &StoreKey, t: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while served(r, k).is_none_or(|s| s < t) {
        assert!(
            Instant::now() < deadline,
            "{} never recorded a serve",
            entry(k)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn store(url: &str) -> RemoteStore {
    let t = Duration::from_secs(2);
    RemoteStore::open(&RemoteUrl::parse(url).unwrap(), t, None, t).unwrap()
}

#[test]
fn serves_are_recorded_on_publish_and_on_hits_once_per_period() {
    let Some(r) = RedisServer::start("serves_are_recorded_on_publish_and_on_hits") else {
        return;
    };
    let t = TempDir::new("retention-touch");
    let be = Arc::new(FakeBackend::new());
    let start = now();
    let pm = ProgramManager::new(be.clone(), &config(&t.join("a"), &r.url()));
    assert_eq!(program(&pm, 0), Source::Built);
    let k = key(&pm, 0);
    served_since(&r, &k, start);
    // An old record; a hit through a store records the serve again, once.
    r.set(&record(&k), b"1000");
    let s = store(&r.url());
    assert!(s.get(&k, Access::ReadWrite).is_some());
    served_since(&r, &k, start);
    r.set(&record(&k), b"1000");
    assert!(s.get(&k, Access::ReadWrite).is_some());
    // Dropping the store drains its queue: nothing more was written.
    drop(s);
    assert_eq!(
        served(&r, &k),
        Some(1000),
        "one record per period and store"
    );
}

#[test]
fn gc_removes_the_unserved_and_what_exceeds_the_quota_and_keeps_what_is_served() {
    let Some(r) = RedisServer::start("gc_removes_the_unserved_and_keeps_what_is_served") else {
        return;
    };
    let t = TempDir::new("retention-gc");
    let be = Arc::new(FakeBackend::new().binary_size(16 << 10));
    let pm = ProgramManager::new(be.clone(), &config(&t.join("a"), &r.url()));
    for i in 0..6 {
        assert_eq!(program(&pm, i), Source::Built);
    }
    // A retired driver's namespace: another device's entries, nobody served for 40 days.
    let old_be = Arc::new(FakeBackend::with_device("retired-device").binary_size(16 << 10));
    let old_pm = ProgramManager::new(old_be, &config(&t.join("old"), &r.url()));
    assert_eq!(program(&old_pm, 0), Source::Built);
    let keys: Vec<StoreKey> = (0..6).map(|i| key(&pm, i)).collect();
    let retired = key(&old_pm, 0);
    for k in keys.iter().chain([&retired]) {
        served_since(&r, k, 0);
    }
    // Every entry last served 10 days ago, the retired one 40 days ago; an orphan record.
    for k in &keys {
        r.set(&record(k), (now() - 10 * DAY).to_string().as_bytes());
    }
    r.set(&record(&retired), (now() - 40 * DAY).to_string().as_bytes());
    r.set("kpc-served/v1/00/11", b"1");
    // A fleet machine is served entries 0 and 1 now.
    let start = now();
    let big = || Arc::new(FakeBackend::new().binary_size(16 << 10));
    let reader = ProgramManager::new(big(), &config(&t.join("b"), &r.url()));
    assert_eq!(
        (program(&reader, 0), program(&reader, 1)),
        (Source::Remote, Source::Remote)
    );
    served_since(&r, &keys[0], start);
    served_since(&r, &keys[1], start);

    let gc = store(&r.url());
    let policy = GcPolicy::default()
        .older_than(Some(Duration::from_secs(DAY)))
        .max_size(None);
    let plan = gc.gc_plan(policy, SystemTime::now()).unwrap();
    assert_eq!(plan.entries.len(), 7);
    assert_eq!(plan.namespaces, 2);
    assert_eq!(plan.dead_namespaces, vec![retired.device_digest().to_hex()]);
    let planned: Vec<&str> = plan
        .remove
        .iter()
        .map(|&(i, why)| {
            assert_eq!(why, GcReason::Age);
            plan.entries[i].path.as_str()
        })
        .collect();
    assert_eq!(planned.len(), 5, "{planned:?}");
    assert!(!planned.contains(&entry(&keys[0]).as_str()));
    // Entry 3 is served between the plan and its execution: the collector keeps it.
    let start = now();
    assert!(store(&r.url()).get(&keys[3], Access::ReadWrite).is_some());
    served_since(&r, &keys[3], start);
    let report = gc.gc_apply(&plan).unwrap();
    assert_eq!(
        (report.removed_by_age, report.kept_served, report.gone),
        (4, 1, 0)
    );
    assert_eq!(
        report.records_removed,
        4 + 1,
        "the removed entries' and the orphan"
    );
    let left: Vec<String> = r.keys("kpc/v1/*");
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            left.contains(&entry(k)),
            [0, 1, 3].contains(&i),
            "entry {i}"
        );
    }
    assert!(!left.contains(&entry(&retired)));
    assert!(r.keys("kpc-served/v1/00/*").is_empty());
    // A fresh machine is served what stayed and builds what went.
    let fresh = ProgramManager::new(big(), &config(&t.join("c"), &r.url()));
    let got: Vec<Source> = (0..6).map(|i| program(&fresh, i)).collect();
    assert_eq!(
        got,
        [
            Source::Remote,
            Source::Remote,
            Source::Built,
            Source::Remote,
            Source::Built,
            Source::Built
        ]
    );
    drop(fresh);
    // The quota: entries 0, 1, 3 and the three rebuilt ones; what fits in two entries' bytes stays,
    // the least recently served go first (0, 1 and 3 were served before the rebuilds).
    let one = plan.entries[0].bytes;
    let quota = GcPolicy::default()
        .older_than(None)
        .max_size(Some(2 * one + one / 2));
    let plan = gc.gc_plan(quota, SystemTime::now()).unwrap();
    assert_eq!(plan.entries.len(), 6);
    assert!(plan.remove.iter().all(|&(_, w)| w == GcReason::Quota));
    assert_eq!(plan.remove.len(), 4);
    let report = gc.gc_apply(&plan).unwrap();
    assert_eq!(report.removed_by_quota + report.kept_served, 4);
    let bytes: u64 = r
        .keys("kpc/v1/*")
        .iter()
        .map(|k| r.get(k).len() as u64)
        .sum();
    assert!(
        bytes <= 2 * one + one / 2 || report.kept_served > 0,
        "{bytes}"
    );
}

#[test]
fn a_cut_off_refuses_entries_built_before_it() {
    let Some(r) = RedisServer::start("a_cut_off_refuses_entries_built_before_it") else {
        return;
    };
    let t = TempDir::new("retention-cutoff");
    let pm = ProgramManager::new(
        Arc::new(FakeBackend::new()),
        &config(&t.join("a"), &r.url()),
    );
    assert_eq!(program(&pm, 0), Source::Built);
    let fleet = |tag: &str, not_before: u64| {
        let mut c = config(&t.join(tag), &r.url());
        c.remote_not_before = Some(not_before);
        let be = Arc::new(FakeBackend::new());
        let ((src, errors), ev) = capture(|| {
            let pm = ProgramManager::new(be.clone(), &c);
            let s = program(&pm, 0);
            let l = pm
                .store_stats()
                .into_iter()
                .find(|l| l.kind == StoreKind::Remote)
                .unwrap();
            (s, l.store.errors)
        });
        let warned: Vec<String> = ev
            .iter()
            .filter(|e| e.level == tracing::Level::WARN && e.target == "kpc::cache::store")
            .map(|e| e.fields.get("cause").cloned().unwrap_or_default())
            .collect();
        (src, errors, warned, be.builds())
    };
    // A cut-off an hour ago: the entry, built now, is served.
    assert_eq!(
        fleet("before", now() - 3600),
        (Source::Remote, 0, vec![], 0)
    );
    // A cut-off an hour from now (a publisher revoked after it published): refused, built.
    let (src, errors, warned, builds) = fleet("after", now() + 3600);
    assert_eq!((src, errors, builds), (Source::Built, 1, 1));
    assert_eq!(warned, vec!["untrusted"]);
}
