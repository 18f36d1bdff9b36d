//! The store chain's side of the miss journal (`crate::cache::journal`), kept by subscribing to the
//! chain's events (`crate::cache::events`): a `build` record after each build that followed a miss,
//! `hits` records summing loads, written to the local disk cache's journal and shared with every
//! level that keeps a fleet journal ([`Fleet::share_journal`](super::Fleet::share_journal), a
//! remote).

use std::sync::Arc;
use std::time::Duration;

use super::{Store, StoreKind, StoreWarnings};
use crate::cache::events::{BuildCause, CacheEvent, CacheObserver};
use crate::cache::journal::{Journal, JournalRecord};
use crate::cache::store::StoreKey;

/// The journal of one chain, with what it needs to know of the chain's levels.
pub(crate) struct ChainJournal {
    pub(crate) journal: Journal,
    /// The levels' kinds, in order: a `build` record's `layer` (`disk+readonly+remote`).
    layers: Vec<&'static str>,
    /// The levels that share a fleet journal.
    fleet: Vec<Arc<dyn Store>>,
    pub(crate) warnings: StoreWarnings,
}

impl ChainJournal {
    /// A journal for host `host`, with no level yet.
    pub(crate) fn new(host: String) -> ChainJournal {
        ChainJournal {
            journal: Journal::new(host, None),
            layers: Vec::new(),
            fleet: Vec::new(),
            warnings: StoreWarnings::new("store chain"),
        }
    }

    /// One more level, `store`, is in the chain.
    pub(crate) fn add_level(&mut self, store: &Arc<dyn Store>, kind: StoreKind) {
        self.layers.push(match kind {
            StoreKind::Disk => "disk",
            StoreKind::ReadOnly => "readonly",
            StoreKind::Remote => "remote",
            StoreKind::Other => "other",
        });
        if store.fleet().is_some() {
            self.fleet.push(store.clone());
        }
    }

    /// Records that `key` was built in `took` after every level missed (with the pending `hits`
    /// record, if any). Best effort: a failure is warned about once per cause.
    fn built(&self, key: &StoreKey, took: Duration) {
        let mut records = Vec::with_capacity(2);
        records.extend(self.journal.flush());
        records.push(self.journal.built(key, took, self.layers.join("+")));
        self.write(&records);
    }

    /// A program was loaded from a store: its build time counts as saved in the next `hits` record,
    /// unless the driver compiled it anyway.
    fn loaded(&self, build_time: Duration, recompiled: bool) {
        if let Some(r) = self.journal.hit(build_time) {
            self.write(&[r]);
        }
        if recompiled {
            self.journal.recompiled(build_time);
        }
    }

    fn write(&self, records: &[JournalRecord]) {
        self.journal
            .write_local(records, |cause, what| self.warnings.warn(cause, &what));
        let lines: Vec<String> = records.iter().map(JournalRecord::to_line).collect();
        for f in self.fleet.iter().filter_map(|s| s.fleet()) {
            f.share_journal(&lines);
        }
    }
}

impl CacheObserver for ChainJournal {
    fn on_event(&self, event: &CacheEvent<'_>) {
        match *event {
            CacheEvent::Built {
                key,
                took,
                cause: BuildCause::Missed,
                ..
            } => self.built(key, took),
            CacheEvent::Loaded {
                build_time,
                recompiled,
                ..
            } => self.loaded(build_time, recompiled),
            _ => {}
        }
    }
}

impl Drop for ChainJournal {
    fn drop(&mut self) {
        if let Some(r) = self.journal.flush() {
            self.write(&[r]);
        }
    }
}
