//! Limits for shared file systems, on real files and real child processes: an entry limit
//! (`KPC_CACHE_MAX_ENTRIES`) kept exactly with the byte total, a free-space floor (`KPC_CACHE_MIN_FREE`)
//! on a small real tmpfs where the machine allows mounting one (else a floor set just under what the
//! temporary directory's file system has free, and the test says so), and lock files kept out of the
//! cache tree in `KPC_CACHE_LOCK_DIR`, where they exclude the processes that share that directory.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::disk::*;
use kpc::MinFree;
use kpc::PutOutcome;
use kpc::admin::disk::PersistentCache;

fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var(name).unwrap())
}

/// `.src` files under `dir` (entries).
fn entries_on_disk(dir: &Path) -> u64 {
    files_named(dir, ".src").len() as u64
}

#[test]
fn the_entry_limit_evicts_the_least_recently_used_and_is_tracked_exactly() {
    let t = TempDir::new("max-entries");
    let c = PersistentCache::new(settings(t.path()).max_size(0).max_entries(8));
    for i in 0..8 {
        assert!(matches!(
            c.put(&key(i), &payload(i, 1000), Duration::ZERO),
            PutOutcome::Published(_)
        ));
    }
    assert_eq!(c.tracked_entries(), Some(8));
    // Keys 0 and 1 used since (access time set explicitly, so relatime cannot hide it).
    let later = filetime::FileTime::from_system_time(
        std::time::SystemTime::now() + Duration::from_secs(3600),
    );
    for i in 0..2 {
        let h = c.get(&key(i)).expect("hit");
        filetime::set_file_atime(h.bin_path(), later).unwrap();
    }
    // The ninth entry takes the count over 8: a pass evicts down to the low watermark (75%: 6).
    c.put(&key(8), &payload(8, 1000), Duration::ZERO);
    c.wait_for_eviction();
    assert_eq!(entries_on_disk(t.path()), 6);
    assert_eq!(c.tracked_entries(), Some(6));
    assert_eq!(c.tracked_size(), Some(entry_bytes(t.path())));
    for i in [0, 1, 8] {
        assert!(matches!(c.get_or_lock(&key(i)), Lookup::Hit(_)), "{i} kept");
    }
    assert_eq!(c.stats().evictions, 3);
    // A record of a kpc without entry counts (three fields) is measured again once, then counted on.
    let size = t.join("v1/size");
    let old = std::fs::read_to_string(&size).unwrap();
    let three: Vec<&str> = old.split_whitespace().take(3).collect();
    std::fs::write(&size, format!("{}\n", three.join(" "))).unwrap();
    assert_eq!(c.tracked_entries(), None);
    let c2 = PersistentCache::new(settings(t.path()).max_size(0).max_entries(8));
    c2.put(&key(9), &payload(9, 1000), Duration::ZERO);
    assert_eq!(c2.tracked_entries(), Some(7));
    assert_eq!(c2.stats().size_rebuilds, 1);
}

/// A tmpfs of `size` and `inodes` mounted at a directory of its own, unmounted on drop; `None`
/// where mounting is not allowed (not root, or no mount namespace of our own).
struct Tmpfs(TempDir);

impl Tmpfs {
    fn mount(tag: &str, size: &str, inodes: u32) -> Option<Tmpfs> {
        let t = TempDir::new(tag);
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},nr_inodes={inodes}"))
            .arg("tmpfs")
            .arg(t.path())
            .stderr(Stdio::null())
            .status()
            .ok()?;
        st.success().then_some(Tmpfs(t))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// Free bytes and inodes of the file system holding `dir` (`df`'s view).
fn free(dir: &Path) -> (u64, u64) {
    let out = Command::new("stat")
        .args(["-f", "-c", "%a %S %d"])
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Vec<u64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0] * v[1], v[2])
}

