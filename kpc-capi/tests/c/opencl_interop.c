/* kpc C API tests b, c, d on OpenCL: the program is the embedder. It creates its own cl_context and
 * in-order queue, hands them to kpc, gets the shipped saxpy kernel (OpenCL C read from
 * kernels/saxpy.cl), leases its cl_kernel, sets the arguments and enqueues it on its own queue,
 * and checks the output.
 *
 * usage: opencl_interop MODE DEVICE_INDEX SAXPY_CL BLOB_FILE
 *   build   b: the kernel must be compiled (an empty cache directory)
 *   disk    c: a new process on the same cache directory: the kernel must come from disk; also saves
 *           the kernel's cache blob to BLOB_FILE
 *   blob    d: a fresh cache directory; the kernel is made from BLOB_FILE without a build
 *           (backend stats: programs_built == 0)
 * DEVICE_INDEX counts devices over all platforms in order, as kpc's `opencl:N` does. The cache
 * directory is KPC_CACHE_DIR (kpc_config_from_env).
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdint.h>

#include "kpc_test.h"

#define CL_CHECK(call)                                                                             \
    do {                                                                                           \
        cl_int e_ = (call);                                                                        \
        if (e_ != CL_SUCCESS) {                                                                    \
            fprintf(stderr, "FAIL %s:%d: %s -> cl_int %d\n", __FILE__, __LINE__, #call, e_);       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define N 1000u
#define BIAS 2

/* Leases saxpy's cl_kernel, sets its arguments, enqueues it on the embedder's queue, checks
 * out[i] == a * x[i] + y[i] + BIAS. */
