//! [`DecoderStack`]: several MultiHeadAttention layers run as one submission per call, each
//! layer's output feeding the next layer's input on the device.

use std::time::Duration;

use kpc::{Context, Event};
use kpc::{Error, Result};

use crate::launch::Batch;
use crate::mha::{MhaKind, MultiHeadAttention};
use crate::tensor::{Dtype, Tensor};

/// One decoder layer of a [`DecoderStack`]: self-attention, optionally followed by
/// cross-attention over a memory.
#[derive(Debug)]
pub struct DecoderLayer {
    /// A [`MhaKind::SelfAttention`] layer with its KV cache on.
    pub self_attn: MultiHeadAttention,
    /// A [`MhaKind::CrossAttention`] layer, or none.
    pub cross_attn: Option<MultiHeadAttention>,
}

/// A decoder of N layers (self-attention, each optionally followed by cross-attention), chained on
/// one context: [`DecoderStack::step`] records every layer's launches into one batch and submits
/// it once, layer `i`'s output in a device tensor that layer `i + 1` reads. Nothing waits on the
/// host until the caller reads the output; the context's queue keeps the layers in order (on an
/// interop context, kpc's queue calls take the embedder's queue lock as every other kpc call does).
///
/// The layers attend with no masks (they are built without `attn_mask`) and are chained as they
/// are: the stack adds no residual, normalization or feed-forward between them.
#[derive(Debug)]
pub struct DecoderStack {
    ctx: Context,
    layers: Vec<DecoderLayer>,
    /// The activations between sublayers, used in turn.
    hidden: [Tensor; 2],
    last: Option<Event>,
}

