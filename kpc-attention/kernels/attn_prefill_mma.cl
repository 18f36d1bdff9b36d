// Causal prefill attention on NVIDIA's matrix units through inline PTX (sm_80+), built the way
// FlashAttention-2's forward kernel is. Same buffers and scalars as attn_prefill_tiled.cl: q and o are
// f32 [batch * q_head][q_len][HEAD_DIM], k and v the fp16 cache [batch][kv_head][capacity][HEAD_DIM];
// query i sees keys up to kv_len - q_len + i; the query tile comes from y, last first.
//
// A workgroup is WARPS warps (4 or 8); each warp owns ROW_BLOCKS blocks of 16 query rows.
// Q is converted to fp16 once and kept in registers as mma.sync A fragments (or in local memory:
// Q_SHARED). K and V tiles of KEYS keys are staged with 16-byte cp.async (rows padded by 16 bytes,
// or XOR-swizzled: SWIZZLE, so that ldmatrix's 8 rows land in distinct banks); with STAGES 1 into
// one K and one V buffer, V(j) in flight while S = Q K(j)^T is computed and K(j+1) while
// O += P V(j) is; with STAGES 2 (kpc's default) or 3, tile j + 1 (.. j + STAGES - 1) in flight during
// all of tile j, one barrier per tile. S is m16n8k16 fp32 accumulators; the online
// softmax runs on them in place (lane / 4 is the row, a quad of lanes holds a row's columns, reduced
// with shfl.sync); P becomes fp16 A fragments in registers (two n8 accumulator tiles are exactly one
// k16 A fragment; HALF_EXP exponentiates those pairs in fp16); V's B fragments come from
// ldmatrix.trans. The defaults below are kpc's (AttentionOptions), which it always passes. A warp skips tiles wholly above its
// rows' diagonal and masks only tiles that cross it, and rescales O only where a row's max moved.
//
// The primitives (MMA, LDSM_X4, LDSM_X4_T, CP_ASYNC16, CP_COMMIT, CP_WAIT_ALL, CP_WAIT_BUT_ONE,
// SHFL_XOR, WARP_ANY, EXP2, EXP2_H2, ADD_H2, UNPACK_H2, PACK_HALF2) are PTX unless KPC_MMA_EMULATED is defined by a prelude that supplies portable ones
// (benches/ocl_prefill_mma_emu.h: lanes exchange through local memory and barriers, so that the
// fragment layouts can be checked on a CPU OpenCL; with it, every warp runs every tile).
//
// kpc-spec-constant 2 KV_F16
// kpc-spec-constant 3 HEAD_DIM
// kpc-spec-constant 5 ROW_BLOCKS
// kpc-spec-constant 6 KEYS
// kpc-spec-constant 7 WARPS
// kpc-spec-constant 8 LAZY_RESCALE
// kpc-spec-constant 9 SWIZZLE
// kpc-spec-constant 10 STAGES
// kpc-spec-constant 11 Q_SHARED
// kpc-spec-constant 12 HALF_EXP
#ifndef KV_F16
#define KV_F16 1
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef ROW_BLOCKS
#define ROW_BLOCKS 2
#endif
#ifndef KEYS
#define KEYS 32
#endif
// Experiments (benches/ocl_prefill_mma.c): fragments by ordinary local loads instead of ldmatrix;
// tiles by ordinary loads and stores instead of cp.async.
// Whether a warp rescales its O accumulators only on tiles where one of its rows' max moved (a
// warp vote), rather than on every tile.
#ifndef LAZY_RESCALE
#define LAZY_RESCALE 1
#endif
#ifndef DIRECT_LDS
#define DIRECT_LDS 0
#endif
// Tile rows unpadded, their 16-byte chunks XOR-swizzled by the row (so that ldmatrix's 8 rows still
// land in distinct banks), rather than padded by 16 bytes: what lets Q and the tiles fit in 48 KiB.
#ifndef SWIZZLE
#define SWIZZLE 0
#endif
// 1: one K and one V buffer, V(j) in flight during S(j) and K(j + 1) during P V(j), two barriers per
// tile. 2 or 3: that many K and V buffers, tiles j + 1 (.. j + STAGES - 1) in flight during all of
// tile j, one barrier per tile.
#ifndef STAGES
#define STAGES 2
#endif
// Q in local memory (fp16, swizzled like the tiles), its A fragments read by ldmatrix per k-step,
// rather than in registers.
#ifndef Q_SHARED
#define Q_SHARED 0
#endif
// Exponentials two at a time in fp16 (ex2.approx.f16x2 on the scaled, max-subtracted scores packed
// as P's fragments); the row sums from them: 1 adds each tile's in fp16 then once to the fp32 sum,
// 2 adds each exponential in fp32.
#ifndef HALF_EXP
#define HALF_EXP 1
#endif
#ifndef SYNC_COPY
#define SYNC_COPY 0
#endif
#if !KV_F16
#error "attn_prefill_mma needs an fp16 K/V cache"
#endif
#if HEAD_DIM % 32 != 0 || HEAD_DIM > 256
#error "attn_prefill_mma needs a head dimension that is a multiple of 32, at most 256"
#endif
#ifndef WARPS
#define WARPS 4
#endif
#if KEYS % 16 != 0 || (KEYS * HEAD_DIM / 8) % (32 * WARPS) != 0
#error "attn_prefill_mma needs KEYS a multiple of 16 and KEYS * HEAD_DIM / 8 a multiple of its work-items"
#endif
#if STAGES < 1 || STAGES > 3
#error "attn_prefill_mma takes 1 to 3 stages"
#endif
#if DIRECT_LDS && SWIZZLE
#error "attn_prefill_mma's direct loads read the padded layout"
#endif
#define RB ROW_BLOCKS
#define BQ (WARPS * 16 * RB)
#define NT (KEYS / 8)
#define DT (HEAD_DIM / 8)
#define KSTEPS (HEAD_DIM / 16)
#define CHUNKS_ROW (HEAD_DIM / 8)
#define CHUNKS (KEYS * CHUNKS_ROW / (32 * WARPS))
#if SWIZZLE
#define PADH HEAD_DIM
// Chunks swizzle within groups of 8 (4 where a row has no multiple of 8).
#define SWZ ((CHUNKS_ROW % 8 == 0) ? 7u : 3u)
#else
#define PADH (HEAD_DIM + 8)
#define SWZ 0u
#endif
// Where chunk C of row R starts (halfs). The fragment loads below add a per-lane part computed once
// to a constant: chunk c * 8 + p of a row whose low 3 bits are y lands at chunk
// c * 8 + (p ^ (y & SWZ)), so only p's low bits need a per-lane offset.
#define TOFF(R, C) ((R) * PADH + (((C) ^ ((R) & SWZ)) * 8))
#define TILE (KEYS * PADH)

