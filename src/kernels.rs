//! The kernels kpc ships as its examples and test kernels (`saxpy`, `copy`, `read`) and for
//! `kpc bench-mma`'s ceiling (`bench_mma`, `bench_mma_cm2`), embedded at
//! build time so that building the crate needs no shader compiler, and the types any crate uses to
//! ship its own kernels the same way (the attention workload, `kpc-attention`, ships its own).
//!
//! GLSL sources and their SPIR-V (compiled by scripts/build-kernels.sh, committed), and OpenCL C
//! sources, live in the shipping crate's kernels/. Each image's entry point is named after its file.
//! What a kernel takes (buffers, push constants, workgroup size) is reflected at run time, from the
//! SPIR-V or from the built OpenCL program, never listed here; an OpenCL C image declares its
//! spec-constant names, and optionally their types, in its source (`// kpc-spec-constant <id> <NAME>
//! [<TYPE>]`).

#[cfg(not(loom))]
use crate::backend::DeviceImage;
#[cfg(not(loom))]
use crate::error::{Error, Result};

/// A shipped SPIR-V kernel image.
///
/// Exhaustive on purpose: a crate that ships kernels (`kpc-attention`) lists them as `const`
/// literals of this type, which `#[non_exhaustive]` would forbid.
#[derive(Debug, Clone, Copy)]
pub struct ShippedSpirv {
    /// Image name, which is also its entry point's name.
    pub name: &'static str,
    /// Path of its GLSL source, relative to the root of the crate that ships it.
    pub source: &'static str,
    /// The committed SPIR-V.
    pub spirv: &'static [u8],
    /// The GLSL source text it was compiled from (for [`ShippedSpirv::glsl_image`]).
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

    /// Its committed SPIR-V as a device image, validated.
    ///
    /// Errors: [`Error::InvalidSpirv`] if the committed module is invalid (a broken build of the
    /// crate that ships it).
    #[cfg(not(loom))]
    pub fn image(&self) -> Result<DeviceImage> {
        DeviceImage::spirv(self.name, self.spirv)
    }

    /// Its GLSL source as a device image, with the options scripts/build-kernels.sh compiles it
    /// with: entry point `name`, Vulkan 1.1 (SPIR-V 1.3), no optimization, no defines. Compiled at
    /// first use through the context's SPIR-V cache.
    ///
    /// Errors: [`Error::InvalidArgument`] for a cooperative-matrix kernel: those need glslang 13 or
    /// later (GL_KHR_cooperative_matrix), newer than the libshaderc kpc links, so
    /// scripts/build-kernels.sh leaves their committed SPIR-V alone and so does kpc.
    #[cfg(not(loom))]
    pub fn glsl_image(&self) -> Result<DeviceImage> {
        use crate::backend::glsl::GlslSource;
        if self.cooperative_matrix {
            return Err(Error::InvalidArgument(format!(
                "{} uses cooperative matrices (GL_KHR_cooperative_matrix), which the linked \
                 libshaderc's glslang cannot compile; use its committed SPIR-V \
                 (ShippedSpirv::image)",
                self.name
            )));
        }
        DeviceImage::glsl(GlslSource::compute(self.name, self.glsl))
    }
}

/// A shipped OpenCL C kernel image.
///
/// Exhaustive on purpose, as [`ShippedSpirv`]: shipping crates list them as `const` literals.
#[derive(Debug, Clone, Copy)]
pub struct ShippedOpenCl {
    /// Image name, which is also its entry point's name.
    pub name: &'static str,
    /// Path of its source, relative to the root of the crate that ships it.
    pub path: &'static str,
    /// The source text.
    pub source: &'static str,
}

impl ShippedOpenCl {
    /// Its source as an OpenCL C device image.
    #[cfg(not(loom))]
    pub fn image(&self) -> DeviceImage {
        DeviceImage::new(
            self.name,
            crate::backend::ImageFormat::OpenClC,
            self.source.as_bytes(),
        )
    }
}

