//! Why a lookup missed: on real drivers (lavapipe, PoCL), changing the build options, a spec constant
//! or the image yields a disk miss whose trace line and counters name that field; a changed device
//! fingerprint (the fake backend with another driver version) does too; `kpc cache explain --json`
//! names the changed spec constant for a kernel `kpc attention` uses and for a key given as a blob id.

// The support code all of the workspace's integration tests share.
use crate::common;
use crate::common::req;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use common::disk::{TempDir, capture};
use common::drivers::opencl_device;
use common::fake_backend::{FakeBackend, image as fake_image};
use kpc::DiskStats;
use kpc::admin::disk::MissCause;
use kpc::admin::runtime::ProgramManager;
use kpc::kernels::{opencl_image, spirv_image};
use kpc::{BackendKind, TraceFlags};
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Config, Context};
use kpc::{DeviceImage, DeviceInfo, ImageFormat};
use serde_json::Value;

fn disk_config(root: &Path) -> Config {
    Config::builder()
        .persistent(true)
        .cache_dir(root)
        .trace(TraceFlags::DISK)
        .build()
        .unwrap()
}

/// The explanations of the disk misses among `events` (the trace line's `why` field).
fn miss_lines(events: &[common::disk::Ev]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.target == "kpc::cache::disk")
        .filter(|e| e.fields.get("message").is_some_and(|m| m == "miss"))
        .filter_map(|e| e.fields.get("why").cloned())
        .collect()
}

fn disk_stats(ctx: &Context) -> DiskStats {
    ctx.stats().disk.expect("a disk cache")
}

/// The same shipped kernel with different bytes under the same name: a comment for OpenCL C, another
/// generator id in the SPIR-V header (word 2, which no consumer interprets).
fn changed_image(base: &DeviceImage) -> DeviceImage {
    let mut bytes = base.bytes().to_vec();
    match base.format() {
        ImageFormat::OpenClC => bytes.extend_from_slice(b"\n// changed\n"),
        _ => bytes[8] ^= 0x5a,
    }
    DeviceImage::new(base.name(), base.format(), bytes)
}

/// Acquires saxpy once, then with each key field changed in turn; each is a miss explained by that
/// field, and counted under its cause.
fn each_field_is_named(d: &DeviceInfo) {
    let t = TempDir::new("explain");
    let ctx = Context::builder()
        .device(d)
        .config(disk_config(t.path()))
        .build()
        .unwrap();
    let base = match d.backend {
        BackendKind::Vulkan => spirv_image("saxpy").unwrap(),
        BackendKind::OpenCl => opencl_image("saxpy").unwrap(),
    };
    let spec7 = SpecConstants::new().with(1, SpecValue::I32(7));
    let none = BuildOptions::default();
    let acquire = |img: &DeviceImage, spec: &SpecConstants, opts: &BuildOptions| {
        let (r, ev) = capture(|| {
            ctx.kernel_with(
                &kpc::KernelRequest::new(img, "saxpy")
                    .spec(spec.clone())
                    .options(opts.clone()),
            )
        });
        r.unwrap();
        miss_lines(&ev)
    };
    assert_eq!(
        acquire(&base, &spec7, &none),
        ["nothing similar cached"],
        "first build"
    );
    assert_eq!(disk_stats(&ctx).misses_new_key, 1);

    let opt = match d.backend {
        BackendKind::Vulkan => "-O",
        BackendKind::OpenCl => "-cl-mad-enable",
    };
    assert_eq!(
        acquire(&base, &spec7, &BuildOptions::new(opt)),
        [format!("options \"\" → \"{opt}\"")]
    );
    assert_eq!(disk_stats(&ctx).misses_options_changed, 1);

    let spec8 = SpecConstants::new().with(1, SpecValue::I32(8));
    assert_eq!(acquire(&base, &spec8, &none), ["spec constant 1: 7 → 8"]);
    assert_eq!(disk_stats(&ctx).misses_spec_changed, 1);

    let changed = changed_image(&base);
    assert_ne!(changed.digest(), base.digest());
    let want = if changed.bytes().len() == base.bytes().len() {
        "image digest changed (same name \"saxpy\")".to_owned()
    } else {
        format!(
            "image digest changed (same name \"saxpy\", {} → {} bytes)",
            base.bytes().len(),
            changed.bytes().len()
        )
    };
    assert_eq!(acquire(&changed, &spec7, &none), [want]);
    let s = disk_stats(&ctx);
    assert_eq!(s.misses_image_changed, 1);
    assert_eq!(s.misses, 4);
    assert_eq!(s.misses_device_changed + s.misses_entry_unusable, 0);

    // The explanation on demand agrees with the trace line.
    let pm_key = |spec: &SpecConstants| -> kpc::StoreKey {
        ctx.program_manager().disk_key(&base, spec, &none)
    };
    let disk = kpc::admin::disk::PersistentCache::new(
        kpc::admin::disk::DiskCacheSettings::from_config_at(&disk_config(t.path()), t.path()),
    );
    let spec9 = SpecConstants::new().with(1, SpecValue::I32(9));
    let why = disk.explain_miss(&pm_key(&spec9));
    assert_eq!(why.cause, MissCause::SpecChanged);
    // Two entries are one constant away (7 and 8): either is the nearest.
    let text = why.to_string();
    assert!(
        text == "spec constant 1: 7 → 9" || text == "spec constant 1: 8 → 9",
        "{text}"
    );
}

