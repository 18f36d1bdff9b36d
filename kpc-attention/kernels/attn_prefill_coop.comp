// Causal prefill attention on the matrix units (VK_KHR_cooperative_matrix, flash-attention 2
// style): the variant chosen where the device multiplies 16x16 fp16 matrices into fp32 at subgroup
// scope, its subgroups are 32 wide, K and V are fp16 and the head dimension is a multiple of 8 * SG
// up to 128 (see Attention::prefill_kernel).
//
// Layout of the work: a workgroup of SG subgroups (4 or 8) owns 16 * RB * SG query rows, RB blocks
// of 16 per subgroup (RB 1 or 2, ROW_BLOCKS), and walks key tiles (BK: QUAD_KEYS, 32 or 64, with
// QUAD, else 32) up to the last key its last row may see. The workgroup stages each K and V tile in
// shared memory (zero past the visible keys, so nothing beyond the cache is read and no stale value
// meets a zero weight), fetched after the barrier that ends the previous tile or, with PREFETCH, into
// registers while the previous tile is computed. Each subgroup keeps its Q blocks (scaled by
// log2(e)/sqrt(D), as fp16) and its 16 x D output blocks in cooperative matrices for the whole walk,
// so per 16 keys it issues RB * D/16 products for S = Q K^T and as many for O += P V, each staged K
// or V fragment feeding RB of them. On an H200 two blocks of 16 rows, 4 subgroups, 32-key tiles and
// no prefetch were the fastest tile (BENCHMARKS.md, issue 41).
//
// The cooperative-matrix extension does not say which invocation holds which element. Where the
// host's probe (coop_layout.comp) found the layout that QUAD describes, the softmax stays in
// registers. Otherwise it goes through shared memory: S is stored (fp32), two lanes per row take its
// max and exponentials, and P is written back in place as fp16 for the P V product; the output's rows
// cannot be rescaled inside its matrices either, so the subgroup round-trips its output through
// shared memory to rescale it. Either way the running max is lazy (as in FlashAttention-4): a row's
// reference max moves only when the new max exceeds it by more than TAU (base 2), which bounds every
// weight by 2^TAU (fine in fp16), and only then is the output rescaled. Past the first tiles that is
// rare.
//
// Lanes hand each other values through the score blocks with subgroupBarrier() alone: it orders
// memory as well as execution for coherent data, and shared memory is implicitly coherent.
//
// Q and O are [batch][q_head][q_len][head_dim] (f32). K and V are the KV cache's
// [batch][kv_head][capacity][head_dim] (f16). Query i of the launch sits at position
// kv_len - q_len + i and sees keys 0..=that position.
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128, local_size_x_id = 0) in;  // 32 * subgroups: 128 or 256
layout(constant_id = 3) const uint HEAD_DIM = 128;  // a multiple of 8 * SG (whole fetches), at most 128
// 1: the device's 16x16 fp16 A matrices and fp32 accumulators both give invocation l, as its element e,
// row (l >> 2) + 8 * (e >> 2) and column 2 * (l & 3) + (e & 1) + 8 * ((e >> 1) & 1) (the host checks
// this with coop_layout before it sets QUAD). Then a row's scores sit in the 4 invocations of a quad,
// so its max and sum take two shuffles, the output's rows are rescaled element by element, and P is
// converted to an A matrix element by element: S and P never leave registers, which frees the shared
// memory of the score blocks for 64-key tiles (fewer barriers per product).
layout(constant_id = 4) const uint QUAD = 0;
// With QUAD only (the shared-memory softmax keeps one block, 32-key tiles and the prefetch):
// 16-row blocks per subgroup, 1 or 2. With 2, each staged K or V fragment feeds two products (half
// the shared-memory reads per product) at twice the accumulator registers.
layout(constant_id = 5) const uint ROW_BLOCKS = 1;
// With QUAD only: keys per tile, 32 or 64.
layout(constant_id = 6) const uint QUAD_KEYS = 64;
// 1: each tile's K and V are fetched into registers while the previous tile is computed; 0: fetched
// and stored after the barrier that ends the previous tile (fewer registers; other workgroups on
// the SM cover the wait). Always 1 without QUAD.
layout(constant_id = 7) const uint PREFETCH = 1;

