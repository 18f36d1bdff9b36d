//! The remote tier against a real redis-server (its own per test, tests/common/redis.rs), with the
//! counting fake backend: hits from the remote are verified and copied to the local disk; every fault
//! (remote down at start, killed mid-run, slower than the timeout, full, garbage, truncated, a value
//! for another key, a poisoned entry) degrades to a local build with one warning per cause; the fleet
//! lock of a killed builder expires; bad URLs are typed errors.
#![cfg(feature = "remote")]

use crate::common;

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::disk::{Ev, TempDir, capture};
use common::fake_backend::{FakeBackend, image, program};
use common::redis::{RedisServer, dead_url};
use kpc::Config;
use kpc::Source;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::store::auth;
use kpc::{BuildOptions, SpecConstants, StoreKind};
use kpc::{ConfigError, MacKey, RemoteUrl};

const SECRET: &str = "0123456789abcdef-fleet-secret";

fn config(root: &Path, url: &str, key: Option<&str>) -> Config {
    Config::builder()
        .cache_dir(root)
        .remote(RemoteUrl::parse(url).unwrap())
        .remote_timeout(Duration::from_millis(500))
        .remote_key(key.map(|k| MacKey::from_secret("KPC_CACHE_REMOTE_KEY", k).unwrap()))
        .lock_timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn manager(be: &Arc<FakeBackend>, cfg: &Config) -> ProgramManager {
    ProgramManager::new(be.clone(), cfg)
}

/// The remote level's (hits, misses, errors, puts) as the store counted them.
fn remote_stats(pm: &ProgramManager) -> (u64, u64, u64, u64) {
    let l = pm
        .store_stats()
        .into_iter()
        .find(|l| l.kind == StoreKind::Remote)
        .expect("a remote level");
    (l.store.hits, l.store.misses, l.store.errors, l.store.puts)
}

/// The causes of the remote store's warnings among `events` (each message printed, for failures).
fn remote_warnings(events: &[Ev]) -> Vec<String> {
    for e in events.iter().filter(|e| e.level == tracing::Level::WARN) {
        eprintln!("warning: {:?}", e.fields);
    }
    events
        .iter()
        .filter(|e| {
            e.level == tracing::Level::WARN
                && e.target == "kpc::cache::store"
                // The message names the store first (`remote:<url>: ...`).
                && e.fields
                    .get("message")
                    .is_some_and(|s| s.starts_with("remote:"))
        })
        .map(|e| e.fields.get("cause").cloned().unwrap_or_default())
        .collect()
}

/// The remote keys of entries (not locks).
fn entries(r: &RedisServer) -> Vec<String> {
    r.keys("kpc/v*")
}

#[test]
fn a_fresh_machine_is_served_by_the_remote_and_the_hit_is_copied_to_its_disk() {
    let Some(r) = RedisServer::start("a_fresh_machine_is_served_by_the_remote") else {
        return;
    };
    let t = TempDir::new("remote-fresh");
    let be = Arc::new(FakeBackend::new().binary_size(16 << 10));
    let pm = manager(&be, &config(&t.join("a"), &r.url(), None));
    for i in 0..3 {
        assert_eq!(program(&pm, i), Source::Built);
    }
    assert_eq!(remote_stats(&pm), (0, 3, 0, 3));
    let keys = entries(&r);
    assert_eq!(keys.len(), 3, "{keys:?}");
    // Namespaced by format version and device digest.
    let dev = pm
        .disk_key(
            &image("k0.cl", &["main"]),
            &SpecConstants::new(),
            &BuildOptions::new("-O2"),
        )
        .device_digest()
        .to_hex();
    assert!(
        keys.iter()
            .all(|k| k.starts_with(&format!("kpc/v1/{dev}/"))),
        "{keys:?}"
    );
    // No fleet lock is left behind.
    assert!(r.keys("kpc-lock/*").is_empty());

    // Another machine: another local disk, same remote.
    let cfg_b = config(&t.join("b"), &r.url(), None);
    let pm_b = manager(&be, &cfg_b);
    for i in 0..3 {
        assert_eq!(program(&pm_b, i), Source::Remote);
    }
    assert_eq!(be.builds(), 3);
    assert_eq!(remote_stats(&pm_b).0, 3);
    let lv = pm_b.store_stats();
    assert_eq!(lv[0].kind, StoreKind::Disk);
    assert_eq!(lv[0].backfills, 3);
    // Its next process hits its own disk.
    let pm_b2 = manager(&be, &cfg_b);
    assert_eq!(program(&pm_b2, 0), Source::Disk);
    assert_eq!(be.builds(), 3);
}

#[test]
fn a_remote_down_at_start_is_one_warning_and_local_builds() {
    let t = TempDir::new("remote-down");
    let be = Arc::new(FakeBackend::new());
    let cfg = config(&t.join("a"), &dead_url(), None);
    let (sources, ev) = capture(|| {
        let pm = manager(&be, &cfg);
        let s: Vec<Source> = (0..5).map(|i| program(&pm, i)).collect();
        (s, remote_stats(&pm))
    });
    assert_eq!(sources.0, vec![Source::Built; 5]);
    assert!(sources.1.2 >= 1, "errors counted: {:?}", sources.1);
    assert_eq!(remote_warnings(&ev), vec!["unavailable"]);
    // The local disk still works.
    assert_eq!(program(&manager(&be, &cfg), 0), Source::Disk);
}

#[test]
fn redis_killed_mid_run_the_run_completes() {
    let Some(mut r) = RedisServer::start("redis_killed_mid_run_the_run_completes") else {
        return;
    };
    let t = TempDir::new("remote-killed");
    let be = Arc::new(FakeBackend::new());
    let cfg = config(&t.join("a"), &r.url(), None);
    let ((), ev) = capture(|| {
        let pm = manager(&be, &cfg);
        assert_eq!(program(&pm, 0), Source::Built);
        assert_eq!(remote_stats(&pm).3, 1);
        r.kill();
        for i in 1..6 {
            assert_eq!(program(&pm, i), Source::Built);
        }
        assert!(remote_stats(&pm).2 >= 1);
        // A fresh machine whose remote died: builds, no failure.
        let pm2 = manager(&be, &config(&t.join("b"), &r.url(), None));
        assert_eq!(program(&pm2, 0), Source::Built);
    });
    let w = remote_warnings(&ev);
    assert!(!w.is_empty(), "the dead remote was warned about");
    let mut unique = w.clone();
    unique.dedup();
    // One warning per cause per store (two stores here: one per manager).
    assert!(w.len() <= 2 * unique.len().max(1), "{w:?}");
    assert_eq!(be.builds(), 7);
}

#[test]
fn a_remote_slower_than_the_timeout_does_not_hold_builds_back() {
    let Some(r) = RedisServer::start("a_remote_slower_than_the_timeout") else {
        return;
    };
    let t = TempDir::new("remote-slow");
    let be = Arc::new(FakeBackend::new());
    let cfg = config(&t.join("a"), &r.url(), None);
    let pm = manager(&be, &cfg);
    assert_eq!(program(&pm, 0), Source::Built);
    // A frozen server: connections open, nothing answers.
    r.signal("STOP");
    let ((), ev) = capture(|| {
        let pm2 = manager(&be, &config(&t.join("b"), &r.url(), None));
        for i in 0..4 {
            assert_eq!(program(&pm2, i), Source::Built);
        }
        assert!(remote_stats(&pm2).2 >= 1);
    });
    r.signal("CONT");
    let w = remote_warnings(&ev);
    assert!(w.contains(&"timeout".to_string()), "{w:?}");
    let mut d = w.clone();
    d.sort();
    d.dedup();
    assert_eq!(d.len(), w.len(), "one warning per cause: {w:?}");
    // Back to normal once it answers again: a third machine (a store of its own, no hold-off) is
    // served by the remote.
    let pm3 = manager(&be, &config(&t.join("c"), &r.url(), None));
    assert_eq!(program(&pm3, 0), Source::Remote);
}

/// The remote level's counters.
fn remote_level(pm: &ProgramManager) -> kpc::StoreStats {
    pm.store_stats()
        .into_iter()
        .find(|l| l.kind == StoreKind::Remote)
        .expect("a remote level")
        .store
}

/// A frozen remote (SIGSTOP: connections open, nothing answers) costs a process one timeout, not one
/// per kernel: the first lookup's timeout opens the circuit breaker, and every later remote call of the
/// run (lookups, fleet locks, publishes, which the build then does not wait for) is skipped. While it
/// stays frozen the hold-off grows (2 s, then 4 s); once it answers, one probe closes the breaker.
#[test]
fn a_frozen_remote_costs_one_timeout_and_the_breaker_skips_the_rest() {
    let Some(r) = RedisServer::start("a_frozen_remote_costs_one_timeout") else {
        return;
    };
    let t = TempDir::new("remote-frozen");
    let be = Arc::new(FakeBackend::new());
    let pm = manager(&be, &config(&t.join("a"), &r.url(), None));
    r.signal("STOP");
    let (s, ev) = capture(|| {
        for i in 0..5 {
            assert_eq!(program(&pm, i), Source::Built);
        }
        remote_level(&pm)
    });
    assert_eq!((s.trips, s.errors, s.puts), (1, 1, 0), "{s:?}");
    // Program 0's fleet lock and publish, and programs 1-4's lookup, lock and publish, all within
    // the first hold-off (2 s; the fake builds take microseconds).
    assert_eq!(s.skipped, 14, "{s:?}");
    assert_eq!(remote_warnings(&ev), vec!["timeout"]);
    // Builds one new program after another (each asks the breaker once) until the remote level's
    // counters say `done`: a deadline poll for a hold-off to pass, whatever the machine's speed.
    let mut next = 5;
    let mut build_until = |what: &str, done: &dyn Fn(&kpc::StoreStats) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert_eq!(program(&pm, next), Source::Built);
            next += 1;
            let s = remote_level(&pm);
            if done(&s) {
                return (s, next - 1);
            }
            assert!(Instant::now() < deadline, "{what} never came: {s:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The first hold-off passes: one lookup probes the still-frozen remote, times out, and the
    // breaker opens again (for 4 s); nothing was published meanwhile.
    let (s, _) = build_until("the first probe", &|s| s.errors == 2);
    assert_eq!((s.trips, s.errors, s.puts), (2, 2, 0), "{s:?}");
    let skipped = s.skipped;
    r.signal("CONT");
    // Answering again, the remote is still not asked until the second hold-off passes; then the
    // probe's lookup is answered (a miss), the breaker closes, and that build is locked for and
    // published as usual: the only publish of the run.
    let (s, last) = build_until("the probe that closes the breaker", &|s| s.puts == 1);
    assert_eq!((s.trips, s.errors, s.puts), (2, 2, 1), "{s:?}");
    assert!(
        s.skipped > skipped,
        "skipped inside the second hold-off: {s:?}"
    );
    assert_eq!(entries(&r).len(), 1);
    assert_eq!(
        program(&manager(&be, &config(&t.join("b"), &r.url(), None)), last),
        Source::Remote
    );
}

#[test]
fn a_full_remote_is_a_skipped_publish_and_a_warning() {
    let Some(r) = RedisServer::start("a_full_remote_is_a_skipped_publish") else {
        return;
    };
    let used: String = r.cmd(&[b"INFO", b"memory"]);
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let limit = (used + (256 << 10)).to_string();
    let _: String = r.cmd(&[b"CONFIG", b"SET", b"maxmemory", limit.as_bytes()]);
    let _: String = r.cmd(&[b"CONFIG", b"SET", b"maxmemory-policy", b"noeviction"]);
    let t = TempDir::new("remote-full");
    let be = Arc::new(FakeBackend::new().binary_size(1 << 20));
    let mut cfg = config(&t.join("a"), &r.url(), None);
    // The fake binaries are padding, which zstd makes almost nothing of: published uncompressed,
    // 1 MiB each, they cannot fit.
    cfg.remote_compress = 0;
    let (stats, ev) = capture(|| {
        let pm = manager(&be, &cfg);
        for i in 0..3 {
            assert_eq!(program(&pm, i), Source::Built);
        }
        remote_stats(&pm)
    });
    assert_eq!(stats.3, 0, "nothing fit: {stats:?}");
    assert!(stats.2 >= 1, "{stats:?}");
    assert_eq!(remote_warnings(&ev), vec!["no-space"]);
    assert!(entries(&r).is_empty());
    // Local disk has them all.
    let pm = manager(&be, &cfg);
    assert!((0..3).all(|i| program(&pm, i) == Source::Disk));
}

/// Replaces the value of program 0's remote entry (`target`) with `f(value)`, builds program 0 on a
/// fresh machine with `key`, restores the value, and returns the source, the remote errors counted,
/// and the remote warnings.
fn tamper(
    r: &RedisServer,
    target: &str,
    t: &TempDir,
    tag: &str,
    key: Option<&str>,
    f: impl Fn(&[u8]) -> Vec<u8>,
) -> (Source, u64, Vec<String>) {
    let v = r.get(target);
    r.set(target, &f(&v));
    let be = Arc::new(FakeBackend::new());
    let cfg = config(&t.join(tag), &r.url(), key);
    let (out, ev) = capture(|| {
        let pm = manager(&be, &cfg);
        let s = program(&pm, 0);
        (s, remote_stats(&pm).2)
    });
    r.set(target, &v);
    (out.0, out.1, remote_warnings(&ev))
}

#[test]
fn poisoned_garbage_truncated_and_misplaced_values_are_refused() {
    let Some(r) = RedisServer::start("poisoned_garbage_truncated_and_misplaced_values") else {
        return;
    };
    let t = TempDir::new("remote-poison");
    let be = Arc::new(FakeBackend::new());
    // Publish key 0 and key 1 with the fleet's key.
    let pm = manager(&be, &config(&t.join("a"), &r.url(), Some(SECRET)));
    assert_eq!(
        (program(&pm, 0), program(&pm, 1)),
        (Source::Built, Source::Built)
    );
    drop(pm);
    let k = Some(SECRET);
    let key0 = {
        let pm = manager(&be, &config(&t.join("x"), &r.url(), k));
        pm.disk_key(
            &image("k0.cl", &["main"]),
            &SpecConstants::new(),
            &BuildOptions::new("-O2"),
        )
    };
    let keys = entries(&r);
    let (k0, k1): (Vec<_>, Vec<_>) = keys
        .iter()
        .partition(|x| x.ends_with(&key0.digest().to_hex()));
    let target = k0[0].as_str();
    // Sanity: untouched, a fresh machine with the key is served.
    assert_eq!(
        tamper(&r, target, &t, "ok", k, |v| v.to_vec()).0,
        Source::Remote
    );
    // A poisoner without the key: a well-formed entry (its own binary, checksums right) with no MAC,
    // or MAC'd with another secret.
    let forged = kpc::seal(&key0, b"FAKEBIN1 evil binary", Duration::ZERO);
    let prov = kpc::admin::store::Provenance::for_key("forger", &key0, None, Duration::ZERO);
    let no_mac = auth::wrap(&None.into(), &key0, &forged, &prov);
    let other = MacKey::from_secret("KPC_CACHE_REMOTE_KEY", "another-secret-of-16+").unwrap();
    let wrong_mac = auth::wrap(&Some(other).into(), &key0, &forged, &prov);
    for (tag, v) in [("nomac", no_mac), ("wrongmac", wrong_mac)] {
        let orig = r.get(target);
        r.set(target, &v);
        let be2 = Arc::new(FakeBackend::new());
        let (out, ev) = capture(|| {
            let pm = manager(&be2, &config(&t.join(tag), &r.url(), k));
            (program(&pm, 0), remote_stats(&pm).2)
        });
        r.set(target, &orig);
        assert_eq!(out, (Source::Built, 1), "{tag}");
        assert_eq!(remote_warnings(&ev), vec!["unauthentic"], "{tag}");
        assert_eq!(
            be2.builds(),
            1,
            "{tag}: the forged binary never reached the backend"
        );
    }

    // Without a key the forged entry would be taken (that is what the key is for, ENVIRONMENT.md) but
    // damage is still refused by the checksums: flip a byte in the binary, truncate, garbage.
    let cases: [(&str, Tamper); 3] = [
        ("flipped", Box::new(flip)),
        ("truncated", Box::new(|v: &[u8]| v[..v.len() / 2].to_vec())),
        (
            "garbage",
            Box::new(|_: &[u8]| b"not an entry at all".to_vec()),
        ),
    ];
    for (tag, f) in cases {
        // Keyless readers see the keyed envelopes as plain ones (the MAC is skipped, the entry checked).
        let (s, errors, w) = tamper(&r, target, &t, tag, None, f);
        assert_eq!((s, errors), (Source::Built, 1), "{tag}");
        assert_eq!(w, vec!["corrupt"], "{tag}");
    }
    // With the key, a flipped byte fails the MAC first.
    let (s, _, w) = tamper(&r, target, &t, "flipped-key", k, flip);
    assert_eq!((s, w), (Source::Built, vec!["unauthentic".to_string()]));

    // A value for another key (key 1's entry copied to key 0's name, intact and MAC'd): refused.
    // Without a key, the entry's own key record and digests refuse it; with one, the MAC (which binds
    // the key) already does.
    let v1 = r.get(k1[0]);
    let (s, errors, w) = tamper(&r, target, &t, "misplaced", None, |_| v1.clone());
    assert_eq!((s, errors), (Source::Built, 1));
    assert_eq!(w, vec!["corrupt"]);
    let (s, errors, w) = tamper(&r, target, &t, "misplaced-key", k, |_| v1.clone());
    assert_eq!((s, errors), (Source::Built, 1));
    assert_eq!(w, vec!["unauthentic"]);
}

/// A change made to a stored value.
type Tamper = Box<dyn Fn(&[u8]) -> Vec<u8>>;

/// Flips one bit of the last byte (inside the binary).
fn flip(v: &[u8]) -> Vec<u8> {
    let mut x = v.to_vec();
    *x.last_mut().unwrap() ^= 1;
    x
}

#[test]
fn a_killed_builders_fleet_lock_expires_and_the_next_process_builds() {
    let Some(r) = RedisServer::start("a_killed_builders_fleet_lock_expires") else {
        return;
    };
    let t = TempDir::new("remote-lock");
    let be = Arc::new(FakeBackend::new());
    let cfg = config(&t.join("a"), &r.url(), None);
    let pm = manager(&be, &cfg);
    let key = pm.disk_key(
        &image("k0.cl", &["main"]),
        &SpecConstants::new(),
        &BuildOptions::new("-O2"),
    );
    // A builder that died holding the lock: its key, its token, a short TTL nobody renews.
    let name = format!(
        "kpc-lock/v1/{}/{}",
        key.device_digest().to_hex(),
        key.digest().to_hex()
    );
    let _: String = r.cmd(&[b"SET", name.as_bytes(), b"dead-builder", b"PX", b"1500"]);
    assert_eq!(program(&pm, 0), Source::Built);
    assert_eq!(be.builds(), 1);
    // Released after the build (compare-and-delete of our own token), and the entry is published.
    assert!(r.keys("kpc-lock/*").is_empty());
    assert_eq!(entries(&r).len(), 1);
}

#[test]
fn bad_remote_values_are_typed_errors_naming_the_variable() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        }
    };
    for v in [
        "http://x",
        "redis://:6379",
        "redis://h:0",
        "redis://h/x",
        "fs://rel",
        "s3://",
        "nohost",
    ] {
        let leaked: &'static [(&str, &str)] =
            Box::leak(vec![("KPC_CACHE_REMOTE", v)].into_boxed_slice());
        match Config::from_lookup(env(leaked)) {
            Err(e @ ConfigError::InvalidUrl { var, .. }) => {
                assert_eq!(var, "KPC_CACHE_REMOTE");
                assert!(
                    e.to_string().contains("redis://"),
                    "says what is accepted: {e}"
                );
            }
            other => panic!("{v}: {other:?}"),
        }
    }
    let e = Config::from_lookup(env(&[("KPC_CACHE_REMOTE_TIMEOUT", "0")])).unwrap_err();
    assert!(e.to_string().contains("KPC_CACHE_REMOTE_TIMEOUT"), "{e}");
    let e = Config::from_lookup(env(&[("KPC_CACHE_REMOTE_TIMEOUT", "soon")])).unwrap_err();
    assert!(e.to_string().contains("KPC_CACHE_REMOTE_TIMEOUT"), "{e}");
    let e = Config::from_lookup(env(&[("KPC_CACHE_REMOTE_KEY", "short")])).unwrap_err();
    assert!(e.to_string().contains("KPC_CACHE_REMOTE_KEY") && !e.to_string().contains("short"));
    let c = Config::from_lookup(env(&[
        ("KPC_CACHE_REMOTE", "redis://10.0.0.1:7000/2"),
        ("KPC_CACHE_REMOTE_TIMEOUT", "250ms"),
    ]))
    .unwrap();
    assert_eq!(c.remote_timeout, Duration::from_millis(250));
    assert!(c.remote.unwrap().has_fleet_lock());
}

