// Probe of the cooperative-matrix layout: which row and column of a 16x16 fp16 A matrix and of a
// 16x16 fp32 accumulator each invocation of a 32-wide subgroup holds as each of its elements. The
// extension leaves that to the implementation; attn_prefill_coop keeps its softmax in registers only
// where the host finds the layout it assumes (Attention::new, `coop_quad_layout`).
//
// Output, u32: [use (0: A, 1: accumulator)][invocation (32)][element (16)] = row * 16 + column, or
// 0xffffffff past the invocation's element count; then the two element counts at 1024 and 1025.
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x = 32) in;  // one subgroup of 32 (the prefill's condition)

layout(std430, set = 0, binding = 0) writeonly buffer Out { uint o[]; };

shared uint ha[128];  // 16 x 16 halves, row-major, two per word: element (r, c) holds r * 16 + c
shared float fc[256];

void main() {
    uint lane = gl_LocalInvocationID.x;
    for (uint i = lane; i < 128u; i += 32u) {
        ha[i] = packHalf2x16(vec2(float(2u * i), float(2u * i + 1u)));
    }
    for (uint i = lane; i < 256u; i += 32u) {
        fc[i] = float(i);
    }
    barrier();
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c;
    coopMatLoad(a, ha, 0u, 8u, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(c, fc, 0u, 16u, gl_CooperativeMatrixLayoutRowMajor);
    uint na = uint(a.length());
    uint nc = uint(c.length());
    for (uint e = 0u; e < 16u; e++) {
        uint va = 0xffffffffu;
        uint vc = 0xffffffffu;
        if (e < na) {
            va = uint(float(a[e]));
        }
        if (e < nc) {
            vc = uint(c[e]);
        }
        o[lane * 16u + e] = va;
        o[512u + lane * 16u + e] = vc;
    }
    if (lane == 0u) {
        o[1024] = na;
        o[1025] = nc;
    }
}
