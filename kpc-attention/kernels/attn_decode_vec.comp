// Decode attention, vectorized and fused: one launch does a whole decode step, the KV append, the
// flash-decoding splits and their combination. Chosen where the device has subgroup shuffles and the
// head dimension divides into 16-byte loads per lane (see Attention::decode_kernel).
//
// Why this shape: decode reads every K and V row once and does ~1 FMA per element loaded, so it is
// bound by memory bandwidth, and at short contexts by fixed costs per launch. Here LANES consecutive
// invocations share one row and each loads 16 bytes (8 halves or 4 floats) per chunk, so a subgroup
// reads whole rows as contiguous 256-byte runs; each invocation keeps U rows of K and V in flight
// before using them; a workgroup serves all GROUP query heads of one KV head, so grouped-query
// attention reads K and V once, not GROUP times; the scores are combined with an online softmax in
// registers (one pass, no shared score array, no barrier in the loop); row groups are merged once at
// the end through shared memory. Then:
// - the append: with APPEND = 1 (push constant) the newest position kv_len - 1 is not read from the
//   cache but from new_k/new_v (f32, as a projection leaves them); the last split's workgroup attends
//   it (rounded as the cache stores it) and writes it into the cache for later steps. No other
//   workgroup reads that position.
// - the combination: each workgroup writes its split's unnormalized output, max and sum; the last
//   workgroup of a KV head to finish (counted with an atomic, the counter reset by that workgroup)
//   combines that head's splits with a log-sum-exp and writes the output. The partials are
//   `coherent` and fenced before the count, so the last workgroup reads every other one's writes.
//   With COMBINE it combines all of the KV head's query heads at once (one round trip for every
//   split's max and sum, an invocation per 16-byte output column); otherwise one after another,
//   each with workgroup-wide reductions, which cost 11 to 13 us per step at Hkv = 8 on an H200.
//
// Grid: x = splits (ceil(kv_len / per_split)), times GROUP with SPREAD; y = batch * kv_heads. Query
// row r = b * q_heads + h; KV head hkv serves query heads hkv * GROUP .. hkv * GROUP + GROUP - 1, all
// in one workgroup per split, or (SPREAD) one workgroup each. The last workgroup of a KV head to
// finish combines all of its query heads.
#version 450
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128, local_size_x_id = 0) in;  // LOCAL_SIZE, a multiple of LANES and of 32
layout(constant_id = 2) const uint KV_F16 = 1;       // 1: K and V are packed f16
layout(constant_id = 3) const uint HEAD_DIM = 128;   // D, a multiple of 8 * LANES (f16) or 4 * LANES
layout(constant_id = 6) const uint LANES = 16;       // invocations per row: a power of two <= subgroup
layout(constant_id = 7) const uint GROUP = 1;        // query heads per KV head (at most 8)
layout(constant_id = 9) const uint ROWS = 4;         // rows per row group in flight (U)
// 1: one workgroup per query head (grid x = splits * GROUP, the GROUP workgroups of a split
// adjacent, so they reread the same K/V rows mostly from L2); 0: one per KV head serving all GROUP.
layout(constant_id = 10) const uint SPREAD = 0;
// Id 8 is the OpenCL twin's NV_SHUFFLE (how a row's lanes are summed there); declared here so that
// both images take the same ids. Subgroup shuffles are core in Vulkan, so it changes nothing.
layout(constant_id = 8) const uint NV_SHUFFLE = 0;
// 1: each lane group loads its next U rows before using the current ones (twice the row registers).
layout(constant_id = 11) const uint PREFETCH = 0;
// 1: the splits take the positions block-cyclically, one trip of RG * U rows at a time: trip t of
// split s reads rows (t * splits + s) * RG * U onwards, so that at any moment the workgroups read
// one window of K and V, as a copy does, rather than `splits` windows far apart.
layout(constant_id = 12) const uint CYCLIC = 0;
// 1: the last workgroup combines every query head of its KV head at once (see the combination);
// the host sets it only where GROUP * splits <= W_CACHED and GROUP * splits <= RG * HEAD_DIM.
layout(constant_id = 13) const uint COMBINE = 0;
// 1: a row's lanes share out its query heads. Summing a row's NQ partial scores across LANES lanes
// takes NQ * log2(LANES) shuffles when every lane sums every head; here each halving step keeps
// half of the heads and sends the other half to its partner (a reduce-scatter), so a row costs
// NQ - 1 + log2(LANES / NQ) shuffles and each lane ends with one head's score. The softmax runs
// once per lane for its own head (one exp per row instead of NQ), and each head's weights reach
// the lanes that accumulate its output through NQ shuffles per row. Fewer instructions per byte
// is what grouped-query decode lacked: the same kernel reads MHA rows at the copy rate, four heads
// per row at two thirds of it (BENCHMARKS.md). The host sets it only where NQ is a power of two
// from 2 to LANES.
layout(constant_id = 14) const uint HEAD_LANES = 0;
// 1: 8-byte chunks (4 halves or 2 floats per lane per row) instead of 16, so that a row of 128
// halves spreads over 32 lanes: half the query and accumulator registers per lane for a group of
// heads, which leaves more of the registers for rows in flight (the host sets it only on Vulkan,
// with LANES up to the subgroup size and 32).
layout(constant_id = 15) const uint NARROW = 0;
// 1: the row groups of all NQ query heads are merged in one pass through shared memory (two
// barriers and NQ times the merge buffer) instead of one head after another (three barriers each).
layout(constant_id = 16) const uint MERGE_ALL = 0;
// 1 (with COMBINE): each query head's max and sum over the splits are reduced by the WG / GROUP
// invocations that serve the head (strided partial pairs, then shuffles within clusters of LANES,
// then shared memory) instead of every invocation scanning all of the head's splits in turn.
layout(constant_id = 17) const uint SCAN = 0;
// 1: the heads' row groups are merged one after another as without MERGE_ALL, but each head's
// max and sum over the row groups is found once, by one invocation, for all heads before the
// first (one barrier), instead of by every invocation per head (2 * RG exponentials each).
layout(constant_id = 18) const uint MERGE_ONCE = 0;

