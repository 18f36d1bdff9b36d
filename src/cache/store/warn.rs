//! Why a store fell back to "build it": the causes each store warns about once per instance.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

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

/// Which causes have been warned about. A bit per cause, set with one `fetch_or`, so a thousand
/// requests failing the same way log one line.
#[derive(Debug, Default)]
pub(crate) struct Warned(AtomicU32);

impl Warned {
    /// Emits the warning for `cause` unless this instance already did.
    pub fn warn(
        &self,
        sink: &crate::warnings::Sink,
        cause: WarnCause,
        path: &Path,
        detail: &dyn fmt::Display,
    ) {
        if self.first(cause) {
            tracing::warn!(
                target: "kpc::cache::disk",
                cause = cause.name(),
                path = %path.display(),
                "disk cache: {detail}; building instead (further {cause} problems are not reported)"
            );
            let w = crate::warnings::Warning {
                target: "kpc::cache::disk",
                cause: cause.name(),
                message: format!(
                    "disk cache at {}: {detail}; building instead (further {cause} problems are \
                     not reported)",
                    path.display()
                ),
            };
            crate::warnings::deliver(Some(sink), &w);
        }
    }

    /// Marks `cause` as warned about; true the first time only (the caller then logs it).
    pub fn first(&self, cause: WarnCause) -> bool {
        let prev = self.0.fetch_or(cause.bit(), Ordering::Relaxed);
        prev & cause.bit() == 0
    }

    /// The causes warned about so far, in declaration order.
    pub fn causes(&self) -> Vec<WarnCause> {
        let bits = self.0.load(Ordering::Relaxed);
        WarnCause::ALL
            .into_iter()
            .filter(|c| bits & c.bit() != 0)
            .collect()
    }
}
