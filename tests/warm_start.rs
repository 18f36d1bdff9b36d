//! Warm start from the last run: the manifest a context writes, a new process reloading its kernels
//! in the background so its first requests come from memory (real drivers, real child processes),
//! and what is only a warning: a corrupt manifest, keys no store holds any more. Manifest logic with
//! the counting fake backend and real files.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::disk::{TempDir, capture, child, child_role};
use common::drivers::{opencl_device, vulkan_device};
use common::fake_backend::{AsFake, FakeBackend, image};
use kpc::DeviceImage;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::runtime::{LoadOutcome, WarmStart, load_if_stored, manifest};
use kpc::{Config, Context};
use kpc::{KernelRequest, ManifestState, Source};
use kpc::{SpecConstants, SpecValue};

const APP: &str = "warm-test";

fn disk_config(root: &Path, app: Option<&str>) -> Config {
    Config::builder()
        .cache_dir(root)
        .warm_start(app)
        .build()
        .unwrap()
}

fn fake_manager(root: &Path) -> ProgramManager {
    ProgramManager::new(Arc::new(FakeBackend::new()), &disk_config(root, None))
}

fn acquire(pm: &ProgramManager, r: &KernelRequest) -> Source {
    pm.kernel(r.image(), r.entry(), r.spec_constants(), r.build_options())
        .unwrap()
        .source
}

fn requests() -> Vec<KernelRequest> {
    let a = image("a", &["x", "y"]);
    let b = image("b", &["z"]);
    vec![
        KernelRequest::new(&a, "x"),
        KernelRequest::new(&a, "y"),
        KernelRequest::new(&b, "z").spec(SpecConstants::new().with(0, SpecValue::U32(7))),
    ]
}

/// A first run: builds `reqs` (persisted to disk), records them and writes the manifest.
fn first_run(root: &Path, reqs: &[KernelRequest]) -> WarmStart {
    let pm = fake_manager(root);
    let ws = WarmStart::new(root, &pm.backend().fingerprint().digest, APP);
    for r in reqs {
        // y is a second entry point of a's program: created from the program in memory.
        let want = if r.entry() == "y" {
            Source::Memory
        } else {
            Source::Built
        };
        assert_eq!(acquire(&pm, r), want, "{}", r.entry());
        ws.record(r);
    }
    assert_eq!(ws.save().unwrap(), Some(reqs.len()));
    ws
}

fn new_run(root: &Path) -> (Arc<ProgramManager>, Arc<WarmStart>) {
    let pm = Arc::new(fake_manager(root));
    let ws = Arc::new(WarmStart::new(
        root,
        &pm.backend().fingerprint().digest,
        APP,
    ));
    let m = pm.clone();
    ws.start(move |r| load_if_stored(&m, r));
    (pm, ws)
}

#[test]
fn a_new_run_finds_the_last_runs_kernels_in_memory_without_building() {
    let dir = TempDir::new("warm-fake");
    let reqs = requests();
    drop(first_run(dir.path(), &reqs));
    let (pm, ws) = new_run(dir.path());
    let rep = ws.wait().expect("a load was started");
    assert_eq!(rep.state, ManifestState::Read);
    assert_eq!(
        (rep.listed, rep.loaded, rep.not_stored, rep.failed),
        (3, 3, 0, 0)
    );
    for r in &reqs {
        assert_eq!(acquire(&pm, r), Source::Memory, "{}", r.entry());
    }
    assert_eq!(pm.fake().builds(), 0);
    // Two programs (a, b with spec 7) loaded from disk, once each.
    assert_eq!(pm.fake().binary_loads.load(Ordering::SeqCst), 2);
    // Nothing new was learned: nothing to write.
    assert_eq!(ws.save().unwrap(), None);
}

