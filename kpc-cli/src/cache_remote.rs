//! `kpc cache ls --remote` and the remote part of `kpc cache stats`: what the remote tier
//! (`KPC_CACHE_REMOTE`) holds, read through the same store the runtime uses.

use std::process::ExitCode;

use kpc::Config;
use kpc::cache::store::StoreEntry;
use serde_json::{Value, json};

/// The remote's entries for the device `KPC_DEVICE` selects (every device with `all_devices`), or
/// why they cannot be listed.
#[cfg(feature = "remote")]
fn entries(config: &Config, all_devices: bool) -> Result<(String, Vec<StoreEntry>), String> {
    let Some(url) = &config.remote else {
        return Err("no remote: KPC_CACHE_REMOTE is not set".into());
    };
    let store = kpc::cache::store::RemoteStore::from_config(config)
        .ok_or_else(|| format!("could not set up the remote {url}"))?;
    let device = if all_devices {
        None
    } else {
        let d = kpc::runtime::select_device(&config.device).map_err(|e| e.to_string())?;
        Some(d.fingerprint.digest)
    };
    let e = store.list_device(device).map_err(|e| e.to_string())?;
    Ok((url.to_string(), e))
}

#[cfg(not(feature = "remote"))]
fn entries(_: &Config, _: bool) -> Result<(String, Vec<StoreEntry>), String> {
    Err("this kpc was built without the `remote` feature".into())
}

/// `kpc cache ls --remote`: one row per entry the remote holds for the selected device.
pub fn ls(config: &Config, json: bool) -> kpc::Result<ExitCode> {
    let (url, entries) = match entries(config, false) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("kpc: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    if json {
        let rows: Vec<Value> = entries
            .iter()
            .map(|e| {
                let r = &e.record;
                json!({
                    "device_digest": r.device_digest,
                    "image": r.label,
                    "image_digest": r.image_digest,
                    "image_len": r.image_len,
                    "spec": r.spec,
                    "options": r.options,
                    "build_ms": r.build_time.as_secs_f64() * 1e3,
                    "bytes": e.bytes,
                })
            })
            .collect();
        crate::output::print_json(&json!({"remote": url, "entries": rows}));
    } else {
        outln!("remote {url}");
        outln!(
            "{:<36}  {:<20}  {:>10}  {:>9}",
            "IMAGE",
            "OPTIONS",
            "SIZE",
            "BUILD MS"
        );
        for e in &entries {
            let r = &e.record;
            let label = if r.label.is_empty() { "-" } else { &r.label };
            let image = format!("{label} ({})", r.image_digest.get(..8).unwrap_or(""));
            let opts = if r.options.is_empty() {
                "-"
            } else {
                &r.options
            };
            outln!(
                "{image:<36}  {opts:<20}  {:>10}  {:>9.1}",
                e.bytes,
                r.build_time.as_secs_f64() * 1e3
            );
        }
        outln!("{} entries", entries.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// The remote's line in `kpc cache stats`: entries and bytes for every device, or why not; `None`
/// without a remote.
pub fn stats(config: &Config) -> Option<Value> {
    config.remote.as_ref()?;
    Some(match entries(config, true) {
        Ok((url, e)) => json!({
            "url": url,
            "entries": e.len(),
            "bytes": e.iter().map(|e| e.bytes).sum::<u64>(),
        }),
        Err(e) => json!({"error": e}),
    })
}
