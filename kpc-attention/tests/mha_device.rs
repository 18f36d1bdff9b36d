//! The MultiHeadAttention layer on device tensors and chained in a decoder stack, on real drivers
//! (lavapipe and PoCL in CI): outputs against the float64 reference in fp16 and f32 activations,
//! the host calls as wrappers of the device ones (the same bits), a 4-layer self + cross stack over
//! 50 steps in one submission per step (counted by the backend), and every bad tensor argument a
//! typed error that changes nothing.

use kpc::{Context, Error};
use kpc_attention::mha::reference::{RefCall, multi_head_attention};
use kpc_attention::reference::relative_error;
use kpc_attention::{
    DecoderLayer, DecoderStack, Dtype, KvDtype, MhaKind, MhaParams, MultiHeadAttention,
    ProjectionKernel, Tensor, round_to_f16,
};

use crate::common::drivers::{opencl_context, random_f32, vulkan_context};
use crate::mha_support::{Weights, params, tolerance};

/// What an fp16 tensor holds for `x`.
fn stored(x: &[f32], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::F32 => x.to_vec(),
        Dtype::F16 => round_to_f16(x),
    }
}

/// The bound for outputs of `dtype` activations over weights of `w`: fp16 outputs are rounded once
/// more (2^-11 relative).
fn bound(w: KvDtype, out: Dtype) -> f64 {
    tolerance(w)
        + match out {
            Dtype::F32 => 0.0,
            Dtype::F16 => 1e-3,
        }
}

fn rows(x: &[f32], w: usize, from: usize, n: usize) -> &[f32] {
    &x[from * w..][..n * w]
}

/// Prefill and steps on tensors of `dtype` against one causal pass of the reference.
fn device_calls(ctx: &Context) {
    // fp16 activations are read and written as they are by the matrix-vector projection, and
    // converted on the device around the tiled one.
    for (wd, dtype, projection) in [
        (KvDtype::F32, Dtype::F32, ProjectionKernel::Auto),
        (KvDtype::F16, Dtype::F16, ProjectionKernel::Auto),
        (KvDtype::F32, Dtype::F16, ProjectionKernel::Auto),
        (KvDtype::F16, Dtype::F16, ProjectionKernel::Tiled),
    ] {
        let p = MhaParams {
            projection,
            ..params(64, 4, 2, wd)
        };
        let w = Weights::random(&p);
        let (prompt, steps) = (5, 4);
        let total = prompt + steps;
        let x = stored(&random_f32(total * p.qdim), dtype);
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
        let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
        let xt =
            Tensor::from_f32(ctx, &[1, prompt, p.qdim], dtype, rows(&x, 64, 0, prompt)).unwrap();
        let mut out = Tensor::new(ctx, &[1, prompt, p.qdim], dtype).unwrap();
        layer.prefill_device(&xt, &mut out, None).unwrap();
        let got = out.read_f32().unwrap();
        let err = relative_error(&got, &want[..prompt * 64]);
        assert!(
            err <= bound(wd, dtype),
            "{wd:?}/{dtype:?}/{projection:?} prefill: {err:e}"
        );
        let mut y = Tensor::new(ctx, &[1, p.qdim], dtype).unwrap();
        for s in prompt..total {
            let xs = Tensor::from_f32(ctx, &[1, p.qdim], dtype, rows(&x, 64, s, 1)).unwrap();
            layer.step_device(&xs, &mut y, None).unwrap();
            let err = relative_error(&y.read_f32().unwrap(), &want[s * 64..][..64]);
            assert!(
                err <= bound(wd, dtype),
                "{wd:?}/{dtype:?}/{projection:?} step {s}: {err:e}"
            );
        }
        assert_eq!(layer.len(), total);
        // Both phases are timed where the backend times launches.
        if let Some(t) = layer.last_times().unwrap() {
            assert!(!t.projection.is_zero() && !t.attention.is_zero(), "{t:?}");
        }
    }
    // Cross-attention with fp16 memory and a device mask.
    let p = MhaParams {
        kind: MhaKind::CrossAttention,
        attn_mask: true,
        kdim: 48,
        ..params(32, 2, 2, KvDtype::F32)
    };
    let w = Weights::random(&p);
    let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
    let s = 6;
    let keys = stored(&random_f32(s * 48), Dtype::F16);
    let values = stored(&random_f32(s * 32), Dtype::F16);
    let kt = Tensor::from_f32(ctx, &[1, s, 48], Dtype::F16, &keys).unwrap();
    let vt = Tensor::from_f32(ctx, &[1, s, 32], Dtype::F16, &values).unwrap();
    layer.set_memory_device(&kt, Some(&vt)).unwrap();
    let x = random_f32(32);
    let mask: Vec<f32> = (0..s)
        .map(|i| {
            if i == 2 {
                f32::NEG_INFINITY
            } else {
                -0.5 * i as f32
            }
        })
        .collect();
    let mt = Tensor::from_f32(ctx, &[1, s], Dtype::F32, &mask).unwrap();
    let xt = Tensor::from_f32(ctx, &[1, 32], Dtype::F32, &x).unwrap();
    let mut y = Tensor::new(ctx, &[1, 32], Dtype::F32).unwrap();
    layer.step_device(&xt, &mut y, Some(&mt)).unwrap();
    let want = multi_head_attention(
        &p,
        &w.view(),
        &RefCall {
            q_in: &x,
            k_in: &keys,
            v_in: &values,
            q_len: 1,
            kv_len: s,
            mask: Some(&mask),
            causal: false,
        },
    )
    .unwrap();
    let err = relative_error(&y.read_f32().unwrap(), &want);
    assert!(
        err <= tolerance(KvDtype::F32),
        "cross, device mask: {err:e}"
    );
}

