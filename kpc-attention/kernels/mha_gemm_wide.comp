// Projection GEMM of the MultiHeadAttention layer on the matrix units (VK_KHR_cooperative_matrix,
// 16x16x16 fp16 products at subgroup scope), built around how its operands reach the units: the
// same operation, bindings and push constants as mha_gemm and mha_gemm_coop (C = A W^T + bias into
// up to three head-split or row-major outputs, the first scaled by alpha0), for f16 weights W
// ([N][K]) and f16 or f32 activations A (A_F16; f32 is rounded to f16 as it is staged), with fp32
// accumulators or, where the host finds them accurate enough, fp16 ones (ACC_F16).
//
// Needs: subgroups of 32; K, N, n0, n1 multiples of 8, and so the head dimension of any split
// layout (every global access is one 16-byte chunk of 8 consecutive k, or 4 consecutive n).
//
// Tiles (spec constants): a workgroup of SG_M x SG_N subgroups owns a BM x BN block of C; each
// subgroup a (BM / SG_M) x (BN / SG_N) part of it, held as TM x TN accumulators of 16 x 16 (64 x
// 64 of C, 16 accumulators, at the default 128 x 256 over 2 x 4 subgroups). K advances BK (16, 32
// or 64) per step. Staging: A and W tiles in shared memory, f16, each row BK halves plus 16 bytes of
// padding, so that the eight 16-byte rows a matrix load reads at once fall in distinct banks (rows
// 48, 80 or 144 bytes apart). Every invocation moves whole 16-byte chunks: one uvec4 of W (and of f16
// A) or two vec4s of f32 A per chunk, consecutive invocations along k. The next step's chunks are
// loaded into registers before the current step's products and stored to shared memory after them,
// so the loads' latency hides behind the products: with STAGES = 2 into the other of two tiles, one
// barrier per step; with STAGES = 1 (where two would not fit the device's shared memory) into the
// same tile between two barriers.
//
// Bounds: a workgroup whose block lies inside C and whose K is a multiple of BK runs a copy of the
// loop without any bounds test; the others test rows of A and W and k, reading zeros past them,
// and C's rows and columns on the way out.
//
// Output: each subgroup passes its accumulators one at a time through a 16 x 16 f32 area of shared
// memory (free after the last step), and two invocations per row write 8 columns each as two vec4
// stores, adding the bias and the scale, into the head-split or row-major output.
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256, local_size_x_id = 0) in;  // 32 SG_M SG_N
layout(constant_id = 1) const uint BM = 128;          // rows of C per workgroup
layout(constant_id = 2) const uint BN = 256;          // columns of C per workgroup
layout(constant_id = 3) const uint BK = 32;           // k per step: 16, 32 or 64
layout(constant_id = 4) const uint SG_M = 2;          // subgroups along M
layout(constant_id = 5) const uint SG_N = 4;          // subgroups along N
layout(constant_id = 6) const bool A_F16 = false;     // A holds f16 (else f32)
layout(constant_id = 7) const bool ACC_F16 = false;   // fp16 accumulators (else fp32)
layout(constant_id = 8) const uint STAGES = 1;        // shared-memory tiles: 1 or 2
layout(constant_id = 9) const uint AHEAD = 1;         // K steps loaded ahead into registers: 1 or 2
layout(constant_id = 10) const uint GROUP_M = 8;      // row blocks per band of the launch order
layout(constant_id = 11) const bool EARLY = false;    // STAGES 1: load before the second barrier

layout(std430, set = 0, binding = 0) readonly buffer A32 { vec4 a4[]; };    // [M][K] f32, or split
layout(std430, set = 0, binding = 0) readonly buffer A16 { uvec4 a8[]; };   // the same, f16
layout(std430, set = 0, binding = 1) readonly buffer W { uvec4 w8[]; };     // [N][K] f16
layout(std430, set = 0, binding = 2) readonly buffer Bias { vec4 bias4[]; };// [N]
layout(std430, set = 0, binding = 3) writeonly buffer C0 { vec4 c0[]; };
layout(std430, set = 0, binding = 4) writeonly buffer C1 { vec4 c1[]; };
layout(std430, set = 0, binding = 5) writeonly buffer C2 { vec4 c2[]; };

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

