// Causal prefill attention, register-tiled. The OpenCL C twin of attn_prefill_tiled.comp (read its
// header for the design): the same buffers, scalars and spec-constant ids.
//
// kpc-spec-constant 2 KV_F16
// kpc-spec-constant 3 HEAD_DIM
// kpc-spec-constant 6 SLICE
#ifndef KV_F16
#define KV_F16 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef SLICE
#define SLICE 16
#endif

#define BQ 64
#define BK 64
#define DC SLICE
#define KC (SLICE * 128 / HEAD_DIM)
#define KOFF (SLICE * 16)
#define DV4 (HEAD_DIM / 64)
#define D4 (HEAD_DIM / 4)

__attribute__((reqd_work_group_size(256, 1, 1)))
kernel void attn_prefill_tiled(global const float *q, global const uint *k, global const uint *v,
                               global float *o, uint q_len, uint kv_len, uint capacity,
                               uint q_heads, uint group, float scale)
{
    local float4 buf[SLICE * 32];
    local float4 pt[BK * 16];
    local float red[BQ * 16];
    local float *bf = (local float *)buf;
    uint tid = get_local_id(0);
    uint rg = tid / 16;
    uint cg = tid % 16;
    uint bh = get_group_id(1);
    uint b = bh / q_heads;
    uint hq = bh % q_heads;
    uint kv_heads = q_heads / group;
    uint head_row = (b * kv_heads + hq / group) * capacity;
    uint tile = get_num_groups(0) - 1 - get_group_id(0);
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

    for (uint j0 = 0; j0 < visible; j0 += BK) {
        float s[16];
#pragma unroll
        for (uint i = 0; i < 16; i++) {
            s[i] = 0.0f;
        }
        for (uint dc = 0; dc < HEAD_DIM; dc += DC) {
            uint row = tid % 64;
#pragma unroll
            for (uint e = 0; e < DC / 4; e++) {
                uint d = tid / 64 + 4 * e;
                float x = row < rows ? q[q_base + row * HEAD_DIM + dc + d] : 0.0f;
                bf[(d * 16 + row / 4) * 4 + row % 4] = x;
            }
            uint key = tid % 64;
            uint j = j0 + key;
#if KV_F16
#pragma unroll
            for (uint e = 0; e < DC / 8; e++) {
                uint pr = tid / 64 + 4 * e;
                float2 kk = (float2)(0.0f, 0.0f);
                if (j < visible) {
                    kk = vload_half2(((head_row + j) * HEAD_DIM + dc) / 2 + pr, (global const half *)k);
                }
                bf[(KOFF + (2 * pr) * 16 + key / 4) * 4 + key % 4] = kk.x;
                bf[(KOFF + (2 * pr + 1) * 16 + key / 4) * 4 + key % 4] = kk.y;
            }
#else
#pragma unroll
            for (uint e = 0; e < DC / 4; e++) {
                uint d = tid / 64 + 4 * e;
                float x = 0.0f;
                if (j < visible) {
                    x = as_float(k[(head_row + j) * HEAD_DIM + dc + d]);
                }
                bf[(KOFF + d * 16 + key / 4) * 4 + key % 4] = x;
            }
#endif
            barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
            for (uint d = 0; d < DC; d++) {
                float4 a = buf[d * 16 + rg];
                float4 bk = buf[KOFF + d * 16 + cg];
                float av[4] = {a.x, a.y, a.z, a.w};
                float bv[4] = {bk.x, bk.y, bk.z, bk.w};
#pragma unroll
                for (uint r = 0; r < 4; r++) {
#pragma unroll
                    for (uint c = 0; c < 4; c++) {
                        s[r * 4 + c] += av[r] * bv[c];
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
            for (uint c = 0; c < 4; c++) {
                uint j = j0 + cg * 4 + c;
                bool ok = i < rows && j <= qpos;
                s[r * 4 + c] = ok ? s[r * 4 + c] * scale : -3.0e38f;
                mx = fmax(mx, s[r * 4 + c]);
            }
            red[i * 16 + cg] = mx;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
        for (uint r = 0; r < 4; r++) {
            uint i = rg * 4 + r;
            uint qpos = offset + q0 + i;
            float mt = m[r];
#pragma unroll
            for (uint t = 0; t < 16; t++) {
                mt = fmax(mt, red[i * 16 + t]);
            }
            float alpha = exp(m[r] - mt);
            m[r] = mt;
            l[r] *= alpha;
#pragma unroll
            for (uint x = 0; x < 4 * DV4; x++) {
                acc[r * 4 * DV4 + x] *= alpha;
            }
#pragma unroll
            for (uint c = 0; c < 4; c++) {
                uint j = j0 + cg * 4 + c;
                bool ok = i < rows && j <= qpos;
                float pv = ok ? exp(s[r * 4 + c] - mt) : 0.0f;
                l[r] += pv;
                s[r * 4 + c] = pv;
            }
        }
#pragma unroll
        for (uint c = 0; c < 4; c++) {
            pt[(cg * 4 + c) * 16 + rg] = (float4)(s[c], s[4 + c], s[8 + c], s[12 + c]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (uint k0 = 0; k0 < BK; k0 += KC) {
#if KV_F16
#pragma unroll
            for (uint e = 0; e < DC / 4; e++) {
                uint i = tid + 256 * e;
                uint key = i / (HEAD_DIM / 2);
                uint pr = i % (HEAD_DIM / 2);
                uint j = j0 + k0 + key;
                float2 vv = (float2)(0.0f, 0.0f);
                if (j < visible) {
                    vv = vload_half2((head_row + j) * (HEAD_DIM / 2) + pr, (global const half *)v);
                }
                uint d = 2 * pr;
                bf[(key * D4 + d / 4) * 4 + d % 4] = vv.x;
                bf[(key * D4 + d / 4) * 4 + d % 4 + 1] = vv.y;
            }
#else
#pragma unroll
            for (uint e = 0; e < DC / 2; e++) {
                uint i = tid + 256 * e;
                uint key = i / HEAD_DIM;
                uint d = i % HEAD_DIM;
                uint j = j0 + k0 + key;
                float x = 0.0f;
                if (j < visible) {
                    x = as_float(v[(head_row + j) * HEAD_DIM + d]);
                }
                bf[(key * D4 + d / 4) * 4 + d % 4] = x;
            }
#endif
            barrier(CLK_LOCAL_MEM_FENCE);
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

#pragma unroll
    for (uint r = 0; r < 4; r++) {
        red[(rg * 4 + r) * 16 + cg] = l[r];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (uint r = 0; r < 4; r++) {
        uint i = rg * 4 + r;
        if (i < rows) {
            float total = 0.0f;
#pragma unroll
            for (uint t = 0; t < 16; t++) {
                total += red[i * 16 + t];
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
