//! ncnn's MultiHeadAttention layer on kpc's attention: the Q, K, V and output projections around
//! it, self-attention with kpc's preallocated KV cache, cross-attention over K/V projected once.
//!
//! - Parameters ([`MhaParams`]) are ncnn's (embed_dim 0, num_heads 1, qdim from weight_data_size 2,
//!   kdim 3, vdim 4, attn_mask 5, scale 6, kv_cache 7) plus `num_kv_heads` (grouped-query attention,
//!   which ncnn's layer lacks).
//! - Weights ([`MhaWeights`]) come in ncnn's order and shapes: q, k, v, out, each
//!   `[out_features][in_features]` row-major followed by its bias. They are stored fp32 or fp16
//!   ([`MhaParams::weight_dtype`]), uploaded once, and read in place by the projection kernels;
//!   every sum is fp32.
//! - Self-attention ([`MhaKind::SelfAttention`]): [`MultiHeadAttention::prefill`] projects a prompt,
//!   appends its K/V to the cache and runs causal attention; [`MultiHeadAttention::step`] does the
//!   same for one token per sequence, appending in place (O(1), the past is never copied). Prefill
//!   and steps give one causal pass over the whole sequence.
//! - Cross-attention ([`MhaKind::CrossAttention`]): [`MultiHeadAttention::set_memory`] projects
//!   the encoder's states to K/V once; every step attends them without a causal mask, re-projecting
//!   nothing. New memory replaces the old one.
//! - The self-attention cache can be exported and imported in ncnn's two layouts ([`CacheLayout`]).
//!
//! Inputs and outputs are `[batch][seq][features]` row-major; the output has `qdim` features, as
//! ncnn's. The host-slice calls take and return f32; the device calls take [`crate::Tensor`]s of
//! fp16 or f32, which decode steps' matrix-vector projection reads and writes as they are (other
//! projections convert with `mha_cast` inside the same submission). Every call records its launches
//! into one batch and submits it once. The projection kernels are `mha_gemm` (tiled, any size), `mha_gemm_wide` (the matrix
//! units with a feed built for them, [`gemm`]: where the device has fp16 cooperative matrices and
//! the weights are fp16; `mha_gemm_coop` before it), `mha_gemm_mma` (OpenCL on NVIDIA from sm_80:
//! inline PTX `mma.sync`, [`gemm_mma`]; fp16 weights) and, for decode steps, `mha_gemv` (one token
//! per sequence: bound by reading the weights, split across workgroups, Q, K and V in one launch); `mha_attn` is the attention with an additive mask. Like every kernel they
//! come through the context's caches.

mod cache_io;
mod forward;
pub mod gemm;
pub mod gemm_mma;
mod mask;
mod memory;
mod proj;
pub mod reference;
mod weights;

pub use cache_io::CacheLayout;
pub use forward::MhaTimes;
pub use weights::MhaWeights;

use kpc::{Buffer, Context, Kernel};
use kpc::{Error, Result};

use super::{Attention, AttentionOptions, AttentionShape, KvCache, KvDtype, MAX_HEAD_DIM};
use proj::Projector;
use weights::DeviceWeights;

/// Which attention a layer computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MhaKind {
    /// Q, K and V all projected from the layer's input; K/V kept in a growing cache.
    #[default]
    SelfAttention,
    /// Q from the layer's input, K and V from a memory (the encoder's states) set once.
    CrossAttention,
}

/// Which kernel projects the inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProjectionKernel {
    /// The matrix-vector kernel for decode steps where it fits (at most
    /// [`MAX_GEMV_BATCH`] sequences, input widths a multiple of 16 bytes of weights); for the
    /// rest `mha_gemm_wide` where it fits (see [`ProjectionKernel::Wide`]), else the
    /// cooperative-matrix GEMM where it fits (see [`ProjectionKernel::Cooperative`]), else, on
    /// NVIDIA's OpenCL, `mha_gemm_mma` where it fits (see [`ProjectionKernel::Mma`] and
    /// [`crate::ptx::auto_takes_inline_ptx`]), else the tiled GEMM.
    #[default]
    Auto,
    /// `mha_gemm` for everything.
    Tiled,
    /// `mha_gemv` for decode steps; an error at creation where it does not fit.
    MatVec,
    /// `mha_gemm_coop` (the matrix units, VK_KHR_cooperative_matrix) for every projection but
    /// decode steps' matrix-vector ones; an error at creation where it does not fit.
    Cooperative,
    /// `mha_gemm_wide` (the matrix units fed through 16-byte loads, padded shared tiles and 64 x 64
    /// of C per subgroup: [`gemm`]; fp32 sums, tiles per shape by [`gemm::auto_tiles`]) for every
    /// projection but decode steps' matrix-vector ones; an error at creation where it does not fit.
    Wide,
    /// `mha_gemm_mma` (OpenCL C with inline PTX `mma.sync`: [`gemm_mma`]; NVIDIA's OpenCL from
    /// sm_80, fp16 weights, widths that are multiples of 8) for every projection but decode steps'
    /// matrix-vector ones; at creation [`Error::Unsupported`] where the device's compiler does not
    /// take the PTX ([`crate::ptx`]), [`Error::InvalidArgument`] where the layer does not fit.
    Mma,
}