// With QUAD and 2 row blocks: 1 keeps the second block's Q in shared memory (beside the K/V tile)
// and reads its fragments each tile, 32 registers fewer than holding it.
layout(constant_id = 8) const uint Q_SHARED = 0;

// With QUAD: 1 stages K/V tiles in two buffers, so one barrier per tile ends it: the next tile is
// written into the other buffer while this one is read. With PREFETCH, the next tile's K is
// loaded before S = Q K^T and stored after it, its V loaded before O += P V and stored after it
// (half the registers of holding both across the tile); without, both are loaded and stored
// before the products.
layout(constant_id = 9) const uint DOUBLE = 0;

// With QUAD: 1 takes the exponentials of P in fp16, two per instruction (P is fp16 for its
// product either way; the row sums add the same fp16 weights in fp32).
layout(constant_id = 10) const uint HALF_EXP = 0;

const uint SG = gl_WorkGroupSize.x / 32u;  // subgroups
const uint RB = QUAD != 0u ? ROW_BLOCKS : 1u;  // 16-row blocks per subgroup
const uint BQ = 16u * RB * SG;     // query rows per workgroup
const uint BK = QUAD != 0u ? QUAD_KEYS : 32u;  // keys per tile
const uint PF = QUAD != 0u ? PREFETCH : 1u;
const uint NT = BK / 16u;          // 16-key blocks per tile
const uint DM = HEAD_DIM / 16u;    // 16-wide matrices across the head dimension
const uint RS = HEAD_DIM / 8u + 1u;  // uvec4s per staged row of Q, K or V (8 halves of padding)
const uint SS = 9u;                // uvec4s per row of a score block: 32 f32 + 4 of padding
const uint KV = 0u;                // where K rows [0, BK) and V rows [BK, 2 BK) of a tile are staged
// Where the subgroups' score blocks start (QUAD: they only stage the output, after the walk, from 0).
const uint SC = QUAD != 0u ? 0u : 2u * BK * RS;
const uint KV_SMEM = 2u * BK * RS;
const uint SC_SMEM = SC + SG * 16u * SS;
// Q is staged one row block per subgroup at a time (RB passes), from 0.
const uint Q_SMEM = SG * 16u * RS;
const uint SMEM_A = KV_SMEM > SC_SMEM ? KV_SMEM : SC_SMEM;
const uint SMEM_B = SMEM_A > Q_SMEM ? SMEM_A : Q_SMEM;
const uint QSH = QUAD != 0u && RB > 1u ? Q_SHARED : 0u;
const uint QB = KV_SMEM;           // where the second block's Q stays (QSH)
const uint QB_SMEM = QSH != 0u ? QB + SG * 16u * RS : 0u;
const uint SMEM_C = SMEM_B > QB_SMEM ? SMEM_B : QB_SMEM;
const uint DB = QUAD != 0u && QSH == 0u ? DOUBLE : 0u;
const uint DB_SMEM = DB != 0u ? 2u * KV_SMEM : 0u;
const uint SMEM = SMEM_C > DB_SMEM ? SMEM_C : DB_SMEM;
const uint CHUNKS = BK * (HEAD_DIM / 8u) / gl_WorkGroupSize.x;  // uvec4s of K (and of V) per invocation per tile
// Register arrays get fixed bounds (as in attn_decode_vec); the loops index them with constants
// once unrolled. The output's accumulators are separate variables, not an array (see EACH_ACC).
const uint MAX_DM = 8u;            // DM for HEAD_DIM 128
const uint MAX_NT = 4u;            // NT for 64-key tiles
const uint MAX_CHUNKS = 8u;        // CHUNKS for 64-key tiles, HEAD_DIM 128, 128 invocations
const float TAU = 8.0;             // lazy-rescale threshold (log2 of the largest weight)
const float NONE = -1.0e30;        // reference max of a row that has seen no key yet
const float MASKED = -3.0e38;      // score of a key a row may not see

