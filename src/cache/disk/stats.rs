//! Counters of one `PersistentCache`, and the warn-once bookkeeping it shares with the other stores.
//!
//! Everything here is counted on the disk path, which costs tens of microseconds at least, so plain
//! relaxed atomics are cheap enough; nothing needs the striping the in-memory hit counter uses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::MissCause;
pub(crate) use crate::cache::store::warn::Warned;

/// A snapshot of one disk cache instance's counters (this process only; other processes sharing the
/// directory keep their own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskStats {
    /// Lookups that returned a verified binary.
    pub hits: u64,
    /// Lookups that found no usable entry (the caller builds). Through the store chain, which looks in
    /// every store before it locks, a lookup that then waited for another builder and found its entry
    /// counts here and as a hit.
    pub misses: u64,
    /// Entries this instance published.
    pub puts: u64,
    /// Bytes this instance wrote into published entries (both files, headers included).
    pub bytes_written: u64,
    /// Payload bytes returned by hits.
    pub bytes_read: u64,
    /// Entries removed by eviction passes this instance ran (`prune` included).
    pub evictions: u64,
    /// Bytes those evictions freed.
    pub evicted_bytes: u64,
    /// Corrupt or incomplete entries found (bad magic, version, length or checksum, a `.src` without
    /// its `.bin`); each was removed unless another process was writing that slot at the time.
    pub corruptions: u64,
    /// Verified binaries that the backend refused to load; each was removed and rebuilt.
    pub rejected: u64,
    /// Lookups that found another process (or thread) building the same key and waited for it.
    pub lock_waits: u64,
    /// Total time spent in those waits.
    pub lock_wait_time: Duration,
    /// Waits that reached `KPC_CACHE_LOCK_TIMEOUT`; the caller then built the key itself.
    pub lock_timeouts: u64,
    /// Sum of the original build times of the binaries served by hits, less those the driver
    /// compiled again when they were loaded (`recompiled_hits`): what the hits saved.
    pub build_time_saved: Duration,
    /// Hits whose binary the backend loaded, but whose driver reported that it compiled anyway
    /// (Vulkan pipeline-creation feedback without APPLICATION_PIPELINE_CACHE_HIT; lavapipe's pipeline
    /// cache is a stub, so every hit there is one). Counted in `hits` too.
    pub recompiled_hits: u64,
    /// The original build times of those hits: served from disk, but not saved.
    pub build_time_recompiled: Duration,
    /// Lookups and puts that did not touch the disk because the device image is outside
    /// `KPC_CACHE_MIN_DEVICE_IMAGE_SIZE..=KPC_CACHE_MAX_DEVICE_IMAGE_SIZE`, or the entry alone is larger
    /// than `KPC_CACHE_MAX_SIZE`.
    pub skipped: u64,
    /// Puts that failed (permission, full disk, read-only root, ...); the build itself succeeded.
    pub failed_puts: u64,
    /// I/O errors on the read path that were treated as a miss (permission denied, ...).
    pub read_errors: u64,
    /// Times this instance measured the whole tree because the size record was missing or left
    /// inconsistent by a process killed in the middle of a change. A new cache counts one.
    pub size_rebuilds: u64,
    /// Times an eviction pass of this instance found the record differing from a walk during which
    /// nothing counted changed (files removed behind the cache's back) and corrected it.
    pub size_corrections: u64,
    /// Misses by cause ([`MissCause`]): nothing similar cached.
    pub misses_new_key: u64,
    /// Misses whose nearest entry was built for another device fingerprint (driver update, ...).
    pub misses_device_changed: u64,
    /// Misses whose nearest entry has an image of the same name with other bytes.
    pub misses_image_changed: u64,
    /// Misses whose nearest entry differs in spec constants only.
    pub misses_spec_changed: u64,
    /// Misses whose nearest entry differs in build options only.
    pub misses_options_changed: u64,
    /// Misses where an entry with exactly the key was there but not usable (corrupt, incomplete or
    /// unreadable).
    pub misses_entry_unusable: u64,
    /// Misses whose key was cached and valid by the time the miss was explained: another process
    /// published it after the lookup.
    pub misses_cached: u64,
    /// Misses on a key that eviction had removed (the eviction record says so): a
    /// larger `KPC_CACHE_MAX_SIZE` would have served them.
    pub misses_evicted: u64,
    /// Stored binaries found to have crashed a process while it loaded them (its loading record was
    /// left behind by a process that died), quarantined: never loaded again here.
    pub crashed_loads: u64,
    /// Loads refused because their binary crashed a process before (a quarantine marker names it).
    pub crashed_refusals: u64,
}

