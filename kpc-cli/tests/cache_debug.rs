//! Cache debug mode (`KPC_CACHE_DEBUG=1`) on real drivers (lavapipe, PoCL): lookups report hits and
//! misses as usual, every program is built fresh anyway, the fresh binary is compared with the cached
//! one, and the cache directory is byte for byte what it was (every file's path, bytes and mtime).

// The support code all of the workspace's integration tests share.
use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use common::disk::{TempDir, files_under};
use common::drivers::opencl_device;
use kpc::BackendKind;
use kpc::DeviceInfo;
use kpc::DiskStats;
use kpc::Source;
use kpc::kernels::{opencl_image, spirv_image};
use kpc::{BuildOptions, SpecConstants, SpecValue};
use kpc::{Config, Context};

type Snapshot = BTreeMap<PathBuf, (Vec<u8>, SystemTime)>;

/// Every file under `root` with its bytes and modification time.
fn snapshot(root: &Path) -> Snapshot {
    files_under(root)
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
            (p, (bytes, mtime))
        })
        .collect()
}

fn config(root: &Path, debug: bool) -> Config {
    Config::builder()
        .persistent(true)
        .cache_dir(root)
        .cache_debug(debug)
        .build()
        .unwrap()
}

fn disk_stats(ctx: &Context) -> DiskStats {
    ctx.stats().disk.expect("a disk cache")
}

/// saxpy with two spec constant values and copy: the first two are cached before debug mode runs,
/// the third (saxpy with bias 9) is not.
fn acquire_all(ctx: &Context, with_uncached: bool) -> Vec<Source> {
    let image = |name| match ctx.backend() {
        BackendKind::Vulkan => spirv_image(name).unwrap(),
        BackendKind::OpenCl => opencl_image(name).unwrap(),
    };
    let none = BuildOptions::default();
    let mut wanted = vec![
        ("saxpy", SpecConstants::new().with(1, SpecValue::I32(7))),
        ("copy", SpecConstants::new()),
    ];
    if with_uncached {
        wanted.push(("saxpy", SpecConstants::new().with(1, SpecValue::I32(9))));
    }
    wanted
        .into_iter()
        .map(|(name, spec)| {
            ctx.kernel_with(
                &kpc::KernelRequest::new(&image(name), name)
                    .spec(spec.clone())
                    .options(none.clone()),
            )
            .unwrap()
            .source()
        })
        .collect()
}

fn debug_mode_builds_and_compares(d: &DeviceInfo) {
    let t = TempDir::new("cache-debug");
    let root = t.join("cache");
    let warm = Context::builder()
        .device(d)
        .config(config(&root, false))
        .build()
        .unwrap();
    assert_eq!(acquire_all(&warm, false), [Source::Built, Source::Built]);
    drop(warm);
    let before = snapshot(&root);
    assert!(before.len() >= 4, "two entries expected: {before:?}");

    let ctx = Context::builder()
        .device(d)
        .config(config(&root, true))
        .build()
        .unwrap();
    let sources = acquire_all(&ctx, true);
    assert_eq!(sources, [Source::Built; 3], "every program is built fresh");
    assert_eq!(ctx.stats().backend_counters.programs_built, 3);
    assert_eq!(ctx.stats().backend_counters.programs_loaded, 0);
    // The lookups ran and report as usual.
    let s = disk_stats(&ctx);
    assert_eq!((s.hits, s.misses, s.puts), (2, 1, 0), "{s:?}");
    assert_eq!(s.misses_spec_changed, 1, "{s:?}");
    let dbg = ctx.stats().cache_debug;
    assert_eq!(dbg.missing, 1, "{dbg}");
    assert_eq!(dbg.equal + dbg.different, 2, "{dbg}");
    assert_eq!(dbg.diffs.len() as u64, dbg.different, "{dbg}");
    for diff in &dbg.diffs {
        assert!(diff.cached > 0 && diff.fresh > 0, "{dbg}");
    }
    eprintln!("{:?} cache debug: {dbg}", d.backend);
    drop(ctx);
    let after = snapshot(&root);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "debug mode added or removed files"
    );
    for (p, v) in &before {
        assert!(after[p] == *v, "debug mode changed {}", p.display());
    }
}

crate::backend_tests! {
    fn debug_mode_builds_compares_and_writes_nothing(backend, test) {
        if let Some(d) = crate::common::drivers::device(backend, test) {
            debug_mode_builds_and_compares(&d);
        }
    }
}

/// `kpc attention` under `KPC_CACHE_DEBUG=1` prints the comparison at its end, and leaves the cache
/// directory as it was.
#[test]
fn kpc_attention_prints_the_debug_report() {
    let Some(d) = opencl_device("kpc_attention_prints_the_debug_report") else {
        return;
    };
    let t = TempDir::new("cache-debug-cli");
    let root = t.join("cache");
    let sel = format!("opencl:{}", d.index);
    let run = |debug: &str| {
        let mut c = common::cli::kpc_command();
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("KPC_") {
                c.env_remove(k);
            }
        }
        let o = c
            .env("KPC_CACHE_DIR", &root)
            .env("KPC_CACHE_DEBUG", debug)
            .args([
                "attention",
                "--device",
                &sel,
                "--prompt",
                "8",
                "--steps",
                "2",
            ])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };
    let cold = run("0");
    assert!(!cold.contains("cache debug:"), "{cold}");
    let before = snapshot(&root);
    let out = run("1");
    let line = out
        .lines()
        .find(|l| l.starts_with("cache debug: "))
        .unwrap_or_else(|| panic!("no report: {out}"));
    assert!(
        line.contains("programs built fresh") && line.contains(", 0 not cached"),
        "{line}"
    );
    assert_eq!(
        before,
        snapshot(&root),
        "debug mode changed the cache directory"
    );
    // A malformed value is a configuration error naming the variable.
    let o = common::cli::kpc_command()
        .env("KPC_CACHE_DEBUG", "2")
        .arg("status")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("KPC_CACHE_DEBUG"),
        "{err}"
    );
}
