// Causal prefill attention, register-tiled. The OpenCL C twin of attn_prefill_tiled.comp (read its
// header for the design): the same buffers, scalars and spec-constant ids.
//
// kpc-spec-constant 2 KV_F16
// kpc-spec-constant 3 HEAD_DIM
// kpc-spec-constant 6 SLICE
// kpc-spec-constant 7 PREFETCH
#ifndef KV_F16
#define KV_F16 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef SLICE
#define SLICE 16
#endif
#ifndef PREFETCH
#define PREFETCH 0
#endif

#define BQ 64
#define BK 128
#define BH 64
#define DC SLICE
#define KC (SLICE * 128 / HEAD_DIM)
#define QS 17
#define KS (BK / 4)
#define KOFF (SLICE * QS)
#define DV4 (HEAD_DIM / 64)
#define D4 (HEAD_DIM / 4)
#define QCH (DC / 4)
#define QE (BQ * QCH / 256)
#define KWR (KV_F16 ? DC / 2 : DC)
#define KCH (KWR / 4)
#define KE (BK * KCH / 256)
#define KROW (KV_F16 ? HEAD_DIM / 8 : HEAD_DIM / 4)

// Chunk e of this work-item in a slice of rows of `per_row` 16-byte chunks: (row, chunk in row).
// A sub-group covers 8 rows of 4 chunks, or 16 of 2 (the twin's chunk_at says why).
inline uint2 chunk_at(uint tid, uint e, uint per_row)
{
    uint c = tid + 256 * e;
    uint lane = c % 32;
    uint w = c / 32;
    uint in_row = min(per_row, 4u);
    uint rows_per = 32 / in_row;
    uint across = max(per_row / 4, 1u);
    return (uint2)(rows_per * (w / across) + lane % rows_per, lane / rows_per + in_row * (w % across));
}

// Loads the Q and K chunks of head-dimension slice dc of the tile at key j0 into pf.
inline void fetch_s(uint *pf, global const float4 *q, global const uint4 *k, uint tid, uint j0,
                    uint dc, uint rows, uint q_base, uint head_row, uint visible)
{
#pragma unroll
    for (uint e = 0; e < QE; e++) {
        uint2 rc = chunk_at(tid, e, QCH);
        float4 x = (float4)(0.0f);
        if (rc.x < rows) {
            x = q[(q_base + rc.x * HEAD_DIM + dc) / 4 + rc.y];
        }
        pf[4 * e] = as_uint(x.x);
        pf[4 * e + 1] = as_uint(x.y);
        pf[4 * e + 2] = as_uint(x.z);
        pf[4 * e + 3] = as_uint(x.w);
    }
#pragma unroll
    for (uint e = 0; e < KE; e++) {
        uint2 rc = chunk_at(tid, e, KCH);
        uint j = j0 + rc.x;
        uint4 x = (uint4)(0u);
        if (j < visible) {
            x = k[(head_row + j) * KROW + dc / (4 << KV_F16) + rc.y];
        }
        pf[8 + 4 * e] = x.x;
        pf[8 + 4 * e + 1] = x.y;
        pf[8 + 4 * e + 2] = x.z;
        pf[8 + 4 * e + 3] = x.w;
    }
}

// Stores the chunks fetch_s loaded: the Q slice as [d][row/4], the K slice as [d][key/4].
inline void store_s(const uint *pf, local float *bf, uint tid)
{
#pragma unroll
    for (uint e = 0; e < QE; e++) {
        uint2 rc = chunk_at(tid, e, QCH);
#pragma unroll
        for (uint t = 0; t < 4; t++) {
            uint d = 4 * rc.y + t;
            bf[(d * QS + rc.x / 4) * 4 + rc.x % 4] = as_float(pf[4 * e + t]);
        }
    }
#pragma unroll
    for (uint e = 0; e < KE; e++) {
        uint2 rc = chunk_at(tid, e, KCH);
        uint key = rc.x;
#pragma unroll
        for (uint t = 0; t < 4; t++) {
#if KV_F16
            uint d = 8 * rc.y + 2 * t;
            float2 kk = vload_half2(0, (const private half *)&pf[8 + 4 * e + t]);
            bf[(KOFF + d * KS + key / 4) * 4 + key % 4] = kk.x;
            bf[(KOFF + (d + 1) * KS + key / 4) * 4 + key % 4] = kk.y;
#else
            uint d = 4 * rc.y + t;
            bf[(KOFF + d * KS + key / 4) * 4 + key % 4] = as_float(pf[8 + 4 * e + t]);
#endif
        }
    }
}