const uint INV = 32u * SG_M * SG_N;  // invocations
const uint TM = BM / SG_M / 16u;     // accumulator rows per subgroup
const uint TN = BN / SG_N / 16u;     // accumulator columns per subgroup
const uint KC = BK / 8u;             // 16-byte chunks per staged row
const uint RS = KC + 1u;             // uvec4s per staged row, padding included
const uint A_CH = BM * KC / INV;     // chunks of A per invocation and step
const uint B_CH = BN * KC / INV;     // chunks of W per invocation and step
const uint ROWS = INV / KC;          // rows one pass of the workgroup's chunks covers
const uint STAGE = (BM + BN) * RS;   // uvec4s of one A tile and one W tile
const uint SS = 5u;                  // uvec4s per row of a subgroup's 16 x 16 f32 output area
shared uvec4 smem[STAGES * STAGE];

#define MatA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MatB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define Acc32 coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define Acc16 coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// Only one of the two sets is used (ACC_F16); the other is removed once specialized.
Acc32 c32[TM][TN];
Acc16 c16[TM][TN];
// The next steps' chunks of A (f16, or f32 as vec4 pairs) and of W: AHEAD sets.
uvec4 ra[2][A_CH];
vec4 rf[2][2u * A_CH];
uvec4 rb[2][B_CH];
// Per chunk of A: the element offset of its row (the part of the address k does not move), and
// whether the row exists.
uint arow[A_CH];
bool aok[A_CH];

uint tid;
uint c8;   // the chunk's column (in chunks of 8 k) within a staged row, the same for all chunks
uint m0;   // the block's first row
uint nb;   // the block's first column

uvec4 pack8(vec4 x, vec4 y) {
    return uvec4(packHalf2x16(x.xy), packHalf2x16(x.zw), packHalf2x16(y.xy), packHalf2x16(y.zw));
}

// Loads the chunks of the step whose first k is k0 into register set q; `checked` tests rows
// and k.
void fetch(uint k0, bool checked, uint q) {
    uint col = k0 + 8u * c8;
    bool kin = !checked || col < p.k;
    // The column's part of A's address: a head-split A puts k = h D + d at h L D + d.
    uint acol = col;
    if (p.a_seq != 0u) {
        acol = (col / p.head_dim) * p.a_seq * p.head_dim + col % p.head_dim;
    }
    [[unroll]] for (uint j = 0u; j < A_CH; j++) {
        bool ok = kin && (!checked || aok[j]);
        uint e = arow[j] + acol;
        if (A_F16) {
            ra[q][j] = uvec4(0u);
            if (ok) {
                ra[q][j] = a8[e / 8u];
            }
        } else {
            rf[q][2u * j] = vec4(0.0);
            rf[q][2u * j + 1u] = vec4(0.0);
            if (ok) {
                rf[q][2u * j] = a4[e / 4u];
                rf[q][2u * j + 1u] = a4[e / 4u + 1u];
            }
        }
    }
    uint wbase = (nb + tid / KC) * (p.k / 8u) + col / 8u;
    [[unroll]] for (uint j = 0u; j < B_CH; j++) {
        rb[q][j] = uvec4(0u);
        if (kin && (!checked || nb + tid / KC + j * ROWS < p.n)) {
            rb[q][j] = w8[wbase + j * ROWS * (p.k / 8u)];
        }
    }
}

// Stores the chunks of register set q into the tiles at `base`.
void stage(uint base, uint q) {
    uint at = base + (tid / KC) * RS + c8;
    [[unroll]] for (uint j = 0u; j < A_CH; j++) {
        smem[at + j * ROWS * RS] = A_F16 ? ra[q][j] : pack8(rf[q][2u * j], rf[q][2u * j + 1u]);
    }
    [[unroll]] for (uint j = 0u; j < B_CH; j++) {
        smem[at + (BM + j * ROWS) * RS] = rb[q][j];
    }
}