/// The host calls give the same bits as the device calls they wrap.
fn host_calls_wrap_device_calls(ctx: &Context) {
    let p = params(32, 2, 1, KvDtype::F16);
    let w = Weights::random(&p);
    let mut host = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
    let mut dev = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
    let x = random_f32(3 * 32);
    let a = host.prefill(&x, 3, None).unwrap();
    let xt = Tensor::from_f32(ctx, &[1, 3, 32], Dtype::F32, &x).unwrap();
    let mut out = Tensor::new(ctx, &[1, 3, 32], Dtype::F32).unwrap();
    dev.prefill_device(&xt, &mut out, None).unwrap();
    assert_eq!(a, out.read_f32().unwrap());
    let mut y = Tensor::new(ctx, &[1, 32], Dtype::F32).unwrap();
    for _ in 0..3 {
        let x = random_f32(32);
        let a = host.step(&x, None).unwrap();
        let xt = Tensor::from_f32(ctx, &[1, 32], Dtype::F32, &x).unwrap();
        dev.step_device(&xt, &mut y, None).unwrap();
        assert_eq!(a, y.read_f32().unwrap());
    }
    assert_eq!(
        host.export_cache(kpc_attention::mha::CacheLayout::Sdpa)
            .unwrap(),
        dev.export_cache(kpc_attention::mha::CacheLayout::Sdpa)
            .unwrap()
    );
}

