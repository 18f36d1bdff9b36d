//! The float64 CPU reference that every attention kernel is checked against.
//!
//! Layouts are the device's: Q and O are `[batch][q_head][q_len][head_dim]`, K and V are
//! `[batch][kv_head][kv_len][head_dim]` (dense, `kv_len` positions). Query head `h` attends KV head
//! `h / (q_heads / kv_heads)`. The scale is `1 / sqrt(head_dim)`. With `causal`, the queries are the
//! last `q_len` positions of the sequence: query `i` sits at position `kv_len - q_len + i` and sees
//! keys `0..=kv_len - q_len + i`, a mask computed from the indices. Without it every query sees every
//! key (cross-attention).

use super::AttentionShape;
use kpc::{Error, Result};

/// Attention in float64: the output `[batch][q_head][q_len][head_dim]`.
///
/// Errors: [`Error::InvalidArgument`] for an invalid shape, `q_len == 0`, `kv_len == 0`, or a causal
/// call with `q_len > kv_len`; [`Error::Size`] when a slice does not have the shape's length.
pub fn attention(
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    q_len: usize,
    kv_len: usize,
    causal: bool,
) -> Result<Vec<f64>> {
    shape.validate()?;
    if q_len == 0 || kv_len == 0 {
        return Err(Error::InvalidArgument(format!(
            "attention needs at least one query and one key; got q_len {q_len}, kv_len {kv_len}"
        )));
    }
    if causal && q_len > kv_len {
        return Err(Error::InvalidArgument(format!(
            "causal attention needs q_len <= kv_len; got q_len {q_len}, kv_len {kv_len}"
        )));
    }
    let d = shape.head_dim;
    super::check_len(
        "reference q",
        q.len(),
        shape.batch * shape.q_heads * q_len * d,
    )?;
    let kv = shape.batch * shape.kv_heads * kv_len * d;
    super::check_len("reference k", k.len(), kv)?;
    super::check_len("reference v", v.len(), kv)?;

    let group = shape.q_heads / shape.kv_heads;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0f64; q.len()];
    let mut scores = vec![0.0f64; kv_len];
    for b in 0..shape.batch {
        for h in 0..shape.q_heads {
            let kv_base = (b * shape.kv_heads + h / group) * kv_len * d;
            for i in 0..q_len {
                let q_row = ((b * shape.q_heads + h) * q_len + i) * d;
                let visible = if causal {
                    kv_len - q_len + i + 1
                } else {
                    kv_len
                };
                let mut max = f64::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate().take(visible) {
                    let k_row = kv_base + j * d;
                    let dot: f64 = (0..d)
                        .map(|x| q[q_row + x] as f64 * k[k_row + x] as f64)
                        .sum();
                    *s = dot * scale;
                    max = max.max(*s);
                }
                let mut sum = 0.0;
                for s in scores.iter_mut().take(visible) {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let o = &mut out[q_row..q_row + d];
                for (j, s) in scores.iter().enumerate().take(visible) {
                    let v_row = kv_base + j * d;
                    for (x, o) in o.iter_mut().enumerate() {
                        *o += s / sum * v[v_row + x] as f64;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// ‖out − reference‖ / ‖reference‖ in the Euclidean norm; infinite when `out` holds a NaN (a
/// poisoned element the kernel never wrote) or the lengths differ.
pub fn relative_error(out: &[f32], reference: &[f64]) -> f64 {
    if out.len() != reference.len() || out.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        diff += (o as f64 - r).powi(2);
        norm += r * r;
    }
    if norm == 0.0 {
        return diff.sqrt();
    }
    (diff / norm).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, q_heads: usize, kv_heads: usize, head_dim: usize) -> AttentionShape {
        AttentionShape {
            batch,
            q_heads,
            kv_heads,
            head_dim,
        }
    }

    #[test]
    fn hand_checked_causal_case() {
        // D = 4 (scale 1/2), one head, two positions. q0 sees only k0: o0 = v0. q1 = (2,0,0,0) sees
        // k0 = 0 (score 0) and k1 = (1,0,0,0) (score 2 * 1 / 2 = 1): weights 1/(1+e), e/(1+e).
        let s = shape(1, 1, 1, 4);
        let q = [0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0];
        let k = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let v = [1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 0.0];
        let o = attention(&s, &q, &k, &v, 2, 2, true).unwrap();
        let e = 1f64.exp();
        let (w0, w1) = (1.0 / (1.0 + e), e / (1.0 + e));
        let want = [
            1.0,
            2.0,
            3.0,
            4.0,
            w0 - w1,
            2.0 * w0,
            3.0 * w0 + w1,
            4.0 * w0,
        ];
        for (a, b) in o.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{o:?} vs {want:?}");
        }
        // Without the mask, q0 (all zeros) weighs both positions equally.
        let o = attention(&s, &q, &k, &v, 2, 2, false).unwrap();
        assert!((o[0] - 0.0).abs() < 1e-12 && (o[1] - 1.0).abs() < 1e-12);
    }

    #[test]
    fn grouped_query_heads_share_their_kv_head() {
        // Two query heads on one KV head: identical queries give identical outputs; the same
        // computation with the KV head duplicated (MHA) gives the same result.
        let s = shape(1, 2, 1, 2);
        let q = [0.3, -0.2, 0.5, 0.1, 0.3, -0.2, 0.5, 0.1]; // [h][2 positions][2]
        let k = [0.1, 0.2, -0.4, 0.3];
        let v = [1.0, 0.0, 0.0, 1.0];
        let gqa = attention(&s, &q, &k, &v, 2, 2, true).unwrap();
        assert_eq!(gqa[..4], gqa[4..]);
        let mha = attention(
            &shape(1, 2, 2, 2),
            &q,
            &[k, k].concat(),
            &[v, v].concat(),
            2,
            2,
            true,
        )
        .unwrap();
        assert_eq!(gqa, mha);
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let s = shape(1, 3, 2, 4);
        let e = attention(&s, &[0.0; 12], &[0.0; 8], &[0.0; 8], 1, 1, false).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let s = shape(1, 2, 1, 4);
        let e = attention(&s, &[0.0; 7], &[0.0; 4], &[0.0; 4], 1, 1, false).unwrap_err();
        assert!(matches!(e, Error::Size { .. }), "{e}");
        let e = attention(&s, &[0.0; 16], &[0.0; 4], &[0.0; 4], 2, 1, true).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    }

    #[test]
    fn relative_error_flags_poison() {
        assert_eq!(relative_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(relative_error(&[f32::NAN, 2.0], &[1.0, 2.0]).is_infinite());
        assert!((relative_error(&[0.0, 1.0], &[0.0, 2.0]) - 0.5).abs() < 1e-12);
    }
}
