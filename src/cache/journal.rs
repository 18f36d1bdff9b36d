//! The miss journal: every build after a miss, and the compile time hits saved, recorded per process
//! so that `kpc cache report` can rank miss causes, the kernels built more than once across a fleet,
//! and the compile seconds spent and saved.
//!
//! - **Records** ([`JournalRecord`], one JSON line each): a `build` (key digest, kernel label, the
//!   store levels that missed, the miss cause the local disk cache counted, build milliseconds) after
//!   each fresh build of a stored program; a `hits` record (count, compile milliseconds saved: the
//!   recorded build times of the entries loaded, less those the driver compiled again) summing the
//!   hits since the last record, written with the next build, every [`HITS_PER_RECORD`] hits, and
//!   when the store chain is dropped. The hit path itself writes nothing.
//! - **Local**: `<cache>/misses.log`, a bounded record (the last 4096 records; checksummed lines, a
//!   torn one skipped; shared by every process of the directory). No local disk cache, no local
//!   journal.
//! - **Shared**: each store that keeps a fleet journal gets the same records ([`Fleet::share_journal`]):
//!   a Redis remote appends them to the stream `kpc-journal/v1`, capped (`MAXLEN ~`) at
//!   [`FLEET_RECORDS`]; an fs or s3 remote keeps one object per host id under `kpc-journal/v1/`,
//!   its last 1024 records, rewritten at each share.
//! - **Failures** lose records, never a request: one warning per cause.
//!
//! [`Fleet::share_journal`]: crate::cache::store::Fleet::share_journal

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde_json::{Value, json};

use super::disk::PersistentCache;
use super::store::StoreKey;
use super::store::warn::WarnCause;

/// Hits summed into one `hits` record at most (a process serving only hits still reports them).
pub const HITS_PER_RECORD: u64 = 64;
/// How many records a shared fleet journal keeps (approximately: Redis trims `MAXLEN ~`).
#[cfg(feature = "remote")]
pub const FLEET_RECORDS: usize = 10_000;

/// What a journal record tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKind {
    /// A program built after every store missed.
    Build {
        /// The key digest (hex).
        key: String,
        /// The kernel label (the image's name).
        label: String,
        /// The store levels that missed, in lookup order (`disk+remote`).
        layer: String,
        /// The miss cause the local disk cache counted (`new-key`, `evicted`, ...); `unexplained`
        /// without one, `not-persisted` for an image outside the persisted sizes.
        cause: String,
        /// Build milliseconds.
        build_ms: u64,
    },
    /// Hits since the previous record of this process.
    Hits {
        /// Programs loaded from a store.
        count: u64,
        /// Their recorded build times, less those the driver compiled again: compile time saved.
        saved_ms: u64,
    },
}

/// One record of the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalRecord {
    /// When it was written.
    pub at: SystemTime,
    /// The writing machine (`KPC_HOST_ID`, else the host name).
    pub host: String,
    /// What it tells.
    pub kind: RecordKind,
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis().min(u64::MAX as u128) as u64)
        .unwrap_or(0)
}

impl JournalRecord {
    /// The record as one JSON line.
    pub fn to_line(&self) -> String {
        let mut v = json!({"t": ms(self.at), "host": self.host});
        match &self.kind {
            RecordKind::Build {
                key,
                label,
                layer,
                cause,
                build_ms,
            } => {
                v["kind"] = json!("build");
                v["key"] = json!(key);
                v["label"] = json!(label);
                v["layer"] = json!(layer);
                v["cause"] = json!(cause);
                v["build_ms"] = json!(build_ms);
            }
            RecordKind::Hits { count, saved_ms } => {
                v["kind"] = json!("hits");
                v["count"] = json!(count);
                v["saved_ms"] = json!(saved_ms);
            }
        }
        v.to_string()
    }

    /// A record from its line; `None` for anything else (a record of a later format included).
    pub fn parse(line: &str) -> Option<JournalRecord> {
        let v: Value = serde_json::from_str(line).ok()?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let n = |k: &str| v.get(k).and_then(Value::as_u64);
        let kind = match v.get("kind")?.as_str()? {
            "build" => RecordKind::Build {
                key: s("key")?,
                label: s("label")?,
                layer: s("layer")?,
                cause: s("cause")?,
                build_ms: n("build_ms")?,
            },
            "hits" => RecordKind::Hits {
                count: n("count")?,
                saved_ms: n("saved_ms")?,
            },
            _ => return None,
        };
        Some(JournalRecord {
            at: UNIX_EPOCH + Duration::from_millis(n("t")?),
            host: s("host")?,
            kind,
        })
    }
}

