//! [`AttentionOptions::lazy`](crate::AttentionOptions::lazy): prefills and decode steps never wait
//! for a specialized kernel's build.
//!
//! Each specialized kernel an [`Attention`](crate::Attention) chose is requested with `attn_generic`
//! as its fallback ([`kpc::KernelRequest::or_generic`]): while one is in no cache layer, kpc returns
//! the fallback at once and builds the specialized one in the background. Every call asks again (a
//! memory hit once the kernels are in memory): a decode step runs on the specialized kernels once
//! all of its path's kernels (the fused decode, or append, split and reduce) came back specialized,
//! else on `attn_generic` alone; a prefill likewise. `attn_generic` takes every shape parameter from
//! push constants, so its one build per device (cached on disk like any) serves every shape.
//!
//! A path's first call runs on `attn_generic` without asking: its specialized kernels are requested
//! (and their background builds begin) from its second call on. Drivers that compile a kernel again
//! at its first launch (PoCL) or only then (lavapipe) do that work for the first answer's
//! `attn_generic` on the CPU the background builds would take, and on such devices the first answer
//! is what the option is for.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kpc::{Context, Kernel, KernelRequest};

/// What the lazy kernels of one [`Attention`](crate::Attention) did
/// ([`Attention::lazy_report`](crate::Attention::lazy_report)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LazyReport {
    /// Prefills and decode steps (or attends) recorded on `attn_generic`.
    pub generic_calls: u64,
    /// Those recorded on the specialized kernels.
    pub specialized_calls: u64,
    /// Paths (prefill, decode) that ran on `attn_generic` and then on their specialized kernels.
    pub swapped: u64,
}

/// One path's specialized requests and whether it ran generic before.
struct Path {
    requests: Vec<KernelRequest>,
    /// Set by the path's first call, which asks for nothing.
    started: AtomicBool,
    was_generic: AtomicBool,
    swapped: AtomicBool,
}

/// The kernels a call records on.
pub(crate) enum Now {
    /// `attn_generic`.
    Generic(Kernel),
    /// The path's specialized kernels, in the order their requests were given.
    Specialized(Vec<Kernel>),
}

/// An attention's lazy state: the fallback, each path's requests, the counts.
pub(crate) struct Lazy {
    generic: Kernel,
    decode: Path,
    prefill: Path,
    generic_calls: AtomicU64,
    specialized_calls: AtomicU64,
}

impl Lazy {
    /// `generic` is the fallback, already acquired; `decode` the decode path's specialized requests
    /// (each with the fallback named), `prefill` the prefill's.
    pub(crate) fn new(generic: Kernel, decode: Vec<KernelRequest>, prefill: KernelRequest) -> Lazy {
        let path = |requests| Path {
            requests,
            started: AtomicBool::new(false),
            was_generic: AtomicBool::new(false),
            swapped: AtomicBool::new(false),
        };
        Lazy {
            generic,
            decode: path(decode),
            prefill: path(vec![prefill]),
            generic_calls: AtomicU64::new(0),
            specialized_calls: AtomicU64::new(0),
        }
    }

    /// What a decode step records on now.
    pub(crate) fn decode(&self, ctx: &Context) -> Now {
        self.now(ctx, &self.decode)
    }

    /// What a prefill records on now.
    pub(crate) fn prefill(&self, ctx: &Context) -> Now {
        self.now(ctx, &self.prefill)
    }

    fn now(&self, ctx: &Context, path: &Path) -> Now {
        if !path.started.swap(true, Ordering::Relaxed) {
            path.was_generic.store(true, Ordering::Relaxed);
            self.generic_calls.fetch_add(1, Ordering::Relaxed);
            return Now::Generic(self.generic.clone());
        }
        // Every request is made, so that each of the path's specialized kernels is queued for its
        // background build from the first call on, not one after the other.
        let got: Vec<Option<Kernel>> = path
            .requests
            .iter()
            .map(|r| ctx.kernel_with(r).ok().filter(|k| !k.is_generic()))
            .collect();
        if got.iter().all(Option::is_some) {
            if path.was_generic.load(Ordering::Relaxed) {
                path.swapped.store(true, Ordering::Relaxed);
            }
            self.specialized_calls.fetch_add(1, Ordering::Relaxed);
            return Now::Specialized(got.into_iter().flatten().collect());
        }
        path.was_generic.store(true, Ordering::Relaxed);
        self.generic_calls.fetch_add(1, Ordering::Relaxed);
        Now::Generic(self.generic.clone())
    }

    /// The fallback kernel.
    pub(crate) fn generic(&self) -> &Kernel {
        &self.generic
    }

    pub(crate) fn report(&self) -> LazyReport {
        LazyReport {
            generic_calls: self.generic_calls.load(Ordering::Relaxed),
            specialized_calls: self.specialized_calls.load(Ordering::Relaxed),
            swapped: [&self.decode, &self.prefill]
                .iter()
                .filter(|p| p.swapped.load(Ordering::Relaxed))
                .count() as u64,
        }
    }
}
