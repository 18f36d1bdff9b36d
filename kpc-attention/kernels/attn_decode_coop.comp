// Decode attention on the matrix units (VK_KHR_cooperative_matrix): grouped-query decode with the
// KV head's query heads folded into the rows of 16x16 fp16 matrices, so that each K/V tile is read
// once per KV head and multiplied for all of them at once. Chosen only when asked for
// (DecodeKernel::Cooperative): on the one device measured (H100) it was slower than
// attn_decode_vec at every shape (BENCHMARKS.md). Needs 16x16 fp16 matrices into fp32, subgroups of
// 32 and the element layout attn_prefill_coop calls QUAD (checked by the coop_layout probe), fp16
// K/V and a head dimension that is a multiple of 16 up to 128.
//
// Layout of the work, as in attn_decode_vec (same bindings, push constants and grid: x = splits,
// y = batch * kv_heads): a workgroup attends one split of one KV head for all GROUP query heads.
// Its SG subgroups take the split's 16-key tiles in turn (tile t goes to subgroup t % SG), each with
// its own online softmax, so no workgroup barrier runs in the walk. Per tile a subgroup computes
// S = Q K^T (16 query rows, GROUP of them real) with K loaded by the products straight from the
// cache, and O += P V with V staged in its own slice of shared memory (fetched into registers while
// the previous tile is computed: the products want V transposed, which a load from shared memory
// gives). Shared memory stays near 18 KiB: on the H100 a version that staged K too (45 KiB) ran one
// workgroup per SM and was 1.7x slower. Rows, columns and rescaling follow the QUAD layout:
// invocation l holds, as element e < 4, row l / 4 and column 2 * (l & 3) + (e & 1) + 8 * (e >> 1),
// so a query head's scores sit in one quad. The running max is lazy (as in attn_prefill_coop): it
// moves only when a tile's max exceeds it by TAU, so P stays below 2^TAU in fp16 and rescaling is
// rare.
//
// Then the subgroups merge through shared memory, the workgroup writes its split's unnormalized
// output, max and sum (base 2), and the last workgroup of the KV head to finish combines every
// query head's splits (attn_decode_vec's COMBINE, which the host requires here). The append: the
// one workgroup whose split holds position kv_len - 1 rounds new_k/new_v to fp16, writes them into
// the cache before its walk (which then reads them back: K is coherent for that) and stages V's
// row for its fetches. No other workgroup reads that position. A partial last tile reads up to 15
// K rows past the split; KvCache keeps 16 rows of slack after its last head so that those loads
// stay inside the buffer, and their scores are masked.
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128, local_size_x_id = 0) in;  // 32 * SG
layout(constant_id = 3) const uint HEAD_DIM = 128;   // a multiple of 16, at most 128
layout(constant_id = 7) const uint GROUP = 4;        // query heads per KV head, at most 8

const uint SG = gl_WorkGroupSize.x / 32u;
const uint DM = HEAD_DIM / 16u;       // 16-wide matrices across the head dimension
const uint DC = HEAD_DIM / 8u;        // 16-byte chunks per row
const uint KT = 16u;                  // keys per tile
const uint CH = KT * DC / 32u;        // chunks of V per invocation per tile
const uint RS = DC + 1u;              // uvec4s per staged row (8 halves of padding)
const uint MAX_DM = 8u;
const uint MAX_CH = 8u;
const uint W_CACHED = 1024u;          // (max, sum) pairs the combination keeps shared
const uint Q4 = HEAD_DIM / 4u;
const uint SLICES = gl_WorkGroupSize.x / 32u;
const uint COMBINE_UNROLL = 8u;
const float TAU = 8.0;
const float NONE = -1.0e30;
const float MASKED = -3.0e38;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };                // [B][Hq][D]
layout(std430, set = 0, binding = 1) coherent buffer K { uvec4 k8[]; };               // [B][Hkv][cap][D]
layout(std430, set = 0, binding = 2) buffer V { uvec4 v8[]; };
layout(std430, set = 0, binding = 3) coherent buffer PartO { float part_o[]; };       // [B*Hq][splits][D]
layout(std430, set = 0, binding = 4) coherent buffer PartMl { float part_ml[]; };     // [B*Hq][splits][2]
layout(std430, set = 0, binding = 5) readonly buffer NewK { float new_k[]; };         // [B][Hkv][D]
layout(std430, set = 0, binding = 6) readonly buffer NewV { float new_v[]; };
layout(std430, set = 0, binding = 7) coherent buffer Done { uint done[]; };           // [B*Hkv]
layout(std430, set = 0, binding = 8) writeonly buffer Out { float o[]; };             // [B][Hq][D]

