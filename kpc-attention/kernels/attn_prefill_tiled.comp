// Causal prefill attention, register-tiled (flash-attention 2 style, f32 arithmetic): the variant
// chosen where the head dimension is a multiple of 64 (see Attention::prefill_kernel).
//
// Why this shape: prefill is compute-bound, so the work is arranged for FMA throughput. A workgroup
// of 256 invocations owns 64 query rows and walks 128-key tiles up to the last key its last row
// may see. Invocation t owns rows 4*(t/16)..+3 and, per tile, keys 4*(t%16)..+3 and 64 + the same
// of S = Q K^T (32 scores in registers), and D/16 columns of the output (in registers). S is
// accumulated over SLICE-wide slices of the head dimension staged in shared memory as vec4s, so each
// step is three 16-byte shared loads (one broadcast across the warp) for 32 FMAs; O += P V takes
// the tile's two 64-key halves in turn, reading P as a broadcast vec4 and V as vec4s. The row max is
// combined across the 16 owners of a row through shared memory; the row sum is kept per invocation
// and combined once at the end. Query tiles are taken last first, so the longest (causal) ones start
// first. A tile's second half is skipped where the causal mask hides all of it.
//
// Why 128 keys: with 64 (16 scores per invocation) the S products cost 1.7x their FMA time on an
// H200, one shared load per 8 FMAs; 128 halves the loads per FMA, and the K and V staging and the
// barriers per query row.
//
// Q and K slices are read from global memory in 16-byte chunks along their rows and transposed as
// they are stored: read one row per invocation, each load touched a cache line per invocation, and
// the loads took 44% of the kernel's time on an H200 (knock-outs, BENCHMARKS.md). With PREFETCH = 1
// the global words of the next staging step (the next Q and K slice, or the next V keys) are loaded
// into registers before the current step's arithmetic and stored to shared memory after it, so the
// L2 round trip overlaps the FMAs instead of stalling between two barriers.
//
// Q and O are [batch][q_head][q_len][head_dim] (f32). K and V are the KV cache's
// [batch][kv_head][capacity][head_dim], f32 or (KV_F16 = 1) packed f16 pairs. Query i of the launch
// sits at position kv_len - q_len + i and sees keys 0..=that position.
#version 450
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 256) in;
layout(constant_id = 2) const uint KV_F16 = 0;
layout(constant_id = 3) const uint HEAD_DIM = 128;  // a multiple of 64, at most 256
layout(constant_id = 6) const uint SLICE = 16;      // 16 or 32: head-dimension slice staged per step
layout(constant_id = 7) const uint PREFETCH = 0;    // 1: load the next step's words during this one

const uint BQ = 64u;                 // query rows per workgroup
const uint BK = 128u;                // keys per tile
const uint BH = 64u;                 // keys per half tile (P is staged one half at a time)
const uint DC = SLICE;               // head-dimension slice staged per step of S
const uint KC = SLICE * 128u / HEAD_DIM;  // keys of V staged per step of O += P V
const uint QS = 17u;                 // vec4s per d of the Q slice in buf (padded: fewer bank conflicts)
const uint KS = BK / 4u;             // vec4s per d of the K slice in buf
const uint KOFF = SLICE * QS;        // where the K slice starts in buf
const uint DV4 = HEAD_DIM / 64u;     // output vec4s per row per invocation
const uint D4 = HEAD_DIM / 4u;       // vec4s per row of V
// Q and K slices are loaded as 16-byte chunks, consecutive invocations along a row.
const uint QCH = DC / 4u;                          // chunks per row of a Q slice
const uint QE = BQ * QCH / 256u;                   // Q chunks per invocation: 1 or 2
const uint KWR = KV_F16 != 0u ? DC / 2u : DC;      // words per key of a K slice
const uint KCH = KWR / 4u;                         // chunks per key of a K slice
const uint KE = BK * KCH / 256u;                   // K chunks per invocation: 1 to 4
const uint KROW = KV_F16 != 0u ? HEAD_DIM / 8u : HEAD_DIM / 4u;  // chunks per cache row

