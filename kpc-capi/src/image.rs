//! `kpc_image`: a device image (SPIR-V bytes or OpenCL C source), the input of a build, created
//! from the caller's bytes or from the kernels kpc ships, and checked against a context's backend.

use std::ffi::c_char;

use super::context::kpc_backend;
use super::registry::{self, Object};
use super::util::{check_out, opt_str_arg, slice_arg, str_arg, write_out};
use super::{Failure, guard, kpc_status};
use kpc::BackendKind;
use kpc::Context;
use kpc::{DeviceImage, ImageFormat};

/// A device image (opaque): the input of a build, immutable, identified by a digest of its bytes.
/// Create once and reuse: the digest (and, for SPIR-V, validation and reflection) is computed once
/// per image. Destroy with `kpc_image_destroy`.
pub struct kpc_image {
    _opaque: [u8; 0],
}

impl Object for DeviceImage {
    type Handle = kpc_image;
    const NAME: &'static str = "kpc_image";
}

/// What a device image holds.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_image_format {
    /// A SPIR-V module for Vulkan (little-endian words).
    KPC_IMAGE_SPIRV = 1,
    /// OpenCL C source text (UTF-8).
    KPC_IMAGE_OPENCL_C = 2,
}

/// Creates a device image named `name` (used in messages and `kpc cache ls`; NULL for "c-image")
/// from `size` bytes at `bytes`, which kpc copies. A SPIR-V image is validated now.
///
/// Ownership: `*out` receives a new image; destroy it with `kpc_image_destroy`.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (NULL `bytes` or `out`, `size` 0, an unknown `format`,
/// a name or OpenCL C source that is not UTF-8); `KPC_STATUS_INVALID_SPIRV` (the validator's message,
/// for SPIR-V that is malformed or whose size is not a multiple of 4).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `bytes` is NULL or has `size` readable bytes; `out` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_image_create(
    name: *const c_char,
    format: u32,
    bytes: *const u8,
    size: usize,
    out: *mut *mut kpc_image,
) -> kpc_status {
    guard("kpc_image_create", || {
        check_out(out, "out")?;
        // SAFETY: forwarded to the caller.
        let name = unsafe { opt_str_arg(name, "name")? }.unwrap_or("c-image");
        if size == 0 {
            return Err(Failure::invalid(
                "size is 0: an image needs at least one byte",
            ));
        }
        // SAFETY: forwarded to the caller.
        let data = unsafe { slice_arg(bytes, size, "bytes")? };
        let image = match format {
            f if f == kpc_image_format::KPC_IMAGE_SPIRV as u32 => {
                DeviceImage::spirv(name, data.to_vec())?
            }
            f if f == kpc_image_format::KPC_IMAGE_OPENCL_C as u32 => {
                std::str::from_utf8(data).map_err(|e| {
                    // SPIR-V bytes passed as OpenCL C are the likely mistake: say so.
                    let spirv = data.len() >= 4
                        && u32::from_le_bytes([data[0], data[1], data[2], data[3]]) == 0x0723_0203;
                    Failure::invalid(if spirv {
                        "the bytes are SPIR-V (they start with its magic number 0x07230203), not \
                         OpenCL C source: pass KPC_IMAGE_SPIRV for them, and an OpenCL context the \
                         kernel's OpenCL C source (KPC_IMAGE_OPENCL_C)"
                            .to_string()
                    } else {
                        format!(
                            "the OpenCL C source is not UTF-8 (at byte {}): KPC_IMAGE_OPENCL_C \
                             takes source text",
                            e.valid_up_to()
                        )
                    })
                })?;
                DeviceImage::new(name, ImageFormat::OpenClC, data.to_vec())
            }
            _ => {
                return Err(Failure::invalid(format!(
                    "format is {format}: expected KPC_IMAGE_SPIRV (1) or KPC_IMAGE_OPENCL_C (2)"
                )));
            }
        };
        let h = registry::insert(image);
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}

/// Creates the device image of a kernel that kpc ships, `name` (kpc's `saxpy`, `copy` and `read`, or an
/// attention kernel such as `attn_decode`), for `backend`: SPIR-V for `KPC_BACKEND_VULKAN`, OpenCL C
/// for `KPC_BACKEND_OPENCL` (pass `kpc_context_backend`'s answer to get the one a context builds).
/// The bytes are compiled into the library: a C program needs no kernel file.
///
/// Ownership: `*out` receives a new image; destroy it with `kpc_image_destroy`.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (NULL `name` or `out`, an unknown `backend`, a name kpc does
/// not ship for that backend: the message lists the names it does).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_image_shipped(
    name: *const c_char,
    backend: u32,
    out: *mut *mut kpc_image,
) -> kpc_status {
    guard("kpc_image_shipped", || {
        check_out(out, "out")?;
        // SAFETY: forwarded to the caller.
        let name = unsafe { str_arg(name, "name")? };
        let vulkan = kpc_backend::KPC_BACKEND_VULKAN as u32;
        let opencl = kpc_backend::KPC_BACKEND_OPENCL as u32;
        let image = match backend {
            b if b == vulkan => kpc::kernels::spirv_image(name)
                .or_else(|kpc_err| kpc_attention::kernels::spirv_image(name).map_err(|_| kpc_err)),
            b if b == opencl => kpc::kernels::opencl_image(name).or_else(|kpc_err| {
                kpc_attention::kernels::opencl_image(name).map_err(|_| kpc_err)
            }),
            _ => {
                return Err(Failure::invalid(format!(
                    "backend is {backend}: expected KPC_BACKEND_VULKAN (1) or KPC_BACKEND_OPENCL (2)"
                )));
            }
        }
        .map_err(|e| {
            let attention: Vec<&str> = match backend {
                b if b == vulkan => kpc_attention::kernels::SPIRV.iter().map(|k| k.name).collect(),
                _ => kpc_attention::kernels::OPENCL.iter().map(|k| k.name).collect(),
            };
            Failure::invalid(format!("{e}; the attention kernels shipped: {}", attention.join(", ")))
        })?;
        let h = registry::insert(image);
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}

/// Destroys an image. NULL is accepted and does nothing. Kernels built from it are not affected.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` when `image` is not a live image; nothing is freed then.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_image_destroy(image: *mut kpc_image) -> kpc_status {
    guard("kpc_image_destroy", || {
        registry::remove::<DeviceImage>(image, "image")
    })
}

/// Refuses an image the context's backend cannot build, with a message that says what it takes.
pub(crate) fn check_format(ctx: &Context, image: &DeviceImage) -> Result<(), Failure> {
    let wanted = match ctx.backend() {
        BackendKind::Vulkan => ImageFormat::SpirV,
        BackendKind::OpenCl => ImageFormat::OpenClC,
    };
    // A GLSL image becomes SPIR-V inside the Vulkan context (its SPIR-V cache).
    let glsl_on_vulkan = image.format() == ImageFormat::Glsl && wanted == ImageFormat::SpirV;
    if image.format() != wanted && !glsl_on_vulkan {
        return Err(Failure::invalid(format!(
            "image {:?} holds {}, but a {} context builds {} images{} ({})",
            image.name(),
            image.format(),
            ctx.backend(),
            wanted,
            if glsl_on_vulkan || wanted == ImageFormat::SpirV {
                " or GLSL"
            } else {
                ""
            },
            wanted.made_by()
        )));
    }
    Ok(())
}
