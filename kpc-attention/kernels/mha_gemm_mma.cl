// Projection GEMM of the MultiHeadAttention layer on NVIDIA's OpenCL through inline PTX: the role
// mha_gemm_wide plays on Vulkan, with the same buffers and scalars as mha_gemm (C = A W^T + bias for
// fp16 weights W [n][k], two halves per uint; A [m][k] f32 or fp16, row-major or split by heads; up
// to three outputs taking consecutive column ranges, the first scaled by alpha0). Products are fp16,
// sums fp32 (`mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`).
//
// The feed, as CUTLASS's sm80 kernels build it:
// - a BM x BN block of C per workgroup, WARPS_M x WARPS_N warps each owning (BM / WARPS_M) x
//   (BN / WARPS_N) of it in registers (m16n8 fragments);
// - K in steps of 32 through STAGES shared-memory stages; W (and fp16 A) copied global -> shared in
//   16-byte chunks by `cp.async.cg` (no registers on the way; zero-filled past the matrix edges),
//   STAGES - 1 steps ahead of the one multiplied; f32 A is loaded into registers one step ahead and
//   converted to fp16 as it is stored (cp.async cannot convert);
// - rows of 32 halves (4 chunks) stored with chunk c at c ^ ((row >> 1) & 3): the 8 rows one
//   `ldmatrix` phase reads then fall in 8 different 16-byte bank groups (no conflicts, no padding,
//   so two 128 x 256 stages fill the 48 KiB a workgroup may have);
// - fragments read with `ldmatrix.sync.aligned.m8n8.x4` (4 per 16 x 16 of A, 4 per 16 x 16 of W).
//
// Shared addresses: PTX's `.shared` forms take the 32-bit address in the shared window, which is
// what casting a `local` pointer to an integer gives on NVIDIA (checked by the reference tests: a
// wrong address reads other data). Only NVIDIA's OpenCL from sm_80 builds this (kpc-attention's
// ptx.rs probes that before kpc builds it).
//
// kpc-spec-constant 0 A_F16
// kpc-spec-constant 1 BM
// kpc-spec-constant 2 BN
// kpc-spec-constant 3 WARPS_M
// kpc-spec-constant 4 WARPS_N
// kpc-spec-constant 5 STAGES
// kpc-spec-constant 6 PIPELINED
// kpc-spec-constant 7 HOISTED
#ifndef A_F16
#define A_F16 0
#endif
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 4
#endif
#ifndef STAGES
#define STAGES 2
#endif
// Qualifier of the mma asm: empty lets the compiler schedule it among other instructions (it
// touches only registers); `volatile` keeps source order.
#ifndef MMA_QUAL
#define MMA_QUAL
#endif
// Knobs measured by benches/ocl_gemm_mma.c (BENCHMARKS.md), each off by default:
// BAR_PTX: the step's barrier as PTX `bar.sync 0` rather than OpenCL's barrier().
// FRAG_DB: fragments double-buffered in registers (CUTLASS's sm80 mainloop): k16 slice kk + 1's
//   ldmatrix issued before slice kk's products; the wait and barrier come before the last slice's
//   products, after which the next stage's first slice is loaded, so no slice starts on an exposed
//   ldmatrix after the barrier.
// HOIST: per-thread global offsets of the copies computed once (row-major A and W), advanced by
//   the step, instead of the row/column arithmetic of every step.
// RASTER: workgroups taken in bands of RASTER rows of tiles along M (L2 reuse of W); 0: off.
// SERP: the products of odd m16 rows walk the n8 tiles backwards (serpentine).
// L2PF: cp.async with the `.L2::128B` prefetch hint.
// SPLIT_K: K split over this many workgroups (the launch's third dimension), each adding its
//   partial sums into outputs the launch zeroed first (`red.global.add.f32`; bias added by split
//   0 only). With 2 splits each element is 0 + x + y in either order: deterministic.
// PIPELINED: FRAG_DB, HOIST, RASTER 8 and SERP together (kpc's `MmaTiles::with_pipeline`; each
//   can still be set on its own): with 2 x 2 warps the harness's fastest at N = 4096 on an H200,
//   slower than the plain mainloop in the layer's fused Q/K/V projection (BENCHMARKS.md).
// DIAG_NOCOPY, DIAG_NOBAR: measurement only, WRONG RESULTS: no copies after the prologue (the
//   products reread the first stages), no wait or barrier in the loop: what the products and the
//   fragment loads cost without the feed.
// HOISTED: HOIST, RASTER 8 and SERP without FRAG_DB (kpc's `MmaTiles::with_hoist`): with 2 x 4
//   warps the layer's tile, 8-11% faster than the plain mainloop at the fused Q/K/V projection
//   (N = 12288) on an H200 (BENCHMARKS.md, session 8).
#ifndef PIPELINED
#define PIPELINED 0
#endif
#ifndef HOISTED
#define HOISTED 0
#endif
#if PIPELINED
#ifndef FRAG_DB
#define FRAG_DB 1
#endif
#endif
#if HOISTED || PIPELINED
#ifndef HOIST
#define HOIST 1
#endif
#ifndef RASTER
#define RASTER 8
#endif
#ifndef SERP
#define SERP 1
#endif
#endif
#ifndef DIAG_NOCOPY
#define DIAG_NOCOPY 0
#endif
#ifndef DIAG_NOBAR
#define DIAG_NOBAR 0
#endif
#ifndef BAR_PTX
#define BAR_PTX 0
#endif
#ifndef FRAG_DB
#define FRAG_DB 0
#endif
#ifndef HOIST
#define HOIST 0
#endif
#ifndef RASTER
#define RASTER 0
#endif
#ifndef SERP
#define SERP 0
#endif
#ifndef L2PF
#define L2PF 0
#endif
#ifndef SPLIT_K
#define SPLIT_K 1
#endif
// BK: halves of K per step and stage, 32 (rows of 4 16-byte chunks) or 16 (rows of 2 chunks:
//   half the shared memory per stage, so twice the stages, i.e. more K in flight, or bigger tiles,
//   in the 48 KiB a workgroup may have). FRAG_DB needs BK = 32 (it splits a step into two slices).
#ifndef BK
#define BK 32
#endif
// DIAG_SAME: measurement only, WRONG RESULTS: the copies read the tiles at block row m0 % (DIAG_SAME
//   x BM) and column col0 % (DIAG_SAME x BN) (1: every workgroup reads the same A and W tiles), so
//   that the operands stay in L2 with the same bytes per FLOP: what the feed costs without DRAM
//   and without L2 misses; 0: off.
#ifndef DIAG_SAME
#define DIAG_SAME 0
#endif
#define THREADS (WARPS_M * WARPS_N * 32)
#define WM (BM / WARPS_M)
#define WN (BN / WARPS_N)
#define MT (WM / 16)
#define NT (WN / 8)
// 16-byte chunks per row of a stage (BK halves), bytes per row, k16 slices per step.
#define CH (BK / 8)
#define ROWB (BK * 2)
#define KS (BK / 16)
#define A_PER (BM * CH / THREADS)
#define W_PER (BN * CH / THREADS)
#define STAGE_BYTES ((BM + BN) * ROWB)

