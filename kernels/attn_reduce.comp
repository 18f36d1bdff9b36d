// Decode attention, reduce phase: combines the splits of attn_decode or attn_decode_vec with a
// log-sum-exp.
//
// Grid: x = batch * q_heads. For each output element d:
//   M = max_s m_s,  out[d] = sum_s exp(m_s - M) * o_s[d] / sum_s exp(m_s - M) * l_s.
// The workgroup shares the scans over splits (max, then weights and their sum) instead of each
// invocation walking every split: with a hundred splits the serial walk dominated the whole step.
// The first W_CACHED weights are kept in shared memory; later ones are recomputed.
#version 450

layout(local_size_x = 64, local_size_x_id = 0) in;  // LOCAL_SIZE, a power of two
layout(constant_id = 3) const uint HEAD_DIM = 128;   // D

layout(std430, set = 0, binding = 0) readonly buffer PartO { float part_o[]; };   // [B*Hq][splits][D]
layout(std430, set = 0, binding = 1) readonly buffer PartMl { float part_ml[]; }; // [B*Hq][splits][2]
layout(std430, set = 0, binding = 2) writeonly buffer Out { float o[]; };         // [B][Hq][D]

layout(push_constant) uniform Params {
    uint splits;
} p;

const uint W_CACHED = 1024u;
shared float w[W_CACHED];
shared float red[gl_WorkGroupSize.x];

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

    for (uint d = tid; d < HEAD_DIM; d += WG) {
        // Four independent sums keep several loads in flight.
        vec4 acc = vec4(0.0);
        uint s = 0u;
        for (; s + 4u <= p.splits; s += 4u) {
            for (uint k = 0u; k < 4u; k++) {
                uint t = s + k;
                float wt = t < W_CACHED ? w[t] : exp(part_ml[(first + t) * 2u] - mx);
                acc[k] += wt * part_o[(first + t) * HEAD_DIM + d];
            }
        }
        for (; s < p.splits; s++) {
            float wt = s < W_CACHED ? w[s] : exp(part_ml[(first + s) * 2u] - mx);
            acc.x += wt * part_o[(first + s) * HEAD_DIM + d];
        }
        o[bh * HEAD_DIM + d] = (acc.x + acc.y + acc.z + acc.w) / l;
    }
}
