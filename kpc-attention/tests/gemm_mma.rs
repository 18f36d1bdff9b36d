//! `mha_gemm_mma` on real drivers: where the device's OpenCL takes the inline PTX (NVIDIA from
//! sm_80) every sweep tile matches the float64 reference with both activation types, at shapes with
//! edge tiles, K off the step, and the head-split layouts with three scaled outputs; elsewhere
//! (lavapipe and PoCL in CI) every tile is refused with the probe's typed error, and so is the
//! layer's `ProjectionKernel::Mma`, while `Auto` falls back to the tiled GEMM.

use kpc::{Context, Error};
use kpc_attention::mha::gemm::GemmShape;
use kpc_attention::mha::gemm_mma::{KERNEL, LAYER_TILES, MmaGemm, SWEEP_TILES};
use kpc_attention::ptx::{NEEDS, inline_ptx_unfit};
use kpc_attention::{KvDtype, MhaParams, MultiHeadAttention, ProjectionKernel};

use crate::common::drivers::{opencl_context, vulkan_context};
use crate::gemm_support::gemm_error;
use crate::mha_support::{Weights, params};

/// Runs `g` on `s` with random fp16-valued inputs and checks every output element, poisoned
/// first, against the float64 reference (relative 2-norm; fp32 sums of exact fp16 products).
fn check(ctx: &Context, g: &MmaGemm, s: &GemmShape) {
    let err = gemm_error(
        ctx,
        s,
        g.a_f16(),
        &g.tiles().to_string(),
        |a, w, b, outs| {
            g.launch(ctx, a, w, b, outs, s).unwrap().wait().unwrap();
        },
    );
    assert!(
        err <= 1e-5,
        "{} a_f16={} {s:?}: error {err:e}",
        g.tiles(),
        g.a_f16()
    );
}

fn shapes() -> Vec<GemmShape> {
    vec![
        // Edge tiles in M and N, K off the step of 32.
        GemmShape::plain(133, 264, 200),
        // Whole tiles.
        GemmShape::plain(256, 256, 128),
        // The layer's fused Q/K/V: three head-split outputs, the first scaled, from a head-split A.
        GemmShape {
            m: 140,
            n: 96 + 32 + 32,
            k: 96,
            n0: 96,
            n1: 32,
            a_seq: 70,
            c_seq: 70,
            head_dim: 16,
            alpha0: 0.25,
        },
    ]
}

fn check_or_refuse(ctx: &Context) {
    let unfit = inline_ptx_unfit(ctx).unwrap();
    let mut ran = 0;
    for &tiles in SWEEP_TILES {
        for a_f16 in [true, false] {
            match MmaGemm::new(ctx, tiles, a_f16) {
                Ok(g) => {
                    assert!(unfit.is_none(), "{tiles} built where the probe did not");
                    for s in shapes() {
                        check(ctx, &g, &s);
                    }
                    ran += 1;
                }
                Err(Error::Unsupported {
                    image,
                    backend,
                    needs,
                    reason,
                }) => {
                    assert_eq!(image, KERNEL);
                    assert_eq!(backend, ctx.backend());
                    assert_eq!(needs, NEEDS);
                    assert_eq!(Some(reason), unfit, "{tiles}");
                }
                Err(e) => panic!("{tiles}: {e}"),
            }
        }
    }
    assert_eq!(ran > 0, unfit.is_none());

    // The layer: `Mma` asked for is the same refusal; `Auto` takes mha_gemm_mma exactly where the
    // probe builds (fp16 weights), mha_gemm_wide or the tiled GEMM elsewhere.
    let p = params(32, 4, 2, KvDtype::F16);
    let w = Weights::random(&p);
    let mma = MhaParams {
        projection: ProjectionKernel::Mma,
        ..p
    };
    match (MultiHeadAttention::new(ctx, &mma, &w.view()), &unfit) {
        (Ok(l), None) => assert_eq!(l.prefill_projection(), KERNEL),
        (Err(Error::Unsupported { reason, .. }), Some(why)) => assert_eq!(&reason, why),
        (r, _) => panic!("{:?} with probe answer {unfit:?}", r.map(|_| ())),
    }
    let auto = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
    if ctx.backend() == kpc::BackendKind::OpenCl {
        let want = if unfit.is_none() { KERNEL } else { "mha_gemm" };
        assert_eq!(auto.prefill_projection(), want);
    } else {
        assert_ne!(auto.prefill_projection(), KERNEL);
    }
    // fp32 weights: the layer's Mma is an argument error where the device takes the PTX.
    if unfit.is_none() {
        let p32 = MhaParams {
            projection: ProjectionKernel::Mma,
            ..params(32, 4, 2, KvDtype::F32)
        };
        let e = MultiHeadAttention::new(ctx, &p32, &Weights::random(&p32).view()).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("fp16 weights")),
            "{e}"
        );
        // A shape the kernel cannot compute is an argument error, before any launch.
        let g = MmaGemm::new(ctx, LAYER_TILES, true).unwrap();
        let a = ctx.buffer::<u16>(64).unwrap();
        let wb = ctx.buffer::<u32>(64).unwrap();
        let b = ctx.buffer::<f32>(64).unwrap();
        let e = g
            .launch(ctx, &a, &wb, &b, [&b, &b, &b], &GemmShape::plain(4, 12, 8))
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}

#[test]
fn mma_gemm_on_opencl_checks_or_refuses() {
    let Some(ctx) = opencl_context("mma_gemm_on_opencl_checks_or_refuses") else {
        return;
    };
    check_or_refuse(&ctx);
}

#[test]
fn mma_gemm_on_vulkan_is_refused() {
    let Some(ctx) = vulkan_context("mma_gemm_on_vulkan_is_refused") else {
        return;
    };
    check_or_refuse(&ctx);
}
