//! Scenarios that span processes, with real child processes (this test binary re-executed): a writer
//! killed with SIGKILL mid-write, a builder killed while holding a key's build lock, and locks held by
//! another process.

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::disk::*;
use kpc::PutOutcome;
use kpc::admin::disk::PersistentCache;

const BIG: usize = 16 << 20;

fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var(name).unwrap())
}

#[test]
fn child() {
    let Some(role) = child_role() else { return };
    let root = env_path("KPC_TEST_ROOT");
    let ready = env_path("KPC_TEST_READY");
    match role.as_str() {
        // Publishes big entries one after another until killed.
        "writer" => {
            let c = cache(&root);
            std::fs::write(&ready, b"").unwrap();
            for i in 0..40 {
                c.put(&key(i), &payload(i, BIG), Duration::ZERO);
            }
        }
        // Takes a key's build lock and dies holding it.
        "holder" => {
            let c = cache(&root);
            let Lookup::Miss(g) = c.get_or_lock(&key(1)) else {
                panic!("fresh cache")
            };
            assert!(g.holds_lock());
            std::fs::write(&ready, b"").unwrap();
            std::thread::sleep(Duration::from_secs(600));
            drop(g);
        }
        // Holds the given locks, as a writer publishing in a leaf (or an evictor) would: a leaf
        // directory's own, or a lock file's (a builder's `key.lock`).
        "locker" => {
            let paths: Vec<PathBuf> = std::env::var("KPC_TEST_LOCKS")
                .unwrap()
                .split(':')
                .map(PathBuf::from)
                .collect();
            let mut held = Vec::new();
            for p in &paths {
                let f = if p.is_dir() {
                    std::fs::File::open(p).unwrap()
                } else {
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(p)
                        .unwrap()
                };
                let mut l = fd_lock::RwLock::new(f);
                std::mem::forget(l.try_write().expect("nobody else holds it"));
                held.push(l);
            }
            std::fs::write(&ready, b"").unwrap();
            std::thread::sleep(Duration::from_secs(600));
            drop(held);
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn sigkill_mid_write_leaves_no_visible_partial_entry_and_blocks_nobody() {
    let t = TempDir::new("kill");
    let root = t.join("c");
    let ready = t.join("ready");
    let mut ch = common::disk::child("child", "writer")
        .env("KPC_TEST_ROOT", &root)
        .env("KPC_TEST_READY", &ready)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&ready, &mut ch);
    // Kill it the moment a temporary file exists: it is then mid-way through writing an entry.
    loop {
        if !files_named(&root, ".tmp").is_empty() {
            break;
        }
        if let Some(st) = ch.try_wait().unwrap() {
            panic!("the writer finished ({st}) before it could be caught mid-write");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    ch.kill().unwrap(); // SIGKILL
    ch.wait().unwrap();
    let tmps = files_named(&root, ".tmp");
    eprintln!("killed with {} temporary files: {tmps:?}", tmps.len());

    // Whatever is visible is whole: every published entry verifies and reads back exactly.
    let c = cache(&root);
    let r = c.verify(false).unwrap();
    assert!(r.bad.is_empty(), "{r:?}");
    assert_eq!(r.checked, r.valid);
    let mut published = 0;
    for i in 0..40 {
        if let Some(h) = c.get(&key(i)) {
            assert_eq!(h.bytes(), &payload(i, BIG)[..]);
            published += 1;
        }
    }
    assert_eq!(published, r.valid);
    assert_eq!(c.stats().corruptions, 0);

    // The next process is not blocked: it takes the interrupted key's lock at once (no wait, no
    // timeout even with a 30 s limit), writes the slot the killed writer left, and is served.
    let k = published;
    let fresh = cache(&root);
    let Lookup::Miss(g) = fresh.get_or_lock(&key(k)) else {
        panic!("the interrupted entry must not be visible")
    };
    assert!(g.holds_lock());
    assert_eq!(
        g.put(&payload(k, 1000), Duration::ZERO),
        PutOutcome::Published(0)
    );
    assert_eq!(fresh.get(&key(k)).unwrap().bytes(), &payload(k, 1000)[..]);
    let s = fresh.stats();
    assert_eq!((s.lock_waits, s.lock_timeouts, s.corruptions), (0, 0, 0));
    assert!(
        files_named(&root, ".tmp").is_empty(),
        "the slot's leftovers were replaced"
    );
    let r = fresh.verify(false).unwrap();
    assert!(r.bad.is_empty() && r.stale.is_empty(), "{r:?}");
}

#[test]
fn builder_killed_while_holding_the_build_lock_leaves_no_stale_lock() {
    let t = TempDir::new("holder");
    let root = t.join("c");
    let ready = t.join("ready");
    let mut ch = common::disk::child("child", "holder")
        .env("KPC_TEST_ROOT", &root)
        .env("KPC_TEST_READY", &ready)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&ready, &mut ch);

    // While it lives, its lock is real: a short-timeout lookup waits and gives up.
    let impatient = PersistentCache::new(settings(&root).lock_timeout(Duration::from_millis(200)));
    let Lookup::Miss(g) = impatient.get_or_lock(&key(1)) else {
        panic!()
    };
    assert!(!g.holds_lock());
    drop(g);
    assert_eq!(impatient.stats().lock_timeouts, 1);

    ch.kill().unwrap();
    ch.wait().unwrap();
    // Dead: the kernel dropped its flock. A 30 s lookup gets the lock without waiting at all.
    let c = cache(&root);
    let Lookup::Miss(g) = c.get_or_lock(&key(1)) else {
        panic!()
    };
    assert!(g.holds_lock());
    let s = c.stats();
    assert_eq!((s.lock_waits, s.lock_timeouts), (0, 0));
    g.put(b"built by the survivor", Duration::ZERO);
    assert_eq!(c.get(&key(1)).unwrap().bytes(), b"built by the survivor");
}

/// Another process holds slot 0's lock of key B's leaf (it is writing that slot) and B's build lock, and
/// slot 0's lock of key A's leaf, where A is published (it is evicting or checking it).
#[test]
fn locks_held_by_another_process() {
    let t = TempDir::new("locks");
    let root = t.join("c");
    let ready = t.join("ready");
    let c = PersistentCache::new(settings(&root).lock_timeout(Duration::from_millis(300)));
    let (a, b) = (key(1), key(2));
    assert_eq!(
        c.put(&a, b"entry A", Duration::ZERO),
        PutOutcome::Published(0)
    );
    let (la, lb) = (c.entry_dir(&a), c.entry_dir(&b));
    std::fs::create_dir_all(&lb).unwrap();
    let lc = c.entry_dir(&key(3));
    std::fs::create_dir_all(&lc).unwrap();
    let locks = [la.clone(), lc.clone(), lb.join("key.lock")]
        .map(|p| p.to_string_lossy().into_owned())
        .join(":");
    let mut ch = common::disk::child("child", "locker")
        .env("KPC_TEST_ROOT", &root)
        .env("KPC_TEST_READY", &ready)
        .env("KPC_TEST_LOCKS", &locks)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&ready, &mut ch);

    // Readers take no lock: A is found although its leaf's lock is held.
    assert_eq!(c.get(&a).unwrap().bytes(), b"entry A");
    // B's builder is "busy": wait, time out, build anyway, and publish (B's leaf is not locked).
    let Lookup::Miss(g) = c.get_or_lock(&b) else {
        panic!()
    };
    assert!(!g.holds_lock());
    assert_eq!(g.put(b"entry B", Duration::ZERO), PutOutcome::Published(0));
    let hb = c.get(&b).unwrap();
    assert_eq!((hb.bytes(), hb.slot()), (&b"entry B"[..], 0));
    let s = c.stats();
    assert_eq!((s.lock_waits, s.lock_timeouts), (1, 1));
    // A writer whose leaf is locked by another process waits for it, gives up after the lock timeout
    // and writes nothing (a put is an optimization; the build it stores has succeeded).
    assert_eq!(
        c.put(&key(3), b"entry C", Duration::ZERO),
        PutOutcome::Skipped
    );
    assert!(files_under(&lc).is_empty(), "{:?}", files_under(&lc));
    assert!(c.get(&key(3)).is_none());
    // An evictor skips A (its leaf is being worked on) but removes B.
    let r = c.evict(Some(0), None).unwrap();
    assert_eq!((r.removed, r.busy), (1, 1), "{r:?}");
    assert_eq!(c.get(&a).unwrap().bytes(), b"entry A");
    assert!(c.get(&b).is_none());

    ch.kill().unwrap();
    ch.wait().unwrap();
    // Released by the kernel: the evictor now removes A too, and the lock files the dead process left.
    let r = c.evict(Some(0), None).unwrap();
    assert_eq!((r.removed, r.busy), (1, 0), "{r:?}");
    assert!(
        files_under(&root.join("v1")).iter().all(|p| {
            let n = p.file_name().unwrap();
            n == "size" || n == "evict.lock"
        }),
        "{:?}",
        files_under(&root)
    );
}
