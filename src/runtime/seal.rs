//! Sealed mode: once a context is sealed, an acquisition that no layer can serve (memory, disk,
//! read-only layers, remote, an embedder's store, a blob) and that would therefore build is either
//! reported (`warn`: it builds, and one warning line names the kernel, why no store served it and
//! the build time) or refused (`error`: nothing is built and the caller gets [`Error::Sealed`]).
//! Under `generic`, a request that names a generic fallback ([`crate::KernelRequest::or_generic`])
//! is served the fallback and its specialized kernel is not built (`lazy.rs` asks
//! [`Seal::serves_generic`] before it queues the build, and a queued build that finds the seal in
//! force is refused here); a build with no fallback to serve instead is reported as under `warn`.
//!
//! A context is sealed explicitly ([`crate::Context::seal`], C `kpc_context_seal`) or, with
//! `KPC_CACHE_SEAL=warn|error`, when its warm start has finished (at creation when it has none: there
//! is no warm-up then). Hits of every layer are unaffected: the check runs only on the path that is
//! about to call the backend's build (or the GLSL compiler, for a GLSL image whose SPIR-V no layer
//! holds), so a hit pays nothing for it.
//!
//! The explanation is the stores' own ([`StoreChain::explain_miss`]: the nearest cached entry and the
//! key fields that differ, e.g. `spec-changed: spec constant 3: 64 → 128`), computed only for a
//! sealed build, which is about to cost far more than the few key records it reads.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use crate::cache::StoreChain;
use crate::cache::store::{StoreKey, StoreKind};
use crate::config::SealMode;
use crate::error::{Error, Result};

/// What sealing did for one context (part of [`crate::runtime::ContextStats`] and the C `kpc_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SealStats {
    /// The seal in force now: [`SealMode::Off`] while the context is not sealed.
    pub mode: SealMode,
    /// Builds that ran after sealing (`warn`), each logged with its explanation.
    pub builds: u64,
    /// Acquisitions refused after sealing (`error`) because they would have built.
    pub refused: u64,
    /// Builds left of the budget (`KPC_CACHE_BUILD_BUDGET`) before the seal comes into force;
    /// `None` where no budget is counting (none configured, the warm-up still running, or spent).
    pub budget_left: Option<u64>,
}

/// One context's seal: the mode in force and what it counted.
#[derive(Debug)]
pub(crate) struct Seal {
    mode: AtomicU8,
    builds: AtomicU64,
    refused: AtomicU64,
    /// Builds left before the budget seals ([`NO_BUDGET`]: none counting), and the mode it seals with.
    budget_left: AtomicU64,
    budget_mode: AtomicU8,
}

thread_local! {
    /// Set while this thread builds a specialized kernel in the background for a request that has a
    /// generic fallback (`lazy.rs`): under `generic` such a build is refused, not reported.
    static HAS_FALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as the background build of a specialized kernel whose request has a generic fallback.
pub(crate) fn with_fallback<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            HAS_FALLBACK.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(HAS_FALLBACK.with(|c| c.replace(true)));
    f()
}

/// `budget_left` when no budget is counting.
const NO_BUDGET: u64 = u64::MAX;

impl Default for Seal {
    fn default() -> Self {
        Seal {
            mode: AtomicU8::new(0),
            builds: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            budget_left: AtomicU64::new(NO_BUDGET),
            budget_mode: AtomicU8::new(0),
        }
    }
}

fn mode_of(code: u8) -> SealMode {
    match code {
        1 => SealMode::Warn,
        2 => SealMode::Error,
        3 => SealMode::Generic,
        _ => SealMode::Off,
    }
}

fn code(m: SealMode) -> u8 {
    match m {
        SealMode::Off => 0,
        SealMode::Warn => 1,
        SealMode::Error => 2,
        SealMode::Generic => 3,
    }
}

impl Seal {
    /// Puts `mode` in force (`Off` unseals).
    pub(crate) fn set(&self, mode: SealMode) {
        self.mode.store(code(mode), Ordering::Release);
    }

    /// The mode in force.
    pub(crate) fn mode(&self) -> SealMode {
        mode_of(self.mode.load(Ordering::Acquire))
    }

