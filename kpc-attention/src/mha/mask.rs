//! A layer call's attention mask: checked against the layer's `attn_mask` and the call's logits
//! (shared by the heads or one per head), refused where a host mask holds NaN or `+inf`, and
//! uploaded as a device tensor.

use kpc::{Error, Result};

use super::MultiHeadAttention;
use crate::tensor::{Dtype, Tensor};

/// How the attention of a call reads its mask.
#[derive(Clone, Copy)]
pub(super) enum MaskMode {
    None = 0,
    Shared = 1,
    PerHead = 2,
}

impl MultiHeadAttention {
    /// Checks a mask of `mask_len` elements (or none) against the layer's `attn_mask` and the
    /// call's `q_len` x `kv_len` logits.
    pub(super) fn mask_mode(
        &self,
        mask_len: Option<usize>,
        q_len: usize,
        kv_len: usize,
    ) -> Result<MaskMode> {
        match (self.params.attn_mask, mask_len) {
            (false, None) => Ok(MaskMode::None),
            (false, Some(_)) => Err(Error::InvalidArgument(
                "this layer was built without attn_mask; pass no mask, or build it with \
                 attn_mask on"
                    .into(),
            )),
            (true, None) => Err(Error::InvalidArgument(
                "this layer was built with attn_mask: every call takes a mask".into(),
            )),
            (true, Some(len)) => {
                let shared = q_len * kv_len;
                let per_head = self.params.num_heads * shared;
                if len == shared {
                    Ok(MaskMode::Shared)
                } else if len == per_head {
                    Ok(MaskMode::PerHead)
                } else {
                    Err(Error::Size {
                        what: "attention mask".into(),
                        got: format!("{len} elements"),
                        expected: format!(
                            "{shared} ([q_len {q_len}][kv_len {kv_len}], shared by the heads) or \
                             {per_head} ([heads {}][q_len][kv_len])",
                            self.params.num_heads
                        ),
                    })
                }
            }
        }
    }

    /// [`MultiHeadAttention::mask_mode`] for a host mask: also refuses NaN and `+inf`.
    pub(super) fn host_mask_mode(
        &self,
        mask: Option<&[f32]>,
        q_len: usize,
        kv_len: usize,
    ) -> Result<MaskMode> {
        if let (true, Some(m)) = (self.params.attn_mask, mask)
            && let Some(i) = m.iter().position(|x| x.is_nan() || *x == f32::INFINITY)
        {
            return Err(Error::InvalidArgument(format!(
                "attention mask[{i}] is {}; masks take finite values (added to the logits) and \
                 -inf (the key is masked)",
                m[i]
            )));
        }
        self.mask_mode(mask.map(<[f32]>::len), q_len, kv_len)
    }

    /// Checks a device mask: an f32 tensor on the layer's context, `[q_len][kv_len]` or
    /// `[num_heads][q_len][kv_len]`.
    pub(super) fn tensor_mask_mode(
        &self,
        mask: Option<&Tensor>,
        q_len: usize,
        kv_len: usize,
    ) -> Result<MaskMode> {
        let mode = self.mask_mode(mask.map(Tensor::len), q_len, kv_len)?;
        if let Some(m) = mask {
            let shape = match mode {
                MaskMode::PerHead => vec![self.params.num_heads, q_len, kv_len],
                _ => vec![q_len, kv_len],
            };
            m.check("attention mask", &self.ctx, &[Dtype::F32], &shape)?;
        }
        Ok(mode)
    }

    /// A host mask as a device tensor of the shape its mode says.
    pub(super) fn upload_mask(
        &self,
        mask: Option<&[f32]>,
        mode: MaskMode,
        q_len: usize,
        kv_len: usize,
    ) -> Result<Option<Tensor>> {
        let Some(m) = mask else { return Ok(None) };
        let shape = match mode {
            MaskMode::PerHead => vec![self.params.num_heads, q_len, kv_len],
            _ => vec![q_len, kv_len],
        };
        Tensor::from_buffer_f32(self.ctx.buffer_from(m)?, &shape).map(Some)
    }
}