layout(push_constant) uniform Params {
    uint kv_len;     // positions to attend, the appended one included
    uint capacity;   // positions per head in the cache
    uint kv_heads;   // Hkv
    uint per_split;  // positions per split
    float scale;     // 1 / sqrt(D)
    uint append;     // 1: position kv_len - 1 comes from new_k/new_v and is written to the cache
} p;

// One array for every phase: the Q block (16 rows from 0) before the walk; the subgroups' V tiles
// (from sg * KT * RS) during it; their output rows (f32 bits, SG * 8 rows of HEAD_DIM) when they
// merge; the combination's maxima (from 0), sums (from W4) and per-slice rows (from 2 * W4).
const uint W4 = W_CACHED / 4u;
const uint SPAN_V = SG * KT * RS;
const uint SPAN_M = SG * 2u * HEAD_DIM;
const uint SPAN_C = 2u * W4 + SLICES * Q4;
const uint SPAN_VM = SPAN_V > SPAN_M ? SPAN_V : SPAN_M;
const uint SPAN = SPAN_VM > SPAN_C ? SPAN_VM : SPAN_C;
shared uvec4 kvs[SPAN];
shared float sm_m[SG * 8u];
shared float sm_l[SG * 8u];
shared uvec4 fresh_v[16];  // the appended row of V (HEAD_DIM <= 128)
shared bool last;

float sh_get(uint i) {
    return uintBitsToFloat(kvs[i >> 2u][i & 3u]);
}

void sh_set(uint i, float x) {
    kvs[i >> 2u][i & 3u] = floatBitsToUint(x);
}

#define MatA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MatB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MatC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// The output block's DM accumulators as separate variables, not an array (see attn_prefill_coop:
// with an array NVIDIA's driver kept the products in local memory).
#define EACH_ACC(X) X(0u, acc0) X(1u, acc1) X(2u, acc2) X(3u, acc3) X(4u, acc4) X(5u, acc5) \
    X(6u, acc6) X(7u, acc7)
#define ZERO(C, A) MatC A = MatC(0.0);
// Rows 0..7 (elements 0..3) times f; rows 8..15 hold no query head.
#define SCALE_ROWS(C, A) \
    if (C < DM) { \
        [[unroll]] for (uint e = 0u; e < 4u; e++) { \
            A[e] *= f; \
        } \
    }
#define PV(C, A) \
    if (C < DM) { \
        MatB vb; \
        coopMatLoad(vb, kvs, vbase + 2u * C, RS, gl_CooperativeMatrixLayoutRowMajor); \
        A = coopMatMulAdd(pa, vb, A); \
    }
// This invocation's rows of acc_c, times f, into the merge area (f32 bits).
#define MERGE_OUT(C, A) \
    if (C < DM) { \
        [[unroll]] for (uint e = 0u; e < 4u; e++) { \
            uint at = (sg * 8u + lr) * HEAD_DIM + 16u * C + lc + (e & 1u) + 8u * (e >> 1u); \
            sh_set(at, A[e] * f); \
        } \
    }

