//! Eviction by last access on real files: recency set by hits survives, the oldest goes, the total
//! lands under the low watermark, leftovers and empty directories go, the size file stays right, only
//! one evictor runs at a time, and a deferred sweep hides nothing from readers, loses no entry written
//! meanwhile, and is finished by the next pass when it was killed.

use crate::common;

use std::time::{Duration, SystemTime};

use common::disk::*;
use filetime::FileTime;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::{PutOutcome, StoreKey};

fn age(c: &PersistentCache, k: &StoreKey, secs: u64) {
    let t = FileTime::from_system_time(SystemTime::now() - Duration::from_secs(secs));
    filetime::set_file_atime(c.entry_dir(k).join("0.bin"), t).unwrap();
}

fn atime(c: &PersistentCache, k: &StoreKey) -> FileTime {
    FileTime::from_last_access_time(&std::fs::metadata(c.entry_dir(k).join("0.bin")).unwrap())
}

fn ctime(c: &PersistentCache, k: &StoreKey) -> (i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(c.entry_dir(k).join("0.bin")).unwrap();
    (m.ctime(), m.ctime_nsec())
}

/// Bytes one entry of key `i` with a `len`-byte payload takes on disk.
fn entry_size(i: u64, len: usize) -> u64 {
    let t = TempDir::new("size");
    let c = cache(t.path());
    c.put(&key(i), &payload(i, len), Duration::ZERO);
    entry_bytes(t.path())
}

#[test]
fn a_recently_read_entry_survives_while_the_oldest_goes() {
    let t = TempDir::new("evict");
    let one = entry_size(0, 1000);
    // Room for four entries and a half: the fifth put goes over and evicts down to 75%, i.e. to three.
    let c = PersistentCache::new(settings(t.path()).max_size(one * 9 / 2));
    for i in 0..4 {
        assert_eq!(
            c.put(&key(i), &payload(i, 1000), Duration::ZERO),
            PutOutcome::Published(0)
        );
    }
    // Entry 0 is the oldest by far, then 1, 2, 3; then entry 0 is read.
    for (i, secs) in [(0, 4 * 3600), (1, 3 * 3600), (2, 2 * 3600), (3, 3600)] {
        age(&c, &key(i), secs);
    }
    let before = atime(&c, &key(0));
    assert!(c.get(&key(0)).is_some());
    assert!(
        atime(&c, &key(0)) > before,
        "a hit sets the access time explicitly"
    );
    // The throttle: a second hit within the minute writes nothing. (Checked on the change time: our
    // explicit touch changes it, the kernel's own relatime update on read does not.)
    let touched = ctime(&c, &key(0));
    c.get(&key(0));
    assert_eq!(ctime(&c, &key(0)), touched);

    assert_eq!(
        c.put(&key(4), &payload(4, 1000), Duration::ZERO),
        PutOutcome::Published(0)
    );
    let present: Vec<bool> = (0..5).map(|i| c.get(&key(i)).is_some()).collect();
    assert_eq!(
        present,
        [true, false, false, true, true],
        "1 and 2 were the least recently accessed"
    );
    let s = c.stats();
    assert_eq!((s.evictions, s.evicted_bytes), (2, 2 * one));
    assert_eq!(c.tracked_size(), Some(3 * one));
    assert!(3 * one <= c.settings().max_size * 3 / 4);
}

#[test]
fn background_eviction_brings_the_total_under_the_low_watermark() {
    let t = TempDir::new("evict");
    let max = 20_000;
    let c = PersistentCache::new(
        DiskCacheSettings::new(t.path())
            .max_size(max)
            .background_eviction(true),
    );
    for i in 0..60 {
        c.put(&key(i), &payload(i, 900), Duration::ZERO);
        c.wait_for_eviction();
        assert!(entry_bytes(t.path()) <= max, "after put {i}");
    }
    assert!(c.stats().evictions > 0);
    assert_eq!(c.tracked_size(), Some(entry_bytes(t.path())));
    // The most recent put is always kept (it is the most recently accessed).
    assert!(c.get(&key(59)).is_some());
}

