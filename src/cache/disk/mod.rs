//! `PersistentCache`: verified program binaries on disk, shared by every process that uses the same
//! cache directory. It knows nothing of Vulkan or OpenCL: it stores opaque bytes under a [`DiskKey`].
//!
//! # Layout
//! ```text
//! <root>/v1/<device>/<image>/<spec>/<options>/<n>.src   key record (full key values, JSON)
//!                                            /<n>.bin   the binary
//!                                            /<n>.lock  the slot's lock (empty; goes with the entry)
//!                                            /key.lock  the key's build lock (only while building)
//! <root>/v1/size                                        tracked total size (see "Size" below)
//! <root>/v1/evict.lock                                  held by the one process evicting
//! <root>/quarantine/                                    entries `kpc cache verify --fix` set aside
//! ```
//! Directory names are 16 hex characters of BLAKE3 ([`DiskKey::dir_names`]). Several keys can share a
//! leaf directory only through a hash collision; their entries then take successive slots `n`, and a
//! reader compares the full key values in each `.src`. Both files carry a header with a checksum
//! ([`entry`]), so nothing unverified is returned.
//!
//! # Protocol
//! - **Readers take no lock.** They list the leaf, read each `<n>.src`, compare the key, then read and
//!   verify `<n>.bin`. Files only ever appear by `rename`, so a reader sees a complete file or none.
//! - **Writers** pick a slot `n` by taking the slot's lock (`<n>.lock`, try-only): a slot that is
//!   published or locked by another writer is skipped, so a writer never waits on another and never
//!   writes a slot someone else is writing. Under the slot lock the writer writes `<n>.bin.tmp` and
//!   `<n>.src.tmp`, fsyncs them, renames the `.bin` and then the `.src` into place (a visible `.src`
//!   therefore always has its `.bin`), and fsyncs the directory. The slot's lock file stays behind, so
//!   whoever removes the entry later opens it rather than creating one (a file creation is the costliest
//!   metadata operation on some file systems, and eviction does one removal per entry).
//! - **Single flight across processes.** [`PersistentCache::get_or_lock`] returns either a hit or a
//!   [`BuildGuard`] holding the key's build lock (`key.lock` in the leaf). Another process that misses
//!   the same key waits for that lock (up to `KPC_CACHE_LOCK_TIMEOUT`) and reads again, so a key is
//!   built once however many processes start together. After the timeout it builds itself.
//! - **Removal** (eviction, corruption, `prune`, `clear`) happens only under the slot lock, `.src`
//!   first, so readers stop finding the entry before its binary goes; the lock file goes last.
//! - Locks are `flock`s (see `lock.rs`): a killed process never leaves a lock behind.
//!
//! # Failures
//! Every failure of the disk layer (missing or unwritable directories, a full disk, a read-only root,
//! corrupt entries, a lock timeout) is a miss or a skipped put, never an error for the caller, and is
//! warned about once per cause per cache instance ([`WarnCause`]).
//!
//! # Size
//! The total (both files of every entry, headers included) is tracked in `<root>/v1/size`, a decimal
//! number updated under a lock on that file by every put and removal, so a put never walks the tree.
//! When a put takes it over `max_size`, an eviction pass walks the tree once, removes the least recently
//! accessed entries down to the low watermark, and writes the total it measured back: the walk corrects
//! any drift (a process killed between publishing and counting, files removed by hand). Hits record
//! access by setting the `.bin`'s access time explicitly, at most once per `touch_interval`, so recency
//! works on noatime and relatime mounts and a hit writes nothing else.

pub mod entry;
mod evict;
mod inventory;
pub mod key;
mod lock;
pub mod stats;

pub use entry::{Defect, FileKind};
pub use evict::EvictReport;
pub use inventory::{BadEntry, ClearReport, EntryInfo, VerifyReport};
pub use key::{DiskKey, KeyRecord};
pub use stats::{DiskStats, WarnCause};

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use filetime::FileTime;
use parking_lot::Mutex;

use crate::config::{Config, TraceFlags};
use entry::{HEADER_LEN, encode_header, read_verified};
use lock::{HeldLock, Waited};
use stats::{DiskCounters, Warned, bump, nanos};

