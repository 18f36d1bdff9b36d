//! The chain's per-level counters ([`LevelStats`](super::LevelStats)), kept by subscribing to its
//! events (`crate::cache::events`): one relaxed atomic per count, so counting costs a request nothing
//! next to the store call it counts.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::cache::events::{CacheEvent, CacheLevel, CacheObserver};
use crate::cache::store::PutOutcome;

/// One level's counts.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub backfills: AtomicU64,
    pub puts: AtomicU64,
    pub rejected: AtomicU64,
    pub recompiled: AtomicU64,
}

/// Every level's counts, in chain order.
#[derive(Debug, Default)]
pub(super) struct LevelCounters {
    levels: Vec<Counts>,
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

impl LevelCounters {
    /// Counts for one more level (the chain appended a store).
    pub(super) fn add_level(&mut self) {
        self.levels.push(Counts::default());
    }

    /// Level `index`'s counts.
    pub(super) fn level(&self, index: usize) -> &Counts {
        &self.levels[index]
    }
}

impl CacheObserver for LevelCounters {
    fn on_event(&self, event: &CacheEvent<'_>) {
        let count = |level: CacheLevel<'_>, pick: fn(&Counts) -> &AtomicU64| {
            if let Some(c) = self.levels.get(level.index) {
                bump(pick(c));
            }
        };
        match *event {
            // A hit found after waiting for a build lock is served by that level too.
            CacheEvent::Hit { level, .. } | CacheEvent::Waited { level, .. } => {
                count(level, |c| &c.hits)
            }
            CacheEvent::Miss { level, .. } => count(level, |c| &c.misses),
            CacheEvent::Rejected { level, .. } => count(level, |c| &c.rejected),
            CacheEvent::Loaded {
                level,
                recompiled: true,
                ..
            } => count(level, |c| &c.recompiled),
            CacheEvent::Published {
                level,
                outcome: PutOutcome::Published(_),
                copy: true,
                ..
            } => count(level, |c| &c.backfills),
            CacheEvent::Published {
                level,
                outcome: PutOutcome::Published(_),
                copy: false,
                ..
            } => count(level, |c| &c.puts),
            _ => {}
        }
    }
}
