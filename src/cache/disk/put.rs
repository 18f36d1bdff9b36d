//! The write side of the protocol: the build guard a miss hands out, creating the leaf directories,
//! picking a free slot under its lock, and publishing an entry atomically.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::count::{Delta, SizeRecord};
use super::entry::{FileKind, HEADER_LEN, encode_header};
use super::lock::{HeldLock, Waited};
use super::names;
use super::slot::{holds_valid, slot_file, sync_dir, write_file};
use super::stats::bump;
use super::{Inner, MAX_SLOTS, PersistentCache, StoreKey};
use crate::cache::store::outcome::PutOutcome;
use crate::cache::store::provenance::Provenance;
use crate::cache::store::warn::WarnCause;

/// The right, and the duty, to build one key. Holds the key's cross-process build lock (when it could be
/// taken) until it drops: the chain puts the build, then drops it; dropped without a put (the build
/// failed), it lets a waiting process take over.
pub(crate) struct BuildGuard {
    pub(super) cache: PersistentCache,
    // Boxed: a key is a few hundred bytes and a miss is the rare case, so `Lookup` stays small.
    pub(super) key: Box<StoreKey>,
    pub(super) lock: Option<HeldLock>,
    pub(super) persist: bool,
}

impl fmt::Debug for BuildGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuildGuard")
            .field("key", &self.key.digest())
            .field("holds_lock", &self.lock.is_some())
            .field("persist", &self.persist)
            .finish()
    }
}

impl BuildGuard {
    /// Whether this guard holds the key's build lock (false after a lock timeout, on an unwritable cache,
    /// or when the key is not persisted at all).
    pub fn holds_lock(&self) -> bool {
        self.lock.is_some()
    }

    /// Whether a put would be attempted at all (false when the image size is outside the limits).
    pub fn persists(&self) -> bool {
        self.persist
    }
}

impl Drop for BuildGuard {
    /// A guard dropped without a publish (the build failed, or its caller gave up) made the key's
    /// leaf directory chain for its lock and leaves nothing in it: removed, so a failed key leaves no
    /// empty directories behind (they are invisible to `ls`, `stats` and `verify`).
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            drop(lock);
            self.cache.inner.remove_empty_chain(&self.key);
        }
    }
}

impl PersistentCache {
    /// Stores `bytes` (built in `build_time`) under `key` without taking the build lock. Never fails the
    /// caller; see [`PutOutcome`].
    pub fn put(&self, key: &StoreKey, bytes: &[u8], build_time: Duration) -> PutOutcome {
        if !self.persists_image_of_size(key.image_len()) {
            bump(&self.inner.counters.skipped, 1);
            return PutOutcome::Skipped;
        }
        let built_here = self.built_here(key, build_time);
        self.inner.put(key, bytes, build_time, Some(&built_here))
    }

    /// Stores `bytes` copied from elsewhere (a lower store, a bundle) under `key`, recording the
    /// original builder's `provenance` (none if unknown) instead of this machine. Never fails the
    /// caller.
    pub fn put_copy(
        &self,
        key: &StoreKey,
        bytes: &[u8],
        build_time: Duration,
        provenance: Option<&Provenance>,
    ) -> PutOutcome {
        if !self.persists_image_of_size(key.image_len()) {
            bump(&self.inner.counters.skipped, 1);
            return PutOutcome::Skipped;
        }
        self.inner.put(key, bytes, build_time, provenance)
    }

    /// The provenance of a binary this process built just now.
    fn built_here(&self, key: &StoreKey, build_time: Duration) -> Provenance {
        Provenance::for_key(&self.inner.s.host_id, key, None, build_time)
    }
}

