//! The float64 CPU reference for the whole MultiHeadAttention layer: projections, attention and the
//! output projection, as ncnn's CPU layer computes them.
//!
//! With `p.weight_dtype` F16 the weights are first rounded to f16 (biases stay f32), and with
//! `p.cache_dtype` F16 the projected K and V are rounded to f16: what the layer stores. Everything
//! else is float64, so the reference differs from the device only by f32 sums.

use kpc::{Error, Result};

use super::{KvDtype, MhaParams, MhaWeights};
use crate::check_len;

/// One reference call: `q_len` queries over `kv_len` keys.
#[derive(Debug, Clone, Copy)]
pub struct RefCall<'a> {
    /// Query input `[batch][q_len][qdim]`.
    pub q_in: &'a [f32],
    /// Key input `[batch][kv_len][kdim]` (for self-attention, the whole sequence so far).
    pub k_in: &'a [f32],
    /// Value input `[batch][kv_len][vdim]`.
    pub v_in: &'a [f32],
    /// Queries per sequence.
    pub q_len: usize,
    /// Keys per sequence.
    pub kv_len: usize,
    /// Additive mask `[q_len][kv_len]` or `[num_heads][q_len][kv_len]`.
    pub mask: Option<&'a [f32]>,
    /// Whether query `i` sits at position `kv_len - q_len + i` and sees keys up to it.
    pub causal: bool,
}

fn stored(x: &[f32], dtype: KvDtype) -> Vec<f64> {
    match dtype {
        KvDtype::F32 => x.iter().map(|&v| v as f64).collect(),
        KvDtype::F16 => x
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32() as f64)
            .collect(),
    }
}

/// `x [rows][k]` times `w [n][k]` transposed, plus `b [n]`.
fn linear(x: &[f64], rows: usize, k: usize, w: &[f64], b: &[f32]) -> Vec<f64> {
    let n = b.len();
    let mut y = vec![0f64; rows * n];
    for r in 0..rows {
        let xr = &x[r * k..][..k];
        for c in 0..n {
            let wr = &w[c * k..][..k];
            y[r * n + c] = xr.iter().zip(wr).map(|(a, b)| a * b).sum::<f64>() + b[c] as f64;
        }
    }
    y
}

