//! `kpc cache prebuild`: builds, in parallel, every kernel an application's warm-start manifests name
//! (also those recorded under an older fingerprint of the device's backend: a manifest carries the
//! images) for the selected device, into every writable store; with a redis remote each key is built
//! under the fleet lock (see `kpc::admin::runtime`). Exit status 0 unless a kernel failed.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Args;
use kpc::DeviceSelector;
use kpc::admin::config::valid_app_name;
use kpc::admin::runtime::{Progress, app_manifests};
use kpc::{Config, Context, Error, SealMode};
use serde_json::json;

use crate::output::print_json;

#[derive(Args, Debug)]
pub struct PrebuildArgs {
    /// The application (its KPC_CACHE_PREFETCH name); default: KPC_CACHE_PREFETCH's.
    #[arg(long, value_name = "NAME")]
    pub app: Option<String>,
    /// The device to build for (as KPC_DEVICE; default: KPC_DEVICE).
    #[arg(long, value_parser = parse_selector)]
    pub device: Option<DeviceSelector>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

fn parse_selector(s: &str) -> Result<DeviceSelector, String> {
    DeviceSelector::parse(s).map_err(|e| e.to_string())
}

pub fn run(config: &Config, args: &PrebuildArgs) -> kpc::Result<ExitCode> {
    let app = match args.app.as_deref().or(config.warm_start.as_deref()) {
        Some(a) if valid_app_name(a) => a.to_owned(),
        Some(a) => {
            return Err(Error::InvalidArgument(format!(
                "--app {a:?}: expected 1 to 64 letters, digits, '.', '_' or '-', not starting with \
                 '.' or '-' (a KPC_CACHE_PREFETCH name)"
            )));
        }
        None => {
            return Err(Error::InvalidArgument(
                "no application: give --app NAME (or set KPC_CACHE_PREFETCH=NAME)".into(),
            ));
        }
    };
    let Some(root) = config.disk_cache_root() else {
        return Err(Error::InvalidArgument(
            "prebuild needs the disk cache (KPC_CACHE_PERSISTENT=1 and a KPC_CACHE_DIR): that is \
             where manifests are and kernels go"
                .into(),
        ));
    };
    let device = kpc::select_device(args.device.as_ref().unwrap_or(&config.device))?;
    let (mut manifests, mut requests): (Vec<String>, _) = {
        let (paths, reqs) = app_manifests(root, &app, device.backend);
        (
            paths.iter().map(|p| p.display().to_string()).collect(),
            reqs,
        )
    };
    // Prebuilding is building ahead of serving: never sealed, and no warm start of its own.
    let mut c = config.clone();
    c.seal = SealMode::Off;
    c.warm_start = None;
    let ctx = Context::builder()
        .device(&device)
        .config(c.clone())
        .build()?;
    // The fleet's manifest (shared through the remote): what other machines ran, for a machine
    // that never ran the application.
    let shared = ctx.shared_manifest(&app);
    if !shared.is_empty() {
        manifests.push(format!(
            "{} (shared)",
            config
                .remote
                .as_ref()
                .map_or_else(|| "a shared store".to_string(), |u| u.to_string(),)
        ));
        requests.extend(shared);
    }
    if manifests.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "--app {app}: no warm-start manifest with {} kernels under {} or shared through a \
             remote; run the application once with KPC_CACHE_PREFETCH={app} to record one",
            device.backend,
            root.display()
        )));
    }
    // A progress line on a terminal only: logs and pipes get the report alone.
    let tty = !args.json && std::io::stderr().is_terminal();
    let r = ctx.prebuild_with_progress(requests, move |p: &Progress<'_>| {
        if tty {
            let what = match p.result {
                Ok(s) => s.to_string(),
                Err(_) => "failed".to_string(),
            };
            eprint!("\r\x1b[2K[{}/{}] {} ({what})", p.done, p.total, p.kernel);
            if p.done == p.total {
                eprintln!();
            }
        }
    });
    let dev = format!("{}:{} {}", device.backend, device.index, device.name);
    if args.json {
        let failed: Vec<_> = r
            .failed
            .iter()
            .map(|(k, e)| json!({"kernel": k, "error": e.to_string()}))
            .collect();
        print_json(&json!({
            "app": app, "device": dev,
            "manifests": manifests,
            "kernels": r.kernels, "built": r.built, "present": r.present, "failed": failed,
            "elapsed_ms": r.elapsed.as_secs_f64() * 1e3,
        }));
    } else {
        outln!(
            "kpc cache prebuild: app {app} on {dev}: {} kernels from {} manifest(s)",
            r.kernels,
            manifests.len()
        );
        outln!(
            "built {}, already present {}, failed {}, in {:.1} ms",
            r.built,
            r.present,
            r.failed.len(),
            r.elapsed.as_secs_f64() * 1e3
        );
        for (k, e) in &r.failed {
            outln!("  failed {k}: {e}");
        }
    }
    Ok(if r.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