/// The most sequences the matrix-vector projection serves in one launch.
pub const MAX_GEMV_BATCH: usize = 8;

/// A MultiHeadAttention layer's parameters, ncnn's ids in brackets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MhaParams {
    /// Width of Q, K and V inside the layer (0): `num_heads * head_dim`.
    pub embed_dim: usize,
    /// Query heads (1).
    pub num_heads: usize,
    /// Key/value heads: `num_heads` for MHA, a divisor of it for grouped-query attention (not an
    /// ncnn parameter). K and V are `num_kv_heads * head_dim` wide.
    pub num_kv_heads: usize,
    /// Width of the query input and of the output (ncnn: weight_data_size / embed_dim).
    pub qdim: usize,
    /// Width of the key input (3). Self-attention needs `kdim == qdim`.
    pub kdim: usize,
    /// Width of the value input (4). Self-attention needs `vdim == qdim`.
    pub vdim: usize,
    /// Logit scale (6); `None` is `1 / sqrt(head_dim)`. Folded into the Q projection, as ncnn does.
    pub scale: Option<f32>,
    /// Whether every call takes an additive mask (5): `[q_len][kv_len]`, shared by the heads, or
    /// `[num_heads][q_len][kv_len]`.
    ///
    /// A mask value is added to its logit. `-inf` masks the key: it gets no weight. Any finite
    /// value is added as it is, however negative: the softmax is then taken over the sums, so a
    /// query row whose keys all get the same huge negative value (`-1e30`, `-f32::MAX`) loses the
    /// logits' differences to rounding and weighs its keys uniformly, as softmax does in any
    /// implementation. A query row whose every key it sees is `-inf` (fully masked) attends to
    /// nothing: its attention output is zeros, so the layer outputs its output bias for it. This is
    /// the same on every backend, every kernel and the float64 reference. NaN and `+inf` are
    /// refused ([`Error::InvalidArgument`], naming the index and the value).
    pub attn_mask: bool,
    /// Whether self-attention keeps K/V across calls (7). Off, every prefill stands alone (it
    /// replaces the cache's positions) and a step is a [`Error::CallOrder`].
    pub kv_cache: bool,
    /// Self- or cross-attention.
    pub kind: MhaKind,
    /// Whether self-attention is causal: query `i` of a prefill sees keys up to its own position.
    /// On by default (a decoder); off, every query sees every key of the cache (an encoder).
    pub causal: bool,
    /// Sequences per call (B).
    pub batch: usize,
    /// Positions the cache (self-attention) or the memory (cross-attention) holds at most.
    pub capacity: usize,
    /// Storage of the projection weights (biases stay fp32).
    pub weight_dtype: KvDtype,
    /// Storage of the K/V cache.
    pub cache_dtype: KvDtype,
    /// Which kernel projects.
    pub projection: ProjectionKernel,
}

impl MhaParams {
    /// ncnn's defaults for `embed_dim` and `num_heads`: MHA, qdim = kdim = vdim = embed_dim, scale
    /// `1 / sqrt(head_dim)`, no mask, caching on, causal self-attention, one sequence, 1024
    /// positions, fp32 weights and cache.
    pub fn new(embed_dim: usize, num_heads: usize) -> MhaParams {
        MhaParams {
            embed_dim,
            num_heads,
            num_kv_heads: num_heads,
            qdim: embed_dim,
            kdim: embed_dim,
            vdim: embed_dim,
            scale: None,
            attn_mask: false,
            kv_cache: true,
            kind: MhaKind::SelfAttention,
            causal: true,
            batch: 1,
            capacity: 1024,
            weight_dtype: KvDtype::F32,
            cache_dtype: KvDtype::F32,
            projection: ProjectionKernel::Auto,
        }
    }

