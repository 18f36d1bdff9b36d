// Portable stand-ins for attn_prefill_mma.cl's PTX primitives, so that its fragment layouts can be
// checked on a CPU OpenCL (PoCL) that refuses `asm`. Prepended to the kernel's source by
// benches/ocl_prefill_mma.c (mode `emu`). A warp's lanes exchange values through local memory
// between barriers, so every primitive must be reached by the whole workgroup (the kernel turns off
// its per-warp tile skipping here). Slow; for correctness only.
#define KPC_MMA_EMULATED 1
#define WARP_SKIPS 0
#define EMU_LOCALS                                                                                 \
    local uint emu_u[32 * WARPS * 6];                                                              \
    local float emu_f[32 * WARPS];

inline float emu_half(uint word, uint hi)
{
    ushort h = (ushort)(hi ? word >> 16 : word & 0xffffu);
    return vload_half(0, (private half *)&h);
}

// m16n8k16, row-major A and column-major B fragments as mma.sync lays them out.
inline void emu_mma(float *d, const uint *a, uint b0, uint b1, local uint *u)
{
    uint tid = get_local_id(0);
    uint wb = tid & ~31u;
    uint lane = tid & 31u;
    for (uint i = 0; i < 4; i++) {
        u[tid * 6 + i] = a[i];
    }
    u[tid * 6 + 4] = b0;
    u[tid * 6 + 5] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    uint g = lane / 4, t = lane % 4;
    for (uint i = 0; i < 4; i++) {
        uint row = g + 8 * (i >> 1);
        uint col = 2 * t + (i & 1);
        float acc = 0.0f;
        for (uint kx = 0; kx < 16; kx++) {
            uint la = (row % 8) * 4 + (kx % 8) / 2;
            uint ra = (row >= 8 ? 1 : 0) + (kx >= 8 ? 2 : 0);
            uint lb = col * 4 + (kx % 8) / 2;
            uint rbb = 4 + (kx >= 8 ? 1 : 0);
            acc += emu_half(u[(wb + la) * 6 + ra], kx % 2) * emu_half(u[(wb + lb) * 6 + rbb], kx % 2);
        }
        d[i] += acc;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#define MMA(D, A, B0, B1) emu_mma((D), (A), (B0), (B1), emu_u)

inline void emu_ldsm(uint *r, local const ushort *base, uint off, uint trans, local uint *u)
{
    uint tid = get_local_id(0);
    uint wb = tid & ~31u;
    uint lane = tid & 31u;
    u[tid] = off;
    barrier(CLK_LOCAL_MEM_FENCE);
    uint g = lane / 4, t = lane % 4;
    for (uint i = 0; i < 4; i++) {
        uint lo, hi;
        if (trans) {
            lo = base[u[wb + 8 * i + 2 * t] + g];
            hi = base[u[wb + 8 * i + 2 * t + 1] + g];
        } else {
            uint o = u[wb + 8 * i + g];
            lo = base[o + 2 * t];
            hi = base[o + 2 * t + 1];
        }
        r[i] = lo | hi << 16;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#define LDSM_X4(R, BASE, OFF) emu_ldsm((R), (BASE), (OFF), 0, emu_u)
#define LDSM_X4_T(R, BASE, OFF) emu_ldsm((R), (BASE), (OFF), 1, emu_u)

#define CP_ASYNC16(DST, SRC, SIZE)                                                                 \
    (*(local uint4 *)(DST) = (SIZE) ? *(SRC) : (uint4)(0u))
#define CP_COMMIT()
#define CP_WAIT_ALL()

inline float emu_shfl_xor(float x, uint m, local float *f)
{
    uint tid = get_local_id(0);
    f[tid] = x;
    barrier(CLK_LOCAL_MEM_FENCE);
    float r = f[tid ^ m];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#define SHFL_XOR(X, M) emu_shfl_xor((X), (M), emu_f)

inline bool emu_any(bool p, local float *f)
{
    uint tid = get_local_id(0);
    uint wb = tid & ~31u;
    f[tid] = p ? 1.0f : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    float n = 0.0f;
    for (uint i = 0; i < 32; i++) {
        n += f[wb + i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    return n > 0.0f;
}
#define WARP_ANY(P) emu_any((P), emu_f)
#define EXP2(X) exp2(X)

inline uint emu_pack(float lo, float hi)
{
    ushort h[2];
    vstore_half_rte(lo, 0, (private half *)h);
    vstore_half_rte(hi, 1, (private half *)h);
    return (uint)h[0] | (uint)h[1] << 16;
}
#define PACK_HALF2(LO, HI) emu_pack((LO), (HI))
#define CP_WAIT_BUT_ONE()

inline uint emu_exp2_h2(uint x) { return emu_pack(exp2(emu_half(x, 0)), exp2(emu_half(x, 1))); }
#define EXP2_H2(X) emu_exp2_h2(X)
inline uint emu_add_h2(uint a, uint b)
{
    return emu_pack(emu_half(a, 0) + emu_half(b, 0), emu_half(a, 1) + emu_half(b, 1));
}
#define ADD_H2(A, B) emu_add_h2((A), (B))
#define UNPACK_H2(W) ((float2)(emu_half((W), 0), emu_half((W), 1)))
