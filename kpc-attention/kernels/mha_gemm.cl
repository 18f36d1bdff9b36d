// Projection GEMM of the MultiHeadAttention layer. The OpenCL C twin of mha_gemm.comp: the same
// buffers, scalars and spec-constant ids, the same tiles (64 x 64 outputs, 256 work-items each
// computing 4 x 4, K in steps of 16 through local memory). f16 weights are read with vload_half and
// computed in f32 (no cl_khr_fp16 needed).
//
// kpc-spec-constant 0 W_F16
#ifndef W_F16
#define W_F16 0
#endif

#if W_F16
#define LOAD_W(i) vload_half((i), (global const half *)w)
#else
#define LOAD_W(i) as_float(w[(i)])
#endif

#define TM 64
#define TN 64
#define TK 16

uint split_at(uint row, uint col, uint width, uint seq, uint head_dim)
{
    if (seq == 0) {
        return row * width + col;
    }
    uint heads = width / head_dim;
    return (((row / seq) * heads + col / head_dim) * seq + row % seq) * head_dim + col % head_dim;
}

__attribute__((reqd_work_group_size(256, 1, 1)))
kernel void mha_gemm(global const float *a, global const uint *w, global const float *bias,
                     global float *c0, global float *c1, global float *c2,
                     uint m, uint n, uint k, uint n0, uint n1, uint a_seq, uint c_seq,
                     uint head_dim, float alpha0)
{
    local float as_[TK][TM + 1];
    local float ws[TK][TN + 1];
    uint tid = get_local_id(0);
    uint tx = tid % 16;
    uint ty = tid / 16;
    uint m0 = get_group_id(1) * TM;
    uint col0 = get_group_id(0) * TN;
    float acc[4][4];
    for (uint i = 0; i < 4; i++) {
        for (uint j = 0; j < 4; j++) {
            acc[i][j] = 0.0f;
        }
    }
    for (uint k0 = 0; k0 < k; k0 += TK) {
        for (uint r = 0; r < 4; r++) {
            uint e = tid + 256 * r;
            uint row = e / TK;
            uint kk = e % TK;
            uint gk = k0 + kk;
            uint gm = m0 + row;
            as_[kk][row] = (gm < m && gk < k) ? a[split_at(gm, gk, k, a_seq, head_dim)] : 0.0f;
            uint gn = col0 + row;
            ws[kk][row] = (gn < n && gk < k) ? LOAD_W(gn * k + gk) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint kk = 0; kk < TK; kk++) {
            float av[4];
            float wv[4];
            for (uint i = 0; i < 4; i++) {
                av[i] = as_[kk][ty + 16 * i];
                wv[i] = ws[kk][tx + 16 * i];
            }
            for (uint i = 0; i < 4; i++) {
                for (uint j = 0; j < 4; j++) {
                    acc[i][j] += av[i] * wv[j];
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (uint i = 0; i < 4; i++) {
        uint gm = m0 + ty + 16 * i;
        if (gm >= m) {
            continue;
        }
        for (uint j = 0; j < 4; j++) {
            uint gn = col0 + tx + 16 * j;
            if (gn >= n) {
                continue;
            }
            float y = acc[i][j] + bias[gn];
            if (gn < n0) {
                c0[split_at(gm, gn, n0, c_seq, head_dim)] = y * alpha0;
            } else if (gn < n0 + n1) {
                c1[split_at(gm, gn - n0, n1, c_seq, head_dim)] = y;
            } else {
                c2[split_at(gm, gn - n0 - n1, n - n0 - n1, c_seq, head_dim)] = y;
            }
        }
    }
}
