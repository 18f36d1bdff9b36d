// Converts activations between f32 and fp16 on the device, two elements per invocation (an fp16
// tensor holds an even number of elements; the host checks): the layer's fp16 inputs into its f32
// projections, and its f32 results into fp16 outputs. fp16 is written with packHalf2x16.
#version 450

layout(local_size_x = 256) in;
layout(constant_id = 0) const uint TO_F16 = 0;  // 1: f32 -> fp16, 0: fp16 -> f32

layout(std430, set = 0, binding = 0) readonly buffer Src { uint src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform Params {
    uint pairs;  // elements / 2
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < p.pairs; i += stride) {
        if (TO_F16 != 0u) {
            dst[i] = packHalf2x16(vec2(uintBitsToFloat(src[2u * i]), uintBitsToFloat(src[2u * i + 1u])));
        } else {
            vec2 v = unpackHalf2x16(src[i]);
            dst[2u * i] = floatBitsToUint(v.x);
            dst[2u * i + 1u] = floatBitsToUint(v.y);
        }
    }
}
