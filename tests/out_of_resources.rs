//! Out-of-resources recovery (issue 25, Deliver 3), through the real `ProgramManager` and
//! `KernelProgramCache` with the counting fake backend: a build, binary load or kernel creation that
//! runs out of resources releases the programs no live kernel holds and is retried once; a second
//! failure reaches the caller and is not cached; both are counted.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::disk::TempDir;
use common::fake_backend::{AsFake, FakeBackend, image};
use kpc::BackendKind;
use kpc::Source;
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, SpecConstants};
use kpc::{Config, Error};

fn oom(code: i32) -> Error {
    Error::OutOfResources {
        backend: BackendKind::OpenCl,
        code,
        message: format!("injected {code}"),
    }
}

fn manager(fake: FakeBackend) -> (Arc<FakeBackend>, ProgramManager) {
    let fake = Arc::new(fake);
    let config = Config::builder().persistent(false).build().unwrap();
    let pm = ProgramManager::new(fake.clone(), &config);
    (fake, pm)
}

fn none() -> (SpecConstants, BuildOptions) {
    (SpecConstants::new(), BuildOptions::default())
}

#[test]
fn a_build_out_of_resources_releases_unused_programs_and_the_retry_succeeds() {
    let (fake, pm) = manager(FakeBackend::new());
    let (spec, opts) = none();
    let (held, dropped, program_only, new) = (
        image("held", &["main"]),
        image("dropped", &["main"]),
        image("program-only", &["main"]),
        image("new", &["main"]),
    );
    // A kernel the application keeps, one it let go, and a program nobody holds.
    let live = pm.kernel(&held, "main", &spec, &opts).unwrap().value;
    drop(pm.kernel(&dropped, "main", &spec, &opts).unwrap());
    drop(pm.program(&program_only, &spec, &opts).unwrap());
    assert_eq!(fake.builds(), 3);
    // The next build runs out of resources (CL_OUT_OF_RESOURCES) once.
    fake.fail_with(|n, _| (n == 3).then(|| oom(-5)));
    let k = pm.kernel(&new, "main", &spec, &opts).unwrap();
    assert_eq!(k.source, Source::Built);
    assert_eq!(fake.builds(), 5, "one failed build, one retry");
    let s = pm.memory_stats();
    assert_eq!(
        (
            s.out_of_resources_retries,
            s.out_of_resources_released,
            s.out_of_resources_failures
        ),
        (1, 2, 0),
        "{s:?}"
    );
    // The live kernel survived the purge with its program, and is still what the cache serves.
    let again = pm.kernel(&held, "main", &spec, &opts).unwrap();
    assert_eq!(again.source, Source::Memory);
    assert!(Arc::ptr_eq(&again.value, &live));
    assert_eq!(live.fake().run(3), 3);
    // The released ones are built again on their next request.
    assert_eq!(
        pm.kernel(&dropped, "main", &spec, &opts).unwrap().source,
        Source::Built
    );
    assert_eq!(
        pm.program(&program_only, &spec, &opts).unwrap().source,
        Source::Built
    );
    assert_eq!(fake.builds(), 7);
}

#[test]
fn a_second_failure_is_returned_and_not_cached() {
    let (fake, pm) = manager(FakeBackend::new());
    let (spec, opts) = none();
    let img = image("big", &["main"]);
    // CL_OUT_OF_HOST_MEMORY, twice.
    fake.fail_with(|n, _| (n < 2).then(|| oom(-6)));
    match pm.program(&img, &spec, &opts) {
        Err(Error::OutOfResources { code: -6, .. }) => {}
        other => panic!("expected the second out-of-resources error, got {other:?}"),
    }
    assert_eq!(fake.builds(), 2);
    let s = pm.memory_stats();
    assert_eq!(
        (s.out_of_resources_retries, s.out_of_resources_failures),
        (1, 1),
        "{s:?}"
    );
    // Not cached: the next request builds, and now succeeds.
    let p = pm.program(&img, &spec, &opts).unwrap();
    assert_eq!(p.source, Source::Built);
    assert_eq!(fake.builds(), 3);
}

/// Eight threads ask for one kernel at once while its build runs out of resources: the builder
/// recovers by itself (one retry), and every waiter gets the same kernel without building.
#[test]
fn concurrent_waiters_share_the_recovered_build() {
    let (fake, pm) = manager(FakeBackend::new().build_delay(Duration::from_millis(40)));
    fake.fail_with(|n, _| (n == 0).then(|| oom(-5)));
    let pm = Arc::new(pm);
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (pm, barrier) = (pm.clone(), barrier.clone());
            std::thread::spawn(move || {
                let (spec, opts) = none();
                barrier.wait();
                pm.kernel(&image("shared", &["main"]), "main", &spec, &opts)
                    .map(|a| a.value)
            })
        })
        .collect();
    let got: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    assert!(got.iter().all(|k| Arc::ptr_eq(k, &got[0])));
    assert_eq!(fake.builds(), 2, "the failed build and its one retry");
    let s = pm.memory_stats();
    assert_eq!(
        (s.out_of_resources_retries, s.out_of_resources_failures),
        (1, 0)
    );
}

/// The same with a retry that fails too: the builder gets the error, the waiters are not handed it
/// (it is transient): one of them builds again, and they all get that kernel.
#[test]
fn concurrent_waiters_rebuild_after_the_builder_fails_twice() {
    let (fake, pm) = manager(FakeBackend::new().build_delay(Duration::from_millis(40)));
    fake.fail_with(|n, _| (n < 2).then(|| oom(-6)));
    let pm = Arc::new(pm);
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (pm, barrier) = (pm.clone(), barrier.clone());
            std::thread::spawn(move || {
                let (spec, opts) = none();
                barrier.wait();
                pm.kernel(&image("shared", &["main"]), "main", &spec, &opts)
                    .map(|a| a.value)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let errors = results
        .iter()
        .filter(|r| matches!(r, Err(Error::OutOfResources { code: -6, .. })))
        .count();
    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!((errors, ok.len()), (1, 7), "{results:?}");
    assert!(ok.iter().all(|k| Arc::ptr_eq(k, ok[0])));
    assert_eq!(fake.builds(), 3);
    let s = pm.memory_stats();
    assert_eq!(
        (s.out_of_resources_retries, s.out_of_resources_failures),
        (1, 1)
    );
}

/// Loading a persisted binary that runs out of resources is retried too, and is not taken for a
/// refusal: the disk entry stays and nothing is built.
#[test]
fn a_binary_load_out_of_resources_is_retried_not_rejected() {
    let t = TempDir::new("oom");
    let config = Config::builder()
        .persistent(true)
        .cache_dir(t.path())
        .build()
        .unwrap();
    let (spec, opts) = none();
    let img = image("persisted", &["main"]);
    let first = Arc::new(FakeBackend::new());
    ProgramManager::new(first.clone(), &config)
        .kernel(&img, "main", &spec, &opts)
        .unwrap();
    assert_eq!(first.builds(), 1);
    let fake = Arc::new(FakeBackend::new());
    fake.oom_loads.store(1, Ordering::SeqCst);
    let pm = ProgramManager::new(fake.clone(), &config);
    let k = pm.kernel(&img, "main", &spec, &opts).unwrap();
    assert_eq!(k.source, Source::Disk);
    assert_eq!(
        (fake.builds(), fake.binary_loads.load(Ordering::SeqCst)),
        (0, 2)
    );
    let d = pm.disk_stats().unwrap();
    assert_eq!(d.rejected, 0, "{d:?}");
    assert_eq!(pm.memory_stats().out_of_resources_retries, 1);
}
