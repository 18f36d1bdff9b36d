//! Parallel acquisition: many kernels at once on a bounded pool of worker threads
//! ([`Context::prefetch`](super::Context::prefetch)), so disk loads and cold builds overlap instead
//! of running one after the other on the caller's thread.
//!
//! Prefetching adds no synchronization of its own to the caches: every request goes through the
//! same `get_or_build` as [`Context::kernel`](super::Context::kernel), so a key a worker is
//! building while a caller asks for it is built once (the caller waits on the entry's build), and a
//! program shared by several requested entry points is built once. What runs concurrently is the
//! backends' work for *different* programs:
//! - Vulkan: every program has its own `VkPipelineCache` (created without
//!   `VK_PIPELINE_CACHE_CREATE_EXTERNALLY_SYNCHRONIZED_BIT`, so even a shared one would be internally
//!   synchronized for `vkCreateComputePipelines`), and `vkCreateShaderModule`/
//!   `vkCreateComputePipelines` take the `VkDevice` without external synchronization.
//! - OpenCL: `clBuildProgram`/`clCreateProgramWithBinary` on one context from several threads are
//!   thread-safe per the OpenCL specification (only `clSetKernelArg` on one kernel is not, and no
//!   kernel is launched here).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::backend::DeviceImage;
use crate::backend::dynamic::DynKernel;
use crate::cache::{BuildOptions, SpecConstants};
use crate::error::{Error, Result};

use super::program_manager::{Acquired, ProgramManager};

/// One kernel to acquire: an image's entry point, its specialization constants and its build
/// options. The one request type of kpc: [`Context::kernel_with`](super::Context::kernel_with)
/// acquires one, [`Context::prefetch`](super::Context::prefetch) and
/// [`Context::prebuild`](super::Context::prebuild) many; the warm-start manifests record them.
///
/// ```no_run
/// # fn f(ctx: &kpc::Context, image: &kpc::DeviceImage) -> kpc::Result<()> {
/// use kpc::{KernelRequest, SpecConstants, SpecValue};
/// let k = ctx.kernel_with(
///     &KernelRequest::new(image, "saxpy").spec(SpecConstants::new().with(0, SpecValue::U32(64))),
/// )?;
/// # Ok(()) }
/// ```
///
/// Guarantees: two requests with the same image bytes, entry, constants and options name the same
/// cached kernel, whatever the image's name.
#[derive(Debug, Clone)]
pub struct KernelRequest {
    pub(crate) image: DeviceImage,
    pub(crate) entry: String,
    pub(crate) spec: SpecConstants,
    pub(crate) options: BuildOptions,
    /// The generic kernel that serves while this one is not available without a build (`lazy.rs`).
    pub(crate) generic: Option<Box<KernelRequest>>,
}

impl KernelRequest {
    /// Entry point `entry` of `image`, unspecialized, with default build options.
    pub fn new(image: &DeviceImage, entry: &str) -> Self {
        KernelRequest {
            image: image.clone(),
            entry: entry.to_string(),
            spec: SpecConstants::new(),
            options: BuildOptions::default(),
            generic: None,
        }
    }
    /// With `generic` as its fallback: while this (specialized) kernel is in no cache layer, an
    /// acquisition returns `generic` at once and builds this one in the background; the acquisition
    /// after it is ready returns this one ([`crate::Kernel::is_generic`] says which came back, since
    /// their launch parameters may differ). A fallback of `generic`'s own is not used. Through a
    /// context ([`crate::Context::kernel_with`], [`crate::Context::prefetch`]) the fallback applies;
    /// a warm start and the manager-level [`prefetch_kernels`] acquire the specialized kernel itself.
    /// See `src/runtime/lazy.rs`.
    pub fn or_generic(mut self, generic: KernelRequest) -> Self {
        self.generic = Some(Box::new(KernelRequest {
            generic: None,
            ..generic
        }));
        self
    }
    /// The generic fallback, when one was named ([`KernelRequest::or_generic`]).
    pub fn generic(&self) -> Option<&KernelRequest> {
        self.generic.as_deref()
    }
    /// With specialization constants `spec` (replacing any set before).
    pub fn spec(mut self, spec: SpecConstants) -> Self {
        self.spec = spec;
        self
    }
    /// With build options `options` (replacing any set before).
    pub fn options(mut self, options: BuildOptions) -> Self {
        self.options = options;
        self
    }
    /// The device image.
    pub fn image(&self) -> &DeviceImage {
        &self.image
    }
    /// The entry point.
    pub fn entry(&self) -> &str {
        &self.entry
    }
    /// The specialization constants.
    pub fn spec_constants(&self) -> &SpecConstants {
        &self.spec
    }
    /// The build options.
    pub fn build_options(&self) -> &BuildOptions {
        &self.options
    }
}

