//! `kpc cache ls --remote [--provenance]`, `kpc cache ls --provenance` and the remote part of `kpc
//! cache stats`: what the remote tier (`KPC_CACHE_REMOTE`) holds, read through the same store the
//! runtime uses and verified as a lookup would verify it, and who built what.

use std::process::ExitCode;

use kpc::Config;
use kpc::StoreEntry;
use kpc::admin::disk::PersistentCache;
use kpc::admin::store::Provenance;
use serde_json::{Value, json};

use crate::entry_fmt::utc;

/// One listed remote entry: the entry as its record claims, and `Ok(provenance)` if a lookup would
/// load it, else why not.
type Listed = (StoreEntry, Result<Option<Provenance>, String>);

/// The remote's entries for the device `KPC_DEVICE` selects, each verified, or why they cannot be
/// listed.
#[cfg(feature = "remote")]
fn verified(config: &Config) -> Result<(String, Vec<Listed>), String> {
    let Some(url) = &config.remote else {
        return Err("no remote: KPC_CACHE_REMOTE is not set".into());
    };
    let store = kpc::admin::store::RemoteStore::from_config(config)
        .ok_or_else(|| format!("could not set up the remote {url}"))?;
    let d = kpc::select_device(&config.device).map_err(|e| e.to_string())?;
    let e = store
        .list_verified(Some(d.fingerprint.digest))
        .map_err(|e| e.to_string())?;
    let rows = e
        .into_iter()
        .map(|v| (v.entry, v.verdict.map_err(|r| r.to_string())))
        .collect();
    Ok((url.to_string(), rows))
}

#[cfg(not(feature = "remote"))]
fn verified(_: &Config) -> Result<(String, Vec<Listed>), String> {
    Err("this kpc was built without the `remote` feature".into())
}

/// Every device's remote entries as their records claim (for `kpc cache stats`).
#[cfg(feature = "remote")]
fn all_entries(config: &Config) -> Result<(String, Vec<StoreEntry>), String> {
    let Some(url) = &config.remote else {
        return Err("no remote: KPC_CACHE_REMOTE is not set".into());
    };
    let store = kpc::admin::store::RemoteStore::from_config(config)
        .ok_or_else(|| format!("could not set up the remote {url}"))?;
    let e = store.list_device(None).map_err(|e| e.to_string())?;
    Ok((url.to_string(), e))
}

#[cfg(not(feature = "remote"))]
fn all_entries(_: &Config) -> Result<(String, Vec<StoreEntry>), String> {
    Err("this kpc was built without the `remote` feature".into())
}

fn provenance_json(p: Option<&Provenance>) -> Value {
    match p {
        None => Value::Null,
        Some(p) => json!({
            "host": p.host,
            "kpc": p.kpc_version,
            "driver": p.driver,
            "built_unix": p.built_unix,
            "build_ms": p.build_time.as_secs_f64() * 1e3,
            "signer": p.signer,
        }),
    }
}

fn image_of(e: &StoreEntry) -> String {
    let r = &e.record;
    let label = if r.label.is_empty() { "-" } else { &r.label };
    format!("{label} ({})", r.image_digest.get(..8).unwrap_or(""))
}