// x as an f16 bit pattern, rounded to nearest even, by integer operations (see attn_decode_vec:
// NVIDIA's compiler folded unpackHalf2x16(packHalf2x16(x)) back to x).
uint half_rne(float x) {
    uint b = floatBitsToUint(x);
    uint sign = (b >> 16u) & 0x8000u;
    uint a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u);
    }
    if (a >= 0x477ff000u) {
        return sign | 0x7c00u;
    }
    if (a < 0x38800000u) {
        return sign | uint(roundEven(uintBitsToFloat(a) * 16777216.0));
    }
    uint h = (a - 0x38000000u) >> 13u;
    uint rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) {
        h += 1u;
    }
    return sign | h;
}

// The appended row's 16-byte chunk c, from new_k (is_k) or new_v, as the cache stores it.
uvec4 pack_new(bool is_k, uint at) {
    float x[8];
    [[unroll]] for (uint t = 0u; t < 8u; t++) {
        x[t] = is_k ? new_k[at + t] : new_v[at + t];
    }
    return uvec4(half_rne(x[0]) | (half_rne(x[1]) << 16u), half_rne(x[2]) | (half_rne(x[3]) << 16u),
                 half_rne(x[4]) | (half_rne(x[5]) << 16u), half_rne(x[6]) | (half_rne(x[7]) << 16u));
}

