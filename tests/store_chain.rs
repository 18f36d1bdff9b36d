//! The store seam through `ProgramManager` and `Context`: an embedder's own store (a map behind a
//! mutex, written here) receives builds and serves fresh managers and contexts without a rebuild; the
//! chain asks its stores in order, stops at the first hit and copies it up to the local disk; what a
//! store returns is verified, and what the backend refuses is removed from it.

use crate::common;

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::disk::TempDir;
use common::drivers::{opencl_device, random_f32, test_config, vulkan_device};
use common::fake_backend::{AsFake, FakeBackend, image};
use kpc::BackendKind;
use kpc::DeviceInfo;
use kpc::Source;
use kpc::StoreKey;
use kpc::admin::runtime::ProgramManager;
use kpc::{
    Access, BuildOptions, Removal, SpecConstants, SpecValue, Store, StoreChain, StoreHit,
    StoreKind, StoreStats,
};
use kpc::{Config, Context, PushConstants};
use kpc::{LevelStats, PutOutcome, StoreEntry, sealed_record};
use kpc::{StoreCounters, seal};

/// An embedder's store: sealed entries in a map, keyed by the key's digest. It verifies what it hands
/// back through `StoreHit::unseal`, as every store outside kpc must.
#[derive(Debug, Default)]
struct MemStore {
    map: Mutex<HashMap<[u8; 32], Vec<u8>>>,
    counters: StoreCounters,
    removed: AtomicUsize,
}

impl MemStore {
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
    /// Flips one bit of every stored entry's last byte (inside the binary).
    fn damage(&self) {
        for v in self.map.lock().unwrap().values_mut() {
            *v.last_mut().unwrap() ^= 0x04;
        }
    }
}

impl Store for MemStore {
    fn name(&self) -> String {
        "mem".into()
    }

    fn get(&self, key: &StoreKey, _access: Access) -> Option<StoreHit> {
        // Cloned out so the map's lock is not held while the entry is verified.
        let sealed = self.map.lock().unwrap().get(&key.digest().0).cloned();
        let Some(sealed) = sealed else {
            self.counters.miss();
            return None;
        };
        match StoreHit::unseal(key, &sealed) {
            Ok(hit) => {
                self.counters.hit(hit.bytes().len());
                Some(hit)
            }
            Err(_) => {
                self.counters.error();
                self.counters.miss();
                None
            }
        }
    }

    fn put(&self, key: &StoreKey, bytes: &[u8], build_time: Duration) -> PutOutcome {
        let sealed = seal(key, bytes, build_time);
        self.counters.put(sealed.len());
        self.map.lock().unwrap().insert(key.digest().0, sealed);
        PutOutcome::Published(0)
    }

    fn remove(&self, key: &StoreKey, what: Removal<'_>) -> bool {
        let mut map = self.map.lock().unwrap();
        let go = match (what, map.get(&key.digest().0)) {
            (_, None) => false,
            (Removal::Any, Some(_)) => true,
            (Removal::Refused { bytes, .. }, Some(sealed)) => {
                StoreHit::unseal(key, sealed).is_ok_and(|h| h.bytes() == bytes)
            }
        };
        if go {
            map.remove(&key.digest().0);
            self.removed.fetch_add(1, Ordering::SeqCst);
        }
        go
    }

    fn list(&self) -> io::Result<Vec<StoreEntry>> {
        Ok(self
            .map
            .lock()
            .unwrap()
            .values()
            .filter_map(|s| Some(StoreEntry::new(sealed_record(s)?, s.len() as u64, None)))
            .collect())
    }

    fn stats(&self) -> StoreStats {
        self.counters.snapshot()
    }
}

fn no_disk() -> Config {
    Config::builder().persistent(false).build().unwrap()
}

fn with_disk(root: &Path) -> Config {
    Config::builder().cache_dir(root).build().unwrap()
}

fn spec() -> SpecConstants {
    SpecConstants::new().with(0, SpecValue::U32(3))
}

fn loads(be: &FakeBackend) -> usize {
    be.binary_loads.load(Ordering::SeqCst)
}

fn level<'a>(stats: &'a [LevelStats], name: &str) -> &'a LevelStats {
    stats
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no level {name} in {stats:?}"))
}

