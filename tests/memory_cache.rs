//! The in-memory KernelProgramCache, tested through the real `KernelProgramCache` and the real
//! `ProgramManager` with a counting fake backend.

use crate::common;

use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use common::fake_backend::{AsFake, FakeBackend, image};
use common::poll_until;
use kpc::BackendKind;
use kpc::Source;
use kpc::admin::cache::{
    BuildError, CacheCost, KernelKey, KernelProgramCache, MAX_TRANSIENT_RETRIES, MemCacheSettings,
    ProgramKey,
};
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, Digest, SpecConstants, SpecValue};
use kpc::{Config, Error};

/// A cached program of a fixed weight.
#[derive(Debug, PartialEq)]
struct Prog {
    id: u32,
    bytes: u64,
}

impl CacheCost for Prog {
    fn cache_bytes(&self) -> u64 {
        self.bytes
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

/// Requests program `id` (weight 100 bytes), counting builds.
fn get(c: &Cache, id: u32, builds: &AtomicUsize) -> Arc<Prog> {
    c.get_or_build_program(&pkey(id), || {
        builds.fetch_add(1, Ordering::SeqCst);
        Ok(Prog { id, bytes: 100 })
    })
    .unwrap()
}

#[test]
fn three_hundred_threads_one_key_one_build_one_arc() {
    let c = Arc::new(cache(0));
    let builds = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(300));
    let handles: Vec<_> = (0..300)
        .map(|_| {
            let (c, builds, barrier) = (c.clone(), builds.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                c.get_or_build_program(&pkey(1), || {
                    builds.fetch_add(1, Ordering::SeqCst);
                    // The build finishes only once every other thread waits on it.
                    poll_until("299 waiters", || c.program_waiters(&pkey(1)) == 299);
                    Ok(Prog { id: 1, bytes: 10 })
                })
                .unwrap()
            })
        })
        .collect();
    let got: Vec<Arc<Prog>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    assert!(got.iter().all(|p| Arc::ptr_eq(p, &got[0])));
    let s = c.stats();
    assert_eq!(s.builds, 1);
    assert_eq!(s.hits + s.misses, 300);
    assert_eq!(
        (s.misses, s.waits),
        (300, 299),
        "every other caller waited on the one build"
    );
    assert_eq!(c.program_waiters(&pkey(1)), 0);
    assert!(s.waits >= 1, "{s:?}");
    assert_eq!(s.programs, 1);
}

#[test]
fn hits_do_not_build_and_are_counted() {
    let c = cache(0);
    let builds = AtomicUsize::new(0);
    let first = get(&c, 1, &builds);
    for _ in 0..1000 {
        assert!(Arc::ptr_eq(&get(&c, 1, &builds), &first));
    }
    let s = c.stats();
    assert_eq!((s.builds, s.misses, s.hits, s.waits), (1, 1, 1000, 0));
    assert_eq!(builds.load(Ordering::SeqCst), 1);
}

#[test]
fn a_deterministic_failure_is_cached_with_its_message_and_code() {
    let c = cache(0);
    let builds = AtomicUsize::new(0);
    let build = || {
        builds.fetch_add(1, Ordering::SeqCst);
        Err(BuildError::deterministic(-11, "line 3: syntax error"))
    };
    let e1 = c.get_or_build_program(&pkey(1), build).unwrap_err();
    let e2 = c
        .get_or_build_program(&pkey(1), || panic!("a cached failure must not rebuild"))
        .unwrap_err();
    assert_eq!(e1, e2);
    assert_eq!(
        (e2.code, e2.message.as_str()),
        (-11, "line 3: syntax error")
    );
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    let s = c.stats();
    assert_eq!((s.builds, s.failed_builds), (1, 1));
}

#[test]
fn a_transient_failure_is_not_cached() {
    let c = cache(0);
    let e = c
        .get_or_build_program(&pkey(1), || Err(BuildError::transient(-2, "out of memory")))
        .unwrap_err();
    assert_eq!(e.code, -2);
    // The entry went back to Initial: the next request builds again and succeeds.
    let p = c
        .get_or_build_program(&pkey(1), || Ok(Prog { id: 1, bytes: 1 }))
        .unwrap();
    assert_eq!(p.id, 1);
    assert_eq!(c.stats().builds, 2);
}

