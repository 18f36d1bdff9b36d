//! `BuildResult<T, E>` and `get_or_build`: single-flight building, after the SYCL runtime's
//! KernelProgramCache.
//!
//! One entry per key holds the build state in an atomic. The thread that wins the compare-and-swap
//! `Initial -> InProgress` builds, outside any map lock; the others block on the entry's condvar;
//! callers that find `Done` or `Failed` return after two atomic loads, touching neither a lock nor the
//! condvar. A deterministic failure is final and cached; a transient one (or a panic) puts the entry back
//! to `Initial` so exactly one waiter retries, and each wave of retries is bounded.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32 as AtomicU32Std, AtomicU64, Ordering as StdOrdering};

use super::sync::{AtomicU8, AtomicU32, Condvar, Mutex, OnceValue, Ordering};

/// How many transient failures (or panics) of one entry a waiter sits through before it gives up and
/// returns the latest one instead of retrying. Bounds the builds one burst of callers can cause.
pub const MAX_TRANSIENT_RETRIES: u32 = 3;

/// The build state of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BuildState {
    /// Nobody is building and nothing is stored: the next caller builds.
    Initial = 0,
    /// One thread is building; others wait on the condvar.
    InProgress = 1,
    /// The value is stored; final.
    Done = 2,
    /// A deterministic error is stored; final.
    Failed = 3,
}

impl BuildState {
    fn from_u8(v: u8) -> BuildState {
        match v {
            0 => BuildState::Initial,
            1 => BuildState::InProgress,
            2 => BuildState::Done,
            _ => BuildState::Failed,
        }
    }
}

/// What a build error must offer to be cached: whether it is worth retrying, and how to describe a
/// panic to waiters that give up after one.
pub trait BuildFailure: Clone + Send + Sync + 'static {
    /// True for failures that may not happen again (out of resources, I/O): they are not cached.
    fn is_transient(&self) -> bool;
    /// The error handed to a waiter that gives up after builds that panicked.
    fn from_panic(message: String) -> Self;
    /// False for deterministic failures that must still leave nothing cached (invalid input the caller
    /// should fix, such as malformed SPIR-V): the entry goes back to `Initial` without counting as a
    /// transient failure, and every caller that builds it sees the error afresh.
    fn is_cacheable(&self) -> bool {
        true
    }
}

/// Whether a failure is final (cached) or worth a retry (not cached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The same inputs fail the same way (a compile error): cached and returned again.
    Deterministic,
    /// May succeed next time (out of memory, I/O, a panic): the entry goes back to `Initial`.
    Transient,
}

impl std::fmt::Display for FailureKind {
    /// `deterministic` or `transient`, for messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FailureKind::Deterministic => "deterministic",
            FailureKind::Transient => "transient",
        })
    }
}

/// The cache's own build error: a code, a message and whether it is transient. Cloned to every waiter,
/// so all of them see the same message and code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("build failed ({kind}, code {code}): {message}")]
#[non_exhaustive]
pub struct BuildError {
    /// Deterministic or transient.
    pub kind: FailureKind,
    /// A backend error code (a VkResult or cl_int), or -1.
    pub code: i32,
    /// What went wrong, including any build log.
    pub message: String,
}

impl BuildError {
    /// A failure that will recur for the same inputs.
    pub fn deterministic(code: i32, message: impl Into<String>) -> Self {
        BuildError {
            kind: FailureKind::Deterministic,
            code,
            message: message.into(),
        }
    }
    /// A failure that may not recur.
    pub fn transient(code: i32, message: impl Into<String>) -> Self {
        BuildError {
            kind: FailureKind::Transient,
            code,
            message: message.into(),
        }
    }
}

impl BuildFailure for BuildError {
    fn is_transient(&self) -> bool {
        self.kind == FailureKind::Transient
    }
    fn from_panic(message: String) -> Self {
        BuildError::transient(-1, message)
    }
}

