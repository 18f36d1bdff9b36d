//! Stores: where persisted binaries live, behind one small object-safe trait.
//!
//! The persistent layer is a [`StoreChain`]: stores looked up in order after the in-memory cache. The
//! local on-disk cache ([`PersistentCache`](crate::cache::PersistentCache), read-write) comes first,
//! then the read-only layers (`KPC_CACHE_READONLY_DIRS`, each a disk cache wrapped in
//! [`ReadOnlyStore`]), then whatever an embedder adds (its own store; later a remote one). A hit from a
//! lower store is copied up to the first writable store above it, so the next process hits locally.
//!
//! One file per implementation, in the spirit of sccache's `src/cache/`: this file holds the trait and
//! what implementations share, `chain.rs` the ordered lookup, `readonly.rs` the read-only wrapper, and
//! the disk cache's implementation sits with the disk cache (`src/cache/disk/store.rs`).
//!
//! # What a store must guarantee
//! - **Only verified bytes.** A [`StoreHit`] can be made in two ways: by the disk cache, which verifies
//!   its own files, or by [`StoreHit::unseal`], which checks a sealed entry (see [`seal`]) against the
//!   key: both checksums, the full key values, and that the binary belongs to that key. A store that
//!   keeps entries anywhere else (a map, a database, a remote service) stores the sealed bytes [`seal`]
//!   makes and hands back what it read through [`StoreHit::unseal`]: nothing it returns can reach a
//!   driver unverified, whatever happened to it in between.
//! - **Failures are misses.** No method returns an error for the caller to handle (except
//!   [`Store::list`], an inspection): an unreachable, full, slow or corrupt store is a miss or a
//!   skipped put, warned about once per cause (`StoreWarnings`).
//! - **No lock across calls.** The chain holds no mutex while it calls a store, so a slow store delays
//!   only the request that asked it.

pub(crate) mod acquire;
pub mod auth;
pub mod chain;
pub(crate) mod compress;
pub(crate) mod crash;
pub mod entry;
pub mod explain;
pub mod fleet;
pub mod idle;
pub mod readonly;
pub mod remote;

pub mod key;
pub(crate) mod outcome;
pub mod provenance;
pub(crate) mod warn;
pub use auth::EntryAuth;
pub use chain::{LevelStats, StoreChain, Turn};
pub use fleet::Fleet;
pub use key::{KeyRecord, StoreKey};
pub use outcome::PutOutcome;
pub use provenance::Provenance;
pub use readonly::ReadOnlyStore;
#[cfg(all(feature = "remote", not(loom)))]
pub use remote::{GcPolicy, GcReason, RemoteStore};
pub use warn::WarnCause;

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use entry::{Defect, FileKind, HEADER_LEN};
use explain::MissExplanation;
use warn::Warned;

/// What kind of place a store is: decides how the runtime reports a hit from it
/// ([`Source`](crate::runtime::Source)) and whether the chain writes to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// The local on-disk cache: read-write, with a cross-process build lock.
    Disk,
    /// A read-only layer: looked up, never written, locked, evicted or repaired.
    ReadOnly,
    /// Any other store: an embedder's own, for example.
    Other,
    /// The remote tier (`KPC_CACHE_REMOTE`): written after the local disk, in the background or
    /// bounded by `KPC_CACHE_REMOTE_TIMEOUT`.
    Remote,
}

impl StoreKind {
    /// Whether the chain writes to a store of this kind (builds and backfills).
    pub fn writable(self) -> bool {
        self != StoreKind::ReadOnly
    }
}

/// How a lookup may treat the store; a store honours it on every lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The lookup may record the access (for eviction by recency) and repair what it finds broken
    /// (remove a corrupt entry).
    ReadWrite,
    /// The lookup must leave the store exactly as it was: no access time recorded, nothing removed,
    /// moved or created (no lock file either). What a read-only layer asks of the store it wraps.
    ReadOnly,
}