layout(std430, set = 0, binding = 0) readonly buffer Q { vec4 q[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { uvec4 k[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { uvec4 v[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Params {
    uint q_len;     // queries in this launch
    uint kv_len;    // positions in the cache, the queries' included
    uint capacity;  // positions per head in the cache
    uint q_heads;   // Hq
    uint group;     // Hq / Hkv
    float scale;    // 1 / sqrt(D)
} p;

// Staging, SLICE * 784 bytes: a Q slice ([d][row/4], padded to 17 vec4s per d so that the
// transposing stores meet fewer bank conflicts) and a K slice ([d][key/4]) while computing S; a V
// slice ([key][d/4]) while computing O; the 16 owners' partials of each row ([row][16] floats)
// between the two. The host picks SLICE = 32 where the device has the shared memory (40.5 KiB in
// all: fewer barriers), else 16 (28.25 KiB).
shared vec4 buf[SLICE * (QS + KS)];
shared vec4 pt[BH * 16u];      // P of one half tile, transposed: [key][row/4]

// The next staging step's words: Q chunks in 0..7 and K chunks from 8 (S steps), or V words.
uint pf[24];

float red_get(uint i) {
    return buf[i / 4u][i % 4u];
}

void red_set(uint i, float x) {
    buf[i / 4u][i % 4u] = x;
}

// Chunk e of this invocation in a slice of rows of `per_row` chunks: its row and its chunk in the
// row. A subgroup covers 8 rows of 4 chunks (or 16 of 2), so each row's run is contiguous in memory
// and the transposing stores fall in few invocations per bank.
uvec2 chunk_at(uint tid, uint e, uint per_row) {
    uint c = tid + 256u * e;
    uint lane = c % 32u;
    uint w = c / 32u;
    uint in_row = min(per_row, 4u);
    uint rows_per = 32u / in_row;          // rows per subgroup-chunk
    uint across = max(per_row / 4u, 1u);   // subgroup-chunks per run of rows_per rows
    return uvec2(rows_per * (w / across) + lane % rows_per, lane / rows_per + in_row * (w % across));
}

// Loads the Q and K chunks of head-dimension slice dc of the tile at key j0 into pf.
void fetch_s(uint tid, uint j0, uint dc, uint rows, uint q_base, uint head_row, uint visible) {
    [[unroll]] for (uint e = 0u; e < QE; e++) {
        uvec2 rc = chunk_at(tid, e, QCH);
        vec4 x = vec4(0.0);
        if (rc.x < rows) {
            x = q[(q_base + rc.x * HEAD_DIM + dc) / 4u + rc.y];
        }
        [[unroll]] for (uint t = 0u; t < 4u; t++) {
            pf[4u * e + t] = floatBitsToUint(x[t]);
        }
    }
    [[unroll]] for (uint e = 0u; e < KE; e++) {
        uvec2 rc = chunk_at(tid, e, KCH);
        uint j = j0 + rc.x;
        uvec4 x = uvec4(0u);
        if (j < visible) {
            x = k[(head_row + j) * KROW + dc / (4u << KV_F16) + rc.y];
        }
        [[unroll]] for (uint t = 0u; t < 4u; t++) {
            pf[8u + 4u * e + t] = x[t];
        }
    }
}

// Stores the chunks fetch_s loaded: the Q slice as [d][row/4], the K slice as [d][key/4].
void store_s(uint tid) {
    [[unroll]] for (uint e = 0u; e < QE; e++) {
        uvec2 rc = chunk_at(tid, e, QCH);
        [[unroll]] for (uint t = 0u; t < 4u; t++) {
            uint d = 4u * rc.y + t;
            buf[d * QS + rc.x / 4u][rc.x % 4u] = uintBitsToFloat(pf[4u * e + t]);
        }
    }
    [[unroll]] for (uint e = 0u; e < KE; e++) {
        uvec2 rc = chunk_at(tid, e, KCH);
        uint key = rc.x;
        if (KV_F16 != 0u) {
            [[unroll]] for (uint t = 0u; t < 4u; t++) {
                uint d = 8u * rc.y + 2u * t;
                vec2 kk = unpackHalf2x16(pf[8u + 4u * e + t]);
                buf[KOFF + d * KS + key / 4u][key % 4u] = kk.x;
                buf[KOFF + (d + 1u) * KS + key / 4u][key % 4u] = kk.y;
            }
        } else {
            [[unroll]] for (uint t = 0u; t < 4u; t++) {
                uint d = 4u * rc.y + t;
                buf[KOFF + d * KS + key / 4u][key % 4u] = uintBitsToFloat(pf[8u + 4u * e + t]);
            }
        }
    }
}

// Loads the V words of keys kb .. kb + KC into pf.
void fetch_v(uint tid, uint kb, uint head_row, uint visible) {
    if (KV_F16 != 0u) {
        [[unroll]] for (uint e = 0u; e < DC / 4u; e++) {
            uint i = tid + 256u * e;
            uint j = kb + i / (HEAD_DIM / 2u);
            uint w = (head_row + j) * (HEAD_DIM / 2u) + i % (HEAD_DIM / 2u);
            pf[e] = j < visible ? v[w / 4u][w % 4u] : 0u;
        }
    } else {
        [[unroll]] for (uint e = 0u; e < DC / 2u; e++) {
            uint i = tid + 256u * e;
            uint j = kb + i / HEAD_DIM;
            uint w = (head_row + j) * HEAD_DIM + i % HEAD_DIM;
            pf[e] = j < visible ? v[w / 4u][w % 4u] : 0u;
        }
    }
}

// Stores the words fetch_v loaded as [key][d/4].
void store_v(uint tid) {
    if (KV_F16 != 0u) {
        [[unroll]] for (uint e = 0u; e < DC / 4u; e++) {
            uint i = tid + 256u * e;
            uint key = i / (HEAD_DIM / 2u);
            uint d = 2u * (i % (HEAD_DIM / 2u));
            vec2 vv = unpackHalf2x16(pf[e]);
            buf[key * D4 + d / 4u][d % 4u] = vv.x;
            buf[key * D4 + d / 4u][d % 4u + 1u] = vv.y;
        }
    } else {
        [[unroll]] for (uint e = 0u; e < DC / 2u; e++) {
            uint i = tid + 256u * e;
            uint key = i / HEAD_DIM;
            uint d = i % HEAD_DIM;
            buf[key * D4 + d / 4u][d % 4u] = uintBitsToFloat(pf[e]);
        }
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint rg = tid / 16u;
    uint cg = tid % 16u;
    uint bh = gl_WorkGroupID.x;
    uint b = bh / p.q_heads;
    uint hq = bh % p.q_heads;
    uint kv_heads = p.q_heads / p.group;
    uint head_row = (b * kv_heads + hq / p.group) * p.capacity;  // cache row of position 0
    // Grid y is the query tile, taken last first: the longest (causal) tiles of every head are
    // dispatched before any shorter one, so no long tile starts near the end (the grid's x runs
    // fastest in dispatch order).
    uint tile = gl_NumWorkGroups.y - 1u - gl_WorkGroupID.y;
    uint q0 = tile * BQ;
    uint rows = min(BQ, p.q_len - q0);
    uint offset = p.kv_len - p.q_len;
    uint q_base = (bh * p.q_len + q0) * HEAD_DIM;
    uint visible = offset + q0 + rows;

    float acc[64];  // [row r][vec4 jv][component]: 16 * DV4 used; a fixed bound keeps it in registers
    float m[4];
    float l[4];
    [[unroll]] for (uint i = 0u; i < 16u * DV4; i++) {
        acc[i] = 0.0;
    }
    [[unroll]] for (uint r = 0u; r < 4u; r++) {
        m[r] = -3.0e38;
        l[r] = 0.0;
    }

    if (PREFETCH != 0u) {
        fetch_s(tid, 0u, 0u, rows, q_base, head_row, visible);
    }
    for (uint j0 = 0u; j0 < visible; j0 += BK) {
        float s[32];  // [row r][half h][key c]
        [[unroll]] for (uint i = 0u; i < 32u; i++) {
            s[i] = 0.0;
        }
        for (uint dc = 0u; dc < HEAD_DIM; dc += DC) {
            if (PREFETCH == 0u) {
                fetch_s(tid, j0, dc, rows, q_base, head_row, visible);
            }
            store_s(tid);
            barrier();
            if (PREFETCH != 0u) {
                if (dc + DC < HEAD_DIM) {
                    fetch_s(tid, j0, dc + DC, rows, q_base, head_row, visible);
                } else {
                    fetch_v(tid, j0, head_row, visible);
                }
            }
            [[unroll]] for (uint d = 0u; d < DC; d++) {
                vec4 a = buf[d * QS + rg];
                vec4 b0 = buf[KOFF + d * KS + cg];
                vec4 b1 = buf[KOFF + d * KS + 16u + cg];
                [[unroll]] for (uint r = 0u; r < 4u; r++) {
                    [[unroll]] for (uint c = 0u; c < 4u; c++) {
                        s[r * 8u + c] += a[r] * b0[c];
                        s[r * 8u + 4u + c] += a[r] * b1[c];
                    }
                }
            }
            barrier();
        }

        // Scale and mask; each owner's row maxima go to shared memory (buf is free until the
        // first V step is stored, after the barrier that follows P's first half).
        [[unroll]] for (uint r = 0u; r < 4u; r++) {
            uint i = rg * 4u + r;
            uint qpos = offset + q0 + i;
            float mx = -3.0e38;
            [[unroll]] for (uint c = 0u; c < 8u; c++) {
                uint j = j0 + (c / 4u) * BH + cg * 4u + c % 4u;
                bool ok = i < rows && j <= qpos;
                s[r * 8u + c] = ok ? s[r * 8u + c] * p.scale : -3.0e38;
                mx = max(mx, s[r * 8u + c]);
            }
            red_set(i * 16u + cg, mx);
        }
        barrier();
        [[unroll]] for (uint r = 0u; r < 4u; r++) {
            uint i = rg * 4u + r;
            uint qpos = offset + q0 + i;
            float mt = m[r];
            [[unroll]] for (uint t = 0u; t < 16u; t++) {
                mt = max(mt, red_get(i * 16u + t));
            }
            float alpha = exp(m[r] - mt);
            m[r] = mt;
            l[r] *= alpha;
            [[unroll]] for (uint x = 0u; x < 4u * DV4; x++) {
                acc[r * 4u * DV4 + x] *= alpha;
            }
            [[unroll]] for (uint c = 0u; c < 8u; c++) {
                uint j = j0 + (c / 4u) * BH + cg * 4u + c % 4u;
                bool ok = i < rows && j <= qpos;
                float pv = ok ? exp(s[r * 8u + c] - mt) : 0.0;
                l[r] += pv;
                s[r * 8u + c] = pv;
            }
        }

        [[unroll]] for (uint h = 0u; h < 2u; h++) {
            if (h == 1u && j0 + BH >= visible) {
                break;  // the causal mask hides the whole second half
            }
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                uint at = 4u * h + c;
                pt[(cg * 4u + c) * 16u + rg] = vec4(s[at], s[8u + at], s[16u + at], s[24u + at]);
            }
            barrier();
            for (uint k0 = 0u; k0 < BH; k0 += KC) {
                uint kb = j0 + h * BH + k0;
                if (PREFETCH == 0u) {
                    fetch_v(tid, kb, head_row, visible);
                }
                store_v(tid);
                barrier();
                if (PREFETCH != 0u) {
                    if (k0 + KC < BH) {
                        fetch_v(tid, kb + KC, head_row, visible);
                    } else if (h == 0u && j0 + BH < visible) {
                        fetch_v(tid, j0 + BH, head_row, visible);
                    } else if (j0 + BK < visible) {
                        fetch_s(tid, j0 + BK, 0u, rows, q_base, head_row, visible);
                    }
                }
                [[unroll]] for (uint kk = 0u; kk < KC; kk++) {
                    vec4 pp = pt[(k0 + kk) * 16u + rg];
                    [[unroll]] for (uint jv = 0u; jv < DV4; jv++) {
                        vec4 vv = buf[kk * D4 + cg + 16u * jv];
                        [[unroll]] for (uint r = 0u; r < 4u; r++) {
                            uint at = (r * DV4 + jv) * 4u;
                            acc[at] += pp[r] * vv.x;
                            acc[at + 1u] += pp[r] * vv.y;
                            acc[at + 2u] += pp[r] * vv.z;
                            acc[at + 3u] += pp[r] * vv.w;
                        }
                    }
                }
                barrier();
            }
        }
    }

    // The row sums: each owner holds its columns' share.
    [[unroll]] for (uint r = 0u; r < 4u; r++) {
        red_set((rg * 4u + r) * 16u + cg, l[r]);
    }
    barrier();
    [[unroll]] for (uint r = 0u; r < 4u; r++) {
        uint i = rg * 4u + r;
        if (i < rows) {
            float total = 0.0;
            [[unroll]] for (uint t = 0u; t < 16u; t++) {
                total += red_get(i * 16u + t);
            }
            [[unroll]] for (uint jv = 0u; jv < DV4; jv++) {
                uint at = (r * DV4 + jv) * 4u;
                uint d = (cg + 16u * jv) * 4u;
                uint out_at = q_base + i * HEAD_DIM + d;
                o[out_at] = acc[at] / total;
                o[out_at + 1u] = acc[at + 1u] / total;
                o[out_at + 2u] = acc[at + 2u] / total;
                o[out_at + 3u] = acc[at + 3u] / total;
            }
        }
    }
}
