// Causal prefill attention, tiled flash-attention style with an online softmax.
//
// Grid: x = ceil(q_len / BLOCK_Q) query tiles, y = batch * q_heads. Query i of the launch sits at
// position kv_len - q_len + i and sees keys 0..=that position: the mask comes from the indices. A
// workgroup walks key tiles of BLOCK_K positions up to the last one its last query can see, so tiles
// that are fully masked are never loaded. Per tile: scores into shared memory, then per query row the
// running max m, sum l and the rescale of the output accumulator, then O += P V.
//
// Q and O are [batch][q_head][q_len][head_dim] (f32). K and V are the KV cache's
// [batch][kv_head][capacity][head_dim], f32 or (KV_F16 = 1) packed f16 pairs.
#version 450

layout(local_size_x = 64, local_size_x_id = 0) in;  // LOCAL_SIZE
layout(constant_id = 2) const uint KV_F16 = 0;
layout(constant_id = 3) const uint HEAD_DIM = 128;
layout(constant_id = 4) const uint BLOCK_Q = 8;
layout(constant_id = 5) const uint BLOCK_K = 32;

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

shared float qs[BLOCK_Q * HEAD_DIM];
shared float os[BLOCK_Q * HEAD_DIM];
shared float ss[BLOCK_Q * BLOCK_K];
shared float ms[BLOCK_Q];
shared float ls[BLOCK_Q];
shared float alphas[BLOCK_Q];

float load_k(uint i) {
    if (KV_F16 != 0u) {
        vec2 h = unpackHalf2x16(k[i >> 1]);
        return (i & 1u) == 0u ? h.x : h.y;
    }
    return uintBitsToFloat(k[i]);
}

float load_v(uint i) {
    if (KV_F16 != 0u) {
        vec2 h = unpackHalf2x16(v[i >> 1]);
        return (i & 1u) == 0u ? h.x : h.y;
    }
    return uintBitsToFloat(v[i]);
}

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint tid = gl_LocalInvocationID.x;
    uint bh = gl_WorkGroupID.y;
    uint b = bh / p.q_heads;
    uint hq = bh % p.q_heads;
    uint kv_heads = p.q_heads / p.group;
    uint base = (b * kv_heads + hq / p.group) * p.capacity * HEAD_DIM;
    uint q0 = gl_WorkGroupID.x * BLOCK_Q;
    uint rows = min(BLOCK_Q, p.q_len - q0);
    uint offset = p.kv_len - p.q_len;  // position of query 0
    uint q_base = (bh * p.q_len + q0) * HEAD_DIM;

    for (uint i = tid; i < BLOCK_Q * HEAD_DIM; i += WG) {
        qs[i] = i < rows * HEAD_DIM ? q[q_base + i] : 0.0;
        os[i] = 0.0;
    }
    for (uint r = tid; r < BLOCK_Q; r += WG) {
        ms[r] = -3.0e38;
        ls[r] = 0.0;
    }
    barrier();

    uint visible = offset + q0 + rows;  // keys the tile's last query sees
    for (uint j0 = 0u; j0 < visible; j0 += BLOCK_K) {
        uint cols = min(BLOCK_K, visible - j0);
        for (uint i = tid; i < BLOCK_Q * BLOCK_K; i += WG) {
            uint r = i / BLOCK_K;
            uint c = i % BLOCK_K;
            uint j = j0 + c;
            float sc = -3.0e38;
            if (r < rows && c < cols && j <= offset + q0 + r) {
                uint row = base + j * HEAD_DIM;
                float dot = 0.0;
                for (uint d = 0u; d < HEAD_DIM; d++) {
                    dot += qs[r * HEAD_DIM + d] * load_k(row + d);
                }
                sc = dot * p.scale;
            }
            ss[i] = sc;
        }
        barrier();
        for (uint r = tid; r < BLOCK_Q; r += WG) {
            float m_old = ms[r];
            float m_new = m_old;
            for (uint c = 0u; c < cols; c++) {
                m_new = max(m_new, ss[r * BLOCK_K + c]);
            }
            float sum = 0.0;
            for (uint c = 0u; c < cols; c++) {
                float e = exp(ss[r * BLOCK_K + c] - m_new);
                ss[r * BLOCK_K + c] = e;
                sum += e;
            }
            float alpha = exp(m_old - m_new);
            alphas[r] = alpha;
            ls[r] = ls[r] * alpha + sum;
            ms[r] = m_new;
        }
        barrier();
        for (uint i = tid; i < BLOCK_Q * HEAD_DIM; i += WG) {
            uint r = i / HEAD_DIM;
            uint d = i % HEAD_DIM;
            float acc = os[i] * alphas[r];
            for (uint c = 0u; c < cols; c++) {
                acc += ss[r * BLOCK_K + c] * load_v(base + (j0 + c) * HEAD_DIM + d);
            }
            os[i] = acc;
        }
        barrier();
    }

    for (uint i = tid; i < rows * HEAD_DIM; i += WG) {
        o[q_base + i] = os[i] / ls[i / HEAD_DIM];
    }
}
