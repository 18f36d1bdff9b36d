//! The layer's calls: prefill and decode steps (self-attention, and cross-attention over its
//! memory), and setting the memory.

use std::time::Duration;

use kpc::{Buffer, BufferArg, Event, LaunchDesc, PushConstants};
use kpc::{Error, Result};

use super::proj::Outputs;
use super::{MhaKind, MultiHeadAttention};
use crate::check_len;

/// What a launch of a layer call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MhaPhase {
    /// A Q/K/V or output projection.
    Projection,
    /// Appending K/V and attending.
    Attention,
}

/// Device time of one layer call, by phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MhaTimes {
    /// The projections (input and output).
    pub projection: Duration,
    /// The K/V append and the attention.
    pub attention: Duration,
}

/// The submissions of one layer call, each with its phase.
pub(crate) type MhaRun = Vec<(MhaPhase, Event)>;

pub(super) fn times(run: &MhaRun) -> Result<Option<MhaTimes>> {
    let mut t = MhaTimes::default();
    for (phase, event) in run {
        let Some(d) = event.device_time()? else {
            return Ok(None);
        };
        match phase {
            MhaPhase::Projection => t.projection += d,
            MhaPhase::Attention => t.attention += d,
        }
    }
    Ok(Some(t))
}

/// How the attention of a call reads its mask.
#[derive(Clone, Copy)]
enum MaskMode {
    None = 0,
    Shared = 1,
    PerHead = 2,
}

