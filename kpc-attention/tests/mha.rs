//! ncnn's MultiHeadAttention layer on real drivers (lavapipe and PoCL in CI), checked against the
//! float64 reference of the whole layer by ‖out − ref‖ / ‖ref‖. The reference rounds weights and
//! K/V as the layer stores them, so fp16 layers are held to nearly the fp32 bound. Inputs and
//! weights are fresh random numbers each run. Sizes are small: CPU drivers run every case.

use kpc::{Context, Error};
use kpc_attention::mha::CacheLayout;
use kpc_attention::mha::reference::{RefCall, multi_head_attention};
use kpc_attention::reference::relative_error;
use kpc_attention::{KvDtype, MhaKind, MhaParams, MultiHeadAttention, ProjectionKernel};

use crate::common::drivers::{opencl_context, random_f32, vulkan_context};
use crate::mha_support::{Weights, params, tolerance};

/// Rows `[from, from + n)` of each sequence of `[batch][len][w]`.
fn rows(x: &[f32], batch: usize, len: usize, w: usize, from: usize, n: usize) -> Vec<f32> {
    (0..batch)
        .flat_map(|b| x[(b * len + from) * w..][..n * w].iter().copied())
        .collect()
}

fn rows64(x: &[f64], batch: usize, len: usize, w: usize, from: usize, n: usize) -> Vec<f64> {
    (0..batch)
        .flat_map(|b| x[(b * len + from) * w..][..n * w].iter().copied())
        .collect()
}

/// Prefill in `chunks`, then `steps` decode steps: every output against one causal pass of the
/// reference over the whole sequence. Returns whether the steps projected with `mha_gemv`.
fn self_attention_case(ctx: &Context, p: MhaParams, chunks: &[usize], steps: usize) -> bool {
    let w = Weights::random(&p);
    let total: usize = chunks.iter().sum::<usize>() + steps;
    let x = random_f32(p.batch * total * p.qdim);
    let want = multi_head_attention(
        &p,
        &w.view(),
        &RefCall {
            q_in: &x,
            k_in: &x,
            v_in: &x,
            q_len: total,
            kv_len: total,
            mask: None,
            causal: true,
        },
    )
    .unwrap();
    let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).expect("the layer");
    let (b, q) = (p.batch, p.qdim);
    let mut at = 0;
    for &n in chunks {
        let out = layer
            .prefill(&rows(&x, b, total, q, at, n), n, None)
            .unwrap();
        let err = relative_error(&out, &rows64(&want, b, total, q, at, n));
        assert!(
            err <= tolerance(p.weight_dtype),
            "{p:?} prefill at {at}+{n}: {err:e}"
        );
        at += n;
        assert_eq!(layer.len(), at);
    }
    for _ in 0..steps {
        let out = layer.step(&rows(&x, b, total, q, at, 1), None).unwrap();
        let err = relative_error(&out, &rows64(&want, b, total, q, at, 1));
        assert!(
            err <= tolerance(p.weight_dtype),
            "{p:?} step at {at}: {err:e}"
        );
        at += 1;
        assert_eq!(layer.len(), at);
    }
    // The last call's device time by phase (None where the backend does not time launches).
    layer.last_times().unwrap();
    layer.uses_matvec()
}

fn self_attention(ctx: &Context) {
    for dtype in [KvDtype::F32, KvDtype::F16] {
        // MHA and GQA, the projection chosen per shape (matrix-vector steps) and forced tiled.
        for (h, hkv) in [(4, 4), (4, 2), (8, 1)] {
            for projection in [ProjectionKernel::Auto, ProjectionKernel::Tiled] {
                let p = MhaParams {
                    projection,
                    ..params(64, h, hkv, dtype)
                };
                let matvec = self_attention_case(ctx, p, &[5], 4);
                assert_eq!(matvec, projection == ProjectionKernel::Auto, "{p:?}");
            }
        }
        // Two sequences, a chunked prompt, qdim != embed_dim, a custom scale, head_dim 32.
        let p = MhaParams {
            batch: 2,
            qdim: 48,
            kdim: 48,
            vdim: 48,
            scale: Some(0.3),
            ..params(64, 2, 1, dtype)
        };
        self_attention_case(ctx, p, &[3, 2], 3);
        // Widths the matrix-vector kernel does not take (qdim 18): tiled steps under Auto.
        let p = MhaParams {
            qdim: 18,
            kdim: 18,
            vdim: 18,
            ..params(32, 2, 2, dtype)
        };
        assert!(!self_attention_case(ctx, p, &[2], 2));
        // A prompt longer than one GEMM tile (64 rows).
        let p = MhaParams {
            capacity: 80,
            ..params(32, 2, 2, dtype)
        };
        self_attention_case(ctx, p, &[70], 1);
    }
}

