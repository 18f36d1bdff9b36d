//! The projection GEMMs' float64 check, shared by `mha_gemm_wide`'s and `mha_gemm_mma`'s tests.

use kpc::{Buffer, BufferArg, Context};
use kpc_attention::mha::gemm::GemmShape;

use crate::common::drivers::random_f32;

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

/// Runs one launch of a projection GEMM on `s` with random fp16-valued inputs (`a_f16`: A as fp16,
/// else as f32; `launch` records the kernel on the A, W, bias and three output buffers it is given
/// and waits for it) and returns the relative 2-norm error of every output element, poisoned
/// first, against the float64 reference (fp32 sums of exact fp16 products). `what` names the
/// kernel in the message of an element it did not write.
pub(crate) fn gemm_error(
    ctx: &Context,
    s: &GemmShape,
    a_f16: bool,
    what: &str,
    launch: impl FnOnce(&dyn BufferArg, &Buffer<u32>, &Buffer<f32>, [&Buffer<f32>; 3]),
) -> f64 {
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
    let a_arg: &dyn BufferArg = if a_f16 { &a16 } else { &a32 };
    launch(a_arg, &wd, &bd, [&outs[0], &outs[1], &outs[2]]);
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
                "{what} {s:?}: output {o} ({r}, {col}) not written"
            );
            num += (have - want) * (have - want);
            den += want * want;
        }
    }
    (num / den).sqrt()
}
