//! kpc-attention's tests, one binary: the kernels it ships, attention over a KV cache, and ncnn's
//! MultiHeadAttention layer, on real drivers (lavapipe and PoCL in CI) through the driver-test
//! helpers kpc's tests share (tests/common of the workspace root), which log `ran`/`skipped` for
//! scripts/test.sh.

#[path = "../../tests/common/mod.rs"]
mod common;

mod attention;
mod gemm_mma;
mod gemm_support;
mod gemm_wide;
mod kernels;
mod mha;
mod mha_device;
mod mha_edges;
mod mha_errors;
mod mha_interop;
mod mha_support;
mod ptx;
