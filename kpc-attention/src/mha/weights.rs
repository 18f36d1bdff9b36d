//! The layer's weights: ncnn's order and shapes, size checks naming the wrong one, and their upload
//! (fp32 or fp16, Q/K/V fused into one matrix for self-attention).

use kpc::{Buffer, Context};
use kpc::{Error, Result};

use super::{KvDtype, MhaKind, MhaParams};

/// A layer's weights in ncnn's order: q, k, v, then out, each `[out_features][in_features]`
/// row-major (a row per output feature) and its bias.
///
/// Shapes: `q_weight` `[embed_dim][qdim]`, `k_weight` `[kv_dim][kdim]`, `v_weight` `[kv_dim][vdim]`,
/// `out_weight` `[qdim][embed_dim]`, where `kv_dim = num_kv_heads * head_dim` (`embed_dim` for MHA);
/// the biases are as long as their matrix's rows are many.
#[derive(Debug, Clone, Copy)]
pub struct MhaWeights<'a> {
    /// `[embed_dim][qdim]`.
    pub q_weight: &'a [f32],
    /// `[embed_dim]`.
    pub q_bias: &'a [f32],
    /// `[kv_dim][kdim]`.
    pub k_weight: &'a [f32],
    /// `[kv_dim]`.
    pub k_bias: &'a [f32],
    /// `[kv_dim][vdim]`.
    pub v_weight: &'a [f32],
    /// `[kv_dim]`.
    pub v_bias: &'a [f32],
    /// `[qdim][embed_dim]`.
    pub out_weight: &'a [f32],
    /// `[qdim]`.
    pub out_bias: &'a [f32],
}

