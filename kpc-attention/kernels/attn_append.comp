// KV-cache append on the device: copies `rows` new positions of K and V (f32, [batch][kv_head][rows]
// [head_dim], as a projection leaves them) into the cache at positions [pos, pos + rows), converting to
// f16 when the cache stores f16. Running it in the same submission as the decode kernels makes a decode
// step one submission with no host copy into the cache.
//
// Each invocation moves one pair of elements of K and of V; a grid-stride loop lets one dispatch of at
// most maxComputeWorkGroupCount groups cover any number of rows. HEAD_DIM is even (checked on the host).
#version 450

layout(local_size_x = 64, local_size_x_id = 0) in;  // LOCAL_SIZE
layout(constant_id = 2) const uint KV_F16 = 0;       // 1: the cache stores f16
layout(constant_id = 3) const uint HEAD_DIM = 128;   // D

layout(std430, set = 0, binding = 0) readonly buffer NewK { vec2 new_k[]; };  // [B][Hkv][rows][D]
layout(std430, set = 0, binding = 1) readonly buffer NewV { vec2 new_v[]; };  // [B][Hkv][rows][D]
layout(std430, set = 0, binding = 2) buffer K { uint k[]; };                  // [B][Hkv][cap][D]
layout(std430, set = 0, binding = 3) buffer V { uint v[]; };                  // [B][Hkv][cap][D]

layout(push_constant) uniform Params {
    uint pos;       // first position written
    uint rows;      // positions written per (batch, KV head)
    uint capacity;  // positions per head in the cache
    uint pairs;     // batch * kv_heads * rows * HEAD_DIM / 2
} p;

void main() {
    const uint HALF_D = HEAD_DIM / 2u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.pairs; i += stride) {
        uint e = i % HALF_D;
        uint r = (i / HALF_D) % p.rows;
        uint bh = i / (HALF_D * p.rows);
        uint row = bh * p.capacity + p.pos + r;
        vec2 kk = new_k[i];
        vec2 vv = new_v[i];
        if (KV_F16 != 0u) {
            k[row * HALF_D + e] = packHalf2x16(kk);
            v[row * HALF_D + e] = packHalf2x16(vv);
        } else {
            uint at = (row * HALF_D + e) * 2u;
            k[at] = floatBitsToUint(kk.x);
            k[at + 1u] = floatBitsToUint(kk.y);
            v[at] = floatBitsToUint(vv.x);
            v[at + 1u] = floatBitsToUint(vv.y);
        }
    }
}
