//! Shipped caches silently unused: a read-only layer or the remote that has served none of the first
//! [`IDLE_LOOKUPS`] lookups a store chain made (one context) is warned about, once, with the dominant
//! miss cause. A layer baked into an image for another driver, or a remote written by another kpc
//! version, is otherwise only visible in counters nobody reads. The watch subscribes to the chain's
//! events (`crate::cache::events`): a hit or a wait served by the level ends it, a miss counts.
//!
//! The cause comes from the store's own miss explanation ([`Store::explain_miss`]: the nearest entry
//! and the key fields that differ) over the first keys that missed, kept as a bounded sample until
//! the verdict; a store that cannot explain its misses (the remote) is judged by its counters
//! (unreachable, or simply without entries for this device's keys).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{Store, StoreKey, StoreKind, StoreStats};
use crate::cache::events::{CacheEvent, CacheLevel, CacheObserver};

/// Lookups a read-only layer or the remote may miss, without one hit, before it is warned about.
pub const IDLE_LOOKUPS: u64 = 32;

/// One level's watch: its misses so far, the first missed keys, and whether the verdict is in.
#[derive(Debug, Default)]
struct IdleWatch {
    misses: AtomicU64,
    sample: Mutex<Vec<StoreKey>>,
    done: AtomicBool,
}

/// The watch over every level of a chain that is watched (read-only layers and the remote), kept
/// by subscribing to the chain's lookups.
#[derive(Debug, Default)]
pub(crate) struct IdleWatches {
    levels: Vec<Option<IdleWatch>>,
}

impl IdleWatches {
    /// One more level, of `kind`, is in the chain.
    pub(crate) fn add_level(&mut self, kind: StoreKind) {
        let watched = matches!(kind, StoreKind::ReadOnly | StoreKind::Remote);
        self.levels.push(watched.then(IdleWatch::default));
    }

    fn watch(&self, level: &CacheLevel<'_>) -> Option<&IdleWatch> {
        self.levels.get(level.index)?.as_ref()
    }
}

impl CacheObserver for IdleWatches {
    fn on_event(&self, event: &CacheEvent<'_>) {
        match event {
            CacheEvent::Hit { level, .. } | CacheEvent::Waited { level, .. } => {
                if let Some(w) = self.watch(level) {
                    w.served();
                }
            }
            CacheEvent::Miss { level, key } => {
                if let Some(w) = self.watch(level) {
                    w.missed(level, key);
                }
            }
            _ => {}
        }
    }
}

impl IdleWatch {
    /// The level served a request: it is used, so never warned about.
    fn served(&self) {
        if !self.done.swap(true, Ordering::Relaxed) {
            self.sample.lock().clear();
        }
    }

    /// The level missed `key`. Warns once when it has missed [`IDLE_LOOKUPS`] lookups without a hit.
    fn missed(&self, level: &CacheLevel<'_>, key: &StoreKey) {
        let misses = self.misses.fetch_add(1, Ordering::Relaxed) + 1;
        if self.done.load(Ordering::Relaxed) {
            return;
        }
        {
            let mut s = self.sample.lock();
            if (s.len() as u64) < IDLE_LOOKUPS {
                s.push(key.clone());
            }
        }
        if misses < IDLE_LOOKUPS {
            return;
        }
        if self.done.swap(true, Ordering::Relaxed) {
            return;
        }
        let sample = std::mem::take(&mut *self.sample.lock());
        let why = dominant_cause(level.store, &sample);
        let name = level.name;
        tracing::warn!(target: "kpc::cache::store", store = name, lookups = misses,
            "{name} has served none of the {misses} lookups this context made: {why}; \
             it is not used (`kpc cache check` says which key fields differ)");
    }
}

/// The most common cause among `sample`'s misses, with one example of it.
fn dominant_cause(store: &dyn Store, sample: &[StoreKey]) -> String {
    let mut by: BTreeMap<&'static str, (usize, String)> = BTreeMap::new();
    for k in sample {
        if let Some(e) = store.explain_miss(k) {
            let c = by
                .entry(e.cause.name())
                .or_insert_with(|| (0, e.to_string()));
            c.0 += 1;
        }
    }
    match by.into_iter().max_by_key(|(_, (n, _))| *n) {
        Some((cause, (n, example))) => format!(
            "most misses are {cause} ({n} of the first {}), e.g. {example}",
            sample.len()
        ),
        None => unexplained(store.stats()),
    }
}

/// For a store that does not explain misses: what its counters say.
fn unexplained(s: StoreStats) -> String {
    if s.errors + s.skipped > s.misses / 2 {
        format!(
            "it is failing or unreachable ({} errors, {} calls skipped while it was down)",
            s.errors, s.skipped
        )
    } else {
        "it holds no entry under this device's keys (built for another device, driver or kpc \
         version, or never published)"
            .into()
    }
}
