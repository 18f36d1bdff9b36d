// Projection GEMM of the MultiHeadAttention layer: C = (A W^T + bias), A [M][K] f32, W [N][K] (a
// linear layer's weights as ncnn stores them, row = output feature) f32 or f16, bias [N] f32.
//
// The N output columns are up to three segments written to three buffers (fused Q/K/V: columns
// [0, n0) to C0 scaled by alpha0 (the attention scale folded into Q), [n0, n0 + n1) to C1, the rest
// to C2), so one launch projects Q, K and V from the same input. Each segment, and A, is either
// row-major ([M][width], seq = 0) or split by heads as the attention kernels read it: with M = B * seq
// rows (m = b * seq + l) and width = H * HEAD_DIM columns (c = h * HEAD_DIM + d), element (m, c) sits
// at ((b * H + h) * seq + l) * HEAD_DIM + d, i.e. [B][H][seq][HEAD_DIM].
//
// Tiles of 64 x 64 outputs, 256 invocations each computing a 4 x 4 block (rows ty + 16 i, columns
// tx + 16 j: neighbours read neighbouring shared words), K in steps of 16 staged in shared memory.
// Bounds are checked everywhere, so any M, N, K work. W in f16 is read as packed pairs
// (unpackHalf2x16): no 16-bit storage feature needed.
#version 450

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint W_F16 = 0;  // 1: W holds f16 pairs

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };      // [M][K] or split
layout(std430, set = 0, binding = 1) readonly buffer W { uint w[]; };       // [N][K]
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };// [N]
layout(std430, set = 0, binding = 3) writeonly buffer C0 { float c0[]; };
layout(std430, set = 0, binding = 4) writeonly buffer C1 { float c1[]; };
layout(std430, set = 0, binding = 5) writeonly buffer C2 { float c2[]; };

layout(push_constant) uniform Params {
    uint m;         // rows of A and C
    uint n;         // columns of C (all segments)
    uint k;         // columns of A, rows of W are this long
    uint n0;        // columns of segment 0
    uint n1;        // columns of segment 1 (segment 2 has the rest)
    uint a_seq;     // 0: A row-major; else A split by heads with this sequence length
    uint c_seq;     // 0: C row-major; else C split by heads with this sequence length
    uint head_dim;  // D of the split layouts
    float alpha0;   // scale of segment 0
} p;

const uint TM = 64u;
const uint TN = 64u;
const uint TK = 16u;
shared float as_[TK][TM + 1u];
shared float ws[TK][TN + 1u];

float load_w(uint i) {
    if (W_F16 != 0u) {
        vec2 h = unpackHalf2x16(w[i >> 1]);
        return (i & 1u) == 0u ? h.x : h.y;
    }
    return uintBitsToFloat(w[i]);
}

uint split_at(uint row, uint col, uint width, uint seq) {
    if (seq == 0u) {
        return row * width + col;
    }
    uint heads = width / p.head_dim;
    return (((row / seq) * heads + col / p.head_dim) * seq + row % seq) * p.head_dim
        + col % p.head_dim;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u;
    uint ty = tid / 16u;
    uint m0 = gl_WorkGroupID.y * TM;
    uint c0_ = gl_WorkGroupID.x * TN;
    float acc[4][4];
    for (uint i = 0u; i < 4u; i++) {
        for (uint j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }
    for (uint k0 = 0u; k0 < p.k; k0 += TK) {
        for (uint r = 0u; r < 4u; r++) {
            uint e = tid + 256u * r;
            uint row = e / TK;
            uint kk = e % TK;
            uint gk = k0 + kk;
            uint gm = m0 + row;
            as_[kk][row] = (gm < p.m && gk < p.k) ? a[split_at(gm, gk, p.k, p.a_seq)] : 0.0;
            uint gn = c0_ + row;
            ws[kk][row] = (gn < p.n && gk < p.k) ? load_w(gn * p.k + gk) : 0.0;
        }
        barrier();
        for (uint kk = 0u; kk < TK; kk++) {
            float av[4];
            float wv[4];
            for (uint i = 0u; i < 4u; i++) {
                av[i] = as_[kk][ty + 16u * i];
                wv[i] = ws[kk][tx + 16u * i];
            }
            for (uint i = 0u; i < 4u; i++) {
                for (uint j = 0u; j < 4u; j++) {
                    acc[i][j] += av[i] * wv[j];
                }
            }
        }
        barrier();
    }
    for (uint i = 0u; i < 4u; i++) {
        uint gm = m0 + ty + 16u * i;
        if (gm >= p.m) {
            continue;
        }
        for (uint j = 0u; j < 4u; j++) {
            uint gn = c0_ + tx + 16u * j;
            if (gn >= p.n) {
                continue;
            }
            float y = acc[i][j] + bias[gn];
            if (gn < p.n0) {
                c0[split_at(gm, gn, p.n0, p.c_seq)] = y * p.alpha0;
            } else if (gn < p.n0 + p.n1) {
                c1[split_at(gm, gn - p.n0, p.n1, p.c_seq)] = y;
            } else {
                uint n2 = p.n - p.n0 - p.n1;
                c2[split_at(gm, gn - p.n0 - p.n1, n2, p.c_seq)] = y;
            }
        }
    }
}
