//! GLSL device images from C: `kpc_image_from_glsl`. The image then goes to `kpc_kernel_create` like any
//! other; its SPIR-V is compiled through the context's SPIR-V cache.

use std::ffi::c_char;
use std::sync::Arc;

use super::registry;
use super::util::{check_out, opt_str_arg, slice_arg, str_arg, write_out};
use super::{Failure, guard, kpc_image, kpc_status};
use kpc::DeviceImage;
use kpc::admin::glsl::{DirIncludes, GlslOptimization, GlslSource, SpirvTarget};

/// The Vulkan environment (and so the SPIR-V version) a GLSL image compiles for.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_spirv_target {
    /// Vulkan 1.0, SPIR-V 1.0.
    KPC_SPIRV_VULKAN_1_0 = 0,
    /// Vulkan 1.1, SPIR-V 1.3 (what the shipped kernels use).
    KPC_SPIRV_VULKAN_1_1 = 1,
    /// Vulkan 1.2, SPIR-V 1.5.
    KPC_SPIRV_VULKAN_1_2 = 2,
    /// Vulkan 1.3, SPIR-V 1.6.
    KPC_SPIRV_VULKAN_1_3 = 3,
}

/// How hard the GLSL compiler optimizes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_glsl_optimization {
    /// No optimization (glslangValidator's default).
    KPC_GLSL_OPTIMIZE_NONE = 0,
    /// Optimize for size.
    KPC_GLSL_OPTIMIZE_SIZE = 1,
    /// Optimize for performance.
    KPC_GLSL_OPTIMIZE_PERFORMANCE = 2,
}

/// Creates a GLSL compute image named `name` (which is also its SPIR-V entry point's name; GLSL's
/// own entry stays `main`) from the NUL-terminated `source`, with `define_count` macro definitions
/// at `defines` (each "NAME" or "NAME=VALUE"; NULL when 0), compiled for `target` at `optimization`,
/// its `#include`s read from files under `include_dir` (NULL: none allowed). kpc copies everything.
///
/// Nothing is compiled here: `kpc_kernel_create` on a Vulkan context compiles it (or finds its SPIR-V in
/// the context's memory or stores, keyed by the preprocessed source, defines, target, optimization and
/// compiler), validates the SPIR-V and builds it like a SPIR-V image. A compile error is returned there
/// as `KPC_STATUS_GLSL_COMPILE` with the compiler's messages (`name:line: error: ...`), and cached.
///
/// Ownership: `*out` receives a new image; destroy it with `kpc_image_destroy`.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (NULL `name`, `source` or `out`; NULL `defines` with a
/// nonzero count; text that is not UTF-8; a define or name that is not a GLSL identifier; an unknown
/// `target` or `optimization`).
///
/// # Safety
/// `name` and `source` are NULL or NUL-terminated strings; `defines` is NULL or has `define_count`
/// readable pointers, each NULL or a NUL-terminated string; `include_dir` is NULL or a NUL-terminated
/// string; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_image_from_glsl(
    name: *const c_char,
    source: *const c_char,
    defines: *const *const c_char,
    define_count: usize,
    target: u32,
    optimization: u32,
    include_dir: *const c_char,
    out: *mut *mut kpc_image,
) -> kpc_status {
    guard("kpc_image_from_glsl", || {
        check_out(out, "out")?;
        // SAFETY: forwarded to the caller.
        let name = unsafe { str_arg(name, "name")? };
        // SAFETY: forwarded to the caller.
        let text = unsafe { str_arg(source, "source")? };
        let target = match target {
            0 => SpirvTarget::Vulkan1_0,
            1 => SpirvTarget::Vulkan1_1,
            2 => SpirvTarget::Vulkan1_2,
            3 => SpirvTarget::Vulkan1_3,
            t => {
                return Err(Failure::invalid(format!(
                    "target is {t}: expected KPC_SPIRV_VULKAN_1_0 (0) to KPC_SPIRV_VULKAN_1_3 (3)"
                )));
            }
        };
        let optimization = match optimization {
            0 => GlslOptimization::None,
            1 => GlslOptimization::Size,
            2 => GlslOptimization::Performance,
            o => {
                return Err(Failure::invalid(format!(
                    "optimization is {o}: expected KPC_GLSL_OPTIMIZE_NONE (0), _SIZE (1) or \
                     _PERFORMANCE (2)"
                )));
            }
        };
        let mut src = GlslSource::compute(name, text)
            .target(target)
            .optimization(optimization);
        // SAFETY: forwarded to the caller.
        let defs = unsafe { slice_arg(defines, define_count, "defines")? };
        for (i, &d) in defs.iter().enumerate() {
            // SAFETY: each element is NULL or NUL-terminated by the caller's promise.
            let d = unsafe { str_arg(d, &format!("defines[{i}]"))? };
            let (k, v) = d.split_once('=').unwrap_or((d, ""));
            src = src.define(k, v);
        }
        // SAFETY: forwarded to the caller.
        if let Some(dir) = unsafe { opt_str_arg(include_dir, "include_dir")? } {
            src = src.includes(Arc::new(DirIncludes::new(dir)));
        }
        let image = DeviceImage::glsl(src)?;
        let h = registry::insert(image);
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}