// The subgroup's products over the step staged at `base`.
void multiply(uint base, uint sg) {
    uint ab = base + (sg / SG_N) * (16u * TM) * RS;
    uint bb = base + (BM + (sg % SG_N) * (16u * TN)) * RS;
    [[unroll]] for (uint kk = 0u; kk < BK / 16u; kk++) {
        MatA a[TM];
        MatB b[TN];
        [[unroll]] for (uint i = 0u; i < TM; i++) {
            coopMatLoad(a[i], smem, ab + 16u * i * RS + 2u * kk, RS,
                        gl_CooperativeMatrixLayoutRowMajor);
        }
        // B(k, n) = W(n, k): the staged W tile read column-major.
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            coopMatLoad(b[j], smem, bb + 16u * j * RS + 2u * kk, RS,
                        gl_CooperativeMatrixLayoutColumnMajor);
        }
        if (ACC_F16) {
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    c16[i][j] = coopMatMulAdd(a[i], b[j], c16[i][j]);
                }
            }
        } else {
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    c32[i][j] = coopMatMulAdd(a[i], b[j], c32[i][j]);
                }
            }
        }
    }
}

// The whole K walk; `checked` as in fetch. Step s's chunks are loaded AHEAD steps before they are
// multiplied (the last steps load their own again rather than branch around the loads).
void walk(uint sg, bool checked) {
    uint steps = (p.k + BK - 1u) / BK;
    uint last = steps - 1u;
    if (STAGES == 1u && AHEAD == 1u) {
        fetch(0u, checked, 0u);
        for (uint s = 0u; s < steps; s++) {
            barrier();  // every subgroup is done reading the tile
            stage(0u, 0u);
            if (EARLY) {
                fetch(min(s + 1u, last) * BK, checked, 0u);
            }
            barrier();
            if (!EARLY) {
                fetch(min(s + 1u, last) * BK, checked, 0u);
            }
            multiply(0u, sg);
        }
    } else if (STAGES == 1u) {
        fetch(0u, checked, 0u);
        fetch(min(1u, last) * BK, checked, 1u);
        for (uint s = 0u; s < steps; s += 2u) {
            barrier();
            stage(0u, 0u);
            if (EARLY) {
                fetch(min(s + 2u, last) * BK, checked, 0u);
            }
            barrier();
            if (!EARLY) {
                fetch(min(s + 2u, last) * BK, checked, 0u);
            }
            multiply(0u, sg);
            if (s + 1u < steps) {
                barrier();
                stage(0u, 1u);
                if (EARLY) {
                    fetch(min(s + 3u, last) * BK, checked, 1u);
                }
                barrier();
                if (!EARLY) {
                    fetch(min(s + 3u, last) * BK, checked, 1u);
                }
                multiply(0u, sg);
            }
        }
    } else if (AHEAD == 1u) {
        fetch(0u, checked, 0u);
        stage(0u, 0u);
        barrier();
        for (uint s = 0u; s < steps; s++) {
            uint cur = (s & 1u) * STAGE;
            fetch(min(s + 1u, last) * BK, checked, 0u);
            multiply(cur, sg);
            stage(STAGE - cur, 0u);
            barrier();
        }
    } else {
        // Tile 0 holds step s, set 1 step s + 1 and set 0 step s + 2 at the top of the loop.
        fetch(0u, checked, 0u);
        stage(0u, 0u);
        fetch(min(1u, last) * BK, checked, 1u);
        fetch(min(2u, last) * BK, checked, 0u);
        barrier();
        for (uint s = 0u; s < steps; s += 2u) {
            multiply(0u, sg);
            stage(STAGE, 1u);
            barrier();
            fetch(min(s + 3u, last) * BK, checked, 1u);
            if (s + 1u < steps) {
                multiply(STAGE, sg);
                stage(0u, 0u);
                barrier();
                fetch(min(s + 4u, last) * BK, checked, 0u);
            }
        }
    }
    barrier();
}