const uint E = (NARROW != 0u ? 2u : 4u) << KV_F16;   // elements per 16- or 8-byte chunk
const uint ROW_CHUNKS = HEAD_DIM / E;                 // 16-byte chunks per row
const uint CPL = ROW_CHUNKS / LANES;                  // chunks per lane
const uint VALS = CPL * E;                            // elements per lane
const uint RG = gl_WorkGroupSize.x / LANES;           // row groups per workgroup
const uint U = ROWS;
const uint NQ = SPREAD != 0u ? 1u : GROUP;            // query heads one workgroup serves
// Register arrays get fixed bounds: an array sized by a specialization constant may be placed in
// local memory by a driver that does not resize it after specialization. The host keeps GROUP,
// VALS and U within these; the loops index with constants once unrolled.
const uint MAX_GROUP = 8u;
const uint MAX_VALS = 32u;
const uint MAX_U = 16u;
const uint MAX_U_CPL = 128u;                          // U * CPL, with CPL = VALS / E <= 8
const uint W_CACHED = 1024u;                          // split weights the combination keeps shared
const uint SLICES = gl_WorkGroupSize.x / 32u;
const uint PER_LANE = (HEAD_DIM + 31u) / 32u;         // at most 8
const uint COMBINE_UNROLL = 8u;                       // splits in flight per slice when combining
// Splits in flight per invocation in the all-heads combination: 16 columns of 16 bytes for a group
// (a team holds every split of its head: Hkv = 8, L = 16k has 64 per head, 4 round trips to L2
// rather than 8), 8 for MHA, whose four teams per head take at most 8 splits each at the default
// sizes and whose kernel needs fewer registers than the combination's 16 would hold.
const uint MAX_COMBINE_ALL_UNROLL = 16u;
const uint COMBINE_ALL_UNROLL = GROUP >= 2u ? 16u : 8u;
const uint Q4 = HEAD_DIM / 4u;                        // 16-byte columns of a head's output

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };                // [B][Hq][D]
layout(std430, set = 0, binding = 1) buffer K { uvec4 k[]; };                         // [B][Hkv][cap][D]
layout(std430, set = 0, binding = 2) buffer V { uvec4 v[]; };                         // [B][Hkv][cap][D]
// The same K and V as 8-byte chunks (NARROW).
layout(std430, set = 0, binding = 1) buffer K2 { uvec2 k2[]; };
layout(std430, set = 0, binding = 2) buffer V2 { uvec2 v2[]; };
// Partial outputs as 16-byte columns, so that the combination reads each with one load.
layout(std430, set = 0, binding = 3) coherent buffer PartO { vec4 part_o[]; };        // [B*Hq][splits][D/4]
layout(std430, set = 0, binding = 4) coherent buffer PartMl { float part_ml[]; };     // [B*Hq][splits][2]
layout(std430, set = 0, binding = 5) readonly buffer NewK { float new_k[]; };         // [B][Hkv][D]
layout(std430, set = 0, binding = 6) readonly buffer NewV { float new_v[]; };         // [B][Hkv][D]
layout(std430, set = 0, binding = 7) coherent buffer Done { uint done[]; };           // [B*Hkv]
layout(std430, set = 0, binding = 8) writeonly buffer Out { float o[]; };             // [B][Hq][D]

