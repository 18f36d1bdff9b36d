// Decode attention, split phase (flash-decoding). The OpenCL C twin of attn_decode.comp: the same
// buffers in the same order, the same scalars (the launch's push-constant bytes), the same spec-constant
// ids. f16 K and V are read with vload_half and computed in f32 (no fp16 arithmetic needed).
//
// kpc-spec-constant 0 LOCAL_SIZE
// kpc-spec-constant 1 CHUNK
// kpc-spec-constant 2 KV_F16
// kpc-spec-constant 3 HEAD_DIM
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 64
#endif
#ifndef CHUNK
#define CHUNK 256
#endif
#ifndef KV_F16
#define KV_F16 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif

#if KV_F16
#define LOAD(buf, i) vload_half((i), (global const half *)(buf))
#else
#define LOAD(buf, i) as_float((buf)[(i)])
#endif

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void attn_decode(global const float *q, global const uint *k, global const uint *v,
                        global float *part_o, global float *part_ml,
                        uint kv_len, uint capacity, uint q_heads, uint group, float scale)
{
    local float qs[HEAD_DIM];
    local float s[CHUNK];
    local float red[LOCAL_SIZE];
    uint split = get_group_id(0);
    uint splits = get_num_groups(0);
    uint bh = get_group_id(1);
    uint tid = get_local_id(0);
    uint b = bh / q_heads;
    uint hq = bh % q_heads;
    uint kv_heads = q_heads / group;
    uint base = (b * kv_heads + hq / group) * capacity * HEAD_DIM;
    uint j0 = split * CHUNK;
    uint n = min((uint)CHUNK, kv_len - j0);

    for (uint d = tid; d < HEAD_DIM; d += LOCAL_SIZE) {
        qs[d] = q[bh * HEAD_DIM + d];
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    float m = -3.0e38f;
    for (uint j = tid; j < n; j += LOCAL_SIZE) {
        uint row = base + (j0 + j) * HEAD_DIM;
        float dot = 0.0f;
        for (uint d = 0; d < HEAD_DIM; d++) {
            dot += qs[d] * LOAD(k, row + d);
        }
        s[j] = dot * scale;
        m = fmax(m, s[j]);
    }
    red[tid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = LOCAL_SIZE / 2; w > 0; w >>= 1) {
        if (tid < w) {
            red[tid] = fmax(red[tid], red[tid + w]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);

    float l = 0.0f;
    for (uint j = tid; j < n; j += LOCAL_SIZE) {
        float e = exp(s[j] - m);
        s[j] = e;
        l += e;
    }
    red[tid] = l;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint w = LOCAL_SIZE / 2; w > 0; w >>= 1) {
        if (tid < w) {
            red[tid] += red[tid + w];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    l = red[0];

    uint slot = bh * splits + split;
    for (uint d = tid; d < HEAD_DIM; d += LOCAL_SIZE) {
        float acc = 0.0f;
        for (uint j = 0; j < n; j++) {
            acc += s[j] * LOAD(v, base + (j0 + j) * HEAD_DIM + d);
        }
        part_o[slot * HEAD_DIM + d] = acc;
    }
    if (tid == 0) {
        part_ml[slot * 2] = m;
        part_ml[slot * 2 + 1] = l;
    }
}
