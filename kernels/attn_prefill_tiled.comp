// Causal prefill attention, register-tiled (flash-attention 2 style, f32 arithmetic): the variant
// chosen where the head dimension is a multiple of 64 (see Attention::prefill_kernel).
//
// Why this shape: prefill is compute-bound, so the work is arranged for FMA throughput. A workgroup
// of 256 invocations owns 64 query rows and walks 64-key tiles up to the last key its last row may
// see. Invocation t owns rows 4*(t/16)..+3 and, per tile, keys 4*(t%16)..+3 of S = Q K^T (16 scores
// in registers) and D/16 columns of the output (in registers). S is accumulated over 16-wide slices
// of the head dimension staged in shared memory as vec4s, so each step is two 16-byte shared loads
// (one broadcast across the warp) for 16 FMAs; O += P V reads P as a broadcast vec4 and V as vec4s.
// The row max is combined across the 16 owners of a row through shared memory; the row sum is kept
// per invocation and combined once at the end. Query tiles are taken last first, so the longest
// (causal) ones start first.
//
// Q and O are [batch][q_head][q_len][head_dim] (f32). K and V are the KV cache's
// [batch][kv_head][capacity][head_dim], f32 or (KV_F16 = 1) packed f16 pairs. Query i of the launch
// sits at position kv_len - q_len + i and sees keys 0..=that position.
#version 450
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256) in;
layout(constant_id = 2) const uint KV_F16 = 0;
layout(constant_id = 3) const uint HEAD_DIM = 128;  // a multiple of 64, at most 256
layout(constant_id = 6) const uint SLICE = 16;      // 16 or 32: head-dimension slice staged per step

