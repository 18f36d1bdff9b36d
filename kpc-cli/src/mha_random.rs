//! What the MultiHeadAttention runs of `kpc attention` share: random inputs and weights in ncnn's
//! order, and medians.

use kpc_attention::MhaParams;
use kpc_attention::mha::MhaWeights;

/// Uniform numbers in [-scale, scale) from a xorshift generator seeded by the clock.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Rng(t | 1)
    }
    pub(crate) fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                (((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

/// A layer's eight weight arrays, random, scaled by 1/sqrt(fan-in).
pub(crate) fn random_weights(rng: &mut Rng, p: &MhaParams) -> Vec<Vec<f32>> {
    let (e, kv) = (p.embed_dim, p.kv_dim());
    [
        (e, p.qdim),
        (e, 0),
        (kv, p.kdim),
        (kv, 0),
        (kv, p.vdim),
        (kv, 0),
        (p.qdim, e),
        (p.qdim, 0),
    ]
    .iter()
    .map(|&(rows, k)| {
        let s = if k == 0 { 0.1 } else { 1.0 / (k as f32).sqrt() };
        rng.vec(rows * k.max(1), s)
    })
    .collect()
}

pub(crate) fn view(w: &[Vec<f32>]) -> MhaWeights<'_> {
    MhaWeights {
        q_weight: &w[0],
        q_bias: &w[1],
        k_weight: &w[2],
        k_bias: &w[3],
        v_weight: &w[4],
        v_bias: &w[5],
        out_weight: &w[6],
        out_bias: &w[7],
    }
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
