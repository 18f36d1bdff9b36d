//! The runtime layer: cache keys from device images, the orchestration of memory cache, persistent
//! stores (local disk, read-only layers, an embedder's) and backend on a miss, and the SYCL-like
//! surface on top (platforms and devices, `Context`,
//! `Queue`, `Buffer<T>`, kernels and events).
//!
//! ```no_run
//! use kpc::{Context, PushConstants};
//!
//! let ctx = Context::builder().build()?; // the device KPC_DEVICE selects
//! let image = kpc::kernels::shipped("saxpy", ctx.backend())?; // SPIR-V or OpenCL C
//! let k = ctx.kernel(&image, "saxpy")?;
//! let n = 1000;
//! let x = ctx.buffer_from(&vec![1.0f32; n])?;
//! let y = ctx.buffer_from(&vec![2.0f32; n])?;
//! let out = ctx.buffer::<f32>(n)?;
//! let push = PushConstants::new().u32(n as u32).f32(3.0); // the kernel's push-constant block
//! let event = ctx.queue().launch(&k, k.groups_for([n as u64, 1, 1])?, &[&x, &y, &out], push.as_bytes())?;
//! println!("{} from {}, ran in {:?}", k.name(), k.source(), event.device_time()?);
//! assert_eq!(out.read()?[0], 5.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(not(loom))]
pub mod blob;
#[cfg(not(loom))]
pub mod bounds;
#[cfg(not(loom))]
pub mod buffer;
#[cfg(not(loom))]
mod builder;
pub mod cache_debug;
#[cfg(not(loom))]
pub mod context;
#[cfg(not(loom))]
pub mod device;
#[cfg(not(loom))]
pub mod interop;
#[cfg(not(loom))]
pub mod kernel;
#[cfg(not(loom))]
pub mod lazy;
#[cfg(not(loom))]
mod lazy_pool;
#[cfg(not(loom))]
mod lifecycle;
pub mod metrics;
mod out_of_resources;
#[cfg(not(loom))]
pub mod prebuild;
#[cfg(not(loom))]
pub mod prefetch;
pub mod program_manager;
#[cfg(not(loom))]
pub mod queue;
pub mod seal;
pub mod source;
#[cfg(not(loom))]
pub mod spirv_cache;
#[cfg(not(loom))]
pub mod stats;
#[cfg(not(loom))]
pub mod warm_start;

#[cfg(not(loom))]
pub use blob::CacheBlob;
#[cfg(not(loom))]
pub use bounds::{BufferBound, Extent, declare_access_bounds};
#[cfg(not(loom))]
pub use buffer::{Buffer, BufferArg, RawBuffer};
#[cfg(not(loom))]
pub use builder::ContextBuilder;
pub use cache_debug::CacheDebugStats;
#[cfg(not(loom))]
pub use context::Context;
#[cfg(not(loom))]
pub use device::{Platform, platforms, select_device};
#[cfg(not(loom))]
pub use kernel::Kernel;
#[cfg(not(loom))]
pub use lazy::LazyStats;
#[cfg(not(loom))]
pub use prebuild::PrebuildReport;
#[cfg(not(loom))]
pub use prefetch::{KernelRequest, Prefetch, prefetch_kernels};
pub use program_manager::{Acquired, ProgramManager};
#[cfg(not(loom))]
pub use queue::{Event, LaunchDesc, PushConstants, Queue};
pub use seal::SealStats;
pub use source::Source;
#[cfg(not(loom))]
pub use spirv_cache::{SpirvStats, SpirvStep};
#[cfg(not(loom))]
pub use stats::ContextStats;
#[cfg(not(loom))]
pub use warm_start::{ManifestState, WarmStartReport};
