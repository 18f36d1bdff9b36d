// Generic attention: the fallback that serves while a shape's specialized kernels build
// (`AttentionOptions::lazy`, `KernelRequest::or_generic`). Every shape parameter (head dimension,
// heads, group, KV type, positions) comes from push constants, so one build per device serves every
// shape the specialized kernels support: head dimension even and at most 256, any grouping, f32 or
// f16 K/V. It is slower than they are (no splits across workgroups, scalar loads), and is meant to
// answer the first steps while they build.
//
// One workgroup per query row: grid x = query rows (1 for a decode step, the prompt's length for a
// prefill), y = batch * q_heads. Query row r of `rows` attends the positions [0, kv_len - rows + r]
// (causal: the rows are the cache's last `rows` positions), with an online softmax over chunks of
// 64 positions. Q and O are [B][Hq][rows][D]; K and V are [B][Hkv][capacity][D], f32 or (kv_f16)
// packed f16 pairs. With `append` (a decode step, rows = 1), position kv_len - 1 is read from NewK
// and NewV ([B][Hkv][D], f32) and written into the cache by the first query head of each KV head;
// no workgroup reads that position from the cache, so the write races with no read.
#version 450

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) buffer K { uint k[]; };
layout(std430, set = 0, binding = 2) buffer V { uint v[]; };
layout(std430, set = 0, binding = 3) writeonly buffer O { float o[]; };
layout(std430, set = 0, binding = 4) readonly buffer NewK { float new_k[]; };
layout(std430, set = 0, binding = 5) readonly buffer NewV { float new_v[]; };

layout(push_constant) uniform Params {
    uint kv_len;    // positions in the cache, the appended one included
    uint rows;      // query rows (the cache's last `rows` positions)
    uint capacity;  // positions per head in the cache
    uint q_heads;   // Hq
    uint group;     // Hq / Hkv
    uint head_dim;  // D: even, at most MAX_D
    uint kv_f16;    // 1: K and V are packed f16
    uint append;    // 1: position kv_len - 1 comes from NewK/NewV and is written to the cache
    float scale;    // 1 / sqrt(D)
} p;

const uint WG = 64u;
const uint MAX_D = 256u;
const uint PER = MAX_D / WG;

shared float qs[MAX_D];
shared float ps[WG];
shared float red[WG];

float load_k(uint i) {
    if (p.kv_f16 != 0u) {
        vec2 h = unpackHalf2x16(k[i >> 1]);
        return (i & 1u) == 0u ? h.x : h.y;
    }
    return uintBitsToFloat(k[i]);
}

float load_v(uint i) {
    if (p.kv_f16 != 0u) {
        vec2 h = unpackHalf2x16(v[i >> 1]);
        return (i & 1u) == 0u ? h.x : h.y;
    }
    return uintBitsToFloat(v[i]);
}

void main() {
    uint r = gl_WorkGroupID.x;
    uint bh = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint D = p.head_dim;
    uint b = bh / p.q_heads;
    uint hq = bh % p.q_heads;
    uint kv_heads = p.q_heads / p.group;
    uint hk = b * kv_heads + hq / p.group;
    uint base = hk * p.capacity * D;
    uint fresh_row = hk * D;
    uint visible = p.kv_len - p.rows + r + 1u;
    uint fresh = p.append != 0u ? p.kv_len - 1u : 0xffffffffu;
    uint qrow = (bh * p.rows + r) * D;

    for (uint d = tid; d < D; d += WG) {
        qs[d] = q[qrow + d];
    }
    if (p.append != 0u && hq % p.group == 0u) {
        uint at = base + fresh * D;
        for (uint e = tid; e < D / 2u; e += WG) {
            vec2 kk = vec2(new_k[fresh_row + 2u * e], new_k[fresh_row + 2u * e + 1u]);
            vec2 vv = vec2(new_v[fresh_row + 2u * e], new_v[fresh_row + 2u * e + 1u]);
            if (p.kv_f16 != 0u) {
                k[(at >> 1) + e] = packHalf2x16(kk);
                v[(at >> 1) + e] = packHalf2x16(vv);
            } else {
                k[at + 2u * e] = floatBitsToUint(kk.x);
                k[at + 2u * e + 1u] = floatBitsToUint(kk.y);
                v[at + 2u * e] = floatBitsToUint(vv.x);
                v[at + 2u * e + 1u] = floatBitsToUint(vv.y);
            }
        }
    }
    barrier();

    float m = -3.0e38;
    float l = 0.0;
    float acc[PER];
    for (uint t = 0u; t < PER; t++) {
        acc[t] = 0.0;
    }
    for (uint j0 = 0u; j0 < visible; j0 += WG) {
        uint j = j0 + tid;
        float sj = -3.0e38;
        if (j < visible) {
            float dot = 0.0;
            if (j == fresh) {
                for (uint d = 0u; d < D; d++) {
                    dot += qs[d] * new_k[fresh_row + d];
                }
            } else {
                uint row = base + j * D;
                for (uint d = 0u; d < D; d++) {
                    dot += qs[d] * load_k(row + d);
                }
            }
            sj = dot * p.scale;
        }
        red[tid] = sj;
        barrier();
        for (uint w = WG / 2u; w > 0u; w >>= 1) {
            if (tid < w) {
                red[tid] = max(red[tid], red[tid + w]);
            }
            barrier();
        }
        float mn = max(m, red[0]);
        barrier();
        float pj = j < visible ? exp(sj - mn) : 0.0;
        ps[tid] = pj;
        red[tid] = pj;
        barrier();
        for (uint w = WG / 2u; w > 0u; w >>= 1) {
            if (tid < w) {
                red[tid] += red[tid + w];
            }
            barrier();
        }
        float corr = exp(m - mn);
        l = l * corr + red[0];
        uint n = min(WG, visible - j0);
        for (uint t = 0u; t < PER; t++) {
            uint d = tid + t * WG;
            if (d < D) {
                float a = acc[t] * corr;
                for (uint jj = 0u; jj < n; jj++) {
                    uint pos = j0 + jj;
                    float vv = pos == fresh ? new_v[fresh_row + d] : load_v(base + pos * D + d);
                    a += ps[jj] * vv;
                }
                acc[t] = a;
            }
        }
        m = mn;
        barrier();
    }
    for (uint t = 0u; t < PER; t++) {
        uint d = tid + t * WG;
        if (d < D) {
            o[qrow + d] = acc[t] / l;
        }
    }
}
