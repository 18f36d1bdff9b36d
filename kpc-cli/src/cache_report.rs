//! `kpc cache report` (the miss journal, ranked: `kpc::admin::journal`) and the eviction part of
//! `kpc cache stats` (what eviction cost, and the `KPC_CACHE_MAX_SIZE` that would have served the
//! misses it caused: `kpc::admin::disk`).

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use kpc::Config;
use kpc::admin::disk::PersistentCache;
use kpc::admin::journal;
use kpc::admin::journal::{JournalRecord, Report};
use serde_json::{Value, json};

use crate::entry_fmt::human;

/// Arguments of `kpc cache report`.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Read the fleet's journal, shared through the remote (KPC_CACHE_REMOTE: a redis stream, or one
    /// object per host on fs and s3), instead of this cache directory's.
    #[arg(long)]
    remote: bool,
    /// Only records of this last period, e.g. 30m, 12h, 7d (default: everything recorded).
    #[arg(long, value_parser = parse_since)]
    since: Option<Duration>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

/// `--since`'s value: a period such as 30m, 12h or 7d.
pub(crate) fn parse_since(s: &str) -> Result<Duration, String> {
    parse_period("--since", s)
}

/// A period for `flag`: a duration (`30m`, `12h`) or whole days (`7d`).
pub(crate) fn parse_period(flag: &'static str, s: &str) -> Result<Duration, String> {
    if let Some(days) = s.trim().strip_suffix('d') {
        return days
            .trim()
            .parse::<u64>()
            .ok()
            .and_then(|d| d.checked_mul(86_400))
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{flag}={s:?} is not valid: expected e.g. 30m, 12h or 7d"));
    }
    kpc::admin::config::parse_duration(flag, s).map_err(|e| e.to_string())
}

fn since_time(since: Option<Duration>) -> Option<SystemTime> {
    since.map(|d| {
        SystemTime::now()
            .checked_sub(d)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    })
}

/// The fleet's records from the remote, or why not.
#[cfg(feature = "remote")]
fn remote_records(config: &Config) -> Result<(String, Vec<JournalRecord>), String> {
    use kpc::Store;
    let Some(url) = &config.remote else {
        return Err("no remote: KPC_CACHE_REMOTE is not set".into());
    };
    let store = kpc::admin::store::RemoteStore::from_config(config)
        .ok_or_else(|| format!("could not set up the remote {url}"))?;
    match store.fleet().and_then(|f| f.read_journal()) {
        None => Err(format!("the remote {url} keeps no miss journal")),
        Some(Err(e)) => Err(e.to_string()),
        Some(Ok(lines)) => Ok((
            format!("remote {url}"),
            lines
                .iter()
                .filter_map(|l| JournalRecord::parse(l))
                .collect(),
        )),
    }
}

#[cfg(not(feature = "remote"))]
fn remote_records(_: &Config) -> Result<(String, Vec<JournalRecord>), String> {
    Err("this kpc was built without the `remote` feature".into())
}

fn secs(ms: u64) -> String {
    format!("{:.1}", ms as f64 / 1000.0)
}

fn report_json(source: &str, since: Option<Duration>, r: &Report) -> Value {
    json!({
        "source": source,
        "since_secs": since.map(|d| d.as_secs()),
        "records": r.records,
        "hosts": r.hosts,
        "builds": r.builds,
        "spent_ms": r.spent_ms,
        "hits": r.hits,
        "saved_ms": r.saved_ms,
        "causes": r.causes.iter().map(|c| json!({
            "cause": c.cause, "builds": c.builds, "build_ms": c.build_ms,
        })).collect::<Vec<_>>(),
        "rebuilt": r.rebuilt.iter().map(|k| json!({
            "key": k.key, "label": k.label, "builds": k.builds, "hosts": k.hosts,
            "build_ms": k.build_ms, "causes": k.causes,
        })).collect::<Vec<_>>(),
    })
}

