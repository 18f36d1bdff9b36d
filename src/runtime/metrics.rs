//! kpc's counters through the [`metrics`] facade, so an embedder whose process runs an exporter
//! (`metrics-exporter-prometheus`, an OpenTelemetry bridge, ...) sees them with no kpc-specific code.
//! kpc installs no recorder: without one every call here is a no-op.
//!
//! The hit path stays free of shared writes: counters that the hot path keeps (memory hits, striped
//! per thread) are published as deltas of the manager's own snapshots, at every miss (which costs a
//! store lookup or a build anyway), on [`Context::stats`](crate::runtime::Context::stats) and on
//! [`ProgramManager::publish_metrics`](crate::runtime::ProgramManager::publish_metrics). Builds,
//! refusals and store failures are counted where they happen (`src/cache/metrics.rs`): builds and
//! programs by subscribing to the cache's events ([`Counting`]). Several contexts add to the same
//! series. README.md ("Metrics") lists every series.

use parking_lot::Mutex;

use super::source::Source;
use crate::cache::CacheStats;
use crate::cache::DiskStats;
use crate::cache::events::{CacheEvent, CacheObserver};
use crate::cache::metrics as count;
use crate::cache::store::{LevelStats, StoreKind};

/// The `level` label of a store kind.
pub fn level_name(kind: StoreKind) -> &'static str {
    match kind {
        StoreKind::Disk => "disk",
        StoreKind::ReadOnly => "readonly",
        StoreKind::Other => "store",
        StoreKind::Remote => "remote",
    }
}

/// The series counted as things happen (`src/cache/metrics.rs`), subscribed to the chain's events:
/// `kpc_programs_total{source}` for each program that missed memory, `kpc_builds_total` and
/// `kpc_build_duration_seconds` for each build.
pub(crate) struct Counting;

impl CacheObserver for Counting {
    fn on_event(&self, event: &CacheEvent<'_>) {
        match *event {
            CacheEvent::ProgramServed { from } => {
                let source = from.map_or(Source::Built, Source::of_store);
                count::program_acquired(source.name());
            }
            CacheEvent::Built { took, .. } => count::built(took),
            _ => {}
        }
    }
}

/// What was last published, to publish differences.
#[derive(Default)]
struct Published {
    memory: CacheStats,
    disk: DiskStats,
    /// Per level index: the level's kind and its counters.
    levels: Vec<LevelStats>,
}

/// Publishes one manager's snapshot counters as deltas.
#[derive(Default)]
pub(crate) struct Publisher {
    last: Mutex<Published>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("metrics::Publisher")
    }
}

fn add(name: &'static str, level: &'static str, now: u64, before: u64) {
    let d = now.saturating_sub(before);
    if d > 0 {
        metrics::counter!(name, "level" => level).increment(d);
    }
}

impl Publisher {
    /// Publishes what changed since the last call.
    pub(crate) fn publish(
        &self,
        memory: CacheStats,
        disk: Option<DiskStats>,
        levels: &[LevelStats],
    ) {
        let mut last = self.last.lock();
        let m = &last.memory;
        add("kpc_cache_hits_total", "memory", memory.hits, m.hits);
        add("kpc_cache_misses_total", "memory", memory.misses, m.misses);
        add(
            "kpc_cache_evictions_total",
            "memory",
            memory.evictions,
            m.evictions,
        );
        add("kpc_cache_waits_total", "memory", memory.waits, m.waits);
        last.memory = memory;
        if let Some(d) = disk {
            let b = &last.disk;
            add(
                "kpc_cache_evictions_total",
                "disk",
                d.evictions,
                b.evictions,
            );
            add(
                "kpc_cache_evicted_bytes_total",
                "disk",
                d.evicted_bytes,
                b.evicted_bytes,
            );
            add(
                "kpc_cache_corruptions_total",
                "disk",
                d.corruptions,
                b.corruptions,
            );
            let causes = [
                ("new-key", d.misses_new_key, b.misses_new_key),
                (
                    "device-changed",
                    d.misses_device_changed,
                    b.misses_device_changed,
                ),
                (
                    "image-changed",
                    d.misses_image_changed,
                    b.misses_image_changed,
                ),
                ("spec-changed", d.misses_spec_changed, b.misses_spec_changed),
                (
                    "options-changed",
                    d.misses_options_changed,
                    b.misses_options_changed,
                ),
                (
                    "entry-unusable",
                    d.misses_entry_unusable,
                    b.misses_entry_unusable,
                ),
                ("cached", d.misses_cached, b.misses_cached),
                ("evicted", d.misses_evicted, b.misses_evicted),
            ];
            for (cause, now, before) in causes {
                let delta = now.saturating_sub(before);
                if delta > 0 {
                    metrics::counter!("kpc_cache_miss_causes_total", "level" => "disk", "cause" => cause)
                        .increment(delta);
                }
            }
            last.disk = d;
        }
        if last.levels.len() != levels.len() {
            // The first call (or a chain of another shape): start from zero for each level.
            last.levels = levels
                .iter()
                .map(|l| LevelStats {
                    name: l.name.clone(),
                    kind: l.kind,
                    hits: 0,
                    misses: 0,
                    backfills: 0,
                    puts: 0,
                    rejected: 0,
                    recompiled: 0,
                    store: Default::default(),
                })
                .collect();
        }
        for (now, before) in levels.iter().zip(last.levels.iter_mut()) {
            let level = level_name(now.kind);
            add("kpc_cache_hits_total", level, now.hits, before.hits);
            add("kpc_cache_misses_total", level, now.misses, before.misses);
            add(
                "kpc_cache_backfills_total",
                level,
                now.backfills,
                before.backfills,
            );
            add("kpc_cache_puts_total", level, now.puts, before.puts);
            add(
                "kpc_cache_rejected_total",
                level,
                now.rejected,
                before.rejected,
            );
            let (s, p) = (&now.store, &before.store);
            add(
                "kpc_cache_read_bytes_total",
                level,
                s.bytes_read,
                p.bytes_read,
            );
            add(
                "kpc_cache_written_bytes_total",
                level,
                s.bytes_written,
                p.bytes_written,
            );
            add("kpc_cache_errors_total", level, s.errors, p.errors);
            add("kpc_cache_skipped_total", level, s.skipped, p.skipped);
            *before = now.clone();
        }
    }
}
