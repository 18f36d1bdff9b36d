//! Why a store fell back to "build it": the causes each store warns about once per instance.

use std::fmt;
use std::io;

/// Why a store (the disk cache, a read-only layer, the remote) fell back to "build it". Each cause is warned about once per cache instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WarnCause {
    /// The cache root or one of its directories is missing and cannot be created (ENOENT, ENOTDIR).
    Unavailable,
    /// Permission denied (EACCES, EPERM).
    PermissionDenied,
    /// The disk is full, a quota or the file size limit was reached (ENOSPC, EDQUOT, EFBIG).
    NoSpace,
    /// A put was skipped because it would have left the cache's file system with less free space (or
    /// fewer free inodes) than `KPC_CACHE_MIN_FREE`.
    LowSpace,
    /// The file system is read-only (EROFS).
    ReadOnly,
    /// An entry failed verification (magic, version, length, checksum, key binding) or was incomplete.
    Corrupt,
    /// Another process held a key's build lock past `KPC_CACHE_LOCK_TIMEOUT`.
    LockTimeout,
    /// The backend refused a verified binary (driver update the fingerprint missed, ...).
    Rejected,
    /// The backend could not serialize a built program, so nothing was persisted.
    Serialize,
    /// One entry is larger than `KPC_CACHE_MAX_SIZE`, so it can never be kept.
    TooLarge,
    /// Any other I/O error.
    Io,
    /// A remote store did not answer within `KPC_CACHE_REMOTE_TIMEOUT`, or could not keep up with
    /// publishing.
    Timeout,
    /// A shared entry failed authentication (no MAC or a wrong one, with `KPC_CACHE_REMOTE_KEY` set).
    Unauthentic,
    /// A shared entry's writer signature was missing, by an untrusted key or wrong
    /// (`KPC_CACHE_TRUSTED_KEYS`), or this node cannot sign what it would publish.
    Untrusted,
}

impl WarnCause {
    pub(crate) const ALL: [WarnCause; 14] = [
        WarnCause::Unavailable,
        WarnCause::PermissionDenied,
        WarnCause::NoSpace,
        WarnCause::LowSpace,
        WarnCause::ReadOnly,
        WarnCause::Corrupt,
        WarnCause::LockTimeout,
        WarnCause::Rejected,
        WarnCause::Serialize,
        WarnCause::TooLarge,
        WarnCause::Io,
        WarnCause::Timeout,
        WarnCause::Unauthentic,
        WarnCause::Untrusted,
    ];

    /// A stable kebab-case name, used as the `cause` field of the warning event.
    pub fn name(self) -> &'static str {
        match self {
            WarnCause::Unavailable => "unavailable",
            WarnCause::PermissionDenied => "permission-denied",
            WarnCause::NoSpace => "no-space",
            WarnCause::LowSpace => "low-space",
            WarnCause::ReadOnly => "read-only",
            WarnCause::Corrupt => "corrupt",
            WarnCause::LockTimeout => "lock-timeout",
            WarnCause::Rejected => "rejected",
            WarnCause::Serialize => "serialize",
            WarnCause::TooLarge => "too-large",
            WarnCause::Io => "io",
            WarnCause::Timeout => "timeout",
            WarnCause::Unauthentic => "unauthentic",
            WarnCause::Untrusted => "untrusted",
        }
    }

    pub(crate) fn bit(self) -> u32 {
        1 << (self as u32)
    }

    /// The cause an I/O error falls under.
    pub fn of(e: &io::Error) -> WarnCause {
        match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => WarnCause::PermissionDenied,
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => WarnCause::NoSpace,
            Some(libc::EROFS) => WarnCause::ReadOnly,
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => WarnCause::Unavailable,
            _ => WarnCause::Io,
        }
    }
}

impl fmt::Display for WarnCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