layout(push_constant) uniform Params {
    uint kv_len;     // positions to attend, the appended one included
    uint capacity;   // positions per head in the cache
    uint kv_heads;   // Hkv
    uint per_split;  // positions per split
    float scale;     // 1 / sqrt(D)
    uint append;     // 1: position kv_len - 1 comes from new_k/new_v and is written to the cache
} p;

const uint MERGED = MERGE_ALL != 0u ? NQ : 1u;        // heads merged at once
const uint MERGED_ML = MERGE_ALL != 0u || MERGE_ONCE != 0u ? NQ : 1u;
shared float sm_m[MERGED_ML * RG];
shared float sm_l[MERGED_ML * RG];
shared float sm_o[MERGED * RG * HEAD_DIM];
shared float w[W_CACHED];
shared float red[gl_WorkGroupSize.x];
shared float red_l[SCAN != 0u ? gl_WorkGroupSize.x : 1u];
shared float part[SLICES * HEAD_DIM];
shared bool last;

// Element t of a 16-byte chunk.
float elem(uvec4 c, uint t) {
    if (KV_F16 != 0u) {
        uint word = t < 2u ? c.x : (t < 4u ? c.y : (t < 6u ? c.z : c.w));
        vec2 h = unpackHalf2x16(word);
        return (t & 1u) == 0u ? h.x : h.y;
    }
    return uintBitsToFloat(t == 0u ? c.x : (t == 1u ? c.y : (t == 2u ? c.z : c.w)));
}

// The 16-byte chunk that stores 8 (f16) or 4 (f32) consecutive floats of `src` from `at`.
// x as an f16 bit pattern, rounded to nearest even. Integer operations, not packHalf2x16: NVIDIA's
// compiler folded unpackHalf2x16(packHalf2x16(x)) back to x, so the appended position was attended
// unrounded while the cache stored it rounded (found by the attention tests on an H200).
uint half_rne(float x) {
    uint b = floatBitsToUint(x);
    uint sign = (b >> 16u) & 0x8000u;
    uint a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) {  // infinity, NaN (kept quiet)
        return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u);
    }
    if (a >= 0x477ff000u) {  // 65520 and up round to infinity
        return sign | 0x7c00u;
    }
    if (a < 0x38800000u) {  // below 2^-14: a subnormal half, x * 2^24 rounded (exact in f32)
        return sign | uint(roundEven(uintBitsToFloat(a) * 16777216.0));
    }
    uint h = (a - 0x38000000u) >> 13u;  // rebias the exponent, keep 10 mantissa bits
    uint rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) {
        h += 1u;
    }
    return sign | h;
}

uint pack_rne(float lo, float hi) {
    return half_rne(lo) | (half_rne(hi) << 16u);
}

uvec4 pack_new(bool is_k, uint at) {
    float x[8];
    [[unroll]] for (uint t = 0u; t < 8u; t++) {
        x[t] = t >= E ? 0.0 : is_k ? new_k[at + t] : new_v[at + t];
    }
    if (KV_F16 != 0u) {
        return uvec4(pack_rne(x[0], x[1]), pack_rne(x[2], x[3]), pack_rne(x[4], x[5]),
                     pack_rne(x[6], x[7]));
    }
    return uvec4(floatBitsToUint(x[0]), floatBitsToUint(x[1]), floatBitsToUint(x[2]),
                 floatBitsToUint(x[3]));
}

// Chunk r of K or V (16 or 8 bytes; a narrow chunk in .xy), and its store.
uvec4 load_k(uint r) {
    return NARROW != 0u ? uvec4(k2[r], 0u, 0u) : k[r];
}

uvec4 load_v(uint r) {
    return NARROW != 0u ? uvec4(v2[r], 0u, 0u) : v[r];
}

void store_kv(uint r, uvec4 kc, uvec4 vc) {
    if (NARROW != 0u) {
        k2[r] = kc.xy;
        v2[r] = vc.xy;
    } else {
        k[r] = kc;
        v[r] = vc;
    }
}