/// How a request was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Found finished: two atomic loads, no lock, no condvar.
    Hit,
    /// This caller ran the build.
    Built,
    /// This caller blocked while another thread built.
    Waited,
}

/// One cached build: the value or the deterministic error, its state, and what waiters block on.
///
/// Guarantees: the build closure of a key runs on one thread at a time; once `Done` or `Failed`, the
/// stored outcome never changes and every reader gets a clone of the same `Arc` or error.
#[derive(Debug)]
pub struct BuildResult<T, E> {
    state: AtomicU8,
    outcome: OnceValue<Result<Arc<T>, E>>,
    wait_lock: Mutex<()>,
    wait_cv: Condvar,
    transient_failures: AtomicU32,
    last_transient: Mutex<Option<E>>,
    // Bookkeeping for the owning cache's LRU; not part of the state machine, so plain std atomics even
    // under loom.
    last_use: AtomicU64,
    cost: AtomicU64,
    waiters: AtomicU32Std,
}

impl<T, E> Default for BuildResult<T, E> {
    fn default() -> Self {
        BuildResult::new()
    }
}

impl<T, E> BuildResult<T, E> {
    /// A fresh entry in state `Initial`.
    pub fn new() -> Self {
        BuildResult {
            state: AtomicU8::new(BuildState::Initial as u8),
            outcome: OnceValue::new(),
            wait_lock: Mutex::new(()),
            wait_cv: Condvar::new(),
            transient_failures: AtomicU32::new(0),
            last_transient: Mutex::new(None),
            last_use: AtomicU64::new(0),
            cost: AtomicU64::new(0),
            waiters: AtomicU32Std::new(0),
        }
    }

    /// How many callers are blocked now on this entry's build in progress (bookkeeping for
    /// introspection: the state machine does not read it).
    pub fn waiters(&self) -> u32 {
        self.waiters.load(StdOrdering::Relaxed)
    }

