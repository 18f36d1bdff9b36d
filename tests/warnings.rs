//! kpc's warnings are visible without a `tracing` subscriber: a context's own callback
//! (`Config::builder().on_warning`), else the process-wide one (`kpc::set_warning_callback`), else
//! one line on stderr per cause (`KPC_LOG_STDERR=0` silences it). The cause exercised is the one
//! embedders hit: a cache directory that is a regular file, which turns the disk cache off (stats
//! say why) while every kernel still builds. Process-wide state is tested in child processes.

use crate::common;

use common::disk::{TempDir, child, child_role};
use common::drivers;
use kpc::StoreChain;
use kpc::WarningCallback;
use kpc::prelude::*;

const DONE: &str = "warnings child: all checks passed";

/// A directory holding a regular file where a cache directory is expected.
fn file_as_cache_dir(tag: &str) -> (TempDir, std::path::PathBuf) {
    let dir = TempDir::new(tag);
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"a file").unwrap();
    (dir, file)
}

#[test]
fn unusable_root_goes_to_the_configs_callback_once_per_chain() {
    let (_dir, file) = file_as_cache_dir("warn-chain");
    let (seen, f) = crate::common::warning_recorder();
    let config = Config::builder()
        .cache_dir(&file)
        .on_warning(f)
        .build()
        .unwrap();
    let chain = StoreChain::from_config(&config);
    let why = chain.local_unusable().expect("the root is a file");
    assert!(
        why.contains("not a directory") && why.contains("not-a-dir"),
        "{why}"
    );
    let seen = seen.lock().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].cause, "unusable-root");
    assert_eq!(seen[0].target, "kpc::cache::disk");
    assert!(
        seen[0].message.contains("KPC_CACHE_DIR"),
        "{}",
        seen[0].message
    );
    // A usable root: no warning, no reason.
    let ok = TempDir::new("warn-chain-ok");
    let (seen, f) = crate::common::warning_recorder();
    let config = Config::builder()
        .cache_dir(ok.path())
        .on_warning(f)
        .build()
        .unwrap();
    let chain = StoreChain::from_config(&config);
    assert!(chain.local_unusable().is_none());
    assert!(seen.lock().is_empty());
}

/// On a real device: the context reports the unusable root in its stats and still builds.
fn context_reports_unusable_root(ctx_for: impl Fn(&Config) -> Context, image: DeviceImage) {
    let (_dir, file) = file_as_cache_dir("warn-ctx");
    let (seen, f) = crate::common::warning_recorder();
    let config = Config::builder()
        .cache_dir(&file)
        .on_warning(f)
        .build()
        .unwrap();
    let ctx = ctx_for(&config);
    let k = ctx.kernel(&image, "saxpy").unwrap();
    assert_eq!(k.source(), kpc::Source::Built);
    let stats = ctx.stats();
    assert!(stats.disk.is_none(), "no disk cache over a file");
    let why = stats.disk_unusable.expect("the reason is in the stats");
    assert!(why.contains("not a directory"), "{why}");
    let seen = seen.lock();
    assert_eq!(
        seen.iter().filter(|w| w.cause == "unusable-root").count(),
        1,
        "{seen:?}"
    );
}

#[test]
fn unusable_root_in_context_stats_vulkan() {
    let test = "unusable_root_in_context_stats_vulkan";
    let Some(dev) = drivers::vulkan_device(test) else {
        return;
    };
    context_reports_unusable_root(
        |c| {
            Context::builder()
                .device(&dev)
                .config(c.clone())
                .build()
                .unwrap()
        },
        kpc::kernels::spirv_image("saxpy").unwrap(),
    );
}

#[test]
fn unusable_root_in_context_stats_opencl() {
    let test = "unusable_root_in_context_stats_opencl";
    let Some(dev) = drivers::opencl_device(test) else {
        return;
    };
    context_reports_unusable_root(
        |c| {
            Context::builder()
                .device(&dev)
                .config(c.clone())
                .build()
                .unwrap()
        },
        kpc::kernels::opencl_image("saxpy").unwrap(),
    );
}

#[test]
fn builder_defaults_are_the_environments_defaults() {
    // What `from_env` gives with no KPC_* variable set: the XDG cache directory.
    let env_defaults = Config::from_lookup(|name| {
        (!name.starts_with("KPC_"))
            .then(|| std::env::var_os(name))
            .flatten()
    })
    .unwrap();
    let built = Config::builder().build().unwrap();
    assert_eq!(built.cache_dir, env_defaults.cache_dir);
    assert_eq!(built.cache_dir_source, env_defaults.cache_dir_source);
    assert!(built.persistent && built.cache_dir.is_some(), "{built:?}");
    assert_eq!(Config::default().cache_dir, built.cache_dir);
}

/// The process-wide receivers, each in a child: the global callback, stderr, and silence.
#[test]
fn process_wide_callback_and_stderr() {
    let test = "process_wide_callback_and_stderr";
    let (_dir, file) = file_as_cache_dir("warn-global");
    match child_role().as_deref() {
        Some("global") => {
            let (seen, f) = crate::common::warning_recorder();
            assert!(kpc::set_warning_callback(Some(WarningCallback::new(f))).is_none());
            let config = Config::builder().cache_dir(&file).build().unwrap();
            let _ = StoreChain::from_config(&config);
            assert_eq!(seen.lock().len(), 1);
            // Removed: the next one goes to stderr, not to it.
            assert!(kpc::set_warning_callback(None).is_some());
            let _ = StoreChain::from_config(&config);
            assert_eq!(seen.lock().len(), 1);
            println!("{DONE}");
        }
        Some("env") => {
            // KPC_CACHE_DIR and KPC_LOG_STDERR come from the parent.
            let config = Config::from_env().unwrap();
            let _ = StoreChain::from_config(&config);
            println!("{DONE}");
        }
        Some(_) => {}
        None => {
            let run = |role: &str, env: &[(&str, &std::ffi::OsStr)]| {
                let mut c = child(test, role);
                for (k, v) in env {
                    c.env(k, v);
                }
                let o = c.output().unwrap();
                let out = String::from_utf8_lossy(&o.stdout).into_owned();
                let err = String::from_utf8_lossy(&o.stderr).into_owned();
                assert!(
                    o.status.success() && out.contains(DONE),
                    "{role}: {out}\n{err}"
                );
                err.lines()
                    .filter(|l| l.starts_with("kpc: warning:"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            };
            let lines = run("global", &[]);
            assert_eq!(lines.len(), 1, "after the callback is removed: {lines:?}");
            let dir = file.as_os_str();
            let lines = run("env", &[("KPC_CACHE_DIR", dir)]);
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(
                lines[0].contains("not a directory") && lines[0].ends_with("[unusable-root]"),
                "{lines:?}"
            );
            let quiet = run(
                "env",
                &[("KPC_CACHE_DIR", dir), ("KPC_LOG_STDERR", "0".as_ref())],
            );
            assert!(quiet.is_empty(), "{quiet:?}");
            // A malformed switch is a configuration error naming it.
            let e = Config::from_lookup(|n| (n == "KPC_LOG_STDERR").then(|| "loud".into()))
                .unwrap_err()
                .to_string();
            assert!(e.contains("KPC_LOG_STDERR") && e.contains("loud"), "{e}");
        }
    }
}
