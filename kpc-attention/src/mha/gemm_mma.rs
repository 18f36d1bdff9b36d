//! `mha_gemm_mma`: the projection GEMM on NVIDIA's OpenCL through inline PTX (`mma.sync` m16n8k16
//! fp16 products into fp32 sums, `ldmatrix` fragment loads, `cp.async` 16-byte global -> shared
//! copies in a multi-stage pipeline, a swizzled shared layout): the role `mha_gemm_wide`
//! ([`super::gemm`]) plays on Vulkan, with the same operands, push constants and edge handling
//! ([`GemmShape`]). Only devices whose OpenCL compiler takes the PTX run it ([`crate::ptx`]);
//! everywhere else it is refused with [`Error::Unsupported`] before anything else is built.

use std::fmt;

use kpc::{Buffer, BufferArg, Context, Kernel, LaunchDesc};
use kpc::{Error, Result};
use kpc::{SpecConstants, SpecValue};

use super::gemm::GemmShape;

/// The kernel's name (and its image's).
pub const KERNEL: &str = "mha_gemm_mma";

/// Shared memory a workgroup may use on the devices this kernel targets (NVIDIA's OpenCL allows
/// 48 KiB of `local` memory per workgroup).
const SHARED_LIMIT: u32 = 48 * 1024;

/// A workgroup tile of `mha_gemm_mma`: `warps_m x warps_n` warps own a `bm x bn` block of C, K
/// advancing 32 per step through `stages` shared-memory stages; `pipelined` selects the kernel's
/// `PIPELINED` mainloop (fragments double-buffered in registers, copy addresses hoisted out of the
/// K loop, workgroups in bands of 8 tile rows, serpentine products), `hoisted` the same knobs
/// without the double-buffered fragments (the kernel's `HOISTED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MmaTiles {
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// Warps along M.
    pub warps_m: u32,
    /// Warps along N.
    pub warps_n: u32,
    /// Shared-memory stages (2 to 4): copies run `stages - 1` K steps ahead of the products.
    pub stages: u32,
    /// The `PIPELINED` mainloop (else the plain one: all of a step's fragments loaded after its
    /// barrier).
    pub pipelined: bool,
    /// The kernel's `HOISTED` knobs: copy addresses hoisted out of the K loop, workgroups in bands
    /// of 8 tile rows, serpentine products, with the plain mainloop's fragment loads (the
    /// `PIPELINED` mainloop has them all already).
    pub hoisted: bool,
}

/// The tile the layer runs (with fp16 activations, f32 ones cast first): 128 x 128 over 2 x 4
/// warps (64 x 32 of C each), three stages (48 KiB), the plain mainloop with the `HOISTED` knobs.
/// Without them ([`PLAIN_TILES`]) it led the first sweep at every shape of the issue (session 7);
/// in session 8's harness on an H200 (BENCHMARKS.md) the knobs made it faster at every shape:
/// M = 2048 and 8192 at N = 4096 and 1024 (K = 4096) 228, 235, 181 and 227 TFLOP/s against 223,
/// 231, 175 and 226, and at the fused Q/K/V projection (N = 12288) 227 and 234 against 210 and
/// 210. The `PIPELINED` 128 x 128 over 2 x 2 warps ([`PIPELINED_TILES`]) is faster at N = 4096
/// and 2048 x 1024 but not at N = 12288 (211 and 217), and made the layer slower through kpc in
/// session 7.
pub const LAYER_TILES: MmaTiles = MmaTiles::new(128, 128, 2, 4, 3).with_hoist();

/// The layer's tile before session 8: [`LAYER_TILES`] without the `HOISTED` knobs.
pub const PLAIN_TILES: MmaTiles = MmaTiles::new(128, 128, 2, 4, 3);

/// 128 x 128 over 2 x 2 warps (64 x 64 of C each), three stages, the `PIPELINED` mainloop: the
/// harness's fastest at N = 4096 and at 2048 x 1024 (session 7, BENCHMARKS.md).
pub const PIPELINED_TILES: MmaTiles = MmaTiles::new(128, 128, 2, 2, 3).with_pipeline();