/// A verified binary: bytes that were stored under exactly the key asked for and pass their
/// checksums, with how long the build that produced them took.
///
/// Guarantees: the only constructors are [`StoreHit::unseal`], which verifies, and the disk cache's
/// own verified read; so holding a `StoreHit` means the bytes were verified.
#[derive(Clone)]
pub struct StoreHit {
    bytes: Vec<u8>,
    build_time: Duration,
    provenance: Option<Provenance>,
}

impl fmt::Debug for StoreHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreHit")
            .field("bytes", &self.bytes.len())
            .field("build_time", &self.build_time)
            .finish()
    }
}

impl StoreHit {
    /// A hit from bytes a store verified itself (the disk cache).
    pub(crate) fn verified(bytes: Vec<u8>, build_time: Duration) -> StoreHit {
        StoreHit {
            bytes,
            build_time,
            provenance: None,
        }
    }

    /// Verifies `sealed` (as [`seal`] made it) against `key` and returns the binary it holds.
    ///
    /// Errors: the defect found: truncated or trailing bytes, bad magic or version, a checksum
    /// mismatch, a key record that is not `key`'s (every value compared, not just hashes), or a binary
    /// bound to another key.
    pub fn unseal(key: &StoreKey, sealed: &[u8]) -> Result<StoreHit, Defect> {
        let (src, bin) = split_sealed(sealed)?;
        let (src_header, record) = entry::verify_bytes(src, FileKind::Src)?;
        let record = KeyRecord::parse(record).ok_or(Defect::BadRecord)?;
        if !record.matches(key) || src_header.key_digest != key.digest().0 {
            return Err(Defect::KeyMismatch);
        }
        let (bin_header, payload) = entry::verify_bytes(bin, FileKind::Bin)?;
        if bin_header.key_digest != key.digest().0 {
            return Err(Defect::KeyMismatch);
        }
        Ok(StoreHit {
            bytes: payload.to_vec(),
            build_time: record.build_time,
            provenance: record.provenance,
        })
    }

    /// The same hit, with the provenance its envelope carried.
    pub(crate) fn with_provenance(mut self, provenance: Option<Provenance>) -> StoreHit {
        self.provenance = provenance;
        self
    }

    /// Who built the binary, where the store knew it (a verified remote or bundle envelope).
    pub fn provenance(&self) -> Option<&Provenance> {
        self.provenance.as_ref()
    }

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
}

/// `key`'s entry for `bytes` built in `build_time` as one self-verifying byte string: the disk cache's
/// two files back to back (the key record, then the binary, each behind a header with the key's digest
/// and a checksum). [`StoreHit::unseal`] checks it.
pub fn seal(key: &StoreKey, bytes: &[u8], build_time: Duration) -> Vec<u8> {
    let digest = key.digest().0;
    let src = key.record_json(build_time, bytes.len() as u64, None);
    let mut out = Vec::with_capacity(2 * HEADER_LEN + src.len() + bytes.len());
    out.extend_from_slice(&entry::encode_header(FileKind::Src, &digest, &src));
    out.extend_from_slice(&src);
    out.extend_from_slice(&entry::encode_header(FileKind::Bin, &digest, bytes));
    out.extend_from_slice(bytes);
    out
}

/// The key record of a sealed entry, verified on its own (the binary is not read): what a store's
/// [`Store::list`] reports. `None` if it does not verify.
pub fn sealed_record(sealed: &[u8]) -> Option<KeyRecord> {
    let (src, _) = split_sealed(sealed).ok()?;
    let (_, record) = entry::verify_bytes(src, FileKind::Src).ok()?;
    KeyRecord::parse(record)
}

/// Splits a sealed entry at the end of its first file, whose header gives its length.
fn split_sealed(sealed: &[u8]) -> Result<(&[u8], &[u8]), Defect> {
    if sealed.len() < HEADER_LEN {
        return Err(Defect::Truncated);
    }
    let raw: &[u8; HEADER_LEN] = sealed[..HEADER_LEN].try_into().expect("header length");
    // The length check against the whole is the first file's own: its header must describe a file
    // that ends within `sealed`.
    let len = u64::from_le_bytes(raw[16..24].try_into().expect("8 bytes"));
    let end = len
        .checked_add(HEADER_LEN as u64)
        .filter(|&e| e <= sealed.len() as u64)
        .ok_or(Defect::Truncated)? as usize;
    Ok(sealed.split_at(end))
}

