//! kpc's C API: the functions and types of `include/kpc.h` (generated from this module by cbindgen).
//!
//! Shape (after ncnn's C API): `kpc_<object>_create*` / `kpc_<object>_destroy` pairs, every function
//! returns a [`kpc_status`], results come back through out-pointers, and the caller owns (and must
//! destroy) every object it created. A failing call also leaves a message for its thread
//! ([`kpc_last_error`]).
//!
//! What this layer guarantees to a C caller:
//! - No panic unwinds into C: every entry point runs inside `catch_unwind`; a panic becomes
//!   [`kpc_status::KPC_STATUS_PANIC`] with its message as the last error.
//! - Handles are never dereferenced. A `kpc_context *` (and every other handle) is a token that a
//!   process-wide registry maps to the Rust object; every use looks the token up, with its type. So
//!   NULL, a made-up pointer (mapped or not), a handle of another type, and a handle already destroyed
//!   are all [`kpc_status::KPC_STATUS_INVALID_ARGUMENT`], never a crash. Tokens are never reused, and
//!   start at a random base per process, so a stale or invented value does not hit a live one.
//!   A call that is running when another thread destroys its handle keeps the object alive until it
//!   returns (the registry hands out reference counts), so even that race is not a use-after-free.
//! - Limits that cannot be checked: memory the caller passes *by pointer* (byte arrays, strings, out
//!   pointers, structs) is read or written as the caller describes it. NULL, misalignment, a length
//!   above `PTRDIFF_MAX` and a wrong `struct_size` are detected; a non-NULL pointer to unmapped or too
//!   little memory, a string without its terminating NUL, or a Vulkan/OpenCL handle or function
//!   pointer that is not what it claims to be cannot be, and is undefined behaviour as in any C API.

#![allow(non_camel_case_types)]

mod arrays;
mod blob;
mod buffer;
mod config;
mod config_stores;
mod context;
mod glsl;
mod image;
mod interop;
mod kernel;
mod launch;
mod log;
mod mha;
mod registry;
mod tensor;
mod util;
mod vulkan_features;

pub use blob::*;
pub use buffer::*;
pub use config::*;
pub use config_stores::*;
pub use context::*;
pub use glsl::*;
pub use image::*;
pub use interop::*;
pub use kernel::*;
pub use log::*;
pub use mha::*;
pub use tensor::*;
pub use vulkan_features::*;

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use kpc::Error;

/// The version of this C interface: bumped whenever a function, type or value changes incompatibly.
/// `kpc_abi_version()` returns the library's; compare it with `KPC_ABI_VERSION` from the header.
pub const KPC_ABI_VERSION: u32 = 1;

