//! The size file: the exact total of the bytes the cache holds, kept right under any interleaving of
//! puts, removals and eviction passes, in threads and processes.
//!
//! What counts: every `.src` and `.bin` file in the versioned tree, headers included, whether or not its
//! slot is complete; and, as the entry count (`KPC_CACHE_MAX_ENTRIES`), every `.src`. Not counted: temporaries (`*.tmp`, a write in progress, never visible to readers),
//! lock files (empty), the size file itself, and what lies outside `v1/` (the trash, the quarantine).
//!
//! # Protocol
//! The record is `<total> <generation> <flags> <entries>` in a fixed-width line, rewritten in place
//! (never truncated, so no update frees a block). Its file is also its lock (`flock`). A record
//! without the entry count (kpc before `KPC_CACHE_MAX_ENTRIES`) is unusable and measured again once.
//! - **A counted change** (a put's renames, a reader's removal of a corrupt entry, `remove`, a
//!   quarantine) runs *inside* the lock: mark the record dirty (one byte), change the files, write the
//!   new total with the flag cleared and the generation bumped. Between the change and its count
//!   nobody can read the total, so nothing is counted twice or missed. A process killed inside leaves
//!   the dirty flag, which the next eviction pass sees (the lock is a `flock`, so it is free again).
//! - **An eviction pass** removes many entries and must not hold the lock meanwhile (puts would wait for
//!   it). Under `evict.lock` it sets the `evicting` flag, renames its victims away, then subtracts
//!   exactly the bytes it removed (each file measured as it is moved) and clears the flag. Counted
//!   changes by others meanwhile keep the flag and add their deltas, which commute with the pass's. A
//!   pass that finds the flag set when it takes `evict.lock` knows the pass that set it died.
//! - **A missing or unusable record** (new cache, deleted, garbage, a dirty or evicting flag left by a
//!   dead process) is measured again exactly once, under `evict.lock` and inside the size lock, so no
//!   change can run between the walk and the write: by the change that finds it when `evict.lock` is
//!   free, else by the pass holding it. A change that cannot measure publishes without counting (the
//!   walk will see its files) and asks for a pass.
//! - **Drift from outside** (files removed by hand): a pass compares its walk with the record when the
//!   generation did not move during the walk (no counted change ran) and writes the walk's total if
//!   they differ, counting the correction ([`DiskStats::size_corrections`](super::DiskStats)).

use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::Inner;
use super::lock::{self, Asker, HeldLock};
use super::slot::slot_file;
use super::stats::bump;
use super::walk::{LeafScan, Tree, scan_tree};

pub(crate) const SIZE_FILE: &str = "size";
/// `<total:20> <generation:20> <dirty><evicting> <entries:20>\n`.
const RECORD_LEN: usize = 66;
const DIRTY_AT: u64 = 42;

/// The size file's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SizeRecord {
    /// Bytes of every counted file.
    pub total: u64,
    /// Entries: `.src` files.
    pub entries: u64,
    /// Bumped by every counted change: a pass whose walk saw it unchanged saw no change.
    pub generation: u64,
    /// A counted change was in progress (found by the next holder: its maker died).
    pub dirty: bool,
    /// An eviction pass is removing entries it has not subtracted yet.
    pub evicting: bool,
}

impl SizeRecord {
    /// A fresh record of `total` bytes in `entries` entries.
    pub fn clean(total: u64, entries: u64, generation: u64) -> SizeRecord {
        SizeRecord {
            total,
            entries,
            generation,
            dirty: false,
            evicting: false,
        }
    }

    /// Parses a record. One without an entry count (a bare number, or an older kpc's three fields) is
    /// unusable: `None`, so it is measured again.
    fn parse(s: &str) -> Option<SizeRecord> {
        let mut it = s.split_ascii_whitespace();
        let total = it.next()?.parse().ok()?;
        match (it.next(), it.next(), it.next(), it.next()) {
            (Some(g), Some(f), Some(n), None) => {
                let (dirty, evicting) = match f.as_bytes() {
                    [d @ (b'd' | b'-'), e @ (b'e' | b'-')] => (*d == b'd', *e == b'e'),
                    _ => return None,
                };
                Some(SizeRecord {
                    total,
                    entries: n.parse().ok()?,
                    generation: g.parse().ok()?,
                    dirty,
                    evicting,
                })
            }
            _ => None,
        }
    }

    fn encode(&self) -> String {
        format!(
            "{:020} {:020} {}{} {:020}\n",
            self.total,
            self.generation,
            if self.dirty { 'd' } else { '-' },
            if self.evicting { 'e' } else { '-' },
            self.entries
        )
    }
}