#[test]
fn emptied_directories_are_removed() {
    let t = TempDir::new("evict");
    let c = cache(t.path());
    for i in 0..10 {
        c.put(&key(i), b"x", Duration::ZERO);
    }
    let r = c.evict(Some(0), None).unwrap();
    assert_eq!(
        (r.removed, r.remaining_entries, r.remaining_bytes),
        (10, 0, 0)
    );
    // 10 entries: 10 leaves, 10 spec dirs, 10 image dirs, and the one device dir.
    assert_eq!(r.dirs_removed, 31);
    let left: Vec<_> = std::fs::read_dir(t.join("v1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        left.iter().all(|n| n == "size" || n == "evict.lock"),
        "{left:?}"
    );
    assert_eq!(c.tracked_size(), Some(0));
}

#[test]
fn eviction_removes_a_killed_writers_leftovers_but_not_a_write_in_progress() {
    let t = TempDir::new("evict");
    let c = cache(t.path());
    c.put(&key(1), b"kept", Duration::ZERO);
    let leaf = c.entry_dir(&key(1));
    // Leftovers of killed writers: temporaries of slot 1, an orphan .bin in slot 2, and a per-slot
    // lock file in 3 (what caches written before the leaf lock have).
    std::fs::write(leaf.join("1.bin.tmp"), vec![0u8; 500]).unwrap();
    std::fs::write(leaf.join("1.src.tmp"), vec![0u8; 50]).unwrap();
    std::fs::copy(leaf.join("0.bin"), leaf.join("2.bin")).unwrap();
    std::fs::write(leaf.join("3.lock"), b"").unwrap();
    // A write in progress in another leaf: it holds that leaf's lock (a flock on the directory).
    c.put(&key(2), b"other", Duration::ZERO);
    let busy_leaf = c.entry_dir(&key(2));
    let mut lock2 = fd_lock::RwLock::new(std::fs::File::open(&busy_leaf).unwrap());
    let _held = lock2.try_write().unwrap();
    std::fs::write(busy_leaf.join("1.bin.tmp"), vec![0u8; 10]).unwrap();

    let v = c.verify(false).unwrap();
    assert_eq!((v.valid, v.bad.len(), v.stale.len()), (2, 0, 3), "{v:?}");
    let r = c.evict(None, None).unwrap();
    assert_eq!((r.removed, r.stale_removed, r.busy), (0, 2, 1), "{r:?}");
    let names = |dir: &std::path::Path| {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&leaf), ["0.bin", "0.src"]);
    assert_eq!(names(&busy_leaf), ["0.bin", "0.src", "1.bin.tmp"]);
    assert_eq!(c.get(&key(1)).unwrap().bytes(), b"kept");
    assert_eq!(c.get(&key(2)).unwrap().bytes(), b"other");
    // The write in progress is not counted until it publishes: temporaries never are.
    assert_eq!(c.tracked_size(), Some(entry_bytes(t.path())));
    // The orphan .bin was made by hand (never counted): the pass, which saw no counted change during
    // its walk, corrected the record before subtracting what it removed.
    assert_eq!(c.stats().size_corrections, 1);
}

#[test]
fn prune_older_than_and_to_a_size() {
    let t = TempDir::new("evict");
    let c = cache(t.path());
    for i in 0..6 {
        c.put(&key(i), &payload(i, 100), Duration::ZERO);
    }
    age(&c, &key(0), 10 * 86_400);
    age(&c, &key(1), 8 * 86_400);
    age(&c, &key(2), 3600);
    let r = c
        .evict(
            None,
            Some(SystemTime::now() - Duration::from_secs(7 * 86_400)),
        )
        .unwrap();
    assert_eq!(r.removed, 2);
    assert!(c.get(&key(0)).is_none() && c.get(&key(1)).is_none());
    let one = entry_bytes(t.path()) / 4;
    // Of the rest, key 2 was accessed longest ago; 3, 4 and 5 in the order they were written.
    let r = c.evict(Some(2 * one), None).unwrap();
    assert_eq!(r.removed, 2);
    assert!(
        c.get(&key(2)).is_none(),
        "the oldest of the rest goes first"
    );
    assert_eq!(r.remaining_entries, 2);
}

