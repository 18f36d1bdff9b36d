// Causal prefill attention on the matrix units (VK_KHR_cooperative_matrix, flash-attention 2
// style): the variant chosen where the device multiplies 16x16 fp16 matrices into fp32 at subgroup
// scope, its subgroups are 32 wide, K and V are fp16 and the head dimension is a multiple of 8 * SG
// up to 128 (see Attention::prefill_kernel).
//
// Layout of the work: a workgroup of SG subgroups (4 or 8) owns 16 * SG query rows, 16 per
// subgroup, and walks 32-key tiles up to the last key its last row may see. The workgroup stages
// each K and V tile in shared memory, fetching the next tile into registers while the current one is
// computed (zero past the visible keys, so nothing beyond the cache is read and no stale value meets
// a zero weight). Each subgroup keeps its Q block (scaled by log2(e)/sqrt(D), as fp16) and its
// 16 x D output block in cooperative matrices for the whole walk, so per tile it issues
// 2 * D/16 products for S = Q K^T and as many for O += P V.
//
// The cooperative-matrix extension does not say which invocation holds which element, so the row
// softmax goes through shared memory: S is stored (fp32), two lanes per row take its max and
// exponentials, and P is written back in place as fp16 for the P V product. The output's rows cannot
// be rescaled inside its matrices either, so the running max is lazy (as in FlashAttention-4): a
// row's reference max moves only when the new max exceeds it by more than TAU (base 2), which bounds
// every weight by 2^TAU (fine in fp16), and only then does the subgroup round-trip its output
// through shared memory to rescale it. Past the first tiles that is rare.
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

const uint SG = gl_WorkGroupSize.x / 32u;  // subgroups, 16 query rows each
const uint BQ = 16u * SG;          // query rows per workgroup
const uint BK = 32u;               // keys per tile
const uint DM = HEAD_DIM / 16u;    // 16-wide matrices across the head dimension
const uint RS = HEAD_DIM / 8u + 1u;  // uvec4s per staged row of Q, K or V (8 halves of padding)
const uint SS = 9u;                // uvec4s per row of a score block: 32 f32 + 4 of padding
const uint KV = 0u;                // where K rows [0, 32) and V rows [32, 64) of a tile are staged
const uint SC = 2u * BK * RS;      // where the subgroups' score blocks start
// The Q tile, staged first from 0, needs BQ * RS: less than this for up to 8 subgroups and
// HEAD_DIM up to 128.
const uint SMEM = SC + SG * 16u * SS;
const uint CHUNKS = BK * (HEAD_DIM / 8u) / gl_WorkGroupSize.x;  // uvec4s of K (and of V) per invocation per tile
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

