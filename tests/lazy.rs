//! Generic while specialized (`KernelRequest::or_generic`, `src/runtime/lazy.rs`) with the counting
//! fake backend: the fallback serves while the specialized build is held at a `BuildGate`, the
//! specialized kernel is swapped in once built, a failing background build keeps the fallback with
//! one warning, N concurrent requests build the specialized kernel once, stores serve the
//! specialized kernel at once, and the `generic` and `error` seals. Ordering is by counts and the
//! gate, never by time. The driver side (lavapipe, PoCL, the attention kernels) is in
//! kpc-attention's tests.

use crate::common;

use std::ops::Deref;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::disk::TempDir;
use common::fake_backend::{AsFake, BuildGate, FakeBackend, image};
use kpc::Warning;
use kpc::admin::backend::DynKernel;
use kpc::admin::runtime::{LazyAcquired, ProgramManager};
use kpc::{BuildOptions, Config, Error, KernelRequest, SealMode, Source, SpecConstants, SpecValue};

fn specialized() -> KernelRequest {
    KernelRequest::new(&image("attn", &["decode"]), "decode")
        .spec(SpecConstants::new().with(0, SpecValue::U32(64)))
}

fn generic() -> KernelRequest {
    KernelRequest::new(&image("attn_generic", &["decode"]), "decode")
}

fn config(root: &Path) -> Config {
    Config::builder().cache_dir(root).build().unwrap()
}

fn manager(backend: FakeBackend, config: &Config) -> Arc<ProgramManager> {
    Arc::new(ProgramManager::new(Arc::new(backend), config))
}

fn lazily(pm: &Arc<ProgramManager>) -> LazyAcquired<impl Deref<Target = DynKernel>> {
    pm.kernel_or_generic(&specialized(), &generic()).unwrap()
}

/// Which image the kernel came from.
fn image_of(a: &LazyAcquired<impl Deref<Target = DynKernel>>) -> String {
    a.acquired.value.fake().program.image.clone()
}

/// Waits (a minute at most) until no background build is queued or running.
fn wait_idle(pm: &ProgramManager) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while pm.lazy_stats().pending > 0 {
        assert!(Instant::now() < deadline, "background builds still pending");
        std::thread::yield_now();
    }
}

/// Acquires the fallback alone through the gate, so later requests find it in memory.
fn warm_generic(pm: &Arc<ProgramManager>, gate: &BuildGate) {
    let p = pm.clone();
    let t = std::thread::spawn(move || {
        p.kernel(
            generic().image(),
            "decode",
            &SpecConstants::new(),
            &BuildOptions::default(),
        )
        .unwrap()
        .source
    });
    gate.wait_parked(1);
    gate.release();
    assert_eq!(t.join().unwrap(), Source::Built);
}

#[test]
fn the_generic_kernel_serves_while_the_specialized_is_held_then_it_swaps_in() {
    let dir = TempDir::new("lazy-swap");
    let gate = Arc::new(BuildGate::default());
    let pm = manager(FakeBackend::new().gated(gate.clone()), &config(dir.path()));
    warm_generic(&pm, &gate);

    let first = lazily(&pm);
    assert!(first.generic && !first.swapped);
    assert_eq!(image_of(&first), "attn_generic");
    assert_eq!(first.acquired.source, Source::Memory);
    // The specialized build is parked at the gate; requests meanwhile get the fallback, unblocked.
    gate.wait_parked(1);
    assert_eq!(gate.order(), ["attn_generic", "attn"]);
    for _ in 0..3 {
        let a = lazily(&pm);
        assert!(a.generic, "the specialized build is still held");
    }
    let s = pm.lazy_stats();
    assert_eq!(
        (s.served_generic, s.pending, s.background_builds),
        (4, 1, 0)
    );
    assert_eq!(pm.fake().builds(), 2);

    gate.release();
    wait_idle(&pm);
    let swapped = lazily(&pm);
    assert!(!swapped.generic && swapped.swapped);
    assert_eq!(image_of(&swapped), "attn");
    assert_eq!(swapped.acquired.value.fake().program.spec0, Some(64));
    let again = lazily(&pm);
    assert!(!again.generic && !again.swapped);
    let s = pm.lazy_stats();
    assert_eq!(
        (
            s.served_generic,
            s.swapped_in,
            s.background_builds,
            s.pending
        ),
        (4, 1, 1, 0)
    );
    assert!(s.background_build_time > Duration::ZERO);
    assert_eq!(pm.fake().builds(), 2, "each kernel was built once");
}

