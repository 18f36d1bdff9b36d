//! Where the OpenCL `mma.sync` prefill ([`crate::PrefillKernel::Mma`], kernels/attn_prefill_mma.cl) runs,
//! its shared memory and its specialization.

use kpc::{BackendKind, Context, SpecConstants, SpecValue};

use super::{AttentionOptions, AttentionShape, KvDtype};
use crate::ptx;

/// Why the `mma.sync` prefill cannot take this shape, K/V type and tile (`Err`), whatever the
/// device: the checks that need no build.
pub(super) fn mma_prefill_shape_fits(
    shape: &AttentionShape,
    dtype: KvDtype,
    options: &AttentionOptions,
) -> std::result::Result<(), String> {
    if dtype != KvDtype::F16 {
        return Err("it needs an fp16 K/V cache".into());
    }
    if shape.head_dim % 32 != 0 || shape.head_dim > 256 {
        return Err(format!(
            "head dimension {} is not a multiple of 32 up to 256",
            shape.head_dim
        ));
    }
    if !matches!(options.mma_row_blocks, 1 | 2)
        || !matches!(options.mma_keys, 32 | 64)
        || !matches!(options.mma_warps, 4 | 8)
    {
        return Err(format!(
            "mma_row_blocks {}, mma_keys {} and mma_warps {}: 1 or 2, 32 or 64, and 4 or 8 are \
             accepted",
            options.mma_row_blocks, options.mma_keys, options.mma_warps
        ));
    }
    if !(1..=3).contains(&options.mma_stages) || options.mma_half_exp > 2 {
        return Err(format!(
            "mma_stages {} and mma_half_exp {}: 1 to 3 and 0 to 2 are accepted",
            options.mma_stages, options.mma_half_exp
        ));
    }
    // Each work-item stages whole 16-byte chunks of a tile.
    if (options.mma_keys as usize * shape.head_dim / 8) % (32 * options.mma_warps as usize) != 0 {
        return Err(format!(
            "a tile of {} keys at head dimension {} does not split into 16-byte chunks over {} \
             work-items",
            options.mma_keys,
            shape.head_dim,
            32 * options.mma_warps
        ));
    }
    Ok(())
}

/// Whether [`crate::PrefillKernel::Auto`] takes the `mma.sync` prefill on `ctx`: a shape and K/V
/// type it fits, the shared memory for the tile, and a device where `Auto` takes inline PTX
/// ([`ptx::auto_takes_inline_ptx`]: NVIDIA's OpenCL, probed).
pub(super) fn mma_prefill_auto(
    ctx: &Context,
    shape: &AttentionShape,
    dtype: KvDtype,
    options: &AttentionOptions,
) -> bool {
    ctx.backend() == BackendKind::OpenCl
        && mma_prefill_shape_fits(shape, dtype, options).is_ok()
        && mma_prefill_shared(shape.head_dim, options)
            <= ctx.device().limits.max_shared_memory_bytes as usize
        && ptx::auto_takes_inline_ptx(ctx)
}

/// Shared memory the kernel declares: `mma_stages` K and V tiles (and Q's rows with
/// `mma_q_shared`), rows padded by 16 bytes unless swizzled.
pub(super) fn mma_prefill_shared(head_dim: usize, options: &AttentionOptions) -> usize {
    let row = (head_dim + if options.mma_swizzle { 0 } else { 8 }) * 2;
    let q_rows = if options.mma_q_shared {
        mma_prefill_rows(options) as usize
    } else {
        0
    };
    (2 * options.mma_stages as usize * options.mma_keys as usize + q_rows) * row
}

/// Query rows per workgroup.
pub(super) fn mma_prefill_rows(options: &AttentionOptions) -> u32 {
    16 * options.mma_row_blocks * options.mma_warps
}

/// The kernel's specialization (ids as its `kpc-spec-constant` lines declare them).
pub(super) fn mma_prefill_spec(head_dim: usize, options: &AttentionOptions) -> SpecConstants {
    SpecConstants::new()
        .with(2, SpecValue::U32(1))
        .with(3, SpecValue::U32(head_dim as u32))
        .with(5, SpecValue::U32(options.mma_row_blocks))
        .with(6, SpecValue::U32(options.mma_keys))
        .with(7, SpecValue::U32(options.mma_warps))
        .with(8, SpecValue::U32(u32::from(options.mma_lazy_rescale)))
        .with(9, SpecValue::U32(u32::from(options.mma_swizzle)))
        .with(10, SpecValue::U32(options.mma_stages))
        .with(11, SpecValue::U32(u32::from(options.mma_q_shared)))
        .with(12, SpecValue::U32(options.mma_half_exp))
}
