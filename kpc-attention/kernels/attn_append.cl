// KV-cache append on the device. The OpenCL C twin of attn_append.comp: the same buffers, scalars and
// spec-constant ids. f16 is written with vstore_half2_rte (round to nearest even, as the host's
// conversion rounds).
//
// kpc-spec-constant 0 LOCAL_SIZE
// kpc-spec-constant 2 KV_F16
// kpc-spec-constant 3 HEAD_DIM
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 64
#endif
#ifndef KV_F16
#define KV_F16 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void attn_append(global const float2 *new_k, global const float2 *new_v, global uint *k,
                        global uint *v, uint pos, uint rows, uint capacity, uint pairs)
{
    const uint half_d = HEAD_DIM / 2;
    uint stride = get_num_groups(0) * LOCAL_SIZE;
    for (uint i = get_global_id(0); i < pairs; i += stride) {
        uint e = i % half_d;
        uint r = (i / half_d) % rows;
        uint bh = i / (half_d * rows);
        uint row = bh * capacity + pos + r;
        float2 kk = new_k[i];
        float2 vv = new_v[i];
#if KV_F16
        vstore_half2_rte(kk, row * half_d + e, (global half *)k);
        vstore_half2_rte(vv, row * half_d + e, (global half *)v);
#else
        vstore2(kk, row * half_d + e, (global float *)k);
        vstore2(vv, row * half_d + e, (global float *)v);
#endif
    }
}