#[test]
fn transient_failures_wake_one_retrying_waiter_at_a_time_and_are_bounded() {
    // 50 callers arrive while the first build is running; every build fails transiently. Each caller builds
    // at most once and waiters give up after MAX_TRANSIENT_RETRIES failures they sat through, so the burst
    // costs at most 1 + MAX_TRANSIENT_RETRIES builds, not 50.
    const N: usize = 50;
    let c = Arc::new(cache(0));
    let builds = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..N)
        .map(|_| {
            let (c, builds) = (c.clone(), builds.clone());
            thread::spawn(move || {
                c.get_or_build_program(&pkey(1), || {
                    let n = builds.fetch_add(1, Ordering::SeqCst);
                    if n == 0 {
                        // Hold the first build until every other caller waits on it.
                        poll_until("every other caller waiting", || {
                            c.program_waiters(&pkey(1)) as usize == N - 1
                        });
                    }
                    Err(BuildError::transient(-5, format!("device lost #{n}")))
                })
                .unwrap_err()
            })
        })
        .collect();
    let errs: Vec<BuildError> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let b = builds.load(Ordering::SeqCst);
    assert!(b >= 2, "at least one waiter retried: {b}");
    assert!(
        b <= 1 + MAX_TRANSIENT_RETRIES as usize,
        "retries are bounded: {b} builds"
    );
    assert!(errs.iter().all(|e| e.code == -5));
}

