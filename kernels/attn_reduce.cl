// Decode attention, reduce phase: combines the splits with a log-sum-exp. The OpenCL C twin of
// attn_reduce.comp (read its header for the design).
//
// kpc-spec-constant 0 LOCAL_SIZE
// kpc-spec-constant 3 HEAD_DIM
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 64
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#define W_CACHED 1024

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void attn_reduce(global const float *part_o, global const float *part_ml, global float *o,
                        uint splits)
{
    local float w[W_CACHED];
    local float red[LOCAL_SIZE];
    uint tid = get_local_id(0);
    uint bh = get_group_id(0);
    uint first = bh * splits;

    float mx = -3.0e38f;
    for (uint s = tid; s < splits; s += LOCAL_SIZE) {
        mx = fmax(mx, part_ml[(first + s) * 2]);
    }
    red[tid] = mx;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint h = LOCAL_SIZE / 2; h > 0; h >>= 1) {
        if (tid < h) {
            red[tid] = fmax(red[tid], red[tid + h]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    mx = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);

    float l = 0.0f;
    for (uint s = tid; s < splits; s += LOCAL_SIZE) {
        float e = exp(part_ml[(first + s) * 2] - mx);
        if (s < W_CACHED) {
            w[s] = e;
        }
        l += e * part_ml[(first + s) * 2 + 1];
    }
    red[tid] = l;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint h = LOCAL_SIZE / 2; h > 0; h >>= 1) {
        if (tid < h) {
            red[tid] += red[tid + h];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    l = red[0];

    for (uint d = tid; d < HEAD_DIM; d += LOCAL_SIZE) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        uint s = 0;
        for (; s + 4 <= splits; s += 4) {
#pragma unroll
            for (uint k = 0; k < 4; k++) {
                uint t = s + k;
                float wt = t < W_CACHED ? w[t] : exp(part_ml[(first + t) * 2] - mx);
                acc[k] += wt * part_o[(first + t) * HEAD_DIM + d];
            }
        }
        for (; s < splits; s++) {
            float wt = s < W_CACHED ? w[s] : exp(part_ml[(first + s) * 2] - mx);
            acc[0] += wt * part_o[(first + s) * HEAD_DIM + d];
        }
        o[bh * HEAD_DIM + d] = (acc[0] + acc[1] + acc[2] + acc[3]) / l;
    }
}
