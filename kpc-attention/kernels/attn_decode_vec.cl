// Decode attention, vectorized and fused (append, splits, combination in one launch). The OpenCL C
// twin of attn_decode_vec.comp (read its header for the design): the same buffers, scalars and
// spec-constant ids. The partials and the counter are volatile, fenced before the count, so the last
// workgroup of a KV head reads every other one's writes. Each lane loads 16 bytes per chunk
// as a uint4 and widens f16 with vload_half8 from registers (a vload_half8 from global memory may be
// split into 2-byte loads, since the compiler cannot know it is 16-byte aligned).
//
// OpenCL 1.2 has no subgroup shuffles, so a row's partial dot products are summed in one of two ways:
// with NV_SHUFFLE = 1 (NVIDIA devices only) by the PTX butterfly shuffle, within one warp; otherwise
// through local memory, with two workgroup barriers per block of rows.
//
// kpc-spec-constant 0 LOCAL_SIZE
// kpc-spec-constant 2 KV_F16
// kpc-spec-constant 3 HEAD_DIM
// kpc-spec-constant 6 LANES
// kpc-spec-constant 7 GROUP
// kpc-spec-constant 8 NV_SHUFFLE
// kpc-spec-constant 9 ROWS
// kpc-spec-constant 10 SPREAD
// kpc-spec-constant 11 PREFETCH
// kpc-spec-constant 12 CYCLIC
// kpc-spec-constant 13 COMBINE
// kpc-spec-constant 14 HEAD_LANES
// kpc-spec-constant 15 NARROW
// kpc-spec-constant 16 MERGE_ALL
// kpc-spec-constant 17 SCAN
// kpc-spec-constant 18 MERGE_ONCE
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 128
#endif
#ifndef KV_F16
#define KV_F16 1
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef LANES
#define LANES 16
#endif
#ifndef GROUP
#define GROUP 1
#endif
#ifndef ROWS
#define ROWS 4
#endif
#ifndef SPREAD
#define SPREAD 0
#endif
#ifndef PREFETCH
#define PREFETCH 0
#endif
#ifndef NV_SHUFFLE
#define NV_SHUFFLE 0
#endif
#ifndef CYCLIC
#define CYCLIC 0
#endif
// Id 13 is the GLSL twin's COMBINE (all query heads combined at once); declared so that both
// images take the same ids. This kernel keeps its per-head combination below, which measured
// faster here (BENCHMARKS.md, issue 7), so it changes nothing.
#ifndef COMBINE
#define COMBINE 0
#endif
// Id 14 is the GLSL twin's HEAD_LANES (a row's query heads shared out among its lanes by
// subgroup shuffles); declared so that both images take the same ids. The host never sets it on
// OpenCL, whose rows are summed through local memory or the PTX shuffle, so it changes nothing.
#ifndef HEAD_LANES
#define HEAD_LANES 0
#endif
// Ids 15 and 16 are the GLSL twin's NARROW (8-byte chunks, up to 32 lanes per row) and MERGE_ALL
// (every query head's row groups merged at once); declared so that both images take the same ids.
// The host sets them only on Vulkan, so they change nothing here.
#ifndef NARROW
#define NARROW 0
#endif
#ifndef MERGE_ALL
#define MERGE_ALL 0
#endif
// Id 17 is the GLSL twin's SCAN (each head's split maxima and sums reduced in parallel in the
// all-heads combination); declared for the same ids, never set on OpenCL.
#ifndef SCAN
#define SCAN 0
#endif
// Id 18 is the GLSL twin's MERGE_ONCE (each head's row-group max and sum found once); declared for
// the same ids, never set on OpenCL.
#ifndef MERGE_ONCE
#define MERGE_ONCE 0
#endif

#define E (KV_F16 ? 8 : 4)
#define ROW_CHUNKS (HEAD_DIM / E)
#define CPL (ROW_CHUNKS / LANES)
#define VALS (CPL * E)
#define RG (LOCAL_SIZE / LANES)
#define U ROWS
#define NQ (SPREAD ? 1 : GROUP)

// Rows base + u * RG + rg (u < U) of this KV head into KW/VW, as this lane's chunks; rows past lim
// load row lim - 1 (they are masked out of the softmax). Needs base < lim. A macro, not a function,
// so that the private arrays stay in registers.
#define LOAD_ROWS(KW, VW, BASE)                                         \
    do {                                                                \
        _Pragma("unroll") for (uint u_ = 0; u_ < U; u_++) {             \
            uint j_ = min((BASE) + u_ * RG + rg, lim - 1);              \
            uint r_ = (row_base + j_) * ROW_CHUNKS + lane;              \
            _Pragma("unroll") for (uint i_ = 0; i_ < CPL; i_++) {       \
                KW[u_ * CPL + i_] = k[r_ + i_ * LANES];                 \
                VW[u_ * CPL + i_] = v[r_ + i_ * LANES];                 \
            }                                                           \
        }                                                               \
    } while (0)
