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

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::backend::dynamic::DynKernel;
use crate::cache::{KernelKey, Local};
use crate::error::{Error, Result};

pub use super::lazy_pool::LazyStats;
use super::lazy_pool::{Outcome, State};
use super::prefetch::KernelRequest;
use super::program_manager::{Acquired, ProgramManager};
use super::seal::{kernel_name, with_fallback};
use super::source::Source;

/// What [`ProgramManager::kernel_or_generic`] returned: the kernel, and which of the two it is.
#[derive(Debug)]
#[non_exhaustive]
pub struct LazyAcquired<T> {
    /// The kernel (the specialized one, or the fallback when [`LazyAcquired::generic`]).
    pub acquired: Acquired<T>,
    /// Whether it is the generic fallback: its launch parameters are the fallback's.
    pub generic: bool,
    /// Whether this is the first acquisition to return the specialized kernel after its
    /// background build.
    pub swapped: bool,
}

/// One background build of `r`'s specialized kernel through `m`, on a worker of the pool.
fn background_build(m: &Weak<ProgramManager>, r: &KernelRequest) -> Outcome {
    // The manager's last owner may be gone: then so is the point of building. The strong handle
    // lives only for this build, so a quiesce or a drop that waits for it waits for the build.
    let Some(m) = m.upgrade() else {
        return Outcome::Dropped;
    };
    let name = kernel_name(r.image.name(), Some(&r.entry));
    let span = tracing::info_span!(target: "kpc::lazy", "background_build", kernel = %name);
    let _in = span.enter();
    let start = Instant::now();
    let got = with_fallback(|| m.kernel(&r.image, &r.entry, &r.spec, &r.options));
    let took = start.elapsed();
    match got {
        Ok(a) => {
            tracing::debug!(target: "kpc::lazy", kernel = %name, source = %a.source,
                ms = took.as_secs_f64() * 1e3, "specialized kernel ready");
            Outcome::Ready {
                compiled: (a.source == Source::Built).then_some(took),
            }
        }
        // The seal came into force after the build was queued: nothing was built, and the next
        // request decides again (serving the fallback under `generic`).
        Err(Error::Sealed { .. }) => Outcome::Dropped,
        Err(e) => {
            m.lazy().failed();
            crate::warnings::emit!(
                Some(&m.config().warning_sink()),
                target: "kpc::lazy",
                cause: "background-build-failed",
                "the background build of specialized kernel {name} failed after {:.1} ms: {e}; \
                 its generic fallback goes on serving it in this context",
                took.as_secs_f64() * 1e3
            );
            Outcome::Failed
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
                // The program came into memory by `load_stored`, so `kernel_local` saw a memory hit
                // and told no one: a first acquisition from a store is told here.
                self.stores()
                    .emit(&crate::cache::events::CacheEvent::KernelServed {
                        from: store.store_kind(),
                        image: &s.image,
                        entry: &s.entry,
                        spec: &s.spec,
                        options: &s.options,
                    });
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
        let g = generic;
        match self.kernel_local(&g.image, &g.entry, &g.spec, &g.options) {
            Ok(a) => {
                if fresh && !sealed {
                    let (m, r) = (Arc::downgrade(self), s.clone());
                    lazy.enqueue(key, move || background_build(&m, &r));
                }
                lazy.served_generic(sealed);
                tracing::debug!(target: "kpc::lazy", kernel = %kernel_name(s.image.name(), Some(&s.entry)),
                    generic = %kernel_name(g.image.name(), Some(&g.entry)), source = %a.source,
                    "served the generic fallback");
                done(a, true, false)
            }
            Err(e) => {
                // Once: the specialized kernel acquired here is in memory for the next request.
                crate::warnings::emit!(
                    Some(&self.config().warning_sink()),
                    target: "kpc::lazy",
                    cause: "generic-failed",
                    "the generic fallback {} failed ({e}); acquiring the specialized kernel {} \
                     instead, without a fallback",
                    kernel_name(g.image.name(), Some(&g.entry)),
                    kernel_name(s.image.name(), Some(&s.entry))
                );
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
        self.stores().backfill(&key, &hit, false);
        Some(Source::of_store(hit.kind()))
    }

    /// What serving generic fallbacks did so far.
    pub fn lazy_stats(&self) -> LazyStats {
        self.lazy().stats()
    }
}
