//! `KernelProgramCache`: one per context, a program map and a kernel map of `BuildResult` entries.
//!
//! Differences from the SYCL runtime's class, each fixing one of its known weaknesses:
//! - the maps are sharded (`DashMap`), so a hit takes one shard read lock and no global mutex;
//! - LRU recency is an atomic tick per entry, refreshed on the lock-free hit path too;
//! - keys hash every field through `Hash`, not an XOR of partial hashes;
//! - counters, with a striped hit counter so they cost nothing measurable on the hit path;
//! - a per-thread front ([`super::front`]) in front of the kernel map, so a repeated kernel hit writes
//!   no cache line that another thread uses (no shard reader count, no shared `Arc` count).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use dashmap::DashMap;
use parking_lot::Mutex;

use super::build_result::{BuildFailure, BuildResult, Served, get_or_build};
use super::counters::{CacheStats, MemCounters};
use super::front::{self, Front, Local};
use super::keys::{KernelKey, KernelKeyParts, ProgramKey};
use crate::config::{Config, TraceFlags};

/// What a cached program weighs against `KPC_IN_MEM_CACHE_EVICTION_THRESHOLD`: the bytes of the code
/// kpc holds for it (see each backend's implementation).
pub trait CacheCost {
    /// Bytes of code this object holds (at least 1).
    fn cache_bytes(&self) -> u64;
}

/// The in-memory cache's settings, taken from a [`Config`].
/// Non-exhaustive: start from `Default` or a `Config`, then the setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemCacheSettings {
    /// `KPC_CACHE_IN_MEM`: false bypasses both maps, so every request builds.
    pub enabled: bool,
    /// `KPC_IN_MEM_CACHE_EVICTION_THRESHOLD`: bytes of programs ([`CacheCost`]) kept before LRU
    /// eviction; 0 = off.
    pub eviction_threshold: u64,
    /// `KPC_CACHE_TRACE` bit 2: trace inserts, hits and evictions.
    pub trace: bool,
}

impl MemCacheSettings {
    /// Sets [`MemCacheSettings::enabled`].
    pub fn enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Sets [`MemCacheSettings::eviction_threshold`].
    pub fn eviction_threshold(mut self, eviction_threshold: u64) -> Self {
        self.eviction_threshold = eviction_threshold;
        self
    }
    /// Sets [`MemCacheSettings::trace`].
    pub fn trace(mut self, trace: bool) -> Self {
        self.trace = trace;
        self
    }
}

impl Default for MemCacheSettings {
    fn default() -> Self {
        MemCacheSettings {
            enabled: true,
            eviction_threshold: 0,
            trace: false,
        }
    }
}

impl From<&Config> for MemCacheSettings {
    fn from(c: &Config) -> Self {
        MemCacheSettings {
            enabled: c.in_mem,
            eviction_threshold: c.in_mem_eviction_threshold,
            trace: c.trace.contains(TraceFlags::MEMORY),
        }
    }
}

// foldhash instead of SipHash: a hit hashes a ~100-byte composite key, and SipHash alone cost more than
// the rest of the hit path. Keys come from the embedding application, not from an attacker, so
// flooding resistance buys nothing here; the per-process seed still varies the layout.
type Hasher = foldhash::fast::RandomState;

struct Maps<P, K, E> {
    programs: DashMap<ProgramKey, Arc<BuildResult<P, E>>, Hasher>,
    kernels: DashMap<KernelKey, Arc<BuildResult<K, E>>, Hasher>,
}

/// What a thread's front keeps for one kernel: its own handle, and (with LRU eviction on) the program's
/// entry, whose recency a hit refreshes.
struct FrontEntry<P, K, E> {
    handle: Arc<Local<K>>,
    program: Option<Arc<BuildResult<P, E>>>,
    /// A hit since the last fold: recorded here, on this thread's own line, instead of writing the
    /// shared LRU tick on every hit; [`KernelProgramCache::fold_front_uses`] turns it into a tick
    /// before any program is stamped or evicted.
    used: bool,
}

