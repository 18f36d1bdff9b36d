//! Prebuild: the kernels an application's warm-start manifest names, recorded under an older driver,
//! built for the new one; with a real redis-server shared by 4 processes (4 "machines", each its own
//! cache directory) prebuilding at once, each kernel is built once in the fleet. Counting fake backend.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::disk::{CHILD_ENV, TempDir, child, child_role};
use common::fake_backend::{FakeBackend, image};
use common::redis::RedisServer;
use kpc::KernelRequest;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::runtime::{WarmStart, shared_requests};
use kpc::admin::runtime::{app_manifests, prebuild};
use kpc::{BackendKind, RemoteUrl};
use kpc::{Config, Error};
use kpc::{SpecConstants, SpecValue};

const APP: &str = "prebuild-app";
const N: usize = 6;

fn requests() -> Vec<KernelRequest> {
    (0..N)
        .map(|i| {
            KernelRequest::new(&image(&format!("k{i}.cl"), &["main"]), "main")
                .spec(SpecConstants::new().with(0, SpecValue::U32(i as u32 + 1)))
        })
        .collect()
}

/// A manifest of `requests()` recorded by driver version "1" under `root`.
fn record_old_manifest(root: &Path) {
    let old = FakeBackend::with_driver_version("fake-device-0", "1");
    let ws = WarmStart::new(
        root,
        &kpc::admin::backend::Backend::fingerprint(&old).digest,
        APP,
    );
    for r in requests() {
        ws.record(&r);
    }
    assert_eq!(ws.save().unwrap(), Some(N));
}

fn new_driver_manager(root: &Path, remote: Option<&str>) -> Arc<ProgramManager> {
    let be = FakeBackend::with_driver_version("fake-device-0", "2")
        .build_delay(Duration::from_millis(150));
    let config = Config::builder()
        .cache_dir(root)
        .remote(remote.map(|u| RemoteUrl::parse(u).unwrap()))
        .remote_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    Arc::new(ProgramManager::new(Arc::new(be), &config))
}

fn run_prebuild(manifests: &Path, pm: Arc<ProgramManager>) -> kpc::PrebuildReport {
    let (used, reqs) = app_manifests(manifests, APP, BackendKind::OpenCl);
    assert_eq!((used.len(), reqs.len()), (1, N));
    prebuild(reqs, move |r| {
        pm.kernel(r.image(), r.entry(), r.spec_constants(), r.build_options())
            .map(|a| a.source)
    })
}

/// One machine of the fleet test: prebuilds from the shared manifest directory into its own cache
/// directory, with the shared remote.
#[test]
fn machine() {
    let Some(_) = child_role() else { return };
    let env = |k: &str| std::env::var(k).unwrap();
    let pm = new_driver_manager(
        Path::new(&env("KPC_TEST_ROOT")),
        Some(&env("KPC_TEST_REMOTE")),
    );
    let r = run_prebuild(Path::new(&env("KPC_TEST_MANIFESTS")), pm);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    println!("RESULT {} {}", r.built, r.present);
}

