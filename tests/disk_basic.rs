//! The disk cache's basic contract on real files: layout, entry format, exact key comparison and
//! collision neighbours, single-flight guards, size gating, counters and trace events.

use crate::common;

use std::time::Duration;

use common::disk::*;
use common::poll_until;
use kpc::Digest;
use kpc::admin::disk::PersistentCache;
use kpc::admin::store::WarnCause;
use kpc::{PutOutcome, StoreKey};

#[test]
fn put_then_get_round_trips_and_lays_out_files() {
    let t = TempDir::new("basic");
    let root = t.join("cache");
    let c = cache(&root);
    let k = key(1);
    assert!(c.get(&k).is_none(), "empty cache misses");
    assert!(!root.exists(), "a lookup creates nothing");

    let data = payload(1, 5000);
    assert_eq!(
        c.put(&k, &data, Duration::from_millis(7)),
        PutOutcome::Published(0)
    );
    let hit = c.get(&k).expect("hit after put");
    assert_eq!(hit.bytes(), &data[..]);
    assert_eq!(hit.slot(), 0);
    assert_eq!(hit.build_time(), Duration::from_millis(7));

    // <root>/v1/<device>/<image>/<spec>/<options>/0.{src,bin}, directory names 16 hex characters.
    let leaf = c.entry_dir(&k);
    let rel: Vec<String> = leaf
        .strip_prefix(root.join("v1"))
        .unwrap()
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    assert_eq!(rel.len(), 4);
    for (name, expect) in rel.iter().zip(k.dir_names()) {
        assert_eq!(name, expect);
        assert_eq!(name.len(), 16);
        assert!(name.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    let mut names: Vec<String> = std::fs::read_dir(&leaf)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    // No temporaries, no build lock and no lock file of any kind are left: an entry is two files
    // (writers and removers lock the leaf directory itself).
    assert_eq!(names, ["0.bin", "0.src"]);

    // Both files start with the header magic; .bin is header + payload exactly.
    let bin = std::fs::read(leaf.join("0.bin")).unwrap();
    assert_eq!(&bin[..8], b"KPCDISK\0");
    assert_eq!(bin.len(), 88 + data.len());
    assert_eq!(&bin[88..], &data[..]);
    // .src holds the full key values in readable form.
    let src = std::fs::read(leaf.join("0.src")).unwrap();
    assert_eq!(&src[..8], b"KPCDISK\0");
    let text = String::from_utf8_lossy(&src[88..]);
    for needle in [
        "Fake Device 9000",
        "-O2 -DKPC=1",
        "image1.spv",
        &Digest::of(b"image-1").to_hex(),
        "\"image_len\": 4096",
        "01000000020700000000000000",
    ] {
        assert!(
            text.contains(needle),
            "{needle:?} missing from .src:\n{text}"
        );
    }

    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.puts), (1, 1, 1));
    let on_disk = entry_bytes(&root);
    assert_eq!(s.bytes_written, on_disk);
    assert_eq!(
        c.tracked_size(),
        Some(on_disk),
        "size file counts both files"
    );
    assert_eq!(s.bytes_read, data.len() as u64);
    assert_eq!(s.build_time_saved, Duration::from_millis(7));
}

#[test]
fn second_put_of_the_same_key_is_already_present() {
    let t = TempDir::new("basic");
    let c = cache(t.path());
    let k = key(2);
    assert_eq!(c.put(&k, b"one", Duration::ZERO), PutOutcome::Published(0));
    assert_eq!(
        c.put(&k, b"two", Duration::ZERO),
        PutOutcome::AlreadyPresent
    );
    assert_eq!(c.get(&k).unwrap().bytes(), b"one");
    assert_eq!(files_named(t.path(), ".bin").len(), 1);
}