#[test]
fn a_put_that_would_go_under_the_free_space_floor_is_skipped_with_one_warning() {
    // 4 MiB with a 25% floor (1 MiB): entries of 256 KiB fit until about 3 MiB are used.
    let (root, floor, fs): (PathBuf, MinFree, Option<Tmpfs>) =
        match Tmpfs::mount("floor", "4m", 4096) {
            Some(m) => {
                eprintln!("free-space floor: on a real 4 MiB tmpfs");
                (m.0.join("cache"), MinFree::Fraction(2500), Some(m))
            }
            None => {
                // No mount allowed: the temporary directory's own file system, with a floor 1 MiB
                // under what it has free now (the test's own writes are what uses it up).
                let t = TempDir::new("floor-sim");
                let (avail, _) = free(t.path());
                eprintln!("free-space floor: simulated (tmpfs mount not allowed here)");
                let root = t.join("cache");
                std::mem::forget(t);
                (root, MinFree::Bytes(avail - (1 << 20)), None)
            }
        };
    let c = PersistentCache::new(settings(&root).min_free(floor));
    let (outcomes, ev) = capture(|| {
        (0..16)
            .map(|i| c.put(&key(i), &payload(i, 256 << 10), Duration::ZERO))
            .collect::<Vec<_>>()
    });
    let stored = outcomes
        .iter()
        .filter(|o| matches!(o, PutOutcome::Published(_)))
        .count();
    let skipped = outcomes
        .iter()
        .filter(|o| matches!(o, PutOutcome::Skipped))
        .count();
    assert!(stored >= 2 && skipped >= 2, "{outcomes:?}");
    assert_eq!(stored + skipped, 16, "never a failed put: {outcomes:?}");
    // Skipped once the floor was near, and only then: every later put skipped too.
    assert!(
        outcomes[stored..]
            .iter()
            .all(|o| matches!(o, PutOutcome::Skipped)),
        "{outcomes:?}"
    );
    assert_eq!(disk_warnings(&ev), vec!["low-space"]);
    assert_eq!(c.stats().skipped, skipped as u64);
    assert_eq!(c.stats().failed_puts, 0);
    if fs.is_some() {
        // The floor held: at least 1 MiB is still free.
        assert!(free(&root).0 >= 1 << 20, "{:?}", free(&root));
    }
    // What was stored is served.
    for i in 0..stored as u64 {
        assert!(matches!(c.get_or_lock(&key(i)), Lookup::Hit(_)));
    }
    if fs.is_none() {
        let _ = std::fs::remove_dir_all(root.parent().unwrap());
    }
}

#[test]
fn a_put_that_would_go_under_the_inode_floor_is_skipped_on_a_small_tmpfs() {
    // Inodes are what GPFS/Lustre quotas and container layers run out of first: a tmpfs of 64
    // inodes with a 25% floor stops taking entries (each a few files and directories) at 16 left.
    let Some(m) = Tmpfs::mount("inodes", "64m", 64) else {
        eprintln!(
            "inode floor: not run (tmpfs mount not allowed here; the byte floor test covers the check)"
        );
        return;
    };
    let root = m.0.join("cache");
    let c = PersistentCache::new(settings(&root).min_free(MinFree::Fraction(2500)));
    let (outcomes, ev) = capture(|| {
        (0..40)
            .map(|i| c.put(&key(i), &payload(i, 100), Duration::ZERO))
            .collect::<Vec<_>>()
    });
    let stored = outcomes
        .iter()
        .filter(|o| matches!(o, PutOutcome::Published(_)))
        .count();
    assert!((3..40).contains(&stored), "{outcomes:?}");
    assert_eq!(c.stats().failed_puts, 0, "never ran out of inodes");
    assert_eq!(disk_warnings(&ev), vec!["low-space"]);
    assert!(free(&root).1 >= 16, "{:?}", free(&root));
}

fn with_locks(root: &Path, locks: &Path) -> PersistentCache {
    PersistentCache::new(
        settings(root)
            .lock_dir(Some(locks.to_owned()))
            .lock_timeout(Duration::from_secs(60)),
    )
}

