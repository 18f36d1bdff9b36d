// Decode-time projection of the MultiHeadAttention layer. The OpenCL C twin of mha_gemv.comp: the
// same buffers, scalars and spec-constant ids; ROWS rows of W per work-group, 16-byte loads strided
// over K, a local-memory tree for the sums. f16 weights are read with vload_half8 and computed in f32.
//
// kpc-spec-constant 0 W_F16
// kpc-spec-constant 1 MAX_M
#ifndef W_F16
#define W_F16 0
#endif
#ifndef MAX_M
#define MAX_M 8
#endif

#define WG 128
#define ROWS 2

__attribute__((reqd_work_group_size(WG, 1, 1)))
kernel void mha_gemv(global const float4 *x, global const uint4 *w, global const float *bias,
                     global float *c0, global float *c1, global float *c2,
                     uint m, uint n, uint k, uint n0, uint n1, float alpha0)
{
    local float red[ROWS * MAX_M][WG];
    uint tid = get_local_id(0);
    uint first = get_group_id(0) * ROWS;
    uint per = W_F16 ? 8 : 4;
    uint words = k / per;
    uint xw = k / 4;
    float acc[ROWS * MAX_M];
    for (uint i = 0; i < ROWS * MAX_M; i++) {
        acc[i] = 0.0f;
    }
    for (uint r = 0; r < ROWS; r++) {
        uint row = first + r;
        if (row >= n) {
            break;
        }
        for (uint c = tid; c < words; c += WG) {
#if W_F16
            float8 f = vload_half8(row * words + c, (global const half *)w);
            for (uint mm = 0; mm < MAX_M; mm++) {
                if (mm < m) {
                    acc[r * MAX_M + mm] += dot(f.lo, x[mm * xw + 2 * c])
                        + dot(f.hi, x[mm * xw + 2 * c + 1]);
                }
            }
#else
            float4 f = as_float4(w[row * words + c]);
            for (uint mm = 0; mm < MAX_M; mm++) {
                if (mm < m) {
                    acc[r * MAX_M + mm] += dot(f, x[mm * xw + c]);
                }
            }
#endif
        }
    }
    for (uint i = 0; i < ROWS * MAX_M; i++) {
        red[i][tid] = acc[i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint h = WG / 2; h > 0; h >>= 1) {
        if (tid < h) {
            for (uint i = 0; i < ROWS * MAX_M; i++) {
                red[i][tid] += red[i][tid + h];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (tid < ROWS * MAX_M) {
        uint r = tid / MAX_M;
        uint mm = tid % MAX_M;
        uint col = first + r;
        if (col < n && mm < m) {
            float y = red[tid][0] + bias[col];
            if (col < n0) {
                c0[mm * n0 + col] = y * alpha0;
            } else if (col < n0 + n1) {
                c1[mm * n1 + col - n0] = y;
            } else {
                c2[mm * (n - n0 - n1) + col - n0 - n1] = y;
            }
        }
    }
}
