//! Concurrency on real files: hundreds of threads on one key, eviction under constant pressure, and 8
//! processes x 20 threads started together on an empty cache, which must build each key exactly once.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::disk::*;
use common::poll_until;
use kpc::PutOutcome;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use rand::Rng;

/// `threads` threads start together on one key of `size` bytes; half share one cache instance, half
/// have their own (as separate contexts would). Exactly one builds; everyone gets its bytes.
fn single_flight(threads: usize, size: usize) {
    let t = TempDir::new("flight");
    let shared = cache(t.path());
    let k = key(size as u64);
    let data = Arc::new(payload(size as u64, size));
    let builds = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(threads));
    let instances: Vec<PersistentCache> = (0..threads)
        .map(|i| {
            if i % 2 == 0 {
                shared.clone()
            } else {
                cache(t.path())
            }
        })
        .collect();
    // Distinct instances (the shared one appears many times), for counting.
    let distinct: Arc<Vec<PersistentCache>> = Arc::new(
        std::iter::once(shared.clone())
            .chain(instances.iter().skip(1).step_by(2).cloned())
            .collect(),
    );
    let misses = |d: &[PersistentCache]| d.iter().map(|c| c.stats().misses).sum::<u64>() as usize;
    let handles: Vec<_> = instances
        .iter()
        .cloned()
        .map(|c| {
            let (k, data, builds, barrier, distinct) = (
                k.clone(),
                data.clone(),
                builds.clone(),
                barrier.clone(),
                distinct.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                match c.get_or_lock(&k) {
                    Lookup::Hit(h) => assert_eq!(h.bytes(), &data[..]),
                    Lookup::Miss(g) => {
                        builds.fetch_add(1, Ordering::SeqCst);
                        assert!(g.holds_lock());
                        // Nothing is published before this put, so every thread's first look misses
                        // and then queues on the build lock: the build waits until all of them have.
                        poll_until("every thread's miss", || misses(&distinct) == threads);
                        assert_eq!(
                            g.put(&data, Duration::from_millis(20)),
                            PutOutcome::Published(0)
                        );
                    }
                }
                assert_eq!(c.get(&k).expect("published").bytes(), &data[..]);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        builds.load(Ordering::SeqCst),
        1,
        "{threads} threads x {size} B: one build"
    );
    let (mut hits, mut corruptions, mut timeouts) = (0, 0, 0);
    for c in distinct.iter() {
        let s = c.stats();
        hits += s.hits;
        corruptions += s.corruptions;
        timeouts += s.lock_timeouts;
    }
    // Every thread: a first look (a miss), then the build lock (a hit for all but the builder) and a
    // last get (always a hit).
    assert_eq!(misses(&distinct), threads);
    assert_eq!(hits as usize, 2 * threads - 1);
    assert_eq!((corruptions, timeouts), (0, 0));
    let r = shared.verify(false).unwrap();
    assert_eq!((r.checked, r.valid, r.stale.len()), (1, 1, 0), "{r:?}");
}

#[test]
fn single_flight_300_threads_128_bytes() {
    single_flight(300, 128);
}

#[test]
fn single_flight_100_threads_10_kb() {
    single_flight(100, 10 << 10);
}

#[test]
fn single_flight_20_threads_1_mb() {
    single_flight(20, 1 << 20);
}

/// Without the build lock: every thread puts and gets the same key at once. Duplicate slots are allowed;
/// a partial, torn or foreign read is not.
fn put_get_storm(threads: usize, size: usize) {
    let t = TempDir::new("storm");
    let k = key(size as u64 + 1);
    let data = Arc::new(payload(size as u64 + 1, size));
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let c = cache(t.path());
            let (k, data, barrier) = (k.clone(), data.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..3 {
                    if let Some(h) = c.get(&k) {
                        assert_eq!(h.bytes(), &data[..]);
                    }
                    // Skipped: every slot was locked by a writer still writing, none published yet.
                    match c.put(&k, &data, Duration::ZERO) {
                        PutOutcome::Published(_) | PutOutcome::AlreadyPresent => {
                            assert_eq!(c.get(&k).expect("present after a put").bytes(), &data[..])
                        }
                        PutOutcome::Skipped => {}
                        PutOutcome::Failed => panic!("a put failed"),
                    }
                }
                c.stats()
            })
        })
        .collect();
    let mut puts = 0;
    for h in handles {
        let s = h.join().unwrap();
        assert_eq!((s.corruptions, s.read_errors, s.failed_puts), (0, 0, 0));
        puts += s.puts;
    }
    let r = cache(t.path()).verify(false).unwrap();
    assert!(r.bad.is_empty() && r.stale.is_empty(), "{r:?}");
    assert_eq!(r.valid, puts, "every published slot is a valid entry");
    assert!(puts >= 1);
}

#[test]
fn put_get_storm_300_threads_128_bytes() {
    put_get_storm(300, 128);
}

#[test]
fn put_get_storm_100_threads_10_kb() {
    put_get_storm(100, 10 << 10);
}

#[test]
fn put_get_storm_20_threads_1_mb() {
    put_get_storm(20, 1 << 20);
}

