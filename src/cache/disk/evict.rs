//! Eviction by last access.
//!
//! Eviction is one pass: walk every leaf once (`walk.rs`: four levels of `read_dir` plus one `stat` per
//! file), settle the size record against the walk (`count.rs`), remove incomplete slots nobody is
//! writing, then remove complete entries in order of their `.bin`'s access time until the tracked
//! total is at or under the target, by renaming their files into the pass's trash (`trash.rs`: freeing
//! blocks is what costs on ext4, and a rename frees none), and subtract exactly what was moved. The
//! chosen entries are removed on a few threads when there are many. A sweep then removes the
//! directories left empty and deletes the trash: before the pass returns, or on a background thread
//! that keeps the eviction lock when the caller deferred it. Every removal takes the leaf's lock first
//! (try-only), so an entry being written, or being removed by someone else, is skipped rather than
//! waited for; a pass a put asked for then waits for those leaves if it is still over its target and
//! its thread holds no leaf's lock itself. Only one process evicts (or sweeps) at a time: it holds
//! `<root>/v1/evict.lock`; how the others wait for it, or leave `evict.recheck` for its holder, is in
//! `schedule.rs`.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use filetime::FileTime;

use super::Inner;
use super::count::{Freed, SizeRecord, counted_bytes, counted_entries, remove_slot_counted};
use super::lock::{self, Asker, RECHECK_FILE, Waited};
use super::slot::slot_file;
use super::stats::bump;
use super::trash::{Sweep, Trash};
use super::walk::{LeafScan, SlotFiles, Tree, scan_tree, workers_for};

/// What an eviction pass should remove.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Remove least recently accessed entries until the total is at or under this.
    pub target: Option<u64>,
    /// Remove least recently accessed entries until at most this many are left
    /// (`KPC_CACHE_MAX_ENTRIES`).
    pub target_entries: Option<u64>,
    /// Remove every entry last accessed before this.
    pub older_than: Option<SystemTime>,
    /// Wait (up to the lock timeout) for another evictor instead of skipping.
    pub wait: bool,
    /// Leave the sweep (emptied directories, trash) to a background thread, which keeps the eviction
    /// lock until it is done, instead of doing it before returning.
    pub defer_sweep: bool,
    /// A pass a change asked for (`schedule.rs`): once it holds `evict.lock` it runs only if the record
    /// still calls for one, and if it never gets the lock it leaves the recheck flag for the holder.
    pub asked: bool,
    /// Wait (up to the lock timeout) for leaves whose holders keep entries the target needs, instead of
    /// skipping them: for a thread that holds no leaf's lock itself.
    pub wait_busy: bool,
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

/// Moves the files of published slot `n` (the caller holds its lock) into the trash, `.src` first so
/// readers stop finding it before the binary goes. The scan already knows which files exist, so this is
/// two renames, not a probe per possible file. Returns the counted bytes moved (each file measured as
/// it moves); `None` when the entry was removed meanwhile.
fn remove_published(
    trash: &mut Trash,
    leaf: &Path,
    n: u32,
    f: &SlotFiles,
) -> io::Result<Option<u64>> {
    let mut freed = match trash.take(&slot_file(leaf, n, "src")) {
        Ok(len) => len,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // The entry is already invisible (no .src); an orphan .bin left by a failed rename stays
    // counted, and a later pass removes it (and subtracts it then).
    if let Ok(len) = trash.take(&slot_file(leaf, n, "bin")) {
        freed += len;
    }
    if f.tmp {
        for ext in ["src.tmp", "bin.tmp"] {
            let _ = trash.take(&slot_file(leaf, n, ext));
        }
    }
    // A per-slot lock file of a cache written before the leaf lock (empty, not counted).
    if f.lock {
        let _ = trash.take(&slot_file(leaf, n, "lock"));
    }
    Ok(Some(freed))
}

/// Creates `path` if it does not exist (a flag file).
fn touch(path: &Path) {
    let _ = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path);
}

impl Inner {
    /// The start of a pass's removals (the caller holds `evict.lock` and walked the tree after reading
    /// `before`): settles the record and sets its `evicting` flag. A record that is missing, dirty or
    /// still flagged by a dead pass is measured again (the walk is redone inside the size lock); one
    /// whose generation did not move during the walk is compared with it and corrected. Returns the
    /// tree to work from and the record the removals start from.
    fn settle_size(
        &self,
        before: Option<SizeRecord>,
        walked: Tree,
    ) -> io::Result<(Tree, SizeRecord)> {
        let lock = self.lock_size().ok_or_else(size_busy)?;
        let rec = lock.read();
        match rec {
            Some(r) if !r.dirty && !r.evicting => {
                let walk_total = counted_bytes(&walked.0);
                let walk_entries = counted_entries(&walked.0);
                let quiet = before.is_some_and(|b| b.generation == r.generation);
                let (total, entries) = if quiet
                    && (walk_total != r.total || walk_entries != r.entries)
                {
                    // Nothing counted changed during the walk, so the walk is the truth: the files
                    // changed behind the protocol's back (removed by hand).
                    bump(&self.counters.size_corrections, 1);
                    self.trace(|| {
                        tracing::debug!(target: "kpc::cache::disk", tracked = r.total, measured = walk_total,
                            "size file corrected")
                    });
                    (walk_total, walk_entries)
                } else {
                    (r.total, r.entries)
                };
                let settled = SizeRecord {
                    total,
                    entries,
                    generation: r.generation.wrapping_add(1),
                    dirty: false,
                    evicting: true,
                };
                lock.write(&settled)?;
                Ok((walked, settled))
            }
            _ => {
                let tree = self.recount(&lock, rec, true)?;
                let (total, entries) = (counted_bytes(&tree.0), counted_entries(&tree.0));
                Ok((tree, SizeRecord::clean(total, entries, 0)))
            }
        }
    }

