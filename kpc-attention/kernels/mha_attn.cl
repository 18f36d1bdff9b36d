// Attention with an additive mask for the MultiHeadAttention layer. The OpenCL C twin of
// mha_attn.comp: the same buffers, scalars and spec-constant ids, the same blocks of 64 keys with an
// online softmax, the same rule for masks (-inf masks a key, finite values are added, a row whose
// every visible key is -inf gives zeros). f16 K and V are read with vload_half.
//
// kpc-spec-constant 2 KV_F16
// kpc-spec-constant 3 HEAD_DIM
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

#define WG 64
#define PER ((HEAD_DIM + WG - 1) / WG)

__attribute__((reqd_work_group_size(WG, 1, 1)))
kernel void mha_attn(global const float *q, global const uint *k, global const uint *v,
                     global const float *mask, global float *o,
                     uint q_len, uint kv_len, uint capacity, uint q_heads, uint group, float scale,
                     uint causal, uint mask_mode)
{
    local float qs[HEAD_DIM];
    local float ps[WG];
    local float red[WG];
    uint tid = get_local_id(0);
    uint i = get_group_id(0);
    uint bh = get_group_id(1);
    uint hq = bh % q_heads;
    uint b = bh / q_heads;
    uint kv_heads = q_heads / group;
    uint base = (b * kv_heads + hq / group) * capacity * HEAD_DIM;
    uint q_row = (bh * q_len + i) * HEAD_DIM;
    uint visible = causal ? kv_len - q_len + i + 1 : kv_len;
    uint mask_row = mask_mode == 2 ? (hq * q_len + i) * kv_len : i * kv_len;

    for (uint d = tid; d < HEAD_DIM; d += WG) {
        qs[d] = q[q_row + d];
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    float m = -INFINITY; // the running maximum: -inf until a key with a finite logit is seen
    float l = 0.0f;
    float acc[PER];
    for (uint e = 0; e < PER; e++) {
        acc[e] = 0.0f;
    }
    for (uint j0 = 0; j0 < visible; j0 += WG) {
        uint j = j0 + tid;
        float s = -INFINITY;
        if (j < visible) {
            float dot_ = 0.0f;
            for (uint d = 0; d < HEAD_DIM; d++) {
                dot_ += qs[d] * LOAD(k, base + j * HEAD_DIM + d);
            }
            s = dot_ * scale;
            if (mask_mode != 0) {
                s += mask[mask_row + j];
            }
        }
        red[tid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint h = WG / 2; h > 0; h >>= 1) {
            if (tid < h) {
                red[tid] = fmax(red[tid], red[tid + h]);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        float m_new = fmax(m, red[0]);
        barrier(CLK_LOCAL_MEM_FENCE);
        // Every key so far masked: no weight, nothing to rescale (exp(-inf - -inf) is NaN).
        bool none = m_new == -INFINITY;
        float pj = none ? 0.0f : exp(s - m_new);
        ps[tid] = pj;
        red[tid] = pj;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint h = WG / 2; h > 0; h >>= 1) {
            if (tid < h) {
                red[tid] += red[tid + h];
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        float corr = none ? 1.0f : exp(m - m_new);
        l = l * corr + red[0];
        m = m_new;
        uint cnt = min((uint)WG, visible - j0);
        for (uint e = 0; e < PER; e++) {
            uint d = tid + WG * e;
            if (d < HEAD_DIM) {
                float sum = acc[e] * corr;
                for (uint c = 0; c < cnt; c++) {
                    sum += ps[c] * LOAD(v, base + (j0 + c) * HEAD_DIM + d);
                }
                acc[e] = sum;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (uint e = 0; e < PER; e++) {
        uint d = tid + WG * e;
        if (d < HEAD_DIM) {
            o[q_row + d] = l > 0.0f ? acc[e] / l : 0.0f;
        }
    }
}
