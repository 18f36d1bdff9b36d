//! What the cache did, as events: one [`CacheEvent`] for each thing a miss went through (a level's
//! hit or miss, a wait for another builder, a load, a refusal, a build, a put), delivered to the
//! [`CacheObserver`]s of the context's [`StoreChain`](super::StoreChain).
//!
//! The miss path only says what happened; what is done about it lives with whoever needs it, in the
//! manner of `tracing` subscribers or moka's eviction listeners: the chain's per-level counters
//! (`store/chain_counters.rs`), the idle-layer watch (`store/idle.rs`) and the miss journal
//! (`store/chain_journal.rs`), the `metrics` counters (`runtime/metrics.rs`), cache debug mode's
//! comparisons (`runtime/cache_debug.rs`) and the warm start's record of acquired kernels
//! (`runtime/warm_start.rs`). An embedder subscribes with
//! [`ContextBuilder::observer`](crate::ContextBuilder::observer) or
//! [`StoreChain::with_observer`](super::StoreChain::with_observer).
//!
//! The memory cache tells its LRU evictions ([`CacheEvent::Evicted`]) to the observers subscribed
//! with `with_observer`. What is not an event: a memory hit (the hot path writes no shared state; its
//! counts are in [`CacheStats`](super::CacheStats)), and the seal, which decides whether a build may
//! run and so is a gate on the miss path, not something told afterwards.
//!
//! Delivery is synchronous, on the thread that made the request, in the order things happened, with
//! no lock of the chain held; an observer should be quick (count, queue, or note) and must not call
//! back into the context. A panic in an embedder's observer is caught and the event dropped for it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::store::{PutOutcome, Store, StoreKey, StoreKind};
use super::{BuildOptions, SpecConstants};
use crate::backend::DeviceImage;

/// The level of a store chain an event happened at.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct CacheLevel<'a> {
    /// Its place in the chain (0 = asked first).
    pub index: usize,
    /// What kind of store it is: the local disk, a read-only layer, the remote, another.
    pub kind: StoreKind,
    /// The store's name (`disk:/home/u/.cache/kpc`, `remote:redis://…`).
    pub name: &'a str,
    /// The store: for what an observer may ask of it, such as why a key missed
    /// ([`Store::explain_miss`], which reads key records, so only the observers that need the cause
    /// pay for it).
    pub store: &'a dyn Store,
}

impl fmt::Debug for CacheLevel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{} ({:?})", self.name, self.index, self.kind)
    }
}

/// Why a program was built rather than loaded.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum BuildCause<'a> {
    /// Every level of the chain missed (or held only binaries the backend refused): the build is
    /// then stored in every writable level.
    Missed,
    /// The chain has no store: nothing is looked up or stored.
    NoStores,
    /// Cache debug mode (`KPC_CACHE_DEBUG=1`) builds every program by design, and stores nothing:
    /// `cached` is what the chain held for the key (looked up without changing any store), to
    /// compare the fresh binary with.
    Debug {
        /// The binary the chain held, if one.
        cached: Option<&'a [u8]>,
    },
}

/// One thing the cache did for a request that missed memory. See the module documentation for who
/// listens.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum CacheEvent<'a> {
    /// `level` returned a verified binary of `bytes` bytes for `key` (not loaded yet).
    Hit {
        /// Where.
        level: CacheLevel<'a>,
        /// The key looked up.
        key: &'a StoreKey,
        /// The binary's length.
        bytes: usize,
    },
    /// `level` held nothing usable for `key`. Its cause, where the store can tell:
    /// `level.store.explain_miss(key)`.
    Miss {
        /// Where.
        level: CacheLevel<'a>,
        /// The key looked up.
        key: &'a StoreKey,
    },
    /// Every level missed; while this request waited for `level`'s build lock, another builder
    /// (a process, a machine) published `key` there, and that binary is used instead of building.
    Waited {
        /// The level whose lock was waited for.
        level: CacheLevel<'a>,
        /// The key.
        key: &'a StoreKey,
        /// The binary's length.
        bytes: usize,
    },
    /// The backend accepted `level`'s binary for `key`, first built in `build_time` (what the hit
    /// saved, unless `recompiled`: the driver reported that it compiled anyway).
    Loaded {
        /// Where the binary came from.
        level: CacheLevel<'a>,
        /// The key.
        key: &'a StoreKey,
        /// How long the build that produced it took.
        build_time: Duration,
        /// Whether the driver compiled it anyway (creation feedback said so).
        recompiled: bool,
    },
    /// The backend refused `level`'s verified binary for `key` (a defect: a driver change the device
    /// fingerprint missed, or bytes that crashed a process loading them): a writable level removes
    /// it, a read-only one is skipped for the rest of the request.
    Rejected {
        /// Where the binary came from.
        level: CacheLevel<'a>,
        /// The key.
        key: &'a StoreKey,
        /// What the backend said.
        reason: &'a str,
    },
    /// A fresh build of `key` succeeded in `took`.
    Built {
        /// The key.
        key: &'a StoreKey,
        /// How long the build took.
        took: Duration,
        /// The binary the backend serialized the program to, when it was asked for one and gave
        /// one (a build after a miss, or in debug mode).
        binary: Option<&'a [u8]>,
        /// Why it was built.
        cause: BuildCause<'a>,
    },
    /// A put into `level`: a fresh build, or a copy of a lower level's accepted hit (`copy`, the
    /// backfill that lets the next process hit locally). `outcome` says whether it was stored.
    Published {
        /// The level written.
        level: CacheLevel<'a>,
        /// The key.
        key: &'a StoreKey,
        /// What the put did.
        outcome: PutOutcome,
        /// Whether the bytes were copied from a lower level rather than freshly built.
        copy: bool,
    },
    /// The memory cache's LRU evicted a program (with its kernels) of `bytes`
    /// ([`CacheCost`](super::CacheCost)) to stay under its threshold
    /// (`KPC_IN_MEM_CACHE_EVICTION_THRESHOLD`). The stores evict on their own and count it in their
    /// statistics.
    Evicted {
        /// The program's cost.
        bytes: u64,
    },
    /// A program request that missed memory was served: from a level of kind `from`, or built
    /// (`None`). One per program that entered memory this way.
    ProgramServed {
        /// The kind of the level that served it; `None` for a build.
        from: Option<StoreKind>,
    },
    /// A kernel request whose program missed memory was served (its kernel created): the request,
    /// as a warm start would repeat it.
    KernelServed {
        /// The kind of the level that served the program; `None` for a build.
        from: Option<StoreKind>,
        /// The image (a GLSL image's SPIR-V, as it was keyed).
        image: &'a DeviceImage,
        /// The entry point.
        entry: &'a str,
        /// The specialization constants.
        spec: &'a SpecConstants,
        /// The build options.
        options: &'a BuildOptions,
    },
}