/// The tiles the harness (benches/ocl_gemm_mma.c) measures, and the tests check.
pub const SWEEP_TILES: &[MmaTiles] = &[
    MmaTiles::new(128, 256, 2, 4, 2),
    MmaTiles::new(128, 128, 2, 2, 3),
    MmaTiles::new(128, 128, 2, 2, 2),
    PLAIN_TILES,
    LAYER_TILES,
    MmaTiles::new(256, 128, 4, 2, 2),
    MmaTiles::new(64, 128, 1, 2, 4),
    PIPELINED_TILES,
    MmaTiles::new(128, 128, 2, 4, 3).with_pipeline(),
];

impl MmaTiles {
    /// A tile.
    pub const fn new(bm: u32, bn: u32, warps_m: u32, warps_n: u32, stages: u32) -> MmaTiles {
        MmaTiles {
            bm,
            bn,
            warps_m,
            warps_n,
            stages,
            pipelined: false,
            hoisted: false,
        }
    }

    /// The same tile with the `HOISTED` knobs.
    pub const fn with_hoist(self) -> MmaTiles {
        MmaTiles {
            hoisted: true,
            ..self
        }
    }

    /// The same tile with the `PIPELINED` mainloop.
    pub const fn with_pipeline(self) -> MmaTiles {
        MmaTiles {
            pipelined: true,
            ..self
        }
    }

    /// Work-items per workgroup.
    pub fn invocations(&self) -> u32 {
        32 * self.warps_m * self.warps_n
    }

    /// Bytes of shared memory: per stage, 64 bytes (32 halves of K) per row of A and of W.
    pub fn shared_bytes(&self) -> u32 {
        self.stages * (self.bm + self.bn) * 64
    }

    /// Why the kernel cannot run this tile, if it cannot (the conditions its `#error` checks, and
    /// the shared-memory limit).
    pub fn malformed(&self) -> Option<String> {
        let MmaTiles {
            bm,
            bn,
            warps_m,
            warps_n,
            stages,
            ..
        } = *self;
        if warps_m == 0 || warps_n == 0 || bm % (16 * warps_m) != 0 || bn % (16 * warps_n) != 0 {
            return Some(format!(
                "{bm} x {bn} does not split into {warps_m} x {warps_n} warps of whole 16 x 16 blocks"
            ));
        }
        let inv = self.invocations();
        if (bm * 4) % inv != 0 || (bn * 4) % inv != 0 {
            return Some(format!(
                "its {inv} work-items do not share its tiles' 16-byte chunks evenly"
            ));
        }
        if !(2..=4).contains(&stages) {
            return Some(format!("{stages} stages (2, 3 or 4)"));
        }
        if self.shared_bytes() > SHARED_LIMIT {
            return Some(format!(
                "its {stages} stages need {} bytes of shared memory; at most {SHARED_LIMIT}",
                self.shared_bytes()
            ));
        }
        None
    }
}

impl fmt::Display for MmaTiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{}/{}x{}s{}{}{}",
            self.bm,
            self.bn,
            self.warps_m,
            self.warps_n,
            self.stages,
            if self.pipelined { "+pipe" } else { "" },
            if self.hoisted { "+hrs" } else { "" }
        )
    }
}

/// `mha_gemm_mma` built for one tile and activation type.
#[derive(Debug)]
pub struct MmaGemm {
    kernel: Kernel,
    tiles: MmaTiles,
    a_f16: bool,
}

impl MmaGemm {
    /// The kernel for `tiles` with fp16 (`a_f16`) or f32 activations, through the context's caches.
    ///
    /// Errors: [`Error::Unsupported`] where the device's OpenCL compiler does not take the inline
    /// PTX ([`crate::ptx::require_inline_ptx`]: any Vulkan device, PoCL, NVIDIA before sm_80);
    /// [`Error::InvalidArgument`] for a tile the kernel cannot run; what building it returns.
    pub fn new(ctx: &Context, tiles: MmaTiles, a_f16: bool) -> Result<MmaGemm> {
        if let Some(why) = tiles.malformed() {
            return Err(Error::InvalidArgument(format!(
                "mma GEMM tile {tiles}: {why}"
            )));
        }
        crate::ptx::require_inline_ptx(ctx, KERNEL)?;
        let u = SpecValue::U32;
        let spec = SpecConstants::new()
            .with(0, u(u32::from(a_f16)))
            .with(1, u(tiles.bm))
            .with(2, u(tiles.bn))
            .with(3, u(tiles.warps_m))
            .with(4, u(tiles.warps_n))
            .with(5, u(tiles.stages))
            .with(6, u(u32::from(tiles.pipelined)))
            .with(7, u(u32::from(tiles.hoisted)));
        let kernel = crate::shipped_kernel(ctx, KERNEL, &spec)?;
        Ok(MmaGemm {
            kernel,
            tiles,
            a_f16,
        })
    }

