// saxpy with a bias: out[i] = a * x[i] + y[i] + BIAS.
//
// kpc's smallest test kernel. BIAS is a specialization constant so that two spec-constant values give
// two pipelines with observably different results; the workgroup size is one too (LOCAL_SIZE), so a
// build that asks for more invocations than the device allows fails deterministically.
#version 450

layout(local_size_x = 64, local_size_x_id = 0) in;  // LOCAL_SIZE
layout(constant_id = 1) const int BIAS = 0;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Y { float y[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { float result[]; };

layout(push_constant) uniform Params {
    uint n;     // elements
    float a;    // scale of x
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n) {
        result[i] = p.a * x[i] + y[i] + float(BIAS);
    }
}