/// `kpc cache ls --remote`: one row per entry the remote holds for the selected device, with whether
/// a lookup here would load it; with `provenance`, who built it. Exit status 1 if any entry would be
/// refused.
pub fn ls(config: &Config, json: bool, provenance: bool) -> kpc::Result<ExitCode> {
    let (url, entries) = match verified(config) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("kpc: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let refused = entries.iter().filter(|(_, v)| v.is_err()).count();
    if json {
        let rows: Vec<Value> = entries
            .iter()
            .map(|(e, v)| {
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
                    "verified": v.is_ok(),
                    "refused": v.as_ref().err(),
                    "provenance": provenance_json(v.as_ref().ok().and_then(Option::as_ref)),
                })
            })
            .collect();
        crate::output::print_json(&json!({"remote": url, "entries": rows, "refused": refused}));
    } else {
        outln!("remote {url}");
        if provenance {
            outln!(
                "{:<30}  {:<16}  {:<7}  {:<23}  {:>9}  {:<24}  {:<8}  DRIVER",
                "IMAGE",
                "HOST",
                "KPC",
                "BUILT",
                "BUILD MS",
                "SIGNER",
                "VERIFIED"
            );
        } else {
            outln!(
                "{:<36}  {:<20}  {:>10}  {:>9}  VERIFIED",
                "IMAGE",
                "OPTIONS",
                "SIZE",
                "BUILD MS"
            );
        }
        for (e, v) in &entries {
            let r = &e.record;
            let verdict = if v.is_ok() { "ok" } else { "REFUSED" };
            if provenance {
                let p = v.as_ref().ok().and_then(Option::as_ref);
                let f = |g: fn(&Provenance) -> String| p.map_or("-".to_string(), g);
                outln!(
                    "{:<30}  {:<16}  {:<7}  {:<23}  {:>9.1}  {:<24}  {verdict:<8}  {}",
                    image_of(e),
                    f(|p| p.host.clone()),
                    f(|p| p.kpc_version.clone()),
                    f(|p| utc(p.built_unix)),
                    r.build_time.as_secs_f64() * 1e3,
                    f(|p| p.signer.clone().unwrap_or_else(|| "unsigned".into())),
                    f(|p| p.driver.clone()),
                );
            } else {
                let opts = if r.options.is_empty() {
                    "-"
                } else {
                    &r.options
                };
                outln!(
                    "{:<36}  {opts:<20}  {:>10}  {:>9.1}  {verdict}",
                    image_of(e),
                    e.bytes,
                    r.build_time.as_secs_f64() * 1e3
                );
            }
            if let Err(why) = v {
                outln!("  refused: {why}");
            }
        }
        outln!("{} entries, {refused} refused", entries.len());
    }
    Ok(if refused == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `kpc cache ls --provenance` (local): who built each entry of the local disk cache, as its key
/// record says: the builder's host, kpc version, when and how long, the signer whose signature this
/// machine verified when it took the entry from the remote or a bundle, and the driver. An entry
/// written by a kpc before provenance records none (`-`).
pub fn ls_local_provenance(cache: &PersistentCache, json: bool) -> kpc::Result<ExitCode> {
    let entries = cache
        .entries()
        .map_err(|e| kpc::Error::Io(format!("{}: {e}", cache.root().display())))?;
    let rows: Vec<_> = entries
        .iter()
        .filter_map(|e| e.record.as_ref().map(|r| (e, r)))
        .collect();
    if json {
        let v: Vec<Value> = rows
            .iter()
            .map(|(e, r)| {
                json!({
                    "device": e.dirs[0],
                    "image": r.label,
                    "image_digest": r.image_digest,
                    "written_unix": r.created_unix,
                    "build_ms": r.build_time.as_secs_f64() * 1e3,
                    "provenance": provenance_json(r.provenance.as_ref()),
                })
            })
            .collect();
        crate::output::print_json(&json!({"root": cache.root(), "entries": v}));
        return Ok(ExitCode::SUCCESS);
    }
    outln!("cache {}", cache.root().display());
    outln!(
        "{:<30}  {:<16}  {:<7}  {:<23}  {:>9}  {:<24}  DRIVER",
        "IMAGE",
        "HOST",
        "KPC",
        "BUILT",
        "BUILD MS",
        "SIGNER"
    );
    for (_, r) in &rows {
        let label = if r.label.is_empty() { "-" } else { &r.label };
        let p = r.provenance.as_ref();
        let f = |g: fn(&Provenance) -> String| p.map_or("-".to_string(), g);
        outln!(
            "{:<30}  {:<16}  {:<7}  {:<23}  {:>9.1}  {:<24}  {}",
            format!("{label} ({})", r.image_digest.get(..8).unwrap_or("")),
            f(|p| p.host.clone()),
            f(|p| p.kpc_version.clone()),
            f(|p| utc(p.built_unix)),
            r.build_time.as_secs_f64() * 1e3,
            f(|p| p.signer.clone().unwrap_or_else(|| "-".into())),
            kpc::admin::store::driver_of(&r.device)
        );
    }
    outln!("{} entries", rows.len());
    Ok(ExitCode::SUCCESS)
}

/// The remote's line in `kpc cache stats`: entries and bytes for every device, or why not; `None`
/// without a remote.
pub fn stats(config: &Config) -> Option<Value> {
    config.remote.as_ref()?;
    Some(match all_entries(config) {
        Ok((url, e)) => json!({
            "url": url,
            "entries": e.len(),
            "bytes": e.iter().map(|e| e.bytes).sum::<u64>(),
        }),
        Err(e) => json!({"error": e}),
    })
}