#ifndef KPC_MMA_EMULATED
#define EMU_LOCALS
#define WARP_SKIPS 1

// d += a * b for one m16n8k16 product: fp16 operands, fp32 accumulators.
#define MMA(D, A, B0, B1)                                                                          \
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "         \
        "{%8,%9}, {%0,%1,%2,%3};"                                                                 \
        : "+f"((D)[0]), "+f"((D)[1]), "+f"((D)[2]), "+f"((D)[3])                                  \
        : "r"((A)[0]), "r"((A)[1]), "r"((A)[2]), "r"((A)[3]), "r"(B0), "r"(B1))

// Four 8x8 fp16 matrices from local memory; this lane gives the address of row lane % 8 of matrix
// lane / 8 (BASE + OFF halfs). The local pointer's integer value is its shared-window address.
#define LDSM_X4(R, BASE, OFF)                                                                      \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"                   \
                 : "=r"((R)[0]), "=r"((R)[1]), "=r"((R)[2]), "=r"((R)[3])                          \
                 : "r"((uint)(ulong)((BASE) + (OFF)))                                              \
                 : "memory")
#define LDSM_X4_T(R, BASE, OFF)                                                                    \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"             \
                 : "=r"((R)[0]), "=r"((R)[1]), "=r"((R)[2]), "=r"((R)[3])                          \
                 : "r"((uint)(ulong)((BASE) + (OFF)))                                              \
                 : "memory")

