//! The attention kernels, embedded at build time so that building the crate needs no shader
//! compiler.
//!
//! GLSL sources and their SPIR-V (compiled by scripts/build-kernels.sh, committed; the
//! cooperative-matrix ones with the digest of the source they were built from in `NAME.spv.source`),
//! and OpenCL C sources, live in this crate's kernels/. Each image's entry point is named after its
//! file. What a kernel takes (buffers, push constants, workgroup size) is reflected at run time, from
//! the SPIR-V or from the built OpenCL program, never listed here; an OpenCL C image declares its
//! spec-constant names in its source (`// kpc-spec-constant <id> <NAME>`).

use kpc::kernels::find;
pub use kpc::kernels::{ShippedOpenCl, ShippedSpirv};
use kpc::{DeviceImage, Result};

/// Every attention SPIR-V kernel.
pub const SPIRV: &[ShippedSpirv] = &[
    ShippedSpirv {
        name: "attn_decode",
        source: "kernels/attn_decode.comp",
        spirv: include_bytes!("../kernels/attn_decode.spv"),
        glsl: include_str!("../kernels/attn_decode.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "attn_decode_vec",
        source: "kernels/attn_decode_vec.comp",
        spirv: include_bytes!("../kernels/attn_decode_vec.spv"),
        glsl: include_str!("../kernels/attn_decode_vec.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "attn_append",
        source: "kernels/attn_append.comp",
        spirv: include_bytes!("../kernels/attn_append.spv"),
        glsl: include_str!("../kernels/attn_append.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "attn_generic",
        source: "kernels/attn_generic.comp",
        spirv: include_bytes!("../kernels/attn_generic.spv"),
        glsl: include_str!("../kernels/attn_generic.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "attn_reduce",
        source: "kernels/attn_reduce.comp",
        spirv: include_bytes!("../kernels/attn_reduce.spv"),
        glsl: include_str!("../kernels/attn_reduce.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "attn_prefill_tiled",
        source: "kernels/attn_prefill_tiled.comp",
        spirv: include_bytes!("../kernels/attn_prefill_tiled.spv"),
        glsl: include_str!("../kernels/attn_prefill_tiled.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "attn_prefill_coop",
        source: "kernels/attn_prefill_coop.comp",
        spirv: include_bytes!("../kernels/attn_prefill_coop.spv"),
        glsl: include_str!("../kernels/attn_prefill_coop.comp"),
        cooperative_matrix: true,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "attn_prefill_cm2",
        source: "kernels/attn_prefill_cm2.comp",
        spirv: include_bytes!("../kernels/attn_prefill_cm2.spv"),
        glsl: include_str!("../kernels/attn_prefill_cm2.comp"),
        cooperative_matrix: true,
        cooperative_matrix2: true,
    },
    ShippedSpirv {
        name: "attn_decode_coop",
        source: "kernels/attn_decode_coop.comp",
        spirv: include_bytes!("../kernels/attn_decode_coop.spv"),
        glsl: include_str!("../kernels/attn_decode_coop.comp"),
        cooperative_matrix: true,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "coop_layout",
        source: "kernels/coop_layout.comp",
        spirv: include_bytes!("../kernels/coop_layout.spv"),
        glsl: include_str!("../kernels/coop_layout.comp"),
        cooperative_matrix: true,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "attn_prefill",
        source: "kernels/attn_prefill.comp",
        spirv: include_bytes!("../kernels/attn_prefill.spv"),
        glsl: include_str!("../kernels/attn_prefill.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "mha_gemm",
        source: "kernels/mha_gemm.comp",
        spirv: include_bytes!("../kernels/mha_gemm.spv"),
        glsl: include_str!("../kernels/mha_gemm.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "mha_gemm_coop",
        source: "kernels/mha_gemm_coop.comp",
        spirv: include_bytes!("../kernels/mha_gemm_coop.spv"),
        glsl: include_str!("../kernels/mha_gemm_coop.comp"),
        cooperative_matrix: true,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "mha_gemm_wide",
        source: "kernels/mha_gemm_wide.comp",
        spirv: include_bytes!("../kernels/mha_gemm_wide.spv"),
        glsl: include_str!("../kernels/mha_gemm_wide.comp"),
        cooperative_matrix: true,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "mha_gemv",
        source: "kernels/mha_gemv.comp",
        spirv: include_bytes!("../kernels/mha_gemv.spv"),
        glsl: include_str!("../kernels/mha_gemv.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "mha_cast",
        source: "kernels/mha_cast.comp",
        spirv: include_bytes!("../kernels/mha_cast.spv"),
        glsl: include_str!("../kernels/mha_cast.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "mha_attn",
        source: "kernels/mha_attn.comp",
        spirv: include_bytes!("../kernels/mha_attn.spv"),
        glsl: include_str!("../kernels/mha_attn.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
];

/// The attention SPIR-V image `name`, validated.
///
/// Errors: [`kpc::Error::InvalidArgument`] for a name this crate does not ship;
/// [`kpc::Error::InvalidSpirv`] if the committed module is invalid (a broken build).
pub fn spirv_image(name: &str) -> Result<DeviceImage> {
    find(SPIRV, name, "attention SPIR-V", |k| k.name)?.image()
}

/// The attention kernel `name` as a GLSL image of its source: see [`ShippedSpirv::glsl_image`].
///
/// Errors: [`kpc::Error::InvalidArgument`] for a name this crate does not ship, or a
/// cooperative-matrix kernel.
pub fn glsl_image(name: &str) -> Result<DeviceImage> {
    find(SPIRV, name, "attention GLSL", |k| k.name)?.glsl_image()
}

/// Every attention OpenCL C kernel: the same names, parameters and spec-constant ids as the SPIR-V
/// ones, so that both backends compute the same function.
pub const OPENCL: &[ShippedOpenCl] = &[
    ShippedOpenCl {
        name: "attn_decode",
        path: "kernels/attn_decode.cl",
        source: include_str!("../kernels/attn_decode.cl"),
    },
    ShippedOpenCl {
        name: "attn_decode_vec",
        path: "kernels/attn_decode_vec.cl",
        source: include_str!("../kernels/attn_decode_vec.cl"),
    },
    ShippedOpenCl {
        name: "attn_append",
        path: "kernels/attn_append.cl",
        source: include_str!("../kernels/attn_append.cl"),
    },
    ShippedOpenCl {
        name: "attn_generic",
        path: "kernels/attn_generic.cl",
        source: include_str!("../kernels/attn_generic.cl"),
    },
    ShippedOpenCl {
        name: "attn_reduce",
        path: "kernels/attn_reduce.cl",
        source: include_str!("../kernels/attn_reduce.cl"),
    },
    ShippedOpenCl {
        name: "attn_prefill_tiled",
        path: "kernels/attn_prefill_tiled.cl",
        source: include_str!("../kernels/attn_prefill_tiled.cl"),
    },
    ShippedOpenCl {
        name: "attn_prefill",
        path: "kernels/attn_prefill.cl",
        source: include_str!("../kernels/attn_prefill.cl"),
    },
    ShippedOpenCl {
        name: "mha_gemm",
        path: "kernels/mha_gemm.cl",
        source: include_str!("../kernels/mha_gemm.cl"),
    },
    ShippedOpenCl {
        name: "mha_gemv",
        path: "kernels/mha_gemv.cl",
        source: include_str!("../kernels/mha_gemv.cl"),
    },
    ShippedOpenCl {
        name: "mha_cast",
        path: "kernels/mha_cast.cl",
        source: include_str!("../kernels/mha_cast.cl"),
    },
    ShippedOpenCl {
        name: "mha_attn",
        path: "kernels/mha_attn.cl",
        source: include_str!("../kernels/mha_attn.cl"),
    },
];

/// The OpenCL C kernels written in inline PTX (NVIDIA's OpenCL from sm_80 only; see
/// [`crate::ptx`]), which have no SPIR-V twin: the Vulkan backend runs `mha_gemm_wide` in place of
/// `mha_gemm_mma` and its cooperative-matrix prefill in place of `attn_prefill_mma`.
pub const OPENCL_PTX: &[ShippedOpenCl] = &[
    ShippedOpenCl {
        name: "mha_gemm_mma",
        path: "kernels/mha_gemm_mma.cl",
        source: include_str!("../kernels/mha_gemm_mma.cl"),
    },
    ShippedOpenCl {
        name: "attn_prefill_mma",
        path: "kernels/attn_prefill_mma.cl",
        source: include_str!("../kernels/attn_prefill_mma.cl"),
    },
];

/// The attention OpenCL C image `name` ([`OPENCL`] or [`OPENCL_PTX`]).
///
/// Errors: [`kpc::Error::InvalidArgument`] for a name this crate does not ship.
pub fn opencl_image(name: &str) -> Result<DeviceImage> {
    if let Some(k) = OPENCL_PTX.iter().find(|k| k.name == name) {
        return Ok(k.image());
    }
    Ok(find(OPENCL, name, "attention OpenCL", |k| k.name)?.image())
}
