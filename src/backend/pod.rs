//! Plain-old-data element types for typed buffers, and the byte views that upload and download use.
//!
//! The casts live here because `unsafe` is confined to src/backend/; the runtime's `Buffer<T>` uses
//! only the safe functions below.

mod sealed {
    pub trait Sealed {}
}

/// An element type a device buffer may hold: every bit pattern is a valid value, there is no padding,
/// and it has no drop glue. Sealed: implemented for the primitive numeric types only, which is what
/// makes the byte views below sound.
///
/// fp16 data is stored as `u16` bit patterns.
pub trait Pod: sealed::Sealed + Copy + Default + Send + Sync + 'static {}

macro_rules! pod {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Pod for $t {}
    )*};
}
pod!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// The bytes of `data`, in host byte order.
pub fn as_bytes<T: Pod>(data: &[T]) -> &[u8] {
    // SAFETY: T is one of the sealed primitive types: no padding, so every byte of the slice is
    // initialized; u8 has alignment 1; the length in bytes is exactly size_of_val(data).
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

/// The bytes of `data`, writable, in host byte order.
pub fn as_bytes_mut<T: Pod>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`, and every bit pattern written through the byte view is a valid T
    // (sealed primitive numeric types), so no invalid value can be produced.
    unsafe {
        std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_views_round_trip() {
        let mut v = [1.5f32, -2.0, 3.25];
        assert_eq!(as_bytes(&v).len(), 12);
        assert_eq!(&as_bytes(&v)[..4], &1.5f32.to_ne_bytes());
        as_bytes_mut(&mut v)[4..8].copy_from_slice(&7.0f32.to_ne_bytes());
        assert_eq!(v, [1.5, 7.0, 3.25]);
    }
}
