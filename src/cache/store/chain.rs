//! [`StoreChain`]: the persistent layer as `ProgramManager` sees it, an ordered list of stores.
//!
//! - **Lookup** asks each store in order (local disk first) and stops at the first verified hit.
//! - **Backfill**: once the backend has accepted a hit from a lower store, it is copied to the first
//!   writable store above it, so the next process finds it locally.
//! - **Single flight**: when every store missed, the build lock is taken from every store that offers
//!   one, in order: the local disk's `flock` (one build per machine), then the remote's fleet lock
//!   (one build per fleet). Each store looks again after waiting, so a key another process or machine
//!   just built is loaded, not rebuilt; a lock that cannot be had is skipped, never waited on twice.
//! - **Put**: a fresh build goes to every writable store in order. The build lock is released as soon
//!   as the store it came from holds the entry (that is where waiters look), so they never wait on a
//!   slower store further down.
//!
//! The chain holds no lock of its own while it calls a store, and counts per level (atomics), so a slow
//! store delays only the request that is asking it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use counters::LevelCounters;
use journal::ChainJournal;

use super::crash::{CrashedLoading, LocalLevel};
use super::explain::{MissCause, MissExplanation};
use super::idle::IdleWatches;
use super::{
    BuildLock, LockGuard, Removal, Store, StoreHit, StoreKind, StoreStats, StoreWarnings, WarnCause,
};
use crate::cache::events::{self, BuildCause, CacheEvent, CacheObserver};
use crate::cache::journal::Journal;
use crate::cache::store::StoreKey;
use crate::config::{Config, TraceFlags};

#[path = "chain_counters.rs"]
mod counters;
#[path = "chain_journal.rs"]
mod journal;

/// A verified hit and the level of the chain it came from.
#[derive(Debug)]
pub struct ChainHit {
    level: usize,
    kind: StoreKind,
    hit: StoreHit,
}

impl ChainHit {
    /// The binary.
    pub fn bytes(&self) -> &[u8] {
        self.hit.bytes()
    }
    /// How long the build that produced it took.
    pub fn build_time(&self) -> Duration {
        self.hit.build_time()
    }
    /// The index of the store that served it (0 = first).
    pub fn level(&self) -> usize {
        self.level
    }
    /// The kind of that store.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }
}

/// The build locks of one key, each taken from one level of the chain (the local disk's, the
/// remote's fleet lock); each released on drop, or by [`StoreChain::put`] once its level holds the
/// entry.
#[derive(Debug)]
pub struct ChainLock {
    held: Vec<(usize, LockGuard)>,
}

impl ChainLock {
    /// The index of the first store a lock came from.
    pub fn level(&self) -> usize {
        self.held.first().map_or(0, |(l, _)| *l)
    }

    /// The indices of every store a lock came from, in order.
    pub fn levels(&self) -> Vec<usize> {
        self.held.iter().map(|(l, _)| *l).collect()
    }
}

/// What `StoreChain::lock_for_build` came to.
#[derive(Debug)]
pub enum Turn {
    /// Another builder published the key while this caller waited: use it.
    Published(ChainHit),
    /// Build it, holding this lock if one could be had.
    Build(Option<ChainLock>),
}

/// What the chain did with one level, in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LevelStats {
    /// The store's name.
    pub name: String,
    /// The store's kind.
    pub kind: StoreKind,
    /// Requests this level served (including hits found after waiting for a build lock).
    pub hits: u64,
    /// Requests that asked this level and found nothing.
    pub misses: u64,
    /// Entries copied into this level from a lower one.
    pub backfills: u64,
    /// Fresh builds stored in this level.
    pub puts: u64,
    /// Binaries from this level that the backend refused.
    pub rejected: u64,
    /// Binaries from this level that the backend loaded but whose driver compiled anyway (its
    /// creation feedback said so): served, but no build time saved.
    pub recompiled: u64,
    /// The store's own counters.
    pub store: StoreStats,
}

