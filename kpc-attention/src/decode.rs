//! Decode: one step appends a token's K/V row and attends over every position, split across
//! workgroups (flash-decoding) and combined with a log-sum-exp; `attend` does the same without
//! appending.

use kpc::{Buffer, BufferArg, Event, Kernel, LaunchDesc, PushConstants};
use kpc::{Error, Result};

use super::{Attention, KvCache, check_len};
use crate::launch::Batch;
use crate::lazy::Now;

impl Attention {
    /// The split launch's groups and push constants for a decode over `len` positions of `cache`.
    fn split_launch(
        &self,
        len: usize,
        capacity: usize,
        append: bool,
    ) -> ([u32; 3], PushConstants, u32) {
        let s = &self.shape;
        let (per, splits) = self.split_sizes(len, append);
        let splits = splits as u32;
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        match self.vec {
            None => (
                [splits, (s.batch * s.q_heads) as u32, 1],
                PushConstants::new()
                    .u32(len as u32)
                    .u32(capacity as u32)
                    .u32(s.q_heads as u32)
                    .u32((s.q_heads / s.kv_heads) as u32)
                    .f32(scale),
                splits,
            ),
            Some(_) => (
                [
                    splits
                        * if self.options.decode_spread {
                            (s.q_heads / s.kv_heads) as u32
                        } else {
                            1
                        },
                    (s.batch * s.kv_heads) as u32,
                    1,
                ],
                PushConstants::new()
                    .u32(len as u32)
                    .u32(capacity as u32)
                    .u32(s.kv_heads as u32)
                    .u32(per as u32)
                    .f32(scale)
                    .u32(u32::from(append)),
                splits,
            ),
        }
    }

    /// One query per (batch, query head) against every filled position of `cache`, without
    /// appending: `q` and `out` are `[batch][q_head][head_dim]`. Used for cross-attention over a
    /// static K/V set. Returns the event of the batch: one launch on the vectorized path, split and
    /// reduce on the generic one.
    ///
    /// Errors: [`Error::Size`] for `q` or `out` of the wrong length or a cache larger than the
    /// capacity; [`Error::InvalidArgument`] for an empty cache or one of another shape or type.
    pub fn attend(&self, cache: &KvCache, q: &Buffer<f32>, out: &Buffer<f32>) -> Result<Event> {
        self.check_cache(cache)?;
        check_len("q", q.len(), self.shape.q_elems())?;
        check_len("out", out.len(), self.shape.q_elems())?;
        if cache.is_empty() {
            return Err(Error::InvalidArgument(
                "attention over an empty KV cache".into(),
            ));
        }
        let _scratch = self.step.lock();
        let mut batch = Batch::new();
        // The vectorized kernel reads no new row without the append flag; any buffers of the right
        // type fill those bindings.
        self.record_step(&mut batch, cache, q, None, out, cache.len());
        batch.submit(&self.ctx.queue())
    }

    /// One decode step as a single submission: `k_new` and `v_new` (device buffers,
    /// `[batch][kv_head][head_dim]` f32, as a projection leaves them) are written into `cache` at
    /// position [`KvCache::len`], converted to the cache's type, and `q` attends every position
    /// including the new one (causal decode: the query is the newest token), into `out`. On the
    /// vectorized path this is one launch that also combines its splits; on the generic path three
    /// (`attn_append`, `attn_decode`, `attn_reduce`). No host copy and no host wait inside.
    ///
    /// Errors: [`Error::Size`] for buffers of the wrong length or a full cache (nothing is launched
    /// then); [`Error::InvalidArgument`] for a cache of another shape or type.
    pub fn decode(
        &self,
        cache: &mut KvCache,
        q: &Buffer<f32>,
        k_new: &Buffer<f32>,
        v_new: &Buffer<f32>,
        out: &Buffer<f32>,
    ) -> Result<Event> {
        self.check_step(cache, q, out, k_new.len(), v_new.len())?;
        let _scratch = self.step.lock();
        self.append_and_submit(cache, q, k_new, v_new, out)
    }

