//! The cross-attention layer's memory: the encoder's states projected to K and V once
//! (`set_memory`, `set_memory_device`), and the check that later calls have it.

use kpc::{Error, Result};

use super::forward::{ANY, check_finite, seq_len};
use super::proj::Outputs;
use super::{MhaKind, MultiHeadAttention};
use crate::check_len;
use crate::launch::{Batch, Phase};
use crate::tensor::Tensor;

impl MultiHeadAttention {
    /// Cross-attention: projects the encoder's states to K and V once and keeps them as the
    /// memory every later call attends. `keys` is `[batch][len][kdim]`; `values` `[batch][len][vdim]`,
    /// or `None` for the same states as `keys` (needs `kdim == vdim`). The new memory replaces the
    /// old one entirely: only its `len` positions are attended afterwards.
    ///
    /// A thin wrapper over [`MultiHeadAttention::set_memory_device`].
    ///
    /// Errors: [`Error::CallOrder`] on a self-attention layer; [`Error::InvalidArgument`] for
    /// `len == 0`, non-finite states, or `None` values with `kdim != vdim`; [`Error::Size`] for
    /// states of the wrong length or more positions than the capacity. The old memory is kept then.
    pub fn set_memory(&mut self, keys: &[f32], values: Option<&[f32]>, len: usize) -> Result<()> {
        self.check_kind("set_memory", MhaKind::CrossAttention)?;
        let p = self.params;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "set_memory needs at least one position".into(),
            ));
        }
        self.check_memory_len(len)?;
        check_len("memory keys", keys.len(), p.batch * len * p.kdim)?;
        check_finite("memory keys", keys)?;
        if let Some(v) = values {
            check_len("memory values", v.len(), p.batch * len * p.vdim)?;
            check_finite("memory values", v)?;
        } else if p.kdim != p.vdim {
            return Err(Error::InvalidArgument(format!(
                "memory values may be omitted only when kdim ({}) equals vdim ({})",
                p.kdim, p.vdim
            )));
        }
        let kt = Tensor::from_buffer_f32(self.ctx.buffer_from(keys)?, &[p.batch, len, p.kdim])?;
        let vt = match values {
            Some(v) => Some(Tensor::from_buffer_f32(
                self.ctx.buffer_from(v)?,
                &[p.batch, len, p.vdim],
            )?),
            None => None,
        };
        self.set_memory_device(&kt, vt.as_ref())
    }

    fn check_memory_len(&self, len: usize) -> Result<()> {
        if len > self.cache.capacity() {
            return Err(Error::Size {
                what: "cross-attention memory".into(),
                got: format!("{len} positions"),
                expected: format!("at most the capacity {}", self.cache.capacity()),
            });
        }
        Ok(())
    }

    /// [`MultiHeadAttention::set_memory`] on device tensors, submitted as one batch with no host
    /// wait: `keys` `[batch][len][kdim]` and `values` `[batch][len][vdim]` (fp16 or f32; `len` is
    /// the keys' second dimension), or `None` for the keys as values (needs `kdim == vdim`).
    ///
    /// Errors: as [`MultiHeadAttention::set_memory`]; [`Error::InvalidArgument`] for a tensor of
    /// another context; [`Error::Size`] for a tensor of the wrong shape. The old memory is kept
    /// then.
    pub fn set_memory_device(&mut self, keys: &Tensor, values: Option<&Tensor>) -> Result<()> {
        self.check_kind("set_memory", MhaKind::CrossAttention)?;
        let p = self.params;
        let len = seq_len(keys, "memory keys", &self.ctx, p.batch, p.kdim)?;
        self.check_memory_len(len)?;
        let values = match values {
            Some(v) => {
                v.check("memory values", &self.ctx, ANY, &[p.batch, len, p.vdim])?;
                v
            }
            None if p.kdim == p.vdim => keys,
            None => {
                return Err(Error::InvalidArgument(format!(
                    "memory values may be omitted only when kdim ({}) equals vdim ({})",
                    p.kdim, p.vdim
                )));
            }
        };
        let Some((wk, wv)) = &self.weights.kv else {
            return Err(Error::InvalidArgument(
                "a cross-attention layer without K/V weights".into(),
            ));
        };
        let ctx = self.ctx.clone();
        let rows = p.batch * len;
        let n = p.kv_dim();
        let mut batch = Batch::new();
        batch.phase(Phase::Projection);
        let kx = self.input_f32(&mut batch, keys, None)?;
        let vx = self.input_f32(&mut batch, values, None)?;
        let (k, v) = (ctx.buffer(rows * n)?, ctx.buffer(rows * n)?);
        let one_k = Outputs::one(&k, n);
        let one_v = Outputs::one(&v, n);
        self.proj
            .project(&mut batch, &ctx, &kx, rows, wk, &one_k, 0, len, false)?;
        self.proj
            .project(&mut batch, &ctx, &vx, rows, wv, &one_v, 0, len, false)?;
        batch.phase(Phase::Attention);
        self.append_rows(&mut batch, &k, &v, 0, len);
        let event = batch.submit(&ctx.queue())?;
        self.cache.len = len;
        self.memory_set = true;
        self.last = Some((event, batch.phases()));
        Ok(())
    }

    pub(super) fn check_memory(&self, call: &str) -> Result<()> {
        if self.memory_set {
            return Ok(());
        }
        Err(Error::CallOrder {
            call: format!("cross-attention {call}"),
            needs: "set_memory first: the memory (the encoder's states) is not set".into(),
        })
    }
}
