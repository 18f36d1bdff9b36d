//! `mha_gemm_wide`'s tiles: their shape and how it is written (`128x256x32/2x4s2a2`), what a
//! device can run, and which tile the layer picks for a shape.

use std::fmt;

use kpc::{BufferArg, Context, DeviceInfo};
use kpc::{Error, PushConstants, Result};

/// A workgroup tile of `mha_gemm_wide`: `sg_m x sg_n` subgroups of 32 own a `bm x bn` block of C,
/// each a `(bm / sg_m) x (bn / sg_n)` part of it, and K advances `bk` per step through `stages`
/// shared-memory tiles, each step's chunks loaded into registers `ahead` steps early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmTiles {
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// K per step: 16, 32 or 64.
    pub bk: u32,
    /// Subgroups along M.
    pub sg_m: u32,
    /// Subgroups along N.
    pub sg_n: u32,
    /// Shared-memory tiles: 2 (the next step is stored into the other tile, one barrier per step)
    /// or 1 (stored into the same tile between two barriers); 0 takes 2 where they fit the
    /// device's shared memory, else 1.
    pub stages: u32,
    /// K steps whose chunks are in flight in registers: 1 or 2 (twice the staging registers).
    pub ahead: u32,
    /// With one stage: issue the next step's loads before the barrier that follows the store into
    /// shared memory rather than after it.
    pub early: bool,
}

/// The tile the layer takes where nothing else is known: 128 x 256 over 2 x 4 subgroups (64 x 64
/// of C each), K in steps of 32, stages as the device allows.
pub const DEFAULT_TILES: GemmTiles = GemmTiles::new(128, 256, 32, 2, 4);

/// The tiles `kpc bench-mma` sweeps by default (with fp16 activations and fp32 sums).
pub const SWEEP_TILES: &[GemmTiles] = &[
    GemmTiles::new(128, 256, 32, 2, 4),
    GemmTiles::new(128, 256, 32, 2, 4).with_early(true),
    GemmTiles::new(256, 128, 32, 4, 2),
    GemmTiles::new(128, 128, 64, 2, 4).with_ahead(2),
    GemmTiles::new(128, 128, 64, 2, 4)
        .with_ahead(2)
        .with_early(true),
    GemmTiles::new(128, 128, 64, 2, 4),
    GemmTiles::new(128, 128, 32, 2, 4),
    GemmTiles::new(128, 128, 32, 2, 2).with_ahead(2),
    GemmTiles::new(128, 256, 16, 2, 4),
];

impl GemmTiles {
    /// A tile whose stages the device decides (see [`GemmTiles::stages`]).
    pub const fn new(bm: u32, bn: u32, bk: u32, sg_m: u32, sg_n: u32) -> GemmTiles {
        GemmTiles {
            bm,
            bn,
            bk,
            sg_m,
            sg_n,
            stages: 0,
            ahead: 1,
            early: false,
        }
    }

    /// The same tile with `early` loads.
    pub const fn with_early(self, early: bool) -> GemmTiles {
        GemmTiles { early, ..self }
    }

    /// The same tile with `ahead` steps loaded early.
    pub const fn with_ahead(self, ahead: u32) -> GemmTiles {
        GemmTiles { ahead, ..self }
    }

    /// The same tile with `stages` (0: the device's choice).
    pub const fn with_stages(self, stages: u32) -> GemmTiles {
        GemmTiles { stages, ..self }
    }

    /// Invocations per workgroup.
    pub fn invocations(&self) -> u32 {
        32 * self.sg_m * self.sg_n
    }

    /// Bytes of shared memory with `stages` tiles (each row of `bk` halves padded by 16 bytes).
    pub fn shared_bytes(&self, stages: u32) -> u32 {
        stages * (self.bm + self.bn) * (self.bk / 8 + 1) * 16
    }

