//! The MultiHeadAttention layer's edges that an independent client of the C API found (issue 40,
//! item 6), on real drivers: a refused prefill changes nothing, `+inf` in a mask is refused, an
//! fp16 cache refuses values outside fp16's range, and a fully masked row follows one rule on every
//! backend (zeros for `-inf`, a softmax of equal logits for equal finite values), checked against
//! the float64 reference.

use kpc::{Context, Error};
use kpc_attention::mha::CacheLayout;
use kpc_attention::mha::reference::{RefCall, multi_head_attention};
use kpc_attention::reference::relative_error;
use kpc_attention::{
    Attention, AttentionOptions, AttentionShape, F16_MAX, KvCache, KvDtype, MhaKind, MhaParams,
    MultiHeadAttention,
};

use crate::common::drivers::{opencl_context, random_f32, vulkan_context};
use crate::mha_support::{Weights, params, tolerance};

/// The layer's length and its cache as exported: what a refused call must leave as it was.
fn snapshot(layer: &MultiHeadAttention) -> (usize, Vec<f32>, Vec<f32>) {
    let (k, v) = layer.export_cache(CacheLayout::Sdpa).unwrap();
    (layer.len(), k, v)
}

fn invalid(e: Error, needle: &str) {
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains(needle)),
        "expected an invalid argument naming {needle:?}, got {e}"
    );
}

fn size(e: Error) {
    assert!(
        matches!(e, Error::Size { .. }),
        "expected a size error, got {e}"
    );
}

/// With caching on and off, on a layer holding 3 positions: a prefill refused for a mask of the
/// wrong size, NaN or `+inf` in the mask, no mask, or more positions than the capacity keeps the
/// length and the cache; so does a step refused for `+inf`; the layer then still works.
fn refused_prefills_change_nothing(ctx: &Context) {
    for kv_cache in [true, false] {
        let p = MhaParams {
            attn_mask: true,
            kv_cache,
            capacity: 8,
            ..params(32, 4, 2, KvDtype::F16)
        };
        let w = Weights::random(&p);
        let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
        let x = random_f32(9 * 32);
        layer.prefill(&x[..3 * 32], 3, Some(&[0.0; 9])).unwrap();
        let before = snapshot(&layer);
        assert_eq!(before.0, 3);
        let kv_len = if kv_cache { 5 } else { 2 };
        let mut mask = vec![0.0f32; 2 * kv_len];
        let two = &x[..2 * 32];
        let wrong = vec![0.0f32; 2 * kv_len + 1];
        size(layer.prefill(two, 2, Some(&wrong)).unwrap_err());
        assert_eq!(
            snapshot(&layer),
            before,
            "kv_cache {kv_cache}: wrong mask size"
        );
        mask[1] = f32::NAN;
        invalid(
            layer.prefill(two, 2, Some(&mask)).unwrap_err(),
            "mask[1] is NaN",
        );
        assert_eq!(
            snapshot(&layer),
            before,
            "kv_cache {kv_cache}: NaN in the mask"
        );
        mask[1] = f32::INFINITY;
        invalid(
            layer.prefill(two, 2, Some(&mask)).unwrap_err(),
            "mask[1] is inf",
        );
        assert_eq!(
            snapshot(&layer),
            before,
            "kv_cache {kv_cache}: +inf in the mask"
        );
        mask[1] = 0.0;
        invalid(layer.prefill(two, 2, None).unwrap_err(), "takes a mask");
        assert_eq!(snapshot(&layer), before, "kv_cache {kv_cache}: no mask");
        let past = if kv_cache { 12 } else { 9 };
        size(
            layer
                .prefill(&x, 9, Some(&vec![0.0; 9 * past]))
                .unwrap_err(),
        );
        assert_eq!(
            snapshot(&layer),
            before,
            "kv_cache {kv_cache}: past the capacity"
        );
        if kv_cache {
            let step_mask = [0.0, 0.0, f32::INFINITY, 0.0];
            invalid(
                layer.step(&x[..32], Some(&step_mask)).unwrap_err(),
                "mask[2] is inf",
            );
            assert_eq!(snapshot(&layer), before, "+inf in a step's mask");
        }
        layer.prefill(two, 2, Some(&mask)).unwrap();
        assert_eq!(layer.len(), kv_len, "kv_cache {kv_cache}: the good prefill");
    }
}