/// What every kpc C function returns. `KPC_STATUS_OK` is 0; every other value is an error, with
/// details in `kpc_last_error()`. Values are stable across releases; new ones may be added.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_status {
    /// Success.
    KPC_STATUS_OK = 0,
    /// An argument was NULL, out of range, not valid UTF-8, of the wrong size, or a handle that is
    /// not a live object of the expected type.
    KPC_STATUS_INVALID_ARGUMENT = 1,
    /// No device matches the selector; the message lists the devices that exist.
    KPC_STATUS_NO_SUCH_DEVICE = 2,
    /// The backend cannot be used on this machine (no loader, no driver, unusable device).
    KPC_STATUS_UNAVAILABLE = 3,
    /// The driver rejected the program (compile or link error); the message holds the build log.
    KPC_STATUS_BUILD_FAILED = 4,
    /// The SPIR-V image failed validation.
    KPC_STATUS_INVALID_SPIRV = 5,
    /// The image has no entry point of that name; the message lists those it has.
    KPC_STATUS_UNKNOWN_KERNEL = 6,
    /// A cache blob made for another device, driver, kpc format or key; the message names the field
    /// that differs, with both values. Nothing reached the driver.
    KPC_STATUS_BLOB_MISMATCH = 7,
    /// Bytes that are not an intact cache blob (truncated, damaged, another format).
    KPC_STATUS_CORRUPT_BLOB = 8,
    /// An operation of one backend on another backend's object (Vulkan handles of an OpenCL
    /// kernel, a lease of a Vulkan kernel).
    KPC_STATUS_WRONG_BACKEND = 9,
    /// The device or driver ran out of something; the same call may succeed later.
    KPC_STATUS_OUT_OF_RESOURCES = 10,
    /// A configuration value was malformed or inconsistent.
    KPC_STATUS_CONFIG = 11,
    /// The caller's buffer is too small; the needed size was written to the size out-pointer.
    KPC_STATUS_BUFFER_TOO_SMALL = 12,
    /// A persisted binary was refused (another device or driver, or malformed).
    KPC_STATUS_BINARY_REJECTED = 13,
    /// A buffer or value does not have the size the kernel or call expects.
    KPC_STATUS_SIZE = 14,
    /// Any other backend (Vulkan/OpenCL) call failed; the message names it and its code.
    KPC_STATUS_BACKEND = 15,
    /// An I/O error outside the disk cache (whose own failures never surface).
    KPC_STATUS_IO = 16,
    /// A kernel launch whose arguments do not match the kernel.
    KPC_STATUS_LAUNCH = 17,
    /// A GLSL image did not compile; the message is the compiler's, citing `name:line`. Cached:
    /// asking again fails the same way without compiling.
    KPC_STATUS_GLSL_COMPILE = 18,
    /// A call made in a state that does not allow it (a cross-attention step before its memory
    /// is set, a call of the other attention kind); nothing was changed.
    KPC_STATUS_CALL_ORDER = 19,
    /// Work kpc had not begun when it was cancelled (a quiesced context's background work).
    KPC_STATUS_CANCELLED = 20,
    /// The context is sealed (`kpc_context_seal`, `KPC_CACHE_SEAL=error`) and the kernel asked for
    /// is in no cache layer, so serving it would have meant a build; nothing was built. The message
    /// names the kernel and why no layer served it (the key field that differs from the nearest
    /// cached entry). Not cached: the same call succeeds once a store holds the kernel.
    KPC_STATUS_SEALED = 21,
    /// A panic inside kpc was caught at the boundary; the message is the panic's. kpc is still
    /// usable, but the object the call was working on may not be.
    KPC_STATUS_PANIC = 100,
}

/// An error on its way to C: a status and the message [`kpc_last_error`] will return.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: kpc_status,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            status: kpc_status::KPC_STATUS_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

/// The status a Rust error maps to. `Error` is non-exhaustive for Rust users; a variant this crate
/// does not know yet is a backend error, and `every_error_kind_has_its_own_status` below lists
/// each variant so that a new one is noticed here.
pub(crate) fn status_of(e: &Error) -> kpc_status {
    use kpc_status::*;
    match e {
        Error::Config(_) => KPC_STATUS_CONFIG,
        Error::Unavailable { .. } => KPC_STATUS_UNAVAILABLE,
        Error::NoSuchDevice { .. } => KPC_STATUS_NO_SUCH_DEVICE,
        Error::InvalidSpirv { .. } => KPC_STATUS_INVALID_SPIRV,
        Error::GlslCompile { .. } => KPC_STATUS_GLSL_COMPILE,
        Error::Build { .. } | Error::Unsupported { .. } => KPC_STATUS_BUILD_FAILED,
        Error::BinaryRejected { .. } => KPC_STATUS_BINARY_REJECTED,
        Error::Launch { .. } | Error::Unbounded { .. } => KPC_STATUS_LAUNCH,
        Error::UnknownKernel { .. } => KPC_STATUS_UNKNOWN_KERNEL,
        Error::Size { .. } => KPC_STATUS_SIZE,
        Error::InvalidArgument(_) => KPC_STATUS_INVALID_ARGUMENT,
        Error::CallOrder { .. } => KPC_STATUS_CALL_ORDER,
        Error::OutOfResources { .. } => KPC_STATUS_OUT_OF_RESOURCES,
        Error::Backend { .. } => KPC_STATUS_BACKEND,
        Error::Io(_) => KPC_STATUS_IO,
        Error::BlobMismatch { .. } => KPC_STATUS_BLOB_MISMATCH,
        Error::CorruptBlob { .. } | Error::Bundle { .. } => KPC_STATUS_CORRUPT_BLOB,
        Error::WrongBackend { .. } => KPC_STATUS_WRONG_BACKEND,
        Error::Cancelled(_) => KPC_STATUS_CANCELLED,
        Error::Sealed { .. } => KPC_STATUS_SEALED,
        // A build that panicked on another thread: the same condition a caught panic reports.
        Error::Panicked(_) => KPC_STATUS_PANIC,
        _ => KPC_STATUS_BACKEND,
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            status: status_of(&e),
            message: e.to_string(),
        }
    }
}

