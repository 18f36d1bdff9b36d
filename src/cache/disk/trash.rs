//! Deferred deletion: where an eviction pass puts what it removes, and the sweep that deletes it later.
//!
//! On this project's ext4 VM (virtio disk mounted with `discard`), every system call that frees an
//! allocated block (an `rmdir`, the `unlink` of a file whose data reached the disk, an `ftruncate`)
//! costs 2-4 ms, while a `rename` costs 7-50 µs. An eviction pass that unlinks two files and removes
//! three directories per entry therefore spent ~9 ms per entry (87 s for 10,000). So the pass only
//! renames: each removed entry's files go into this pass's trash directory
//! (`<root>/trash/<pid>-<nanos>-<thread>/`, outside the versioned tree, so nothing reads or counts them), and
//! directories the pass emptied are left for the sweep. Renaming `.src` away is as atomic for a reader
//! as unlinking it: the entry is gone from the tree either way.
//!
//! The sweep then removes the emptied directories (`rmdir`, which fails on a directory a writer has
//! refilled meanwhile, so no entry is ever lost to it) and every trash directory, including those a
//! killed evictor left. It runs under the eviction lock, so it never deletes a trash directory a pass
//! is still filling, and one sweep runs at a time across processes.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::VERSION_DIR;
use super::lock;
use super::locks::{BUILD_LOCK, Locks};
use super::names;

/// The directory under the cache root holding every pass's trash.
pub(crate) const TRASH_DIR: &str = "trash";

/// One pass's trash directory, created on first use.
#[derive(Debug)]
pub(crate) struct Trash {
    dir: PathBuf,
    next: u64,
    created: bool,
}

impl Trash {
    /// A trash directory of its own for this pass's thread `tag`.
    pub fn new(root: &Path, tag: usize) -> Trash {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Trash {
            dir: root
                .join(TRASH_DIR)
                .join(format!("{}-{nanos}-{tag}", std::process::id())),
            next: 0,
            created: false,
        }
    }

    /// Moves `path` into the trash and returns its length. `NotFound` means `path` was already gone.
    /// Where the rename cannot be done (the trash cannot be created, or sits on another file system),
    /// the file is unlinked instead: slower, never wrong. The length is measured on the file moved
    /// (the caller holds its slot lock, so it no longer changes), not taken from an earlier walk.
    pub fn take(&mut self, path: &Path) -> io::Result<u64> {
        if !self.created {
            self.created = fs::create_dir_all(&self.dir).is_ok();
        }
        if self.created {
            let to = self.dir.join(self.next.to_string());
            self.next += 1;
            match fs::rename(path, &to) {
                Ok(()) => return Ok(fs::symlink_metadata(&to).map_or(0, |m| m.len())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // Either `path` is gone, or the trash was; only the first is final.
                    if fs::symlink_metadata(path).is_err() {
                        return Err(e);
                    }
                    self.created = false;
                }
                Err(_) => {}
            }
        }
        let len = fs::symlink_metadata(path)?.len();
        fs::remove_file(path)?;
        Ok(len)
    }
}

/// What a sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SweepReport {
    /// Empty directories removed from the tree.
    pub dirs_removed: u64,
    /// Trash directories deleted (this pass's and any a killed evictor left).
    pub trash_removed: u64,
}

/// The directory work an eviction pass leaves for later: the leaves it found or left empty, with how
/// many subdirectories each of their ancestors had at the walk, so a parent is tried only once its
/// last child went.
#[derive(Debug)]
pub(crate) struct Sweep {
    pub root: PathBuf,
    /// Empty leaves, and whether each had a `key.lock` (a killed builder's, unless someone holds it).
    pub leaves: Vec<(PathBuf, bool)>,
    pub children: HashMap<PathBuf, usize>,
    /// Where the leaves' locks are.
    pub locks: Locks,
}

impl Sweep {
    /// Removes the emptied directories, then every trash directory. The caller holds the eviction lock.
    pub fn run(mut self) -> SweepReport {
        let mut report = SweepReport::default();
        for (leaf, key_lock) in std::mem::take(&mut self.leaves) {
            if key_lock {
                // If it is held, the builder keeps the leaf alive (the rmdir below fails).
                drop(lock::try_lock(&leaf.join(BUILD_LOCK), true));
            }
            let mut dir = leaf;
            // A directory that gained an entry meanwhile is not empty, and rmdir says so; a leaf is
            // removed under its lock, so a writer that has just locked it keeps it.
            let mut removed = self.locks.remove_leaf_dir(&dir);
            while removed {
                report.dirs_removed += 1;
                let Some(parent) = dir.parent() else { break };
                match self.children.get_mut(parent) {
                    Some(c) if *c > 1 => {
                        *c -= 1;
                        break;
                    }
                    Some(_) => dir = parent.to_owned(),
                    // v1 itself (or something outside the tree): never removed.
                    None => break,
                }
                removed = fs::remove_dir(&dir).is_ok();
            }
        }
        // The name index drops the image directories that went (and duplicates).
        names::compact(&self.root.join(VERSION_DIR));
        if let Ok(rd) = fs::read_dir(self.root.join(TRASH_DIR)) {
            for e in rd.filter_map(Result::ok) {
                if fs::remove_dir_all(e.path()).is_ok() {
                    report.trash_removed += 1;
                }
            }
        }
        report
    }
}
