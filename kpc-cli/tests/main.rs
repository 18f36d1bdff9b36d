//! The `kpc` command's tests, one binary: each module runs the built `kpc` against real cache
//! directories, drivers and servers.

#[path = "../../tests/common/mod.rs"]
mod common;

mod attention_cli;
mod bundle;
mod bundle_layer;
mod cache_check;
mod cache_debug;
mod cache_report;
mod cli_pipe;
mod disk_cli;
mod explain;
mod explain_many;
mod glsl;
mod mha_cli;
mod opencl_cli;
mod prebuild_cli;
mod remote_cluster;
mod remote_fleet;
mod remote_s3;
mod seal_cli;
mod signed_cli;
mod stats_prometheus;
mod store_readonly;
mod vulkan_cli;
