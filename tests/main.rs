//! kpc's integration tests, one binary (one link of spirv-tools, OpenDAL and tokio instead of one
//! per file): each module is one area, run against real files, child processes, servers and drivers.

mod common;

mod blob;
mod crash_loading;
mod disk_accounting;
mod disk_basic;
mod disk_concurrency;
mod disk_corruption;
mod disk_evicted;
mod disk_eviction;
mod disk_limits;
mod disk_process;
mod disk_wiring;
mod driver_disk;
mod interop_contract;
mod interop_opencl;
mod interop_vulkan;
mod launch_bounds;
mod memory_cache;
mod memory_front;
mod metrics_scrape;
mod opencl_binary;
mod opencl_build;
mod opencl_kernels;
mod out_of_resources;
mod prebuild;
mod prefetch;
mod remote_compress;
mod remote_redis;
mod remote_retention;
mod remote_signed;
mod seal;
mod seal_drivers;
mod spirv_images;
mod store_chain;
mod store_idle;
mod stress_contexts;
mod vulkan_binary;
mod vulkan_build;
mod vulkan_device_reuse;
mod vulkan_kernels;
mod vulkan_recompiled;
mod vulkan_shader_checks;
mod warm_start;
mod warnings;
