//! Crash-safe loading: a stored binary that kills the process that hands it to the driver (a segfault
//! or abort inside the driver) must not kill the next process too, and the one after.
//!
//! Before a stored binary goes to the driver, the loading process records it: a file
//! `<root>/loading/<key digest>.<pid>.<n>` holding the binary's hash, under an exclusive `flock` held
//! until the load returns, when the record is removed. A process that dies while loading leaves its
//! record behind without a lock (the kernel drops a dead process's `flock`s, as the disk cache's other
//! locks rely on). The next process that is about to load that key finds the record, takes its lock,
//! and so knows its writer is dead while loading: the binary with that hash crashed it. It quarantines
//! it (`<root>/quarantine/crashed-loading/<key digest>.<hash>`, cause `crashed-loading`, counted and
//! warned about once), and from then on a binary with that hash is refused for that key, from any
//! store: the caller treats it as a binary the driver refused (removed from writable stores, skipped
//! in read-only ones) and builds.
//!
//! Per-process liveness is what keeps a process killed for other reasons from costing entries: a
//! record exists only while a load runs, and a record whose writer is alive is locked, so it is never
//! taken for a crash. A record is created under a temporary name, locked, then renamed into place, so
//! nobody sees it unlocked while its writer lives. Records need no fsync: what they guard against is a
//! process dying, not the machine. `kpc cache clear` removes the quarantine, markers included.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::PersistentCache;
use super::stats::bump;
use crate::cache::store::StoreKey;
pub use crate::cache::store::crash::CrashedLoading;

/// The directory of loading records, under the cache root.
const LOADING_DIR: &str = "loading";
/// Where binaries that crashed a load are named, under the quarantine directory.
const CRASHED_DIR: &str = "crashed-loading";

static SERIAL: AtomicU64 = AtomicU64::new(0);

/// A load in progress: the record is removed (then its lock released) when this drops.
#[derive(Debug)]
pub struct LoadRecord {
    path: PathBuf,
    _file: File,
}

impl Drop for LoadRecord {
    fn drop(&mut self) {
        // We hold the lock, so the path still names our record; closing `_file` then releases it.
        let _ = fs::remove_file(&self.path);
    }
}

fn hash_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex()[..32].to_string()
}

impl PersistentCache {
    fn loading_dir(&self) -> PathBuf {
        self.root().join(LOADING_DIR)
    }

    fn crashed_dir(&self) -> PathBuf {
        self.quarantine_dir().join(CRASHED_DIR)
    }

    /// Whether `bytes` for `key` crashed a load before (a quarantine marker names them), after
    /// turning any record a dead process left for `key` into such a marker. `bytes` may come from any
    /// store; the record and markers live in this (the local) cache.
    pub fn crashed_before(&self, key: &StoreKey, bytes: &[u8]) -> Option<CrashedLoading> {
        let kd = key.digest().to_hex();
        self.collect_dead_records(&kd);
        let marker = self.crashed_dir().join(format!("{kd}.{}", hash_hex(bytes)));
        marker.is_file().then_some(CrashedLoading { marker })
    }

    /// Called right before `bytes`, a stored binary for `key`, go to the driver: refuses them when
    /// they crashed a load before ([`PersistentCache::crashed_before`]), else records the load until
    /// the returned record drops. `Ok(None)` when the record could not be written (the load goes
    /// ahead unguarded; the disk cache never fails a request).
    pub fn begin_load(
        &self,
        key: &StoreKey,
        bytes: &[u8],
    ) -> Result<Option<LoadRecord>, CrashedLoading> {
        if let Some(c) = self.crashed_before(key, bytes) {
            // The first refusal right after this instance found the crash was warned about there.
            let reported = self.inner.counters.crashed_loads.load(Ordering::Relaxed) > 0;
            if bump_first(&self.inner.counters.crashed_refusals) && !reported {
                tracing::warn!(target: "kpc::cache::disk", cause = "crashed-loading", key = %key.digest(),
                    label = key.label(), marker = %c.marker.display(),
                    "disk cache: not loading {:?}: {c}; building it instead (further refusals are not reported)",
                    key.label());
            }
            return Err(c);
        }
        Ok(self
            .write_record(&key.digest().to_hex(), &hash_hex(bytes))
            .ok())
    }

    fn write_record(&self, key_hex: &str, hash: &str) -> io::Result<LoadRecord> {
        let dir = self.loading_dir();
        fs::create_dir_all(&dir)?;
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tmp = dir.join(format!(".tmp-{pid}-{n}"));
        let path = dir.join(format!("{key_hex}.{pid}.{n}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        let mut rw = fd_lock::RwLock::new(file);
        let locked = rw.try_write().map(std::mem::forget);
        let mut file = rw.into_inner();
        let done = locked
            .and_then(|()| file.write_all(hash.as_bytes()))
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = done {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(LoadRecord { path, _file: file })
    }

    /// Turns every record for the key `key_hex` whose writer is dead into a quarantine marker.
    fn collect_dead_records(&self, key_hex: &str) {
        let Ok(rd) = fs::read_dir(self.loading_dir()) else {
            return;
        };
        let prefix = format!("{key_hex}.");
        for e in rd.filter_map(Result::ok) {
            let name = e.file_name();
            if !name.to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let path = e.path();
            let Ok(Some((hash, file))) = dead_record(&path) else {
                continue;
            };
            let marker_dir = self.crashed_dir();
            let marker = marker_dir.join(format!("{key_hex}.{hash}"));
            let written = fs::create_dir_all(&marker_dir).and_then(|()| {
                fs::write(
                    &marker,
                    format!(
                        "key {key_hex}\nbinary blake3 {hash}\nrecord {}\n",
                        name.to_string_lossy()
                    ),
                )
            });
            // Removed while still locked (so no one else takes it for a crash a second time).
            let _ = fs::remove_file(&path);
            drop(file);
            if written.is_ok() && bump_first(&self.inner.counters.crashed_loads) {
                tracing::warn!(target: "kpc::cache::disk", cause = "crashed-loading", key = key_hex,
                    marker = %marker.display(),
                    "disk cache: a process died while loading a stored binary ({}); quarantined it as \
                     {}, so it is not loaded again: building instead (further crashed loads are not \
                     reported)", name.to_string_lossy(), marker.display());
            }
        }
    }
}

/// Counts one and says whether it was the first.
fn bump_first(a: &AtomicU64) -> bool {
    let first = a.load(Ordering::Relaxed) == 0;
    bump(a, 1);
    first
}

/// The hash a record holds when its writer is dead (its lock could be taken and it is still the file
/// at `path`), with the locked file; `None` when its writer is alive or it went meanwhile.
fn dead_record(path: &Path) -> io::Result<Option<(String, File)>> {
    let file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut rw = fd_lock::RwLock::new(file);
    match rw.try_write() {
        Ok(g) => std::mem::forget(g),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut file = rw.into_inner();
    let (a, b) = (file.metadata()?, fs::metadata(path)?);
    if a.ino() != b.ino() || a.dev() != b.dev() {
        return Ok(None);
    }
    let mut hash = String::new();
    file.read_to_string(&mut hash)?;
    let hash = hash.trim().to_owned();
    if hash.len() != 32 || !hash.bytes().all(|c| c.is_ascii_hexdigit()) {
        // Not a record this code wrote: remove it, but it names no binary.
        let _ = fs::remove_file(path);
        return Ok(None);
    }
    Ok(Some((hash, file)))
}
