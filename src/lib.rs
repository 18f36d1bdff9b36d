//! kpc builds GPU kernels once and reuses them: per context in memory, across processes on disk.
//!
//! The surface, in the order an embedder meets it: [`Context::builder`] opens a device (the one
//! `KPC_DEVICE` selects, one from [`platforms`], or the embedder's own through [`interop`]);
//! [`Context::kernel`] acquires a kernel of a [`DeviceImage`] (from memory, a store, or a build;
//! [`kernels::shipped`] gives kpc's own for the context's backend); [`Context::buffer_from`] and
//! [`Queue::launch`] run it; [`Context::stats`] says what the caches did. [`Config`] holds every
//! setting (ENVIRONMENT.md lists the variables), [`StoreChain`] and [`Store`] the persistent layers.
//! [`admin`] is for tools (the `kpc` command): the on-disk cache, the remote, the backends opened
//! directly. The attention workload is the `kpc-attention` crate of this workspace, built on this
//! surface.
//!
//! Embedding: a [`Context`] can also run over a device the embedder owns
//! ([`ContextBuilder::vulkan_handles`], [`ContextBuilder::opencl_handles`]); kpc then borrows the
//! instance, device, context and queue and never destroys them, and owns only the objects it creates
//! on them. [`interop`] states the whole contract; cached kernels hand out their raw handles
//! ([`Kernel::vulkan_handles`], [`Kernel::opencl_lease`]) and cache blobs ([`Kernel::cache_blob`],
//! [`Context::kernel_from_blob`]).
//!
//! From C: the `kpc-capi` crate of this workspace is the same surface as `include/kpc.h` (cdylib
//! `libkpc.so`, staticlib `libkpc.a`), with status codes, a thread-local last error, and handles
//! checked on every call. The `kpc` binary is the `kpc-cli` crate.

#![warn(missing_docs)]
// The loom build (`--cfg loom`) compiles the cache layer for its models alone: what only the backends
// and the runtime use is dead there, and used in every other build.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

// The layers (top to bottom: runtime, cache, backend; the cache knows nothing of any backend) are
// crate-private; the root re-exports the embedder's surface and `admin` the tools'. loom's model
// tests reach the cache's synchronization through `loom_internals`.
#[cfg(not(loom))]
pub mod admin;
mod backend;
mod cache;
mod config;
mod error;
#[cfg(not(loom))]
pub mod interop;
pub mod kernels;
mod runtime;
mod warnings;

pub use backend::{
    BackendStats, BufferParam, DeviceImage, DeviceInfo, DeviceLimits, DeviceType, ImageFormat,
    KernelInfo, Pod, ProgramOrigin,
};
pub use cache::events::{BuildCause, CacheEvent, CacheLevel, CacheObserver};
pub use cache::store::{
    Access, Fleet, KeyRecord, LevelStats, PutOutcome, StoreCounters, StoreEntry, StoreKind, seal,
    sealed_record,
};
pub use cache::{
    BuildOptions, CacheStats, Digest, DiskStats, Removal, SpecConstants, SpecValue, Store,
    StoreChain, StoreHit, StoreKey, StoreStats,
};
pub use config::{
    BackendKind, CacheDirSource, Config, ConfigBuilder, ConfigError, DeviceClass, DeviceSelector,
    MacKey, MinFree, PublicKey, RemoteUrl, SealMode, SigningKey, TraceFlags,
};
pub use error::{Error, Result};
#[cfg(not(loom))]
pub use runtime::{
    Buffer, BufferArg, BufferBound, CacheBlob, Context, ContextBuilder, ContextStats, Event,
    Extent, Kernel, KernelRequest, LaunchDesc, LazyStats, ManifestState, Platform, PrebuildReport,
    Prefetch, PushConstants, Queue, RawBuffer, SpirvStats, SpirvStep, WarmStartReport,
    declare_access_bounds, platforms, select_device,
};
pub use runtime::{CacheDebugStats, SealStats, Source};
pub use warnings::{Warning, WarningCallback, set_warning_callback};

/// The cache's synchronization, for loom's model tests (loom_tests/) only.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_internals {
    pub use crate::cache::front::Front;
    pub use crate::cache::pass_gate::PassGate;
    pub use crate::cache::sync::Mutex;
    pub use crate::cache::{BuildError, BuildMap, BuildResult, BuildState, Served, get_or_build};
}

/// Everything a typical embedder names: `use kpc::prelude::*;` then `ctx.kernel(&image, "entry")`.
#[cfg(not(loom))]
pub mod prelude {
    pub use crate::{
        BackendKind, Buffer, BuildOptions, Config, Context, DeviceImage, Error, Kernel,
        KernelRequest, PushConstants, Result, Source, SpecConstants, SpecValue,
    };
}
