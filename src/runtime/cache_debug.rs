//! Cache debug mode (`KPC_CACHE_DEBUG=1`): every program is built fresh, and its binary compared
//! with what the stores hold for the key. `ProgramManager` builds and tells each build with what the
//! stores held ([`CacheEvent::Built`], [`BuildCause::Debug`]); the comparison and its counts are here,
//! subscribed to those events.
//!
//! The comparison is byte for byte on what [`Backend::program_binary`](crate::backend::Backend)
//! returns, the bytes the cache would store. A driver whose binaries embed a timestamp, a build id or
//! randomized layout makes every comparison "different": that is reported as a note about the driver
//! ("binaries differ (driver not deterministic?)"), never as an error, since the cached binary is still
//! a valid build of the same key.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::cache::events::{BuildCause, CacheEvent, CacheObserver};
use crate::cache::store::StoreKey;

/// Most differing programs kept for the report; the counters count them all.
pub const MAX_DEBUG_DIFFS: usize = 64;

/// What one debug-mode build found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DebugOutcome {
    /// The fresh binary equals the cached one (`len` bytes).
    Equal {
        /// Binary length.
        len: usize,
    },
    /// The fresh binary differs from the cached one.
    Different {
        /// The cached binary's length.
        cached: usize,
        /// The fresh binary's length.
        fresh: usize,
    },
    /// No store holds the key: nothing to compare with.
    Missing,
    /// The backend gave no binary for the fresh program (it cannot serialize one), so nothing was
    /// compared.
    NoFreshBinary,
}

impl fmt::Display for DebugOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DebugOutcome::Equal { len } => write!(f, "binaries equal ({len} bytes)"),
            DebugOutcome::Different { cached, fresh } => write!(
                f,
                "binaries differ (driver not deterministic?): cached {cached} bytes, fresh {fresh} bytes"
            ),
            DebugOutcome::Missing => f.write_str("not cached: nothing to compare"),
            DebugOutcome::NoFreshBinary => {
                f.write_str("the backend gave no binary for the fresh build: not compared")
            }
        }
    }
}

/// One program whose fresh binary differed from the cached one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugDiff {
    /// The image's name.
    pub image: String,
    /// The cached binary's length.
    pub cached: usize,
    /// The fresh binary's length.
    pub fresh: usize,
}

/// Debug-mode counters of one `ProgramManager` (all zero when debug mode is off).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheDebugStats {
    /// Programs built fresh whose binary equals the cached one.
    pub equal: u64,
    /// Programs built fresh whose binary differs from the cached one.
    pub different: u64,
    /// Programs built fresh that no store held.
    pub missing: u64,
    /// Programs built fresh for which the backend gave no binary.
    pub no_fresh_binary: u64,
    /// The first 64 differing programs, with both sizes.
    pub diffs: Vec<DebugDiff>,
}

impl CacheDebugStats {
    /// Programs built in debug mode.
    pub fn built(&self) -> u64 {
        self.equal + self.different + self.missing + self.no_fresh_binary
    }
}

impl fmt::Display for CacheDebugStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} programs built fresh: {} equal to the cached binary, {} different, {} not cached",
            self.built(),
            self.equal,
            self.different,
            self.missing
        )?;
        if self.no_fresh_binary > 0 {
            write!(f, ", {} without a binary to compare", self.no_fresh_binary)?;
        }
        for d in &self.diffs {
            write!(
                f,
                "\n  {}: binaries differ (driver not deterministic?): cached {} bytes, fresh {} bytes",
                d.image, d.cached, d.fresh
            )?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
pub(crate) struct DebugCounters {
    /// Whether each comparison is traced (`KPC_CACHE_TRACE`'s disk bit).
    trace: bool,
    equal: AtomicU64,
    different: AtomicU64,
    missing: AtomicU64,
    no_fresh_binary: AtomicU64,
    diffs: Mutex<Vec<DebugDiff>>,
}

impl CacheObserver for DebugCounters {
    fn on_event(&self, event: &CacheEvent<'_>) {
        if let CacheEvent::Built {
            key,
            binary,
            cause: BuildCause::Debug { cached },
            ..
        } = *event
        {
            self.compare(key, cached, binary);
        }
    }
}

impl DebugCounters {
    /// Counters that trace each comparison when `trace` is set.
    pub fn new(trace: bool) -> DebugCounters {
        DebugCounters {
            trace,
            ..DebugCounters::default()
        }
    }

    pub fn record(&self, image: &str, outcome: &DebugOutcome) {
        let c = match outcome {
            DebugOutcome::Equal { .. } => &self.equal,
            DebugOutcome::Different { cached, fresh } => {
                let mut d = self.diffs.lock();
                if d.len() < MAX_DEBUG_DIFFS {
                    d.push(DebugDiff {
                        image: image.to_owned(),
                        cached: *cached,
                        fresh: *fresh,
                    });
                }
                &self.different
            }
            DebugOutcome::Missing => &self.missing,
            DebugOutcome::NoFreshBinary => &self.no_fresh_binary,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Debug mode's comparison of a fresh build of `key`'s image (its binary `fresh`, if the backend
    /// gave one) with what the stores held for `key` (`cached`, looked up without changing any
    /// store), recorded and traced when asked. Debug mode writes nothing to any store (no put,
    /// backfill, lock or repair).
    fn compare(&self, key: &StoreKey, cached: Option<&[u8]>, fresh: Option<&[u8]>) {
        let outcome = match (cached, fresh) {
            (None, _) => DebugOutcome::Missing,
            (Some(cached), Some(fresh)) if fresh == cached => {
                DebugOutcome::Equal { len: fresh.len() }
            }
            (Some(cached), Some(fresh)) => DebugOutcome::Different {
                cached: cached.len(),
                fresh: fresh.len(),
            },
            (Some(_), None) => DebugOutcome::NoFreshBinary,
        };
        let image = key.label();
        self.record(image, &outcome);
        if self.trace {
            tracing::debug!(target: "kpc::cache::debug", image, key = %key.digest(),
                cached = cached.is_some(), "{outcome}");
        }
    }

    pub fn snapshot(&self) -> CacheDebugStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheDebugStats {
            equal: l(&self.equal),
            different: l(&self.different),
            missing: l(&self.missing),
            no_fresh_binary: l(&self.no_fresh_binary),
            diffs: self.diffs.lock().clone(),
        }
    }
}