impl MultiHeadAttention {
    /// Checks `mask` against the layer's `attn_mask` and the call's `q_len` x `kv_len` logits.
    fn mask_mode(&self, mask: Option<&[f32]>, q_len: usize, kv_len: usize) -> Result<MaskMode> {
        match (self.params.attn_mask, mask) {
            (false, None) => Ok(MaskMode::None),
            (false, Some(_)) => Err(Error::InvalidArgument(
                "this layer was built without attn_mask; pass no mask, or build it with \
                 attn_mask on"
                    .into(),
            )),
            (true, None) => Err(Error::InvalidArgument(
                "this layer was built with attn_mask: every call takes a mask".into(),
            )),
            (true, Some(m)) => {
                if let Some(i) = m.iter().position(|x| x.is_nan() || *x == f32::INFINITY) {
                    return Err(Error::InvalidArgument(format!(
                        "attention mask[{i}] is {}; masks take finite values (added to the \
                         logits) and -inf (the key is masked)",
                        m[i]
                    )));
                }
                let shared = q_len * kv_len;
                let per_head = self.params.num_heads * shared;
                if m.len() == shared {
                    Ok(MaskMode::Shared)
                } else if m.len() == per_head {
                    Ok(MaskMode::PerHead)
                } else {
                    Err(Error::Size {
                        what: "attention mask".into(),
                        got: format!("{} elements", m.len()),
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
        let (d, hq, hkv) = (p.head_dim(), p.num_heads, p.num_kv_heads);
        let rows = p.batch * len;
        let cross = p.kind == MhaKind::CrossAttention;
        if cross {
            self.check_memory("prefill")?;
        }
        // With caching off the prompt stands alone: it is written from position 0 and the cache's
        // length set to it once the launches are under way, so a refused call keeps the old
        // positions.
        let start = if cross || !p.kv_cache {
            0
        } else {
            self.cache.len()
        };
        let kv_len = if cross { self.cache.len() } else { start + len };
        if kv_len > self.cache.capacity() {
            return Err(Error::Size {
                what: "KV cache prefill".into(),
                got: format!("{len} positions after {start}"),
                expected: format!("at most the capacity {} in all", self.cache.capacity()),
            });
        }
        let mode = self.mask_mode(mask, len, kv_len)?;
        let ctx = self.ctx.clone();
        let xb = ctx.buffer_from(x)?;
        let q = ctx.buffer(rows * hq * d)?;
        let o = ctx.buffer(rows * hq * d)?;
        let y = ctx.buffer(rows * p.qdim)?;
        let mut run = MhaRun::new();
        if cross {
            let outs = Outputs {
                alpha0: self.alpha,
                ..Outputs::one(&q, hq * d)
            };
            let w = &self.weights.q_or_qkv;
            run.push((
                MhaPhase::Projection,
                self.proj
                    .project(&ctx, &xb, rows, w, &outs, 0, len, false)?,
            ));
        } else {
            let k = ctx.buffer(rows * hkv * d)?;
            let v = ctx.buffer(rows * hkv * d)?;
            let outs = Outputs {
                bufs: [&q, &k, &v],
                n0: hq * d,
                n1: hkv * d,
                alpha0: self.alpha,
            };
            let w = &self.weights.q_or_qkv;
            run.push((
                MhaPhase::Projection,
                self.proj
                    .project(&ctx, &xb, rows, w, &outs, 0, len, false)?,
            ));
            run.push((MhaPhase::Attention, self.append_rows(&k, &v, start, len)?));
            self.cache.len = kv_len;
        }
        let causal = !cross && p.causal;
        let event = match (mode, causal) {
            (MaskMode::None, true) => self.attn.prefill_cached(&self.cache, &q, len, &o)?,
            _ => self.masked_attention(&q, &o, len, kv_len, causal, mode, mask)?,
        };
        run.push((MhaPhase::Attention, event));
        run.push((
            MhaPhase::Projection,
            self.proj.project(
                &ctx,
                &o,
                rows,
                &self.weights.out,
                &Outputs::one(&y, p.qdim),
                len,
                0,
                false,
            )?,
        ));
        let out = y.read()?;
        self.last = run;
        Ok(out)
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
    /// Errors: [`Error::CallOrder`] for a self-attention step with caching off or a
    /// cross-attention step before its memory is set; [`Error::Size`] for `x` or the mask of the
    /// wrong length or a full cache; [`Error::InvalidArgument`] for non-finite input, a mask
    /// against the layer's `attn_mask`, or NaN or `+inf` in the mask. Nothing is written or
    /// launched then.
    pub fn step(&mut self, x: &[f32], mask: Option<&[f32]>) -> Result<Vec<f32>> {
        check_len(
            "step input x",
            x.len(),
            self.params.batch * self.params.qdim,
        )?;
        check_finite("step input x", x)?;
        self.check_step(mask)?;
        self.step_x.write(x)?;
        let (xb, yb) = (self.step_x.clone(), self.step_y.clone());
        self.step_device(&xb, &yb, mask)?;
        yb.read()
    }

    fn check_step(&self, mask: Option<&[f32]>) -> Result<()> {
        let p = &self.params;
        let kv_len = match p.kind {
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
                self.cache.len() + 1
            }
            MhaKind::CrossAttention => {
                self.check_memory("step")?;
                self.cache.len()
            }
        };
        self.mask_mode(mask, 1, kv_len).map(|_| ())
    }

    /// [`MultiHeadAttention::step`] on device buffers: `x` `[batch][qdim]` in, `out` `[batch][qdim]`
    /// written. Submits the projections and the attention (no host copy, no wait inside); their
    /// submissions are kept for [`MultiHeadAttention::last_times`], and a read of `out` waits for
    /// them.
    ///
    /// Errors: as [`MultiHeadAttention::step`]; [`Error::Size`] for buffers of the wrong length.
    pub(crate) fn step_device(
        &mut self,
        x: &Buffer<f32>,
        out: &Buffer<f32>,
        mask: Option<&[f32]>,
    ) -> Result<()> {
        let p = self.params;
        check_len("step input x", x.len(), p.batch * p.qdim)?;
        check_len("step output", out.len(), p.batch * p.qdim)?;
        self.check_step(mask)?;
        let ctx = self.ctx.clone();
        let (hq, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim());
        let mut run = MhaRun::new();
        let cross = p.kind == MhaKind::CrossAttention;
        let outs = Outputs {
            bufs: [&self.step_q, &self.step_k, &self.step_v],
            n0: hq * d,
            n1: if cross { 0 } else { hkv * d },
            alpha0: self.alpha,
        };
        let w = &self.weights.q_or_qkv;
        run.push((
            MhaPhase::Projection,
            self.proj.project(&ctx, x, p.batch, w, &outs, 0, 0, true)?,
        ));
        let kv_len = if cross {
            self.cache.len()
        } else {
            self.cache.len() + 1
        };
        let mode = self.mask_mode(mask, 1, kv_len)?;
        let (q, o) = (self.step_q.clone(), self.step_o.clone());
        let event = match (mode, cross) {
            (MaskMode::None, true) => self.attn.attend(&self.cache, &q, &o)?,
            (MaskMode::None, false) => {
                let (k, v) = (self.step_k.clone(), self.step_v.clone());
                self.attn.decode(&mut self.cache, &q, &k, &v, &o)?
            }
            (_, true) => self.masked_attention(&q, &o, 1, kv_len, false, mode, mask)?,
            (_, false) => {
                let (k, v) = (self.step_k.clone(), self.step_v.clone());
                let start = self.cache.len();
                run.push((MhaPhase::Attention, self.append_rows(&k, &v, start, 1)?));
                self.cache.len = kv_len;
                self.masked_attention(&q, &o, 1, kv_len, false, mode, mask)?
            }
        };
        run.push((MhaPhase::Attention, event));
        let out_w = &self.weights.out;
        run.push((
            MhaPhase::Projection,
            self.proj.project(
                &ctx,
                &o,
                p.batch,
                out_w,
                &Outputs::one(out, p.qdim),
                0,
                0,
                true,
            )?,
        ));
        self.last = run;
        Ok(())
    }

    /// Cross-attention: projects the encoder's states to K and V once and keeps them as the
    /// memory every later call attends. `keys` is `[batch][len][kdim]`; `values` `[batch][len][vdim]`,
    /// or `None` for the same states as `keys` (needs `kdim == vdim`). The new memory replaces the
    /// old one entirely: only its `len` positions are attended afterwards.
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
        if len > self.cache.capacity() {
            return Err(Error::Size {
                what: "cross-attention memory".into(),
                got: format!("{len} positions"),
                expected: format!("at most the capacity {}", self.cache.capacity()),
            });
        }
        check_len("memory keys", keys.len(), p.batch * len * p.kdim)?;
        check_finite("memory keys", keys)?;
        let values = match values {
            Some(v) => {
                check_len("memory values", v.len(), p.batch * len * p.vdim)?;
                check_finite("memory values", v)?;
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
        let ctx = self.ctx.clone();
        let rows = p.batch * len;
        let n = p.kv_dim();
        let (kx, vx) = (ctx.buffer_from(keys)?, ctx.buffer_from(values)?);
        let (k, v) = (ctx.buffer(rows * n)?, ctx.buffer(rows * n)?);
        let Some((wk, wv)) = &self.weights.kv else {
            return Err(Error::InvalidArgument(
                "a cross-attention layer without K/V weights".into(),
            ));
        };
        let mut run = MhaRun::new();
        let one_k = Outputs::one(&k, n);
        let one_v = Outputs::one(&v, n);
        run.push((
            MhaPhase::Projection,
            self.proj
                .project(&ctx, &kx, rows, wk, &one_k, 0, len, false)?,
        ));
        run.push((
            MhaPhase::Projection,
            self.proj
                .project(&ctx, &vx, rows, wv, &one_v, 0, len, false)?,
        ));
        // Until the copy is in, no call may attend a half-replaced memory.
        self.memory_set = false;
        self.cache.clear();
        run.push((MhaPhase::Attention, self.append_rows(&k, &v, 0, len)?));
        self.cache.len = len;
        self.memory_set = true;
        self.last = run;
        Ok(())
    }

    fn check_memory(&self, call: &str) -> Result<()> {
        if self.memory_set {
            return Ok(());
        }
        Err(Error::CallOrder {
            call: format!("cross-attention {call}"),
            needs: "set_memory first: the memory (the encoder's states) is not set".into(),
        })
    }

    /// Writes `rows` positions of K and V (`[batch][kv_head][rows][head_dim]`) into the cache at
    /// `pos`, converting to its type.
    fn append_rows(
        &self,
        k: &Buffer<f32>,
        v: &Buffer<f32>,
        pos: usize,
        rows: usize,
    ) -> Result<Event> {
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
        crate::launch::submit(
            &self.ctx.queue(),
            &[LaunchDesc {
                kernel: &self.append,
                groups: [groups, 1, 1],
                buffers: &args,
                push_constants: push.as_bytes(),
            }],
        )
    }

    /// `mha_attn`: `q` (`[batch][q_head][q_len][head_dim]`) over the cache's first `kv_len`
    /// positions, with the mask, into `o`.
    #[allow(clippy::too_many_arguments)]
    fn masked_attention(
        &self,
        q: &Buffer<f32>,
        o: &Buffer<f32>,
        q_len: usize,
        kv_len: usize,
        causal: bool,
        mode: MaskMode,
        mask: Option<&[f32]>,
    ) -> Result<Event> {
        let p = &self.params;
        let mask_buf = match mask {
            Some(m) => Some(self.ctx.buffer_from(m)?),
            None => None,
        };
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
        let m: &Buffer<f32> = mask_buf.as_ref().unwrap_or(&self.no_mask);
        let args: [&dyn BufferArg; 5] = [q, kc, vc, m, o];
        crate::launch::submit(
            &self.ctx.queue(),
            &[LaunchDesc {
                kernel: &self.masked,
                groups: [q_len as u32, (p.batch * p.num_heads) as u32, 1],
                buffers: &args,
                push_constants: push.as_bytes(),
            }],
        )
    }
}

fn check_finite(what: &str, x: &[f32]) -> Result<()> {
    match x.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::InvalidArgument(format!(
            "{what}[{i}] is {}; inputs must be finite",
            x[i]
        ))),
    }
}