/// The size file, locked: through its own descriptor, or (with `KPC_CACHE_LOCK_DIR`) through a lock
/// file there, the record read and written through a descriptor of the size file.
pub(crate) struct SizeLock(HeldLock, Option<fs::File>);

impl SizeLock {
    fn file(&self) -> &fs::File {
        self.1.as_ref().unwrap_or_else(|| self.0.file())
    }

    /// The record, or `None` when it is missing or unusable.
    pub fn read(&self) -> Option<SizeRecord> {
        let mut buf = [0u8; 96];
        let n = self.file().read_at(&mut buf, 0).ok()?;
        if n == buf.len() {
            return None;
        }
        SizeRecord::parse(std::str::from_utf8(&buf[..n]).ok()?)
    }

    /// Replaces the record.
    pub fn write(&self, r: &SizeRecord) -> io::Result<()> {
        let f = self.file();
        let text = r.encode();
        debug_assert_eq!(text.len(), RECORD_LEN);
        f.write_all_at(text.as_bytes(), 0)?;
        // Only a record of another shape (an older kpc's, garbage) leaves a tail to cut.
        if f.metadata()?.len() != RECORD_LEN as u64 {
            f.set_len(RECORD_LEN as u64)?;
        }
        Ok(())
    }

    /// Sets the dirty flag of `r`, the record just read.
    fn mark_dirty(&self, r: &SizeRecord) -> io::Result<()> {
        let f = self.file();
        if f.metadata()?.len() == RECORD_LEN as u64 {
            f.write_all_at(b"d", DIRTY_AT)
        } else {
            self.write(&SizeRecord { dirty: true, ..*r })
        }
    }
}

/// The record of the cache at `v1`, read without the lock (an updater rewrites it in one `pwrite`):
/// `None` when missing or unusable.
pub(crate) fn read_record(v1: &Path) -> Option<SizeRecord> {
    SizeRecord::parse(&fs::read_to_string(v1.join(SIZE_FILE)).ok()?)
}

/// What the counted bytes of a tree are.
pub(crate) fn counted_bytes(leaves: &[LeafScan]) -> u64 {
    leaves.iter().map(LeafScan::counted).sum()
}

/// How many entries (`.src` files) a tree holds.
pub(crate) fn counted_entries(leaves: &[LeafScan]) -> u64 {
    leaves.iter().map(LeafScan::entries).sum()
}

/// A counted change: bytes and entries added (negative: removed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Delta {
    /// Counted bytes.
    pub bytes: i64,
    /// Entries (`.src` files).
    pub entries: i64,
}

/// What a removal freed: counted bytes and entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Freed {
    /// Counted bytes.
    pub bytes: u64,
    /// Entries (`.src` files).
    pub entries: u64,
}

impl Freed {
    /// The change this removal made.
    pub fn delta(self) -> Delta {
        Delta {
            bytes: -(self.bytes as i64),
            entries: -(self.entries as i64),
        }
    }
}

