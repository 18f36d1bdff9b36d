// kpc's inline-PTX probe (kpc-attention/src/ptx.rs): one kernel that issues every PTX construct the
// OpenCL `mma.sync` kernels use, each the way they write it. kpc decides whether an OpenCL device
// takes those kernels by whether the driver builds this program (NVIDIA's OpenCL passes `asm` through
// to ptxas, which refuses these instructions below sm_80; other compilers refuse `asm` itself).
// It is built, never launched.
//
// - a `__local` address as the 32-bit shared-window address PTX's `.shared` forms take (a pointer
//   to integer cast, as ptx.h's SHARED_ADDR);
// - cp.async.cg.shared.global (16 bytes, with a source size for zero fill), commit_group, wait_group;
// - ldmatrix.sync.aligned.m8n8.x4.shared.b16;
// - mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32.

__attribute__((reqd_work_group_size(32, 1, 1)))
kernel void ptx_probe(global const uint4 *a, global float4 *d)
{
    local uint4 tile[32];
    uint l = get_local_id(0);
    uint dst = (uint)(ulong)(tile + l);
    ulong src = (ulong)(a + l);
    uint bytes = 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    barrier(CLK_LOCAL_MEM_FENCE);
    uint r0, r1, r2, r3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(dst)
                 : "memory");
    float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
        : "r"(r0), "r"(r1), "r"(r2), "r"(r3), "r"(r0), "r"(r1));
    d[l] = (float4)(c0, c1, c2, c3);
}
