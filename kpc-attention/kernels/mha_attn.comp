// Attention with an additive mask for the MultiHeadAttention layer: what kpc's causal kernels do not
// take. One workgroup per (query row, batch * query head); keys in blocks of 64, one key per
// invocation for the scores, an online softmax across blocks, and each invocation accumulating
// HEAD_DIM / 64 output elements.
//
// logit(i, j) = q_i . k_j * scale + mask(i, j), where the mask is absent (mode 0), one [q_len][kv_len]
// matrix shared by every head and sequence (mode 1), or one per query head [Hq][q_len][kv_len]
// (mode 2), as ncnn's attn_mask input. With `causal`, query i sits at position kv_len - q_len + i and
// sees keys up to it. A mask value of -inf masks its key; finite values are added as they are (a row
// whose keys all get the same huge negative value, -1e30 or -FLT_MAX, is a softmax of equal logits:
// uniform weights). A row whose every visible key is -inf attends to nothing and gives zeros. The
// running maximum starts at -inf and weights stay 0 while it is -inf, so no finite value is mistaken
// for "masked".
//
// Q and O are [B][Hq][q_len][D] f32; K and V the KV cache, [B][Hkv][capacity][D], f32 or (KV_F16)
// packed f16 pairs. Query head h reads KV head h / group.
#version 450

layout(local_size_x = 64) in;
layout(constant_id = 2) const uint KV_F16 = 0;      // 1: K and V are f16
layout(constant_id = 3) const uint HEAD_DIM = 128;  // D, at most 256

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { uint k[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { uint v[]; };
layout(std430, set = 0, binding = 3) readonly buffer Mask { float mask[]; };
layout(std430, set = 0, binding = 4) writeonly buffer O { float o[]; };

layout(push_constant) uniform Params {
    uint q_len;
    uint kv_len;
    uint capacity;   // positions per head in the cache
    uint q_heads;
    uint group;      // Hq / Hkv
    float scale;
    uint causal;     // 1: query i sees keys up to kv_len - q_len + i
    uint mask_mode;  // 0 none, 1 [q_len][kv_len], 2 [Hq][q_len][kv_len]
} p;

const uint WG = 64u;
const uint PER = (HEAD_DIM + WG - 1u) / WG;
shared float qs[HEAD_DIM];
shared float ps[WG];
shared float red[WG];

float load_kv(bool is_k, uint i) {
    uint word = is_k ? k[KV_F16 != 0u ? i >> 1 : i] : v[KV_F16 != 0u ? i >> 1 : i];
    if (KV_F16 != 0u) {
        vec2 h = unpackHalf2x16(word);
        return (i & 1u) == 0u ? h.x : h.y;
    }
    return uintBitsToFloat(word);
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint i = gl_WorkGroupID.x;
    uint bh = gl_WorkGroupID.y;
    uint hq = bh % p.q_heads;
    uint b = bh / p.q_heads;
    uint kv_heads = p.q_heads / p.group;
    uint base = (b * kv_heads + hq / p.group) * p.capacity * HEAD_DIM;
    uint q_row = (bh * p.q_len + i) * HEAD_DIM;
    uint visible = p.causal != 0u ? p.kv_len - p.q_len + i + 1u : p.kv_len;
    uint mask_row = p.mask_mode == 2u ? (hq * p.q_len + i) * p.kv_len : i * p.kv_len;

    for (uint d = tid; d < HEAD_DIM; d += WG) {
        qs[d] = q[q_row + d];
    }
    barrier();

    float neg_inf = uintBitsToFloat(0xff800000u);
    float m = neg_inf;  // the running maximum: -inf until a key with a finite logit is seen
    float l = 0.0;
    float acc[PER];
    for (uint e = 0u; e < PER; e++) {
        acc[e] = 0.0;
    }
    for (uint j0 = 0u; j0 < visible; j0 += WG) {
        uint j = j0 + tid;
        float s = neg_inf;
        if (j < visible) {
            float dot_ = 0.0;
            for (uint d = 0u; d < HEAD_DIM; d++) {
                dot_ += qs[d] * load_kv(true, base + j * HEAD_DIM + d);
            }
            s = dot_ * p.scale;
            if (p.mask_mode != 0u) {
                s += mask[mask_row + j];
            }
        }
        red[tid] = s;
        barrier();
        for (uint h = WG / 2u; h > 0u; h >>= 1) {
            if (tid < h) {
                red[tid] = max(red[tid], red[tid + h]);
            }
            barrier();
        }
        float m_new = max(m, red[0]);
        barrier();
        // Every key so far masked: no weight, nothing to rescale (exp(-inf - -inf) is NaN).
        bool none = m_new == neg_inf;
        float pj = none ? 0.0 : exp(s - m_new);
        ps[tid] = pj;
        red[tid] = pj;
        barrier();
        for (uint h = WG / 2u; h > 0u; h >>= 1) {
            if (tid < h) {
                red[tid] += red[tid + h];
            }
            barrier();
        }
        float corr = none ? 1.0 : exp(m - m_new);
        l = l * corr + red[0];
        m = m_new;
        uint n = min(WG, visible - j0);
        for (uint e = 0u; e < PER; e++) {
            uint d = tid + WG * e;
            if (d < HEAD_DIM) {
                float sum = acc[e] * corr;
                for (uint c = 0u; c < n; c++) {
                    sum += ps[c] * load_kv(false, base + (j0 + c) * HEAD_DIM + d);
                }
                acc[e] = sum;
            }
        }
        barrier();
    }
    for (uint e = 0u; e < PER; e++) {
        uint d = tid + WG * e;
        if (d < HEAD_DIM) {
            o[q_row + d] = l > 0.0 ? acc[e] / l : 0.0;
        }
    }
}
