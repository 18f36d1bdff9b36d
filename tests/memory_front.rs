//! The kernel cache's per-thread front (`KernelProgramCache::kernel_local`, src/cache/front.rs): hits
//! counted, the same kernel as the shared map, eviction and `KPC_CACHE_IN_MEM=0` keep their meaning,
//! through the real cache and the real `ProgramManager` with the counting fake backend.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use common::fake_backend::{FakeBackend, image};
use kpc::Config;
use kpc::Source;
use kpc::admin::cache::{
    BuildError, CacheCost, KernelKey, KernelProgramCache, MemCacheSettings, ProgramKey,
};
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, Digest, SpecConstants};

struct Prog;

impl CacheCost for Prog {
    fn cache_bytes(&self) -> u64 {
        100
    }
}

type Cache = KernelProgramCache<Prog, String, BuildError>;

fn cache(threshold: u64) -> Cache {
    KernelProgramCache::new(
        MemCacheSettings::default()
            .enabled(true)
            .eviction_threshold(threshold)
            .trace(false),
    )
}

fn pkey(id: u32) -> ProgramKey {
    ProgramKey::new(
        Digest::of(&id.to_le_bytes()),
        SpecConstants::new(),
        Digest::of(b"dev"),
        BuildOptions::default(),
    )
}

/// Caches program `id` and its kernel "main" (named `k<id>`), returning the kernel key.
fn cached(c: &Cache, id: u32) -> KernelKey {
    c.get_or_build_program(&pkey(id), || Ok(Prog)).unwrap();
    let k = KernelKey::new(pkey(id), "main");
    c.get_or_build_kernel(&k, || Ok(format!("k{id}"))).unwrap();
    k
}

#[test]
fn front_hits_are_the_shared_kernel_and_every_one_is_counted() {
    let c = Arc::new(cache(0));
    let k = cached(&c, 1);
    let shared = c
        .get_or_build_kernel(&k, || panic!("hit expected"))
        .unwrap();
    let before = c.stats();
    let threads = 8;
    let per_thread = 1000;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (c, k, shared, barrier) = (c.clone(), k.clone(), shared.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for _ in 0..per_thread {
                    let h = c.kernel_local(&k).expect("a finished kernel is a hit");
                    assert!(Arc::ptr_eq(h.shared(), &shared), "the shared map's kernel");
                    assert_eq!(h.as_str(), "k1");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let after = c.stats();
    assert_eq!(after.hits - before.hits, (threads * per_thread) as u64);
    assert_eq!(
        (after.misses, after.builds),
        (before.misses, before.builds),
        "hits neither miss nor build"
    );
}

#[test]
fn a_key_not_finished_or_failed_is_left_to_the_building_path() {
    let c = cache(0);
    let missing = KernelKey::new(pkey(9), "main");
    assert!(c.kernel_local(&missing).is_none());
    c.get_or_build_program(&pkey(2), || Ok(Prog)).unwrap();
    let failed = KernelKey::new(pkey(2), "main");
    let e = c
        .get_or_build_kernel(&failed, || Err(BuildError::deterministic(-11, "no entry")))
        .unwrap_err();
    assert!(c.kernel_local(&failed).is_none());
    // The building path answers the cached failure again, without building.
    let again = c
        .get_or_build_kernel(&failed, || panic!("cached failure expected"))
        .unwrap_err();
    assert_eq!(again, e);
    assert_eq!(c.stats().hits, 1, "the cached failure's answer is a hit");
}

#[test]
fn an_evicted_kernel_leaves_every_threads_front() {
    let c = Arc::new(cache(100));
    let k1 = cached(&c, 1);
    // Another thread keeps the kernel in its own stripe.
    let (c2, k2) = (c.clone(), k1.clone());
    thread::spawn(move || assert!(c2.kernel_local(&k2).is_some()))
        .join()
        .unwrap();
    assert!(c.kernel_local(&k1).is_some());
    let evictions = c.stats().evictions;
    cached(&c, 2); // over the threshold: program 1 goes, with its kernel
    assert_eq!(c.stats().evictions, evictions + 1);
    assert!(c.kernel_local(&k1).is_none(), "evicted: not served here");
    let (c2, k2) = (c.clone(), k1.clone());
    thread::spawn(move || assert!(c2.kernel_local(&k2).is_none(), "nor on another thread"))
        .join()
        .unwrap();
    let builds = AtomicUsize::new(0);
    c.get_or_build_program(&pkey(1), || {
        builds.fetch_add(1, Ordering::SeqCst);
        Ok(Prog)
    })
    .unwrap();
    assert_eq!(builds.load(Ordering::SeqCst), 1, "rebuilt after eviction");
}

#[test]
fn front_hits_keep_their_program_recent() {
    let c = cache(200);
    let k1 = cached(&c, 1);
    assert!(c.kernel_local(&k1).is_some());
    cached(&c, 2);
    // Program 1 is used only through its kernel, from the front; that use still counts.
    assert!(c.kernel_local(&k1).is_some());
    cached(&c, 3);
    assert!(
        c.contains_program(&pkey(1)),
        "front hit refreshed program 1"
    );
    assert!(!c.contains_program(&pkey(2)), "program 2 was the LRU");
}

#[test]
fn in_mem_off_serves_nothing_from_the_front() {
    let c: Cache = KernelProgramCache::new(
        MemCacheSettings::default()
            .enabled(false)
            .eviction_threshold(0)
            .trace(false),
    );
    let k = cached(&c, 1);
    assert!(c.kernel_local(&k).is_none());
    let s = c.stats();
    assert_eq!((s.hits, s.kernels), (0, 0));
}

#[test]
fn the_runtime_call_builds_once_then_serves_from_memory() {
    let fake = Arc::new(FakeBackend::new());
    let config = Config::builder().persistent(false).build().unwrap();
    let pm = ProgramManager::new(fake.clone(), &config);
    let img = image("img", &["main"]);
    let (spec, opts) = (SpecConstants::new(), BuildOptions::default());
    let first = pm.kernel_local(&img, "main", &spec, &opts).unwrap();
    assert_eq!(first.source, Source::Built);
    for _ in 0..3 {
        let again = pm.kernel_local(&img, "main", &spec, &opts).unwrap();
        assert_eq!(again.source, Source::Memory);
        assert!(Arc::ptr_eq(again.value.shared(), first.value.shared()));
    }
    assert_eq!(fake.builds(), 1);
    assert_eq!(pm.memory_stats().hits, 3);
}

#[test]
fn the_runtime_call_with_in_mem_off_builds_every_request() {
    let config = Config::from_lookup(|k| (k == "KPC_CACHE_IN_MEM").then(|| "0".into())).unwrap();
    let fake = Arc::new(FakeBackend::new());
    let pm = ProgramManager::new(fake.clone(), &config);
    let img = image("img", &["main"]);
    for _ in 0..3 {
        let k = pm
            .kernel_local(
                &img,
                "main",
                &SpecConstants::new(),
                &BuildOptions::default(),
            )
            .unwrap();
        assert_eq!(k.source, Source::Built);
    }
    assert_eq!(fake.builds(), 3);
}
