//! Warm start from the last run: a context remembers, under the cache root, which kernels it acquired
//! (per device fingerprint and per application name), and a new context with the same name reloads
//! them from the stores in the background at creation, so its first request for each finds it in
//! memory.
//!
//! Layout: `<cache root>/warm/v1/<device fingerprint digest>/<app>.manifest` (format in
//! `manifest.rs`) and `<app>.lock`, the advisory lock writers merge under.
//!
//! What is remembered is each program a context acquired from a store or a build, with the entry point
//! asked for then (a request served from memory adds nothing, which keeps hits free of bookkeeping).
//! A warm start loads each such program and that kernel; another entry point of a loaded program is
//! created from the program in memory at its first request, as within one run.
//!
//! What it guarantees:
//! - It never builds: a remembered key with no verified entry in any store is skipped silently (and
//!   forgotten at the next write); a new build happens only when the application asks.
//! - A missing, unreadable, corrupt or foreign-version manifest is a warning, never an error; the
//!   context works exactly as without warm start.
//! - Writes are atomic (temporary file in the same directory, fsync, rename, fsync of the directory)
//!   and merge under an advisory lock (flock-style, released if the process dies), so processes that
//!   write concurrently each add their kernels and none sees a torn file.

pub mod manifest;
mod share;
pub use share::shared_requests;

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::cache::Digest;
use crate::cache::events::{CacheEvent, CacheObserver};
use crate::config::Config;
use crate::error::{Error, Result};

use super::prefetch::{Cancel, KernelRequest, Prefetch, default_workers};
use super::program_manager::ProgramManager;
use manifest::RecordId;

pub use manifest::Corrupt;

/// What became of the manifest a warm start read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestState {
    /// There was none (a first run): nothing to load.
    Absent,
    /// Read and verified.
    Read,
    /// Refused (damaged, truncated, another format version): ignored with a warning, rewritten at
    /// the next save.
    Corrupt(String),
    /// Could not be read (permissions, I/O): ignored with a warning.
    Unreadable(String),
}

/// What loading one remembered kernel came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadOutcome {
    /// Loaded into memory from a store.
    Loaded,
    /// No store holds it any more: skipped, and forgotten at the next write.
    NotStored,
    /// Not attempted: the context was dropped or quiesced before the load reached it (it stays
    /// remembered).
    Cancelled,
}

/// What a background warm start did. A warm start only loads what a store holds: it never builds,
/// and what it could not load is counted, not returned as an error.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WarmStartReport {
    /// The application name.
    pub app: String,
    /// The manifest file.
    pub manifest: PathBuf,
    /// What became of it.
    pub state: ManifestState,
    /// Kernels it listed.
    pub listed: usize,
    /// Kernels loaded into memory from a store.
    pub loaded: usize,
    /// Kernels skipped because no store holds them any more.
    pub not_stored: usize,
    /// Kernels a store held but that failed to load (each warned about once per cause; a later
    /// request takes the normal path).
    pub failed: usize,
    /// From context creation until the last kernel was in memory.
    pub elapsed: Duration,
}

/// One context's warm-start state: the kernels it acquired, the manifest, the background load.
pub struct WarmStart {
    app: String,
    /// Image sizes the stores persist (`KPC_CACHE_MIN/MAX_DEVICE_IMAGE_SIZE`): others are not
    /// remembered, since no store could serve them.
    persisted: (u64, u64),
    dir: PathBuf,
    path: PathBuf,
    state: Mutex<State>,
    loader: Mutex<Option<JoinHandle<WarmStartReport>>>,
    /// The loader's batch while it runs, so that [`WarmStart::stop`] can cancel it; `stopped` is
    /// set under this lock, so a loader that has not spawned its batch yet never does.
    batch: Mutex<Option<Arc<dyn Cancel>>>,
    stopped: AtomicBool,
    report: Mutex<Option<WarmStartReport>>,
    warned: Mutex<HashSet<&'static str>>,
    /// The stores this manifest is also shared through ([`WarmStart::share_through`]).
    shared: std::sync::OnceLock<Vec<Arc<dyn crate::cache::Store>>>,
}

#[derive(Default)]
struct State {
    /// What this process knows: the manifest's kernels and the ones it acquired, oldest first.
    records: Vec<KernelRequest>,
    index: HashMap<RecordId, usize>,
    /// Remembered keys no store holds any more: dropped from the manifest at the next write.
    missing: HashSet<RecordId>,
    /// Whether a write would change the manifest.
    dirty: bool,
}

