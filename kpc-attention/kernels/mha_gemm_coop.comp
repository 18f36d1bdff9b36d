// Projection GEMM of the MultiHeadAttention layer on the matrix units (VK_KHR_cooperative_matrix):
// the same operation, bindings and push constants as mha_gemm.comp (C = A W^T + bias into up to
// three head-split or row-major outputs, the first scaled by alpha0), for f16 weights. A (f32
// activations) is rounded to f16 as it is staged; products accumulate in f32, as cuBLAS does for an
// fp16 GEMM. The host picks it where the device multiplies 16x16 fp16 matrices into fp32 at subgroup
// scope with subgroups of 32, W is f16, K is a multiple of 8 and so is the head dimension of any
// split layout (each invocation moves 8 consecutive k of one row: one 16-byte load of W, two of A).
//
// Work: a workgroup of 8 subgroups owns a 128 x 128 block of C; subgroup s owns rows 64 (s / 4) ..
// +64 and columns 32 (s % 4) .. +32 of it, 4 x 2 accumulators of 16 x 16, kept as separate
// variables (NVIDIA's driver spills an array of matrices to local memory: see attn_prefill_coop).
// K advances 32 at a time through two shared-memory stages: while the subgroups multiply one stage,
// each invocation holds the next stage's A and W chunks in registers and stores them after, so one
// barrier per step suffices. Rows of M and N past the end, and k past K, are staged as zeros.
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer A { vec4 a4[]; };      // [M][K] f32 or split
layout(std430, set = 0, binding = 1) readonly buffer W { uvec4 w8[]; };     // [N][K] f16, 8 per uvec4
layout(std430, set = 0, binding = 2) readonly buffer Bias { float bias[]; };// [N]
layout(std430, set = 0, binding = 3) writeonly buffer C0 { float c0[]; };
layout(std430, set = 0, binding = 4) writeonly buffer C1 { float c1[]; };
layout(std430, set = 0, binding = 5) writeonly buffer C2 { float c2[]; };

layout(push_constant) uniform Params {
    uint m;         // rows of A and C
    uint n;         // columns of C (all segments)
    uint k;         // columns of A, rows of W are this long (a multiple of 8)
    uint n0;        // columns of segment 0
    uint n1;        // columns of segment 1 (segment 2 has the rest)
    uint a_seq;     // 0: A row-major; else A split by heads with this sequence length
    uint c_seq;     // 0: C row-major; else C split by heads with this sequence length
    uint head_dim;  // D of the split layouts (a multiple of 8 where A is split)
    float alpha0;   // scale of segment 0
} p;

const uint BM = 128u;
const uint BN = 128u;
const uint BK = 32u;
const uint RS = BK / 8u + 1u;          // uvec4s per staged row: 32 halves + 8 of padding
const uint TILE = BM * RS;             // uvec4s of one staged A (or W) tile
const uint STAGE = 2u * TILE;          // A then W
const uint SS = 5u;                    // uvec4s per row of a subgroup's f32 output block (16 + 4)
shared uvec4 smem[2u * STAGE];         // two stages: 40 KiB

#define MatA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MatB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MatC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

uint split_at(uint row, uint col, uint width, uint seq) {
    if (seq == 0u) {
        return row * width + col;
    }
    uint heads = width / p.head_dim;
    return (((row / seq) * heads + col / p.head_dim) * seq + row % seq) * p.head_dim
        + col % p.head_dim;
}

// Where an invocation's two chunks of each tile come from. Chunk e (tid, tid + 256) of a tile is row
// e / 4 (the same sub-column tid % 4 for both), halves 8 (tid % 4) .. +8 of the step's 32 k. The
// row parts of the addresses are fixed for the whole walk and computed once; per step only k moves,
// so the loop does no division (it otherwise spends more issue slots on addressing than on the
// products). A split by heads with D a multiple of 32 keeps a step's 32 k inside one head, whose
// index and offset advance as counters; any other split takes the general path per chunk.
struct Src {
    uint a[2];   // A: row-major, the row's first vec4; split, the row's (b, l) part in vec4s
    uint w[2];   // W: the row's first uvec4
    bool am[2];  // the A row exists
    bool wm[2];  // the W row exists
};

