//! `kpc_tensor`: a shape and an element type (fp16 or f32) over a `kpc_buffer`'s memory, on the
//! device: what the layers' device calls (`kpc_mha_step_tensor`, ...) read and write without a host
//! copy or wait.

use super::buffer::{DeviceBuffer, kpc_buffer};
use super::registry::{self, Object};
use super::util::{check_out, slice_arg, write_out};
use super::{Failure, guard, kpc_context, kpc_status};
use kpc::Context;
use kpc::Error;
use kpc_attention::{Dtype, Tensor};

/// The element type of a tensor.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_dtype {
    /// IEEE half floats (an fp16 tensor holds an even number of elements).
    KPC_DTYPE_F16 = 1,
    /// 32-bit floats.
    KPC_DTYPE_F32 = 2,
}

/// A device tensor (opaque): a shape (row-major, the last dimension contiguous) and an element type
/// over device memory. Destroy with `kpc_tensor_destroy`.
pub struct kpc_tensor {
    _opaque: [u8; 0],
}

pub(crate) struct TensorObj(pub(crate) Tensor);

impl Object for TensorObj {
    type Handle = kpc_tensor;
    const NAME: &'static str = "kpc_tensor";
}

/// Most dimensions a tensor takes.
const MAX_RANK: usize = 8;

fn dtype_arg(v: i32) -> Result<Dtype, Failure> {
    match v {
        1 => Ok(Dtype::F16),
        2 => Ok(Dtype::F32),
        _ => Err(Failure::invalid(format!(
            "dtype is {v}: expected KPC_DTYPE_F16 (1) or KPC_DTYPE_F32 (2)"
        ))),
    }
}

/// # Safety
/// `shape` is NULL or points to `rank` readable values.
unsafe fn shape_arg(shape: *const u64, rank: usize) -> Result<Vec<usize>, Failure> {
    if rank == 0 || rank > MAX_RANK {
        return Err(Failure::invalid(format!(
            "rank is {rank}: a tensor has 1 to {MAX_RANK} dimensions"
        )));
    }
    // SAFETY: forwarded to the caller.
    let dims = unsafe { slice_arg(shape, rank, "shape") }?;
    dims.iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| Failure::invalid(format!("dimension {d} does not fit this host")))
        })
        .collect()
}

fn register(out: *mut *mut kpc_tensor, t: Tensor) -> Result<(), Failure> {
    let h = registry::insert(TensorObj(t));
    // SAFETY: the caller checked `out` before any work; writable by its promise.
    unsafe { write_out(out, h, "out") }
}

/// A tensor of `shape` (`rank` dimensions) and `dtype` in new device memory of `context`
/// (contents undefined until written).
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, `out`, `dtype` or shape (rank 0 or
/// above 8, a zero dimension, an odd number of fp16 elements); `KPC_STATUS_OUT_OF_RESOURCES` when
/// the device has no room.
///
/// # Safety
/// `shape` points to `rank` readable values; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_tensor_create(
    context: *const kpc_context,
    dtype: i32,
    shape: *const u64,
    rank: usize,
    out: *mut *mut kpc_tensor,
) -> kpc_status {
    guard("kpc_tensor_create", || {
        check_out(out, "out")?;
        let ctx = registry::get::<Context>(context, "context")?;
        let d = dtype_arg(dtype)?;
        // SAFETY: forwarded to the caller.
        let s = unsafe { shape_arg(shape, rank) }?;
        register(out, Tensor::new(&ctx, &s, d)?)
    })
}

/// A tensor of `shape` and `dtype` over `buffer`'s memory (its first bytes; shared, not copied),
/// an imported buffer included. The tensor keeps the memory alive after `kpc_buffer_destroy`.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, `out`, `dtype` or shape, or a buffer
/// whose size is not whole elements; `KPC_STATUS_SIZE` for a buffer smaller than the shape.
///
/// # Safety
/// `shape` points to `rank` readable values; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_tensor_from_buffer(
    buffer: *const kpc_buffer,
    dtype: i32,
    shape: *const u64,
    rank: usize,
    out: *mut *mut kpc_tensor,
) -> kpc_status {
    guard("kpc_tensor_from_buffer", || {
        check_out(out, "out")?;
        let b = registry::get::<DeviceBuffer>(buffer, "buffer")?;
        let d = dtype_arg(dtype)?;
        // SAFETY: forwarded to the caller.
        let s = unsafe { shape_arg(shape, rank) }?;
        let t = match d {
            Dtype::F16 => Tensor::from_buffer_f16(b.0.cast::<u16>()?, &s)?,
            Dtype::F32 => Tensor::from_buffer_f32(b.0.cast::<f32>()?, &s)?,
        };
        register(out, t)
    })
}

/// Writes `count` floats from `data` into the tensor (rounded to nearest even for fp16), after
/// every launch submitted before.
///
/// Errors: `KPC_STATUS_SIZE` unless `count` is the tensor's element count;
/// `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, NULL `data`, or a value outside fp16's range
/// for an fp16 tensor (nothing is written then).
///
/// # Safety
/// `data` is NULL or points to `count` readable floats.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_tensor_write_f32(
    tensor: *const kpc_tensor,
    data: *const f32,
    count: usize,
) -> kpc_status {
    guard("kpc_tensor_write_f32", || {
        let t = registry::get::<TensorObj>(tensor, "tensor")?;
        if count == 0 || data.is_null() {
            return Err(Failure::invalid(format!(
                "data is {data:p} with count {count}: a write takes the tensor's {} floats",
                t.0.len()
            )));
        }
        // SAFETY: forwarded to the caller.
        let src = unsafe { slice_arg(data, count, "data") }?;
        Ok(t.0.write_f32(src)?)
    })
}

/// Reads the tensor into `out` (`count` floats, its element count; fp16 widened exactly), after
/// every launch submitted before (it waits for them).
///
/// Errors: `KPC_STATUS_SIZE` unless `count` is the tensor's element count;
/// `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or `out`.
///
/// # Safety
/// `out` is NULL or points to `count` writable floats.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_tensor_read_f32(
    tensor: *const kpc_tensor,
    out: *mut f32,
    count: usize,
) -> kpc_status {
    guard("kpc_tensor_read_f32", || {
        let t = registry::get::<TensorObj>(tensor, "tensor")?;
        if count != t.0.len() {
            return Err(Error::Size {
                what: "tensor read".into(),
                got: format!("{count} floats"),
                expected: format!("{} floats (the tensor's elements)", t.0.len()),
            }
            .into());
        }
        check_out(out, "out")?;
        let v = t.0.read_f32()?;
        // SAFETY: non-NULL and aligned (checked), `count` writable floats by the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, count) };
        Ok(())
    })
}

/// Destroys a tensor handle (its memory goes with the last user). NULL is accepted and does
/// nothing.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` when `tensor` is not a live tensor.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_tensor_destroy(tensor: *mut kpc_tensor) -> kpc_status {
    guard("kpc_tensor_destroy", || {
        registry::remove::<TensorObj>(tensor, "tensor")
    })
}

/// The tensor behind an optional handle: NULL is none.
pub(crate) fn opt_tensor(
    t: *const kpc_tensor,
    what: &str,
) -> Result<Option<std::sync::Arc<TensorObj>>, Failure> {
    if t.is_null() {
        Ok(None)
    } else {
        registry::get::<TensorObj>(t, what).map(Some)
    }
}
