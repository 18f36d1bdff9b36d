//! `kpc_buffer`: device memory of a context, by bytes, whatever it holds: made by kpc, or the
//! embedder's own `VkBuffer` or `cl_mem` used in place. The unit device data is passed in (tensors
//! for the attention layers; kernel launches later).

use std::ffi::c_void;

use super::registry::{self, Object};
use super::util::{check_out, slice_arg, write_out};
use super::{Failure, guard, kpc_context, kpc_status};
use kpc::{Buffer, Context};

/// Device memory of one context (opaque): created by kpc (`kpc_buffer_create`) or the embedder's
/// own (`kpc_buffer_import_vulkan`, `kpc_buffer_import_opencl`). Destroy with
/// `kpc_buffer_destroy`; objects made from it (tensors) keep the memory alive until they go.
pub struct kpc_buffer {
    _opaque: [u8; 0],
}

pub(crate) struct DeviceBuffer(pub(crate) Buffer<u8>);

impl Object for DeviceBuffer {
    type Handle = kpc_buffer;
    const NAME: &'static str = "kpc_buffer";
}

fn register(out: *mut *mut kpc_buffer, b: Buffer<u8>) -> Result<(), Failure> {
    let h = registry::insert(DeviceBuffer(b));
    // SAFETY: the caller checked `out` (check_out) before any work; writable by its promise.
    unsafe { write_out(out, h, "out") }
}

/// A buffer of `bytes` bytes on `context` (contents undefined until written).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or `out`, or `bytes` 0;
/// `KPC_STATUS_OUT_OF_RESOURCES` when the device has no room.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_buffer_create(
    context: *const kpc_context,
    bytes: u64,
    out: *mut *mut kpc_buffer,
) -> kpc_status {
    guard("kpc_buffer_create", || {
        check_out(out, "out")?;
        let ctx = registry::get::<Context>(context, "context")?;
        if bytes == 0 {
            return Err(Failure::invalid(
                "bytes is 0: a buffer holds at least one byte",
            ));
        }
        let n = usize::try_from(bytes)
            .map_err(|_| Failure::invalid(format!("{bytes} bytes do not fit this host")))?;
        register(out, ctx.buffer::<u8>(n)?)
    })
}

/// The embedder's own `VkBuffer` (its raw handle) used in place, no copy: `size` bytes from byte
/// `offset` of it, bound to `memory`. kpc never destroys the buffer or frees the memory.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or `out`, a null `VkBuffer` or
/// `VkDeviceMemory`, an offset that is not a multiple of the device's
/// `minStorageBufferOffsetAlignment`, or a context that is not Vulkan; `KPC_STATUS_SIZE` for a
/// size of 0 or `offset + size` past the end of the buffer (as its memory requirements say).
///
/// # Safety
/// `buffer` is a live `VkBuffer` of the context's `VkDevice` (a context made with
/// `kpc_context_create_vulkan_interop`), created with `VK_BUFFER_USAGE_STORAGE_BUFFER_BIT`,
/// `TRANSFER_SRC_BIT` and `TRANSFER_DST_BIT`, bound to `memory`, at least `offset + size` bytes;
/// it outlives this buffer and everything made from it, and the embedder does not write it while
/// kpc's work on it runs. `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_buffer_import_vulkan(
    context: *const kpc_context,
    buffer: u64,
    memory: u64,
    offset: u64,
    size: u64,
    out: *mut *mut kpc_buffer,
) -> kpc_status {
    guard("kpc_buffer_import_vulkan", || {
        check_out(out, "out")?;
        let ctx = registry::get::<Context>(context, "context")?;
        // SAFETY: forwarded to the caller, whose contract is import_vulkan_buffer's.
        let b = unsafe { ctx.import_vulkan_buffer::<u8>(buffer, memory, offset, size) }?;
        register(out, b)
    })
}

