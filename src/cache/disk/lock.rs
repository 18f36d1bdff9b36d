//! Advisory file locks for the disk cache: `flock` through fd-lock, never `O_EXCL` lock files.
//!
//! A `flock` belongs to the open file description, so the kernel drops it when the holder's descriptor
//! is closed, including when the holder is killed: no lock outlives its process, and no writer ever
//! spins on a lock left by a dead one (the SYCL runtime's lock files have exactly that failure). Two
//! threads of one process that open the file separately also exclude each other, which the
//! in-process tests rely on.
//!
//! # The leaf lock
//! Every slot of a leaf directory is chosen, written and removed under one lock on the leaf: a `flock`
//! on the leaf directory itself ([`try_lock_leaf`]). It needs no file of its own, so a published entry
//! is its two files and nothing else. Where the file system cannot `flock` a directory (NFS emulates
//! `flock` with POSIX locks, which need a file open for writing), the lock is taken on
//! `<leaf>/leaf.lock` instead, created for the occasion and removed by its holder; which of the two a
//! file system takes never changes, so every process on it takes the same one.
//!
//! # Lock files
//! A lock file is removed only by a holder, while it holds it: the build lock (`key.lock`) when the
//! build ends, `leaf.lock` when its holder is done. A contender may have opened the old file just
//! before the unlink and then lock an inode no longer reachable by its path, which guards nothing; so
//! after every acquisition the path is checked to still name the locked inode, and on a mismatch the
//! contender opens the path again. The leaf directory is checked the same way, since a sweep may
//! remove an emptied leaf (under its lock) and a writer create it again. Because finished work takes
//! its lock files with it, emptied directories can be removed.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Held by the one process evicting or sweeping (`<root>/v1/evict.lock`).
pub(crate) const EVICT_LOCK: &str = "evict.lock";
/// Left by a pass that did not get [`EVICT_LOCK`] (it may not wait, or waited past the lock timeout);
/// the holder looks for it after letting go and runs again (`schedule.rs`), so a put that crossed the
/// limit while another process evicted is not lost.
pub(crate) const RECHECK_FILE: &str = "evict.recheck";

/// What a thread asking for an eviction pass holds, which decides whether a pass run on it may wait
/// for locks (`schedule.rs`): only one that holds none may, so no two waiters wait for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asker {
    /// No lock of the cache (a put that let go of its leaf, a pass or sweep letting go of `evict.lock`).
    Free,
    /// Perhaps a leaf's lock or a build lock (a counted change that took `evict.lock` to recount).
    HoldsLocks,
}

/// An exclusive advisory lock held on a file. Dropping it releases the lock, after unlinking the file
/// when it was taken as `ephemeral` (the caller is removing what the file guards, or the lock is the
/// build lock, which only exists while someone builds).
#[derive(Debug)]
pub(crate) struct HeldLock {
    file: Option<File>,
    path: PathBuf,
    ephemeral: bool,
}

impl HeldLock {
    /// The locked file itself (the size file is read and written through its lock's descriptor).
    pub fn file(&self) -> &File {
        self.file.as_ref().expect("present until drop")
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        if self.ephemeral {
            // Only a holder unlinks, and we hold it, so the path still names our inode.
            let _ = std::fs::remove_file(&self.path);
        }
        // Closing the descriptor releases the flock.
        drop(self.file.take());
    }
}

