//! `PersistentCache`: verified program binaries on disk, shared by every process that uses the same
//! cache directory. It knows nothing of Vulkan or OpenCL: it stores opaque bytes under a [`StoreKey`].
//! It is the first [`Store`](crate::cache::Store) (`store.rs`): the local, read-write level of the
//! store chain, and, opened read-only, each layer of `KPC_CACHE_READONLY_DIRS`.
//!
//! # Layout
//! ```text
//! <root>/v1/<device>/<image>/<spec>/<options>/<n>.src   key record (full key values, JSON)
//!                                            /<n>.bin   the binary
//!                                            /key.lock  the key's build lock (only while building)
//! <root>/v1/size                                        tracked total size and entry count (see "Size" below)
//! <root>/v1/evict.lock                                  held by the one process evicting
//! <root>/v1/names/<device>                              image directories per image name (`names.rs`)
//! <root>/v1/evict.recheck                               "run again": left for the evicting process
//! <root>/evicted.log                                   what eviction removed, and misses it caused (`evicted.rs`)
//! <root>/misses.log                                    the miss journal (`crate::cache::journal`)
//! <root>/quarantine/                                    entries `kpc cache verify --fix` set aside
//! <root>/trash/<pid>-<nanos>-<i>/                       files an eviction pass removed, until its sweep
//! ```
//! With `KPC_CACHE_LOCK_DIR` the lock files (`key.lock`, the leaf locks, `evict.lock`, the size file's
//! lock) live there instead (`locks.rs`). A put that would leave the file system under
//! `KPC_CACHE_MIN_FREE` is skipped (`space.rs`).
//!
//! Directory names are 16 hex characters of BLAKE3 ([`StoreKey::dir_names`]). Several keys can share a
//! leaf directory only through a hash collision; their entries then take successive slots `n`, and a
//! reader compares the full key values in each `.src`. Both files carry a header with a checksum
//! ([`entry`]), so nothing unverified is returned.
//!
//! # Protocol
//! - **Readers take no lock.** They list the leaf, read each `<n>.src`, compare the key, then read and
//!   verify `<n>.bin`. Files only ever appear by `rename`, so a reader sees a complete file or none.
//! - **Writers** take the leaf's lock (a `flock` on the leaf directory itself, so an entry costs no
//!   lock file; see `lock.rs`), waiting at most `KPC_CACHE_LOCK_TIMEOUT` for another writer or a
//!   remover, and pick the first slot `n` without a `.src`; so no two writers ever write one slot.
//!   Under the leaf's lock the writer writes `<n>.bin.tmp` and `<n>.src.tmp`, fsyncs them, renames
//!   the `.bin` and then the `.src` into place (a visible `.src` therefore always has its `.bin`),
//!   and fsyncs the directory. Only keys whose directory names collide share a leaf, so writers of
//!   different keys never wait for each other.
//! - **Single flight across processes.** After a miss, [`PersistentCache::lock_for_build`] returns
//!   either a hit or a `BuildGuard` holding the key's build lock (`key.lock` in the leaf). Another process that misses
//!   the same key waits for that lock (up to `KPC_CACHE_LOCK_TIMEOUT`) and reads again, so a key is
//!   built once however many processes start together. After the timeout it builds itself.
//! - **Removal** (eviction, corruption, `prune`, `clear`) happens only under the leaf's lock
//!   (try-only: a leaf being written is skipped), `.src` first, so readers stop finding the entry
//!   before its binary goes. Eviction renames the files into its trash instead of unlinking them,
//!   and removes emptied directories in a sweep after the pass (`trash.rs` says why); a directory is
//!   only ever removed by `rmdir`, which fails if a writer refilled it (and a leaf is removed under
//!   its lock, so a writer that has just locked it keeps it).
//! - Locks are `flock`s (see `lock.rs`): a killed process never leaves a lock behind.
//!
//! - **Read-only lookups** ([`PersistentCache::get_read_only`], what a read-only layer does) change
//!   nothing: no access time, no lock, a defective entry counted and left in place.
//!
//! # Misses
//! Every miss this cache counts is explained (`explain.rs`): the entries one key part away are read
//! first, at paths the key's directory names give and, for a changed image, through the name index
//! (`names.rs`); then, within [`explain::MAX_EXPLAIN_RECORDS`] records, entries further away. The
//! nearest one's differing fields are named ([`MissExplanation`]), the cause counted in [`DiskStats`]
//! and traced on the `miss` line. A hit never pays for it, and its cost does not grow with the
//! number of entries cached.
//!
//! # Failures
//! Every failure of the disk layer (missing or unwritable directories, a full disk, a read-only root,
//! corrupt entries, a lock timeout) is a miss or a skipped put, never an error for the caller, and is
//! warned about once per cause per cache instance ([`WarnCause`]).
//!
//! # Size
//! The total (both files of every entry, headers included) is tracked in `<root>/v1/size`, exactly,
//! under any interleaving of puts, removals and eviction passes in threads and processes (`count.rs`
//! gives the protocol), with the number of entries: a put walks the tree only when the record must be
//! rebuilt (a new cache, or a process killed mid-change), and a put that takes the total over
//! `max_size` or the entry count over `max_entries` (`KPC_CACHE_MAX_ENTRIES`)
//! asks for an eviction pass (`schedule.rs`), which removes the least recently accessed entries down
//! to the low watermark on a background thread; a put that crosses the limit while a pass runs makes
//! that pass (or another) run again, so once writers stop the total is at or under the limit. A
//! process killed inside a change leaves a flag that makes the next change or pass measure the tree
//! again, once. Hits record access by setting the `.bin`'s access time explicitly, at most once per
//! `touch_interval`, so recency works on noatime and relatime mounts and a hit writes nothing else.

