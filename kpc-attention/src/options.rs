//! What a caller may choose: the decode and prefill kernels, and the sizes of [`AttentionOptions`].

use kpc::BackendKind;
use kpc::DeviceInfo;

/// Which split kernel a decode runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeKernel {
    /// The vectorized kernel where the device and shape allow it, else the generic one.
    #[default]
    Auto,
    /// `attn_decode`: one invocation per position for the scores, any even head dimension.
    Generic,
    /// `attn_decode_vec`: 16-byte loads, several lanes per row summed by subgroup shuffles (Vulkan;
    /// OpenCL on NVIDIA) or local memory (other OpenCL devices), one workgroup per KV head for
    /// grouped-query attention, online softmax in registers. Needs a head dimension that splits into
    /// 16-byte chunks (a multiple of 8 for f16, 4 for f32) and at most 8 query heads per KV head.
    Vectorized,
    /// `attn_decode_coop`: the vectorized kernel's launch (same splits, append and combination),
    /// with the scores and the output computed on the matrix units: a KV head's query heads are
    /// the rows of 16x16 fp16 matrices, so each K/V tile is read once and multiplied for all of
    /// them. Needs what [`PrefillKernel::Cooperative`] needs of the device and its matrices'
    /// register layout (the `coop_layout` probe's, as for that kernel's register softmax), fp16
    /// K/V, a head dimension that is a multiple of 16 up to 128, at most 8 query heads per KV
    /// head, `decode_local_size` 64 or 128, no `decode_spread`, and `group * splits` at most 1024.
    /// Q and P are rounded to fp16 for the products; sums are fp32. Only when asked for:
    /// [`DecodeKernel::Auto`] never picks it, because on the H100 it was slower than
    /// [`DecodeKernel::Vectorized`] at every shape measured (BENCHMARKS.md).
    Cooperative,
}

/// Which prefill kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillKernel {
    /// The cooperative-matrix kernel where the device, shape and K/V type allow it, else the
    /// VK_NV_cooperative_matrix2 one where they allow that (the KHR kernel was the faster of the
    /// two where both ran), else the tiled one, else the generic one.
    #[default]
    Auto,
    /// `attn_prefill`: `block_q` by `block_k` tiles, one score per invocation, any even head
    /// dimension.
    Generic,
    /// `attn_prefill_tiled`: 64 query rows by 128 keys per tile, 256 invocations each holding a 4
    /// by 8 block of scores and a slice of the output in registers (f32 arithmetic). Needs a head
    /// dimension that is a multiple of 64 (at most 256), workgroups of 256 and 28.25 KiB of shared
    /// memory (40.5 KiB for its wider staging).
    Tiled,
    /// `attn_prefill_coop`: the products S = Q K^T and O += P V on the device's matrix units
    /// (Vulkan cooperative matrices, 16x16 fp16 into fp32), `coop_rows` query rows per workgroup
    /// in 4 or 8 32-wide subgroups. Where a probe kernel finds the matrices' element layout that it
    /// knows (NVIDIA's), the softmax stays in registers, each subgroup owns
    /// `coop_row_blocks` blocks of 16 rows and tiles are `coop_keys` keys
    /// ([`AttentionOptions::coop_registers`]); elsewhere it goes through shared memory with one
    /// block per subgroup and 32-key tiles. Needs a Vulkan device with
    /// [`DeviceLimits::cooperative_matrix_f16`](kpc::DeviceLimits), subgroups of 32,
    /// fp16 K/V, and a head dimension up to 128 that is a multiple of 8 per subgroup (32 or 64).
    /// Q and P are rounded to fp16 for the products; sums are fp32.
    Cooperative,
    /// `attn_prefill_cm2`: the same products on workgroup-scope matrices (VK_NV_cooperative_matrix2),
    /// `cm2_rows` query rows by `cm2_keys` keys per tile, K and V read from the cache by
    /// tensor-addressed loads, the row max by a matrix reduction and the row sums as a product with
    /// a matrix of ones; the driver stages the tiles itself. Needs a Vulkan device with
    /// [`DeviceLimits::cooperative_matrix2_workgroup`](kpc::DeviceLimits) at least
    /// `cm2_local_size` (besides what [`PrefillKernel::Cooperative`] needs of the device), fp16
    /// K/V, and a head dimension up to 128 that is a multiple of 32. Q and P are rounded to fp16 for
    /// the products; sums are fp32. On an H100 it was slower than [`PrefillKernel::Cooperative`]
    /// (BENCHMARKS.md), so [`PrefillKernel::Auto`] takes it only where that one does not fit.
    Cm2,
    /// `attn_prefill_mma`: OpenCL C with inline PTX, built as FlashAttention-2's forward kernel is:
    /// `mma.sync` m16n8k16 products (fp16 into fp32), `mma_warps` warps of `mma_row_blocks` blocks
    /// of 16 query rows, Q's fragments in registers (or shared memory: `mma_q_shared`),
    /// `mma_keys`-key K/V tiles staged by `cp.async` into `mma_stages` buffers (by default two: the
    /// next tile in flight during all of this one's products), `ldmatrix` fragment loads, the
    /// softmax in registers (exponentials in fp16 pairs by default: `mma_half_exp`). Needs an
    /// OpenCL device whose compiler takes inline PTX for sm_80 or later (NVIDIA's OpenCL on Ampere
    /// and later: [`crate::ptx`]; elsewhere [`kpc::Error::Unsupported`]), fp16 K/V, and a head
    /// dimension that is a multiple of 32 up to 256. Q and P are rounded to fp16 for the products;
    /// sums are fp32.
    /// [`PrefillKernel::Auto`] takes it on NVIDIA's OpenCL wherever it runs (other OpenCL devices
    /// are not probed: a refused probe is not cached on disk): on an H200 it was 7 to 8 times
    /// the tiled kernel's rate there (BENCHMARKS.md, issue 41).
    Mma,
}