#[test]
fn keys_no_longer_on_disk_are_skipped_silently_and_forgotten() {
    let dir = TempDir::new("warm-missing");
    let reqs = requests();
    drop(first_run(dir.path(), &reqs));
    // b's entry goes (evicted, or removed by hand).
    let pm = fake_manager(dir.path());
    let key = pm.disk_key(
        reqs[2].image(),
        reqs[2].spec_constants(),
        reqs[2].build_options(),
    );
    std::fs::remove_dir_all(pm.disk_cache().unwrap().entry_dir(&key)).unwrap();

    // On this thread, where the capture sees it: a missing key is a plain `false`, no warning.
    let (r, events) = capture(|| load_if_stored(&pm, &reqs[2]));
    assert_eq!(r.unwrap(), LoadOutcome::NotStored);
    assert!(
        events.iter().all(|e| e.level != tracing::Level::WARN),
        "{events:?}"
    );
    let (pm, ws) = new_run(dir.path());
    let rep = ws.wait().unwrap();
    assert_eq!((rep.loaded, rep.not_stored, rep.failed), (2, 1, 0));
    assert_eq!(pm.fake().builds(), 0, "a warm start never builds");
    // The next write drops it from the manifest.
    assert_eq!(ws.save().unwrap(), Some(2));
    let listed = manifest::decode(&std::fs::read(ws.manifest_path()).unwrap()).unwrap();
    assert_eq!(
        listed.iter().map(|r| r.entry()).collect::<Vec<_>>(),
        ["x", "y"]
    );
    // Asked for again, it is built and remembered again.
    assert_eq!(acquire(&pm, &reqs[2]), Source::Built);
    ws.record(&reqs[2]);
    assert_eq!(ws.save().unwrap(), Some(3));
}

#[test]
fn a_corrupt_manifest_is_a_warning_and_is_rewritten() {
    let dir = TempDir::new("warm-corrupt");
    let reqs = requests();
    let ws = first_run(dir.path(), &reqs);
    let path = ws.manifest_path().to_path_buf();
    drop(ws);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();

    let pm = Arc::new(fake_manager(dir.path()));
    let ws = WarmStart::new(dir.path(), &pm.backend().fingerprint().digest, APP);
    let ((listed, state), events) = capture(|| ws.read_manifest());
    assert!(listed.is_empty());
    assert!(
        matches!(&state, ManifestState::Corrupt(why) if why.contains("checksum")),
        "{state:?}"
    );
    let warns: Vec<_> = events
        .iter()
        .filter(|e| e.level == tracing::Level::WARN && e.target == "kpc::warm_start")
        .collect();
    assert_eq!(warns.len(), 1, "{events:?}");

    // The same through a background load: a report, no error; requests build as without warm start.
    let (pm2, ws2) = new_run(dir.path());
    let rep = ws2.wait().unwrap();
    assert!(matches!(rep.state, ManifestState::Corrupt(_)));
    assert_eq!(rep.listed, 0);
    for r in &reqs {
        let want = if r.entry() == "y" {
            Source::Memory
        } else {
            Source::Disk
        };
        assert_eq!(acquire(&pm2, r), want, "{}", r.entry());
        ws2.record(r);
    }
    assert_eq!(ws2.save().unwrap(), Some(3));
    assert_eq!(
        manifest::decode(&std::fs::read(&path).unwrap())
            .unwrap()
            .len(),
        3
    );
    // Garbage of any length, and an empty file, are refused the same way.
    for junk in [&b""[..], b"kpcwarm\0", &[0xffu8; 100][..]] {
        std::fs::write(&path, junk).unwrap();
        assert!(matches!(ws.read_manifest().1, ManifestState::Corrupt(_)));
    }
}