#[test]
fn keys_differing_in_any_part_are_distinct_entries() {
    let t = TempDir::new("basic");
    let c = cache(t.path());
    let dev = Digest::of(b"dev");
    let img = Digest::of(b"img");
    let keys = [
        StoreKey::new("backend=a\n", dev, img, 10, b"s", "-O1"),
        StoreKey::new("backend=b\n", dev, img, 10, b"s", "-O1"),
        StoreKey::new("backend=a\n", Digest::of(b"dev2"), img, 10, b"s", "-O1"),
        StoreKey::new("backend=a\n", dev, Digest::of(b"img2"), 10, b"s", "-O1"),
        StoreKey::new("backend=a\n", dev, img, 11, b"s", "-O1"),
        StoreKey::new("backend=a\n", dev, img, 10, b"t", "-O1"),
        StoreKey::new("backend=a\n", dev, img, 10, b"s", "-O2"),
        StoreKey::new("backend=a\n", dev, img, 10, b"", ""),
    ];
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            c.put(k, &payload(i as u64, 100), Duration::ZERO),
            PutOutcome::Published(0)
        );
    }
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            c.get(k).unwrap().bytes(),
            &payload(i as u64, 100)[..],
            "key {i}"
        );
    }
    // The label is informational: it does not make a different key.
    let relabeled = keys[0].clone().with_label("other name");
    assert_eq!(c.get(&relabeled).unwrap().bytes(), &payload(0, 100)[..]);
}

/// A hash collision cannot be produced on demand, so it is staged: a valid entry of key A is moved into
/// key B's leaf as slot 0, exactly what a colliding neighbour looks like to B's readers.
#[test]
fn collision_neighbour_is_compared_exactly_and_the_put_moves_to_n_plus_1() {
    let t = TempDir::new("basic");
    let c = cache(t.path());
    let (a, b) = (key(10), key(11));
    c.put(&a, b"aaaa", Duration::ZERO);
    let (la, lb) = (c.entry_dir(&a), c.entry_dir(&b));
    std::fs::create_dir_all(&lb).unwrap();
    for f in ["0.src", "0.bin"] {
        std::fs::copy(la.join(f), lb.join(f)).unwrap();
    }
    assert!(c.get(&b).is_none(), "A's entry must not answer for B");
    assert_eq!(c.stats().corruptions, 0, "a neighbour is not corruption");
    assert_eq!(c.put(&b, b"bbbb", Duration::ZERO), PutOutcome::Published(1));
    let hb = c.get(&b).unwrap();
    assert_eq!((hb.bytes(), hb.slot()), (&b"bbbb"[..], 1));
    assert_eq!(c.get(&a).unwrap().bytes(), b"aaaa");
    assert!(lb.join("0.src").exists(), "the neighbour is left alone");
    // verify knows the staged neighbour sits where its key does not hash to.
    let r = c.verify(false).unwrap();
    assert_eq!(r.checked, 3);
    assert_eq!(r.bad.len(), 1, "{r:?}");
    assert!(r.bad[0].problem.contains("misplaced"), "{r:?}");
}

#[test]
fn get_or_lock_miss_holds_the_key_lock_until_put() {
    let t = TempDir::new("basic");
    let c = cache(t.path());
    let k = key(3);
    let Lookup::Miss(g) = c.get_or_lock(&k) else {
        panic!("empty cache must miss")
    };
    assert!(g.holds_lock() && g.persists());
    let lock = c.entry_dir(&k).join("key.lock");
    assert!(lock.exists(), "the build lock file exists while held");
    assert_eq!(
        g.put(b"built", Duration::from_millis(3)),
        PutOutcome::Published(0)
    );
    assert!(!lock.exists(), "released and unlinked by the put");
    match c.get_or_lock(&k) {
        Lookup::Hit(h) => assert_eq!(h.bytes(), b"built"),
        Lookup::Miss(_) => panic!("must hit after the put"),
    }
    let s = c.stats();
    assert_eq!(
        (s.hits, s.misses, s.lock_waits, s.lock_timeouts),
        (1, 1, 0, 0)
    );
}

