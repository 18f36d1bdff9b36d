// Decode attention, reduce phase: combines the splits of attn_decode or attn_decode_vec with a
// log-sum-exp.
//
// Grid: x = batch * q_heads. For each output element d:
//   M = max_s m_s,  out[d] = sum_s exp(m_s - M) * o_s[d] / sum_s exp(m_s - M) * l_s.
// Why this shape: with a hundred or more splits (long caches, grouped-query attention) a serial walk
// over the splits dominated the whole step. Here the workgroup shares every scan: the max and the
// weights over all invocations, and the weighted sum with the invocations arranged as SLICES slices
// of 32, each slice summing every SLICES-th split for its elements, the slices then added through
// shared memory. The first W_CACHED weights are kept in shared memory; later ones are recomputed.
#version 450
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256, local_size_x_id = 0) in;  // LOCAL_SIZE: a power of two, at least 32
layout(constant_id = 3) const uint HEAD_DIM = 128;    // D, at most 256

layout(std430, set = 0, binding = 0) readonly buffer PartO { float part_o[]; };   // [B*Hq][splits][D]
layout(std430, set = 0, binding = 1) readonly buffer PartMl { float part_ml[]; }; // [B*Hq][splits][2]
layout(std430, set = 0, binding = 2) writeonly buffer Out { float o[]; };         // [B][Hq][D]

layout(push_constant) uniform Params {
    uint splits;
} p;

const uint SLICES = gl_WorkGroupSize.x / 32u;
const uint PER_LANE = (HEAD_DIM + 31u) / 32u;  // at most 8
const uint W_CACHED = 1024u;
shared float w[W_CACHED];
shared float red[gl_WorkGroupSize.x];
shared float part[SLICES * HEAD_DIM];

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint tid = gl_LocalInvocationID.x;
    uint bh = gl_WorkGroupID.x;
    uint first = bh * p.splits;

    float mx = -3.0e38;
    for (uint s = tid; s < p.splits; s += WG) {
        mx = max(mx, part_ml[(first + s) * 2u]);
    }
    red[tid] = mx;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) {
            red[tid] = max(red[tid], red[tid + h]);
        }
        barrier();
    }
    mx = red[0];
    barrier();

    float l = 0.0;
    for (uint s = tid; s < p.splits; s += WG) {
        float e = exp(part_ml[(first + s) * 2u] - mx);
        if (s < W_CACHED) {
            w[s] = e;
        }
        l += e * part_ml[(first + s) * 2u + 1u];
    }
    red[tid] = l;
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) {
            red[tid] += red[tid + h];
        }
        barrier();
    }
    l = red[0];

    uint slice = tid / 32u;
    uint lane = tid % 32u;
    float acc[8];
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        acc[i] = 0.0;
    }
    for (uint s = slice; s < p.splits; s += SLICES) {
        float wt = s < W_CACHED ? w[s] : exp(part_ml[(first + s) * 2u] - mx);
        [[unroll]] for (uint i = 0u; i < PER_LANE; i++) {
            uint d = lane + 32u * i;
            if (d < HEAD_DIM) {
                acc[i] += wt * part_o[(first + s) * HEAD_DIM + d];
            }
        }
    }
    [[unroll]] for (uint i = 0u; i < PER_LANE; i++) {
        uint d = lane + 32u * i;
        if (d < HEAD_DIM) {
            part[slice * HEAD_DIM + d] = acc[i];
        }
    }
    barrier();
    for (uint d = tid; d < HEAD_DIM; d += WG) {
        float sum = 0.0;
        for (uint t = 0u; t < SLICES; t++) {
            sum += part[t * HEAD_DIM + d];
        }
        o[bh * HEAD_DIM + d] = sum / l;
    }
}