mod boundlog;
mod chain;
mod count;
mod evict;
pub mod evicted;
pub mod explain;
mod inventory;
mod loading;
mod lock;
mod locks;
mod lookup;
mod names;
mod nearest;
mod put;
mod recent;
mod schedule;
mod settings;
mod slot;
mod space;
pub mod stats;
mod store;
mod trash;
mod walk;

pub use crate::cache::store::entry;
pub use evict::EvictReport;
pub use evicted::{Evicted, EvictionCost};
pub use explain::{FieldDiff, MissCause, MissExplanation, compare_keys};
pub use inventory::EntryInfo;
pub(crate) use lookup::Lookup;
pub use settings::DiskCacheSettings;
pub use stats::DiskStats;

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::cache::pass_gate::PassGate;
use crate::cache::store::key::StoreKey;
use crate::cache::store::outcome::PutOutcome;
use crate::cache::store::warn::WarnCause;
use crate::config::Config;
use stats::{DiskCounters, Warned};

/// Name of the versioned directory under the root; bumping the entry format changes it.
pub const VERSION_DIR: &str = "v1";
/// Most slots one leaf directory may hold; a put that finds them all taken is skipped.
pub const MAX_SLOTS: u32 = 64;

/// The on-disk cache. Cloning is cheap and shares counters and warnings.
///
/// Guarantees: a lookup returns only bytes that were put under exactly this key and pass their checksum;
/// no method returns an error or panics on a disk problem; a killed process leaves no lock and no
/// visible partial entry; the tracked total equals the bytes of the tree's entry files whenever no
/// change is in progress; with `max_size > 0`, every put that exceeds the limit is followed by a pass
/// that brings the total under the low watermark (entries being written excepted), so once writers stop
/// (and [`PersistentCache::wait_for_eviction`] returns) the total is at or under the limit.
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
    /// Where the locks go (`KPC_CACHE_LOCK_DIR`).
    locks: locks::Locks,
    counters: DiskCounters,
    warned: Warned,
    /// One eviction runner per instance, re-run for puts that came while it ran (`schedule.rs`).
    passes: PassGate,
    /// Background eviction runners and deferred sweeps, for `wait_for_eviction`.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// This instance, for the runner a pass request starts from code that holds only `&Inner`.
    me: std::sync::Weak<Inner>,
    /// Causes of counted misses, until their builds take them (the miss journal).
    miss_causes: recent::RecentCauses,
}

static UNRESOLVED_WARNING: std::sync::Once = std::sync::Once::new();

