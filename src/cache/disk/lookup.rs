//! The read side of the protocol: verified lookups, the cross-process build lock a miss takes, what a
//! reader does about a defective slot, and the removal of a binary the backend refused.

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use filetime::FileTime;

use super::entry::{self, Defect, FileKind, read_verified};
use super::lock::{self, HeldLock, Waited};
use super::locks::Locks;
use super::put::BuildGuard;
use super::slot::{SlotCheck, check_slot, list_slots, read_src, slot_file};
use super::stats::{bump, nanos};
use super::{Inner, PersistentCache, StoreKey};
use crate::cache::store::warn::WarnCause;

/// How long a reader that met a defective slot, or a binary the backend refused, waits for the leaf's
/// lock to remove it.
const DEFECT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Locks `leaf` within [`DEFECT_LOCK_WAIT`], to remove a slot a reader found unusable: `Ok(None)` when
/// another holder kept it the whole time, `NotFound` when the leaf is gone.
fn lock_leaf_briefly(locks: &Locks, leaf: &Path) -> std::io::Result<Option<HeldLock>> {
    let waited = locks.leaf(leaf, DEFECT_LOCK_WAIT, || {
        Err(std::io::ErrorKind::NotFound.into())
    })?;
    Ok(match waited {
        Waited::Acquired { lock, .. } => Some(lock),
        Waited::TimedOut => None,
    })
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

/// What [`PersistentCache::lock_for_build`] found.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// A verified binary.
    Hit(DiskHit),
    /// Nothing usable: build, then [`BuildGuard::put`]. The guard holds the key's build lock when it
    /// could be taken, so other processes wait for this build instead of repeating it.
    Miss(BuildGuard),
}

enum SlotRead {
    Hit(DiskHit),
    OtherKey,
    Gone,
    Defect(FileKind, Defect),
    Io(io::Error, PathBuf),
}

impl PersistentCache {
    /// Looks `key` up without locking anything. `None` on a miss or any disk problem.
    pub fn get(&self, key: &StoreKey) -> Option<DiskHit> {
        let i = &self.inner;
        if !self.persists_image_of_size(key.image_len()) {
            bump(&i.counters.skipped, 1);
            return None;
        }
        let r = i.find(&i.leaf(key), key, true, true);
        i.count_lookup(key, r.as_ref(), None);
        r
    }

    /// Looks `key` up changing nothing on disk: no access time is recorded and a defective entry is
    /// counted and warned about but left in place (no lock file is created either). What a read-only
    /// layer does. `None` on a miss or any disk problem.
    pub fn get_read_only(&self, key: &StoreKey) -> Option<DiskHit> {
        let i = &self.inner;
        if !self.persists_image_of_size(key.image_len()) {
            bump(&i.counters.skipped, 1);
            return None;
        }
        let r = i.find(&i.leaf(key), key, false, false);
        i.count_lookup_as(key, r.as_ref(), None, false);
        r
    }

    /// For a caller whose [`PersistentCache::get`] just missed (the store chain, which looks in every
    /// store before it locks): takes the key's cross-process build lock, waiting up to `lock_timeout`
    /// while another process (or thread) holds it, and reads again. After a timeout, or when the lock
    /// cannot be taken at all (unwritable cache), the guard holds no lock and the caller builds anyway. A hit found then is counted as a hit;
    /// a miss is not counted again (the `get` counted it). Images outside the size limits are not
    /// locked: the guard then persists nothing.
    pub(crate) fn lock_for_build(&self, key: &StoreKey) -> Lookup {
        if !self.persists_image_of_size(key.image_len()) {
            return self.miss(key, None, false);
        }
        match self.lock_and_look(key) {
            Ok((_, wait, Some(hit))) => {
                self.inner.count_lookup(key, Some(&hit), wait);
                Lookup::Hit(hit)
            }
            Ok((lock, _, None)) => self.miss(key, lock, true),
            Err(()) => self.miss(key, None, true),
        }
    }

    fn miss(&self, key: &StoreKey, lock: Option<HeldLock>, persist: bool) -> Lookup {
        Lookup::Miss(BuildGuard {
            cache: self.clone(),
            key: Box::new(key.clone()),
            lock,
            persist,
        })
    }

