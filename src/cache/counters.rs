//! Counters for the in-memory cache. The hit counter is striped over cache-line-padded slots so that
//! threads hitting the same entry do not all write one cache line; everything else is counted on slow
//! paths, where one atomic is cheaper than the build it counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

/// A counter that many threads increment without contending on one cache line.
#[derive(Default)]
pub(crate) struct StripedCounter {
    slots: [Padded; STRIPES],
}

impl std::fmt::Debug for StripedCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.get())
    }
}

// Indices are distinct among live threads and reused after exits, so up to STRIPES live threads never
// share a stripe, however many came and went before.
fn thread_slot() -> usize {
    super::front::thread_index() % STRIPES
}

impl StripedCounter {
    /// Adds one on this thread's stripe.
    #[inline]
    pub(crate) fn incr(&self) {
        self.slots[thread_slot()].0.fetch_add(1, Ordering::Relaxed);
    }
    /// The sum over all stripes.
    pub fn get(&self) -> u64 {
        self.slots.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// Live counters of one `KernelProgramCache`.
#[derive(Debug, Default)]
pub(crate) struct MemCounters {
    pub(crate) hits: StripedCounter,
    pub(crate) misses: AtomicU64,
    pub(crate) builds: AtomicU64,
    pub(crate) failed_builds: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) waits: AtomicU64,
    pub(crate) build_nanos: AtomicU64,
    pub(crate) oor_retries: AtomicU64,
    pub(crate) oor_released: AtomicU64,
    pub(crate) oor_failures: AtomicU64,
}

/// A plain snapshot of a cache's counters (programs and kernels together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Requests answered from a finished entry without building or waiting.
    pub hits: u64,
    /// Requests that found no finished entry (they built or waited).
    pub misses: u64,
    /// Build closures run (successful or not).
    pub builds: u64,
    /// Builds that returned an error or panicked.
    pub failed_builds: u64,
    /// Programs evicted by the LRU (their kernels go with them and are not counted separately).
    pub evictions: u64,
    /// Requests that blocked while another thread built the same key.
    pub waits: u64,
    /// Wall time spent inside build closures.
    pub build_time: Duration,
    /// Programs cached now.
    pub programs: u64,
    /// Kernels cached now.
    pub kernels: u64,
    /// Bytes of programs cached now ([`super::CacheCost`]) (what the eviction threshold counts).
    pub program_bytes: u64,
    /// Builds, binary loads and kernel creations that ran out of device or host resources and were
    /// retried once after releasing the programs no live kernel holds (the SYCL runtime's recovery).
    pub out_of_resources_retries: u64,
    /// Programs (with their unused kernels) those releases dropped from the cache.
    pub out_of_resources_released: u64,
    /// Retries that ran out of resources again: the error went to the caller, uncached.
    pub out_of_resources_failures: u64,
}

impl MemCounters {
    pub(crate) fn snapshot(&self) -> CacheStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            hits: self.hits.get(),
            misses: l(&self.misses),
            builds: l(&self.builds),
            failed_builds: l(&self.failed_builds),
            evictions: l(&self.evictions),
            waits: l(&self.waits),
            build_time: Duration::from_nanos(l(&self.build_nanos)),
            out_of_resources_retries: l(&self.oor_retries),
            out_of_resources_released: l(&self.oor_released),
            out_of_resources_failures: l(&self.oor_failures),
            ..CacheStats::default()
        }
    }
}
