// Causal prefill attention on workgroup-scope matrices (VK_NV_cooperative_matrix2), flash-attention
// 2 style: for devices with the extension's workgroup scope, flexible dimensions, reductions,
// conversions, per-element operations and tensor addressing, fp16 K/V and a head dimension that is
// a multiple of 32 up to 128 (see choice.rs: Auto prefers attn_prefill_coop where both fit, as it
// was faster on an H100).
//
// Unlike attn_prefill_coop, nothing here is staged by hand: the workgroup owns BR x D and BR x BC
// matrices as a whole, and the driver decides how they are split over its subgroups and staged
// through the shared memory it reserves for that. That is the only route by which the driver may
// choose its own staging (and wider products) for a tile, which subgroup-scope matrices leave to
// the kernel.
//
// A workgroup owns BR query rows of one head and walks key tiles of BC up to the last key its last
// row may see. K and V are read straight from the cache with tensor-addressed loads (K through a
// transposing view) whose rows past the visible keys read as zero, so nothing beyond the cache's
// written positions is read. Per tile: S = Q K^T; the causal mask only on tiles that reach past the
// first row's position; the row max by a row reduction; P = exp2(S - m) per element; the row sums
// of P as the product of P (fp16, as in P V) with a BC x 16 matrix of ones, on the matrix units
// rather than as another reduction; then O = alpha O + P V with alpha = exp2(m_old - m). The row
// statistics (m, l, alpha) are BR x 16 matrices whose rows are constant, widened by a row reduction
// only where they meet a wider matrix: kept BR x BC wide (as first written) they cost 2 x 32
// registers per invocation at 64 x 64 over 128 invocations, and the kernel spilled (BENCHMARKS.md).
//
// Q and O are [batch][q_head][q_len][head_dim] (f32). K and V are the KV cache's
// [batch][kv_head][capacity][head_dim] (f16). Query i of the launch sits at position
// kv_len - q_len + i and sees keys 0..=that position.
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types : require

layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 3) const uint HEAD_DIM = 128;  // a multiple of 32, at most 128
layout(constant_id = 4) const uint BR = 128;        // query rows per workgroup: a multiple of 16
layout(constant_id = 5) const uint BC = 64;         // keys per tile: a multiple of 16

