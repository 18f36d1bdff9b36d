//! Sealed mode with the counting fake backend and real files: after sealing, a build is refused
//! (`error`, `Error::Sealed` with the stores' miss explanation) or built and logged (`warn`); hits of
//! memory, disk, a read-only layer and blobs are unaffected; the seal after a warm start; counters.
//! The real-driver side (lavapipe, PoCL, `KPC_CACHE_SEAL` through `Context`) is in
//! `tests/seal_drivers.rs`.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::disk::{Ev, TempDir, capture};
use common::fake_backend::{AsFake, FakeBackend, image};
use kpc::admin::disk::DiskCacheSettings;
use kpc::admin::disk::PersistentCache;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::runtime::{WarmStart, load_if_stored};
use kpc::admin::store::ReadOnlyStore;
use kpc::{BuildOptions, SpecConstants, SpecValue, StoreChain};
use kpc::{Config, Error, SealMode};
use kpc::{KernelRequest, SealStats, Source};

fn config(root: &Path) -> Config {
    Config::builder().cache_dir(root).build().unwrap()
}

fn manager(root: &Path) -> ProgramManager {
    ProgramManager::new(Arc::new(FakeBackend::new()), &config(root))
}

fn spec(v: u32) -> SpecConstants {
    SpecConstants::new().with(0, SpecValue::U32(v))
}

fn acquire(pm: &ProgramManager, s: &SpecConstants, o: &BuildOptions) -> kpc::Result<Source> {
    pm.kernel(&image("attn", &["decode"]), "decode", s, o)
        .map(|a| a.source)
}

fn seal_lines(events: &[Ev]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.level == tracing::Level::WARN && e.target == "kpc::seal")
        .map(|e| e.fields.get("message").cloned().unwrap_or_default())
        .collect()
}

/// A first process: builds the kernel with spec constant 0 = 64 into the disk cache at `root`.
fn populate(root: &Path) {
    let pm = manager(root);
    let o = BuildOptions::default();
    assert_eq!(acquire(&pm, &spec(64), &o).unwrap(), Source::Built);
}

#[test]
fn sealed_error_refuses_a_build_with_the_field_that_differs_and_serves_disk_hits() {
    let dir = TempDir::new("seal-error");
    populate(dir.path());
    let pm = manager(dir.path());
    pm.seal(SealMode::Error);
    let o = BuildOptions::default();
    // A disk hit is unaffected, and then a memory hit.
    assert_eq!(acquire(&pm, &spec(64), &o).unwrap(), Source::Disk);
    assert_eq!(acquire(&pm, &spec(64), &o).unwrap(), Source::Memory);
    // A variant no store holds: refused, nothing built, with the field-level explanation.
    let e = acquire(&pm, &spec(128), &o).unwrap_err();
    let Error::Sealed { kernel, why } = &e else {
        panic!("expected Error::Sealed, got {e:?}");
    };
    assert_eq!(kernel, "attn:decode");
    assert_eq!(why, "spec-changed: spec constant 0: 64 → 128");
    assert!(e.to_string().contains("attn:decode"), "{e}");
    let o2 = BuildOptions::new("-DFAST");
    let Error::Sealed { why, .. } = acquire(&pm, &spec(64), &o2).unwrap_err() else {
        panic!("expected Error::Sealed");
    };
    assert_eq!(why, "options-changed: options \"\" → \"-DFAST\"");
    assert_eq!(pm.fake().builds(), 0, "nothing was built after sealing");
    let s = pm.seal_stats();
    assert_eq!(
        (s.mode, s.builds, s.refused, s.budget_left),
        (SealMode::Error, 0, 2, None)
    );
    // Refusals are not cached: once another process published the variant, it is served from disk.
    let other = manager(dir.path());
    assert_eq!(acquire(&other, &spec(128), &o).unwrap(), Source::Built);
    assert_eq!(acquire(&pm, &spec(128), &o).unwrap(), Source::Disk);
    // Unsealed, it builds again.
    pm.seal(SealMode::Off);
    assert_eq!(acquire(&pm, &spec(64), &o2).unwrap(), Source::Built);
    assert_eq!(pm.fake().builds(), 1);
    assert_eq!(pm.seal_stats().refused, 2);
}

