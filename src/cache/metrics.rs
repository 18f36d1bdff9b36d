//! The leaf of kpc's metrics (see `src/runtime/metrics.rs` for the whole picture): the series counted
//! where they happen, through the [`metrics`] facade. Imports nothing of kpc, so every layer may call
//! it.

use std::time::Duration;

/// Counts one program acquisition that missed memory, served from `source`
/// (`kpc_programs_total{source}`).
pub fn program_acquired(source: &'static str) {
    metrics::counter!("kpc_programs_total", "source" => source).increment(1);
}

/// Counts one fresh build that took `took` (`kpc_builds_total`, `kpc_build_duration_seconds`).
pub fn built(took: Duration) {
    metrics::counter!("kpc_builds_total").increment(1);
    metrics::histogram!("kpc_build_duration_seconds").record(took.as_secs_f64());
}

/// Counts one shared entry refused at `level` (`remote`, `bundle`) for `reason`
/// (`kpc_refusals_total{level, reason}`).
pub fn refused(level: &'static str, reason: &'static str) {
    metrics::counter!("kpc_refusals_total", "level" => level, "reason" => reason).increment(1);
}

/// Counts one store failure turned into a miss or a skipped put, at `level`, by `cause`
/// (`kpc_store_failures_total{level, cause}`).
pub fn store_failure(level: &'static str, cause: &'static str) {
    metrics::counter!("kpc_store_failures_total", "level" => level, "cause" => cause).increment(1);
}