/// The layer's output `[batch][q_len][qdim]` in float64.
///
/// Errors: [`Error::InvalidArgument`] for invalid parameters, zero lengths, or a causal call with
/// `q_len > kv_len`; [`Error::Size`] for weights, inputs or a mask of the wrong length.
pub fn multi_head_attention(
    p: &MhaParams,
    w: &MhaWeights<'_>,
    c: &RefCall<'_>,
) -> Result<Vec<f64>> {
    p.validate()?;
    w.check(p)?;
    if c.q_len == 0 || c.kv_len == 0 || (c.causal && c.q_len > c.kv_len) {
        return Err(Error::InvalidArgument(format!(
            "reference needs 0 < q_len ({}) and 0 < kv_len ({}), q_len <= kv_len when causal",
            c.q_len, c.kv_len
        )));
    }
    let (b, hq, hkv, d) = (p.batch, p.num_heads, p.num_kv_heads, p.head_dim());
    let (e, kvd) = (p.embed_dim, p.kv_dim());
    check_len("reference q input", c.q_in.len(), b * c.q_len * p.qdim)?;
    check_len("reference k input", c.k_in.len(), b * c.kv_len * p.kdim)?;
    check_len("reference v input", c.v_in.len(), b * c.kv_len * p.vdim)?;
    let per_head = match c.mask {
        None => false,
        Some(m) if m.len() == c.q_len * c.kv_len => false,
        Some(m) => {
            check_len("reference mask", m.len(), hq * c.q_len * c.kv_len)?;
            true
        }
    };
    let dt = p.weight_dtype;
    let scale = p.scale_value() as f64;
    let f64s = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let q = linear(
        &f64s(c.q_in),
        b * c.q_len,
        p.qdim,
        &stored(w.q_weight, dt),
        w.q_bias,
    );
    let k = linear(
        &f64s(c.k_in),
        b * c.kv_len,
        p.kdim,
        &stored(w.k_weight, dt),
        w.k_bias,
    );
    let v = linear(
        &f64s(c.v_in),
        b * c.kv_len,
        p.vdim,
        &stored(w.v_weight, dt),
        w.v_bias,
    );
    let round_kv = |x: Vec<f64>| -> Vec<f64> {
        match p.cache_dtype {
            KvDtype::F32 => x,
            KvDtype::F16 => x.iter().map(|&v| half::f16::from_f64(v).to_f64()).collect(),
        }
    };
    let (k, v) = (round_kv(k), round_kv(v));
    let group = hq / hkv;
    let mut attn = vec![0f64; b * c.q_len * e];
    let mut s = vec![0f64; c.kv_len];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / group;
            for i in 0..c.q_len {
                let visible = if c.causal {
                    c.kv_len - c.q_len + i + 1
                } else {
                    c.kv_len
                };
                let qr = &q[(bi * c.q_len + i) * e + h * d..][..d];
                let mut max = f64::NEG_INFINITY;
                for (j, sj) in s.iter_mut().enumerate().take(visible) {
                    let kr = &k[(bi * c.kv_len + j) * kvd + kh * d..][..d];
                    let dot: f64 = qr.iter().zip(kr).map(|(a, b)| a * b).sum();
                    *sj = dot * scale;
                    if let Some(m) = c.mask {
                        let at = if per_head { h * c.q_len + i } else { i };
                        *sj += m[at * c.kv_len + j] as f64;
                    }
                    max = max.max(*sj);
                }
                let out = &mut attn[(bi * c.q_len + i) * e + h * d..][..d];
                if max == f64::NEG_INFINITY {
                    continue; // every key masked: zeros, as the kernel gives
                }
                let mut sum = 0.0;
                for sj in s.iter_mut().take(visible) {
                    *sj = (*sj - max).exp();
                    sum += *sj;
                }
                for (j, sj) in s.iter().enumerate().take(visible) {
                    let vr = &v[(bi * c.kv_len + j) * kvd + kh * d..][..d];
                    for (o, x) in out.iter_mut().zip(vr) {
                        *o += sj / sum * x;
                    }
                }
            }
        }
    }
    Ok(linear(
        &attn,
        b * c.q_len,
        e,
        &stored(w.out_weight, dt),
        w.out_bias,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One head, D = 2, identity projections with zero biases: the layer is plain attention, and
    /// with a single key the output is that key's value.
    #[test]
    fn identity_projections_give_plain_attention() {
        let mut p = MhaParams::new(2, 1);
        p.scale = Some(1.0);
        let eye = [1.0, 0.0, 0.0, 1.0];
        let zero = [0.0, 0.0];
        let w = MhaWeights {
            q_weight: &eye,
            q_bias: &zero,
            k_weight: &eye,
            k_bias: &zero,
            v_weight: &eye,
            v_bias: &zero,
            out_weight: &eye,
            out_bias: &zero,
        };
        let x = [1.0, 0.0, 0.0, 2.0];
        let call = RefCall {
            q_in: &x,
            k_in: &x,
            v_in: &x,
            q_len: 2,
            kv_len: 2,
            mask: None,
            causal: true,
        };
        let y = multi_head_attention(&p, &w, &call).unwrap();
        // Query 0 sees key 0 only; query 1 = (0, 2) scores 0 against key 0 and 4 against key 1.
        let (w0, w1) = (1.0 / (1.0 + 4f64.exp()), 4f64.exp() / (1.0 + 4f64.exp()));
        let want = [1.0, 0.0, w0, 2.0 * w1];
        for (a, b) in y.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{y:?} vs {want:?}");
        }
        // A mask of -inf on key 1 makes query 1 see key 0 only.
        let mask = [0.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
        let y = multi_head_attention(
            &p,
            &w,
            &RefCall {
                mask: Some(&mask),
                causal: false,
                ..call
            },
        )
        .unwrap();
        assert_eq!(y, vec![1.0, 0.0, 1.0, 0.0]);
    }
}