impl DecoderStack {
    /// Chains `layers` on `ctx`, with activations of `dtype` between them.
    ///
    /// Errors: [`Error::InvalidArgument`] for no layers, a layer of another context, of the wrong
    /// kind, with its KV cache off or with `attn_mask` on, or layers that disagree on `batch` or
    /// `qdim` (each takes the previous one's output), or cross-attention layers that disagree on
    /// `kdim`, `vdim` or `capacity` (they share one memory); allocation errors.
    pub fn new(ctx: &Context, layers: Vec<DecoderLayer>, dtype: Dtype) -> Result<DecoderStack> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        let Some(first) = layers.first() else {
            return bad("a decoder stack needs at least one layer".into());
        };
        let p0 = *first.self_attn.params();
        let cross0 = layers
            .iter()
            .find_map(|l| l.cross_attn.as_ref())
            .map(|c| *c.params());
        for (i, l) in layers.iter().enumerate() {
            let mut parts = vec![(&l.self_attn, MhaKind::SelfAttention)];
            parts.extend(l.cross_attn.iter().map(|c| (c, MhaKind::CrossAttention)));
            for (m, kind) in parts {
                let p = m.params();
                if !m.is_on(ctx) {
                    return bad(format!(
                        "decoder layer {i}: its {kind:?} layer belongs to another context"
                    ));
                }
                if p.kind != kind {
                    return bad(format!(
                        "decoder layer {i}: the {kind:?} slot holds a {:?} layer",
                        p.kind
                    ));
                }
                if kind == MhaKind::SelfAttention && !p.kv_cache {
                    return bad(format!(
                        "decoder layer {i}: self-attention needs kv_cache on to take steps"
                    ));
                }
                if p.attn_mask {
                    return bad(format!(
                        "decoder layer {i}: a {kind:?} layer with attn_mask; the stack passes \
                         no masks"
                    ));
                }
                if p.batch != p0.batch || p.qdim != p0.qdim {
                    return bad(format!(
                        "decoder layer {i}: batch {} and qdim {} differ from layer 0's ({} and \
                         {}); each layer reads the previous one's output",
                        p.batch, p.qdim, p0.batch, p0.qdim
                    ));
                }
                if let Some(c) = cross0.filter(|_| kind == MhaKind::CrossAttention)
                    && (c.kdim, c.vdim, c.capacity) != (p.kdim, p.vdim, p.capacity)
                {
                    return bad(format!(
                        "decoder layer {i}: cross-attention kdim {}, vdim {} and capacity {} \
                         differ from the first cross-attention layer's ({}, {}, {}); the layers \
                         share one memory",
                        p.kdim, p.vdim, p.capacity, c.kdim, c.vdim, c.capacity
                    ));
                }
            }
        }
        let shape = [p0.batch, p0.qdim];
        Ok(DecoderStack {
            ctx: ctx.clone(),
            hidden: [
                Tensor::new(ctx, &shape, dtype)?,
                Tensor::new(ctx, &shape, dtype)?,
            ],
            layers,
            last: None,
        })
    }

    /// The layers.
    pub fn layers(&self) -> &[DecoderLayer] {
        &self.layers
    }

    /// The layers, to prefill them or import their caches one by one.
    pub fn layers_mut(&mut self) -> &mut [DecoderLayer] {
        &mut self.layers
    }

    /// Rolls every self-attention layer back to `len` positions (see
    /// [`MultiHeadAttention::truncate`]); the memories are kept.
    pub fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.self_attn.truncate(len);
        }
    }

    /// Sets every cross-attention layer's memory from the same encoder states (see
    /// [`MultiHeadAttention::set_memory_device`]).
    ///
    /// Errors: as [`MultiHeadAttention::set_memory_device`], from the first cross-attention layer
    /// (the others take the same tensors, so nothing is changed then).
    pub fn set_memory(&mut self, keys: &Tensor, values: Option<&Tensor>) -> Result<()> {
        for l in &mut self.layers {
            if let Some(c) = &mut l.cross_attn {
                c.set_memory_device(keys, values)?;
            }
        }
        Ok(())
    }

    /// One decode step of every layer as one submission: `x` `[batch][qdim]` (fp16 or f32) into
    /// the first layer, the last layer's output into `out` (`[batch][qdim]`, fp16 or f32). Each
    /// self-attention layer appends its token's K/V. Returns once submitted; a read of `out`
    /// waits.
    ///
    /// Errors: [`Error::InvalidArgument`] for a tensor of another context; [`Error::Size`] for a
    /// tensor of the wrong shape or a full cache; [`Error::CallOrder`] for a cross-attention layer
    /// without memory. Every layer is checked before anything is recorded: nothing is written or
    /// launched then, and no cache moves.
    pub fn step(&mut self, x: &Tensor, out: &mut Tensor) -> Result<()> {
        // Every sublayer with its input and output, checked before any records.
        let subs: Vec<&MultiHeadAttention> = self
            .layers
            .iter()
            .flat_map(|l| std::iter::once(&l.self_attn).chain(l.cross_attn.as_ref()))
            .collect();
        let n = subs.len();
        let io = |j: usize| -> (&Tensor, &Tensor) {
            let input = if j == 0 { x } else { &self.hidden[(j - 1) % 2] };
            let output = if j + 1 == n {
                &*out
            } else {
                &self.hidden[j % 2]
            };
            (input, output)
        };
        for (j, m) in subs.iter().enumerate() {
            let (i, o) = io(j);
            m.check_step_device(i, o, None)?;
        }
        let saved: Vec<usize> = self
            .layers
            .iter()
            .flat_map(|l| std::iter::once(&l.self_attn).chain(l.cross_attn.as_ref()))
            .map(MultiHeadAttention::saved_len)
            .collect();
        let mut batch = Batch::new();
        let mut j = 0;
        let mut recorded = Ok(());
        for l in &mut self.layers {
            let parts = std::iter::once(&mut l.self_attn).chain(l.cross_attn.as_mut());
            for m in parts {
                let input = if j == 0 { x } else { &self.hidden[(j - 1) % 2] };
                let output = if j + 1 == n {
                    &*out
                } else {
                    &self.hidden[j % 2]
                };
                recorded = recorded.and_then(|()| m.record_step(&mut batch, input, output, None));
                j += 1;
            }
        }
        match recorded.and_then(|()| batch.submit(&self.ctx.queue())) {
            Ok(event) => {
                self.last = Some(event);
                Ok(())
            }
            Err(e) => {
                let all = self
                    .layers
                    .iter_mut()
                    .flat_map(|l| std::iter::once(&mut l.self_attn).chain(l.cross_attn.as_mut()));
                for (m, len) in all.zip(saved) {
                    m.restore_len(len);
                }
                Err(e)
            }
        }
    }

    /// The device time of the last step's submission, from its first launch's start to its last
    /// one's end (waiting for it); `None` before a step or where the backend does not time.
    ///
    /// Errors: the event's errors.
    pub fn last_device_time(&self) -> Result<Option<Duration>> {
        match &self.last {
            Some(e) => e.device_time(),
            None => Ok(None),
        }
    }

    /// Each launch of the last step's submission with its device time, in order (waiting for
    /// it); `None` before a step or where the backend does not time.
    ///
    /// Errors: the event's errors.
    pub fn last_launch_times(&self) -> Result<Option<Vec<(String, Duration)>>> {
        let Some(e) = &self.last else {
            return Ok(None);
        };
        Ok(e.launch_times()?
            .map(|t| e.kernels().iter().cloned().zip(t).collect()))
    }

    /// The launches of the last step's submission, in order.
    pub fn last_kernels(&self) -> &[String] {
        self.last.as_ref().map_or(&[], |e| e.kernels())
    }

    /// Blocks until the last step has finished.
    ///
    /// Errors: the event's errors.
    pub fn wait(&self) -> Result<()> {
        match &self.last {
            Some(e) => e.wait(),
            None => Ok(()),
        }
    }
}
