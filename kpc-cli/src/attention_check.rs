//! `kpc attention --check`: the prompt's and the decode steps' outputs against the float64
//! reference, over the K/V rows the run wrote.

use kpc_attention::reference::{attention, relative_error};
use kpc_attention::{AttentionShape, KvDtype};

use crate::attention_measure::prefix;

/// What one `kpc attention` run kept for its check.
pub(crate) struct Run<'a> {
    /// The attention's shape.
    pub shape: &'a AttentionShape,
    /// The cache's element type, which sets the tolerance.
    pub dtype: KvDtype,
    /// Positions prefilled from the prompt.
    pub prompt: usize,
    /// Positions in the cache at the end (prompt and steps).
    pub total: usize,
    /// Every K row, `[batch * kv_heads][total][head_dim]`.
    pub all_k: &'a [f32],
    /// Every V row, the same.
    pub all_v: &'a [f32],
    /// The prompt's queries, `[batch * q_heads][prompt][head_dim]` (empty where `--fill` skipped
    /// the prefill).
    pub prompt_q: &'a [f32],
    /// The prefill's outputs, the same layout.
    pub prompt_out: &'a [f32],
    /// Each step's queries, `[batch * q_heads][head_dim]`.
    pub step_q: &'a [Vec<f32>],
    /// Each step's outputs, the same.
    pub step_out: &'a [Vec<f32>],
}

impl Run<'_> {
    /// The largest relative error of the prefill's and the steps' outputs, and the tolerance for
    /// the cache's type (fp16 K/V are rounded, and the matrix kernels round Q and P too).
    pub fn error(&self) -> kpc::Result<(f64, f64)> {
        let shape = self.shape;
        let (d, total, prompt) = (shape.head_dim, self.total, self.prompt);
        let rows_q = shape.batch * shape.q_heads;
        let rows_kv = shape.batch * shape.kv_heads;
        let steps = self.step_q.len();
        let tolerance = match self.dtype {
            KvDtype::F32 => 1e-5,
            KvDtype::F16 => 2e-3,
        };
        let mut worst: f64 = 0.0;
        if !self.prompt_q.is_empty() {
            // The prompt's rows see only the prompt: compare against attention over its prefix.
            let kp = prefix(self.all_k, rows_kv, total, d, prompt);
            let vp = prefix(self.all_v, rows_kv, total, d, prompt);
            let want = attention(shape, self.prompt_q, &kp, &vp, prompt, prompt, true)?;
            worst = worst.max(relative_error(self.prompt_out, &want));
        }
        if steps > 0 {
            // q as [rows_q][steps][d]: the steps are the last `steps` queries of the sequence.
            let mut q = vec![0.0; rows_q * steps * d];
            let mut got = vec![0.0; rows_q * steps * d];
            for (t, (sq, so)) in self.step_q.iter().zip(self.step_out).enumerate() {
                for h in 0..rows_q {
                    q[(h * steps + t) * d..][..d].copy_from_slice(&sq[h * d..][..d]);
                    got[(h * steps + t) * d..][..d].copy_from_slice(&so[h * d..][..d]);
                }
            }
            let want = attention(shape, &q, self.all_k, self.all_v, steps, total, true)?;
            worst = worst.max(relative_error(&got, &want));
        }
        Ok((worst, tolerance))
    }
}