// 16 bytes from global to local memory, asynchronously; SIZE 0 writes zeros and reads nothing.
#define CP_ASYNC16(DST, SRC, SIZE)                                                                 \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((uint)(ulong)(DST)),        \
                 "l"(SRC), "r"(SIZE)                                                              \
                 : "memory")
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define CP_WAIT_ALL() asm volatile("cp.async.wait_group 0;" ::: "memory")
#define CP_WAIT_BUT_ONE() asm volatile("cp.async.wait_group 1;" ::: "memory")

inline float shfl_xor(float x, uint m)
{
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(x), "r"(m));
    return r;
}
#define SHFL_XOR(X, M) shfl_xor((X), (M))

inline bool warp_any(bool p)
{
    uint r;
    asm volatile("{ .reg .pred q; setp.ne.u32 q, %1, 0; vote.sync.any.pred q, q, 0xffffffff; "
                 "selp.u32 %0, 1, 0, q; }"
                 : "=r"(r)
                 : "r"((uint)p));
    return r != 0;
}
#define WARP_ANY(P) warp_any(P)

inline float exp2_approx(float x)
{
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
#define EXP2(X) exp2_approx(X)

// Two floats as fp16 in one word, LO in the low half.
inline uint pack_half2(float lo, float hi)
{
    uint r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#define PACK_HALF2(LO, HI) pack_half2((LO), (HI))

// 2^x for both fp16 halves of a word.
inline uint exp2_half2(uint x)
{
    uint r;
    asm("ex2.approx.f16x2 %0, %1;" : "=r"(r) : "r"(x));
    return r;
}
#define EXP2_H2(X) exp2_half2(X)
inline uint add_half2(uint a, uint b)
{
    uint r;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#define ADD_H2(A, B) add_half2((A), (B))
// The two fp16 halves of a word as floats.
inline float2 unpack_half2(uint w)
{
    float lo, hi;
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
        : "=f"(lo), "=f"(hi)
        : "r"(w));
    return (float2)(lo, hi);
}
#define UNPACK_H2(W) unpack_half2(W)
#endif

// Stages keys j0 .. j0 + KEYS of one head (K or V) into dst, zeros past `visible`.
// Whether each work-item's chunks share one swizzle (its keys step by a multiple of 8), so that
// their local offsets are one per-thread offset plus constants.
#define STAGE_STEP ((32 * WARPS) % CHUNKS_ROW == 0 && ((32 * WARPS / CHUNKS_ROW) & SWZ) == 0)
inline void stage(local ushort *dst, global const uint4 *src, uint head_row, uint j0,
                  uint visible, uint tid)
{
    uint soff = TOFF(tid / CHUNKS_ROW, tid % CHUNKS_ROW);
#pragma unroll
    for (uint e = 0; e < CHUNKS; e++) {
        uint c = tid + 32 * WARPS * e;
        uint key = c / CHUNKS_ROW;
        uint ch = c % CHUNKS_ROW;
        uint j = j0 + key;
        bool ok = j < visible;
        uint at = STAGE_STEP ? soff + e * (32 * WARPS / CHUNKS_ROW) * PADH : TOFF(key, ch);
#if SYNC_COPY
        *(local uint4 *)(dst + at) =
            ok ? src[(head_row + j) * CHUNKS_ROW + ch] : (uint4)(0u);
#else
        CP_ASYNC16(dst + at, src + (head_row + (ok ? j : 0)) * CHUNKS_ROW + ch,
                   ok ? 16u : 0u);
#endif
    }
}
#if SYNC_COPY
#define COMMIT()
#else
#define COMMIT() CP_COMMIT()
#endif

__attribute__((reqd_work_group_size(32 * WARPS, 1, 1)))
kernel void attn_prefill_mma(global const float *q, global const uint4 *k, global const uint4 *v,
                             global float *o, uint q_len, uint kv_len, uint capacity,
                             uint q_heads, uint group, float scale)
{
    // 16-byte aligned: cp.async writes 16-byte chunks.
    local ushort ks[STAGES * TILE] __attribute__((aligned(16)));
    local ushort vs[STAGES * TILE] __attribute__((aligned(16)));
#if Q_SHARED
    local ushort qs[BQ * PADH] __attribute__((aligned(16)));
#endif
    EMU_LOCALS
    uint tid = get_local_id(0);
    uint warp = tid / 32;
    uint lane = tid % 32;
    uint g = lane / 4;
    uint t = lane % 4;
    uint bh = get_group_id(0);
    uint b = bh / q_heads;
    uint hq = bh % q_heads;
    uint kv_heads = q_heads / group;
    uint head_row = (b * kv_heads + hq / group) * capacity;
    uint tile = get_num_groups(1) - 1 - get_group_id(1);
    uint q0 = tile * BQ;
    uint rows = min((uint)BQ, q_len - q0);
    uint offset = kv_len - q_len;
    uint visible = offset + q0 + rows;
    uint q_base = (bh * q_len + q0) * HEAD_DIM;
    uint wrow0 = warp * 16 * RB;
    // The key positions this warp's first and last rows see up to.
    uint wfirst = offset + q0 + wrow0;
    uint wlast = wfirst + 16 * RB - 1;
    // Scores are scaled in fp32 and exponentiated base 2.
    float sl2 = scale * 1.4426950408889634f;
    uint ntiles = (visible + KEYS - 1) / KEYS;
    // Per-lane parts of the ldmatrix offsets (see TOFF): K's for k-step pairs kd even / odd, V's
    // for d-pairs dp % 4, Q's for (kd % 2, k-step of the pair).
    uint y = lane % 8;
    uint kx[2], vx[4];
#pragma unroll
    for (uint p = 0; p < 2; p++) {
        kx[p] = y * PADH + (((p * 4 + lane / 8) ^ (y & SWZ)) * 8);
    }
#pragma unroll
    for (uint p = 0; p < 4; p++) {
        vx[p] = (y + 8 * ((lane / 8) % 2)) * PADH + (((p * 2 + lane / 16) ^ (y & SWZ)) * 8);
    }
#if Q_SHARED
    uint qx[4];
#pragma unroll
    for (uint p = 0; p < 4; p++) {
        qx[p] = (wrow0 + lane % 16) * PADH + (((p * 2 + lane / 16) ^ (y & SWZ)) * 8);
    }
#endif

#if STAGES == 1
    stage(ks, k, head_row, 0, visible, tid);
    COMMIT();
#else
    // Tiles 0 .. STAGES - 2 in flight, one commit group each (empty past the last tile, so that
    // the wait below always counts the same groups).
#pragma unroll
    for (uint st = 0; st + 1 < STAGES; st++) {
        if (st < ntiles) {
            stage(ks + st * TILE, k, head_row, st * KEYS, visible, tid);
            stage(vs + st * TILE, v, head_row, st * KEYS, visible, tid);
        }
        COMMIT();
    }
#endif

#if Q_SHARED
    // Q as fp16 rows in local memory; the loop's first barrier publishes them.
    for (uint c = tid; c < BQ * CHUNKS_ROW; c += 32 * WARPS) {
        uint r = c / CHUNKS_ROW;
        uint ch = c % CHUNKS_ROW;
        uint4 w = (uint4)(0u);
        if (r < rows) {
            float8 x = vload8(0, q + q_base + r * HEAD_DIM + ch * 8);
            w = (uint4)(PACK_HALF2(x.s0, x.s1), PACK_HALF2(x.s2, x.s3), PACK_HALF2(x.s4, x.s5),
                        PACK_HALF2(x.s6, x.s7));
        }
        *(local uint4 *)(qs + TOFF(r, ch)) = w;
    }
#else
    // Q's A fragments: a0 (row g, cols 2t..), a1 (row g + 8), a2 (cols + 8), a3 (both).
    uint qa[RB * KSTEPS * 4];
#pragma unroll
    for (uint rb = 0; rb < RB; rb++) {
#pragma unroll
        for (uint kk = 0; kk < KSTEPS; kk++) {
#pragma unroll
            for (uint i = 0; i < 4; i++) {
                uint r = wrow0 + rb * 16 + g + 8 * (i & 1);
                uint c = kk * 16 + 2 * t + 8 * (i >> 1);
                float2 x = (float2)(0.0f);
                if (r < rows) {
                    x = vload2(0, q + q_base + r * HEAD_DIM + c);
                }
                qa[(rb * KSTEPS + kk) * 4 + i] = PACK_HALF2(x.x, x.y);
            }
        }
    }
#endif

    float oc[RB * DT * 4];
#pragma unroll
    for (uint i = 0; i < RB * DT * 4; i++) {
        oc[i] = 0.0f;
    }
    // Per row (g and g + 8 of each block): running max (unscaled) and this lane's share of the sum.
    float m[RB * 2];
    float l[RB * 2];
#pragma unroll
    for (uint i = 0; i < RB * 2; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }

    for (uint it = 0; it < ntiles; it++) {
        uint j0 = it * KEYS;
#if STAGES == 1
        local const ushort *kt = ks;
        local const ushort *vt = vs;
        CP_WAIT_ALL();
        // K(it) is in for every warp, and every warp is done with V(it - 1).
        barrier(CLK_LOCAL_MEM_FENCE);
        stage(vs, v, head_row, j0, visible, tid);
        COMMIT();
#else
        uint buf = it % STAGES;
        local const ushort *kt = ks + buf * TILE;
        local const ushort *vt = vs + buf * TILE;
#if STAGES == 2
        CP_WAIT_ALL();
#else
        CP_WAIT_BUT_ONE();
#endif
        // K(it) and V(it) are in for every warp, and every warp is done with tile it - 1, whose
        // buffers take tile it + STAGES - 1.
        barrier(CLK_LOCAL_MEM_FENCE);
        {
            uint nx = it + STAGES - 1;
            if (nx < ntiles) {
                uint nb = nx % STAGES;
                stage(ks + nb * TILE, k, head_row, nx * KEYS, visible, tid);
                stage(vs + nb * TILE, v, head_row, nx * KEYS, visible, tid);
            }
            COMMIT();
        }
#endif
        bool active = !WARP_SKIPS || j0 <= wlast;
        float s[RB * NT * 4];
#if HALF_EXP
        // P's fp16 pairs: (rb * NT + nt) * 2 + h holds row g + 8 h's two columns of n8 tile nt.
        uint ph[RB * NT * 2];
#endif
        if (active) {
#pragma unroll
            for (uint i = 0; i < RB * NT * 4; i++) {
                s[i] = 0.0f;
            }
#pragma unroll
            for (uint kd = 0; kd < HEAD_DIM / 32; kd++) {
#if Q_SHARED
                // This k-step pair's Q fragments: [rb][2 kd + x] at (rb * 2 + x) * 4; matrices are
                // rows 0-7 / 8-15 (lanes 0-7 / 8-15) by columns 0-7, then by 8-15 (lanes 16-31).
                uint qa[RB * 2 * 4];
#pragma unroll
                for (uint rb = 0; rb < RB; rb++) {
#pragma unroll
                    for (uint x = 0; x < 2; x++) {
                        LDSM_X4(&qa[(rb * 2 + x) * 4], qs,
                                rb * 16 * PADH + (kd / 2) * 64 + qx[(kd % 2) * 2 + x]);
                    }
                }
#define QFRAG(RB_, X) (&qa[((RB_) * 2 + (X)) * 4])
#else
#define QFRAG(RB_, X) (&qa[((RB_) * KSTEPS + 2 * kd + (X)) * 4])
#endif
#pragma unroll
                for (uint nt = 0; nt < NT; nt++) {
                    // Matrices: keys nt*8 .. +8 by d kd*32 + 8 * (0..3); regs 0-1 are the B fragment
                    // of k-step 2 kd, 2-3 of 2 kd + 1.
                    uint kb[4];
#if DIRECT_LDS
#pragma unroll
                    for (uint i = 0; i < 4; i++) {
                        kb[i] = *(local const uint *)(kt + (nt * 8 + g) * PADH + kd * 32 + 8 * i +
                                                       2 * t);
                    }
#else
                    LDSM_X4(kb, kt, nt * 8 * PADH + (kd / 2) * 64 + kx[kd % 2]);
#endif
#pragma unroll
                    for (uint rb = 0; rb < RB; rb++) {
                        MMA(&s[(rb * NT + nt) * 4], QFRAG(rb, 0), kb[0], kb[1]);
                        MMA(&s[(rb * NT + nt) * 4], QFRAG(rb, 1), kb[2], kb[3]);
                    }
                }
#undef QFRAG
            }
            bool crosses = j0 + KEYS - 1 > wfirst;
            float al[RB * 2];
            bool moved = false;
#pragma unroll
            for (uint rb = 0; rb < RB; rb++) {
#pragma unroll
                for (uint h = 0; h < 2; h++) {
                    uint qpos = wfirst + rb * 16 + g + 8 * h;
                    float mx = -INFINITY;
#pragma unroll
                    for (uint nt = 0; nt < NT; nt++) {
#pragma unroll
                        for (uint c = 0; c < 2; c++) {
                            uint at = (rb * NT + nt) * 4 + 2 * h + c;
                            if (crosses && j0 + nt * 8 + 2 * t + c > qpos) {
                                s[at] = -INFINITY;
                            }
                            mx = fmax(mx, s[at]);
                        }
                    }
                    mx = fmax(mx, SHFL_XOR(mx, 1));
                    mx = fmax(mx, SHFL_XOR(mx, 2));
                    float mnew = fmax(m[rb * 2 + h], mx);
                    float alpha = EXP2((m[rb * 2 + h] - mnew) * sl2);
                    moved = moved || mnew != m[rb * 2 + h];
                    al[rb * 2 + h] = alpha;
                    m[rb * 2 + h] = mnew;
                    float ms = mnew * sl2;
                    float rs = 0.0f;
#if HALF_EXP == 1
                    uint hs = 0u;
#endif
#pragma unroll
                    for (uint nt = 0; nt < NT; nt++) {
                        uint at = (rb * NT + nt) * 4 + 2 * h;
#if HALF_EXP
                        uint e = EXP2_H2(PACK_HALF2(fma(s[at], sl2, -ms), fma(s[at + 1], sl2, -ms)));
                        ph[(rb * NT + nt) * 2 + h] = e;
#if HALF_EXP == 1
                        hs = nt == 0 ? e : ADD_H2(hs, e);
#else
                        float2 ef = UNPACK_H2(e);
                        rs += ef.x + ef.y;
#endif
#else
#pragma unroll
                        for (uint c = 0; c < 2; c++) {
                            float p = EXP2(fma(s[at + c], sl2, -ms));
                            s[at + c] = p;
                            rs += p;
                        }
#endif
                    }
#if HALF_EXP == 1
                    float2 hf = UNPACK_H2(hs);
                    rs = hf.x + hf.y;
#endif
                    l[rb * 2 + h] = l[rb * 2 + h] * alpha + rs;
                }
            }
#if LAZY_RESCALE
            if (WARP_ANY(moved))
#endif
            {
#pragma unroll
                for (uint rb = 0; rb < RB; rb++) {
#pragma unroll
                    for (uint dt = 0; dt < DT; dt++) {
#pragma unroll
                        for (uint x = 0; x < 4; x++) {
                            oc[(rb * DT + dt) * 4 + x] *= al[rb * 2 + x / 2];
                        }
                    }
                }
            }
        }
#if STAGES == 1
        CP_WAIT_ALL();
        // V(it) is in for every warp, and every warp is done with K(it).
        barrier(CLK_LOCAL_MEM_FENCE);
        if (it + 1 < ntiles) {
            stage(ks, k, head_row, j0 + KEYS, visible, tid);
        }
        COMMIT();
#endif
        if (active) {
#pragma unroll
            for (uint kk = 0; kk < KEYS / 16; kk++) {
                // P's A fragment for keys kk*16 .. +16: the accumulators of n8 tiles 2 kk and 2 kk + 1.
                uint pa[RB * 4];
#pragma unroll
                for (uint rb = 0; rb < RB; rb++) {
#if HALF_EXP
                    uint p0 = (rb * NT + 2 * kk) * 2;
                    pa[rb * 4] = ph[p0];
                    pa[rb * 4 + 1] = ph[p0 + 1];
                    pa[rb * 4 + 2] = ph[p0 + 2];
                    pa[rb * 4 + 3] = ph[p0 + 3];
#else
                    uint s0 = (rb * NT + 2 * kk) * 4;
                    uint s1 = s0 + 4;
                    pa[rb * 4] = PACK_HALF2(s[s0], s[s0 + 1]);
                    pa[rb * 4 + 1] = PACK_HALF2(s[s0 + 2], s[s0 + 3]);
                    pa[rb * 4 + 2] = PACK_HALF2(s[s1], s[s1 + 1]);
                    pa[rb * 4 + 3] = PACK_HALF2(s[s1 + 2], s[s1 + 3]);
#endif
                }
#pragma unroll
                for (uint dp = 0; dp < DT / 2; dp++) {
                    // Matrices (transposed): keys kk*16 + (0..7, 8..15) by d (2 dp) * 8, then the
                    // same keys by d (2 dp + 1) * 8.
                    uint vb[4];
#if DIRECT_LDS
#pragma unroll
                    for (uint i = 0; i < 4; i++) {
                        uint at = (kk * 16 + 8 * (i % 2) + 2 * t) * PADH + (2 * dp + i / 2) * 8 + g;
                        vb[i] = (uint)vt[at] | (uint)vt[at + PADH] << 16;
                    }
#else
                    LDSM_X4_T(vb, vt, kk * 16 * PADH + (dp / 4) * 64 + vx[dp % 4]);
#endif
#pragma unroll
                    for (uint rb = 0; rb < RB; rb++) {
                        MMA(&oc[(rb * DT + 2 * dp) * 4], &pa[rb * 4], vb[0], vb[1]);
                        MMA(&oc[(rb * DT + 2 * dp + 1) * 4], &pa[rb * 4], vb[2], vb[3]);
                    }
                }
            }
        }
    }

#pragma unroll
    for (uint rb = 0; rb < RB; rb++) {
#pragma unroll
        for (uint h = 0; h < 2; h++) {
            float lt = l[rb * 2 + h];
            lt += SHFL_XOR(lt, 1);
            lt += SHFL_XOR(lt, 2);
            float inv = 1.0f / lt;
            uint r = wrow0 + rb * 16 + g + 8 * h;
            if (r < rows) {
#pragma unroll
                for (uint dt = 0; dt < DT; dt++) {
                    uint at = (rb * DT + dt) * 4 + 2 * h;
                    vstore2((float2)(oc[at] * inv, oc[at + 1] * inv), 0,
                            o + q_base + r * HEAD_DIM + dt * 8 + 2 * t);
                }
            }
        }
    }
}
