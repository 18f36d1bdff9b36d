//! What the `kpc cache` commands need: listing entries, verifying every checksum, quarantining bad
//! entries, clearing the cache.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::PersistentCache;
use super::count::Freed;
use super::evict::Plan;
use super::slot::{SlotCheck, check_slot, read_src, slot_file};
use super::walk::scan;
use crate::cache::store::key::KeyRecord;

/// One complete entry, as `kpc cache ls` shows it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EntryInfo {
    /// Its leaf directory.
    pub leaf: PathBuf,
    /// Its slot `n`.
    pub slot: u32,
    /// The four directory names (device, image, spec, options).
    pub dirs: [String; 4],
    /// Both files' bytes.
    pub bytes: u64,
    /// When its `.bin` was last accessed (what eviction orders by).
    pub last_access: SystemTime,
    /// Its key record, or `None` when the `.src` does not verify (see `verify`).
    pub record: Option<KeyRecord>,
}

/// One entry that failed verification.
#[derive(Debug, Clone)]
pub struct BadEntry {
    /// The file at fault.
    pub path: PathBuf,
    /// The slot.
    pub slot: u32,
    /// What is wrong.
    pub problem: String,
    /// Whether `--fix` moved it to the quarantine directory.
    pub quarantined: bool,
}

/// What `verify` found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Entries checked (slots with a `.src`).
    pub checked: u64,
    /// Entries that passed every check.
    pub valid: u64,
    /// Entries that did not.
    pub bad: Vec<BadEntry>,
    /// Incomplete slots (temporaries, a `.bin` without `.src`, per-slot lock files of older caches): a killed writer's
    /// leftovers or a write in progress. Invisible to readers; not an error.
    pub stale: Vec<PathBuf>,
    /// How many of those `--fix` removed.
    pub stale_removed: u64,
}

/// What `clear` removed.
#[derive(Debug, Clone, Default)]
pub struct ClearReport {
    /// Entries removed.
    pub removed: u64,
    /// Bytes freed by them.
    pub removed_bytes: u64,
    /// Incomplete slots removed.
    pub stale_removed: u64,
    /// Entries skipped because another process was writing them.
    pub busy: u64,
    /// Files removed from the quarantine directory.
    pub quarantine_removed: u64,
}

fn unique_suffix() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

impl PersistentCache {
    /// Where `verify --fix` moves bad entries: `<root>/quarantine`, outside the versioned tree, so
    /// nothing reads or counts them.
    pub fn quarantine_dir(&self) -> PathBuf {
        self.root().join("quarantine")
    }

    /// Files and bytes in the quarantine directory.
    pub fn quarantined(&self) -> (u64, u64) {
        let Ok(rd) = fs::read_dir(self.quarantine_dir()) else {
            return (0, 0);
        };
        rd.filter_map(Result::ok)
            .filter_map(|e| e.metadata().ok())
            .filter(|m| m.is_file())
            .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
    }

    /// Every complete entry (both files present), in path order. Reads each `.src` (small); no `.bin`.
    pub fn entries(&self) -> io::Result<Vec<EntryInfo>> {
        let mut out = Vec::new();
        for leaf in scan(&self.inner.v1)? {
            for (&n, f) in &leaf.slots {
                let (Some(src), Some(bin)) = (f.src, f.bin) else {
                    continue;
                };
                let record = read_src(&slot_file(&leaf.path, n, "src"))
                    .ok()
                    .and_then(Result::ok)
                    .map(|(_, r)| r);
                out.push(EntryInfo {
                    leaf: leaf.path.clone(),
                    slot: n,
                    dirs: leaf.dirs.clone(),
                    bytes: src.len + bin.len,
                    last_access: UNIX_EPOCH
                        + std::time::Duration::new(
                            bin.atime.unix_seconds().max(0) as u64,
                            bin.atime.nanoseconds(),
                        ),
                    record,
                });
            }
        }
        Ok(out)
    }