#if (WM % 16) || (WN % 16) || ((BM * CH) % THREADS) || ((BN * CH) % THREADS) || STAGES < 2 || STAGES > 6 \
    || SPLIT_K < 1 || (BK != 16 && BK != 32) || (FRAG_DB && BK != 32)
#error "unsupported tile"
#endif

#if STAGES == 2
#define WAIT_PENDING "0"
#elif STAGES == 3
#define WAIT_PENDING "1"
#elif STAGES == 4
#define WAIT_PENDING "2"
#elif STAGES == 5
#define WAIT_PENDING "3"
#else
#define WAIT_PENDING "4"
#endif

// Byte offset of chunk c (0..CH - 1) of row `row` in a stage's tile. BK = 32: chunk c at
// c ^ ((row >> 1) & 3); BK = 16 (32-byte rows, four to a 128-byte bank line): chunk c at
// c ^ ((row >> 2) & 1). Either way the 8 rows an ldmatrix phase reads fall in 8 different 16-byte
// bank groups.
#if BK == 32
#define SWZ(row, c) ((((row) << 2) + ((c) ^ (((row) >> 1) & 3))) << 4)
#else
#define SWZ(row, c) ((((row) << 1) + ((c) ^ (((row) >> 2) & 1))) << 4)
#endif

