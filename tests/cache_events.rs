//! Cache events (`src/cache/events.rs`): what a subscriber is told for a miss that builds and
//! publishes, then for a fresh manager that hits and loads; that kpc's own subscribers (the level
//! counters) agree with what it is told; the memory cache's evictions; that a panicking subscriber
//! costs the request nothing; and that `ContextBuilder::observer` subscribes an embedder to a real
//! device's context.

use crate::common;

use std::sync::{Arc, Mutex};

use common::disk::TempDir;
use common::fake_backend::{FakeBackend, image};
use kpc::admin::runtime::ProgramManager;
use kpc::kernels::{opencl_image, spirv_image};
use kpc::{
    BackendKind, BuildCause, BuildOptions, CacheEvent, CacheObserver, Config, Context, PutOutcome,
    Source, SpecConstants, StoreChain, StoreKind,
};

/// Each event as one short line: what, and where.
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn kind(k: Option<StoreKind>) -> String {
    k.map_or("build".into(), |k| format!("{k:?}"))
}

impl CacheObserver for Recorder {
    fn on_event(&self, event: &CacheEvent<'_>) {
        let line = match *event {
            CacheEvent::Hit { level, .. } => format!("hit {:?}#{}", level.kind, level.index),
            CacheEvent::Miss { level, .. } => format!("miss {:?}#{}", level.kind, level.index),
            CacheEvent::Waited { level, .. } => format!("waited {:?}", level.kind),
            CacheEvent::Loaded {
                level, recompiled, ..
            } => format!("loaded {:?} recompiled={recompiled}", level.kind),
            CacheEvent::Rejected { level, .. } => format!("rejected {:?}", level.kind),
            CacheEvent::Built { binary, cause, .. } => {
                let cause = match cause {
                    BuildCause::Missed => "missed",
                    BuildCause::NoStores => "no-stores",
                    BuildCause::Debug { .. } => "debug",
                    _ => "other",
                };
                format!("built {cause} binary={}", binary.is_some())
            }
            CacheEvent::Published {
                level,
                outcome,
                copy,
                ..
            } => format!(
                "put {:?} stored={} copy={copy}",
                level.kind,
                matches!(outcome, PutOutcome::Published(_))
            ),
            CacheEvent::Evicted { bytes } => format!("evicted {bytes}"),
            CacheEvent::ProgramServed { from } => format!("program from {}", kind(from)),
            CacheEvent::KernelServed { from, entry, .. } => {
                format!("kernel {entry} from {}", kind(from))
            }
            _ => "other".into(),
        };
        self.0.lock().unwrap().push(line);
    }
}

fn disk_config(root: &std::path::Path) -> Config {
    Config::builder().cache_dir(root).build().unwrap()
}

#[test]
fn a_miss_is_told_as_miss_build_put_and_a_fresh_manager_as_hit_and_load() {
    let t = TempDir::new("events");
    let config = disk_config(t.path());
    let be = Arc::new(FakeBackend::new());
    let rec = Arc::new(Recorder::default());
    let chain = || StoreChain::from_config(&config).with_observer(rec.clone());
    let img = image("e.cl", &["main"]);
    let (spec, o) = (SpecConstants::new(), BuildOptions::new("-O2"));

    let pm = ProgramManager::with_stores(be.clone(), &config, chain());
    assert_eq!(pm.program(&img, &spec, &o).unwrap().source, Source::Built);
    assert_eq!(
        rec.take(),
        [
            "miss Disk#0",
            "built missed binary=true",
            "put Disk stored=true copy=false",
            "program from build",
        ]
    );
    // A memory hit is not an event.
    assert_eq!(pm.program(&img, &spec, &o).unwrap().source, Source::Memory);
    assert!(rec.take().is_empty());

    // A fresh manager (a new process): a hit, the load, then the kernel served from the disk.
    let pm2 = ProgramManager::with_stores(be.clone(), &config, chain());
    let k = pm2.kernel(&img, "main", &spec, &o).unwrap();
    assert_eq!(k.source, Source::Disk);
    assert_eq!(
        rec.take(),
        [
            "hit Disk#0",
            "loaded Disk recompiled=false",
            "program from Disk",
            "kernel main from Disk",
        ]
    );
    // kpc's own subscriber, the level counters, counted the same.
    let lv = &pm2.store_stats()[0];
    assert_eq!((lv.hits, lv.misses, lv.puts), (1, 0, 0));
    assert_eq!(be.builds(), 1);
}