impl Inner {
    /// Creates the leaf directory of `key` (and its parents). Retries a few times because an evictor may
    /// remove an emptied parent between our mkdir calls.
    pub(super) fn ensure_leaf(&self, key: &StoreKey) -> io::Result<PathBuf> {
        let leaf = self.leaf(key);
        if leaf.is_dir() {
            return Ok(leaf);
        }
        let mut last = None;
        for _ in 0..4 {
            match self.create_chain(key) {
                Ok(()) => return Ok(leaf),
                Err(e) if e.kind() == io::ErrorKind::NotFound => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::NotFound)))
    }

    fn create_chain(&self, key: &StoreKey) -> io::Result<()> {
        if !self.s.root.is_dir() {
            fs::create_dir_all(&self.s.root)?;
        }
        let mut dir = self.v1.clone();
        let mut created = Vec::new();
        let mut make = |d: &Path| match fs::create_dir(d) {
            Ok(()) => {
                created.push(d.to_owned());
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        };
        make(&dir)?;
        for (level, name) in key.dir_names().iter().enumerate() {
            dir.push(name);
            if level == 1 && !dir.is_dir() {
                self.index_image(key);
            }
            make(&dir)?;
        }
        if self.s.sync {
            // A new directory's own entry must reach the disk too, or a crash could lose the whole leaf.
            for d in &created {
                if let Some(p) = d.parent() {
                    sync_dir(p)?;
                }
            }
        }
        Ok(())
    }

    /// Records in the name index that `key`'s image directory is being made, before it is (see
    /// `names.rs`). Best effort: without the line, only a later miss explanation falls short.
    fn index_image(&self, key: &StoreKey) {
        let [dev, img, ..] = key.dir_names();
        if let Err(e) = names::record(&self.v1, dev, img, key.label()) {
            self.trace(|| {
                tracing::debug!(target: "kpc::cache::disk", image = img.as_str(), error = %e,
                    "name index not updated")
            });
        }
    }

    fn put(
        self: &Arc<Inner>,
        key: &StoreKey,
        bytes: &[u8],
        build_time: Duration,
        provenance: Option<&Provenance>,
    ) -> PutOutcome {
        let src = key.record_json(build_time, bytes.len() as u64, provenance);
        let total = (2 * HEADER_LEN + src.len() + bytes.len()) as u64;
        if self.s.max_size > 0 && total > self.s.max_size {
            bump(&self.counters.skipped, 1);
            self.warned.warn(
                &self.s.warnings,
                WarnCause::TooLarge,
                &self.s.root,
                &format_args!(
                    "an entry of {total} bytes cannot fit in KPC_CACHE_MAX_SIZE={}",
                    self.s.max_size
                ),
            );
            return PutOutcome::Skipped;
        }
        if let Some(why) = self.under_floor(total) {
            bump(&self.counters.skipped, 1);
            self.warned
                .warn(&self.s.warnings, WarnCause::LowSpace, &self.s.root, &why);
            return PutOutcome::Skipped;
        }
        let fail = |e: &io::Error, path: &Path| {
            bump(&self.counters.failed_puts, 1);
            self.warn_io(e, path, "cannot store an entry");
            PutOutcome::Failed
        };
        let mut tries = 0;
        loop {
            let leaf = match self.ensure_leaf(key) {
                Ok(l) => l,
                Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 16 => {
                    tries += 1;
                    continue;
                }
                Err(e) => return fail(&e, &self.leaf(key)),
            };
            if self.find(&leaf, key, false, true).is_some() {
                return PutOutcome::AlreadyPresent;
            }
            match self.put_in_leaf(&leaf, key, bytes, &src, total) {
                Ok(outcome) => return outcome,
                // The leaf was removed by an evictor's sweep under us: make it again. Under constant
                // eviction (a tiny limit, many writers) that can happen several times in a row.
                Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 16 => tries += 1,
                Err(e) => return fail(&e, &leaf),
            }
        }
    }

    fn put_in_leaf(
        self: &Arc<Inner>,
        leaf: &Path,
        key: &StoreKey,
        bytes: &[u8],
        src: &[u8],
        total: u64,
    ) -> io::Result<PutOutcome> {
        // Waits for another writer (a colliding key) or a remover of this leaf: both hold the lock
        // for a few file operations only.
        let held = self.locks.leaf(leaf, self.s.lock_timeout, || {
            self.ensure_leaf(key).map(drop)
        })?;
        let Waited::Acquired {
            lock: leaf_lock, ..
        } = held
        else {
            bump(&self.counters.skipped, 1);
            self.warned.warn(
                &self.s.warnings,
                WarnCause::LockTimeout,
                leaf,
                &format_args!(
                    "another process held a leaf directory's lock for longer than {:?}",
                    self.s.lock_timeout
                ),
            );
            return Ok(PutOutcome::Skipped);
        };
        // Whoever held the lock before us may have published this very key (a put without the build
        // lock, racing with ours): look again, now that nobody can publish meanwhile.
        if holds_valid(leaf, key) {
            return Ok(PutOutcome::AlreadyPresent);
        }
        for n in 0..MAX_SLOTS {
            if slot_file(leaf, n, "src").exists() {
                continue;
            }
            // Temporaries of a writer killed mid-way, and the per-slot lock file of caches written
            // before the leaf lock; the leaf lock says nobody is working on them. (An orphan `.bin`
            // is counted, and replaced by the publish as a counted change.)
            for ext in ["src.tmp", "bin.tmp", "lock"] {
                match fs::remove_file(slot_file(leaf, n, ext)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            let now = self.publish(leaf, n, key, bytes, src)?;
            bump(&self.counters.puts, 1);
            bump(&self.counters.bytes_written, total);
            self.trace(|| {
                tracing::debug!(target: "kpc::cache::disk", key = %key.digest(), label = key.label(),
                    slot = n, bytes = total, "put")
            });
            drop(leaf_lock);
            match now {
                Some(r) if !self.over_limits(&r) => {}
                // Over a limit, or the record needs measuring and nobody could yet.
                _ => self.request_pass(),
            }
            return Ok(PutOutcome::Published(n));
        }
        bump(&self.counters.skipped, 1);
        self.warned.warn(
            &self.s.warnings,
            WarnCause::Io,
            leaf,
            &format_args!("all {MAX_SLOTS} slots of a leaf directory are taken"),
        );
        Ok(PutOutcome::Skipped)
    }

    /// Writes the entry's temporaries, then makes them visible as one counted change (`count.rs`):
    /// `.bin` first, since a reader goes through `.src`, so once `.src` is visible its `.bin` already
    /// is. Returns the new size record (`None`: the record needs measuring).
    fn publish(
        &self,
        leaf: &Path,
        n: u32,
        key: &StoreKey,
        bytes: &[u8],
        src: &[u8],
    ) -> io::Result<Option<SizeRecord>> {
        let digest = key.digest().0;
        let (bin_tmp, src_tmp) = (slot_file(leaf, n, "bin.tmp"), slot_file(leaf, n, "src.tmp"));
        let (bin, srcp) = (slot_file(leaf, n, "bin"), slot_file(leaf, n, "src"));
        let cleanup = || {
            let _ = fs::remove_file(&bin_tmp);
            let _ = fs::remove_file(&src_tmp);
        };
        let bin_header = encode_header(FileKind::Bin, &digest, bytes);
        let written = write_file(&bin_tmp, &bin_header, bytes, self.s.sync).and_then(|()| {
            write_file(
                &src_tmp,
                &encode_header(FileKind::Src, &digest, src),
                src,
                self.s.sync,
            )
        });
        if let Err(e) = written {
            cleanup();
            return Err(e);
        }
        let bin_len = (bin_header.len() + bytes.len()) as i64;
        let src_len = (HEADER_LEN + src.len()) as i64;
        let counted = self.counted(|| {
            // An orphan `.bin` a killed writer left in this slot is replaced by the rename.
            let old = fs::symlink_metadata(&bin).map_or(0, |m| m.len() as i64);
            let bytes = |bytes| Delta { bytes, entries: 0 };
            if let Err(e) = fs::rename(&bin_tmp, &bin) {
                return (Err(e), bytes(0));
            }
            if let Err(e) = fs::rename(&src_tmp, &srcp) {
                return match fs::remove_file(&bin) {
                    Ok(()) => (Err(e), bytes(-old)),
                    Err(_) => (Err(e), bytes(bin_len - old)),
                };
            }
            // The slot had no `.src` (the caller checked, under the leaf's lock): one entry more.
            let d = Delta {
                bytes: bin_len + src_len - old,
                entries: 1,
            };
            (Ok(()), d)
        });
        let Some((r, now)) = counted else {
            cleanup();
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the size file could not be locked",
            ));
        };
        if let Err(e) = r {
            cleanup();
            return Err(e);
        }
        if self.s.sync {
            sync_dir(leaf)?;
        }
        Ok(now)
    }
}
