//! Advisory file locks for the disk cache: `flock` through fd-lock, never `O_EXCL` lock files.
//!
//! A `flock` belongs to the open file description, so the kernel drops it when the holder's descriptor
//! is closed, including when the holder is killed: no lock outlives its process, and no writer ever
//! spins on a lock left by a dead one (the SYCL runtime's lock files have exactly that failure). Two
//! threads of one process that open the file separately also exclude each other, which the
//! in-process tests rely on.
//!
//! A lock file is removed only by a holder, while it holds it: the build lock (`key.lock`) when the
//! build ends, a slot's lock (`<n>.lock`) together with the entry it guards. A contender may have opened
//! the old file just before the unlink and then lock an inode no longer reachable by its path, which
//! guards nothing; so after every acquisition the path is checked to still name the locked inode, and on
//! a mismatch the contender opens the path again. Because finished work takes its lock files with it,
//! emptied directories can be removed.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Held by the one process evicting or sweeping (`<root>/v1/evict.lock`).
pub(crate) const EVICT_LOCK: &str = "evict.lock";
/// Left by a pass that found [`EVICT_LOCK`] taken; the holder looks for it after letting go and runs
/// again (`schedule.rs`), so a put that crossed the limit while another process evicted is not lost.
pub(crate) const RECHECK_FILE: &str = "evict.recheck";

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
    mut on_retry: impl FnMut() -> io::Result<()>,
) -> io::Result<Waited> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    let mut waited = false;
    let mut vanished = 0;
    loop {
        match try_lock(path, ephemeral) {
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
