//! `mha_gemm_wide` on real drivers: where the device multiplies 16x16 fp16 cooperative matrices it
//! matches the float64 reference for every sweep tile, both activation types and both accumulators,
//! at shapes with edge tiles, K off the step, and the head-split layouts with three scaled outputs;
//! elsewhere (lavapipe and PoCL in CI, which have none) every tile is refused with a typed error
//! before anything is built.

use kpc::{BackendKind, Context, Error};
use kpc_attention::mha::gemm::{
    DEFAULT_TILES, GemmAccumulator, GemmShape, GemmTiles, KERNEL, SWEEP_TILES, WideGemm,
};

use crate::common::drivers::{opencl_context, vulkan_context};
use crate::gemm_support::gemm_error;

/// Runs `g` on `s` with random fp16-valued inputs and checks each output element, poisoned
/// first, against the float64 reference.
fn check(ctx: &Context, g: &WideGemm, s: &GemmShape) {
    let err = gemm_error(
        ctx,
        s,
        g.a_f16(),
        &g.tiles().to_string(),
        |a, w, b, outs| {
            g.launch(ctx, a, w, b, outs, s, 1).unwrap().wait().unwrap();
        },
    );
    let tol = match g.accumulator() {
        GemmAccumulator::F32 => 1e-5,
        GemmAccumulator::F16 => 1e-2,
    };
    assert!(
        err <= tol,
        "{} a_f16={} {:?} {s:?}: error {err:e}",
        g.tiles(),
        g.a_f16(),
        g.accumulator()
    );
}

fn shapes() -> Vec<GemmShape> {
    // Edge tiles in M and N, K off both steps (32 and 64): the bounds-checked walk.
    let mut v = vec![GemmShape::plain(133, 264, 200)];
    // Whole tiles: the walk without bounds tests.
    v.push(GemmShape::plain(256, 256, 128));
    // The layer's fused Q/K/V: three head-split outputs (D = 16), the first scaled, from a
    // head-split A (two sequences of 70), K = 96 (a multiple of 32 but not of 64).
    v.push(GemmShape {
        m: 140,
        n: 96 + 32 + 32,
        k: 96,
        n0: 96,
        n1: 32,
        a_seq: 70,
        c_seq: 70,
        head_dim: 16,
        alpha0: 0.25,
    });
    v
}

fn check_or_refuse(ctx: &Context) {
    let l = &ctx.device().limits;
    let matrices = ctx.device().backend == BackendKind::Vulkan
        && l.cooperative_matrix_f16
        && l.subgroup_size == Some(32);
    let mut ran = 0;
    for &tiles in SWEEP_TILES
        .iter()
        .chain([&GemmTiles::new(128, 128, 32, 2, 4).with_stages(1)])
    {
        for (a_f16, acc) in [
            (true, GemmAccumulator::F32),
            (false, GemmAccumulator::F32),
            (true, GemmAccumulator::F16),
        ] {
            match WideGemm::new(ctx, tiles, a_f16, acc) {
                Ok(g) => {
                    assert!(matrices, "{tiles} built without cooperative matrices");
                    for s in shapes() {
                        check(ctx, &g, &s);
                    }
                    ran += 1;
                }
                Err(Error::Unsupported {
                    image,
                    backend,
                    reason,
                    ..
                }) => {
                    assert_eq!(image, KERNEL);
                    assert_eq!(backend, ctx.device().backend);
                    // Refused only for want of matrices, fp16 sums, or room for the tile.
                    assert!(
                        !matrices
                            || (acc == GemmAccumulator::F16 && !l.cooperative_matrix_f16_acc)
                            || reason.contains("shared memory")
                            || reason.contains("invocations"),
                        "{tiles}: {reason}"
                    );
                }
                Err(e) => panic!("{tiles}: {e}"),
            }
        }
    }
    if matrices {
        assert!(ran > 0, "no tile ran on a device with cooperative matrices");
    } else {
        assert_eq!(ran, 0);
    }
    // A shape the kernel cannot compute is an argument error, before any launch.
    if let Ok(g) = WideGemm::new(ctx, DEFAULT_TILES, true, GemmAccumulator::F32) {
        let a = ctx.buffer::<u16>(64).unwrap();
        let w = ctx.buffer::<u32>(64).unwrap();
        let b = ctx.buffer::<f32>(64).unwrap();
        let e = g
            .launch(
                ctx,
                &a,
                &w,
                &b,
                [&b, &b, &b],
                &GemmShape::plain(4, 12, 8),
                1,
            )
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }
}

#[test]
fn wide_gemm_on_vulkan_checks_or_refuses() {
    let Some(ctx) = vulkan_context("wide_gemm_on_vulkan_checks_or_refuses") else {
        return;
    };
    check_or_refuse(&ctx);
}

#[test]
fn wide_gemm_on_opencl_is_refused() {
    let Some(ctx) = opencl_context("wide_gemm_on_opencl_is_refused") else {
        return;
    };
    check_or_refuse(&ctx);
}