crate::backend_tests! {
    fn misses_name_the_changed_field(backend, test) {
        if let Some(d) = crate::common::drivers::device(backend, test) {
            each_field_is_named(&d);
        }
    }
}

#[test]
fn a_changed_device_fingerprint_is_named() {
    let t = TempDir::new("explain-fp");
    let config = disk_config(t.path());
    let img = fake_image("k.cl", &["k"]);
    let spec = SpecConstants::new();
    let opts = BuildOptions::default();
    let old = ProgramManager::new(
        Arc::new(FakeBackend::with_driver_version("fake-gpu", "580.159.03")),
        &config,
    );
    old.program(&img, &spec, &opts).unwrap();
    let new = ProgramManager::new(
        Arc::new(FakeBackend::with_driver_version("fake-gpu", "580.159.04")),
        &config,
    );
    let (r, ev) = capture(|| new.program(&img, &spec, &opts));
    assert_eq!(r.unwrap().source, kpc::Source::Built);
    assert_eq!(miss_lines(&ev), ["driverVersion 580.159.03 → 580.159.04"]);
    let s = new.disk_stats().unwrap();
    assert_eq!((s.misses, s.misses_device_changed), (1, 1));
    let cause = ev
        .iter()
        .find_map(|e| {
            e.fields
                .get("cause")
                .filter(|_| e.target == "kpc::cache::disk")
        })
        .cloned();
    assert_eq!(cause.as_deref(), Some("device-changed"));
    // A hit is not explained: the old device looks its key up again.
    let (_, ev) = capture(|| {
        ProgramManager::new(
            Arc::new(FakeBackend::with_driver_version("fake-gpu", "580.159.03")),
            &config,
        )
        .program(&img, &spec, &opts)
        .unwrap()
    });
    assert!(miss_lines(&ev).is_empty());
}

/// Runs the kpc binary with the cache at `root` and no other `KPC_*` variable (the drivers keep
/// the rest of the environment: PoCL links with the system's `ld`).
fn kpc(root: &Path, args: &[&str]) -> Output {
    common::cli::kpc_command()
        .env("KPC_CACHE_DIR", root)
        .args(args)
        .output()
        .unwrap()
}

