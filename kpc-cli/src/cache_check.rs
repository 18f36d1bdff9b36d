//! `kpc cache check PATH`: preflight of a shipped cache. Reads a bundle (`kpc cache export`) or a
//! cache directory and says, per entry, whether the selected device can use it, with the field that
//! differs when it cannot; with `--app`, how many of the application's kernels (its warm-start
//! manifest, which carries the images) the bundle or directory would serve, and why not for the
//! others. Exit status 0 only when every requested kernel would be served: with `--app` the app's
//! kernels, without it every entry of the device's backend (entries of another backend are listed
//! but are not meant for this device). Nothing is written, imported or locked.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use kpc::BackendKind;
use kpc::DeviceSelector;
use kpc::KernelRequest;
use kpc::StoreKey;
use kpc::admin::bundle;
use kpc::admin::check;
use kpc::admin::check::{CheckedEntry, Covered, Target, Usability};
use kpc::admin::config::valid_app_name;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::admin::runtime::{manifest, manifest_dir};
use kpc::{Config, Error, ImageFormat};
use serde_json::{Value, json};

use crate::output::print_json;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// A bundle written by `kpc cache export`, or a cache directory (a KPC_CACHE_DIR).
    pub path: PathBuf,
    /// The device to check for (as KPC_DEVICE: vulkan:0, opencl:cpu, ...; default: KPC_DEVICE).
    #[arg(long, value_parser = parse_selector)]
    pub device: Option<DeviceSelector>,
    /// Also check the coverage of this application's warm-start manifest (KPC_CACHE_PREFETCH name),
    /// found under PATH (a directory) or the configured cache directory.
    #[arg(long, value_name = "NAME")]
    pub app: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

fn parse_selector(s: &str) -> Result<DeviceSelector, String> {
    DeviceSelector::parse(s).map_err(|e| e.to_string())
}

/// The app's manifest and its kernels: the device's own manifest under each root (PATH when a
/// directory, then the configured cache root), else the newest one recorded under another
/// fingerprint of the same backend (a driver update); the images it carries give this device's keys
/// either way.
fn find_manifest(
    roots: &[&Path],
    device: &kpc::DeviceInfo,
    app: &str,
) -> kpc::Result<Option<(PathBuf, Vec<KernelRequest>)>> {
    let name = format!("{app}.manifest");
    for root in roots {
        let own = manifest_dir(root, &device.fingerprint.digest).join(&name);
        if own.is_file() {
            let requests = read_manifest(&own)?;
            return Ok(Some((own, requests)));
        }
    }
    let mut others: Vec<(std::time::SystemTime, PathBuf)> = roots
        .iter()
        .filter_map(|r| std::fs::read_dir(r.join("warm").join("v1")).ok())
        .flatten()
        .filter_map(|d| {
            let p = d.ok()?.path().join(&name);
            Some((p.metadata().ok()?.modified().ok()?, p))
        })
        .collect();
    others.sort();
    let fits = |r: &KernelRequest| match device.backend {
        BackendKind::Vulkan => r.image().format() != ImageFormat::OpenClC,
        BackendKind::OpenCl => r.image().format() == ImageFormat::OpenClC,
    };
    for (_, p) in others.into_iter().rev() {
        // Another device's manifest that cannot be read is not this check's business.
        if let Ok(requests) = read_manifest(&p)
            && requests.iter().any(fits)
        {
            return Ok(Some((p, requests.into_iter().filter(fits).collect())));
        }
    }
    Ok(None)
}

fn read_manifest(path: &Path) -> kpc::Result<Vec<KernelRequest>> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::Io(format!("reading {}: {e}", path.display())))?;
    manifest::decode(&bytes).map_err(|e| {
        Error::InvalidArgument(format!(
            "{} is not a usable warm-start manifest: {}",
            path.display(),
            e.0
        ))
    })
}

/// The kernels the app's manifest lists, with this device's key for each.
fn wanted(requests: &[KernelRequest], target: Target<'_>) -> Vec<(String, StoreKey)> {
    requests
        .iter()
        .map(|r| {
            let key = StoreKey::new(
                target.description,
                target.digest,
                r.image().digest(),
                r.image().bytes().len() as u64,
                &r.spec_constants().canonical_bytes(),
                r.build_options().as_str(),
            )
            .with_label(r.image().name());
            (format!("{}:{}", r.image().name(), r.entry()), key)
        })
        .collect()
}

fn verdict(u: &Usability) -> (&'static str, String) {
    match u {
        Usability::Usable => ("usable", String::new()),
        Usability::OtherBackend(b) => ("other-backend", format!("an entry for {b}")),
        Usability::OtherDevice(d) => (
            "other-device",
            d.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        ),
        Usability::Damaged(p) => ("damaged", p.clone()),
    }
}

fn entry_json(e: &CheckedEntry) -> Value {
    let (v, reason) = verdict(&e.usability);
    let mut o = json!({"label": e.label, "verdict": v});
    if let Some(k) = &e.key {
        o["key_digest"] = json!(k.digest().to_hex());
    }
    if let Usability::OtherDevice(d) = &e.usability {
        o["diffs"] = d
            .iter()
            .map(|f| {
                let (field, old, new) = f.parts();
                json!({"field": field, "old": old, "new": new})
            })
            .collect();
    }
    if !reason.is_empty() {
        o["reason"] = json!(reason);
    }
    o
}