#[test]
fn four_machines_prebuild_each_kernel_once_in_the_fleet() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let Some(redis) = RedisServer::start("four_machines_prebuild_each_kernel_once_in_the_fleet")
    else {
        return;
    };
    let t = TempDir::new("prebuild-fleet");
    let manifests = t.join("manifests");
    record_old_manifest(&manifests);
    let machines: Vec<PathBuf> = (0..4).map(|i| t.join(format!("m{i}"))).collect();
    let children: Vec<_> = machines
        .iter()
        .map(|m| {
            child("machine", "machine")
                .env("KPC_TEST_ROOT", m)
                .env("KPC_TEST_MANIFESTS", &manifests)
                .env("KPC_TEST_REMOTE", redis.url())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (mut built, mut present) = (0, 0);
    for c in children {
        let o = c.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{out}");
        let line = out.lines().find_map(|l| l.strip_prefix("RESULT ")).unwrap();
        let v: Vec<usize> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        assert_eq!(
            v[0] + v[1],
            N,
            "every kernel built or present on each machine: {line}"
        );
        built += v[0];
        present += v[1];
    }
    assert_eq!(built, N, "each kernel built once in the fleet");
    assert_eq!(present, 3 * N);
}

#[test]
fn a_second_prebuild_finds_everything_present_and_failures_are_reported() {
    let t = TempDir::new("prebuild-local");
    record_old_manifest(t.path());
    let pm = new_driver_manager(t.path(), None);
    let r = run_prebuild(t.path(), pm);
    assert_eq!(
        (r.kernels, r.built, r.present, r.failed.len()),
        (N, N, 0, 0)
    );
    // A new process on the same machine: all on disk.
    let pm = new_driver_manager(t.path(), None);
    let r = run_prebuild(t.path(), pm);
    assert_eq!((r.built, r.present), (0, N));

    let fresh = TempDir::new("prebuild-fail");
    record_old_manifest(fresh.path());
    let pm = new_driver_manager(fresh.path(), None);
    let fake = pm.backend_as::<FakeBackend>().unwrap();
    fake.fail_with(|_, img| {
        (img.name() == "k2.cl").then(|| Error::Build {
            backend: BackendKind::Vulkan,
            image: img.name().into(),
            code: -11,
            message: "injected".into(),
            log: String::new(),
        })
    });
    let r = run_prebuild(fresh.path(), pm.clone());
    assert_eq!((r.built, r.present), (N - 1, 0));
    assert_eq!(r.failed.len(), 1);
    assert_eq!(r.failed[0].0, "k2.cl:main");
    assert!(matches!(r.failed[0].1, Error::Build { .. }));
}

/// A fresh machine that never ran the application prebuilds what the fleet shared: every process
/// that writes its manifest merges it into the remote's, authenticated like an entry.
#[test]
fn a_fresh_machine_prebuilds_from_the_manifest_the_fleet_shares() {
    let Some(redis) =
        RedisServer::start("a_fresh_machine_prebuilds_from_the_manifest_the_fleet_shares")
    else {
        return;
    };
    let t = TempDir::new("prebuild-shared");
    // Two machines ran the application, each using half of the kernels (and one in common).
    let all = requests();
    for (m, part) in [("a", &all[..N / 2 + 1]), ("b", &all[N / 2..])] {
        let pm = new_driver_manager(&t.join(m), Some(&redis.url()));
        let old = FakeBackend::with_driver_version("fake-device-0", "1");
        let digest = kpc::admin::backend::Backend::fingerprint(&old).digest;
        let ws = WarmStart::new(&t.join(m), &digest, APP);
        ws.share_through(pm.stores().stores().cloned().collect());
        for r in part {
            ws.record(r);
        }
        assert_eq!(ws.save().unwrap(), Some(part.len()));
    }
    // A third machine, new driver, empty cache directory, no manifest of its own.
    let pm = new_driver_manager(&t.join("c"), Some(&redis.url()));
    assert!(
        app_manifests(&t.join("c"), APP, BackendKind::OpenCl)
            .0
            .is_empty()
    );
    let shared = shared_requests(pm.stores().stores(), APP);
    assert_eq!(shared.len(), N, "the union of both machines' manifests");
    let p = pm.clone();
    let r = prebuild(shared, move |r| {
        p.kernel(r.image(), r.entry(), r.spec_constants(), r.build_options())
            .map(|a| a.source)
    });
    assert_eq!((r.kernels, r.built, r.failed.len()), (N, N, 0));
    assert_eq!(
        shared_requests(pm.stores().stores(), "another-app").len(),
        0
    );

    // With the fleet's MAC key set, the unauthenticated manifest is refused, never used.
    let keyed = Config::builder()
        .cache_dir(t.join("d"))
        .remote(Some(RemoteUrl::parse(&redis.url()).unwrap()))
        .remote_key(
            kpc::MacKey::from_secret("KPC_CACHE_REMOTE_KEY", "a fleet secret of 16+").unwrap(),
        )
        .build()
        .unwrap();
    let pm = ProgramManager::new(Arc::new(FakeBackend::new()), &keyed);
    assert!(shared_requests(pm.stores().stores(), APP).is_empty());
}

/// The progress hook (what `kpc cache prebuild` draws its terminal line from) sees every kernel
/// once, numbered 1 to N, with its result.
#[test]
fn progress_reports_each_kernel_once_in_order_of_completion() {
    let t = TempDir::new("prebuild-progress");
    record_old_manifest(t.path());
    let pm = new_driver_manager(t.path(), None);
    let (_, reqs) = app_manifests(t.path(), APP, BackendKind::OpenCl);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let r = kpc::admin::runtime::prebuild_with_progress(
        reqs,
        move |r| {
            pm.kernel(r.image(), r.entry(), r.spec_constants(), r.build_options())
                .map(|a| a.source)
        },
        move |p: &kpc::admin::runtime::Progress<'_>| {
            assert_eq!(p.total, N);
            log.lock()
                .unwrap()
                .push((p.done, p.kernel.to_string(), p.result.is_ok()));
        },
    );
    assert_eq!(r.built, N);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        (1..=N).collect::<Vec<_>>()
    );
    let mut kernels: Vec<_> = seen.iter().map(|s| s.1.clone()).collect();
    kernels.sort();
    kernels.dedup();
    assert_eq!(kernels.len(), N);
    assert!(seen.iter().all(|s| s.2));
}