/// 40 threads hammer a cache limited to a few KB: constant eviction, in background threads, racing with
/// readers and writers. Nothing crashes or deadlocks, every hit is exact, and the cache ends within limit.
#[test]
fn eviction_under_constant_pressure_40_threads() {
    let t = TempDir::new("pressure");
    let max = 6 << 10;
    let c = PersistentCache::new(
        DiskCacheSettings::new(t.path())
            .max_size(max)
            .background_eviction(true),
    );
    let size_of = |i: u64| 200 + (i as usize * 37) % 1200;
    let handles: Vec<_> = (0..40)
        .map(|n| {
            let c = if n % 2 == 0 {
                c.clone()
            } else {
                PersistentCache::new(c.settings().clone())
            };
            std::thread::spawn(move || {
                let mut rng = rand::rng();
                for _ in 0..60 {
                    let i = rng.random_range(0..120u64);
                    let k = key(i);
                    match rng.random_range(0..3) {
                        0 => {
                            if let Some(h) = c.get(&k) {
                                assert_eq!(h.bytes(), &payload(i, size_of(i))[..]);
                            }
                        }
                        1 => {
                            c.put(&k, &payload(i, size_of(i)), Duration::ZERO);
                        }
                        _ => match c.get_or_lock(&k) {
                            Lookup::Hit(h) => assert_eq!(h.bytes(), &payload(i, size_of(i))[..]),
                            Lookup::Miss(g) => {
                                g.put(&payload(i, size_of(i)), Duration::ZERO);
                            }
                        },
                    }
                }
                c.wait_for_eviction();
                c.stats()
            })
        })
        .collect();
    let mut evictions = 0;
    for h in handles {
        let s = h.join().unwrap();
        assert_eq!(
            (s.corruptions, s.read_errors, s.failed_puts, s.lock_timeouts),
            (0, 0, 0, 0),
            "{s:?}"
        );
        evictions += s.evictions;
    }
    c.wait_for_eviction();
    assert!(evictions > 0, "a few KB cannot hold 120 entries");
    let r = c.evict(Some(max), None).unwrap();
    assert!(r.ran && r.remaining_bytes <= max, "{r:?}");
    assert_eq!(
        c.tracked_size(),
        Some(entry_bytes(t.path())),
        "tracked size reconciled"
    );
    let v = c.verify(false).unwrap();
    assert!(v.bad.is_empty(), "{v:?}");
}

// ---------------------------------------------------------------------------------------------------
// 8 processes x 20 threads

const KEYS: u64 = 12;

fn size_for(i: u64) -> usize {
    [128, 10 << 10, 1 << 20][(i % 3) as usize]
}

#[test]
fn child() {
    let Some(role) = child_role() else { return };
    assert_eq!(role, "hammer");
    let root = PathBuf::from(std::env::var("KPC_TEST_ROOT").unwrap());
    let builds_file = PathBuf::from(std::env::var("KPC_TEST_BUILDS").unwrap());
    let go = PathBuf::from(std::env::var("KPC_TEST_GO").unwrap());
    let c = PersistentCache::new(DiskCacheSettings::new(&root));
    while !go.exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let handles: Vec<_> = (0..20u64)
        .map(|tid| {
            let (c, builds_file) = (c.clone(), builds_file.clone());
            std::thread::spawn(move || {
                for j in 0..KEYS {
                    let i = (j + tid) % KEYS;
                    let data = payload(i, size_for(i));
                    match c.get_or_lock(&key(i)) {
                        Lookup::Hit(h) => assert_eq!(h.bytes(), &data[..], "key {i}"),
                        Lookup::Miss(g) => {
                            append_line(&builds_file, &format!("{i} pid={}", std::process::id()));
                            // A build long enough for every other process to pile up on the lock.
                            std::thread::sleep(Duration::from_millis(30));
                            assert_eq!(
                                g.put(&data, Duration::from_millis(30)),
                                PutOutcome::Published(0)
                            );
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = c.stats();
    assert_eq!(
        (s.corruptions, s.lock_timeouts, s.failed_puts),
        (0, 0, 0),
        "{s:?}"
    );
    println!(
        "CHILD-OK hits={} misses={} waits={}",
        s.hits, s.misses, s.lock_waits
    );
}

fn append_line(path: &Path, line: &str) {
    // One write(2) with O_APPEND: lines from concurrent processes never interleave.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

#[test]
fn eight_processes_x_20_threads_build_each_key_once() {
    let t = TempDir::new("procs");
    let root = t.join("cache");
    let builds = t.join("builds.txt");
    let go = t.join("go");
    let children: Vec<_> = (0..8)
        .map(|_| {
            common::disk::child("child", "hammer")
                .env("KPC_TEST_ROOT", &root)
                .env("KPC_TEST_BUILDS", &builds)
                .env("KPC_TEST_GO", &go)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::fs::write(&go, b"go").unwrap();
    let mut waits = 0;
    for ch in children {
        let out = ch.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("CHILD-OK"), "{text}");
        waits += text
            .split("waits=")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap();
    }
    let log = std::fs::read_to_string(&builds).unwrap();
    let mut per_key = vec![0; KEYS as usize];
    for line in log.lines() {
        per_key[line.split(' ').next().unwrap().parse::<usize>().unwrap()] += 1;
    }
    assert_eq!(
        per_key,
        vec![1; KEYS as usize],
        "builds per key across 160 threads:\n{log}"
    );
    assert!(
        waits > 0,
        "with 160 threads on 12 keys some must have waited"
    );
    let c = cache(&root);
    let r = c.verify(false).unwrap();
    assert_eq!((r.checked, r.valid), (KEYS, KEYS), "{r:?}");
    for i in 0..KEYS {
        assert_eq!(
            c.get(&key(i)).unwrap().bytes(),
            &payload(i, size_for(i))[..]
        );
    }
}
