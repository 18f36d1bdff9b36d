//! The disk cache behind the in-memory cache, through `ProgramManager`, with a counting fake backend:
//! a memory miss loads a persisted binary, a build is persisted, a refused binary is rebuilt and
//! replaced, a failed build persists nothing, and no disk problem ever fails a request.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::disk::{TempDir, capture, disk_warnings};
use common::fake_backend::{AsFake, FakeBackend, image};
use kpc::Source;
use kpc::admin::disk::PersistentCache;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::store::WarnCause;
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Config, Error};
use kpc::{DeviceImage, ImageFormat};

fn config(root: &std::path::Path) -> Config {
    Config::builder().cache_dir(root).build().unwrap()
}

fn spec() -> SpecConstants {
    SpecConstants::new().with(0, SpecValue::U32(64))
}

/// An image of exactly `len` bytes (no entry points: for program-level tests).
fn sized(name: &str, len: usize) -> DeviceImage {
    DeviceImage::new(name, ImageFormat::OpenClC, vec![b'x'; len])
}

fn loads(be: &FakeBackend) -> usize {
    be.binary_loads.load(Ordering::SeqCst)
}

#[test]
fn a_new_context_loads_what_an_earlier_one_built() {
    let t = TempDir::new("wiring");
    let be = Arc::new(FakeBackend::new());
    let img = image("attn.cl", &["main", "aux"]);
    let opts = BuildOptions::new("-O2");

    let pm1 = ProgramManager::new(be.clone(), &config(t.path()));
    let p = pm1.program(&img, &spec(), &opts).unwrap();
    assert_eq!(p.source, Source::Built);
    assert!(!p.value.fake().from_disk);
    assert_eq!(
        pm1.program(&img, &spec(), &opts).unwrap().source,
        Source::Memory
    );
    let s = pm1.disk_stats().unwrap();
    assert_eq!((s.misses, s.puts, s.hits), (1, 1, 0));

    // A fresh context (as a new process would have): memory miss, disk hit, no build.
    let pm2 = ProgramManager::new(be.clone(), &config(t.path()));
    let p2 = pm2.program(&img, &spec(), &opts).unwrap();
    assert_eq!(p2.source, Source::Disk);
    assert!(p2.value.fake().from_disk);
    assert_eq!(p2.value.fake().binary, p.value.fake().binary);
    assert_eq!(p2.value.fake().spec0, Some(64));
    assert_eq!((be.builds(), loads(&be)), (1, 1));
    assert_eq!(
        pm2.program(&img, &spec(), &opts).unwrap().source,
        Source::Memory
    );
    // Kernels report where their program came from.
    let pm3 = ProgramManager::new(be.clone(), &config(t.path()));
    let k = pm3.kernel(&img, "main", &spec(), &opts).unwrap();
    assert_eq!(k.source, Source::Disk);
    assert_eq!(k.value.fake().entry, "main");
    assert!(k.value.fake().program.from_disk);
    assert_eq!(k.value.fake().run(3), 192);
    assert_eq!(
        pm3.kernel(&img, "main", &spec(), &opts).unwrap().source,
        Source::Memory
    );
    assert_eq!(be.builds(), 1);

    // Anything in the key differing means a different entry: options, spec constants, image.
    let pm4 = ProgramManager::new(be.clone(), &config(t.path()));
    assert_eq!(
        pm4.program(&img, &spec(), &BuildOptions::new("-O3"))
            .unwrap()
            .source,
        Source::Built
    );
    let other_spec = SpecConstants::new().with(0, SpecValue::U32(128));
    assert_eq!(
        pm4.program(&img, &other_spec, &opts).unwrap().source,
        Source::Built
    );
    assert_eq!(
        pm4.program(&image("other.cl", &["main"]), &spec(), &opts)
            .unwrap()
            .source,
        Source::Built
    );
    assert_eq!(be.builds(), 4);
}

#[test]
fn build_time_saved_is_counted_on_disk_hits() {
    let t = TempDir::new("wiring");
    let be = Arc::new(FakeBackend::new().build_delay(Duration::from_millis(30)));
    let img = image("slow.cl", &["main"]);
    ProgramManager::new(be.clone(), &config(t.path()))
        .program(&img, &spec(), &BuildOptions::default())
        .unwrap();
    let pm = ProgramManager::new(be.clone(), &config(t.path()));
    pm.program(&img, &spec(), &BuildOptions::default()).unwrap();
    let s = pm.disk_stats().unwrap();
    assert_eq!(s.hits, 1);
    // The entry records the original build's duration, which included the 30 ms sleep.
    assert!(s.build_time_saved >= Duration::from_millis(30), "{s:?}");
}

