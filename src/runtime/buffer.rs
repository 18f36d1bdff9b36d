//! `Buffer<T>`: a typed device buffer with synchronous upload and download.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::backend::Pod;
use crate::backend::pod::{as_bytes, as_bytes_mut};
use crate::error::{Error, Result};

use crate::backend::dynamic::{AnyBuffer, DynComputeBackend};

/// A buffer handle with its size and owning context, whatever its element type: what a launch
/// checks (the context, the size against the kernel's parameter). Cloning shares the buffer.
#[derive(Clone)]
pub struct RawBuffer {
    pub(crate) handle: AnyBuffer,
    pub(crate) bytes: u64,
    pub(crate) context: u64,
}

impl RawBuffer {
    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Anything that can be passed as a kernel's buffer argument: a [`Buffer`] of any element type.
/// Sealed: only kpc's buffers implement it, so a launch always gets a buffer kpc made.
pub trait BufferArg: sealed::Sealed {
    /// The untyped buffer.
    fn raw(&self) -> &RawBuffer;
}

/// A device buffer of `len` elements of `T`. Reads and writes are synchronous and ordered after every
/// launch submitted before them on the context's queue. Cloning shares the buffer; it is freed when
/// the last clone and the last launch using it are gone. `Send` and `Sync`: reads and writes from
/// several threads are each whole, in the order the queue takes them.
pub struct Buffer<T: Pod> {
    raw: RawBuffer,
    len: usize,
    backend: Arc<dyn DynComputeBackend>,
    _t: PhantomData<T>,
}

impl<T: Pod> Clone for Buffer<T> {
    fn clone(&self) -> Self {
        Buffer {
            raw: self.raw.clone(),
            len: self.len,
            backend: self.backend.clone(),
            _t: PhantomData,
        }
    }
}

impl<T: Pod> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("elem", &std::any::type_name::<T>())
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Pod> sealed::Sealed for Buffer<T> {}

impl sealed::Sealed for RawBuffer {}

/// An untyped handle passes as the buffer it is: a recorded launch can keep its arguments as
/// `RawBuffer`s (each keeps its buffer alive) whatever their element types.
impl BufferArg for RawBuffer {
    fn raw(&self) -> &RawBuffer {
        self
    }
}

impl<T: Pod> BufferArg for Buffer<T> {
    fn raw(&self) -> &RawBuffer {
        &self.raw
    }
}

impl<T: Pod> Buffer<T> {
    pub(crate) fn new(raw: RawBuffer, len: usize, backend: Arc<dyn DynComputeBackend>) -> Self {
        Buffer {
            raw,
            len,
            backend,
            _t: PhantomData,
        }
    }

    /// The same memory seen as elements of `U` (shared, not copied).
    ///
    /// Errors: [`Error::InvalidArgument`] when its bytes are not a whole number of `U`s.
    pub fn cast<U: Pod>(&self) -> Result<Buffer<U>> {
        let size = std::mem::size_of::<U>() as u64;
        if size == 0 || self.raw.bytes % size != 0 {
            return Err(Error::InvalidArgument(format!(
                "a buffer of {} bytes is not a whole number of {size}-byte elements",
                self.raw.bytes
            )));
        }
        Ok(Buffer::new(
            self.raw.clone(),
            (self.raw.bytes / size) as usize,
            self.backend.clone(),
        ))
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes.
    pub fn byte_len(&self) -> u64 {
        self.raw.bytes
    }

    fn range(&self, what: &str, offset: usize, n: usize) -> Result<u64> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok((offset * std::mem::size_of::<T>()) as u64),
            _ => Err(Error::Size {
                what: format!("{what} of a buffer of {} elements", self.len),
                got: format!("{n} elements at offset {offset}"),
                expected: format!("offset + length <= {}", self.len),
            }),
        }
    }

    /// Overwrites the whole buffer with `data`.
    ///
    /// Errors: [`Error::Size`] unless `data` has exactly [`Buffer::len`] elements.
    pub fn write(&self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::Size {
                what: "write to a buffer".into(),
                got: format!("{} elements", data.len()),
                expected: format!("{} elements", self.len),
            });
        }
        self.write_at(0, data)
    }

    /// Writes `data` at element `offset`, leaving the rest untouched (an in-place KV-cache append).
    ///
    /// Errors: [`Error::Size`] when the range does not fit.
    pub fn write_at(&self, offset: usize, data: &[T]) -> Result<()> {
        let at = self.range("write", offset, data.len())?;
        self.backend
            .write_buffer(&self.raw.handle, at, as_bytes(data))
    }

    /// The whole buffer, after every launch submitted before the call has finished.
    ///
    /// Errors: [`Error::Backend`] for a device failure.
    pub fn read(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.len];
        self.read_at(0, &mut out)?;
        Ok(out)
    }

    /// Fills `out` from the buffer starting at element `offset`.
    ///
    /// Errors: [`Error::Size`] when the range does not fit.
    pub fn read_at(&self, offset: usize, out: &mut [T]) -> Result<()> {
        let at = self.range("read", offset, out.len())?;
        self.backend
            .read_buffer(&self.raw.handle, at, as_bytes_mut(out))
    }
}