    /// Verifies every entry: headers, lengths, checksums, that each `.bin` belongs to its `.src`'s key,
    /// and that each entry sits in the directory its key hashes to. With `fix`, bad entries are moved to
    /// [`PersistentCache::quarantine_dir`] and incomplete slots removed (each under its leaf's lock; a slot
    /// being written is left alone). Without `fix` nothing is written.
    pub fn verify(&self, fix: bool) -> io::Result<VerifyReport> {
        let mut report = VerifyReport::default();
        for leaf in scan(&self.inner.v1)? {
            for (&n, f) in &leaf.slots {
                if f.src.is_none() {
                    if f.bin.is_some() || f.tmp {
                        report.stale.push(slot_file(
                            &leaf.path,
                            n,
                            if f.bin.is_some() { "bin" } else { "bin.tmp" },
                        ));
                        if fix && self.remove_stale(&leaf.path, n) {
                            report.stale_removed += 1;
                        }
                    }
                    continue;
                }
                report.checked += 1;
                let problem = match check_slot(&leaf.path, n) {
                    SlotCheck::Valid(rec) => match rec.to_key() {
                        Some(k) if *k.dir_names() == leaf.dirs => None,
                        Some(k) => Some((
                            "src",
                            format!(
                                "misplaced: its key belongs in {}",
                                self.entry_dir(&k).display()
                            ),
                        )),
                        None => Some(("src", "key record has malformed values".to_string())),
                    },
                    SlotCheck::Defective(kind, d) => Some((kind.ext(), d.to_string())),
                    SlotCheck::Unreadable(kind, e) => {
                        Some((kind.ext(), format!("unreadable: {e}")))
                    }
                    // Removed while we looked.
                    SlotCheck::Absent | SlotCheck::Orphan => {
                        report.checked -= 1;
                        continue;
                    }
                };
                match problem {
                    None => report.valid += 1,
                    Some((ext, problem)) => {
                        let quarantined = fix && self.quarantine(&leaf.path, &leaf.dirs, n);
                        report.bad.push(BadEntry {
                            path: slot_file(&leaf.path, n, ext),
                            slot: n,
                            problem,
                            quarantined,
                        });
                    }
                }
            }
        }
        Ok(report)
    }

    fn remove_stale(&self, leaf: &Path, n: u32) -> bool {
        let Ok(Some(_leaf)) = self.inner.locks.try_leaf(leaf) else {
            return false;
        };
        if slot_file(leaf, n, "src").exists() {
            return false;
        }
        self.inner.remove_slot(leaf, n).is_some()
    }

    /// Moves slot `n`'s files into the quarantine directory, under the leaf's lock.
    fn quarantine(&self, leaf: &Path, dirs: &[String; 4], n: u32) -> bool {
        let Ok(Some(_leaf)) = self.inner.locks.try_leaf(leaf) else {
            return false;
        };
        let q = self.quarantine_dir();
        if fs::create_dir_all(&q).is_err() {
            return false;
        }
        let stem = format!(
            "{}-{}-{}-{}-{n}-{}",
            dirs[0],
            dirs[1],
            dirs[2],
            dirs[3],
            unique_suffix()
        );
        let moved = self.inner.counted(|| {
            let mut moved = Freed::default();
            let mut ok = true;
            for ext in ["src", "bin"] {
                let from = slot_file(leaf, n, ext);
                let len = fs::symlink_metadata(&from).map(|m| m.len()).unwrap_or(0);
                match fs::rename(&from, q.join(format!("{stem}.{ext}"))) {
                    Ok(()) => {
                        moved.bytes += len;
                        moved.entries += u64::from(ext == "src");
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(_) => ok = false,
                }
            }
            (ok, moved.delta())
        });
        moved.is_some_and(|(ok, _)| ok)
    }

    /// Removes every entry (except those being written), the quarantine directory and the eviction
    /// record (what was cleared was not evicted). Waits up to the
    /// lock timeout for a running eviction.
    pub fn clear(&self) -> io::Result<ClearReport> {
        let r = self.inner.evict(Plan {
            target: Some(0),
            target_entries: None,
            older_than: None,
            wait: true,
            defer_sweep: false,
            asked: false,
            wait_busy: false,
        })?;
        if !r.ran {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "another process kept the eviction lock past the lock timeout",
            ));
        }
        // What was cleared was not evicted: no later miss is explained by it.
        match fs::remove_file(self.root().join(super::evicted::EVICTED_FILE)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let (quarantine_removed, _) = self.quarantined();
        match fs::remove_dir_all(self.quarantine_dir()) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(ClearReport {
            removed: r.removed,
            removed_bytes: r.removed_bytes,
            stale_removed: r.stale_removed,
            busy: r.busy,
            quarantine_removed,
        })
    }
}