/// Reads `cache`'s local journal, oldest first. Errors: it exists but cannot be read.
pub fn read_local(cache: &PersistentCache) -> std::io::Result<Vec<JournalRecord>> {
    Ok(cache
        .journal_log()
        .read()?
        .iter()
        .filter_map(|l| JournalRecord::parse(l))
        .collect())
}

/// A miss cause and what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CauseRank {
    /// The cause.
    pub cause: String,
    /// Builds it caused.
    pub builds: u64,
    /// Their build milliseconds.
    pub build_ms: u64,
}

/// A kernel (one key) built more than once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    /// The key digest (hex).
    pub key: String,
    /// Its label.
    pub label: String,
    /// How many times it was built.
    pub builds: u64,
    /// The machines that built it, sorted.
    pub hosts: Vec<String>,
    /// Build milliseconds in all.
    pub build_ms: u64,
    /// Causes of its builds, sorted.
    pub causes: Vec<String>,
}

/// What `kpc cache report` shows ([`report`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Records read (after `since`).
    pub records: u64,
    /// Machines that wrote them, sorted.
    pub hosts: Vec<String>,
    /// Builds recorded.
    pub builds: u64,
    /// Their build milliseconds: compile time spent.
    pub spent_ms: u64,
    /// Hits recorded.
    pub hits: u64,
    /// Compile milliseconds those hits saved.
    pub saved_ms: u64,
    /// Causes, most builds first (then most time, then name).
    pub causes: Vec<CauseRank>,
    /// Keys built more than once, most builds first (then most time, then key).
    pub rebuilt: Vec<Rebuilt>,
}

/// Ranks `records` written at or after `since` (all when `None`).
pub fn report(records: &[JournalRecord], since: Option<SystemTime>) -> Report {
    let mut r = Report::default();
    let mut causes: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut keys: BTreeMap<&str, Rebuilt> = BTreeMap::new();
    let mut hosts = std::collections::BTreeSet::new();
    for rec in records.iter().filter(|x| since.is_none_or(|s| x.at >= s)) {
        r.records += 1;
        hosts.insert(rec.host.clone());
        match &rec.kind {
            RecordKind::Build {
                key,
                label,
                cause,
                build_ms,
                ..
            } => {
                r.builds += 1;
                r.spent_ms += build_ms;
                let c = causes.entry(cause).or_default();
                c.0 += 1;
                c.1 += build_ms;
                let k = keys.entry(key).or_insert_with(|| Rebuilt {
                    key: key.clone(),
                    label: label.clone(),
                    builds: 0,
                    hosts: Vec::new(),
                    build_ms: 0,
                    causes: Vec::new(),
                });
                k.builds += 1;
                k.build_ms += build_ms;
                if !k.hosts.contains(&rec.host) {
                    k.hosts.push(rec.host.clone());
                }
                if !k.causes.contains(cause) {
                    k.causes.push(cause.clone());
                }
            }
            RecordKind::Hits { count, saved_ms } => {
                r.hits += count;
                r.saved_ms += saved_ms;
            }
        }
    }
    r.hosts = hosts.into_iter().collect();
    r.causes = causes
        .into_iter()
        .map(|(c, (b, t))| CauseRank {
            cause: c.to_owned(),
            builds: b,
            build_ms: t,
        })
        .collect();
    r.causes.sort_by(|a, b| {
        (b.builds, b.build_ms)
            .cmp(&(a.builds, a.build_ms))
            .then_with(|| a.cause.cmp(&b.cause))
    });
    r.rebuilt = keys
        .into_values()
        .filter(|k| k.builds > 1)
        .map(|mut k| {
            k.hosts.sort();
            k.causes.sort();
            k
        })
        .collect();
    r.rebuilt.sort_by(|a, b| {
        (b.builds, b.build_ms)
            .cmp(&(a.builds, a.build_ms))
            .then_with(|| a.key.cmp(&b.key))
    });
    r
}

/// The journal a store chain writes (see the module documentation).
pub(crate) struct Journal {
    pub host: String,
    pub local: Option<PersistentCache>,
    /// Hits and nanoseconds saved since the last `hits` record.
    pending: Mutex<(u64, u64)>,
}

impl Journal {
    pub(crate) fn new(host: String, local: Option<PersistentCache>) -> Journal {
        Journal {
            host,
            local,
            pending: Mutex::new((0, 0)),
        }
    }

