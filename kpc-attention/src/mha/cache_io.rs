//! The self-attention cache in ncnn's layouts, for callers that keep ncnn's cache blobs: export and
//! import, exact both ways (an f16 cache exports its values widened exactly, and they import back
//! to the same bits).

use kpc::{Error, Result};

use super::{MhaKind, MultiHeadAttention};
use crate::{check_len, check_storable};

/// A layout of one cache blob (K or V), per sequence of the batch; blobs of a batch follow one
/// another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheLayout {
    /// ncnn's MultiHeadAttention cache, transposed: `Mat(w = seq_len, h = kv_dim)`, a row per
    /// channel (`kv_head * head_dim + d`) holding its value at every position, so that each head is a
    /// contiguous block of rows. Per sequence `[kv_dim][len]`.
    MhaTransposed,
    /// ncnn's SDPA cache: `Mat(w = head_dim, h = seq_len, c = kv_heads)`. Per sequence
    /// `[kv_heads][len][head_dim]`, which is kpc's own layout without the unused capacity.
    Sdpa,
}

impl MultiHeadAttention {
    /// The self-attention cache's K and V in `layout`, each
    /// `batch * kv_heads * head_dim * len` elements (`len` = [`MultiHeadAttention::len`]).
    ///
    /// Errors: [`Error::CallOrder`] on a cross-attention layer; the buffers' read errors.
    pub fn export_cache(&self, layout: CacheLayout) -> Result<(Vec<f32>, Vec<f32>)> {
        self.check_kind("export_cache", MhaKind::SelfAttention)?;
        let (k, v) = self.cache.read()?;
        let len = self.cache.len();
        Ok(match layout {
            CacheLayout::Sdpa => (k, v),
            CacheLayout::MhaTransposed => {
                (self.transpose(&k, len, true), self.transpose(&v, len, true))
            }
        })
    }

    /// Replaces the self-attention cache with `len` positions given in `layout` (as
    /// [`MultiHeadAttention::export_cache`] returns them); later steps append after them.
    ///
    /// Errors: [`Error::CallOrder`] on a cross-attention layer; [`Error::Size`] for `len` past the
    /// capacity or blobs of the wrong length; [`Error::InvalidArgument`] for a value that is not
    /// finite or, in an fp16 cache ([`MhaParams::cache_dtype`](super::MhaParams)), outside fp16's
    /// range (magnitude 65520 or more, which fp16 would store as infinity; see
    /// [`check_storable`]). The cache is unchanged then.
    pub fn import_cache(
        &mut self,
        layout: CacheLayout,
        k: &[f32],
        v: &[f32],
        len: usize,
    ) -> Result<()> {
        self.check_kind("import_cache", MhaKind::SelfAttention)?;
        if len > self.cache.capacity() {
            return Err(Error::Size {
                what: "imported KV cache".into(),
                got: format!("{len} positions"),
                expected: format!("at most the capacity {}", self.cache.capacity()),
            });
        }
        let n = self.params.shape().kv_step_elems() * len;
        check_len("imported cache k", k.len(), n)?;
        check_len("imported cache v", v.len(), n)?;
        // Checked in the caller's layout, so that the index named is the caller's.
        check_storable("imported cache k", k, self.cache.dtype())?;
        check_storable("imported cache v", v, self.cache.dtype())?;
        match layout {
            CacheLayout::Sdpa => self.cache.fill(k, v, len),
            CacheLayout::MhaTransposed => {
                let (k, v) = (self.transpose(k, len, false), self.transpose(v, len, false));
                self.cache.fill(&k, &v, len)
            }
        }
    }

    /// Between `[batch][kv_head][len][head_dim]` and `[batch][kv_head * head_dim][len]`:
    /// `to_mha` goes from the first to the second.
    fn transpose(&self, x: &[f32], len: usize, to_mha: bool) -> Vec<f32> {
        let p = &self.params;
        let (d, heads) = (p.head_dim(), p.num_kv_heads);
        let mut out = vec![0f32; x.len()];
        for b in 0..p.batch {
            for h in 0..heads {
                for j in 0..len {
                    for e in 0..d {
                        let sdpa = ((b * heads + h) * len + j) * d + e;
                        let mha = (b * heads * d + h * d + e) * len + j;
                        if to_mha {
                            out[mha] = x[sdpa];
                        } else {
                            out[sdpa] = x[mha];
                        }
                    }
                }
            }
        }
        out
    }
}