// Reference max before any key: far below any score, yet m_old - m stays finite.
const float NONE = -1.0e30;
// Score of a key a row may not see: exp2(MASKED - m) is 0 for any finite m.
const float MASKED = -3.0e38;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { float16_t k[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { float16_t v[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Params {
    uint q_len;     // queries in this launch
    uint kv_len;    // positions in the cache, the queries' included
    uint capacity;  // positions per head in the cache
    uint q_heads;   // Hq
    uint group;     // Hq / Hkv
    float scale;    // 1 / sqrt(D)
} p;

#define MatS coopmat<float, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseAccumulator>
#define MatO coopmat<float, gl_ScopeWorkgroup, BR, HEAD_DIM, gl_MatrixUseAccumulator>
#define MatR coopmat<float, gl_ScopeWorkgroup, BR, 16, gl_MatrixUseAccumulator>
#define Clamped tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV>

float max_of(const in float a, const in float b) { return max(a, b); }
// A row reduction of a matrix whose rows are constant: any element is the row's value.
float first_of(const in float a, const in float b) { return a; }
float max_with(const in uint32_t row, const in uint32_t col, const in float x, const in float y) {
    return max(x, y);
}
float exp2_minus(const in uint32_t row, const in uint32_t col, const in float x, const in float y) {
    return exp2(x - y);
}
// Key `col` of the tile is past row `row`'s position when col > row + diag, diag being the first
// row's position minus the tile's first key.
float causal(const in uint32_t row, const in uint32_t col, const in float x, const in int diag) {
    return int(col) > int(row) + diag ? MASKED : x;
}

void main() {
    uint bh = gl_WorkGroupID.x;
    uint b = bh / p.q_heads;
    uint hq = bh % p.q_heads;
    uint kv_heads = p.q_heads / p.group;
    uint kv_base = (b * kv_heads + hq / p.group) * p.capacity * HEAD_DIM;
    // Grid y is the query tile, last first: every head's longest (causal) tiles are dispatched
    // before any shorter one (x runs fastest in dispatch order).
    uint tile = gl_NumWorkGroups.y - 1u - gl_WorkGroupID.y;
    uint q0 = tile * BR;
    uint rows = min(BR, p.q_len - q0);
    uint offset = p.kv_len - p.q_len;
    uint q_base = bh * p.q_len * HEAD_DIM;
    uint visible = offset + q0 + rows;

    // Rows past the launch read as zero (and are never stored); keys past `visible` read as zero.
    Clamped lq = createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    lq = setTensorLayoutDimensionNV(lq, p.q_len, HEAD_DIM);
    Clamped lkv = createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    lkv = setTensorLayoutDimensionNV(lkv, visible, HEAD_DIM);
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    // Q scaled into the exp2 domain, then rounded to fp16 for the products.
    MatO qf;
    coopMatLoadTensorNV(qf, q, q_base, sliceTensorLayoutNV(lq, q0, BR, 0, HEAD_DIM));
    qf = qf * (p.scale * 1.4426950408889634);
    coopmat<float16_t, gl_ScopeWorkgroup, BR, HEAD_DIM, gl_MatrixUseA> qa =
        coopmat<float16_t, gl_ScopeWorkgroup, BR, HEAD_DIM, gl_MatrixUseA>(qf);

    MatO acc = MatO(0.0);
    MatR m = MatR(NONE);
    MatR l = MatR(0.0);
    coopmat<float16_t, gl_ScopeWorkgroup, BC, 16, gl_MatrixUseB> ones =
        coopmat<float16_t, gl_ScopeWorkgroup, BC, 16, gl_MatrixUseB>(1.0);
    uint first = offset + q0;  // position of row 0
    for (uint j0 = 0u; j0 < visible; j0 += BC) {
        coopmat<float16_t, gl_ScopeWorkgroup, HEAD_DIM, BC, gl_MatrixUseB> kt;
        coopMatLoadTensorNV(kt, k, kv_base, sliceTensorLayoutNV(lkv, j0, BC, 0, HEAD_DIM),
                            transposed);
        MatS s = MatS(0.0);
        s = coopMatMulAdd(qa, kt, s);
        // Only tiles that reach past the first row's position need the mask; it also hides the
        // zero keys past `visible`, which lie past every row's position.
        if (j0 + BC > first + 1u) {
            coopMatPerElementNV(s, s, causal, int(first) - int(j0));
        }
        MatR rowmax;
        coopMatReduceNV(rowmax, s, gl_CooperativeMatrixReduceRowNV, max_of);
        MatR m_new;
        coopMatPerElementNV(m_new, rowmax, max_with, m);
        MatR alpha;
        coopMatPerElementNV(alpha, m, exp2_minus, m_new);
        m = m_new;
        MatS m_wide;
        coopMatReduceNV(m_wide, m, gl_CooperativeMatrixReduceRowNV, first_of);
        coopMatPerElementNV(s, s, exp2_minus, m_wide);
        coopmat<float16_t, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseA> pa =
            coopmat<float16_t, gl_ScopeWorkgroup, BR, BC, gl_MatrixUseA>(s);
        MatR sums = MatR(0.0);
        sums = coopMatMulAdd(pa, ones, sums);
        l = alpha * l + sums;
        coopmat<float16_t, gl_ScopeWorkgroup, BC, HEAD_DIM, gl_MatrixUseB> vb;
        coopMatLoadTensorNV(vb, v, kv_base, sliceTensorLayoutNV(lkv, j0, BC, 0, HEAD_DIM));
        MatO alpha_o;
        coopMatReduceNV(alpha_o, alpha, gl_CooperativeMatrixReduceRowNV, first_of);
        acc = alpha_o * acc;
        acc = coopMatMulAdd(pa, vb, acc);
    }

    // O = acc / l; rows past the launch are outside the layout and not stored.
    MatO l_o;
    coopMatReduceNV(l_o, l, gl_CooperativeMatrixReduceRowNV, first_of);
    acc = acc / l_o;
    Clamped lout = createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    lout = setTensorLayoutDimensionNV(lout, p.q_len, HEAD_DIM);
    coopMatStoreTensorNV(acc, o, q_base, sliceTensorLayoutNV(lout, q0, BR, 0, HEAD_DIM));
}
