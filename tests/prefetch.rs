//! `Context::prefetch` and `prefetch_kernels`: many kernels acquired at once on worker threads, one
//! result per request with its own error, and single flight with callers asking meanwhile. Cache logic
//! with the counting fake backend; the real backends on lavapipe and PoCL, with a launch.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::drivers::{check_read_kernel, opencl_device, test_config, vulkan_device};
use common::fake_backend::{AsFake, BuildGate, FakeBackend, image};
use kpc::DeviceImage;
use kpc::admin::runtime::{ProgramManager, prefetch_kernels};
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Context, Error};
use kpc::{KernelRequest, Source};

fn manager(backend: FakeBackend) -> Arc<ProgramManager> {
    Arc::new(ProgramManager::new(Arc::new(backend), &test_config()))
}

#[test]
fn one_result_per_request_each_with_its_own_error() {
    let fake = FakeBackend::new();
    fake.fail_with(|_, img: &DeviceImage| {
        (img.name() == "broken").then(|| Error::Build {
            backend: kpc::BackendKind::Vulkan,
            image: "broken".into(),
            code: -11,
            message: "compile error".into(),
            log: "syntax error".into(),
        })
    });
    let pm = manager(fake);
    let a = image("a", &["x", "y"]);
    let broken = image("broken", &["z"]);
    let reqs = vec![
        KernelRequest::new(&a, "x"),
        KernelRequest::new(&a, "nope"),
        KernelRequest::new(&broken, "z"),
        KernelRequest::new(&a, "y").spec(SpecConstants::new().with(0, SpecValue::U32(3))),
    ];
    let p = prefetch_kernels(&pm, reqs);
    assert_eq!(p.len(), 4);
    let r = p.wait();
    assert_eq!(r.len(), 4);
    let x = r[0].as_ref().expect("a:x builds");
    // `a:x` and `a:nope` share program `a`: whichever worker got there first built it, and the other
    // waited on that build (Memory).
    assert_eq!(x.value.fake().entry.as_str(), "x");
    assert!(
        matches!(x.source, Source::Built | Source::Memory),
        "a:x came from {:?}",
        x.source
    );
    match &r[1] {
        Err(Error::UnknownKernel {
            entry, available, ..
        }) => {
            assert_eq!(entry, "nope");
            assert!(available.contains('x') && available.contains('y'));
        }
        other => panic!("expected UnknownKernel, got {other:?}"),
    }
    assert!(
        matches!(&r[2], Err(Error::Build { log, .. }) if log == "syntax error"),
        "{:?}",
        r[2]
    );
    let y = r[3].as_ref().expect("a:y with spec 3 builds");
    assert_eq!(y.value.fake().run(2), 6);
    // a (unspecialized), broken, a (spec 3): one build each, whatever the order the workers took.
    assert_eq!(pm.fake().builds(), 3);
}

#[test]
fn single_flight_holds_under_prefetch_and_concurrent_callers() {
    // The delay keeps the builds in flight while the callers arrive; the assertion is a count.
    let pm = manager(FakeBackend::new().build_delay(Duration::from_millis(200)));
    let img = image("shared", &["e0", "e1", "e2"]);
    let reqs: Vec<KernelRequest> = (0..12)
        .map(|i| KernelRequest::new(&img, &format!("e{}", i % 3)))
        .collect();
    let p = prefetch_kernels(&pm, reqs);
    let callers: Vec<_> = (0..6)
        .map(|i| {
            let pm = pm.clone();
            let img = img.clone();
            std::thread::spawn(move || {
                let k = pm
                    .kernel(
                        &img,
                        &format!("e{}", i % 3),
                        &SpecConstants::new(),
                        &BuildOptions::default(),
                    )
                    .unwrap();
                (Arc::as_ptr(&k.value) as usize, k.source)
            })
        })
        .collect();
    let results = p.wait();
    let caller_results: Vec<(usize, Source)> =
        callers.into_iter().map(|c| c.join().unwrap()).collect();
    assert_eq!(pm.fake().builds(), 1, "one program, built once");
    assert_eq!(
        pm.fake().kernels_created.load(Ordering::SeqCst),
        3,
        "one kernel per entry point"
    );
    // Everyone got the same kernel object per entry point.
    let by_entry = |e: &str| {
        results
            .iter()
            .map(|r| r.as_ref().unwrap())
            .find(|k| k.value.fake().entry == e)
            .map(|k| Arc::as_ptr(&k.value) as usize)
            .unwrap()
    };
    for (i, (p, _)) in caller_results.iter().enumerate() {
        assert_eq!(*p, by_entry(&format!("e{}", i % 3)));
    }
    // The program build is won by whichever request arrives first: a prefetch worker or one of
    // the callers. Across both, exactly one request reports it.
    let prefetch_built = results
        .iter()
        .filter(|r| r.as_ref().unwrap().source == Source::Built)
        .count();
    let callers_built = caller_results
        .iter()
        .filter(|(_, s)| *s == Source::Built)
        .count();
    assert_eq!(
        prefetch_built + callers_built,
        1,
        "exactly one request reports the build (prefetch {prefetch_built}, callers {callers_built})"
    );
}

