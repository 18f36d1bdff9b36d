// Device-to-device copy, 16 bytes per element: dst[i] = src[i].
//
// Measures the device's copy bandwidth (attention compares decode bandwidth against it). A grid-stride
// loop lets one dispatch of at most maxComputeWorkGroupCount groups cover any buffer size.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in; // LOCAL_SIZE

layout(std430, set = 0, binding = 0) readonly buffer Src { uvec4 src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Dst { uvec4 dst[]; };

layout(push_constant) uniform Params {
    uint n;     // uvec4 elements to copy
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        dst[i] = src[i];
    }
}
