// Issue 41, item 5: harness for attn_prefill_mma.cl (causal prefill on mma.sync through inline PTX in
// OpenCL C). Builds each variant (VARIANTS: `label|-D options` lines; default the list below),
// prints the build log (ptxas's resource report with -cl-nv-verbose on NVIDIA), checks the output
// against a float64 host reference on shapes that end mid-tile (chunked, GQA, a poisoned cache past
// its length, the output poisoned before each run), then times B=1, H=32, D=128 causal prefill at
// SWEEP_L lengths (profiling events, median of RUNS after warm-up; TFLOP/s counted as 2·B·H·L²·D).
//   gcc -O2 -o ocl_prefill_mma benches/ocl_prefill_mma.c -lOpenCL -lm
//   ./ocl_prefill_mma NVIDIA kpc-attention/kernels/attn_prefill_mma.cl            # the PTX kernel
//   ./ocl_prefill_mma Portable kpc-attention/kernels/attn_prefill_mma.cl benches/ocl_prefill_mma_emu.h
// With a third argument (a prelude: the emulated primitives) only the checks run, at D=64 and 128.
// PTX_DIR (a folder): on NVIDIA each variant's program binary (PTX) is written there as LABEL.ptx.
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cl_int e_ = (x);                                                                           \
        if (e_ != CL_SUCCESS) {                                                                    \
            printf("ocl-prefill: %s failed: %d (line %d)\n", #x, e_, __LINE__);                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static cl_context ctx;
static cl_command_queue queue;
static cl_device_id dev;
static int nvidia;
static const char *cur_label = "kernel";

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("ocl-prefill: cannot read %s\n", path);
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

static uint16_t f2h(float f) {
    _Float16 h = (_Float16)f;
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

static cl_kernel build(const char *src, const char *prelude, const char *opts, int *ok) {
    const char *parts[2];
    int n = 0;
    if (prelude) parts[n++] = prelude;
    parts[n++] = src;
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx, n, parts, NULL, &err);
    CHECK(err);
    char full[1024];
    snprintf(full, sizeof full, "%s%s", opts, nvidia ? " -cl-nv-verbose" : "");
    cl_int built = clBuildProgram(prog, 1, &dev, full, NULL, NULL);
    size_t logn = 0;
    clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &logn);
    char *log = calloc(logn + 1, 1);
    clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, logn, log, NULL);
    printf("ocl-prefill: build [%s] %s (%d); log:\n%s\n", full, built == CL_SUCCESS ? "ok" : "FAILED",
           built, logn > 1 ? log : "(empty)");
    free(log);
    *ok = built == CL_SUCCESS;
    if (!*ok) return NULL;
    if (nvidia) { // the PTX: count the instructions that matter
        size_t binn = 0;
        clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof binn, &binn, NULL);
        unsigned char *bin = calloc(binn + 1, 1);
        clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL);
        const char *dir = getenv("PTX_DIR");
        if (dir) { // the PTX, for ptxas and cuobjdump
            char path[512];
            snprintf(path, sizeof path, "%s/%s.ptx", dir, cur_label);
            FILE *f = fopen(path, "wb");
            if (f) fwrite(bin, 1, binn, f), fclose(f);
        }
        const char *keys[] = {"mma.sync", "ldmatrix", "cp.async.cg", "ld.local", "st.local", "bar.sync"};
        printf("ocl-prefill: ptx:");
        for (int i = 0; i < 6; i++) {
            int c = 0;
            for (char *p = (char *)bin; (p = strstr(p, keys[i])); p++) c++;
            printf(" %s=%d", keys[i], c);
        }
        printf("\n");
        free(bin);
    }
    cl_kernel k = clCreateKernel(prog, "attn_prefill_mma", &err);
    CHECK(err);
    return k;
}

typedef struct {
    int batch, q_heads, kv_heads, d, q_len, kv_len, capacity;
} Shape;

