//! The runtime layer: cache keys from device images, the orchestration of memory cache, disk cache
//! and backend on a miss, and the SYCL-like surface on top (platforms and devices, `Context`,
//! `Queue`, `Buffer<T>`, kernels and events).

#[cfg(not(loom))]
pub mod buffer;
#[cfg(not(loom))]
pub mod context;
#[cfg(not(loom))]
pub mod device;
pub mod program_manager;
#[cfg(not(loom))]
pub mod queue;

#[cfg(not(loom))]
pub use buffer::{Buffer, BufferArg, RawBuffer};
#[cfg(not(loom))]
pub use context::{Context, Kernel};
#[cfg(not(loom))]
pub use device::{Platform, platforms, select_device};
pub use program_manager::{Acquired, ProgramManager, Source};
#[cfg(not(loom))]
pub use queue::{Event, LaunchDesc, PushConstants, Queue};
