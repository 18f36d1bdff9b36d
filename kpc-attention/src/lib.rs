//! Attention with a KV cache, the workload kpc runs, on either backend, built on `kpc`'s public API
//! (contexts, cached kernels, buffers, queues) only.
//!
//! - [`KvCache`] holds one layer's K and V on the device, preallocated to a capacity and laid out
//!   `[batch][kv_head][position][head_dim]`, so that a decode step reads each head's past as one
//!   contiguous run. Appending a token writes one position per (batch, KV head) in place: O(1), the
//!   past is never copied.
//! - [`Attention`] holds the kernels for one shape (acquired through the context's caches, one
//!   distinct cached program per variant) and runs them: [`Attention::prefill`] appends a prompt's
//!   K and V and runs causal attention over it (tiled, online softmax, fully masked tiles skipped);
//!   [`Attention::decode`] appends a token's K/V row from device buffers and attends over every
//!   position, as one submission ([`Attention::decode_step`] takes the row from the host);
//!   [`Attention::attend`] attends over a cache without appending (a static cross-attention set
//!   filled once with [`KvCache::fill`]).
//! - Decode is flash-decoding: the sequence is split into chunks, each attended by its own
//!   workgroups, and the chunks are combined with a log-sum-exp. Kernels are chosen per device and
//!   shape ([`DecodeKernel`], [`PrefillKernel`]): where the device allows, one fused launch
//!   (`attn_decode_vec`: append, 16-byte loads, subgroup sums, combination by the last workgroup;
//!   `attn_decode_coop` runs the same launch on the matrix units, only when asked for, since it was
//!   the slower of the two on the one device measured);
//!   a prefill on the matrix units where the device has fp16 cooperative matrices
//!   (`attn_prefill_coop`, Vulkan, fp16 K/V; its softmax in registers where the `coop_layout`
//!   probe finds a layout it knows), else one on VK_NV_cooperative_matrix2's workgroup-scope
//!   matrices (`attn_prefill_cm2`, also forced with [`PrefillKernel::Cm2`]), else a register-tiled
//!   one (`attn_prefill_tiled`);
//!   elsewhere the generic kernels (`attn_append`, `attn_decode`, `attn_reduce`, `attn_prefill`).
//!   Each variant is its own cached program.
//! - [`reference`](mod@reference) is the float64 CPU reference the kernels are tested against.
//! - [`mha`] is ncnn's MultiHeadAttention layer around these kernels: Q/K/V and output projections,
//!   self-attention with this cache, cross-attention over K/V projected once.
//!
//! - [`Tensor`] is a device array (fp16 or f32, a shape) over a kpc buffer: the layer's device calls
//!   ([`MultiHeadAttention::step_device`], [`MultiHeadAttention::prefill_device`],
//!   [`MultiHeadAttention::set_memory_device`]) read and write tensors and submit without a host copy
//!   or wait; its host-slice calls are thin wrappers over them. [`DecoderStack`] chains several layers
//!   (self-attention, optionally followed by cross-attention) into one submission per step.
//!
//! Q and O are f32, `[batch][q_head][head_dim]` per decode step. K and V are f32 or f16
//! ([`KvDtype`]); computation is f32, except that the cooperative-matrix prefill multiplies Q and
//! the softmax weights as fp16 (accumulating in f32). The scale is `1 / sqrt(head_dim)`.

#![warn(missing_docs)]

mod choice;
mod decode;
mod decode_choice;
pub mod kernels;
mod kv_cache;
mod launch;
mod layer;
mod lazy;
pub mod mha;
mod options;
mod prefill;
pub mod ptx;
pub mod reference;
mod stack;
mod tensor;

pub use kv_cache::{F16_MAX, KvCache, check_storable, round_to_f16};
pub use lazy::LazyReport;
pub use mha::{MhaKind, MhaParams, MhaWeights, MultiHeadAttention, ProjectionKernel};
pub use options::{AttentionOptions, DecodeKernel, PrefillKernel};
pub use stack::{DecoderLayer, DecoderStack};
pub use tensor::{Dtype, Tensor};

use kpc::BackendKind;
use kpc::SpecConstants;
use kpc::{Buffer, Context, Kernel};
use kpc::{Error, Result};

use decode_choice::VecLayout;

/// The head layout of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Sequences processed together (B).
    pub batch: usize,
    /// Query heads (Hq).
    pub q_heads: usize,
    /// Key/value heads (Hkv); `q_heads` must be a multiple of it (grouped-query attention).
    pub kv_heads: usize,
    /// Elements per head (D): even, at most 256.
    pub head_dim: usize,
}

/// The largest head dimension the kernels accept.
pub(crate) const MAX_HEAD_DIM: usize = 256;