    /// Why the tile is not one the kernel can run, if it is not.
    pub fn malformed(&self) -> Option<String> {
        let GemmTiles {
            bm,
            bn,
            bk,
            sg_m,
            sg_n,
            stages,
            ahead,
            early: _,
        } = *self;
        if ahead != 1 && ahead != 2 {
            return Some(format!("{ahead} steps ahead (1 or 2)"));
        }
        if bk != 16 && bk != 32 && bk != 64 {
            return Some(format!("its K step {bk} is not 16, 32 or 64"));
        }
        if sg_m == 0 || sg_n == 0 || bm % (16 * sg_m) != 0 || bn % (16 * sg_n) != 0 {
            return Some(format!(
                "{bm} x {bn} does not split into {sg_m} x {sg_n} subgroups of whole 16 x 16 matrices"
            ));
        }
        let inv = self.invocations();
        let chunks = bk / 8;
        if (bm * chunks) % inv != 0 || (bn * chunks) % inv != 0 {
            return Some(format!(
                "its {inv} invocations do not share its tiles' 16-byte chunks evenly"
            ));
        }
        if stages > 2 {
            return Some(format!(
                "{stages} stages (1, 2, or 0 for the device's choice)"
            ));
        }
        // The output passes through 16 x 20 floats per subgroup of the (then free) tiles.
        if (inv / 32) * 16 * 5 > (bm + bn) * (bk / 8 + 1) {
            return Some("its tiles are too small for its subgroups' output areas".into());
        }
        None
    }

    /// The stages the kernel runs with on `device`: as asked, or 2 where they fit and 1 otherwise
    /// where the tile asks for neither; an error where the tile does not fit.
    pub fn stages_on(&self, device: &DeviceInfo) -> std::result::Result<u32, String> {
        if let Some(why) = self.malformed() {
            return Err(why);
        }
        let l = &device.limits;
        if self.invocations() > l.max_workgroup_invocations {
            return Err(format!(
                "its workgroups of {} invocations are more than the device's {}",
                self.invocations(),
                l.max_workgroup_invocations
            ));
        }
        let fits = |s: u32| self.shared_bytes(s) <= l.max_shared_memory_bytes;
        let stages = match self.stages {
            0 if fits(2) => 2,
            0 => 1,
            s => s,
        };
        if !fits(stages) {
            return Err(format!(
                "its {stages} stage(s) need {} bytes of shared memory; the device has {}",
                self.shared_bytes(stages),
                l.max_shared_memory_bytes
            ));
        }
        Ok(stages)
    }

    /// Parses `BMxBNxBK/SGMxSGN`, optionally followed by `s1` or `s2` (stages), `a1` or `a2`
    /// (steps ahead) and `e` (early loads), e.g. `128x256x32/2x4`, `128x128x32/2x2s1` or
    /// `128x256x32/2x4a2e`.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the text and the form.
    pub fn parse(text: &str) -> Result<GemmTiles> {
        let bad = || {
            Error::InvalidArgument(format!(
                "GEMM tile {text:?}: expected BMxBNxBK/SGMxSGN[s1|s2][a1|a2], e.g. 128x256x32/2x4"
            ))
        };
        let (block, rest) = text.split_once('/').ok_or_else(bad)?;
        let (rest, early) = match rest.strip_suffix('e') {
            Some(r) => (r, true),
            None => (rest, false),
        };
        let (rest, ahead) = match rest.split_once('a') {
            Some((r, a)) => (r, a.parse::<u32>().map_err(|_| bad())?),
            None => (rest, 1),
        };
        let (grid, stages) = match rest.split_once('s') {
            Some((g, s)) => (g, s.parse::<u32>().map_err(|_| bad())?),
            None => (rest, 0),
        };
        let nums = |s: &str| -> Result<Vec<u32>> {
            s.split('x')
                .map(|n| n.parse::<u32>().map_err(|_| bad()))
                .collect()
        };
        let (b, g) = (nums(block)?, nums(grid)?);
        let (&[bm, bn, bk], &[sg_m, sg_n]) = (b.as_slice(), g.as_slice()) else {
            return Err(bad());
        };
        let t = GemmTiles {
            bm,
            bn,
            bk,
            sg_m,
            sg_n,
            stages,
            ahead,
            early,
        };
        match t.malformed() {
            Some(why) => Err(Error::InvalidArgument(format!("GEMM tile {text:?}: {why}"))),
            None => Ok(t),
        }
    }
}

impl fmt::Display for GemmTiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{}x{}/{}x{}",
            self.bm, self.bn, self.bk, self.sg_m, self.sg_n
        )?;
        if self.stages != 0 {
            write!(f, "s{}", self.stages)?;
        }
        if self.ahead != 1 {
            write!(f, "a{}", self.ahead)?;
        }
        if self.early {
            write!(f, "e")?;
        }
        Ok(())
    }
}