impl From<kpc::ConfigError> for Failure {
    fn from(e: kpc::ConfigError) -> Failure {
        Failure::from(Error::Config(e))
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message with an interior NUL would be cut there by C; make it visible instead.
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // `try_with`: during thread teardown the slot may be gone; losing the message beats aborting.
    let _ = LAST_ERROR.try_with(|m| *m.borrow_mut() = c);
}

fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|m| {
        if !m.borrow().is_empty() {
            *m.borrow_mut() = CString::default();
        }
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// Runs one entry point's body: a panic becomes `KPC_STATUS_PANIC`, an error its status; the
/// thread's last error is set on failure and cleared on success. `function` prefixes the message.
pub(crate) fn guard(function: &str, body: impl FnOnce() -> Result<(), Failure>) -> kpc_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            clear_last_error();
            kpc_status::KPC_STATUS_OK
        }
        Ok(Err(f)) => {
            set_last_error(&format!("{function}: {}", f.message));
            f.status
        }
        Err(payload) => {
            // Formatting the message allocates; even if that panicked, it stays on this side.
            let msg = catch_unwind(AssertUnwindSafe(|| panic_message(&*payload)))
                .unwrap_or_else(|_| "a panic".to_owned());
            // Dropping a payload can panic too (its Drop is arbitrary code); contain it.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            set_last_error(&format!("{function}: panic: {msg}"));
            kpc_status::KPC_STATUS_PANIC
        }
    }
}

/// The message of the calling thread's last failed kpc call, as a NUL-terminated UTF-8 string; ""
/// when the last call succeeded. Never NULL.
///
/// The pointer stays valid until the next kpc call on this thread other than `kpc_last_error` and
/// `kpc_last_error_copy`; copy the text to keep it. The caller must not free it.
#[unsafe(no_mangle)]
pub extern "C" fn kpc_last_error() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    LAST_ERROR
        .try_with(|m| m.borrow().as_ptr())
        .unwrap_or(EMPTY.as_ptr().cast())
}

/// Copies the calling thread's last error message into `buffer` (`capacity` bytes), truncated if
/// needed and always NUL-terminated when `capacity > 0`. Returns the message's full length without
/// the NUL, as `snprintf` does, so a return value `>= capacity` means it was truncated.
/// `buffer` may be NULL when `capacity` is 0 (a length query). Does not change the last error.
///
/// # Safety
/// `buffer` must point to `capacity` writable bytes (or be NULL with `capacity` 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_last_error_copy(buffer: *mut c_char, capacity: usize) -> usize {
    let r = catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR
            .try_with(|m| {
                let m = m.borrow();
                let bytes = m.as_bytes();
                if !buffer.is_null() && capacity > 0 {
                    let n = bytes.len().min(capacity - 1);
                    // SAFETY: the caller gives `capacity` writable bytes at `buffer`; n + 1 <= capacity.
                    unsafe {
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), n);
                        buffer.add(n).write(0);
                    }
                }
                bytes.len()
            })
            .unwrap_or(0)
    }));
    r.unwrap_or(0)
}

