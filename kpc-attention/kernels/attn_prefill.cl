// Causal prefill attention, tiled with an online softmax. The OpenCL C twin of attn_prefill.comp: the
// same buffers and scalars in the same order, the same spec-constant ids.
//
// kpc-spec-constant 0 LOCAL_SIZE
// kpc-spec-constant 2 KV_F16
// kpc-spec-constant 3 HEAD_DIM
// kpc-spec-constant 4 BLOCK_Q
// kpc-spec-constant 5 BLOCK_K
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 64
#endif
#ifndef KV_F16
#define KV_F16 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_Q
#define BLOCK_Q 8
#endif
#ifndef BLOCK_K
#define BLOCK_K 32
#endif

#if KV_F16
#define LOAD(buf, i) vload_half((i), (global const half *)(buf))
#else
#define LOAD(buf, i) as_float((buf)[(i)])
#endif

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void attn_prefill(global const float *q, global const uint *k, global const uint *v,
                         global float *o,
                         uint q_len, uint kv_len, uint capacity, uint q_heads, uint group,
                         float scale)
{
    local float qs[BLOCK_Q * HEAD_DIM];
    local float os[BLOCK_Q * HEAD_DIM];
    local float ss[BLOCK_Q * BLOCK_K];
    local float ms[BLOCK_Q];
    local float ls[BLOCK_Q];
    local float alphas[BLOCK_Q];
    uint tid = get_local_id(0);
    uint bh = get_group_id(1);
    uint b = bh / q_heads;
    uint hq = bh % q_heads;
    uint kv_heads = q_heads / group;
    uint base = (b * kv_heads + hq / group) * capacity * HEAD_DIM;
    uint q0 = get_group_id(0) * BLOCK_Q;
    uint rows = min((uint)BLOCK_Q, q_len - q0);
    uint offset = kv_len - q_len;
    uint q_base = (bh * q_len + q0) * HEAD_DIM;

    for (uint i = tid; i < BLOCK_Q * HEAD_DIM; i += LOCAL_SIZE) {
        qs[i] = i < rows * HEAD_DIM ? q[q_base + i] : 0.0f;
        os[i] = 0.0f;
    }
    for (uint r = tid; r < BLOCK_Q; r += LOCAL_SIZE) {
        ms[r] = -3.0e38f;
        ls[r] = 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    uint visible = offset + q0 + rows;
    for (uint j0 = 0; j0 < visible; j0 += BLOCK_K) {
        uint cols = min((uint)BLOCK_K, visible - j0);
        for (uint i = tid; i < BLOCK_Q * BLOCK_K; i += LOCAL_SIZE) {
            uint r = i / BLOCK_K;
            uint c = i % BLOCK_K;
            uint j = j0 + c;
            float sc = -3.0e38f;
            if (r < rows && c < cols && j <= offset + q0 + r) {
                uint row = base + j * HEAD_DIM;
                float dot = 0.0f;
                for (uint d = 0; d < HEAD_DIM; d++) {
                    dot += qs[r * HEAD_DIM + d] * LOAD(k, row + d);
                }
                sc = dot * scale;
            }
            ss[i] = sc;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint r = tid; r < BLOCK_Q; r += LOCAL_SIZE) {
            float m_old = ms[r];
            float m_new = m_old;
            for (uint c = 0; c < cols; c++) {
                m_new = fmax(m_new, ss[r * BLOCK_K + c]);
            }
            float sum = 0.0f;
            for (uint c = 0; c < cols; c++) {
                float e = exp(ss[r * BLOCK_K + c] - m_new);
                ss[r * BLOCK_K + c] = e;
                sum += e;
            }
            float alpha = exp(m_old - m_new);
            alphas[r] = alpha;
            ls[r] = ls[r] * alpha + sum;
            ms[r] = m_new;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint i = tid; i < BLOCK_Q * HEAD_DIM; i += LOCAL_SIZE) {
            uint r = i / HEAD_DIM;
            uint d = i % HEAD_DIM;
            float acc = os[i] * alphas[r];
            for (uint c = 0; c < cols; c++) {
                acc += ss[r * BLOCK_K + c] * LOAD(v, base + (j0 + c) * HEAD_DIM + d);
            }
            os[i] = acc;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (uint i = tid; i < rows * HEAD_DIM; i += LOCAL_SIZE) {
        o[q_base + i] = os[i] / ls[i / HEAD_DIM];
    }
}
