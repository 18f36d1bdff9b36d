//! The settings of one `PersistentCache`, and how a [`Config`] maps onto them.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{Config, MinFree, TraceFlags};

/// Settings of one [`PersistentCache`](super::PersistentCache): [`DiskCacheSettings::new`] or
/// [`DiskCacheSettings::from_config_at`], then a setter per field (`.max_size(1 << 20)`).
/// Non-exhaustive, so that a new setting is not a breaking change.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DiskCacheSettings {
    /// The cache root (`KPC_CACHE_DIR`). Created on the first put.
    pub root: PathBuf,
    /// Size limit in bytes over both files of every entry; 0 = unlimited (`KPC_CACHE_MAX_SIZE`).
    pub max_size: u64,
    /// Limit on the number of entries (two files each); 0 = unlimited (`KPC_CACHE_MAX_ENTRIES`).
    pub max_entries: u64,
    /// Free space a put must leave on the cache's file system; a put that would go under it is
    /// skipped (`KPC_CACHE_MIN_FREE`, default 1% of the file system).
    pub min_free: MinFree,
    /// Where the lock files go instead of the cache tree (`KPC_CACHE_LOCK_DIR`); `None`: in the tree.
    pub lock_dir: Option<PathBuf>,
    /// Entries whose device image is shorter are neither looked up nor stored.
    pub min_image_size: u64,
    /// Entries whose device image is longer are neither looked up nor stored.
    pub max_image_size: u64,
    /// How long a miss waits for another process building the same key (`KPC_CACHE_LOCK_TIMEOUT`).
    pub lock_timeout: Duration,
    /// Emit `tracing` events on target `kpc::cache::disk` (`KPC_CACHE_TRACE` bit 1).
    pub trace: bool,
    /// A hit refreshes the entry's access time only when it is older than this (default 60 s).
    pub touch_interval: Duration,
    /// An eviction pass stops when the total is at or under this percentage of `max_size` (default 75).
    pub low_watermark_percent: u8,
    /// Run the eviction a put triggers on a background thread (default), so the put returns at once;
    /// `false` runs it inside the put.
    pub background_eviction: bool,
    /// fsync files and directories when publishing (default). `false` gives up durability across power
    /// loss (never atomicity); for benchmarks and throwaway caches only.
    pub sync: bool,
    /// The host id recorded in the provenance of what this process builds (`KPC_HOST_ID`, default
    /// the host name).
    pub host_id: String,
    /// Where this cache's warnings go besides `tracing` (the context's callback, stderr).
    pub warnings: crate::warnings::Sink,
}

impl DiskCacheSettings {
    /// The defaults (1 GiB limit and largest image, 30 s lock timeout, 60 s touch interval, 75%
    /// low watermark, background eviction, fsync), rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DiskCacheSettings {
            root: root.into(),
            max_size: crate::config::GIB,
            max_entries: 0,
            min_free: MinFree::default(),
            lock_dir: None,
            min_image_size: 0,
            max_image_size: crate::config::GIB,
            lock_timeout: Duration::from_secs(30),
            trace: false,
            touch_interval: Duration::from_secs(60),
            low_watermark_percent: 75,
            background_eviction: true,
            sync: true,
            host_id: crate::config::signing::hostname(),
            warnings: crate::warnings::Sink::default(),
        }
    }

    /// Sets [`DiskCacheSettings::max_size`].
    pub fn max_size(mut self, max_size: u64) -> Self {
        self.max_size = max_size;
        self
    }

    /// Sets [`DiskCacheSettings::max_entries`].
    pub fn max_entries(mut self, max_entries: u64) -> Self {
        self.max_entries = max_entries;
        self
    }

    /// Sets [`DiskCacheSettings::min_free`].
    pub fn min_free(mut self, min_free: MinFree) -> Self {
        self.min_free = min_free;
        self
    }

    /// Sets [`DiskCacheSettings::lock_dir`].
    pub fn lock_dir(mut self, lock_dir: Option<PathBuf>) -> Self {
        self.lock_dir = lock_dir;
        self
    }

    /// Sets [`DiskCacheSettings::min_image_size`].
    pub fn min_image_size(mut self, min_image_size: u64) -> Self {
        self.min_image_size = min_image_size;
        self
    }

    /// Sets [`DiskCacheSettings::max_image_size`].
    pub fn max_image_size(mut self, max_image_size: u64) -> Self {
        self.max_image_size = max_image_size;
        self
    }

    /// Sets [`DiskCacheSettings::lock_timeout`].
    pub fn lock_timeout(mut self, lock_timeout: Duration) -> Self {
        self.lock_timeout = lock_timeout;
        self
    }

    /// Sets [`DiskCacheSettings::trace`].
    pub fn trace(mut self, trace: bool) -> Self {
        self.trace = trace;
        self
    }

    /// Sets [`DiskCacheSettings::touch_interval`].
    pub fn touch_interval(mut self, touch_interval: Duration) -> Self {
        self.touch_interval = touch_interval;
        self
    }

    /// Sets [`DiskCacheSettings::low_watermark_percent`].
    pub fn low_watermark_percent(mut self, low_watermark_percent: u8) -> Self {
        self.low_watermark_percent = low_watermark_percent;
        self
    }

    /// Sets [`DiskCacheSettings::background_eviction`].
    pub fn background_eviction(mut self, background_eviction: bool) -> Self {
        self.background_eviction = background_eviction;
        self
    }

    /// Sets [`DiskCacheSettings::sync`].
    pub fn sync(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }

    /// Sets [`DiskCacheSettings::host_id`].
    pub fn host_id(mut self, host_id: String) -> Self {
        self.host_id = host_id;
        self
    }

    /// The settings `config` implies, rooted at its cache directory even when `KPC_CACHE_PERSISTENT=0`
    /// (the `kpc cache` commands inspect a disabled cache too); `None` when no directory is resolved.
    pub fn from_config_dir(c: &Config) -> Option<Self> {
        Some(DiskCacheSettings::from_config_at(c, c.cache_dir.as_ref()?))
    }

    /// The settings `config` implies (limits, lock timeout, tracing) for a cache rooted at `root`: how
    /// the read-only layers of `KPC_CACHE_READONLY_DIRS` are opened.
    pub fn from_config_at(c: &Config, root: impl Into<PathBuf>) -> Self {
        DiskCacheSettings {
            max_size: c.max_size,
            max_entries: c.max_entries,
            min_free: c.min_free,
            lock_dir: c.lock_dir.clone(),
            min_image_size: c.min_device_image_size,
            max_image_size: c.max_device_image_size,
            lock_timeout: c.lock_timeout,
            trace: c.trace.contains(TraceFlags::DISK),
            host_id: c.host_id(),
            warnings: c.warning_sink(),
            ..DiskCacheSettings::new(root)
        }
    }
}
