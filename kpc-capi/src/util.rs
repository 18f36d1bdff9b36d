//! Reading C arguments: strings, byte arrays, out-pointers and versioned structs, each checked for
//! what can be checked (NULL, alignment, length limits, UTF-8, `struct_size`).

use std::ffi::{CStr, c_char};

use super::{Failure, kpc_status};

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays unchanged during the call.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    // SAFETY: forwarded to the caller.
    let bytes = unsafe { cstr_bytes(p, what)? };
    std::str::from_utf8(bytes).map_err(|e| {
        Failure::invalid(format!(
            "{what} is not valid UTF-8 (byte {} is not): expected a UTF-8 string",
            e.valid_up_to()
        ))
    })
}

/// A string argument that may be NULL (then `None`).
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn opt_str_arg<'a>(
    p: *const c_char,
    what: &str,
) -> Result<Option<&'a str>, Failure> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { str_arg(p, what) }.map(Some)
    }
}

/// The bytes of a NUL-terminated string argument, without the NUL (for paths, which need not be
/// UTF-8).
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn cstr_bytes<'a>(p: *const c_char, what: &str) -> Result<&'a [u8], Failure> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
    Ok(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// `count` elements at `p`. NULL is accepted only with `count == 0`.
///
/// # Safety
/// `p` is NULL or points to `count` initialized elements that stay unchanged during the call.
pub(crate) unsafe fn slice_arg<'a, T>(
    p: *const T,
    count: usize,
    what: &str,
) -> Result<&'a [T], Failure> {
    if count == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::invalid(format!(
            "{what} is NULL but its count is {count}"
        )));
    }
    if !p.is_aligned() {
        return Err(Failure::invalid(format!(
            "{what} ({p:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    // slice::from_raw_parts requires the total size to fit in isize; a larger count is garbage.
    if count
        .checked_mul(std::mem::size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(Failure::invalid(format!(
            "{what}: a count of {count} is larger than any array can be"
        )));
    }
    // SAFETY: non-NULL, aligned, size within isize, and the caller promises `count` elements.
    Ok(unsafe { std::slice::from_raw_parts(p, count) })
}

/// Writes `value` through an out-pointer.
///
/// # Safety
/// `out` is NULL or points to writable memory for a `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T, what: &str) -> Result<(), Failure> {
    check_out(out, what)?;
    // SAFETY: non-NULL and aligned (checked); writable by the caller's promise. `write` does not
    // read or drop the old contents, which may be uninitialized.
    unsafe { out.write(value) };
    Ok(())
}

/// Checks an out-pointer before any work is done, so a call with a bad one has no effect.
pub(crate) fn check_out<T>(out: *mut T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} (an out-pointer) is NULL")));
    }
    if !out.is_aligned() {
        return Err(Failure::invalid(format!(
            "{what} ({out:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    Ok(())
}

/// The two-call pattern for variable-length results: `*size` always receives `bytes.len()`; the
/// bytes are copied when `buffer` holds them. `buffer` NULL with `capacity` 0 is a size query (OK).
///
/// # Safety
/// `buffer` is NULL or points to `capacity` writable bytes; `size` is NULL or writable.
pub(crate) unsafe fn copy_out(
    bytes: &[u8],
    buffer: *mut u8,
    capacity: usize,
    size: *mut usize,
    what: &str,
) -> Result<(), Failure> {
    // SAFETY: forwarded to the caller.
    unsafe { write_out(size, bytes.len(), "size")? };
    if buffer.is_null() {
        if capacity == 0 {
            return Ok(());
        }
        return Err(Failure::invalid(format!(
            "{what} buffer is NULL but its capacity is {capacity} (pass NULL with 0 to ask the size)"
        )));
    }
    if capacity < bytes.len() {
        return Err(Failure {
            status: kpc_status::KPC_STATUS_BUFFER_TOO_SMALL,
            message: format!(
                "{what} needs {} bytes, the buffer has {capacity} (the size was written to *size)",
                bytes.len()
            ),
        });
    }
    // SAFETY: `capacity >= bytes.len()` writable bytes at `buffer` by the caller's promise; a Rust
    // slice cannot overlap memory the caller lends us for writing.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer, bytes.len()) };
    Ok(())
}

/// A `0`/`1` switch argument; anything else is refused rather than read as "true".
pub(crate) fn switch_arg(v: i32, what: &str) -> Result<bool, Failure> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Failure::invalid(format!("{what} is {v}: expected 0 or 1"))),
    }
}

/// Writes a versioned output struct: the caller's `struct_size` says how much room it has; kpc writes
/// the fields that fit (at least the `struct_size` field itself) and sets `struct_size` to the bytes
/// it wrote.
///
/// # Safety
/// `out` is NULL or points to writable memory of the size its first `u32` says, which the caller
/// initialized.
pub(crate) unsafe fn write_versioned<T: Copy>(
    out: *mut T,
    mut value: T,
    size_field: impl Fn(&mut T) -> &mut u32,
    name: &str,
) -> Result<(), Failure> {
    check_out(out, name)?;
    // SAFETY: non-NULL, aligned for T hence for its leading u32, and the caller initialized it.
    let room = unsafe { out.cast::<u32>().read() } as usize;
    let ours = std::mem::size_of::<T>();
    // Anything below the smallest struct any header version had is an uninitialized field.
    if room < MIN_VERSIONED_SIZE {
        return Err(Failure::invalid(format!(
            "{name}.struct_size is {room}, expected sizeof({name}) = {ours} (set it before the call)"
        )));
    }
    let n = room.min(ours);
    *size_field(&mut value) = n as u32;
    // SAFETY: `out` has `room >= n` writable bytes; `value` is a local of `ours >= n` bytes. An
    // untyped byte copy, so padding in T (there is none in kpc's structs) would be copied as is.
    unsafe {
        std::ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), out.cast::<u8>(), n);
    }
    Ok(())
}

/// The size of the first version of every versioned output struct's header: `struct_size` plus the
/// first field.
pub(crate) const MIN_VERSIONED_SIZE: usize = 8;