impl AttentionShape {
    /// Checks that the kernels support this shape.
    ///
    /// Errors: [`Error::InvalidArgument`] for a zero dimension, `q_heads` not a multiple of
    /// `kv_heads`, or a head dimension that is odd or larger than 256.
    pub fn validate(&self) -> Result<()> {
        let s = self;
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.head_dim == 0 {
            return Err(Error::InvalidArgument(format!(
                "attention dimensions must be positive: {s:?}"
            )));
        }
        if s.q_heads % s.kv_heads != 0 {
            return Err(Error::InvalidArgument(format!(
                "query heads ({}) must be a multiple of key/value heads ({})",
                s.q_heads, s.kv_heads
            )));
        }
        if s.head_dim % 2 != 0 || s.head_dim > MAX_HEAD_DIM {
            return Err(Error::InvalidArgument(format!(
                "head dimension {} unsupported: it must be even and at most {MAX_HEAD_DIM}",
                s.head_dim
            )));
        }
        Ok(())
    }

    /// Elements of one decode step's Q or O: `batch * q_heads * head_dim`.
    pub fn q_elems(&self) -> usize {
        self.batch * self.q_heads * self.head_dim
    }

    /// Elements of one position of K or V over the batch: `batch * kv_heads * head_dim`.
    pub fn kv_step_elems(&self) -> usize {
        self.batch * self.kv_heads * self.head_dim
    }
}

/// How K and V are stored in a [`KvCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 32-bit floats.
    F32,
    /// IEEE half floats (converted on upload with round-to-nearest-even; computed in f32).
    F16,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

pub(crate) fn check_len(what: &str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::Size {
            what: what.to_string(),
            got: format!("{got} elements"),
            expected: format!("{expected} elements"),
        })
    }
}

/// The attention kernels for one shape and KV type on one context, with the scratch buffers their
/// splits need for caches of up to `capacity` positions.
///
/// Calls on one `Attention` are serialized internally where they share scratch; launches of one
/// `Attention` from several threads still run in submission order on the context's queue.
pub struct Attention {
    ctx: Context,
    shape: AttentionShape,
    dtype: KvDtype,
    capacity: usize,
    options: AttentionOptions,
    vec: Option<VecLayout>,
    /// The decode runs on the matrix units (`attn_decode_coop`, in the vectorized launch).
    coop_decode: bool,
    /// The prefill kernel chosen (never `Auto`).
    prefill_kind: PrefillKernel,
    /// Whether the cooperative-matrix prefill keeps its softmax in registers.
    coop_quad: bool,
    /// The vectorized decode combines all query heads of a KV head at once (`COMBINE`).
    combine_all: bool,
    /// The generic path's append and reduce; the vectorized decode kernel does both itself.
    append: Option<Kernel>,
    decode: Kernel,
    reduce: Option<Kernel>,
    prefill: Kernel,
    part_o: Buffer<f32>,
    part_ml: Buffer<f32>,
    /// Splits finished per (batch, KV head) in the current vectorized launch; each launch's last
    /// workgroup resets its entry to zero.
    done: Buffer<u32>,
    new_k: Buffer<f32>,
    new_v: Buffer<f32>,
    step: parking_lot::Mutex<()>,
    /// [`AttentionOptions::lazy`]: the specialized kernels' requests with `attn_generic` as their
    /// fallback (then `append`, `decode`, `reduce` and `prefill` hold `attn_generic`, for reporting
    /// only).
    lazy: Option<lazy::Lazy>,
}

impl std::fmt::Debug for Attention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attention")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("capacity", &self.capacity)
            .field("options", &self.options)
            .field("decode", &self.decode_kernel())
            .field("prefill", &self.prefill_kernel())
            .finish()
    }
}

/// The shipped kernel `name` on `ctx`'s backend, specialized by `spec`: built, or served by the
/// context's memory or disk cache.
fn shipped_kernel(ctx: &Context, name: &str, spec: &SpecConstants) -> Result<Kernel> {
    shipped_kernel_from(ctx, name, spec, false)
}

/// [`shipped_kernel`], or with `from_source` on Vulkan, built from its GLSL through the SPIR-V cache
/// (cooperative-matrix kernels excepted: see [`kernels::glsl_image`]).
fn shipped_kernel_from(
    ctx: &Context,
    name: &str,
    spec: &SpecConstants,
    from_source: bool,
) -> Result<Kernel> {
    ctx.kernel_with(&shipped_request(ctx, name, spec, from_source)?)
}

/// The request [`shipped_kernel_from`] acquires.
fn shipped_request(
    ctx: &Context,
    name: &str,
    spec: &SpecConstants,
    from_source: bool,
) -> Result<kpc::KernelRequest> {
    let coop = crate::kernels::SPIRV
        .iter()
        .any(|k| k.name == name && k.cooperative_matrix);
    let image = match ctx.backend() {
        BackendKind::Vulkan if from_source && !coop => crate::kernels::glsl_image(name)?,
        BackendKind::Vulkan => crate::kernels::spirv_image(name)?,
        BackendKind::OpenCl => crate::kernels::opencl_image(name)?,
    };
    Ok(kpc::KernelRequest::new(&image, name).spec(spec.clone()))
}