    /// [`Attention::decode`] recorded into `batch` instead of submitted; the cache counts the new
    /// position at once. The caller has checked the step (`check_step`) and keeps `batch` in the
    /// order of the context's queue (the scratch is shared between this attention's steps, which
    /// the in-order batch keeps apart).
    pub(crate) fn record_decode(
        &self,
        batch: &mut Batch,
        cache: &mut KvCache,
        q: &Buffer<f32>,
        k_new: &Buffer<f32>,
        v_new: &Buffer<f32>,
        out: &Buffer<f32>,
    ) {
        let len = cache.len() + 1;
        self.record_step(batch, cache, q, Some((k_new, v_new)), out, len);
        cache.len = len;
    }

    /// [`Attention::attend`] recorded into `batch`; the caller has checked the arguments and that
    /// the cache is not empty.
    pub(crate) fn record_attend(
        &self,
        batch: &mut Batch,
        cache: &KvCache,
        q: &Buffer<f32>,
        out: &Buffer<f32>,
    ) {
        self.record_step(batch, cache, q, None, out, cache.len());
    }

    /// What a decode step checks before anything is written or launched: the cache (shape, type,
    /// room for one more position) and the lengths of `q`, `out` and the new row.
    pub(super) fn check_step(
        &self,
        cache: &KvCache,
        q: &Buffer<f32>,
        out: &Buffer<f32>,
        k_len: usize,
        v_len: usize,
    ) -> Result<()> {
        self.check_cache(cache)?;
        check_len("q", q.len(), self.shape.q_elems())?;
        check_len("out", out.len(), self.shape.q_elems())?;
        check_len("appended k", k_len, self.shape.kv_step_elems())?;
        check_len("appended v", v_len, self.shape.kv_step_elems())?;
        cache.check_room()
    }

    /// Submits a checked step (see `check_step`); the caller holds `step`.
    pub(super) fn append_and_submit(
        &self,
        cache: &mut KvCache,
        q: &Buffer<f32>,
        k_new: &Buffer<f32>,
        v_new: &Buffer<f32>,
        out: &Buffer<f32>,
    ) -> Result<Event> {
        let mut batch = Batch::new();
        let len = cache.len() + 1;
        self.record_step(&mut batch, cache, q, Some((k_new, v_new)), out, len);
        let event = batch.submit(&self.ctx.queue())?;
        cache.len = len;
        Ok(event)
    }

    /// Records attention of `q` over the first `len` positions of `cache`; with `new`, position
    /// `len - 1` is first written from it. The caller holds `step` (or orders the batch) and has
    /// checked the arguments.
    pub(super) fn record_step(
        &self,
        batch: &mut Batch,
        cache: &KvCache,
        q: &Buffer<f32>,
        new: Option<(&Buffer<f32>, &Buffer<f32>)>,
        out: &Buffer<f32>,
        len: usize,
    ) {
        let lazy = self.lazy.as_ref().map(|l| l.decode(&self.ctx));
        let (decode, append, reduce) = match &lazy {
            None => (&self.decode, self.append.as_ref(), self.reduce.as_ref()),
            Some(Now::Generic(g)) => {
                self.record_generic(batch, g, cache, q, new, out, len, 1);
                return;
            }
            // In request order: the decode, then the split path's reduce and append.
            Some(Now::Specialized(k)) => (&k[0], k.get(2), k.get(1)),
        };
        let (groups, split_push, splits) = self.split_launch(len, cache.capacity(), new.is_some());
        let (k, v) = cache.buffers();
        let (Some(append), Some(reduce)) = (append, reduce) else {
            let (nk, nv) = new.unwrap_or((&self.new_k, &self.new_v));
            let args: [&dyn BufferArg; 9] = [
                q,
                k,
                v,
                &self.part_o,
                &self.part_ml,
                nk,
                nv,
                &self.done,
                out,
            ];
            batch.add(&[LaunchDesc {
                kernel: decode,
                groups,
                buffers: &args,
                push_constants: split_push.as_bytes(),
            }]);
            return;
        };
        let reduce_push = PushConstants::new().u32(splits);
        let decode_args: [&dyn BufferArg; 5] = [q, k, v, &self.part_o, &self.part_ml];
        let reduce_args: [&dyn BufferArg; 3] = [&self.part_o, &self.part_ml, out];
        let split = LaunchDesc {
            kernel: decode,
            groups,
            buffers: &decode_args,
            push_constants: split_push.as_bytes(),
        };
        let combine = LaunchDesc {
            kernel: reduce,
            groups: [(self.shape.batch * self.shape.q_heads) as u32, 1, 1],
            buffers: &reduce_args,
            push_constants: reduce_push.as_bytes(),
        };
        let Some((k_new, v_new)) = new else {
            batch.add(&[split, combine]);
            return;
        };
        let pos = len - 1;
        let pairs = self.shape.kv_step_elems() / 2;
        let append_groups = (pairs.div_ceil(self.options.local_size as usize) as u32)
            .clamp(1, self.ctx.device().limits.max_workgroup_count[0].max(1));
        let append_push = PushConstants::new()
            .u32(pos as u32)
            .u32(1)
            .u32(cache.capacity() as u32)
            .u32(pairs as u32);
        let append_args: [&dyn BufferArg; 4] = [k_new, v_new, k, v];
        batch.add(&[
            LaunchDesc {
                kernel: append,
                groups: [append_groups, 1, 1],
                buffers: &append_args,
                push_constants: append_push.as_bytes(),
            },
            split,
            combine,
        ]);
    }