uvec4 pack8(vec4 x, vec4 y) {
    return uvec4(packHalf2x16(x.xy), packHalf2x16(x.zw), packHalf2x16(y.xy), packHalf2x16(y.zw));
}

// A's vec4 index for k = col of row gm, in general (any split).
uint a_index(uint gm, uint col) {
    return split_at(gm, col, p.k, p.a_seq) / 4u;
}

void store_out(uint gm, uint gn, float acc) {
    if (gm >= p.m || gn >= p.n) {
        return;
    }
    float y = acc + bias[gn];
    if (gn < p.n0) {
        c0[split_at(gm, gn, p.n0, p.c_seq)] = y * p.alpha0;
    } else if (gn < p.n0 + p.n1) {
        c1[split_at(gm, gn - p.n0, p.n1, p.c_seq)] = y;
    } else {
        uint n2 = p.n - p.n0 - p.n1;
        c2[split_at(gm, gn - p.n0 - p.n1, n2, p.c_seq)] = y;
    }
}

#define EACH_ACC(X) X(0u, 0u, c00) X(0u, 1u, c01) X(1u, 0u, c10) X(1u, 1u, c11) \
    X(2u, 0u, c20) X(2u, 1u, c21) X(3u, 0u, c30) X(3u, 1u, c31)
#define ZERO(I, J, C) MatC C = MatC(0.0);

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = tid / 32u;
    uint lane = tid % 32u;
    uint m0 = gl_WorkGroupID.y * BM;
    uint n0_ = gl_WorkGroupID.x * BN;
    uint rows0 = (sg / 4u) * 64u;   // the subgroup's first row in the block
    uint cols0 = (sg % 4u) * 32u;   // and first column
    EACH_ACC(ZERO)

    uint steps = (p.k + BK - 1u) / BK;
    uint sub = tid % 4u;
    bool fast_split = p.a_seq != 0u && p.head_dim % BK == 0u;
    Src src;
    [[unroll]] for (uint j = 0u; j < 2u; j++) {
        uint row = tid / 4u + 64u * j;
        uint gm = m0 + row;
        uint gn = n0_ + row;
        src.am[j] = gm < p.m;
        src.wm[j] = gn < p.n;
        if (p.a_seq == 0u) {
            src.a[j] = gm * (p.k / 4u);
        } else {
            uint heads = p.k / p.head_dim;
            src.a[j] = ((gm / p.a_seq) * heads * p.a_seq + gm % p.a_seq) * (p.head_dim / 4u);
        }
        src.w[j] = gn * (p.k / 8u);
    }
    // The split's head and offset of the current step's first k (fast_split only).
    uint kh = 0u;
    uint kd = 0u;
    uvec4 ra[2];
    uvec4 rw[2];