#[derive(Debug, Default)]
pub(crate) struct DiskCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub puts: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub evictions: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub corruptions: AtomicU64,
    pub rejected: AtomicU64,
    pub lock_waits: AtomicU64,
    pub lock_wait_nanos: AtomicU64,
    pub lock_timeouts: AtomicU64,
    pub build_nanos_saved: AtomicU64,
    pub recompiled_hits: AtomicU64,
    pub build_nanos_recompiled: AtomicU64,
    pub skipped: AtomicU64,
    pub failed_puts: AtomicU64,
    pub read_errors: AtomicU64,
    pub size_rebuilds: AtomicU64,
    pub size_corrections: AtomicU64,
    pub misses_by_cause: [AtomicU64; 8],
    pub crashed_loads: AtomicU64,
    pub crashed_refusals: AtomicU64,
}

pub(crate) fn bump(a: &AtomicU64, by: u64) {
    a.fetch_add(by, Ordering::Relaxed);
}

pub(crate) fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

impl DiskCounters {
    /// A hit's binary was loaded but the driver compiled anyway: its build time moves from saved to
    /// recompiled.
    pub fn recompiled(&self, build_time: Duration) {
        let t = nanos(build_time);
        bump(&self.recompiled_hits, 1);
        bump(&self.build_nanos_recompiled, t);
        let _ = self
            .build_nanos_saved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s.saturating_sub(t))
            });
    }

    pub fn snapshot(&self) -> DiskStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiskStats {
            hits: l(&self.hits),
            misses: l(&self.misses),
            puts: l(&self.puts),
            bytes_written: l(&self.bytes_written),
            bytes_read: l(&self.bytes_read),
            evictions: l(&self.evictions),
            evicted_bytes: l(&self.evicted_bytes),
            corruptions: l(&self.corruptions),
            rejected: l(&self.rejected),
            lock_waits: l(&self.lock_waits),
            lock_wait_time: Duration::from_nanos(l(&self.lock_wait_nanos)),
            lock_timeouts: l(&self.lock_timeouts),
            build_time_saved: Duration::from_nanos(l(&self.build_nanos_saved)),
            recompiled_hits: l(&self.recompiled_hits),
            build_time_recompiled: Duration::from_nanos(l(&self.build_nanos_recompiled)),
            skipped: l(&self.skipped),
            failed_puts: l(&self.failed_puts),
            read_errors: l(&self.read_errors),
            size_rebuilds: l(&self.size_rebuilds),
            size_corrections: l(&self.size_corrections),
            misses_new_key: l(&self.misses_by_cause[MissCause::NewKey as usize]),
            misses_device_changed: l(&self.misses_by_cause[MissCause::DeviceChanged as usize]),
            misses_image_changed: l(&self.misses_by_cause[MissCause::ImageChanged as usize]),
            misses_spec_changed: l(&self.misses_by_cause[MissCause::SpecChanged as usize]),
            misses_options_changed: l(&self.misses_by_cause[MissCause::OptionsChanged as usize]),
            misses_entry_unusable: l(&self.misses_by_cause[MissCause::EntryUnusable as usize]),
            misses_cached: l(&self.misses_by_cause[MissCause::Cached as usize]),
            misses_evicted: l(&self.misses_by_cause[MissCause::Evicted as usize]),
            crashed_loads: l(&self.crashed_loads),
            crashed_refusals: l(&self.crashed_refusals),
        }
    }
}

impl From<DiskStats> for crate::cache::store::StoreStats {
    fn from(d: DiskStats) -> Self {
        Self {
            hits: d.hits,
            misses: d.misses,
            errors: d.read_errors + d.failed_puts + d.corruptions + d.lock_timeouts + d.rejected,
            puts: d.puts,
            bytes_read: d.bytes_read,
            bytes_written: d.bytes_written,
            ..Default::default()
        }
    }
}
