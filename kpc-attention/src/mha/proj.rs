//! The projection kernels: `mha_gemm` (tiled, any shape, head-split layouts), `mha_gemm_coop` (the
//! same on the matrix units, fp16 weights), `mha_gemm_wide` (the same with a feed built for the
//! matrix units: [`super::gemm`]), `mha_gemm_mma` (OpenCL on NVIDIA through inline PTX:
//! [`super::gemm_mma`]) and `mha_gemv` (decode steps: matrix-vector, bound by reading the
//! weights), chosen per layer and launched into up to three outputs (fused Q/K/V).

use kpc::DeviceInfo;
use kpc::{Buffer, BufferArg, Context, Kernel, LaunchDesc, PushConstants};
use kpc::{Error, Result};
use kpc::{SpecConstants, SpecValue};

use super::gemm::{GemmAccumulator, GemmShape, WideGemm};
use super::gemm_mma::MmaGemm;
use super::weights::DeviceMatrix;
use super::{KvDtype, MAX_GEMV_BATCH, MhaParams, ProjectionKernel};
use crate::launch::Batch;

/// Output columns per `mha_gemm` workgroup, and rows.
const GEMM_TILE: usize = 64;
/// Output columns per `mha_gemv` workgroup (its `ROWS`).
const GEMV_ROWS: usize = 2;
/// Output rows and columns per `mha_gemm_coop` workgroup.
const COOP_TILE: usize = 128;

/// Where a projection's outputs go: up to three buffers taking consecutive column ranges, the first
/// scaled by `alpha0`.
pub(super) struct Outputs<'a> {
    pub(super) bufs: [&'a Buffer<f32>; 3],
    /// Columns of the first and second output (the third takes the rest).
    pub(super) n0: usize,
    pub(super) n1: usize,
    pub(super) alpha0: f32,
}

impl<'a> Outputs<'a> {
    /// Every column into `c`, unscaled.
    pub(super) fn one(c: &'a Buffer<f32>, n: usize) -> Outputs<'a> {
        Outputs {
            bufs: [c, c, c],
            n0: n,
            n1: 0,
            alpha0: 1.0,
        }
    }
}

/// The layer's projection kernels.
pub(super) struct Projector {
    gemm: Kernel,
    /// `mha_gemm_coop`, which then takes every projection `gemm` would.
    coop: Option<Kernel>,
    /// `mha_gemm_wide` for each tile `gemm::auto_tiles` may pick on this device, which then takes
    /// every projection `gemm` would (before `coop`).
    wide: Vec<WideGemm>,
    /// `mha_gemm_mma` reading fp16 activations, and `mha_cast` (f32 -> fp16) to give it them,
    /// which then take every projection `gemm` would.
    mma: Option<(MmaGemm, Kernel)>,
    gemv: Option<Kernel>,
    /// `mha_gemv` reading fp16 X (decode steps' fp16 inputs), where the input width allows.
    gemv_x16: Option<Kernel>,
    /// `mha_gemv` writing fp16 outputs (decode steps' fp16 outputs), where the width allows.
    gemv_c16: Option<Kernel>,
    head_dim: usize,
}

/// What a decode-step projection reads or writes in fp16.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Half {
    /// X is fp16.
    Input,
    /// The outputs take fp16.
    Output,
}

/// Why `mha_gemm_coop` cannot project `p`'s layer on `device`, if it cannot.
fn coop_unfit(device: &DeviceInfo, p: &MhaParams) -> Option<String> {
    if let Some(why) = crate::choice::coop_matrix_unfit(device) {
        return Some(why);
    }
    let l = &device.limits;
    if l.max_workgroup_invocations < 256 {
        return Some(format!(
            "it needs workgroups of 256 invocations; the device allows {}",
            l.max_workgroup_invocations
        ));
    }
    if p.weight_dtype != KvDtype::F16 {
        return Some("it needs fp16 weights".into());
    }
    // Each invocation stages 8 consecutive k of one row (16 bytes of W, 32 of A).
    for (name, k) in [
        ("qdim", p.qdim),
        ("kdim", p.kdim),
        ("vdim", p.vdim),
        ("embed_dim", p.embed_dim),
        ("head_dim", p.head_dim()),
    ] {
        if k % 8 != 0 {
            return Some(format!("{name} {k} is not a multiple of 8"));
        }
    }
    None
}

/// Why `mha_gemm_wide` cannot project `p`'s layer on `device`, if it cannot: what `mha_gemm_coop`
/// needs (fp16 weights, widths that are multiples of 8), and a tile that fits the device.
fn wide_unfit(device: &DeviceInfo, p: &MhaParams) -> Option<String> {
    coop_unfit(device, p).or_else(|| {
        super::gemm::wide_unfit(device, &super::gemm::DEFAULT_TILES, GemmAccumulator::F32)
    })
}