#[test]
fn child_process() {
    let Some(role) = child_role() else { return };
    assert_eq!(role, "builder");
    let (root, locks) = (env_path("KPC_TEST_ROOT"), env_path("KPC_TEST_LOCKS"));
    let (ready, go) = (env_path("KPC_TEST_READY"), env_path("KPC_TEST_GO"));
    let c = with_locks(&root, &locks);
    let Lookup::Miss(g) = c.get_or_lock(&key(1)) else {
        panic!("fresh cache")
    };
    assert!(g.holds_lock());
    std::fs::write(&ready, b"").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !go.exists() {
        assert!(std::time::Instant::now() < deadline, "no go");
        std::thread::sleep(Duration::from_millis(2));
    }
    g.put(&payload(1, 5000), Duration::from_millis(7));
}

#[test]
fn lock_files_live_in_the_lock_dir_and_exclude_the_processes_that_share_it() {
    let t = TempDir::new("lock-dir");
    let (root, locks) = (t.join("cache"), t.join("locks"));
    let (ready, go) = (t.join("ready"), t.join("go"));
    let mut builder = child("child_process", "builder")
        .env("KPC_TEST_ROOT", &root)
        .env("KPC_TEST_LOCKS", &locks)
        .env("KPC_TEST_READY", &ready)
        .env("KPC_TEST_GO", &go)
        .spawn()
        .unwrap();
    wait_for_file(&ready, &mut builder);
    // The builder holds the key's build lock: a file in the lock dir, none in the cache tree.
    let in_tree: Vec<_> = files_under(&root)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".lock"))
        .collect();
    assert!(in_tree.is_empty(), "{in_tree:?}");
    let held = files_named(&locks, ".lock");
    assert!(
        held.iter()
            .any(|p| p.file_name().unwrap().to_string_lossy().starts_with("key-")),
        "{held:?}"
    );
    // A process of another machine (its own lock dir) is not excluded: it builds at once.
    let other = with_locks(&root, &t.join("other-node-locks"));
    let Lookup::Miss(g) = other.get_or_lock(&key(1)) else {
        panic!("nothing published yet")
    };
    assert!(g.holds_lock());
    drop(g);
    // A process sharing the lock dir is excluded: it cannot take the lock (with no time to wait, it
    // builds without it, warned), and once the builder published, it is served the builder's entry.
    let impatient = PersistentCache::new(
        settings(&root)
            .lock_dir(Some(locks.clone()))
            .lock_timeout(Duration::ZERO),
    );
    let (g, ev) = capture(|| impatient.get_or_lock(&key(1)));
    let Lookup::Miss(g) = g else {
        panic!("nothing published yet")
    };
    assert!(!g.holds_lock());
    drop(g);
    assert_eq!(disk_warnings(&ev), vec!["lock-timeout"]);
    std::fs::write(&go, b"").unwrap();
    assert!(builder.wait().unwrap().success());
    match with_locks(&root, &locks).get_or_lock(&key(1)) {
        Lookup::Hit(h) => assert_eq!(h.bytes(), &payload(1, 5000)[..]),
        Lookup::Miss(_) => panic!("the builder's entry"),
    }
    // Eviction and the size file's lock use the lock dir too: the tree holds entries and the record.
    let c = PersistentCache::new(settings(&root).max_entries(4).lock_dir(Some(locks.clone())));
    for i in 10..20 {
        c.put(&key(i), &payload(i, 300), Duration::ZERO);
    }
    c.wait_for_eviction();
    assert_eq!(c.tracked_entries(), Some(entries_on_disk(&root)));
    assert!(entries_on_disk(&root) <= 4);
    let in_tree: Vec<_> = files_under(&root)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".lock"))
        .collect();
    assert!(in_tree.is_empty(), "no lock file in the tree: {in_tree:?}");
    assert!(root.join("v1/size").is_file());
    let names: Vec<String> = files_under(&locks)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(names.contains(&"evict.lock".to_string()), "{names:?}");
    assert!(names.contains(&"size.lock".to_string()), "{names:?}");
}
