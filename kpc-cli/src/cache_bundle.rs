//! `kpc cache export|import`: the disk cache's verified entries as one file, and back; `kpc cache ls
//! --bundle`: what a bundle would serve as a read-only layer.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use kpc::DeviceSelector;
use kpc::admin::bundle;
use kpc::admin::bundle::ImportReport;
use kpc::admin::disk::PersistentCache;
use kpc::admin::store::EntryAuth;
use kpc::{Config, Error};
use serde_json::json;

use crate::output::print_json;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The bundle file to write (replaced atomically if it exists).
    pub file: PathBuf,
    /// Only the entries of this device's fingerprint (e.g. vulkan:0, opencl:cpu; as KPC_DEVICE).
    /// Without it, every verified entry of every device.
    #[arg(long, value_parser = parse_selector)]
    pub device: Option<DeviceSelector>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// A bundle written by `kpc cache export`.
    pub file: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

fn parse_selector(s: &str) -> Result<DeviceSelector, String> {
    DeviceSelector::parse(s).map_err(|e| e.to_string())
}

/// What entries are written and checked with: the MAC key (`KPC_CACHE_REMOTE_KEY`), the signing key
/// (`KPC_CACHE_SIGNING_KEY`), the trusted keys (`KPC_CACHE_TRUSTED_KEYS`) and the host id.
fn entry_auth(config: &Config) -> EntryAuth {
    EntryAuth::from_config(config)
}

pub fn export(
    config: &Config,
    cache: &PersistentCache,
    args: &ExportArgs,
) -> kpc::Result<ExitCode> {
    let device = match &args.device {
        None => None,
        Some(sel) => Some(kpc::select_device(sel)?),
    };
    let fingerprint = device
        .as_ref()
        .map(|d| kpc::admin::runtime::cache_fingerprint(d, config))
        .transpose()?;
    let r = bundle::export(
        cache,
        fingerprint.as_ref().map(|f| f.digest),
        &entry_auth(config),
        &args.file,
    )?;
    if args.json {
        print_json(&json!({
            "file": args.file,
            "entries": r.entries,
            "unverified": r.unverified,
            "other_devices": r.other_devices,
            "raw_bytes": r.raw_bytes,
            "file_bytes": r.file_bytes,
            "signed": r.signed,
            "signer": r.signer,
            "device": fingerprint.as_ref().map(|f| f.digest.to_hex()),
        }));
    } else {
        let which = match (&device, &fingerprint) {
            (Some(d), Some(f)) => format!(
                " of {}:{} {} (fingerprint {})",
                d.backend,
                d.index,
                d.name,
                f.digest.short_hex(8)
            ),
            _ => String::new(),
        };
        outln!(
            "exported {} entries{which} to {} ({} bytes, {} before compression, {})",
            r.entries,
            args.file.display(),
            r.file_bytes,
            r.raw_bytes,
            match (r.signed, &r.signer) {
                (true, Some(s)) => format!("MAC'd with KPC_CACHE_REMOTE_KEY, signed by {s}"),
                (true, None) => "MAC'd with KPC_CACHE_REMOTE_KEY, not signed".into(),
                (false, Some(s)) => format!("signed by {s}"),
                (false, None) =>
                    "unsigned: set KPC_CACHE_SIGNING_KEY (or KPC_CACHE_REMOTE_KEY) to sign".into(),
            }
        );
        if r.unverified > 0 {
            outln!(
                "left out {} entries that did not verify (`kpc cache verify` shows them)",
                r.unverified
            );
        }
        if r.other_devices > 0 {
            outln!("left out {} entries of other devices", r.other_devices);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_import(args: &ImportArgs, r: &ImportReport) {
    if args.json {
        let refused: Vec<_> = r
            .refused
            .iter()
            .map(|x| json!({"index": x.index, "label": x.label, "reason": x.reason}))
            .collect();
        print_json(&json!({
            "file": args.file,
            "total": r.total,
            "taken": r.taken,
            "present": r.present,
            "not_stored": r.not_stored,
            "refused": refused,
            "signed": r.signed,
        }));
        return;
    }
    outln!(
        "{}: {} entries: {} taken, {} already present, {} refused, {} not stored",
        args.file.display(),
        r.total,
        r.taken,
        r.present,
        r.refused.len(),
        r.not_stored
    );
    for x in &r.refused {
        outln!(
            "  refused entry {} ({}): {}",
            x.index,
            if x.label.is_empty() { "?" } else { &x.label },
            x.reason
        );
    }
    if r.not_stored > 0 {
        outln!(
            "  not stored: outside KPC_CACHE_MIN/MAX_DEVICE_IMAGE_SIZE or KPC_CACHE_MAX_SIZE, or the cache could not be written (see the warning above)"
        );
    }
}

/// Exit status 1 when any entry was refused, so a script notices a tampered or foreign bundle.
pub fn import(
    config: &Config,
    cache: &PersistentCache,
    args: &ImportArgs,
) -> kpc::Result<ExitCode> {
    if !config.persistent {
        return Err(Error::InvalidArgument(
            "KPC_CACHE_PERSISTENT=0: the disk cache is disabled, so there is nowhere to import to; unset it or set it to 1".into(),
        ));
    }
    let r = bundle::import(cache, &entry_auth(config), &args.file)?;
    print_import(args, &r);
    Ok(if r.refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `kpc cache ls --bundle FILE`: every entry of the bundle, verified as a lookup through
/// `KPC_CACHE_READONLY_DIRS` would verify it. Exit 1 if any would be refused, 2 if the file cannot be
/// read as a bundle.
pub fn ls(config: &Config, file: &std::path::Path, json: bool) -> kpc::Result<ExitCode> {
    let store = bundle::BundleStore::from_config(config, file);
    let rows = match store.list_verified() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kpc: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let refused = rows.iter().filter(|r| r.verdict.is_err()).count();
    if json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "image": r.label,
                    "key_digest": r.key_digest,
                    "backend": r.record.as_ref().map(|x| x.backend().to_owned()),
                    "device_digest": r.record.as_ref().map(|x| x.device_digest.clone()),
                    "options": r.record.as_ref().map(|x| x.options.clone()),
                    "bytes": r.bytes,
                    "verified": r.verdict.is_ok(),
                    "refused": r.verdict.as_ref().err(),
                })
            })
            .collect();
        print_json(&json!({"bundle": file, "entries": list, "refused": refused}));
    } else {
        outln!("bundle {}", file.display());
        outln!(
            "{:<36}  {:<7}  {:<20}  {:>10}  VERIFIED",
            "IMAGE",
            "BACKEND",
            "OPTIONS",
            "SIZE"
        );
        for r in &rows {
            let backend = r.record.as_ref().map_or("?", |x| x.backend());
            let opts = r
                .record
                .as_ref()
                .map(|x| x.options.as_str())
                .filter(|o| !o.is_empty())
                .unwrap_or("-");
            let verdict = match &r.verdict {
                Ok(()) => "ok".to_string(),
                Err(why) => format!("REFUSED: {why}"),
            };
            let image = format!(
                "{} ({})",
                r.label,
                &r.key_digest[..r.key_digest.len().min(8)]
            );
            outln!(
                "{image:<36}  {backend:<7}  {opts:<20}  {:>10}  {verdict}",
                r.bytes
            );
        }
        outln!("{} entries, {refused} refused", rows.len());
    }
    Ok(if refused > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