#[test]
fn a_refused_binary_is_removed_rebuilt_and_replaced() {
    let t = TempDir::new("wiring");
    let be = Arc::new(FakeBackend::new());
    let img = image("a.cl", &["main"]);
    let o = BuildOptions::default();
    ProgramManager::new(be.clone(), &config(t.path()))
        .program(&img, &spec(), &o)
        .unwrap();

    be.reject_binaries.store(true, Ordering::SeqCst);
    let pm = ProgramManager::new(be.clone(), &config(t.path()));
    let (p, ev) = capture(|| pm.program(&img, &spec(), &o).unwrap());
    assert_eq!(
        p.source,
        Source::Built,
        "refused binary: built instead, request succeeds"
    );
    assert_eq!(be.builds(), 2);
    let s = pm.disk_stats().unwrap();
    assert_eq!((s.rejected, s.puts), (1, 1), "{s:?}");
    assert_eq!(disk_warnings(&ev), ["rejected"]);

    be.reject_binaries.store(false, Ordering::SeqCst);
    let pm = ProgramManager::new(be.clone(), &config(t.path()));
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Disk);
    let disk = pm.disk_cache().unwrap();
    assert_eq!(
        disk.entries().unwrap().len(),
        1,
        "the refused entry was replaced, not kept beside"
    );
}

#[test]
fn a_failed_build_persists_nothing_and_releases_the_build_lock() {
    let t = TempDir::new("wiring");
    let be = Arc::new(FakeBackend::new());
    be.fail_with(|_, img| {
        Some(Error::Build {
            backend: kpc::BackendKind::Vulkan,
            image: img.name().into(),
            code: -11,
            message: "fake compile error".into(),
            log: String::new(),
        })
    });
    let img = image("bad.cl", &["main"]);
    let o = BuildOptions::default();
    let pm = ProgramManager::new(be.clone(), &config(t.path()));
    let e = pm.program(&img, &spec(), &o).unwrap_err();
    assert!(e.to_string().contains("fake compile error"), "{e}");
    assert_eq!(pm.disk_stats().unwrap().puts, 0);
    let disk = pm.disk_cache().unwrap();
    let key = pm.disk_key(&img, &spec(), &o);
    assert!(
        !disk.entry_dir(&key).join("key.lock").exists(),
        "the lock went with the failed build"
    );
    // And so did the leaf directory chain made for the lock: no empty directories remain.
    let leftovers: Vec<_> = walkdir::WalkDir::new(t.path().join("v1"))
        .min_depth(1)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_dir())
        .filter(|e| std::fs::read_dir(e.path()).unwrap().next().is_none())
        .map(|e| e.path().display().to_string())
        .collect();
    assert!(
        leftovers.is_empty(),
        "empty directories left: {leftovers:?}"
    );
    // Another process gets the lock at once and builds.
    be.fail_with(|_, _| None);
    let pm2 = ProgramManager::new(be.clone(), &config(t.path()));
    assert_eq!(
        pm2.program(&img, &spec(), &o).unwrap().source,
        Source::Built
    );
    let s = pm2.disk_stats().unwrap();
    assert_eq!((s.lock_waits, s.puts), (0, 1));
}

#[test]
fn nothing_to_persist_and_serialization_errors() {
    let t = TempDir::new("wiring");
    let be = Arc::new(FakeBackend::new());
    let o = BuildOptions::default();
    be.no_binary.store(true, Ordering::SeqCst);
    let pm = ProgramManager::new(be.clone(), &config(t.path()));
    assert_eq!(
        pm.program(&sized("a", 10), &spec(), &o).unwrap().source,
        Source::Built
    );
    assert_eq!(pm.disk_stats().unwrap().puts, 0);

    be.no_binary.store(false, Ordering::SeqCst);
    be.binary_error.store(true, Ordering::SeqCst);
    let pm = ProgramManager::new(be.clone(), &config(t.path()));
    let (p, ev) = capture(|| pm.program(&sized("b", 10), &spec(), &o).unwrap());
    assert_eq!(p.source, Source::Built);
    assert_eq!(disk_warnings(&ev), ["serialize"]);
    assert_eq!(pm.disk_cache().unwrap().warnings(), [WarnCause::Serialize]);
    assert!(pm.disk_cache().unwrap().entries().unwrap().is_empty());
}