/// Workgroup and tile sizes; each distinct value gives a distinct cached program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionOptions {
    /// Invocations per workgroup of the generic decode and prefill kernels and of the append: a
    /// power of two.
    pub local_size: u32,
    /// Positions per decode split of the generic kernel (flash-decoding chunk).
    pub chunk: u32,
    /// Fewest positions per split of the vectorized decode, which lengthens its splits beyond
    /// this so that a decode launches about `decode_workgroups` workgroups. 64 by default;
    /// [`AttentionOptions::for_device`] makes it 128 on Vulkan, where on an H200 it was up to
    /// 4.3 µs faster per step at L = 1k and 4k (Hkv = 8, L = 4k: 22.2 -> 17.9 µs) and the same
    /// elsewhere, while on OpenCL it was mixed (BENCHMARKS.md).
    pub decode_split_min: u32,
    /// Workgroups a vectorized decode aims to launch (enough to fill a large GPU several times).
    pub decode_workgroups: u32,
    /// Which decode kernel to run.
    pub decode: DecodeKernel,
    /// Which prefill kernel to run (`block_q` and `block_k` size the generic one).
    pub prefill: PrefillKernel,
    /// Invocations per workgroup of the vectorized decode kernel: a power of two.
    pub decode_local_size: u32,
    /// K/V rows each lane group of the vectorized decode kernel loads before using them
    /// (1 to 16): more hides more memory latency, at the cost of registers.
    pub decode_rows: u32,
    /// Grouped-query attention in the vectorized decode kernel: one workgroup per query head,
    /// the workgroups of one KV head adjacent so that they reread its rows mostly from L2 (`true`),
    /// or one workgroup per KV head serving all of its query heads (`false`).
    pub decode_spread: bool,
    /// Whether each lane group of the vectorized decode kernel loads its next rows while it uses
    /// the current ones (twice the registers for rows). Off by default: on an H200 it cost 3 to
    /// 11% at MHA shapes and 25 to 42% at Hkv=8 (74 -> 102 and 127 -> 168 registers;
    /// BENCHMARKS.md).
    pub decode_prefetch: bool,
    /// Whether the splits of the vectorized decode take the positions block-cyclically (one
    /// trip of rows at a time, split `s` taking trips `s`, `s + splits`, ...), so that the
    /// workgroups read one window of K and V at a time as a copy does, rather than each a
    /// contiguous range of its own. Off by default; [`AttentionOptions::for_device`] turns it on
    /// on OpenCL. On an H200 it was 0.7 to 1.6 µs faster per step on OpenCL at every shape but
    /// MHA L=1k (0.13 µs slower), and on Vulkan mixed: up to 1.1 µs faster at L <= 4k, 0.9 and
    /// 1.1 µs slower at Hkv=8 L=16k and 32k (BENCHMARKS.md).
    pub decode_cyclic: bool,
    /// Whether the Vulkan vectorized decode combines all query heads of a KV head at once, where
    /// they fit (`group * splits` at most 1024 and at most the kernel's row-merge buffer): every
    /// split's max and sum in one round trip, an invocation per 16-byte output column. Otherwise
    /// the heads are combined one after another. On by default: on an H200 it took 3.6 to
    /// 4.6 µs off each step at Hkv=8 and up to 1.8 µs at MHA shapes (BENCHMARKS.md). OpenCL
    /// keeps its own per-head combination either way.
    pub decode_combine_all: bool,
    /// Whether the Vulkan vectorized decode shares a row's query heads out among its lanes
    /// where a workgroup serves a group of them (a power of two, at most the lanes per row): the
    /// partial scores are summed by a reduce-scatter that leaves each lane one head's score, the
    /// softmax runs once per lane, and the weights go back to every lane by shuffles. Fewer
    /// shuffles and exponentials per K/V byte than every lane summing every head. On by default
    /// (BENCHMARKS.md, issue 41: 3 to 4.5% faster at Hkv = 8, L = 4k to 32k, on an H100); OpenCL
    /// keeps its own row sums either way.
    pub decode_head_lanes: bool,
    /// Whether the Vulkan vectorized decode loads K/V in 8-byte chunks instead of 16, so that a
    /// row spreads over up to 32 lanes (the subgroup size permitting) instead of 16: half the
    /// query and accumulator registers per lane for a group of heads, the rest left for rows in
    /// flight. Off by default: on an H200 it was 2 to 15% slower at Hkv = 8, L = 4k to 32k, at every
    /// row count tried (4 to 16; 95 to 128 registers against 128), so fewer registers per lane
    /// were not what the kernel lacked (BENCHMARKS.md, issue 41). OpenCL keeps 16-byte chunks.
    pub decode_narrow: bool,
    /// Whether the Vulkan vectorized decode merges the row groups of all of a workgroup's query
    /// heads in one pass through shared memory (two barriers, the merge buffer times the group)
    /// instead of one head after another (three barriers each), where the shared memory fits.
    /// Off by default: on an H200 it took the kernel from 128 to 142 registers, three workgroups
    /// per SM instead of four, and at Hkv = 8 was 0.8 us faster at L = 4k but 8 and 15 us slower at
    /// 16k and 32k (BENCHMARKS.md, issue 41). OpenCL merges one head after another.
    pub decode_merge_all: bool,
    /// Whether the Vulkan vectorized decode's all-heads combination
    /// ([`AttentionOptions::decode_combine_all`]) reduces each query head's split maxima and sums
    /// with the invocations that serve the head (partials, then shuffles, then shared memory)
    /// instead of every invocation scanning all of them. Applies where the group is a power of
    /// two. On by default: on an H200 it took 0.6 to 1.4 us off each step at Hkv = 8, L = 4k to
    /// 32k (BENCHMARKS.md, issue 41).
    pub decode_scan: bool,
    /// Whether the Vulkan vectorized decode, merging its row groups one head after another,
    /// finds each head's max and sum over the row groups once (one invocation per head, before
    /// the first head) instead of in every invocation for every head. On by default: on an H200
    /// it took 0.3 to 0.5 us off each step at Hkv = 8 alone, and 0.1 to 0.6 us more with
    /// [`AttentionOptions::decode_scan`] (BENCHMARKS.md, issue 41). OpenCL keeps its own merge.
    pub decode_merge_once: bool,
    /// Query rows per workgroup of the cooperative-matrix prefill: 4 or 8 subgroups of
    /// 16 x `coop_row_blocks` rows (64 or 128 with 1 block, 128 or 256 with 2). 128 is the default.
    /// With [`PrefillKernel::Auto`], 64 rows of 1 block are used where only they fit the head
    /// dimension.
    pub coop_rows: u32,
    /// 16-row blocks per subgroup of the cooperative-matrix prefill with its softmax in registers:
    /// 1 or 2 (`coop_rows` is then 4 or 8 subgroups times 16 or 32 rows). With 2, each K or V
    /// fragment read from shared memory feeds two products. The default, 2 blocks of 128 rows
    /// with `coop_keys` 32 and no `coop_prefetch`, was the fastest tile on an H200: 6 to 11%
    /// faster than 1 block of 128 rows with 64-key tiles and the prefetch at L = 2k to 8k
    /// (BENCHMARKS.md, issue 41). The shared-memory softmax keeps 1 block per subgroup (up to 128
    /// rows).
    pub coop_row_blocks: u32,
    /// Keys per tile of the cooperative-matrix prefill with its softmax in registers: 32 or 64.
    pub coop_keys: u32,
    /// Whether the cooperative-matrix prefill with its softmax in registers fetches each K/V tile
    /// into registers while the previous one is computed (rather than after the barrier that
    /// ends it: fewer registers). Off by default: on an H200 it cost 5 to 7% with 1 block and
    /// 20 to 23% with 2 (where it spills).
    pub coop_prefetch: bool,
    /// With 2 row blocks and the register softmax: whether the second block's Q stays in shared
    /// memory beside the K/V tile, its fragments read each tile, rather than in registers (32
    /// fewer per invocation). Needs the shared memory for it (4 subgroups, 32-key tiles at D = 128).
    /// Off by default: on an H200 it ended the default tile's spill but was 31 to 34% slower.
    pub coop_q_shared: bool,
    /// With the register softmax (and not `coop_q_shared`): whether K/V tiles are staged in two
    /// shared buffers, the next tile written into one while this one is read from the other, so
    /// that one barrier per tile ends it rather than two. With `coop_prefetch`, the next tile's K
    /// is held in registers across S = Q K^T and its V across O += P V. Needs twice the tile's
    /// shared memory (32-key tiles at D = 128). Off by default: on an H200 it was 35 to 40% slower
    /// than the default tile (55 to 61% with the prefetch).
    pub coop_double: bool,
    /// With the register softmax: whether the cooperative-matrix prefill takes P's exponentials
    /// in fp16, two per instruction (P is rounded to fp16 for its product either way). Off by
    /// default: on an H200 it was 3 to 4% slower (BENCHMARKS.md, issue 41).
    pub coop_half_exp: bool,
    /// Whether the cooperative-matrix prefill keeps its softmax in registers (64-key tiles) where
    /// the device's matrix layout allows it (a probe kernel checks, once per device), rather
    /// than in shared memory (32-key tiles). On by default; off only to compare the two.
    pub coop_registers: bool,
    /// Query rows per workgroup of the VK_NV_cooperative_matrix2 prefill ([`PrefillKernel::Cm2`]):
    /// a multiple of 16 from 16 to 256. 128 rows by 64 keys over 256 invocations (the default) was
    /// the fastest of six tiles on an H100, by 8 to 50% (BENCHMARKS.md).
    pub cm2_rows: u32,
    /// Keys per tile of the VK_NV_cooperative_matrix2 prefill: a multiple of 16 from 16 to 256.
    pub cm2_keys: u32,
    /// Invocations per workgroup of the VK_NV_cooperative_matrix2 prefill: a power of two from 32,
    /// at most what the device allows for workgroup-scope matrices.
    pub cm2_local_size: u32,
    /// 16-row blocks per warp of the `mma.sync` prefill ([`PrefillKernel::Mma`]): 1 or 2. With 2,
    /// each K or V fragment read from shared memory feeds two products. The default, 4 warps of 2
    /// blocks (128 rows) with 32-key tiles, was the fastest tile through kpc on an H200: 198.9 /
    /// 230.7 / 247.3 TFLOP/s at L = 2k / 4k / 8k against 196.9 / 219.5 / 225.4 with 1 block, and
    /// 158.8 / 184.5 / 199.2 with 8 warps of 1 block (BENCHMARKS.md, issue 41).
    pub mma_row_blocks: u32,
    /// Keys per K/V tile of the `mma.sync` prefill: 32 or 64.
    pub mma_keys: u32,
    /// Warps per workgroup of the `mma.sync` prefill: 4 or 8 (rows per workgroup are
    /// 16 x `mma_row_blocks` x `mma_warps`).
    pub mma_warps: u32,
    /// Whether the `mma.sync` prefill's warps rescale their output accumulators only on tiles where
    /// one of their rows' running max moved (a warp vote), rather than on every tile. On by
    /// default: on an H200 (default tile) it was 0.6 / 0.6 / 2.3% faster through kpc at L = 2k / 4k /
    /// 8k (199.0 / 230.0 / 253.2 against 197.8 / 228.6 / 247.5 TFLOP/s; BENCHMARKS.md, issue 41).
    pub mma_lazy_rescale: bool,
    /// K and V tile buffers of the `mma.sync` prefill: 1 (V(j) in flight during S(j) and K(j + 1)
    /// during P V(j), two barriers per tile) or 2 and 3 (tiles j + 1 .. j + stages - 1 in flight
    /// during all of tile j, one barrier per tile). 2 by default: on an H200 (default tile,
    /// fp16 exponentials) it was 15 / 17 / 15% faster through kpc than 1 stage with fp32
    /// exponentials at L = 2k / 4k / 8k (219.8 / 257.9 / 275.5 against 191.3 / 219.5 / 238.8
    /// TFLOP/s); 3 stages (swizzled, 48 KiB) were 7% slower than 2 in the harness
    /// (BENCHMARKS.md, issue 41).
    pub mma_stages: u32,
    /// Whether the `mma.sync` prefill lays its tiles out unpadded with XOR-swizzled 16-byte chunks
    /// rather than rows padded by 16 bytes (the same bank spread; 6% less shared memory at D = 128,
    /// which is what lets Q, or a third stage, fit in 48 KiB). Off by default: alone it was 1%
    /// slower on an H200.
    pub mma_swizzle: bool,
    /// Whether the `mma.sync` prefill keeps Q in shared memory (fp16) and reads its fragments by
    /// `ldmatrix` per k-step, rather than holding them in registers. Needs `mma_swizzle` and 1
    /// stage at 128 rows and D = 128 (exactly 48 KiB). Off by default: through kpc on an H200 it was
    /// 4 / 3 / 1% slower than the default (210.5 / 250.0 / 272.1 TFLOP/s), though level with it at
    /// 8k in the harness (BENCHMARKS.md, issue 41).
    pub mma_q_shared: bool,
    /// The `mma.sync` prefill's exponentials: 0 one at a time in fp32; 1 two at a time in fp16
    /// (`ex2.approx.f16x2` on the scaled scores packed as P's fragments) with each tile's row sums
    /// added in fp16 before the fp32 total; 2 the same exponentials with every one added in fp32.
    /// 1 by default: on an H200 (2 stages) it was 5 / 2 / 2% faster through kpc than 0 and its
    /// relative error at `kpc attention --check` 3.1e-4 against 2.6e-4 (tolerance 2e-3); sm_90 has
    /// no paired exponential (the driver issues two `MUFU.EX2.F16`), so the gain is the adds and
    /// registers saved (BENCHMARKS.md, issue 41).
    pub mma_half_exp: u32,
    /// Whether the tiled prefill loads the next staging step's Q, K or V words into registers
    /// before the current step's arithmetic, so that their round trip overlaps it, rather than
    /// loading them between two barriers. On by default; [`AttentionOptions::for_device`] turns
    /// it off on OpenCL. On an H200 it was 4 to 7% faster on Vulkan (177 registers instead of
    /// 163) and 14 to 16% slower on OpenCL, at L = 2k to 8k (BENCHMARKS.md).
    pub tiled_prefetch: bool,
    /// Query rows per workgroup of the generic prefill.
    pub block_q: u32,
    /// Key positions per prefill tile.
    pub block_k: u32,
    /// Vulkan: build the kernels from their GLSL in kernels/ at run time, through the SPIR-V cache,
    /// instead of from the committed SPIR-V (`kpc attention --from-source`). Cooperative-matrix
    /// kernels keep their committed SPIR-V (see [`crate::kernels::glsl_image`]).
    pub from_source: bool,
    /// Never wait for a specialized kernel's build (`kpc attention --lazy`): each kernel is
    /// requested with the generic `attn_generic` as its fallback ([`kpc::KernelRequest::or_generic`]),
    /// so while a specialized kernel is in no cache layer, prefills and decode steps run on
    /// `attn_generic` (every shape parameter in push constants: one build per device serves every
    /// shape) and the specialized kernels build in the background (requested from each path's
    /// second call on: the first answer does not share the CPU with their builds); each call runs
    /// on them once they are all ready ([`crate::Attention::lazy_report`]).
    pub lazy: bool,
}