/// Where the products are summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GemmAccumulator {
    /// fp32 accumulators (as cuBLAS sums an fp16 GEMM).
    #[default]
    F32,
    /// fp16 accumulators: half the registers, so wider tiles, at the cost of accuracy (about
    /// `sqrt(K)` roundings of 2^-11 each).
    F16,
}

/// What one launch computes (the push constants of the projection GEMMs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmShape {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of C, all outputs together.
    pub n: usize,
    /// Columns of A, length of W's rows.
    pub k: usize,
    /// Columns of the first output.
    pub n0: usize,
    /// Columns of the second output (the third takes the rest).
    pub n1: usize,
    /// 0: A row-major; else A is split by heads (`[batch][head][a_seq][head_dim]`).
    pub a_seq: usize,
    /// 0: the outputs are row-major; else split by heads with this sequence length.
    pub c_seq: usize,
    /// Elements per head of the split layouts.
    pub head_dim: usize,
    /// Scale of the first output.
    pub alpha0: f32,
}

impl GemmShape {
    /// `m x n x k` into one row-major output, unscaled.
    pub fn plain(m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape {
            m,
            n,
            k,
            n0: n,
            n1: 0,
            a_seq: 0,
            c_seq: 0,
            head_dim: 8,
            alpha0: 1.0,
        }
    }

    /// Why `mha_gemm_wide` and `mha_gemm_mma` cannot compute this shape, if they cannot: every
    /// access is a 16-byte chunk of 8 consecutive k (A, W) or 4 consecutive columns (C) of one
    /// output and head, and every matrix is indexed with 32-bit offsets.
    pub fn unfit(&self) -> Option<String> {
        for (name, v) in [
            ("K", self.k),
            ("N", self.n),
            ("n0", self.n0),
            ("n1", self.n1),
        ] {
            if v % 8 != 0 {
                return Some(format!("{name} = {v} is not a multiple of 8"));
            }
        }
        if self.n0 + self.n1 > self.n {
            return Some(format!(
                "its outputs' columns {} + {} exceed N = {}",
                self.n0, self.n1, self.n
            ));
        }
        if (self.a_seq != 0 || self.c_seq != 0) && (self.head_dim == 0 || self.head_dim % 8 != 0) {
            return Some(format!(
                "the split layouts' head dimension {} is not a multiple of 8",
                self.head_dim
            ));
        }
        if self.m == 0 || self.n == 0 || self.k == 0 {
            return Some("it is empty".into());
        }
        self.offsets_unfit()
    }

    /// Why no projection kernel can compute this shape, if none can: they take m, n and k as 32-bit
    /// push constants and index every matrix with 32-bit offsets, so a larger matrix would wrap
    /// to other elements rather than fail.
    pub(crate) fn offsets_unfit(&self) -> Option<String> {
        for (what, count) in [
            ("A", self.m.checked_mul(self.k)),
            ("W", self.n.checked_mul(self.k)),
            ("C", self.m.checked_mul(self.n)),
        ] {
            if count.is_none_or(|c| c > u32::MAX as usize) {
                return Some(format!(
                    "{what} would hold more than 2^32 - 1 elements, the most the kernels' 32-bit \
                     offsets reach (split the rows into several launches)"
                ));
            }
        }
        None
    }