#[test]
fn an_empty_batch_and_a_dropped_handle() {
    let pm = manager(FakeBackend::new());
    let p = prefetch_kernels(&pm, Vec::new());
    assert!(p.is_empty() && p.is_finished());
    assert!(p.wait().is_empty());
    // Dropped without waiting: a request a worker began finishes and lands in memory; one not yet
    // begun is cancelled. Either way the next request builds it at most once.
    let img = image("bg", &["k"]);
    drop(prefetch_kernels(&pm, vec![KernelRequest::new(&img, "k")]));
    let k = pm
        .kernel(&img, "k", &SpecConstants::new(), &BuildOptions::default())
        .unwrap();
    assert!(matches!(k.source, Source::Memory | Source::Built));
    assert_eq!(pm.fake().builds(), 1);
}

/// Prefetches every shipped kernel of `ctx`'s backend while another thread asks for `read`, then
/// launches `read`: one program built per image, whichever thread got there first.
fn prefetch_on_driver(ctx: &Context, images: Vec<DeviceImage>, read: DeviceImage) {
    let reqs: Vec<KernelRequest> = images
        .iter()
        .map(|i| KernelRequest::new(i, i.name()))
        .chain([KernelRequest::new(&read, "nope")])
        .collect();
    let n = images.len();
    let p = ctx.prefetch(reqs);
    let caller = {
        let ctx = ctx.clone();
        let read = read.clone();
        std::thread::spawn(move || ctx.kernel(&read, "read").unwrap())
    };
    let results = p.wait();
    caller.join().unwrap();
    for (img, r) in images.iter().zip(&results) {
        let k = r.as_ref().unwrap_or_else(|e| panic!("{}: {e}", img.name()));
        assert_eq!(k.name(), img.name());
    }
    assert!(
        matches!(&results[n], Err(Error::UnknownKernel { entry, .. }) if entry == "nope"),
        "{:?}",
        results[n]
    );
    assert_eq!(
        ctx.stats().backend_counters.programs_built,
        n as u64,
        "each image built once"
    );
    check_read_kernel(ctx, &read);
}

#[test]
fn prefetch_on_lavapipe_builds_each_program_once_and_launches() {
    let Some(d) = vulkan_device("prefetch_on_lavapipe_builds_each_program_once_and_launches")
    else {
        return;
    };
    let ctx = Context::builder()
        .device(&d)
        .config(test_config())
        .build()
        .unwrap();
    let images: Vec<DeviceImage> = kpc::kernels::SPIRV
        .iter()
        .filter(|k| k.matrices_fit(&d.limits))
        .map(|k| kpc::kernels::spirv_image(k.name).unwrap())
        .collect();
    let read = kpc::kernels::spirv_image("read").unwrap();
    prefetch_on_driver(&ctx, images, read);
}