// Loads the V words of keys kb .. kb + KC into pf.
inline void fetch_v(uint *pf, global const uint *v, uint tid, uint kb, uint head_row, uint visible)
{
#if KV_F16
#pragma unroll
    for (uint e = 0; e < DC / 4; e++) {
        uint i = tid + 256 * e;
        uint j = kb + i / (HEAD_DIM / 2);
        pf[e] = j < visible ? v[(head_row + j) * (HEAD_DIM / 2) + i % (HEAD_DIM / 2)] : 0u;
    }
#else
#pragma unroll
    for (uint e = 0; e < DC / 2; e++) {
        uint i = tid + 256 * e;
        uint j = kb + i / HEAD_DIM;
        pf[e] = j < visible ? v[(head_row + j) * HEAD_DIM + i % HEAD_DIM] : 0u;
    }
#endif
}

// Stores the words fetch_v loaded as [key][d/4].
inline void store_v(const uint *pf, local float *bf, uint tid)
{
#if KV_F16
#pragma unroll
    for (uint e = 0; e < DC / 4; e++) {
        uint i = tid + 256 * e;
        uint key = i / (HEAD_DIM / 2);
        uint d = 2 * (i % (HEAD_DIM / 2));
        float2 vv = vload_half2(0, (const private half *)&pf[e]);
        bf[(key * D4 + d / 4) * 4 + d % 4] = vv.x;
        bf[(key * D4 + d / 4) * 4 + d % 4 + 1] = vv.y;
    }
#else
#pragma unroll
    for (uint e = 0; e < DC / 2; e++) {
        uint i = tid + 256 * e;
        uint key = i / HEAD_DIM;
        uint d = i % HEAD_DIM;
        bf[(key * D4 + d / 4) * 4 + d % 4] = as_float(pf[e]);
    }
#endif
}

