//! Warnings for C programs: `kpc_set_log_callback`, and why a context's disk cache is off.
//!
//! kpc degrades instead of failing (an unusable cache directory, a remote that does not answer: the
//! kernel is built instead), and says so once per cause. A C program has no `tracing` subscriber, so
//! without a callback those warnings go to stderr (`KPC_LOG_STDERR=0` silences that).

use std::ffi::{CString, c_char, c_void};

use super::context::kpc_context;
use super::registry;
use super::util::copy_out;
use super::{guard, kpc_status};
use kpc::Context;

/// Receives one kpc warning: `target` is the part of kpc that warns (`kpc::cache::disk`, ...),
/// `cause` a short stable name (`unusable-root`, `io`, `timeout`, ...), `message` the warning in
/// words; all three are NUL-terminated UTF-8, valid only during the call. `user_data` is what
/// `kpc_set_log_callback` was given. Called on whichever thread warns (kpc's background threads
/// included), possibly inside a kpc call: it must be thread-safe, return quickly, and not call kpc.
pub type kpc_log_callback = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        target: *const c_char,
        cause: *const c_char,
        message: *const c_char,
    ),
>;

/// Sends every kpc warning of this process to `callback` with `user_data` (`callback` NULL: back
/// to the default, one line per warning on stderr unless `KPC_LOG_STDERR=0`). Replaces any earlier
/// callback; a warning being delivered while it is replaced may still reach the old one.
///
/// Errors: none; always `KPC_STATUS_OK`.
///
/// # Safety
/// `callback`, if not NULL, may be called with `user_data` from any thread until it is replaced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_set_log_callback(
    callback: kpc_log_callback,
    user_data: *mut c_void,
) -> kpc_status {
    guard("kpc_set_log_callback", || {
        // The pointer travels as an integer: the caller vouched for its use on any thread.
        let data = user_data as usize;
        let installed = callback.map(|f| {
            kpc::WarningCallback::new(move |w: &kpc::Warning| {
                let c = |s: &str| CString::new(s.replace('\0', "\\0")).unwrap_or_default();
                let (target, cause, message) = (c(w.target), c(w.cause), c(&w.message));
                // SAFETY: the caller of kpc_set_log_callback promised `f` may be called with
                // `user_data` from any thread; the strings live across the call.
                unsafe {
                    f(
                        data as *mut c_void,
                        target.as_ptr(),
                        cause.as_ptr(),
                        message.as_ptr(),
                    )
                };
            })
        });
        kpc::set_warning_callback(installed);
        Ok(())
    })
}

/// Why `context`'s disk cache is off although one was configured (its root is a regular file or a
/// directory that cannot be created: the same reason the warning gave), as a NUL-terminated string
/// copied into `buffer`; "" (size 1) when the disk cache is on or was turned off on purpose.
/// `kpc_stats.disk.enabled` is 0 in both off cases. With a NULL `buffer` and `capacity` 0, only
/// `*size` (the bytes needed, NUL included) is written.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, a NULL `size`, or a NULL `buffer` with a
/// non-zero capacity; `KPC_STATUS_BUFFER_TOO_SMALL` when `capacity` is less than `*size` (nothing is
/// copied).
///
/// # Safety
/// `buffer` is NULL or has `capacity` writable bytes; `size` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_context_disk_unusable_reason(
    context: *const kpc_context,
    buffer: *mut c_char,
    capacity: usize,
    size: *mut usize,
) -> kpc_status {
    guard("kpc_context_disk_unusable_reason", || {
        let ctx = registry::get::<Context>(context, "context")?;
        let mut why = ctx.stats().disk_unusable.unwrap_or_default().into_bytes();
        why.retain(|b| *b != 0);
        why.push(0);
        // SAFETY: forwarded to the caller.
        unsafe { copy_out(&why, buffer.cast(), capacity, size, "the reason") }
    })
}
