//! The size file, and eviction by last access.
//!
//! Eviction is one pass: walk every leaf once (`walk.rs`: four levels of `read_dir` plus one `stat` per
//! file), remove incomplete slots nobody is writing, then remove complete entries in order of their
//! `.bin`'s access time until the total is at or under the target, by renaming their files into the
//! pass's trash (`trash.rs`: freeing blocks is what costs on ext4, and a rename frees none). The chosen
//! entries are removed on a few threads when there are many. A sweep then removes the directories left
//! empty and deletes the trash: before the pass returns, or on a background thread that keeps the
//! eviction lock when the caller deferred it. Every removal takes the leaf's lock first (try-only), so
//! an entry being written, or being removed by someone else, is skipped rather than waited for. Only
//! one process evicts (or sweeps) at a time: it holds `<root>/v1/evict.lock`, and a put that finds it
//! taken skips eviction (the holder is doing the work).

use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use filetime::FileTime;

use super::Inner;
use super::lock::{self, Waited};
use super::slot::{remove_slot_files, slot_file};
use super::stats::bump;
use super::trash::{Sweep, Trash};
use super::walk::{LeafScan, SlotFiles, scan, scan_tree, workers_for};

pub(crate) const SIZE_FILE: &str = "size";
pub(crate) const EVICT_LOCK: &str = "evict.lock";
/// The size file is held for microseconds; waiting longer than this means something is badly wrong,
/// and the update is dropped (the next eviction pass corrects the total).
const SIZE_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// What an eviction pass should remove.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Remove least recently accessed entries until the total is at or under this.
    pub target: Option<u64>,
    /// Remove every entry last accessed before this.
    pub older_than: Option<SystemTime>,
    /// Wait (up to the lock timeout) for another evictor instead of skipping.
    pub wait: bool,
    /// Leave the sweep (emptied directories, trash) to a background thread, which keeps the eviction
    /// lock until it is done, instead of doing it before returning.
    pub defer_sweep: bool,
}

/// What one eviction pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvictReport {
    /// Whether the pass ran (false: another process was evicting and this one did not wait for it).
    pub ran: bool,
    /// Complete entries removed.
    pub removed: u64,
    /// Bytes they occupied.
    pub removed_bytes: u64,
    /// Incomplete slots removed (temporaries or half-published files of killed writers).
    pub stale_removed: u64,
    /// Slots skipped because another process was writing or removing them.
    pub busy: u64,
    /// Empty directories removed (0 when the sweep was deferred: see `sweep_deferred`).
    pub dirs_removed: u64,
    /// Whether removing emptied directories and deleting the removed files' trash was left to a
    /// background thread ([`PersistentCache::wait_for_eviction`](super::PersistentCache::wait_for_eviction)
    /// waits for it).
    pub sweep_deferred: bool,
    /// Complete entries left.
    pub remaining_entries: u64,
    /// Bytes left (all files of every leaf), as measured by the walk.
    pub remaining_bytes: u64,
}

/// What became of one entry the pass tried to remove.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    Removed(u64),
    Gone,
    Busy,
    Failed,
}

