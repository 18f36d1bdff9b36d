//! Remote retention: when each entry was last served, and garbage collection by age and quota
//! (`kpc cache gc --remote`).
//!
//! - **Last served.** Beside each entry `kpc/v<format>/<device>/<key>` lives a small record
//!   `kpc-served/v<format>/<device>/<key>` holding the Unix time it was last served or published
//!   (decimal). It is written when the entry is published and when a process is served the entry, at
//!   most once per [`TOUCH_PERIOD`] per key per process, in the background (the publisher's queue; a
//!   full queue drops it): a hit costs no round trip more. On fs and s3 the record's own modification
//!   time (the server's clock) is what the collector reads, from the listing; on Redis its value.
//! - **Collection** ([`RemoteStore::gc_plan`], then [`RemoteStore::gc_apply`]): every entry whose last
//!   serve is older than the age given goes, then, oldest served first, entries until the total is
//!   within the quota. A fingerprint namespace (one device digest) none of whose entries was served
//!   within the age goes whole with them: kpc versions and drivers nobody runs any more. Before it
//!   removes an entry the collector reads its record again, and keeps an entry served since the plan
//!   was made; a lookup that already read it has its bytes (and its own disk copy), so removing an
//!   entry never breaks a lookup in progress. An entry without a record (published by kpc before
//!   retention) counts as served when it was written (its modification time, or its build time).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::super::names::{entry_of_served, namespace, served_namespace, served_path};
use super::RemoteStore;
use crate::cache::store::StoreKey;
use crate::cache::store::auth;

/// A process records a serve of one key at most this often.
pub const TOUCH_PERIOD: Duration = Duration::from_secs(3600);

/// What [`RemoteStore::gc_plan`] is asked to remove.
/// Non-exhaustive: `GcPolicy::default().older_than(Some(d))`.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct GcPolicy {
    /// Remove entries not served for this long (and the namespaces none of whose entries was).
    pub older_than: Option<Duration>,
    /// Then remove entries, least recently served first, until the entries' bytes are at most this.
    pub max_size: Option<u64>,
}

impl GcPolicy {
    /// Sets [`GcPolicy::older_than`].
    pub fn older_than(mut self, older_than: Option<Duration>) -> Self {
        self.older_than = older_than;
        self
    }
    /// Sets [`GcPolicy::max_size`].
    pub fn max_size(mut self, max_size: Option<u64>) -> Self {
        self.max_size = max_size;
        self
    }
}

/// One remote entry as the collector sees it.
#[derive(Debug, Clone)]
pub struct GcEntry {
    /// Its path on the remote.
    pub path: String,
    /// Its device (fingerprint namespace) digest, hex.
    pub device: String,
    /// Its bytes on the remote.
    pub bytes: u64,
    /// When it was last served (or published), as far as the remote says.
    pub last_served: SystemTime,
}

/// Why the plan removes an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcReason {
    /// Not served within the age.
    Age,
    /// Over the quota (least recently served first).
    Quota,
}

/// What the collector would remove, and what it saw.
#[derive(Debug, Clone)]
pub struct GcPlan {
    /// Every entry, oldest served first.
    pub entries: Vec<GcEntry>,
    /// The entries to remove (indices into `entries`) and why.
    pub remove: Vec<(usize, GcReason)>,
    /// Fingerprint namespaces, and those none of whose entries was served within the age.
    pub namespaces: usize,
    /// The namespaces that go whole.
    pub dead_namespaces: Vec<String>,
    /// Last-served records whose entry is gone.
    pub orphan_records: Vec<String>,
    /// The age cut used: entries last served before it go.
    pub cut: Option<SystemTime>,
}

/// What [`RemoteStore::gc_apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Entries removed for their age.
    pub removed_by_age: u64,
    /// Entries removed to get within the quota.
    pub removed_by_quota: u64,
    /// Their bytes.
    pub removed_bytes: u64,
    /// Entries the plan would have removed that were served since it was made: kept.
    pub kept_served: u64,
    /// Entries that went before the collector came to them (another collector, a refused entry).
    pub gone: u64,
    /// Last-served records of removed or missing entries removed.
    pub records_removed: u64,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn from_unix(s: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(s)
}

/// The time a last-served record's value says.
fn record_time(v: &[u8]) -> Option<SystemTime> {
    std::str::from_utf8(v)
        .ok()?
        .trim()
        .parse()
        .ok()
        .map(from_unix)
}

impl RemoteStore {
    /// Records (in the background, at most once per [`TOUCH_PERIOD`] per key in this process) that
    /// `key`'s entry was served or published now.
    pub(super) fn touch(&self, key: &StoreKey, force: bool) {
        let Some(publisher) = &self.publisher else {
            return;
        };
        let now = Instant::now();
        {
            let mut t = self.touched.lock();
            match t.get(&key.digest().0) {
                Some(&last) if !force && now.duration_since(last) < TOUCH_PERIOD => return,
                _ => {}
            }
            if t.len() > 100_000 {
                t.retain(|_, last| now.duration_since(*last) < TOUCH_PERIOD);
            }
            t.insert(key.digest().0, now);
        }
        let stamp = unix(SystemTime::now()).to_string().into_bytes();
        publisher.submit(served_path(key), stamp);
    }