#[test]
fn a_failing_specialized_build_keeps_the_generic_serving_with_one_warning() {
    let dir = TempDir::new("lazy-fail");
    let (seen, record) = crate::common::warning_recorder();
    let config = Config::builder()
        .cache_dir(dir.path())
        .on_warning(record)
        .build()
        .unwrap();
    let backend = FakeBackend::new();
    backend.fail_with(|_, img| {
        (img.name() == "attn").then(|| Error::Build {
            backend: kpc::BackendKind::Vulkan,
            image: img.name().into(),
            code: -11,
            message: "fake compile error".into(),
            log: String::new(),
        })
    });
    let pm = manager(backend, &config);
    assert!(lazily(&pm).generic);
    wait_idle(&pm);
    for _ in 0..4 {
        let a = lazily(&pm);
        assert!(a.generic && !a.swapped);
        assert_eq!(image_of(&a), "attn_generic");
    }
    let warnings: Vec<Warning> = seen
        .lock()
        .iter()
        .filter(|w| w.cause == "background-build-failed")
        .cloned()
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].message.contains("attn:decode") && warnings[0].message.contains("fake compile"),
        "{}",
        warnings[0].message
    );
    let s = pm.lazy_stats();
    assert_eq!(
        (
            s.served_generic,
            s.background_failures,
            s.swapped_in,
            s.pending
        ),
        (5, 1, 0, 0)
    );
    assert_eq!(pm.fake().builds(), 2, "the failed build was not retried");
}