impl std::fmt::Debug for WarmStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmStart")
            .field("app", &self.app)
            .field("manifest", &self.path)
            .finish()
    }
}

/// What is remembered is told by the context's cache: each kernel whose program missed memory.
impl CacheObserver for WarmStart {
    fn on_event(&self, event: &CacheEvent<'_>) {
        if let CacheEvent::KernelServed {
            image,
            entry,
            spec,
            options,
            ..
        } = *event
        {
            self.record(&KernelRequest {
                image: image.clone(),
                entry: entry.to_string(),
                spec: spec.clone(),
                options: options.clone(),
                generic: None,
            });
        }
    }
}

/// The directory holding the manifests of the device with fingerprint `digest` under cache `root`.
pub fn manifest_dir(root: &Path, digest: &Digest) -> PathBuf {
    root.join("warm").join("v1").join(digest.short_hex(32))
}

static TMP_SERIAL: AtomicU64 = AtomicU64::new(0);

impl WarmStart {
    /// The warm-start state `config` asks for on the device with fingerprint `digest`: `None` when
    /// warm start is off (`KPC_CACHE_PREFETCH` unset or 0), or pointless (no disk cache root, the
    /// in-memory cache off, cache debug mode).
    pub fn from_config(config: &Config, digest: &Digest) -> Option<Arc<WarmStart>> {
        let app = config.warm_start.as_deref()?;
        if !config.in_mem || config.cache_debug {
            return None;
        }
        let root = config.disk_cache_root()?;
        let mut ws = WarmStart::new(root, digest, app);
        ws.persisted = (config.min_device_image_size, config.max_device_image_size);
        Some(Arc::new(ws))
    }

    /// Warm-start state for application `app` (a name [`crate::config::prefetch::valid_app_name`] accepts)
    /// on the device with fingerprint `digest`, under cache root `root`.
    pub fn new(root: &Path, digest: &Digest, app: &str) -> WarmStart {
        let dir = manifest_dir(root, digest);
        WarmStart {
            app: app.to_string(),
            persisted: (0, u64::MAX),
            path: dir.join(format!("{app}.manifest")),
            dir,
            state: Mutex::new(State::default()),
            loader: Mutex::new(None),
            batch: Mutex::new(None),
            stopped: AtomicBool::new(false),
            report: Mutex::new(None),
            warned: Mutex::new(HashSet::new()),
            shared: std::sync::OnceLock::new(),
        }
    }

    /// The application name.
    pub fn app(&self) -> &str {
        &self.app
    }

    /// The manifest file.
    pub fn manifest_path(&self) -> &Path {
        &self.path
    }

    fn warn(&self, cause: &'static str, detail: &dyn std::fmt::Display) {
        if self.warned.lock().insert(cause) {
            tracing::warn!(target: "kpc::warm_start", app = %self.app, manifest = %self.path.display(),
                "warm start: {cause}: {detail} (warm start only saves time; continuing without it)");
        }
    }

    /// Remembers that this process acquired `r` (a no-op for a kernel already remembered).
    pub fn record(&self, r: &KernelRequest) {
        let len = r.image.bytes().len() as u64;
        if !manifest::storable(r) || len < self.persisted.0 || len > self.persisted.1 {
            return;
        }
        let id = manifest::id_of(r);
        let mut s = self.state.lock();
        let was_missing = s.missing.remove(&id);
        if !s.index.contains_key(&id) {
            let i = s.records.len();
            s.records.push(r.clone());
            s.index.insert(id, i);
            s.dirty = true;
        } else if was_missing {
            s.dirty = true;
        }
    }

    /// The kernels this process knows of (the manifest's and those it acquired), oldest first.
    pub fn remembered(&self) -> Vec<KernelRequest> {
        self.state.lock().records.clone()
    }

