// Converts activations between f32 and fp16. The OpenCL C twin of mha_cast.comp: the same buffers,
// scalar and spec-constant id; fp16 is written with vstore_half2_rte (round to nearest even).
//
// kpc-spec-constant 0 TO_F16
#ifndef TO_F16
#define TO_F16 0
#endif

__attribute__((reqd_work_group_size(256, 1, 1)))
kernel void mha_cast(global const uint *src, global uint *dst, uint pairs)
{
    uint stride = get_num_groups(0) * 256;
    for (uint i = get_global_id(0); i < pairs; i += stride) {
#if TO_F16
        vstore_half2_rte(vload2(i, (global const float *)src), i, (global half *)dst);
#else
        vstore2(vload_half2(i, (global const half *)src), i, (global float *)dst);
#endif
    }
}
