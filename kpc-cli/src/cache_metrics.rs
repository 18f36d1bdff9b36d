//! `kpc cache stats --format prometheus`: the CLI's own view of the caches (entries and bytes per
//! device, the limit, the quarantine, the remote) in Prometheus' text exposition format, rendered by
//! `metrics-exporter-prometheus` from gauges set through the `metrics` facade, as an embedder's
//! exporter renders kpc's counters (README.md, "Metrics").

use std::collections::BTreeMap;
use std::process::ExitCode;

use kpc::Config;
use kpc::admin::disk::PersistentCache;

/// What `kpc cache stats` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for people.
    Text,
    /// One JSON document.
    Json,
    /// Prometheus' text exposition format.
    Prometheus,
}

/// Prints the gauges of the disk cache at `cache` (limit `max_size`) and of the remote, if any.
pub fn prometheus(
    config: &Config,
    cache: &PersistentCache,
    max_size: u64,
) -> kpc::Result<ExitCode> {
    let entries = cache
        .entries()
        .map_err(|e| kpc::Error::Io(format!("{}: {e}", cache.root().display())))?;
    let mut per: BTreeMap<(String, String, String), (u64, u64)> = BTreeMap::new();
    for e in &entries {
        let (backend, name) = crate::entry_fmt::device_of(e);
        let d = per.entry((e.dirs[0].clone(), backend, name)).or_default();
        d.0 += 1;
        d.1 += e.bytes;
    }
    let (qn, qb) = cache.quarantined();
    let remote = crate::cache_remote::stats(config);
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        metrics::describe_gauge!(
            "kpc_disk_entries",
            "Entries in the local disk cache, per device fingerprint."
        );
        metrics::describe_gauge!(
            "kpc_disk_bytes",
            "Bytes of the local disk cache's entries, per device fingerprint."
        );
        for ((device, backend, name), (n, b)) in &per {
            let labels = [
                ("device", device.clone()),
                ("backend", backend.clone()),
                ("name", name.clone()),
            ];
            metrics::gauge!("kpc_disk_entries", &labels).set(*n as f64);
            metrics::gauge!("kpc_disk_bytes", &labels).set(*b as f64);
        }
        metrics::describe_gauge!("kpc_disk_limit_bytes", "KPC_CACHE_MAX_SIZE (0: unlimited).");
        metrics::gauge!("kpc_disk_limit_bytes").set(max_size as f64);
        metrics::gauge!("kpc_disk_enabled").set(if config.persistent { 1.0 } else { 0.0 });
        metrics::gauge!("kpc_disk_quarantine_files").set(qn as f64);
        metrics::gauge!("kpc_disk_quarantine_bytes").set(qb as f64);
        if let Some(r) = &remote {
            let up = r.get("error").is_none();
            metrics::describe_gauge!(
                "kpc_remote_up",
                "1 if the remote (KPC_CACHE_REMOTE) could be listed."
            );
            metrics::gauge!("kpc_remote_up").set(if up { 1.0 } else { 0.0 });
            if up {
                let n = |k: &str| r[k].as_u64().unwrap_or(0) as f64;
                metrics::gauge!("kpc_remote_entries").set(n("entries"));
                metrics::gauge!("kpc_remote_bytes").set(n("bytes"));
            }
        }
    });
    out!("{}", handle.render());
    Ok(ExitCode::SUCCESS)
}
