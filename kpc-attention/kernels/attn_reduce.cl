// Decode attention, reduce phase: combines the splits with a log-sum-exp. The OpenCL C twin of
// attn_reduce.comp (read its header for the design).
//
// kpc-spec-constant 0 LOCAL_SIZE
// kpc-spec-constant 3 HEAD_DIM
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 256
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#define SLICES (LOCAL_SIZE / 32)
#define PER_LANE ((HEAD_DIM + 31) / 32)
#define W_CACHED 1024

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void attn_reduce(global const float *part_o, global const float *part_ml, global float *o,
                        uint splits)
{
    local float w[W_CACHED];
    local float red[LOCAL_SIZE];
    local float part[SLICES * HEAD_DIM];
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

    uint slice = tid / 32;
    uint lane = tid % 32;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (uint s = slice; s < splits; s += SLICES) {
        float wt = s < W_CACHED ? w[s] : exp(part_ml[(first + s) * 2] - mx);
#pragma unroll
        for (uint i = 0; i < PER_LANE; i++) {
            uint d = lane + 32 * i;
            if (d < HEAD_DIM) {
                acc[i] += wt * part_o[(first + s) * HEAD_DIM + d];
            }
        }
    }
#pragma unroll
    for (uint i = 0; i < PER_LANE; i++) {
        uint d = lane + 32 * i;
        if (d < HEAD_DIM) {
            part[slice * HEAD_DIM + d] = acc[i];
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint d = tid; d < HEAD_DIM; d += LOCAL_SIZE) {
        float sum = 0.0f;
        for (uint t = 0; t < SLICES; t++) {
            sum += part[t * HEAD_DIM + d];
        }
        o[bh * HEAD_DIM + d] = sum / l;
    }
}
