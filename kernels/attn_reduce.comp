// Decode attention, reduce phase: combines attn_decode's splits with a log-sum-exp.
//
// Grid: x = batch * q_heads. For each output element d:
//   M = max_s m_s,  out[d] = sum_s exp(m_s - M) * o_s[d] / sum_s exp(m_s - M) * l_s.
#version 450

layout(local_size_x = 64, local_size_x_id = 0) in;  // LOCAL_SIZE
layout(constant_id = 3) const uint HEAD_DIM = 128;   // D

layout(std430, set = 0, binding = 0) readonly buffer PartO { float part_o[]; };   // [B*Hq][splits][D]
layout(std430, set = 0, binding = 1) readonly buffer PartMl { float part_ml[]; }; // [B*Hq][splits][2]
layout(std430, set = 0, binding = 2) writeonly buffer Out { float o[]; };         // [B][Hq][D]

layout(push_constant) uniform Params {
    uint splits;
} p;

void main() {
    uint bh = gl_WorkGroupID.x;
    uint first = bh * p.splits;
    float mx = -3.0e38;
    for (uint s = 0u; s < p.splits; s++) {
        mx = max(mx, part_ml[(first + s) * 2u]);
    }
    float l = 0.0;
    for (uint s = 0u; s < p.splits; s++) {
        l += exp(part_ml[(first + s) * 2u] - mx) * part_ml[(first + s) * 2u + 1u];
    }
    for (uint d = gl_LocalInvocationID.x; d < HEAD_DIM; d += gl_WorkGroupSize.x) {
        float acc = 0.0;
        for (uint s = 0u; s < p.splits; s++) {
            acc += exp(part_ml[(first + s) * 2u] - mx) * part_o[(first + s) * HEAD_DIM + d];
        }
        o[bh * HEAD_DIM + d] = acc / l;
    }
}
