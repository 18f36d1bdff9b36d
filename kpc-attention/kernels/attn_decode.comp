// Decode attention, split phase (flash-decoding): one query row per (batch, query head) against
// positions [split * CHUNK, min((split + 1) * CHUNK, kv_len)) of the KV cache.
//
// Grid: x = splits (ceil(kv_len / CHUNK)), y = batch * q_heads. Each workgroup writes its split's
// unnormalized output sum_j exp(s_j - m) * v_j, its running max m and its sum l = sum_j exp(s_j - m);
// attn_reduce combines the splits with a log-sum-exp. Every position up to kv_len is visible: the
// query is the newest token (causal decode) or the cache is a static cross-attention set.
//
// K and V are [batch][kv_head][position][head_dim] with `capacity` positions per head, stored as f32
// or, with KV_F16 = 1, as packed f16 pairs (read with unpackHalf2x16: no 16-bit storage feature
// needed). Query head h reads KV head h / group (grouped-query attention).
#version 450

layout(local_size_x = 64, local_size_x_id = 0) in;  // LOCAL_SIZE, a power of two
layout(constant_id = 1) const uint CHUNK = 256;      // positions per split
layout(constant_id = 2) const uint KV_F16 = 0;       // 1: K and V are f16
layout(constant_id = 3) const uint HEAD_DIM = 128;   // D

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };            // [B][Hq][D]
layout(std430, set = 0, binding = 1) readonly buffer K { uint k[]; };             // [B][Hkv][cap][D]
layout(std430, set = 0, binding = 2) readonly buffer V { uint v[]; };             // [B][Hkv][cap][D]
layout(std430, set = 0, binding = 3) writeonly buffer PartO { float part_o[]; };  // [B*Hq][splits][D]
layout(std430, set = 0, binding = 4) writeonly buffer PartMl { float part_ml[]; };// [B*Hq][splits][2]

layout(push_constant) uniform Params {
    uint kv_len;    // positions to attend
    uint capacity;  // positions per head in the cache
    uint q_heads;   // Hq
    uint group;     // Hq / Hkv
    float scale;    // 1 / sqrt(D)
} p;

shared float qs[HEAD_DIM];
shared float s[CHUNK];
shared float red[gl_WorkGroupSize.x];

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
    uint split = gl_WorkGroupID.x;
    uint splits = gl_NumWorkGroups.x;
    uint bh = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint b = bh / p.q_heads;
    uint hq = bh % p.q_heads;
    uint kv_heads = p.q_heads / p.group;
    uint base = (b * kv_heads + hq / p.group) * p.capacity * HEAD_DIM;
    uint j0 = split * CHUNK;
    uint n = min(CHUNK, p.kv_len - j0);

    for (uint d = tid; d < HEAD_DIM; d += WG) {
        qs[d] = q[bh * HEAD_DIM + d];
    }
    barrier();

    float m = -3.0e38;
    for (uint j = tid; j < n; j += WG) {
        uint row = base + (j0 + j) * HEAD_DIM;
        float dot = 0.0;
        for (uint d = 0u; d < HEAD_DIM; d++) {
            dot += qs[d] * load_k(row + d);
        }
        s[j] = dot * p.scale;
        m = max(m, s[j]);
    }
    red[tid] = m;
    barrier();
    for (uint w = WG / 2u; w > 0u; w >>= 1) {
        if (tid < w) {
            red[tid] = max(red[tid], red[tid + w]);
        }
        barrier();
    }
    m = red[0];
    barrier();

    float l = 0.0;
    for (uint j = tid; j < n; j += WG) {
        float e = exp(s[j] - m);
        s[j] = e;
        l += e;
    }
    red[tid] = l;
    barrier();
    for (uint w = WG / 2u; w > 0u; w >>= 1) {
        if (tid < w) {
            red[tid] += red[tid + w];
        }
        barrier();
    }
    l = red[0];

    uint slot = bh * splits + split;
    for (uint d = tid; d < HEAD_DIM; d += WG) {
        float acc = 0.0;
        for (uint j = 0u; j < n; j++) {
            acc += s[j] * load_v(base + (j0 + j) * HEAD_DIM + d);
        }
        part_o[slot * HEAD_DIM + d] = acc;
    }
    if (tid == 0u) {
        part_ml[slot * 2u] = m;
        part_ml[slot * 2u + 1u] = l;
    }
}