#[test]
fn size_file_is_rebuilt_and_reconciled() {
    let t = TempDir::new("evict");
    let c = PersistentCache::new(settings(t.path()).max_size(1 << 20));
    for i in 0..5 {
        c.put(&key(i), &payload(i, 1000), Duration::ZERO);
    }
    let truth = entry_bytes(t.path());
    assert_eq!(c.tracked_size(), Some(truth));
    // Deleted: the next put measures the tree.
    std::fs::remove_file(t.join("v1/size")).unwrap();
    c.put(&key(5), &payload(5, 1000), Duration::ZERO);
    let truth = entry_bytes(t.path());
    assert_eq!(c.tracked_size(), Some(truth));
    // Wildly wrong (say, files removed by hand): the next put triggers a pass that finds the cache far
    // under its limit, removes nothing, and writes the truth back.
    std::fs::write(t.join("v1/size"), b"999999999\n").unwrap();
    c.put(&key(6), &payload(6, 1000), Duration::ZERO);
    assert_eq!(c.stats().evictions, 0);
    assert_eq!(c.tracked_size(), Some(entry_bytes(t.path())));
    // Entries removed by hand: tracked total drifts high until a pass measures again.
    std::fs::remove_dir_all(c.entry_dir(&key(0))).unwrap();
    let r = c.evict(None, None).unwrap();
    assert_eq!(r.removed, 0);
    assert_eq!(c.tracked_size(), Some(entry_bytes(t.path())));
}

#[test]
fn only_one_evictor_at_a_time() {
    let t = TempDir::new("evict");
    let one = entry_size(0, 1000);
    let c = PersistentCache::new(
        settings(t.path())
            .max_size(3 * one)
            .lock_timeout(Duration::from_millis(100)),
    );
    for i in 0..3 {
        c.put(&key(i), &payload(i, 1000), Duration::ZERO);
    }
    // Another process is evicting: puts over the limit skip eviction instead of waiting.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(t.join("v1/evict.lock"))
        .unwrap();
    let mut other = fd_lock::RwLock::new(f);
    let held = other.try_write().unwrap();
    for i in 3..6 {
        assert_eq!(
            c.put(&key(i), &payload(i, 1000), Duration::ZERO),
            PutOutcome::Published(0)
        );
    }
    assert_eq!(c.stats().evictions, 0);
    assert_eq!(entry_bytes(t.path()), 6 * one);
    let r = c.evict(Some(0), None).unwrap();
    assert!(
        !r.ran,
        "an explicit pass waits (here 100 ms) and then reports it did not run"
    );
    drop(held);
    c.put(&key(6), &payload(6, 1000), Duration::ZERO);
    assert!(c.stats().evictions >= 4);
    assert!(entry_bytes(t.path()) <= 3 * one * 3 / 4);
}

#[test]
fn unlimited_cache_never_evicts() {
    let t = TempDir::new("evict");
    let c = PersistentCache::new(settings(t.path()).max_size(0));
    for i in 0..30 {
        c.put(&key(i), &payload(i, 2000), Duration::ZERO);
    }
    assert_eq!(c.stats().evictions, 0);
    assert_eq!(c.entries().unwrap().len(), 30);
}

/// Names under `dir`, sorted; empty when it does not exist.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_deferred_sweep_hides_nothing_and_leaves_nothing_behind() {
    let t = TempDir::new("evict");
    let c = cache(t.path());
    for i in 0..10 {
        c.put(&key(i), b"x", Duration::ZERO);
    }
    let r = c.evict_deferred(Some(0), None).unwrap();
    assert!(r.sweep_deferred);
    assert_eq!((r.removed, r.remaining_entries), (10, 0));
    // Gone for readers before the sweep has run, whether or not it has.
    for i in 0..10 {
        assert!(c.get(&key(i)).is_none(), "entry {i}");
    }
    assert!(c.entries().unwrap().is_empty());
    assert_eq!(c.tracked_size(), Some(0));
    c.wait_for_eviction();
    assert_eq!(names(&t.join("v1")), ["evict.lock", "size"]);
    assert_eq!(names(&t.join("trash")), Vec::<String>::new());
}

