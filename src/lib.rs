//! kpc builds GPU kernels once and reuses them: per context in memory, across processes on disk.
//!
//! Layers, top to bottom: `runtime` (keys, orchestration), `cache` (in-memory
//! `KernelProgramCache`, on-disk persistent cache), `backend` (Vulkan, OpenCL). The cache layer knows
//! nothing of any backend. The attention workload is the `kpc-attention` crate of this workspace,
//! built on this crate's public API.
//!
//! Embedding: a [`Context`] can also run over a device the embedder owns
//! ([`ContextBuilder::vulkan_handles`], [`ContextBuilder::opencl_handles`]); kpc then borrows the
//! instance, device, context and queue and never destroys them, and owns only the objects it creates
//! on them. [`runtime::interop`] states the whole contract; cached kernels hand out their raw handles
//! ([`Kernel::vulkan_handles`], [`Kernel::opencl_lease`]) and cache blobs ([`runtime::blob`]).
//!
//! From C: the `kpc-capi` crate of this workspace is the same surface as `include/kpc.h` (cdylib
//! `libkpc.so`, staticlib `libkpc.a`), with status codes, a thread-local last error, and handles
//! checked on every call. The `kpc` binary is the `kpc-cli` crate.

#![warn(missing_docs)]

pub mod backend;
pub mod cache;
pub mod config;
pub mod error;
pub mod kernels;
pub mod runtime;
pub mod warnings;

// One import brings in what the main call (`Context::kernel`) and its results need:
// `use kpc::prelude::*;` or these root names.
pub use backend::{DeviceImage, ImageFormat};
pub use cache::{BuildOptions, SpecConstants, SpecValue};
pub use config::{BackendKind, Config, ConfigError, SealMode};
pub use error::{Error, Result};
#[cfg(not(loom))]
pub use runtime::Source;
#[cfg(not(loom))]
pub use runtime::{
    Buffer, CacheBlob, Context, ContextBuilder, Event, Kernel, KernelRequest, OpenClHandles,
    OpenClKernelLease, PushConstants, Queue, VulkanFeatures, VulkanHandles, VulkanKernelHandles,
    VulkanQueueLock,
};
pub use warnings::{Warning, WarningCallback, set_warning_callback};

/// Everything a typical embedder names: `use kpc::prelude::*;` then
/// `ctx.kernel(&image, "entry")`.
#[cfg(not(loom))]
pub mod prelude {
    pub use crate::{
        BackendKind, Buffer, BuildOptions, Config, Context, DeviceImage, Error, Kernel,
        PushConstants, Result, Source, SpecConstants, SpecValue,
    };
}