/// Name of the versioned directory under the root; bumping the entry format changes it.
pub const VERSION_DIR: &str = "v1";
/// Most slots one leaf directory may hold; a put that finds them all taken is skipped.
pub const MAX_SLOTS: u32 = 64;

/// Settings of one [`PersistentCache`].
#[derive(Debug, Clone, PartialEq)]
pub struct DiskCacheSettings {
    /// The cache root (`KPC_CACHE_DIR`). Created on the first put.
    pub root: PathBuf,
    /// Size limit in bytes over both files of every entry; 0 = unlimited (`KPC_CACHE_MAX_SIZE`).
    pub max_size: u64,
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
}

impl DiskCacheSettings {
    /// The defaults DESIGN.md gives, rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DiskCacheSettings {
            root: root.into(),
            max_size: crate::config::GIB,
            min_image_size: 0,
            max_image_size: crate::config::GIB,
            lock_timeout: Duration::from_secs(30),
            trace: false,
            touch_interval: Duration::from_secs(60),
            low_watermark_percent: 75,
            background_eviction: true,
            sync: true,
        }
    }

    /// The settings `config` implies, rooted at its cache directory even when `KPC_CACHE_PERSISTENT=0`
    /// (the `kpc cache` commands inspect a disabled cache too); `None` when no directory is resolved.
    pub fn from_config_dir(c: &Config) -> Option<Self> {
        let root = c.cache_dir.clone()?;
        Some(DiskCacheSettings {
            max_size: c.max_size,
            min_image_size: c.min_device_image_size,
            max_image_size: c.max_device_image_size,
            lock_timeout: c.lock_timeout,
            trace: c.trace.contains(TraceFlags::DISK),
            ..DiskCacheSettings::new(root)
        })
    }
}

/// A verified binary found on disk.
#[derive(Debug)]
pub struct DiskHit {
    bytes: Vec<u8>,
    build_time: Duration,
    leaf: PathBuf,
    slot: u32,
    checksum: [u8; 32],
}

impl DiskHit {
    /// The binary, exactly as it was put.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    /// The binary, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
    /// How long the build that produced it took (what this hit saved).
    pub fn build_time(&self) -> Duration {
        self.build_time
    }
    /// The slot `n` it was read from.
    pub fn slot(&self) -> u32 {
        self.slot
    }
    /// The path of its `.bin`.
    pub fn bin_path(&self) -> PathBuf {
        self.leaf.join(format!("{}.bin", self.slot))
    }
}

/// What [`PersistentCache::get_or_lock`] found.
#[derive(Debug)]
pub enum Lookup {
    /// A verified binary.
    Hit(DiskHit),
    /// Nothing usable: build, then [`BuildGuard::put`]. The guard holds the key's build lock when it
    /// could be taken, so other processes wait for this build instead of repeating it.
    Miss(BuildGuard),
}

/// What a put did. None of these is an error for the caller: the disk cache is an optimization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Published in slot `n`.
    Published(u32),
    /// A valid entry for the key was already there (another process published it first).
    AlreadyPresent,
    /// Not attempted: image size outside the limits, entry larger than `max_size`, or every slot of the
    /// leaf taken.
    Skipped,
    /// Attempted and failed (warned once per cause).
    Failed,
}

/// The right, and the duty, to build one key. Holds the key's cross-process build lock (when it could be
/// taken) until [`BuildGuard::put`] or drop; dropping it without a put (the build failed) lets a waiting
/// process take over.
pub struct BuildGuard {
    cache: PersistentCache,
    // Boxed: a key is a few hundred bytes and a miss is the rare case, so `Lookup` stays small.
    key: Box<DiskKey>,
    lock: Option<HeldLock>,
    persist: bool,
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

    /// Publishes `bytes` built in `build_time` for the key, then releases the build lock.
    pub fn put(self, bytes: &[u8], build_time: Duration) -> PutOutcome {
        if !self.persist {
            return PutOutcome::Skipped;
        }
        let r = self.cache.inner.put(&self.key, bytes, build_time);
        drop(self.lock);
        r
    }
}

