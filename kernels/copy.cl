// Device-to-device copy, 16 bytes per element: dst[i] = src[i]. The OpenCL C twin of copy.comp.
//
// Measures the device's copy bandwidth (attention compares decode bandwidth against it). A grid-stride
// loop lets one launch of any number of workgroups cover any buffer size.
//
// kpc-spec-constant 0 LOCAL_SIZE u32
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 256
#endif

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void copy(global const uint4 *src, global uint4 *dst, uint n)
{
    uint stride = get_num_groups(0) * LOCAL_SIZE;
    for (uint i = get_global_id(0); i < n; i += stride) {
        dst[i] = src[i];
    }
}