struct Level {
    store: Arc<dyn Store>,
    kind: StoreKind,
    name: String,
}

/// Stores looked up in order after the in-memory cache. Cheap to share behind the `ProgramManager`
/// that owns it; every method takes `&self`.
///
/// Guarantees: a hit is verified (see [`StoreHit`]); no method fails the caller or panics on a store's
/// failure; a read-only store is never written, locked or repaired through the chain.
pub struct StoreChain {
    levels: Vec<Level>,
    /// The local level's crash guard (the first disk cache appended).
    local: Option<Arc<dyn LocalLevel>>,
    trace: bool,
    warnings: StoreWarnings,
    /// Why the configured local disk cache is not in the chain, when its root cannot be used.
    local_unusable: Option<String>,
    // The chain's own subscribers to its events, held by value: each keeps state per level, grown as
    // levels are appended, and `stats` reads the counters.
    /// Per-level counts ([`LevelStats`]).
    counters: LevelCounters,
    /// Read-only layers and the remote: warned about once if they serve nothing (`idle.rs`).
    idle: IdleWatches,
    /// The miss journal (`crate::cache::journal`), local with the first disk cache appended.
    journal: ChainJournal,
    /// Everyone else subscribed: the runtime's (metrics, debug mode, warm start) and an embedder's.
    observers: Arc<Vec<Arc<dyn CacheObserver>>>,
}

impl fmt::Debug for StoreChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.levels.iter().map(|l| &l.name))
            .finish()
    }
}

impl Default for StoreChain {
    fn default() -> Self {
        StoreChain::new()
    }
}

impl StoreChain {
    /// No stores: nothing is persisted.
    pub fn new() -> StoreChain {
        StoreChain {
            levels: Vec::new(),
            local: None,
            trace: false,
            warnings: StoreWarnings::new("store chain"),
            local_unusable: None,
            counters: LevelCounters::default(),
            idle: IdleWatches::default(),
            journal: ChainJournal::new(crate::config::signing::hostname()),
            observers: Arc::default(),
        }
    }

    /// Why the configured local disk cache is not in this chain: its root could not be used
    /// (`None` when it is there, or when none was configured).
    pub fn local_unusable(&self) -> Option<&str> {
        self.local_unusable.as_deref()
    }

    /// Takes `config`'s tracing, warning sink and host name (what `with_local_disk` starts from).
    pub(crate) fn configure(&mut self, config: &Config) {
        self.trace = config.trace.contains(TraceFlags::DISK);
        self.warnings.set_sink(config.warning_sink());
        self.journal.warnings.set_sink(config.warning_sink());
        self.journal.journal.host = config.host_id();
    }

    /// Records why the configured local disk cache is not in the chain.
    pub(crate) fn set_local_unusable(&mut self, why: String) {
        self.local_unusable = Some(why);
    }

    /// Whether a local level (crash guard, journal) is set.
    pub(crate) fn has_local(&self) -> bool {
        self.local.is_some()
    }

    /// Sets the local level, whose crash guard serves every load.
    pub(crate) fn set_local(&mut self, local: Arc<dyn LocalLevel>) {
        self.local = Some(local);
    }

    /// The miss journal, for the local level to attach its log to.
    pub(crate) fn journal_mut(&mut self) -> &mut Journal {
        &mut self.journal.journal
    }

    /// The local level, if one was set.
    pub(crate) fn local_level(&self) -> Option<&dyn LocalLevel> {
        self.local.as_deref()
    }

    /// Appends the remote `config` names (`KPC_CACHE_REMOTE`), if any. Without the `remote` feature a
    /// configured remote is warned about once and left out.
    pub(crate) fn with_remote(self, config: &Config) -> StoreChain {
        #[cfg(all(feature = "remote", not(loom)))]
        if let Some(r) = super::RemoteStore::from_config(config) {
            return self.with_store(Arc::new(r));
        }
        #[cfg(not(all(feature = "remote", not(loom))))]
        if config.remote.is_some() {
            self.warnings.warn(
                WarnCause::Unavailable,
                &"KPC_CACHE_REMOTE is set but this kpc was built without the `remote` feature",
            );
        }
        self
    }