/// The on-disk cache. Cloning is cheap and shares counters and warnings.
///
/// Guarantees: a lookup returns only bytes that were put under exactly this key and pass their checksum;
/// no method returns an error or panics on a disk problem; a killed process leaves no lock and no
/// visible partial entry; with `max_size > 0`, the tracked total is brought back under the low watermark
/// after every put that exceeds the limit (entries being written excepted).
#[derive(Clone)]
pub struct PersistentCache {
    inner: Arc<Inner>,
}

impl fmt::Debug for PersistentCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PersistentCache")
            .field("root", &self.inner.s.root)
            .field("max_size", &self.inner.s.max_size)
            .finish()
    }
}

struct Inner {
    s: DiskCacheSettings,
    v1: PathBuf,
    counters: DiskCounters,
    warned: Warned,
    evicting: AtomicBool,
    evict_thread: Mutex<Option<JoinHandle<()>>>,
}

enum SlotRead {
    Hit(DiskHit),
    OtherKey,
    Gone,
    Defect(FileKind, Defect),
    Io(io::Error, PathBuf),
}

/// The state of one slot, checked in full (both files, key binding).
#[derive(Debug)]
pub(crate) enum SlotCheck {
    Absent,
    Valid(KeyRecord),
    /// `.bin` (or temporaries) without `.src`: invisible to readers; removed by eviction.
    Orphan,
    Defective(FileKind, Defect),
    Unreadable(FileKind, io::Error),
}

fn slot_file(leaf: &Path, n: u32, ext: &str) -> PathBuf {
    leaf.join(format!("{n}.{ext}"))
}

/// The slot numbers of the `<n>.src` files in `leaf`, ascending.
fn list_slots(leaf: &Path) -> io::Result<Vec<u32>> {
    let mut v = Vec::new();
    for e in fs::read_dir(leaf)? {
        let e = e?;
        let name = e.file_name();
        if let Some(n) = name
            .to_str()
            .and_then(|s| s.strip_suffix(".src"))
            .and_then(|s| s.parse::<u32>().ok())
        {
            v.push(n);
        }
    }
    v.sort_unstable();
    Ok(v)
}

fn read_src(path: &Path) -> io::Result<Result<(entry::Header, KeyRecord), Defect>> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    Ok(match read_verified(&mut f, len, FileKind::Src)? {
        Err(d) => Err(d),
        Ok(v) => match KeyRecord::parse(&v.payload) {
            Some(r) => Ok((v.header, r)),
            None => Err(Defect::BadRecord),
        },
    })
}

fn remove_if_exists(p: &Path) -> io::Result<u64> {
    let len = match fs::symlink_metadata(p) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    match fs::remove_file(p) {
        Ok(()) => Ok(len),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Removes every file of slot `n` (the caller holds the slot lock), `.src` first; returns the bytes freed.
fn remove_slot_files(leaf: &Path, n: u32) -> io::Result<u64> {
    let mut freed = 0;
    for ext in ["src", "bin", "src.tmp", "bin.tmp"] {
        freed += remove_if_exists(&slot_file(leaf, n, ext))?;
    }
    Ok(freed)
}

/// Checks slot `n` of `leaf` in full. Does not compare with any particular key.
pub(crate) fn check_slot(leaf: &Path, n: u32) -> SlotCheck {
    let src = slot_file(leaf, n, "src");
    let (header, rec) = match read_src(&src) {
        Ok(Ok(x)) => x,
        Ok(Err(d)) => return SlotCheck::Defective(FileKind::Src, d),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let any = ["bin", "src.tmp", "bin.tmp"]
                .iter()
                .any(|ext| slot_file(leaf, n, ext).exists());
            return if any {
                SlotCheck::Orphan
            } else {
                SlotCheck::Absent
            };
        }
        Err(e) => return SlotCheck::Unreadable(FileKind::Src, e),
    };
    match rec.to_key() {
        Some(k) if k.digest().0 == header.key_digest => {}
        _ => return SlotCheck::Defective(FileKind::Src, Defect::KeyMismatch),
    }
    let bin = slot_file(leaf, n, "bin");
    let mut f = match File::open(&bin) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return SlotCheck::Defective(FileKind::Bin, Defect::MissingBin);
        }
        Err(e) => return SlotCheck::Unreadable(FileKind::Bin, e),
    };
    let len = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => return SlotCheck::Unreadable(FileKind::Bin, e),
    };
    match read_verified(&mut f, len, FileKind::Bin) {
        Ok(Ok(v)) if v.header.key_digest == header.key_digest => SlotCheck::Valid(rec),
        Ok(Ok(_)) => SlotCheck::Defective(FileKind::Bin, Defect::KeyMismatch),
        Ok(Err(d)) => SlotCheck::Defective(FileKind::Bin, d),
        Err(e) => SlotCheck::Unreadable(FileKind::Bin, e),
    }
}

