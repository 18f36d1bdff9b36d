// Issue 41, item 5: does NVIDIA's OpenCL accept inline PTX `mma.sync` in OpenCL C, and what rate does
// it reach? Builds one OpenCL C program whose kernels issue
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 through `asm volatile`, prints the build status and
// log, the PTX header the driver returns as the program binary (.version / .target) and whether the
// instruction is in it, checks one product against the host (small integers: exact in fp16 and fp32),
// then times a register-fed loop of independent products (profiling events, median of 5 launches).
// On a device that refuses the program it says so and exits 2.
//   gcc -O2 -o ocl_mma_probe benches/ocl_mma_probe.c -lOpenCL && ./ocl_mma_probe [platform-substring]
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *SRC =
    "#define MMA(d0,d1,d2,d3,a,b) asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\" "
    ": \"+f\"(d0), \"+f\"(d1), \"+f\"(d2), \"+f\"(d3) "
    ": \"r\"(a.x), \"r\"(a.y), \"r\"(a.z), \"r\"(a.w), \"r\"(b.x), \"r\"(b.y))\n"
    "__kernel void one(__global const uint4 *a, __global const uint2 *b, __global float4 *d) {\n"
    "  uint l = get_local_id(0);\n"
    "  uint4 av = a[l]; uint2 bv = b[l];\n"
    "  float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;\n"
    "  MMA(d0, d1, d2, d3, av, bv);\n"
    "  d[l] = (float4)(d0, d1, d2, d3);\n"
    "}\n"
    // 8 independent accumulators per lane (8 chains), `iters` rounds: 8 * iters products of
    // 2 * 16 * 8 * 16 flops per warp.
    "__kernel void peak(__global const uint4 *a, __global const uint2 *b, __global float *out, uint iters) {\n"
    "  uint l = get_local_id(0) & 31u;\n"
    "  uint4 av = a[l]; uint2 bv = b[l];\n"
    "  float c[32];\n"
    "  for (int i = 0; i < 32; i++) c[i] = 0.0f;\n"
    "  for (uint it = 0; it < iters; it++) {\n"
    "    MMA(c[0], c[1], c[2], c[3], av, bv); MMA(c[4], c[5], c[6], c[7], av, bv);\n"
    "    MMA(c[8], c[9], c[10], c[11], av, bv); MMA(c[12], c[13], c[14], c[15], av, bv);\n"
    "    MMA(c[16], c[17], c[18], c[19], av, bv); MMA(c[20], c[21], c[22], c[23], av, bv);\n"
    "    MMA(c[24], c[25], c[26], c[27], av, bv); MMA(c[28], c[29], c[30], c[31], av, bv);\n"
    "  }\n"
    "  float s = 0.0f;\n"
    "  for (int i = 0; i < 32; i++) s += c[i];\n"
    "  out[get_global_id(0)] = s;\n"
    "}\n";