pub fn run(config: &Config, args: &CheckArgs) -> kpc::Result<ExitCode> {
    let selector = args.device.as_ref().unwrap_or(&config.device);
    let device = kpc::select_device(selector)?;
    let description = device.fingerprint.describe();
    let target = Target::new(&description, device.fingerprint.digest);
    let is_dir = args.path.is_dir();
    let (kind, signed, entries) = if is_dir {
        let cache = PersistentCache::new(DiskCacheSettings::from_config_at(config, &args.path));
        let e = check::dir_entries(&cache, target)
            .map_err(|e| Error::Io(format!("listing {}: {e}", args.path.display())))?;
        ("cache directory", None, e)
    } else {
        let (signed, raw) = bundle::read_entries(
            &kpc::admin::store::EntryAuth::from_config(config),
            &args.path,
        )?;
        let e = raw
            .into_iter()
            .map(|b| check::judge(b.label, b.key, b.problem, target))
            .collect();
        ("bundle", Some(signed), e)
    };
    let count = |v: &str| {
        entries
            .iter()
            .filter(|e| verdict(&e.usability).0 == v)
            .count()
    };
    let (usable, other_device, damaged, other_backend) = (
        count("usable"),
        count("other-device"),
        count("damaged"),
        count("other-backend"),
    );
    let app = match &args.app {
        None => None,
        Some(name) if !valid_app_name(name) => {
            return Err(Error::InvalidArgument(format!(
                "--app {name:?}: expected 1 to 64 letters, digits, '.', '_' or '-', not starting \
                 with '.' or '-' (a KPC_CACHE_PREFETCH name)"
            )));
        }
        Some(name) => {
            let mut roots: Vec<&Path> = Vec::new();
            if is_dir {
                roots.push(&args.path);
            }
            roots.extend(config.cache_dir.as_deref());
            let Some((m, requests)) = find_manifest(&roots, &device, name)? else {
                let shown: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
                return Err(Error::InvalidArgument(format!(
                    "--app {name}: no warm-start manifest for it under {}; run the application once \
                     with KPC_CACHE_PREFETCH={name} (and KPC_CACHE_DIR there) to record one",
                    shown.join(" or ")
                )));
            };
            let covered = check::coverage(&entries, &wanted(&requests, target));
            Some((name.clone(), m, covered))
        }
    };
    let ok = match &app {
        Some((_, _, c)) => c.iter().all(|c| c.served),
        None => usable + other_backend == entries.len(),
    };
    let dev = format!("{}:{} {}", device.backend, device.index, device.name);
    if args.json {
        let mut o = json!({
            "path": args.path.display().to_string(),
            "kind": if is_dir { "directory" } else { "bundle" },
            "device": dev,
            "entries": entries.iter().map(entry_json).collect::<Vec<_>>(),
            "usable": usable, "other_device": other_device, "damaged": damaged,
            "other_backend": other_backend, "ok": ok,
        });
        if let Some(s) = signed {
            o["signed"] = json!(s);
        }
        if let Some((name, m, c)) = &app {
            let kernels: Vec<Value> = c
                .iter()
                .map(|c| json!({"kernel": c.kernel, "served": c.served, "why": c.why}))
                .collect();
            o["app"] = json!({"name": name, "manifest": m.display().to_string(),
                "served": c.iter().filter(|c| c.served).count(), "total": c.len(), "kernels": kernels});
        }
        print_json(&o);
    } else {
        print_report(args, kind, signed, &dev, &entries, app.as_ref(), ok);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_report(
    args: &CheckArgs,
    kind: &str,
    signed: Option<bool>,
    dev: &str,
    entries: &[CheckedEntry],
    app: Option<&(String, PathBuf, Vec<Covered>)>,
    ok: bool,
) {
    let signed = match signed {
        Some(true) => " (signed)",
        Some(false) => " (unsigned)",
        None => "",
    };
    outln!(
        "kpc cache check: {kind} {}{signed} for {dev}",
        args.path.display()
    );
    let mut counts = [0usize; 4];
    for e in entries {
        let (v, reason) = verdict(&e.usability);
        let i = ["usable", "other-device", "damaged", "other-backend"]
            .iter()
            .position(|x| *x == v)
            .unwrap_or(2);
        counts[i] += 1;
        let label = if e.label.is_empty() { "?" } else { &e.label };
        if reason.is_empty() {
            outln!("  {v:<14} {label}");
        } else {
            outln!("  {v:<14} {label}: {reason}");
        }
    }
    outln!(
        "entries: {} usable, {} for another device or driver, {} damaged, {} for another backend",
        counts[0],
        counts[1],
        counts[2],
        counts[3]
    );
    if let Some((name, manifest, covered)) = app {
        let served = covered.iter().filter(|c| c.served).count();
        outln!(
            "app {name}: {served} of {} kernels would be served (manifest {})",
            covered.len(),
            manifest.display()
        );
        for c in covered {
            match &c.why {
                None => outln!("  served         {}", c.kernel),
                Some(why) => outln!("  not served     {}: {why}", c.kernel),
            }
        }
    }
    outln!(
        "{}",
        if ok && app.is_none() && counts[0] == 0 {
            "ok: nothing in it is for this device's backend (no --app: no kernel was requested)"
        } else if ok && app.is_none() {
            "ok: every entry for this device's backend is usable (no --app: coverage not checked)"
        } else if ok {
            "ok: every requested kernel would be served"
        } else {
            "NOT OK: some requested kernels would not be served (they would be built)"
        }
    );
}