#[test]
fn a_waiter_gets_the_builders_result_and_a_dropped_guard_hands_over() {
    let t = TempDir::new("basic");
    let c = cache(t.path());
    let k = key(4);

    // Builder holds the lock; a second "process" (own instance, own descriptor) waits, then hits.
    let Lookup::Miss(g) = c.get_or_lock(&k) else {
        panic!()
    };
    let other = cache(t.path());
    let (k2, o2) = (k.clone(), other.clone());
    let waiter = std::thread::spawn(move || match o2.get_or_lock(&k2) {
        Lookup::Hit(h) => h.into_bytes(),
        Lookup::Miss(_) => panic!("the waiter must see the builder's entry"),
    });
    // Once the waiter's first look has missed, it goes for the build lock the builder holds: whether
    // it waits there or takes the lock after the put, it must get the builder's bytes and never build.
    poll_until("the waiter's miss", || other.stats().misses == 1);
    g.put(b"result", Duration::ZERO);
    assert_eq!(waiter.join().unwrap(), b"result");
    let s = other.stats();
    // The chain's path counts the first look's miss, then the hit found under the lock.
    assert_eq!((s.hits, s.misses, s.lock_timeouts), (1, 1, 0));
    assert!(s.lock_waits <= 1);

    // A guard dropped without a put (the build failed) lets the next caller build.
    let k = key(5);
    let Lookup::Miss(g) = c.get_or_lock(&k) else {
        panic!()
    };
    let o2 = other.clone();
    let k2 = k.clone();
    let next = std::thread::spawn(move || match o2.get_or_lock(&k2) {
        Lookup::Miss(g) => g.holds_lock(),
        Lookup::Hit(_) => panic!("nothing was put"),
    });
    poll_until("the next caller's miss", || other.stats().misses == 2);
    drop(g);
    assert!(next.join().unwrap(), "the next caller takes over the lock");
    assert_eq!(other.stats().lock_timeouts, 0);
}

#[test]
fn lock_timeout_builds_without_the_lock() {
    let t = TempDir::new("basic");
    let c = cache(t.path());
    let k = key(6);
    let Lookup::Miss(_held) = c.get_or_lock(&k) else {
        panic!()
    };
    let impatient =
        PersistentCache::new(settings(t.path()).lock_timeout(Duration::from_millis(100)));
    let (r, ev) = capture(|| impatient.get_or_lock(&k));
    let Lookup::Miss(g) = r else { panic!() };
    assert!(!g.holds_lock());
    let s = impatient.stats();
    assert_eq!((s.lock_waits, s.lock_timeouts, s.misses), (1, 1, 1));
    assert!(s.lock_wait_time >= Duration::from_millis(100));
    assert_eq!(disk_warnings(&ev), ["lock-timeout"]);
    // It builds and publishes anyway; the holder's own put then finds it present.
    assert_eq!(g.put(b"x", Duration::ZERO), PutOutcome::Published(0));
    assert_eq!(_held.put(b"y", Duration::ZERO), PutOutcome::AlreadyPresent);
}

#[test]
fn image_size_limits_decide_what_persists() {
    let t = TempDir::new("basic");
    let root = t.join("c");
    let c = PersistentCache::new(settings(&root).min_image_size(100).max_image_size(1000));
    for len in [99, 1001] {
        let k = key_n(len, len);
        assert!(c.get(&k).is_none());
        assert_eq!(c.put(&k, b"x", Duration::ZERO), PutOutcome::Skipped);
        let Lookup::Miss(g) = c.get_or_lock(&k) else {
            panic!()
        };
        assert!(!g.persists() && !g.holds_lock());
        assert_eq!(g.put(b"x", Duration::ZERO), PutOutcome::Skipped);
    }
    assert!(!root.exists(), "gated keys never touch the disk");
    assert_eq!(c.stats().skipped, 6);
    assert_eq!(c.stats().misses, 0, "a gated lookup is not a miss");
    for len in [100, 1000] {
        let k = key_n(len, len);
        assert_eq!(c.put(&k, b"x", Duration::ZERO), PutOutcome::Published(0));
        assert!(c.get(&k).is_some());
    }
}