uint split_at(uint row, uint col, uint width, uint seq, uint head_dim)
{
    if (seq == 0) {
        return row * width + col;
    }
    uint heads = width / head_dim;
    return (((row / seq) * heads + col / head_dim) * seq + row % seq) * head_dim + col % head_dim;
}

#ifndef PTX_EMULATE
#define SHARED_ADDR(p) ((uint)(ulong)(p))

#if L2PF
#define CP_ASYNC_OP "cp.async.cg.shared.global.L2::128B"
#else
#define CP_ASYNC_OP "cp.async.cg.shared.global"
#endif
#define CP_ASYNC16(smem, dst, src, bytes)                                                        \
    asm volatile(CP_ASYNC_OP " [%0], [%1], 16, %2;\n" ::"r"(dst), "l"((ulong)(src)), "r"(bytes)  \
                 : "memory")
#if BAR_PTX
#define BARRIER() asm volatile("bar.sync 0;\n" ::: "memory")
#else
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#endif
#define RED_ADD(p, v) asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"((ulong)(p)), "f"(v) : "memory")

#define CP_COMMIT() asm volatile("cp.async.commit_group;\n" ::: "memory")
#define CP_WAIT() asm volatile("cp.async.wait_group " WAIT_PENDING ";\n" ::: "memory")
#define CP_WAIT_ALL() asm volatile("cp.async.wait_all;\n" ::: "memory")

#define LDMATRIX_X4(r, addr)                                                                     \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"            \
                 : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3])                       \
                 : "r"(addr)                                                                     \
                 : "memory")

#define MMA16816(d, a, b0, b1)                                                                   \
    asm MMA_QUAL("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "         \
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                               \
                 : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3])                       \
                 : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"(b0), "r"(b1))
#else
// Test aid (benches/ocl_gemm_mma.c on PoCL): the same instructions in plain OpenCL C, lanes
// exchanging fragments through local memory, so that the tiles' indexing can be checked on a CPU.
// Shared addresses become byte offsets from the kernel's `smem`.
#define SHARED_ADDR(p) 0u
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
// Float add through a compare-and-swap loop (OpenCL 1.2 has no float atomics).
#define RED_ADD(p, v)                                                                            \
    do {                                                                                         \
        volatile global uint *u_ = (volatile global uint *)(p);                                  \
        uint old_ = *u_, seen_;                                                                  \
        while ((seen_ = atomic_cmpxchg(u_, old_, as_uint(as_float(old_) + (v)))) != old_) {      \
            old_ = seen_;                                                                        \
        }                                                                                        \
    } while (0)
#define CP_ASYNC16(smem, dst, src, bytes)                                                        \
    ((local uint4 *)(smem))[(dst) >> 4] =                                                       \
        (bytes) ? *(global const uint4 *)(src) : (uint4)(0u)
#define CP_COMMIT()
#define CP_WAIT()
#define CP_WAIT_ALL()
#define LDMATRIX_X4(r, addr)                                                                     \
    do {                                                                                         \
        emu[warp][lane][0] = (addr);                                                             \
        barrier(CLK_LOCAL_MEM_FENCE);                                                            \
        for (uint j_ = 0; j_ < 4; j_++) {                                                        \
            uint at_ = emu[warp][8 * j_ + lane / 4][0];                                          \
            (r)[j_] = ((local uint *)smem)[at_ / 4 + lane % 4];                                  \
        }                                                                                        \
        barrier(CLK_LOCAL_MEM_FENCE);                                                            \
    } while (0)