/// Runs `f` over `x` as the reference's f32 input, returning f32 rows.
fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// 4 decoder layers (self-attention then cross-attention) over 50 steps, each step one
/// submission, against the reference run layer by layer over the whole sequence.
fn stack(ctx: &Context) {
    let (layers, steps, s) = (4, 50, 5);
    for (wd, dtype) in [(KvDtype::F32, Dtype::F32), (KvDtype::F16, Dtype::F16)] {
        let ps = MhaParams {
            capacity: steps,
            ..params(32, 4, 2, wd)
        };
        let pc = MhaParams {
            kind: MhaKind::CrossAttention,
            kdim: 16,
            vdim: 16,
            capacity: 8,
            ..params(32, 4, 4, wd)
        };
        let ws: Vec<(Weights, Weights)> = (0..layers)
            .map(|_| (Weights::random(&ps), Weights::random(&pc)))
            .collect();
        let decoder: Vec<DecoderLayer> = ws
            .iter()
            .map(|(a, c)| DecoderLayer {
                self_attn: MultiHeadAttention::new(ctx, &ps, &a.view()).unwrap(),
                cross_attn: Some(MultiHeadAttention::new(ctx, &pc, &c.view()).unwrap()),
            })
            .collect();
        let mut stack = DecoderStack::new(ctx, decoder, dtype).unwrap();
        let mem = stored(&random_f32(s * 16), dtype);
        let mt = Tensor::from_f32(ctx, &[1, s, 16], dtype, &mem).unwrap();
        stack.set_memory(&mt, None).unwrap();
        let x = stored(&random_f32(steps * 32), dtype);
        // The reference, layer by layer over the whole sequence (causal self-attention gives each
        // position what the steps give it).
        let mut h = x.clone();
        for (a, c) in &ws {
            let call = RefCall {
                q_in: &h,
                k_in: &h,
                v_in: &h,
                q_len: steps,
                kv_len: steps,
                mask: None,
                causal: true,
            };
            h = to_f32(&multi_head_attention(&ps, &a.view(), &call).unwrap());
            let call = RefCall {
                q_in: &h,
                k_in: &mem,
                v_in: &mem,
                q_len: steps,
                kv_len: s,
                mask: None,
                causal: false,
            };
            h = to_f32(&multi_head_attention(&pc, &c.view(), &call).unwrap());
        }
        let mut y = Tensor::new(ctx, &[1, 32], dtype).unwrap();
        let xt = Tensor::new(ctx, &[1, 32], dtype).unwrap();
        let mut worst = 0.0f64;
        let mut last = Vec::new();
        for t in 0..steps {
            xt.write_f32(rows(&x, 32, t, 1)).unwrap();
            let before = ctx.stats().backend_counters.batches;
            stack.step(&xt, &mut y).unwrap();
            let after = ctx.stats().backend_counters.batches;
            assert_eq!(
                after - before,
                1,
                "step {t}: one submission for the whole stack"
            );
            let got = y.read_f32().unwrap();
            last.clone_from(&got);
            let want: Vec<f64> = rows(&h, 32, t, 1).iter().map(|&v| f64::from(v)).collect();
            worst = worst.max(relative_error(&got, &want));
        }
        // Eight sublayers' rounding compound (fp16: each hidden state is rounded to fp16 too).
        let limit = match dtype {
            Dtype::F32 => 1e-3,
            Dtype::F16 => 2e-2,
        };
        assert!(worst <= limit, "{dtype:?} stack: worst step {worst:e}");
        for l in stack.layers() {
            assert_eq!(l.self_attn.len(), steps);
        }
        // Every layer's launches went into the one batch.
        assert!(
            stack.last_kernels().len() >= 2 * 2 * layers,
            "{:?}",
            stack.last_kernels()
        );
        // A full cache refuses the next step before anything is recorded.
        let e = stack.step(&xt, &mut y).unwrap_err();
        assert!(matches!(e, Error::Size { .. }), "{e}");
        for l in stack.layers() {
            assert_eq!(l.self_attn.len(), steps);
        }
        // Rolled back one position, the last step gives the same output again.
        stack.truncate(steps - 1);
        assert!(
            stack
                .layers()
                .iter()
                .all(|l| l.self_attn.len() == steps - 1)
        );
        stack.step(&xt, &mut y).unwrap();
        assert_eq!(y.read_f32().unwrap(), last);
    }
}