#define FETCH(K0) \
    { \
        uint col = (K0) + 8u * sub; \
        bool kin = col < p.k; \
        [[unroll]] for (uint j = 0u; j < 2u; j++) { \
            ra[j] = uvec4(0u); \
            rw[j] = uvec4(0u); \
            if (kin && src.am[j]) { \
                uint i; \
                if (p.a_seq == 0u) { \
                    i = src.a[j] + col / 4u; \
                } else if (fast_split) { \
                    i = src.a[j] + (kh * p.a_seq * p.head_dim + kd + 8u * sub) / 4u; \
                } else { \
                    i = a_index(m0 + tid / 4u + 64u * j, col); \
                } \
                ra[j] = pack8(a4[i], a4[i + 1u]); \
            } \
            if (kin && src.wm[j]) { \
                rw[j] = w8[src.w[j] + col / 8u]; \
            } \
        } \
        kd += BK; \
        if (kd >= p.head_dim) { \
            kd -= p.head_dim; \
            kh += 1u; \
        } \
    }
    FETCH(0u)
    // Chunk j sits at row tid / 4 + 64 j, uvec4 tid % 4 of its tile.
    uint at0 = (tid / 4u) * RS + sub;
    uint at1 = at0 + 64u * RS;
    smem[at0] = ra[0];
    smem[at1] = ra[1];
    smem[TILE + at0] = rw[0];
    smem[TILE + at1] = rw[1];
    barrier();
    for (uint s = 0u; s < steps; s++) {
        uint cur = (s & 1u) * STAGE;
        bool more = s + 1u < steps;
        if (more) {
            FETCH((s + 1u) * BK)
        }
        [[unroll]] for (uint kk = 0u; kk < BK / 16u; kk++) {
            MatB b0;
            MatB b1;
            // B(k, n) = W(n, k): the staged W tile read column-major.
            coopMatLoad(b0, smem, cur + TILE + (cols0) * RS + 2u * kk, RS,
                        gl_CooperativeMatrixLayoutColumnMajor);
            coopMatLoad(b1, smem, cur + TILE + (cols0 + 16u) * RS + 2u * kk, RS,
                        gl_CooperativeMatrixLayoutColumnMajor);
            MatA a;
            coopMatLoad(a, smem, cur + (rows0) * RS + 2u * kk, RS, gl_CooperativeMatrixLayoutRowMajor);
            c00 = coopMatMulAdd(a, b0, c00);
            c01 = coopMatMulAdd(a, b1, c01);
            coopMatLoad(a, smem, cur + (rows0 + 16u) * RS + 2u * kk, RS, gl_CooperativeMatrixLayoutRowMajor);
            c10 = coopMatMulAdd(a, b0, c10);
            c11 = coopMatMulAdd(a, b1, c11);
            coopMatLoad(a, smem, cur + (rows0 + 32u) * RS + 2u * kk, RS, gl_CooperativeMatrixLayoutRowMajor);
            c20 = coopMatMulAdd(a, b0, c20);
            c21 = coopMatMulAdd(a, b1, c21);
            coopMatLoad(a, smem, cur + (rows0 + 48u) * RS + 2u * kk, RS, gl_CooperativeMatrixLayoutRowMajor);
            c30 = coopMatMulAdd(a, b0, c30);
            c31 = coopMatMulAdd(a, b1, c31);
        }
        if (more) {
            uint nxt = STAGE - cur;
            smem[nxt + at0] = ra[0];
            smem[nxt + at1] = ra[1];
            smem[nxt + TILE + at0] = rw[0];
            smem[nxt + TILE + at1] = rw[1];
        }
        barrier();
    }

    // Each subgroup writes its blocks one at a time through its own 16 x 16 f32 staging area (the
    // stages are free after the last barrier): lanes 2r and 2r + 1 take row r, 8 columns each.
    uint sb = sg * 16u * SS;
    uint r = lane / 2u;
    uint h = lane % 2u;
#define WRITE(I, J, C) \
    coopMatStore(C, smem, sb, SS, gl_CooperativeMatrixLayoutRowMajor); \
    subgroupBarrier(); \
    { \
        uvec4 u0 = smem[sb + r * SS + 2u * h]; \
        uvec4 u1 = smem[sb + r * SS + 2u * h + 1u]; \
        uint gm = m0 + rows0 + 16u * I + r; \
        uint gc = n0_ + cols0 + 16u * J + 8u * h; \
        store_out(gm, gc, uintBitsToFloat(u0.x)); \
        store_out(gm, gc + 1u, uintBitsToFloat(u0.y)); \
        store_out(gm, gc + 2u, uintBitsToFloat(u0.z)); \
        store_out(gm, gc + 3u, uintBitsToFloat(u0.w)); \
        store_out(gm, gc + 4u, uintBitsToFloat(u1.x)); \
        store_out(gm, gc + 5u, uintBitsToFloat(u1.y)); \
        store_out(gm, gc + 6u, uintBitsToFloat(u1.z)); \
        store_out(gm, gc + 7u, uintBitsToFloat(u1.w)); \
    } \
    subgroupBarrier();
    EACH_ACC(WRITE)
}