    /// The end of a pass's removals: subtracts what was `removed` and clears the `evicting` flag.
    /// Returns the new total, or `None` when the record went bad meanwhile (a put died inside its
    /// change): the recheck flag is left then, so a pass measures it again once this one lets go of
    /// `evict.lock` (asked for now, it could only wait for this very pass).
    fn finish_size(&self, removed: Freed) -> Option<u64> {
        let lock = self.lock_size()?;
        let rec = lock.read().filter(|r| !r.dirty);
        let new = rec.map(|r| SizeRecord {
            total: r.total.saturating_sub(removed.bytes),
            entries: r.entries.saturating_sub(removed.entries),
            generation: r.generation.wrapping_add(1),
            dirty: false,
            evicting: false,
        });
        match new.map(|n| (lock.write(&n), n)) {
            Some((Ok(()), n)) => Some(n.total),
            Some((Err(e), _)) => {
                self.warn_io(&e, &self.v1, "cannot update the size file");
                None
            }
            None => {
                drop(lock);
                touch(&self.v1.join(RECHECK_FILE));
                None
            }
        }
    }

    /// Takes `evict.lock` as `plan` says. A pass that was asked for and does not get it (it may not
    /// wait, or waited past the lock timeout) leaves the recheck flag for the holder and tries once
    /// more (the holder may have let go before it could see the flag).
    fn take_evict_lock(&self, plan: &Plan) -> io::Result<Option<lock::HeldLock>> {
        let lock_path = self.locks.evict()?;
        if plan.wait {
            let waited =
                lock::lock_with_timeout(&lock_path, false, self.s.lock_timeout, || Ok(()))?;
            if let Waited::Acquired { lock, .. } = waited {
                return Ok(Some(lock));
            }
        } else if let Some(l) = lock::try_lock(&lock_path, false)? {
            return Ok(Some(l));
        }
        if !plan.asked {
            return Ok(None);
        }
        touch(&self.v1.join(RECHECK_FILE));
        lock::try_lock(&lock_path, false)
    }