    /// Takes `key`'s build lock (bounded wait; `None` after a timeout) and looks again. Returns the lock,
    /// how long it waited when it had to, and what the second look found; `Err` when the lock could not
    /// be taken at all (warned).
    #[allow(clippy::type_complexity)]
    fn lock_and_look(
        &self,
        key: &StoreKey,
    ) -> Result<(Option<HeldLock>, Option<Duration>, Option<DiskHit>), ()> {
        let i = &self.inner;
        let leaf = i.leaf(key);
        let start = Instant::now();
        let waited = match i.ensure_leaf(key).and_then(|_| {
            let lock_path = i.locks.build(&leaf)?;
            lock::lock_with_timeout(&lock_path, true, i.s.lock_timeout, || {
                i.ensure_leaf(key).map(drop)
            })
        }) {
            Ok(w) => w,
            Err(e) => {
                i.warn_io(&e, &leaf, "cannot take the build lock");
                return Err(());
            }
        };
        let (lock, wait) = match waited {
            Waited::Acquired { lock, waited } => (Some(lock), waited.then(|| start.elapsed())),
            Waited::TimedOut => {
                bump(&i.counters.lock_timeouts, 1);
                i.warned.warn(
                    &i.s.warnings,
                    WarnCause::LockTimeout,
                    &leaf,
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
        Ok((lock, wait, i.find(&leaf, key, true, true)))
    }

    /// Reports that the backend refused `hit` (`reason` says why): counts it, warns once, and removes the
    /// entry unless it was replaced meanwhile, so the next lookup misses and the key is rebuilt.
    pub fn reject(&self, hit: DiskHit, reason: &dyn fmt::Display) {
        let i = &self.inner;
        bump(&i.counters.rejected, 1);
        i.warned.warn(
            &i.s.warnings,
            WarnCause::Rejected,
            &hit.bin_path(),
            &format_args!("the backend refused a verified binary ({reason})"),
        );
        i.trace(|| tracing::debug!(target: "kpc::cache::disk", path = %hit.bin_path().display(), %reason, "rejected"));
        // A leaf held for a moment (a put on another thread, a lock a forked child briefly shares)
        // must not leave the refused binary to be found, refused and rebuilt by every later lookup.
        if let Ok(Some(_l)) = lock_leaf_briefly(&self.inner.locks, &hit.leaf) {
            let same = fs::read(hit.bin_path()).ok().and_then(|b| {
                entry::verify_bytes(&b, FileKind::Bin)
                    .ok()
                    .map(|(h, _)| h.checksum)
            }) == Some(hit.checksum);
            if same {
                i.remove_slot(&hit.leaf, hit.slot);
            }
        }
    }
    /// Removes `key`'s entry: every slot holding it, or only those whose binary is exactly `only` when
    /// given, each under its leaf's lock (a leaf being written is left alone). Returns whether any went.
    pub fn remove(&self, key: &StoreKey, only: Option<&[u8]>) -> bool {
        let i = &self.inner;
        let leaf = i.leaf(key);
        let Ok(slots) = list_slots(&leaf) else {
            return false;
        };
        let mut removed = false;
        for n in slots {
            let Ok(Some(_l)) = self.inner.locks.try_leaf(&leaf) else {
                continue;
            };
            let ours = match read_src(&slot_file(&leaf, n, "src")) {
                Ok(Ok((_, rec))) => rec.matches(key),
                _ => false,
            };
            let wanted = ours
                && only.is_none_or(|want| {
                    fs::read(slot_file(&leaf, n, "bin")).ok().is_some_and(|b| {
                        entry::verify_bytes(&b, FileKind::Bin)
                            .is_ok_and(|(_, payload)| payload == want)
                    })
                });
            if !wanted {
                continue;
            }
            if i.remove_slot(&leaf, n).is_some() {
                removed = true;
            }
        }
        removed
    }
}

impl Inner {
    fn count_lookup(&self, key: &StoreKey, hit: Option<&DiskHit>, waited: Option<Duration>) {
        self.count_lookup_as(key, hit, waited, true);
    }

    /// Counts a lookup; `writes`: it may write (the eviction record), false for a read-only one.
    fn count_lookup_as(
        &self,
        key: &StoreKey,
        hit: Option<&DiskHit>,
        waited: Option<Duration>,
        writes: bool,
    ) {
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
                // Explained on every miss (not only when tracing) so the counters by cause are
                // complete: a bounded read of nearby key records, on a path about to build anyway.
                let why = self.explain_miss(key);
                bump(&self.counters.misses_by_cause[why.cause as usize], 1);
                if let Some(ev) = why.evicted.as_ref().filter(|_| writes) {
                    self.record_evicted_miss(key, ev);
                }
                self.miss_causes.note(key, why.cause);
                self.trace(|| {
                    tracing::debug!(target: "kpc::cache::disk", key = %key.digest(), label = key.label(),
                        waited_ms = waited.map(|w| w.as_secs_f64() * 1e3), cause = why.cause.name(),
                        why = %why, "miss")
                });
            }
        }
    }

    /// The first valid entry for `key` in `leaf`. With `touch`, a hit records its access; with
    /// `repair`, defective entries met on the way are removed (else only counted and warned about).
    pub(super) fn find(
        &self,
        leaf: &Path,
        key: &StoreKey,
        touch: bool,
        repair: bool,
    ) -> Option<DiskHit> {
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
                SlotRead::Defect(kind, d) => self.on_defect(leaf, n, kind, &d, repair),
                SlotRead::Io(e, path) => self.read_error(&e, &path),
            }
        }
        None
    }

    fn read_error(&self, e: &io::Error, path: &Path) {
        bump(&self.counters.read_errors, 1);
        self.warn_io(e, path, "cannot read an entry");
    }

    fn read_slot(&self, leaf: &Path, n: u32, key: &StoreKey, touch: bool) -> SlotRead {
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

    /// A reader met a defective slot. Under the leaf's lock (so no writer or evictor is mid-way through it)
    /// the slot is checked again and removed if still defective. Without the lock (read-only directory),
    /// or without `repair` (a read-only layer, which must not even lock), the defect is
    /// counted and left in place.
    fn on_defect(&self, leaf: &Path, n: u32, kind: FileKind, d: &Defect, repair: bool) {
        let path = slot_file(leaf, n, kind.ext());
        let report = |removed: bool| {
            bump(&self.counters.corruptions, 1);
            self.warned.warn(
                &self.s.warnings,
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
        if !repair {
            report(false);
            return;
        }
        // A short bounded wait, not a try: a writer or evictor holding the leaf for a moment (or the
        // leaf lock a put just released on another thread) must not make a defect this reader saw
        // go uncounted and unrepaired.
        match lock_leaf_briefly(&self.locks, leaf) {
            Ok(Some(_l)) => {
                if let SlotCheck::Defective(..) = check_slot(leaf, n) {
                    match self.remove_slot(leaf, n) {
                        Some(_) => report(true),
                        None => report(false),
                    }
                }
            }
            // Someone kept the leaf the whole time: the defect this reader saw is still counted,
            // and left to them.
            Ok(None) => report(false),
            // The leaf is gone: someone removed the entry meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => report(false),
        }
    }
}