uint split_at(uint row, uint col, uint width, uint seq) {
    if (seq == 0u) {
        return row * width + col;
    }
    uint heads = width / p.head_dim;
    return (((row / seq) * heads + col / p.head_dim) * seq + row % seq) * p.head_dim
        + col % p.head_dim;
}

// Columns gn .. gn + 3 of row gm (gn a multiple of 4, so all four lie in one segment and head).
void store4(uint gm, uint gn, vec4 acc) {
    if (gm >= p.m || gn >= p.n) {
        return;
    }
    vec4 y = acc + bias4[gn / 4u];
    if (gn < p.n0) {
        c0[split_at(gm, gn, p.n0, p.c_seq) / 4u] = y * p.alpha0;
    } else if (gn < p.n0 + p.n1) {
        c1[split_at(gm, gn - p.n0, p.n1, p.c_seq) / 4u] = y;
    } else {
        uint n2 = p.n - p.n0 - p.n1;
        c2[split_at(gm, gn - p.n0 - p.n1, n2, p.c_seq) / 4u] = y;
    }
}

void main() {
    tid = gl_LocalInvocationID.x;
    uint sg = tid / 32u;
    uint lane = tid % 32u;
    // Launch order: bands of GROUP_M row blocks, each walked column block by column block, so
    // that the workgroups resident at once share their A rows and W columns in L2.
    uint nx = gl_NumWorkGroups.x;
    uint ny = gl_NumWorkGroups.y;
    uint id = gl_WorkGroupID.y * nx + gl_WorkGroupID.x;
    uint band = GROUP_M * nx;
    uint first = (id / band) * GROUP_M;
    uint tall = min(ny - first, GROUP_M);
    uint tile_m = first + (id % band) % tall;
    uint tile_n = (id % band) / tall;
    if (GROUP_M <= 1u) {
        tile_m = gl_WorkGroupID.y;
        tile_n = gl_WorkGroupID.x;
    }
    m0 = tile_m * BM;
    nb = tile_n * BN;
    c8 = tid % KC;
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            c32[i][j] = Acc32(0.0);
            c16[i][j] = Acc16(0.0);
        }
    }
    [[unroll]] for (uint j = 0u; j < A_CH; j++) {
        uint gm = m0 + tid / KC + j * ROWS;
        aok[j] = gm < p.m;
        if (p.a_seq == 0u) {
            arow[j] = gm * p.k;
        } else {
            uint heads = p.k / p.head_dim;
            arow[j] = ((gm / p.a_seq) * heads * p.a_seq + gm % p.a_seq) * p.head_dim;
        }
    }
    bool interior = m0 + BM <= p.m && nb + BN <= p.n && p.k % BK == 0u;
    if (interior) {
        walk(sg, false);
    } else {
        walk(sg, true);
    }

    uint sb = sg * 16u * SS;
    uint r = lane / 2u;
    uint h = lane % 2u;
    uint rows0 = m0 + (sg / SG_N) * (16u * TM);
    uint cols0 = nb + (sg % SG_N) * (16u * TN);
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            if (ACC_F16) {
                Acc32 c = Acc32(c16[i][j]);
                coopMatStore(c, smem, sb, SS, gl_CooperativeMatrixLayoutRowMajor);
            } else {
                coopMatStore(c32[i][j], smem, sb, SS, gl_CooperativeMatrixLayoutRowMajor);
            }
            subgroupBarrier();
            uvec4 u0 = smem[sb + r * SS + 2u * h];
            uvec4 u1 = smem[sb + r * SS + 2u * h + 1u];
            uint gm = rows0 + 16u * i + r;
            uint gc = cols0 + 16u * j + 8u * h;
            store4(gm, gc, uintBitsToFloat(u0));
            store4(gm, gc + 4u, uintBitsToFloat(u1));
            subgroupBarrier();
        }
    }
}