#[test]
fn sealed_warn_builds_and_logs_one_line_with_kernel_explanation_and_time() {
    let dir = TempDir::new("seal-warn");
    populate(dir.path());
    let pm = manager(dir.path());
    pm.seal(SealMode::Warn);
    let o = BuildOptions::default();
    let (r, events) = capture(|| {
        let first = acquire(&pm, &spec(128), &o).unwrap();
        let again = acquire(&pm, &spec(128), &o).unwrap();
        let hit = acquire(&pm, &spec(64), &o).unwrap();
        (first, again, hit)
    });
    assert_eq!(r, (Source::Built, Source::Memory, Source::Disk));
    let lines = seal_lines(&events);
    assert_eq!(lines.len(), 1, "one line for the one build: {lines:?}");
    let l = &lines[0];
    assert!(
        l.starts_with("sealed context built attn:decode in ")
            && l.contains(" ms: spec-changed: spec constant 0: 64 → 128"),
        "{l}"
    );
    let ev = events.iter().find(|e| e.target == "kpc::seal").unwrap();
    assert_eq!(ev.fields["kernel"], "attn:decode");
    assert!(ev.fields["ms"].parse::<f64>().unwrap() >= 0.0);
    assert_eq!(pm.fake().builds(), 1);
    let s = pm.seal_stats();
    assert_eq!(
        (s.mode, s.builds, s.refused, s.budget_left),
        (SealMode::Warn, 1, 0, None)
    );
}

#[test]
fn unsealed_builds_log_nothing_and_count_nothing() {
    let dir = TempDir::new("seal-off");
    let pm = manager(dir.path());
    let (r, events) = capture(|| acquire(&pm, &spec(1), &BuildOptions::default()));
    assert_eq!(r.unwrap(), Source::Built);
    assert!(seal_lines(&events).is_empty());
    assert_eq!(pm.seal_stats(), SealStats::default());
}

#[test]
fn a_read_only_layer_serves_a_sealed_manager_and_explains_its_misses() {
    let (local, shipped) = (TempDir::new("seal-local"), TempDir::new("seal-ro"));
    populate(shipped.path());
    let ro = PersistentCache::new(DiskCacheSettings::from_config_at(
        &config(shipped.path()),
        shipped.path(),
    ));
    let chain = StoreChain::new()
        .with_disk(PersistentCache::from_config(&config(local.path())).unwrap())
        .with_store(Arc::new(ReadOnlyStore::new(Arc::new(ro))));
    let pm =
        ProgramManager::with_stores(Arc::new(FakeBackend::new()), &config(local.path()), chain);
    pm.seal(SealMode::Error);
    let o = BuildOptions::default();
    assert_eq!(acquire(&pm, &spec(64), &o).unwrap(), Source::ReadOnly);
    // The local disk now holds the backfilled entry, so the nearest entry is local.
    let Error::Sealed { why, .. } = acquire(&pm, &spec(65), &o).unwrap_err() else {
        panic!("expected Error::Sealed");
    };
    assert_eq!(why, "spec-changed: spec constant 0: 64 → 65");
    // Another image name: nothing similar anywhere.
    let Error::Sealed { kernel, why } = pm
        .kernel(&image("other", &["k"]), "k", &spec(1), &o)
        .unwrap_err()
    else {
        panic!("expected Error::Sealed");
    };
    assert_eq!(
        (kernel.as_str(), why.as_str()),
        ("other:k", "new-key: nothing similar cached")
    );
    assert_eq!(pm.fake().builds(), 0);
}

#[test]
fn the_nearest_entry_of_a_read_only_layer_is_named_when_the_local_disk_has_nothing_near() {
    let (local, shipped) = (TempDir::new("seal-local2"), TempDir::new("seal-ro2"));
    populate(shipped.path());
    let ro = PersistentCache::new(DiskCacheSettings::from_config_at(
        &config(shipped.path()),
        shipped.path(),
    ));
    let chain = StoreChain::new()
        .with_disk(PersistentCache::from_config(&config(local.path())).unwrap())
        .with_store(Arc::new(ReadOnlyStore::new(Arc::new(ro))));
    let pm =
        ProgramManager::with_stores(Arc::new(FakeBackend::new()), &config(local.path()), chain);
    pm.seal(SealMode::Error);
    let Error::Sealed { why, .. } = acquire(&pm, &spec(7), &BuildOptions::default()).unwrap_err()
    else {
        panic!("expected Error::Sealed");
    };
    let want = format!(
        "spec-changed: spec constant 0: 64 → 7 (nearest entry in readonly:disk:{})",
        shipped.path().display()
    );
    assert_eq!(why, want);
}