#define MMA16816(d, a, b0, b1)                                                                   \
    do {                                                                                         \
        for (uint i_ = 0; i_ < 4; i_++) {                                                        \
            emu[warp][lane][i_] = (a)[i_];                                                       \
        }                                                                                        \
        emu[warp][lane][4] = (b0);                                                               \
        emu[warp][lane][5] = (b1);                                                               \
        barrier(CLK_LOCAL_MEM_FENCE);                                                            \
        local const half *h_ = (local const half *)emu[warp];                                    \
        for (uint r_ = 0; r_ < 4; r_++) {                                                        \
            uint row_ = (lane >> 2) + 8 * (r_ >> 1);                                             \
            uint col_ = 2 * (lane & 3) + (r_ & 1);                                               \
            float s_ = 0.0f;                                                                     \
            for (uint k_ = 0; k_ < 16; k_++) {                                                   \
                uint ai_ = (row_ >= 8) + 2 * (k_ >= 8);                                          \
                uint al_ = (row_ % 8) * 4 + (k_ % 8) / 2;                                        \
                uint bl_ = col_ * 4 + (k_ % 8) / 2;                                              \
                float av_ = vload_half((al_ * 6 + ai_) * 2 + k_ % 2, h_);                        \
                float bv_ = vload_half((bl_ * 6 + 4 + (k_ >= 8)) * 2 + k_ % 2, h_);              \
                s_ += av_ * bv_;                                                                 \
            }                                                                                    \
            (d)[r_] += s_;                                                                       \
        }                                                                                        \
        barrier(CLK_LOCAL_MEM_FENCE);                                                            \
    } while (0)
#endif

// W's rows col0 .. col0 + BN of K step k0 into the stage at `dst` (bytes, shared window).
void load_w(local uint4 *smem, uint dst, global const ushort *w, uint col0, uint n, uint k, uint k0, uint tid)
{
#pragma unroll
    for (uint i = 0; i < W_PER; i++) {
        uint e = tid + i * THREADS;
        uint row = e / CH;
        uint c = e % CH;
        uint gn = col0 + row;
        uint gk = k0 + c * 8;
        bool ok = gn < n && gk < k;
        global const ushort *src = ok ? w + (ulong)gn * k + gk : w;
        CP_ASYNC16(smem, dst + SWZ(row, c), src, ok ? 16u : 0u);
    }
}

// HOIST: the offsets at k = 0 of this thread's `per` chunks in rows row0.. of a row-major matrix
// of `rows` rows of k halves, and which of those rows exist (bit i for chunk i).
uint hoist_rows(uint *off, uint row0, uint rows, uint k, uint tid, uint per)
{
    uint ok = 0;
#pragma unroll
    for (uint i = 0; i < per; i++) {
        uint r = row0 + (tid + i * THREADS) / CH;
        off[i] = r * k + (tid % CH) * 8;
        ok |= (uint)(r < rows) << i;
    }
    return ok;
}

// HOIST: chunk i of this thread's copies is `base + off[i] + k0` (row-major rows of k halves),
// valid where bit i of `rows_ok` is set and its column is under k.
void load_rows(local uint4 *smem, uint dst, global const ushort *base, const uint *off, uint rows_ok,
               uint k, uint k0, uint tid, uint per)
{
    uint gk = k0 + (tid % CH) * 8;
    bool k_ok = gk < k;
#pragma unroll
    for (uint i = 0; i < per; i++) {
        uint e = tid + i * THREADS;
        bool ok = k_ok && ((rows_ok >> i) & 1);
        global const ushort *src = ok ? base + (off[i] + k0) : base;
        CP_ASYNC16(smem, dst + SWZ(e / CH, e % CH), src, ok ? 16u : 0u);
    }
}

#if A_F16
void load_a(local uint4 *smem, uint dst, global const ushort *a, uint m0, uint m, uint k, uint k0, uint a_seq,
                   uint head_dim, uint tid)
{
#pragma unroll
    for (uint i = 0; i < A_PER; i++) {
        uint e = tid + i * THREADS;
        uint row = e / CH;
        uint c = e % CH;
        uint gm = m0 + row;
        uint gk = k0 + c * 8;
        bool ok = gm < m && gk < k;
        global const ushort *src = ok ? a + split_at(gm, gk, k, a_seq, head_dim) : a;
        CP_ASYNC16(smem, dst + SWZ(row, c), src, ok ? 16u : 0u);
    }
}
#else
// f32 A: K step k0's chunks into registers (8 floats each; zeros past the edges) ...
void fetch_a(float8 *r, global const float *a, uint m0, uint m, uint k, uint k0, uint a_seq,
                    uint head_dim, uint tid)
{
#pragma unroll
    for (uint i = 0; i < A_PER; i++) {
        uint e = tid + i * THREADS;
        uint row = e / CH;
        uint c = e % CH;
        uint gm = m0 + row;
        uint gk = k0 + c * 8;
        r[i] = (gm < m && gk < k) ? vload8(0, a + split_at(gm, gk, k, a_seq, head_dim))
                                  : (float8)(0.0f);
    }
}

