// Ceiling of the matrix units through workgroup-scope matrices (VK_NV_cooperative_matrix2), for
// `kpc bench-mma`: the workgroup owns a WM x WK fp16 A, a WK x WN fp16 B (loaded once from `src`)
// and a WM x WN accumulator, and repeats C = A B + C `iters` times; the driver decides how the
// matrices are split over the subgroups. ACC_F16 picks an fp16 accumulator (else fp32). Work per
// launch: groups x iters x 2 WM WN WK flops. C is written to `out_` (every workgroup to the same
// place: only the timing matters) so that nothing is optimized away.
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x = 256, local_size_x_id = 0) in;
layout(constant_id = 1) const bool ACC_F16 = false;
layout(constant_id = 2) const uint WM = 128;
layout(constant_id = 3) const uint WN = 128;
layout(constant_id = 4) const uint WK = 32;

layout(std430, set = 0, binding = 0) readonly buffer In { float16_t src[]; };  // >= WK max(WM, WN)
layout(std430, set = 0, binding = 1) writeonly buffer Out { float out_[]; };    // >= WM WN

layout(push_constant) uniform Params {
    uint iters;
} p;

void main() {
    coopmat<float16_t, gl_ScopeWorkgroup, WM, WK, gl_MatrixUseA> a;
    coopmat<float16_t, gl_ScopeWorkgroup, WK, WN, gl_MatrixUseB> b;
    coopMatLoad(a, src, 0, WK, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(b, src, 0, WN, gl_CooperativeMatrixLayoutRowMajor);
    if (ACC_F16) {
        coopmat<float16_t, gl_ScopeWorkgroup, WM, WN, gl_MatrixUseAccumulator> c =
            coopmat<float16_t, gl_ScopeWorkgroup, WM, WN, gl_MatrixUseAccumulator>(0.0);
        for (uint it = 0u; it < p.iters; it++) {
            c = coopMatMulAdd(a, b, c);
        }
        coopmat<float, gl_ScopeWorkgroup, WM, WN, gl_MatrixUseAccumulator> f =
            coopmat<float, gl_ScopeWorkgroup, WM, WN, gl_MatrixUseAccumulator>(c);
        coopMatStore(f, out_, 0, WN, gl_CooperativeMatrixLayoutRowMajor);
    } else {
        coopmat<float, gl_ScopeWorkgroup, WM, WN, gl_MatrixUseAccumulator> c =
            coopmat<float, gl_ScopeWorkgroup, WM, WN, gl_MatrixUseAccumulator>(0.0);
        for (uint it = 0u; it < p.iters; it++) {
            c = coopMatMulAdd(a, b, c);
        }
        coopMatStore(c, out_, 0, WN, gl_CooperativeMatrixLayoutRowMajor);
    }
}