    /// Records `attn_generic` (see lazy.rs and its source) for `rows` query rows of `q` over the
    /// first `len` positions of `cache`, the rows being its last ones; with `new` (a decode step,
    /// one row), position `len - 1` is read from it and written to the cache.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_generic(
        &self,
        batch: &mut Batch,
        generic: &Kernel,
        cache: &KvCache,
        q: &Buffer<f32>,
        new: Option<(&Buffer<f32>, &Buffer<f32>)>,
        out: &Buffer<f32>,
        len: usize,
        rows: usize,
    ) {
        let s = &self.shape;
        let (k, v) = cache.buffers();
        let (nk, nv) = new.unwrap_or((&self.new_k, &self.new_v));
        let push = PushConstants::new()
            .u32(len as u32)
            .u32(rows as u32)
            .u32(cache.capacity() as u32)
            .u32(s.q_heads as u32)
            .u32((s.q_heads / s.kv_heads) as u32)
            .u32(s.head_dim as u32)
            .u32(u32::from(self.dtype == crate::KvDtype::F16))
            .u32(u32::from(new.is_some()))
            .f32(1.0 / (s.head_dim as f32).sqrt());
        let args: [&dyn BufferArg; 6] = [q, k, v, out, nk, nv];
        batch.add(&[LaunchDesc {
            kernel: generic,
            groups: [rows as u32, (s.batch * s.q_heads) as u32, 1],
            buffers: &args,
            push_constants: push.as_bytes(),
        }]);
    }

    /// [`Attention::decode`] with the new position's K and V given on the host
    /// (`[batch][kv_head][head_dim]`): they are uploaded to the attention's own staging buffers
    /// first (two host copies), then the step is submitted as one batch.
    ///
    /// Errors: as [`Attention::decode`], [`Error::Size`] for slices of the wrong length, and
    /// [`Error::InvalidArgument`] for a value the cache cannot hold (see
    /// [`check_storable`](crate::check_storable)); nothing is written or launched then. The
    /// buffers' write errors.
    pub fn decode_step(
        &self,
        cache: &mut KvCache,
        q: &Buffer<f32>,
        k_new: &[f32],
        v_new: &[f32],
        out: &Buffer<f32>,
    ) -> Result<Event> {
        self.check_step(cache, q, out, k_new.len(), v_new.len())?;
        crate::check_storable("decode step k", k_new, cache.dtype())?;
        crate::check_storable("decode step v", v_new, cache.dtype())?;
        // Held across the upload and the submission, so that another thread's step cannot
        // overwrite the staged row before this step's append has read it.
        let _scratch = self.step.lock();
        self.new_k.write(k_new)?;
        self.new_v.write(v_new)?;
        self.append_and_submit(cache, q, &self.new_k, &self.new_v, out)
    }
}