type Work<R, T> = dyn Fn(&R) -> Result<T> + Send + Sync;

struct Shared<R, T> {
    requests: Vec<R>,
    work: Box<Work<R, T>>,
    /// The next request nobody has taken yet.
    next: AtomicUsize,
    /// Set by [`Batch::cancel`]: no request is taken any more.
    cancelled: AtomicBool,
    results: Mutex<Slots<T>>,
    finished: Condvar,
}

struct Slots<T> {
    results: Vec<Option<Result<T>>>,
    done: usize,
}

impl<R, T> Shared<R, T> {
    /// Takes requests until none is left. Run by every worker and by a waiting caller, so the batch
    /// completes even where no worker thread could be spawned.
    fn drain(&self) {
        loop {
            if self.cancelled.load(Ordering::Acquire) {
                return;
            }
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            let Some(req) = self.requests.get(i) else {
                return;
            };
            // A panicking backend must not strand the waiter: the request reports it as its error.
            let r = catch_unwind(AssertUnwindSafe(|| (self.work)(req))).unwrap_or_else(|p| {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic".into());
                Err(Error::Panicked(format!(
                    "acquiring a prefetched kernel panicked: {what}"
                )))
            });
            let mut s = self.results.lock();
            s.results[i] = Some(r);
            s.done += 1;
            if s.done == s.results.len() {
                self.finished.notify_all();
            }
        }
    }

    /// Stops the batch: requests nobody has taken yet finish at once with [`Error::Cancelled`];
    /// those running go on to their end.
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        let n = self.requests.len();
        // Takes every index not yet taken; a worker's later fetch_add lands past the end.
        let from = self.next.swap(n, Ordering::AcqRel).min(n);
        if from == n {
            return;
        }
        let mut s = self.results.lock();
        for slot in &mut s.results[from..n] {
            *slot = Some(Err(Error::Cancelled(
                "the prefetch was dropped or its context quiesced before this request began".into(),
            )));
        }
        s.done += n - from;
        if s.done == n {
            self.finished.notify_all();
        }
    }

    /// Blocks until every request has finished or been cancelled.
    fn wait_done(&self) {
        let mut s = self.results.lock();
        while s.done < s.results.len() {
            self.finished.wait(&mut s);
        }
    }
}

/// A batch of acquisitions running on worker threads. [`Prefetch::wait`] gives one result per
/// request, in request order.
///
/// Dropping the handle without waiting cancels the batch: requests not yet begun are not run, and
/// the drop returns once the requests already running have finished (what they acquired lands in
/// the caches). So when the drop returns, the batch makes no further call on the device, and holds
/// nothing of the context: an embedder that drops its last kpc object after it may destroy a
/// borrowed device.
pub struct Prefetch<T> {
    shared: Arc<dyn Batch<T>>,
    workers: Vec<JoinHandle<()>>,
}

/// What stops a running batch, whatever it returns: [`Cancel::cancel_and_wait`] is what a
/// context's `quiesce` and a warm start's stop run on their batches.
pub(crate) trait Cancel: Send + Sync {
    /// Cancels the requests not yet begun and blocks until the running ones have finished.
    fn cancel_and_wait(&self);
}

/// The request type erased, so the handle's type names only what it returns.
trait Batch<T>: Cancel {
    fn drain(&self);
    fn slots(&self) -> &Mutex<Slots<T>>;
    fn finished(&self) -> &Condvar;
}

impl<R: Send + Sync, T: Send> Cancel for Shared<R, T> {
    fn cancel_and_wait(&self) {
        self.cancel();
        self.wait_done();
    }
}

impl<R: Send + Sync, T: Send> Batch<T> for Shared<R, T> {
    fn drain(&self) {
        Shared::drain(self)
    }
    fn slots(&self) -> &Mutex<Slots<T>> {
        &self.results
    }
    fn finished(&self) -> &Condvar {
        &self.finished
    }
}

impl<T> std::fmt::Debug for Prefetch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared.slots().lock();
        f.debug_struct("Prefetch")
            .field("requests", &s.results.len())
            .field("done", &s.done)
            .field("workers", &self.workers.len())
            .finish()
    }
}

/// How many workers a batch of `n` requests gets: one per core the process may use, at most one per
/// request.
pub fn default_workers(n: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    cores.min(n)
}