    /// Elements per head: `embed_dim / num_heads`.
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads.max(1)
    }

    /// Width of K and V inside the layer: `num_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim()
    }

    /// The logit scale in use.
    pub(crate) fn scale_value(&self) -> f32 {
        self.scale
            .unwrap_or_else(|| 1.0 / (self.head_dim() as f32).sqrt())
    }

    /// The attention's head layout.
    pub fn shape(&self) -> AttentionShape {
        AttentionShape {
            batch: self.batch,
            q_heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            head_dim: self.head_dim(),
        }
    }

    /// Checks that the layer can be built.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the parameter that is wrong and what is accepted.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        for (name, v) in [
            ("embed_dim", self.embed_dim),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("qdim", self.qdim),
            ("kdim", self.kdim),
            ("vdim", self.vdim),
            ("batch", self.batch),
            ("capacity", self.capacity),
        ] {
            if v == 0 {
                return bad(format!("MultiHeadAttention {name} must be positive"));
            }
        }
        if self.embed_dim % self.num_heads != 0 {
            return bad(format!(
                "embed_dim {} is not a multiple of num_heads {}",
                self.embed_dim, self.num_heads
            ));
        }
        if self.num_heads % self.num_kv_heads != 0 {
            return bad(format!(
                "num_heads {} is not a multiple of num_kv_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        let d = self.head_dim();
        if d % 2 != 0 || d > MAX_HEAD_DIM {
            return bad(format!(
                "head_dim {d} (embed_dim / num_heads) must be even and at most {MAX_HEAD_DIM}"
            ));
        }
        if self.kind == MhaKind::SelfAttention && (self.kdim != self.qdim || self.vdim != self.qdim)
        {
            return bad(format!(
                "self-attention projects K and V from the query input, so kdim ({}) and vdim ({}) \
                 must equal qdim ({})",
                self.kdim, self.vdim, self.qdim
            ));
        }
        if let Some(s) = self.scale
            && !(s.is_finite() && s > 0.0)
        {
            return bad(format!("scale {s} must be finite and positive"));
        }
        Ok(())
    }
}

/// A MultiHeadAttention layer on one context: its weights on the device, its kernels, and its
/// cache (self-attention) or memory (cross-attention).
///
/// Calls take `&mut self`: a layer runs one call at a time, its launches in submission order on the
/// context's queue.
pub struct MultiHeadAttention {
    ctx: Context,
    params: MhaParams,
    /// `scale * sqrt(head_dim)`: the attention kernels multiply logits by `1 / sqrt(head_dim)`.
    alpha: f32,
    attn: Attention,
    cache: KvCache,
    /// Cross-attention: whether [`MultiHeadAttention::set_memory`] has run.
    memory_set: bool,
    weights: DeviceWeights,
    proj: Projector,
    append: Kernel,
    masked: Kernel,
    /// `mha_cast` both ways: fp16 activations in and out of the f32 projections.
    cast_to_f16: Kernel,
    cast_to_f32: Kernel,
    /// Decode-step staging: input, Q, new K and V, attention output, output.
    step_x: Buffer<f32>,
    step_q: Buffer<f32>,
    step_k: Buffer<f32>,
    step_v: Buffer<f32>,
    step_o: Buffer<f32>,
    step_y: Buffer<f32>,
    /// Binds the mask parameter of `mha_attn` when there is no mask.
    no_mask: Buffer<f32>,
    /// The last call's submission.
    last: forward::MhaRun,
}

impl std::fmt::Debug for MultiHeadAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiHeadAttention")
            .field("params", &self.params)
            .field("len", &self.cache.len())
            .field("memory_set", &self.memory_set)
            .field("matvec", &self.proj.has_gemv())
            .finish()
    }
}

impl MultiHeadAttention {
    /// Builds the layer on `ctx`: checks `params` and every weight's size, uploads the weights
    /// (converted to [`MhaParams::weight_dtype`]), acquires the kernels through the context's
    /// caches and allocates the cache or memory for [`MhaParams::capacity`] positions.
    ///
    /// Errors: [`Error::InvalidArgument`] for invalid parameters (the message names the one), or
    /// [`ProjectionKernel::MatVec`] asked for where it does not fit; [`Error::Size`] naming the
    /// weight or bias of the wrong length; kernel build and allocation errors.
    pub fn new(
        ctx: &Context,
        params: &MhaParams,
        weights: &MhaWeights<'_>,
    ) -> Result<MultiHeadAttention> {
        let options = AttentionOptions::for_device(ctx.device());
        MultiHeadAttention::with_options(ctx, params, weights, options)
    }

