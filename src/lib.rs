//! kpc builds GPU kernels once and reuses them: per context in memory, across processes on disk.
//!
//! Layers, top to bottom (see DESIGN.md): `runtime` (keys, orchestration), `cache` (in-memory
//! `KernelProgramCache`, on-disk persistent cache), `backend` (Vulkan, OpenCL), `attention` (the
//! built-in workload). The cache layer knows nothing of any backend.
//!
//! Embedding: a [`Context`] can also run over a device the embedder owns
//! ([`Context::from_vulkan_handles`], [`Context::from_opencl_handles`]); kpc then borrows the
//! instance, device, context and queue and never destroys them, and owns only the objects it creates
//! on them. [`runtime::interop`] states the whole contract; cached kernels hand out their raw handles
//! ([`Kernel::vulkan_handles`], [`Kernel::opencl_lease`]) and cache blobs ([`runtime::blob`]).
//!
//! From C: [`capi`] is the same surface as `include/kpc.h` (cdylib `libkpc.so`, staticlib `libkpc.a`),
//! with status codes, a thread-local last error, and handles checked on every call.

#![warn(missing_docs)]

#[cfg(not(loom))]
pub mod attention;
pub mod backend;
pub mod cache;
#[cfg(not(loom))]
pub mod capi;
pub mod config;
pub mod error;
pub mod kernels;
pub mod runtime;

pub use config::{Config, ConfigError};
pub use error::{Error, Result};
#[cfg(not(loom))]
pub use runtime::{
    Buffer, CacheBlob, Context, Event, Kernel, OpenClHandles, OpenClKernelLease, PushConstants,
    Queue, VulkanFeatures, VulkanHandles, VulkanKernelHandles, VulkanQueueLock,
};