impl Default for AttentionOptions {
    fn default() -> Self {
        AttentionOptions {
            local_size: 64,
            chunk: 64,
            decode_split_min: 64,
            decode_workgroups: 1024,
            decode: DecodeKernel::Auto,
            prefill: PrefillKernel::Auto,
            decode_local_size: 128,
            decode_rows: 4,
            decode_spread: false,
            decode_prefetch: false,
            decode_cyclic: false,
            decode_combine_all: true,
            decode_head_lanes: true,
            decode_narrow: false,
            decode_merge_all: false,
            decode_scan: true,
            decode_merge_once: true,
            coop_rows: 128,
            coop_row_blocks: 2,
            coop_keys: 32,
            coop_prefetch: false,
            coop_q_shared: false,
            coop_double: false,
            coop_half_exp: false,
            coop_registers: true,
            cm2_rows: 128,
            cm2_keys: 64,
            cm2_local_size: 256,
            mma_row_blocks: 2,
            mma_keys: 32,
            mma_warps: 4,
            mma_lazy_rescale: true,
            mma_stages: 2,
            mma_swizzle: false,
            mma_q_shared: false,
            mma_half_exp: 1,
            tiled_prefetch: true,
            block_q: 8,
            block_k: 32,
            from_source: false,
            lazy: false,
        }
    }
}

impl AttentionOptions {
    /// Sizes suited to `device`: the defaults, with the workgroup capped at the device's limit;
    /// on Vulkan splits of at least 128 positions, on OpenCL the tiled prefill's prefetch off and
    /// the decode's block-cyclic splits on (each measured faster that way there).
    pub fn for_device(device: &DeviceInfo) -> AttentionOptions {
        let opencl = device.backend == BackendKind::OpenCl;
        let mut o = AttentionOptions {
            tiled_prefetch: !opencl,
            decode_cyclic: opencl,
            decode_split_min: if opencl { 64 } else { 128 },
            ..AttentionOptions::default()
        };
        let max = device.limits.max_workgroup_invocations.max(1);
        while o.local_size > max {
            o.local_size /= 2;
        }
        while o.decode_local_size > max {
            o.decode_local_size /= 2;
        }
        o
    }
}