    /// Appends `store` as the next level (looked up after every level before it).
    pub fn with_store(mut self, store: Arc<dyn Store>) -> StoreChain {
        let kind = store.kind();
        self.counters.add_level();
        self.idle.add_level(kind);
        self.journal.add_level(&store, kind);
        self.levels.push(Level {
            kind,
            name: store.name(),
            store,
        });
        self
    }

    /// Subscribes `observer` to this chain's events ([`CacheEvent`]): every level's hits and misses,
    /// waits, loads, refusals, builds and puts, and the requests the context served from them.
    pub fn with_observer(mut self, observer: Arc<dyn CacheObserver>) -> StoreChain {
        Arc::make_mut(&mut self.observers).push(observer);
        self
    }

    /// Everyone subscribed with [`StoreChain::with_observer`]: for what the chain does not see
    /// itself (the memory cache's evictions).
    pub(crate) fn observers(&self) -> Arc<Vec<Arc<dyn CacheObserver>>> {
        self.observers.clone()
    }

    /// Tells every subscriber that `event` happened.
    pub(crate) fn emit(&self, event: &CacheEvent<'_>) {
        self.counters.on_event(event);
        self.idle.on_event(event);
        self.journal.on_event(event);
        for o in self.observers.iter() {
            events::deliver(&**o, event);
        }
    }

    /// Tells that `key` was built in `took` (serialized to `binary`, if asked and given) for
    /// `cause` ([`CacheEvent::Built`]).
    pub(crate) fn built(
        &self,
        key: &StoreKey,
        took: Duration,
        binary: Option<&[u8]>,
        cause: BuildCause<'_>,
    ) {
        self.emit(&CacheEvent::Built {
            key,
            took,
            binary,
            cause,
        });
    }