    /// The current state.
    #[inline]
    pub fn state(&self) -> BuildState {
        BuildState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// How many builds of this entry failed transiently or panicked.
    pub fn transient_failures(&self) -> u32 {
        self.transient_failures.load(Ordering::Acquire)
    }

    /// The LRU tick of the last use, as set by the owning cache.
    pub(crate) fn last_use(&self) -> u64 {
        self.last_use.load(StdOrdering::Relaxed)
    }

    /// Records a use at `tick`.
    pub(crate) fn set_last_use(&self, tick: u64) {
        self.last_use.store(tick, StdOrdering::Relaxed);
    }

    /// The bytes this entry counts against its cache's threshold (set before `Done` is published).
    pub fn cost(&self) -> u64 {
        self.cost.load(StdOrdering::Relaxed)
    }

    /// Sets the byte cost; the owning cache calls this from its `on_built` hook.
    pub(crate) fn set_cost(&self, bytes: u64) {
        self.cost.store(bytes, StdOrdering::Relaxed);
    }
}

impl<T, E> BuildResult<T, E> {
    /// How many `Arc`s share the built value (this entry's included), without taking one: 1 means
    /// nothing outside the cache entry holds it. `None` unless the entry is `Done`.
    pub(crate) fn value_refs(&self) -> Option<usize> {
        if self.state() != BuildState::Done {
            return None;
        }
        self.outcome
            .with(|r| r.as_ref().ok().map(Arc::strong_count))
            .flatten()
    }
}

impl<T, E: Clone> BuildResult<T, E> {
    /// The stored outcome if the entry is final: the hit path. Lock-free.
    #[inline]
    pub(crate) fn try_final(&self) -> Option<Result<Arc<T>, E>> {
        match self.state() {
            BuildState::Done | BuildState::Failed => self.outcome.with(Clone::clone),
            _ => None,
        }
    }
}

impl<T, E: BuildFailure> BuildResult<T, E> {
    /// Returns the final outcome, building it on this thread if nobody else is, or waiting for the
    /// thread that is.
    ///
    /// `on_built` runs on the builder after the value is stored and before `Done` is published, so
    /// anything it records is visible to every thread that sees `Done`.
    pub fn get_or_build(
        &self,
        build: impl FnOnce() -> Result<T, E>,
        on_built: impl FnOnce(&Self, &Arc<T>),
    ) -> (Result<Arc<T>, E>, Served) {
        let mut build = Some(build);
        let mut on_built = Some(on_built);
        let failures_at_start = self.transient_failures.load(Ordering::Acquire);
        let mut waited = false;
        loop {
            match self.state() {
                BuildState::Done | BuildState::Failed => {
                    let out = self
                        .outcome
                        .with(Clone::clone)
                        .expect("a final state is published only after its outcome is stored");
                    let how = if waited { Served::Waited } else { Served::Hit };
                    return (out, how);
                }
                BuildState::Initial => {
                    // Each call builds at most once, and gives up after a bounded run of others' failures, so one
                    // burst of callers cannot turn a persistent out-of-memory into hundreds of builds.
                    let failed_since =
                        self.transient_failures.load(Ordering::Acquire) - failures_at_start;
                    if failed_since >= MAX_TRANSIENT_RETRIES {
                        if let Some(e) = self.last_transient.lock().clone() {
                            return (Err(e), Served::Waited);
                        }
                    }
                    if self
                        .state
                        .compare_exchange(
                            BuildState::Initial as u8,
                            BuildState::InProgress as u8,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        let build = build.take().expect("a call builds at most once");
                        let on_built = on_built.take().expect("a call builds at most once");
                        return (self.run_build(build, on_built), Served::Built);
                    }
                }
                BuildState::InProgress => {
                    waited = true;
                    self.waiters.fetch_add(1, StdOrdering::Relaxed);
                    let mut g = self.wait_lock.lock();
                    while self.state() == BuildState::InProgress {
                        g = self.wait_cv.wait(g);
                    }
                    drop(g);
                    self.waiters.fetch_sub(1, StdOrdering::Relaxed);
                }
            }
        }
    }

    fn run_build(
        &self,
        build: impl FnOnce() -> Result<T, E>,
        on_built: impl FnOnce(&Self, &Arc<T>),
    ) -> Result<Arc<T>, E> {
        // A panic must not strand waiters: catch it, put the entry back to Initial and wake them, then let the
        // panic continue to this caller. Resetting outside the unwind also keeps every mutex unpoisoned.
        let result = match catch_unwind(AssertUnwindSafe(build)) {
            Ok(r) => r,
            Err(payload) => {
                self.reset_after_failure(E::from_panic(
                    "the build of this entry panicked on another thread".to_string(),
                ));
                resume_unwind(payload);
            }
        };
        match result {
            Ok(v) => {
                let v = Arc::new(v);
                self.outcome.set(Ok(v.clone()));
                on_built(self, &v);
                self.publish(BuildState::Done);
                Ok(v)
            }
            Err(e) if e.is_transient() => {
                self.reset_after_failure(e.clone());
                Err(e)
            }
            Err(e) if !e.is_cacheable() => {
                self.publish(BuildState::Initial);
                Err(e)
            }
            Err(e) => {
                self.outcome.set(Err(e.clone()));
                self.publish(BuildState::Failed);
                Err(e)
            }
        }
    }

    fn reset_after_failure(&self, e: E) {
        *self.last_transient.lock() = Some(e);
        self.transient_failures.fetch_add(1, Ordering::AcqRel);
        self.publish(BuildState::Initial);
    }