/// An fp16 cache refuses values that fp16 would store as infinity, naming the value, its index in
/// the caller's layout and the range; 65504 (and anything below 65520, which rounds to it) is
/// accepted. An f32 cache takes them. The same check guards `KvCache` and `decode_step`.
fn fp16_caches_refuse_values_out_of_range(ctx: &Context) {
    let p = MhaParams {
        capacity: 8,
        ..params(32, 4, 2, KvDtype::F16)
    };
    let w = Weights::random(&p);
    let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
    layer.prefill(&random_f32(3 * 32), 3, None).unwrap();
    let before = snapshot(&layer);
    let (k0, v0) = (before.1.clone(), before.2.clone());
    let mut k = k0.clone();
    k[5] = 1.0e5;
    let e = layer
        .import_cache(CacheLayout::Sdpa, &k, &v0, 3)
        .unwrap_err();
    invalid(e.clone(), "imported cache k[5] is 100000");
    invalid(e, "65504");
    assert_eq!(snapshot(&layer), before, "an import of 1e5");
    let mut v = v0.clone();
    let last = v.len() - 1;
    v[last] = -65520.0;
    invalid(
        layer
            .import_cache(CacheLayout::MhaTransposed, &k0, &v, 3)
            .unwrap_err(),
        &format!("imported cache v[{last}] is -65520"),
    );
    assert_eq!(snapshot(&layer), before, "an import of -65520");
    v[last] = 65519.0;
    let mut k = k0.clone();
    k[0] = -F16_MAX;
    layer.import_cache(CacheLayout::Sdpa, &k, &v, 3).unwrap();
    let (_, k2, v2) = snapshot(&layer);
    assert_eq!((k2[0], v2[last]), (-65504.0, 65504.0));

    // An f32 cache holds what fp16 cannot.
    let p32 = MhaParams {
        cache_dtype: KvDtype::F32,
        ..p
    };
    let mut layer32 = MultiHeadAttention::new(ctx, &p32, &w.view()).unwrap();
    let mut k = k0.clone();
    k[5] = 1.0e5;
    layer32.import_cache(CacheLayout::Sdpa, &k, &v0, 3).unwrap();
    assert_eq!(snapshot(&layer32).1[5], 1.0e5);

    // KvCache's own writers and a host decode step.
    let shape = AttentionShape {
        batch: 1,
        q_heads: 2,
        kv_heads: 1,
        head_dim: 8,
    };
    let mut cache = KvCache::new(ctx, &shape, 4, KvDtype::F16).unwrap();
    let mut row = vec![0.5f32; 8];
    cache.append(&row, &row).unwrap();
    row[3] = -1.0e6;
    invalid(
        cache.append(&row, &row).unwrap_err(),
        "appended k[3] is -1000000",
    );
    invalid(cache.fill(&row, &row, 1).unwrap_err(), "filled k[3]");
    invalid(cache.write(1, 1, &row, &row).unwrap_err(), "written k[3]");
    assert_eq!(cache.len(), 1);
    let attn = Attention::new(ctx, &shape, KvDtype::F16, 4, AttentionOptions::default()).unwrap();
    let q = ctx.buffer_from(&random_f32(shape.q_elems())).unwrap();
    let out = ctx.buffer::<f32>(shape.q_elems()).unwrap();
    invalid(
        attn.decode_step(&mut cache, &q, &[0.5; 8], &row, &out)
            .unwrap_err(),
        "decode step v[3]",
    );
    assert_eq!(cache.len(), 1);
}

/// `[rows][kv]` masks, one row each: fully `-inf`, all `-1e30`, all `-f32::MAX`, and a row with
/// some keys masked.
fn edge_rows(kv: usize) -> Vec<Vec<f32>> {
    let mut partial = random_f32(kv);
    partial[0] = f32::NEG_INFINITY;
    vec![
        vec![f32::NEG_INFINITY; kv],
        vec![-1.0e30; kv],
        vec![-f32::MAX; kv],
        partial,
    ]
}

/// Row `row` of `out` (`[rows][qdim]`) is the output bias: the attention gave zeros.
fn is_bias(out: &[f32], row: usize, bias: &[f32]) -> bool {
    out[row * bias.len()..][..bias.len()]
        .iter()
        .zip(bias)
        .all(|(o, b)| (o - b).abs() <= 1e-6)
}