#[test]
fn concurrent_writers_merge_and_never_tear() {
    let dir = TempDir::new("warm-merge");
    let pm = fake_manager(dir.path());
    let digest = pm.backend().fingerprint().digest;
    // Eight writers (as eight processes would: separate states, one file), each with its own kernels.
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let root = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let ws = WarmStart::new(&root, &digest, APP);
                for i in 0..5 {
                    let img = image(&format!("w{w}"), &[&format!("k{i}")]);
                    ws.record(&KernelRequest::new(&img, &format!("k{i}")));
                    ws.save().unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let ws = WarmStart::new(dir.path(), &digest, APP);
    let (listed, state) = ws.read_manifest();
    assert_eq!(state, ManifestState::Read);
    assert_eq!(
        listed.len(),
        40,
        "every writer's kernels survive the merges"
    );
    // No temporary file is left behind.
    let left: Vec<_> = std::fs::read_dir(ws.manifest_path().parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_bad_prefetch_setting_is_a_config_error_naming_the_variable() {
    for bad in ["../escape", "has space", ".hidden"] {
        let e =
            Config::from_lookup(|n| (n == "KPC_CACHE_PREFETCH").then(|| bad.into())).unwrap_err();
        assert!(e.to_string().contains("KPC_CACHE_PREFETCH"), "{e}");
        assert!(Config::builder().warm_start(Some(bad)).build().is_err());
    }
    let on = |v: &str| {
        Config::from_lookup(|n| (n == "KPC_CACHE_PREFETCH").then(|| v.into()))
            .unwrap()
            .warm_start
    };
    assert_eq!(on("0"), None);
    assert_eq!(on("my-engine"), Some("my-engine".into()));
    assert!(on("1").is_some());
    assert_eq!(Config::from_lookup(|_| None).unwrap().warm_start, None);
}

// Real drivers, real processes: a parent records, a child (this binary re-executed) warm-starts.

fn shipped(d: &kpc::DeviceInfo) -> Vec<DeviceImage> {
    ["saxpy", "copy", "read"]
        .iter()
        .map(|n| match d.backend {
            kpc::BackendKind::Vulkan => kpc::kernels::spirv_image(n).unwrap(),
            kpc::BackendKind::OpenCl => kpc::kernels::opencl_image(n).unwrap(),
        })
        .collect()
}

fn device_for(backend: &str, test: &str) -> Option<kpc::DeviceInfo> {
    match backend {
        "vulkan" => vulkan_device(test),
        _ => opencl_device(test),
    }
}

/// Child: warm-starts on `backend`, then checks every kernel comes from memory with nothing built,
/// and launches one.
fn warm_child(backend: &str) {
    let root = std::env::var("KPC_TEST_ROOT").unwrap();
    let d = device_for(backend, "warm_child").unwrap();
    let ctx = Context::builder()
        .device(&d)
        .config(disk_config(Path::new(&root), Some(APP)))
        .build()
        .unwrap();
    let rep = ctx.wait_warm_start().expect("warm start is on");
    assert_eq!(rep.state, ManifestState::Read);
    assert_eq!((rep.listed, rep.loaded, rep.failed), (3, 3, 0), "{rep:?}");
    for img in shipped(&d) {
        let k = ctx.kernel(&img, img.name()).unwrap();
        assert_eq!(k.source(), Source::Memory, "{}", img.name());
    }
    assert_eq!(ctx.stats().backend_counters.programs_built, 0);
    assert_eq!(ctx.stats().backend_counters.programs_loaded, 3);
    common::drivers::check_read_kernel(&ctx, &shipped(&d)[2]);
    println!("WARM-CHILD-OK");
}

fn parent_records_child_warm_starts(backend: &str, test: &str) {
    let Some(d) = device_for(backend, test) else {
        return;
    };
    let dir = TempDir::new("warm-process");
    {
        let ctx = Context::builder()
            .device(&d)
            .config(disk_config(dir.path(), Some(APP)))
            .build()
            .unwrap();
        assert_eq!(ctx.wait_warm_start().unwrap().state, ManifestState::Absent);
        for img in shipped(&d) {
            let k = ctx.kernel(&img, img.name()).unwrap();
            assert_eq!(k.source(), Source::Built);
        }
        // Written when the last handle goes.
    }
    let out = child(test, &format!("warm-{backend}"))
        .env("KPC_TEST_ROOT", dir.path())
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("WARM-CHILD-OK"),
        "{text}"
    );
}

#[test]
fn warm_start_across_processes_on_lavapipe() {
    if let Some(role) = child_role() {
        if role == "warm-vulkan" {
            warm_child("vulkan");
        }
        return;
    }
    parent_records_child_warm_starts("vulkan", "warm_start_across_processes_on_lavapipe");
}

#[test]
fn warm_start_across_processes_on_pocl() {
    if let Some(role) = child_role() {
        if role == "warm-opencl" {
            warm_child("opencl");
        }
        return;
    }
    parent_records_child_warm_starts("opencl", "warm_start_across_processes_on_pocl");
}

#[test]
fn a_corrupt_manifest_does_not_stop_a_context_on_lavapipe() {
    let Some(d) = vulkan_device("a_corrupt_manifest_does_not_stop_a_context_on_lavapipe") else {
        return;
    };
    let dir = TempDir::new("warm-corrupt-vk");
    let config = disk_config(dir.path(), Some(APP));
    // The fingerprint entries are keyed by (on a device persisting pipeline binaries, the opened
    // device's, which holds the driver's key).
    let fp = kpc::admin::runtime::cache_fingerprint(&d, &config).unwrap();
    let ws = WarmStart::new(dir.path(), &fp.digest, APP);
    std::fs::create_dir_all(ws.manifest_path().parent().unwrap()).unwrap();
    std::fs::write(ws.manifest_path(), b"kpcwarm\0 not really").unwrap();
    drop(ws);
    let ctx = Context::builder()
        .device(&d)
        .config(config.clone())
        .build()
        .unwrap();
    let rep = ctx.wait_warm_start().unwrap();
    assert!(matches!(rep.state, ManifestState::Corrupt(_)), "{rep:?}");
    let read = kpc::kernels::spirv_image("read").unwrap();
    common::drivers::check_read_kernel(&ctx, &read);
    // The next write replaces it with a valid manifest listing what this context built.
    assert_eq!(ctx.save_warm_start().unwrap(), Some(1));
    let listed = manifest::decode(&std::fs::read(&rep.manifest).unwrap()).unwrap();
    assert_eq!(listed[0].entry(), "read");
}

#[test]
fn a_load_cut_short_by_a_dropped_context_forgets_nothing() {
    let dir = TempDir::new("warm-cancel");
    let reqs = requests();
    drop(first_run(dir.path(), &reqs));
    let pm = fake_manager(dir.path());
    let ws = Arc::new(WarmStart::new(
        dir.path(),
        &pm.backend().fingerprint().digest,
        APP,
    ));
    // What the context's loader answers once its context is gone.
    ws.start(|_| Ok(LoadOutcome::Cancelled));
    let rep = ws.wait().unwrap();
    assert_eq!((rep.listed, rep.loaded, rep.not_stored), (3, 0, 0));
    assert_eq!(ws.save().unwrap(), None, "nothing learned, nothing written");
    drop(ws);
    let (listed, _) =
        WarmStart::new(dir.path(), &pm.backend().fingerprint().digest, APP).read_manifest();
    assert_eq!(listed.len(), 3);
}

#[test]
fn concurrent_writer_processes_merge() {
    let digest = kpc::Digest::of(b"fake device for writer processes");
    if let Some(role) = child_role() {
        if let Some(w) = role.strip_prefix("writer-") {
            let root = std::env::var("KPC_TEST_ROOT").unwrap();
            let ws = WarmStart::new(Path::new(&root), &digest, APP);
            for i in 0..10 {
                let img = image(&format!("p{w}"), &[&format!("k{i}")]);
                ws.record(&KernelRequest::new(&img, &format!("k{i}")));
                ws.save().unwrap();
            }
        }
        return;
    }
    let dir = TempDir::new("warm-merge-proc");
    let children: Vec<_> = (0..4)
        .map(|w| {
            child("concurrent_writer_processes_merge", &format!("writer-{w}"))
                .env("KPC_TEST_ROOT", dir.path())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let (listed, state) = WarmStart::new(dir.path(), &digest, APP).read_manifest();
    assert_eq!(state, ManifestState::Read);
    assert_eq!(
        listed.len(),
        40,
        "every process's kernels survive the merges"
    );
}
