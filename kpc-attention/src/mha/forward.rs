//! The layer's calls: prefill and decode steps (self-attention, and cross-attention over its
//! memory), and setting the memory. Each call records its launches into one batch: the device calls
//! on [`Tensor`]s submit it and return, the host-slice calls wrap them (upload, submit, read back).

use std::time::Duration;

use kpc::{Buffer, BufferArg, Event, LaunchDesc, PushConstants};
use kpc::{Error, Result};

use super::mask::MaskMode;
use super::proj::{Half, Outputs};
use super::{MhaKind, MultiHeadAttention};
use crate::check_len;
use crate::launch::{Batch, Phase};
use crate::tensor::{Dtype, Tensor};

/// Device time of one layer call, by phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MhaTimes {
    /// The projections (input and output), with any conversion between fp16 and f32 activations.
    pub projection: Duration,
    /// The K/V append and the attention.
    pub attention: Duration,
}

/// The submission of a call: its event and each launch's phase.
pub(crate) type MhaRun = Option<(Event, Vec<Phase>)>;

pub(super) fn times(run: &MhaRun) -> Result<Option<MhaTimes>> {
    let mut t = MhaTimes::default();
    let Some((event, phases)) = run else {
        return Ok(Some(t));
    };
    let Some(each) = event.launch_times()? else {
        return Ok(None);
    };
    for (phase, d) in phases.iter().zip(each) {
        match phase {
            Phase::Projection => t.projection += d,
            Phase::Attention => t.attention += d,
        }
    }
    Ok(Some(t))
}

/// Both activation types the device calls take.
pub(super) const ANY: &[Dtype] = &[Dtype::F16, Dtype::F32];

