//! Generic while specialized: a request that names a generic fallback
//! ([`KernelRequest::or_generic`]) is never held up by the build of its specialized kernel.
//!
//! On an acquisition of such a request ([`ProgramManager::kernel_or_generic`], which
//! [`Context::kernel_with`](super::Context::kernel_with) uses):
//! - the specialized kernel in memory, or in any store (a load is fast), is served as usual;
//! - otherwise the fallback is served at once (from memory, a store, or a build that is itself
//!   cached: the generic kernel is built once per device) and the specialized kernel is queued for
//!   a background build; the acquisition after it is ready returns it ("swapped in");
//! - a background build that fails is reported once (a warning through the context's warning sink)
//!   and the fallback goes on serving that request; it is not tried again in this context;
//! - under the `generic` seal (`KPC_CACHE_SEAL=generic`), the fallback serves and nothing
//!   specialized is built (`seal.rs`).
//!
//! The background builds run on one small pool per manager (at most one worker per core, started on
//! demand, gone when the queue is empty), each through the same `get_or_build` as any request: the
//! memory cache's single flight holds across the pool, callers, prefetches and warm starts, and a
//! key queued once is not queued again while pending. A worker holds its manager only weakly, and
//! only while it builds; [`Lazy::cancel_and_wait`] (a context's `quiesce`, the drop of its last
//! handle) drops what is queued and waits for what runs, so no background build outlives those.

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::backend::dynamic::DynKernel;
use crate::cache::{KernelKey, Local};
use crate::error::{Error, Result};

use super::prefetch::{Cancel, KernelRequest, default_workers};
use super::program_manager::{Acquired, ProgramManager};
use super::seal::{kernel_name, with_fallback};
use super::source::Source;

/// What serving generic fallbacks did for one context (part of
/// [`crate::runtime::ContextStats`] and the C `kpc_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LazyStats {
    /// Acquisitions of a request with a fallback that were served the fallback.
    pub served_generic: u64,
    /// Of those, the ones served it because the `generic` seal was in force (nothing queued).
    pub sealed_generic: u64,
    /// Specialized kernels returned for the first time after their background build (or load).
    pub swapped_in: u64,
    /// Background builds that compiled (a background acquisition served by a store is not one).
    pub background_builds: u64,
    /// Their compile time, summed.
    pub background_build_time: Duration,
    /// Background builds that failed (each reported once; the fallback goes on serving).
    pub background_failures: u64,
    /// Background builds queued or running now.
    pub pending: u64,
}

/// What [`ProgramManager::kernel_or_generic`] returned: the kernel, and which of the two it is.
#[derive(Debug)]
pub struct LazyAcquired<T> {
    /// The kernel (the specialized one, or the fallback when [`LazyAcquired::generic`]).
    pub acquired: Acquired<T>,
    /// Whether it is the generic fallback: its launch parameters are the fallback's.
    pub generic: bool,
    /// Whether this is the first acquisition to return the specialized kernel after its
    /// background build.
    pub swapped: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Queued or building.
    Pending,
    /// Built (or loaded) in the background; not yet returned to a request with a fallback.
    Ready,
    /// The background build failed: the fallback serves from now on.
    Failed,
}

struct Job {
    key: KernelKey,
    request: KernelRequest,
    manager: Weak<ProgramManager>,
}

#[derive(Default)]
struct Pool {
    jobs: VecDeque<Job>,
    /// Workers alive, and how many of them run a job now.
    live: usize,
    running: usize,
    handles: Vec<JoinHandle<()>>,
}

/// One manager's background builds of specialized kernels, and what they counted.
pub(crate) struct Lazy {
    states: Mutex<HashMap<KernelKey, State>>,
    /// How many states are [`State::Ready`]: a hit looks at the states only while one is.
    ready: AtomicUsize,
    pool: Mutex<Pool>,
    idle: Condvar,
    max_workers: usize,
    served_generic: AtomicU64,
    sealed_generic: AtomicU64,
    swapped_in: AtomicU64,
    builds: AtomicU64,
    build_nanos: AtomicU64,
    failures: AtomicU64,
}

