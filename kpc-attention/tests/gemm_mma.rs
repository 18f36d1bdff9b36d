//! `mha_gemm_mma` on real drivers: where the device's OpenCL takes the inline PTX (NVIDIA from
//! sm_80) every sweep tile matches the float64 reference with both activation types, at shapes with
//! edge tiles, K off the step, and the head-split layouts with three scaled outputs; elsewhere
//! (lavapipe and PoCL in CI) every tile is refused with the probe's typed error, and so is the
//! layer's `ProjectionKernel::Mma`, while `Auto` falls back to the tiled GEMM.

use kpc::BufferArg;
use kpc::{Buffer, Context, Error};
use kpc_attention::mha::gemm::GemmShape;
use kpc_attention::mha::gemm_mma::{KERNEL, LAYER_TILES, MmaGemm, SWEEP_TILES};
use kpc_attention::ptx::{NEEDS, inline_ptx_unfit};
use kpc_attention::{KvDtype, MhaParams, MultiHeadAttention, ProjectionKernel};

use crate::common::drivers::{opencl_context, random_f32, vulkan_context};
use crate::mha_support::{Weights, params};

fn f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

fn value(b: u16) -> f64 {
    half::f16::from_bits(b).to_f32() as f64
}

fn split_at(row: usize, col: usize, width: usize, seq: usize, d: usize) -> usize {
    if seq == 0 {
        return row * width + col;
    }
    let heads = width / d;
    (((row / seq) * heads + col / d) * seq + row % seq) * d + col % d
}

/// Runs `g` on `s` with random fp16-valued inputs and checks every output element, poisoned
/// first, against the float64 reference (relative 2-norm; fp32 sums of exact fp16 products).
fn check(ctx: &Context, g: &MmaGemm, s: &GemmShape) {
    let (m, n, k, d) = (s.m, s.n, s.k, s.head_dim);
    let a: Vec<u16> = random_f32(m * k).into_iter().map(f16).collect();
    let w: Vec<u16> = random_f32(n * k)
        .into_iter()
        .map(|x| f16(x / (k as f32).sqrt()))
        .collect();
    let bias = random_f32(n);
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
    g.launch(ctx, a_arg, &wd, &bd, [&outs[0], &outs[1], &outs[2]], s)
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
                "{} {s:?}: ({r}, {j}) not written",
                g.tiles()
            );
            num += (have - want) * (have - want);
            den += want * want;
        }
    }
    let err = (num / den).sqrt();
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