impl MultiHeadAttention {
    /// Self-attention over a prompt, or cross-attention of `len` queries over the memory.
    ///
    /// `x` is `[batch][len][qdim]`; the output is `[batch][len][qdim]`. Self-attention projects Q,
    /// K and V, appends K/V to the cache after its current positions (a first prefill, or the next
    /// chunk of a long prompt; with caching off they replace the cache's positions) and attends
    /// causally (unless [`MhaParams::causal`](super::MhaParams) is off). Cross-attention projects Q
    /// and attends the memory. `mask` (layers built with `attn_mask` only) is added to the logits:
    /// `[len][kv_len]` or `[num_heads][len][kv_len]`, where `kv_len` is the cache's length after the
    /// append (self) or the memory's (cross); see [`MhaParams::attn_mask`](super::MhaParams) for
    /// what its values mean, fully masked rows included.
    ///
    /// A thin wrapper over [`MultiHeadAttention::prefill_device`]: `x` and the mask are uploaded,
    /// the output read back.
    ///
    /// Errors: [`Error::InvalidArgument`] for `len == 0`, non-finite input, a mask against the
    /// layer's `attn_mask`, or NaN or `+inf` in the mask; [`Error::Size`] for `x` or the mask of the
    /// wrong length or positions past the capacity; [`Error::CallOrder`] for cross-attention before
    /// [`MultiHeadAttention::set_memory`]. Every check comes before any change: nothing is written,
    /// launched or forgotten then (the cache keeps its positions, with caching on or off).
    pub fn prefill(&mut self, x: &[f32], len: usize, mask: Option<&[f32]>) -> Result<Vec<f32>> {
        let p = self.params;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "prefill needs at least one position".into(),
            ));
        }
        check_len("prefill input x", x.len(), p.batch * len * p.qdim)?;
        check_finite("prefill input x", x)?;
        let kv_len = self.prefill_kv_len(len)?;
        let mode = self.host_mask_mode(mask, len, kv_len)?;
        let shape = [p.batch, len, p.qdim];
        let xt = Tensor::from_buffer_f32(self.ctx.buffer_from(x)?, &shape)?;
        let mut out = Tensor::new(&self.ctx, &shape, Dtype::F32)?;
        let mt = self.upload_mask(mask, mode, len, kv_len)?;
        self.prefill_device(&xt, &mut out, mt.as_ref())?;
        out.read_f32()
    }

    /// The positions a prefill of `len` attends, after its checks of the layer's state: the memory
    /// is set (cross), the positions fit the capacity.
    fn prefill_kv_len(&self, len: usize) -> Result<usize> {
        let p = &self.params;
        let cross = p.kind == MhaKind::CrossAttention;
        if cross {
            self.check_memory("prefill")?;
            return Ok(self.cache.len());
        }
        let start = if p.kv_cache { self.cache.len() } else { 0 };
        if start + len > self.cache.capacity() {
            return Err(Error::Size {
                what: "KV cache prefill".into(),
                got: format!("{len} positions after {start}"),
                expected: format!("at most the capacity {} in all", self.cache.capacity()),
            });
        }
        Ok(start + len)
    }

    /// [`MultiHeadAttention::prefill`] on device tensors, submitted as one batch with no host wait:
    /// `x` is `[batch][len][qdim]` (fp16 or f32; `len` is its second dimension), `out` the same
    /// shape (fp16 or f32, written), `mask` an f32 tensor `[len][kv_len]` or
    /// `[num_heads][len][kv_len]`. A read of `out` waits for the batch.
    ///
    /// The device's values are not inspected (that would need a host wait): a NaN in `x` or the
    /// mask gives NaN outputs, where the host call refuses it.
    ///
    /// Errors: [`Error::InvalidArgument`] for a tensor of another context or of an unaccepted type
    /// (the mask is f32), a mask against the layer's `attn_mask`; [`Error::Size`] for a tensor of
    /// the wrong shape or positions past the capacity; [`Error::CallOrder`] as
    /// [`MultiHeadAttention::prefill`]. Nothing is written, launched or forgotten then.
    pub fn prefill_device(
        &mut self,
        x: &Tensor,
        out: &mut Tensor,
        mask: Option<&Tensor>,
    ) -> Result<()> {
        let p = self.params;
        let len = seq_len(x, "prefill input x", &self.ctx, p.batch, p.qdim)?;
        out.check("prefill output", &self.ctx, ANY, &[p.batch, len, p.qdim])?;
        let kv_len = self.prefill_kv_len(len)?;
        let mode = self.tensor_mask_mode(mask, len, kv_len)?;
        let mut batch = Batch::new();
        let saved = self.cache.len;
        let run = self
            .record_prefill(&mut batch, x, out, mask, mode, len, kv_len)
            .and_then(|()| batch.submit(&self.ctx.queue()));
        match run {
            Ok(event) => {
                self.last = Some((event, batch.phases()));
                Ok(())
            }
            Err(e) => {
                self.cache.len = saved;
                Err(e)
            }
        }
    }

    /// Records a checked prefill.
    #[allow(clippy::too_many_arguments)]
    fn record_prefill(
        &mut self,
        batch: &mut Batch,
        x: &Tensor,
        out: &Tensor,
        mask: Option<&Tensor>,
        mode: MaskMode,
        len: usize,
        kv_len: usize,
    ) -> Result<()> {
        let p = self.params;
        let (d, hq, hkv) = (p.head_dim(), p.num_heads, p.num_kv_heads);
        let rows = p.batch * len;
        let cross = p.kind == MhaKind::CrossAttention;
        let ctx = self.ctx.clone();
        batch.phase(Phase::Projection);
        let xb = self.input_f32(batch, x, None)?;
        let q = ctx.buffer(rows * hq * d)?;
        let o = ctx.buffer(rows * hq * d)?;
        let y = match out.as_f32() {
            Some(y) => y.clone(),
            None => ctx.buffer(rows * p.qdim)?,
        };
        let w = &self.weights.q_or_qkv;
        if cross {
            let outs = Outputs {
                alpha0: self.alpha,
                ..Outputs::one(&q, hq * d)
            };
            self.proj
                .project(batch, &ctx, &xb, rows, w, &outs, 0, len, false)?;
        } else {
            let k = ctx.buffer(rows * hkv * d)?;
            let v = ctx.buffer(rows * hkv * d)?;
            let outs = Outputs {
                bufs: [&q, &k, &v],
                n0: hq * d,
                n1: hkv * d,
                alpha0: self.alpha,
            };
            self.proj
                .project(batch, &ctx, &xb, rows, w, &outs, 0, len, false)?;
            // With caching off the prompt stands alone: it is written from position 0.
            let start = kv_len - len;
            batch.phase(Phase::Attention);
            self.append_rows(batch, &k, &v, start, len);
            self.cache.len = kv_len;
        }
        batch.phase(Phase::Attention);
        let causal = !cross && p.causal;
        match (mode, causal) {
            (MaskMode::None, true) => {
                self.attn
                    .record_prefill_cached(batch, &self.cache, &q, len, &o)?
            }
            _ => self.masked_attention(batch, &q, &o, len, kv_len, causal, mode, mask),
        }
        batch.phase(Phase::Projection);
        self.proj.project(
            batch,
            &ctx,
            &o,
            rows,
            &self.weights.out,
            &Outputs::one(&y, p.qdim),
            len,
            0,
            false,
        )?;
        self.output_from_f32(batch, &y, out);
        Ok(())
    }

    /// `x` as an f32 buffer: itself, or converted on the device into `staging` (or a new buffer).
    pub(super) fn input_f32(
        &self,
        batch: &mut Batch,
        x: &Tensor,
        staging: Option<&Buffer<f32>>,
    ) -> Result<Buffer<f32>> {
        if let Some(b) = x.as_f32() {
            return Ok(b.clone());
        }
        let dst = match staging {
            Some(s) => s.clone(),
            None => self.ctx.buffer(x.len())?,
        };
        self.record_cast(batch, x.buffer(), &dst, x.len(), false);
        Ok(dst)
    }

    /// Converts `y` into `out` where `out` is fp16 (an f32 `out` is `y` itself).
    fn output_from_f32(&self, batch: &mut Batch, y: &Buffer<f32>, out: &Tensor) {
        if out.dtype() == Dtype::F16 {
            batch.phase(Phase::Projection);
            self.record_cast(batch, y, out.buffer(), out.len(), true);
        }
    }

    /// `mha_cast` of `n` elements (even) from `src` to `dst`.
    fn record_cast(
        &self,
        batch: &mut Batch,
        src: &dyn BufferArg,
        dst: &dyn BufferArg,
        n: usize,
        to_f16: bool,
    ) {
        let pairs = n / 2;
        let groups = (pairs.div_ceil(256) as u32)
            .clamp(1, self.ctx.device().limits.max_workgroup_count[0].max(1));
        let kernel = if to_f16 {
            &self.cast_to_f16
        } else {
            &self.cast_to_f32
        };
        let push = PushConstants::new().u32(pairs as u32);
        batch.add(&[LaunchDesc {
            kernel,
            groups: [groups, 1, 1],
            buffers: &[src, dst],
            push_constants: push.as_bytes(),
        }]);
    }

    /// One decode step: `x` is `[batch][qdim]` (one token per sequence), the output `[batch][qdim]`.
    ///
    /// Self-attention projects Q, K and V (one launch), appends K/V at the cache's next position in
    /// place, and attends every position; cross-attention projects Q and attends the memory set by
    /// [`MultiHeadAttention::set_memory`], re-projecting nothing. `mask` (layers built with
    /// `attn_mask` only) is `[1][kv_len]` or `[num_heads][1][kv_len]`, `kv_len` the positions
    /// attended (the cache's length after the append, or the memory's); its values mean what
    /// [`MhaParams::attn_mask`](super::MhaParams) says.
    ///
    /// A thin wrapper over [`MultiHeadAttention::step_device`] on the layer's staging tensors.
    ///
    /// Errors: [`Error::CallOrder`] for a self-attention step with caching off or a
    /// cross-attention step before its memory is set; [`Error::Size`] for `x` or the mask of the
    /// wrong length or a full cache; [`Error::InvalidArgument`] for non-finite input, a mask
    /// against the layer's `attn_mask`, or NaN or `+inf` in the mask. Nothing is written or
    /// launched then.
    pub fn step(&mut self, x: &[f32], mask: Option<&[f32]>) -> Result<Vec<f32>> {
        let p = self.params;
        check_len("step input x", x.len(), p.batch * p.qdim)?;
        check_finite("step input x", x)?;
        let kv_len = self.step_kv_len()?;
        let mode = self.host_mask_mode(mask, 1, kv_len)?;
        self.step_x.write(x)?;
        let shape = [p.batch, p.qdim];
        let xt = Tensor::from_buffer_f32(self.step_x.clone(), &shape)?;
        let mut yt = Tensor::from_buffer_f32(self.step_y.clone(), &shape)?;
        let mt = self.upload_mask(mask, mode, 1, kv_len)?;
        self.step_device(&xt, &mut yt, mt.as_ref())?;
        yt.read_f32()
    }

    /// The positions a step attends, after the checks of the layer's state.
    fn step_kv_len(&self) -> Result<usize> {
        let p = &self.params;
        match p.kind {
            MhaKind::SelfAttention => {
                if !p.kv_cache {
                    return Err(Error::CallOrder {
                        call: "step".into(),
                        needs: "a decode step needs kv_cache on; with it off every call is a \
                                prefill"
                            .into(),
                    });
                }
                self.cache.check_room()?;
                Ok(self.cache.len() + 1)
            }
            MhaKind::CrossAttention => {
                self.check_memory("step")?;
                Ok(self.cache.len())
            }
        }
    }

    /// Everything a device step checks before anything changes; returns the mask's mode.
    pub(crate) fn check_step_device(
        &self,
        x: &Tensor,
        out: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<()> {
        let p = &self.params;
        let shape = [p.batch, p.qdim];
        x.check("step input x", &self.ctx, ANY, &shape)?;
        out.check("step output", &self.ctx, ANY, &shape)?;
        let kv_len = self.step_kv_len()?;
        self.tensor_mask_mode(mask, 1, kv_len).map(|_| ())
    }

    /// [`MultiHeadAttention::step`] on device tensors, submitted as one batch with no host copy and
    /// no host wait: `x` `[batch][qdim]` in (fp16 or f32), `out` `[batch][qdim]` written (fp16 or
    /// f32), `mask` an f32 tensor `[1][kv_len]` or `[num_heads][1][kv_len]`. A read of `out` waits
    /// for the batch; [`MultiHeadAttention::last_times`] splits its device time.
    ///
    /// The device's values are not inspected (that would need a host wait): a NaN in `x` or the
    /// mask gives NaN outputs, where the host call refuses it.
    ///
    /// Errors: as [`MultiHeadAttention::step`]; [`Error::InvalidArgument`] for a tensor of another
    /// context or of an unaccepted type (the mask is f32); [`Error::Size`] for a tensor of the
    /// wrong shape. Nothing is written or launched then.
    pub fn step_device(
        &mut self,
        x: &Tensor,
        out: &mut Tensor,
        mask: Option<&Tensor>,
    ) -> Result<()> {
        self.check_step_device(x, out, mask)?;
        let mut batch = Batch::new();
        let saved = self.cache.len;
        let run = self
            .record_step(&mut batch, x, out, mask)
            .and_then(|()| batch.submit(&self.ctx.queue()));
        match run {
            Ok(event) => {
                self.last = Some((event, batch.phases()));
                Ok(())
            }
            Err(e) => {
                self.cache.len = saved;
                Err(e)
            }
        }
    }

    /// The cache's length, to restore when a recorded batch is not submitted.
    pub(crate) fn saved_len(&self) -> usize {
        self.cache.len
    }

    /// Restores the cache's length saved before a recording that was not submitted.
    pub(crate) fn restore_len(&mut self, len: usize) {
        self.cache.len = len;
    }

    /// Records a step checked by [`MultiHeadAttention::check_step_device`] into `batch`; the cache
    /// counts the new position at once.
    pub(crate) fn record_step(
        &mut self,
        batch: &mut Batch,
        x: &Tensor,
        out: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<()> {
        let p = self.params;
        let ctx = self.ctx.clone();
        let (hq, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim());
        let cross = p.kind == MhaKind::CrossAttention;
        batch.phase(Phase::Projection);
        let outs = Outputs {
            bufs: [&self.step_q, &self.step_k, &self.step_v],
            n0: hq * d,
            n1: if cross { 0 } else { hkv * d },
            alpha0: self.alpha,
        };
        let w = &self.weights.q_or_qkv;
        match x.as_f16() {
            // fp16 input read as it is by the matrix-vector projection.
            Some(xh) if self.proj.has_half(Half::Input) => self.proj.project_half(
                batch,
                &ctx,
                Half::Input,
                xh,
                p.batch,
                w,
                [outs.bufs[0], outs.bufs[1], outs.bufs[2]],
                (outs.n0, outs.n1, outs.alpha0),
            )?,
            _ => {
                let step_x = self.step_x.clone();
                let xb = self.input_f32(batch, x, Some(&step_x))?;
                self.proj
                    .project(batch, &ctx, &xb, p.batch, w, &outs, 0, 0, true)?;
            }
        }
        let kv_len = if cross {
            self.cache.len()
        } else {
            self.cache.len() + 1
        };
        let mode = self.mask_mode(mask.map(Tensor::len), 1, kv_len)?;
        let (q, o) = (self.step_q.clone(), self.step_o.clone());
        batch.phase(Phase::Attention);
        match (mode, cross) {
            (MaskMode::None, true) => self.attn.record_attend(batch, &self.cache, &q, &o),
            (MaskMode::None, false) => {
                let (k, v) = (self.step_k.clone(), self.step_v.clone());
                self.attn
                    .record_decode(batch, &mut self.cache, &q, &k, &v, &o)
            }
            (_, true) => self.masked_attention(batch, &q, &o, 1, kv_len, false, mode, mask),
            (_, false) => {
                let (k, v) = (self.step_k.clone(), self.step_v.clone());
                let start = self.cache.len();
                self.append_rows(batch, &k, &v, start, 1);
                self.cache.len = kv_len;
                self.masked_attention(batch, &q, &o, 1, kv_len, false, mode, mask);
            }
        }
        batch.phase(Phase::Projection);
        if let Some(oh) = out.as_f16()
            && self.proj.has_half(Half::Output)
        {
            // fp16 output written as it is by the matrix-vector projection.
            return self.proj.project_half(
                batch,
                &ctx,
                Half::Output,
                &o,
                p.batch,
                &self.weights.out,
                [oh, oh, oh],
                (p.qdim, 0, 1.0),
            );
        }
        let y = match out.as_f32() {
            Some(y) => y.clone(),
            None => self.step_y.clone(),
        };
        self.proj.project(
            batch,
            &ctx,
            &o,
            p.batch,
            &self.weights.out,
            &Outputs::one(&y, p.qdim),
            0,
            0,
            true,
        )?;
        self.output_from_f32(batch, &y, out);
        Ok(())
    }

    /// Records writing `rows` positions of K and V (`[batch][kv_head][rows][head_dim]`) into the
    /// cache at `pos`, converting to its type.
    pub(super) fn append_rows(
        &self,
        batch: &mut Batch,
        k: &Buffer<f32>,
        v: &Buffer<f32>,
        pos: usize,
        rows: usize,
    ) {
        let shape = self.params.shape();
        let pairs = shape.kv_step_elems() * rows / 2;
        let groups = (pairs.div_ceil(64) as u32)
            .clamp(1, self.ctx.device().limits.max_workgroup_count[0].max(1));
        let push = PushConstants::new()
            .u32(pos as u32)
            .u32(rows as u32)
            .u32(self.cache.capacity() as u32)
            .u32(pairs as u32);
        let (kc, vc) = self.cache.buffers();
        let args: [&dyn BufferArg; 4] = [k, v, kc, vc];
        batch.add(&[LaunchDesc {
            kernel: &self.append,
            groups: [groups, 1, 1],
            buffers: &args,
            push_constants: push.as_bytes(),
        }]);
    }

    /// Records `mha_attn`: `q` (`[batch][q_head][q_len][head_dim]`) over the cache's first `kv_len`
    /// positions, with the mask, into `o`.
    #[allow(clippy::too_many_arguments)]
    fn masked_attention(
        &self,
        batch: &mut Batch,
        q: &Buffer<f32>,
        o: &Buffer<f32>,
        q_len: usize,
        kv_len: usize,
        causal: bool,
        mode: MaskMode,
        mask: Option<&Tensor>,
    ) {
        let p = &self.params;
        let push = PushConstants::new()
            .u32(q_len as u32)
            .u32(kv_len as u32)
            .u32(self.cache.capacity() as u32)
            .u32(p.num_heads as u32)
            .u32((p.num_heads / p.num_kv_heads) as u32)
            .f32(1.0 / (p.head_dim() as f32).sqrt())
            .u32(u32::from(causal))
            .u32(mode as u32);
        let (kc, vc) = self.cache.buffers();
        let m: &dyn BufferArg = match mask.and_then(Tensor::as_f32) {
            Some(m) => m,
            None => &self.no_mask,
        };
        let args: [&dyn BufferArg; 5] = [q, kc, vc, m, o];
        batch.add(&[LaunchDesc {
            kernel: &self.masked,
            groups: [q_len as u32, (p.batch * p.num_heads) as u32, 1],
            buffers: &args,
            push_constants: push.as_bytes(),
        }]);
    }
}

/// The sequence length of `x`, `[batch][len][width]` of an accepted type on `ctx`.
pub(super) fn seq_len(
    x: &Tensor,
    what: &str,
    ctx: &kpc::Context,
    batch: usize,
    width: usize,
) -> Result<usize> {
    match x.shape() {
        &[b, len, w] if b == batch && w == width => {
            x.check(what, ctx, ANY, &[batch, len, width])?;
            Ok(len)
        }
        other => Err(Error::Size {
            what: what.into(),
            got: format!("shape {other:?}"),
            expected: format!("shape [batch {batch}, len, {width}]"),
        }),
    }
}

pub(super) fn check_finite(what: &str, x: &[f32]) -> Result<()> {
    match x.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::InvalidArgument(format!(
            "{what}[{i}] is {}; inputs must be finite",
            x[i]
        ))),
    }
}