    /// Level `index` as events name it.
    fn level(&self, index: usize) -> events::CacheLevel<'_> {
        let l = &self.levels[index];
        events::CacheLevel {
            index,
            kind: l.kind,
            name: &l.name,
            store: &*l.store,
        }
    }

    /// Whether the chain has no store.
    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    /// How many stores it has.
    pub fn len(&self) -> usize {
        self.levels.len()
    }

    /// The stores, in lookup order.
    pub fn stores(&self) -> impl Iterator<Item = &Arc<dyn Store>> {
        self.levels.iter().map(|l| &l.store)
    }

    fn trace(&self, f: impl FnOnce()) {
        if self.trace {
            f();
        }
    }

    /// The first verified hit for `key`, asking the levels in order except those in `skip` (levels
    /// whose binary the backend refused earlier in this request).
    pub fn get(&self, key: &StoreKey, skip: &[usize]) -> Option<ChainHit> {
        // A writable store may record the access and repair what it finds broken; a read-only one
        // is asked for a pure read (ReadOnlyStore enforces it whatever is asked).
        self.first_hit(key, skip, false)
    }

    /// The first verified hit for `key`, asking every level for a pure read ([`super::Access::ReadOnly`]),
    /// writable ones included: no access time recorded, nothing repaired, no lock file. What cache
    /// debug mode looks up with, since it must leave every store as it was. Counted as [`Self::get`].
    pub(crate) fn peek(&self, key: &StoreKey) -> Option<ChainHit> {
        self.first_hit(key, &[], true)
    }

    fn first_hit(&self, key: &StoreKey, skip: &[usize], read_only: bool) -> Option<ChainHit> {
        for (i, l) in self.levels.iter().enumerate() {
            if skip.contains(&i) {
                continue;
            }
            let access = if l.kind.writable() && !read_only {
                super::Access::ReadWrite
            } else {
                super::Access::ReadOnly
            };
            match l.store.get(key, access) {
                Some(hit) => {
                    let bytes = hit.bytes().len();
                    self.emit(&CacheEvent::Hit {
                        level: self.level(i),
                        key,
                        bytes,
                    });
                    self.trace(|| {
                        tracing::debug!(target: "kpc::cache::store", store = %l.name, key = %key.digest(),
                            bytes = hit.bytes().len(), read_only, "hit")
                    });
                    return Some(ChainHit {
                        level: i,
                        kind: l.kind,
                        hit,
                    });
                }
                None => self.emit(&CacheEvent::Miss {
                    level: self.level(i),
                    key,
                }),
            }
        }
        None
    }

    /// After every level missed: the build lock of every level that offers one, in order (skipping
    /// `skip`): the local disk's, then the remote's fleet lock. Each level waits (bounded) for another
    /// builder and looks again; what it found then is [`Turn::Published`] (locks taken so far are
    /// released). A level whose lock cannot be had is passed over.
    pub(crate) fn lock_for_build(&self, key: &StoreKey, skip: &[usize]) -> Turn {
        let mut held = Vec::new();
        for (i, l) in self.levels.iter().enumerate() {
            if skip.contains(&i) {
                continue;
            }
            match l.store.lock_for_build(key) {
                BuildLock::NotOffered | BuildLock::Unavailable => continue,
                BuildLock::Held(g) => held.push((i, g)),
                BuildLock::Published(hit) => {
                    let bytes = hit.bytes().len();
                    self.emit(&CacheEvent::Waited {
                        level: self.level(i),
                        key,
                        bytes,
                    });
                    return Turn::Published(ChainHit {
                        level: i,
                        kind: l.kind,
                        hit,
                    });
                }
            }
        }
        Turn::Build((!held.is_empty()).then_some(ChainLock { held }))
    }

    /// The backend accepted `hit` (`recompiled`: the driver reported that it compiled anyway): told
    /// as [`CacheEvent::Loaded`], then copied to the first writable level above the one it came from
    /// (none when it came from the first writable level). A recompiled hit is counted apart by its
    /// store, so that time saved counts only compiles that were avoided.
    pub(crate) fn backfill(&self, key: &StoreKey, hit: &ChainHit, recompiled: bool) {
        let from = &self.levels[hit.level];
        self.emit(&CacheEvent::Loaded {
            level: self.level(hit.level),
            key,
            build_time: hit.build_time(),
            recompiled,
        });
        let above = self.levels[..hit.level]
            .iter()
            .enumerate()
            .find(|(_, l)| l.kind.writable());
        if let Some((i, l)) = above {
            let outcome =
                l.store
                    .put_copy(key, hit.bytes(), hit.build_time(), hit.hit.provenance());
            self.emit(&CacheEvent::Published {
                level: self.level(i),
                key,
                outcome,
                copy: true,
            });
            self.trace(|| {
                tracing::debug!(target: "kpc::cache::store", from = %from.name,
                    to = %l.name, level = i, ?outcome, key = %key.digest(), "backfill")
            });
        }
        if recompiled {
            from.store.note_recompiled(hit.build_time());
        }
    }

    /// The backend refused `hit` (`reason` says why): the level it came from removes it if it can.
    /// Returns whether that level may be asked again in this request: a writable one removed the bytes
    /// (or a replacement took their place), a read-only one would return them again.
    pub(crate) fn reject(&self, key: &StoreKey, hit: &ChainHit, reason: &dyn fmt::Display) -> bool {
        let l = &self.levels[hit.level];
        self.emit(&CacheEvent::Rejected {
            level: self.level(hit.level),
            key,
            reason: &reason.to_string(),
        });
        l.store.remove(
            key,
            Removal::Refused {
                bytes: hit.bytes(),
                reason,
            },
        );
        l.kind.writable()
    }

    /// Right before `bytes` (a hit for `key` from any level) go to the driver: refused when they
    /// crashed a process that loaded them before, else the load is recorded in the local disk cache
    /// until the record drops (see `src/cache/disk/loading.rs`). Without a local disk, nothing is
    /// recorded.
    ///
    /// A binary from a shared level that another machine marked as crashing is refused too; one this
    /// machine found crashing is marked on every shared level that does not know yet.
    pub(crate) fn begin_load(
        &self,
        key: &StoreKey,
        hit: &ChainHit,
    ) -> Result<Option<Box<dyn Send>>, CrashedLoading> {
        let bytes = hit.bytes();
        let fleet = self.levels[hit.level].store.fleet();
        if let Some(m) = fleet.and_then(|f| f.crashed_marker(key, bytes)) {
            return Err(CrashedLoading { marker: m.into() });
        }
        let Some(d) = &self.local else {
            return Ok(None);
        };
        let r = d.begin_load(key, bytes);
        if r.is_err() {
            for f in self.levels.iter().filter_map(|l| l.store.fleet()) {
                if f.crashed_marker(key, bytes).is_none() {
                    f.note_crashed(key, bytes);
                }
            }
        }
        r
    }

    /// Whether `bytes` for `key` crashed a process that loaded them before (then a fresh build
    /// that produced the same bytes is not stored, so no process loads them again).
    pub(crate) fn crashed_before(&self, key: &StoreKey, bytes: &[u8]) -> bool {
        self.local
            .as_ref()
            .is_some_and(|d| d.crashed_before(key, bytes))
    }

    /// Stores a fresh build in every writable level, in order, releasing each of `lock`'s locks as
    /// soon as the level it came from holds the entry (that is where its waiters look).
    pub fn put(&self, key: &StoreKey, bytes: &[u8], build_time: Duration, lock: Option<ChainLock>) {
        let mut lock = lock;
        for (i, l) in self.levels.iter().enumerate() {
            if l.kind.writable() {
                let outcome = l.store.put(key, bytes, build_time);
                self.emit(&CacheEvent::Published {
                    level: self.level(i),
                    key,
                    outcome,
                    copy: false,
                });
                self.trace(|| {
                    tracing::debug!(target: "kpc::cache::store", store = %l.name, ?outcome,
                        key = %key.digest(), "put")
                });
            }
            if let Some(l) = lock.as_mut() {
                l.held.retain(|(level, _)| *level != i);
            }
        }
    }

    /// Records that the backend could not serialize a built program, so nothing was stored: warned
    /// once by the local disk cache if there is one, else by the chain.
    pub(crate) fn note_serialize_failure(&self, reason: &dyn fmt::Display) {
        match &self.local {
            Some(d) => d.note_serialize_failure(reason),
            None => self.warnings.warn(
                WarnCause::Serialize,
                &format_args!("could not serialize a built program ({reason})"),
            ),
        }
    }

    /// Why `key` missed, as the levels that can tell explain it (see [`Store::explain_miss`]): the
    /// first explanation that names a near entry, else the first one, with the name and kind of the
    /// level that gave it; `None` when no level explains misses. Changes nothing.
    pub fn explain_miss(&self, key: &StoreKey) -> Option<(String, StoreKind, MissExplanation)> {
        let mut first = None;
        for l in &self.levels {
            let Some(e) = l.store.explain_miss(key) else {
                continue;
            };
            if e.cause != MissCause::NewKey {
                return Some((l.name.clone(), l.kind, e));
            }
            first.get_or_insert((l.name.clone(), l.kind, e));
        }
        first
    }

    /// Per-level counters, in lookup order.
    pub fn stats(&self) -> Vec<LevelStats> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.levels
            .iter()
            .enumerate()
            .map(|(i, lv)| {
                let c = self.counters.level(i);
                LevelStats {
                    name: lv.name.clone(),
                    kind: lv.kind,
                    hits: l(&c.hits),
                    misses: l(&c.misses),
                    backfills: l(&c.backfills),
                    puts: l(&c.puts),
                    rejected: l(&c.rejected),
                    recompiled: l(&c.recompiled),
                    store: lv.store.stats(),
                }
            })
            .collect()
    }
}
