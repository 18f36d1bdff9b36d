// Decode-time projection of the MultiHeadAttention layer. The OpenCL C twin of mha_gemv.comp: the
// same buffers, scalars and spec-constant ids; ROWS rows of W per work-group, 16-byte loads strided
// over K, a local-memory tree for the sums. f16 weights are read with vload_half8 and computed in f32.
//
// kpc-spec-constant 0 W_F16
// kpc-spec-constant 1 MAX_M
// kpc-spec-constant 2 X_F16
// kpc-spec-constant 3 C_F16
#ifndef W_F16
#define W_F16 0
#endif
#ifndef MAX_M
#define MAX_M 8
#endif

#ifndef X_F16
#define X_F16 0
#endif
#ifndef C_F16
#define C_F16 0
#endif

#define WG 128
#define ROWS 2

// Elements [4 * j, 4 * j + 4) of row mm of X (k per row).
static inline float4 xload(global const uint4 *x, uint mm, uint j, uint k)
{
#if X_F16
    return vload_half4(mm * (k / 4) + j, (global const half *)x);
#else
    return as_float4(x[mm * (k / 4) + j]);
#endif
}

// Writes column col of row mm: f32, or with C_F16 the pair (col, col + 1) as fp16.
static inline void store(global uint *c0, global uint *c1, global uint *c2, uint n, uint n0,
                         uint n1, float alpha0, uint mm, uint col, float y, float y1)
{
    uint seg_n = col < n0 ? n0 : (col < n0 + n1 ? n1 : n - n0 - n1);
    uint at = col < n0 ? col : (col < n0 + n1 ? col - n0 : col - n0 - n1);
    float s = col < n0 ? alpha0 : 1.0f;
    global uint *c = col < n0 ? c0 : (col < n0 + n1 ? c1 : c2);
    uint i = mm * seg_n + at;
#if C_F16
    vstore_half2_rte((float2)(y * s, y1 * s), i / 2, (global half *)c);
#else
    c[i] = as_uint(y * s);
#endif
}

__attribute__((reqd_work_group_size(WG, 1, 1)))
kernel void mha_gemv(global const uint4 *x, global const uint4 *w, global const float *bias,
                     global uint *c0, global uint *c1, global uint *c2,
                     uint m, uint n, uint k, uint n0, uint n1, float alpha0)
{
    local float red[ROWS * MAX_M][WG];
    uint tid = get_local_id(0);
    uint first = get_group_id(0) * ROWS;
    uint per = W_F16 ? 8 : 4;
    uint words = k / per;
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
                    acc[r * MAX_M + mm] += dot(f.lo, xload(x, mm, 2 * c, k))
                        + dot(f.hi, xload(x, mm, 2 * c + 1, k));
                }
            }
#else
            float4 f = as_float4(w[row * words + c]);
            for (uint mm = 0; mm < MAX_M; mm++) {
                if (mm < m) {
                    acc[r * MAX_M + mm] += dot(f, xload(x, mm, c, k));
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
#if C_F16
            if (r == 0) {
                store(c0, c1, c2, n, n0, n1, alpha0, mm, col, y, red[MAX_M + mm][0] + bias[col + 1]);
            }
#else
            store(c0, c1, c2, n, n0, n1, alpha0, mm, col, y, 0.0f);
#endif
        }
    }
}