// ... and from them, rounded to fp16, into the stage whose tile starts at `tile`.
void store_a(const float8 *r, local uint4 *tile, uint tid)
{
#pragma unroll
    for (uint i = 0; i < A_PER; i++) {
        uint e = tid + i * THREADS;
        uint row = e / CH;
        uint c = e % CH;
        vstore_half8(r[i], SWZ(row, c) >> 4, (local half *)tile);
    }
}
#endif

// The fragments of k16 slice kk of the stage at `st`: MT of A, NT / 2 x4 loads of W.
#define LOAD_FRAGS(af, bf, st, kk)                                                               \
    {                                                                                            \
        _Pragma("unroll") for (uint fi_ = 0; fi_ < MT; fi_++)                                       \
        {                                                                                        \
            LDMATRIX_X4((af)[fi_], (st) + a_off[kk] + fi_ * 16 * ROWB);                              \
        }                                                                                        \
        _Pragma("unroll") for (uint fj_ = 0; fj_ < NT / 2; fj_++)                                   \
        {                                                                                        \
            LDMATRIX_X4((bf)[fj_], (st) + w_off[kk] + fj_ * 16 * ROWB);                              \
        }                                                                                        \
    }

#if SERP
#define NCOL(i, j) (((i) & 1) ? NT - 1 - (j) : (j))
#else
#define NCOL(i, j) (j)
#endif
#define MMAS(af, bf)                                                                             \
    {                                                                                            \
        _Pragma("unroll") for (uint fi_ = 0; fi_ < MT; fi_++)                                       \
        {                                                                                        \
            _Pragma("unroll") for (uint fk_ = 0; fk_ < NT; fk_++)                                \
            {                                                                                    \
                MMA16816(acc[fi_][NCOL(fi_, fk_)], (af)[fi_], (bf)[NCOL(fi_, fk_) / 2][(NCOL(fi_, fk_) & 1) * 2], \
                         (bf)[NCOL(fi_, fk_) / 2][(NCOL(fi_, fk_) & 1) * 2 + 1]);                  \
            }                                                                                    \
        }                                                                                        \
    }