// By hand: binaries are shown by their length, so that logging an event never dumps one.
impl fmt::Debug for BuildCause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildCause::Missed => f.write_str("Missed"),
            BuildCause::NoStores => f.write_str("NoStores"),
            BuildCause::Debug { cached } => f
                .debug_struct("Debug")
                .field("cached", &cached.map(<[u8]>::len))
                .finish(),
        }
    }
}

impl fmt::Debug for CacheEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at =
            |f: &mut fmt::Formatter<'_>, what: &str, level: &CacheLevel<'_>, key: &StoreKey| {
                write!(f, "{what} {level:?} {}", key.digest())
            };
        match self {
            CacheEvent::Hit { level, key, bytes } => {
                at(f, "Hit", level, key)?;
                write!(f, " ({bytes} bytes)")
            }
            CacheEvent::Miss { level, key } => at(f, "Miss", level, key),
            CacheEvent::Waited { level, key, bytes } => {
                at(f, "Waited", level, key)?;
                write!(f, " ({bytes} bytes)")
            }
            CacheEvent::Loaded {
                level,
                key,
                build_time,
                recompiled,
            } => {
                at(f, "Loaded", level, key)?;
                write!(f, " (built in {build_time:?}, recompiled: {recompiled})")
            }
            CacheEvent::Rejected { level, key, reason } => {
                at(f, "Rejected", level, key)?;
                write!(f, " ({reason})")
            }
            CacheEvent::Built {
                key,
                took,
                binary,
                cause,
            } => f
                .debug_struct("Built")
                .field("key", &format_args!("{}", key.digest()))
                .field("took", took)
                .field("binary", &binary.map(<[u8]>::len))
                .field("cause", cause)
                .finish(),
            CacheEvent::Published {
                level,
                key,
                outcome,
                copy,
            } => {
                at(f, "Published", level, key)?;
                write!(f, " ({outcome:?}, copy: {copy})")
            }
            CacheEvent::Evicted { bytes } => write!(f, "Evicted ({bytes} bytes)"),
            CacheEvent::ProgramServed { from } => write!(f, "ProgramServed from {from:?}"),
            CacheEvent::KernelServed {
                from, image, entry, ..
            } => write!(f, "KernelServed {}:{entry} from {from:?}", image.name()),
        }
    }
}

/// A subscriber to a context's [`CacheEvent`]s, registered with
/// [`ContextBuilder::observer`](crate::ContextBuilder::observer) or
/// [`StoreChain::with_observer`](super::StoreChain::with_observer).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use kpc::{CacheEvent, CacheObserver};
///
/// /// Counts fresh builds.
/// #[derive(Default)]
/// struct Builds(AtomicU64);
///
/// impl CacheObserver for Builds {
///     fn on_event(&self, event: &CacheEvent<'_>) {
///         if let CacheEvent::Built { .. } = event {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait CacheObserver: Send + Sync {
    /// `event` happened. Called on the requesting thread, in order; see the module documentation
    /// for what an observer may do.
    fn on_event(&self, event: &CacheEvent<'_>);
}

/// What the memory cache calls for each program it evicts: tells `observers`
/// [`CacheEvent::Evicted`].
pub(crate) fn evictions_to(
    observers: Arc<Vec<Arc<dyn CacheObserver>>>,
) -> impl Fn(u64) + Send + Sync + 'static {
    move |bytes| {
        let evicted = CacheEvent::Evicted { bytes };
        observers.iter().for_each(|o| deliver(&**o, &evicted));
    }
}

/// Delivers `event` to an embedder's `observer`: a panic there is caught (kpc never panics on a
/// subscriber's behalf, and the request goes on) and the event is lost for it.
pub(crate) fn deliver(observer: &dyn CacheObserver, event: &CacheEvent<'_>) {
    let call = std::panic::AssertUnwindSafe(|| observer.on_event(event));
    if std::panic::catch_unwind(call).is_err() {
        tracing::warn!(target: "kpc::cache::events", "a cache observer panicked; event dropped for it");
    }
}
