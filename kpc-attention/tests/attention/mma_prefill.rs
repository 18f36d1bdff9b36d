//! The OpenCL `mma.sync` prefill (`PrefillKernel::Mma`, kernels/attn_prefill_mma.cl): refused with
//! a typed error where the device takes no inline PTX (Vulkan, PoCL), never picked by Auto there;
//! where it does (NVIDIA's OpenCL from sm_80), Auto takes it for fp16 K/V and every tile matches the
//! reference at head dimensions 128, 64 and 96, GQA, lengths that end mid-tile and scaled queries.

use kpc::{Context, Error};
use kpc_attention::ptx::{auto_takes_inline_ptx, inline_ptx_unfit};
use kpc_attention::{Attention, AttentionOptions, KvDtype, PrefillKernel};

use super::prefill::prefill_case_scaled;
use super::shape;

/// Whether `kernel` resolves to the `mma.sync` prefill here for `dtype` (head dimensions 64 and 128).
pub(crate) fn picks_mma(ctx: &Context, dtype: KvDtype, kernel: PrefillKernel) -> bool {
    dtype == KvDtype::F16
        && match kernel {
            PrefillKernel::Auto => auto_takes_inline_ptx(ctx),
            PrefillKernel::Mma => inline_ptx_unfit(ctx)
                .expect("probing is not an error")
                .is_none(),
            _ => false,
        }
}

pub(crate) fn mma_prefill_choice(ctx: &Context) {
    let forced = |row_blocks: u32, keys: u32, warps: u32| AttentionOptions {
        prefill: PrefillKernel::Mma,
        mma_row_blocks: row_blocks,
        mma_keys: keys,
        mma_warps: warps,
        ..AttentionOptions::default()
    };
    let s = shape(1, 4, 2, 64);
    let auto = Attention::new(ctx, &s, KvDtype::F16, 64, AttentionOptions::default()).unwrap();
    if let Some(why) = inline_ptx_unfit(ctx).unwrap() {
        let e = Attention::new(ctx, &s, KvDtype::F16, 64, forced(1, 32, 4)).unwrap_err();
        match &e {
            Error::Unsupported {
                backend,
                image,
                reason,
                ..
            } => {
                assert_eq!(*backend, ctx.backend());
                assert_eq!(image, "attn_prefill_mma");
                assert_eq!(*reason, why);
            }
            e => panic!("expected Error::Unsupported, got {e}"),
        }
        assert_ne!(auto.prefill_kernel(), PrefillKernel::Mma);
        return;
    }
    assert_eq!(auto.prefill_kernel(), PrefillKernel::Mma);
    let f32_auto = Attention::new(ctx, &s, KvDtype::F32, 64, AttentionOptions::default()).unwrap();
    assert_ne!(f32_auto.prefill_kernel(), PrefillKernel::Mma);
    for (dtype, s, options) in [
        (KvDtype::F32, s, forced(1, 32, 4)),
        (KvDtype::F16, shape(1, 2, 2, 48), forced(1, 32, 4)),
        (KvDtype::F16, s, forced(3, 32, 4)),
        (KvDtype::F16, s, forced(1, 48, 4)),
        (KvDtype::F16, s, forced(1, 32, 2)),
        (
            KvDtype::F16,
            s,
            AttentionOptions {
                mma_stages: 4,
                ..forced(2, 32, 4)
            },
        ),
        (
            KvDtype::F16,
            s,
            AttentionOptions {
                mma_half_exp: 3,
                ..forced(2, 32, 4)
            },
        ),
    ] {
        let e = Attention::new(ctx, &s, dtype, 64, options).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("mma.sync")),
            "{dtype:?} {s:?} {options:?}: {e}"
        );
    }
    // Q in shared memory without the swizzle: 128 padded rows and two padded tiles are over 48 KiB.
    let big = AttentionOptions {
        mma_q_shared: true,
        ..forced(2, 32, 4)
    };
    let e = Attention::new(ctx, &shape(1, 2, 2, 128), KvDtype::F16, 64, big).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("shared memory")),
        "{e}"
    );
    // (row blocks, keys, warps, lazy rescale, stages, swizzle, Q shared, half exp)
    for (row_blocks, keys, warps, lazy, stages, swizzle, q_shared, half_exp) in [
        (1, 32, 4, false, 1, false, false, 0),
        (2, 32, 4, false, 1, false, false, 0),
        (2, 32, 4, true, 1, false, false, 0),
        (1, 64, 4, false, 1, false, false, 0),
        (1, 32, 8, true, 1, false, false, 0),
        (2, 64, 4, false, 1, false, false, 0),
        (2, 32, 4, true, 2, false, false, 0),
        (2, 32, 4, true, 2, true, false, 1),
        (2, 32, 4, true, 3, true, false, 0),
        (2, 32, 4, true, 1, true, true, 2),
        (1, 32, 8, true, 1, true, true, 1),
        (1, 64, 4, true, 1, true, true, 0),
    ] {
        for (s, len, q_scale) in [
            (shape(1, 4, 2, 128), 200, 1.0),
            (shape(2, 4, 4, 64), 129, 1.0),
            (shape(1, 2, 1, 96), 77, 1.0),
            (shape(1, 4, 1, 128), 64, 1.0),
            (shape(1, 2, 2, 128), 333, 30.0),
            (shape(1, 2, 1, 64), 1, 1.0),
        ] {
            let options = AttentionOptions {
                mma_lazy_rescale: lazy,
                mma_stages: stages,
                mma_swizzle: swizzle,
                mma_q_shared: q_shared,
                mma_half_exp: half_exp,
                ..forced(row_blocks, keys, warps)
            };
            if s.head_dim == 96 && warps == 8 {
                // 32 keys x 12 chunks do not split over 256 work-items.
                assert!(Attention::new(ctx, &s, KvDtype::F16, len, options).is_err());
                continue;
            }
            let err = prefill_case_scaled(ctx, s, KvDtype::F16, options, len, q_scale);
            assert!(
                err <= 2e-3,
                "{s:?} tile {row_blocks}x{keys}/{warps} lazy {lazy} stages {stages} swizzle \
                 {swizzle} Q shared {q_shared} half exp {half_exp} len {len} q x{q_scale}: error {err:e}"
            );
        }
    }
}