    /// A program was loaded from a store; its recorded build time saved. Returns the `hits` record
    /// due, if one is.
    pub(crate) fn hit(&self, build_time: Duration) -> Option<JournalRecord> {
        let mut p = self.pending.lock();
        p.0 += 1;
        p.1 =
            p.1.saturating_add(build_time.as_nanos().min(u64::MAX as u128) as u64);
        if p.0 >= HITS_PER_RECORD {
            self.take_hits(&mut p)
        } else {
            None
        }
    }

    /// A hit's binary was compiled again by the driver: not saved after all.
    pub(crate) fn recompiled(&self, build_time: Duration) {
        let mut p = self.pending.lock();
        p.1 =
            p.1.saturating_sub(build_time.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// The pending `hits` record, if any hits are pending.
    pub(crate) fn flush(&self) -> Option<JournalRecord> {
        let mut p = self.pending.lock();
        self.take_hits(&mut p)
    }

    fn take_hits(&self, p: &mut (u64, u64)) -> Option<JournalRecord> {
        if p.0 == 0 {
            return None;
        }
        let (count, ns) = std::mem::take(p);
        Some(JournalRecord {
            at: SystemTime::now(),
            host: self.host.clone(),
            kind: RecordKind::Hits {
                count,
                saved_ms: ns / 1_000_000,
            },
        })
    }

    /// The `build` record of `key`, built in `took` after the levels `layer` missed.
    pub(crate) fn built(&self, key: &StoreKey, took: Duration, layer: String) -> JournalRecord {
        let cause = match &self.local {
            Some(d) => match d.take_miss_cause(key) {
                Some(c) => c.name(),
                None if !d.persists_image_of_size(key.image_len()) => "not-persisted",
                None => "unexplained",
            },
            None => "unexplained",
        };
        JournalRecord {
            at: SystemTime::now(),
            host: self.host.clone(),
            kind: RecordKind::Build {
                key: key.digest().to_hex(),
                label: key.label().to_owned(),
                layer,
                cause: cause.to_owned(),
                build_ms: took.as_millis().min(u64::MAX as u128) as u64,
            },
        }
    }

    /// Appends `records` to the local journal (warned once per cause on failure).
    pub(crate) fn write_local(&self, records: &[JournalRecord], warn: impl Fn(WarnCause, String)) {
        let Some(d) = &self.local else {
            return;
        };
        let lines: Vec<String> = records.iter().map(JournalRecord::to_line).collect();
        let log = d.journal_log();
        if let Err(e) = log.append(&lines) {
            warn(
                WarnCause::of(&e),
                format!(
                    "cannot write the miss journal {}: {e}",
                    log.path().display()
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Now, to the millisecond (what a record keeps).
    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms(SystemTime::now()))
    }

    fn build(host: &str, key: &str, cause: &str, ms: u64) -> JournalRecord {
        JournalRecord {
            at: now(),
            host: host.into(),
            kind: RecordKind::Build {
                key: key.into(),
                label: format!("k{key}"),
                layer: "disk".into(),
                cause: cause.into(),
                build_ms: ms,
            },
        }
    }

    #[test]
    fn records_round_trip_and_rank() {
        let recs = vec![
            build("a", "1", "new-key", 100),
            build("b", "1", "new-key", 120),
            build("b", "2", "evicted", 50),
            build("a", "2", "evicted", 40),
            build("a", "3", "evicted", 10),
            JournalRecord {
                at: now(),
                host: "b".into(),
                kind: RecordKind::Hits {
                    count: 3,
                    saved_ms: 70,
                },
            },
        ];
        for r in &recs {
            assert_eq!(JournalRecord::parse(&r.to_line()).as_ref(), Some(r));
        }
        let rep = report(&recs, None);
        assert_eq!(
            (rep.builds, rep.spent_ms, rep.hits, rep.saved_ms),
            (5, 320, 3, 70)
        );
        assert_eq!(rep.causes[0].cause, "evicted");
        assert_eq!(rep.causes[0].builds, 3);
        assert_eq!(rep.rebuilt.len(), 2);
        assert_eq!(rep.rebuilt[0].key, "1");
        assert_eq!(rep.rebuilt[0].hosts, ["a", "b"]);
        let later = report(&recs, Some(SystemTime::now() + Duration::from_secs(60)));
        assert_eq!(later.records, 0);
    }
}