/// Fully masked rows on both dtypes, with shared and per-head masks, in a prefill, a self-attention
/// step and a cross-attention step: `-inf` gives zeros (the output bias), equal finite values give
/// the reference's softmax (uniform), and `-1e30` and `-f32::MAX` give the same row.
fn fully_masked_rows_follow_one_rule(ctx: &Context) {
    for dtype in [KvDtype::F32, KvDtype::F16] {
        // A non-causal prefill of 4 queries over 4 keys, one edge row each.
        let p = MhaParams {
            attn_mask: true,
            kv_cache: false,
            causal: false,
            capacity: 8,
            ..params(32, 4, 2, dtype)
        };
        let w = Weights::random(&p);
        let bias = &w.0[7];
        let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
        let x = random_f32(4 * 32);
        let shared: Vec<f32> = edge_rows(4).concat();
        // Per head: head 1 gets the edge rows, the other heads a zero mask.
        let mut per_head = vec![0.0f32; 4 * 16];
        per_head[16..32].copy_from_slice(&shared);
        for mask in [&shared, &per_head] {
            let out = layer.prefill(&x, 4, Some(mask)).unwrap();
            let call = RefCall {
                q_in: &x,
                k_in: &x,
                v_in: &x,
                q_len: 4,
                kv_len: 4,
                mask: Some(mask),
                causal: false,
            };
            let want = multi_head_attention(&p, &w.view(), &call).unwrap();
            let err = relative_error(&out, &want);
            assert!(err <= tolerance(dtype), "{dtype:?}: {err:e}");
            if mask.len() == 16 {
                assert!(is_bias(&out, 0, bias), "{dtype:?}: a -inf row is not zeros");
                assert_eq!(
                    out[32..64],
                    out[64..96],
                    "{dtype:?}: -1e30 and -f32::MAX rows differ"
                );
                assert!(!is_bias(&out, 1, bias), "{dtype:?}: a -1e30 row gave zeros");
            }
        }

        // A self-attention step whose every key (its own too) is -inf, then one at -1e30.
        let ps = MhaParams {
            kv_cache: true,
            causal: true,
            ..p
        };
        let mut layer = MultiHeadAttention::new(ctx, &ps, &w.view()).unwrap();
        layer.prefill(&x[..2 * 32], 2, Some(&[0.0; 4])).unwrap();
        let out = layer
            .step(&x[2 * 32..3 * 32], Some(&[f32::NEG_INFINITY; 3]))
            .unwrap();
        assert!(
            is_bias(&out, 0, bias),
            "{dtype:?}: a masked step is not zeros"
        );
        let out = layer.step(&x[3 * 32..], Some(&[-1.0e30; 4])).unwrap();
        let mut full = vec![0.0f32; 16];
        full[8..11].fill(f32::NEG_INFINITY);
        full[12..16].fill(-1.0e30);
        let call = RefCall {
            q_in: &x,
            k_in: &x,
            v_in: &x,
            q_len: 4,
            kv_len: 4,
            mask: Some(&full),
            causal: true,
        };
        let want = multi_head_attention(&ps, &w.view(), &call).unwrap();
        let err = relative_error(&out, &want[3 * 32..]);
        assert!(err <= tolerance(dtype), "{dtype:?} step at -1e30: {err:e}");

        // A cross-attention step with every head fully masked.
        let pc = MhaParams {
            kind: MhaKind::CrossAttention,
            causal: false,
            ..p
        };
        let mut cross = MultiHeadAttention::new(ctx, &pc, &w.view()).unwrap();
        cross.set_memory(&x[..3 * 32], None, 3).unwrap();
        let out = cross
            .step(&x[..32], Some(&[f32::NEG_INFINITY; 4 * 3]))
            .unwrap();
        assert!(is_bias(&out, 0, bias), "{dtype:?}: a masked cross step");
    }
}

macro_rules! backend_tests {
    ($backend:ident, $context:ident) => {
        mod $backend {
            use super::*;

            #[test]
            fn refused_prefills_change_nothing() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_refused")) else {
                    return;
                };
                super::refused_prefills_change_nothing(&ctx);
            }

            #[test]
            fn fp16_caches_refuse_values_out_of_range() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_fp16_range")) else {
                    return;
                };
                super::fp16_caches_refuse_values_out_of_range(&ctx);
            }

            #[test]
            fn fully_masked_rows_follow_one_rule() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_masked_rows")) else {
                    return;
                };
                super::fully_masked_rows_follow_one_rule(&ctx);
            }
        }
    };
}

backend_tests!(vulkan, vulkan_context);
backend_tests!(opencl, opencl_context);