#[test]
fn without_stores_a_build_is_told_with_its_cause() {
    let be = Arc::new(FakeBackend::new());
    let rec = Arc::new(Recorder::default());
    let config = Config::builder().persistent(false).build().unwrap();
    let chain = StoreChain::new().with_observer(rec.clone());
    let pm = ProgramManager::with_stores(be, &config, chain);
    let img = image("n.cl", &["main"]);
    let p = pm.program(&img, &SpecConstants::new(), &BuildOptions::default());
    assert_eq!(p.unwrap().source, Source::Built);
    assert_eq!(
        rec.take(),
        ["built no-stores binary=false", "program from build"]
    );
}

#[test]
fn the_memory_caches_evictions_are_told_with_their_cost() {
    let be = Arc::new(FakeBackend::new().binary_size(100));
    let rec = Arc::new(Recorder::default());
    // Room for two programs of 100 bytes.
    let config = Config::builder()
        .persistent(false)
        .in_mem_eviction_threshold(250)
        .build()
        .unwrap();
    let chain = StoreChain::new().with_observer(rec.clone());
    let pm = ProgramManager::with_stores(be, &config, chain);
    for i in 0..5 {
        assert_eq!(common::fake_backend::program(&pm, i), Source::Built);
    }
    let evicted: Vec<String> = rec
        .take()
        .into_iter()
        .filter(|e| e.starts_with("evicted"))
        .collect();
    assert_eq!(evicted.len() as u64, pm.memory_stats().evictions);
    assert_eq!(evicted, ["evicted 100", "evicted 100", "evicted 100"]);
}

/// Each event as its `Debug` text.
#[derive(Default)]
struct Logged(Mutex<Vec<String>>);

impl CacheObserver for Logged {
    fn on_event(&self, event: &CacheEvent<'_>) {
        self.0.lock().unwrap().push(format!("{event:?}"));
    }
}

#[test]
fn an_events_debug_text_shows_a_binary_by_its_length() {
    let t = TempDir::new("events-debug");
    let config = disk_config(t.path());
    let be = Arc::new(FakeBackend::new().binary_size(100_000));
    let log = Arc::new(Logged::default());
    let chain = StoreChain::from_config(&config).with_observer(log.clone());
    let pm = ProgramManager::with_stores(be, &config, chain);
    assert_eq!(common::fake_backend::program(&pm, 0), Source::Built);
    let log = log.0.lock().unwrap();
    let built = log
        .iter()
        .find(|l| l.starts_with("Built"))
        .expect("a Built event");
    assert!(built.contains("binary: Some(100000)"), "{built}");
    assert!(log.iter().all(|l| l.len() < 400), "{log:?}");
}

/// Panics at every event.
struct Panics;

impl CacheObserver for Panics {
    fn on_event(&self, _: &CacheEvent<'_>) {
        panic!("an observer's own bug");
    }
}

#[test]
fn a_panicking_observer_costs_the_request_nothing_and_later_observers_are_told() {
    let t = TempDir::new("events-panic");
    let config = disk_config(t.path());
    let be = Arc::new(FakeBackend::new());
    let rec = Arc::new(Recorder::default());
    let chain = StoreChain::from_config(&config)
        .with_observer(Arc::new(Panics))
        .with_observer(rec.clone());
    let pm = ProgramManager::with_stores(be.clone(), &config, chain);
    let img = image("p.cl", &["main"]);
    let p = pm.program(&img, &SpecConstants::new(), &BuildOptions::default());
    assert_eq!(p.unwrap().source, Source::Built);
    assert_eq!(rec.take().len(), 4);
    assert_eq!(pm.disk_stats().unwrap().puts, 1);
}

crate::backend_tests! {
    fn the_builders_observer_sees_a_real_devices_kernels(backend, test) {
        let Some(device) = common::drivers::device(backend, test) else {
            return;
        };
        let t = TempDir::new("events-ctx");
        let image = match backend {
            BackendKind::Vulkan => spirv_image("saxpy").unwrap(),
            BackendKind::OpenCl => opencl_image("saxpy").unwrap(),
        };
        let rec = Arc::new(Recorder::default());
        let open = || {
            Context::builder()
                .device(&device)
                .config(disk_config(t.path()))
                .observer(rec.clone())
                .build()
                .unwrap()
        };
        let ctx = open();
        assert_eq!(ctx.kernel(&image, "saxpy").unwrap().source(), Source::Built);
        let told = rec.take();
        assert_eq!(told.first().map(String::as_str), Some("miss Disk#0"));
        assert!(told.contains(&"built missed binary=true".to_string()), "{told:?}");
        assert_eq!(told.last().map(String::as_str), Some("kernel saxpy from build"));
        drop(ctx);

        let ctx = open();
        assert_eq!(ctx.kernel(&image, "saxpy").unwrap().source(), Source::Disk);
        let told = rec.take();
        assert_eq!(told.first().map(String::as_str), Some("hit Disk#0"));
        assert_eq!(told.last().map(String::as_str), Some("kernel saxpy from Disk"));
    }
}
