//! "Would have hit": a bounded record of the entries eviction removed (`<root>/evicted.log`), so that
//! a later miss on one is explained as [`MissCause::Evicted`](super::MissCause::Evicted), with how
//! long ago and under which `KPC_CACHE_MAX_SIZE`, instead of `new-key`; and of those misses, so that
//! `kpc cache stats` can say what eviction cost and which limit would have served them.
//!
//! Two kinds of record, one line each (`BoundedLog`: checksummed, a torn line skipped, the last
//! [`EVICTED_RECORDS`] kept across restarts and processes):
//! - `E <unix ms> <entry> <bytes> <limit>`: an eviction pass removed the entry (its leaf directory,
//!   the key's four directory names, which name the key) of `bytes`, under a limit of `limit` bytes:
//!   `KPC_CACHE_MAX_SIZE` for a pass a put asked for, `--max-size` for `kpc cache prune`, `0` for a
//!   prune by age. `kpc cache clear` removes the record with the entries.
//! - `M <unix ms> <entry> <bytes> <limit> <evicted unix ms>`: a counted lookup missed a key whose
//!   latest record is an eviction.
//!
//! Failures (an unwritable directory, a full disk) lose records, never a lookup or a put; each cause
//! is warned about once per cache instance.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::boundlog::BoundedLog;
use super::{Inner, StoreKey};
pub use crate::cache::store::explain::{Evicted, size_arg};

/// How many records the eviction record keeps (evictions and the misses they caused together).
pub const EVICTED_RECORDS: usize = 4096;
/// The eviction record's file name, under the cache root.
pub const EVICTED_FILE: &str = "evicted.log";

/// One miss on an evicted key, from the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EvictedMiss {
    /// When it missed.
    pub at: SystemTime,
    /// The evicted entry's bytes: what it cost to hold.
    pub bytes: u64,
    /// The limit in force when it was evicted.
    pub limit: u64,
    /// When it was evicted.
    pub evicted_at: SystemTime,
}

/// What eviction cost since some time, from the record ([`super::PersistentCache::eviction_cost`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvictionCost {
    /// Entries removed by eviction in the period.
    pub evictions: u64,
    /// Their bytes.
    pub evicted_bytes: u64,
    /// Lookups that missed an entry eviction had removed.
    pub misses: u64,
    /// The bytes of the entries those misses wanted (each entry counted once per miss).
    pub miss_bytes: u64,
    /// An estimate of the `KPC_CACHE_MAX_SIZE` under which none of those misses would have happened:
    /// for each miss, the limit then in force plus every byte evicted from its entry's eviction to the
    /// miss (the room that would have kept it), the largest over the misses, rounded up to a MiB
    /// (to a KiB below 1 MiB).
    /// `None` without misses, or when every one was of an entry removed by age rather than size.
    pub suggested_max_size: Option<u64>,
}

pub(super) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis().min(u64::MAX as u128) as u64)
        .unwrap_or(0)
}

fn from_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The name a record gives a key's entry: its four directory names.
pub(super) fn entry_name(key: &StoreKey) -> String {
    key.dir_names().join("/")
}

pub(super) fn log(root: &std::path::Path) -> BoundedLog {
    BoundedLog::new(root.join(EVICTED_FILE), EVICTED_RECORDS, 110)
}

enum Record<'a> {
    Evicted(u64, &'a str, u64, u64),
    Missed(u64, EvictedMiss),
}

fn parse(line: &str) -> Option<Record<'_>> {
    let f: Vec<&str> = line.split(' ').collect();
    let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
    match *f.first()? {
        "E" if f.len() == 5 => Some(Record::Evicted(n(1)?, f[2], n(3)?, n(4)?)),
        "M" if f.len() == 6 => Some(Record::Missed(
            n(1)?,
            EvictedMiss {
                at: from_ms(n(1)?),
                bytes: n(3)?,
                limit: n(4)?,
                evicted_at: from_ms(n(5)?),
            },
        )),
        _ => None,
    }
}

impl Inner {
    /// Records the entries (leaf directories and bytes) an eviction pass removed under `limit`.
    pub(super) fn record_evicted(&self, removed: &[(&std::path::Path, u64)], limit: u64) {
        if removed.is_empty() {
            return;
        }
        let now = unix_ms(SystemTime::now());
        let lines: Vec<String> = removed
            .iter()
            .filter_map(|(leaf, bytes)| {
                let rel = leaf.strip_prefix(&self.v1).ok()?.to_str()?.to_owned();
                Some(format!("E {now} {rel} {bytes} {limit}"))
            })
            .collect();
        let log = log(&self.s.root);
        if let Err(e) = log.append(&lines) {
            self.warn_io(&e, log.path(), "cannot update the eviction record");
        }
    }

    /// `key`'s latest eviction, if the record's latest word on it is one.
    pub(super) fn evicted(&self, key: &StoreKey) -> Option<Evicted> {
        let name = entry_name(key);
        let lines = log(&self.s.root).read().ok()?;
        lines.iter().rev().find_map(|l| match parse(l)? {
            Record::Evicted(at, e, bytes, limit) if e == name => Some(Evicted {
                at: from_ms(at),
                bytes,
                limit,
            }),
            _ => None,
        })
    }

    /// Records that a counted lookup of `key` missed after `ev`.
    pub(super) fn record_evicted_miss(&self, key: &StoreKey, ev: &Evicted) {
        let line = format!(
            "M {} {} {} {} {}",
            unix_ms(SystemTime::now()),
            entry_name(key),
            ev.bytes,
            ev.limit,
            unix_ms(ev.at)
        );
        let log = log(&self.s.root);
        if let Err(e) = log.append(&[line]) {
            self.warn_io(&e, log.path(), "cannot update the eviction record");
        }
    }

    pub(super) fn eviction_cost(&self, since: SystemTime) -> std::io::Result<EvictionCost> {
        let lines = log(&self.s.root).read()?;
        let since = unix_ms(since);
        let recs: Vec<Record<'_>> = lines.iter().filter_map(|l| parse(l)).collect();
        let mut cost = EvictionCost::default();
        let mut suggest: Option<u64> = None;
        for r in &recs {
            match r {
                Record::Evicted(at, _, bytes, _) if *at >= since => {
                    cost.evictions += 1;
                    cost.evicted_bytes += bytes;
                }
                Record::Missed(at, m) if *at >= since => {
                    cost.misses += 1;
                    cost.miss_bytes += m.bytes;
                    if m.limit == 0 {
                        continue;
                    }
                    let from = unix_ms(m.evicted_at);
                    let window: u64 = recs
                        .iter()
                        .filter_map(|r| match r {
                            Record::Evicted(t, _, b, _) if *t >= from && *t <= *at => Some(*b),
                            _ => None,
                        })
                        .sum();
                    let need = m.limit + window.max(m.bytes);
                    let unit = if need >= 1 << 20 { 1 << 20 } else { 1 << 10 };
                    let need = need.div_ceil(unit) * unit;
                    suggest = Some(suggest.map_or(need, |s| s.max(need)));
                }
                _ => {}
            }
        }
        cost.suggested_max_size = suggest;
        Ok(cost)
    }
}