// A max and a sum over the workgroup through `red`.
float group_max(float x, uint tid) {
    red[tid] = x;
    barrier();
    for (uint h = gl_WorkGroupSize.x / 2u; h > 0u; h >>= 1) {
        if (tid < h) {
            red[tid] = max(red[tid], red[tid + h]);
        }
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

float group_sum(float x, uint tid) {
    red[tid] = x;
    barrier();
    for (uint h = gl_WorkGroupSize.x / 2u; h > 0u; h >>= 1) {
        if (tid < h) {
            red[tid] += red[tid + h];
        }
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

// Rows base + u * RG + rg (u < U) of this KV head, as this lane's chunks; rows past jc load row
// jc - 1 (they are masked out of the softmax). Needs base < jc.
void load_rows(out uvec4 kw[MAX_U_CPL], out uvec4 vw[MAX_U_CPL], uint base, uint jc,
               uint row_base, uint rg, uint lane) {
    [[unroll]] for (uint u = 0u; u < U; u++) {
        uint j = min(base + u * RG + rg, jc - 1u);
        uint r = (row_base + j) * ROW_CHUNKS + lane;
        [[unroll]] for (uint i = 0u; i < CPL; i++) {
            kw[u * CPL + i] = load_k(r + i * LANES);
            vw[u * CPL + i] = load_v(r + i * LANES);
        }
    }
}

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint tid = gl_LocalInvocationID.x;
    uint lane = tid % LANES;
    uint rg = tid / LANES;
    uint per_x = SPREAD != 0u ? GROUP : 1u;
    uint split = gl_WorkGroupID.x / per_x;
    uint gx = gl_WorkGroupID.x % per_x;
    uint splits = gl_NumWorkGroups.x / per_x;
    uint bkv = gl_WorkGroupID.y;
    uint b = bkv / p.kv_heads;
    uint hkv = bkv % p.kv_heads;
    uint q_heads = p.kv_heads * GROUP;
    uint head0 = b * q_heads + hkv * GROUP;  // the KV head's first query row
    uint qrow0 = head0 + gx;                 // this workgroup's first query row
    uint j0 = split * p.per_split;
    uint j1 = min(j0 + p.per_split, p.kv_len);
    // Positions read from the cache: all but the appended one.
    uint jc = min(j1, p.kv_len - p.append);
    uint row_base = bkv * p.capacity;
    // The rows this workgroup reads: one trip of RG * U rows from `first`, then every `step` rows,
    // all below `lim`.
    uint first = CYCLIC != 0u ? split * RG * U : j0;
    uint step = CYCLIC != 0u ? splits * RG * U : RG * U;
    uint lim = CYCLIC != 0u ? p.kv_len - p.append : jc;

    float qv[MAX_GROUP * MAX_VALS];
    float acc[MAX_GROUP * MAX_VALS];
    float m[MAX_GROUP];
    float l[MAX_GROUP];
    [[unroll]] for (uint g = 0u; g < NQ; g++) {
        [[unroll]] for (uint i = 0u; i < CPL; i++) {
            [[unroll]] for (uint t = 0u; t < E; t++) {
                uint d = (lane + i * LANES) * E + t;
                qv[g * VALS + i * E + t] = q[(qrow0 + g) * HEAD_DIM + d] * p.scale;
                acc[g * VALS + i * E + t] = 0.0;
            }
        }
        m[g] = -3.0e38;
        l[g] = 0.0;
    }

    // The trip count is the same for every invocation, so the shuffles run in uniform control flow;
    // rows past jc load the last valid row and are masked out of the softmax.
    // HEAD_LANES: the running max and sum of this lane's own head, and the subgroup index of its
    // row's first lane.
    float hm = -3.0e38;
    float hs = 0.0;
    uint sg_row = gl_SubgroupInvocationID - lane;
    uvec4 kw[MAX_U_CPL];
    uvec4 vw[MAX_U_CPL];
    uvec4 kp[MAX_U_CPL];
    uvec4 vp[MAX_U_CPL];
    if (PREFETCH != 0u && first < lim) {
        load_rows(kw, vw, first, lim, row_base, rg, lane);
    }
    for (uint base = first; base < lim; base += step) {
        if (PREFETCH == 0u) {
            load_rows(kw, vw, base, lim, row_base, rg, lane);
        } else if (base + step < lim) {
            // The next rows are in flight while these are used.
            load_rows(kp, vp, base + step, lim, row_base, rg, lane);
        }
        float s[MAX_U * MAX_GROUP];
        if (HEAD_LANES != 0u) {
            // The lane's partial scores, then the reduce-scatter: the lane keeps head hl's.
            float sv[MAX_U];
            [[unroll]] for (uint u = 0u; u < U; u++) {
                float x[MAX_GROUP];
                [[unroll]] for (uint g = 0u; g < NQ; g++) {
                    x[g] = 0.0;
                    [[unroll]] for (uint i = 0u; i < CPL; i++) {
                        [[unroll]] for (uint t = 0u; t < E; t++) {
                            x[g] += qv[g * VALS + i * E + t] * elem(kw[u * CPL + i], t);
                        }
                    }
                }
                [[unroll]] for (uint k = 0u; (LANES >> (k + 1u)) > 0u; k++) {
                    uint off = LANES >> (k + 1u);
                    uint c = NQ >> k;  // heads still held, while at least 2
                    if (c >= 2u) {
                        bool up = (lane & off) != 0u;
                        [[unroll]] for (uint i = 0u; i < c / 2u; i++) {
                            float keep = up ? x[c / 2u + i] : x[i];
                            float send = up ? x[i] : x[c / 2u + i];
                            x[i] = keep + subgroupShuffleXor(send, off);
                        }
                    } else {
                        x[0] += subgroupShuffleXor(x[0], off);
                    }
                }
                sv[u] = x[0];
            }
            float mx = hm;
            [[unroll]] for (uint u = 0u; u < U; u++) {
                if (base + u * RG + rg < lim) {
                    mx = max(mx, sv[u]);
                }
            }
            float corr = exp(hm - mx);
            hs = hs * corr;
            hm = mx;
            [[unroll]] for (uint u = 0u; u < U; u++) {
                sv[u] = base + u * RG + rg < lim ? exp(sv[u] - mx) : 0.0;
                hs += sv[u];
            }
            // Each head's correction and weights from a lane that holds it.
            [[unroll]] for (uint g = 0u; g < NQ; g++) {
                uint from = sg_row + g * (LANES / NQ) + lane % (LANES / NQ);
                float cg = subgroupShuffle(corr, from);
                [[unroll]] for (uint c = 0u; c < VALS; c++) {
                    acc[g * VALS + c] *= cg;
                }
                [[unroll]] for (uint u = 0u; u < U; u++) {
                    float pr = subgroupShuffle(sv[u], from);
                    [[unroll]] for (uint i = 0u; i < CPL; i++) {
                        [[unroll]] for (uint t = 0u; t < E; t++) {
                            acc[g * VALS + i * E + t] += pr * elem(vw[u * CPL + i], t);
                        }
                    }
                }
            }
        } else {
        [[unroll]] for (uint u = 0u; u < U; u++) {
            [[unroll]] for (uint g = 0u; g < NQ; g++) {
                float x = 0.0;
                [[unroll]] for (uint i = 0u; i < CPL; i++) {
                    [[unroll]] for (uint t = 0u; t < E; t++) {
                        x += qv[g * VALS + i * E + t] * elem(kw[u * CPL + i], t);
                    }
                }
                [[unroll]] for (uint off = LANES / 2u; off > 0u; off >>= 1) {
                    x += subgroupShuffleXor(x, off);
                }
                s[u * NQ + g] = x;
            }
        }
        [[unroll]] for (uint g = 0u; g < NQ; g++) {
            float mx = m[g];
            [[unroll]] for (uint u = 0u; u < U; u++) {
                if (base + u * RG + rg < lim) {
                    mx = max(mx, s[u * NQ + g]);
                }
            }
            float corr = exp(m[g] - mx);
            l[g] *= corr;
            [[unroll]] for (uint c = 0u; c < VALS; c++) {
                acc[g * VALS + c] *= corr;
            }
            [[unroll]] for (uint u = 0u; u < U; u++) {
                float pr = base + u * RG + rg < lim ? exp(s[u * NQ + g] - mx) : 0.0;
                l[g] += pr;
                [[unroll]] for (uint i = 0u; i < CPL; i++) {
                    [[unroll]] for (uint t = 0u; t < E; t++) {
                        acc[g * VALS + i * E + t] += pr * elem(vw[u * CPL + i], t);
                    }
                }
            }
            m[g] = mx;
        }
        }
        if (PREFETCH != 0u) {
            [[unroll]] for (uint c = 0u; c < U * CPL; c++) {
                kw[c] = kp[c];
                vw[c] = vp[c];
            }
        }
    }

    if (HEAD_LANES != 0u) {
        [[unroll]] for (uint g = 0u; g < NQ; g++) {
            uint from = sg_row + g * (LANES / NQ) + lane % (LANES / NQ);
            m[g] = subgroupShuffle(hm, from);
            l[g] = subgroupShuffle(hs, from);
        }
    }

    // The appended position: attended by row group 0 of the last split, and stored in the cache.
    if (p.append != 0u && split == splits - 1u && rg == 0u) {
        uint pos = p.kv_len - 1u;
        uint src = bkv * HEAD_DIM;
        uint r = (row_base + pos) * ROW_CHUNKS + lane;
        uvec4 kn[8];
        uvec4 vn[8];
        [[unroll]] for (uint i = 0u; i < CPL; i++) {
            uint at = src + (lane + i * LANES) * E;
            kn[i] = pack_new(true, at);
            vn[i] = pack_new(false, at);
            if (gx == 0u) {
                store_kv(r + i * LANES, kn[i], vn[i]);
            }
        }
        [[unroll]] for (uint g = 0u; g < NQ; g++) {
            float x = 0.0;
            [[unroll]] for (uint i = 0u; i < CPL; i++) {
                [[unroll]] for (uint t = 0u; t < E; t++) {
                    x += qv[g * VALS + i * E + t] * elem(kn[i], t);
                }
            }
            [[unroll]] for (uint off = LANES / 2u; off > 0u; off >>= 1) {
                x += subgroupShuffleXor(x, off);
            }
            float mx = max(m[g], x);
            float corr = exp(m[g] - mx);
            float pr = exp(x - mx);
            l[g] = l[g] * corr + pr;
            [[unroll]] for (uint i = 0u; i < CPL; i++) {
                [[unroll]] for (uint t = 0u; t < E; t++) {
                    uint c = g * VALS + i * E + t;
                    acc[c] = acc[c] * corr + pr * elem(vn[i], t);
                }
            }
            m[g] = mx;
        }
    }

    // Merge the row groups: rescale each to the workgroup's max, then sum through shared memory.
    if (MERGE_ALL != 0u || MERGE_ONCE != 0u) {
        if (lane == 0u) {
            [[unroll]] for (uint g = 0u; g < NQ; g++) {
                sm_m[g * RG + rg] = m[g];
                sm_l[g * RG + rg] = l[g];
            }
        }
        barrier();
        // Invocation g finds head g's max and sum (one pass for all heads, so that no invocation
        // holds every head's maxima at once: that took the kernel from 128 to 142 registers).
        if (tid < NQ) {
            float mx = -3.0e38;
            for (uint r = 0u; r < RG; r++) {
                mx = max(mx, sm_m[tid * RG + r]);
            }
            float total = 0.0;
            for (uint r = 0u; r < RG; r++) {
                total += sm_l[tid * RG + r] * exp(sm_m[tid * RG + r] - mx);
            }
            red[tid] = mx;
            uint slot = (qrow0 + tid) * splits + split;
            part_ml[slot * 2u] = mx;
            part_ml[slot * 2u + 1u] = total;
        }
        barrier();
        [[unroll]] for (uint g = 0u; g < (MERGE_ALL != 0u ? NQ : 0u); g++) {
            float wt = exp(m[g] - red[g]);
            [[unroll]] for (uint i = 0u; i < CPL; i++) {
                [[unroll]] for (uint t = 0u; t < E; t++) {
                    uint at = (g * RG + rg) * HEAD_DIM + (lane + i * LANES) * E + t;
                    sm_o[at] = acc[g * VALS + i * E + t] * wt;
                }
            }
        }
        if (MERGE_ALL != 0u) {
            barrier();
        }
        for (uint c = tid; c < (MERGE_ALL != 0u ? NQ * Q4 : 0u); c += WG) {
            uint g = c / Q4;
            uint col = c % Q4;
            vec4 o = vec4(0.0);
            [[unroll]] for (uint r = 0u; r < RG; r++) {
                uint at = (g * RG + r) * HEAD_DIM + 4u * col;
                o += vec4(sm_o[at], sm_o[at + 1u], sm_o[at + 2u], sm_o[at + 3u]);
            }
            part_o[((qrow0 + g) * splits + split) * Q4 + col] = o;
        }
    }
    // MERGE_ONCE: one head after another through one row buffer, with the maxima found above.
    [[unroll]] for (uint g = 0u; g < (MERGE_ONCE != 0u && MERGE_ALL == 0u ? NQ : 0u); g++) {
        float wt = exp(m[g] - red[g]);
        [[unroll]] for (uint i = 0u; i < CPL; i++) {
            [[unroll]] for (uint t = 0u; t < E; t++) {
                sm_o[rg * HEAD_DIM + (lane + i * LANES) * E + t] = acc[g * VALS + i * E + t] * wt;
            }
        }
        barrier();
        uint slot = (qrow0 + g) * splits + split;
        for (uint c = tid; c < Q4; c += WG) {
            vec4 o = vec4(0.0);
            [[unroll]] for (uint r = 0u; r < RG; r++) {
                uint at = r * HEAD_DIM + 4u * c;
                o += vec4(sm_o[at], sm_o[at + 1u], sm_o[at + 2u], sm_o[at + 3u]);
            }
            part_o[slot * Q4 + c] = o;
        }
        barrier();
    }
    [[unroll]] for (uint g = 0u; g < (MERGE_ALL != 0u || MERGE_ONCE != 0u ? 0u : NQ); g++) {
        if (lane == 0u) {
            sm_m[rg] = m[g];
            sm_l[rg] = l[g];
        }
        barrier();
        float mx = -3.0e38;
        [[unroll]] for (uint r = 0u; r < RG; r++) {
            mx = max(mx, sm_m[r]);
        }
        float total = 0.0;
        [[unroll]] for (uint r = 0u; r < RG; r++) {
            total += sm_l[r] * exp(sm_m[r] - mx);
        }
        float wt = exp(m[g] - mx);
        [[unroll]] for (uint i = 0u; i < CPL; i++) {
            [[unroll]] for (uint t = 0u; t < E; t++) {
                sm_o[rg * HEAD_DIM + (lane + i * LANES) * E + t] = acc[g * VALS + i * E + t] * wt;
            }
        }
        barrier();
        uint slot = (qrow0 + g) * splits + split;
        for (uint c = tid; c < Q4; c += WG) {
            vec4 o = vec4(0.0);
            [[unroll]] for (uint r = 0u; r < RG; r++) {
                uint at = r * HEAD_DIM + 4u * c;
                o += vec4(sm_o[at], sm_o[at + 1u], sm_o[at + 2u], sm_o[at + 3u]);
            }
            part_o[slot * Q4 + c] = o;
        }
        if (tid == 0u) {
            part_ml[slot * 2u] = mx;
            part_ml[slot * 2u + 1u] = total;
        }
        barrier();
    }

    // Count this split done; the last one of the KV head combines.
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) {
        last = atomicAdd(done[bkv], 1u) == gl_NumWorkGroups.x - 1u;
    }
    barrier();
    if (!last) {
        return;
    }
    memoryBarrierBuffer();
    uint slice = tid / 32u;
    uint sl = tid % 32u;
    if (COMBINE != 0u) {
        // Every query head at once. All GROUP * splits (max, sum) pairs come in one round trip
        // (four per invocation in flight) into shared memory: maxima in w, sums in sm_o, entry
        // e = g * splits + s (the pairs of a KV head's query heads are consecutive in part_ml).
        uint n_ml = GROUP * splits;
        uint ml0 = head0 * splits;
        for (uint e0 = tid; e0 < n_ml; e0 += 4u * WG) {
            float mv[4];
            float lv[4];
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                uint e = min(e0 + i * WG, n_ml - 1u);
                mv[i] = part_ml[(ml0 + e) * 2u];
                lv[i] = part_ml[(ml0 + e) * 2u + 1u];
            }
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                uint e = e0 + i * WG;
                if (e < n_ml) {
                    w[e] = mv[i];
                    sm_o[e] = lv[i];
                }
            }
        }
        barrier();
        // SCAN: head g's WG / GROUP invocations reduce its (max, sum) pairs: strided partials,
        // merged within clusters of CL lanes by shuffles, the clusters' pairs left in red / red_l.
        const uint P = WG / GROUP;
        const uint CL = min(P, LANES);
        if (SCAN != 0u) {
            uint g = tid / P;
            float ms = -3.0e38;
            for (uint s = tid % P; s < splits; s += P) {
                ms = max(ms, w[g * splits + s]);
            }
            float ls = 0.0;
            for (uint s = tid % P; s < splits; s += P) {
                ls += sm_o[g * splits + s] * exp(w[g * splits + s] - ms);
            }
            [[unroll]] for (uint off = CL / 2u; off > 0u; off >>= 1) {
                float mo = subgroupShuffleXor(ms, off);
                float lo = subgroupShuffleXor(ls, off);
                float mn = max(ms, mo);
                ls = ls * exp(ms - mn) + lo * exp(mo - mn);
                ms = mn;
            }
            if (tid % CL == 0u) {
                red[tid / CL] = ms;
                red_l[tid / CL] = ls;
            }
            barrier();
        }
        // Groups of Q4 invocations, each holding one 16-byte column of a head's output per
        // invocation, take (query head, team) pairs; a head's `teams` teams split its splits and
        // add up through `part` after. Each invocation finds its head's max and sum by scanning
        // shared memory (the reads are broadcasts), so no reduction needs a barrier. (Loading the
        // first partial columns before the (max, sum) pairs, to overlap the two round trips, held
        // two sets of 16 columns at once and took the kernel from 127 to 164 registers on an H100:
        // three workgroups per SM instead of four, 20% slower at L = 16k.)
        const uint SLOTS = WG / Q4;
        uint teams = max(1u, min(SLOTS, SLICES) / GROUP);
        uint col = tid % Q4;
        for (uint pair = tid / Q4; pair < GROUP * teams; pair += SLOTS) {
            uint g = pair / teams;
            uint team = pair % teams;
            float mx = -3.0e38;
            float total = 0.0;
            if (SCAN != 0u) {
                const uint C = P / CL;  // clusters per head
                for (uint c = 0u; c < C; c++) {
                    mx = max(mx, red[g * C + c]);
                }
                for (uint c = 0u; c < C; c++) {
                    total += red_l[g * C + c] * exp(red[g * C + c] - mx);
                }
            } else {
                for (uint s = 0u; s < splits; s++) {
                    mx = max(mx, w[g * splits + s]);
                }
                for (uint s = 0u; s < splits; s++) {
                    total += sm_o[g * splits + s] * exp(w[g * splits + s] - mx);
                }
            }
            uint row = (head0 + g) * splits;
            vec4 sum = vec4(0.0);
            for (uint s0 = team; s0 < splits; s0 += teams * COMBINE_ALL_UNROLL) {
                vec4 x[MAX_COMBINE_ALL_UNROLL];
                [[unroll]] for (uint u = 0u; u < COMBINE_ALL_UNROLL; u++) {
                    x[u] = part_o[(row + min(s0 + u * teams, splits - 1u)) * Q4 + col];
                }
                [[unroll]] for (uint u = 0u; u < COMBINE_ALL_UNROLL; u++) {
                    uint s = s0 + u * teams;
                    sum += (s < splits ? exp(w[g * splits + s] - mx) : 0.0) * x[u];
                }
            }
            sum /= total;
            uint at = (head0 + g) * HEAD_DIM + 4u * col;
            if (teams == 1u) {
                o[at] = sum.x;
                o[at + 1u] = sum.y;
                o[at + 2u] = sum.z;
                o[at + 3u] = sum.w;
            } else {
                uint slot = (g * teams + team) * HEAD_DIM + 4u * col;
                part[slot] = sum.x;
                part[slot + 1u] = sum.y;
                part[slot + 2u] = sum.z;
                part[slot + 3u] = sum.w;
            }
        }
        if (teams > 1u) {
            barrier();
            for (uint d = tid; d < GROUP * HEAD_DIM; d += WG) {
                uint g = d / HEAD_DIM;
                float x = 0.0;
                for (uint t = 0u; t < teams; t++) {
                    x += part[(g * teams + t) * HEAD_DIM + d % HEAD_DIM];
                }
                o[head0 * HEAD_DIM + d] = x;
            }
        }
    } else {
    for (uint g = 0u; g < GROUP; g++) {
        uint first = (head0 + g) * splits;
        float mx = -3.0e38;
        for (uint s = tid; s < splits; s += WG) {
            mx = max(mx, part_ml[(first + s) * 2u]);
        }
        mx = group_max(mx, tid);
        float total = 0.0;
        for (uint s = tid; s < splits; s += WG) {
            float e = exp(part_ml[(first + s) * 2u] - mx);
            if (s < W_CACHED) {
                w[s] = e;
            }
            total += e * part_ml[(first + s) * 2u + 1u];
        }
        total = group_sum(total, tid);
        float sum[8];
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            sum[i] = 0.0;
        }
        // COMBINE_UNROLL splits per slice at a time, all loaded before any is used: the partials
        // are coherent (read from L2), and one split per trip cost an L2 round trip each, which
        // made the combination the largest fixed cost of a step (BENCHMARKS.md, issue 7).
        for (uint s0 = slice; s0 < splits; s0 += SLICES * COMBINE_UNROLL) {
            float wt[COMBINE_UNROLL];
            float x[COMBINE_UNROLL * 8u];
            [[unroll]] for (uint u = 0u; u < COMBINE_UNROLL; u++) {
                uint s = s0 + u * SLICES;
                uint at = min(s, splits - 1u);  // a valid split to load; weighted 0 past the end
                wt[u] = s >= splits ? 0.0 : s < W_CACHED ? w[s] : exp(part_ml[(first + s) * 2u] - mx);
                [[unroll]] for (uint i = 0u; i < PER_LANE; i++) {
                    uint d = min(sl + 32u * i, HEAD_DIM - 1u);
                    uint e = (first + at) * HEAD_DIM + d;
                    x[u * 8u + i] = part_o[e >> 2u][e & 3u];
                }
            }
            [[unroll]] for (uint u = 0u; u < COMBINE_UNROLL; u++) {
                [[unroll]] for (uint i = 0u; i < PER_LANE; i++) {
                    sum[i] += wt[u] * x[u * 8u + i];
                }
            }
        }
        [[unroll]] for (uint i = 0u; i < PER_LANE; i++) {
            uint d = sl + 32u * i;
            if (d < HEAD_DIM) {
                part[slice * HEAD_DIM + d] = sum[i];
            }
        }
        barrier();
        for (uint d = tid; d < HEAD_DIM; d += WG) {
            float x = 0.0;
            for (uint t = 0u; t < SLICES; t++) {
                x += part[t * HEAD_DIM + d];
            }
            o[(head0 + g) * HEAD_DIM + d] = x / total;
        }
        barrier();
    }
    }
    if (tid == 0u) {
        done[bkv] = 0u;
    }
}
