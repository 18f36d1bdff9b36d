//! The runtime layer: cache keys from device images, and the orchestration of memory cache, disk
//! cache and backend on a miss.

pub mod program_manager;

pub use program_manager::{Acquired, ProgramManager, Source};
