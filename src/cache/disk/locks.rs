//! Where a disk cache takes its locks: beside what they guard (the default), or in
//! `KPC_CACHE_LOCK_DIR`, on node-local storage, when the cache root is on a network file system whose
//! `flock` is unreliable (some NFS setups lose or never grant them; MIOpen and FlashInfer moved their
//! locks off NFS after deadlocks).
//!
//! Relocated: the leaf locks (`lock.rs`, "The leaf lock": a file per leaf instead of a `flock` on the
//! directory), the build locks (`key.lock`), the eviction lock (`evict.lock`) and the size file's lock
//! (the record itself stays in the tree, read and written through a descriptor of its own). Each cache
//! root gets a directory of its own under the lock directory (16 hex digits of BLAKE3 over the root's
//! path), made on first use; leaf and build lock files are named by a hash of the leaf's path and
//! removed by their holders, as in the tree. The small record files (the eviction record, the miss
//! journal, the name index) and the crash-safe loading records keep their locks beside them.
//!
//! What a lock directory changes: locks exclude only the processes of the machine that shares it.
//! Across machines sharing the cache root, entries are still published atomically (`rename`) and
//! verified when read, but two machines may build the same key, pick the same free slot (the later
//! rename wins; both are whole entries) and update the size record without excluding each other, so
//! the record may drift; every eviction pass corrects it from its walk when no counted change ran
//! meanwhile (`count.rs`, "Drift from outside").

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::lock::{self, EVICT_LOCK, HeldLock, Waited};

/// Name of the build lock file in a leaf.
pub(crate) const BUILD_LOCK: &str = "key.lock";

/// Where one cache's locks go. Cloning is cheap.
#[derive(Debug, Clone)]
pub(crate) struct Locks {
    v1: PathBuf,
    /// The cache's own directory under `KPC_CACHE_LOCK_DIR`, when one is set.
    dir: Option<PathBuf>,
}

impl Locks {
    /// The locks of the cache rooted at `root` (versioned tree `v1`), in `lock_dir` when given.
    pub fn new(root: &Path, v1: &Path, lock_dir: Option<&Path>) -> Locks {
        let dir = lock_dir.map(|d| {
            let abs = std::path::absolute(root).unwrap_or_else(|_| root.to_owned());
            let h = blake3::hash(abs.as_os_str().as_encoded_bytes());
            d.join(&h.to_hex()[..16])
        });
        Locks {
            v1: v1.to_owned(),
            dir,
        }
    }

    /// The lock directory of this cache, made if needed; `None` when locks live in the tree.
    fn dir(&self) -> io::Result<Option<&Path>> {
        match &self.dir {
            None => Ok(None),
            Some(d) => {
                fs::create_dir_all(d)?;
                Ok(Some(d))
            }
        }
    }

    /// The relocated lock file `tag`-(hash of `path`) for `path`.
    fn file_for(dir: &Path, tag: &str, path: &Path) -> PathBuf {
        let h = blake3::hash(path.as_os_str().as_encoded_bytes());
        dir.join(format!("{tag}-{}.lock", &h.to_hex()[..24]))
    }

    /// Tries once to lock the slots of `leaf` (see `lock::try_lock_leaf`).
    pub fn try_leaf(&self, leaf: &Path) -> io::Result<Option<HeldLock>> {
        match self.dir()? {
            None => lock::try_lock_leaf(leaf),
            Some(d) => lock::try_lock(&Locks::file_for(d, "leaf", leaf), true),
        }
    }

    /// Locks the slots of `leaf`, polling for at most `timeout` (see `lock::lock_leaf`).
    pub fn leaf(
        &self,
        leaf: &Path,
        timeout: Duration,
        on_retry: impl FnMut() -> io::Result<()>,
    ) -> io::Result<Waited> {
        match self.dir()? {
            None => lock::lock_leaf(leaf, timeout, on_retry),
            Some(d) => {
                lock::lock_with_timeout(&Locks::file_for(d, "leaf", leaf), true, timeout, on_retry)
            }
        }
    }

    /// The build lock file of the key whose leaf is `leaf`.
    pub fn build(&self, leaf: &Path) -> io::Result<PathBuf> {
        Ok(match self.dir()? {
            None => leaf.join(BUILD_LOCK),
            Some(d) => Locks::file_for(d, "key", leaf),
        })
    }

    /// The eviction lock file.
    pub fn evict(&self) -> io::Result<PathBuf> {
        Ok(match self.dir()? {
            None => self.v1.join(EVICT_LOCK),
            Some(d) => d.join(EVICT_LOCK),
        })
    }

    /// The size file's lock, when it is not the size file itself.
    pub fn size(&self) -> io::Result<Option<PathBuf>> {
        Ok(self.dir()?.map(|d| d.join("size.lock")))
    }

    /// Removes the leaf directory `leaf` if it is empty and nobody holds its lock (see
    /// `lock::remove_leaf_dir`; with a lock directory, under the leaf's lock file there).
    pub fn remove_leaf_dir(&self, leaf: &Path) -> bool {
        match self.dir() {
            Ok(None) => lock::remove_leaf_dir(leaf),
            Ok(Some(d)) => match lock::try_lock(&Locks::file_for(d, "leaf", leaf), true) {
                Ok(Some(held)) => {
                    let gone = fs::remove_dir(leaf).is_ok();
                    drop(held);
                    gone
                }
                _ => false,
            },
            Err(_) => false,
        }
    }
}
