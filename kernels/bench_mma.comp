// Ceiling of the matrix units through VK_KHR_cooperative_matrix (16x16x16 fp16 products at subgroup
// scope), for `kpc bench-mma`: what a GEMM could reach if feeding its operands cost nothing
// (MODE 0), or cost only the shared-memory reads of a GEMM's inner loop (MODE 1).
//
// MODE 0, operands in registers: each subgroup loads AM fragments of A and BN of B once, then
// repeats `iters` times AM x BN independent products into AM x BN accumulators. Nothing but the
// matrix instructions runs in the loop.
// MODE 1, operands from shared memory: the workgroup's 8 subgroups (2 x 4) own a 128 x (64 BN / 4 *
// 4) tile as a GEMM with 64 x 16 BN per subgroup would; shared memory holds a 128-row A tile and a
// 16 BN * 4-row B tile of 32 k each (rows padded by 16 bytes, as mha_gemm_wide stages them), filled
// once. Every iteration reads the subgroup's AM A and BN B fragments of one 16-k half back out of
// shared memory and multiplies them; a barrier every second iteration stands for the GEMM's one
// barrier per 32-k step (it also keeps the compiler from hoisting the reads out of the loop).
//
// ACC_F16 picks fp16 accumulators (else fp32). Work per launch: groups x subgroups x iters x AM x BN
// products of 2 x 16^3 flops. The accumulators' sum is written to `out` (one 16 x 16 block per
// subgroup) so that nothing is optimized away.
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256, local_size_x_id = 0) in;  // LOCAL_SIZE: a multiple of 32 (256 in MODE 1)
layout(constant_id = 1) const uint MODE = 0;         // 0: registers, 1: shared memory
layout(constant_id = 2) const bool ACC_F16 = false;  // fp16 accumulators
layout(constant_id = 3) const uint AM = 4;           // A fragments per subgroup (1..4)
layout(constant_id = 4) const uint BN = 4;           // B fragments per subgroup (1..4)

layout(std430, set = 0, binding = 0) readonly buffer In { uvec4 src[]; };  // >= 512 halves
layout(std430, set = 0, binding = 1) writeonly buffer Out { float out_[]; };

layout(push_constant) uniform Params {
    uint iters;
} p;

const uint RS = 5u;  // uvec4s per staged row: 32 halves + 8 of padding
shared uvec4 tiles[(128u + 64u * BN) * RS];

#define MatA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MatB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define Acc32 coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define Acc16 coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

MatA a[AM];
MatB b[BN];
Acc32 c32[AM][BN];
Acc16 c16[AM][BN];

void load_fragments(uint half_k, uint sg) {
    uint rows0 = (sg / 4u) * 64u;
    uint cols0 = 128u + (sg % 4u) * 16u * BN;
    [[unroll]] for (uint i = 0u; i < AM; i++) {
        coopMatLoad(a[i], tiles, (rows0 + 16u * i) * RS + 2u * half_k, RS,
                    gl_CooperativeMatrixLayoutRowMajor);
    }
    [[unroll]] for (uint j = 0u; j < BN; j++) {
        coopMatLoad(b[j], tiles, (cols0 + 16u * j) * RS + 2u * half_k, RS,
                    gl_CooperativeMatrixLayoutColumnMajor);
    }
}

void multiply() {
    if (ACC_F16) {
        [[unroll]] for (uint i = 0u; i < AM; i++) {
            [[unroll]] for (uint j = 0u; j < BN; j++) {
                c16[i][j] = coopMatMulAdd(a[i], b[j], c16[i][j]);
            }
        }
    } else {
        [[unroll]] for (uint i = 0u; i < AM; i++) {
            [[unroll]] for (uint j = 0u; j < BN; j++) {
                c32[i][j] = coopMatMulAdd(a[i], b[j], c32[i][j]);
            }
        }
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = tid / 32u;
    [[unroll]] for (uint i = 0u; i < AM; i++) {
        [[unroll]] for (uint j = 0u; j < BN; j++) {
            c32[i][j] = Acc32(0.0);
            c16[i][j] = Acc16(0.0);
        }
    }
    // Fill the tiles from the 512 halves of `src` (64 uvec4s), whatever their size.
    for (uint i = tid; i < (128u + 64u * BN) * RS; i += gl_WorkGroupSize.x) {
        tiles[i] = src[i % 64u];
    }
    barrier();
    load_fragments(0u, sg % 8u);
    if (MODE == 0u) {
        for (uint it = 0u; it < p.iters; it++) {
            multiply();
        }
    } else {
        for (uint it = 0u; it < p.iters; it += 2u) {
            load_fragments(0u, sg);
            multiply();
            load_fragments(1u, sg);
            multiply();
            barrier();
        }
    }
    Acc32 sum = Acc32(0.0);
    [[unroll]] for (uint i = 0u; i < AM; i++) {
        [[unroll]] for (uint j = 0u; j < BN; j++) {
            if (ACC_F16) {
                sum = sum + Acc32(c16[i][j]);
            } else {
                sum = sum + c32[i][j];
            }
        }
    }
    uint block = gl_WorkGroupID.x * (gl_WorkGroupSize.x / 32u) + sg;
    coopMatStore(sum, out_, block * 256u, 16u, gl_CooperativeMatrixLayoutRowMajor);
}