/// The per-context cache of built programs `P` and kernels `K`, with build errors `E`.
///
/// Guarantees: each key is built at most once at a time and, once built, every caller gets the same
/// `Arc`; deterministic failures are returned again without rebuilding; with a threshold set, the bytes
/// of cached programs are brought back under it after every insert, least recently used first, and a
/// program's kernels leave with it.
pub struct KernelProgramCache<P, K, E> {
    maps: Maps<P, K, E>,
    settings: MemCacheSettings,
    clock: AtomicU64,
    program_bytes: AtomicU64,
    evict_lock: Mutex<()>,
    counters: MemCounters,
    front: Front<KernelKey, FrontEntry<P, K, E>>,
    front_hasher: Hasher,
    /// Told the cost of each program evicted, once the eviction lock is released.
    on_evict: std::sync::OnceLock<EvictionListener>,
}

/// What [`KernelProgramCache::on_evict`] calls.
type EvictionListener = Box<dyn Fn(u64) + Send + Sync>;

impl<P, K, E> std::fmt::Debug for KernelProgramCache<P, K, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelProgramCache")
            .field("settings", &self.settings)
            .field("programs", &self.maps.programs.len())
            .field("kernels", &self.maps.kernels.len())
            .finish()
    }
}

enum Kind {
    Program,
    Kernel,
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Program => "program",
            Kind::Kernel => "kernel",
        }
    }
}