    fn publish(&self, state: BuildState) {
        self.state.store(state as u8, Ordering::Release);
        // Taking the lock orders this store against a waiter's check-then-wait, so no wakeup is lost.
        drop(self.wait_lock.lock());
        self.wait_cv.notify_all();
    }
}

/// A map of build entries as `get_or_build` needs it. The sharded `DashMap` of the real cache and the
/// mutex-guarded map of the loom models both implement it.
pub trait BuildMap<K, T, E> {
    /// Runs `f` on the entry of `key`, if there is one, without cloning the entry's `Arc`.
    fn with_entry<R>(&self, key: &K, f: impl FnOnce(&BuildResult<T, E>) -> R) -> Option<R>;
    /// Returns the entry of `key`, inserting a fresh `Initial` one if there is none.
    fn entry_or_insert(&self, key: &K) -> Arc<BuildResult<T, E>>;
    /// Removes the entry of `key` if it is still `entry` (not a newer one inserted since).
    fn remove_entry(&self, key: &K, entry: &Arc<BuildResult<T, E>>);
}

impl<K, T, E, S> BuildMap<K, T, E> for dashmap::DashMap<K, Arc<BuildResult<T, E>>, S>
where
    K: std::hash::Hash + Eq + Clone,
    S: std::hash::BuildHasher + Clone,
{
    #[inline]
    fn with_entry<R>(&self, key: &K, f: impl FnOnce(&BuildResult<T, E>) -> R) -> Option<R> {
        self.get(key).map(|e| f(e.value()))
    }
    fn entry_or_insert(&self, key: &K) -> Arc<BuildResult<T, E>> {
        self.entry(key.clone())
            .or_insert_with(|| Arc::new(BuildResult::new()))
            .value()
            .clone()
    }
    fn remove_entry(&self, key: &K, entry: &Arc<BuildResult<T, E>>) {
        self.remove_if(key, |_, v| Arc::ptr_eq(v, entry));
    }
}

/// A cache's answer for one request.
#[derive(Debug)]
pub struct Resolved<T, E> {
    /// The shared value, or the (cached or transient) error.
    pub result: Result<Arc<T>, E>,
    /// How it was served.
    pub served: Served,
}

/// Returns the value for `key`, building it at most once across all concurrent callers.
///
/// The three closures follow the SYCL runtime's `getOrBuild`: `acquire` gives access to the cache (for a
/// sharded map that takes no lock; shard locks are taken inside the map), `get_cache` picks the map, and
/// `build` builds. `on_hit` runs on the lock-free hit path (the cache refreshes LRU recency there);
/// `on_built` runs on the builder before `Done` is published.
pub fn get_or_build<L, M, K, T, E>(
    acquire: impl FnOnce() -> L,
    get_cache: impl for<'a> FnOnce(&'a L) -> &'a M,
    key: &K,
    build: impl FnOnce() -> Result<T, E>,
    on_hit: impl FnOnce(&BuildResult<T, E>),
    on_built: impl FnOnce(&BuildResult<T, E>, &Arc<T>),
) -> Resolved<T, E>
where
    M: BuildMap<K, T, E> + ?Sized,
    E: BuildFailure,
{
    let access = acquire();
    let map = get_cache(&access);
    let fast = map.with_entry(key, |e| {
        let r = e.try_final();
        if r.is_some() {
            on_hit(e);
        }
        r
    });
    if let Some(Some(result)) = fast {
        return Resolved {
            result,
            served: Served::Hit,
        };
    }
    let entry = map.entry_or_insert(key);
    let (result, served) = entry.get_or_build(build, on_built);
    if let Err(e) = &result {
        // An uncacheable failure leaves no entry behind, not even an Initial one, so the cache holds
        // nothing for that key (a waiter that is about to retry re-inserts one).
        if served == Served::Built && !e.is_cacheable() && entry.state() == BuildState::Initial {
            map.remove_entry(key, &entry);
        }
    }
    Resolved { result, served }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_error_says_its_kind_in_words() {
        let e = BuildError::transient(-2, "out of memory").to_string();
        assert_eq!(e, "build failed (transient, code -2): out of memory");
        let e = BuildError::deterministic(-11, "syntax error").to_string();
        assert!(
            e.starts_with("build failed (deterministic, code -11)"),
            "{e}"
        );
    }
}
