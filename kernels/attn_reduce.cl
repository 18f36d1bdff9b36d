// Decode attention, reduce phase: combines attn_decode's splits with a log-sum-exp. The OpenCL C twin
// of attn_reduce.comp.
//
// kpc-spec-constant 0 LOCAL_SIZE
// kpc-spec-constant 3 HEAD_DIM
#ifndef LOCAL_SIZE
#define LOCAL_SIZE 64
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif

__attribute__((reqd_work_group_size(LOCAL_SIZE, 1, 1)))
kernel void attn_reduce(global const float *part_o, global const float *part_ml, global float *o,
                        uint splits)
{
    uint bh = get_group_id(0);
    uint first = bh * splits;
    float mx = -3.0e38f;
    for (uint s = 0; s < splits; s++) {
        mx = fmax(mx, part_ml[(first + s) * 2]);
    }
    float l = 0.0f;
    for (uint s = 0; s < splits; s++) {
        l += exp(part_ml[(first + s) * 2] - mx) * part_ml[(first + s) * 2 + 1];
    }
    for (uint d = get_local_id(0); d < HEAD_DIM; d += LOCAL_SIZE) {
        float acc = 0.0f;
        for (uint s = 0; s < splits; s++) {
            acc += exp(part_ml[(first + s) * 2] - mx) * part_o[(first + s) * HEAD_DIM + d];
        }
        o[bh * HEAD_DIM + d] = acc / l;
    }
}
