//! Shipped caches silently unused: a read-only layer or the remote that has served none of the first
//! [`IDLE_LOOKUPS`] lookups a store chain made (one context) is warned about, once, with the dominant
//! miss cause. A layer baked into an image for another driver, or a remote written by another kpc
//! version, is otherwise only visible in counters nobody reads.
//!
//! The cause comes from the store's own miss explanation ([`Store::explain_miss`]: the nearest entry
//! and the key fields that differ) over the first keys that missed, kept as a bounded sample until
//! the verdict; a store that cannot explain its misses (the remote) is judged by its counters
//! (unreachable, or simply without entries for this device's keys).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::{Store, StoreKey, StoreKind, StoreStats};

/// Lookups a read-only layer or the remote may miss, without one hit, before it is warned about.
pub const IDLE_LOOKUPS: u64 = 32;

/// One level's watch: the first missed keys, and whether the verdict is in.
#[derive(Debug, Default)]
pub(crate) struct IdleWatch {
    sample: Mutex<Vec<StoreKey>>,
    done: AtomicBool,
}

/// Whether levels of `kind` are watched.
pub(crate) fn watched(kind: StoreKind) -> bool {
    matches!(kind, StoreKind::ReadOnly | StoreKind::Remote)
}

impl IdleWatch {
    /// After a lookup of this level: `hit` or not, with the level's totals so far (this lookup
    /// included). Warns once when the level has missed [`IDLE_LOOKUPS`] lookups without a hit.
    pub(crate) fn after_lookup(
        &self,
        name: &str,
        store: &dyn Store,
        key: &StoreKey,
        hit: bool,
        (hits, misses): (u64, u64),
    ) {
        if self.done.load(Ordering::Relaxed) {
            return;
        }
        if hit || hits > 0 {
            self.done.store(true, Ordering::Relaxed);
            self.sample.lock().clear();
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
        let why = dominant_cause(store, &sample);
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