    /// Every entry (all devices) with its size, and every last-served record with its time.
    #[allow(clippy::type_complexity)]
    fn census(
        &self,
    ) -> io::Result<(
        Vec<(String, u64, Option<SystemTime>)>,
        HashMap<String, SystemTime>,
    )> {
        let ops = &self.shared.ops;
        let failed = |e: redis::RedisError| io::Error::other(format!("listing {}: {e}", self.url));
        match &self.fleet {
            Some(f) => {
                let paths = f.scan(&format!("{}*", namespace())).map_err(failed)?;
                let lens = f.strlens(&paths).map_err(failed)?;
                let entries = paths
                    .into_iter()
                    .zip(lens)
                    .filter(|(_, l)| *l > 0)
                    .map(|(p, l)| (p, l, None))
                    .collect();
                let records = f
                    .scan(&format!("{}*", served_namespace()))
                    .map_err(failed)?;
                let values = f.mget(&records).map_err(failed)?;
                let served = records
                    .into_iter()
                    .zip(values)
                    .filter_map(|(p, v)| Some((p, record_time(&v?)?)))
                    .collect();
                Ok((entries, served))
            }
            None => {
                let entries = ops.list_meta(&namespace())?;
                let served = ops
                    .list_meta(&served_namespace())?
                    .into_iter()
                    .filter_map(|(p, _, t)| Some((p, t?)))
                    .collect();
                Ok((entries, served))
            }
        }
    }

    /// When the entry at `path` was written, as its provenance says (for an entry without a record).
    fn built_time(&self, path: &str) -> Option<SystemTime> {
        let v = self.shared.ops.read(path).ok()??;
        Some(from_unix(auth::claimed_provenance(&v)?.built_unix))
    }

    /// What a collection under `policy` would remove, judged at `now`. Changes nothing.
    ///
    /// Errors: the remote could not be listed.
    pub fn gc_plan(&self, policy: GcPolicy, now: SystemTime) -> io::Result<GcPlan> {
        let (listed, mut served) = self.census()?;
        let mut entries: Vec<GcEntry> = Vec::with_capacity(listed.len());
        for (path, bytes, modified) in listed {
            let record = served.remove(&format!("kpc-served/{}", &path["kpc/".len()..]));
            let last_served = record
                .or(modified)
                .or_else(|| self.built_time(&path))
                .unwrap_or(UNIX_EPOCH);
            let device = path[namespace().len()..]
                .split('/')
                .next()
                .unwrap_or("")
                .to_owned();
            entries.push(GcEntry {
                path,
                device,
                bytes,
                last_served,
            });
        }
        entries.sort_by(|a, b| (a.last_served, &a.path).cmp(&(b.last_served, &b.path)));
        let cut = policy
            .older_than
            .map(|d| now.checked_sub(d).unwrap_or(UNIX_EPOCH));
        let mut remove = Vec::new();
        let mut kept_bytes: u64 = entries.iter().map(|e| e.bytes).sum();
        // Sorted oldest first: the entries past the age are a prefix, and the quota takes the
        // entries right after it.
        let aged = entries
            .iter()
            .take_while(|e| cut.is_some_and(|c| e.last_served < c))
            .count();
        for (i, e) in entries.iter().enumerate().take(aged) {
            remove.push((i, GcReason::Age));
            kept_bytes -= e.bytes;
        }
        if let Some(max) = policy.max_size {
            for (i, e) in entries.iter().enumerate().skip(aged) {
                if kept_bytes <= max {
                    break;
                }
                remove.push((i, GcReason::Quota));
                kept_bytes -= e.bytes;
            }
        }
        // Namespaces: the newest serve of each.
        let mut newest: BTreeMap<&str, SystemTime> = BTreeMap::new();
        for e in &entries {
            let n = newest.entry(e.device.as_str()).or_insert(UNIX_EPOCH);
            *n = (*n).max(e.last_served);
        }
        let dead_namespaces = newest
            .iter()
            .filter(|(_, t)| cut.is_some_and(|c| **t < c))
            .map(|(d, _)| d.to_string())
            .collect();
        Ok(GcPlan {
            namespaces: newest.len(),
            dead_namespaces,
            orphan_records: served.into_keys().collect(),
            entries,
            remove,
            cut,
        })
    }

    /// The last-served time the remote records for the entry at `path` now, if any.
    fn served_now(&self, path: &str) -> Option<SystemTime> {
        let record = format!("kpc-served/{}", path.strip_prefix("kpc/")?);
        match &self.fleet {
            Some(_) => record_time(&self.shared.ops.read(&record).ok()??),
            None => self.shared.ops.stat(&record).ok()??.1,
        }
    }

    /// Removes what `plan` says, keeping every entry served since the plan was made (its record read
    /// again just before), then the records of removed entries and the orphan records.
    ///
    /// Errors: a removal failed (what was removed before it stays removed).
    pub fn gc_apply(&self, plan: &GcPlan) -> io::Result<GcReport> {
        let mut r = GcReport::default();
        let ops = &self.shared.ops;
        let fail = |f: super::super::ops::Failure| io::Error::other(f.detail);
        for &(i, why) in &plan.remove {
            let e = &plan.entries[i];
            if self.served_now(&e.path).is_some_and(|t| t > e.last_served) {
                r.kept_served += 1;
                continue;
            }
            match ops.stat(&e.path).map_err(fail)? {
                None => r.gone += 1,
                Some(_) => {
                    ops.delete(&e.path).map_err(fail)?;
                    match why {
                        GcReason::Age => r.removed_by_age += 1,
                        GcReason::Quota => r.removed_by_quota += 1,
                    }
                    r.removed_bytes += e.bytes;
                }
            }
            ops.delete(&format!("kpc-served/{}", &e.path["kpc/".len()..]))
                .map_err(fail)?;
            r.records_removed += 1;
        }
        for record in &plan.orphan_records {
            // Orphans only while their entry is still missing (a publish may have just made it).
            if let Some(entry) = entry_of_served(record)
                && ops.stat(&entry).map_err(fail)?.is_none()
            {
                ops.delete(record).map_err(fail)?;
                r.records_removed += 1;
            }
        }
        Ok(r)
    }
}