/// The name of a status value ("KPC_STATUS_OK", ...), or "KPC_STATUS_UNKNOWN" for a value that is
/// not one. The string is static; the caller must not free it. Takes an `int` so that any value,
/// including one not in the enum, is accepted.
#[unsafe(no_mangle)]
pub extern "C" fn kpc_status_name(status: i32) -> *const c_char {
    use kpc_status::*;
    let all = [
        KPC_STATUS_OK,
        KPC_STATUS_INVALID_ARGUMENT,
        KPC_STATUS_NO_SUCH_DEVICE,
        KPC_STATUS_UNAVAILABLE,
        KPC_STATUS_BUILD_FAILED,
        KPC_STATUS_INVALID_SPIRV,
        KPC_STATUS_UNKNOWN_KERNEL,
        KPC_STATUS_BLOB_MISMATCH,
        KPC_STATUS_CORRUPT_BLOB,
        KPC_STATUS_WRONG_BACKEND,
        KPC_STATUS_OUT_OF_RESOURCES,
        KPC_STATUS_CONFIG,
        KPC_STATUS_BUFFER_TOO_SMALL,
        KPC_STATUS_BINARY_REJECTED,
        KPC_STATUS_SIZE,
        KPC_STATUS_BACKEND,
        KPC_STATUS_IO,
        KPC_STATUS_LAUNCH,
        KPC_STATUS_GLSL_COMPILE,
        KPC_STATUS_CALL_ORDER,
        KPC_STATUS_CANCELLED,
        KPC_STATUS_SEALED,
        KPC_STATUS_PANIC,
    ];
    let name: &'static [u8] = match all.iter().find(|s| **s as i32 == status) {
        Some(s) => status_name(*s),
        None => b"KPC_STATUS_UNKNOWN\0",
    };
    name.as_ptr().cast()
}

fn status_name(s: kpc_status) -> &'static [u8] {
    use kpc_status::*;
    match s {
        KPC_STATUS_OK => b"KPC_STATUS_OK\0",
        KPC_STATUS_INVALID_ARGUMENT => b"KPC_STATUS_INVALID_ARGUMENT\0",
        KPC_STATUS_NO_SUCH_DEVICE => b"KPC_STATUS_NO_SUCH_DEVICE\0",
        KPC_STATUS_UNAVAILABLE => b"KPC_STATUS_UNAVAILABLE\0",
        KPC_STATUS_BUILD_FAILED => b"KPC_STATUS_BUILD_FAILED\0",
        KPC_STATUS_INVALID_SPIRV => b"KPC_STATUS_INVALID_SPIRV\0",
        KPC_STATUS_UNKNOWN_KERNEL => b"KPC_STATUS_UNKNOWN_KERNEL\0",
        KPC_STATUS_BLOB_MISMATCH => b"KPC_STATUS_BLOB_MISMATCH\0",
        KPC_STATUS_CORRUPT_BLOB => b"KPC_STATUS_CORRUPT_BLOB\0",
        KPC_STATUS_WRONG_BACKEND => b"KPC_STATUS_WRONG_BACKEND\0",
        KPC_STATUS_OUT_OF_RESOURCES => b"KPC_STATUS_OUT_OF_RESOURCES\0",
        KPC_STATUS_CONFIG => b"KPC_STATUS_CONFIG\0",
        KPC_STATUS_BUFFER_TOO_SMALL => b"KPC_STATUS_BUFFER_TOO_SMALL\0",
        KPC_STATUS_BINARY_REJECTED => b"KPC_STATUS_BINARY_REJECTED\0",
        KPC_STATUS_SIZE => b"KPC_STATUS_SIZE\0",
        KPC_STATUS_BACKEND => b"KPC_STATUS_BACKEND\0",
        KPC_STATUS_IO => b"KPC_STATUS_IO\0",
        KPC_STATUS_LAUNCH => b"KPC_STATUS_LAUNCH\0",
        KPC_STATUS_GLSL_COMPILE => b"KPC_STATUS_GLSL_COMPILE\0",
        KPC_STATUS_CALL_ORDER => b"KPC_STATUS_CALL_ORDER\0",
        KPC_STATUS_CANCELLED => b"KPC_STATUS_CANCELLED\0",
        KPC_STATUS_SEALED => b"KPC_STATUS_SEALED\0",
        KPC_STATUS_PANIC => b"KPC_STATUS_PANIC\0",
    }
}