/// Removes the counted files of slot `n` (the caller holds the slot lock and the size lock), `.src`
/// first, and its temporaries. Adds to `freed` what it removes, also before an error.
pub(crate) fn remove_slot_counted(leaf: &Path, n: u32, freed: &mut Freed) -> io::Result<()> {
    for (ext, counted) in [
        ("src", true),
        ("bin", true),
        ("src.tmp", false),
        ("bin.tmp", false),
        // The per-slot lock file of caches written before the leaf lock: empty, not counted.
        ("lock", false),
    ] {
        let p = slot_file(leaf, n, ext);
        let len = match fs::symlink_metadata(&p) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        match fs::remove_file(&p) {
            Ok(()) if counted => {
                freed.bytes += len;
                freed.entries += u64::from(ext == "src");
            }
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Inner {
    /// Measures the tree inside the size lock (`lock`) and writes the truth, with the `evicting` flag
    /// as given. The caller holds `evict.lock`, so this runs once per need. Returns the walk.
    pub(crate) fn recount(
        &self,
        lock: &SizeLock,
        old: Option<SizeRecord>,
        evicting: bool,
    ) -> io::Result<Tree> {
        let tree = scan_tree(&self.v1)?;
        let total = counted_bytes(&tree.0);
        let entries = counted_entries(&tree.0);
        let generation = old.map_or(1, |r| r.generation.wrapping_add(1));
        lock.write(&SizeRecord {
            evicting,
            ..SizeRecord::clean(total, entries, generation)
        })?;
        bump(&self.counters.size_rebuilds, 1);
        self.trace(
            || tracing::debug!(target: "kpc::cache::disk", total, was = ?old, "size file rebuilt"),
        );
        Ok(tree)
    }

    /// Takes the size lock (creating the file), blocking: changes hold it for microseconds, a recount
    /// for one walk. `None`: the cache is unwritable or the file cannot be locked (warned).
    pub(crate) fn lock_size(&self) -> Option<SizeLock> {
        let path = self.v1.join(SIZE_FILE);
        let taken = self.locks.size().and_then(|relocated| match relocated {
            None => lock::lock_blocking(&path).map(|l| SizeLock(l, None)),
            Some(lp) => {
                let lock = lock::lock_blocking(&lp)?;
                let data = fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)?;
                Ok(SizeLock(lock, Some(data)))
            }
        });
        match taken {
            Ok(l) => Some(l),
            Err(e) => {
                self.warn_io(&e, &path, "cannot lock the size file");
                None
            }
        }
    }

    /// Makes a counted change: runs `change`, which changes counted files and returns its result and
    /// the change in counted bytes and entries, inside the size lock (see the module's protocol).
    /// Returns `None` without running `change` when the lock cannot be taken; otherwise its result and
    /// the new record, which is `None` when it needs the recount of the next eviction pass.
    pub(crate) fn counted<T>(
        &self,
        change: impl FnOnce() -> (T, Delta),
    ) -> Option<(T, Option<SizeRecord>)> {
        let lock = self.lock_size()?;
        let mut rec = lock.read();
        let mut evictor = None;
        if rec.is_none_or(|r| r.dirty || r.evicting) {
            (rec, evictor) = self.recount_if_free(&lock, rec);
        }
        let out = self.counted_under(&lock, rec, change);
        drop(lock);
        if let Some(e) = evictor {
            // A put holds its leaf's lock here, a removal its leaf's.
            self.release_evict_lock(e, Asker::HoldsLocks);
        }
        out
    }

    fn counted_under<T>(
        &self,
        lock: &SizeLock,
        rec: Option<SizeRecord>,
        change: impl FnOnce() -> (T, Delta),
    ) -> Option<(T, Option<SizeRecord>)> {
        let rec = rec.filter(|r| !r.dirty);
        if let Some(r) = &rec {
            if let Err(e) = lock.mark_dirty(r) {
                self.warn_io(&e, &self.v1, "cannot update the size file");
                return None;
            }
        }
        let (t, delta) = change();
        let Some(r) = rec else {
            return Some((t, None));
        };
        let new = SizeRecord {
            total: r.total.saturating_add_signed(delta.bytes),
            entries: r.entries.saturating_add_signed(delta.entries),
            generation: r.generation.wrapping_add(1),
            dirty: false,
            evicting: r.evicting,
        };
        match lock.write(&new) {
            Ok(()) => Some((t, Some(new))),
            // The dirty flag stays: the next pass measures the truth.
            Err(e) => {
                self.warn_io(&e, &self.v1, "cannot update the size file");
                Some((t, None))
            }
        }
    }

    /// A record that is missing, dirty or flagged `evicting`, found inside the size lock: when
    /// `evict.lock` is free (no pass is running, so a flag was left by a dead process), measures the
    /// tree now, under both locks, and returns the new record; otherwise returns `rec` as it is (a
    /// running pass settles it, see `settle_size` and `finish_size`).
    /// Returns the record and, when it took it, `evict.lock`, which the caller lets go of through
    /// `release_evict_lock` once it no longer holds the size lock.
    fn recount_if_free(
        &self,
        lock: &SizeLock,
        rec: Option<SizeRecord>,
    ) -> (Option<SizeRecord>, Option<HeldLock>) {
        let Ok(Some(evictor)) = self.locks.evict().and_then(|p| lock::try_lock(&p, false)) else {
            return (rec, None);
        };
        match self.recount(lock, rec, false) {
            Ok(_) => (lock.read(), Some(evictor)),
            Err(e) => {
                self.warn_io(&e, &self.v1, "cannot measure the cache");
                (rec, Some(evictor))
            }
        }
    }

    /// Removes slot `n` of `leaf` (the caller holds its lock) as a counted change. Returns the counted
    /// bytes freed; `None` when nothing could be removed.
    pub(crate) fn remove_slot(&self, leaf: &Path, n: u32) -> Option<u64> {
        let (r, _) = self.counted(|| {
            let mut freed = Freed::default();
            let r = remove_slot_counted(leaf, n, &mut freed);
            (r.map(|()| freed.bytes), freed.delta())
        })?;
        r.ok()
    }
}