#[test]
fn a_panic_in_build_reaches_its_caller_and_waiters_retry() {
    let c = Arc::new(cache(0));
    let builds = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (c, builds, barrier) = (c.clone(), builds.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                catch_unwind(AssertUnwindSafe(|| {
                    c.get_or_build_program(&pkey(1), || {
                        if builds.fetch_add(1, Ordering::SeqCst) == 0 {
                            poll_until("7 waiters", || c.program_waiters(&pkey(1)) == 7);
                            panic!("driver crashed");
                        }
                        Ok(Prog { id: 7, bytes: 1 })
                    })
                }))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let panicked = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(panicked, 1, "the panic reaches exactly its own caller");
    for r in results.iter().filter_map(|r| r.as_ref().ok()) {
        assert_eq!(r.as_ref().unwrap().id, 7);
    }
    assert_eq!(builds.load(Ordering::SeqCst), 2);
    let s = c.stats();
    assert_eq!((s.builds, s.failed_builds), (2, 1));
}

#[test]
fn lru_sequence_k1_k2_k1_k3_k2_k1() {
    // Threshold fits two 100-byte programs. The policy: after each insert, evict least recently used
    // programs until the total fits; hits refresh recency.
    let c = cache(200);
    let b = AtomicUsize::new(0);
    let builds = |id| {
        get(&c, id, &b);
        b.load(Ordering::SeqCst)
    };
    // K1: miss, build.                              cached {K1}
    assert_eq!(builds(1), 1);
    // K2: miss, build.                              cached {K1, K2}
    assert_eq!(builds(2), 2);
    // K1: hit; K1 is now more recent than K2.       cached {K2, K1}
    assert_eq!(builds(1), 2);
    // K3: miss, build; 300 > 200 evicts the LRU, K2. cached {K1, K3}
    assert_eq!(builds(3), 3);
    // K2: miss (evicted), build; evicts K1.          cached {K3, K2}
    assert_eq!(builds(2), 4);
    // K1: miss (evicted), build; evicts K3.          cached {K2, K1}
    assert_eq!(builds(1), 5);
    let s = c.stats();
    assert_eq!((s.programs, s.program_bytes, s.evictions), (2, 200, 3));
    assert!(c.contains_program(&pkey(1)) && c.contains_program(&pkey(2)));
    assert!(!c.contains_program(&pkey(3)));
}

#[test]
fn two_hundred_threads_over_three_keys_leave_exactly_two_cached() {
    let c = Arc::new(cache(200));
    let b = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(200));
    let handles: Vec<_> = (0..200)
        .map(|t| {
            let (c, b, barrier) = (c.clone(), b.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for i in 0..3 {
                    let id = (t + i) % 3 + 1;
                    assert_eq!(get(&c, id as u32, &b).id, id as u32);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = c.stats();
    assert_eq!(s.programs, 2, "{s:?}");
    assert_eq!(s.program_bytes, 200, "{s:?}");
    assert!(s.evictions >= 1);
}

#[test]
fn a_threshold_below_one_program_caches_nothing_and_survives_300_threads() {
    let c = Arc::new(cache(50));
    let b = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(300));
    let handles: Vec<_> = (0..300)
        .map(|t| {
            let (c, b, barrier) = (c.clone(), b.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                assert_eq!(get(&c, (t % 3) as u32, &b).bytes, 100);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = c.stats();
    assert_eq!((s.programs, s.program_bytes), (0, 0), "{s:?}");
    assert!(s.evictions >= 3);
}

#[test]
fn evicting_a_program_evicts_its_kernels() {
    let c = cache(100);
    let b = AtomicUsize::new(0);
    get(&c, 1, &b);
    let k1 = KernelKey::new(pkey(1), "main");
    c.get_or_build_kernel(&k1, || Ok("k1".to_string())).unwrap();
    assert!(c.contains_kernel(&k1));
    get(&c, 2, &b); // over the threshold: program 1 (the LRU) goes, and its kernel with it
    assert!(!c.contains_program(&pkey(1)));
    assert!(!c.contains_kernel(&k1));
    assert_eq!(c.stats().kernels, 0);
}

#[test]
fn kernel_hits_keep_their_program_recent() {
    let c = cache(200);
    let b = AtomicUsize::new(0);
    get(&c, 1, &b);
    let k1 = KernelKey::new(pkey(1), "main");
    c.get_or_build_kernel(&k1, || Ok("k1".into())).unwrap();
    get(&c, 2, &b);
    // Program 1 is used only through its kernel; that use must still count for its recency.
    c.get_or_build_kernel(&k1, || panic!("hit expected"))
        .unwrap();
    get(&c, 3, &b);
    assert!(
        c.contains_program(&pkey(1)),
        "kernel hit refreshed program 1"
    );
    assert!(!c.contains_program(&pkey(2)), "program 2 was the LRU");
}

#[test]
fn in_mem_off_builds_every_request() {
    let c: Cache = KernelProgramCache::new(
        MemCacheSettings::default()
            .enabled(false)
            .eviction_threshold(0)
            .trace(false),
    );
    let b = AtomicUsize::new(0);
    for _ in 0..5 {
        get(&c, 1, &b);
    }
    assert_eq!(b.load(Ordering::SeqCst), 5);
    let s = c.stats();
    assert_eq!((s.builds, s.hits, s.programs), (5, 0, 0));
}

#[test]
fn in_mem_off_from_the_environment_bypasses_the_runtime_cache() {
    let config = Config::from_lookup(|k| (k == "KPC_CACHE_IN_MEM").then(|| "0".into())).unwrap();
    let fake = Arc::new(FakeBackend::new());
    let pm = ProgramManager::new(fake.clone(), &config);
    let img = image("img", &["main"]);
    for _ in 0..3 {
        pm.kernel(
            &img,
            "main",
            &SpecConstants::new(),
            &BuildOptions::default(),
        )
        .unwrap();
    }
    assert_eq!(fake.builds(), 3);
}

fn manager() -> (Arc<FakeBackend>, ProgramManager) {
    let fake = Arc::new(FakeBackend::new());
    let config = Config::builder().persistent(false).build().unwrap();
    let pm = ProgramManager::new(fake.clone(), &config);
    (fake, pm)
}

#[test]
fn spec_constants_80_and_70_give_two_programs_each_with_its_value() {
    let (fake, pm) = manager();
    let img = image("scale", &["main"]);
    let s80 = SpecConstants::new().with(0, SpecValue::U32(80));
    let s70 = SpecConstants::new().with(0, SpecValue::U32(70));
    let none = BuildOptions::default();
    let k80 = pm.kernel(&img, "main", &s80, &none).unwrap();
    let k70 = pm.kernel(&img, "main", &s70, &none).unwrap();
    assert_eq!(fake.builds(), 2);
    assert_eq!(
        (k80.value.fake().run(2), k70.value.fake().run(2)),
        (160, 140)
    );
    // Asking again is served from memory, still with each program's own value.
    let again = pm.kernel(&img, "main", &s80, &none).unwrap();
    assert_eq!(again.source, Source::Memory);
    assert!(Arc::ptr_eq(&again.value, &k80.value));
    assert_eq!(fake.builds(), 2);
    assert_eq!(pm.memory_stats().programs, 2);
}

#[test]
fn build_options_a_b_b_none_a_give_three_programs() {
    let (fake, pm) = manager();
    let img = image("opts", &["main"]);
    let spec = SpecConstants::new();
    let mut got = Vec::new();
    for opts in [Some("-a"), Some("-b"), Some("-b"), None, Some("-a")] {
        let o = opts.map(BuildOptions::new).unwrap_or_default();
        got.push(pm.program(&img, &spec, &o).unwrap());
    }
    assert_eq!(fake.builds(), 3);
    assert_eq!(pm.memory_stats().programs, 3);
    assert!(Arc::ptr_eq(&got[0].value, &got[4].value));
    assert!(Arc::ptr_eq(&got[1].value, &got[2].value));
    assert_eq!(got[3].value.fake().options, "");
    assert_eq!(
        got.iter().map(|a| a.source).collect::<Vec<_>>(),
        [
            Source::Built,
            Source::Built,
            Source::Memory,
            Source::Built,
            Source::Memory
        ]
    );
}

#[test]
fn unknown_kernel_is_a_typed_error_naming_what_exists() {
    let (_fake, pm) = manager();
    let img = image("two", &["a", "b"]);
    let e = pm
        .kernel(&img, "c", &SpecConstants::new(), &BuildOptions::default())
        .unwrap_err();
    match &e {
        Error::UnknownKernel {
            entry, available, ..
        } => {
            assert_eq!(entry, "c");
            assert_eq!(available, "a, b");
        }
        other => panic!("expected UnknownKernel, got {other:?}"),
    }
    // Deterministic, so cached: the second request returns the same error.
    let e2 = pm
        .kernel(&img, "c", &SpecConstants::new(), &BuildOptions::default())
        .unwrap_err();
    assert_eq!(e, e2);
}

#[test]
fn a_compile_error_through_the_runtime_is_returned_again_without_rebuilding() {
    let (fake, pm) = manager();
    fake.fail_with(|_, img| {
        Some(Error::Build {
            backend: BackendKind::OpenCl,
            image: img.name().into(),
            code: -11,
            message: "clBuildProgram failed".into(),
            log: "<source>:3:1: error: expected ';'".into(),
        })
    });
    let img = image("bad", &["main"]);
    let spec = SpecConstants::new();
    let e1 = pm
        .kernel(&img, "main", &spec, &BuildOptions::default())
        .unwrap_err();
    let e2 = pm
        .kernel(&img, "main", &spec, &BuildOptions::default())
        .unwrap_err();
    assert_eq!(e1, e2);
    assert!(e1.to_string().contains("expected ';'"), "{e1}");
    assert_eq!(fake.builds(), 1);
}

#[derive(Clone, Default)]
struct Captured(Arc<parking_lot::Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn trace_bit_2_traces_inserts_hits_and_evictions() {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    let config = Config::from_lookup(|k| match k {
        "KPC_CACHE_TRACE" => Some("2".into()),
        _ => None,
    })
    .unwrap();
    let settings = MemCacheSettings::from(&config);
    assert!(settings.trace);
    tracing::subscriber::with_default(subscriber, || {
        let c: Cache = KernelProgramCache::new(settings.eviction_threshold(100));
        let b = AtomicUsize::new(0);
        get(&c, 1, &b);
        get(&c, 1, &b);
        get(&c, 2, &b);
    });
    let text = String::from_utf8(out.0.lock().clone()).unwrap();
    for word in ["insert", "hit", "evict"] {
        assert!(
            text.lines()
                .any(|l| l.contains("kpc::cache::memory") && l.contains(word)),
            "no {word} event in:\n{text}"
        );
    }
    // Bit 2 off: nothing is traced.
    let quiet = Captured::default();
    let w = quiet.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let c = cache(0);
        get(&c, 1, &AtomicUsize::new(0));
    });
    assert!(quiet.0.lock().is_empty());
}

#[test]
fn counters_snapshot_adds_up() {
    let c = Arc::new(cache(0));
    let b = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (c, b) = (c.clone(), b.clone());
            thread::spawn(move || {
                for i in 0..1000u32 {
                    get(&c, i % 10, &b);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = c.stats();
    assert_eq!(s.hits + s.misses, 4000);
    assert_eq!(s.builds, 10);
    assert_eq!(s.programs, 10);
    assert_eq!(s.program_bytes, 1000);
    assert_eq!(s.failed_builds, 0);
    assert!(s.build_time > Duration::ZERO);
}