    /// The built kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Its tile.
    pub fn tiles(&self) -> MmaTiles {
        self.tiles
    }

    /// Whether it reads fp16 activations (else f32).
    pub fn a_f16(&self) -> bool {
        self.a_f16
    }

    /// Workgroups for an `m x n` output.
    pub fn groups(&self, m: usize, n: usize) -> [usize; 2] {
        [
            n.div_ceil(self.tiles.bn as usize),
            m.div_ceil(self.tiles.bm as usize),
        ]
    }

    /// Records one launch of `shape` into `batch`: `a` (f32, or fp16 as `u16` where the kernel was
    /// built for fp16 activations), `w` (`[n][k]` fp16 pairs), `bias` (`n`), and the three outputs
    /// (the same buffer may stand for unused ones).
    ///
    /// Errors: [`Error::InvalidArgument`] for a shape the kernel cannot compute
    /// ([`GemmShape::unfit`]), more workgroups than the device allows, or buffers smaller than the
    /// shape needs.
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
    ) -> Result<()> {
        let groups = self.groups(shape.m, shape.n);
        let args: [&dyn BufferArg; 6] = [a, w, bias, outs[0], outs[1], outs[2]];
        shape.check_launch(KERNEL, ctx, self.a_f16, args, groups, &self.tiles)?;
        let push = shape.push_constants();
        // Every buffer was checked above against the shape the kernel indexes by.
        batch.add(&[LaunchDesc {
            kernel: &self.kernel,
            groups: [groups[0] as u32, groups[1] as u32, 1],
            buffers: &args,
            push_constants: push.as_bytes(),
        }]);
        Ok(())
    }

    /// Submits one launch of `shape`: `a` (f32, or fp16 as `u16` where the kernel was built for
    /// fp16 activations), `w` (`[n][k]` fp16 pairs), `bias` (`n`), and the three outputs (the same
    /// buffer may stand for unused ones).
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
    ) -> Result<kpc::Event> {
        let mut batch = crate::launch::Batch::new();
        self.record(&mut batch, ctx, a, w, bias, outs, shape)?;
        batch.submit(&ctx.queue())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_tiles_fit_and_bad_tiles_say_why() {
        for t in SWEEP_TILES {
            assert_eq!(t.malformed(), None, "{t}");
            assert!(t.shared_bytes() <= SHARED_LIMIT, "{t}");
        }
        assert_eq!(LAYER_TILES.to_string(), "128x128/2x4s3+hrs");
        assert_eq!(PLAIN_TILES.to_string(), "128x128/2x4s3");
        assert_eq!(LAYER_TILES, PLAIN_TILES.with_hoist());
        assert_eq!(LAYER_TILES.invocations(), 256);
        assert_eq!(PIPELINED_TILES.to_string(), "128x128/2x2s3+pipe");
        assert_eq!(PIPELINED_TILES.invocations(), 128);
        assert_eq!(PIPELINED_TILES.shared_bytes(), 48 * 1024);
        assert_eq!(LAYER_TILES.shared_bytes(), 48 * 1024);
        assert!(
            MmaTiles::new(128, 256, 2, 4, 3)
                .malformed()
                .unwrap()
                .contains("shared")
        );
        assert!(
            MmaTiles::new(128, 128, 2, 2, 5)
                .malformed()
                .unwrap()
                .contains("stages")
        );
        assert!(MmaTiles::new(100, 128, 2, 2, 2).malformed().is_some());
        assert!(MmaTiles::new(128, 128, 0, 2, 2).malformed().is_some());
    }

    /// The spec constants `MmaGemm::new` sets are the kernel's: an index the source does not
    /// declare would leave the knob at its default (the layer's `hoisted` silently off).
    #[test]
    fn the_kernel_declares_every_spec_constant_the_builder_sets() {
        let src = include_str!("../../kernels/mha_gemm_mma.cl");
        for (i, name) in [
            "A_F16",
            "BM",
            "BN",
            "WARPS_M",
            "WARPS_N",
            "STAGES",
            "PIPELINED",
            "HOISTED",
        ]
        .iter()
        .enumerate()
        {
            let line = format!("// kpc-spec-constant {i} {name}\n");
            assert!(src.contains(&line), "{line}");
        }
    }
}