#[test]
fn an_fs_remote_serves_a_fresh_machine_and_lists_its_entries() {
    // The fs service: no fleet lock, listing through OpenDAL.
    let t = TempDir::new("remote-fs");
    let url = format!("fs://{}", t.join("shared").display());
    let be = Arc::new(FakeBackend::new());
    let pm = manager(&be, &config(&t.join("a"), &url, Some(SECRET)));
    for i in 0..2 {
        assert_eq!(program(&pm, i), Source::Built);
    }
    let pm_b = manager(&be, &config(&t.join("b"), &url, Some(SECRET)));
    assert_eq!(
        (program(&pm_b, 0), program(&pm_b, 1)),
        (Source::Remote, Source::Remote)
    );
    assert_eq!(be.builds(), 2);
    // Every entry was written aside and renamed into place: nothing is left being written.
    let partial = t.join("shared").join(".kpc-partial");
    assert_eq!(
        std::fs::read_dir(&partial).unwrap().count(),
        0,
        "{partial:?}"
    );
    let remote = kpc::admin::store::RemoteStore::open(
        &RemoteUrl::parse(&url).unwrap(),
        Duration::from_secs(2),
        None,
        Duration::from_secs(2),
    )
    .unwrap();
    let key = pm.disk_key(
        &image("k0.cl", &["main"]),
        &SpecConstants::new(),
        &BuildOptions::new("-O2"),
    );
    let listed = remote.list_device(Some(key.device_digest())).unwrap();
    let mut labels: Vec<_> = listed.iter().map(|e| e.record.label.clone()).collect();
    labels.sort();
    assert_eq!(labels, vec!["k0.cl", "k1.cl"]);
    assert!(
        remote
            .list_device(Some(kpc::Digest([7; 32])))
            .unwrap()
            .is_empty()
    );
}