fn same_inode(file: &File, path: &Path) -> io::Result<bool> {
    let a = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(b) => Ok(a.ino() == b.ino() && a.dev() == b.dev()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Tries once (plus retries for a lock file that was unlinked under us) to lock `path` exclusively,
/// creating the file if needed. `Ok(None)` means another holder has it.
pub(crate) fn try_lock(path: &Path, ephemeral: bool) -> io::Result<Option<HeldLock>> {
    // Each retry means some other holder released and unlinked the file between our open and our
    // lock; a handful of retries in a row means heavy churn, which callers treat like "busy".
    for _ in 0..8 {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut rw = fd_lock::RwLock::new(file);
        match rw.try_write() {
            // The guard would unlock on drop; the lock must instead live as long as the descriptor, which
            // HeldLock owns, so the guard is forgotten (it owns nothing but a borrow).
            Ok(guard) => std::mem::forget(guard),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        }
        let file = rw.into_inner();
        if same_inode(&file, path)? {
            return Ok(Some(HeldLock {
                file: Some(file),
                path: path.to_owned(),
                ephemeral,
            }));
        }
    }
    Ok(None)
}

/// Locks `path` exclusively, blocking until it is free: for the size file, whose holders keep it for
/// microseconds (a recount, for one walk). A blocking `flock` queues in the kernel, where polling would
/// let a steady stream of short holders starve a waiter on a loaded machine. Creates the file if needed.
pub(crate) fn lock_blocking(path: &Path) -> io::Result<HeldLock> {
    for _ in 0..8 {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut rw = fd_lock::RwLock::new(file);
        loop {
            match rw.write() {
                // As in `try_lock`: the lock lives as long as the descriptor HeldLock owns.
                Ok(guard) => {
                    std::mem::forget(guard);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let file = rw.into_inner();
        if same_inode(&file, path)? {
            return Ok(HeldLock {
                file: Some(file),
                path: path.to_owned(),
                ephemeral: false,
            });
        }
    }
    Err(io::Error::new(
        io::ErrorKind::WouldBlock,
        format!("{} kept being replaced while locking it", path.display()),
    ))
}

/// What waiting for a lock came to.
#[derive(Debug)]
pub(crate) enum Waited {
    /// Acquired; `waited` tells whether it was busy at first.
    Acquired { lock: HeldLock, waited: bool },
    /// Still busy when the timeout passed.
    TimedOut,
}

/// Locks `path`, polling while another holder has it, for at most `timeout`.
///
/// fd-lock has no timed lock and a blocking `flock` cannot be abandoned, so this polls with a
/// backoff from 1 ms to 20 ms: a waiter notices a release within 20 ms, which is small next to any
/// build worth persisting.
pub(crate) fn lock_with_timeout(
    path: &Path,
    ephemeral: bool,
    timeout: Duration,
    on_retry: impl FnMut() -> io::Result<()>,
) -> io::Result<Waited> {
    poll(|| try_lock(path, ephemeral), timeout, on_retry)
}

/// Locks the slots of `leaf` ([`try_lock_leaf`]), polling like [`lock_with_timeout`] while another
/// holder has them, for at most `timeout`. `on_retry` recreates the leaf when it vanished.
pub(crate) fn lock_leaf(
    leaf: &Path,
    timeout: Duration,
    on_retry: impl FnMut() -> io::Result<()>,
) -> io::Result<Waited> {
    poll(|| try_lock_leaf(leaf), timeout, on_retry)
}

fn poll(
    mut try_once: impl FnMut() -> io::Result<Option<HeldLock>>,
    timeout: Duration,
    mut on_retry: impl FnMut() -> io::Result<()>,
) -> io::Result<Waited> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    let mut waited = false;
    let mut vanished = 0;
    loop {
        match try_once() {
            Ok(Some(lock)) => return Ok(Waited::Acquired { lock, waited }),
            Ok(None) => {}
            // The directory can vanish when an evictor removes an emptied leaf; the caller recreates it
            // and we try again at once. A directory that keeps vanishing is reported as the error it is.
            Err(e) if e.kind() == io::ErrorKind::NotFound && vanished < 3 => {
                vanished += 1;
                on_retry()?;
                continue;
            }
            Err(e) => return Err(e),
        }
        waited = true;
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return Ok(Waited::TimedOut);
        }
        std::thread::sleep(pause.min(timeout - elapsed));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// The file locked instead of the leaf directory where directories cannot be locked.
pub(crate) const LEAF_LOCK_FILE: &str = "leaf.lock";

/// Tries once to lock the slots of the leaf directory `leaf` (see "The leaf lock" above).
/// `Ok(None)` means another holder has them; `NotFound` that the leaf does not exist.
pub(crate) fn try_lock_leaf(leaf: &Path) -> io::Result<Option<HeldLock>> {
    match try_lock_dir(leaf)? {
        DirLock::Held(l) => Ok(Some(l)),
        DirLock::Busy => Ok(None),
        DirLock::Unsupported => {
            if !leaf.is_dir() {
                return Err(io::Error::from(io::ErrorKind::NotFound));
            }
            try_lock(&leaf.join(LEAF_LOCK_FILE), true)
        }
    }
}

enum DirLock {
    Held(HeldLock),
    Busy,
    /// The file system refused to lock a directory at all (not "busy").
    Unsupported,
}

fn try_lock_dir(dir: &Path) -> io::Result<DirLock> {
    // Retries as `try_lock` does: each means the directory was removed and made again meanwhile.
    for _ in 0..8 {
        let file = File::open(dir)?;
        let mut rw = fd_lock::RwLock::new(file);
        match rw.try_write() {
            Ok(guard) => std::mem::forget(guard),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(DirLock::Busy),
            Err(_) => return Ok(DirLock::Unsupported),
        }
        let file = rw.into_inner();
        if same_inode(&file, dir)? {
            return Ok(DirLock::Held(HeldLock {
                file: Some(file),
                path: dir.to_owned(),
                ephemeral: false,
            }));
        }
    }
    Ok(DirLock::Busy)
}

/// Removes the leaf directory `leaf` if it is empty and nobody holds its lock; returns whether it is
/// gone. Holding the directory's lock across the `rmdir` is what keeps a writer that has just locked
/// the leaf (and not yet written a file into it) from losing it: either the writer holds the lock and
/// the leaf stays, or it locks after the removal, finds the path no longer names what it locked, and
/// makes the leaf again. (Where the lock is a file in the leaf, its presence already keeps the leaf.)
pub(crate) fn remove_leaf_dir(leaf: &Path) -> bool {
    match try_lock_dir(leaf) {
        Ok(DirLock::Held(lock)) => {
            let gone = std::fs::remove_dir(leaf).is_ok();
            drop(lock);
            gone
        }
        Ok(DirLock::Busy) => false,
        Ok(DirLock::Unsupported) => std::fs::remove_dir(leaf).is_ok(),
        Err(_) => false,
    }
}