// Runs one prefill; returns device ms.
static int wg = 128;
static double launch(cl_kernel k, const Shape *s, int bq, cl_mem q, cl_mem kb, cl_mem vb, cl_mem o) {
    cl_uint ql = s->q_len, kl = s->kv_len, cap = s->capacity, qh = s->q_heads,
            grp = s->q_heads / s->kv_heads;
    float scale = 1.0f / sqrtf((float)s->d);
    CHECK(clSetKernelArg(k, 0, sizeof q, &q));
    CHECK(clSetKernelArg(k, 1, sizeof kb, &kb));
    CHECK(clSetKernelArg(k, 2, sizeof vb, &vb));
    CHECK(clSetKernelArg(k, 3, sizeof o, &o));
    CHECK(clSetKernelArg(k, 4, sizeof ql, &ql));
    CHECK(clSetKernelArg(k, 5, sizeof kl, &kl));
    CHECK(clSetKernelArg(k, 6, sizeof cap, &cap));
    CHECK(clSetKernelArg(k, 7, sizeof qh, &qh));
    CHECK(clSetKernelArg(k, 8, sizeof grp, &grp));
    CHECK(clSetKernelArg(k, 9, sizeof scale, &scale));
    size_t local[2] = {(size_t)wg, 1};
    size_t global[2] = {(size_t)s->batch * s->q_heads * wg, (size_t)((s->q_len + bq - 1) / bq)};
    cl_event ev;
    CHECK(clEnqueueNDRangeKernel(queue, k, 2, NULL, global, local, 0, NULL, &ev));
    CHECK(clWaitForEvents(1, &ev));
    cl_ulong t0 = 0, t1 = 0;
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    clReleaseEvent(ev);
    return (t1 - t0) / 1e6;
}

// Fresh random inputs, the cache poisoned (fp16 NaN) past kv_len, the output poisoned (NaN); checks
// every element against float64 sums over the fp16-rounded K/V. Returns 1 when it passes.
static int check(cl_kernel k, const Shape *s, int bq, float qmul) {
    size_t qn = (size_t)s->batch * s->q_heads * s->q_len * s->d;
    size_t kn = (size_t)s->batch * s->kv_heads * s->capacity * s->d;
    float *q = malloc(qn * 4), *o = malloc(qn * 4);
    uint16_t *kh = malloc(kn * 2), *vh = malloc(kn * 2);
    for (size_t i = 0; i < qn; i++) q[i] = frand() * qmul, o[i] = NAN;
    for (size_t i = 0; i < kn; i++) {
        size_t pos = (i / s->d) % s->capacity;
        kh[i] = pos < (size_t)s->kv_len ? f2h(frand()) : 0x7e00;
        vh[i] = pos < (size_t)s->kv_len ? f2h(frand()) : 0x7e00;
    }
    cl_int err;
    cl_mem qb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, qn * 4, q, &err);
    CHECK(err);
    cl_mem kb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, kn * 2, kh, &err);
    CHECK(err);
    cl_mem vb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, kn * 2, vh, &err);
    CHECK(err);
    cl_mem ob = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, qn * 4, o, &err);
    CHECK(err);
    launch(k, s, bq, qb, kb, vb, ob);
    CHECK(clEnqueueReadBuffer(queue, ob, CL_TRUE, 0, qn * 4, o, 0, NULL, NULL));
    double num = 0, den = 0, worst = 0;
    long bad = 0;
    int group = s->q_heads / s->kv_heads, offset = s->kv_len - s->q_len;
    double scale = 1.0 / sqrt((double)s->d);
    double *p = malloc(sizeof(double) * s->kv_len);
    for (int b = 0; b < s->batch; b++)
        for (int h = 0; h < s->q_heads; h++) {
            size_t krow = ((size_t)b * s->kv_heads + h / group) * s->capacity;
            for (int i = 0; i < s->q_len; i++) {
                const float *qi = q + (((size_t)b * s->q_heads + h) * s->q_len + i) * s->d;
                const float *oi = o + (((size_t)b * s->q_heads + h) * s->q_len + i) * s->d;
                int n = offset + i + 1;
                double mx = -1e300, sum = 0;
                for (int j = 0; j < n; j++) {
                    double dot = 0;
                    for (int x = 0; x < s->d; x++) dot += (double)qi[x] * h2f(kh[(krow + j) * s->d + x]);
                    p[j] = dot * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j < n; j++) sum += (p[j] = exp(p[j] - mx));
                for (int x = 0; x < s->d; x++) {
                    double r = 0;
                    for (int j = 0; j < n; j++) r += p[j] * h2f(vh[(krow + j) * s->d + x]);
                    r /= sum;
                    double e = fabs(oi[x] - r);
                    if (!(e == e) || isinf(oi[x])) bad++;
                    else {
                        num += e * e;
                        if (e > worst) worst = e;
                    }
                    den += r * r;
                }
            }
        }
    double rel = sqrt(num / den);
    int pass = bad == 0 && rel < 2e-3;
    printf("ocl-prefill: check B=%d H=%d Hkv=%d D=%d q_len=%d kv_len=%d cap=%d q x%g: rel %.3e, max abs "
           "%.3e, %ld not finite: %s\n",
           s->batch, s->q_heads, s->kv_heads, s->d, s->q_len, s->kv_len, s->capacity, qmul, rel, worst,
           bad, pass ? "pass" : "FAIL");
    free(p), free(q), free(o), free(kh), free(vh);
    clReleaseMemObject(qb), clReleaseMemObject(kb), clReleaseMemObject(vb), clReleaseMemObject(ob);
    return pass;
}

