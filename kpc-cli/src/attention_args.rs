//! `kpc attention`'s arguments and what they select ([`Plan`]): the device, shape, K/V type and
//! attention options. Shared with `kpc cache explain`, which looks at the kernels the same arguments
//! make `kpc attention` use.

use clap::Args as ClapArgs;
use kpc::DeviceSelector;
use kpc::select_device;
use kpc::{Config, Error};
use kpc_attention::{AttentionOptions, AttentionShape, DecodeKernel, KvDtype, PrefillKernel};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BackendArg {
    Vulkan,
    Opencl,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum KvArg {
    F16,
    F32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LayerArg {
    /// Scaled-dot-product attention over the KV cache (kpc's Attention).
    Sdpa,
    /// ncnn's MultiHeadAttention layer: Q/K/V and output projections around the attention.
    Mha,
}

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// What runs: bare attention (`sdpa`) or a decoder block's MultiHeadAttention layers (`mha`:
    /// self-attention with the KV cache, plus cross-attention with --cross). With `mha`, the
    /// embedding width is heads x head dimension.
    #[arg(long, value_enum, default_value = "sdpa")]
    pub(crate) layer: LayerArg,
    /// With `--layer mha`: also run a cross-attention layer over this many encoder positions,
    /// projected once, after the self-attention layer at every step.
    #[arg(long)]
    pub(crate) cross: Option<usize>,
    /// With `--layer mha`: run a decoder stack of this many layers (self-attention, each followed
    /// by cross-attention with --cross), chained on the device in one submission per step
    /// (DecoderStack); reports device time, wall time and the weights + K/V read floor per step.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) layers: Option<u32>,
    /// With `--layers`: the activations' type between and into the layers.
    #[arg(long, value_enum, default_value = "f16")]
    pub(crate) activations: KvArg,
    /// With `--layer mha`: the projection kernel (`auto`: the matrix-vector one for decode steps
    /// where it fits, else the wide cooperative-matrix GEMM (mha_gemm_wide), else the first
    /// cooperative-matrix GEMM (mha_gemm_coop), where the device and shape allow them, else on
    /// OpenCL the inline-PTX mma.sync GEMM (mha_gemm_mma) where the driver takes it, else the
    /// tiled GEMM).
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) projection: ProjectionArg,
    /// Backend; without it (and without --device) KPC_DEVICE decides.
    #[arg(long, value_enum)]
    pub(crate) backend: Option<BackendArg>,
    /// Device: an index on the backend, or a KPC_DEVICE selector such as `vulkan:gpu`.
    #[arg(long)]
    pub(crate) device: Option<String>,
    /// Sequences (B).
    #[arg(long, default_value_t = 1)]
    pub(crate) batch: usize,
    /// Query heads (Hq).
    #[arg(long, default_value_t = 8)]
    pub(crate) heads: usize,
    /// Key/value heads (Hkv); defaults to --heads.
    #[arg(long)]
    pub(crate) kv_heads: Option<usize>,
    /// Head dimension (D).
    #[arg(long, default_value_t = 64)]
    pub(crate) head_dim: usize,
    /// Prompt length prefilled.
    #[arg(long, default_value_t = 128)]
    pub(crate) prompt: usize,
    /// Decode steps after the prompt.
    #[arg(long, default_value_t = 32)]
    pub(crate) steps: usize,
    /// K/V storage type.
    #[arg(long, value_enum, default_value = "f16")]
    pub(crate) kv: KvArg,
    /// Compare every output with the float64 reference (fails above 1e-5 for f32, 2e-3 for f16).
    #[arg(long)]
    pub(crate) check: bool,
    /// Upload the prompt's K/V into the cache instead of running the prefill kernel: decode
    /// benchmarks at long L without waiting for a prefill.
    #[arg(long)]
    pub(crate) fill: bool,
    /// Decode split kernel.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) decode_kernel: DecodeArg,
    /// Prefill kernel.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) prefill_kernel: PrefillArg,
    /// Query rows per workgroup of the cooperative-matrix prefill (AttentionOptions::coop_rows).
    #[arg(long)]
    pub(crate) coop_rows: Option<u32>,
    /// 16-row blocks per subgroup of the cooperative-matrix prefill, 1 or 2
    /// (AttentionOptions::coop_row_blocks).
    #[arg(long)]
    pub(crate) coop_row_blocks: Option<u32>,
    /// Keys per tile of the cooperative-matrix prefill, 32 or 64 (AttentionOptions::coop_keys).
    #[arg(long)]
    pub(crate) coop_keys: Option<u32>,
    /// Whether the cooperative-matrix prefill fetches the next K/V tile into registers during
    /// the current one (AttentionOptions::coop_prefetch): `true` or `false`.
    #[arg(long)]
    pub(crate) coop_prefetch: Option<bool>,
    /// Whether the cooperative-matrix prefill with 2 row blocks keeps the second block's Q in
    /// shared memory (AttentionOptions::coop_q_shared): `true` or `false`.
    #[arg(long)]
    pub(crate) coop_q_shared: Option<bool>,
    /// Whether the cooperative-matrix prefill stages K/V tiles in two shared buffers, one barrier
    /// per tile (AttentionOptions::coop_double): `true` or `false`.
    #[arg(long)]
    pub(crate) coop_double: Option<bool>,
    /// Whether the cooperative-matrix prefill takes P's exponentials in fp16
    /// (AttentionOptions::coop_half_exp): `true` or `false`.
    #[arg(long)]
    pub(crate) coop_half_exp: Option<bool>,
    /// Whether the cooperative-matrix prefill keeps its softmax in registers where the device's
    /// matrix layout allows (AttentionOptions::coop_registers): `true` or `false`; without it, the
    /// default.
    #[arg(long)]
    pub(crate) coop_registers: Option<bool>,
    /// Query rows per workgroup of the VK_NV_cooperative_matrix2 prefill
    /// (AttentionOptions::cm2_rows).
    #[arg(long)]
    pub(crate) cm2_rows: Option<u32>,
    /// Keys per tile of the VK_NV_cooperative_matrix2 prefill (AttentionOptions::cm2_keys).
    #[arg(long)]
    pub(crate) cm2_keys: Option<u32>,
    /// Invocations per workgroup of the VK_NV_cooperative_matrix2 prefill
    /// (AttentionOptions::cm2_local_size).
    #[arg(long)]
    pub(crate) cm2_local: Option<u32>,
    /// 16-row blocks per warp of the mma.sync prefill, 1 or 2 (AttentionOptions::mma_row_blocks).
    #[arg(long)]
    pub(crate) mma_row_blocks: Option<u32>,
    /// Keys per tile of the mma.sync prefill, 32 or 64 (AttentionOptions::mma_keys).
    #[arg(long)]
    pub(crate) mma_keys: Option<u32>,
    /// Warps per workgroup of the mma.sync prefill, 4 or 8 (AttentionOptions::mma_warps).
    #[arg(long)]
    pub(crate) mma_warps: Option<u32>,
    /// Whether the mma.sync prefill rescales its output only on tiles where a row's max moved
    /// (AttentionOptions::mma_lazy_rescale): `true` or `false`.
    #[arg(long)]
    pub(crate) mma_lazy_rescale: Option<bool>,
    /// K/V tile buffers of the mma.sync prefill, 1 to 3 (AttentionOptions::mma_stages).
    #[arg(long)]
    pub(crate) mma_stages: Option<u32>,
    /// Whether the mma.sync prefill's tiles are XOR-swizzled rather than padded
    /// (AttentionOptions::mma_swizzle): `true` or `false`.
    #[arg(long)]
    pub(crate) mma_swizzle: Option<bool>,
    /// Whether the mma.sync prefill keeps Q in shared memory (AttentionOptions::mma_q_shared):
    /// `true` or `false`.
    #[arg(long)]
    pub(crate) mma_q_shared: Option<bool>,
    /// The mma.sync prefill's exponentials, 0 to 2 (AttentionOptions::mma_half_exp).
    #[arg(long)]
    pub(crate) mma_half_exp: Option<u32>,
    /// Whether the tiled prefill loads its next staging step during the current one
    /// (AttentionOptions::tiled_prefetch): `true` or `false`; without it, the default.
    #[arg(long)]
    pub(crate) tiled_prefetch: Option<bool>,
    /// Times the prefill runs; the bench line reports the median. Above 1, the runs after the
    /// first attend over the K/V it wrote (Attention::prefill_cached), untimed ones for at
    /// least 300 ms first (the GPU leaves its idle clocks only under sustained load), then
    /// these timed ones. With `--layer mha` every run is the whole layer's prefill (projections,
    /// cache append, attention) of the same prompt into an emptied cache, with the same warm-up.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) prefill_runs: u32,
    /// Multiplies the random queries (uniform in [-1, 1)): larger scores make the softmax's running
    /// max move, which exercises its rescaling.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) q_scale: f32,
    /// Workgroups a vectorized decode aims for (AttentionOptions::decode_workgroups).
    #[arg(long)]
    pub(crate) workgroups: Option<u32>,
    /// Invocations per workgroup of the vectorized decode (AttentionOptions::decode_local_size).
    #[arg(long)]
    pub(crate) decode_local: Option<u32>,
    /// Fewest positions per split of the vectorized decode (AttentionOptions::decode_split_min);
    /// without it, the device's default.
    #[arg(long)]
    pub(crate) decode_split_min: Option<u32>,
    /// Rows in flight per lane group of the vectorized decode (AttentionOptions::decode_rows).
    #[arg(long)]
    pub(crate) decode_rows: Option<u32>,
    /// Grouped-query decode with one workgroup per query head (AttentionOptions::decode_spread):
    /// `true` or `false`; without it, the default.
    #[arg(long)]
    pub(crate) decode_spread: Option<bool>,
    /// Vectorized decode loads the next rows while using the current ones
    /// (AttentionOptions::decode_prefetch): `true` or `false`; without it, the default.
    #[arg(long)]
    pub(crate) decode_prefetch: Option<bool>,
    /// Vectorized decode splits take the positions block-cyclically
    /// (AttentionOptions::decode_cyclic): `true` or `false`; without it, the device's default.
    #[arg(long)]
    pub(crate) decode_cyclic: Option<bool>,
    /// Vectorized decode on Vulkan combines all query heads at once where they fit
    /// (AttentionOptions::decode_combine_all): `true` or `false`; without it, the default.
    #[arg(long)]
    pub(crate) decode_combine_all: Option<bool>,
    /// Vectorized decode on Vulkan shares a row's query heads out among its lanes where the
    /// group allows (AttentionOptions::decode_head_lanes): `true` or `false`; without it, the
    /// default.
    #[arg(long)]
    pub(crate) decode_head_lanes: Option<bool>,
    /// Vectorized decode on Vulkan loads 8-byte chunks, up to 32 lanes per row
    /// (AttentionOptions::decode_narrow): `true` or `false`; without it, the default.
    #[arg(long)]
    pub(crate) decode_narrow: Option<bool>,
    /// Vectorized decode on Vulkan merges every query head's row groups at once
    /// (AttentionOptions::decode_merge_all): `true` or `false`; without it, the default.
    #[arg(long)]
    pub(crate) decode_merge_all: Option<bool>,
    /// Vectorized decode on Vulkan reduces each head's split maxima and sums in parallel in the
    /// all-heads combination (AttentionOptions::decode_scan): `true` or `false`; without it, the
    /// default.
    #[arg(long)]
    pub(crate) decode_scan: Option<bool>,
    /// Vectorized decode on Vulkan finds each head's row-group max and sum once when it merges
    /// the heads one after another (AttentionOptions::decode_merge_once): `true` or `false`;
    /// without it, the default.
    #[arg(long)]
    pub(crate) decode_merge_once: Option<bool>,
    /// Vulkan: build the kernels from their GLSL (kernels/*.comp, embedded in kpc) through the SPIR-V
    /// cache instead of from the committed SPIR-V; each kernel's line then says where its SPIR-V came
    /// from (compiled, memory, disk, ...).
    #[arg(long)]
    pub(crate) from_source: bool,
    /// Never wait for a specialized kernel's build (AttentionOptions::lazy): while one is not in a
    /// cache layer, prefills and decode steps run on the generic attn_generic (shapes in push
    /// constants) and the specialized kernels build in the background; the report counts what ran
    /// on which, and what was swapped in.
    #[arg(long)]
    pub(crate) lazy: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PrefillArg {
    Auto,
    Generic,
    Tiled,
    Cooperative,
    /// The VK_NV_cooperative_matrix2 kernel (attn_prefill_cm2).
    Cm2,
    /// The OpenCL mma.sync kernel through inline PTX (attn_prefill_mma; NVIDIA, sm_80+).
    Mma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ProjectionArg {
    Auto,
    Tiled,
    Matvec,
    Cooperative,
    /// mha_gemm_wide: the cooperative-matrix GEMM with the wide feed.
    Wide,
    /// mha_gemm_mma: OpenCL C with inline PTX mma.sync (NVIDIA's OpenCL, sm_80 and later).
    Mma,
}

impl ProjectionArg {
    /// The layer's setting.
    pub(crate) fn kernel(self) -> kpc_attention::ProjectionKernel {
        use kpc_attention::ProjectionKernel as P;
        match self {
            ProjectionArg::Auto => P::Auto,
            ProjectionArg::Tiled => P::Tiled,
            ProjectionArg::Matvec => P::MatVec,
            ProjectionArg::Cooperative => P::Cooperative,
            ProjectionArg::Wide => P::Wide,
            ProjectionArg::Mma => P::Mma,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DecodeArg {
    Auto,
    Generic,
    Vectorized,
    /// The cooperative-matrix decode (Vulkan, fp16 K/V; never chosen by auto).
    Cooperative,
}

fn selector(args: &Args, config: &Config) -> kpc::Result<DeviceSelector> {
    let backend = args.backend.map(|b| match b {
        BackendArg::Vulkan => "vulkan",
        BackendArg::Opencl => "opencl",
    });
    let text = match (backend, args.device.as_deref()) {
        (_, Some(d)) if d.contains(':') => d.to_string(),
        (Some(b), Some(d)) => format!("{b}:{d}"),
        (None, Some(d)) => format!("any:{d}"),
        (Some(b), None) => format!("{b}:0"),
        (None, None) => return Ok(config.device),
    };
    Ok(DeviceSelector::parse(&text)?)
}

/// What `kpc attention` runs with: the device, shape, K/V type and attention options its arguments
/// select. `kpc cache explain` takes the same arguments and so looks at the same kernels.
pub struct Plan {
    pub device: kpc::DeviceInfo,
    pub shape: AttentionShape,
    pub dtype: KvDtype,
    pub options: AttentionOptions,
}

/// The [`Plan`] `args` select under `config`.
pub fn plan(config: &Config, args: &Args) -> kpc::Result<Plan> {
    let shape = AttentionShape {
        batch: args.batch,
        q_heads: args.heads,
        kv_heads: args.kv_heads.unwrap_or(args.heads),
        head_dim: args.head_dim,
    };
    shape.validate()?;
    if args.prompt == 0 {
        return Err(Error::InvalidArgument("--prompt must be at least 1".into()));
    }
    let dtype = match args.kv {
        KvArg::F16 => KvDtype::F16,
        KvArg::F32 => KvDtype::F32,
    };
    let device = select_device(&selector(args, config)?)?;
    let mut options = AttentionOptions::for_device(&device);
    // Explicit sizes are taken as given: Attention::new rejects what the device cannot run.
    options.decode = match args.decode_kernel {
        DecodeArg::Auto => DecodeKernel::Auto,
        DecodeArg::Generic => DecodeKernel::Generic,
        DecodeArg::Vectorized => DecodeKernel::Vectorized,
        DecodeArg::Cooperative => DecodeKernel::Cooperative,
    };
    options.prefill = match args.prefill_kernel {
        PrefillArg::Auto => PrefillKernel::Auto,
        PrefillArg::Generic => PrefillKernel::Generic,
        PrefillArg::Tiled => PrefillKernel::Tiled,
        PrefillArg::Cooperative => PrefillKernel::Cooperative,
        PrefillArg::Cm2 => PrefillKernel::Cm2,
        PrefillArg::Mma => PrefillKernel::Mma,
    };
    if !args.q_scale.is_finite() {
        return Err(kpc::Error::InvalidArgument(format!(
            "--q-scale {} is not a finite number",
            args.q_scale
        )));
    }
    if let Some(r) = args.coop_rows {
        options.coop_rows = r;
    }
    if let Some(b) = args.mma_row_blocks {
        options.mma_row_blocks = b;
    }
    if let Some(k) = args.mma_keys {
        options.mma_keys = k;
    }
    if let Some(w) = args.mma_warps {
        options.mma_warps = w;
    }
    if let Some(l) = args.mma_lazy_rescale {
        options.mma_lazy_rescale = l;
    }
    if let Some(s) = args.mma_stages {
        options.mma_stages = s;
    }
    if let Some(s) = args.mma_swizzle {
        options.mma_swizzle = s;
    }
    if let Some(q) = args.mma_q_shared {
        options.mma_q_shared = q;
    }
    if let Some(h) = args.mma_half_exp {
        options.mma_half_exp = h;
    }
    if let Some(b) = args.coop_row_blocks {
        options.coop_row_blocks = b;
    }
    if let Some(k) = args.coop_keys {
        options.coop_keys = k;
    }
    if let Some(p) = args.coop_prefetch {
        options.coop_prefetch = p;
    }
    if let Some(q) = args.coop_q_shared {
        options.coop_q_shared = q;
    }
    if let Some(d) = args.coop_double {
        options.coop_double = d;
    }
    if let Some(h) = args.coop_half_exp {
        options.coop_half_exp = h;
    }
    if let Some(r) = args.coop_registers {
        options.coop_registers = r;
    }
    if let Some(r) = args.cm2_rows {
        options.cm2_rows = r;
    }
    if let Some(k) = args.cm2_keys {
        options.cm2_keys = k;
    }
    if let Some(l) = args.cm2_local {
        options.cm2_local_size = l;
    }
    if let Some(p) = args.tiled_prefetch {
        options.tiled_prefetch = p;
    }
    if let Some(w) = args.workgroups {
        options.decode_workgroups = w;
    }
    if let Some(l) = args.decode_local {
        options.decode_local_size = l;
    }
    if let Some(c) = args.decode_split_min {
        options.decode_split_min = c;
    }
    if let Some(r) = args.decode_rows {
        options.decode_rows = r;
    }
    if let Some(s) = args.decode_spread {
        options.decode_spread = s;
    }
    if let Some(p) = args.decode_prefetch {
        options.decode_prefetch = p;
    }
    if let Some(c) = args.decode_cyclic {
        options.decode_cyclic = c;
    }
    if let Some(c) = args.decode_combine_all {
        options.decode_combine_all = c;
    }
    if let Some(h) = args.decode_head_lanes {
        options.decode_head_lanes = h;
    }
    if let Some(n) = args.decode_narrow {
        options.decode_narrow = n;
    }
    if let Some(m) = args.decode_merge_all {
        options.decode_merge_all = m;
    }
    if let Some(s) = args.decode_scan {
        options.decode_scan = s;
    }
    if let Some(m) = args.decode_merge_once {
        options.decode_merge_once = m;
    }
    options.from_source = args.from_source;
    options.lazy = args.lazy;
    Ok(Plan {
        device,
        shape,
        dtype,
        options,
    })
}
