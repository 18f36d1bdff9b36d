//! `kpc_kernel_launch`: a cached kernel run on kpc's own queue over `kpc_buffer`s, so that a C
//! program runs kernels without Vulkan or OpenCL code of its own. It is Rust's safe
//! `Queue::submit` of one `LaunchDesc`, with the same checks: on a device without robust buffer access only kernels
//! with declared access bounds run (kpc's shipped `saxpy`, `copy` and `read`), each buffer checked
//! against its bound for the launch first.

use std::ffi::c_void;

use super::buffer::{DeviceBuffer, kpc_buffer};
use super::kernel::{KernelObject, kpc_kernel};
use super::registry;
use super::util::slice_arg;
use super::{Failure, guard, kpc_context, kpc_status};
use kpc::{BufferArg, Context, LaunchDesc};

/// Launches `kernel` on `context`'s queue over `groups[0] x groups[1] x groups[2]` workgroups, with
/// `buffers[0..buffer_count]` bound in the kernel's binding order and `push_size` bytes of push
/// constants at `push` (exactly the kernel's push-constant size; NULL with 0 for none), and returns
/// once the launch has finished on the device. Buffers are read back with `kpc_buffer_download`.
///
/// The kernel and every buffer must belong to `context`. On a device without robust buffer access
/// (every OpenCL device; Vulkan devices lacking `robustBufferAccess`) only kernels whose access
/// bounds are declared run: kpc's shipped kernels (`kpc_image_shipped`). Another kernel is refused
/// with `KPC_STATUS_LAUNCH`, because it could write past a short buffer into this process's memory.
///
/// Errors (nothing is launched then): `KPC_STATUS_INVALID_ARGUMENT` (a bad handle, NULL `groups`,
/// NULL `buffers` or `push` with a non-zero count, a kernel or buffer of another context);
/// `KPC_STATUS_LAUNCH` (a buffer count or group counts the kernel or device does not take, a
/// kernel without declared bounds on a device without robust access); `KPC_STATUS_SIZE` (a buffer
/// smaller than the kernel reads or writes for these groups and push constants, push constants of
/// the wrong size); a device failure's status.
///
/// # Safety
/// `groups` is NULL or points to 3 `uint32_t`; `buffers` is NULL or points to `buffer_count`
/// handles; `push` is NULL or points to `push_size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_kernel_launch(
    context: *const kpc_context,
    kernel: *const kpc_kernel,
    groups: *const u32,
    buffers: *const *const kpc_buffer,
    buffer_count: usize,
    push: *const c_void,
    push_size: usize,
) -> kpc_status {
    guard("kpc_kernel_launch", || {
        let ctx = registry::get::<Context>(context, "context")?;
        let k = registry::get::<KernelObject>(kernel, "kernel")?;
        if groups.is_null() {
            return Err(Failure::invalid(
                "groups is NULL: pass the workgroup counts as an array of 3 uint32_t",
            ));
        }
        // SAFETY: forwarded to the caller (3 readable uint32_t).
        let g = unsafe { slice_arg(groups, 3, "groups") }?;
        // SAFETY: forwarded to the caller.
        let handles = unsafe { slice_arg(buffers, buffer_count, "buffers") }?;
        let held: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(i, h)| registry::get::<DeviceBuffer>(*h, &format!("buffers[{i}]")))
            .collect::<Result<_, _>>()?;
        let args: Vec<&dyn BufferArg> = held.iter().map(|b| &b.0 as &dyn BufferArg).collect();
        // SAFETY: forwarded to the caller.
        let push = unsafe { slice_arg(push.cast::<u8>(), push_size, "push") }?;
        let launch = LaunchDesc {
            kernel: &k.kernel,
            groups: [g[0], g[1], g[2]],
            buffers: &args,
            push_constants: push,
        };
        ctx.queue().submit(&[launch])?.wait()?;
        Ok(())
    })
}