    /// As [`MultiHeadAttention::new`], with the options of the attention kernels underneath
    /// (which decode and prefill kernels, their sizes) instead of the device's defaults.
    ///
    /// Errors: as [`MultiHeadAttention::new`], and [`Attention::new`]'s for options the device
    /// cannot run.
    pub fn with_options(
        ctx: &Context,
        params: &MhaParams,
        weights: &MhaWeights<'_>,
        options: AttentionOptions,
    ) -> Result<MultiHeadAttention> {
        params.validate()?;
        weights.check(params)?;
        let p = *params;
        let shape = p.shape();
        let attn = Attention::new(ctx, &shape, p.cache_dtype, p.capacity, options)?;
        let cache = KvCache::new(ctx, &shape, p.capacity, p.cache_dtype)?;
        let proj = Projector::new(ctx, &p)?;
        let weights = DeviceWeights::upload(ctx, &p, weights)?;
        let d = kpc::SpecValue::U32(shape.head_dim as u32);
        let f16 = kpc::SpecValue::U32(u32::from(p.cache_dtype == KvDtype::F16));
        let append = super::shipped_kernel(
            ctx,
            "attn_append",
            &kpc::SpecConstants::new()
                .with(0, kpc::SpecValue::U32(64))
                .with(2, f16)
                .with(3, d),
        )?;
        let masked = super::shipped_kernel(
            ctx,
            "mha_attn",
            &kpc::SpecConstants::new().with(2, f16).with(3, d),
        )?;
        let cast = |to_f16: bool| {
            super::shipped_kernel(
                ctx,
                "mha_cast",
                &kpc::SpecConstants::new().with(0, kpc::SpecValue::U32(u32::from(to_f16))),
            )
        };
        let (cast_to_f16, cast_to_f32) = (cast(true)?, cast(false)?);
        let (b, e) = (p.batch, shape.head_dim);
        Ok(MultiHeadAttention {
            ctx: ctx.clone(),
            alpha: p.scale_value() * (e as f32).sqrt(),
            params: p,
            attn,
            cache,
            memory_set: false,
            weights,
            proj,
            append,
            masked,
            cast_to_f16,
            cast_to_f32,
            step_x: ctx.buffer(b * p.qdim)?,
            step_q: ctx.buffer(shape.q_elems())?,
            step_k: ctx.buffer(shape.kv_step_elems())?,
            step_v: ctx.buffer(shape.kv_step_elems())?,
            step_o: ctx.buffer(shape.q_elems())?,
            step_y: ctx.buffer(b * p.qdim)?,
            no_mask: ctx.buffer(1)?,
            last: None,
        })
    }

    /// Whether the layer lives on `ctx` (a clone of the context it was built on).
    pub fn is_on(&self, ctx: &Context) -> bool {
        ctx.owns(&self.step_x)
    }

    /// The parameters it was built with.
    pub fn params(&self) -> &MhaParams {
        &self.params
    }

    /// Positions in the self-attention cache, or in the cross-attention memory.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether the cache (or memory) holds no position.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// Forgets the cache's positions (self-attention) or the memory (cross-attention); the next
    /// cross-attention step needs [`MultiHeadAttention::set_memory`] again.
    pub fn clear(&mut self) {
        self.cache.clear();
        self.memory_set = false;
    }

    /// Self-attention: forgets every cached position from `len` on (a rollback, as after rejected
    /// speculative tokens); a `len` at or past [`MultiHeadAttention::len`] changes nothing. The
    /// cross-attention memory is not affected. Nothing is written.
    pub fn truncate(&mut self, len: usize) {
        if self.params.kind == MhaKind::SelfAttention {
            self.cache.truncate(len);
        }
    }

    /// Whether decode steps project with the matrix-vector kernel (`mha_gemv`).
    pub fn uses_matvec(&self) -> bool {
        self.proj.has_gemv()
    }

    /// The kernel that projects prefills (and [`MultiHeadAttention::set_memory`]): `mha_gemm_wide`,
    /// `mha_gemm_coop`, `mha_gemm_mma` or `mha_gemm`.
    pub fn prefill_projection(&self) -> &'static str {
        self.proj.gemm_name()
    }

    /// The SDPA kernels underneath.
    pub fn attention(&self) -> &Attention {
        &self.attn
    }

    /// Every kernel the layer holds, for reporting where each came from.
    pub fn kernels(&self) -> Vec<&Kernel> {
        let mut k = self.proj.kernels();
        k.push(&self.append);
        k.push(&self.masked);
        k.push(&self.cast_to_f16);
        k.push(&self.cast_to_f32);
        k.extend(self.attn.kernels());
        k
    }

    /// The device time of the last call's launches by phase (projections, attention): `None`
    /// where the backend does not time launches.
    ///
    /// Errors: the events' errors (waiting on them).
    pub fn last_times(&self) -> Result<Option<forward::MhaTimes>> {
        forward::times(&self.last)
    }

    fn check_kind(&self, call: &str, kind: MhaKind) -> Result<()> {
        if self.params.kind == kind {
            return Ok(());
        }
        Err(Error::CallOrder {
            call: call.into(),
            needs: format!(
                "it is for {kind:?} layers; this layer is {:?}",
                self.params.kind
            ),
        })
    }
}
