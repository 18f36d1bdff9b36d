// Issue 41, item 5: the OpenCL `mma.sync` projection GEMM (kpc-attention/kernels/mha_gemm_mma.cl) on
// NVIDIA's OpenCL, outside kpc: builds every tile variant (fp16 and f32 A) with the options kpc
// passes (-cl-kernel-arg-info, one -D per spec constant) plus -cl-nv-verbose (ptxas's registers and
// spills in the log), checks every element at small shapes with edge tiles, K off the step and the
// head-split layouts into three outputs, and sampled rows at the timed shapes, against a float64
// reference of the fp16-rounded inputs; then times each variant (profiling events, median of 7 after
// 200 ms of the same launch) and, for f32 A, a cast pass (f32 -> fp16) to add to the fp16 kernel.
// Also builds kpc's inline-PTX probe (kernels/ptx_probe.cl) as kpc does.
//   gcc -O2 -o ocl_gemm_mma benches/ocl_gemm_mma.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lOpenCL
//   ./ocl_gemm_mma mha_gemm_mma.cl ptx_probe.cl [variant-substring]
// With GEMM_EMULATE=1 (any OpenCL device, e.g. PoCL): the kernel's PTX replaced by plain OpenCL C
// (-D PTX_EMULATE), the small shapes checked, nothing timed: the tiles' indexing tested on a CPU.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x)                                                                                  \
  do {                                                                                            \
    cl_int e_ = (x);                                                                              \
    if (e_ != CL_SUCCESS) {                                                                       \
      printf("gemm-mma: %s failed: %d (line %d)\n", #x, e_, __LINE__);                            \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

static cl_context ctx;
static cl_device_id dev;
static cl_command_queue q;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    printf("gemm-mma: cannot open %s\n", path);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = calloc(n + 1, 1);
  if (fread(s, 1, n, f) != (size_t)n) exit(1);
  fclose(f);
  return s;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Builds `src` with `opts`; prints the log's ptxas lines (or all of it on failure). NULL on failure.
static cl_program build(const char *src, const char *opts, const char *label) {
  cl_int err;
  cl_program p = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
  CHECK(err);
  cl_int built = clBuildProgram(p, 1, &dev, opts, NULL, NULL);
  size_t n = 0;
  clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
  char *log = calloc(n + 1, 1);
  clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, n, log, NULL);
  if (built != CL_SUCCESS) {
    printf("gemm-mma: %s: build FAILED (%d) with [%s]; log:\n%s\n", label, built, opts, log);
    free(log);
    clReleaseProgram(p);
    return NULL;
  }
  for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
    if (strstr(line, "registers") || strstr(line, "spill") || strstr(line, "error") ||
        strstr(line, "arning"))
      printf("gemm-mma: %s: log: %s\n", label, line);
  free(log);
  return p;
}

static uint16_t f2h(float x) {
  _Float16 h = (_Float16)x;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
static float h2f(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) { // uniform in [-1, 1)
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static size_t split_at(size_t row, size_t col, size_t width, size_t seq, size_t d) {
  if (seq == 0) return row * width + col;
  size_t heads = width / d;
  return (((row / seq) * heads + col / d) * seq + row % seq) * d + col % d;
}

typedef struct {
  unsigned m, n, k, n0, n1, a_seq, c_seq, d;
  float alpha0;
} Shape;

typedef struct {
  const char *name;
  int bm, bn, wm, wn, stages;
  const char *defs; // extra -D knobs of the kernel (FRAG_DB, HOIST, ...), "" for none
  int split;        // SPLIT_K (1: none)
} Tile;

// The baseline tiles (as kpc's SWEEP_TILES) and, behind `+`, the kernel's knobs (see
// mha_gemm_mma.cl for what each does; "+pipe" is PIPELINED, what kpc's `with_pipeline` builds).
// GEMM_SET=1: the first round's sweep (session 7, call 1); GEMM_SET=2: the second's (call 2).
#define ALL " -D BAR_PTX=1 -D HOIST=1 -D RASTER=8 -D FRAG_DB=1"
#define PIPE " -D PIPELINED=1"
static const Tile TILES1[] = {
    {"128x256/2x4s2", 128, 256, 2, 4, 2, "", 1},
    {"128x128/2x2s3", 128, 128, 2, 2, 3, "", 1},
    {"128x128/2x2s2", 128, 128, 2, 2, 2, "", 1},
    {"128x128/2x4s3", 128, 128, 2, 4, 3, "", 1},
    {"256x128/4x2s2", 256, 128, 4, 2, 2, "", 1},
    {"64x128/1x2s4", 64, 128, 1, 2, 4, "", 1},
    {"128x128/2x4s3+bar", 128, 128, 2, 4, 3, " -D BAR_PTX=1", 1},
    {"128x128/2x4s3+hoist", 128, 128, 2, 4, 3, " -D HOIST=1", 1},
    {"128x128/2x4s3+r8", 128, 128, 2, 4, 3, " -D RASTER=8", 1},
    {"128x128/2x4s3+r16", 128, 128, 2, 4, 3, " -D RASTER=16", 1},
    {"128x128/2x4s3+serp", 128, 128, 2, 4, 3, " -D SERP=1", 1},
    {"128x128/2x4s3+l2pf", 128, 128, 2, 4, 3, " -D L2PF=1", 1},
    {"128x128/2x4s3+db", 128, 128, 2, 4, 3, " -D FRAG_DB=1", 1},
    {"128x128/2x4s3+all", 128, 128, 2, 4, 3, ALL, 1},
    {"128x128/2x4s3+all-db", 128, 128, 2, 4, 3, " -D BAR_PTX=1 -D HOIST=1 -D RASTER=8", 1},
    {"128x128/2x2s3+db", 128, 128, 2, 2, 3, " -D FRAG_DB=1", 1},
    {"128x128/2x2s3+hoist", 128, 128, 2, 2, 3, " -D HOIST=1", 1},
    {"128x128/2x2s3+all", 128, 128, 2, 2, 3, ALL, 1},
    {"128x128/2x2s3+all+serp", 128, 128, 2, 2, 3, ALL " -D SERP=1", 1},
    {"128x128/2x2s3+all-db", 128, 128, 2, 2, 3, " -D BAR_PTX=1 -D HOIST=1 -D RASTER=8", 1},
    {"128x256/2x4s2+all", 128, 256, 2, 4, 2, ALL, 1},
    {"256x128/4x2s2+all", 256, 128, 4, 2, 2, ALL, 1},
    {"128x128/2x2s2+all", 128, 128, 2, 2, 2, ALL, 1},
    {"128x128/2x4s3+db+r128", 128, 128, 2, 4, 3, " -D FRAG_DB=1 -cl-nv-maxrregcount=128", 1},
    {"128x128/2x4s3+all+r128", 128, 128, 2, 4, 3, ALL " -cl-nv-maxrregcount=128", 1},
    {"128x64/2x2s4+all", 128, 64, 2, 2, 4, ALL, 1},
    {"64x128/2x2s4+all", 64, 128, 2, 2, 4, ALL, 1},
    {"128x64/2x2s4", 128, 64, 2, 2, 4, "", 1},
    {"128x128/2x4s3+k2", 128, 128, 2, 4, 3, "", 2},
    {"128x128/2x4s3+all+k2", 128, 128, 2, 4, 3, ALL, 2},
    {"128x128/2x2s3+all+k2", 128, 128, 2, 2, 3, ALL, 2},
    {"128x128/2x4s3+all-db+k2", 128, 128, 2, 4, 3, " -D BAR_PTX=1 -D HOIST=1 -D RASTER=8", 2},
};
static const Tile TILES2[] = {
    {"128x128/2x4s3", 128, 128, 2, 4, 3, "", 1},
    {"128x128/2x2s3+pipe", 128, 128, 2, 2, 3, PIPE, 1},
    {"128x128/2x4s3+pipe", 128, 128, 2, 4, 3, PIPE, 1},
    {"128x64/2x2s4+pipe", 128, 64, 2, 2, 4, PIPE, 1},
    {"128x128/2x2s3+pipe+l2pf", 128, 128, 2, 2, 3, PIPE " -D L2PF=1", 1},
    {"128x128/2x2s3+pipe+r16", 128, 128, 2, 2, 3, PIPE " -D RASTER=16", 1},
    {"128x128/2x4s3+hoist+r8+l2pf", 128, 128, 2, 4, 3, " -D HOIST=1 -D RASTER=8 -D L2PF=1", 1},
    {"128x128/2x2s3+pipe+diag-nocopy", 128, 128, 2, 2, 3, PIPE " -D DIAG_NOCOPY=1", 1},
    {"128x128/2x2s3+pipe+diag-nocopy-nobar", 128, 128, 2, 2, 3, PIPE " -D DIAG_NOCOPY=1 -D DIAG_NOBAR=1", 1},
    {"128x128/2x4s3+diag-nocopy", 128, 128, 2, 4, 3, " -D DIAG_NOCOPY=1", 1},
    {"128x128/2x4s3+diag-nocopy-nobar", 128, 128, 2, 4, 3, " -D DIAG_NOCOPY=1 -D DIAG_NOBAR=1", 1},
    {"128x128/2x2s3+pipe(again)", 128, 128, 2, 2, 3, PIPE, 1},
    {"128x128/2x4s3(again)", 128, 128, 2, 4, 3, "", 1},
};

// Session 8 (GEMM_SET unset): BK = 16 (twice the stages, or 128 x 256 / 256 x 128 with 4 stages
// in 48 KiB), the same-tile diagnostic (DIAG_SAME: every workgroup, or every one in a 4 x 4 group of
// tiles, reads the same operands: L2 hits at the same bytes per FLOP; wrong results on purpose).
// "+hrs" is the kernel's HOISTED (what kpc's `with_hoist` builds: PIPELINED's HOIST, RASTER 8 and
// SERP without its FRAG_DB, which BK = 16 cannot have).
#define HRS " -D HOISTED=1"
#define K16 " -D BK=16"
static const Tile TILES3[] = {
    {"128x128/2x4s3", 128, 128, 2, 4, 3, "", 1},
    {"128x128/2x2s3+pipe", 128, 128, 2, 2, 3, PIPE, 1},
    {"128x128/2x4s3+hrs", 128, 128, 2, 4, 3, HRS, 1},
    {"128x128/2x4s3+diag-same1", 128, 128, 2, 4, 3, " -D DIAG_SAME=1", 1},
    {"128x128/2x4s3+diag-same4", 128, 128, 2, 4, 3, " -D DIAG_SAME=4", 1},
    {"128x128/2x2s3+pipe+diag-same1", 128, 128, 2, 2, 3, PIPE " -D DIAG_SAME=1", 1},
    {"128x128/2x2s3+pipe+diag-same4", 128, 128, 2, 2, 3, PIPE " -D DIAG_SAME=4", 1},
    {"128x128/2x4s3+diag-nocopy", 128, 128, 2, 4, 3, " -D DIAG_NOCOPY=1", 1},
    {"128x256/2x4s4k16", 128, 256, 2, 4, 4, K16, 1},
    {"128x256/2x4s4k16+hrs", 128, 256, 2, 4, 4, K16 HRS, 1},
    {"256x128/4x2s4k16+hrs", 256, 128, 4, 2, 4, K16 HRS, 1},
    {"128x256/2x4s4k16+hrs+diag-same1", 128, 256, 2, 4, 4, K16 HRS " -D DIAG_SAME=1", 1},
    {"128x128/2x4s6k16", 128, 128, 2, 4, 6, K16, 1},
    {"128x128/2x4s6k16+hrs", 128, 128, 2, 4, 6, K16 HRS, 1},
    {"128x128/2x4s4k16+hrs", 128, 128, 2, 4, 4, K16 HRS, 1},
    {"128x128/2x4s3k16+hrs", 128, 128, 2, 4, 3, K16 HRS, 1},
    {"128x128/2x2s6k16+hrs", 128, 128, 2, 2, 6, K16 HRS, 1},
    {"128x128/2x2s4k16+hrs", 128, 128, 2, 2, 4, K16 HRS, 1},
    {"128x64/2x2s6k16+hrs", 128, 64, 2, 2, 6, K16 HRS, 1},
    {"128x128/2x4s4k16+hrs+k2", 128, 128, 2, 4, 4, K16 HRS, 2},
    // 3 workgroups of 4 warps per SM (at most 168 registers): more copies in flight per SM (the
    // H200's driver did not honour the cap: 220 registers, session 8 call 2).
    {"128x128/2x2s3+hrs+r168", 128, 128, 2, 2, 3, HRS " -cl-nv-maxrregcount=168", 1},
    {"128x128/2x2s6k16+hrs+r168", 128, 128, 2, 2, 6, K16 HRS " -cl-nv-maxrregcount=168", 1},
    {"128x128/2x4s3(again)", 128, 128, 2, 4, 3, "", 1},
};

// Host data: A (logical [m][k], fp16 values; kept as f32 and fp16 bits), W [n][k] fp16, bias.
typedef struct {
  cl_mem a16, a32, w, bias, c[3], a16cast;
  float *ha;      // logical A values (fp16-exact), row-major
  uint16_t *hw;   // W bits
  float *hbias;
} Data;

static void set_args(cl_kernel kern, cl_mem a, Data *dd, const Shape *s) {
  CHECK(clSetKernelArg(kern, 0, sizeof(cl_mem), &a));
  CHECK(clSetKernelArg(kern, 1, sizeof(cl_mem), &dd->w));
  CHECK(clSetKernelArg(kern, 2, sizeof(cl_mem), &dd->bias));
  for (int i = 0; i < 3; i++) CHECK(clSetKernelArg(kern, 3 + i, sizeof(cl_mem), &dd->c[i]));
  unsigned v[8] = {s->m, s->n, s->k, s->n0, s->n1, s->a_seq, s->c_seq, s->d};
  for (int i = 0; i < 8; i++) CHECK(clSetKernelArg(kern, 6 + i, sizeof(unsigned), &v[i]));
  CHECK(clSetKernelArg(kern, 14, sizeof(float), &s->alpha0));
}

static size_t widths_of(const Shape *s, int i) {
  return i == 0 ? s->n0 : i == 1 ? s->n1 : s->n - s->n0 - s->n1;
}

// Enqueues one launch; with split-K, the zeroing of the outputs first (*first: the first event of
// the launch, for timing from its start; NULL: not wanted).
static cl_event launch2(cl_kernel kern, const Tile *t, const Shape *s, Data *dd, cl_event *first) {
  if (first) *first = NULL;
  if (t->split > 1) {
    float zero = 0.0f;
    for (int i = 0; i < 3; i++) {
      size_t wdt = widths_of(s, i);
      if (!wdt) continue;
      cl_event ev;
      CHECK(clEnqueueFillBuffer(q, dd->c[i], &zero, 4, 0, (size_t)s->m * wdt * 4, 0, NULL, &ev));
      if (first && !*first)
        *first = ev;
      else
        clReleaseEvent(ev);
    }
  }
  size_t local = (size_t)t->wm * t->wn * 32;
  size_t global[3] = {(s->n + t->bn - 1) / t->bn * local, (s->m + t->bm - 1) / t->bm, t->split};
  size_t loc[3] = {local, 1, 1};
  cl_event ev;
  CHECK(clEnqueueNDRangeKernel(q, kern, 3, NULL, global, loc, 0, NULL, &ev));
  return ev;
}

static double ev_ms(cl_event ev) {
  cl_ulong t0, t1;
  CHECK(clWaitForEvents(1, &ev));
  clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
  clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
  clReleaseEvent(ev);
  return (t1 - t0) / 1e6;
}

// Device ms from the start of `first` (NULL: of `last`) to the end of `last`.
static double span_ms(cl_event first, cl_event last) {
  cl_ulong t0, t1;
  CHECK(clWaitForEvents(1, &last));
  clGetEventProfilingInfo(first ? first : last, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
  clGetEventProfilingInfo(last, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
  if (first) clReleaseEvent(first);
  clReleaseEvent(last);
  return (t1 - t0) / 1e6;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

// Median device ms of 7 launches (with split-K: from the zeroing's start) after 150 ms of the same.
static double time_ms(cl_kernel kern, const Tile *t, const Shape *s, Data *dd) {
  double t0 = now_s();
  cl_event f;
  while (now_s() - t0 < 0.15) {
    cl_event e = launch2(kern, t, s, dd, &f);
    span_ms(f, e);
  }
  double ms[7];
  for (int i = 0; i < 7; i++) {
    cl_event e = launch2(kern, t, s, dd, &f);
    ms[i] = span_ms(f, e);
  }
  qsort(ms, 7, sizeof(double), cmpd);
  return ms[3];
}

// Uploads A in shape s's layout (fp16 and f32), poisons the outputs, runs, and checks `rows` rows
// (all when rows == 0) of every output. Returns the worst |err| / sum |a w| (and prints it).
static double check(cl_kernel kern, int a_f16, const Tile *t, Data *dd, const Shape *s, unsigned rows,
                    const char *label) {
  size_t m = s->m, n = s->n, k = s->k;
  uint16_t *a16 = malloc(m * k * 2);
  float *a32 = malloc(m * k * 4);
  for (size_t r = 0; r < m; r++)
    for (size_t c = 0; c < k; c++) {
      size_t at = split_at(r, c, k, s->a_seq, s->d);
      a16[at] = f2h(dd->ha[r * k + c]);
      a32[at] = dd->ha[r * k + c];
    }
  cl_mem a = a_f16 ? dd->a16 : dd->a32;
  CHECK(clEnqueueWriteBuffer(q, a, CL_TRUE, 0, m * k * (a_f16 ? 2 : 4), a_f16 ? (void *)a16 : a32,
                             0, NULL, NULL));
  size_t widths[3] = {s->n0, s->n1, n - s->n0 - s->n1};
  float *out[3];
  float poison = -12345.0f;
  for (int i = 0; i < 3; i++) {
    out[i] = malloc((m * widths[i] + 1) * 4);
    if (widths[i])
      CHECK(clEnqueueFillBuffer(q, dd->c[i], &poison, 4, 0, m * widths[i] * 4, 0, NULL, NULL));
  }
  set_args(kern, a, dd, s);
  ev_ms(launch2(kern, t, s, dd, NULL));
  for (int i = 0; i < 3; i++)
    if (widths[i])
      CHECK(clEnqueueReadBuffer(q, dd->c[i], CL_TRUE, 0, m * widths[i] * 4, out[i], 0, NULL, NULL));
  double worst = 0;
  size_t bad = 0, checked = 0;
  unsigned step = rows ? (s->m + rows - 1) / rows : 1;
  for (size_t r = 0; r < m; r += step) {
    for (size_t c = 0; c < n; c++) {
      double sum = 0, mag = 0;
      for (size_t j = 0; j < k; j++) {
        double p = (double)dd->ha[r * k + j] * h2f(dd->hw[c * k + j]);
        sum += p;
        mag += fabs(p);
      }
      sum += dd->hbias[c];
      mag += fabs(dd->hbias[c]);
      int o = c < s->n0 ? 0 : c < s->n0 + s->n1 ? 1 : 2;
      size_t cc = o == 0 ? c : o == 1 ? c - s->n0 : c - s->n0 - s->n1;
      if (o == 0) {
        sum *= s->alpha0;
        mag *= fabs(s->alpha0);
      }
      float got = out[o][split_at(r, cc, widths[o], s->c_seq, s->d)];
      double e = fabs(got - sum) / (mag + 1e-30);
      if (!(e <= 1e-4)) {
        if (bad < 3)
          printf("gemm-mma: %s: (%zu, %zu) got %g want %g\n", label, r, c, got, sum);
        bad++;
        e = isnan(e) ? 1e30 : e;
      }
      if (e > worst) worst = e;
      checked++;
    }
  }
  printf("gemm-mma: check %s: %ux%ux%u n0=%u n1=%u a_seq=%u c_seq=%u d=%u: %s, %zu of %zu wrong, "
         "worst |err|/sum|aw| %.2e\n",
         label, s->m, s->n, s->k, s->n0, s->n1, s->a_seq, s->c_seq, s->d, bad ? "FAIL" : "ok", bad,
         checked, worst);
  free(a16);
  free(a32);
  for (int i = 0; i < 3; i++) free(out[i]);
  return bad ? 1e30 : worst;
}

// With GEMM_PTX_DIR set: the program binary (PTX text on NVIDIA's OpenCL) into DIR/label.ptx, the
// label's '/', ':' and '+' as '_', for ptxas and cuobjdump on the host.
static void dump_ptx(cl_program p, const char *label) {
  const char *dir = getenv("GEMM_PTX_DIR");
  if (!dir) return;
  size_t n = 0;
  if (clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL) != CL_SUCCESS || !n) return;
  unsigned char *bin = malloc(n);
  unsigned char *bins[1] = {bin};
  if (clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS) {
    char path[512];
    int at = snprintf(path, sizeof path, "%s/", dir);
    for (const char *c = label; *c && at < 500; c++)
      path[at++] = (*c == '/' || *c == ':' || *c == '+') ? '_' : *c;
    snprintf(path + at, sizeof path - at, ".ptx");
    FILE *f = fopen(path, "wb");
    if (f) {
      fwrite(bin, 1, n, f);
      fclose(f);
    }
  }
  free(bin);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    printf("usage: %s mha_gemm_mma.cl ptx_probe.cl [variant-substring]\n", argv[0]);
    return 2;
  }
  const char *want = argc > 3 ? argv[3] : "";
  int emulate = getenv("GEMM_EMULATE") && atoi(getenv("GEMM_EMULATE"));
  cl_platform_id plats[8];
  cl_uint np = 0;
  CHECK(clGetPlatformIDs(8, plats, &np));
  cl_platform_id plat = 0;
  for (cl_uint i = 0; i < np; i++) {
    char name[256] = {0};
    clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
    if (!plat && (emulate || strstr(name, "NVIDIA"))) plat = plats[i];
  }
  if (!plat) {
    printf("gemm-mma: no NVIDIA platform\n");
    return 2;
  }
  CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
  char dname[256] = {0}, dver[256] = {0};
  cl_ulong lmem = 0;
  clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname, dname, NULL);
  clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof dver, dver, NULL);
  clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL);
  printf("gemm-mma: device %s, driver %s, local memory %llu bytes\n", dname, dver,
         (unsigned long long)lmem);
  cl_int err;
  ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  CHECK(err);
  q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
  CHECK(err);

  char *probe = slurp(argv[2]);
  cl_program pp = build(probe, "-cl-kernel-arg-info", "ptx_probe");
  printf("gemm-mma: kpc's inline-PTX probe: %s\n", pp ? "built" : "REFUSED");

  // Does the driver take more local memory than CL_DEVICE_LOCAL_MEM_SIZE as a `local` kernel
  // argument (what a 4-stage 128 x 128 or a K = 64 step would need)? Each size: set, launch, check.
  // Only with GEMM_LOCAL_PROBE=1, and nothing else then (a failed launch can spoil the context).
  if (!emulate && getenv("GEMM_LOCAL_PROBE")) {
    const char *lm_src =
        "kernel void lm(global uint *o, local uint *s, uint n) { uint l = get_local_id(0);"
        " for (uint i = l; i < n; i += 256) s[i] = i * 3u; barrier(CLK_LOCAL_MEM_FENCE);"
        " uint at = (l * 977u + get_group_id(0) * 131u) % n; o[get_global_id(0)] = s[at]; }";
    cl_program lp = build(lm_src, "", "local-probe");
    cl_kernel lk = lp ? clCreateKernel(lp, "lm", &err) : NULL;
    cl_mem lo = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 264 * 256 * 4, NULL, &err);
    const size_t sizes[] = {48 * 1024, 64 * 1024, 96 * 1024, 160 * 1024, 227 * 1024};
    for (int i = 0; lk && i < 5; i++) {
      cl_uint n = (cl_uint)(sizes[i] / 4);
      cl_int e1 = clSetKernelArg(lk, 0, sizeof(cl_mem), &lo);
      cl_int e2 = clSetKernelArg(lk, 1, sizes[i], NULL);
      cl_int e3 = clSetKernelArg(lk, 2, sizeof n, &n);
      size_t g = 264 * 256, l = 256;
      cl_int e4 = clEnqueueNDRangeKernel(q, lk, 1, NULL, &g, &l, 0, NULL, NULL);
      cl_int e5 = clFinish(q);
      int bad = -1;
      if (e4 == CL_SUCCESS && e5 == CL_SUCCESS) {
        cl_uint *h = malloc(g * 4);
        clEnqueueReadBuffer(q, lo, CL_TRUE, 0, g * 4, h, 0, NULL, NULL);
        bad = 0;
        for (size_t j = 0; j < g; j++)
          if (h[j] != ((cl_uint)(((j % 256) * 977u + (j / 256) * 131u) % n)) * 3u) bad++;
        free(h);
      }
      printf("gemm-mma: local-probe %zu bytes as a kernel argument: set %d %d %d, launch %d, finish %d, "
             "%d wrong\n", sizes[i], e1, e2, e3, e4, e5, bad);
      if (e5 != CL_SUCCESS) break;
    }
    return 0;
  }

  char *src = slurp(argv[1]);
  // The cast pass for f32 A: 8 floats -> 8 halves per work-item.
  const char *cast_src =
      "kernel void cast(global const float *a, global half *o) { size_t i = get_global_id(0);"
      " vstore_half8(vload8(i, a), i, o); }";
  cl_program cp = build(cast_src, "", "cast");
  cl_kernel cast = clCreateKernel(cp, "cast", &err);
  CHECK(err);

  // N up to 12288: the layer's fused Q/K/V projection (timed only on the device).
  size_t MAXM = 8192, MAXN = emulate ? 4096 : 12288, MAXK = 4096;
  Data dd;
  dd.ha = malloc(MAXM * MAXK * 4);
  dd.hw = malloc(MAXN * MAXK * 2);
  dd.hbias = malloc(MAXN * 4);
  for (size_t i = 0; i < MAXM * MAXK; i++) dd.ha[i] = h2f(f2h(frand()));
  for (size_t i = 0; i < MAXN * MAXK; i++) dd.hw[i] = f2h(frand() / 64.0f);
  for (size_t i = 0; i < MAXN; i++) dd.hbias[i] = frand();
  dd.a16 = clCreateBuffer(ctx, CL_MEM_READ_WRITE, MAXM * MAXK * 2, NULL, &err);
  CHECK(err);
  dd.a32 = clCreateBuffer(ctx, CL_MEM_READ_WRITE, MAXM * MAXK * 4, NULL, &err);
  CHECK(err);
  dd.w = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, MAXN * MAXK * 2, dd.hw, &err);
  CHECK(err);
  dd.bias = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, MAXN * 4, dd.hbias, &err);
  CHECK(err);
  for (int i = 0; i < 3; i++) {
    dd.c[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, MAXM * MAXN * 4, NULL, &err);
    CHECK(err);
  }

  // Check shapes: edge tiles with K off the step; W at its own width (the weights buffer is read
  // as [n][k] with k the shape's: re-upload W for each k); split layouts into three outputs.
  const Shape small[] = {
      {333, 264, 200, 264, 0, 0, 0, 8, 1.0f},
      {130, 520, 72, 520, 0, 0, 0, 8, 1.0f},
      {2 * 100, 3 * 256, 512, 256, 256, 100, 100, 64, 0.125f},
      {257, 384, 4096, 128, 128, 0, 0, 64, 0.5f},
  };
  const Shape timed[] = {
      {2048, 4096, 4096, 4096, 0, 0, 0, 8, 1.0f},
      {8192, 4096, 4096, 4096, 0, 0, 0, 8, 1.0f},
      {2048, 1024, 4096, 1024, 0, 0, 0, 8, 1.0f},
      {8192, 1024, 4096, 1024, 0, 0, 0, 8, 1.0f},
      // The fused Q/K/V projection as the layer launches it (batch 1, 32 heads of 128): three
      // outputs split by heads, the first scaled.
      {2048, 12288, 4096, 4096, 4096, 0, 2048, 128, 0.088388f},
      {8192, 12288, 4096, 4096, 4096, 0, 8192, 128, 0.088388f},
  };
  // The weights for k: W's first n rows of k (dd.hw holds them as [n][MAXK]; compacted per k).
  uint16_t *wk = malloc(MAXN * MAXK * 2);
  unsigned cur_k = 0;