/// Why `mha_gemm_mma` cannot project `p`'s layer, if it cannot (what the device needs is the
/// inline-PTX probe's, [`crate::ptx`]): fp16 weights and widths that are multiples of 8 (every
/// access is a 16-byte chunk of 8 consecutive k).
fn mma_unfit(p: &MhaParams) -> Option<String> {
    if p.weight_dtype != KvDtype::F16 {
        return Some("it needs fp16 weights".into());
    }
    [
        ("qdim", p.qdim),
        ("kdim", p.kdim),
        ("vdim", p.vdim),
        ("embed_dim", p.embed_dim),
        ("head_dim", p.head_dim()),
    ]
    .into_iter()
    .find(|(_, k)| k % 8 != 0)
    .map(|(name, k)| format!("{name} {k} is not a multiple of 8"))
}

/// Why `mha_gemv` cannot project `p`'s decode steps, if it cannot.
fn gemv_unfit(p: &MhaParams) -> Option<String> {
    let per = 16 / p.weight_dtype.bytes();
    if p.batch > MAX_GEMV_BATCH {
        return Some(format!(
            "batch {} is more than the {MAX_GEMV_BATCH} sequences it serves",
            p.batch
        ));
    }
    // Decode steps project the query input (qdim wide) and the attention output (embed_dim).
    for (name, k) in [("qdim", p.qdim), ("embed_dim", p.embed_dim)] {
        if k % per != 0 {
            return Some(format!(
                "{name} {k} is not a multiple of {per} ({:?} weights per 16-byte load)",
                p.weight_dtype
            ));
        }
    }
    None
}

impl Projector {
    pub(super) fn new(ctx: &Context, p: &MhaParams) -> Result<Projector> {
        let f16 = SpecValue::U32(u32::from(p.weight_dtype == KvDtype::F16));
        let gemm =
            super::super::shipped_kernel(ctx, "mha_gemm", &SpecConstants::new().with(0, f16))?;
        let want_gemv = match p.projection {
            ProjectionKernel::Tiled => false,
            ProjectionKernel::Auto
            | ProjectionKernel::Cooperative
            | ProjectionKernel::Wide
            | ProjectionKernel::Mma => gemv_unfit(p).is_none(),
            ProjectionKernel::MatVec => match gemv_unfit(p) {
                None => true,
                Some(why) => {
                    return Err(Error::InvalidArgument(format!(
                        "the matrix-vector projection cannot run this layer: {why}"
                    )));
                }
            },
        };
        let gemv_with = |x16: bool, c16: bool| {
            super::super::shipped_kernel(
                ctx,
                "mha_gemv",
                &SpecConstants::new()
                    .with(0, f16)
                    .with(1, SpecValue::U32(p.batch as u32))
                    .with(2, SpecValue::U32(u32::from(x16)))
                    .with(3, SpecValue::U32(u32::from(c16))),
            )
        };
        let (gemv, gemv_x16, gemv_c16) = if want_gemv {
            // fp16 X is read 8 halves per 16-byte word; fp16 outputs are written in pairs.
            (
                Some(gemv_with(false, false)?),
                (p.qdim % 8 == 0)
                    .then(|| gemv_with(true, false))
                    .transpose()?,
                (p.qdim % 2 == 0)
                    .then(|| gemv_with(false, true))
                    .transpose()?,
            )
        } else {
            (None, None, None)
        };
        let want_wide = match p.projection {
            ProjectionKernel::Auto => wide_unfit(ctx.device(), p).is_none(),
            ProjectionKernel::Wide => match wide_unfit(ctx.device(), p) {
                None => true,
                Some(why) => {
                    return Err(Error::InvalidArgument(format!(
                        "the wide cooperative-matrix projection cannot run this layer: {why}"
                    )));
                }
            },
            _ => false,
        };
        // Every tile auto_tiles may pick, built now so that no projection waits for a build.
        let wide = if want_wide {
            super::gemm::auto_candidates(ctx.device())
                .into_iter()
                .map(|t| WideGemm::new(ctx, t, false, GemmAccumulator::F32))
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let want_coop = match p.projection {
            ProjectionKernel::Tiled
            | ProjectionKernel::MatVec
            | ProjectionKernel::Wide
            | ProjectionKernel::Mma => false,
            ProjectionKernel::Auto => wide.is_empty() && coop_unfit(ctx.device(), p).is_none(),
            ProjectionKernel::Cooperative => match coop_unfit(ctx.device(), p) {
                None => true,
                Some(why) => {
                    return Err(Error::InvalidArgument(format!(
                        "the cooperative-matrix projection cannot run this layer: {why}"
                    )));
                }
            },
        };
        let coop = if want_coop {
            Some(super::super::shipped_kernel(
                ctx,
                "mha_gemm_coop",
                &SpecConstants::new(),
            )?)
        } else {
            None
        };
        // OpenCL only (Vulkan devices with matrices took `wide` or `coop` above): measured 10x and
        // more ahead of `mha_gemm` on an H200 (BENCHMARKS.md).
        let want_mma = match p.projection {
            ProjectionKernel::Auto => {
                wide.is_empty()
                    && coop.is_none()
                    && mma_unfit(p).is_none()
                    && crate::ptx::auto_takes_inline_ptx(ctx)
            }
            ProjectionKernel::Mma => {
                crate::ptx::require_inline_ptx(ctx, super::gemm_mma::KERNEL)?;
                if let Some(why) = mma_unfit(p) {
                    return Err(Error::InvalidArgument(format!(
                        "the inline-PTX mma projection cannot run this layer: {why}"
                    )));
                }
                true
            }
            _ => false,
        };
        // fp16 activations cast by a pass of their own: measured on an H200 (BENCHMARKS.md), the
        // cast plus the fp16 kernel ran 1.2-1.3x the f32 kernel (which converts as it stages) at
        // N = 4096, and the fused Q/K/V projection is three times wider still.
        let mma = if want_mma {
            let gemm = MmaGemm::new(ctx, super::gemm_mma::LAYER_TILES, true)?;
            let cast = super::super::shipped_kernel(
                ctx,
                "mha_cast",
                &SpecConstants::new().with(0, SpecValue::U32(1)),
            )?;
            Some((gemm, cast))
        } else {
            None
        };
        Ok(Projector {
            gemm,
            coop,
            wide,
            mma,
            gemv,
            gemv_x16,
            gemv_c16,
            head_dim: p.head_dim(),
        })
    }

    pub(super) fn gemm_name(&self) -> &'static str {
        if !self.wide.is_empty() {
            super::gemm::KERNEL
        } else if self.mma.is_some() {
            super::gemm_mma::KERNEL
        } else if self.coop.is_some() {
            "mha_gemm_coop"
        } else {
            "mha_gemm"
        }
    }