/// What a build lock request came to.
#[derive(Debug)]
pub enum BuildLock {
    /// This store does not lock (read-only, or without single flight): the chain asks the next one.
    NotOffered,
    /// The store locks, but the lock could not be had (a timeout, an unwritable store): build
    /// without it.
    Unavailable,
    /// The key's build lock, held until the guard drops: build, put, then drop it.
    Held(LockGuard),
    /// While this caller waited for the lock, another builder published the key: use this instead of
    /// building.
    Published(StoreHit),
}

/// A store's build lock on one key; dropping it releases the lock.
pub struct LockGuard {
    _held: Box<dyn Send + Sync>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LockGuard")
    }
}

impl LockGuard {
    /// A guard that releases the lock when `held` drops (for example a file lock, or a handle that
    /// deletes a remote key on drop).
    pub fn new(held: impl Send + Sync + 'static) -> LockGuard {
        LockGuard {
            _held: Box::new(held),
        }
    }
}

/// Which entry [`Store::remove`] removes, and why.
#[derive(Clone, Copy)]
pub enum Removal<'a> {
    /// Whatever entry the key has (maintenance, or a caller that knows better).
    Any,
    /// The backend refused `bytes`, which this store returned for the key (a driver change the device
    /// fingerprint missed, say): remove the entry only if it still holds exactly these bytes, so a
    /// replacement published meanwhile is kept. The store counts and warns as it sees fit.
    Refused {
        /// The bytes the backend refused.
        bytes: &'a [u8],
        /// What the backend said.
        reason: &'a dyn fmt::Display,
    },
}

impl fmt::Debug for Removal<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Removal::Any => f.write_str("Any"),
            Removal::Refused { bytes, reason } => f
                .debug_struct("Refused")
                .field("bytes", &bytes.len())
                .field("reason", &format_args!("{reason}"))
                .finish(),
        }
    }
}

/// One entry as [`Store::list`] reports it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreEntry {
    /// The entry's key record (the full key values, build time, binary length).
    pub record: KeyRecord,
    /// Bytes the entry occupies in the store (headers and key record included).
    pub bytes: u64,
    /// When it was last used, where the store knows.
    pub last_access: Option<SystemTime>,
}

impl StoreEntry {
    /// An entry of key record `record` occupying `bytes` in the store, last used at `last_access`
    /// where the store knows: what a [`Store::list`] implementation returns.
    pub fn new(record: KeyRecord, bytes: u64, last_access: Option<SystemTime>) -> Self {
        StoreEntry {
            record,
            bytes,
            last_access,
        }
    }
}

/// A snapshot of one store's counters (this process only), each read atomically; counters only
/// grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Lookups that returned a verified binary.
    pub hits: u64,
    /// Lookups that found nothing usable.
    pub misses: u64,
    /// Failures turned into a miss or a skipped put: unreadable or corrupt entries, failed puts, lock
    /// timeouts, an unreachable store.
    pub errors: u64,
    /// Entries stored.
    pub puts: u64,
    /// Payload bytes returned by hits.
    pub bytes_read: u64,
    /// Bytes stored by puts.
    pub bytes_written: u64,
    /// Calls not made because the store was known to be unreachable (the remote's circuit breaker was
    /// open); not counted in `errors`.
    pub skipped: u64,
    /// Times the remote's circuit breaker opened: each is one call that timed out or could not
    /// connect, and paid for it.
    pub trips: u64,
}

