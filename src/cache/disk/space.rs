//! The free-space floor (`KPC_CACHE_MIN_FREE`): a put that would leave the cache's file system with
//! less free space, or fewer free inodes, than the floor is skipped with one warning, instead of
//! filling the disk (and failing the put, or somebody else's write) later.
//!
//! The check is one `statvfs` of the cache root (or of its nearest existing parent, before the root is
//! made) per put: the space an unprivileged user may still use (`f_bavail`) against the entry's bytes
//! plus the floor, and, where the floor is a share and the file system reports inodes, the free inodes
//! against the files and directories a put may create plus the same share of all inodes. Quotas are
//! not visible to `statvfs`: a quota that runs out is still a failed put (`no-space`).

use std::path::Path;

use super::Inner;

/// Files and directories one put may create: four directory levels and two files.
const INODES_PER_PUT: u64 = 6;

/// The file system's state, as `statvfs` gave it.
#[derive(Debug, Clone, Copy)]
struct Fs {
    size: u64,
    avail: u64,
    inodes: u64,
    inodes_avail: u64,
}

fn statvfs(mut dir: &Path) -> Option<Fs> {
    // The root may not exist yet: its nearest existing parent is on the file system it will be on.
    loop {
        match rustix::fs::statvfs(dir) {
            Ok(st) => {
                let unit = st.f_frsize.max(1);
                return Some(Fs {
                    size: st.f_blocks.saturating_mul(unit),
                    avail: st.f_bavail.saturating_mul(unit),
                    inodes: st.f_files,
                    inodes_avail: st.f_favail,
                });
            }
            Err(rustix::io::Errno::NOENT) => dir = dir.parent()?,
            Err(_) => return None,
        }
    }
}

impl Inner {
    /// Why a put of `bytes` must be skipped to keep the floor, or `None` when it may go ahead (also
    /// when the file system cannot be asked: the put then finds out for itself).
    pub(super) fn under_floor(&self, bytes: u64) -> Option<String> {
        let floor = self.s.min_free;
        if floor == crate::config::MinFree::Bytes(0) {
            return None;
        }
        // A file system that reports no blocks (procfs, some FUSE file systems) cannot be judged: the
        // put finds out for itself.
        let fs = statvfs(&self.s.root).filter(|fs| fs.size > 0)?;
        let (min_bytes, min_inodes) = floor.floor(fs.size, fs.inodes);
        if fs.avail < bytes.saturating_add(min_bytes) {
            return Some(format!(
                "a put of {bytes} bytes would leave {} of the file system's {} bytes free, under KPC_CACHE_MIN_FREE={floor} ({min_bytes} bytes)",
                fs.avail.saturating_sub(bytes),
                fs.size
            ));
        }
        if min_inodes > 0 && fs.inodes_avail < INODES_PER_PUT.saturating_add(min_inodes) {
            return Some(format!(
                "a put would leave fewer than {min_inodes} of the file system's {} inodes free ({} are), under KPC_CACHE_MIN_FREE={floor}",
                fs.inodes, fs.inodes_avail
            ));
        }
        None
    }
}