    pub(super) fn has_gemv(&self) -> bool {
        self.gemv.is_some()
    }

    pub(super) fn kernels(&self) -> Vec<&Kernel> {
        std::iter::once(&self.gemm)
            .chain(self.coop.as_ref())
            .chain(self.wide.iter().map(WideGemm::kernel))
            .chain(self.mma.iter().flat_map(|(g, c)| [g.kernel(), c]))
            .chain(self.gemv.as_ref())
            .chain(self.gemv_x16.as_ref())
            .chain(self.gemv_c16.as_ref())
            .collect()
    }

    /// Whether decode steps can read (`Half::Input`) or write (`Half::Output`) fp16 directly.
    pub(super) fn has_half(&self, half: Half) -> bool {
        match half {
            Half::Input => self.gemv_x16.is_some(),
            Half::Output => self.gemv_c16.is_some(),
        }
    }

    /// A decode step's matrix-vector projection with fp16 X or fp16 outputs (`half`): `x` (`rows`
    /// rows of `w.k`) times `w` into `outs` (consecutive column ranges of `n0` and `n1`, the first
    /// scaled by `alpha0`). The caller checked [`Projector::has_half`] and every buffer's size.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn project_half(
        &self,
        batch: &mut Batch,
        ctx: &Context,
        half: Half,
        x: &dyn BufferArg,
        rows: usize,
        w: &DeviceMatrix,
        outs: [&dyn BufferArg; 3],
        (n0, n1, alpha0): (usize, usize, f32),
    ) -> Result<()> {
        let kernel = match half {
            Half::Input => self.gemv_x16.as_ref(),
            Half::Output => self.gemv_c16.as_ref(),
        }
        .ok_or_else(|| {
            Error::InvalidArgument("this layer has no fp16 matrix-vector projection".into())
        })?;
        let args: [&dyn BufferArg; 6] = [x, &w.w, &w.bias, outs[0], outs[1], outs[2]];
        gemv_launch(batch, ctx, kernel, &args, w, rows, n0, n1, alpha0)
    }

    /// `x` (`rows` rows of `w.k` features) times `w` into `out`. `a_seq` / `c_seq`: 0 for
    /// row-major, else the sequence length of a head-split layout (see kernels/mha_gemm.comp).
    /// Decode steps (`decode`) use `mha_gemv` where the layer has it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn project(
        &self,
        batch: &mut Batch,
        ctx: &Context,
        x: &Buffer<f32>,
        rows: usize,
        w: &DeviceMatrix,
        out: &Outputs<'_>,
        a_seq: usize,
        c_seq: usize,
        decode: bool,
    ) -> Result<()> {
        let args: [&dyn BufferArg; 6] = [x, &w.w, &w.bias, out.bufs[0], out.bufs[1], out.bufs[2]];
        let max_groups = ctx.device().limits.max_workgroup_count;
        if let (Some(gemv), true) = (&self.gemv, decode) {
            return gemv_launch(batch, ctx, gemv, &args, w, rows, out.n0, out.n1, out.alpha0);
        }
        let shape = GemmShape {
            m: rows,
            n: w.n,
            k: w.k,
            n0: out.n0,
            n1: out.n1,
            a_seq,
            c_seq,
            head_dim: self.head_dim,
            alpha0: out.alpha0,
        };
        if !self.wide.is_empty() {
            let tiles = super::gemm::auto_tiles(ctx.device(), rows, w.n);
            let wide = self
                .wide
                .iter()
                .find(|g| Some(g.tiles().with_stages(0)) == tiles)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "no mha_gemm_wide tile was built for a {rows} x {} projection",
                        w.n
                    ))
                })?;
            return wide.record(batch, ctx, x, &w.w, &w.bias, out.bufs, &shape, 1);
        }
        if let Some((mma, cast)) = &self.mma {
            if let Some(why) = shape.unfit() {
                return Err(Error::InvalidArgument(format!(
                    "mha_gemm_mma cannot compute a {rows} x {} x {} projection: {why}",
                    w.n, w.k
                )));
            }
            // The cast keeps the layout (row-major or split by heads): element for element.
            let elems = rows * w.k;
            if x.len() < elems {
                return Err(Error::InvalidArgument(format!(
                    "the projection's input holds {} values; {rows} rows of {} need {elems}",
                    x.len(),
                    w.k
                )));
            }
            let x16: Buffer<u16> = ctx.buffer(elems)?;
            let pairs = elems / 2;
            let groups = (pairs.div_ceil(256) as u32).clamp(1, max_groups[0].max(1));
            let push = PushConstants::new().u32(pairs as u32);
            batch.add(&[LaunchDesc {
                kernel: cast,
                groups: [groups, 1, 1],
                buffers: &[x, &x16],
                push_constants: push.as_bytes(),
            }]);
            return mma.record(batch, ctx, &x16, &w.w, &w.bias, out.bufs, &shape);
        }
        // The wide and mma kernels checked this in `unfit`; the tiled ones index the same way.
        if let Some(why) = shape.offsets_unfit() {
            return Err(Error::InvalidArgument(format!(
                "a {rows} x {} x {} projection is too large: {why}",
                w.n, w.k
            )));
        }
        let (kernel, tile) = match &self.coop {
            Some(coop) => (coop, COOP_TILE),
            None => (&self.gemm, GEMM_TILE),
        };
        let groups = [w.n.div_ceil(tile), rows.div_ceil(tile)];
        if groups[0] > max_groups[0] as usize || groups[1] > max_groups[1] as usize {
            return Err(Error::InvalidArgument(format!(
                "a {rows} x {} projection needs {groups:?} workgroups; the device allows {:?}",
                w.n, max_groups
            )));
        }
        let push = shape.push_constants();
        batch.add(&[LaunchDesc {
            kernel,
            groups: [groups[0] as u32, groups[1] as u32, 1],
            buffers: &args,
            push_constants: push.as_bytes(),
        }]);
        Ok(())
    }
}

/// Records one `mha_gemv` launch over `w`'s rows.
#[allow(clippy::too_many_arguments)]
fn gemv_launch(
    batch: &mut Batch,
    ctx: &Context,
    gemv: &Kernel,
    args: &[&dyn BufferArg; 6],
    w: &DeviceMatrix,
    rows: usize,
    n0: usize,
    n1: usize,
    alpha0: f32,
) -> Result<()> {
    let max_groups = ctx.device().limits.max_workgroup_count;
    let groups = w.n.div_ceil(GEMV_ROWS);
    if groups > max_groups[0] as usize {
        return Err(Error::InvalidArgument(format!(
            "{} output features need {groups} workgroups; the device allows {}",
            w.n, max_groups[0]
        )));
    }
    let push = PushConstants::new()
        .u32(rows as u32)
        .u32(w.n as u32)
        .u32(w.k as u32)
        .u32(n0 as u32)
        .u32(n1 as u32)
        .f32(alpha0);
    batch.add(&[LaunchDesc {
        kernel: gemv,
        groups: [groups as u32, 1, 1],
        buffers: args,
        push_constants: push.as_bytes(),
    }]);
    Ok(())
}