impl<P, K, E> KernelProgramCache<P, K, E>
where
    P: CacheCost,
    E: BuildFailure,
{
    /// An empty cache.
    pub fn new(settings: MemCacheSettings) -> Self {
        KernelProgramCache {
            maps: Maps {
                programs: DashMap::with_hasher(Hasher::default()),
                kernels: DashMap::with_hasher(Hasher::default()),
            },
            settings,
            clock: AtomicU64::new(0),
            program_bytes: AtomicU64::new(0),
            evict_lock: Mutex::new(()),
            counters: MemCounters::default(),
            front: Front::new(front::STRIPES),
            front_hasher: Hasher::default(),
            on_evict: std::sync::OnceLock::new(),
        }
    }

    /// Calls `listener` with the cost of each program the LRU evicts from now on (after the
    /// eviction, outside the cache's locks); the first listener set stays.
    pub(crate) fn on_evict(&self, listener: impl Fn(u64) + Send + Sync + 'static) {
        let _ = self.on_evict.set(Box::new(listener));
    }

    /// The settings this cache runs with.
    pub fn settings(&self) -> MemCacheSettings {
        self.settings
    }

    /// Returns the program for `key`, running `build` only if no finished entry exists and no other thread
    /// is building it. Concurrent callers for the same key share one build and one `Arc`.
    pub fn get_or_build_program(
        &self,
        key: &ProgramKey,
        build: impl FnOnce() -> Result<P, E>,
    ) -> Result<Arc<P>, E> {
        if !self.settings.enabled {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return self.timed_build(build).map(Arc::new);
        }
        let lru = self.settings.eviction_threshold > 0;
        let r = get_or_build(
            || &self.maps,
            |m| &m.programs,
            key,
            || self.timed_build(build),
            |e| {
                if lru {
                    self.touch(e);
                }
            },
            |e, v| {
                if lru {
                    self.fold_front_uses();
                }
                let bytes = v.cache_bytes();
                e.set_cost(bytes);
                // Counted before Done is published, so an evictor that sees Done also sees these bytes.
                self.program_bytes.fetch_add(bytes, Ordering::AcqRel);
                e.set_last_use(self.clock.fetch_add(1, Ordering::Relaxed) + 1);
            },
        );
        self.account(r.served, Kind::Program, key);
        if lru && r.served == Served::Built && r.result.is_ok() {
            self.evict_to_threshold();
        }
        r.result
    }

    /// Returns the kernel for `key`, with the same single-flight guarantees as programs. A kernel hit
    /// refreshes its program's recency, so a program whose kernels are in use is not evicted.
    pub fn get_or_build_kernel(
        &self,
        key: &KernelKey,
        build: impl FnOnce() -> Result<K, E>,
    ) -> Result<Arc<K>, E> {
        if !self.settings.enabled {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return self.timed_build(build).map(Arc::new);
        }
        let r = get_or_build(
            || &self.maps,
            |m| &m.kernels,
            key,
            || self.timed_build(build),
            |_| {},
            |_, _| {},
        );
        self.account(r.served, Kind::Kernel, key);
        if self.settings.eviction_threshold > 0 && r.served == Served::Hit {
            if let Some(p) = self.maps.programs.get(&key.program) {
                self.touch(p.value());
            }
        }
        r.result
    }

    /// The lock-free hit path for a borrowed key: the finished kernel (or cached failure) for `key`, or
    /// `None` when the caller must take the building path ([`Self::get_or_build_kernel`]). Allocates
    /// nothing. With LRU eviction on, it declines (returns `None`) so the owned path can refresh the
    /// program's recency.
    #[inline]
    pub(crate) fn kernel_hit(&self, key: &dyn KernelKeyParts) -> Option<Result<Arc<K>, E>> {
        if !self.settings.enabled || self.settings.eviction_threshold > 0 {
            return None;
        }
        let r = self.maps.kernels.get(key)?.value().try_final()?;
        self.counters.hits.incr();
        if self.settings.trace {
            tracing::debug!(target: "kpc::cache::memory", kind = "kernel", entry = key.entry(), "hit");
        }
        Some(r)
    }

    /// The hit path that scales with threads: the finished kernel for `key` behind a handle of this
    /// thread's own, or `None` when the caller must take the building path
    /// ([`Self::get_or_build_kernel`]): nothing finished is cached (or only a failure), or the cache is
    /// off.
    ///
    /// The first hit of a thread on a kernel reads the shared map and keeps a `Local` handle in this
    /// thread's stripe of the front; later hits lock only that stripe and clone only that handle, so
    /// they write no cache line another thread uses. With LRU eviction on, a hit marks its entry used,
    /// and that use refreshes the program's recency before the next program is stamped or any is
    /// evicted, so a program whose kernels are in use is not evicted. Once an eviction of the kernel's
    /// program has returned, no call returns the evicted kernel. Every hit is counted.
    #[inline]
    pub fn kernel_local(&self, key: &dyn KernelKeyParts) -> Option<Arc<Local<K>>> {
        if !self.settings.enabled {
            return None;
        }
        use std::hash::BuildHasher;
        let hash = self.front_hasher.hash_one(key);
        let lru = self.settings.eviction_threshold > 0;
        let handle = self.front.get(
            front::thread_index(),
            hash,
            key,
            || self.front_fill(key, lru),
            |e| {
                if lru {
                    e.used = true;
                }
                e.handle.clone()
            },
        )?;
        if self.settings.trace {
            tracing::debug!(target: "kpc::cache::memory", kind = "kernel", entry = key.entry(), "hit");
        }
        Some(handle)
    }

    /// A front miss: the finished kernel from the shared map, counted as a hit there. Runs with the
    /// thread's stripe locked (see [`Front::get`]); takes shard read locks one at a time.
    fn front_fill(
        &self,
        key: &dyn KernelKeyParts,
        lru: bool,
    ) -> Option<(KernelKey, FrontEntry<P, K, E>)> {
        let (owned, value) = {
            let e = self.maps.kernels.get(key)?;
            // A cached failure is answered by the building path, which returns it again.
            let value = e.value().try_final()?.ok()?;
            (e.key().clone(), value)
        };
        let program = if lru {
            let p = self.maps.programs.get(&owned.program)?.value().clone();
            Some(p)
        } else {
            None
        };
        self.counters.hits.incr();
        Some((
            owned,
            FrontEntry {
                handle: Arc::new(Local::new(value)),
                program,
                used: false,
            },
        ))
    }

    /// Refreshes the recency of every program a kernel front hit used since the last fold. Runs before
    /// a new program takes its tick and before eviction ranks programs, so a program used only through
    /// its kernels' front hits is as recent as those hits: newer than every program stamped before
    /// them. (Among programs used between two folds, the order of their hits is not kept.)
    fn fold_front_uses(&self) {
        self.front.for_each_mut(|e| {
            if std::mem::take(&mut e.used) {
                if let Some(p) = &e.program {
                    self.touch(p);
                }
            }
        });
    }

    /// A snapshot of the counters and current sizes.
    pub fn stats(&self) -> CacheStats {
        let mut s = CacheStats {
            programs: self.maps.programs.len() as u64,
            kernels: self.maps.kernels.len() as u64,
            program_bytes: self.program_bytes.load(Ordering::Relaxed),
            ..self.counters.snapshot()
        };
        s.hits += self.front.hits();
        s
    }

    /// Whether a program entry for `key` is present (in any state).
    pub fn contains_program(&self, key: &ProgramKey) -> bool {
        self.maps.programs.contains_key(key)
    }

    /// How many callers are blocked now on the build in progress of `key`'s program (0 when nothing
    /// builds it): what a herd of requests for one new kernel looks like while it builds.
    pub fn program_waiters(&self, key: &ProgramKey) -> u32 {
        self.maps.programs.get(key).map_or(0, |e| e.waiters())
    }

    /// Whether the program for `key` is built and cached (not building, not failed): a kernel of it
    /// is one kernel creation away.
    pub fn has_built_program(&self, key: &ProgramKey) -> bool {
        self.maps
            .programs
            .get(key)
            .and_then(|e| e.value().try_final())
            .is_some_and(|r| r.is_ok())
    }

    /// Whether a kernel entry for `key` is present (in any state).
    pub fn contains_kernel(&self, key: &KernelKey) -> bool {
        self.maps.kernels.contains_key(key)
    }

    fn timed_build<T>(&self, build: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        // Counts a panicking build as failed too: the guard's drop runs while the panic unwinds.
        struct Count<'a> {
            c: &'a MemCounters,
            start: Instant,
            ok: bool,
        }
        impl Drop for Count<'_> {
            fn drop(&mut self) {
                self.c.builds.fetch_add(1, Ordering::Relaxed);
                let ns = self.start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                self.c.build_nanos.fetch_add(ns, Ordering::Relaxed);
                if !self.ok {
                    self.c.failed_builds.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let mut g = Count {
            c: &self.counters,
            start: Instant::now(),
            ok: false,
        };
        let r = build();
        g.ok = r.is_ok();
        r
    }

    #[inline]
    fn touch<T>(&self, e: &BuildResult<T, E>) {
        // Read-only when the entry is already the most recent, so threads hitting one hot entry share its
        // cache line instead of bouncing it; only a change of recency order costs an RMW.
        if e.last_use() != self.clock.load(Ordering::Relaxed) {
            e.set_last_use(self.clock.fetch_add(1, Ordering::Relaxed) + 1);
        }
    }

    #[inline]
    fn account(&self, served: Served, kind: Kind, key: &dyn std::fmt::Debug) {
        match served {
            Served::Hit => self.counters.hits.incr(),
            Served::Built => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
            }
            Served::Waited => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                self.counters.waits.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.settings.trace {
            let what = match served {
                Served::Hit => "hit",
                Served::Built => "insert",
                Served::Waited => "waited",
            };
            tracing::debug!(target: "kpc::cache::memory", kind = kind.name(), key = ?key, "{what}");
        }
    }

    /// Releases every cached program that nothing outside the cache holds, with the kernels nothing
    /// outside holds: what the SYCL runtime does when a build runs out of resources, before it retries.
    /// A kernel the application still holds keeps itself and its program cached. Entries being built
    /// are left alone. Returns how many programs were released (counted in
    /// [`CacheStats::out_of_resources_released`]).
    pub(crate) fn release_unused(&self) -> usize {
        // The per-thread fronts hold kernel handles of their own; they refill from the maps on the
        // next hit, so they go first, and the counts below see only the map and outside holders.
        self.front.purge(|_| true);
        let mut kernels = Vec::new();
        self.maps.kernels.retain(|k, e| {
            let unused = e.value_refs() == Some(1);
            if unused {
                kernels.push(k.clone());
            }
            !unused
        });
        // A kernel a thread took from its front between the purge and here stays with that thread.
        self.front.purge(|k| kernels.contains(k));
        let unused: Vec<(ProgramKey, Arc<BuildResult<P, E>>)> = self
            .maps
            .programs
            .iter()
            .filter(|e| e.value().value_refs() == Some(1))
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        let mut released = 0;
        for (key, entry) in unused {
            // Our clone of the entry does not count: `value_refs` counts holders of the value.
            if entry.value_refs() != Some(1) {
                continue;
            }
            if self
                .maps
                .programs
                .remove_if(&key, |_, v| Arc::ptr_eq(v, &entry))
                .is_some()
            {
                self.program_bytes.fetch_sub(entry.cost(), Ordering::AcqRel);
                released += 1;
            }
        }
        self.counters
            .oor_released
            .fetch_add(released as u64, Ordering::Relaxed);
        if self.settings.trace {
            tracing::debug!(target: "kpc::cache::memory", programs = released, kernels = kernels.len(),
                "released unused programs (out of resources)");
        }
        released
    }

    /// Counts a retry after out of resources, and whether it failed again.
    pub(crate) fn count_out_of_resources_retry(&self, failed_again: bool) {
        self.counters.oor_retries.fetch_add(1, Ordering::Relaxed);
        if failed_again {
            self.counters.oor_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn evict_to_threshold(&self) {
        let threshold = self.settings.eviction_threshold;
        if self.program_bytes.load(Ordering::Acquire) <= threshold {
            return;
        }
        // One evictor at a time; a second one waits and then usually finds nothing left to do. Eviction is
        // off the hit path, so blocking here costs only builders.
        let guard = self.evict_lock.lock();
        self.fold_front_uses();
        type Candidate<P, E> = (u64, ProgramKey, Arc<BuildResult<P, E>>);
        let mut candidates: Vec<Candidate<P, E>> = self
            .maps
            .programs
            .iter()
            .filter(|e| e.value().state() == super::BuildState::Done)
            .map(|e| (e.value().last_use(), e.key().clone(), e.value().clone()))
            .collect();
        candidates.sort_by_key(|c| c.0);
        let mut evicted = Vec::new();
        for (_, key, entry) in candidates {
            if self.program_bytes.load(Ordering::Acquire) <= threshold {
                break;
            }
            let removed = self
                .maps
                .programs
                .remove_if(&key, |_, v| Arc::ptr_eq(v, &entry))
                .is_some();
            if removed {
                self.program_bytes.fetch_sub(entry.cost(), Ordering::AcqRel);
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                self.maps.kernels.retain(|k, _| k.program != key);
                if self.settings.trace {
                    tracing::debug!(target: "kpc::cache::memory", key = ?key, bytes = entry.cost(), "evict");
                }
                evicted.push((key, entry.cost()));
            }
        }
        // After the maps: a thread that fills its stripe from now on no longer finds these kernels.
        if !evicted.is_empty() {
            self.front
                .purge(|k| evicted.iter().any(|(e, _)| *e == k.program));
        }
        drop(guard);
        if let Some(tell) = self.on_evict.get() {
            evicted.iter().for_each(|&(_, cost)| tell(cost));
        }
    }
}