__attribute__((reqd_work_group_size(256, 1, 1)))
kernel void attn_prefill_tiled(global const float4 *q, global const uint4 *k, global const uint *v,
                               global float *o, uint q_len, uint kv_len, uint capacity,
                               uint q_heads, uint group, float scale)
{
    // buf also holds the row partials ([row][16] floats) between S and the first V step.
    local float4 buf[SLICE * (QS + KS)];
    local float4 pt[BH * 16];
    local float *bf = (local float *)buf;
    uint tid = get_local_id(0);
    uint rg = tid / 16;
    uint cg = tid % 16;
    uint bh = get_group_id(0);
    uint b = bh / q_heads;
    uint hq = bh % q_heads;
    uint kv_heads = q_heads / group;
    uint head_row = (b * kv_heads + hq / group) * capacity;
    uint tile = get_num_groups(1) - 1 - get_group_id(1);  // every head's longest tiles first
    uint q0 = tile * BQ;
    uint rows = min((uint)BQ, q_len - q0);
    uint offset = kv_len - q_len;
    uint q_base = (bh * q_len + q0) * HEAD_DIM;
    uint visible = offset + q0 + rows;

    float acc[16 * DV4];
    float m[4];
    float l[4];
#pragma unroll
    for (uint i = 0; i < 16 * DV4; i++) {
        acc[i] = 0.0f;
    }
#pragma unroll
    for (uint r = 0; r < 4; r++) {
        m[r] = -3.0e38f;
        l[r] = 0.0f;
    }

    // The next staging step's words (see the twin's PREFETCH).
    uint pf[24];
#if PREFETCH
    fetch_s(pf, q, k, tid, 0, 0, rows, q_base, head_row, visible);
#endif
    for (uint j0 = 0; j0 < visible; j0 += BK) {
        float s[32];
#pragma unroll
        for (uint i = 0; i < 32; i++) {
            s[i] = 0.0f;
        }
        for (uint dc = 0; dc < HEAD_DIM; dc += DC) {
#if !PREFETCH
            fetch_s(pf, q, k, tid, j0, dc, rows, q_base, head_row, visible);
#endif
            store_s(pf, bf, tid);
            barrier(CLK_LOCAL_MEM_FENCE);
#if PREFETCH
            if (dc + DC < HEAD_DIM) {
                fetch_s(pf, q, k, tid, j0, dc + DC, rows, q_base, head_row, visible);
            } else {
                fetch_v(pf, v, tid, j0, head_row, visible);
            }
#endif
#pragma unroll
            for (uint d = 0; d < DC; d++) {
                float4 a = buf[d * QS + rg];
                float4 b0 = buf[KOFF + d * KS + cg];
                float4 b1 = buf[KOFF + d * KS + 16 + cg];
                float av[4] = {a.x, a.y, a.z, a.w};
                float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (uint r = 0; r < 4; r++) {
#pragma unroll
                    for (uint c = 0; c < 8; c++) {
                        s[r * 8 + c] += av[r] * bv[c];
                    }
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }

#pragma unroll
        for (uint r = 0; r < 4; r++) {
            uint i = rg * 4 + r;
            uint qpos = offset + q0 + i;
            float mx = -3.0e38f;
#pragma unroll
            for (uint c = 0; c < 8; c++) {
                uint j = j0 + (c / 4) * BH + cg * 4 + c % 4;
                bool ok = i < rows && j <= qpos;
                s[r * 8 + c] = ok ? s[r * 8 + c] * scale : -3.0e38f;
                mx = fmax(mx, s[r * 8 + c]);
            }
            bf[i * 16 + cg] = mx;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (uint r = 0; r < 4; r++) {
            uint i = rg * 4 + r;
            uint qpos = offset + q0 + i;
            float mt = m[r];
#pragma unroll
            for (uint t = 0; t < 16; t++) {
                mt = fmax(mt, bf[i * 16 + t]);
            }
            float alpha = exp(m[r] - mt);
            m[r] = mt;
            l[r] *= alpha;
#pragma unroll
            for (uint x = 0; x < 4 * DV4; x++) {
                acc[r * 4 * DV4 + x] *= alpha;
            }
#pragma unroll
            for (uint c = 0; c < 8; c++) {
                uint j = j0 + (c / 4) * BH + cg * 4 + c % 4;
                bool ok = i < rows && j <= qpos;
                float pv = ok ? exp(s[r * 8 + c] - mt) : 0.0f;
                l[r] += pv;
                s[r * 8 + c] = pv;
            }
        }

#pragma unroll
        for (uint h = 0; h < 2; h++) {
            if (h == 1 && j0 + BH >= visible) {
                break;
            }
#pragma unroll
            for (uint c = 0; c < 4; c++) {
                uint at = 4 * h + c;
                pt[(cg * 4 + c) * 16 + rg] = (float4)(s[at], s[8 + at], s[16 + at], s[24 + at]);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (uint k0 = 0; k0 < BH; k0 += KC) {
                uint kb = j0 + h * BH + k0;
#if !PREFETCH
                fetch_v(pf, v, tid, kb, head_row, visible);
#endif
                store_v(pf, bf, tid);
                barrier(CLK_LOCAL_MEM_FENCE);
#if PREFETCH
                if (k0 + KC < BH) {
                    fetch_v(pf, v, tid, kb + KC, head_row, visible);
                } else if (h == 0 && j0 + BH < visible) {
                    fetch_v(pf, v, tid, j0 + BH, head_row, visible);
                } else if (j0 + BK < visible) {
                    fetch_s(pf, q, k, tid, j0 + BK, 0, rows, q_base, head_row, visible);
                }
#endif
#pragma unroll
                for (uint kk = 0; kk < KC; kk++) {
                    float4 pp = pt[(k0 + kk) * 16 + rg];
                    float pr4[4] = {pp.x, pp.y, pp.z, pp.w};
#pragma unroll
                    for (uint jv = 0; jv < DV4; jv++) {
                        float4 vv = buf[kk * D4 + cg + 16 * jv];
#pragma unroll
                        for (uint r = 0; r < 4; r++) {
                            uint at = (r * DV4 + jv) * 4;
                            acc[at] += pr4[r] * vv.x;
                            acc[at + 1] += pr4[r] * vv.y;
                            acc[at + 2] += pr4[r] * vv.z;
                            acc[at + 3] += pr4[r] * vv.w;
                        }
                    }
                }
                barrier(CLK_LOCAL_MEM_FENCE);
            }
        }
    }

#pragma unroll
    for (uint r = 0; r < 4; r++) {
        bf[(rg * 4 + r) * 16 + cg] = l[r];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (uint r = 0; r < 4; r++) {
        uint i = rg * 4 + r;
        if (i < rows) {
            float total = 0.0f;
#pragma unroll
            for (uint t = 0; t < 16; t++) {
                total += bf[i * 16 + t];
            }
#pragma unroll
            for (uint jv = 0; jv < DV4; jv++) {
                uint at = (r * DV4 + jv) * 4;
                uint d = (cg + 16 * jv) * 4;
                uint out_at = q_base + i * HEAD_DIM + d;
                o[out_at] = acc[at] / total;
                o[out_at + 1] = acc[at + 1] / total;
                o[out_at + 2] = acc[at + 2] / total;
                o[out_at + 3] = acc[at + 3] / total;
            }
        }
    }
}