    /// Starts the build budget: `builds` more builds run as they would unsealed; the next one finds
    /// `mode` in force (`warn` where `mode` is off: a budget that sealed nothing would be no budget).
    pub(crate) fn start_budget(&self, builds: u64, mode: SealMode) {
        let mode = if mode == SealMode::Off {
            SealMode::Warn
        } else {
            mode
        };
        self.budget_mode.store(code(mode), Ordering::Release);
        self.budget_left
            .store(builds.min(NO_BUDGET - 1), Ordering::Release);
    }

    /// Takes one build of the budget, if one is counting: whether the budget was already spent, in
    /// which case its seal is put in force now (once: the thread that finds it spent).
    fn spend_budget(&self, kernel: &str) {
        let spent = self
            .budget_left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| match left {
                NO_BUDGET => None,
                0 => Some(NO_BUDGET),
                n => Some(n - 1),
            });
        if spent == Ok(0) {
            let mode = mode_of(self.budget_mode.load(Ordering::Acquire));
            self.set(mode);
            tracing::warn!(target: "kpc::seal", kernel, %mode,
                "build budget (KPC_CACHE_BUILD_BUDGET) spent: the context is sealed ({mode}) from {kernel} on");
        }
    }

    /// Called where `kernel` is about to be built: `Ok(None)` when not sealed (build silently),
    /// `Ok(Some(why))` under `warn` (build, then [`Seal::built`]), and under `error` the refusal.
    /// `why` is computed only when sealed.
    pub(crate) fn before_build(
        &self,
        kernel: &str,
        why: impl FnOnce() -> String,
    ) -> Result<Option<String>> {
        if self.mode() == SealMode::Off {
            self.spend_budget(kernel);
        }
        let mode = self.mode();
        let refuse = match mode {
            SealMode::Off => return Ok(None),
            SealMode::Warn => false,
            SealMode::Error => true,
            // A specialized kernel whose fallback serves is not built; anything else must be.
            SealMode::Generic => HAS_FALLBACK.with(Cell::get),
        };
        if !refuse {
            return Ok(Some(why()));
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        let why = why();
        tracing::debug!(target: "kpc::seal", kernel, why = %why, "refused a build");
        Err(Error::Sealed {
            kernel: kernel.to_owned(),
            why,
        })
    }

    /// A build that [`Seal::before_build`] let through under `warn` ran for `took` (`ok`: whether it
    /// succeeded): counted and logged, one line.
    pub(crate) fn built(&self, kernel: &str, why: &str, took: Duration, ok: bool) {
        self.builds.fetch_add(1, Ordering::Relaxed);
        let ms = took.as_secs_f64() * 1e3;
        let outcome = if ok { "built" } else { "tried to build" };
        tracing::warn!(target: "kpc::seal", kernel, ms,
            "sealed context {outcome} {kernel} in {ms:.1} ms: {why}");
    }

    /// Whether a request with a generic fallback is served the fallback instead of building its
    /// specialized kernel (the `generic` seal is in force).
    pub(crate) fn serves_generic(&self) -> bool {
        self.mode() == SealMode::Generic
    }

    /// The counters and the mode in force.
    pub(crate) fn stats(&self) -> SealStats {
        SealStats {
            mode: self.mode(),
            builds: self.builds.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            budget_left: match self.budget_left.load(Ordering::Acquire) {
                NO_BUDGET => None,
                n => Some(n),
            },
        }
    }
}

/// `image:entry`, or the image's name alone when no entry point is known (a program acquired on its
/// own).
pub(crate) fn kernel_name(image: &str, entry: Option<&str>) -> String {
    match entry {
        Some(e) => format!("{image}:{e}"),
        None => image.to_owned(),
    }
}

/// Why no store served `key`, in one line: `<cause>: <fields that differ>` from the store that
/// explains it best (named when it is not the local disk), or what the chain is when none can.
pub(crate) fn explain(stores: &StoreChain, key: &StoreKey) -> String {
    if stores.is_empty() {
        return "no persistent store is configured (KPC_CACHE_PERSISTENT=0 or no cache directory), \
                and it is not in memory"
            .into();
    }
    match stores.explain_miss(key) {
        Some((name, kind, e)) => {
            let mut s = format!("{}: {e}", e.cause);
            if kind != StoreKind::Disk {
                s.push_str(&format!(" (nearest entry in {name})"));
            }
            s
        }
        None => {
            let names: Vec<String> = stores.stats().into_iter().map(|l| l.name).collect();
            format!("no store holds it (asked: {})", names.join(", "))
        }
    }
}