fn json(o: &Output) -> Value {
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{text}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn cli_explain_names_a_changed_spec_constant() {
    let Some(d) = opencl_device("cli_explain_names_a_changed_spec_constant") else {
        return;
    };
    let t = TempDir::new("explain-cli");
    let root = t.join("cache");
    let sel = format!("opencl:{}", d.index);
    // Cold: nothing similar cached, and explaining writes nothing.
    let v = json(&kpc(
        &root,
        &["cache", "explain", "--json", "--device", &sel],
    ));
    let kernels = v["kernels"].as_array().unwrap();
    assert!(kernels.len() >= 2, "{v}");
    for k in kernels {
        assert_eq!(k["cached"], false, "{k}");
        assert_eq!(k["stores"][0]["cause"], "new-key", "{k}");
    }
    assert!(
        !root.exists(),
        "kpc cache explain created the cache directory"
    );
    // kpc attention with head dimension 32 populates the cache; explaining the default (64) shows the
    // decode kernel's head-dimension constant changed.
    let o = kpc(
        &root,
        &[
            "attention",
            "--device",
            &sel,
            "--head-dim",
            "32",
            "--prompt",
            "8",
            "--steps",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json(&kpc(
        &root,
        &["cache", "explain", "--json", "--device", &sel],
    ));
    let kernels = v["kernels"].as_array().unwrap();
    let copy = kernels.iter().find(|k| k["label"] == "copy").unwrap();
    assert_eq!(copy["cached"], true, "{copy}");
    let spec_changed: Vec<&Value> = kernels
        .iter()
        .filter(|k| k["stores"][0]["cause"] == "spec-changed")
        .collect();
    assert!(!spec_changed.is_empty(), "{v}");
    for k in &spec_changed {
        let diffs = k["stores"][0]["diffs"].as_array().unwrap();
        assert!(
            diffs.iter().any(|d| d["old"] == "32"
                && d["new"] == "64"
                && d["field"].as_str().unwrap().starts_with("spec constant ")),
            "{k}"
        );
    }
    // The same run for people.
    let o = kpc(&root, &["cache", "explain", "--device", &sel]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("[spec-changed]: spec constant"),
        "{text}"
    );
}

#[test]
fn cli_explain_takes_a_blob_id() {
    let Some(d) = opencl_device("cli_explain_takes_a_blob_id") else {
        return;
    };
    let t = TempDir::new("explain-blob");
    let root = t.join("cache");
    let ctx = Context::builder()
        .device(&d)
        .config(disk_config(&root))
        .build()
        .unwrap();
    let img = opencl_image("saxpy").unwrap();
    let opts = BuildOptions::default();
    ctx.kernel_with(
        &kpc::KernelRequest::new(&img, "saxpy")
            .spec(SpecConstants::new().with(1, SpecValue::I32(7)))
            .options(opts.clone()),
    )
    .unwrap();
    let hex = |b: Vec<u8>| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let sel = format!("opencl:{}", d.index);
    let cached = hex(ctx
        .cache_blob_id(&req(
            &img,
            "saxpy",
            &SpecConstants::new().with(1, SpecValue::I32(7)),
            &opts,
        ))
        .unwrap());
    let v = json(&kpc(
        &root,
        &[
            "cache",
            "explain",
            "--json",
            "--device",
            &sel,
            "--blob-id",
            &cached,
        ],
    ));
    assert_eq!(v["kernels"][0]["cached"], true, "{v}");
    assert_eq!(v["kernels"][0]["label"], "saxpy", "{v}");
    let other = hex(ctx
        .cache_blob_id(&req(
            &img,
            "saxpy",
            &SpecConstants::new().with(1, SpecValue::I32(8)),
            &opts,
        ))
        .unwrap());
    let v = json(&kpc(
        &root,
        &[
            "cache",
            "explain",
            "--json",
            "--device",
            &sel,
            "--blob-id",
            &other,
        ],
    ));
    let s = &v["kernels"][0]["stores"][0];
    assert_eq!(s["cause"], "spec-changed", "{v}");
    assert_eq!(s["explanation"], "spec constant 1: 7 → 8", "{v}");
    // Not a blob id: a clear error, no panic.
    let o = kpc(
        &root,
        &["cache", "explain", "--device", &sel, "--blob-id", "abc"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("hex digits"), "{err}");
}

#[test]
fn read_only_layers_explain_their_misses_too() {
    let t = TempDir::new("explain-ro");
    let (layer, local) = (t.join("layer"), t.join("local"));
    let img = fake_image("k.cl", &["k"]);
    let opts = BuildOptions::default();
    let spec = |v| SpecConstants::new().with(0, SpecValue::U32(v));
    ProgramManager::new(Arc::new(FakeBackend::new()), &disk_config(&layer))
        .program(&img, &spec(64), &opts)
        .unwrap();
    let config = Config::builder()
        .persistent(true)
        .cache_dir(&local)
        .readonly_dirs(vec![layer.clone()])
        .trace(TraceFlags::DISK)
        .build()
        .unwrap();
    let pm = ProgramManager::new(Arc::new(FakeBackend::new()), &config);
    let before = common::disk::files_under(&layer);
    let (r, ev) = capture(|| pm.program(&img, &spec(128), &opts));
    r.unwrap();
    // The local cache, then the layer: each explains its own miss.
    assert_eq!(
        miss_lines(&ev),
        ["nothing similar cached", "spec constant 0: 64 → 128"]
    );
    assert_eq!(before, common::disk::files_under(&layer));
}