#define USE_K(kk)                                                                                 \
  do {                                                                                            \
    if (cur_k != (kk)) {                                                                          \
      cur_k = (kk);                                                                               \
      for (size_t r = 0; r < MAXN; r++) memcpy(wk + r * cur_k, hw_full + r * MAXK, cur_k * 2);    \
      CHECK(clEnqueueWriteBuffer(q, dd.w, CL_TRUE, 0, MAXN * cur_k * 2, wk, 0, NULL, NULL));      \
      memcpy(dd.hw, wk, MAXN * cur_k * 2);                                                        \
    }                                                                                             \
  } while (0)
  uint16_t *hw_full = malloc(MAXN * MAXK * 2);
  memcpy(hw_full, dd.hw, MAXN * MAXK * 2);
  // The host reference reads A as [m][k] with k the shape's: keep a compacted copy per k too.
  float *ha_full = dd.ha;
  float *ha_k = malloc(MAXM * MAXK * 4);

  double cast_ms[2] = {0, 0};
  if (!emulate) {
    // The cast pass at M x K = 2048 / 8192 x 4096.
    for (int i = 0; i < 2; i++) {
      size_t mk = (i ? 8192 : 2048) * MAXK;
      CHECK(clSetKernelArg(cast, 0, sizeof(cl_mem), &dd.a32));
      CHECK(clSetKernelArg(cast, 1, sizeof(cl_mem), &dd.a16));
      size_t g = mk / 8, l = 256;
      double t0 = now_s();
      cl_event ev;
      while (now_s() - t0 < 0.1) {
        CHECK(clEnqueueNDRangeKernel(q, cast, 1, NULL, &g, &l, 0, NULL, &ev));
        ev_ms(ev);
      }
      double ms[7];
      for (int r = 0; r < 7; r++) {
        CHECK(clEnqueueNDRangeKernel(q, cast, 1, NULL, &g, &l, 0, NULL, &ev));
        ms[r] = ev_ms(ev);
      }
      qsort(ms, 7, sizeof(double), cmpd);
      cast_ms[i] = ms[3];
      printf("gemm-mma: cast f32 -> fp16 of %zu x 4096: %.4f ms (%.0f GB/s)\n", mk / MAXK, ms[3],
             mk * 6 / (ms[3] * 1e-3) / 1e9);
    }
  }

  const char *quals[2] = {"", " -D MMA_QUAL=volatile"};
  int set = getenv("GEMM_SET") ? atoi(getenv("GEMM_SET")) : 3;
  const Tile *tiles = set == 1 ? TILES1 : set == 2 ? TILES2 : TILES3;
  size_t ntiles = set == 1   ? sizeof TILES1 / sizeof TILES1[0]
                  : set == 2 ? sizeof TILES2 / sizeof TILES2[0]
                             : sizeof TILES3 / sizeof TILES3[0];
  for (size_t ti = 0; ti < ntiles; ti++) {
    const Tile *t = &tiles[ti];
    for (int a_f16 = 1; a_f16 >= 0; a_f16--) {
      char label[96];
      snprintf(label, sizeof label, "%s:%s", t->name, a_f16 ? "a16" : "a32");
      if (!strstr(label, want)) continue;
      if (!a_f16 && ((t->defs[0] && strcmp(t->defs, PIPE)) || t->split > 1) && !getenv("GEMM_ALL_A32"))
        continue;
      cl_program p = NULL;
      char opts[512];
      for (int qi = 0; qi < 2 && !p; qi++) {
        snprintf(opts, sizeof opts,
                 "-cl-kernel-arg-info -D A_F16=%d -D BM=%d -D BN=%d -D WARPS_M=%d -D WARPS_N=%d "
                 "-D STAGES=%d -D SPLIT_K=%d%s%s%s",
                 a_f16, t->bm, t->bn, t->wm, t->wn, t->stages, t->split, t->defs,
                 emulate ? " -D PTX_EMULATE" : " -cl-nv-verbose", quals[qi]);
        p = build(src, opts, label);
      }
      if (!p) continue;
      dump_ptx(p, label);
      cl_kernel kern = clCreateKernel(p, "mha_gemm_mma", &err);
      CHECK(err);
      size_t priv = 0, loc = 0;
      clGetKernelWorkGroupInfo(kern, dev, CL_KERNEL_PRIVATE_MEM_SIZE, sizeof priv, &priv, NULL);
      clGetKernelWorkGroupInfo(kern, dev, CL_KERNEL_LOCAL_MEM_SIZE, sizeof loc, &loc, NULL);
      printf("gemm-mma: %s: built%s; private %zu bytes, local %zu bytes\n", label,
             strstr(opts, "volatile") ? " (volatile mma)" : "", priv, loc);
      int ok = 1;
      for (size_t si = 0; si < sizeof small / sizeof small[0] - (emulate ? 1 : 0); si++) {
        const Shape *s = &small[si];
        USE_K(s->k);
        for (size_t r = 0; r < s->m; r++) memcpy(ha_k + r * s->k, ha_full + r * MAXK, s->k * 4);
        dd.ha = ha_k;
        if (check(kern, a_f16, t, &dd, s, 0, label) > 1e-4) ok = 0;
        dd.ha = ha_full;
      }
      for (size_t si = 0; si < (emulate ? 0 : sizeof timed / sizeof timed[0]); si++) {
        const Shape *s = &timed[si];
        USE_K(s->k);
        dd.ha = ha_full; // k == MAXK
        if (si != 2 && si != 3 && check(kern, a_f16, t, &dd, s, 3, label) > 1e-4) ok = 0;
        set_args(kern, a_f16 ? dd.a16 : dd.a32, &dd, s);
        double ms = time_ms(kern, t, s, &dd);
        double fl = 2.0 * s->m * s->n * s->k;
        printf("gemm-mma: time %s %ux%ux%u: %.4f ms, %.1f TFLOP/s%s", label, s->m, s->n, s->k, ms,
               fl / (ms * 1e-3) / 1e12, ok ? "" : " (CHECK FAILED)");
        if (a_f16) {
          double both = ms + cast_ms[s->m == 8192];
          printf("; with the cast pass for f32 A: %.4f ms, %.1f TFLOP/s", both,
                 fl / (both * 1e-3) / 1e12);
        }
        printf("\n");
      }
      clReleaseKernel(kern);
      clReleaseProgram(p);
    }
  }
  return 0;
}
