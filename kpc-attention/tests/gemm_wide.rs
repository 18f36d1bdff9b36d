//! `mha_gemm_wide` on real drivers: where the device multiplies 16x16 fp16 cooperative matrices it
//! matches the float64 reference for every sweep tile, both activation types and both accumulators,
//! at shapes with edge tiles, K off the step, and the head-split layouts with three scaled outputs;
//! elsewhere (lavapipe and PoCL in CI, which have none) every tile is refused with a typed error
//! before anything is built.

use kpc::BufferArg;
use kpc::{BackendKind, Buffer, Context, Error};
use kpc_attention::mha::gemm::{
    DEFAULT_TILES, GemmAccumulator, GemmShape, GemmTiles, KERNEL, SWEEP_TILES, WideGemm,
};

use crate::common::drivers::{opencl_context, random_f32, vulkan_context};

fn f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

fn value(b: u16) -> f64 {
    half::f16::from_bits(b).to_f32() as f64
}

/// Where row `row`, column `col` of a `width`-wide matrix sits in a head-split layout of sequence
/// length `seq` (0: row-major), as the projection kernels lay them out.
fn split_at(row: usize, col: usize, width: usize, seq: usize, d: usize) -> usize {
    if seq == 0 {
        return row * width + col;
    }
    let heads = width / d;
    (((row / seq) * heads + col / d) * seq + row % seq) * d + col % d
}

/// Runs `g` on `s` with random fp16-valued inputs and checks each output element, poisoned
/// first, against the float64 reference.
fn check(ctx: &Context, g: &WideGemm, s: &GemmShape) {
    let (m, n, k, d) = (s.m, s.n, s.k, s.head_dim);
    let a: Vec<u16> = random_f32(m * k).into_iter().map(f16).collect();
    let w: Vec<u16> = random_f32(n * k)
        .into_iter()
        .map(|x| f16(x / (k as f32).sqrt()))
        .collect();
    let bias = random_f32(n);
    // A in its layout: logical (row, col) at split_at(row, col, k, a_seq).
    let mut a_laid = vec![0u16; m * k];
    for r in 0..m {
        for c in 0..k {
            a_laid[split_at(r, c, k, s.a_seq, d)] = a[r * k + c];
        }
    }
    let a16 = ctx.buffer_from(&a_laid).unwrap();
    let a32v: Vec<f32> = a_laid.iter().map(|&b| value(b) as f32).collect();
    let a32 = ctx.buffer_from(&a32v).unwrap();
    let pairs: Vec<u32> = w
        .chunks(2)
        .map(|c| c[0] as u32 | (c[1] as u32) << 16)
        .collect();
    let wd = ctx.buffer_from(&pairs).unwrap();
    let bd = ctx.buffer_from(&bias).unwrap();
    let widths = [s.n0, s.n1, n - s.n0 - s.n1];
    let outs: Vec<Buffer<f32>> = widths
        .iter()
        .map(|&wdt| ctx.buffer_from(&vec![f32::NAN; (m * wdt).max(4)]).unwrap())
        .collect();
    let a_arg: &dyn BufferArg = if g.a_f16() { &a16 } else { &a32 };
    g.launch(ctx, a_arg, &wd, &bd, [&outs[0], &outs[1], &outs[2]], s, 1)
        .unwrap()
        .wait()
        .unwrap();
    let got: Vec<Vec<f32>> = outs.iter().map(|b| b.read().unwrap()).collect();
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for r in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|c| value(a[r * k + c]) * value(w[j * k + c]))
                .sum();
            let mut want = dot + bias[j] as f64;
            let (o, col) = if j < s.n0 {
                want *= s.alpha0 as f64;
                (0, j)
            } else if j < s.n0 + s.n1 {
                (1, j - s.n0)
            } else {
                (2, j - s.n0 - s.n1)
            };
            let have = got[o][split_at(r, col, widths[o], s.c_seq, d)] as f64;
            assert!(
                have.is_finite(),
                "{} {s:?}: output {o} ({r}, {col}) not written",
                g.tiles()
            );
            num += (have - want) * (have - want);
            den += want * want;
        }
    }
    let err = (num / den).sqrt();
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