/// The C interface version this library implements (`KPC_ABI_VERSION` when it was built). A caller
/// compiled against another header version should refuse to run.
#[unsafe(no_mangle)]
pub extern "C" fn kpc_abi_version() -> u32 {
    KPC_ABI_VERSION
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: kpc_last_error never returns NULL and its string is NUL-terminated.
        unsafe { CStr::from_ptr(kpc_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_a_status_and_the_last_error() {
        let s = guard("kpc_test", || panic!("boom {}", 7));
        assert_eq!(s, kpc_status::KPC_STATUS_PANIC);
        assert_eq!(last(), "kpc_test: panic: boom 7");
        let s = guard("kpc_test", || std::panic::panic_any(42u8));
        assert_eq!(s, kpc_status::KPC_STATUS_PANIC);
        assert!(last().contains("non-string payload"), "{}", last());
        // A success clears it.
        assert_eq!(guard("kpc_test", || Ok(())), kpc_status::KPC_STATUS_OK);
        assert_eq!(last(), "");
    }

    #[test]
    fn errors_map_to_statuses_and_messages() {
        let s = guard("kpc_x", || {
            Err(Error::UnknownKernel {
                image: "i".into(),
                entry: "e".into(),
                available: "a, b".into(),
            }
            .into())
        });
        assert_eq!(s, kpc_status::KPC_STATUS_UNKNOWN_KERNEL);
        assert!(
            last().starts_with("kpc_x: unknown kernel \"e\""),
            "{}",
            last()
        );
        // Interior NULs are shown, not cut.
        guard("kpc_x", || Err(Failure::invalid("a\0b")));
        assert_eq!(last(), "kpc_x: a\\0b");
    }

    #[test]
    fn a_sealed_refusal_has_its_own_status_and_names_the_kernel() {
        let s = guard("kpc_kernel_create", || {
            Err(Error::Sealed {
                kernel: "saxpy.spv:saxpy".into(),
                why: "spec-changed: spec constant 1: 2 → 3".into(),
            }
            .into())
        });
        assert_eq!(s, kpc_status::KPC_STATUS_SEALED);
        assert!(
            last().contains("saxpy.spv:saxpy") && last().contains("spec constant 1: 2 → 3"),
            "{}",
            last()
        );
        // SAFETY: kpc_status_name returns a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(kpc_status_name(21)) };
        assert_eq!(name.to_str().unwrap(), "KPC_STATUS_SEALED");
    }

    #[test]
    fn last_error_copy_truncates_like_snprintf() {
        guard("kpc_x", || Err(Failure::invalid("0123456789")));
        let full = last();
        let mut buf = [0x7f as c_char; 8];
        // SAFETY: buf has 8 writable bytes.
        let n = unsafe { kpc_last_error_copy(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, full.len());
        // SAFETY: the copy is NUL-terminated within buf.
        let got = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert_eq!(got, &full[..7]);
        // SAFETY: a NULL buffer with capacity 0 is a length query.
        assert_eq!(
            unsafe { kpc_last_error_copy(std::ptr::null_mut(), 0) },
            full.len()
        );
    }

    #[test]
    fn every_status_has_its_name() {
        for v in -1..=200 {
            // SAFETY: kpc_status_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(kpc_status_name(v)) }
                .to_str()
                .unwrap();
            assert!(name.starts_with("KPC_STATUS_"), "{v}: {name}");
        }
        // SAFETY: as above.
        let ok = unsafe { CStr::from_ptr(kpc_status_name(0)) };
        assert_eq!(ok.to_str().unwrap(), "KPC_STATUS_OK");
        // SAFETY: as above.
        let p = unsafe { CStr::from_ptr(kpc_status_name(100)) };
        assert_eq!(p.to_str().unwrap(), "KPC_STATUS_PANIC");
    }
}