/// Every bad tensor argument is a typed error, and the layer and stack are unchanged after it.
fn bad_tensors(ctx: &Context, other: &Context) {
    let p = MhaParams {
        attn_mask: true,
        ..params(32, 2, 2, KvDtype::F32)
    };
    let w = Weights::random(&p);
    let mut layer = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
    let mut twin = MultiHeadAttention::new(ctx, &p, &w.view()).unwrap();
    let x0 = random_f32(32);
    let m0 = vec![0.0f32; 1];
    layer.step(&x0, Some(&m0)).unwrap();
    twin.step(&x0, Some(&m0)).unwrap();
    let x = Tensor::from_f32(ctx, &[1, 32], Dtype::F32, &random_f32(32)).unwrap();
    let mut y = Tensor::new(ctx, &[1, 32], Dtype::F32).unwrap();
    let mask = Tensor::from_f32(ctx, &[1, 2], Dtype::F32, &[0.0, -1.0]).unwrap();
    let y_before = vec![7.0f32; 32];
    y.write_f32(&y_before).unwrap();
    let t = |shape: &[usize], d: Dtype, c: &Context| Tensor::new(c, shape, d).unwrap();
    let mut bad_out = t(&[1, 31 + 1, 1], Dtype::F32, ctx);
    let mut other_out = t(&[1, 32], Dtype::F32, other);
    let cases: Vec<(&str, Result<(), Error>)> = vec![
        (
            "x of another context",
            layer.step_device(&t(&[1, 32], Dtype::F32, other), &mut y, Some(&mask)),
        ),
        (
            "out of another context",
            layer.step_device(&x, &mut other_out, Some(&mask)),
        ),
        (
            "x of the wrong shape",
            layer.step_device(&t(&[2, 32], Dtype::F32, ctx), &mut y, Some(&mask)),
        ),
        (
            "x of the wrong rank",
            layer.step_device(&t(&[32], Dtype::F32, ctx), &mut y, Some(&mask)),
        ),
        (
            "out of the wrong shape",
            layer.step_device(&x, &mut bad_out, Some(&mask)),
        ),
        (
            "fp16 mask",
            layer.step_device(&x, &mut y, Some(&t(&[1, 2], Dtype::F16, ctx))),
        ),
        (
            "mask of the wrong shape",
            layer.step_device(&x, &mut y, Some(&t(&[2, 1], Dtype::F32, ctx))),
        ),
        (
            "mask of the wrong length",
            layer.step_device(&x, &mut y, Some(&t(&[1, 3], Dtype::F32, ctx))),
        ),
        (
            "mask of another context",
            layer.step_device(&x, &mut y, Some(&t(&[1, 2], Dtype::F32, other))),
        ),
        ("no mask", layer.step_device(&x, &mut y, None)),
        (
            "prefill x of another context",
            layer.prefill_device(
                &t(&[1, 2, 32], Dtype::F32, other),
                &mut t(&[1, 2, 32], Dtype::F32, ctx),
                Some(&t(&[2, 3], Dtype::F32, ctx)),
            ),
        ),
        (
            "prefill out of the wrong length",
            layer.prefill_device(
                &t(&[1, 2, 32], Dtype::F32, ctx),
                &mut t(&[1, 3, 32], Dtype::F32, ctx),
                Some(&t(&[2, 3], Dtype::F32, ctx)),
            ),
        ),
        (
            "prefill x of the wrong width",
            layer.prefill_device(
                &t(&[1, 2, 30], Dtype::F32, ctx),
                &mut t(&[1, 2, 32], Dtype::F32, ctx),
                Some(&t(&[2, 3], Dtype::F32, ctx)),
            ),
        ),
        (
            "set_memory on a self-attention layer",
            layer.set_memory_device(&t(&[1, 2, 32], Dtype::F32, ctx), None),
        ),
    ];
    for (what, r) in cases {
        let e = r.expect_err(what);
        assert!(
            matches!(
                e,
                Error::InvalidArgument(_) | Error::Size { .. } | Error::CallOrder { .. }
            ),
            "{what}: {e}"
        );
        assert!(!e.to_string().is_empty());
    }
    // Tensors that cannot exist.
    for (shape, d) in [
        (&[][..], Dtype::F32),
        (&[3, 0][..], Dtype::F32),
        (&[3][..], Dtype::F16),
    ] {
        let e = Tensor::new(ctx, shape, d).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{shape:?}: {e}");
    }
    let e = Tensor::from_buffer_f32(ctx.buffer(10).unwrap(), &[1, 32]).unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    let e = Tensor::from_f32(ctx, &[2], Dtype::F16, &[1e6, 0.0]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // Nothing changed: the output untouched, the cache where it was, and the next step the twin's.
    assert_eq!(y.read_f32().unwrap(), y_before);
    assert_eq!(layer.len(), 1);
    let xs = x.read_f32().unwrap();
    layer.step_device(&x, &mut y, Some(&mask)).unwrap();
    assert_eq!(
        y.read_f32().unwrap(),
        twin.step(&xs, Some(&[0.0, -1.0])).unwrap()
    );

    // The stack: bad layers, and bad tensors refused with no cache moved.
    let ps = params(32, 2, 2, KvDtype::F32);
    let ws = Weights::random(&ps);
    let mk = |c: &Context, p: &MhaParams| MultiHeadAttention::new(c, p, &ws.view()).unwrap();
    let e = DecoderStack::new(ctx, vec![], Dtype::F32).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = DecoderStack::new(
        ctx,
        vec![DecoderLayer {
            self_attn: mk(other, &ps),
            cross_attn: None,
        }],
        Dtype::F32,
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let masked = MhaParams {
        attn_mask: true,
        ..ps
    };
    let e = DecoderStack::new(
        ctx,
        vec![DecoderLayer {
            self_attn: mk(ctx, &masked),
            cross_attn: None,
        }],
        Dtype::F32,
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let wide = MhaParams {
        qdim: 16,
        kdim: 16,
        vdim: 16,
        ..ps
    };
    let ww = Weights::random(&wide);
    let e = DecoderStack::new(
        ctx,
        vec![
            DecoderLayer {
                self_attn: mk(ctx, &ps),
                cross_attn: None,
            },
            DecoderLayer {
                self_attn: MultiHeadAttention::new(ctx, &wide, &ww.view()).unwrap(),
                cross_attn: None,
            },
        ],
        Dtype::F32,
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let cross = MhaParams {
        kind: MhaKind::CrossAttention,
        ..ps
    };
    let mut stack = DecoderStack::new(
        ctx,
        vec![
            DecoderLayer {
                self_attn: mk(ctx, &ps),
                cross_attn: None,
            },
            DecoderLayer {
                self_attn: mk(ctx, &ps),
                cross_attn: Some(mk(ctx, &cross)),
            },
        ],
        Dtype::F16,
    )
    .unwrap();
    let x16 = t(&[1, 32], Dtype::F16, ctx);
    let mut y16 = t(&[1, 32], Dtype::F16, ctx);
    // The cross layer has no memory yet: refused before the first layer moves.
    let e = stack.step(&x16, &mut y16).unwrap_err();
    assert!(matches!(e, Error::CallOrder { .. }), "{e}");
    let e = stack
        .step(&t(&[1, 32], Dtype::F16, other), &mut y16)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = stack
        .set_memory(&t(&[1, 2, 16], Dtype::F32, ctx), None)
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    assert!(stack.layers().iter().all(|l| l.self_attn.is_empty()));
    let mem = Tensor::from_f32(ctx, &[1, 2, 32], Dtype::F16, &random_f32(64)).unwrap();
    stack.set_memory(&mem, None).unwrap();
    let e = stack
        .step(&x16, &mut t(&[1, 16], Dtype::F16, ctx))
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    assert!(stack.layers().iter().all(|l| l.self_attn.is_empty()));
    x16.write_f32(&random_f32(32)).unwrap();
    stack.step(&x16, &mut y16).unwrap();
    assert!(stack.layers().iter().all(|l| l.self_attn.len() == 1));
    assert!(y16.read_f32().unwrap().iter().all(|v| v.is_finite()));
}

macro_rules! backend_tests {
    ($backend:ident, $context:ident) => {
        mod $backend {
            use super::*;

            #[test]
            fn device_calls_match_the_reference_in_fp16_and_f32() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_device")) else {
                    return;
                };
                device_calls(&ctx);
            }

            #[test]
            fn host_calls_wrap_the_device_calls() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_host_wrap")) else {
                    return;
                };
                host_calls_wrap_device_calls(&ctx);
            }

            #[test]
            fn a_four_layer_stack_is_one_submission_per_step() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_stack")) else {
                    return;
                };
                stack(&ctx);
            }

            #[test]
            fn bad_tensors_are_typed_errors_that_change_nothing() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mha_bad_tensors")) else {
                    return;
                };
                let other = $context(concat!(stringify!($backend), "_mha_bad_tensors"))
                    .expect("a second context on the same device");
                bad_tensors(&ctx, &other);
            }
        }
    };
}

backend_tests!(vulkan, vulkan_context);
backend_tests!(opencl, opencl_context);