#define PER_X (SPREAD ? GROUP : 1)
#define W_CACHED 1024
#define COMBINE_UNROLL 8  // splits in flight per slice when combining (16 lost in the per-head one, H200)
#define SLICES (LOCAL_SIZE / 32)
#define PER_LANE ((HEAD_DIM + 31) / 32)

#if NV_SHUFFLE
inline float shfl_xor(float x, int off)
{
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(x), "r"(off));
    return r;
}
#endif

// x as an f16 bit pattern, rounded to nearest even, with integer operations: the step must attend
// the appended position as the cache stores it, and NVIDIA's Vulkan compiler folded a
// pack-then-unpack pair back to the unrounded value (the GLSL twin says more); this keeps both
// backends on one conversion that no compiler folds.
inline uint half_rne(float x)
{
    uint b = as_uint(x);
    uint sign = (b >> 16) & 0x8000u;
    uint a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) {  // infinity, NaN (kept quiet)
        return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u);
    }
    if (a >= 0x477ff000u) {  // 65520 and up round to infinity
        return sign | 0x7c00u;
    }
    if (a < 0x38800000u) {  // below 2^-14: a subnormal half, x * 2^24 rounded (exact in f32)
        return sign | (uint)rint(as_float(a) * 16777216.0f);
    }
    uint h = (a - 0x38000000u) >> 13;  // rebias the exponent, keep 10 mantissa bits
    uint rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) {
        h += 1u;
    }
    return sign | h;
}

inline uint4 pack_new(global const float *src, uint at)
{
#if KV_F16
    float8 x = vload8(0, src + at);
    return (uint4)(half_rne(x.s0) | (half_rne(x.s1) << 16), half_rne(x.s2) | (half_rne(x.s3) << 16),
                   half_rne(x.s4) | (half_rne(x.s5) << 16), half_rne(x.s6) | (half_rne(x.s7) << 16));
#else
    return as_uint4(vload4(0, src + at));
#endif
}

inline void widen(uint4 w, float *out)
{
#if KV_F16
    vstore8(vload_half8(0, (const private half *)&w), 0, out);
#else
    vstore4(as_float4(w), 0, out);
#endif
}