    pub(crate) fn evict(self: &Arc<Inner>, plan: Plan) -> io::Result<EvictReport> {
        let mut report = EvictReport::default();
        if !self.v1.is_dir() {
            report.ran = true;
            return Ok(report);
        }
        let Some(evictor) = self.take_evict_lock(&plan)? else {
            return Ok(report);
        };
        // Whatever asked for a pass before this point is served by this one.
        let _ = fs::remove_file(self.v1.join(RECHECK_FILE));
        report.ran = true;
        // Another pass may have done the work while this one waited for the lock.
        if plan.asked && !self.pass_due() {
            self.release_evict_lock(evictor, Asker::Free);
            return Ok(report);
        }
        let mut trash = Trash::new(&self.s.root, 0);
        let before = self.lock_size().and_then(|l| l.read());
        let settled = scan_tree(&self.v1).and_then(|walked| self.settle_size(before, walked));
        let ((leaves, children, bare), start) = match settled {
            Ok(s) => s,
            Err(e) => {
                self.release_evict_lock(evictor, Asker::Free);
                return Err(e);
            }
        };
        let (mut total, mut count) = (start.total, start.entries);
        let mut removed_counted = Freed::default();
        // Slots (of any state) still present per leaf: a leaf at zero is removed with its emptied parents.
        let mut alive: Vec<usize> = leaves.iter().map(|l| l.slots.len()).collect();

        // Incomplete slots: temporaries and half-published files of killed writers, and per-slot lock
        // files older caches left. A slot whose leaf's lock is held may be being written: skipped.
        for (li, leaf) in leaves.iter().enumerate() {
            for (&n, f) in &leaf.slots {
                if f.complete() && !f.tmp {
                    continue;
                }
                match self.locks.try_leaf(&leaf.path) {
                    Ok(Some(_leaf)) => {
                        let published = slot_file(&leaf.path, n, "src").exists()
                            && slot_file(&leaf.path, n, "bin").exists();
                        if f.complete() || published {
                            continue;
                        }
                        let mut freed = Freed::default();
                        let r = remove_slot_counted(&leaf.path, n, &mut freed);
                        total = total.saturating_sub(freed.bytes);
                        count = count.saturating_sub(freed.entries);
                        removed_counted.bytes += freed.bytes;
                        removed_counted.entries += freed.entries;
                        if r.is_ok() {
                            alive[li] -= 1;
                            if freed.bytes > 0 || f.tmp {
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
        let wanted = |atime: FileTime, total: u64, count: u64| {
            plan.target.is_some_and(|t| total > t)
                || plan.target_entries.is_some_and(|t| count > t)
                || cutoff.is_some_and(|c| atime < c)
        };
        let mut remaining = cands.len() as u64;
        // What was removed (leaf, bytes), for the eviction record (`evicted.rs`).
        let mut evicted: Vec<(&Path, u64)> = Vec::new();
        let mut apply =
            |li: usize, o: Outcome, now: &mut (u64, u64), report: &mut EvictReport| match o {
                Outcome::Removed(freed) => {
                    evicted.push((leaves[li].path.as_path(), freed));
                    now.0 = now.0.saturating_sub(freed);
                    now.1 = now.1.saturating_sub(1);
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
        let (mut t, mut c) = (total, count);
        while k < cands.len() && wanted(cands[k].0, t, c) {
            let (_, li, n) = cands[k];
            t = t.saturating_sub(leaves[li].slots[&n].counted());
            c = c.saturating_sub(1);
            k += 1;
        }
        let outcomes = self.remove_many(&cands[..k], &leaves, &mut trash);
        let mut busy = Vec::new();
        let mut now = (total, count);
        for (&c, o) in cands[..k].iter().zip(outcomes) {
            if let Outcome::Busy = o {
                busy.push(c);
            }
            apply(c.1, o, &mut now, &mut report);
        }
        // Busy entries can leave the total over the target: carry on down the list.
        for &c in &cands[k..] {
            if !wanted(c.0, now.0, now.1) {
                break;
            }
            let o = self.remove_candidate(&mut trash, &leaves[c.1], c.2, None);
            if let Outcome::Busy = o {
                busy.push(c);
            }
            apply(c.1, o, &mut now, &mut report);
        }
        // Still over the target because of entries whose leaves were held: a writer between its
        // publish and its unlock, a reader repairing, or a child process forked while some thread held
        // the lock. Once writers stop nobody else comes back for these bytes, so a pass that may wait
        // does, oldest first, for at most the lock timeout in all.
        if plan.wait_busy {
            let deadline = Instant::now() + self.s.lock_timeout;
            for (atime, li, n) in busy {
                if !wanted(atime, now.0, now.1) {
                    break;
                }
                let o = self.remove_candidate(&mut trash, &leaves[li], n, Some(deadline));
                if let Outcome::Busy = o {
                    continue;
                }
                report.busy -= 1;
                apply(li, o, &mut now, &mut report);
            }
        }
        let total = now.0;
        removed_counted.bytes += report.removed_bytes;
        removed_counted.entries += report.removed;
        // A pass a put asked for evicts under KPC_CACHE_MAX_SIZE; an explicit one (prune) under its
        // own target, or none (by age, 0).
        let limit = if plan.asked {
            self.s.max_size
        } else {
            plan.target.unwrap_or(0)
        };
        self.record_evicted(&evicted, limit);

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
            locks: self.locks.clone(),
        };

        bump(&self.counters.evictions, report.removed);
        bump(&self.counters.evicted_bytes, report.removed_bytes);
        report.remaining_entries = remaining;
        report.remaining_bytes = self.finish_size(removed_counted).unwrap_or(total);
        self.trace(|| {
            tracing::debug!(target: "kpc::cache::disk", removed = report.removed, bytes = report.removed_bytes,
                stale = report.stale_removed, busy = report.busy, remaining = report.remaining_bytes,
                "eviction pass")
        });
        let me = Arc::clone(self);
        let sweep_now = move || {
            let r = sweep.run();
            me.trace(|| {
                tracing::debug!(target: "kpc::cache::disk", dirs = r.dirs_removed, trash = r.trash_removed,
                    "eviction sweep")
            });
            // The eviction lock is released only now: no other pass fills a trash directory while the
            // sweep deletes them, and no two sweeps race.
            me.release_evict_lock(evictor, Asker::Free);
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
                    self.keep_thread(h);
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
                .map(|&(_, li, n)| self.remove_candidate(trash, &leaves[li], n, None))
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

    /// Removes one complete entry under its leaf's lock: tried once, or waited for until `deadline`.
    fn remove_candidate(
        &self,
        trash: &mut Trash,
        leaf: &LeafScan,
        n: u32,
        deadline: Option<Instant>,
    ) -> Outcome {
        let path = &leaf.path;
        let held = match deadline {
            None => self.locks.try_leaf(path),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                let w = self
                    .locks
                    .leaf(path, left, || Err(io::ErrorKind::NotFound.into()));
                w.map(|w| match w {
                    Waited::Acquired { lock, .. } => Some(lock),
                    Waited::TimedOut => None,
                })
            }
        };
        match held {
            // Only a sweep removes a leaf, under `evict.lock`, which this pass holds: the leaf was
            // removed by hand, and the entry with it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Outcome::Gone,
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
}

fn size_busy() -> io::Error {
    io::Error::new(
        io::ErrorKind::WouldBlock,
        "the size file could not be locked",
    )
}