/// The embedder's own `cl_mem` buffer used in place, no copy: its first `size` bytes. kpc retains
/// the `cl_mem` while it uses it.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or `out`, a NULL `mem`, a `cl_mem` of
/// another `cl_context` than the context's, or a context that is not OpenCL; `KPC_STATUS_SIZE` for
/// a size of 0 or more than the `cl_mem` holds.
///
/// # Safety
/// `mem` is NULL or a live `cl_mem` buffer object; the embedder does not write it while kpc's work
/// on it runs. `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_buffer_import_opencl(
    context: *const kpc_context,
    mem: *mut c_void,
    size: u64,
    out: *mut *mut kpc_buffer,
) -> kpc_status {
    guard("kpc_buffer_import_opencl", || {
        check_out(out, "out")?;
        let ctx = registry::get::<Context>(context, "context")?;
        // SAFETY: forwarded to the caller, whose contract is import_opencl_buffer's.
        let b = unsafe { ctx.import_opencl_buffer::<u8>(mem.addr(), size) }?;
        register(out, b)
    })
}

/// Writes the buffer's size in bytes to `*out`.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or `out`.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_buffer_size(buffer: *const kpc_buffer, out: *mut u64) -> kpc_status {
    guard("kpc_buffer_size", || {
        check_out(out, "out")?;
        let b = registry::get::<DeviceBuffer>(buffer, "buffer")?;
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, b.0.byte_len(), "out") }
    })
}

/// Copies `bytes` bytes from `data` into the buffer at byte `offset`, after every launch
/// submitted before on its context (a synchronous write).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or NULL `data` with `bytes` > 0;
/// `KPC_STATUS_SIZE` for a range past the buffer's end (nothing is written then).
///
/// # Safety
/// `data` is NULL or points to `bytes` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_buffer_upload(
    buffer: *const kpc_buffer,
    offset: u64,
    data: *const c_void,
    bytes: usize,
) -> kpc_status {
    guard("kpc_buffer_upload", || {
        let b = registry::get::<DeviceBuffer>(buffer, "buffer")?;
        // SAFETY: forwarded to the caller.
        let src = unsafe { slice_arg(data.cast::<u8>(), bytes, "data") }?;
        let at = usize::try_from(offset)
            .map_err(|_| Failure::invalid(format!("offset {offset} does not fit this host")))?;
        Ok(b.0.write_at(at, src)?)
    })
}

/// Copies `bytes` bytes from the buffer at byte `offset` into `data`, after every launch submitted
/// before on its context (it waits for them).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or NULL `data` with `bytes` > 0;
/// `KPC_STATUS_SIZE` for a range past the buffer's end (nothing is read then).
///
/// # Safety
/// `data` is NULL or points to `bytes` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_buffer_download(
    buffer: *const kpc_buffer,
    offset: u64,
    data: *mut c_void,
    bytes: usize,
) -> kpc_status {
    guard("kpc_buffer_download", || {
        let b = registry::get::<DeviceBuffer>(buffer, "buffer")?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: forwarded to the caller (the check of NULL and size is slice_arg's).
        unsafe { slice_arg(data.cast_const().cast::<u8>(), bytes, "data") }?;
        let at = usize::try_from(offset)
            .map_err(|_| Failure::invalid(format!("offset {offset} does not fit this host")))?;
        // SAFETY: non-NULL, `bytes` writable bytes by the caller's promise; a fresh mutable view
        // only kpc writes during the call.
        let dst = unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), bytes) };
        Ok(b.0.read_at(at, dst)?)
    })
}

/// Destroys a buffer handle. The memory goes when nothing made from it (tensors) and no launch
/// uses it any more; an imported buffer's memory stays the embedder's. NULL is accepted and does
/// nothing.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` when `buffer` is not a live buffer.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_buffer_destroy(buffer: *mut kpc_buffer) -> kpc_status {
    guard("kpc_buffer_destroy", || {
        registry::remove::<DeviceBuffer>(buffer, "buffer")
    })
}