static void run_saxpy(cl_context clctx, cl_command_queue q, const kpc_kernel *k) {
    float x[N], y[N], out[N];
    for (uint32_t i = 0; i < N; i++) {
        x[i] = (float)i * 0.5f;
        y[i] = 100.0f - (float)i;
        out[i] = -1.0f;
    }
    cl_int err;
    cl_mem bx = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof x, x, &err);
    CL_CHECK(err);
    cl_mem by = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof y, y, &err);
    CL_CHECK(err);
    cl_mem bo = clCreateBuffer(clctx, CL_MEM_WRITE_ONLY, sizeof out, NULL, &err);
    CL_CHECK(err);

    kpc_lease *lease = NULL;
    CHECK(kpc_lease_acquire(k, &lease));
    void *raw = NULL;
    CHECK(kpc_lease_cl_kernel(lease, &raw));
    cl_kernel ck = (cl_kernel)raw;
    char name[64] = {0};
    CL_CHECK(clGetKernelInfo(ck, CL_KERNEL_FUNCTION_NAME, sizeof name - 1, name, NULL));
    printf("leased cl_kernel %p (%s)\n", raw, name);
    ASSERT(strcmp(name, "saxpy") == 0, "the lease is saxpy's");
    /* A second lease is another kernel object: the first is exclusive while held. */
    kpc_lease *second = NULL;
    void *raw2 = NULL;
    CHECK(kpc_lease_acquire(k, &second));
    CHECK(kpc_lease_cl_kernel(second, &raw2));
    ASSERT(raw2 != raw, "two live leases share a cl_kernel");
    CHECK(kpc_lease_release(second));

    cl_uint n = N;
    cl_float a = 3.0f;
    CL_CHECK(clSetKernelArg(ck, 0, sizeof bx, &bx));
    CL_CHECK(clSetKernelArg(ck, 1, sizeof by, &by));
    CL_CHECK(clSetKernelArg(ck, 2, sizeof bo, &bo));
    CL_CHECK(clSetKernelArg(ck, 3, sizeof n, &n));
    CL_CHECK(clSetKernelArg(ck, 4, sizeof a, &a));
    kpc_kernel_info ki;
    memset(&ki, 0, sizeof ki);
    ki.struct_size = sizeof ki;
    CHECK(kpc_kernel_info_get(k, &ki));
    size_t local = ki.local_size[0];
    size_t global = (N + local - 1) / local * local;
    CL_CHECK(clEnqueueNDRangeKernel(q, ck, 1, NULL, &global, &local, 0, NULL, NULL));
    /* The enqueued launch captured its arguments: the lease can go back now. */
    CHECK(kpc_lease_release(lease));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_lease_cl_kernel(lease, &raw));
    CL_CHECK(clEnqueueReadBuffer(q, bo, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL));
    int bad = 0;
    for (uint32_t i = 0; i < N; i++) {
        float want = 3.0f * x[i] + y[i] + (float)BIAS;
        if (out[i] != want && bad++ < 5) fprintf(stderr, "out[%u] = %g, want %g\n", i, out[i], want);
    }
    ASSERT(bad == 0, "%d wrong outputs", bad);
    printf("own queue: saxpy of %u elements checked (out[7] = %g)\n", N, out[7]);
    clReleaseMemObject(bx);
    clReleaseMemObject(by);
    clReleaseMemObject(bo);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    ASSERT(f && fwrite(p, 1, n, f) == n && fclose(f) == 0, "write %s", path);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: opencl_interop build|disk|blob DEVICE_INDEX SAXPY_CL BLOB_FILE\n");
        return 2;
    }
    const char *mode = argv[1];
    int index = atoi(argv[2]);

    /* The embedder's own context and in-order queue on device `index` over all platforms. */
    cl_platform_id plats[16];
    cl_uint np = 0;
    CL_CHECK(clGetPlatformIDs(16, plats, &np));
    cl_device_id device = NULL;
    for (cl_uint p = 0; p < np && device == NULL; p++) {
        cl_device_id devs[16];
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, devs, &nd) != CL_SUCCESS) continue;
        if (index < (int)nd)
            device = devs[index];
        else
            index -= (int)nd;
    }
    ASSERT(device != NULL, "OpenCL device %s", argv[2]);
    char dname[256] = {0};
    CL_CHECK(clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof dname - 1, dname, NULL));
    cl_int err;
    cl_context clctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    CL_CHECK(err);
    cl_command_queue q = clCreateCommandQueue(clctx, device, 0, &err);
    CL_CHECK(err);
    printf("embedder: own cl_context and in-order queue on %s\n", dname);

    kpc_config *cfg = NULL;
    CHECK(kpc_config_from_env(&cfg));
    kpc_opencl_handles oh;
    memset(&oh, 0, sizeof oh);
    oh.struct_size = sizeof oh;
    oh.context = clctx;
    oh.device = device;
    oh.queue = q;
    kpc_context *ctx = NULL;
    CHECK(kpc_context_create_opencl(cfg, &oh, &ctx));
    CHECK(kpc_config_destroy(cfg));
    kpc_backend be;
    CHECK(kpc_context_backend(ctx, &be));
    ASSERT(be == KPC_BACKEND_OPENCL, "backend %d", be);

    size_t cl_len = 0;
    unsigned char *src = read_file(argv[3], &cl_len);
    kpc_image *img = NULL;
    CHECK(kpc_image_create("saxpy.cl", KPC_IMAGE_OPENCL_C, src, cl_len, &img));
    free(src);
    kpc_spec_constant spec;
    memset(&spec, 0, sizeof spec);
    spec.id = 1; /* BIAS, declared in saxpy.cl as `// kpc-spec-constant 1 BIAS` */
    spec.kind = KPC_SPEC_I32;
    spec.value.i32 = BIAS;

    kpc_kernel *k = NULL;
    kpc_source want = strcmp(mode, "build") == 0 ? KPC_SOURCE_BUILT : KPC_SOURCE_DISK;
    if (strcmp(mode, "blob") != 0) {
        CHECK(kpc_kernel_create(ctx, img, "saxpy", &spec, 1, NULL, &k));
    } else {
        size_t blob_len = 0;
        unsigned char *blob = read_file(argv[4], &blob_len);
        EXPECT(KPC_STATUS_BLOB_MISMATCH,
               kpc_kernel_create_from_blob(ctx, img, "saxpy", &spec, 1, "-cl-fast-relaxed-math", blob,
                                           blob_len, &k));
        CHECK(kpc_kernel_create_from_blob(ctx, img, "saxpy", &spec, 1, NULL, blob, blob_len, &k));
        want = KPC_SOURCE_BLOB;
        free(blob);
    }
    kpc_source got;
    CHECK(kpc_kernel_source(k, &got));
    printf("saxpy from %s\n", kpc_source_name(got));
    ASSERT(got == want, "source %s, want %s", kpc_source_name(got), kpc_source_name(want));

    run_saxpy(clctx, q, k);

    if (strcmp(mode, "disk") == 0) {
        size_t n = 0;
        CHECK(kpc_kernel_cache_blob(k, NULL, 0, &n));
        unsigned char *blob = (unsigned char *)malloc(n);
        CHECK(kpc_kernel_cache_blob(k, blob, n, &n));
        write_bytes(argv[4], blob, n);
        printf("saved the cache blob: %zu bytes\n", n);
        free(blob);
    }
    /* A Vulkan-only operation on an OpenCL kernel is refused. */
    kpc_vulkan_kernel_handles vh;
    memset(&vh, 0, sizeof vh);
    vh.struct_size = sizeof vh;
    EXPECT(KPC_STATUS_WRONG_BACKEND, kpc_kernel_vulkan_handles(k, &vh));

    kpc_stats st = stats_of(ctx);
    printf("stats: programs built %llu, loaded %llu; disk hits %llu, puts %llu\n",
           (unsigned long long)st.backend_counters.programs_built,
           (unsigned long long)st.backend_counters.programs_loaded,
           (unsigned long long)st.disk.hits, (unsigned long long)st.disk.puts);
    ASSERT(st.disk.enabled == 1, "the disk cache is on (KPC_CACHE_DIR)");
    if (strcmp(mode, "build") == 0)
        ASSERT(st.backend_counters.programs_built == 1 && st.disk.puts == 1, "built and stored");
    else if (strcmp(mode, "disk") == 0)
        ASSERT(st.backend_counters.programs_built == 0 && st.disk.hits == 1, "from disk");
    else
        ASSERT(st.backend_counters.programs_built == 0 && st.backend_counters.programs_loaded == 1 &&
                   st.disk.puts == 0,
               "from the blob, without a build, nothing written to disk");

    CHECK(kpc_kernel_destroy(k));
    CHECK(kpc_image_destroy(img));
    CHECK(kpc_context_destroy(ctx));
    /* kpc released what it retained; the embedder's own references are still its to release. */
    CL_CHECK(clReleaseCommandQueue(q));
    CL_CHECK(clReleaseContext(clctx));
    printf("opencl_interop %s: passed (%d checks)\n", mode, kpc_test_checks);
    return 0;
}
