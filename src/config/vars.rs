//! Names of every environment variable kpc reads. ENVIRONMENT.md documents each of them.

/// 0/1: use the on-disk cache.
pub const CACHE_PERSISTENT: &str = "KPC_CACHE_PERSISTENT";
/// Root directory of the on-disk cache.
pub const CACHE_DIR: &str = "KPC_CACHE_DIR";
/// Read-only cache roots searched after the local one (colon-separated, like PATH).
pub const CACHE_READONLY_DIRS: &str = "KPC_CACHE_READONLY_DIRS";
/// Disk cache size limit.
pub const CACHE_MAX_SIZE: &str = "KPC_CACHE_MAX_SIZE";
/// Disk cache entry limit (inode quotas count files).
pub const CACHE_MAX_ENTRIES: &str = "KPC_CACHE_MAX_ENTRIES";
/// Free space a disk cache put must leave on the file system.
pub const CACHE_MIN_FREE: &str = "KPC_CACHE_MIN_FREE";
/// Where the disk cache's lock files go (node-local storage for a cache on a network file system).
pub const CACHE_LOCK_DIR: &str = "KPC_CACHE_LOCK_DIR";
/// Smallest device image that is persisted.
pub const CACHE_MIN_DEVICE_IMAGE_SIZE: &str = "KPC_CACHE_MIN_DEVICE_IMAGE_SIZE";
/// Largest device image that is persisted.
pub const CACHE_MAX_DEVICE_IMAGE_SIZE: &str = "KPC_CACHE_MAX_DEVICE_IMAGE_SIZE";
/// 0/1: use the in-memory cache.
pub const CACHE_IN_MEM: &str = "KPC_CACHE_IN_MEM";
/// Bytes of programs ([`crate::cache::CacheCost`]) kept in memory before LRU eviction (0 = off).
pub const IN_MEM_CACHE_EVICTION_THRESHOLD: &str = "KPC_IN_MEM_CACHE_EVICTION_THRESHOLD";
/// How long to wait for another process building the same key.
pub const CACHE_LOCK_TIMEOUT: &str = "KPC_CACHE_LOCK_TIMEOUT";
/// Trace bitmask: 1 disk, 2 memory, 4 builds.
pub const CACHE_TRACE: &str = "KPC_CACHE_TRACE";
/// 0/1: debug mode, every program built fresh and compared with the cached binary.
pub const CACHE_DEBUG: &str = "KPC_CACHE_DEBUG";
/// Device selector.
pub const DEVICE: &str = "KPC_DEVICE";
/// Warm start: off, on, or on under an application name.
pub const CACHE_PREFETCH: &str = "KPC_CACHE_PREFETCH";
/// Remote store URL (redis://, fs://, s3://).
pub const CACHE_REMOTE: &str = "KPC_CACHE_REMOTE";
/// Bound on each remote call, and on how long a publish may hold a build back.
pub const CACHE_REMOTE_TIMEOUT: &str = "KPC_CACHE_REMOTE_TIMEOUT";
/// Shared secret: remote entries carry a keyed BLAKE3 MAC and are verified.
pub const CACHE_REMOTE_KEY: &str = "KPC_CACHE_REMOTE_KEY";
/// zstd level of published remote entries, or 0 for none.
pub const CACHE_REMOTE_COMPRESS: &str = "KPC_CACHE_REMOTE_COMPRESS";
/// Readers refuse remote entries built before this time (a cut-off after a bad publisher).
pub const CACHE_REMOTE_NOT_BEFORE: &str = "KPC_CACHE_REMOTE_NOT_BEFORE";
/// Private key file: this process signs the entries it publishes or exports (Ed25519).
pub const CACHE_SIGNING_KEY: &str = "KPC_CACHE_SIGNING_KEY";
/// Public keys (inline or files): readers refuse shared entries none of them signed.
pub const CACHE_TRUSTED_KEYS: &str = "KPC_CACHE_TRUSTED_KEYS";
/// This machine's name in the provenance of what it publishes or exports (default: the host name).
pub const HOST_ID: &str = "KPC_HOST_ID";
/// Sealed mode: off, warn or error for a build after warm-up.
pub const CACHE_SEAL: &str = "KPC_CACHE_SEAL";
/// Builds a context may run after its warm-up before it is sealed.
pub const CACHE_BUILD_BUDGET: &str = "KPC_CACHE_BUILD_BUDGET";
/// Fallback cache root base (XDG base directory spec).
pub const XDG_CACHE_HOME: &str = "XDG_CACHE_HOME";
/// Last-resort cache root base.
pub const HOME: &str = "HOME";
/// 0/1: print warnings nobody else receives on stderr.
pub const LOG_STDERR: &str = crate::warnings::STDERR_VAR;
