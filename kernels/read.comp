// Device read, 16 bytes per element: each workgroup XORs the elements its invocations stride over
// and writes the result to dst[workgroup], so the XOR of dst is the XOR of src (what the tests
// check), and the kernel moves almost nothing but reads.
//
// Measures how fast the device reads a given number of bytes: the floor of a kernel that only
// reads them, such as a decode step reading its K and V (copy.comp moves half its bytes each way).
// A grid-stride loop lets one dispatch of at most maxComputeWorkGroupCount groups cover any size.
#version 450
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256, local_size_x_id = 0) in; // LOCAL_SIZE, a power of two

layout(std430, set = 0, binding = 0) readonly buffer Src { uvec4 src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Dst { uvec4 dst[]; };  // one per workgroup

layout(push_constant) uniform Params {
    uint n;     // uvec4 elements to read
} p;

shared uvec4 red[gl_WorkGroupSize.x];

void main() {
    // Four loads in flight per invocation before any is used: a grid of n / (4 * LOCAL_SIZE)
    // groups then reads everything in one trip.
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uvec4 x = uvec4(0u);
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += 4u * stride) {
        uvec4 y[4];
        [[unroll]] for (uint u = 0u; u < 4u; u++) {
            uint at = i + u * stride;
            y[u] = at < p.n ? src[at] : uvec4(0u);
        }
        x ^= (y[0] ^ y[1]) ^ (y[2] ^ y[3]);
    }
    uint tid = gl_LocalInvocationID.x;
    red[tid] = x;
    barrier();
    for (uint h = gl_WorkGroupSize.x / 2u; h > 0u; h >>= 1) {
        if (tid < h) {
            red[tid] ^= red[tid + h];
        }
        barrier();
    }
    if (tid == 0u) {
        dst[gl_WorkGroupID.x] = red[0];
    }
}
