//! `kpc cache path|stats|ls|verify|prune|clear` (`explain` lives in `cache_explain.rs`, `export` and
//! `import` in `cache_bundle.rs`, `check` in `cache_check.rs`, `prebuild` in `cache_prebuild.rs`): inspect and maintain the on-disk cache.
//!
//! The commands work on the configured cache directory even when `KPC_CACHE_PERSISTENT=0` (a disabled
//! cache can still be inspected or cleared). Output is for people by default; `--json` prints one JSON
//! document on stdout for scripts.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{ArgGroup, Subcommand};
use kpc::Config;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use serde_json::{Value, json};

use crate::entry_fmt::{device_of, human, utc};

#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// Print the cache directory.
    Path,
    /// Entries and bytes per device.
    Stats {
        /// Machine-readable output (the same as --format json).
        #[arg(long)]
        json: bool,
        /// Output format: text, json, or prometheus (the text exposition format, for a node
        /// exporter's textfile collector or a push gateway).
        #[arg(long, value_enum, default_value = "text")]
        format: crate::cache_metrics::Format,
        /// Count what eviction cost (misses on evicted entries, their bytes, the KPC_CACHE_MAX_SIZE
        /// that would have served them) over this last period only, e.g. 30m, 12h, 7d (default:
        /// everything the eviction record holds).
        #[arg(long, value_parser = crate::cache_report::parse_since)]
        since: Option<Duration>,
    },
    /// One row per entry: device, image, options, size, last access.
    Ls {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// List what the remote (KPC_CACHE_REMOTE) holds for the selected device instead, each entry
        /// verified as a lookup would (MAC, writer signature, checksums).
        #[arg(long)]
        remote: bool,
        /// Show who built each entry: host, kpc version, driver, build time and duration, signer.
        #[arg(long)]
        provenance: bool,
        /// List a bundle file (`kpc cache export`) instead, each entry verified as a lookup through
        /// KPC_CACHE_READONLY_DIRS would (MAC, writer signature, checksums, full key); exit with
        /// status 1 if any would be refused.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["remote", "provenance"])]
        bundle: Option<std::path::PathBuf>,
    },
    /// Check every entry's checksums; exit with status 1 if any entry is bad.
    Verify {
        /// Move bad entries to <root>/quarantine and remove leftovers of killed writers.
        #[arg(long)]
        fix: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Garbage-collect the remote tier (--remote): entries not served for --older-than, then the
    /// least recently served down to --max-size, and fingerprint namespaces nobody was served from.
    Gc(crate::cache_gc::GcArgs),
    /// Remove entries: least recently accessed first down to --max-size, and/or those not accessed
    /// for --older-than.
    #[command(group(ArgGroup::new("what").required(true).multiple(true).args(["max_size", "older_than"])))]
    Prune {
        /// Size to shrink to, e.g. 512M (suffixes K, M, G, T).
        #[arg(long, value_parser = parse_size)]
        max_size: Option<u64>,
        /// Remove entries last accessed longer ago than this, e.g. 30m, 12h, 7d.
        #[arg(long, value_parser = parse_age)]
        older_than: Option<Duration>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// For each kernel `kpc attention` would use (same arguments), whether it is cached and if not,
    /// why: the nearest cached entry and the key fields that differ. Or one key, given as a blob id.
    Explain(Box<crate::cache_explain::ExplainArgs>),
    /// Write every verified entry (of one device with --device) to one zstd-compressed file, MAC'd
    /// when KPC_CACHE_REMOTE_KEY is set and signed when KPC_CACHE_SIGNING_KEY is: for container
    /// images and offline machines.
    Export(crate::cache_bundle::ExportArgs),
    /// Verify every entry of a bundle (its MAC when KPC_CACHE_REMOTE_KEY is set, a trusted signature
    /// when KPC_CACHE_TRUSTED_KEYS is) and publish those that pass to this cache; exit with status 1
    /// if any entry was refused.
    Import(crate::cache_bundle::ImportArgs),
    /// Preflight: whether this device can use each entry of a bundle or cache directory (the field
    /// that differs when not) and, with --app, how many of the app's kernels it would serve; exit
    /// with status 1 unless every requested kernel would be served.
    Check(crate::cache_check::CheckArgs),
    /// Build, in parallel, every kernel the app's warm-start manifests name (also those recorded
    /// under an older driver) for the selected device, into every writable store (with a redis
    /// remote, each kernel once per fleet); exit with status 1 if any failed.
    Prebuild(crate::cache_prebuild::PrebuildArgs),
    /// Write a new Ed25519 key pair for writer signatures: the private key to FILE (mode 0600), the
    /// public key to FILE.pub.
    Keygen(crate::cache_keys::KeygenArgs),
    /// Rank the miss journal: miss causes, kernels built more than once (across the fleet with
    /// --remote), compile seconds spent building and saved by hits.
    Report(crate::cache_report::ReportArgs),
    /// Remove every entry, the quarantine directory and the eviction record.
    Clear {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    kpc::admin::config::parse_size("--max-size", s).map_err(|e| e.to_string())
}

fn parse_age(s: &str) -> Result<Duration, String> {
    crate::cache_report::parse_period("--older-than", s)
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn ago(t: SystemTime) -> String {
    let s = SystemTime::now()
        .duration_since(t)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        3600..86_400 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

pub fn run(config: &Config, cmd: CacheCommand) -> kpc::Result<ExitCode> {
    match cmd {
        CacheCommand::Ls {
            json,
            bundle: Some(file),
            ..
        } => return crate::cache_bundle::ls(config, &file, json),
        CacheCommand::Ls {
            json,
            remote: true,
            provenance,
            ..
        } => return crate::cache_remote::ls(config, json, provenance),
        CacheCommand::Keygen(args) => return crate::cache_keys::keygen(config, &args),
        CacheCommand::Gc(args) => return crate::cache_gc::run(config, &args),
        _ => {}
    }
    if let CacheCommand::Check(args) = &cmd {
        return crate::cache_check::run(config, args);
    }
    if let CacheCommand::Prebuild(args) = &cmd {
        return crate::cache_prebuild::run(config, args);
    }
    let Some(settings) = DiskCacheSettings::from_config_dir(config) else {
        eprintln!(
            "kpc: no cache directory: none of KPC_CACHE_DIR, XDG_CACHE_HOME (absolute) or HOME (absolute) is set"
        );
        return Ok(ExitCode::from(2));
    };
    if !config.persistent {
        eprintln!(
            "kpc: note: the disk cache is disabled (KPC_CACHE_PERSISTENT=0); showing its directory anyway"
        );
    }
    let (max_size, max_entries) = (settings.max_size, settings.max_entries);
    let cache = PersistentCache::new(settings);
    let io = |e: std::io::Error| kpc::Error::Io(format!("{}: {e}", cache.root().display()));
    match cmd {
        CacheCommand::Explain(args) => crate::cache_explain::run(config, cache, &args),
        CacheCommand::Report(args) => crate::cache_report::run(config, &cache, &args),
        CacheCommand::Export(args) => crate::cache_bundle::export(config, &cache, &args),
        CacheCommand::Import(args) => crate::cache_bundle::import(config, &cache, &args),
        CacheCommand::Check(args) => crate::cache_check::run(config, &args),
        CacheCommand::Prebuild(args) => crate::cache_prebuild::run(config, &args),
        CacheCommand::Gc(args) => crate::cache_gc::run(config, &args),
        CacheCommand::Path => {
            outln!("{}", cache.root().display());
            Ok(ExitCode::SUCCESS)
        }
        CacheCommand::Stats {
            format: crate::cache_metrics::Format::Prometheus,
            ..
        } => crate::cache_metrics::prometheus(config, &cache, max_size),
        CacheCommand::Stats {
            json,
            format,
            since,
        } => {
            let json = json || format == crate::cache_metrics::Format::Json;
            let entries = cache.entries().map_err(io)?;
            let mut per: BTreeMap<String, (String, String, u64, u64)> = BTreeMap::new();
            for e in &entries {
                let (backend, name) = device_of(e);
                let d = per
                    .entry(e.dirs[0].clone())
                    .or_insert((backend, name, 0, 0));
                d.2 += 1;
                d.3 += e.bytes;
            }
            let total: u64 = entries.iter().map(|e| e.bytes).sum();
            let (qn, qb) = cache.quarantined();
            if json {
                let devices: Vec<Value> = per
                    .iter()
                    .map(|(dir, (backend, name, n, b))| {
                        json!({"device": dir, "backend": backend, "name": name, "entries": n, "bytes": b})
                    })
                    .collect();
                crate::output::print_json(&json!({
                    "root": cache.root(),
                    "enabled": config.persistent,
                    "max_size": max_size,
                    "tracked_size": cache.tracked_size(),
                    "max_entries": max_entries,
                    "tracked_entries": cache.tracked_entries(),
                    "entries": entries.len(),
                    "bytes": total,
                    "devices": devices,
                    "quarantine": {"files": qn, "bytes": qb},
                    "eviction": crate::cache_report::eviction_json(&cache, since),
                    "remote": crate::cache_remote::stats(config),
                }));
            } else {
                outln!(
                    "cache {} ({})",
                    cache.root().display(),
                    if config.persistent {
                        "on"
                    } else {
                        "off: KPC_CACHE_PERSISTENT=0"
                    }
                );
                let limit = if max_size == 0 {
                    "unlimited".to_string()
                } else {
                    human(max_size)
                };
                match max_entries {
                    0 => outln!("limit {limit}"),
                    n => outln!("limit {limit}, {n} entries"),
                }
                outln!(
                    "{:<16}  {:<7}  {:<32}  {:>7}  {:>10}",
                    "DEVICE",
                    "BACKEND",
                    "NAME",
                    "ENTRIES",
                    "SIZE"
                );
                for (dir, (backend, name, n, b)) in &per {
                    outln!(
                        "{dir:<16}  {backend:<7}  {name:<32}  {n:>7}  {:>10}",
                        human(*b)
                    );
                }
                outln!(
                    "{:<16}  {:<7}  {:<32}  {:>7}  {:>10}",
                    "total",
                    "",
                    "",
                    entries.len(),
                    human(total)
                );
                crate::cache_report::eviction_text(&cache, since, max_size);
                if qn > 0 {
                    outln!(
                        "quarantine: {qn} files, {} in {}",
                        human(qb),
                        cache.quarantine_dir().display()
                    );
                }
                if let Some(r) = crate::cache_remote::stats(config) {
                    match r.get("error") {
                        Some(e) => outln!("remote: {}", e.as_str().unwrap_or("?")),
                        None => outln!(
                            "remote {}: {} entries, {} (all devices)",
                            r["url"].as_str().unwrap_or("?"),
                            r["entries"],
                            human(r["bytes"].as_u64().unwrap_or(0))
                        ),
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        CacheCommand::Keygen(args) => crate::cache_keys::keygen(config, &args),
        CacheCommand::Ls {
            json,
            provenance: true,
            ..
        } => crate::cache_remote::ls_local_provenance(&cache, json),
        CacheCommand::Ls { json, .. } => {
            let entries = cache.entries().map_err(io)?;
            if json {
                let rows: Vec<Value> = entries
                    .iter()
                    .map(|e| {
                        let (backend, name) = device_of(e);
                        let r = e.record.as_ref();
                        json!({
                            "device": e.dirs[0],
                            "backend": backend,
                            "device_name": name,
                            "image": r.map(|r| r.label.clone()),
                            "image_digest": r.map(|r| r.image_digest.clone()),
                            "image_len": r.map(|r| r.image_len),
                            "spec": r.map(|r| r.spec.clone()),
                            "options": r.map(|r| r.options.clone()),
                            "build_ms": r.map(|r| r.build_time.as_secs_f64() * 1e3),
                            "bytes": e.bytes,
                            "last_access_unix": unix(e.last_access),
                            "slot": e.slot,
                            "path": e.leaf,
                        })
                    })
                    .collect();
                crate::output::print_json(&Value::Array(rows));
            } else {
                // Columns as wide as their widest value: GLSL options strings and image labels run
                // long, and a fixed width shifted every column after them.
                let rows: Vec<[String; 4]> = entries
                    .iter()
                    .map(|e| {
                        let (backend, _) = device_of(e);
                        let (image, options) = match &e.record {
                            Some(r) => {
                                let label = if r.label.is_empty() { "-" } else { &r.label };
                                let short = r.image_digest.get(..8).unwrap_or("");
                                let opts = if r.options.is_empty() {
                                    "-".to_string()
                                } else {
                                    r.options.clone()
                                };
                                (format!("{label} ({short})"), opts)
                            }
                            None => ("?".into(), "?".into()),
                        };
                        let last = format!("{} ({})", utc(unix(e.last_access)), ago(e.last_access));
                        [format!("{} ({backend})", e.dirs[0]), image, options, last]
                    })
                    .collect();
                let width = |col: usize, header: &str| {
                    rows.iter()
                        .map(|r| r[col].chars().count())
                        .chain([header.len()])
                        .max()
                        .unwrap_or(0)
                };
                let (wd, wi, wo) = (width(0, "DEVICE"), width(1, "IMAGE"), width(2, "OPTIONS"));
                outln!(
                    "{:<wd$}  {:<wi$}  {:<wo$}  {:>10}  LAST ACCESS",
                    "DEVICE",
                    "IMAGE",
                    "OPTIONS",
                    "SIZE"
                );
                for (e, [device, image, options, last]) in entries.iter().zip(&rows) {
                    outln!(
                        "{device:<wd$}  {image:<wi$}  {options:<wo$}  {:>10}  {last}",
                        human(e.bytes)
                    );
                }
                outln!("{} entries", entries.len());
            }
            Ok(ExitCode::SUCCESS)
        }
        CacheCommand::Verify { fix, json } => {
            let r = cache.verify(fix).map_err(io)?;
            if json {
                let bad: Vec<Value> = r
                    .bad
                    .iter()
                    .map(|b| json!({"path": b.path, "slot": b.slot, "problem": b.problem, "quarantined": b.quarantined}))
                    .collect();
                crate::output::print_json(&json!({
                    "checked": r.checked,
                    "valid": r.valid,
                    "bad": bad,
                    "stale": r.stale,
                    "stale_removed": r.stale_removed,
                }));
            } else {
                outln!(
                    "checked {} entries: {} valid, {} bad",
                    r.checked,
                    r.valid,
                    r.bad.len()
                );
                for b in &r.bad {
                    let q = if b.quarantined { " [quarantined]" } else { "" };
                    outln!("BAD    {}: {}{q}", b.path.display(), b.problem);
                }
                for s in &r.stale {
                    outln!(
                        "STALE  {}: incomplete slot (a write in progress or a killed writer's leftovers){}",
                        s.display(),
                        if fix { "" } else { "; --fix removes it" }
                    );
                }
                if fix && r.bad.iter().any(|b| b.quarantined) {
                    outln!(
                        "quarantined entries are in {}",
                        cache.quarantine_dir().display()
                    );
                }
            }
            Ok(if r.bad.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        CacheCommand::Prune {
            max_size,
            older_than,
            json,
        } => {
            let cutoff = older_than.map(|d| SystemTime::now() - d);
            let r = cache.evict(max_size, cutoff).map_err(io)?;
            if !r.ran {
                eprintln!(
                    "kpc: another process is evicting and kept at it past KPC_CACHE_LOCK_TIMEOUT"
                );
                return Ok(ExitCode::FAILURE);
            }
            if json {
                crate::output::print_json(&json!({
                    "removed": r.removed,
                    "removed_bytes": r.removed_bytes,
                    "stale_removed": r.stale_removed,
                    "busy": r.busy,
                    "remaining_entries": r.remaining_entries,
                    "remaining_bytes": r.remaining_bytes,
                }));
            } else {
                outln!(
                    "removed {} entries ({}); {} entries ({}) left",
                    r.removed,
                    human(r.removed_bytes),
                    r.remaining_entries,
                    human(r.remaining_bytes)
                );
                if r.busy > 0 {
                    outln!(
                        "skipped {} entries being written by another process",
                        r.busy
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        CacheCommand::Clear { json } => {
            let r = cache.clear().map_err(io)?;
            if json {
                crate::output::print_json(&json!({
                    "removed": r.removed,
                    "removed_bytes": r.removed_bytes,
                    "stale_removed": r.stale_removed,
                    "busy": r.busy,
                    "quarantine_removed": r.quarantine_removed,
                }));
            } else {
                outln!(
                    "removed {} entries ({}) from {}",
                    r.removed,
                    human(r.removed_bytes),
                    cache.root().display()
                );
                if r.busy > 0 {
                    outln!(
                        "skipped {} entries being written by another process",
                        r.busy
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn ages_and_sizes_parse() {
        assert_eq!(parse_age("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(parse_age("30m").unwrap(), Duration::from_secs(1800));
        assert!(parse_age("soon").is_err());
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(12), "12 B");
    }
}