#[test]
fn an_embedders_store_receives_puts_and_serves_a_fresh_manager() {
    let be = Arc::new(FakeBackend::new());
    let mem = Arc::new(MemStore::default());
    let img = image("attn.cl", &["main"]);
    let o = BuildOptions::new("-O2");
    let only_mem = || StoreChain::new().with_store(mem.clone());

    let pm1 = ProgramManager::with_stores(be.clone(), &no_disk(), only_mem());
    let p1 = pm1.program(&img, &spec(), &o).unwrap();
    assert_eq!(p1.source, Source::Built);
    assert!(pm1.disk_cache().is_none());
    assert_eq!((mem.len(), mem.stats().puts), (1, 1));
    let listed = mem.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].record.label, "attn.cl");
    assert_eq!(listed[0].record.options, "-O2");
    assert!(listed[0].record.matches(&pm1.disk_key(&img, &spec(), &o)));

    // A fresh manager (as a new process would have): memory miss, store hit, no build.
    let pm2 = ProgramManager::with_stores(be.clone(), &no_disk(), only_mem());
    let p2 = pm2.program(&img, &spec(), &o).unwrap();
    assert_eq!(p2.source, Source::Store);
    assert!(p2.value.fake().from_disk);
    assert_eq!(p2.value.fake().binary, p1.value.fake().binary);
    assert_eq!((be.builds(), loads(&be)), (1, 1));
    assert_eq!(
        pm2.program(&img, &spec(), &o).unwrap().source,
        Source::Memory
    );
    let k = ProgramManager::with_stores(be.clone(), &no_disk(), only_mem())
        .kernel(&img, "main", &spec(), &o)
        .unwrap();
    assert_eq!((k.source, k.value.fake().run(5)), (Source::Store, 15));
    assert_eq!(be.builds(), 1);
    let s = mem.stats();
    assert_eq!((s.hits, s.misses, s.puts, s.errors), (2, 1, 1, 0));
    assert_eq!(s.bytes_read, 2 * p1.value.fake().binary.len() as u64);
    let lv = pm2.store_stats();
    assert_eq!((lv[0].hits, lv[0].kind), (1, StoreKind::Other));
}

#[test]
fn with_store_sits_behind_the_local_disk_and_its_hits_are_copied_up() {
    let t = TempDir::new("chain");
    let be = Arc::new(FakeBackend::new());
    let mem = Arc::new(MemStore::default());
    let img = image("a.cl", &["main"]);
    let o = BuildOptions::default();
    let config = with_disk(t.path());

    // A build goes to every writable store: the local disk, then the embedder's.
    let pm = ProgramManager::with_store(be.clone(), &config, mem.clone());
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Built);
    assert_eq!(pm.disk_stats().unwrap().puts, 1);
    assert_eq!(mem.stats().puts, 1);
    let stats = pm.store_stats();
    assert_eq!(stats.len(), 2);
    assert_eq!(stats[0].kind, StoreKind::Disk);
    assert_eq!((stats[0].puts, stats[1].puts), (1, 1));

    // The local disk loses it (another machine, a cleared cache): the embedder's store serves it and
    // the hit is copied to the local disk.
    pm.disk_cache().unwrap().clear().unwrap();
    let pm = ProgramManager::with_store(be.clone(), &config, mem.clone());
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Store);
    let stats = pm.store_stats();
    assert_eq!((stats[0].misses, stats[0].backfills), (1, 1));
    assert_eq!((stats[1].hits, stats[1].puts), (1, 0));
    assert_eq!(pm.disk_cache().unwrap().entries().unwrap().len(), 1);

    // The next manager finds it locally and never asks the embedder's store.
    let hits_before = mem.stats().hits;
    let pm = ProgramManager::with_store(be.clone(), &config, mem.clone());
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Disk);
    assert_eq!(mem.stats().hits, hits_before);
    assert_eq!(pm.store_stats()[1].hits + pm.store_stats()[1].misses, 0);
    // So does a manager with the disk alone.
    let pm = ProgramManager::new(be.clone(), &config);
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Disk);
    assert_eq!(be.builds(), 1);
}

#[test]
fn levels_are_asked_in_order_and_the_first_hit_wins() {
    let t = TempDir::new("chain");
    let be = Arc::new(FakeBackend::new());
    let (first, second) = (Arc::new(MemStore::default()), Arc::new(MemStore::default()));
    let img = image("order.cl", &["main"]);
    let o = BuildOptions::default();
    // Both lower stores hold the key.
    for m in [&first, &second] {
        ProgramManager::with_stores(
            be.clone(),
            &no_disk(),
            StoreChain::new().with_store(m.clone()),
        )
        .program(&img, &spec(), &o)
        .unwrap();
    }
    assert_eq!(be.builds(), 2);

    let chain = || {
        StoreChain::with_local_disk(
            kpc::admin::disk::PersistentCache::from_config(&with_disk(t.path())),
            &no_disk(),
        )
        .with_store(first.clone())
        .with_store(second.clone())
    };
    let (h1, h2) = (first.stats().hits, second.stats().hits);
    let pm = ProgramManager::with_stores(be.clone(), &no_disk(), chain());
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Store);
    let st = pm.store_stats();
    assert_eq!((st[0].misses, st[0].backfills), (1, 1), "{st:?}");
    assert_eq!((st[1].hits, st[2].hits + st[2].misses), (1, 0), "{st:?}");
    assert_eq!((first.stats().hits, second.stats().hits), (h1 + 1, h2));
    // Backfilled to the local disk only: the stores below it are not written on a hit.
    assert_eq!((first.stats().puts, second.stats().puts), (1, 1));

    let pm = ProgramManager::with_stores(be.clone(), &no_disk(), chain());
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Disk);
    assert_eq!(first.stats().hits, h1 + 1);
    assert_eq!(be.builds(), 2);
    assert_eq!(level(&pm.store_stats(), "mem").hits, 0);
}