layout(std430, set = 0, binding = 0) readonly buffer Q { vec4 q4[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { uvec4 k8[]; };  // 8 halves each
layout(std430, set = 0, binding = 2) readonly buffer V { uvec4 v8[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { vec4 o4[]; };

layout(push_constant) uniform Params {
    uint q_len;     // queries in this launch
    uint kv_len;    // positions in the cache, the queries' included
    uint capacity;  // positions per head in the cache
    uint q_heads;   // Hq
    uint group;     // Hq / Hkv
    float scale;    // 1 / sqrt(D)
} p;

// The Q tile (BQ rows from 0) while the subgroups load their Q matrices; then K and V of the current
// tile (from KV), and per subgroup 16 rows of scores (from SC): S as f32, then P as f16 in place; a
// score block also stages the output when it is rescaled or written out (32 columns at a time).
shared uvec4 kvq[SMEM];

#define MatA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MatB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MatC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// The output block's DM accumulators, acc0 .. acc7 (those past DM unused): X(c, acc_c) for each, or
// X(c, acc_c, acc_c+1) for each pair. Separate variables rather than an array of matrices: with
// an array, NVIDIA's driver kept the products of P V through local memory (BENCHMARKS.md).
#define EACH_ACC(X) X(0u, acc0) X(1u, acc1) X(2u, acc2) X(3u, acc3) X(4u, acc4) X(5u, acc5) \
    X(6u, acc6) X(7u, acc7)
#define EACH_ACC_PAIR(X) X(0u, acc0, acc1) X(2u, acc2, acc3) X(4u, acc4, acc5) X(6u, acc6, acc7)
// The second row block's accumulators (RB 2), bcc0 .. bcc7, alone or beside the first block's.
#define EACH_BCC(X) X(0u, bcc0) X(1u, bcc1) X(2u, bcc2) X(3u, bcc3) X(4u, bcc4) X(5u, bcc5) \
    X(6u, bcc6) X(7u, bcc7)
#define EACH_BCC_PAIR(X) X(0u, bcc0, bcc1) X(2u, bcc2, bcc3) X(4u, bcc4, bcc5) X(6u, bcc6, bcc7)
#define EACH_ACC_BCC(X) X(0u, acc0, bcc0) X(1u, acc1, bcc1) X(2u, acc2, bcc2) X(3u, acc3, bcc3) \
    X(4u, acc4, bcc4) X(5u, acc5, bcc5) X(6u, acc6, bcc6) X(7u, acc7, bcc7)
// acc_c *= f1 in rows 8..15 of the block and f0 in rows 0..7 (QUAD layout: element e >= 4 is in
// row 8 + lane / 4).
#define SCALE_ROWS(C, A) \
    if (C < DM) { \
        [[unroll]] for (uint e = 0u; e < 8u; e++) { \
            A[e] *= e >= 4u ? f1 : f0; \
        } \
    }
// acc_c += P (16 x 16 keys, pa[kb]) times V rows kb * 16 .. of the tile, columns c * 16 ...
#define PV(C, A) \
    if (C < DM) { \
        MatB vb; \
        coopMatLoad(vb, kvq, kvb + (BK + 16u * kb) * RS + 2u * C, RS, \
                    gl_CooperativeMatrixLayoutRowMajor); \
        A = coopMatMulAdd(pa[kb], vb, A); \
    }
// The same for both row blocks (QUAD): one V fragment, RB products.
#define PV2(C, A, B) \
    if (C < DM) { \
        MatB vb; \
        coopMatLoad(vb, kvq, kvb + (BK + 16u * kb) * RS + 2u * C, RS, \
                    gl_CooperativeMatrixLayoutRowMajor); \
        A = coopMatMulAdd(pa[kb], vb, A); \
        if (RB > 1u) { \
            B = coopMatMulAdd(pb[kb], vb, B); \
        } \
    }
// Register softmax of one row block (QUAD): S (its score matrices) masked where the tile reaches
// past the block's first row (row offset OFF in the subgroup), the lazy max M0 (rows lr) and M1
// (rows lr + 8) moved and the block's accumulators (EACH) rescaled where it grows by more than
// TAU, then P = exp2(S - m) into PA (at most 2^TAU, element by element: same layout) and its sums
// into L0 and L1.
#define SOFTMAX(S, PA, M0, M1, L0, L1, OFF, EACH) { \
        bool edge = j0 + BK > sg_first + OFF + 1u; \
        float mx0 = MASKED; \
        float mx1 = MASKED; \
        [[unroll]] for (uint n = 0u; n < NT; n++) { \
            [[unroll]] for (uint e = 0u; e < 8u; e++) { \
                uint hi = e >> 2u; \
                float x = S[n][e]; \
                if (edge) { \
                    uint j = j0 + 16u * n + lc + (e & 1u) + 8u * ((e >> 1u) & 1u); \
                    if (j > pos0 + OFF + 8u * hi) { \
                        x = MASKED; \
                        S[n][e] = x; \
                    } \
                } \
                if (hi == 0u) { \
                    mx0 = max(mx0, x); \
                } else { \
                    mx1 = max(mx1, x); \
                } \
            } \
        } \
        mx0 = max(mx0, subgroupShuffleXor(mx0, 1u)); \
        mx0 = max(mx0, subgroupShuffleXor(mx0, 2u)); \
        mx1 = max(mx1, subgroupShuffleXor(mx1, 1u)); \
        mx1 = max(mx1, subgroupShuffleXor(mx1, 2u)); \
        float a0 = 1.0; \
        float a1 = 1.0; \
        if (M0 == NONE) { \
            M0 = mx0; \
        } else if (mx0 > M0 + TAU) { \
            a0 = exp2(M0 - mx0); \
            M0 = mx0; \
        } \
        if (M1 == NONE) { \
            M1 = mx1; \
        } else if (mx1 > M1 + TAU) { \
            a1 = exp2(M1 - mx1); \
            M1 = mx1; \
        } \
        if (subgroupAny(a0 != 1.0 || a1 != 1.0)) { \
            L0 *= a0; \
            L1 *= a1; \
            float f0 = a0; \
            float f1 = a1; \
            EACH(SCALE_ROWS) \
        } \
        [[unroll]] for (uint n = 0u; n < NT; n++) { \
            [[unroll]] for (uint e = 0u; e < 8u; e += 2u) { \
                bool hi = e >= 4u; \
                vec2 x2 = vec2(S[n][e], S[n][e + 1u]) - (hi ? M1 : M0); \
                vec2 pv; \
                if (HALF_EXP != 0u) { \
                    f16vec2 ph = exp2(f16vec2(x2)); \
                    PA[n][e] = ph.x; \
                    PA[n][e + 1u] = ph.y; \
                    pv = vec2(ph); \
                } else { \
                    pv = exp2(x2); \
                    PA[n][e] = float16_t(pv.x); \
                    PA[n][e + 1u] = float16_t(pv.y); \
                } \
                if (hi) { \
                    L1 += pv.x + pv.y; \
                } else { \
                    L0 += pv.x + pv.y; \
                } \
            } \
        } \
    }
#define ZERO(C, A) MatC A = MatC(0.0);
// Shared-memory softmax: acc_c and acc_c+1 through the score block, their rows times alpha.
#define RESCALE_PAIR(C, A, B) \
    if (C < DM) { \
        coopMatStore(A, kvq, sbase, SS, gl_CooperativeMatrixLayoutRowMajor); \
        coopMatStore(B, kvq, sbase + 4u, SS, gl_CooperativeMatrixLayoutRowMajor); \
        subgroupBarrier(); \
        [[unroll]] for (uint e = 0u; e < 4u; e++) { \
            vec4 v = uintBitsToFloat(kvq[mine + 4u * half_ + e]) * alpha; \
            kvq[mine + 4u * half_ + e] = floatBitsToUint(v); \
        } \
        subgroupBarrier(); \
        coopMatLoad(A, kvq, sbase, SS, gl_CooperativeMatrixLayoutRowMajor); \
        coopMatLoad(B, kvq, sbase + 4u, SS, gl_CooperativeMatrixLayoutRowMajor); \
        subgroupBarrier(); \
    }
// Output columns c * 16 .. c * 16 + 31 (acc_c, acc_c+1) through the score block, times inv.
#define STORE_PAIR(C, A, B) \
    if (C < DM) { \
        coopMatStore(A, kvq, sbase, SS, gl_CooperativeMatrixLayoutRowMajor); \
        coopMatStore(B, kvq, sbase + 4u, SS, gl_CooperativeMatrixLayoutRowMajor); \
        subgroupBarrier(); \
        if (row_ok) { \
            [[unroll]] for (uint e = 0u; e < 4u; e++) { \
                o4[out_row + 4u * C + 4u * half_ + e] = \
                    uintBitsToFloat(kvq[mine + 4u * half_ + e]) * inv; \
            } \
        } \
        subgroupBarrier(); \
    }

// K and V rows j0 .. j0+BK of this head, as the invocation's share of the tile; zero past `visible`.
void fetch(out uvec4 kn[MAX_CHUNKS], out uvec4 vn[MAX_CHUNKS], uint j0, uint head_row, uint visible) {
    [[unroll]] for (uint e = 0u; e < CHUNKS; e++) {
        uint i = gl_LocalInvocationID.x + e * gl_WorkGroupSize.x;
        uint j = j0 + i / (HEAD_DIM / 8u);
        kn[e] = uvec4(0u);
        vn[e] = uvec4(0u);
        if (j < visible) {
            uint at = (head_row + j) * (HEAD_DIM / 8u) + i % (HEAD_DIM / 8u);
            kn[e] = k8[at];
            vn[e] = v8[at];
        }
    }
}

// K (or V: `v`) rows j0 .. j0+BK alone, as fetch() takes them.
void fetch_one(out uvec4 xn[MAX_CHUNKS], bool v, uint j0, uint head_row, uint visible) {
    [[unroll]] for (uint e = 0u; e < CHUNKS; e++) {
        uint i = gl_LocalInvocationID.x + e * gl_WorkGroupSize.x;
        uint j = j0 + i / (HEAD_DIM / 8u);
        xn[e] = uvec4(0u);
        if (j < visible) {
            uint at = (head_row + j) * (HEAD_DIM / 8u) + i % (HEAD_DIM / 8u);
            xn[e] = v ? v8[at] : k8[at];
        }
    }
}

// The invocation's share of a tile's K rows (or V rows, `v`) into the buffer at `base`.
void store_one(uvec4 xn[MAX_CHUNKS], bool v, uint base) {
    [[unroll]] for (uint e = 0u; e < CHUNKS; e++) {
        uint i = gl_LocalInvocationID.x + e * gl_WorkGroupSize.x;
        uint key = i / (HEAD_DIM / 8u);
        uint c = i % (HEAD_DIM / 8u);
        kvq[base + ((v ? BK : 0u) + key) * RS + c] = xn[e];
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint bh = gl_WorkGroupID.x;
    uint b = bh / p.q_heads;
    uint hq = bh % p.q_heads;
    uint kv_heads = p.q_heads / p.group;
    uint head_row = (b * kv_heads + hq / p.group) * p.capacity;  // cache row of position 0
    // Grid y is the query tile, last first: every head's longest (causal) tiles are dispatched
    // before any shorter one (x runs fastest in dispatch order).
    uint tile = gl_NumWorkGroups.y - 1u - gl_WorkGroupID.y;
    uint q0 = tile * BQ;
    uint rows = min(BQ, p.q_len - q0);
    uint offset = p.kv_len - p.q_len;
    uint q_base = (bh * p.q_len + q0) * HEAD_DIM;
    uint visible = offset + q0 + rows;

    // Stage Q scaled into the exp2 domain, as f16, one row block per subgroup at a time (RB
    // passes); rows past the launch are zero. Q's matrices stay in registers for the whole walk
    // (keeping them in shared memory instead saved registers but no time: BENCHMARKS.md).
    float qs = p.scale * 1.4426950408889634;
    MatA qa[MAX_DM];
    MatA qb[MAX_DM];
    [[unroll]] for (uint rb = 0u; rb < RB; rb++) {
        for (uint i = tid; i < SG * 16u * (HEAD_DIM / 8u); i += gl_WorkGroupSize.x) {
            uint r = i / (HEAD_DIM / 8u);
            uint c = i % (HEAD_DIM / 8u);
            uint qr = (r >> 4u) * 16u * RB + 16u * rb + (r & 15u);  // row in the workgroup's tile
            uvec4 w = uvec4(0u);
            if (qr < rows) {
                uint at = (q_base + qr * HEAD_DIM) / 4u + 2u * c;
                vec4 a = q4[at] * qs;
                vec4 z = q4[at + 1u] * qs;
                w = uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(z.xy), packHalf2x16(z.zw));
            }
            kvq[(rb > 0u && QSH != 0u ? QB : 0u) + r * RS + c] = w;
        }
        barrier();
        [[unroll]] for (uint kk = 0u; kk < DM; kk++) {
            if (rb > 0u && QSH != 0u) {
                // stays in shared memory, read where it is used
            } else if (rb == 0u) {
                coopMatLoad(qa[kk], kvq, sg * 16u * RS + 2u * kk, RS, gl_CooperativeMatrixLayoutRowMajor);
            } else {
                coopMatLoad(qb[kk], kvq, sg * 16u * RS + 2u * kk, RS, gl_CooperativeMatrixLayoutRowMajor);
            }
        }
        barrier();
    }
    EACH_ACC(ZERO)
    EACH_BCC(ZERO)

    // Lanes 2r and 2r+1 own row r of the subgroup's (first) block, 16 of each tile's 32 keys each.
    uint r = lane >> 1u;
    uint half_ = lane & 1u;
    uint sg_row0 = sg * 16u * RB;  // the subgroup's first row in the workgroup's tile
    uint qrow = sg_row0 + r;
    bool row_ok = qrow < rows;
    uint qpos = offset + q0 + qrow;
    uint sbase = SC + sg * 16u * SS;
    uint mine = sbase + r * SS;  // this row in the score block
    // The subgroup's last row that exists sees keys up to sg_last; past it the subgroup idles.
    bool has_rows = sg_row0 < rows;
    uint sg_last = offset + q0 + min(sg_row0 + 16u * RB - 1u, rows - 1u);
    float m_ref = NONE;
    float lsum = 0.0;

    // Each tile's K and V are fetched into registers while the previous tile is computed
    // (10 to 17% faster than fetching after the barrier, at 128 rows: BENCHMARKS.md).
    uvec4 kn[MAX_CHUNKS];
    uvec4 vn[MAX_CHUNKS];
    if (PF != 0u) {
        fetch(kn, vn, 0u, head_row, visible);
    }
    if (QUAD != 0u) {
        // Invocation `lane` holds rows lr and lr + 8 of each of the subgroup's blocks, and of each
        // 16-key block the keys lc, lc + 1, lc + 8 and lc + 9.
        uint lr = lane >> 2u;
        uint lc = 2u * (lane & 3u);
        uint sg_first = offset + q0 + sg_row0;
        uint pos0 = sg_first + lr;  // position of row lr; row lr + 8 is 8 further
        float m0 = NONE;
        float m1 = NONE;
        float l0 = 0.0;
        float l1 = 0.0;
        float m2 = NONE;  // the second block's (RB 2)
        float m3 = NONE;
        float l2 = 0.0;
        float l3 = 0.0;
        if (DB != 0u) {
            // Tile 0 into buffer 0 (kn and vn hold it with PREFETCH).
            if (PF == 0u) {
                fetch(kn, vn, 0u, head_row, visible);
            }
            store_one(kn, false, 0u);
            store_one(vn, true, 0u);
            barrier();
        }
        uint kvb = KV;  // the buffer this tile is read from
        for (uint j0 = 0u; j0 < visible; j0 += BK) {
            bool more = j0 + BK < visible;
            uint other = KV_SMEM - kvb;  // DB: the buffer the next tile goes to
            if (DB == 0u) {
                if (PF == 0u) {
                    fetch(kn, vn, j0, head_row, visible);
                }
                store_one(kn, false, KV);
                store_one(vn, true, KV);
                barrier();
                if (PF != 0u && more) {
                    fetch(kn, vn, j0 + BK, head_row, visible);
                }
            } else if (more) {
                if (PF == 0u) {
                    fetch(kn, vn, j0 + BK, head_row, visible);
                    store_one(kn, false, other);
                    store_one(vn, true, other);
                } else {
                    fetch_one(kn, false, j0 + BK, head_row, visible);
                }
            }
            if (has_rows && j0 <= sg_last) {
                MatC s[MAX_NT];
                MatC t[MAX_NT];
                [[unroll]] for (uint n = 0u; n < NT; n++) {
                    s[n] = MatC(0.0);
                    if (RB > 1u) {
                        t[n] = MatC(0.0);
                    }
                }
                [[unroll]] for (uint kk = 0u; kk < DM; kk++) {
                    MatA qt;
                    if (QSH != 0u) {
                        coopMatLoad(qt, kvq, QB + sg * 16u * RS + 2u * kk, RS,
                                    gl_CooperativeMatrixLayoutRowMajor);
                    }
                    [[unroll]] for (uint n = 0u; n < NT; n++) {
                        MatB kb;
                        coopMatLoad(kb, kvq, kvb + n * 16u * RS + 2u * kk, RS,
                                    gl_CooperativeMatrixLayoutColumnMajor);
                        s[n] = coopMatMulAdd(qa[kk], kb, s[n]);
                        if (QSH != 0u) {
                            t[n] = coopMatMulAdd(qt, kb, t[n]);
                        } else if (RB > 1u) {
                            t[n] = coopMatMulAdd(qb[kk], kb, t[n]);
                        }
                    }
                }
                MatA pa[MAX_NT];
                MatA pb[MAX_NT];
                SOFTMAX(s, pa, m0, m1, l0, l1, 0u, EACH_ACC)
                if (RB > 1u) {
                    SOFTMAX(t, pb, m2, m3, l2, l3, 16u, EACH_BCC)
                }
                if (DB != 0u && PF != 0u && more) {
                    store_one(kn, false, other);
                    fetch_one(vn, true, j0 + BK, head_row, visible);
                }
                [[unroll]] for (uint kb = 0u; kb < NT; kb++) {
                    EACH_ACC_BCC(PV2)
                }
                if (DB != 0u && PF != 0u && more) {
                    store_one(vn, true, other);
                }
            } else if (DB != 0u && PF != 0u && more) {
                // A subgroup past its rows still stages its share of the next tile.
                store_one(kn, false, other);
                fetch_one(vn, true, j0 + BK, head_row, visible);
                store_one(vn, true, other);
            }
            barrier();
            if (DB != 0u) {
                kvb = other;
            }
        }
        // O = acc / l, scaled in place; written below through the (now free) shared memory.
        l0 += subgroupShuffleXor(l0, 1u);
        l0 += subgroupShuffleXor(l0, 2u);
        l1 += subgroupShuffleXor(l1, 1u);
        l1 += subgroupShuffleXor(l1, 2u);
        float f0 = 1.0 / l0;
        float f1 = 1.0 / l1;
        EACH_ACC(SCALE_ROWS)
        if (RB > 1u) {
            l2 += subgroupShuffleXor(l2, 1u);
            l2 += subgroupShuffleXor(l2, 2u);
            l3 += subgroupShuffleXor(l3, 1u);
            l3 += subgroupShuffleXor(l3, 2u);
            f0 = 1.0 / l2;
            f1 = 1.0 / l3;
            EACH_BCC(SCALE_ROWS)
        }
    } else {
        uint kvb = KV;
        for (uint j0 = 0u; j0 < visible; j0 += BK) {
            [[unroll]] for (uint e = 0u; e < CHUNKS; e++) {
                uint i = tid + e * gl_WorkGroupSize.x;
                uint key = i / (HEAD_DIM / 8u);
                uint c = i % (HEAD_DIM / 8u);
                kvq[KV + key * RS + c] = kn[e];
                kvq[KV + (BK + key) * RS + c] = vn[e];
            }
            barrier();
            if (j0 + BK < visible) {
                fetch(kn, vn, j0 + BK, head_row, visible);  // in flight while this tile is computed
            }
            if (has_rows && j0 <= sg_last) {
                MatC s[2];
                s[0] = MatC(0.0);
                s[1] = MatC(0.0);
                [[unroll]] for (uint kk = 0u; kk < DM; kk++) {
                    [[unroll]] for (uint n = 0u; n < 2u; n++) {
                        MatB kb;
                        coopMatLoad(kb, kvq, kvb + n * 16u * RS + 2u * kk, RS,
                                    gl_CooperativeMatrixLayoutColumnMajor);
                        s[n] = coopMatMulAdd(qa[kk], kb, s[n]);
                    }
                }
                [[unroll]] for (uint n = 0u; n < 2u; n++) {
                    coopMatStore(s[n], kvq, sbase + 4u * n, SS, gl_CooperativeMatrixLayoutRowMajor);
                }
                subgroupBarrier();

                float x[16];
                float mx = MASKED;
                [[unroll]] for (uint e = 0u; e < 4u; e++) {
                    uvec4 w = kvq[mine + 4u * half_ + e];
                    [[unroll]] for (uint c = 0u; c < 4u; c++) {
                        uint j = j0 + 16u * half_ + 4u * e + c;
                        bool ok = row_ok && j <= qpos;
                        x[4u * e + c] = ok ? uintBitsToFloat(w[c]) : MASKED;
                        mx = max(mx, x[4u * e + c]);
                    }
                }
                mx = max(mx, subgroupShuffleXor(mx, 1u));
                float alpha = 1.0;
                if (m_ref == NONE) {
                    m_ref = max(m_ref, mx);  // nothing accumulated yet: no rescale needed
                } else if (mx > m_ref + TAU) {
                    alpha = exp2(m_ref - mx);
                    m_ref = mx;
                }
                subgroupBarrier();  // every lane has read S before the block is reused

                if (subgroupAny(alpha != 1.0)) {
                    lsum *= alpha;
                    EACH_ACC_PAIR(RESCALE_PAIR)
                }

                // P = exp2(S - m_ref), at most 2^TAU, written over the row as f16.
                uint packed[8];
                [[unroll]] for (uint e = 0u; e < 8u; e++) {
                    vec2 pe = exp2(vec2(x[2u * e], x[2u * e + 1u]) - m_ref);
                    lsum += pe.x + pe.y;
                    packed[e] = packHalf2x16(pe);
                }
                kvq[mine + 2u * half_] = uvec4(packed[0], packed[1], packed[2], packed[3]);
                kvq[mine + 2u * half_ + 1u] = uvec4(packed[4], packed[5], packed[6], packed[7]);
                subgroupBarrier();

                MatA pa[2];
                coopMatLoad(pa[0], kvq, sbase, SS, gl_CooperativeMatrixLayoutRowMajor);
                coopMatLoad(pa[1], kvq, sbase + 2u, SS, gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (uint kb = 0u; kb < 2u; kb++) {
                    EACH_ACC(PV)
                }
                subgroupBarrier();  // P is read before the next tile's S overwrites it
            }
            barrier();
        }

    }

    // O = acc / l (QUAD: acc), 32 columns at a time through the score block.
    float inv = 1.0;
    if (QUAD == 0u) {
        inv = 1.0 / (lsum + subgroupShuffleXor(lsum, 1u));
    }
    uint out_row = (q_base + qrow * HEAD_DIM) / 4u;
    if (has_rows) {
        EACH_ACC_PAIR(STORE_PAIR)
    }
    if (RB > 1u) {
        out_row += 16u * HEAD_DIM / 4u;
        row_ok = qrow + 16u < rows;
        if (sg_row0 + 16u < rows) {
            EACH_BCC_PAIR(STORE_PAIR)
        }
    }
}
