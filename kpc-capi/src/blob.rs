//! Cache blobs (oneDNN's option 2, ncnn's save/load to memory): the caller keeps compiled kernels in
//! its own storage. A blob id names a key; a kernel's blob holds its verified program; a kernel made
//! from a blob skips the compiler.

use std::ffi::c_char;

use super::context::kpc_context;
use super::image::kpc_image;
use super::kernel::{KernelObject, key_args, kpc_kernel, kpc_spec_constant};
use super::registry;
use super::util::{check_out, copy_out, slice_arg, str_arg, write_out};
use super::{Failure, guard, kpc_status};

/// Copies the cache-blob id of `image` with `spec_count` spec constants at `spec` and
/// `build_options` (NULL for none) on `context`'s device into `buffer`: stable bytes covering the
/// whole key (device fingerprint, kpc format, image digest and length, spec constants, options).
/// Equal ids mean interchangeable blobs: store blobs under their id. `*size` receives the id's
/// length; call with `buffer` NULL and `capacity` 0 to ask it.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (bad handles or spec constants, NULL `size`, a NULL
/// `buffer` with a non-zero capacity, an image of the other backend's format);
/// `KPC_STATUS_BUFFER_TOO_SMALL` when `capacity < *size` (nothing is copied).
///
/// # Safety
/// `spec` is NULL or has `spec_count` elements; `build_options` is NULL or a NUL-terminated
/// string; `buffer` is NULL or has `capacity` writable bytes; `size` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_cache_blob_id(
    context: *const kpc_context,
    image: *const kpc_image,
    spec: *const kpc_spec_constant,
    spec_count: usize,
    build_options: *const c_char,
    buffer: *mut u8,
    capacity: usize,
    size: *mut usize,
) -> kpc_status {
    guard("kpc_cache_blob_id", || {
        check_out(size, "size")?;
        // SAFETY: forwarded to the caller.
        let k = unsafe { key_args(context, image, spec, spec_count, build_options)? };
        // A blob holds the whole program: its id has no entry point.
        let id = k.context.cache_blob_id(&k.request(""))?;
        // SAFETY: forwarded to the caller.
        unsafe { copy_out(&id, buffer, capacity, size, "the blob id") }
    })
}

/// Copies `kernel`'s cache blob into `buffer`: a self-describing, checksummed container of its
/// compiled program and key, which `kpc_kernel_create_from_blob` accepts on any context whose blob
/// id for the key is the same. `*size` receives its length; call with `buffer` NULL and `capacity` 0
/// to ask it (the blob is made once per kernel handle, so both calls see the same bytes).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (bad handle, NULL `size`, a NULL `buffer` with a non-zero
/// capacity); `KPC_STATUS_BUFFER_TOO_SMALL` when `capacity < *size`; `KPC_STATUS_BACKEND` when the
/// driver cannot serialize the program.
///
/// # Safety
/// `buffer` is NULL or has `capacity` writable bytes; `size` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_cache_blob(
    kernel: *const kpc_kernel,
    buffer: *mut u8,
    capacity: usize,
    size: *mut usize,
) -> kpc_status {
    guard("kpc_kernel_cache_blob", || {
        check_out(size, "size")?;
        let k = registry::get::<KernelObject>(kernel, "kernel")?;
        let blob = match k.blob.get() {
            Some(b) => b,
            None => {
                let b = k.kernel.cache_blob()?;
                k.blob.get_or_init(|| b)
            }
        };
        // SAFETY: forwarded to the caller.
        unsafe { copy_out(blob, buffer, capacity, size, "the cache blob") }
    })
}

/// Creates the kernel `entry` of `image` (with `spec` and `build_options`, as for
/// `kpc_kernel_create`) from the `blob_size` bytes at `blob`, without compiling: the blob is
/// checksummed, every key field is compared with this context's and the call's, and only then does
/// its program reach the driver. The program then sits in the context's memory cache (later
/// `kpc_kernel_create` calls for the key are memory hits); nothing is written to the disk cache.
/// `kpc_kernel_info` reports `KPC_SOURCE_BLOB` (or `KPC_SOURCE_MEMORY` when the program was in
/// memory already).
///
/// Ownership: `*out` receives a new kernel handle; destroy it with `kpc_kernel_destroy`. The blob is
/// not kept.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (as `kpc_kernel_create`, and a NULL `blob` or
/// `blob_size` 0); `KPC_STATUS_CORRUPT_BLOB` (not an intact blob); `KPC_STATUS_BLOB_MISMATCH` (made
/// for another device, driver, kpc format, image, spec constants or options: the message names the
/// field and both values); `KPC_STATUS_BINARY_REJECTED` (the driver refused the program);
/// `KPC_STATUS_UNKNOWN_KERNEL`.
///
/// # Safety
/// As `kpc_kernel_create`; `blob` is NULL or has `blob_size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_create_from_blob(
    context: *const kpc_context,
    image: *const kpc_image,
    entry: *const c_char,
    spec: *const kpc_spec_constant,
    spec_count: usize,
    build_options: *const c_char,
    blob: *const u8,
    blob_size: usize,
    out: *mut *mut kpc_kernel,
) -> kpc_status {
    guard("kpc_kernel_create_from_blob", || {
        check_out(out, "out")?;
        // SAFETY: forwarded to the caller.
        let k = unsafe { key_args(context, image, spec, spec_count, build_options)? };
        // SAFETY: forwarded to the caller.
        let entry = unsafe { str_arg(entry, "entry")? };
        if blob_size == 0 {
            return Err(Failure::invalid(
                "blob_size is 0: expected a cache blob's bytes",
            ));
        }
        // SAFETY: forwarded to the caller.
        let bytes = unsafe { slice_arg(blob, blob_size, "blob")? };
        let kernel = k.context.kernel_from_blob(&k.request(entry), bytes)?;
        let h = registry::insert(KernelObject::new(kernel, k.context.backend()));
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}
