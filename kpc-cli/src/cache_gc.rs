//! `kpc cache gc --remote [--older-than D] [--max-size S] [--dry-run]`: the remote's garbage
//! collection (`kpc::admin::store`, retention): entries not served for D, then the least
//! recently served until the rest fit in S, and the fingerprint namespaces nobody was served from for D.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use kpc::Config;
#[cfg(feature = "remote")]
use serde_json::json;

#[cfg(feature = "remote")]
use crate::entry_fmt::{human, utc};

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).multiple(true).args(["older_than", "max_size"])))]
pub struct GcArgs {
    /// Collect the remote tier (KPC_CACHE_REMOTE); the local disk cache has `kpc cache prune`.
    #[arg(long, required = true)]
    pub remote: bool,
    /// Remove entries not served for this long, e.g. 30d, 12h (and namespaces none of whose entries
    /// was).
    #[arg(long, value_parser = parse_age)]
    pub older_than: Option<Duration>,
    /// Then remove the least recently served entries until the rest take at most this, e.g. 20G.
    #[arg(long, value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// Say what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    kpc::admin::config::parse_size("--max-size", s).map_err(|e| e.to_string())
}

fn parse_age(s: &str) -> Result<Duration, String> {
    crate::cache_report::parse_period("--older-than", s)
}

#[cfg(not(feature = "remote"))]
pub fn run(_: &Config, _: &GcArgs) -> kpc::Result<ExitCode> {
    eprintln!("kpc: this kpc was built without the `remote` feature");
    Ok(ExitCode::from(2))
}

#[cfg(feature = "remote")]
pub fn run(config: &Config, args: &GcArgs) -> kpc::Result<ExitCode> {
    use kpc::admin::store::{GcPolicy, GcReason, RemoteStore};
    let Some(url) = &config.remote else {
        eprintln!("kpc: no remote: KPC_CACHE_REMOTE is not set");
        return Ok(ExitCode::from(2));
    };
    let Some(store) = RemoteStore::from_config(config) else {
        eprintln!("kpc: could not set up the remote {url}");
        return Ok(ExitCode::from(2));
    };
    let policy = GcPolicy::default()
        .older_than(args.older_than)
        .max_size(args.max_size);
    let plan = match store.gc_plan(policy, std::time::SystemTime::now()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("kpc: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let total: u64 = plan.entries.iter().map(|e| e.bytes).sum();
    let count = |why| plan.remove.iter().filter(|(_, w)| *w == why).count();
    let bytes: u64 = plan
        .remove
        .iter()
        .map(|&(i, _)| plan.entries[i].bytes)
        .sum();
    let report = if args.dry_run {
        None
    } else {
        match store.gc_apply(&plan) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("kpc: {e}");
                return Ok(ExitCode::from(1));
            }
        }
    };
    if args.json {
        let removing: Vec<_> = plan
            .remove
            .iter()
            .map(|&(i, why)| {
                let e = &plan.entries[i];
                json!({
                    "path": e.path,
                    "bytes": e.bytes,
                    "last_served_unix": e.last_served.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
                    "reason": match why { GcReason::Age => "age", GcReason::Quota => "quota" },
                })
            })
            .collect();
        crate::output::print_json(&json!({
            "remote": url.to_string(),
            "dry_run": args.dry_run,
            "entries": plan.entries.len(),
            "bytes": total,
            "namespaces": plan.namespaces,
            "dead_namespaces": plan.dead_namespaces,
            "planned": removing,
            "removed_by_age": report.as_ref().map(|r| r.removed_by_age),
            "removed_by_quota": report.as_ref().map(|r| r.removed_by_quota),
            "removed_bytes": report.as_ref().map(|r| r.removed_bytes),
            "kept_served": report.as_ref().map(|r| r.kept_served),
            "records_removed": report.as_ref().map(|r| r.records_removed),
        }));
    } else {
        outln!(
            "remote {url}: {} entries, {} in {} fingerprint namespaces",
            plan.entries.len(),
            human(total),
            plan.namespaces
        );
        if let Some(c) = plan.cut {
            let secs = c
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            outln!(
                "not served since {}: {} entries",
                utc(secs),
                count(GcReason::Age)
            );
        }
        if let Some(m) = args.max_size {
            outln!(
                "over {}: {} more entries, least recently served first",
                human(m),
                count(GcReason::Quota)
            );
        }
        for d in &plan.dead_namespaces {
            outln!("namespace {d}: nothing served within the age, removed whole");
        }
        match &report {
            None => outln!(
                "dry run: would remove {} entries ({})",
                plan.remove.len(),
                human(bytes)
            ),
            Some(r) => outln!(
                "removed {} entries ({}); kept {} served since the plan; {} already gone",
                r.removed_by_age + r.removed_by_quota,
                human(r.removed_bytes),
                r.kept_served,
                r.gone
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}