static double bench(cl_kernel k, int bq, int L, int runs) {
    Shape s = {1, 32, 32, 128, L, L, L};
    size_t qn = (size_t)32 * L * 128;
    float *q = malloc(qn * 4);
    uint16_t *kh = malloc(qn * 2);
    for (size_t i = 0; i < qn; i++) q[i] = frand(), kh[i] = f2h(frand());
    cl_int err;
    cl_mem qb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, qn * 4, q, &err);
    CHECK(err);
    cl_mem kb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, qn * 2, kh, &err);
    CHECK(err);
    for (size_t i = 0; i < qn; i++) kh[i] = f2h(frand());
    cl_mem vb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, qn * 2, kh, &err);
    CHECK(err);
    cl_mem ob = clCreateBuffer(ctx, CL_MEM_READ_WRITE, qn * 4, NULL, &err);
    CHECK(err);
    double ms[64];
    for (int i = 0; i < 5; i++) launch(k, &s, bq, qb, kb, vb, ob);
    for (int i = 0; i < runs; i++) ms[i] = launch(k, &s, bq, qb, kb, vb, ob);
    for (int i = 0; i < runs; i++)
        for (int j = i + 1; j < runs; j++)
            if (ms[j] < ms[i]) {
                double x = ms[i];
                ms[i] = ms[j];
                ms[j] = x;
            }
    free(q), free(kh);
    clReleaseMemObject(qb), clReleaseMemObject(kb), clReleaseMemObject(vb), clReleaseMemObject(ob);
    double med = ms[runs / 2];
    return 2.0 * 32 * (double)L * L * 128 / (med * 1e-3) / 1e12;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        printf("usage: %s platform-substring kernel.cl [prelude.h]\n", argv[0]);
        return 1;
    }
    const char *src = slurp(argv[2]);
    const char *prelude = argc > 3 ? slurp(argv[3]) : NULL;
    cl_platform_id plats[8];
    cl_uint np = 0;
    CHECK(clGetPlatformIDs(8, plats, &np));
    cl_platform_id plat = 0;
    for (cl_uint i = 0; i < np; i++) {
        char name[256] = {0};
        clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (!plat && strstr(name, argv[1])) plat = plats[i];
    }
    if (!plat) {
        printf("ocl-prefill: no platform named like '%s'\n", argv[1]);
        return 2;
    }
    CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    char dname[256] = {0}, dver[256] = {0};
    clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname, dname, NULL);
    clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof dver, dver, NULL);
    nvidia = strstr(dname, "NVIDIA") || strstr(dname, "H200") || strstr(dname, "H100");
    printf("ocl-prefill: device %s, driver %s\n", dname, dver);
    cl_int err;
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    queue = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    CHECK(err);

    const char *variants = getenv("VARIANTS");
    if (!variants)
        variants = "rb2k32|-D ROW_BLOCKS=2 -D KEYS=32\n"
                   "rb2k64|-D ROW_BLOCKS=2 -D KEYS=64\n"
                   "rb1k64|-D ROW_BLOCKS=1 -D KEYS=64\n";
    const char *sweep = getenv("SWEEP_L") ? getenv("SWEEP_L") : "2048 4096 8192";
    int runs = getenv("RUNS") ? atoi(getenv("RUNS")) : 7;
    if (runs > 64) runs = 64;
    char table[8192] = "";
    char *vl = strdup(variants);
    char *lines[32];
    int nlines = 0;
    for (char *line = strtok(vl, "\n"); line && nlines < 32; line = strtok(NULL, "\n")) lines[nlines++] = line;
    int all_pass = 1;
    for (int li = 0; li < nlines; li++) {
        char *line = lines[li];
        char *bar = strchr(line, '|');
        if (!bar) continue;
        *bar = 0;
        const char *label = line, *opts = bar + 1;
        cur_label = label;
        int rb = strstr(opts, "ROW_BLOCKS=1") ? 1 : 2;
        wg = strstr(opts, "WARPS=8") ? 256 : 128;
        int bq = wg / 2 * rb;
        int dims[2] = {128, 64};
        int pass = 1;
        for (int di = 0; di < (prelude ? 2 : 1) && pass; di++) {
            char o2[512];
            snprintf(o2, sizeof o2, "%s -D HEAD_DIM=%d", opts, dims[di]);
            int ok;
            cl_kernel k = build(src, prelude, o2, &ok);
            if (!ok) {
                pass = 0;
                break;
            }
            int d = dims[di];
            Shape shapes[] = {
                {1, 2, 2, d, 1, 1, 8},         {1, 2, 2, d, 77, 77, 90},    {2, 4, 2, d, 200, 200, 230},
                {1, 2, 1, d, 333, 333, 333},    {1, 2, 2, d, 45, 301, 320},  {1, 2, 2, d, 130, 130, 150},
                {1, 1, 1, d, 129, 1000, 1100},
            };
            int nshapes = prelude ? 6 : 7;
            for (int i = 0; i < nshapes; i++) pass &= check(k, &shapes[i], bq, 1.0f);
            pass &= check(k, &shapes[2], bq, 30.0f);
            if (!prelude && d == 128) {
                char row[512];
                int n = snprintf(row, sizeof row, "%-10s %s |", label, pass ? "pass" : "FAIL");
                for (const char *ls = sweep; pass && *ls;) {
                    int L = atoi(ls);
                    if (L > 0) n += snprintf(row + n, sizeof row - n, " L=%d %.1f", L, bench(k, bq, L, runs));
                    while (*ls && *ls != ' ') ls++;
                    while (*ls == ' ') ls++;
                }
                strcat(table, row);
                strcat(table, "\n");
            }
            clReleaseKernel(k);
        }
        all_pass &= pass;
        printf("ocl-prefill: variant %s: %s\n", label, pass ? "pass" : "FAIL");
    }
    printf("## attn_prefill_mma, B=1 H=32 D=128 causal, TFLOP/s (2*B*H*L^2*D, median of %d)\n%s", runs,
           table);
    return all_pass ? 0 : 3;
}
