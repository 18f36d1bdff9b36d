//! Every bad shape, size and call order of the MultiHeadAttention layer is a typed error, on real
//! drivers (lavapipe and PoCL in CI), and a failed call leaves the layer as it was.

use kpc::{Context, Error};
use kpc_attention::mha::{CacheLayout, MAX_GEMV_BATCH};
use kpc_attention::{
    KvDtype, MhaKind, MhaParams, MhaWeights, MultiHeadAttention, ProjectionKernel,
};

use crate::common::drivers::{opencl_context, random_f32, vulkan_context};
use crate::mha_support::{Weights, params};

/// Every bad shape, size and call order is a typed error, and leaves the layer usable.
fn bad_calls(ctx: &Context) {
    let p = params(32, 4, 2, KvDtype::F16);
    let w = Weights::random(&p);
    // Each weight array one element short is named.
    for i in 0..8 {
        let mut bad = Weights(w.0.clone());
        bad.0[i].pop();
        let e = MultiHeadAttention::new(ctx, &p, &bad.view()).unwrap_err();
        let name = [
            "q_weight",
            "q_bias",
            "k_weight",
            "k_bias",
            "v_weight",
            "v_bias",
            "out_weight",
            "out_bias",
        ][i];
        assert!(
            matches!(&e, Error::Size { what, .. } if what.contains(name)),
            "{i}: {e}"
        );
    }
    let flat: Vec<f32> = w.0.concat();
    assert!(MhaWeights::from_ncnn(&flat, &p).is_ok());
    let e = MhaWeights::from_ncnn(&flat[1..], &p).unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    let mut nan = Weights(w.0.clone());
    nan.0[6][3] = f32::NAN;
    let e = MultiHeadAttention::new(ctx, &p, &nan.view()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("out_weight[3]")),
        "{e}"
    );
    // Invalid parameters name themselves.
    for (bad, word) in [
        (MhaParams { num_heads: 3, ..p }, "num_heads"),
        (
            MhaParams {
                num_kv_heads: 3,
                ..p
            },
            "num_kv_heads",
        ),
        (MhaParams { kdim: 16, ..p }, "kdim"),
        (MhaParams { batch: 0, ..p }, "batch"),
        (MhaParams { capacity: 0, ..p }, "capacity"),
        (
            MhaParams {
                scale: Some(f32::NAN),
                ..p
            },
            "scale",
        ),
        (params(6, 2, 2, KvDtype::F32), "head_dim"),
    ] {
        let e = MultiHeadAttention::new(ctx, &bad, &w.view()).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains(word)),
            "{word}: {e}"
        );
    }
    let unfit = MhaParams {
        projection: ProjectionKernel::MatVec,
        batch: MAX_GEMV_BATCH + 1,
        ..p
    };
    let e = MultiHeadAttention::new(ctx, &unfit, &w.view()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("batch")),
        "{e}"
    );

    // The cooperative-matrix projection asked for where it cannot run: no cooperative matrices
    // on lavapipe or PoCL, and fp32 weights anywhere.
    let coop = MhaParams {
        projection: ProjectionKernel::Cooperative,
        ..p
    };
    let e = MultiHeadAttention::new(ctx, &coop, &w.view()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("cooperative-matrix projection")
            && (m.contains("cooperative matrices") || m.contains("fp16 weights"))),
        "{e}"
    );

    // The same for the wide cooperative-matrix projection (mha_gemm_wide).
    let wide = MhaParams {
        projection: ProjectionKernel::Wide,
        ..p
    };
    let e = MultiHeadAttention::new(ctx, &wide, &w.view()).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("wide cooperative-matrix projection")
            && (m.contains("cooperative matrices") || m.contains("fp16 weights"))),
        "{e}"
    );

    let mut layer =
        MultiHeadAttention::new(ctx, &MhaParams { capacity: 6, ..p }, &w.view()).unwrap();
    let size = |e: Error| assert!(matches!(e, Error::Size { .. }), "{e}");
    size(layer.step(&[0.0; 31], None).unwrap_err());
    size(layer.prefill(&[0.0; 3 * 32 + 1], 3, None).unwrap_err());
    size(layer.prefill(&[0.0; 7 * 32], 7, None).unwrap_err());
    let e = layer.prefill(&[], 0, None).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = layer.step(&[f32::INFINITY; 32], None).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // A mask on a layer built without attn_mask.
    let e = layer.step(&[0.0; 32], Some(&[0.0])).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = layer.set_memory(&[0.0; 32], None, 1).unwrap_err();
    assert!(matches!(e, Error::CallOrder { .. }), "{e}");
    size(
        layer
            .import_cache(CacheLayout::Sdpa, &[0.0; 10], &[0.0; 10], 1)
            .unwrap_err(),
    );
    size(
        layer
            .import_cache(CacheLayout::Sdpa, &[0.0; 7 * 32], &[0.0; 7 * 32], 7)
            .unwrap_err(),
    );
    assert_eq!(layer.len(), 0, "failed calls leave the cache alone");
    // Fill to capacity; one more step is a size error and changes nothing.
    let x = random_f32(6 * 32);
    layer.prefill(&x[..5 * 32], 5, None).unwrap();
    layer.step(&x[5 * 32..], None).unwrap();
    size(layer.step(&x[..32], None).unwrap_err());
    assert_eq!(layer.len(), 6);
    layer.clear();
    assert!(layer.is_empty());

    // Masks: missing, of the wrong size, NaN.
    let pm = MhaParams {
        attn_mask: true,
        ..p
    };
    let mut masked = MultiHeadAttention::new(ctx, &pm, &w.view()).unwrap();
    let e = masked.prefill(&x[..64], 2, None).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    size(masked.prefill(&x[..64], 2, Some(&[0.0; 5])).unwrap_err());
    let e = masked
        .prefill(&x[..64], 2, Some(&[f32::NAN; 4]))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert_eq!(masked.len(), 0);
    masked.prefill(&x[..64], 2, Some(&[0.0; 4])).unwrap();

    // Caching off: steps are refused.
    let mut off = MultiHeadAttention::new(
        ctx,
        &MhaParams {
            kv_cache: false,
            ..p
        },
        &w.view(),
    )
    .unwrap();
    let e = off.step(&x[..32], None).unwrap_err();
    assert!(matches!(e, Error::CallOrder { .. }), "{e}");

    // Cross-attention: no prefill or step before memory; no self-attention cache export; memory
    // of the wrong size or past the capacity; values omitted with kdim != vdim.
    let pc = MhaParams {
        kind: MhaKind::CrossAttention,
        kdim: 16,
        vdim: 24,
        capacity: 4,
        ..p
    };
    let wc = Weights::random(&pc);
    let mut cross = MultiHeadAttention::new(ctx, &pc, &wc.view()).unwrap();
    let order = |e: Error| assert!(matches!(e, Error::CallOrder { .. }), "{e}");
    order(cross.step(&x[..32], None).unwrap_err());
    order(cross.prefill(&x[..64], 2, None).unwrap_err());
    order(cross.export_cache(CacheLayout::Sdpa).unwrap_err());
    size(
        cross
            .set_memory(&[0.0; 2 * 16 + 1], Some(&[0.0; 2 * 24]), 2)
            .unwrap_err(),
    );
    size(
        cross
            .set_memory(&[0.0; 5 * 16], Some(&[0.0; 5 * 24]), 5)
            .unwrap_err(),
    );
    let e = cross.set_memory(&[0.0; 2 * 16], None, 2).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("vdim")),
        "{e}"
    );
    order(cross.step(&x[..32], None).unwrap_err());
    cross
        .set_memory(&[0.5; 2 * 16], Some(&[0.5; 2 * 24]), 2)
        .unwrap();
    cross.step(&x[..32], None).unwrap();
    cross.clear();
    order(cross.step(&x[..32], None).unwrap_err());
}

#[test]
fn vulkan_bad_calls_are_typed_errors() {
    if let Some(ctx) = vulkan_context("vulkan_mha_bad_calls") {
        bad_calls(&ctx);
    }
}

#[test]
fn opencl_bad_calls_are_typed_errors() {
    if let Some(ctx) = opencl_context("opencl_mha_bad_calls") {
        bad_calls(&ctx);
    }
}