#[test]
fn prefetch_on_pocl_builds_each_program_once_and_launches() {
    let Some(d) = opencl_device("prefetch_on_pocl_builds_each_program_once_and_launches") else {
        return;
    };
    let ctx = Context::builder()
        .device(&d)
        .config(test_config())
        .build()
        .unwrap();
    let images: Vec<DeviceImage> = kpc::kernels::OPENCL
        .iter()
        .map(|k| kpc::kernels::opencl_image(k.name).unwrap())
        .collect();
    let read = kpc::kernels::opencl_image("read").unwrap();
    prefetch_on_driver(&ctx, images, read);
}

#[test]
fn dropping_a_prefetch_cancels_what_has_not_begun_and_waits_for_what_runs() {
    let gate = Arc::new(BuildGate::default());
    let pm = manager(FakeBackend::new().gated(gate.clone()));
    let reqs: Vec<KernelRequest> = (0..40)
        .map(|i| KernelRequest::new(&image(&format!("p{i}"), &["k"]), "k"))
        .collect();
    let p = prefetch_kernels(&pm, reqs);
    // A build has begun and is held in the backend.
    gate.wait_parked(1);
    // The drop cancels first, then waits for the running builds: a helper lets them finish only
    // once the drop is called, so that nothing else is taken before the cancellation.
    let (go, called) = std::sync::mpsc::channel::<()>();
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let releaser = {
        let (gate, dropped) = (gate.clone(), dropped.clone());
        std::thread::spawn(move || {
            called.recv().unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !dropped.load(Ordering::SeqCst) {
                gate.release();
                assert!(
                    std::time::Instant::now() < deadline,
                    "the drop never returned"
                );
                std::thread::yield_now();
            }
        })
    };
    go.send(()).unwrap();
    drop(p);
    dropped.store(true, Ordering::SeqCst);
    releaser.join().unwrap();
    // Every build that began had finished (and was kept) when the drop returned; none is running,
    // and the rest never began.
    let at_drop = pm.fake().builds();
    assert_eq!(pm.memory_stats().programs as usize, at_drop);
    assert_eq!((gate.arrived(), gate.parked()), (at_drop, 0));
    assert!(
        at_drop < 40,
        "{at_drop} of 40 built: the rest was cancelled"
    );
}

/// A kernel a caller asks for while its request waits in a prefetch queue is built at once by the
/// caller, ahead of the queue, and only once: the prefetch later finds it in memory.
#[test]
fn a_request_queued_in_a_prefetch_is_built_by_the_requester_ahead_and_once() {
    let gate = Arc::new(BuildGate::default());
    let pm = manager(FakeBackend::new().gated(gate.clone()));
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let n = cores + 4;
    let workers = kpc::admin::runtime::default_workers(n);
    assert!(
        workers < n,
        "{workers} workers for {n} requests leave some queued"
    );
    let reqs: Vec<KernelRequest> = (0..n)
        .map(|i| KernelRequest::new(&image(&format!("q{i}"), &["k"]), "k"))
        .collect();
    let last = reqs[n - 1].clone();
    let p = prefetch_kernels(&pm, reqs);
    // Every worker is inside a build; the rest of the batch is queued behind them.
    gate.wait_parked(workers);
    let requester = {
        let pm = pm.clone();
        std::thread::spawn(move || {
            pm.kernel(
                last.image(),
                last.entry(),
                last.spec_constants(),
                last.build_options(),
            )
            .unwrap()
            .source
        })
    };
    // The caller's build starts while the workers' builds are still held: ahead of the queue.
    gate.wait_parked(workers + 1);
    assert_eq!(
        gate.order()[workers],
        format!("q{}", n - 1),
        "{:?}",
        gate.order()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(requester.is_finished() && p.is_finished()) {
        gate.release();
        assert!(
            std::time::Instant::now() < deadline,
            "the batch never finished"
        );
        std::thread::yield_now();
    }
    assert_eq!(requester.join().unwrap(), Source::Built);
    let results = p.wait();
    // One build per key: the queued request for the caller's key was served from memory.
    assert_eq!(pm.fake().builds(), n);
    assert_eq!(
        gate.order()
            .iter()
            .filter(|i| **i == format!("q{}", n - 1))
            .count(),
        1
    );
    assert_eq!(results[n - 1].as_ref().unwrap().source, Source::Memory);
}