/// Counters a store implementation can keep with one relaxed atomic each.
#[derive(Debug, Default)]
pub struct StoreCounters {
    hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
    puts: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

impl StoreCounters {
    /// Counts a hit of `bytes` payload bytes.
    pub fn hit(&self, bytes: usize) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    /// Counts a miss.
    pub fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
    /// Counts a failure turned into a miss or a skipped put.
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
    /// Counts a put of `bytes` bytes.
    pub fn put(&self, bytes: usize) {
        self.puts.fetch_add(1, Ordering::Relaxed);
        self.bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }
    /// The counts so far.
    pub fn snapshot(&self) -> StoreStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreStats {
            hits: l(&self.hits),
            misses: l(&self.misses),
            errors: l(&self.errors),
            puts: l(&self.puts),
            bytes_read: l(&self.bytes_read),
            bytes_written: l(&self.bytes_written),
            ..StoreStats::default()
        }
    }
}

/// Warn-once bookkeeping for a store: the first problem of each [`WarnCause`] is logged (target
/// `kpc::cache::store`, with the store's name and the cause), later ones of the same cause are not, so
/// a thousand requests failing the same way log one line.
#[derive(Debug)]
pub(crate) struct StoreWarnings {
    store: String,
    warned: Warned,
    sink: crate::warnings::Sink,
}

impl StoreWarnings {
    /// Bookkeeping for the store named `store`, warning through the process-wide receivers.
    pub fn new(store: impl Into<String>) -> StoreWarnings {
        StoreWarnings {
            store: store.into(),
            warned: Warned::default(),
            sink: crate::warnings::Sink::default(),
        }
    }

    /// Sends this store's warnings to `sink` (a context's callback) from now on.
    pub(crate) fn set_sink(&mut self, sink: crate::warnings::Sink) {
        self.sink = sink;
    }

    /// The `level` label of this store's metrics: the kind its name starts with (`remote:`, ...).
    fn level(&self) -> &'static str {
        match self.store.split(':').next() {
            Some("remote") => "remote",
            Some("disk") => "disk",
            Some("readonly") => "readonly",
            _ => "store",
        }
    }

    /// Logs `detail` for `cause` unless this store already warned about that cause.
    pub(crate) fn warn(&self, cause: WarnCause, detail: &dyn fmt::Display) {
        crate::cache::metrics::store_failure(self.level(), cause.name());
        if self.warned.first(cause) {
            let message = format!(
                "{}: {detail}; building instead (further {cause} problems are not reported)",
                self.store
            );
            tracing::warn!(
                target: "kpc::cache::store",
                store = %self.store,
                cause = cause.name(),
                "{message}"
            );
            let w = crate::warnings::Warning {
                target: "kpc::cache::store",
                cause: cause.name(),
                message,
            };
            crate::warnings::deliver(Some(&self.sink), &w);
        }
    }
}