#define CHECK(x)                                                               \
  do {                                                                         \
    cl_int e_ = (x);                                                           \
    if (e_ != CL_SUCCESS) {                                                    \
      printf("ocl-mma: %s failed: %d\n", #x, e_);                              \
      return 1;                                                                \
    }                                                                          \
  } while (0)

static uint16_t half_of_int(int v) { // small integers, exact
  _Float16 h = (_Float16)v;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}

int main(int argc, char **argv) {
  const char *want = argc > 1 ? argv[1] : "NVIDIA";
  cl_platform_id plats[8];
  cl_uint np = 0;
  CHECK(clGetPlatformIDs(8, plats, &np));
  cl_platform_id plat = 0;
  for (cl_uint i = 0; i < np; i++) {
    char name[256] = {0};
    clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
    printf("ocl-mma: platform %u: %s\n", i, name);
    if (!plat && strstr(name, want)) plat = plats[i];
  }
  if (!plat) {
    printf("ocl-mma: no platform named like '%s'\n", want);
    return 2;
  }
  cl_device_id dev;
  CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
  char dname[256] = {0}, dver[256] = {0};
  clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname, dname, NULL);
  clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof dver, dver, NULL);
  printf("ocl-mma: device %s, driver %s\n", dname, dver);
  cl_int err;
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  CHECK(err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
  CHECK(err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &err);
  CHECK(err);
  cl_int built = clBuildProgram(prog, 1, &dev, "", NULL, NULL);
  size_t logn = 0;
  clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &logn);
  char *log = calloc(logn + 1, 1);
  clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, logn, log, NULL);
  printf("ocl-mma: build %s (%d); log: %s\n", built == CL_SUCCESS ? "ok" : "FAILED", built,
         logn > 1 ? log : "(empty)");
  if (built != CL_SUCCESS) return 2;
  size_t binn = 0;
  clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof binn, &binn, NULL);
  unsigned char *bin = calloc(binn + 1, 1);
  clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL);
  int lines = 0;
  for (char *line = strtok((char *)bin, "\n"); line; line = strtok(NULL, "\n")) {
    if (strstr(line, ".version") || strstr(line, ".target") || (strstr(line, "mma.sync") && lines++ < 2))
      printf("ocl-mma: binary: %s\n", line);
  }
  printf("ocl-mma: binary: %d mma.sync lines (first 2 shown)\n", lines);

  // A (16x16) and B (16x8, k x n) of small integers, in the m16n8k16 fragment layout.
  int A[16][16], B[16][8];
  for (int r = 0; r < 16; r++)
    for (int c = 0; c < 16; c++) A[r][c] = (r * 7 + c * 3) % 5 - 2;
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 8; n++) B[k][n] = (k * 5 + n * 11) % 7 - 3;
  uint32_t a[32][4], b[32][2];
  for (int l = 0; l < 32; l++) {
    int g = l >> 2, t = l & 3;
    int ar[4] = {g, g + 8, g, g + 8}, ac[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int i = 0; i < 4; i++)
      a[l][i] = half_of_int(A[ar[i]][ac[i]]) | (uint32_t)half_of_int(A[ar[i]][ac[i] + 1]) << 16;
    for (int i = 0; i < 2; i++) {
      int k = 2 * t + 8 * i;
      b[l][i] = half_of_int(B[k][g]) | (uint32_t)half_of_int(B[k + 1][g]) << 16;
    }
  }
  cl_mem ab = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof a, a, &err);
  CHECK(err);
  cl_mem bb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof b, b, &err);
  CHECK(err);
  float d[32][4];
  for (int l = 0; l < 32; l++)
    for (int i = 0; i < 4; i++) d[l][i] = -12345.0f; // poison
  cl_mem db = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof d, d, &err);
  CHECK(err);
  cl_kernel one = clCreateKernel(prog, "one", &err);
  CHECK(err);
  CHECK(clSetKernelArg(one, 0, sizeof ab, &ab));
  CHECK(clSetKernelArg(one, 1, sizeof bb, &bb));
  CHECK(clSetKernelArg(one, 2, sizeof db, &db));
  size_t g32 = 32;
  CHECK(clEnqueueNDRangeKernel(q, one, 1, NULL, &g32, &g32, 0, NULL, NULL));
  CHECK(clEnqueueReadBuffer(q, db, CL_TRUE, 0, sizeof d, d, 0, NULL, NULL));
  int bad = 0;
  for (int l = 0; l < 32; l++) {
    int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; i++) {
      int r = g + 8 * (i >> 1), c = 2 * t + (i & 1);
      int want_v = 0;
      for (int k = 0; k < 16; k++) want_v += A[r][k] * B[k][c];
      if (d[l][i] != (float)want_v) bad++;
    }
  }
  printf("ocl-mma: one 16x8x16 product against the host: %s (%d of 128 elements wrong)\n",
         bad ? "WRONG" : "exact", bad);

  cl_kernel peak = clCreateKernel(prog, "peak", &err);
  CHECK(err);
  cl_uint iters = 4096;
  size_t local = 256, groups = 132 * 16, global = groups * local;
  cl_mem ob = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, global * sizeof(float), NULL, &err);
  CHECK(err);
  CHECK(clSetKernelArg(peak, 0, sizeof ab, &ab));
  CHECK(clSetKernelArg(peak, 1, sizeof bb, &bb));
  CHECK(clSetKernelArg(peak, 2, sizeof ob, &ob));
  CHECK(clSetKernelArg(peak, 3, sizeof iters, &iters));
  double ms[5];
  for (int run = -3; run < 5; run++) {
    cl_event ev;
    CHECK(clEnqueueNDRangeKernel(q, peak, 1, NULL, &global, &local, 0, NULL, &ev));
    CHECK(clWaitForEvents(1, &ev));
    cl_ulong t0, t1;
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    clReleaseEvent(ev);
    if (run >= 0) ms[run] = (t1 - t0) / 1e6;
  }
  for (int i = 0; i < 5; i++)
    for (int j = i + 1; j < 5; j++)
      if (ms[j] < ms[i]) { double x = ms[i]; ms[i] = ms[j]; ms[j] = x; }
  double flops = (double)(global / 32) * iters * 8 * 2.0 * 16 * 8 * 16;
  printf("ocl-mma: register-fed peak: %zu workgroups of %zu, %u x 8 products per warp: %.3f ms, "
         "%.1f TFLOP/s (median of 5)\n", groups, local, iters, ms[2], flops / (ms[2] * 1e-3) / 1e12);
  return bad ? 3 : 0;
}