#[test]
fn concurrent_requests_build_the_specialized_kernel_once() {
    const N: usize = 8;
    let dir = TempDir::new("lazy-flight");
    let gate = Arc::new(BuildGate::default());
    let pm = manager(FakeBackend::new().gated(gate.clone()), &config(dir.path()));
    warm_generic(&pm, &gate);
    let barrier = Arc::new(Barrier::new(N));
    let threads: Vec<_> = (0..N)
        .map(|_| {
            let (pm, b) = (pm.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                lazily(&pm).generic
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap(), "every request got the fallback at once");
    }
    gate.wait_parked(1);
    assert_eq!(gate.arrived(), 2, "one specialized build for {N} requests");
    assert_eq!(pm.lazy_stats().pending, 1);
    gate.release();
    wait_idle(&pm);
    assert!(!lazily(&pm).generic);
    assert_eq!(pm.fake().builds(), 2);
    assert_eq!(gate.arrived(), 2);
    let s = pm.lazy_stats();
    assert_eq!((s.served_generic, s.swapped_in), (N as u64, 1));
}

#[test]
fn a_stored_specialized_kernel_is_served_at_once_without_the_fallback() {
    let dir = TempDir::new("lazy-stored");
    let first = manager(FakeBackend::new(), &config(dir.path()));
    first
        .kernel(
            specialized().image(),
            "decode",
            specialized().spec_constants(),
            &BuildOptions::default(),
        )
        .unwrap();
    let pm = manager(FakeBackend::new(), &config(dir.path()));
    let a = lazily(&pm);
    assert!(!a.generic);
    assert_eq!(a.acquired.source, Source::Disk);
    assert!(a.acquired.value.fake().program.from_disk);
    assert_eq!(lazily(&pm).acquired.source, Source::Memory);
    assert_eq!(pm.fake().builds(), 0, "neither kernel was built");
    assert_eq!(pm.lazy_stats().served_generic, 0);
}

#[test]
fn the_generic_seal_serves_the_fallback_and_builds_nothing_specialized() {
    let dir = TempDir::new("lazy-seal-generic");
    let pm = manager(FakeBackend::new(), &config(dir.path()));
    pm.seal(SealMode::Generic);
    for _ in 0..3 {
        let a = lazily(&pm);
        assert!(a.generic);
        assert_eq!(image_of(&a), "attn_generic");
    }
    let s = pm.lazy_stats();
    assert_eq!(
        (
            s.served_generic,
            s.sealed_generic,
            s.pending,
            s.background_builds
        ),
        (3, 3, 0, 0)
    );
    assert_eq!(pm.fake().builds(), 1, "only the fallback was built");
    // A build with no fallback to serve instead is built and reported, as under `warn`.
    let plain = pm
        .kernel(
            &image("other", &["main"]),
            "main",
            &SpecConstants::new(),
            &BuildOptions::default(),
        )
        .unwrap();
    assert_eq!(plain.source, Source::Built);
    assert_eq!(
        pm.seal_stats().builds,
        2,
        "the fallback and the plain build"
    );
    assert_eq!(pm.seal_stats().refused, 0);
    // Unsealed, the next request queues the specialized build.
    pm.seal(SealMode::Off);
    assert!(lazily(&pm).generic);
    wait_idle(&pm);
    assert!(lazily(&pm).swapped);
}

#[test]
fn a_build_budget_with_the_generic_seal_stops_specialized_builds_after_it() {
    let dir = TempDir::new("lazy-budget");
    let pm = manager(FakeBackend::new(), &config(dir.path()));
    // One build: the fallback's. The specialized build queued then finds the budget spent.
    pm.seal_after_warm_up(SealMode::Generic, Some(1));
    assert!(lazily(&pm).generic);
    wait_idle(&pm);
    assert_eq!(pm.seal_stats().mode, SealMode::Generic);
    let a = lazily(&pm);
    assert!(a.generic);
    assert_eq!(pm.fake().builds(), 1, "nothing specialized was built");
    let s = pm.lazy_stats();
    assert_eq!(
        (s.background_builds, s.sealed_generic, s.pending),
        (0, 1, 0)
    );
}

#[test]
fn the_error_seal_refuses_a_specialized_build_as_without_a_fallback() {
    let dir = TempDir::new("lazy-seal-error");
    let pm = manager(FakeBackend::new(), &config(dir.path()));
    pm.seal(SealMode::Error);
    let e = pm
        .kernel_or_generic(&specialized(), &generic())
        .unwrap_err();
    assert!(
        matches!(e, Error::Sealed { ref kernel, .. } if kernel == "attn:decode"),
        "{e:?}"
    );
    assert_eq!(pm.fake().builds(), 0);
    assert_eq!(pm.lazy_stats().served_generic, 0);
}

#[test]
fn a_fallback_that_fails_gives_the_specialized_kernel_built_in_the_foreground() {
    let dir = TempDir::new("lazy-generic-fails");
    let backend = FakeBackend::new();
    backend.fail_with(|_, img| {
        (img.name() == "attn_generic").then(|| Error::InvalidArgument("no generic here".into()))
    });
    let (seen, record) = crate::common::warning_recorder();
    let config = Config::builder()
        .cache_dir(dir.path())
        .on_warning(record)
        .build()
        .unwrap();
    let pm = manager(backend, &config);
    let a = lazily(&pm);
    assert!(!a.generic);
    assert_eq!(a.acquired.source, Source::Built);
    assert_eq!(image_of(&a), "attn");
    assert_eq!(lazily(&pm).acquired.source, Source::Memory);
    assert_eq!(pm.lazy_stats().pending, 0);
    let causes: Vec<&str> = seen.lock().iter().map(|w| w.cause).collect();
    assert_eq!(causes, ["generic-failed"], "warned once");
}