    /// What every projection GEMM checks before it records a launch of this shape: that `kernel`
    /// can compute it ([`GemmShape::unfit`]), that each buffer holds what the kernel indexes (`a`
    /// in fp16 where `a_f16`, else f32; `w` `[n][k]` fp16; `bias` `n` f32; the three outputs
    /// their columns' f32), and that the grid of `groups` workgroups (of `tiles`) fits `ctx`'s
    /// device.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the kernel, the shape and what fell short.
    pub(crate) fn check_launch(
        &self,
        kernel: &str,
        ctx: &Context,
        a_f16: bool,
        buffers: [&dyn BufferArg; 6],
        groups: [usize; 2],
        tiles: &dyn fmt::Display,
    ) -> Result<()> {
        let (m, n, k) = (self.m, self.n, self.k);
        if let Some(why) = self.unfit() {
            return Err(Error::InvalidArgument(format!(
                "{kernel} cannot compute a {m} x {n} x {k} product: {why}"
            )));
        }
        let n2 = n - self.n0 - self.n1;
        let need: [(&str, u64); 6] = [
            ("A", (m * k) as u64 * if a_f16 { 2 } else { 4 }),
            ("W", (n * k) as u64 * 2),
            ("bias", n as u64 * 4),
            ("output 0", (m * self.n0) as u64 * 4),
            ("output 1", (m * self.n1) as u64 * 4),
            ("output 2", (m * n2) as u64 * 4),
        ];
        for ((what, need), buffer) in need.into_iter().zip(buffers) {
            let have = buffer.raw().bytes();
            if have < need {
                return Err(Error::InvalidArgument(format!(
                    "{kernel}: {what} holds {have} bytes; a {m} x {n} x {k} product needs {need}"
                )));
            }
        }
        let max = ctx.device().limits.max_workgroup_count;
        if groups[0] > max[0] as usize || groups[1] > max[1] as usize {
            return Err(Error::InvalidArgument(format!(
                "a {m} x {n} product needs {groups:?} workgroups of {tiles}; the device allows {max:?}"
            )));
        }
        Ok(())
    }

    /// Multiply-add flops: `2 m n k`.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// The push constants of the projection GEMMs (`mha_gemm`, `mha_gemm_coop`, `mha_gemm_wide`).
    pub fn push_constants(&self) -> PushConstants {
        PushConstants::new()
            .u32(self.m as u32)
            .u32(self.n as u32)
            .u32(self.k as u32)
            .u32(self.n0 as u32)
            .u32(self.n1 as u32)
            .u32(self.a_seq as u32)
            .u32(self.c_seq as u32)
            .u32(self.head_dim as u32)
            .f32(self.alpha0)
    }
}

/// Why `mha_gemm_wide` with `tiles` and `acc` cannot run on `device`, if it cannot.
pub fn wide_unfit(device: &DeviceInfo, tiles: &GemmTiles, acc: GemmAccumulator) -> Option<String> {
    if let Some(why) = crate::choice::coop_matrix_unfit(device) {
        return Some(why);
    }
    if acc == GemmAccumulator::F16 && !device.limits.cooperative_matrix_f16_acc {
        return Some("the device lists no 16x16x16 fp16 products into fp16 accumulators".into());
    }
    tiles.stages_on(device).err()
}

/// The tile the layer takes where the larger one would leave SMs idle: 128 x 128 over 2 x 4
/// subgroups (64 x 32 of C each), K in steps of 64, two steps ahead.
pub const SMALL_TILES: GemmTiles = GemmTiles::new(128, 128, 64, 2, 4).with_ahead(2);

/// The tiles [`auto_tiles`] picks among on `device`: those of [`DEFAULT_TILES`] and
/// [`SMALL_TILES`] that fit it.
pub fn auto_candidates(device: &DeviceInfo) -> Vec<GemmTiles> {
    [DEFAULT_TILES, SMALL_TILES]
        .into_iter()
        .filter(|t| wide_unfit(device, t, GemmAccumulator::F32).is_none())
        .collect()
}

/// The tile the layer picks for an `m x n` output on `device` (fp32 sums): [`DEFAULT_TILES`]
/// (128 x 256), or [`SMALL_TILES`] (128 x 128) where the larger tile would give fewer than 200
/// workgroups (on an H100's 132 SMs, one per SM: under one and a half waves); whichever of them
/// fits the device (`None` where neither does). Measured on an H100 (BENCHMARKS.md): 128 x 256 led
/// at M = 2048 and 8192 with N = 4096 and 12288 and at M = 8192, N = 1024; 128 x 128 at M = 2048,
/// N = 1024 (64 workgroups of 128 x 256).
pub fn auto_tiles(device: &DeviceInfo, m: usize, n: usize) -> Option<GemmTiles> {
    const MIN_GROUPS: usize = 200;
    let groups = |t: &GemmTiles| {
        m.div_ceil(t.bm as usize)
            .saturating_mul(n.div_ceil(t.bn as usize))
    };
    let order = if groups(&DEFAULT_TILES) < MIN_GROUPS {
        [SMALL_TILES, DEFAULT_TILES]
    } else {
        [DEFAULT_TILES, SMALL_TILES]
    };
    let fits = auto_candidates(device);
    order.into_iter().find(|t| fits.contains(t))
}