    /// Reads the manifest now: its kernels, or why there are none.
    pub fn read_manifest(&self) -> (Vec<KernelRequest>, ManifestState) {
        match fs::read(&self.path) {
            Ok(b) => match manifest::decode(&b) {
                Ok(rs) => (rs, ManifestState::Read),
                Err(Corrupt(why)) => {
                    self.warn("corrupt manifest ignored", &why);
                    (Vec::new(), ManifestState::Corrupt(why))
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (Vec::new(), ManifestState::Absent)
            }
            Err(e) => {
                self.warn("manifest unreadable", &e);
                (Vec::new(), ManifestState::Unreadable(e.to_string()))
            }
        }
    }

    /// Starts loading the manifest's kernels in the background: one thread reads the manifest, then
    /// a pool (one worker per core) runs `load` on each kernel. `load` returns whether the kernel was
    /// loaded, skipped (no store holds it) or not attempted. [`WarmStart::wait`] gives the report.
    /// A second call while a load is running or done does nothing.
    pub fn start(
        self: &Arc<Self>,
        load: impl Fn(&KernelRequest) -> Result<LoadOutcome> + Send + Sync + 'static,
    ) {
        self.start_then(load, || {});
    }

    /// [`WarmStart::start`], then `finished` once the load has ended (done, or stopped), on the
    /// loader's thread before [`WarmStart::wait`] returns; at once when the loader cannot start.
    /// What sealing after warm-up (`KPC_CACHE_SEAL`) hangs on. Not run by a call that does nothing.
    pub fn start_then(
        self: &Arc<Self>,
        load: impl Fn(&KernelRequest) -> Result<LoadOutcome> + Send + Sync + 'static,
        finished: impl FnOnce() + Send + 'static,
    ) {
        let mut loader = self.loader.lock();
        if loader.is_some() || self.report.lock().is_some() {
            return;
        }
        let ws = self.clone();
        let started = Instant::now();
        let finished = Arc::new(Mutex::new(Some(finished)));
        let f = finished.clone();
        let run = move || {
            let report = ws.load_all(started, load);
            if let Some(f) = f.lock().take() {
                f();
            }
            report
        };
        match std::thread::Builder::new()
            .name("kpc-warm-start".into())
            .spawn(run)
        {
            Ok(h) => *loader = Some(h),
            Err(e) => {
                self.warn("could not start the background load", &e);
                if let Some(f) = finished.lock().take() {
                    f();
                }
            }
        }
    }

    fn load_all(
        self: Arc<Self>,
        started: Instant,
        load: impl Fn(&KernelRequest) -> Result<LoadOutcome> + Send + Sync + 'static,
    ) -> WarmStartReport {
        let (records, state) = self.read_manifest();
        {
            let mut s = self.state.lock();
            for r in &records {
                let id = manifest::id_of(r);
                if !s.index.contains_key(&id) {
                    let i = s.records.len();
                    s.records.push(r.clone());
                    s.index.insert(id, i);
                }
            }
        }
        let listed = records.len();
        let ids: Vec<RecordId> = records.iter().map(manifest::id_of).collect();
        let workers = default_workers(records.len());
        let batch = {
            let mut slot = self.batch.lock();
            if self.stopped.load(Ordering::Acquire) {
                None
            } else {
                let p = Prefetch::spawn(records, workers, load);
                *slot = Some(p.canceller());
                Some(p)
            }
        };
        let results = match batch {
            Some(p) => p.wait(),
            None => (0..listed).map(|_| Ok(LoadOutcome::Cancelled)).collect(),
        };
        *self.batch.lock() = None;
        let (mut loaded, mut not_stored, mut failed) = (0, 0, 0);
        for (r, id) in results.into_iter().zip(ids) {
            match r {
                Ok(LoadOutcome::Loaded) => loaded += 1,
                Ok(LoadOutcome::Cancelled) | Err(Error::Cancelled(_)) => {}
                Ok(LoadOutcome::NotStored) => {
                    not_stored += 1;
                    let mut s = self.state.lock();
                    if s.missing.insert(id) {
                        s.dirty = true;
                    }
                }
                Err(e) => {
                    failed += 1;
                    self.warn("a remembered kernel failed to load", &e);
                }
            }
        }
        WarmStartReport {
            app: self.app.clone(),
            manifest: self.path.clone(),
            state,
            listed,
            loaded,
            not_stored,
            failed,
            elapsed: started.elapsed(),
        }
    }

    /// Stops the background load: kernels not yet begun are not loaded (they stay remembered), and
    /// this returns once the loads running now have finished and the loader has ended. So when it
    /// returns, the warm start makes no further call on the device. Later calls do nothing.
    pub fn stop(&self) {
        let batch = {
            let mut slot = self.batch.lock();
            self.stopped.store(true, Ordering::Release);
            slot.take()
        };
        if let Some(b) = batch {
            b.cancel_and_wait();
        }
        self.wait();
    }

    /// Blocks until the background load has finished and returns its report; `None` when no load
    /// was started.
    pub fn wait(&self) -> Option<WarmStartReport> {
        // Held while joining, so concurrent waiters all return after the load, with its report.
        let mut loader = self.loader.lock();
        if let Some(h) = loader.take() {
            let r = h.join().unwrap_or_else(|_| WarmStartReport {
                app: self.app.clone(),
                manifest: self.path.clone(),
                state: ManifestState::Unreadable("the background load panicked".into()),
                listed: 0,
                loaded: 0,
                not_stored: 0,
                failed: 0,
                elapsed: Duration::ZERO,
            });
            *self.report.lock() = Some(r);
        }
        self.report.lock().clone()
    }

    /// Writes the manifest now if this process learned anything (new kernels, or remembered ones no
    /// store holds), merged with what other processes wrote meanwhile. Returns how many kernels the
    /// manifest lists afterwards, or `None` when there was nothing to write.
    ///
    /// Errors: [`Error::Io`] naming the path when the directory, lock or file cannot be written.
    pub fn save(&self) -> Result<Option<usize>> {
        let (ours, missing) = {
            let s = self.state.lock();
            if !s.dirty {
                return Ok(None);
            }
            (s.records.clone(), s.missing.clone())
        };
        let n = self.write_merged(&ours, &missing)?;
        let mut s = self.state.lock();
        // Records acquired while writing keep the state dirty for the next save.
        s.dirty = s.records.len() != ours.len() || s.missing != missing;
        Ok(Some(n))
    }

    fn write_merged(&self, ours: &[KernelRequest], missing: &HashSet<RecordId>) -> Result<usize> {
        let io = |what: &str, p: &Path, e: std::io::Error| {
            Error::Io(format!("warm-start manifest: {what} {}: {e}", p.display()))
        };
        fs::create_dir_all(&self.dir).map_err(|e| io("creating", &self.dir, e))?;
        let lock_path = self.dir.join(format!("{}.lock", self.app));
        let lock_file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| io("opening", &lock_path, e))?;
        let mut lock = fd_lock::RwLock::new(lock_file);
        let _guard = lock.write().map_err(|e| io("locking", &lock_path, e))?;

        // Under the lock: what others wrote since we read it, then ours, without what is gone.
        let (theirs, _) = self.read_manifest();
        let mut merged = share::merge(&theirs, ours, missing);
        // Oldest first: over the limits, the oldest go.
        let bytes = share::encode_bounded(&mut merged);

        let tmp = self.dir.join(format!(
            ".{}.tmp-{}-{}",
            self.app,
            std::process::id(),
            TMP_SERIAL.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, &self.path)?;
            // The rename is durable only once the directory is.
            File::open(&self.dir)?.sync_all()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io("writing", &self.path, e));
        }
        drop(_guard);
        self.publish_shared(&merged);
        Ok(merged.len())
    }
}