/// The kernel `name` of `table`, or [`Error::InvalidArgument`] listing the names it has (`what`
/// says which kind of kernel was asked for, e.g. "SPIR-V").
#[cfg(not(loom))]
pub fn find<'a, T>(
    table: &'a [T],
    name: &str,
    what: &str,
    name_of: impl Fn(&T) -> &'static str,
) -> Result<&'a T> {
    table.iter().find(|k| name_of(k) == name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "no shipped {what} kernel {name:?}; there are: {}",
            table.iter().map(&name_of).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// Every SPIR-V kernel kpc ships.
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
];

/// The SPIR-V image `name` that kpc ships, validated.
///
/// Errors: [`Error::InvalidArgument`] for a name kpc does not ship; [`Error::InvalidSpirv`] if the
/// committed module is invalid (a broken build of kpc).
#[cfg(not(loom))]
pub fn spirv_image(name: &str) -> Result<DeviceImage> {
    find(SPIRV, name, "SPIR-V", |k| k.name)?.image()
}

/// The kernel `name` that kpc ships as a GLSL image of its source: see
/// [`ShippedSpirv::glsl_image`].
///
/// Errors: [`Error::InvalidArgument`] for a name kpc does not ship.
#[cfg(not(loom))]
pub fn glsl_image(name: &str) -> Result<DeviceImage> {
    find(SPIRV, name, "GLSL", |k| k.name)?.glsl_image()
}

/// Every OpenCL C kernel kpc ships: the same names, parameters and spec-constant ids as the SPIR-V
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
];

/// The OpenCL C image `name` that kpc ships.
///
/// Errors: [`Error::InvalidArgument`] for a name kpc does not ship.
#[cfg(not(loom))]
pub fn opencl_image(name: &str) -> Result<DeviceImage> {
    Ok(find(OPENCL, name, "OpenCL", |k| k.name)?.image())
}

/// The image of the kernel `name` that kpc ships for `backend`: its SPIR-V for Vulkan, its OpenCL
/// C for OpenCL, so one program runs on either (`KPC_DEVICE`):
/// `kernels::shipped("saxpy", ctx.backend())`. Each shipped kernel computes the same function on
/// both backends (same parameters, push-constant layout and spec-constant ids).
///
/// Errors: [`Error::InvalidArgument`] for a name kpc does not ship for that backend, listing those
/// it does (the cooperative-matrix kernels are Vulkan only).
#[cfg(not(loom))]
pub fn shipped(name: &str, backend: crate::config::BackendKind) -> Result<DeviceImage> {
    match backend {
        crate::config::BackendKind::Vulkan => spirv_image(name),
        crate::config::BackendKind::OpenCl => opencl_image(name),
    }
}

/// What kpc's generic shipped kernels touch of their buffers, for both their SPIR-V and OpenCL C
/// images (GLSL images are compiled through options a caller may set, so they are not declared):
/// a launch of them on a device without robust buffer access is checked against these (see
/// [`crate::runtime::bounds`]). Each bound restates the kernel's code:
/// - `saxpy(x, y, result; n, a)`: invocation `i` touches element `i` of each buffer while `i < n`;
/// - `copy(src, dst; n)`: a grid-stride loop over the first `n` 16-byte elements of both;
/// - `read(src, dst; n)`: the first `n` 16-byte elements of `src`, one per workgroup of `dst`.
#[cfg(not(loom))]
pub(crate) fn shipped_bounds() -> Vec<(DeviceImage, &'static str, Vec<crate::runtime::BufferBound>)>
{
    use crate::runtime::{BufferBound as B, Extent};
    let table: [(&str, Vec<B>); 3] = [
        (
            "saxpy",
            (0..3)
                .map(|p| B::new(p, Extent::PushOrGlobal(0, 0), 4))
                .collect(),
        ),
        (
            "copy",
            vec![
                B::new(0, Extent::Push(0), 16),
                B::new(1, Extent::Push(0), 16),
            ],
        ),
        (
            "read",
            vec![
                B::new(0, Extent::Push(0), 16),
                B::new(1, Extent::Groups(0), 16),
            ],
        ),
    ];
    let mut out = Vec::new();
    for (name, bounds) in table {
        for image in [spirv_image(name), opencl_image(name)]
            .into_iter()
            .flatten()
        {
            out.push((image, name, bounds.clone()));
        }
    }
    out
}