const uint BQ = 64u;                 // query rows per workgroup
const uint BK = 64u;                 // keys per tile
const uint DC = SLICE;               // head-dimension slice staged per step of S
const uint KC = SLICE * 128u / HEAD_DIM;  // keys of V staged per step of O += P V
const uint KOFF = SLICE * 16u;       // where the K slice starts in buf
const uint DV4 = HEAD_DIM / 64u;     // output vec4s per row per invocation
const uint D4 = HEAD_DIM / 4u;       // vec4s per row of V

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { uint k[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { uint v[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Params {
    uint q_len;     // queries in this launch
    uint kv_len;    // positions in the cache, the queries' included
    uint capacity;  // positions per head in the cache
    uint q_heads;   // Hq
    uint group;     // Hq / Hkv
    float scale;    // 1 / sqrt(D)
} p;

// Staging, SLICE / 2 KiB: a Q slice ([d][row/4]) and a K slice ([d][key/4]) while computing S, then
// a V slice ([key][d/4]) while computing O. A wider slice halves the barriers per tile; the host
// picks 32 where the device has the shared memory (36 KiB in all), else 16 (28 KiB).
shared vec4 buf[SLICE * 32u];
shared vec4 pt[BK * 16u];      // P transposed: [key][row/4]
shared float red[BQ * 16u];    // per-row partials of the 16 owners of each row

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint rg = tid / 16u;
    uint cg = tid % 16u;
    uint bh = gl_WorkGroupID.y;
    uint b = bh / p.q_heads;
    uint hq = bh % p.q_heads;
    uint kv_heads = p.q_heads / p.group;
    uint head_row = (b * kv_heads + hq / p.group) * p.capacity;  // cache row of position 0
    uint tile = gl_NumWorkGroups.x - 1u - gl_WorkGroupID.x;
    uint q0 = tile * BQ;
    uint rows = min(BQ, p.q_len - q0);
    uint offset = p.kv_len - p.q_len;
    uint q_base = (bh * p.q_len + q0) * HEAD_DIM;
    uint visible = offset + q0 + rows;

    float acc[64];  // [row r][vec4 jv][component]: 16 * DV4 used; a fixed bound keeps it in registers
    float m[4];
    float l[4];
    [[unroll]] for (uint i = 0u; i < 16u * DV4; i++) {
        acc[i] = 0.0;
    }
    [[unroll]] for (uint r = 0u; r < 4u; r++) {
        m[r] = -3.0e38;
        l[r] = 0.0;
    }

    for (uint j0 = 0u; j0 < visible; j0 += BK) {
        float s[16];
        [[unroll]] for (uint i = 0u; i < 16u; i++) {
            s[i] = 0.0;
        }
        for (uint dc = 0u; dc < HEAD_DIM; dc += DC) {
            uint row = tid % 64u;
            [[unroll]] for (uint e = 0u; e < DC / 4u; e++) {
                uint d = tid / 64u + 4u * e;
                float x = row < rows ? q[q_base + row * HEAD_DIM + dc + d] : 0.0;
                buf[d * 16u + row / 4u][row % 4u] = x;
            }
            uint key = tid % 64u;
            uint j = j0 + key;
            if (KV_F16 != 0u) {
                [[unroll]] for (uint e = 0u; e < DC / 8u; e++) {
                    uint pr = tid / 64u + 4u * e;
                    vec2 kk = vec2(0.0);
                    if (j < visible) {
                        kk = unpackHalf2x16(k[((head_row + j) * HEAD_DIM + dc) / 2u + pr]);
                    }
                    buf[KOFF + (2u * pr) * 16u + key / 4u][key % 4u] = kk.x;
                    buf[KOFF + (2u * pr + 1u) * 16u + key / 4u][key % 4u] = kk.y;
                }
            } else {
                [[unroll]] for (uint e = 0u; e < DC / 4u; e++) {
                    uint d = tid / 64u + 4u * e;
                    float x = 0.0;
                    if (j < visible) {
                        x = uintBitsToFloat(k[(head_row + j) * HEAD_DIM + dc + d]);
                    }
                    buf[KOFF + d * 16u + key / 4u][key % 4u] = x;
                }
            }
            barrier();
            [[unroll]] for (uint d = 0u; d < DC; d++) {
                vec4 a = buf[d * 16u + rg];
                vec4 bk = buf[KOFF + d * 16u + cg];
                [[unroll]] for (uint r = 0u; r < 4u; r++) {
                    [[unroll]] for (uint c = 0u; c < 4u; c++) {
                        s[r * 4u + c] += a[r] * bk[c];
                    }
                }
            }
            barrier();
        }

        // Scale and mask; each owner's row maxima go to shared memory.
        [[unroll]] for (uint r = 0u; r < 4u; r++) {
            uint i = rg * 4u + r;
            uint qpos = offset + q0 + i;
            float mx = -3.0e38;
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                uint j = j0 + cg * 4u + c;
                bool ok = i < rows && j <= qpos;
                s[r * 4u + c] = ok ? s[r * 4u + c] * p.scale : -3.0e38;
                mx = max(mx, s[r * 4u + c]);
            }
            red[i * 16u + cg] = mx;
        }
        barrier();
        [[unroll]] for (uint r = 0u; r < 4u; r++) {
            uint i = rg * 4u + r;
            uint qpos = offset + q0 + i;
            float mt = m[r];
            [[unroll]] for (uint t = 0u; t < 16u; t++) {
                mt = max(mt, red[i * 16u + t]);
            }
            float alpha = exp(m[r] - mt);
            m[r] = mt;
            l[r] *= alpha;
            [[unroll]] for (uint x = 0u; x < 4u * DV4; x++) {
                acc[r * 4u * DV4 + x] *= alpha;
            }
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                uint j = j0 + cg * 4u + c;
                bool ok = i < rows && j <= qpos;
                float pv = ok ? exp(s[r * 4u + c] - mt) : 0.0;
                l[r] += pv;
                s[r * 4u + c] = pv;
            }
        }
        [[unroll]] for (uint c = 0u; c < 4u; c++) {
            pt[(cg * 4u + c) * 16u + rg] = vec4(s[c], s[4u + c], s[8u + c], s[12u + c]);
        }
        barrier();

        for (uint k0 = 0u; k0 < BK; k0 += KC) {
            if (KV_F16 != 0u) {
                [[unroll]] for (uint e = 0u; e < DC / 4u; e++) {
                    uint i = tid + 256u * e;
                    uint key = i / (HEAD_DIM / 2u);
                    uint pr = i % (HEAD_DIM / 2u);
                    uint j = j0 + k0 + key;
                    vec2 vv = vec2(0.0);
                    if (j < visible) {
                        vv = unpackHalf2x16(v[(head_row + j) * (HEAD_DIM / 2u) + pr]);
                    }
                    uint d = 2u * pr;
                    buf[key * D4 + d / 4u][d % 4u] = vv.x;
                    buf[key * D4 + d / 4u][d % 4u + 1u] = vv.y;
                }
            } else {
                [[unroll]] for (uint e = 0u; e < DC / 2u; e++) {
                    uint i = tid + 256u * e;
                    uint key = i / HEAD_DIM;
                    uint d = i % HEAD_DIM;
                    uint j = j0 + k0 + key;
                    float x = 0.0;
                    if (j < visible) {
                        x = uintBitsToFloat(v[(head_row + j) * HEAD_DIM + d]);
                    }
                    buf[key * D4 + d / 4u][d % 4u] = x;
                }
            }
            barrier();
            [[unroll]] for (uint kk = 0u; kk < KC; kk++) {
                vec4 pp = pt[(k0 + kk) * 16u + rg];
                [[unroll]] for (uint jv = 0u; jv < DV4; jv++) {
                    vec4 vv = buf[kk * D4 + cg + 16u * jv];
                    [[unroll]] for (uint r = 0u; r < 4u; r++) {
                        uint at = (r * DV4 + jv) * 4u;
                        acc[at] += pp[r] * vv.x;
                        acc[at + 1u] += pp[r] * vv.y;
                        acc[at + 2u] += pp[r] * vv.z;
                        acc[at + 3u] += pp[r] * vv.w;
                    }
                }
            }
            barrier();
        }
    }

    // The row sums: each owner holds its columns' share.
    [[unroll]] for (uint r = 0u; r < 4u; r++) {
        red[(rg * 4u + r) * 16u + cg] = l[r];
    }
    barrier();
    [[unroll]] for (uint r = 0u; r < 4u; r++) {
        uint i = rg * 4u + r;
        if (i < rows) {
            float total = 0.0;
            [[unroll]] for (uint t = 0u; t < 16u; t++) {
                total += red[i * 16u + t];
            }
            [[unroll]] for (uint jv = 0u; jv < DV4; jv++) {
                uint at = (r * DV4 + jv) * 4u;
                uint d = (cg + 16u * jv) * 4u;
                uint out_at = q_base + i * HEAD_DIM + d;
                o[out_at] = acc[at] / total;
                o[out_at + 1u] = acc[at + 1u] / total;
                o[out_at + 2u] = acc[at + 2u] / total;
                o[out_at + 3u] = acc[at + 3u] / total;
            }
        }
    }
}
