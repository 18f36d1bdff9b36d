//! `mha_gemm_wide`: the projection GEMM built around how its operands reach the matrix units
//! (16-byte loads, padded shared tiles, 64 x 64 of C per subgroup, the next K step held in
//! registers while the current one is multiplied): its tile shapes, where it runs, and its launch.
//! The layer picks it for its projections where it fits ([`super::ProjectionKernel`]); `kpc
//! bench-mma` sweeps its tiles against the device's ceiling.
//!
//! It computes what `mha_gemm` and `mha_gemm_coop` compute, with the same buffers and push
//! constants: `C = A W^T + bias` for fp16 weights `W` (`[N][K]`, two halves per `u32`) and f32 or
//! fp16 activations `A` (`[M][K]` row-major, or split by heads), into up to three outputs taking
//! consecutive column ranges (row-major or split by heads), the first scaled by `alpha0`. The
//! products are fp16 (f32 activations are rounded as they are staged); the sums fp32, or fp16 with
//! [`GemmAccumulator::F16`].

use kpc::BackendKind;
use kpc::{Buffer, BufferArg, Context, Event, Kernel, LaunchDesc};
use kpc::{Error, Result};
use kpc::{SpecConstants, SpecValue};

mod tiles;
pub use tiles::{
    DEFAULT_TILES, GemmAccumulator, GemmShape, GemmTiles, SMALL_TILES, SWEEP_TILES,
    auto_candidates, auto_tiles, wide_unfit,
};

/// The kernel's name (and its image's).
pub const KERNEL: &str = "mha_gemm_wide";

/// `mha_gemm_wide` built for one tile, activation type and accumulator.
#[derive(Debug)]
pub struct WideGemm {
    kernel: Kernel,
    tiles: GemmTiles,
    a_f16: bool,
    acc: GemmAccumulator,
}

impl WideGemm {
    /// The kernel for `tiles` with fp16 (`a_f16`) or f32 activations and `acc` accumulators,
    /// through the context's caches.
    ///
    /// Errors: [`Error::Unsupported`] where the device cannot run it (no fp16 cooperative matrices,
    /// as on lavapipe, PoCL or any OpenCL device; no fp16 accumulators; a tile too large for it);
    /// [`Error::InvalidArgument`] for a malformed tile; what building the kernel returns.
    pub fn new(
        ctx: &Context,
        tiles: GemmTiles,
        a_f16: bool,
        acc: GemmAccumulator,
    ) -> Result<WideGemm> {
        if let Some(why) = tiles.malformed() {
            return Err(Error::InvalidArgument(format!("GEMM tile {tiles}: {why}")));
        }
        let device = ctx.device();
        if let Some(why) = wide_unfit(device, &tiles, acc) {
            return Err(Error::Unsupported {
                backend: device.backend,
                image: KERNEL.into(),
                needs: format!(
                    "16x16x16 fp16 cooperative matrices into {} accumulators, subgroups of 32 and \
                     a {tiles} tile",
                    match acc {
                        GemmAccumulator::F32 => "fp32",
                        GemmAccumulator::F16 => "fp16",
                    }
                ),
                reason: why,
            });
        }
        // Checked above: only a Vulkan device passes.
        debug_assert_eq!(device.backend, BackendKind::Vulkan);
        let stages = tiles.stages_on(device).map_err(Error::InvalidArgument)?;
        let tiles = GemmTiles { stages, ..tiles };
        let u = SpecValue::U32;
        let spec = SpecConstants::new()
            .with(0, u(tiles.invocations()))
            .with(1, u(tiles.bm))
            .with(2, u(tiles.bn))
            .with(3, u(tiles.bk))
            .with(4, u(tiles.sg_m))
            .with(5, u(tiles.sg_n))
            .with(6, SpecValue::Bool(a_f16))
            .with(7, SpecValue::Bool(acc == GemmAccumulator::F16))
            .with(8, u(stages))
            .with(9, u(tiles.ahead))
            .with(11, SpecValue::Bool(tiles.early));
        let kernel = crate::shipped_kernel(ctx, KERNEL, &spec)?;
        Ok(WideGemm {
            kernel,
            tiles,
            a_f16,
            acc,
        })
    }

    /// The built kernel (its driver statistics name its registers on NVIDIA).
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The tile, with the stages it runs with.
    pub fn tiles(&self) -> GemmTiles {
        self.tiles
    }

    /// Whether it reads fp16 activations (else f32).
    pub fn a_f16(&self) -> bool {
        self.a_f16
    }

    /// Its accumulators.
    pub fn accumulator(&self) -> GemmAccumulator {
        self.acc
    }

    /// Workgroups for an `m x n` output.
    pub fn groups(&self, m: usize, n: usize) -> [usize; 2] {
        [
            n.div_ceil(self.tiles.bn as usize),
            m.div_ceil(self.tiles.bm as usize),
        ]
    }