// V rows j0 .. j0 + KT of the KV head as this invocation's chunks: zero from `end` on, and the
// appended position (`fresh`) from fresh_v.
void fetch(out uvec4 vn[MAX_CH], uint j0, uint end, uint fresh, uint row_base, uint lane) {
    [[unroll]] for (uint e = 0u; e < CH; e++) {
        uint i = lane + 32u * e;
        uint j = j0 + i / DC;
        uint c = i % DC;
        vn[e] = v8[(row_base + min(j, end - 1u)) * DC + c];
        if (j >= end) {
            vn[e] = uvec4(0u);
        } else if (j == fresh) {
            vn[e] = fresh_v[c];
        }
    }
}

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint split = gl_WorkGroupID.x;
    uint splits = gl_NumWorkGroups.x;
    uint bkv = gl_WorkGroupID.y;
    uint b = bkv / p.kv_heads;
    uint hkv = bkv % p.kv_heads;
    uint head0 = b * p.kv_heads * GROUP + hkv * GROUP;  // the KV head's first query row
    uint j0 = split * p.per_split;
    uint j1 = min(j0 + p.per_split, p.kv_len);
    uint fresh = p.append != 0u ? p.kv_len - 1u : 0xffffffffu;
    uint row_base = bkv * p.capacity;
    // The appended row, rounded as the cache stores it: written to the cache (the walk reads K
    // back from there), V's also staged for the fetches.
    if (fresh < j1 && tid < 2u * DC) {
        uint c = tid % DC;
        if (tid < DC) {
            k8[(row_base + fresh) * DC + c] = pack_new(true, bkv * HEAD_DIM + 8u * c);
        } else {
            uvec4 x = pack_new(false, bkv * HEAD_DIM + 8u * c);
            fresh_v[c] = x;
            v8[(row_base + fresh) * DC + c] = x;
        }
    }

    // Q in the exp2 domain as f16, rows past GROUP zero.
    float qs = p.scale * 1.4426950408889634;
    for (uint i = tid; i < 16u * DC; i += WG) {
        uint r = i / DC;
        uint c = i % DC;
        uvec4 x = uvec4(0u);
        if (r < GROUP) {
            uint at = (head0 + r) * HEAD_DIM + 8u * c;
            float f[8];
            [[unroll]] for (uint t = 0u; t < 8u; t++) {
                f[t] = q[at + t] * qs;
            }
            x = uvec4(packHalf2x16(vec2(f[0], f[1])), packHalf2x16(vec2(f[2], f[3])),
                      packHalf2x16(vec2(f[4], f[5])), packHalf2x16(vec2(f[6], f[7])));
        }
        kvs[r * RS + c] = x;
    }
    barrier();
    MatA qa[MAX_DM];
    [[unroll]] for (uint kk = 0u; kk < DM; kk++) {
        coopMatLoad(qa[kk], kvs, 2u * kk, RS, gl_CooperativeMatrixLayoutRowMajor);
    }
    EACH_ACC(ZERO)
    // The appended K row is visible to the walk's loads, and Q's staging is free for V tiles.
    memoryBarrierBuffer();
    barrier();

    uint lr = lane >> 2u;          // this invocation's query head (row), with elements 0..3
    uint lc = 2u * (lane & 3u);    // its first key (column) of each 16-key block
    uint vbase = sg * KT * RS;
    uint tiles = (j1 - j0 + KT - 1u) / KT;
    float m = NONE;
    float l = 0.0;
    uvec4 vn[MAX_CH];
    if (sg < tiles) {
        fetch(vn, j0 + sg * KT, j1, fresh, row_base, lane);
    }
    for (uint t = sg; t < tiles; t += SG) {
        uint t0 = j0 + t * KT;
        subgroupBarrier();  // the previous tile's loads from the slice are done
        [[unroll]] for (uint e = 0u; e < CH; e++) {
            uint i = lane + 32u * e;
            kvs[vbase + (i / DC) * RS + i % DC] = vn[e];
        }
        subgroupBarrier();
        if (t + SG < tiles) {
            fetch(vn, t0 + SG * KT, j1, fresh, row_base, lane);
        }
        MatC s = MatC(0.0);
        [[unroll]] for (uint kk = 0u; kk < DM; kk++) {
            MatB kb;
            coopMatLoad(kb, k8, (row_base + t0) * DC + 2u * kk, DC,
                        gl_CooperativeMatrixLayoutColumnMajor);
            s = coopMatMulAdd(qa[kk], kb, s);
        }
        float mx = MASKED;
        [[unroll]] for (uint e = 0u; e < 4u; e++) {
            uint j = t0 + lc + (e & 1u) + 8u * (e >> 1u);
            float x = j < j1 ? s[e] : MASKED;
            s[e] = x;
            mx = max(mx, x);
        }
        mx = max(mx, subgroupShuffleXor(mx, 1u));
        mx = max(mx, subgroupShuffleXor(mx, 2u));
        float alpha = 1.0;
        if (m == NONE) {
            m = mx;  // nothing accumulated yet
        } else if (mx > m + TAU) {
            alpha = exp2(m - mx);
            m = mx;
        }
        if (subgroupAny(alpha != 1.0)) {
            l *= alpha;
            float f = alpha;
            EACH_ACC(SCALE_ROWS)
        }
        // P = exp2(S - m), at most 2^TAU, converted element by element (same layout); rows 8..15
        // hold no query head.
        MatA pa;
        [[unroll]] for (uint e = 0u; e < 8u; e++) {
            float pv = e < 4u ? exp2(s[e] - m) : 0.0;
            l += pv;
            pa[e] = float16_t(pv);
        }
        EACH_ACC(PV)
    }
    l += subgroupShuffleXor(l, 1u);
    l += subgroupShuffleXor(l, 2u);

    // Merge the subgroups: each row to the workgroup's max, summed through shared memory.
    if ((lane & 3u) == 0u) {
        sm_m[sg * 8u + lr] = m;
        sm_l[sg * 8u + lr] = l;
    }
    barrier();
    float mw = NONE;
    [[unroll]] for (uint s = 0u; s < SG; s++) {
        mw = max(mw, sm_m[s * 8u + lr]);
    }
    float f = exp2(m - mw);
    EACH_ACC(MERGE_OUT)
    barrier();
    for (uint i = tid; i < GROUP * HEAD_DIM; i += WG) {
        uint g = i / HEAD_DIM;
        uint d = i % HEAD_DIM;
        float x = 0.0;
        [[unroll]] for (uint s = 0u; s < SG; s++) {
            x += sh_get((s * 8u + g) * HEAD_DIM + d);
        }
        part_o[((head0 + g) * splits + split) * HEAD_DIM + d] = x;
    }
    if (tid < GROUP) {
        float mg = NONE;
        [[unroll]] for (uint s = 0u; s < SG; s++) {
            mg = max(mg, sm_m[s * 8u + tid]);
        }
        float total = 0.0;
        [[unroll]] for (uint s = 0u; s < SG; s++) {
            total += sm_l[s * 8u + tid] * exp2(sm_m[s * 8u + tid] - mg);
        }
        uint slot = (head0 + tid) * splits + split;
        part_ml[slot * 2u] = mg;
        part_ml[slot * 2u + 1u] = total;
    }

    // Count this split done; the last one of the KV head combines.
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) {
        last = atomicAdd(done[bkv], 1u) == splits - 1u;
    }
    barrier();
    if (!last) {
        return;
    }
    memoryBarrierBuffer();
    // Every query head at once (attn_decode_vec's COMBINE, in base 2): all GROUP * splits pairs
    // into shared memory, then groups of Q4 invocations, one 16-byte output column each, take
    // (query head, team) pairs.
    uint n_ml = GROUP * splits;
    uint ml0 = head0 * splits;
    for (uint e = tid; e < n_ml; e += WG) {
        sh_set(e, part_ml[(ml0 + e) * 2u]);
        sh_set(W_CACHED + e, part_ml[(ml0 + e) * 2u + 1u]);
    }
    barrier();
    const uint SLOTS = WG / Q4;
    uint teams = max(1u, min(SLOTS, SLICES) / GROUP);
    uint col = tid % Q4;
    for (uint pair = tid / Q4; pair < GROUP * teams; pair += SLOTS) {
        uint g = pair / teams;
        uint team = pair % teams;
        float mx = NONE;
        for (uint s = 0u; s < splits; s++) {
            mx = max(mx, sh_get(g * splits + s));
        }
        float total = 0.0;
        for (uint s = 0u; s < splits; s++) {
            total += sh_get(W_CACHED + g * splits + s) * exp2(sh_get(g * splits + s) - mx);
        }
        uint row = (head0 + g) * splits;
        vec4 sum = vec4(0.0);
        for (uint s0 = team; s0 < splits; s0 += teams * COMBINE_UNROLL) {
            vec4 x[COMBINE_UNROLL];
            [[unroll]] for (uint u = 0u; u < COMBINE_UNROLL; u++) {
                uint at = (row + min(s0 + u * teams, splits - 1u)) * HEAD_DIM + 4u * col;
                x[u] = vec4(part_o[at], part_o[at + 1u], part_o[at + 2u], part_o[at + 3u]);
            }
            [[unroll]] for (uint u = 0u; u < COMBINE_UNROLL; u++) {
                uint s = s0 + u * teams;
                sum += (s < splits ? exp2(sh_get(g * splits + s) - mx) : 0.0) * x[u];
            }
        }
        sum /= total;
        uint at = (head0 + g) * HEAD_DIM + 4u * col;
        if (teams == 1u) {
            o[at] = sum.x;
            o[at + 1u] = sum.y;
            o[at + 2u] = sum.z;
            o[at + 3u] = sum.w;
        } else {
            uint slot = (g * teams + team) * HEAD_DIM + 4u * col;
            sh_set(2u * W_CACHED + slot, sum.x);
            sh_set(2u * W_CACHED + slot + 1u, sum.y);
            sh_set(2u * W_CACHED + slot + 2u, sum.z);
            sh_set(2u * W_CACHED + slot + 3u, sum.w);
        }
    }
    if (teams > 1u) {
        barrier();
        for (uint d = tid; d < GROUP * HEAD_DIM; d += WG) {
            uint g = d / HEAD_DIM;
            float x = 0.0;
            for (uint t = 0u; t < teams; t++) {
                x += sh_get(2u * W_CACHED + (g * teams + t) * HEAD_DIM + d % HEAD_DIM);
            }
            o[head0 * HEAD_DIM + d] = x;
        }
    }
    if (tid == 0u) {
        done[bkv] = 0u;
    }
}