fn write_file(path: &Path, header: &[u8], payload: &[u8], sync: bool) -> io::Result<()> {
    use std::io::Write;
    let mut f = File::create(path)?;
    f.write_all(header)?;
    f.write_all(payload)?;
    if sync {
        f.sync_all()?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

static UNRESOLVED_WARNING: std::sync::Once = std::sync::Once::new();

impl PersistentCache {
    /// A cache with these settings. Touches nothing on disk until the first lookup or put.
    pub fn new(settings: DiskCacheSettings) -> Self {
        let v1 = settings.root.join(VERSION_DIR);
        PersistentCache {
            inner: Arc::new(Inner {
                s: settings,
                v1,
                counters: DiskCounters::default(),
                warned: Warned::default(),
                evicting: AtomicBool::new(false),
                evict_thread: Mutex::new(None),
            }),
        }
    }

    /// The cache `config` asks for, or `None` when the disk cache is off: `KPC_CACHE_PERSISTENT=0`, or no
    /// directory could be resolved (warned once per process: builds still work, they just do not persist).
    pub fn from_config(config: &Config) -> Option<Self> {
        if !config.persistent {
            return None;
        }
        match DiskCacheSettings::from_config_dir(config) {
            Some(s) => Some(PersistentCache::new(s)),
            None => {
                UNRESOLVED_WARNING.call_once(|| {
                    tracing::warn!(
                        target: "kpc::cache::disk",
                        cause = "unavailable",
                        "disk cache off: none of KPC_CACHE_DIR, XDG_CACHE_HOME (absolute) or HOME (absolute) is set"
                    );
                });
                None
            }
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &DiskCacheSettings {
        &self.inner.s
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.inner.s.root
    }

    /// The leaf directory entries of `key` live in (whether or not any exist).
    pub fn entry_dir(&self, key: &DiskKey) -> PathBuf {
        self.inner.leaf(key)
    }

    /// A snapshot of this instance's counters.
    pub fn stats(&self) -> DiskStats {
        self.inner.counters.snapshot()
    }

    /// The causes this instance has warned about so far, in declaration order.
    pub fn warnings(&self) -> Vec<WarnCause> {
        self.inner.warned.causes()
    }

    /// Whether a key with a device image of `image_len` bytes is persisted at all.
    pub fn persists_image_of_size(&self, image_len: u64) -> bool {
        image_len >= self.inner.s.min_image_size && image_len <= self.inner.s.max_image_size
    }

    /// Looks `key` up without locking anything. `None` on a miss or any disk problem.
    pub fn get(&self, key: &DiskKey) -> Option<DiskHit> {
        let i = &self.inner;
        if !self.persists_image_of_size(key.image_len()) {
            bump(&i.counters.skipped, 1);
            return None;
        }
        let r = i.find(&i.leaf(key), key, true);
        i.count_lookup(key, r.as_ref(), None);
        r
    }

    /// Stores `bytes` (built in `build_time`) under `key` without taking the build lock. Never fails the
    /// caller; see [`PutOutcome`].
    pub fn put(&self, key: &DiskKey, bytes: &[u8], build_time: Duration) -> PutOutcome {
        if !self.persists_image_of_size(key.image_len()) {
            bump(&self.inner.counters.skipped, 1);
            return PutOutcome::Skipped;
        }
        self.inner.put(key, bytes, build_time)
    }

    /// Looks `key` up; on a miss, takes the key's cross-process build lock, waiting up to
    /// `lock_timeout` while another process (or thread) holds it and then reading again. Returns the hit,
    /// or a guard for the caller to build under. After a timeout, or when the lock cannot be taken at all
    /// (unwritable cache), the guard holds no lock and the caller builds anyway.
    pub fn get_or_lock(&self, key: &DiskKey) -> Lookup {
        let i = &self.inner;
        let miss = |lock: Option<HeldLock>, persist: bool| {
            Lookup::Miss(BuildGuard {
                cache: self.clone(),
                key: Box::new(key.clone()),
                lock,
                persist,
            })
        };
        if !self.persists_image_of_size(key.image_len()) {
            bump(&i.counters.skipped, 1);
            return miss(None, false);
        }
        let leaf = i.leaf(key);
        if let Some(hit) = i.find(&leaf, key, true) {
            i.count_lookup(key, Some(&hit), None);
            return Lookup::Hit(hit);
        }
        let lock_path = leaf.join("key.lock");
        let start = Instant::now();
        let waited = match i.ensure_leaf(key).and_then(|_| {
            lock::lock_with_timeout(&lock_path, true, i.s.lock_timeout, || {
                i.ensure_leaf(key).map(drop)
            })
        }) {
            Ok(w) => w,
            Err(e) => {
                i.warn_io(&e, &leaf, "cannot take the build lock");
                i.count_lookup(key, None, None);
                return miss(None, true);
            }
        };
        let (lock, wait) = match waited {
            Waited::Acquired { lock, waited } => (Some(lock), waited.then(|| start.elapsed())),
            Waited::TimedOut => {
                bump(&i.counters.lock_timeouts, 1);
                i.warned.warn(
                    WarnCause::LockTimeout,
                    &lock_path,
                    &format_args!(
                        "another process held the build lock for longer than {:?}",
                        i.s.lock_timeout
                    ),
                );
                (None, Some(start.elapsed()))
            }
        };
        if let Some(w) = wait {
            bump(&i.counters.lock_waits, 1);
            bump(&i.counters.lock_wait_nanos, nanos(w));
        }
        // Someone may have published between our first look and the lock: that is the whole point of
        // waiting, and cheap when they did not.
        let r = i.find(&leaf, key, true);
        i.count_lookup(key, r.as_ref(), wait);
        match r {
            Some(hit) => Lookup::Hit(hit),
            None => miss(lock, true),
        }
    }

    /// Reports that the backend refused `hit` (`reason` says why): counts it, warns once, and removes the
    /// entry unless it was replaced meanwhile, so the next lookup misses and the key is rebuilt.
    pub fn reject(&self, hit: DiskHit, reason: &dyn fmt::Display) {
        let i = &self.inner;
        bump(&i.counters.rejected, 1);
        i.warned.warn(
            WarnCause::Rejected,
            &hit.bin_path(),
            &format_args!("the backend refused a verified binary ({reason})"),
        );
        i.trace(|| tracing::debug!(target: "kpc::cache::disk", path = %hit.bin_path().display(), %reason, "rejected"));
        if let Ok(Some(_l)) = lock::try_lock(&slot_file(&hit.leaf, hit.slot, "lock"), true) {
            let same = fs::read(hit.bin_path()).ok().and_then(|b| {
                entry::verify_bytes(&b, FileKind::Bin)
                    .ok()
                    .map(|(h, _)| h.checksum)
            }) == Some(hit.checksum);
            if same {
                if let Ok(freed) = remove_slot_files(&hit.leaf, hit.slot) {
                    i.add_size(-(freed as i64));
                }
            }
        }
    }

    /// Records that the backend could not serialize a built program (warned once).
    pub fn note_serialize_failure(&self, reason: &dyn fmt::Display) {
        self.inner.warned.warn(
            WarnCause::Serialize,
            &self.inner.s.root,
            &format_args!("could not serialize a built program ({reason})"),
        );
    }

    /// Waits for a background eviction this instance started, if one is running.
    pub fn wait_for_eviction(&self) {
        let h = self.inner.evict_thread.lock().take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Runs one eviction pass now, down to `target` bytes (`None`: no size target) and removing every
    /// entry last accessed before `older_than`. Entries being written are skipped. Waits up to
    /// `lock_timeout` for another evictor; `ran` is false if it never got its turn.
    pub fn evict(
        &self,
        target: Option<u64>,
        older_than: Option<std::time::SystemTime>,
    ) -> io::Result<EvictReport> {
        self.inner.evict(evict::Plan {
            target,
            older_than,
            wait: true,
        })
    }

    /// The total size as tracked in `<root>/v1/size`, if that file exists and is readable.
    pub fn tracked_size(&self) -> Option<u64> {
        evict::read_size_file(&self.inner.v1)
    }
}

impl Inner {
    fn leaf(&self, key: &DiskKey) -> PathBuf {
        let [a, b, c, d] = key.dir_names();
        self.v1.join(a).join(b).join(c).join(d)
    }

    fn trace(&self, f: impl FnOnce()) {
        if self.s.trace {
            f();
        }
    }

    fn warn_io(&self, e: &io::Error, path: &Path, what: &str) {
        self.warned
            .warn(WarnCause::of(e), path, &format_args!("{what}: {e}"));
    }

    fn count_lookup(&self, key: &DiskKey, hit: Option<&DiskHit>, waited: Option<Duration>) {
        match hit {
            Some(h) => {
                bump(&self.counters.hits, 1);
                bump(&self.counters.bytes_read, h.bytes.len() as u64);
                bump(&self.counters.build_nanos_saved, nanos(h.build_time));
                self.trace(|| {
                    tracing::debug!(target: "kpc::cache::disk", key = %key.digest(), label = key.label(),
                        slot = h.slot, bytes = h.bytes.len(), waited_ms = waited.map(|w| w.as_secs_f64() * 1e3),
                        "hit")
                });
            }
            None => {
                bump(&self.counters.misses, 1);
                self.trace(|| {
                    tracing::debug!(target: "kpc::cache::disk", key = %key.digest(), label = key.label(),
                        waited_ms = waited.map(|w| w.as_secs_f64() * 1e3), "miss")
                });
            }
        }
    }

    /// Creates the leaf directory of `key` (and its parents). Retries a few times because an evictor may
    /// remove an emptied parent between our mkdir calls.
    fn ensure_leaf(&self, key: &DiskKey) -> io::Result<PathBuf> {
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

    fn create_chain(&self, key: &DiskKey) -> io::Result<()> {
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
        for name in key.dir_names() {
            dir.push(name);
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

    /// The first valid entry for `key` in `leaf`. Defective entries met on the way are dealt with.
    fn find(&self, leaf: &Path, key: &DiskKey, touch: bool) -> Option<DiskHit> {
        let slots = match list_slots(leaf) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                self.read_error(&e, leaf);
                return None;
            }
        };
        for n in slots {
            match self.read_slot(leaf, n, key, touch) {
                SlotRead::Hit(h) => return Some(h),
                SlotRead::OtherKey | SlotRead::Gone => {}
                SlotRead::Defect(kind, d) => self.on_defect(leaf, n, kind, &d),
                SlotRead::Io(e, path) => self.read_error(&e, &path),
            }
        }
        None
    }

    fn read_error(&self, e: &io::Error, path: &Path) {
        bump(&self.counters.read_errors, 1);
        self.warn_io(e, path, "cannot read an entry");
    }

    fn read_slot(&self, leaf: &Path, n: u32, key: &DiskKey, touch: bool) -> SlotRead {
        let src = slot_file(leaf, n, "src");
        let (header, rec) = match read_src(&src) {
            Ok(Ok(x)) => x,
            Ok(Err(d)) => return SlotRead::Defect(FileKind::Src, d),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return SlotRead::Gone,
            Err(e) => return SlotRead::Io(e, src),
        };
        if !rec.matches(key) {
            return SlotRead::OtherKey;
        }
        if header.key_digest != key.digest().0 {
            return SlotRead::Defect(FileKind::Src, Defect::KeyMismatch);
        }
        let bin = slot_file(leaf, n, "bin");
        let mut f = match File::open(&bin) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return SlotRead::Defect(FileKind::Bin, Defect::MissingBin);
            }
            Err(e) => return SlotRead::Io(e, bin),
        };
        let meta = match f.metadata() {
            Ok(m) => m,
            Err(e) => return SlotRead::Io(e, bin),
        };
        let v = match read_verified(&mut f, meta.len(), FileKind::Bin) {
            Ok(Ok(v)) => v,
            Ok(Err(d)) => return SlotRead::Defect(FileKind::Bin, d),
            Err(e) => return SlotRead::Io(e, bin),
        };
        if v.header.key_digest != key.digest().0 {
            return SlotRead::Defect(FileKind::Bin, Defect::KeyMismatch);
        }
        if touch {
            let now = FileTime::now();
            let atime = FileTime::from_last_access_time(&meta);
            if now.unix_seconds() - atime.unix_seconds() >= self.s.touch_interval.as_secs() as i64 {
                // Best effort: a read-only cache still serves hits, its recency just goes stale.
                let _ = filetime::set_file_handle_times(&f, Some(now), None);
            }
        }
        SlotRead::Hit(DiskHit {
            bytes: v.payload,
            build_time: rec.build_time,
            leaf: leaf.to_owned(),
            slot: n,
            checksum: v.header.checksum,
        })
    }

    /// A reader met a defective slot. Under the slot lock (so no writer or evictor is mid-way through it)
    /// the slot is checked again and removed if still defective. Without the lock (read-only directory)
    /// the defect is counted and left in place.
    fn on_defect(&self, leaf: &Path, n: u32, kind: FileKind, d: &Defect) {
        let path = slot_file(leaf, n, kind.ext());
        let report = |removed: bool| {
            bump(&self.counters.corruptions, 1);
            self.warned.warn(
                WarnCause::Corrupt,
                &path,
                &format_args!(
                    "entry {}: {d} ({})",
                    path.display(),
                    if removed { "removed" } else { "left in place" }
                ),
            );
            self.trace(|| tracing::debug!(target: "kpc::cache::disk", path = %path.display(), defect = %d, removed, "corrupt"));
        };
        match lock::try_lock(&slot_file(leaf, n, "lock"), true) {
            Ok(Some(_l)) => {
                if let SlotCheck::Defective(..) = check_slot(leaf, n) {
                    match remove_slot_files(leaf, n) {
                        Ok(freed) => {
                            self.add_size(-(freed as i64));
                            report(true);
                        }
                        Err(_) => report(false),
                    }
                }
            }
            // Someone is writing or removing this slot right now: it is theirs to deal with.
            Ok(None) => {}
            Err(_) => report(false),
        }
    }

    fn put(self: &Arc<Inner>, key: &DiskKey, bytes: &[u8], build_time: Duration) -> PutOutcome {
        let src = key.record_json(build_time, bytes.len() as u64);
        let total = (2 * HEADER_LEN + src.len() + bytes.len()) as u64;
        if self.s.max_size > 0 && total > self.s.max_size {
            bump(&self.counters.skipped, 1);
            self.warned.warn(
                WarnCause::TooLarge,
                &self.s.root,
                &format_args!(
                    "an entry of {total} bytes cannot fit in KPC_CACHE_MAX_SIZE={}",
                    self.s.max_size
                ),
            );
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
                Err(e) => return fail(&e, &self.leaf(key)),
            };
            if self.find(&leaf, key, false).is_some() {
                return PutOutcome::AlreadyPresent;
            }
            match self.put_in_leaf(&leaf, key, bytes, &src, total) {
                Ok(Some(n)) => return PutOutcome::Published(n),
                Ok(None) => return PutOutcome::Skipped,
                // The leaf was removed by an evictor under us: make it again.
                Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 3 => tries += 1,
                Err(e) => return fail(&e, &leaf),
            }
        }
    }

    fn put_in_leaf(
        self: &Arc<Inner>,
        leaf: &Path,
        key: &DiskKey,
        bytes: &[u8],
        src: &[u8],
        total: u64,
    ) -> io::Result<Option<u32>> {
        for n in 0..MAX_SLOTS {
            if slot_file(leaf, n, "src").exists() {
                continue;
            }
            // The lock file stays with the published entry (removers unlink it with the entry), so an
            // evictor opens it instead of creating one: half the metadata writes of a removal.
            let Some(_slot) = lock::try_lock(&slot_file(leaf, n, "lock"), false)? else {
                // Another writer is filling this slot (or an evictor emptying it): take the next one.
                continue;
            };
            if slot_file(leaf, n, "src").exists() {
                continue;
            }
            // Leftovers of a writer killed mid-way; the slot lock says nobody is working on them.
            remove_slot_files(leaf, n)?;
            self.publish(leaf, n, key, bytes, src)?;
            bump(&self.counters.puts, 1);
            bump(&self.counters.bytes_written, total);
            self.trace(|| {
                tracing::debug!(target: "kpc::cache::disk", key = %key.digest(), label = key.label(),
                    slot = n, bytes = total, "put")
            });
            drop(_slot);
            let now = self.add_size(total as i64);
            if let Some(t) = now {
                self.maybe_evict(t);
            }
            return Ok(Some(n));
        }
        bump(&self.counters.skipped, 1);
        self.warned.warn(
            WarnCause::Io,
            leaf,
            &format_args!("all {MAX_SLOTS} slots of a leaf directory are taken"),
        );
        Ok(None)
    }

    fn publish(
        &self,
        leaf: &Path,
        n: u32,
        key: &DiskKey,
        bytes: &[u8],
        src: &[u8],
    ) -> io::Result<()> {
        let digest = key.digest().0;
        let (bin_tmp, src_tmp) = (slot_file(leaf, n, "bin.tmp"), slot_file(leaf, n, "src.tmp"));
        let (bin, srcp) = (slot_file(leaf, n, "bin"), slot_file(leaf, n, "src"));
        let r = (|| {
            write_file(
                &bin_tmp,
                &encode_header(FileKind::Bin, &digest, bytes),
                bytes,
                self.s.sync,
            )?;
            write_file(
                &src_tmp,
                &encode_header(FileKind::Src, &digest, src),
                src,
                self.s.sync,
            )?;
            // .bin first: a reader goes through .src, so once .src is visible its .bin already is.
            fs::rename(&bin_tmp, &bin)?;
            fs::rename(&src_tmp, &srcp)?;
            if self.s.sync {
                sync_dir(leaf)?;
            }
            Ok(())
        })();
        if r.is_err() {
            for p in [&src_tmp, &bin_tmp, &srcp, &bin] {
                let _ = fs::remove_file(p);
            }
        }
        r
    }

    fn maybe_evict(self: &Arc<Inner>, total: u64) {
        if self.s.max_size == 0 || total <= self.s.max_size {
            return;
        }
        // One pass per instance at a time; the evict.lock file does the same across processes.
        if self.evicting.swap(true, Ordering::AcqRel) {
            return;
        }
        let plan = evict::Plan {
            target: Some(self.low_watermark()),
            older_than: None,
            wait: false,
        };
        let run = move |me: &Inner| {
            if let Err(e) = me.evict(plan) {
                me.warn_io(&e, &me.v1, "eviction failed");
            }
            me.evicting.store(false, Ordering::Release);
        };
        if self.s.background_eviction {
            let me = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("kpc-disk-evict".into())
                .spawn(move || run(&me));
            match spawned {
                // A previous pass's handle is dropped (detached): it has finished, or it would still hold
                // `evicting`.
                Ok(h) => drop(self.evict_thread.lock().replace(h)),
                Err(_) => run(self),
            }
        } else {
            run(self);
        }
    }

    fn low_watermark(&self) -> u64 {
        (self.s.max_size as u128 * self.s.low_watermark_percent.min(100) as u128 / 100) as u64
    }
}