/// Cross-attention: steps and a multi-query call over fixed memory, then a smaller memory that
/// must replace the first entirely.
fn cross_attention(ctx: &Context) {
    for dtype in [KvDtype::F32, KvDtype::F16] {
        let p = MhaParams {
            kind: MhaKind::CrossAttention,
            kdim: 48,
            vdim: 32,
            batch: 2,
            ..params(64, 4, 2, dtype)
        };
        let w = Weights::random(&p);
        let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
        let e = layer.step(&random_f32(2 * 64), None).unwrap_err();
        assert!(matches!(e, Error::CallOrder { .. }), "{e}");
        for s in [7usize, 4] {
            let keys = random_f32(2 * s * 48);
            let values = random_f32(2 * s * 32);
            layer.set_memory(&keys, Some(&values), s).unwrap();
            assert_eq!(layer.len(), s);
            for q_len in [1usize, 1, 3] {
                let x = random_f32(2 * q_len * 64);
                let out = if q_len == 1 {
                    layer.step(&x, None).unwrap()
                } else {
                    layer.prefill(&x, q_len, None).unwrap()
                };
                let call = RefCall {
                    q_in: &x,
                    k_in: &keys,
                    v_in: &values,
                    q_len,
                    kv_len: s,
                    mask: None,
                    causal: false,
                };
                let want = multi_head_attention(&p, &w.view(), &call).unwrap();
                let err = relative_error(&out, &want);
                assert!(
                    err <= tolerance(dtype),
                    "{dtype:?} S={s} q_len={q_len}: {err:e}"
                );
                // The memory is not consumed or grown by the queries.
                assert_eq!(layer.len(), s);
            }
        }
        // One input for both K and V where kdim == vdim.
        let p = MhaParams {
            kind: MhaKind::CrossAttention,
            ..params(32, 2, 2, dtype)
        };
        let w = Weights::random(&p);
        let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
        let mem = random_f32(5 * 32);
        layer.set_memory(&mem, None, 5).unwrap();
        let x = random_f32(32);
        let out = layer.step(&x, None).unwrap();
        let call = RefCall {
            q_in: &x,
            k_in: &mem,
            v_in: &mem,
            q_len: 1,
            kv_len: 5,
            mask: None,
            causal: false,
        };
        let err = relative_error(&out, &multi_head_attention(&p, &w.view(), &call).unwrap());
        assert!(
            err <= tolerance(dtype),
            "{dtype:?} shared memory input: {err:e}"
        );
    }
}

/// A random mask with some -inf entries (never a whole row).
fn random_mask(n: usize, row: usize) -> Vec<f32> {
    random_f32(n)
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if v > 0.6 && i % row != 0 {
                f32::NEG_INFINITY
            } else {
                v
            }
        })
        .collect()
}

/// Masks: shared and per-head, with causal self-attention (prefill and steps), non-causal
/// self-attention, and cross-attention.
fn masks(ctx: &Context) {
    for dtype in [KvDtype::F32, KvDtype::F16] {
        let p = MhaParams {
            attn_mask: true,
            ..params(32, 4, 2, dtype)
        };
        let w = Weights::random(&p);
        let total = 6;
        let x = random_f32(total * 32);
        let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
        // Prefill 4 with a shared [4][4] mask, then steps with per-head [4][1][kv] masks; the
        // reference sees the same logits through one [4][6][6] per-head mask.
        let mut full = vec![0f32; 4 * total * total];
        let pre = random_mask(16, 4);
        for h in 0..4 {
            for i in 0..4 {
                for j in 0..4 {
                    full[(h * total + i) * total + j] = pre[i * 4 + j];
                }
            }
        }
        let mut outs = layer.prefill(&x[..4 * 32], 4, Some(&pre)).unwrap();
        for t in 4..total {
            let m = random_mask(4 * (t + 1), t + 1);
            for h in 0..4 {
                for j in 0..=t {
                    full[(h * total + t) * total + j] = m[h * (t + 1) + j];
                }
            }
            outs.extend(layer.step(&x[t * 32..][..32], Some(&m)).unwrap());
        }
        let call = RefCall {
            q_in: &x,
            k_in: &x,
            v_in: &x,
            q_len: total,
            kv_len: total,
            mask: Some(&full),
            causal: true,
        };
        let want = multi_head_attention(&p, &w.view(), &call).unwrap();
        let err = relative_error(&outs, &want);
        assert!(
            err <= tolerance(dtype),
            "{dtype:?} masked self-attention: {err:e}"
        );

        // Non-causal self-attention (an encoder), with and without a mask.
        for attn_mask in [false, true] {
            let p = MhaParams {
                causal: false,
                kv_cache: false,
                attn_mask,
                ..params(32, 4, 2, dtype)
            };
            let w = Weights::random(&p);
            let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
            let x = random_f32(5 * 32);
            let mask = random_mask(25, 5);
            let m = attn_mask.then_some(&mask[..]);
            let out = layer.prefill(&x, 5, m).unwrap();
            // Caching off: the same call again gives the same output, not a longer attention.
            assert_eq!(layer.prefill(&x, 5, m).unwrap(), out);
            let call = RefCall {
                q_in: &x,
                k_in: &x,
                v_in: &x,
                q_len: 5,
                kv_len: 5,
                mask: m,
                causal: false,
            };
            let err = relative_error(&out, &multi_head_attention(&p, &w.view(), &call).unwrap());
            assert!(
                err <= tolerance(dtype),
                "{dtype:?} encoder mask {attn_mask}: {err:e}"
            );
        }

        // Cross-attention with a shared mask.
        let p = MhaParams {
            kind: MhaKind::CrossAttention,
            attn_mask: true,
            ..params(32, 2, 2, dtype)
        };
        let w = Weights::random(&p);
        let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
        let mem = random_f32(6 * 32);
        layer.set_memory(&mem, None, 6).unwrap();
        let x = random_f32(32);
        let mask = random_mask(6, 6);
        let out = layer.step(&x, Some(&mask)).unwrap();
        let call = RefCall {
            q_in: &x,
            k_in: &mem,
            v_in: &mem,
            q_len: 1,
            kv_len: 6,
            mask: Some(&mask),
            causal: false,
        };
        let err = relative_error(&out, &multi_head_attention(&p, &w.view(), &call).unwrap());
        assert!(
            err <= tolerance(dtype),
            "{dtype:?} masked cross-attention: {err:e}"
        );
    }
}

