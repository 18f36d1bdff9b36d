//! The kernels kpc ships, embedded at build time so that building the crate needs no shader compiler.
//!
//! GLSL sources and their SPIR-V (compiled by scripts/build-kernels.sh, committed), and OpenCL C
//! sources, live in kernels/. Each image's entry point is named after its file. What a kernel takes
//! (buffers, push constants, workgroup size) is reflected at run time, from the SPIR-V or from the
//! built OpenCL program, never listed here; an OpenCL C image declares its spec-constant names in
//! its source (`// kpc-spec-constant <id> <NAME>`).

#[cfg(not(loom))]
use crate::backend::DeviceImage;
#[cfg(not(loom))]
use crate::error::{Error, Result};

/// A shipped SPIR-V kernel image.
#[derive(Debug, Clone, Copy)]
pub struct ShippedSpirv {
    /// Image name, which is also its entry point's name.
    pub name: &'static str,
    /// Path of its GLSL source, relative to the repository root.
    pub source: &'static str,
    /// The committed SPIR-V.
    pub spirv: &'static [u8],
    /// The GLSL source text it was compiled from (for [`glsl_image`]).
    pub glsl: &'static str,
    /// Whether it multiplies cooperative matrices: it runs only where
    /// [`DeviceLimits::cooperative_matrix_f16`](crate::backend::DeviceLimits) holds, and it has no
    /// OpenCL C twin (OpenCL C has no portable form of them).
    pub cooperative_matrix: bool,
    /// Whether it uses workgroup-scope matrices (VK_NV_cooperative_matrix2): it runs only where
    /// [`DeviceLimits::cooperative_matrix2_workgroup`](crate::backend::DeviceLimits) is nonzero
    /// (and, being a cooperative-matrix kernel too, where `cooperative_matrix` allows).
    pub cooperative_matrix2: bool,
}

impl ShippedSpirv {
    /// Whether a device with `limits` has the matrix extensions this kernel needs (what else it
    /// needs is checked when it is built).
    pub fn matrices_fit(&self, limits: &crate::backend::DeviceLimits) -> bool {
        (!self.cooperative_matrix || limits.cooperative_matrix_f16)
            && (!self.cooperative_matrix2 || limits.cooperative_matrix2_workgroup > 0)
    }
}

/// Every shipped SPIR-V kernel.
pub const SPIRV: &[ShippedSpirv] = &[
    ShippedSpirv {
        name: "saxpy",
        source: "kernels/saxpy.comp",
        spirv: include_bytes!("../kernels/saxpy.spv"),
        glsl: include_str!("../kernels/saxpy.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "copy",
        source: "kernels/copy.comp",
        spirv: include_bytes!("../kernels/copy.spv"),
        glsl: include_str!("../kernels/copy.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "read",
        source: "kernels/read.comp",
        spirv: include_bytes!("../kernels/read.spv"),
        glsl: include_str!("../kernels/read.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
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
        name: "bench_mma",
        source: "kernels/bench_mma.comp",
        spirv: include_bytes!("../kernels/bench_mma.spv"),
        glsl: include_str!("../kernels/bench_mma.comp"),
        cooperative_matrix: true,
        cooperative_matrix2: false,
    },
    ShippedSpirv {
        name: "bench_mma_cm2",
        source: "kernels/bench_mma_cm2.comp",
        spirv: include_bytes!("../kernels/bench_mma_cm2.spv"),
        glsl: include_str!("../kernels/bench_mma_cm2.comp"),
        cooperative_matrix: true,
        cooperative_matrix2: true,
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
        name: "mha_attn",
        source: "kernels/mha_attn.comp",
        spirv: include_bytes!("../kernels/mha_attn.spv"),
        glsl: include_str!("../kernels/mha_attn.comp"),
        cooperative_matrix: false,
        cooperative_matrix2: false,
    },
];

/// The shipped SPIR-V image `name`, validated.
///
/// Errors: [`Error::InvalidArgument`] for a name kpc does not ship; [`Error::InvalidSpirv`] if the
/// committed module is invalid (a broken build of kpc).
#[cfg(not(loom))]
pub fn spirv_image(name: &str) -> Result<DeviceImage> {
    let k = SPIRV.iter().find(|k| k.name == name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "no shipped SPIR-V kernel {name:?}; there are: {}",
            SPIRV.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
        ))
    })?;
    DeviceImage::spirv(k.name, k.spirv)
}

/// The shipped kernel `name` as a GLSL image of its source in kernels/, with the options
/// scripts/build-kernels.sh compiles it with: entry point `name`, Vulkan 1.1 (SPIR-V 1.3), no
/// optimization, no defines. Compiled at first use through the context's SPIR-V cache.
///
/// Errors: [`Error::InvalidArgument`] for a name kpc does not ship, or for a cooperative-matrix
/// kernel: those need glslang 13 or later (GL_KHR_cooperative_matrix), newer than the libshaderc kpc
/// links, so scripts/build-kernels.sh leaves their committed SPIR-V alone and so does kpc.
#[cfg(not(loom))]
pub fn glsl_image(name: &str) -> Result<DeviceImage> {
    use crate::backend::glsl::GlslSource;
    let k = SPIRV.iter().find(|k| k.name == name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "no shipped GLSL kernel {name:?}; there are: {}",
            SPIRV.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
        ))
    })?;
    if k.cooperative_matrix {
        return Err(Error::InvalidArgument(format!(
            "{name} uses cooperative matrices (GL_KHR_cooperative_matrix), which the linked libshaderc's \
             glslang cannot compile; use its committed SPIR-V (kpc::kernels::spirv_image)"
        )));
    }
    DeviceImage::glsl(GlslSource::compute(k.name, k.glsl))
}

/// A shipped OpenCL C kernel image.
#[derive(Debug, Clone, Copy)]
pub struct ShippedOpenCl {
    /// Image name, which is also its entry point's name.
    pub name: &'static str,
    /// Path of its source, relative to the repository root.
    pub path: &'static str,
    /// The source text.
    pub source: &'static str,
}

/// Every shipped OpenCL C kernel: the same names, parameters and spec-constant ids as the SPIR-V
/// ones, so that both backends compute the same function.
pub const OPENCL: &[ShippedOpenCl] = &[
    ShippedOpenCl {
        name: "saxpy",
        path: "kernels/saxpy.cl",
        source: include_str!("../kernels/saxpy.cl"),
    },
    ShippedOpenCl {
        name: "copy",
        path: "kernels/copy.cl",
        source: include_str!("../kernels/copy.cl"),
    },
    ShippedOpenCl {
        name: "read",
        path: "kernels/read.cl",
        source: include_str!("../kernels/read.cl"),
    },
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
        name: "mha_attn",
        path: "kernels/mha_attn.cl",
        source: include_str!("../kernels/mha_attn.cl"),
    },
];

/// The shipped OpenCL C image `name`.
///
/// Errors: [`Error::InvalidArgument`] for a name kpc does not ship.
#[cfg(not(loom))]
pub fn opencl_image(name: &str) -> Result<DeviceImage> {
    let k = OPENCL.iter().find(|k| k.name == name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "no shipped OpenCL kernel {name:?}; there are: {}",
            OPENCL.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
        ))
    })?;
    Ok(DeviceImage::new(
        k.name,
        crate::backend::ImageFormat::OpenClC,
        k.source.as_bytes(),
    ))
}
