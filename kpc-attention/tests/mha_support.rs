//! Helpers for the MultiHeadAttention tests: random weights in ncnn's order and small parameters.

use kpc_attention::{KvDtype, MhaParams, MhaWeights};

use crate::common::drivers::random_f32;

/// The eight weight arrays of a layer, random, scaled by 1/sqrt(fan-in) so activations stay O(1).
pub struct Weights(pub Vec<Vec<f32>>);

impl Weights {
    pub fn random(p: &MhaParams) -> Weights {
        let sizes = [
            (p.embed_dim, p.qdim),
            (p.embed_dim, 0),
            (p.kv_dim(), p.kdim),
            (p.kv_dim(), 0),
            (p.kv_dim(), p.vdim),
            (p.kv_dim(), 0),
            (p.qdim, p.embed_dim),
            (p.qdim, 0),
        ];
        Weights(
            sizes
                .iter()
                .map(|&(rows, k)| {
                    let n = rows * k.max(1);
                    let s = if k == 0 { 0.1 } else { 1.0 / (k as f32).sqrt() };
                    random_f32(n).iter().map(|x| x * s * 1.5).collect()
                })
                .collect(),
        )
    }

    pub fn view(&self) -> MhaWeights<'_> {
        let a = &self.0;
        MhaWeights {
            q_weight: &a[0],
            q_bias: &a[1],
            k_weight: &a[2],
            k_bias: &a[3],
            v_weight: &a[4],
            v_bias: &a[5],
            out_weight: &a[6],
            out_bias: &a[7],
        }
    }
}

pub fn params(e: usize, h: usize, hkv: usize, dtype: KvDtype) -> MhaParams {
    MhaParams {
        num_kv_heads: hkv,
        weight_dtype: dtype,
        cache_dtype: dtype,
        capacity: 32,
        ..MhaParams::new(e, h)
    }
}

pub fn tolerance(dtype: KvDtype) -> f64 {
    match dtype {
        KvDtype::F32 => 1e-4,
        KvDtype::F16 => 1e-3,
    }
}