#[test]
fn a_damaged_entry_in_a_store_is_a_miss_and_never_reaches_the_backend() {
    let be = Arc::new(FakeBackend::new());
    let mem = Arc::new(MemStore::default());
    let img = image("d.cl", &["main"]);
    let o = BuildOptions::default();
    let chain = || StoreChain::new().with_store(mem.clone());
    ProgramManager::with_stores(be.clone(), &no_disk(), chain())
        .program(&img, &spec(), &o)
        .unwrap();
    mem.damage();

    let pm = ProgramManager::with_stores(be.clone(), &no_disk(), chain());
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Built);
    assert_eq!(
        (be.builds(), loads(&be)),
        (2, 0),
        "the damaged bytes were never loaded"
    );
    assert_eq!(mem.stats().errors, 1);
    // The rebuild replaced the damaged entry.
    let pm = ProgramManager::with_stores(be.clone(), &no_disk(), chain());
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Store);
    assert_eq!(loads(&be), 1);
}

#[test]
fn a_binary_the_backend_refuses_is_removed_from_its_store_and_rebuilt() {
    let be = Arc::new(FakeBackend::new());
    let mem = Arc::new(MemStore::default());
    let img = image("r.cl", &["main"]);
    let o = BuildOptions::default();
    let chain = || StoreChain::new().with_store(mem.clone());
    ProgramManager::with_stores(be.clone(), &no_disk(), chain())
        .program(&img, &spec(), &o)
        .unwrap();

    be.reject_binaries.store(true, Ordering::SeqCst);
    let pm = ProgramManager::with_stores(be.clone(), &no_disk(), chain());
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Built);
    assert_eq!((be.builds(), loads(&be)), (2, 1));
    assert_eq!(mem.removed.load(Ordering::SeqCst), 1);
    assert_eq!(pm.store_stats()[0].rejected, 1);
    assert_eq!(
        (mem.len(), mem.stats().puts),
        (1, 2),
        "replaced by the rebuild"
    );

    be.reject_binaries.store(false, Ordering::SeqCst);
    let pm = ProgramManager::with_stores(be.clone(), &no_disk(), chain());
    assert_eq!(pm.program(&img, &spec(), &o).unwrap().source, Source::Store);
}

/// Acquires saxpy (bias 7) on `d` through a context whose only store is `mem`, checks its output, and
/// returns where it came from and how many programs the backend built and loaded.
fn saxpy_through(d: &DeviceInfo, mem: &Arc<MemStore>) -> (Source, u64, u64) {
    let stores = StoreChain::new().with_store(mem.clone());
    let ctx = Context::builder()
        .device(d)
        .config(test_config())
        .stores(stores)
        .build()
        .unwrap();
    let image = match d.backend {
        BackendKind::Vulkan => kpc::kernels::spirv_image("saxpy").unwrap(),
        BackendKind::OpenCl => kpc::kernels::opencl_image("saxpy").unwrap(),
    };
    let spec = SpecConstants::new().with(1, SpecValue::I32(7));
    let k = ctx
        .kernel_with(&kpc::KernelRequest::new(&image, "saxpy").spec(spec.clone()))
        .unwrap();
    let n = 1000;
    let (x, y) = (random_f32(n), random_f32(n));
    let (bx, by) = (ctx.buffer_from(&x).unwrap(), ctx.buffer_from(&y).unwrap());
    let out = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    let push = PushConstants::new().u32(n as u32).f32(2.0);
    let groups = k.groups_for([n as u64, 1, 1]).unwrap();
    ctx.queue()
        .launch(&k, groups, &[&bx, &by, &out], push.as_bytes())
        .unwrap()
        .wait()
        .unwrap();
    for (i, o) in out.read().unwrap().iter().enumerate() {
        let want = 2.0 * x[i] + y[i] + 7.0;
        assert!((o - want).abs() <= 1e-5 * (1.0 + want.abs()), "out[{i}]");
    }
    let s = ctx.stats().backend_counters;
    (k.source(), s.programs_built, s.programs_loaded)
}

fn contexts_share_through_an_embedders_store(d: Option<DeviceInfo>) {
    let Some(d) = d else { return };
    let mem = Arc::new(MemStore::default());
    assert_eq!(saxpy_through(&d, &mem), (Source::Built, 1, 0));
    assert_eq!(mem.len(), 1);
    assert_eq!(saxpy_through(&d, &mem), (Source::Store, 0, 1));
    assert_eq!(mem.stats().hits, 1);
}

#[test]
fn vulkan_contexts_share_binaries_through_an_embedders_store() {
    contexts_share_through_an_embedders_store(vulkan_device(
        "vulkan_contexts_share_binaries_through_an_embedders_store",
    ));
}

#[test]
fn opencl_contexts_share_binaries_through_an_embedders_store() {
    contexts_share_through_an_embedders_store(opencl_device(
        "opencl_contexts_share_binaries_through_an_embedders_store",
    ));
}