impl Drop for WarmStart {
    /// The last handle on a context writes what it learned; a failure is a warning.
    fn drop(&mut self) {
        if let Err(e) = self.save() {
            self.warn("the manifest could not be written", &e);
        }
    }
}

/// What a warm start runs per remembered kernel on a [`ProgramManager`]: loads it into memory from
/// the first store holding a verified entry for its key, without building. Returns
/// [`LoadOutcome::NotStored`] when
/// no store holds it.
///
/// Errors: what the backend says when it refuses the stored binary (the request is then left to the
/// normal path, which removes such an entry and rebuilds).
pub fn load_if_stored(manager: &ProgramManager, r: &KernelRequest) -> Result<LoadOutcome> {
    if manager.stores().is_empty() {
        return Ok(LoadOutcome::NotStored);
    }
    let key = manager.disk_key(&r.image, &r.spec, &r.options);
    // The store verified the entry (checksum, full key, MAC where configured) and its key covers the
    // image's digest: this image is the one a build validated before that entry was written.
    let Some(hit) = manager.stores().get(&key, &[]) else {
        return Ok(LoadOutcome::NotStored);
    };
    // A binary that crashed a process loading it is left to the request's normal path, which
    // removes it and builds; the warm start never builds.
    let Ok(record) = manager.stores().begin_load(&key, &hit) else {
        return Ok(LoadOutcome::NotStored);
    };
    manager.kernel_from_binary(&r.image, &r.entry, &r.spec, &r.options, hit.bytes())?;
    drop(record);
    manager.stores().backfill(&key, &hit, false);
    Ok(LoadOutcome::Loaded)
}