// K and V rows j0 .. j0+BK of this head, as the invocation's share of the tile; zero past `visible`.
void fetch(out uvec4 kn[CHUNKS], out uvec4 vn[CHUNKS], uint j0, uint head_row, uint visible) {
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

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint bh = gl_WorkGroupID.y;
    uint b = bh / p.q_heads;
    uint hq = bh % p.q_heads;
    uint kv_heads = p.q_heads / p.group;
    uint head_row = (b * kv_heads + hq / p.group) * p.capacity;  // cache row of position 0
    uint tile = gl_NumWorkGroups.x - 1u - gl_WorkGroupID.x;       // longest (causal) tiles first
    uint q0 = tile * BQ;
    uint rows = min(BQ, p.q_len - q0);
    uint offset = p.kv_len - p.q_len;
    uint q_base = (bh * p.q_len + q0) * HEAD_DIM;
    uint visible = offset + q0 + rows;

    // Stage Q scaled into the exp2 domain, as f16; rows past the launch are zero.
    float qs = p.scale * 1.4426950408889634;
    for (uint i = tid; i < BQ * (HEAD_DIM / 8u); i += gl_WorkGroupSize.x) {
        uint r = i / (HEAD_DIM / 8u);
        uint c = i % (HEAD_DIM / 8u);
        uvec4 w = uvec4(0u);
        if (r < rows) {
            uint at = (q_base + r * HEAD_DIM) / 4u + 2u * c;
            vec4 a = q4[at] * qs;
            vec4 z = q4[at + 1u] * qs;
            w = uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(z.xy), packHalf2x16(z.zw));
        }
        kvq[r * RS + c] = w;
    }
    barrier();
    // Q's matrices stay in registers for the whole walk (keeping them in shared memory instead
    // saved registers but no time: BENCHMARKS.md).
    MatA qa[DM];
    [[unroll]] for (uint kk = 0u; kk < DM; kk++) {
        coopMatLoad(qa[kk], kvq, sg * 16u * RS + 2u * kk, RS, gl_CooperativeMatrixLayoutRowMajor);
    }
    MatC acc[DM];
    [[unroll]] for (uint c = 0u; c < DM; c++) {
        acc[c] = MatC(0.0);
    }
    barrier();

    // Lanes 2r and 2r+1 own row r of the subgroup's block, 16 of each tile's 32 keys each.
    uint r = lane >> 1u;
    uint half_ = lane & 1u;
    uint qrow = sg * 16u + r;
    bool row_ok = qrow < rows;
    uint qpos = offset + q0 + qrow;
    uint sbase = SC + sg * 16u * SS;
    uint mine = sbase + r * SS;  // this row in the score block
    // The subgroup's last row that exists sees keys up to sg_last; past it the subgroup idles.
    bool has_rows = sg * 16u < rows;
    uint sg_last = offset + q0 + min(sg * 16u + 15u, rows - 1u);
    float m_ref = NONE;
    float lsum = 0.0;

    // Each tile's K and V are fetched into registers while the previous tile is computed
    // (10 to 17% faster than fetching after the barrier, at 128 rows: BENCHMARKS.md).
    uvec4 kn[CHUNKS];
    uvec4 vn[CHUNKS];
    fetch(kn, vn, 0u, head_row, visible);
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
                    coopMatLoad(kb, kvq, KV + n * 16u * RS + 2u * kk, RS,
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
                [[unroll]] for (uint c = 0u; c < DM; c += 2u) {
                    coopMatStore(acc[c], kvq, sbase, SS, gl_CooperativeMatrixLayoutRowMajor);
                    coopMatStore(acc[c + 1u], kvq, sbase + 4u, SS,
                                 gl_CooperativeMatrixLayoutRowMajor);
                    subgroupBarrier();
                    [[unroll]] for (uint e = 0u; e < 4u; e++) {
                        vec4 v = uintBitsToFloat(kvq[mine + 4u * half_ + e]) * alpha;
                        kvq[mine + 4u * half_ + e] = floatBitsToUint(v);
                    }
                    subgroupBarrier();
                    coopMatLoad(acc[c], kvq, sbase, SS, gl_CooperativeMatrixLayoutRowMajor);
                    coopMatLoad(acc[c + 1u], kvq, sbase + 4u, SS,
                                gl_CooperativeMatrixLayoutRowMajor);
                    subgroupBarrier();
                }
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
            [[unroll]] for (uint c = 0u; c < DM; c++) {
                [[unroll]] for (uint kb = 0u; kb < 2u; kb++) {
                    MatB vb;
                    coopMatLoad(vb, kvq, KV + (BK + 16u * kb) * RS + 2u * c, RS,
                                gl_CooperativeMatrixLayoutRowMajor);
                    acc[c] = coopMatMulAdd(pa[kb], vb, acc[c]);
                }
            }
            subgroupBarrier();  // P is read before the next tile's S overwrites it
        }
        barrier();
    }

    // O = acc / l, 32 columns at a time through the score block.
    float l = lsum + subgroupShuffleXor(lsum, 1u);
    float inv = 1.0 / l;
    uint out_row = (q_base + qrow * HEAD_DIM) / 4u;
    if (has_rows) {
        [[unroll]] for (uint c = 0u; c < DM; c += 2u) {
            coopMatStore(acc[c], kvq, sbase, SS, gl_CooperativeMatrixLayoutRowMajor);
            coopMatStore(acc[c + 1u], kvq, sbase + 4u, SS, gl_CooperativeMatrixLayoutRowMajor);
            subgroupBarrier();
            if (row_ok) {
                [[unroll]] for (uint e = 0u; e < 4u; e++) {
                    o4[out_row + 4u * c + 4u * half_ + e] =
                        uintBitsToFloat(kvq[mine + 4u * half_ + e]) * inv;
                }
            }
            subgroupBarrier();
        }
    }
}