#[test]
fn a_sealed_manager_without_stores_says_so_and_blobs_still_load() {
    let mem_only = Config::builder().persistent(false).build().unwrap();
    let maker = ProgramManager::new(Arc::new(FakeBackend::new()), &mem_only);
    let img = image("blobbed", &["k"]);
    let built = maker
        .kernel(&img, "k", &spec(3), &BuildOptions::default())
        .unwrap();
    let binary = built.value.fake().program.binary.clone();

    let pm = ProgramManager::new(Arc::new(FakeBackend::new()), &mem_only);
    pm.seal(SealMode::Error);
    let Error::Sealed { why, .. } = pm
        .kernel(&img, "k", &spec(4), &BuildOptions::default())
        .unwrap_err()
    else {
        panic!("expected Error::Sealed");
    };
    assert!(
        why.starts_with("no persistent store is configured"),
        "{why}"
    );
    // A blob is a load, not a build: served while sealed.
    let a = pm
        .kernel_from_binary(&img, "k", &spec(3), &BuildOptions::default(), &binary)
        .unwrap();
    assert_eq!(a.source, Source::Blob);
    assert_eq!(pm.fake().builds(), 0);
    assert_eq!(pm.seal_stats().refused, 1);
}

#[test]
fn a_warm_start_seals_when_it_finishes_and_what_it_loaded_is_served() {
    let dir = TempDir::new("seal-warm");
    populate(dir.path());
    let first = manager(dir.path());
    let digest = first.backend().fingerprint().digest;
    let ws = WarmStart::new(dir.path(), &digest, "seal-app");
    ws.record(&KernelRequest::new(&image("attn", &["decode"]), "decode").spec(spec(64)));
    assert_eq!(ws.save().unwrap(), Some(1));

    let pm = Arc::new(manager(dir.path()));
    let ws = Arc::new(WarmStart::new(dir.path(), &digest, "seal-app"));
    let (m, s) = (pm.clone(), pm.clone());
    ws.start_then(
        move |r| load_if_stored(&m, r),
        move || s.seal(SealMode::Error),
    );
    let report = ws.wait().unwrap();
    assert_eq!(report.loaded, 1);
    assert_eq!(pm.seal_stats().mode, SealMode::Error);
    let o = BuildOptions::default();
    assert_eq!(acquire(&pm, &spec(64), &o).unwrap(), Source::Memory);
    assert!(matches!(
        acquire(&pm, &spec(99), &o),
        Err(Error::Sealed { .. })
    ));
    assert_eq!(pm.fake().builds(), 0);
}

#[test]
fn a_refused_acquisition_leaves_nothing_cached_for_concurrent_callers() {
    let dir = TempDir::new("seal-threads");
    let pm = Arc::new(manager(dir.path()));
    pm.seal(SealMode::Error);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let pm = pm.clone();
            std::thread::spawn(move || acquire(&pm, &spec(5), &BuildOptions::default()))
        })
        .collect();
    for t in threads {
        assert!(matches!(t.join().unwrap(), Err(Error::Sealed { .. })));
    }
    assert_eq!(pm.fake().builds(), 0);
    assert_eq!(pm.seal_stats().refused, 8);
    pm.seal(SealMode::Off);
    assert_eq!(
        acquire(&pm, &spec(5), &BuildOptions::default()).unwrap(),
        Source::Built
    );
}

/// The build budget with the fake backend: `n` builds after the warm-up run unsealed, each counted
/// down; the next finds the seal in force (`warn` where the configured mode is off), and the budget
/// seals once, however many threads find it spent.
#[test]
fn a_build_budget_seals_after_that_many_builds() {
    let dir = TempDir::new("seal-budget");
    let pm = manager(dir.path());
    pm.seal_after_warm_up(SealMode::Off, Some(2));
    let o = BuildOptions::default();
    assert_eq!(pm.seal_stats().budget_left, Some(2));
    assert_eq!(acquire(&pm, &spec(1), &o).unwrap(), Source::Built);
    assert_eq!(pm.seal_stats().budget_left, Some(1));
    assert_eq!(acquire(&pm, &spec(2), &o).unwrap(), Source::Built);
    assert_eq!(pm.seal_stats().mode, SealMode::Off);
    let (src, events) = capture(|| acquire(&pm, &spec(3), &o).unwrap());
    assert_eq!(src, Source::Built, "warn builds");
    let s = pm.seal_stats();
    assert_eq!((s.mode, s.builds, s.budget_left), (SealMode::Warn, 1, None));
    let lines = seal_lines(&events);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("build budget"), "{lines:?}");
    // Hits are unaffected; error past a budget of 0 refuses the first build.
    assert_eq!(acquire(&pm, &spec(1), &o).unwrap(), Source::Memory);
    let pm = manager(TempDir::new("seal-budget-0").path());
    pm.seal_after_warm_up(SealMode::Error, Some(0));
    assert!(matches!(
        acquire(&pm, &spec(4), &o),
        Err(Error::Sealed { .. })
    ));
    assert_eq!(pm.fake().builds(), 0);
}
