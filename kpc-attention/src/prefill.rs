//! Prefill: a prompt's K and V appended, then causal attention over it in tiles with an online
//! softmax, fully masked tiles skipped.

use kpc::{Buffer, Event, LaunchDesc, PushConstants};
use kpc::{Error, Result};

use super::{Attention, KvCache, PrefillKernel, check_len};
use crate::launch::Batch;
use crate::lazy::Now;

impl Attention {
    /// Causal attention for `len` new positions: appends `k` and `v` (`[batch][kv_head][len][head_dim]`)
    /// to `cache` after its current [`KvCache::len`] positions, then attends `q`
    /// (`[batch][q_head][len][head_dim]`) over the cache, query `i` seeing every position up to its
    /// own, and writes `out` in `q`'s layout. On an empty cache this is a prompt's prefill; on a
    /// filled one, a chunk of a longer prompt. Tiles that the mask hides entirely are skipped.
    ///
    /// Errors: [`Error::InvalidArgument`] for `len == 0` or a cache of another shape or type;
    /// [`Error::Size`] for slices or buffers of the wrong length, a cache larger than the capacity, or
    /// positions past the cache's capacity (nothing is written or launched then).
    pub fn prefill(
        &self,
        cache: &mut KvCache,
        q: &Buffer<f32>,
        k: &[f32],
        v: &[f32],
        len: usize,
        out: &Buffer<f32>,
    ) -> Result<Event> {
        self.check_cache(cache)?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "prefill needs at least one position".into(),
            ));
        }
        check_len("prefill q", q.len(), self.shape.q_elems() * len)?;
        check_len("prefill out", out.len(), self.shape.q_elems() * len)?;
        let n = self.shape.kv_step_elems() * len;
        check_len("prefill k", k.len(), n)?;
        check_len("prefill v", v.len(), n)?;
        let start = cache.len();
        if start + len > cache.capacity() {
            return Err(Error::Size {
                what: "KV cache prefill".into(),
                got: format!("{len} positions after {start}"),
                expected: format!("at most the capacity {} in all", cache.capacity()),
            });
        }
        cache.write_rows(start, len, k, v)?;
        cache.len = start + len;
        self.prefill_cached(cache, q, len, out)
    }

    /// The attention half of [`Attention::prefill`], for K and V already in the cache: its last
    /// `len` positions are the queries' own (written by [`KvCache::write`], [`KvCache::fill`] or
    /// an earlier prefill), and `q` (`[batch][q_head][len][head_dim]`) attends over the whole
    /// cache, query `i` seeing every position up to its own; `out` is written in `q`'s layout.
    /// Nothing is uploaded, so running it again over the same cache gives the same output.
    ///
    /// Errors: [`Error::InvalidArgument`] for `len == 0`, `len` past the cache's length, or a cache
    /// of another shape or type; [`Error::Size`] for buffers of the wrong length (nothing is
    /// launched then).
    pub fn prefill_cached(
        &self,
        cache: &KvCache,
        q: &Buffer<f32>,
        len: usize,
        out: &Buffer<f32>,
    ) -> Result<Event> {
        let mut batch = Batch::new();
        self.record_prefill_cached(&mut batch, cache, q, len, out)?;
        batch.submit(&self.ctx.queue())
    }

    /// [`Attention::prefill_cached`] recorded into `batch`.
    pub(crate) fn record_prefill_cached(
        &self,
        batch: &mut Batch,
        cache: &KvCache,
        q: &Buffer<f32>,
        len: usize,
        out: &Buffer<f32>,
    ) -> Result<()> {
        self.check_cache(cache)?;
        if len == 0 || len > cache.len() {
            return Err(Error::InvalidArgument(format!(
                "prefill over the cache needs 1 to {} positions (the cache's length); got {len}",
                cache.len()
            )));
        }
        check_len("prefill q", q.len(), self.shape.q_elems() * len)?;
        check_len("prefill out", out.len(), self.shape.q_elems() * len)?;
        let prefill = match self.lazy.as_ref().map(|l| l.prefill(&self.ctx)) {
            None => self.prefill.clone(),
            Some(Now::Generic(g)) => {
                self.record_generic(batch, &g, cache, q, None, out, cache.len(), len);
                return Ok(());
            }
            Some(Now::Specialized(mut k)) => k.remove(0),
        };
        let block_q = match self.prefill_kind {
            PrefillKernel::Cooperative => self.options.coop_rows as usize,
            PrefillKernel::Cm2 => self.options.cm2_rows as usize,
            PrefillKernel::Tiled => 64,
            PrefillKernel::Mma => crate::prefill_mma::mma_prefill_rows(&self.options) as usize,
            _ => self.options.block_q as usize,
        };
        let tiles = len.div_ceil(block_q) as u32;
        let rows = (self.shape.batch * self.shape.q_heads) as u32;
        let push = PushConstants::new()
            .u32(len as u32)
            .u32(cache.len() as u32)
            .u32(cache.capacity() as u32)
            .u32(self.shape.q_heads as u32)
            .u32((self.shape.q_heads / self.shape.kv_heads) as u32)
            .f32(1.0 / (self.shape.head_dim as f32).sqrt());
        // The tiled, both cooperative-matrix and the mma.sync kernels take the query tile from y,
        // last first, so that every head's longest (causal) tiles are dispatched first: with the
        // tile in x, one head's tiles went out longest to shortest before the next head's, and the
        // last heads' long tiles started near the end.
        let groups = match self.prefill_kind {
            PrefillKernel::Tiled
            | PrefillKernel::Cooperative
            | PrefillKernel::Cm2
            | PrefillKernel::Mma => [rows, tiles, 1],
            _ => [tiles, rows, 1],
        };
        let (kb, vb) = cache.buffers();
        batch.add(&[LaunchDesc {
            kernel: &prefill,
            groups,
            buffers: &[q, kb, vb, out],
            push_constants: push.as_bytes(),
        }]);
        Ok(())
    }
}
