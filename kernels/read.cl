// Device read, 16 bytes per element: each workgroup XORs the elements its invocations stride over
// and writes the result to dst[workgroup]. The OpenCL C twin of read.comp.
//
// Measures how fast the device reads a given number of bytes: the floor of a kernel that only
// reads them, such as a decode step reading its K and V (copy moves half its bytes each way).
//
// kpc-spec-constant 0 LOCAL_SIZE u32
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 256
#endif

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void read(global const uint4 *src, global uint4 *dst, uint n)
{
    local uint4 red[LOCAL_SIZE];
    // Four loads in flight per invocation before any is used: a grid of n / (4 * LOCAL_SIZE)
    // groups then reads everything in one trip.
    uint stride = get_num_groups(0) * LOCAL_SIZE;
    uint4 x = (uint4)(0);
    for (uint i = get_global_id(0); i < n; i += 4 * stride) {
        uint4 y[4];
#pragma unroll
        for (uint u = 0; u < 4; u++) {
            uint at = i + u * stride;
            y[u] = at < n ? src[at] : (uint4)(0);
        }
        x ^= (y[0] ^ y[1]) ^ (y[2] ^ y[3]);
    }
    uint tid = get_local_id(0);
    red[tid] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint h = LOCAL_SIZE / 2; h > 0; h >>= 1) {
        if (tid < h) {
            red[tid] ^= red[tid + h];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (tid == 0) {
        dst[get_group_id(0)] = red[0];
    }
}