/// A place persisted binaries live: the local disk cache, a read-only layer, an embedder's own store,
/// a remote one. Object safe; shared as `Arc<dyn Store>`.
///
/// Keys are [`StoreKey`]s: the full key values (device description and digest, image digest and length,
/// spec constant bytes, build options) and their hashes. No method fails the caller: every problem is
/// a miss, a skipped put, or no lock, counted and warned about once per cause.
///
/// An embedder's store keeps the bytes [`seal`] makes and hands them back through
/// [`StoreHit::unseal`], which verifies them:
///
/// ```no_run
/// use std::collections::HashMap;
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use kpc::{
///     Access, PutOutcome, Removal, Store, StoreChain, StoreCounters, StoreEntry, StoreHit, StoreKey,
///     StoreStats, seal, sealed_record,
/// };
///
/// #[derive(Debug, Default)]
/// struct Mine(Mutex<HashMap<[u8; 32], Vec<u8>>>, StoreCounters);
///
/// impl Store for Mine {
///     fn name(&self) -> String { "mine".into() }
///     fn get(&self, key: &StoreKey, _: Access) -> Option<StoreHit> {
///         let sealed = self.0.lock().unwrap().get(&key.digest().0).cloned()?;
///         StoreHit::unseal(key, &sealed).ok() // a damaged entry is a miss
///     }
///     fn put(&self, key: &StoreKey, bytes: &[u8], t: Duration) -> PutOutcome {
///         self.0.lock().unwrap().insert(key.digest().0, seal(key, bytes, t));
///         PutOutcome::Published(0)
///     }
///     fn remove(&self, key: &StoreKey, _: Removal<'_>) -> bool {
///         self.0.lock().unwrap().remove(&key.digest().0).is_some()
///     }
///     fn list(&self) -> std::io::Result<Vec<StoreEntry>> {
///         let map = self.0.lock().unwrap();
///         Ok(map.values().filter_map(|s| {
///             Some(StoreEntry { record: sealed_record(s)?, bytes: s.len() as u64, last_access: None })
///         }).collect())
///     }
///     fn stats(&self) -> StoreStats { self.1.snapshot() }
/// }
///
/// // kpc's disk cache and read-only layers first, then the embedder's store.
/// let config = kpc::Config::from_env()?;
/// let stores = StoreChain::from_config(&config).with_store(Arc::new(Mine::default()));
/// let device = kpc::select_device(&config.device)?;
/// let ctx = kpc::Context::builder().device(&device).config(config).stores(stores).build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Store: Send + Sync + fmt::Debug {
    /// A short name for messages and `kpc status`, such as `disk:/home/u/.cache/kpc`.
    fn name(&self) -> String;

    /// What kind of store this is.
    fn kind(&self) -> StoreKind {
        StoreKind::Other
    }

    /// The verified binary stored under `key`, or `None`. See [`Access`] for what the lookup may
    /// change in the store.
    fn get(&self, key: &StoreKey, access: Access) -> Option<StoreHit>;

    /// Takes `key`'s build lock, waiting (bounded) while another builder holds it; after a wait, looks
    /// again and returns [`BuildLock::Published`] when that builder's entry is there. The chain calls
    /// this only after every store missed. Stores without locking return [`BuildLock::NotOffered`]
    /// (the default).
    fn lock_for_build(&self, key: &StoreKey) -> BuildLock {
        let _ = key;
        BuildLock::NotOffered
    }

    /// A hit this store returned (first built in `build_time`) was loaded, but the driver reported
    /// that it compiled anyway: the hit saved no build time. Stores that count time saved move it
    /// (the default does nothing).
    fn note_recompiled(&self, build_time: Duration) {
        let _ = build_time;
    }

    /// Stores `bytes`, built in `build_time`, under `key`. Never fails the caller; see
    /// [`PutOutcome`].
    fn put(&self, key: &StoreKey, bytes: &[u8], build_time: Duration) -> PutOutcome;

    /// Stores `bytes` copied from another place (a lower store's hit, a bundle) whose entry recorded
    /// `provenance`: stores that record provenance keep the original builder's; the default is
    /// [`Store::put`].
    fn put_copy(
        &self,
        key: &StoreKey,
        bytes: &[u8],
        build_time: Duration,
        provenance: Option<&Provenance>,
    ) -> PutOutcome {
        let _ = provenance;
        self.put(key, bytes, build_time)
    }

    /// Removes `key`'s entry (see [`Removal`]). Returns whether an entry went; a store that never
    /// changes (a read-only layer) returns false.
    fn remove(&self, key: &StoreKey, what: Removal<'_>) -> bool;

    /// Why `key` is not (usably) here: the nearest entry this store holds and the key fields that
    /// differ from it. Only stores that can tell cheaply answer (the disk cache and read-only layers
    /// over it, which read a bounded number of key records); the default is `None`. Changes nothing.
    fn explain_miss(&self, key: &StoreKey) -> Option<MissExplanation> {
        let _ = key;
        None
    }

    /// What this store offers a fleet of machines beyond storage (crash markers, the shared miss
    /// journal, shared warm-start manifests), if it is shared by one: only the remote is. Default:
    /// `None`.
    fn fleet(&self) -> Option<&dyn Fleet> {
        None
    }

    /// Every entry, with its key record.
    ///
    /// Errors: the store could not be listed (unreadable, unreachable).
    fn list(&self) -> io::Result<Vec<StoreEntry>>;

    /// This store's counters.
    fn stats(&self) -> StoreStats;
}

#[cfg(test)]
mod tests;