impl PersistentCache {
    /// A cache with these settings. Touches nothing on disk until the first lookup or put.
    pub fn new(settings: DiskCacheSettings) -> Self {
        let v1 = settings.root.join(VERSION_DIR);
        let locks = locks::Locks::new(&settings.root, &v1, settings.lock_dir.as_deref());
        PersistentCache {
            inner: Arc::new_cyclic(|me| Inner {
                s: settings,
                v1,
                locks,
                counters: DiskCounters::default(),
                warned: Warned::default(),
                passes: PassGate::new(),
                threads: Mutex::new(Vec::new()),
                me: me.clone(),
                miss_causes: recent::RecentCauses::default(),
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
                    crate::warnings::emit!(
                        Some(&config.warning_sink()),
                        target: "kpc::cache::disk",
                        cause: "unavailable",
                        "disk cache off: none of KPC_CACHE_DIR, XDG_CACHE_HOME (absolute) or HOME (absolute) is set"
                    );
                });
                None
            }
        }
    }

    /// [`PersistentCache::from_config`], with its root made and checked: `Err` says why a
    /// configured root cannot be used (a regular file, a directory that cannot be created), so
    /// that a context reports it instead of failing every put without a word.
    pub fn open_from_config(config: &Config) -> Result<Option<Self>, String> {
        let Some(cache) = PersistentCache::from_config(config) else {
            return Ok(None);
        };
        let root = cache.root();
        match std::fs::create_dir_all(root) {
            Ok(()) if root.is_dir() => Ok(Some(cache)),
            Err(_) | Ok(()) if root.exists() && !root.is_dir() => Err(format!(
                "cache root {} exists and is not a directory",
                root.display()
            )),
            Ok(()) => Err(format!("cache root {} is not a directory", root.display())),
            Err(e) => Err(format!("cannot create cache root {}: {e}", root.display())),
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
    pub fn entry_dir(&self, key: &StoreKey) -> PathBuf {
        self.inner.leaf(key)
    }

    /// Counts a hit whose binary the driver compiled again when it was loaded (see
    /// [`DiskStats::recompiled_hits`]).
    pub fn note_recompiled(&self, build_time: std::time::Duration) {
        self.inner.counters.recompiled(build_time);
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

    /// Records that the backend could not serialize a built program (warned once).
    pub fn note_serialize_failure(&self, reason: &dyn fmt::Display) {
        self.inner.warned.warn(
            &self.inner.s.warnings,
            WarnCause::Serialize,
            &self.inner.s.root,
            &format_args!("could not serialize a built program ({reason})"),
        );
    }

    /// Waits for every background eviction (and sweep of [`PersistentCache::evict_deferred`]) this
    /// instance started, including the passes they asked for while running.
    pub fn wait_for_eviction(&self) {
        self.inner.join_threads();
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
            target_entries: None,
            older_than,
            wait: true,
            defer_sweep: false,
            asked: false,
            wait_busy: false,
        })
    }

    /// Like [`PersistentCache::evict`], but returns once the entries are removed from the tree (their
    /// files renamed into `<root>/trash`) and the size file is updated, leaving the removal of emptied
    /// directories and the deletion of the trash to a background thread that holds the eviction lock
    /// until it is done ([`PersistentCache::wait_for_eviction`] waits for it). The removed entries are
    /// gone for every reader when this returns; their disk space is freed by the sweep. If the process
    /// exits first, the next eviction pass (of any process) finishes the job.
    pub fn evict_deferred(
        &self,
        target: Option<u64>,
        older_than: Option<std::time::SystemTime>,
    ) -> io::Result<EvictReport> {
        self.inner.evict(evict::Plan {
            target,
            target_entries: None,
            older_than,
            wait: true,
            defer_sweep: true,
            asked: false,
            wait_busy: false,
        })
    }

    /// `key`'s latest eviction, if the eviction record (`<root>/evicted.log`) has one. Reads the record (bounded); changes nothing.
    pub fn evicted(&self, key: &StoreKey) -> Option<Evicted> {
        self.inner.evicted(key)
    }

    /// What eviction cost since `since`, by the eviction record: entries and bytes evicted, the
    /// misses on evicted entries and their bytes, and the limit that would have served them
    /// (a cost record). Every process sharing the directory contributes; the record keeps the last
    /// [`evicted::EVICTED_RECORDS`] records, so a long period may be cut short. Errors: the record
    /// exists but cannot be read.
    pub fn eviction_cost(&self, since: std::time::SystemTime) -> io::Result<EvictionCost> {
        self.inner.eviction_cost(since)
    }

    /// The cause this instance counted for `key`'s latest miss, taken (once) by the build that
    /// followed it.
    pub(crate) fn take_miss_cause(&self, key: &StoreKey) -> Option<MissCause> {
        self.inner.miss_causes.take(key)
    }

    /// The miss journal's bounded record file under this cache (see `crate::cache::journal`).
    pub(crate) fn journal_log(&self) -> boundlog::BoundedLog {
        boundlog::BoundedLog::new(self.inner.s.root.join("misses.log"), 4096, 200)
    }

    /// The total size as tracked in `<root>/v1/size` (the `.src` and `.bin` files of the tree, see
    /// "Size" above), when the record is settled: `None` when it is missing or unreadable, while an
    /// eviction pass is between its removals and their count, and when a process died in the middle of
    /// a change (the next change or pass measures it again).
    pub fn tracked_size(&self) -> Option<u64> {
        count::read_record(&self.inner.v1)
            .filter(|r| !r.dirty && !r.evicting)
            .map(|r| r.total)
    }

    /// The number of entries (`.src` files) as tracked in `<root>/v1/size`, when the record is
    /// settled (as [`PersistentCache::tracked_size`]): what `KPC_CACHE_MAX_ENTRIES` bounds.
    pub fn tracked_entries(&self) -> Option<u64> {
        count::read_record(&self.inner.v1)
            .filter(|r| !r.dirty && !r.evicting)
            .map(|r| r.entries)
    }
}

impl Inner {
    /// Removes `key`'s leaf directory if it is empty and unlocked (as a sweep would), then each
    /// emptied parent up to the version directory: what a lock taken for a build that published
    /// nothing leaves behind. A writer that meanwhile made the chain again keeps it (its leaf is
    /// locked or not empty, and `rmdir` of a non-empty parent fails).
    fn remove_empty_chain(&self, key: &StoreKey) {
        let leaf = self.leaf(key);
        if !lock::remove_leaf_dir(&leaf) {
            return;
        }
        let mut dir = leaf.parent();
        while let Some(d) = dir {
            if d == self.v1 || fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }

    fn leaf(&self, key: &StoreKey) -> PathBuf {
        let [a, b, c, d] = key.dir_names();
        self.v1.join(a).join(b).join(c).join(d)
    }

    fn trace(&self, f: impl FnOnce()) {
        if self.s.trace {
            f();
        }
    }

    fn warn_io(&self, e: &io::Error, path: &Path, what: &str) {
        self.warned.warn(
            &self.s.warnings,
            WarnCause::of(e),
            path,
            &format_args!("{what}: {e}"),
        );
    }
}
