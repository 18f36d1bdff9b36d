//! A decoder stack on an embedder's own Vulkan device (an interop context over the engine of
//! tests/common/vk_engine.rs, under the validation layer): the same steps as on kpc's own device,
//! bit for bit, one submission each, and no validation error.

use std::sync::atomic::Ordering;

use kpc::Context;
use kpc_attention::{
    DecoderLayer, DecoderStack, Dtype, KvDtype, MhaKind, MhaParams, MultiHeadAttention, Tensor,
};

use crate::common::drivers::{random_f32, test_config, vulkan_context};
use crate::common::vk_engine::{Engine, VALIDATION_ERRORS};
use crate::mha_support::{Weights, params};

fn stack(ctx: &Context, ws: &[(Weights, Weights)], ps: &MhaParams, pc: &MhaParams) -> DecoderStack {
    let layers = ws
        .iter()
        .map(|(a, c)| DecoderLayer {
            self_attn: MultiHeadAttention::new(ctx, ps, &a.view()).unwrap(),
            cross_attn: Some(MultiHeadAttention::new(ctx, pc, &c.view()).unwrap()),
        })
        .collect();
    DecoderStack::new(ctx, layers, Dtype::F16).unwrap()
}

#[test]
fn a_stack_runs_on_the_embedders_vulkan_device() {
    let Some(engine) = Engine::new("vulkan_mha_stack_interop") else {
        return;
    };
    let Some(own) = vulkan_context("vulkan_mha_stack_interop_own") else {
        return;
    };
    let theirs = engine.context(&test_config());
    VALIDATION_ERRORS.store(0, Ordering::SeqCst);
    let ps = MhaParams {
        capacity: 8,
        ..params(32, 4, 2, KvDtype::F16)
    };
    let pc = MhaParams {
        kind: MhaKind::CrossAttention,
        capacity: 4,
        ..params(32, 4, 2, KvDtype::F16)
    };
    let ws: Vec<(Weights, Weights)> = (0..2)
        .map(|_| (Weights::random(&ps), Weights::random(&pc)))
        .collect();
    let mem = random_f32(3 * 32);
    let mut outs = Vec::new();
    for ctx in [&own, &theirs] {
        let mut s = stack(ctx, &ws, &ps, &pc);
        let m = Tensor::from_f32(ctx, &[1, 3, 32], Dtype::F16, &mem).unwrap();
        s.set_memory(&m, None).unwrap();
        let x = Tensor::new(ctx, &[1, 32], Dtype::F16).unwrap();
        let mut y = Tensor::new(ctx, &[1, 32], Dtype::F16).unwrap();
        let mut got = Vec::new();
        for t in 0..6 {
            x.write_f32(
                &(0..32)
                    .map(|i| ((i * 7 + t) % 11) as f32 / 11.0 - 0.5)
                    .collect::<Vec<_>>(),
            )
            .unwrap();
            let before = ctx.stats().backend_counters.batches;
            s.step(&x, &mut y).unwrap();
            assert_eq!(ctx.stats().backend_counters.batches - before, 1);
            got.push(y.read_f32().unwrap());
        }
        assert!(got.iter().flatten().all(|v| v.is_finite()));
        outs.push(got);
    }
    assert_eq!(
        outs[0], outs[1],
        "the embedder's device gives kpc's own device's outputs"
    );
    assert_eq!(VALIDATION_ERRORS.load(Ordering::SeqCst), 0);
}