#[test]
fn disabled_disk_cache_is_clean() {
    use std::ffi::OsString;
    let t = TempDir::new("wiring");
    let root = t.join("never");
    let root_s = root.to_string_lossy().into_owned();
    let be = Arc::new(FakeBackend::new());
    let img = sized("a", 100);
    let o = BuildOptions::default();
    let lookup = |pairs: Vec<(&'static str, String)>| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    };
    for c in [
        Config::from_lookup(lookup(vec![
            ("KPC_CACHE_DIR", root_s.clone()),
            ("KPC_CACHE_PERSISTENT", "0".into()),
        ]))
        .unwrap(),
        // No KPC_CACHE_DIR, XDG_CACHE_HOME or HOME: nothing to resolve.
        Config::from_lookup(lookup(vec![])).unwrap(),
    ] {
        for _ in 0..2 {
            let pm = ProgramManager::new(be.clone(), &c);
            assert!(pm.disk_stats().is_none() && pm.disk_cache().is_none());
            assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Built);
        }
    }
    assert_eq!(be.builds(), 4);
    assert!(!root.exists(), "a disabled cache creates nothing");
}

#[test]
fn image_size_limits_keep_programs_in_memory_only() {
    let t = TempDir::new("wiring");
    let be = Arc::new(FakeBackend::new());
    let c = Config::builder()
        .cache_dir(t.path())
        .min_device_image_size(1024)
        .build()
        .unwrap();
    let o = BuildOptions::default();
    for _ in 0..2 {
        let pm = ProgramManager::new(be.clone(), &c);
        assert_eq!(
            pm.program(&sized("tiny", 100), &spec(), &o).unwrap().source,
            Source::Built
        );
        assert_eq!(
            pm.disk_stats().unwrap().skipped,
            1,
            "one gated request, counted once"
        );
    }
    let pm = ProgramManager::new(be.clone(), &c);
    pm.program(&sized("big", 2048), &spec(), &o).unwrap();
    let pm = ProgramManager::new(be.clone(), &c);
    assert_eq!(
        pm.program(&sized("big", 2048), &spec(), &o).unwrap().source,
        Source::Disk
    );
}

#[test]
fn an_unusable_cache_directory_never_fails_a_build() {
    let t = TempDir::new("wiring");
    std::fs::write(t.join("file"), b"x").unwrap();
    let be = Arc::new(FakeBackend::new());
    // The root cannot be created (a file is in its path): the disk cache is left out when the
    // manager is made, with one warning that names the cause, and every program is built.
    let ((pm, r), ev) = capture(|| {
        let pm = ProgramManager::new(be.clone(), &config(&t.join("file/kpc")));
        let r = (0..10)
            .map(|i| {
                pm.program(
                    &sized(&format!("i{i}"), 100 + i),
                    &spec(),
                    &BuildOptions::default(),
                )
            })
            .collect::<Vec<_>>();
        (pm, r)
    });
    assert!(
        r.iter()
            .all(|p| p.as_ref().unwrap().source == Source::Built)
    );
    assert_eq!(disk_warnings(&ev), ["unusable-root"]);
    assert!(pm.disk_stats().is_none());
    let why = pm.disk_unusable().unwrap();
    assert!(
        why.contains("cannot create cache root") && why.contains("file/kpc"),
        "{why}"
    );
}

/// Contexts of one process share nothing in memory, but the disk layer's build lock makes them build a
/// program once between them.
#[test]
fn contexts_in_parallel_build_once_through_the_disk_lock() {
    let t = TempDir::new("wiring");
    let be = Arc::new(FakeBackend::new().build_delay(Duration::from_millis(50)));
    let shared = PersistentCache::from_config(&config(t.path()));
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let (be, barrier, root) = (be.clone(), barrier.clone(), t.path().to_owned());
            let disk = if i % 2 == 0 {
                shared.clone()
            } else {
                PersistentCache::from_config(&config(&root))
            };
            std::thread::spawn(move || {
                let pm = ProgramManager::with_disk_cache(be, &config(&root), disk);
                barrier.wait();
                pm.program(
                    &image("shared.cl", &["main"]),
                    &spec(),
                    &BuildOptions::default(),
                )
                .unwrap()
                .source
            })
        })
        .collect();
    let sources: Vec<Source> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(be.builds(), 1, "{sources:?}");
    assert_eq!(sources.iter().filter(|s| **s == Source::Built).count(), 1);
    assert_eq!(sources.iter().filter(|s| **s == Source::Disk).count(), 7);
}