/// Export in both ncnn layouts, import into a fresh layer, export again: the same bits; and the
/// imported layer's next step equals the original's.
fn cache_round_trip(ctx: &Context) {
    for dtype in [KvDtype::F32, KvDtype::F16] {
        let p = MhaParams {
            batch: 2,
            ..params(32, 4, 2, dtype)
        };
        let (d, hkv, len) = (p.head_dim(), p.num_kv_heads, 5);
        let w = Weights::random(&p);
        let mut a = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
        a.prefill(&random_f32(2 * 4 * 32), 4, None).unwrap();
        a.step(&random_f32(2 * 32), None).unwrap();
        let (sk, sv) = a.export_cache(CacheLayout::Sdpa).unwrap();
        let (mk, mv) = a.export_cache(CacheLayout::MhaTransposed).unwrap();
        assert_eq!(sk.len(), 2 * hkv * len * d);
        // Transposed: [b][channel = head * d + e][position] against [b][head][position][e].
        for b in 0..2 {
            for h in 0..hkv {
                for j in 0..len {
                    for e in 0..d {
                        let s = ((b * hkv + h) * len + j) * d + e;
                        let m = ((b * hkv + h) * d + e) * len + j;
                        assert_eq!(sk[s].to_bits(), mk[m].to_bits());
                        assert_eq!(sv[s].to_bits(), mv[m].to_bits());
                    }
                }
            }
        }
        let x = random_f32(2 * 32);
        let next = a.step(&x, None).unwrap();
        for layout in [CacheLayout::Sdpa, CacheLayout::MhaTransposed] {
            let (k, v) = match layout {
                CacheLayout::Sdpa => (&sk, &sv),
                CacheLayout::MhaTransposed => (&mk, &mv),
            };
            let mut b = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
            b.import_cache(layout, k, v, len).unwrap();
            assert_eq!(b.len(), len);
            let (k2, v2) = b.export_cache(layout).unwrap();
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&k2), bits(k), "{dtype:?} {layout:?} k");
            assert_eq!(bits(&v2), bits(v), "{dtype:?} {layout:?} v");
            assert_eq!(
                b.step(&x, None).unwrap(),
                next,
                "{dtype:?} {layout:?} next step"
            );
        }
    }
}

macro_rules! backend_tests {
    ($backend:ident, $context:ident) => {
        mod $backend {
            use super::*;

            #[test]
            fn self_attention_prefill_and_steps_are_one_causal_pass() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_self")) else {
                    return;
                };
                self_attention(&ctx);
            }

            #[test]
            fn cross_attention_attends_its_memory() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_cross")) else {
                    return;
                };
                cross_attention(&ctx);
            }

            #[test]
            fn masks_are_added_to_the_logits() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_masks")) else {
                    return;
                };
                masks(&ctx);
            }

            #[test]
            fn cache_exports_and_imports_exactly_in_both_layouts() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_cache_io")) else {
                    return;
                };
                cache_round_trip(&ctx);
            }
        }
    };
}

backend_tests!(vulkan, vulkan_context);
backend_tests!(opencl, opencl_context);