/// `kpc cache report`.
pub fn run(config: &Config, cache: &PersistentCache, args: &ReportArgs) -> kpc::Result<ExitCode> {
    let (source, records) = if args.remote {
        match remote_records(config) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("kpc: {e}");
                return Ok(ExitCode::from(2));
            }
        }
    } else {
        let recs = journal::read_local(cache)
            .map_err(|e| kpc::Error::Io(format!("{}: {e}", cache.root().display())))?;
        (format!("{}/misses.log", cache.root().display()), recs)
    };
    let r = journal::report(&records, since_time(args.since));
    if args.json {
        crate::output::print_json(&report_json(&source, args.since, &r));
        return Ok(ExitCode::SUCCESS);
    }
    let period = args.since.map_or("everything recorded".to_string(), |d| {
        format!("the last {}", fmt_age(d))
    });
    outln!("miss journal {source}: {period}");
    outln!(
        "{} records from {} machine(s){}",
        r.records,
        r.hosts.len(),
        if r.hosts.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.hosts.join(", "))
        }
    );
    outln!(
        "compile time spent: {} s on {} builds; saved: {} s by {} hits",
        secs(r.spent_ms),
        r.builds,
        secs(r.saved_ms),
        r.hits
    );
    outln!();
    outln!("{:<16}  {:>7}  {:>9}", "MISS CAUSE", "BUILDS", "SECONDS");
    for c in &r.causes {
        outln!("{:<16}  {:>7}  {:>9}", c.cause, c.builds, secs(c.build_ms));
    }
    outln!();
    if r.rebuilt.is_empty() {
        outln!("no kernel was built more than once");
    } else {
        outln!("kernels built more than once:");
        outln!(
            "{:>6}  {:>8}  {:<24}  {:<20}  {:<24}  KEY",
            "BUILDS",
            "SECONDS",
            "MACHINES",
            "CAUSES",
            "KERNEL"
        );
        for k in &r.rebuilt {
            outln!(
                "{:>6}  {:>8}  {:<24}  {:<20}  {:<24}  {}",
                k.builds,
                secs(k.build_ms),
                k.hosts.join(","),
                k.causes.join(","),
                k.label,
                &k.key[..16.min(k.key.len())]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn fmt_age(d: Duration) -> String {
    match d.as_secs() {
        s @ 0..60 => format!("{s}s"),
        s @ 60..3600 => format!("{}m", s / 60),
        s @ 3600..86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The eviction part of `kpc cache stats --json`: an object, or `{"error": ...}`.
pub fn eviction_json(cache: &PersistentCache, since: Option<Duration>) -> Value {
    match cache.eviction_cost(since_time(since).unwrap_or(SystemTime::UNIX_EPOCH)) {
        Ok(c) => json!({
            "since_secs": since.map(|d| d.as_secs()),
            "evictions": c.evictions,
            "evicted_bytes": c.evicted_bytes,
            "misses": c.misses,
            "miss_bytes": c.miss_bytes,
            "suggested_max_size": c.suggested_max_size,
        }),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// The eviction part of `kpc cache stats`: what eviction cost, and the advice.
pub fn eviction_text(cache: &PersistentCache, since: Option<Duration>, max_size: u64) {
    let period = since.map_or(String::new(), |d| format!(" in the last {}", fmt_age(d)));
    let c = match cache.eviction_cost(since_time(since).unwrap_or(SystemTime::UNIX_EPOCH)) {
        Ok(c) => c,
        Err(e) => {
            outln!("eviction: the eviction record cannot be read ({e})");
            return;
        }
    };
    outln!(
        "eviction{period}: {} entries ({}) evicted; {} misses ({}) on evicted entries",
        c.evictions,
        human(c.evicted_bytes),
        c.misses,
        human(c.miss_bytes)
    );
    if let Some(s) = c.suggested_max_size {
        let now = if max_size == 0 {
            "unlimited".to_string()
        } else {
            human(max_size)
        };
        outln!(
            "  KPC_CACHE_MAX_SIZE={} would have served them (now {now})",
            kpc::admin::disk::size_arg(s)
        );
    }
}
