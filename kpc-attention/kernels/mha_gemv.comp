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
#version 450

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint W_F16 = 0;  // 1: W holds f16
layout(constant_id = 1) const uint MAX_M = 8;  // most rows of X (the host checks)

layout(std430, set = 0, binding = 0) readonly buffer X { vec4 x[]; };       // [M][K / 4]
layout(std430, set = 0, binding = 1) readonly buffer W { uvec4 w[]; };      // [N][K] in 16-byte words
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };// [N]
layout(std430, set = 0, binding = 3) writeonly buffer C0 { float c0[]; };
layout(std430, set = 0, binding = 4) writeonly buffer C1 { float c1[]; };
layout(std430, set = 0, binding = 5) writeonly buffer C2 { float c2[]; };

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

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint first = gl_WorkGroupID.x * ROWS;
    uint per = W_F16 != 0u ? 8u : 4u;  // elements per 16-byte word of W
    uint words = p.k / per;            // 16-byte words per row of W
    uint xw = p.k / 4u;                // vec4s per row of X
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
                        acc[r * MAX_M + mm] += dot(lo, x[mm * xw + 2u * c])
                            + dot(hi, x[mm * xw + 2u * c + 1u]);
                    }
                }
            } else {
                vec4 f = uintBitsToFloat(word);
                for (uint mm = 0u; mm < MAX_M; mm++) {
                    if (mm < p.m) {
                        acc[r * MAX_M + mm] += dot(f, x[mm * xw + c]);
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
    // One invocation per (row, batch row) writes the result.
    if (tid < ROWS * MAX_M) {
        uint r = tid / MAX_M;
        uint mm = tid % MAX_M;
        uint col = first + r;
        if (col < p.n && mm < p.m) {
            float y = red[tid][0] + bias[col];
            if (col < p.n0) {
                c0[mm * p.n0 + col] = y * p.alpha0;
            } else if (col < p.n0 + p.n1) {
                c1[mm * p.n1 + col - p.n0] = y;
            } else {
                c2[mm * (p.n - p.n0 - p.n1) + col - p.n0 - p.n1] = y;
            }
        }
    }
}