__attribute__((reqd_work_group_size(THREADS, 1, 1)))
kernel void mha_gemm_mma(global const void *a_raw, global const uint *w_raw,
                         global const float *bias, global float *c0, global float *c1,
                         global float *c2, uint m, uint n, uint k, uint n0, uint n1, uint a_seq,
                         uint c_seq, uint head_dim, float alpha0)
{
    local uint4 smem[STAGES * STAGE_BYTES / 16];
#ifdef PTX_EMULATE
    local uint emu[THREADS / 32][32][6];
#endif
    global const ushort *w = (global const ushort *)w_raw;
    uint tid = get_local_id(0);
    uint lane = tid & 31;
    uint warp = tid >> 5;
    uint wm0 = (warp / WARPS_N) * WM;
    uint wn0 = (warp % WARPS_N) * WN;
#if RASTER
    // Row-major workgroup order remapped to bands of RASTER tile rows walked down M first.
    uint tiles_n = get_num_groups(0);
    uint tiles_m = get_num_groups(1);
    uint id = get_group_id(1) * tiles_n + get_group_id(0);
    uint band = RASTER * tiles_n;
    uint first = (id / band) * RASTER;
    uint rows = min(tiles_m - first, (uint)RASTER);
    uint in_band = id % band;
    uint m0 = (first + in_band % rows) * BM;
    uint col0 = (in_band / rows) * BN;
#else
    uint m0 = get_group_id(1) * BM;
    uint col0 = get_group_id(0) * BN;
#endif
#if DIAG_SAME
    uint ld_m0 = m0 % (DIAG_SAME * BM);
    uint ld_col0 = col0 % (DIAG_SAME * BN);
#else
    uint ld_m0 = m0;
    uint ld_col0 = col0;
#endif
    uint sbase = SHARED_ADDR(smem);
    uint ktiles_all = (k + BK - 1) / BK;
#if SPLIT_K > 1
    uint split = get_group_id(2);
    uint per_split = (ktiles_all + SPLIT_K - 1) / SPLIT_K;
    uint kt0 = min(split * per_split, ktiles_all);
    uint ktiles = min(ktiles_all - kt0, per_split);
#else
    uint kt0 = 0;
    uint ktiles = ktiles_all;
#endif

    // Per lane, the byte offsets within a stage of what it points ldmatrix at, for the two k16
    // halves of a step: A rows wm0 + 16 i + (lane & 15), chunk 2 kk + (lane >> 4); W rows
    // wn0 + 16 j + 8 (lane >> 4) + (lane & 7), chunk 2 kk + ((lane >> 3) & 1).
    uint a_off[KS];
    uint w_off[KS];
    {
        uint ar = wm0 + (lane & 15);
        uint wr = wn0 + ((lane >> 4) << 3) + (lane & 7);
        for (uint kk = 0; kk < KS; kk++) {
            a_off[kk] = SWZ(ar, 2 * kk + (lane >> 4));
            w_off[kk] = BM * ROWB + SWZ(wr, 2 * kk + ((lane >> 3) & 1));
        }
    }

    float acc[MT][NT][4];
#pragma unroll
    for (uint i = 0; i < MT; i++) {
#pragma unroll
        for (uint j = 0; j < NT; j++) {
#pragma unroll
            for (uint r = 0; r < 4; r++) {
                acc[i][j][r] = 0.0f;
            }
        }
    }

#if A_F16
    global const ushort *a = (global const ushort *)a_raw;
#else
    global const float *a = (global const float *)a_raw;
    float8 a_next[A_PER];
#endif

#if HOIST
    uint wg_off[W_PER];
    uint w_rows_ok = hoist_rows(wg_off, ld_col0, n, k, tid, W_PER);
#define LOAD_W(st, k0) load_rows(smem, (st) + BM * ROWB, w, wg_off, w_rows_ok, k, k0, tid, W_PER)
#if A_F16
    uint ag_off[A_PER];
    uint a_rows_ok = hoist_rows(ag_off, ld_m0, m, k, tid, A_PER);
#define LOAD_A16(st, k0)                                                                         \
    do {                                                                                         \
        if (a_seq == 0) {                                                                        \
            load_rows(smem, st, a, ag_off, a_rows_ok, k, k0, tid, A_PER);                        \
        } else {                                                                                 \
            load_a(smem, st, a, ld_m0, m, k, k0, a_seq, head_dim, tid);                             \
        }                                                                                        \
    } while (0)
#endif
#else
#define LOAD_W(st, k0) load_w(smem, (st) + BM * ROWB, w, ld_col0, n, k, k0, tid)
#define LOAD_A16(st, k0) load_a(smem, st, a, ld_m0, m, k, k0, a_seq, head_dim, tid)
#endif

    // The copies of one K step into the stage at `st`: W and fp16 A by cp.async; f32 A into
    // registers, stored (converted) once the stage's readers are done.
#if A_F16
#define ISSUE_STEP(st, k0)                                                                       \
    do {                                                                                         \
        LOAD_W(st, k0);                                                                          \
        LOAD_A16(st, k0);                                                                        \
    } while (0)
#else
#define ISSUE_STEP(st, k0)                                                                       \
    do {                                                                                         \
        LOAD_W(st, k0);                                                                          \
        fetch_a(a_next, a, ld_m0, m, k, k0, a_seq, head_dim, tid);                                  \
    } while (0)
#endif

    // Prologue: steps 0 .. STAGES - 2 in flight.
#pragma unroll
    for (uint s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) {
            uint st = sbase + s * STAGE_BYTES;
            ISSUE_STEP(st, (kt0 + s) * BK);
#if !A_F16
            store_a(a_next, smem + s * (STAGE_BYTES / 16), tid);
#endif
        }
        CP_COMMIT();
    }