#[test]
fn an_entry_larger_than_the_whole_cache_is_not_stored() {
    let t = TempDir::new("basic");
    let c = PersistentCache::new(settings(t.path()).max_size(4096));
    let (r, ev) = capture(|| {
        (0..5)
            .map(|i| c.put(&key(i), &payload(i, 5000), Duration::ZERO))
            .collect::<Vec<_>>()
    });
    assert!(r.iter().all(|o| *o == PutOutcome::Skipped));
    assert_eq!(
        disk_warnings(&ev),
        ["too-large"],
        "warned once for five puts"
    );
    assert_eq!(c.warnings(), [WarnCause::TooLarge]);
    assert_eq!(
        c.put(&key(9), &payload(9, 1000), Duration::ZERO),
        PutOutcome::Published(0)
    );
}

#[test]
fn trace_events_only_when_asked() {
    let t = TempDir::new("basic");
    let quiet = cache(t.path());
    let loud = PersistentCache::new(settings(t.path()).trace(true));
    let (_, ev) = capture(|| {
        quiet.get(&key(1));
        quiet.put(&key(1), b"q", Duration::ZERO);
        quiet.get(&key(1));
    });
    assert!(ev.iter().all(|e| e.target != "kpc::cache::disk"), "{ev:?}");
    let (_, ev) = capture(|| {
        loud.get(&key(2));
        loud.put(&key(2), b"l", Duration::ZERO);
        loud.get(&key(2));
    });
    let msgs: Vec<&str> = ev
        .iter()
        .filter(|e| e.target == "kpc::cache::disk" && e.level == tracing::Level::DEBUG)
        .filter_map(|e| e.fields.get("message").map(String::as_str))
        .collect();
    assert_eq!(msgs, ["miss", "put", "hit"]);
}

#[test]
fn config_decides_whether_there_is_a_disk_cache() {
    use kpc::Config;
    use std::ffi::OsString;
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(*v))
        }
    };
    let c = Config::from_lookup(env(&[("KPC_CACHE_DIR", "/tmp/kpc-x")])).unwrap();
    let d = PersistentCache::from_config(&c).expect("on by default");
    assert_eq!(d.root(), std::path::Path::new("/tmp/kpc-x"));
    let c = Config::from_lookup(env(&[
        ("KPC_CACHE_DIR", "/tmp/kpc-x"),
        ("KPC_CACHE_PERSISTENT", "0"),
    ]))
    .unwrap();
    assert!(PersistentCache::from_config(&c).is_none());
    let c = Config::from_lookup(env(&[])).unwrap();
    assert!(
        PersistentCache::from_config(&c).is_none(),
        "no KPC_CACHE_DIR, XDG_CACHE_HOME or HOME"
    );
    let c = Config::from_lookup(env(&[("HOME", "/home/u")])).unwrap();
    assert_eq!(
        PersistentCache::from_config(&c).unwrap().root(),
        std::path::Path::new("/home/u/.cache/kpc")
    );
    let c = Config::from_lookup(env(&[
        ("KPC_CACHE_DIR", "/tmp/kpc-y"),
        ("KPC_CACHE_MAX_SIZE", "3M"),
        ("KPC_CACHE_MIN_DEVICE_IMAGE_SIZE", "1K"),
        ("KPC_CACHE_MAX_DEVICE_IMAGE_SIZE", "2M"),
        ("KPC_CACHE_LOCK_TIMEOUT", "250ms"),
        ("KPC_CACHE_TRACE", "1"),
    ]))
    .unwrap();
    let s = PersistentCache::from_config(&c).unwrap().settings().clone();
    assert_eq!(
        (
            s.max_size,
            s.min_image_size,
            s.max_image_size,
            s.lock_timeout,
            s.trace
        ),
        (3 << 20, 1024, 2 << 20, Duration::from_millis(250), true)
    );
}