impl Default for Lazy {
    fn default() -> Self {
        Lazy {
            states: Mutex::new(HashMap::new()),
            ready: AtomicUsize::new(0),
            pool: Mutex::new(Pool::default()),
            idle: Condvar::new(),
            max_workers: default_workers(usize::MAX).max(1),
            served_generic: AtomicU64::new(0),
            sealed_generic: AtomicU64::new(0),
            swapped_in: AtomicU64::new(0),
            builds: AtomicU64::new(0),
            build_nanos: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Lazy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lazy")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Lazy {
    pub(crate) fn stats(&self) -> LazyStats {
        let pending = self
            .states
            .lock()
            .values()
            .filter(|s| **s == State::Pending)
            .count() as u64;
        LazyStats {
            served_generic: self.served_generic.load(Ordering::Relaxed),
            sealed_generic: self.sealed_generic.load(Ordering::Relaxed),
            swapped_in: self.swapped_in.load(Ordering::Relaxed),
            background_builds: self.builds.load(Ordering::Relaxed),
            background_build_time: Duration::from_nanos(self.build_nanos.load(Ordering::Relaxed)),
            background_failures: self.failures.load(Ordering::Relaxed),
            pending,
        }
    }

    fn state(&self, key: &KernelKey) -> Option<State> {
        self.states.lock().get(key).copied()
    }

    /// A specialized kernel is being returned: whether it is the first time since its background
    /// build (counted once).
    fn take_ready(&self, key: impl FnOnce() -> KernelKey) -> bool {
        if self.ready.load(Ordering::Acquire) == 0 {
            return false;
        }
        let key = key();
        let mut s = self.states.lock();
        if s.get(&key) != Some(&State::Ready) {
            return false;
        }
        s.remove(&key);
        self.ready.fetch_sub(1, Ordering::AcqRel);
        drop(s);
        self.swapped_in.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("kpc_lazy_swapped_total").increment(1);
        true
    }

    fn served_generic(&self, sealed: bool) {
        self.served_generic.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("kpc_lazy_served_generic_total").increment(1);
        if sealed {
            self.sealed_generic.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues the background build of `request` (whose key is `key`) unless it is pending or has
    /// failed already.
    fn enqueue(
        self: &Arc<Self>,
        manager: &Arc<ProgramManager>,
        key: KernelKey,
        request: KernelRequest,
    ) {
        {
            let mut s = self.states.lock();
            match s.get(&key) {
                Some(State::Pending | State::Failed) => return,
                Some(State::Ready) => {
                    self.ready.fetch_sub(1, Ordering::AcqRel);
                }
                None => {}
            }
            s.insert(key.clone(), State::Pending);
        }
        let mut p = self.pool.lock();
        p.jobs.push_back(Job {
            key,
            request,
            manager: Arc::downgrade(manager),
        });
        if p.live < self.max_workers && p.live < p.running + p.jobs.len() {
            p.handles.retain(|h| !h.is_finished());
            let me = self.clone();
            let i = p.live;
            match std::thread::Builder::new()
                .name(format!("kpc-lazy-{i}"))
                .spawn(move || me.work())
            {
                Ok(h) => {
                    p.live += 1;
                    p.handles.push(h);
                }
                Err(e) => {
                    // No worker: the job stays queued and the fallback serves meanwhile; the next
                    // enqueue tries again.
                    tracing::warn!(target: "kpc::lazy", "could not spawn a background build worker: {e}");
                }
            }
        }
    }

    fn work(&self) {
        loop {
            let job = {
                let mut p = self.pool.lock();
                match p.jobs.pop_front() {
                    Some(j) => {
                        p.running += 1;
                        j
                    }
                    None => {
                        p.live -= 1;
                        return;
                    }
                }
            };
            let key = job.key.clone();
            if catch_unwind(AssertUnwindSafe(|| self.run(job))).is_err() {
                self.finish(&key, Some(State::Failed));
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(target: "kpc::lazy", "a background build panicked; the fallback goes on serving");
            }
            let mut p = self.pool.lock();
            p.running -= 1;
            if p.running == 0 && p.jobs.is_empty() {
                self.idle.notify_all();
            }
        }
    }

    fn finish(&self, key: &KernelKey, to: Option<State>) {
        let mut s = self.states.lock();
        match to {
            Some(st) => {
                if st == State::Ready {
                    self.ready.fetch_add(1, Ordering::AcqRel);
                }
                s.insert(key.clone(), st);
            }
            None => {
                s.remove(key);
            }
        }
    }

    fn run(&self, job: Job) {
        // The manager's last owner may be gone: then so is the point of building.
        let Some(m) = job.manager.upgrade() else {
            self.finish(&job.key, None);
            return;
        };
        let r = &job.request;
        let name = kernel_name(r.image.name(), Some(&r.entry));
        let span = tracing::info_span!(target: "kpc::lazy", "background_build", kernel = %name);
        let _in = span.enter();
        let start = Instant::now();
        let got = with_fallback(|| m.kernel(&r.image, &r.entry, &r.spec, &r.options));
        let took = start.elapsed();
        match got {
            Ok(a) => {
                if a.source == Source::Built {
                    self.builds.fetch_add(1, Ordering::Relaxed);
                    self.build_nanos
                        .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
                    metrics::counter!("kpc_lazy_background_builds_total").increment(1);
                    metrics::histogram!("kpc_lazy_background_build_duration_seconds")
                        .record(took.as_secs_f64());
                }
                tracing::debug!(target: "kpc::lazy", kernel = %name, source = %a.source,
                    ms = took.as_secs_f64() * 1e3, "specialized kernel ready");
                self.finish(&job.key, Some(State::Ready));
            }
            // The seal came into force after the build was queued: nothing was built, and the next
            // request decides again (serving the fallback under `generic`).
            Err(Error::Sealed { .. }) => self.finish(&job.key, None),
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("kpc_lazy_background_failures_total").increment(1);
                self.finish(&job.key, Some(State::Failed));
                crate::warnings::emit!(
                    Some(&m.config().warning_sink()),
                    target: "kpc::lazy",
                    cause: "background-build-failed",
                    "the background build of specialized kernel {name} failed after {:.1} ms: \
                     {e}; its generic fallback goes on serving it in this context",
                    took.as_secs_f64() * 1e3
                );
            }
        }
        // The strong handle goes before the job counts as finished (see `cancel_and_wait`).
        drop(m);
    }
}

impl Cancel for Lazy {
    /// Drops the queued builds (a later request queues them again) and waits for the running ones,
    /// then reaps the workers.
    fn cancel_and_wait(&self) {
        let mut p = self.pool.lock();
        let dropped: Vec<Job> = p.jobs.drain(..).collect();
        while p.running > 0 {
            self.idle.wait(&mut p);
        }
        let handles = std::mem::take(&mut p.handles);
        drop(p);
        for j in &dropped {
            self.finish(&j.key, None);
        }
        for h in handles {
            // The workers find the queue empty and return; joining only reaps them.
            let _ = h.join();
        }
    }
}

impl ProgramManager {
    /// The kernel `specialized` names, or, while that one is not available without a build,
    /// `generic` (see the module documentation, `src/runtime/lazy.rs`): the specialized kernel is
    /// then built in the background, and a later acquisition returns it once it is ready.
    /// [`LazyAcquired::generic`] says which one came back.
    ///
    /// Errors: those of acquiring `generic` when it is served; when `generic` itself fails, the
    /// specialized kernel is acquired here as without a fallback (and its errors returned). Under
    /// the `error` seal, a specialized kernel that would build is refused ([`Error::Sealed`]) as
    /// without a fallback.
    pub fn kernel_or_generic(
        self: &Arc<Self>,
        specialized: &KernelRequest,
        generic: &KernelRequest,
    ) -> Result<LazyAcquired<Local<DynKernel>>> {
        let start = Instant::now();
        let s = specialized;
        let lazy = self.lazy();
        let key = || KernelKey::new(self.program_key(&s.image, &s.spec, &s.options), &s.entry);
        let done = |acquired: Acquired<Local<DynKernel>>, generic, swapped| {
            Ok(LazyAcquired {
                acquired: Acquired {
                    value: acquired.value,
                    source: acquired.source,
                    elapsed: start.elapsed(),
                },
                generic,
                swapped,
            })
        };
        if let Some(value) = self.kernel_hit_local(&s.image, &s.entry, &s.spec, &s.options) {
            let swapped = lazy.take_ready(key);
            let a = Acquired {
                value,
                source: Source::Memory,
                elapsed: Duration::ZERO,
            };
            return done(a, false, swapped);
        }
        let key = key();
        let state = lazy.state(&key);
        // Neither queued nor failed: a request may find it in memory or a store, or queue it.
        let fresh = !matches!(state, Some(State::Pending | State::Failed));
        let available = if !fresh {
            None
        } else if self.memory_cache().has_built_program(&key.program) {
            Some(None)
        } else {
            self.load_stored(s).map(Some)
        };
        if let Some(from) = available {
            let mut a = self.kernel_local(&s.image, &s.entry, &s.spec, &s.options)?;
            if let Some(store) = from {
                a.source = store;
            }
            let swapped = lazy.take_ready(|| key);
            return done(a, false, swapped);
        }
        let sealed = fresh && self.seal_state().serves_generic();
        if fresh && self.seal_state().mode() == crate::SealMode::Error {
            // Refused with the stores' explanation, as without a fallback.
            let a = self.kernel_local(&s.image, &s.entry, &s.spec, &s.options)?;
            return done(a, false, false);
        }
        let g = &generic;
        match self.kernel_local(&g.image, &g.entry, &g.spec, &g.options) {
            Ok(a) => {
                if fresh && !sealed {
                    lazy.enqueue(self, key, s.clone());
                }
                lazy.served_generic(sealed);
                tracing::debug!(target: "kpc::lazy", kernel = %kernel_name(s.image.name(), Some(&s.entry)),
                    generic = %kernel_name(g.image.name(), Some(&g.entry)), source = %a.source,
                    "served the generic fallback");
                done(a, true, false)
            }
            Err(e) => {
                tracing::warn!(target: "kpc::lazy", kernel = %kernel_name(g.image.name(), Some(&g.entry)),
                    "the generic fallback failed ({e}); acquiring the specialized kernel instead");
                let a = self.kernel_local(&s.image, &s.entry, &s.spec, &s.options)?;
                let swapped = lazy.take_ready(|| key);
                done(a, false, swapped)
            }
        }
    }

    /// Loads the program of `r` from a store into memory when one holds a copy the driver takes,
    /// without building: the store's [`Source`], or `None`. A copy the driver refuses is left to the
    /// usual path (the background build), which rejects it and builds.
    fn load_stored(&self, r: &KernelRequest) -> Option<Source> {
        if self.stores().is_empty() {
            return None;
        }
        let key = self.disk_key(&r.image, &r.spec, &r.options);
        let hit = self.stores().get(&key, &[])?;
        // A binary that crashed a process loading it is the usual path's to remove.
        let record = self.stores().begin_load(&key, &hit).ok()?;
        self.kernel_from_binary(&r.image, &r.entry, &r.spec, &r.options, hit.bytes())
            .ok()?;
        drop(record);
        self.stores().backfill(&key, &hit);
        Some(Source::of_store(hit.kind()))
    }

    /// What serving generic fallbacks did so far.
    pub fn lazy_stats(&self) -> LazyStats {
        self.lazy().stats()
    }
}