    /// Submits `repeats` launches of `shape` as one batch: `a` (f32, or fp16 as `u16` where the
    /// kernel was built for fp16 activations), `w` (`[n][k]` fp16 pairs), `bias` (`n`), and the three
    /// outputs (the same buffer may stand for unused ones).
    ///
    /// Errors: [`Error::InvalidArgument`] for a shape the kernel cannot compute
    /// ([`GemmShape::unfit`]), more workgroups than the device allows, or buffers smaller than the
    /// shape needs; what the submission returns.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        ctx: &Context,
        a: &dyn BufferArg,
        w: &Buffer<u32>,
        bias: &Buffer<f32>,
        outs: [&Buffer<f32>; 3],
        shape: &GemmShape,
        repeats: usize,
    ) -> Result<Event> {
        let mut batch = crate::launch::Batch::new();
        self.record(&mut batch, ctx, a, w, bias, outs, shape, repeats)?;
        batch.submit(&ctx.queue())
    }

    /// [`WideGemm::launch`] recorded into `batch`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        batch: &mut crate::launch::Batch,
        ctx: &Context,
        a: &dyn BufferArg,
        w: &Buffer<u32>,
        bias: &Buffer<f32>,
        outs: [&Buffer<f32>; 3],
        shape: &GemmShape,
        repeats: usize,
    ) -> Result<()> {
        let groups = self.groups(shape.m, shape.n);
        let args: [&dyn BufferArg; 6] = [a, w, bias, outs[0], outs[1], outs[2]];
        shape.check_launch(KERNEL, ctx, self.a_f16, args, groups, &self.tiles)?;
        let push = shape.push_constants();
        let one = LaunchDesc {
            kernel: &self.kernel,
            groups: [groups[0] as u32, groups[1] as u32, 1],
            buffers: &args,
            push_constants: push.as_bytes(),
        };
        let launches: Vec<LaunchDesc<'_>> =
            (0..repeats.max(1)).map(|_| LaunchDesc { ..one }).collect();
        // Every buffer was checked above against the shape the kernel indexes by.
        batch.add(&launches);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_parse_print_and_refuse_what_the_kernel_cannot_split() {
        let t = GemmTiles::parse("128x256x32/2x4").unwrap();
        assert_eq!(t, DEFAULT_TILES);
        assert_eq!(t.to_string(), "128x256x32/2x4");
        assert_eq!(t.invocations(), 256);
        assert_eq!(t.shared_bytes(1), 384 * 5 * 16);
        let s = GemmTiles::parse("128x128x64/2x2s1").unwrap();
        assert_eq!((s.bk, s.stages), (64, 1));
        assert_eq!(s.to_string(), "128x128x64/2x2s1");
        let a = GemmTiles::parse("128x256x32/2x4s2a2").unwrap();
        assert_eq!((a.stages, a.ahead), (2, 2));
        assert_eq!(a.to_string(), "128x256x32/2x4s2a2");
        let e = GemmTiles::parse("128x256x32/2x4a2e").unwrap();
        assert_eq!(e, DEFAULT_TILES.with_ahead(2).with_early(true));
        assert_eq!(e.to_string(), "128x256x32/2x4a2e");
        assert_eq!(
            GemmTiles::parse("128x256x32/2x4a2").unwrap(),
            DEFAULT_TILES.with_ahead(2)
        );
        for bad in [
            "128x256x48/2x4",
            "128x256x8/2x4",
            "128x256/2x4",
            "100x256x32/2x4",
            "128x256x32/2x4s3",
            "128x256x32/2x4a3",
            "128x256x32",
            "16x16x32/1x2",
        ] {
            assert!(
                matches!(GemmTiles::parse(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
        for t in SWEEP_TILES {
            assert_eq!(t.malformed(), None, "{t}");
        }
    }

    #[test]
    fn auto_tiles_take_the_wide_tile_unless_it_leaves_sms_idle() {
        let mut d = crate::choice::tests::device(true, 256);
        d.limits.max_workgroup_count = [65535; 3];
        assert_eq!(auto_candidates(&d), [DEFAULT_TILES, SMALL_TILES]);
        assert_eq!(auto_tiles(&d, 2048, 4096), Some(DEFAULT_TILES));
        assert_eq!(auto_tiles(&d, 2048, 12288), Some(DEFAULT_TILES));
        assert_eq!(auto_tiles(&d, 2048, 1024), Some(SMALL_TILES));
        assert_eq!(auto_tiles(&d, 10, 64), Some(SMALL_TILES));
        assert_eq!(auto_tiles(&d, usize::MAX, usize::MAX), Some(DEFAULT_TILES));
        // No room for two stages of 128 x 256: one, as on the H100's 48 KiB.
        assert_eq!(DEFAULT_TILES.stages_on(&d), Ok(1));
        assert_eq!(SMALL_TILES.stages_on(&d), Ok(1));
        assert_eq!(GemmTiles::new(128, 128, 32, 2, 4).stages_on(&d), Ok(2));
        // Without matrices (lavapipe): nothing.
        let none = crate::choice::tests::device(false, 0);
        assert!(auto_candidates(&none).is_empty());
        assert_eq!(auto_tiles(&none, 2048, 4096), None);
        assert!(wide_unfit(&none, &DEFAULT_TILES, GemmAccumulator::F32).is_some());
    }

    #[test]
    fn shapes_need_whole_chunks() {
        assert_eq!(GemmShape::plain(5, 64, 32).unfit(), None);
        assert!(GemmShape::plain(5, 64, 36).unfit().is_some());
        assert!(GemmShape::plain(5, 60, 32).unfit().is_some());
        let mut s = GemmShape::plain(5, 64, 32);
        s.c_seq = 5;
        s.head_dim = 12;
        assert!(s.unfit().is_some());
        // 32-bit offsets: 2^16 x 2^16 elements of C is one too many, and no product overflows.
        assert_eq!(
            GemmShape::plain(1 << 16, 1 << 16, 8)
                .unfit()
                .map(|w| w.starts_with("C")),
            Some(true)
        );
        assert_eq!(
            GemmShape::plain(1 << 20, 8, 1 << 12)
                .unfit()
                .map(|w| w.starts_with("A")),
            Some(true)
        );
        assert!(
            GemmShape::plain(usize::MAX, 8, usize::MAX - 7)
                .unfit()
                .is_some()
        );
        assert_eq!(GemmShape::plain(1 << 16, 4096, 4096).unfit(), None);
        assert_eq!(GemmShape::plain(2, 3, 4).flops(), 48.0);
    }
}
