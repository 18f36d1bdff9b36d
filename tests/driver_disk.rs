//! The disk cache with real drivers (lavapipe and PoCL in CI): a program built by one context is a
//! disk hit for a fresh context in the same process and for a fresh process, computes the same
//! results there, and is not compiled again.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use kpc::BackendKind;
use kpc::DeviceInfo;
use kpc::Source;
use kpc::kernels::{opencl_image, spirv_image};
use kpc::{Buffer, Config, Context, PushConstants};
use kpc::{SpecConstants, SpecValue};

use common::drivers::{opencl_device, random_f32, vulkan_device};

/// Set in a child: "vulkan:<root>" or "opencl:<root>".
const CHILD: &str = "KPC_TEST_DRIVER_DISK_CHILD";

fn device(backend: BackendKind, test: &str) -> Option<DeviceInfo> {
    match backend {
        BackendKind::Vulkan => vulkan_device(test),
        BackendKind::OpenCl => opencl_device(test),
    }
}

/// Acquires saxpy (bias 7) through a fresh context with the disk cache at `root`, checks its output on
/// random inputs into a poisoned buffer, and returns where it came from and the backend's counters.
fn acquire_and_run(d: &DeviceInfo, root: &Path) -> String {
    let config = Config::builder()
        .persistent(true)
        .cache_dir(root)
        .build()
        .unwrap();
    let ctx = Context::builder()
        .device(d)
        .config(config.clone())
        .build()
        .unwrap();
    let image = match d.backend {
        BackendKind::Vulkan => spirv_image("saxpy").unwrap(),
        BackendKind::OpenCl => opencl_image("saxpy").unwrap(),
    };
    let k = ctx
        .kernel_with(
            &kpc::KernelRequest::new(&image, "saxpy")
                .spec(SpecConstants::new().with(1, SpecValue::I32(7))),
        )
        .unwrap();
    let n = 3000;
    let (x, y) = (random_f32(n), random_f32(n));
    let bx = ctx.buffer_from(&x).unwrap();
    let by = ctx.buffer_from(&y).unwrap();
    let out: Buffer<f32> = ctx.buffer_from(&vec![f32::NAN; n]).unwrap();
    let push = PushConstants::new().u32(n as u32).f32(0.5);
    ctx.queue()
        .launch(
            &k,
            k.groups_for([n as u64, 1, 1]).unwrap(),
            &[&bx, &by, &out],
            push.as_bytes(),
        )
        .unwrap()
        .wait()
        .unwrap();
    let out = out.read().unwrap();
    for i in 0..n {
        let want = 0.5 * x[i] + y[i] + 7.0;
        assert!(
            (out[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "out[{i}] = {}, want {want}",
            out[i]
        );
    }
    let stats = ctx.stats();
    // The local disk is counted once, in `disk`, not again among the stores.
    assert!(stats.disk.is_some());
    assert!(
        stats.stores.iter().all(|l| l.kind != kpc::StoreKind::Disk),
        "{:?}",
        stats.stores
    );
    let s = stats.backend_counters;
    format!(
        "source={} built={} loaded={}",
        k.source(),
        s.programs_built,
        s.programs_loaded
    )
}

#[test]
fn child_acquires_saxpy_through_the_disk_cache() {
    // Does something only as a child of the fresh-process tests below.
    let Some(spec) = std::env::var_os(CHILD) else {
        return;
    };
    let spec = spec.to_string_lossy().to_string();
    let (backend, root) = spec.split_once(':').unwrap();
    let backend = match backend {
        "vulkan" => BackendKind::Vulkan,
        _ => BackendKind::OpenCl,
    };
    let d = device(backend, "child").expect("the parent found this device");
    println!("KPCDISK {}", acquire_and_run(&d, Path::new(root)));
}

fn child(backend: BackendKind, root: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &common::disk::test_path("child_acquires_saxpy_through_the_disk_cache"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{backend}:{}", root.display()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.split_once("KPCDISK ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no result line:\n{text}"))
        .to_string()
}

fn fresh_root(tag: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("kpc-driver-disk-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    root
}

fn a_disk_hit_in_a_fresh_process(backend: BackendKind, test: &str) {
    if device(backend, test).is_none() {
        return;
    }
    let root = fresh_root(&format!("{backend}-process"));
    let built = format!("source={} built=1 loaded=0", Source::Built);
    let from_disk = format!("source={} built=0 loaded=1", Source::Disk);
    assert_eq!(child(backend, &root), built);
    // New processes: nothing in memory; the program comes from disk and is not compiled again.
    assert_eq!(child(backend, &root), from_disk);
    assert_eq!(child(backend, &root), from_disk);
    let _ = std::fs::remove_dir_all(&root);
}

fn a_disk_hit_in_a_fresh_context(backend: BackendKind, test: &str) {
    let Some(d) = device(backend, test) else {
        return;
    };
    let root = fresh_root(&format!("{backend}-context"));
    assert_eq!(
        acquire_and_run(&d, &root),
        format!("source={} built=1 loaded=0", Source::Built)
    );
    // Each context has its own memory cache, so the second one finds the program only on disk.
    assert_eq!(
        acquire_and_run(&d, &root),
        format!("source={} built=0 loaded=1", Source::Disk)
    );
    let _ = std::fs::remove_dir_all(&root);
}

crate::backend_tests! {
    fn disk_hit_in_a_fresh_process(backend, test) {
        a_disk_hit_in_a_fresh_process(backend, test);
    }
}

crate::backend_tests! {
    fn disk_hit_in_a_fresh_context(backend, test) {
        a_disk_hit_in_a_fresh_context(backend, test);
    }
}
