//! Access bounds: how much of each buffer a kernel may touch in one launch, declared for kernels
//! whose code is known, so that a launch on a device that does not bound buffer accesses itself
//! (OpenCL, Vulkan without `robustBufferAccess`) is checked before it runs instead of trusted.
//!
//! Why: a kernel indexes its buffers with whatever its code computes. On a CPU OpenCL device a
//! buffer is process memory, so a kernel that writes past a short buffer corrupts the process's own
//! heap; on a GPU it corrupts other device memory. The host cannot see what a kernel will index,
//! so a safe launch needs either the device's guarantee (Vulkan's robust buffer access, which kpc
//! enables) or a declaration of the kernel's accesses that the launch checks. kpc declares its own
//! shipped kernels ([`crate::kernels`]); an embedder may declare others with
//! [`declare_access_bounds`], which is `unsafe` because kpc cannot verify the declaration.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

use crate::backend::DeviceImage;
use crate::cache::Digest;
use crate::error::{Error, Result};

/// How many elements of a buffer one launch may touch, in terms of the launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Extent {
    /// The `u32` push constant (OpenCL: scalar argument) at this byte offset.
    Push(u32),
    /// The launch's work-items in dimension `d` (workgroups × local size).
    Global(usize),
    /// The launch's workgroups in dimension `d`.
    Groups(usize),
    /// The smaller of the `u32` push constant at this byte offset and the launch's work-items in
    /// dimension `d`: a kernel whose invocation `i` touches element `i` only while `i < n`.
    PushOrGlobal(u32, usize),
}

impl std::fmt::Display for Extent {
    /// The extent in words, for messages: `the u32 push constant at byte 8`, `the work-items in
    /// dimension 0`, ...
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Extent::Push(at) => write!(f, "the u32 push constant at byte {at}"),
            Extent::Global(d) => write!(f, "the work-items in dimension {d}"),
            Extent::Groups(d) => write!(f, "the workgroups in dimension {d}"),
            Extent::PushOrGlobal(at, d) => write!(
                f,
                "the smaller of the u32 push constant at byte {at} and the work-items in \
                 dimension {d}"
            ),
        }
    }
}

/// What a kernel touches of one buffer parameter in a launch: at most `extent` elements of
/// `element_bytes` bytes from the start of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BufferBound {
    /// The parameter's position in the kernel's buffer list ([`crate::backend::KernelInfo::buffers`]).
    pub param: usize,
    /// How many elements a launch touches.
    pub extent: Extent,
    /// Bytes per element.
    pub element_bytes: u64,
}

impl BufferBound {
    /// A bound of `extent` elements of `element_bytes` bytes on parameter `param`.
    pub const fn new(param: usize, extent: Extent, element_bytes: u64) -> BufferBound {
        BufferBound {
            param,
            extent,
            element_bytes,
        }
    }

    /// The bytes this bound requires of its buffer for a launch of `groups` workgroups of `local`
    /// work-items with `push` bytes, or `None` when it cannot be evaluated (a push constant outside
    /// `push`): the launch is refused then.
    pub(crate) fn required_bytes(
        &self,
        groups: [u32; 3],
        local: [u32; 3],
        push: &[u8],
    ) -> Option<u64> {
        let push_u32 = |off: u32| -> Option<u64> {
            let at = usize::try_from(off).ok()?;
            let bytes: [u8; 4] = push.get(at..at.checked_add(4)?)?.try_into().ok()?;
            Some(u64::from(u32::from_le_bytes(bytes)))
        };
        let global = |d: usize| -> Option<u64> {
            Some(u64::from(*groups.get(d)?) * u64::from(*local.get(d)?))
        };
        let elements = match self.extent {
            Extent::Push(off) => push_u32(off)?,
            Extent::Global(d) => global(d)?,
            Extent::Groups(d) => u64::from(*groups.get(d)?),
            Extent::PushOrGlobal(off, d) => push_u32(off)?.min(global(d)?),
        };
        elements.checked_mul(self.element_bytes)
    }
}

/// Kernels with declared bounds: (image digest, entry point) -> bounds.
type Registry = RwLock<HashMap<(Digest, String), Arc<[BufferBound]>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut map = HashMap::new();
        #[cfg(not(loom))]
        for (image, entry, bounds) in crate::kernels::shipped_bounds() {
            map.insert((image.digest(), entry.to_string()), bounds.into());
        }
        RwLock::new(map)
    })
}

/// Declares what kernel `entry` of `image` touches of its buffers, so that [`crate::Queue::submit`]
/// launches it safely on devices that do not bound buffer accesses, checking every buffer against
/// `bounds` first. Applies to kernels acquired from this image with no build options (options can
/// change what the code does); a later declaration for the same kernel replaces the earlier one.
///
/// Errors: [`Error::InvalidArgument`] when two bounds name the same parameter.
///
/// # Safety
/// For every launch of the kernel, it reads and writes nothing of a buffer parameter beyond the
/// bytes its bound gives for that launch, and only the parameters listed are accessed at all
/// through indices the launch can influence beyond their fixed part (an unlisted parameter is
/// checked only against the fixed part of its block). kpc cannot check this: a wrong declaration
/// lets a safe launch write out of bounds.
pub unsafe fn declare_access_bounds(
    image: &DeviceImage,
    entry: &str,
    bounds: &[BufferBound],
) -> Result<()> {
    for (i, b) in bounds.iter().enumerate() {
        if bounds[..i].iter().any(|o| o.param == b.param) {
            return Err(Error::InvalidArgument(format!(
                "access bounds for kernel {entry:?} name parameter {} twice: give one bound per \
                 buffer parameter",
                b.param
            )));
        }
    }
    registry()
        .write()
        .insert((image.digest(), entry.to_string()), bounds.into());
    Ok(())
}

/// The declared bounds of kernel `entry` of the image with `digest`, if any.
pub(crate) fn lookup(digest: &Digest, entry: &str) -> Option<Arc<[BufferBound]>> {
    registry()
        .read()
        .get(&(*digest, entry.to_string()))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_bytes_follow_the_launch() {
        let push = 1000u32.to_le_bytes();
        let b = BufferBound::new(0, Extent::PushOrGlobal(0, 0), 4);
        // 16 groups of 64 = 1024 work-items; n = 1000 elements of 4 bytes.
        assert_eq!(b.required_bytes([16, 1, 1], [64, 1, 1], &push), Some(4000));
        // 4 groups of 64 = 256 work-items: only 256 elements are touched.
        assert_eq!(b.required_bytes([4, 1, 1], [64, 1, 1], &push), Some(1024));
        let g = BufferBound::new(1, Extent::Groups(0), 16);
        assert_eq!(g.required_bytes([7, 1, 1], [256, 1, 1], &push), Some(112));
        // A push constant outside the bytes given cannot be evaluated: the launch is refused.
        let far = BufferBound::new(0, Extent::Push(4), 4);
        assert_eq!(far.required_bytes([1, 1, 1], [1, 1, 1], &push), None);
        // Overflow is refused too, never wrapped.
        let huge = BufferBound::new(0, Extent::Global(0), u64::MAX);
        assert_eq!(huge.required_bytes([2, 1, 1], [2, 1, 1], &push), None);
    }
}
