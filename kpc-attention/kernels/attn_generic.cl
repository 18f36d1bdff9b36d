// Generic attention: the OpenCL C twin of attn_generic.comp (see there): the same buffers in the
// same order, the same scalars (the launch's push-constant bytes), no spec constants. Every shape
// parameter is an argument, so one build per device serves every shape. f16 K and V are read with
// vload_half and written with vstore_half_rte, computed in f32.
#define WG 64
#define MAX_D 256
#define PER (MAX_D / WG)

inline float load_kv(global const uint *buf, uint i, uint f16)
{
    return f16 ? vload_half(i, (global const half *)buf) : as_float(buf[i]);
}

__attribute__((reqd_work_group_size(WG, 1, 1)))
kernel void attn_generic(global const float *q, global uint *k, global uint *v,
                         global float *o, global const float *new_k, global const float *new_v,
                         uint kv_len, uint rows, uint capacity, uint q_heads, uint group,
                         uint head_dim, uint kv_f16, uint append, float scale)
{
    local float qs[MAX_D];
    local float ps[WG];
    local float red[WG];
    uint r = get_group_id(0);
    uint bh = get_group_id(1);
    uint tid = get_local_id(0);
    uint D = head_dim;
    uint b = bh / q_heads;
    uint hq = bh % q_heads;
    uint kv_heads = q_heads / group;
    uint hk = b * kv_heads + hq / group;
    uint base = hk * capacity * D;
    uint fresh_row = hk * D;
    uint visible = kv_len - rows + r + 1;
    uint fresh = append ? kv_len - 1 : 0xffffffffu;
    uint qrow = (bh * rows + r) * D;

    for (uint d = tid; d < D; d += WG) {
        qs[d] = q[qrow + d];
    }
    if (append && hq % group == 0) {
        uint at = base + fresh * D;
        for (uint d = tid; d < D; d += WG) {
            if (kv_f16) {
                vstore_half_rte(new_k[fresh_row + d], at + d, (global half *)k);
                vstore_half_rte(new_v[fresh_row + d], at + d, (global half *)v);
            } else {
                k[at + d] = as_uint(new_k[fresh_row + d]);
                v[at + d] = as_uint(new_v[fresh_row + d]);
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    float m = -3.0e38f;
    float l = 0.0f;
    float acc[PER];
    for (uint t = 0; t < PER; t++) {
        acc[t] = 0.0f;
    }
    for (uint j0 = 0; j0 < visible; j0 += WG) {
        uint j = j0 + tid;
        float sj = -3.0e38f;
        if (j < visible) {
            float dot = 0.0f;
            if (j == fresh) {
                for (uint d = 0; d < D; d++) {
                    dot += qs[d] * new_k[fresh_row + d];
                }
            } else {
                uint row = base + j * D;
                for (uint d = 0; d < D; d++) {
                    dot += qs[d] * load_kv(k, row + d, kv_f16);
                }
            }
            sj = dot * scale;
        }
        red[tid] = sj;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint w = WG / 2; w > 0; w >>= 1) {
            if (tid < w) {
                red[tid] = fmax(red[tid], red[tid + w]);
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        float mn = fmax(m, red[0]);
        barrier(CLK_LOCAL_MEM_FENCE);
        float pj = j < visible ? exp(sj - mn) : 0.0f;
        ps[tid] = pj;
        red[tid] = pj;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint w = WG / 2; w > 0; w >>= 1) {
            if (tid < w) {
                red[tid] += red[tid + w];
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        float corr = exp(m - mn);
        l = l * corr + red[0];
        uint n = min((uint)WG, visible - j0);
        for (uint t = 0; t < PER; t++) {
            uint d = tid + t * WG;
            if (d < D) {
                float a = acc[t] * corr;
                for (uint jj = 0; jj < n; jj++) {
                    uint pos = j0 + jj;
                    float vv = pos == fresh ? new_v[fresh_row + d] : load_kv(v, base + pos * D + d, kv_f16);
                    a += ps[jj] * vv;
                }
                acc[t] = a;
            }
        }
        m = mn;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (uint t = 0; t < PER; t++) {
        uint d = tid + t * WG;
        if (d < D) {
            o[qrow + d] = acc[t] / l;
        }
    }
}