/// Names and lengths of the eight arrays, in ncnn's order, for `p`.
pub(crate) fn weight_sizes(p: &MhaParams) -> [(&'static str, usize); 8] {
    let (e, kv) = (p.embed_dim, p.kv_dim());
    [
        ("q_weight", e * p.qdim),
        ("q_bias", e),
        ("k_weight", kv * p.kdim),
        ("k_bias", kv),
        ("v_weight", kv * p.vdim),
        ("v_bias", kv),
        ("out_weight", p.qdim * e),
        ("out_bias", p.qdim),
    ]
}

impl<'a> MhaWeights<'a> {
    /// Splits one array holding the eight in ncnn's order (as a `.bin` file stores them, fp32).
    ///
    /// Errors: [`Error::Size`] when `flat` is not exactly their total length.
    pub fn from_ncnn(flat: &'a [f32], p: &MhaParams) -> Result<MhaWeights<'a>> {
        let sizes = weight_sizes(p);
        let total: usize = sizes.iter().map(|s| s.1).sum();
        if flat.len() != total {
            return Err(Error::Size {
                what: "MultiHeadAttention weights (q, k, v, out, each with its bias)".into(),
                got: format!("{} elements", flat.len()),
                expected: format!(
                    "{total} elements ({})",
                    sizes
                        .iter()
                        .map(|(n, l)| format!("{n} {l}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        let mut parts = [&flat[..0]; 8];
        let mut at = 0;
        for (part, (_, len)) in parts.iter_mut().zip(sizes) {
            *part = &flat[at..at + len];
            at += len;
        }
        let [
            q_weight,
            q_bias,
            k_weight,
            k_bias,
            v_weight,
            v_bias,
            out_weight,
            out_bias,
        ] = parts;
        Ok(MhaWeights {
            q_weight,
            q_bias,
            k_weight,
            k_bias,
            v_weight,
            v_bias,
            out_weight,
            out_bias,
        })
    }

    fn arrays(&self) -> [&'a [f32]; 8] {
        [
            self.q_weight,
            self.q_bias,
            self.k_weight,
            self.k_bias,
            self.v_weight,
            self.v_bias,
            self.out_weight,
            self.out_bias,
        ]
    }

    /// Checks every length against `p`.
    ///
    /// Errors: [`Error::Size`] naming the first array of the wrong length, with the shape it needs;
    /// [`Error::InvalidArgument`] for a value that is not finite (named, with its index).
    pub fn check(&self, p: &MhaParams) -> Result<()> {
        let (e, kv) = (p.embed_dim, p.kv_dim());
        let shapes = [
            format!("[embed_dim {e}][qdim {}]", p.qdim),
            format!("[embed_dim {e}]"),
            format!("[kv_dim {kv}][kdim {}]", p.kdim),
            format!("[kv_dim {kv}]"),
            format!("[kv_dim {kv}][vdim {}]", p.vdim),
            format!("[kv_dim {kv}]"),
            format!("[qdim {}][embed_dim {e}]", p.qdim),
            format!("[qdim {}]", p.qdim),
        ];
        for ((array, (name, len)), shape) in self.arrays().iter().zip(weight_sizes(p)).zip(shapes) {
            if array.len() != len {
                return Err(Error::Size {
                    what: format!("MultiHeadAttention {name}"),
                    got: format!("{} elements", array.len()),
                    expected: format!("{len} elements, {shape}"),
                });
            }
            if let Some(i) = array.iter().position(|x| !x.is_finite()) {
                return Err(Error::InvalidArgument(format!(
                    "MultiHeadAttention {name}[{i}] is {}; weights must be finite",
                    array[i]
                )));
            }
        }
        Ok(())
    }
}

/// One projection's weights on the device: the matrix in its storage type (f32 bits, or f16 pairs
/// packed in words) and its fp32 bias.
pub(super) struct DeviceMatrix {
    pub(super) w: Buffer<u32>,
    pub(super) bias: Buffer<f32>,
    /// Rows (output features).
    pub(super) n: usize,
    /// Row length (input features).
    pub(super) k: usize,
}

impl DeviceMatrix {
    /// Uploads the rows of `parts` (each `[rows][k]` with its bias) stacked into one matrix.
    fn upload(ctx: &Context, dtype: KvDtype, k: usize, parts: &[(&[f32], &[f32])]) -> Result<Self> {
        let rows: Vec<f32> = parts.iter().flat_map(|(w, _)| w.iter().copied()).collect();
        let bias: Vec<f32> = parts.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let words: Vec<u32> = match dtype {
            KvDtype::F32 => rows.iter().map(|x| x.to_bits()).collect(),
            KvDtype::F16 => rows
                .chunks(2)
                .map(|c| {
                    let lo = half::f16::from_f32(c[0]).to_bits() as u32;
                    let hi = c
                        .get(1)
                        .map_or(0, |&x| half::f16::from_f32(x).to_bits() as u32);
                    lo | (hi << 16)
                })
                .collect(),
        };
        Ok(DeviceMatrix {
            w: ctx.buffer_from(&words)?,
            bias: ctx.buffer_from(&bias)?,
            n: bias.len(),
            k,
        })
    }
}

/// The weights on the device. Self-attention stores Q, K and V as one `[embed_dim + 2 kv_dim][qdim]`
/// matrix (one launch projects all three); cross-attention keeps them apart (K and V read the
/// memory, of other widths).
pub(super) struct DeviceWeights {
    /// Self-attention: Q, K, V stacked. Cross-attention: Q alone.
    pub(super) q_or_qkv: DeviceMatrix,
    /// Cross-attention: K and V.
    pub(super) kv: Option<(DeviceMatrix, DeviceMatrix)>,
    pub(super) out: DeviceMatrix,
}

impl DeviceWeights {
    /// Uploads `w` (checked against `p` by the caller) in `p.weight_dtype`.
    pub(super) fn upload(ctx: &Context, p: &MhaParams, w: &MhaWeights<'_>) -> Result<Self> {
        let dt = p.weight_dtype;
        let q = (w.q_weight, w.q_bias);
        let k = (w.k_weight, w.k_bias);
        let v = (w.v_weight, w.v_bias);
        let (q_or_qkv, kv) = match p.kind {
            MhaKind::SelfAttention => (DeviceMatrix::upload(ctx, dt, p.qdim, &[q, k, v])?, None),
            MhaKind::CrossAttention => (
                DeviceMatrix::upload(ctx, dt, p.qdim, &[q])?,
                Some((
                    DeviceMatrix::upload(ctx, dt, p.kdim, &[k])?,
                    DeviceMatrix::upload(ctx, dt, p.vdim, &[v])?,
                )),
            ),
        };
        let out = DeviceMatrix::upload(ctx, dt, p.embed_dim, &[(w.out_weight, w.out_bias)])?;
        Ok(DeviceWeights { q_or_qkv, kv, out })
    }
}