/// The total in the size file, if it exists and parses.
pub(crate) fn read_size_file(v1: &Path) -> Option<u64> {
    fs::read_to_string(v1.join(SIZE_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Moves the files of published slot `n` (the caller holds its lock) into the trash, `.src` first so
/// readers stop finding it before the binary goes. The scan already knows which files exist and their
/// sizes, so this is two renames, not a probe per possible file. `None` when the entry was removed
/// meanwhile.
fn remove_published(
    trash: &mut Trash,
    leaf: &Path,
    n: u32,
    f: &SlotFiles,
) -> io::Result<Option<u64>> {
    match trash.take(&slot_file(leaf, n, "src")) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut gone = vec!["bin"];
    if f.tmp {
        gone.extend(["src.tmp", "bin.tmp"]);
    }
    // A per-slot lock file of a cache written before the leaf lock.
    if f.lock {
        gone.push("lock");
    }
    for ext in gone {
        match trash.take(&slot_file(leaf, n, ext)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // The entry is already invisible (no .src); what is left is an orphan a later pass removes.
            Err(_) => {}
        }
    }
    Ok(Some(f.bytes()))
}

impl Inner {
    /// Applies `f` to the tracked total under the size file's lock and stores the result. `f` gets
    /// `None` when the file is missing or unreadable. Returns the new total, or `None` when the file
    /// cannot be updated (unwritable cache): the next eviction pass measures the truth anyway.
    fn update_size(&self, f: impl FnOnce(Option<u64>) -> u64) -> Option<u64> {
        if !self.v1.is_dir() {
            return None;
        }
        let path = self.v1.join(SIZE_FILE);
        let lock = match lock::lock_with_timeout(&path, false, SIZE_LOCK_TIMEOUT, || Ok(())) {
            Ok(Waited::Acquired { lock, .. }) => lock,
            Ok(Waited::TimedOut) => return None,
            Err(e) => {
                self.warn_io(&e, &path, "cannot update the size file");
                return None;
            }
        };
        let mut file = lock.file();
        let mut s = String::new();
        let cur = file
            .seek(SeekFrom::Start(0))
            .and_then(|_| file.read_to_string(&mut s))
            .ok()
            .and_then(|_| s.trim().parse::<u64>().ok());
        let new = f(cur);
        let w = file
            .set_len(0)
            .and_then(|_| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(format!("{new}\n").as_bytes()));
        match w {
            Ok(()) => Some(new),
            Err(e) => {
                self.warn_io(&e, &path, "cannot update the size file");
                None
            }
        }
    }

    /// Adds `delta` bytes to the tracked total and returns the new total. A missing size file (new
    /// cache, or deleted by hand) is rebuilt by measuring the tree, which already includes the change.
    pub(crate) fn add_size(&self, delta: i64) -> Option<u64> {
        self.update_size(|cur| match cur {
            Some(c) => c.saturating_add_signed(delta),
            None => self.measure(),
        })
    }

    fn measure(&self) -> u64 {
        scan(&self.v1)
            .map(|leaves| leaves.iter().map(LeafScan::bytes).sum())
            .unwrap_or(0)
    }

    pub(crate) fn evict(&self, plan: Plan) -> io::Result<EvictReport> {
        let mut report = EvictReport::default();
        if !self.v1.is_dir() {
            report.ran = true;
            return Ok(report);
        }
        let lock_path = self.v1.join(EVICT_LOCK);
        let evictor = if plan.wait {
            match lock::lock_with_timeout(&lock_path, false, self.s.lock_timeout, || Ok(()))? {
                Waited::Acquired { lock, .. } => lock,
                Waited::TimedOut => return Ok(report),
            }
        } else {
            match lock::try_lock(&lock_path, false)? {
                Some(l) => l,
                None => return Ok(report),
            }
        };
        report.ran = true;
        let mut trash = Trash::new(&self.s.root, 0);
        let tracked_before = read_size_file(&self.v1);
        let (leaves, children, bare) = scan_tree(&self.v1)?;
        let mut total: u64 = leaves.iter().map(LeafScan::bytes).sum();
        // Slots (of any state) still present per leaf: a leaf at zero is removed with its emptied parents.
        let mut alive: Vec<usize> = leaves.iter().map(|l| l.slots.len()).collect();

        // Incomplete slots: temporaries and half-published files of killed writers, and per-slot lock
        // files older caches left. A slot whose leaf's lock is held may be being written: skipped.
        for (li, leaf) in leaves.iter().enumerate() {
            for (&n, f) in &leaf.slots {
                if f.complete() && !f.tmp {
                    continue;
                }
                match lock::try_lock_leaf(&leaf.path) {
                    Ok(Some(_leaf)) => {
                        let published = slot_file(&leaf.path, n, "src").exists()
                            && slot_file(&leaf.path, n, "bin").exists();
                        if f.complete() || published {
                            continue;
                        }
                        if let Ok(freed) = remove_slot_files(&leaf.path, n) {
                            total = total.saturating_sub(freed);
                            alive[li] -= 1;
                            if freed > 0 {
                                report.stale_removed += 1;
                            }
                        }
                    }
                    Ok(None) => report.busy += 1,
                    Err(_) => {}
                }
            }
        }

        // Complete entries, least recently accessed first.
        let mut cands: Vec<(FileTime, usize, u32)> = leaves
            .iter()
            .enumerate()
            .flat_map(|(li, l)| {
                l.slots
                    .iter()
                    .filter(|(_, f)| f.complete())
                    .map(move |(&n, f)| (f.bin.expect("complete").atime, li, n))
            })
            .collect();
        cands.sort_unstable();
        let cutoff = plan.older_than.map(FileTime::from_system_time);
        // Sorted by access time, so once an entry is neither needed for the target nor old, no later
        // one is either.
        let wanted = |atime: FileTime, total: u64| {
            plan.target.is_some_and(|t| total > t) || cutoff.is_some_and(|c| atime < c)
        };
        let mut remaining = cands.len() as u64;
        let mut apply = |li: usize, o: Outcome, total: &mut u64, report: &mut EvictReport| match o {
            Outcome::Removed(freed) => {
                *total = total.saturating_sub(freed);
                report.removed += 1;
                report.removed_bytes += freed;
                remaining -= 1;
                alive[li] -= 1;
            }
            // Removed by someone else (a reader that found it corrupt) since the walk.
            Outcome::Gone => {
                remaining -= 1;
                alive[li] -= 1;
            }
            Outcome::Busy => report.busy += 1,
            Outcome::Failed => {}
        };
        // What the pass removes if no entry is busy: removed together, on a few threads when there
        // are many (the removals are independent system calls).
        let mut k = 0;
        let mut t = total;
        while k < cands.len() && wanted(cands[k].0, t) {
            let (_, li, n) = cands[k];
            t = t.saturating_sub(leaves[li].slots[&n].bytes());
            k += 1;
        }
        let outcomes = self.remove_many(&cands[..k], &leaves, &mut trash);
        for (&(_, li, _), o) in cands[..k].iter().zip(outcomes) {
            apply(li, o, &mut total, &mut report);
        }
        // Busy entries can leave the total over the target: carry on down the list.
        for &(atime, li, n) in &cands[k..] {
            if !wanted(atime, total) {
                break;
            }
            let o = self.remove_candidate(&mut trash, &leaves[li], n);
            apply(li, o, &mut total, &mut report);
        }

        // Directories left empty, leaves found empty included (a killed process's, or emptied by
        // readers), are the sweep's, with the trash.
        let sweep = Sweep {
            root: self.s.root.clone(),
            leaves: leaves
                .iter()
                .zip(&alive)
                .filter(|&(_, &a)| a == 0)
                .map(|(l, _)| (l.path.clone(), l.key_lock))
                .chain(bare.into_iter().map(|d| (d, false)))
                .collect(),
            children,
        };

        bump(&self.counters.evictions, report.removed);
        bump(&self.counters.evicted_bytes, report.removed_bytes);
        report.remaining_entries = remaining;
        report.remaining_bytes = total;
        // The walk measured the truth; keep what other processes added or removed while it ran.
        self.update_size(|now| match (now, tracked_before) {
            (Some(now), Some(before)) => total.saturating_add_signed(now as i64 - before as i64),
            _ => total,
        });
        self.trace(|| {
            tracing::debug!(target: "kpc::cache::disk", removed = report.removed, bytes = report.removed_bytes,
                stale = report.stale_removed, busy = report.busy, remaining = total, "eviction pass")
        });
        let trace = self.s.trace;
        let sweep_now = move || {
            let r = sweep.run();
            if trace {
                tracing::debug!(target: "kpc::cache::disk", dirs = r.dirs_removed, trash = r.trash_removed,
                    "eviction sweep");
            }
            // The eviction lock is released only now: no other pass fills a trash directory while the
            // sweep deletes them, and no two sweeps race.
            drop(evictor);
            r
        };
        if plan.defer_sweep {
            let spawned = std::thread::Builder::new()
                .name("kpc-disk-sweep".into())
                .spawn(move || {
                    sweep_now();
                });
            match spawned {
                Ok(h) => {
                    // A previous sweep's handle is finished: it held the lock this pass now holds.
                    drop(self.evict_thread.lock().replace(h));
                    report.sweep_deferred = true;
                }
                Err(e) => self.warn_io(&e, &self.v1, "cannot start the eviction sweep"),
            }
        } else {
            report.dirs_removed = sweep_now().dirs_removed;
        }
        Ok(report)
    }

    /// Removes the complete entries `cands` (access time, leaf index, slot) of `leaves`, returning what
    /// became of each, in order.
    fn remove_many(
        &self,
        cands: &[(FileTime, usize, u32)],
        leaves: &[LeafScan],
        trash: &mut Trash,
    ) -> Vec<Outcome> {
        let workers = workers_for(cands.len());
        let one = |trash: &mut Trash, chunk: &[(FileTime, usize, u32)]| -> Vec<Outcome> {
            chunk
                .iter()
                .map(|&(_, li, n)| self.remove_candidate(trash, &leaves[li], n))
                .collect()
        };
        if workers == 1 {
            return one(trash, cands);
        }
        std::thread::scope(|sc| {
            let handles: Vec<_> = cands
                .chunks(cands.len().div_ceil(workers))
                .enumerate()
                .map(|(i, chunk)| {
                    // One trash directory per thread: renames into one directory serialize on its lock.
                    let mut trash = Trash::new(&self.s.root, i);
                    sc.spawn(move || one(&mut trash, chunk))
                })
                .collect();
            handles
                .into_iter()
                .zip(cands.chunks(cands.len().div_ceil(workers)))
                .flat_map(|(h, chunk)| {
                    h.join()
                        .unwrap_or_else(|_| vec![Outcome::Failed; chunk.len()])
                })
                .collect()
        })
    }

    /// Removes one complete entry under its leaf's lock.
    fn remove_candidate(&self, trash: &mut Trash, leaf: &LeafScan, n: u32) -> Outcome {
        let path = &leaf.path;
        match lock::try_lock_leaf(path) {
            Ok(Some(_leaf)) => match remove_published(trash, path, n, &leaf.slots[&n]) {
                Ok(Some(freed)) => {
                    self.trace(|| {
                        tracing::debug!(target: "kpc::cache::disk", path = %path.display(), slot = n,
                            bytes = freed, "evict")
                    });
                    Outcome::Removed(freed)
                }
                Ok(None) => Outcome::Gone,
                Err(e) => {
                    self.warn_io(&e, path, "cannot evict an entry");
                    Outcome::Failed
                }
            },
            Ok(None) => Outcome::Busy,
            Err(e) => {
                self.warn_io(&e, path, "cannot evict an entry");
                Outcome::Failed
            }
        }
    }

    pub(super) fn maybe_evict(self: &Arc<Inner>, total: u64) {
        if self.s.max_size == 0 || total <= self.s.max_size {
            return;
        }
        // One pass per instance at a time; the evict.lock file does the same across processes.
        if self.evicting.swap(true, Ordering::AcqRel) {
            return;
        }
        let plan = Plan {
            target: Some(self.low_watermark()),
            older_than: None,
            wait: false,
            // Already on a background thread when background_eviction is set.
            defer_sweep: false,
        };
        let run = move |me: &Inner| {
            if let Err(e) = me.evict(plan) {
                me.warn_io(&e, &me.v1, "eviction failed");
            }
            me.evicting.store(false, Ordering::Release);
        };
        if self.s.background_eviction {
            let me = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("kpc-disk-evict".into())
                .spawn(move || run(&me));
            match spawned {
                // A previous pass's handle is dropped (detached): it has finished, or it would still hold
                // `evicting`.
                Ok(h) => drop(self.evict_thread.lock().replace(h)),
                Err(_) => run(self),
            }
        } else {
            run(self);
        }
    }

    fn low_watermark(&self) -> u64 {
        (self.s.max_size as u128 * self.s.low_watermark_percent.min(100) as u128 / 100) as u64
    }
}
