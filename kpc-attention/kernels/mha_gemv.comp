// Decode-time projection of the MultiHeadAttention layer: C = (X W^T + bias) for a few rows of X
// (M = batch, one token each), X [M][K] f32, W [N][K] f32 or f16, bias [N] f32. This is matrix-vector
// work, bound by reading W once: each workgroup takes ROWS rows of W (output columns), its
// invocations stride over K in 16-byte loads (8 halves or 4 floats per load, so K must be a multiple
// of 8 for f16 and 4 for f32; checked on the host), every row of X reusing each load, and a
// shared-memory tree sums the invocations' partials. N / ROWS workgroups spread the weights over the
// whole device.
//
// Outputs are three segments as in mha_gemm (columns [0, n0) to C0 scaled by alpha0, [n0, n0 + n1)
// to C1, the rest to C2), all row-major: with one token per sequence that is also the head-split
// layout the attention kernels read. So one launch is the fused Q/K/V projection of a decode step.
//
// X_F16: X holds fp16 (K a multiple of 8; checked on the host), read as it is. C_F16: the outputs
// take fp16, each written by the invocation of the even column of a pair (every segment's width is
// even; checked on the host). Outputs are declared as words and written by their bits either way.
#version 450

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint W_F16 = 0;  // 1: W holds f16
layout(constant_id = 1) const uint MAX_M = 8;  // most rows of X (the host checks)
layout(constant_id = 2) const uint X_F16 = 0;  // 1: X holds fp16
layout(constant_id = 3) const uint C_F16 = 0;  // 1: the outputs take fp16

layout(std430, set = 0, binding = 0) readonly buffer X { uvec4 x[]; };      // [M][K] in 16-byte words
layout(std430, set = 0, binding = 1) readonly buffer W { uvec4 w[]; };      // [N][K] in 16-byte words
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };// [N]
layout(std430, set = 0, binding = 3) writeonly buffer C0 { uint c0[]; };
layout(std430, set = 0, binding = 4) writeonly buffer C1 { uint c1[]; };
layout(std430, set = 0, binding = 5) writeonly buffer C2 { uint c2[]; };

layout(push_constant) uniform Params {
    uint m;        // rows of X
    uint n;        // columns of C
    uint k;        // length of a row of X and W
    uint n0;       // columns of segment 0
    uint n1;       // columns of segment 1
    float alpha0;  // scale of segment 0
} p;

const uint WG = 128u;
const uint ROWS = 2u;
shared float red[ROWS * MAX_M][WG];

// Elements [4 * j, 4 * j + 4) of row mm of X, `xw` 16-byte words per row.
vec4 xload(uint mm, uint j, uint xw) {
    if (X_F16 != 0u) {
        uvec4 h = x[mm * xw + j / 2u];
        uvec2 q = (j & 1u) == 0u ? h.xy : h.zw;
        return vec4(unpackHalf2x16(q.x), unpackHalf2x16(q.y));
    }
    return uintBitsToFloat(x[mm * xw + j]);
}

// Writes column col (of segment 0, 1 or 2) of row mm: f32 bits, or with C_F16 the pair (col, col + 1).
void store(uint mm, uint col, float y, float y1) {
    uint seg_n = col < p.n0 ? p.n0 : (col < p.n0 + p.n1 ? p.n1 : p.n - p.n0 - p.n1);
    uint at = col < p.n0 ? col : (col < p.n0 + p.n1 ? col - p.n0 : col - p.n0 - p.n1);
    float s = col < p.n0 ? p.alpha0 : 1.0;
    uint i = mm * seg_n + at;
    uint v = floatBitsToUint(y * s);
    if (C_F16 != 0u) {
        i /= 2u;
        v = packHalf2x16(vec2(y, y1) * s);
    }
    if (col < p.n0) {
        c0[i] = v;
    } else if (col < p.n0 + p.n1) {
        c1[i] = v;
    } else {
        c2[i] = v;
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint first = gl_WorkGroupID.x * ROWS;
    uint per = W_F16 != 0u ? 8u : 4u;  // elements per 16-byte word of W
    uint words = p.k / per;            // 16-byte words per row of W
    uint xw = p.k / (X_F16 != 0u ? 8u : 4u);  // 16-byte words per row of X
    float acc[ROWS * MAX_M];
    for (uint i = 0u; i < ROWS * MAX_M; i++) {
        acc[i] = 0.0;
    }
    for (uint r = 0u; r < ROWS; r++) {
        uint row = first + r;
        if (row >= p.n) {
            break;
        }
        for (uint c = tid; c < words; c += WG) {
            uvec4 word = w[row * words + c];
            if (W_F16 != 0u) {
                vec4 lo = vec4(unpackHalf2x16(word.x), unpackHalf2x16(word.y));
                vec4 hi = vec4(unpackHalf2x16(word.z), unpackHalf2x16(word.w));
                for (uint mm = 0u; mm < MAX_M; mm++) {
                    if (mm < p.m) {
                        acc[r * MAX_M + mm] += dot(lo, xload(mm, 2u * c, xw))
                            + dot(hi, xload(mm, 2u * c + 1u, xw));
                    }
                }
            } else {
                vec4 f = uintBitsToFloat(word);
                for (uint mm = 0u; mm < MAX_M; mm++) {
                    if (mm < p.m) {
                        acc[r * MAX_M + mm] += dot(f, xload(mm, c, xw));
                    }
                }
            }
        }
    }
    for (uint i = 0u; i < ROWS * MAX_M; i++) {
        red[i][tid] = acc[i];
    }
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h) {
            for (uint i = 0u; i < ROWS * MAX_M; i++) {
                red[i][tid] += red[i][tid + h];
            }
        }
        barrier();
    }
    // One invocation per (row, batch row) writes the result; for fp16, the even column's writes
    // the pair (ROWS is 2, so both are this workgroup's).
    if (tid < ROWS * MAX_M) {
        uint r = tid / MAX_M;
        uint mm = tid % MAX_M;
        uint col = first + r;
        if (col < p.n && mm < p.m) {
            float y = red[tid][0] + bias[col];
            if (C_F16 == 0u) {
                store(mm, col, y, 0.0);
            } else if (r == 0u) {
                store(mm, col, y, red[MAX_M + mm][0] + bias[col + 1u]);
            }
        }
    }
}