// Adds COMBINE_UNROLL splits s0, s0 + stride, ... of one query head (its partials from `first`),
// each weighted exp(max - m), into this lane's PER_LANE columns sl, sl + 32, ...: all loaded before
// any is used, since the partials are volatile (each load an L2 round trip; one split per trip made
// the combination the largest fixed cost of a step, BENCHMARKS.md, issue 7). Splits past the end
// load a valid one and weigh 0. With `cached`, the weights of splits below W_CACHED come from w.
inline void add_splits(float *sum, volatile global const float *part_o,
                       volatile global const float *part_ml, local const float *w, bool cached,
                       uint first, uint s0, uint stride, uint splits, uint sl, float m)
{
    float wt[COMBINE_UNROLL];
    float x[COMBINE_UNROLL * 8];
#pragma unroll
    for (uint u = 0; u < COMBINE_UNROLL; u++) {
        uint s = s0 + u * stride;
        uint at = min(s, splits - 1);
        wt[u] = s >= splits ? 0.0f
                : cached && s < W_CACHED ? w[s]
                                         : exp(part_ml[(first + s) * 2] - m);
#pragma unroll
        for (uint i = 0; i < PER_LANE; i++) {
            uint d = min(sl + 32 * i, (uint)HEAD_DIM - 1);
            x[u * 8 + i] = part_o[(first + at) * HEAD_DIM + d];
        }
    }
#pragma unroll
    for (uint u = 0; u < COMBINE_UNROLL; u++) {
#pragma unroll
        for (uint i = 0; i < PER_LANE; i++) {
            sum[i] += wt[u] * x[u * 8 + i];
        }
    }
}

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void attn_decode_vec(global const float *q, global uint4 *k, global uint4 *v,
                            volatile global float *part_o, volatile global float *part_ml,
                            global const float *new_k, global const float *new_v,
                            volatile global uint *done, global float *o, uint kv_len,
                            uint capacity, uint kv_heads, uint per_split, float scale, uint append)
{
    local float w[W_CACHED];
    local float red2[LOCAL_SIZE];
    local float part[SLICES * HEAD_DIM];
    local int last;
    local float sm_m[RG];
    local float sm_l[RG];
    local float sm_o[RG * HEAD_DIM];
#if !NV_SHUFFLE
    local float red[LOCAL_SIZE * U * GROUP];
#endif
    uint tid = get_local_id(0);
    uint lane = tid % LANES;
    uint rg = tid / LANES;
    uint split = get_group_id(0) / PER_X;
    uint gx = get_group_id(0) % PER_X;
    uint splits = get_num_groups(0) / PER_X;
    uint bkv = get_group_id(1);
    uint b = bkv / kv_heads;
    uint hkv = bkv % kv_heads;
    uint head0 = b * kv_heads * GROUP + hkv * GROUP;
    uint qrow0 = head0 + gx;
    uint j0 = split * per_split;
    uint j1 = min(j0 + per_split, kv_len);
    uint jc = min(j1, kv_len - append);
    uint row_base = bkv * capacity;
    // The rows this work-group reads: one trip of RG * U rows from `first`, then every `step`
    // rows, all below `lim` (the GLSL twin's CYCLIC says why).
    uint first = CYCLIC ? split * RG * U : j0;
    uint step = CYCLIC ? splits * RG * U : RG * U;
    uint lim = CYCLIC ? kv_len - append : jc;

    float qv[NQ * VALS];
    float acc[NQ * VALS];
    float m[NQ];
    float l[NQ];
    #pragma unroll
    for (uint g = 0; g < NQ; g++) {
        #pragma unroll
        for (uint i = 0; i < CPL; i++) {
            #pragma unroll
            for (uint t = 0; t < E; t++) {
                uint d = (lane + i * LANES) * E + t;
                qv[g * VALS + i * E + t] = q[(qrow0 + g) * HEAD_DIM + d] * scale;
                acc[g * VALS + i * E + t] = 0.0f;
            }
        }
        m[g] = -3.0e38f;
        l[g] = 0.0f;
    }

    uint4 kw[U * CPL];
    uint4 vw[U * CPL];
    uint4 kp[U * CPL];
    uint4 vp[U * CPL];
    if (PREFETCH && first < lim) {
        LOAD_ROWS(kw, vw, first);
    }
    for (uint base = first; base < lim; base += step) {
        if (!PREFETCH) {
            LOAD_ROWS(kw, vw, base);
        } else if (base + step < lim) {
            // The next rows are in flight while these are used.
            LOAD_ROWS(kp, vp, base + step);
        }
        float s[U * NQ];
        #pragma unroll
        for (uint u = 0; u < U; u++) {
            #pragma unroll
            for (uint g = 0; g < NQ; g++) {
                float x = 0.0f;
                #pragma unroll
                for (uint i = 0; i < CPL; i++) {
                    float kf[E];
                    widen(kw[u * CPL + i], kf);
                    #pragma unroll
                    for (uint t = 0; t < E; t++) {
                        x += qv[g * VALS + i * E + t] * kf[t];
                    }
                }
#if NV_SHUFFLE
                #pragma unroll
                for (int off = LANES / 2; off > 0; off >>= 1) {
                    x += shfl_xor(x, off);
                }
                s[u * NQ + g] = x;
#else
                red[(u * NQ + g) * LOCAL_SIZE + tid] = x;
#endif
            }
        }
#if !NV_SHUFFLE
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (uint ug = 0; ug < U * NQ; ug++) {
            float x = 0.0f;
            #pragma unroll
            for (uint t = 0; t < LANES; t++) {
                x += red[ug * LOCAL_SIZE + rg * LANES + t];
            }
            s[ug] = x;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        #pragma unroll
        for (uint g = 0; g < NQ; g++) {
            float mx = m[g];
            #pragma unroll
            for (uint u = 0; u < U; u++) {
                if (base + u * RG + rg < lim) {
                    mx = fmax(mx, s[u * NQ + g]);
                }
            }
            float corr = exp(m[g] - mx);
            l[g] *= corr;
            #pragma unroll
            for (uint c = 0; c < VALS; c++) {
                acc[g * VALS + c] *= corr;
            }
            #pragma unroll
            for (uint u = 0; u < U; u++) {
                float pr = base + u * RG + rg < lim ? exp(s[u * NQ + g] - mx) : 0.0f;
                l[g] += pr;
                #pragma unroll
                for (uint i = 0; i < CPL; i++) {
                    float vf[E];
                    widen(vw[u * CPL + i], vf);
                    #pragma unroll
                    for (uint t = 0; t < E; t++) {
                        acc[g * VALS + i * E + t] += pr * vf[t];
                    }
                }
            }
            m[g] = mx;
        }
        if (PREFETCH) {
            #pragma unroll
            for (uint c = 0; c < U * CPL; c++) {
                kw[c] = kp[c];
                vw[c] = vp[c];
            }
        }
    }

    // The appended position: attended by row group 0 of the last split, and stored in the cache.
    // The whole workgroup runs this block (the local-memory sum has barriers), the others with
    // zeros. It is not under `if (append)`: PoCL 3.1 lost private values (the row group index)
    // across barriers inside that uniform branch, so that every row group took the new row.
    {
#define MINE (append && split == splits - 1 && rg == 0)
#define WRITER (MINE && gx == 0)
        uint pos = kv_len - 1;
        uint src = bkv * HEAD_DIM;
        uint r = (row_base + pos) * ROW_CHUNKS + lane;
        uint4 kn[CPL];
        uint4 vn[CPL];
#pragma unroll
        for (uint i = 0; i < CPL; i++) {
            uint at = src + (lane + i * LANES) * E;
            kn[i] = MINE ? pack_new(new_k, at) : (uint4)(0);
            vn[i] = MINE ? pack_new(new_v, at) : (uint4)(0);
            if (WRITER) {
                k[r + i * LANES] = kn[i];
                v[r + i * LANES] = vn[i];
            }
        }
        float sn[NQ];
#pragma unroll
        for (uint g = 0; g < NQ; g++) {
            float x = 0.0f;
#pragma unroll
            for (uint i = 0; i < CPL; i++) {
                float kf[E];
                widen(kn[i], kf);
#pragma unroll
                for (uint t = 0; t < E; t++) {
                    x += qv[g * VALS + i * E + t] * kf[t];
                }
            }
#if NV_SHUFFLE
#pragma unroll
            for (int off = LANES / 2; off > 0; off >>= 1) {
                x += shfl_xor(x, off);
            }
            sn[g] = x;
#else
            red[g * LOCAL_SIZE + tid] = x;
#endif
        }
#if !NV_SHUFFLE
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (uint g = 0; g < NQ; g++) {
            float x = 0.0f;
            for (uint t = 0; t < LANES; t++) {
                x += red[g * LOCAL_SIZE + rg * LANES + t];
            }
            sn[g] = x;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        if (MINE) {
#pragma unroll
            for (uint g = 0; g < NQ; g++) {
                float mx = fmax(m[g], sn[g]);
                float corr = exp(m[g] - mx);
                float pr = exp(sn[g] - mx);
                l[g] = l[g] * corr + pr;
#pragma unroll
                for (uint i = 0; i < CPL; i++) {
                    float vf[E];
                    widen(vn[i], vf);
#pragma unroll
                    for (uint t = 0; t < E; t++) {
                        uint c = g * VALS + i * E + t;
                        acc[c] = acc[c] * corr + pr * vf[t];
                    }
                }
                m[g] = mx;
            }
        }
    }

    for (uint g = 0; g < NQ; g++) {
        if (lane == 0) {
            sm_m[rg] = m[g];
            sm_l[rg] = l[g];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        float mx = -3.0e38f;
        #pragma unroll
        for (uint r = 0; r < RG; r++) {
            mx = fmax(mx, sm_m[r]);
        }
        float total = 0.0f;
        #pragma unroll
        for (uint r = 0; r < RG; r++) {
            total += sm_l[r] * exp(sm_m[r] - mx);
        }
        float w = exp(m[g] - mx);
        #pragma unroll
        for (uint i = 0; i < CPL; i++) {
            #pragma unroll
            for (uint t = 0; t < E; t++) {
                sm_o[rg * HEAD_DIM + (lane + i * LANES) * E + t] = acc[g * VALS + i * E + t] * w;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        uint slot = (qrow0 + g) * splits + split;
        for (uint d = tid; d < HEAD_DIM; d += LOCAL_SIZE) {
            float o = 0.0f;
            #pragma unroll
            for (uint r = 0; r < RG; r++) {
                o += sm_o[r * HEAD_DIM + d];
            }
            part_o[slot * HEAD_DIM + d] = o;
        }
        if (tid == 0) {
            part_ml[slot * 2] = mx;
            part_ml[slot * 2 + 1] = total;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    // Count this split done; the last one of the KV head combines.
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (tid == 0) {
        last = atomic_inc(&done[bkv]) == get_num_groups(0) - 1;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!last) {
        return;
    }
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    uint slice = tid / 32;
    uint sl = tid % 32;
    if (GROUP > 1) {
        // Grouped-query: each slice of 32 work-items combines one query head (round-robin past
        // SLICES), all in parallel. One after another, each with work-group-wide reductions, they
        // cost 11 to 13 us per step at Hkv = 8 on an H200 (BENCHMARKS.md). The trip count is the
        // same for every work-item, so every one reaches the barriers. The Vulkan twin keeps the
        // heads one after another: there, this layout measured 5.5 to 6.6 us slower per step (the
        // partials are `coherent`), here 4 to 5 us faster; both compute the same function.
        for (uint g0 = 0; g0 < GROUP; g0 += SLICES) {
            uint g = g0 + slice;
            bool mine = g < GROUP;
            uint first = (head0 + min(g, (uint)GROUP - 1)) * splits;
            // This lane's splits sl, sl + 32, ...: their max, and their sums rescaled online to it.
            float mx = -3.0e38f;
            float tot = 0.0f;
            if (mine) {
                for (uint s = sl; s < splits; s += 32) {
                    float ms = part_ml[(first + s) * 2];
                    float nm = fmax(mx, ms);
                    tot = tot * exp(mx - nm) + part_ml[(first + s) * 2 + 1] * exp(ms - nm);
                    mx = nm;
                }
            }
            red2[tid] = mx;
            barrier(CLK_LOCAL_MEM_FENCE);
            float gm = -3.0e38f;
            for (uint t = 0; t < 32; t++) {
                gm = fmax(gm, red2[slice * 32 + t]);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            red2[tid] = tot * exp(mx - gm);
            barrier(CLK_LOCAL_MEM_FENCE);
            float total = 0.0f;
            for (uint t = 0; t < 32; t++) {
                total += red2[slice * 32 + t];
            }
            if (mine) {
                float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                for (uint s0 = 0; s0 < splits; s0 += COMBINE_UNROLL) {
                    add_splits(sum, part_o, part_ml, w, false, first, s0, 1, splits, sl, gm);
                }
#pragma unroll
                for (uint i = 0; i < PER_LANE; i++) {
                    uint d = sl + 32 * i;
                    if (d < HEAD_DIM) {
                        o[(head0 + g) * HEAD_DIM + d] = sum[i] / total;
                    }
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);  // red2 is rewritten for the next heads
        }
    } else {
    for (uint g = 0; g < GROUP; g++) {
        uint first = (head0 + g) * splits;
        float mx = -3.0e38f;
        for (uint s = tid; s < splits; s += LOCAL_SIZE) {
            mx = fmax(mx, part_ml[(first + s) * 2]);
        }
        red2[tid] = mx;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint h = LOCAL_SIZE / 2; h > 0; h >>= 1) {
            if (tid < h) {
                red2[tid] = fmax(red2[tid], red2[tid + h]);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        mx = red2[0];
        barrier(CLK_LOCAL_MEM_FENCE);
        float total = 0.0f;
        for (uint s = tid; s < splits; s += LOCAL_SIZE) {
            float e = exp(part_ml[(first + s) * 2] - mx);
            if (s < W_CACHED) {
                w[s] = e;
            }
            total += e * part_ml[(first + s) * 2 + 1];
        }
        red2[tid] = total;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint h = LOCAL_SIZE / 2; h > 0; h >>= 1) {
            if (tid < h) {
                red2[tid] += red2[tid + h];
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        total = red2[0];
        barrier(CLK_LOCAL_MEM_FENCE);
        float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (uint s0 = slice; s0 < splits; s0 += SLICES * COMBINE_UNROLL) {
            add_splits(sum, part_o, part_ml, w, true, first, s0, SLICES, splits, sl, mx);
        }
#pragma unroll
        for (uint i = 0; i < PER_LANE; i++) {
            uint d = sl + 32 * i;
            if (d < HEAD_DIM) {
                part[slice * HEAD_DIM + d] = sum[i];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint d = tid; d < HEAD_DIM; d += LOCAL_SIZE) {
            float x = 0.0f;
            for (uint t = 0; t < SLICES; t++) {
                x += part[t * HEAD_DIM + d];
            }
            o[(head0 + g) * HEAD_DIM + d] = x / total;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    }
    if (tid == 0) {
        done[bkv] = 0;
    }
}