#[test]
fn an_entry_written_during_a_deferred_sweep_survives_it() {
    let t = TempDir::new("evict");
    let c = cache(t.path());
    for i in 0..20 {
        c.put(&key(i), b"old", Duration::ZERO);
    }
    let r = c.evict_deferred(Some(0), None).unwrap();
    assert_eq!(r.removed, 20);
    // The sweep removes these keys' emptied directories while the puts recreate them: a directory is
    // only removed by rmdir, which fails on a refilled one, and a put whose directory vanished makes it
    // again.
    for i in 0..20 {
        let out = c.put(&key(i), &payload(i, 64), Duration::ZERO);
        assert_eq!(out, PutOutcome::Published(0), "put {i}");
    }
    c.wait_for_eviction();
    for i in 0..20 {
        let hit = c.get(&key(i)).unwrap_or_else(|| panic!("entry {i} lost"));
        assert_eq!(hit.bytes(), payload(i, 64));
    }
    assert_eq!(c.tracked_size(), Some(entry_bytes(t.path())));
}

#[test]
fn a_killed_sweeps_leftovers_go_with_the_next_pass() {
    let t = TempDir::new("evict");
    let c = cache(t.path());
    c.put(&key(0), b"kept", Duration::ZERO);
    c.put(&key(1), b"x", Duration::ZERO);
    // What a sweep killed half-way leaves: a trash directory with files in it, and an image directory
    // whose leaf went but which itself did not.
    let trash = t.join("trash").join("1-2-0");
    std::fs::create_dir_all(&trash).unwrap();
    std::fs::write(trash.join("0"), b"removed entry").unwrap();
    let leaf = c.entry_dir(&key(1));
    let spec = leaf.parent().unwrap().to_owned();
    let image = spec.parent().unwrap().to_owned();
    c.remove(&key(1), None);
    std::fs::remove_dir(&leaf).unwrap();
    std::fs::remove_dir(&spec).unwrap();
    assert!(image.is_dir());
    // A pass that removes nothing still sweeps.
    let r = c.evict(None, None).unwrap();
    assert_eq!((r.removed, r.remaining_entries), (0, 1));
    assert_eq!(r.dirs_removed, 1);
    assert!(!image.exists());
    assert_eq!(names(&t.join("trash")), Vec::<String>::new());
    assert_eq!(c.get(&key(0)).unwrap().bytes(), b"kept");
}

#[test]
fn a_pass_over_many_entries_removes_exactly_the_old_ones() {
    // Enough entries for the walk and the removals to be spread over threads (512 per thread).
    let t = TempDir::new("evict");
    let c = cache(t.path());
    let n = 1040;
    for i in 0..n {
        c.put(&key(i), b"x", Duration::ZERO);
    }
    for i in (0..n).step_by(2) {
        age(&c, &key(i), 3600);
    }
    let cutoff = SystemTime::now() - Duration::from_secs(1800);
    let r = c.evict(None, Some(cutoff)).unwrap();
    assert_eq!((r.removed, r.remaining_entries, r.busy), (n / 2, n / 2, 0));
    // Each removed entry had its own leaf, spec and image directory.
    assert_eq!(r.dirs_removed, 3 * n / 2);
    assert_eq!(c.entries().unwrap().len() as u64, n / 2);
    for i in 0..n {
        assert_eq!(c.get(&key(i)).is_some(), i % 2 == 1, "entry {i}");
    }
    assert_eq!(c.tracked_size(), Some(entry_bytes(t.path())));
    assert_eq!(names(&t.join("trash")), Vec::<String>::new());
}