impl<T: Send + 'static> Prefetch<T> {
    /// Runs `work` on every request on `workers` threads (at least one when there is a request).
    pub(crate) fn spawn<R: Send + Sync + 'static>(
        requests: Vec<R>,
        workers: usize,
        work: impl Fn(&R) -> Result<T> + Send + Sync + 'static,
    ) -> Prefetch<T> {
        let n = requests.len();
        let shared = Arc::new(Shared {
            requests,
            work: Box::new(work),
            next: AtomicUsize::new(0),
            cancelled: AtomicBool::new(false),
            results: Mutex::new(Slots {
                results: (0..n).map(|_| None).collect(),
                done: 0,
            }),
            finished: Condvar::new(),
        });
        let mut handles = Vec::new();
        let workers = if n == 0 { 0 } else { workers.clamp(1, n) };
        for i in 0..workers {
            let s = shared.clone();
            // A thread that cannot be spawned only means less parallelism: `wait` drains what is left.
            match std::thread::Builder::new()
                .name(format!("kpc-prefetch-{i}"))
                .spawn(move || s.drain())
            {
                Ok(h) => handles.push(h),
                Err(e) => {
                    tracing::warn!(target: "kpc::prefetch", "could not spawn a prefetch worker: {e}");
                    break;
                }
            }
        }
        Prefetch {
            shared,
            workers: handles,
        }
    }

    /// How many requests the batch has.
    pub fn len(&self) -> usize {
        self.shared.slots().lock().results.len()
    }

    /// Whether the batch has no request.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many requests have finished (successfully or not).
    pub fn completed(&self) -> usize {
        self.shared.slots().lock().done
    }

    /// Whether every request has finished.
    pub fn is_finished(&self) -> bool {
        let s = self.shared.slots().lock();
        s.done == s.results.len()
    }

    /// What cancels this batch from elsewhere (a context's `quiesce`, a warm start's stop).
    pub(crate) fn canceller(&self) -> Arc<dyn Cancel>
    where
        T: 'static,
    {
        // Upcasting the trait object: Batch<T> has Cancel as its supertrait.
        self.shared.clone() as Arc<dyn Cancel>
    }

    /// Blocks until every request has finished (the calling thread takes requests too), and returns
    /// one result per request, in request order, each with its own error ([`Error::Cancelled`] for
    /// a request the batch was cancelled before it began, by its context's `quiesce`).
    pub fn wait(mut self) -> Vec<Result<T>> {
        self.shared.drain();
        let mut s = self.shared.slots().lock();
        while s.done < s.results.len() {
            self.shared.finished().wait(&mut s);
        }
        let out = s
            .results
            .iter_mut()
            .map(|r| {
                r.take().unwrap_or_else(|| {
                    Err(Error::Panicked("a prefetch result went missing".into()))
                })
            })
            .collect();
        drop(s);
        for h in std::mem::take(&mut self.workers) {
            // The workers catch panics of the work itself; joining only reaps the thread.
            let _ = h.join();
        }
        out
    }
}

impl<T> Drop for Prefetch<T> {
    /// Cancels what has not begun, waits for what runs, and reaps the workers (see [`Prefetch`]).
    fn drop(&mut self) {
        self.shared.cancel_and_wait();
        for h in std::mem::take(&mut self.workers) {
            // A worker left drain() once no request was left; this only reaps it, so that nothing
            // of the batch (its context clone included) outlives the drop on another thread.
            let _ = h.join();
        }
    }
}

/// Acquires every request's kernel through `manager` on a bounded pool of worker threads (one per
/// core, at most one per request): the [`ProgramManager`]-level twin of
/// [`super::Context::prefetch`], for tools and tests that drive a manager directly.
pub fn prefetch_kernels(
    manager: &Arc<ProgramManager>,
    requests: Vec<KernelRequest>,
) -> Prefetch<Acquired<DynKernel>> {
    let m = manager.clone();
    let workers = default_workers(requests.len());
    Prefetch::spawn(requests, workers, move |r: &KernelRequest| {
        m.kernel(&r.image, &r.entry, &r.spec, &r.options)
    })
}

#[cfg(not(loom))]
impl super::Context {
    /// What [`super::Context::prefetch`] runs: every request through [`super::Context::kernel`] on
    /// its own worker pool.
    pub(crate) fn prefetch_impl(&self, requests: Vec<KernelRequest>) -> Prefetch<super::Kernel> {
        let ctx = self.internal();
        let workers = default_workers(requests.len());
        let p = Prefetch::spawn(requests, workers, move |r: &KernelRequest| {
            ctx.kernel_with(r)
        });
        self.inner.background.register(&p.canceller());
        p
    }
}