#if FRAG_DB
    uint af[2][MT][4];
    uint bf[2][NT / 2][4];
    CP_WAIT();
    BARRIER();
    uint st = sbase;
    LOAD_FRAGS(af[0], bf[0], st, 0);
    for (uint kt = 0; kt < ktiles; kt++) {
        uint next = kt + STAGES - 1;
        uint ns = next % STAGES;
        // Slice 0: slice 1's fragments first, then the copies of step `next` into the stage
        // step kt - 1 used (every warp passed the barrier after its last read of it), then the
        // products.
        LOAD_FRAGS(af[1], bf[1], st, 1);
        if (next < ktiles && !DIAG_NOCOPY) {
            ISSUE_STEP(sbase + ns * STAGE_BYTES, (kt0 + next) * BK);
        }
        CP_COMMIT();
        MMAS(af[0], bf[0]);
#if !A_F16
        if (next < ktiles) {
            store_a(a_next, smem + ns * (STAGE_BYTES / 16), tid);
        }
#endif
        // Slice 1: step kt + 1 landed (for every thread: the barrier); its slice 0 loaded
        // before slice 1's products.
        if (!DIAG_NOBAR) {
            CP_WAIT();
            BARRIER();
        }
        st = sbase + ((kt + 1) % STAGES) * STAGE_BYTES;
        LOAD_FRAGS(af[0], bf[0], st, 0);
        MMAS(af[1], bf[1]);
    }
#else
    for (uint kt = 0; kt < ktiles; kt++) {
        // Step kt has landed (for every thread: the barrier), and every warp is done with the
        // stage step kt - 1 used, which the copies below refill.
        if (!DIAG_NOBAR) {
            CP_WAIT();
            BARRIER();
        }
        uint next = kt + STAGES - 1;
        uint ns = next % STAGES;
        if (next < ktiles && !DIAG_NOCOPY) {
            ISSUE_STEP(sbase + ns * STAGE_BYTES, (kt0 + next) * BK);
        }
        CP_COMMIT();

        uint st = sbase + (kt % STAGES) * STAGE_BYTES;
#pragma unroll
        for (uint kk = 0; kk < KS; kk++) {
            uint af[MT][4];
            uint bf[NT / 2][4];
            LOAD_FRAGS(af, bf, st, kk);
            MMAS(af, bf);
        }
#if !A_F16
        if (next < ktiles) {
            store_a(a_next, smem + ns * (STAGE_BYTES / 16), tid);
        }
#endif
    }
#endif
    // Leave no copy in flight past the kernel's end (the last groups are empty).
    CP_WAIT_ALL();

    // Fragment element r of m16 tile i, n8 tile j: row g + 8 (r >> 1), columns 2 t and 2 t + 1.
    uint g = lane >> 2;
    uint t = lane & 3;
#pragma unroll
    for (uint i = 0; i < MT; i++) {
#pragma unroll
        for (uint h = 0; h < 2; h++) {
            uint gm = m0 + wm0 + i * 16 + g + 8 * h;
            if (gm >= m) {
                continue;
            }
#pragma unroll
            for (uint j = 0; j < NT; j++) {
                uint gn = col0 + wn0 + j * 8 + 2 * t;
                if (gn >= n) {
                    continue;
                }
                // n, n0, n1 and head_dim are multiples of 8: the pair stays in one output and head.
                float2 y = (float2)(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
#if SPLIT_K > 1
                if (split == 0) {
                    y += vload2(0, bias + gn);
                }
                global float *p;
                if (gn < n0) {
                    y *= alpha0;
                    p = c0 + split_at(gm, gn, n0, c_seq, head_dim);
                } else if (gn < n0 + n1) {
                    p = c1 + split_at(gm, gn - n0, n1, c_seq, head_dim);
                } else {
                    p = c2 + split_at(gm, gn - n0 - n1, n - n0 - n1, c_seq, head_dim);
                }
                RED_ADD(p, y.x);
                RED_ADD(p + 1, y.y);
#else
                y += vload2(0, bias + gn);
                if (gn < n0) {
                    vstore2(y * alpha0, 0, c0 + split_at(gm, gn, n0, c_seq, head_dim));
                } else if (gn < n0 + n1) {
                    vstore2(y, 0, c1 + split_at(gm, gn - n0, n1, c_seq, head_dim));
                } else {
                    vstore2(y, 0, c2 + split_at(gm, gn - n0 - n1, n - n0 - n1, c_seq, head_dim));
                }
#endif
            }
        }
    }
}
