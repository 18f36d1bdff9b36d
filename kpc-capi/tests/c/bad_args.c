/* kpc C API test e: NULL and garbage passed to every entry point give error codes and a message,
 * never a crash; kpc still works afterwards.
 *
 * usage: bad_args SELECTOR SAXPY_SPV SAXPY_CL
 *   SELECTOR   a Vulkan device selector (a live context makes each argument fail on its own)
 */
#include <stddef.h>
#include <stdint.h>

#include "kpc_test.h"

#define INVALID KPC_STATUS_INVALID_ARGUMENT

/* Never called: a half-set queue-lock hook is refused before anything is used. */
static void unmapped_lock(void *user_data) {
    (void)user_data;
    abort();
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: bad_args SELECTOR SAXPY_SPV SAXPY_CL\n");
        return 2;
    }
    const char *selector = argv[1];
    size_t spv_len = 0, cl_len = 0;
    unsigned char *spv = read_file(argv[2], &spv_len);
    unsigned char *cl = read_file(argv[3], &cl_len);
    printf("kpc C ABI version %u (header %d)\n", kpc_abi_version(), KPC_ABI_VERSION);
    ASSERT(kpc_abi_version() == KPC_ABI_VERSION, "library and header disagree");

    /* Handles that are not live objects: an address never mapped, a pointer to random bytes (as if
     * to freed memory), a misaligned one, and (below) destroyed and wrong-type handles. */
    uint64_t junk[8];
    for (int i = 0; i < 8; i++) junk[i] = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    void *unmapped = (void *)(uintptr_t)0xdead0000beef0ull;
    void *garbage = (void *)junk;
    void *odd = (void *)((uintptr_t)junk + 3);
    void *bad[] = {unmapped, garbage, odd};
    const char *bad_name[] = {"unmapped", "garbage", "misaligned"};

    /* --- the last error itself --- */
    ASSERT(kpc_last_error() != NULL, "kpc_last_error never returns NULL");
    ASSERT(kpc_last_error_copy(NULL, 0) == strlen(kpc_last_error()), "length query");
    ASSERT(strcmp(kpc_status_name(-7), "KPC_STATUS_UNKNOWN") == 0, "unknown status name");
    ASSERT(strcmp(kpc_status_name(KPC_STATUS_PANIC), "KPC_STATUS_PANIC") == 0, "status name");
    ASSERT(strcmp(kpc_source_name(12345), "unknown") == 0, "unknown source name");

    /* --- config --- */
    EXPECT(INVALID, kpc_config_create(NULL));
    EXPECT(INVALID, kpc_config_from_env(NULL));
    CHECK(kpc_config_destroy(NULL));
    kpc_config *cfg = NULL;
    CHECK(kpc_config_create(&cfg));
    EXPECT(INVALID, kpc_config_create((kpc_config **)odd));
    for (int i = 0; i < 3; i++) {
        kpc_config *b = (kpc_config *)bad[i];
        printf("-- %s config handle\n", bad_name[i]);
        EXPECT(INVALID, kpc_config_destroy(b));
        EXPECT(INVALID, kpc_config_set_cache_dir(b, "/tmp/x"));
        EXPECT(INVALID, kpc_config_set_persistent(b, 1));
        EXPECT(INVALID, kpc_config_set_in_mem(b, 1));
        EXPECT(INVALID, kpc_config_set_max_size(b, 1));
        EXPECT(INVALID, kpc_config_set_device_image_sizes(b, 0, 1));
        EXPECT(INVALID, kpc_config_set_in_mem_eviction_threshold(b, 1));
        EXPECT(INVALID, kpc_config_set_lock_timeout_ms(b, 1));
        EXPECT(INVALID, kpc_config_set_trace(b, 1));
        EXPECT(INVALID, kpc_config_set_device(b, "auto"));
        EXPECT(INVALID, kpc_config_set_readonly_dirs(b, "/tmp"));
        EXPECT(INVALID, kpc_config_set_remote(b, "fs:///tmp/r"));
        EXPECT(INVALID, kpc_config_set_remote_timeout_ms(b, 1));
        EXPECT(INVALID, kpc_config_set_remote_key(b, "0123456789abcdef0123"));
        EXPECT(INVALID, kpc_config_set_signing_key(b, "/tmp/k"));
        EXPECT(INVALID, kpc_config_set_trusted_keys(b, NULL));
        EXPECT(INVALID, kpc_config_set_host_id(b, "node"));
        EXPECT(INVALID, kpc_config_set_warm_start(b, "app"));
        EXPECT(INVALID, kpc_config_set_cache_debug(b, 1));
    }
    EXPECT(INVALID, kpc_config_set_persistent(NULL, 1));
    EXPECT(INVALID, kpc_config_set_persistent(cfg, 2));
    EXPECT(INVALID, kpc_config_set_in_mem(cfg, -1));
    EXPECT(INVALID, kpc_config_set_cache_dir(cfg, "  "));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_device_image_sizes(cfg, 10, 5));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_trace(cfg, 8));
    EXPECT(INVALID, kpc_config_set_trace(cfg, 0x100));
    EXPECT(INVALID, kpc_config_set_device(cfg, NULL));
    EXPECT(INVALID, kpc_config_set_device(cfg, "vulkan:\xff"));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_device(cfg, "cuda:0"));
    ASSERT(strstr(kpc_last_error(), "device selector \"cuda:0\"") != NULL &&
               strstr(kpc_last_error(), "KPC_DEVICE") == NULL,
           "a selector given in code is not the variable: %s", kpc_last_error());
    /* The stores and modes the environment reaches: bad values are typed errors, good ones taken,
     * NULL unsets. */
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_readonly_dirs(cfg, "relative/dir"));
    CHECK(kpc_config_set_readonly_dirs(cfg, "/tmp/kpc-ro-a:/tmp/kpc-ro-b"));
    CHECK(kpc_config_set_readonly_dirs(cfg, NULL));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_remote(cfg, "ftp://host/x"));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_remote(cfg, "redis://"));
    EXPECT(INVALID, kpc_config_set_remote(cfg, "redis://\xff"));
    CHECK(kpc_config_set_remote(cfg, "fs:///tmp/kpc-remote"));
    CHECK(kpc_config_set_remote(cfg, NULL));
    EXPECT(INVALID, kpc_config_set_remote_timeout_ms(cfg, 0));
    CHECK(kpc_config_set_remote_timeout_ms(cfg, 500));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_remote_key(cfg, "short"));
    CHECK(kpc_config_set_remote_key(cfg, "0123456789abcdef0123"));
    CHECK(kpc_config_set_remote_key(cfg, NULL));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_signing_key(cfg, "/nonexistent/kpc-builder.key"));
    CHECK(kpc_config_set_signing_key(cfg, NULL));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_trusted_keys(cfg, "ed25519:not-a-key"));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_trusted_keys(cfg, "/nonexistent/builders.pub"));
    CHECK(kpc_config_set_trusted_keys(cfg, "ed25519:044674f2272744983100cec4fb7c66d50b6b8eb8345a8311130d3e2c03c7ea3f"));
    CHECK(kpc_config_set_trusted_keys(cfg, NULL));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_host_id(cfg, "two\nlines"));
    EXPECT(KPC_STATUS_CONFIG, kpc_config_set_host_id(cfg, ""));
    CHECK(kpc_config_set_host_id(cfg, "build-7"));
    CHECK(kpc_config_set_host_id(cfg, NULL));
    EXPECT(INVALID, kpc_config_set_warm_start(cfg, "-bad"));
    EXPECT(INVALID, kpc_config_set_warm_start(cfg, ""));
    CHECK(kpc_config_set_warm_start(cfg, "my-engine"));
    CHECK(kpc_config_set_warm_start(cfg, NULL));
    EXPECT(INVALID, kpc_config_set_cache_debug(cfg, 3));
    CHECK(kpc_config_set_cache_debug(cfg, 0));
    CHECK(kpc_config_set_cache_dir(cfg, NULL)); /* NULL: no disk cache, which is valid */
    CHECK(kpc_config_set_persistent(cfg, 0));

    /* A destroyed handle, destroyed again or used. */
    kpc_config *gone = NULL;
    CHECK(kpc_config_create(&gone));
    CHECK(kpc_config_destroy(gone));
    EXPECT(INVALID, kpc_config_destroy(gone));
    EXPECT(INVALID, kpc_config_set_max_size(gone, 1));

    /* --- context --- */
    kpc_context *ctx = NULL;
    EXPECT(INVALID, kpc_context_create(NULL, selector, &ctx));
    EXPECT(INVALID, kpc_context_create(gone, selector, &ctx));
    EXPECT(INVALID, kpc_context_create(cfg, selector, NULL));
    EXPECT(INVALID, kpc_context_create((kpc_config *)garbage, selector, &ctx));
    EXPECT(INVALID, kpc_context_create(cfg, "opencl:\xfe", &ctx));
    EXPECT(KPC_STATUS_CONFIG, kpc_context_create(cfg, "quantum:0", &ctx));
    EXPECT(KPC_STATUS_NO_SUCH_DEVICE, kpc_context_create(cfg, "vulkan:4096", &ctx));
    ASSERT(ctx == NULL, "a failed create leaves *out alone");
    CHECK(kpc_context_create(cfg, selector, &ctx));
    /* A handle of another type where a context is expected. */
    EXPECT(INVALID, kpc_context_destroy((kpc_context *)cfg));
    EXPECT(INVALID, kpc_config_destroy((kpc_config *)ctx));
    kpc_backend be;
    size_t size = 0;
    char small[2];
    kpc_stats st;
    for (int i = 0; i < 3; i++) {
        kpc_context *b = (kpc_context *)bad[i];
        printf("-- %s context handle\n", bad_name[i]);
        EXPECT(INVALID, kpc_context_destroy(b));
        EXPECT(INVALID, kpc_context_backend(b, &be));
        EXPECT(INVALID, kpc_context_device_name(b, NULL, 0, &size));
        st.struct_size = sizeof st;
        EXPECT(INVALID, kpc_context_stats(b, &st));
    }
    CHECK(kpc_context_destroy(NULL));
    EXPECT(INVALID, kpc_context_backend(ctx, NULL));
    EXPECT(INVALID, kpc_context_backend(ctx, (kpc_backend *)odd));
    EXPECT(INVALID, kpc_context_device_name(ctx, NULL, 0, NULL));
    EXPECT(INVALID, kpc_context_device_name(ctx, NULL, 16, &size));
    EXPECT(KPC_STATUS_BUFFER_TOO_SMALL, kpc_context_device_name(ctx, small, sizeof small, &size));
    ASSERT(size > sizeof small, "the needed size (%zu) was reported", size);
    char *name = (char *)malloc(size);
    CHECK(kpc_context_device_name(ctx, name, size, &size));
    ASSERT(strlen(name) + 1 == size, "name length");
    printf("context on %s\n", name);
    free(name);
    EXPECT(INVALID, kpc_context_stats(ctx, NULL));
    memset(&st, 0, sizeof st); /* struct_size 0: the caller forgot to set it */
    EXPECT(INVALID, kpc_context_stats(ctx, &st));
    st.struct_size = 3;
    EXPECT(INVALID, kpc_context_stats(ctx, &st));

    /* --- images --- */
    kpc_image *img = NULL;
    EXPECT(INVALID, kpc_image_create("x", KPC_IMAGE_SPIRV, NULL, spv_len, &img));
    EXPECT(INVALID, kpc_image_create("x", KPC_IMAGE_SPIRV, spv, 0, &img));
    EXPECT(INVALID, kpc_image_create("x", 0, spv, spv_len, &img));
    EXPECT(INVALID, kpc_image_create("x", 77, spv, spv_len, &img));
    EXPECT(INVALID, kpc_image_create("x", KPC_IMAGE_SPIRV, spv, spv_len, NULL));
    EXPECT(INVALID, kpc_image_create("\xc3\x28", KPC_IMAGE_SPIRV, spv, spv_len, &img));
    EXPECT(INVALID, kpc_image_create("x", KPC_IMAGE_SPIRV, spv, (size_t)-1, &img));
    EXPECT(INVALID, kpc_image_create("x", KPC_IMAGE_OPENCL_C, (const uint8_t *)"kernel \xff", 8, &img));
    /* SPIR-V passed as OpenCL C: the message says what the bytes are and what to pass. */
    EXPECT(INVALID, kpc_image_create("x", KPC_IMAGE_OPENCL_C, spv, spv_len, &img));
    ASSERT(strstr(kpc_last_error(), "the bytes are SPIR-V") != NULL, "%s", kpc_last_error());
    EXPECT(KPC_STATUS_INVALID_SPIRV, kpc_image_create("x", KPC_IMAGE_SPIRV, spv, spv_len - 3, &img));
    EXPECT(KPC_STATUS_INVALID_SPIRV,
           kpc_image_create("x", KPC_IMAGE_SPIRV, (const uint8_t *)junk, sizeof junk, &img));
    ASSERT(img == NULL, "a failed create leaves *out alone");
    for (int i = 0; i < 3; i++) EXPECT(INVALID, kpc_image_destroy((kpc_image *)bad[i]));
    CHECK(kpc_image_destroy(NULL));
    kpc_image *climg = NULL;
    CHECK(kpc_image_create(NULL, KPC_IMAGE_SPIRV, spv, spv_len, &img));
    CHECK(kpc_image_create("saxpy.cl", KPC_IMAGE_OPENCL_C, cl, cl_len, &climg));

    /* --- kernels --- */
    kpc_kernel *k = NULL;
    kpc_spec_constant spec[2];
    memset(spec, 0, sizeof spec);
    spec[0].id = 1;
    spec[0].kind = KPC_SPEC_I32;
    spec[0].value.i32 = 3;
    for (int i = 0; i < 3; i++) {
        printf("-- %s context/image/kernel handles\n", bad_name[i]);
        EXPECT(INVALID, kpc_kernel_create((kpc_context *)bad[i], img, "saxpy", NULL, 0, NULL, &k));
        EXPECT(INVALID, kpc_kernel_create(ctx, (kpc_image *)bad[i], "saxpy", NULL, 0, NULL, &k));
        EXPECT(INVALID, kpc_kernel_destroy((kpc_kernel *)bad[i]));
        kpc_kernel_info ki;
        ki.struct_size = sizeof ki;
        EXPECT(INVALID, kpc_kernel_info_get((kpc_kernel *)bad[i], &ki));
        kpc_source src;
        EXPECT(INVALID, kpc_kernel_source((kpc_kernel *)bad[i], &src));
    }
    EXPECT(INVALID, kpc_kernel_create(NULL, img, "saxpy", NULL, 0, NULL, &k));
    EXPECT(INVALID, kpc_kernel_create(ctx, NULL, "saxpy", NULL, 0, NULL, &k));
    EXPECT(INVALID, kpc_kernel_create(ctx, (kpc_image *)ctx, "saxpy", NULL, 0, NULL, &k));
    EXPECT(INVALID, kpc_kernel_create(ctx, img, NULL, NULL, 0, NULL, &k));
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "saxpy", NULL, 0, NULL, NULL));
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "sax\xffpy", NULL, 0, NULL, &k));
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "saxpy", NULL, 0, "-O\xff", &k));
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "saxpy", NULL, 2, NULL, &k));
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "saxpy", spec, (size_t)-1 / 4, NULL, &k));
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "saxpy", (kpc_spec_constant *)odd, 1, NULL, &k));
    spec[1] = spec[0]; /* the same id twice */
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "saxpy", spec, 2, NULL, &k));
    spec[1].id = 0;
    spec[1].kind = 99; /* no such type */
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "saxpy", spec, 2, NULL, &k));
    spec[1].kind = KPC_SPEC_BOOL;
    spec[1].value.u32 = 2; /* a bool of 2 */
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "saxpy", spec, 2, NULL, &k));
    EXPECT(KPC_STATUS_UNKNOWN_KERNEL, kpc_kernel_create(ctx, img, "nope", NULL, 0, NULL, &k));
    EXPECT(INVALID, kpc_kernel_create(ctx, climg, "saxpy", NULL, 0, NULL, &k)); /* wrong format */
    ASSERT(strstr(kpc_last_error(), "holds OpenCL C source, but a vulkan context builds SPIR-V") != NULL, "%s", kpc_last_error());
    /* BIAS is an i32: an f32 is refused in the user's terms, not as a bit pattern. */
    kpc_spec_constant wrong = spec[0];
    wrong.kind = KPC_SPEC_F32;
    wrong.value.f32 = 1.0f;
    EXPECT(INVALID, kpc_kernel_create(ctx, img, "saxpy", &wrong, 1, NULL, &k));
    ASSERT(strstr(kpc_last_error(), "is i32, but f32 1 was given") != NULL &&
               strstr(kpc_last_error(), "Bits") == NULL,
           "%s", kpc_last_error());
    ASSERT(k == NULL, "a failed create leaves *out alone");

    /* After all that, kpc works: saxpy with BIAS = 3, built, then from memory. */
    CHECK(kpc_kernel_create(ctx, img, "saxpy", spec, 1, NULL, &k));
    kpc_kernel *k2 = NULL;
    CHECK(kpc_kernel_create(ctx, img, "saxpy", spec, 1, "  ", &k2));
    kpc_source s1, s2;
    CHECK(kpc_kernel_source(k, &s1));
    CHECK(kpc_kernel_source(k2, &s2));
    printf("saxpy: first from %s, second from %s\n", kpc_source_name(s1), kpc_source_name(s2));
    ASSERT(s1 == KPC_SOURCE_BUILT && s2 == KPC_SOURCE_MEMORY, "sources %d %d", s1, s2);
    EXPECT(INVALID, kpc_kernel_source(k, NULL));
    kpc_kernel_info ki;
    memset(&ki, 0, sizeof ki);
    EXPECT(INVALID, kpc_kernel_info_get(k, &ki));
    ki.struct_size = sizeof ki;
    CHECK(kpc_kernel_info_get(k, &ki));
    printf("saxpy: %u buffers, %u push-constant bytes, local size %u\n", ki.buffer_count,
           ki.push_constant_bytes, ki.local_size[0]);
    ASSERT(ki.buffer_count == 3 && ki.push_constant_bytes == 8 && ki.local_size[0] == 64, "info");
    ASSERT(ki.struct_size == sizeof ki, "struct_size written back");
    /* A caller with an older, smaller struct gets the fields that fit, and nothing past them. */
    uint64_t older[2]; /* 8 bytes of struct, then a canary */
    memset(older, 0xab, sizeof older);
    ((kpc_kernel_info *)(void *)older)->struct_size = 8;
    CHECK(kpc_kernel_info_get(k, (kpc_kernel_info *)(void *)older));
    ASSERT(older[1] == 0xababababababababull, "kpc wrote past the caller's struct_size");
    ASSERT(((kpc_kernel_info *)(void *)older)->backend == KPC_BACKEND_VULKAN, "prefix written");
    st = stats_of(ctx);
    printf("stats: memory hits %llu misses %llu, programs built %llu\n",
           (unsigned long long)st.memory.hits, (unsigned long long)st.memory.misses,
           (unsigned long long)st.backend_counters.programs_built);
    ASSERT(st.memory.hits >= 1 && st.backend_counters.programs_built == 1, "stats");
    ASSERT(st.disk.enabled == 0, "no disk cache was configured");

    /* --- interop constructors --- */
    kpc_context *ictx = NULL;
    kpc_vulkan_handles vh;
    memset(&vh, 0, sizeof vh);
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, NULL, &ictx));
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, &vh, &ictx)); /* struct_size not set */
    vh.struct_size = offsetof(kpc_vulkan_handles, queue_lock) - 8; /* older than any header */
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, &vh, &ictx));
    vh.struct_size = sizeof vh;
    vh.instance_api_version = (1u << 22) | (3u << 12); /* 1.3 */
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, &vh, &ictx)); /* NULL vkGetInstanceProcAddr */
    /* Never called: kpc refuses the NULL instance, device and queue before it loads anything. */
    vh.get_instance_proc_addr = unmapped;
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, &vh, &ictx));
    vh.enabled_features = 1ull << 40;
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, &vh, &ictx));
    vh.enabled_features = 0;
    vh.queue_lock = unmapped_lock; /* without queue_unlock */
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, &vh, &ictx));
    ASSERT(strstr(kpc_last_error(), "queue_unlock") != NULL, "names the missing half: %s",
           kpc_last_error());
    vh.queue_lock = NULL;
    vh.reserved = 7;
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, &vh, &ictx));
    EXPECT(INVALID, kpc_context_create_vulkan(NULL, &vh, &ictx));
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, &vh, NULL));
    EXPECT(INVALID, kpc_context_create_vulkan(cfg, (kpc_vulkan_handles *)odd, &ictx));
    kpc_opencl_handles oh;
    memset(&oh, 0, sizeof oh);
    EXPECT(INVALID, kpc_context_create_opencl(cfg, NULL, &ictx));
    EXPECT(INVALID, kpc_context_create_opencl(cfg, &oh, &ictx)); /* struct_size not set */
    oh.struct_size = sizeof oh;
    EXPECT(INVALID, kpc_context_create_opencl(cfg, &oh, &ictx)); /* NULL handles */
    oh.reserved = 1;
    EXPECT(INVALID, kpc_context_create_opencl(cfg, &oh, &ictx));
    EXPECT(INVALID, kpc_context_create_opencl((kpc_config *)garbage, &oh, &ictx));
    ASSERT(ictx == NULL, "a failed create leaves *out alone");

    /* --- raw handles and leases --- */
    kpc_vulkan_kernel_handles kh;
    memset(&kh, 0, sizeof kh);
    EXPECT(INVALID, kpc_kernel_vulkan_handles(k, &kh)); /* struct_size not set */
    EXPECT(INVALID, kpc_kernel_vulkan_handles(k, NULL));
    kh.struct_size = sizeof kh;
    kpc_lease *lease = NULL;
    void *clk = NULL;
    for (int i = 0; i < 3; i++) {
        printf("-- %s kernel/lease handles\n", bad_name[i]);
        EXPECT(INVALID, kpc_kernel_vulkan_handles((kpc_kernel *)bad[i], &kh));
        EXPECT(INVALID, kpc_lease_acquire((kpc_kernel *)bad[i], &lease));
        EXPECT(INVALID, kpc_lease_cl_kernel((kpc_lease *)bad[i], &clk));
        EXPECT(INVALID, kpc_lease_release((kpc_lease *)bad[i]));
        EXPECT(INVALID, kpc_kernel_cache_blob((kpc_kernel *)bad[i], NULL, 0, &size));
    }
    EXPECT(INVALID, kpc_lease_acquire(k, NULL));
    EXPECT(KPC_STATUS_WRONG_BACKEND, kpc_lease_acquire(k, &lease)); /* a Vulkan kernel */
    EXPECT(INVALID, kpc_lease_release((kpc_lease *)k));
    CHECK(kpc_lease_release(NULL));
    CHECK(kpc_kernel_vulkan_handles(k, &kh));
    ASSERT(kh.pipeline != 0 && kh.binding_count == 3 && kh.local_size[0] == 64, "handles");

    /* --- blobs --- */
    EXPECT(INVALID, kpc_cache_blob_id(ctx, img, spec, 1, NULL, NULL, 0, NULL));
    EXPECT(INVALID, kpc_cache_blob_id(ctx, img, spec, 1, NULL, NULL, 64, &size));
    EXPECT(INVALID, kpc_cache_blob_id(NULL, img, spec, 1, NULL, NULL, 0, &size));
    EXPECT(INVALID, kpc_cache_blob_id(ctx, (kpc_image *)garbage, spec, 1, NULL, NULL, 0, &size));
    EXPECT(INVALID, kpc_cache_blob_id(ctx, climg, spec, 1, NULL, NULL, 0, &size)); /* wrong format */
    EXPECT(KPC_STATUS_BUFFER_TOO_SMALL,
           kpc_cache_blob_id(ctx, img, spec, 1, NULL, (uint8_t *)small, sizeof small, &size));
    ASSERT(size > sizeof small, "the id's size (%zu) was reported", size);
    EXPECT(INVALID, kpc_kernel_cache_blob(k, NULL, 0, NULL));
    EXPECT(INVALID, kpc_kernel_cache_blob(k, NULL, 1, &size));
    EXPECT(KPC_STATUS_BUFFER_TOO_SMALL, kpc_kernel_cache_blob(k, (uint8_t *)small, 1, &size));
    kpc_kernel *kb = NULL;
    EXPECT(INVALID, kpc_kernel_create_from_blob(ctx, img, "saxpy", spec, 1, NULL, NULL, 16, &kb));
    EXPECT(INVALID, kpc_kernel_create_from_blob(ctx, img, "saxpy", spec, 1, NULL, spv, 0, &kb));
    EXPECT(INVALID, kpc_kernel_create_from_blob(ctx, img, "saxpy", spec, 1, NULL, spv, 16, NULL));
    EXPECT(INVALID, kpc_kernel_create_from_blob(ctx, img, NULL, spec, 1, NULL, spv, 16, &kb));
    EXPECT(INVALID, kpc_kernel_create_from_blob((kpc_context *)img, img, "saxpy", spec, 1, NULL,
                                                spv, 16, &kb));
    EXPECT(KPC_STATUS_CORRUPT_BLOB, /* SPIR-V is not a blob */
           kpc_kernel_create_from_blob(ctx, img, "saxpy", spec, 1, NULL, spv, spv_len, &kb));
    EXPECT(KPC_STATUS_CORRUPT_BLOB,
           kpc_kernel_create_from_blob(ctx, img, "saxpy", spec, 1, NULL, (uint8_t *)junk,
                                       sizeof junk, &kb));
    ASSERT(kb == NULL, "a failed create leaves *out alone");

    /* Destroyed kernel handles are refused; the other handle is unaffected. */
    CHECK(kpc_kernel_destroy(k));
    EXPECT(INVALID, kpc_kernel_destroy(k));
    EXPECT(INVALID, kpc_kernel_source(k, &s1));
    CHECK(kpc_kernel_source(k2, &s2));
    /* A kernel outlives its context and image: it holds what it needs. */
    CHECK(kpc_image_destroy(img));
    CHECK(kpc_image_destroy(climg));
    EXPECT(INVALID, kpc_image_destroy(img));
    EXPECT(INVALID, kpc_context_quiesce(NULL));
    EXPECT(INVALID, kpc_context_quiesce((kpc_context *)cfg));
    CHECK(kpc_context_quiesce(ctx));
    CHECK(kpc_context_destroy(ctx));
    EXPECT(INVALID, kpc_context_destroy(ctx));
    EXPECT(INVALID, kpc_context_quiesce(ctx));
    EXPECT(INVALID, kpc_context_stats(ctx, &st));
    CHECK(kpc_kernel_vulkan_handles(k2, &kh));
    ASSERT(kh.pipeline != 0, "handles after the context is gone");
    CHECK(kpc_kernel_destroy(k2));
    CHECK(kpc_kernel_destroy(NULL));
    CHECK(kpc_config_destroy(cfg));
    /* A success clears the last error. */
    ASSERT(kpc_last_error()[0] == '\0', "last error after a success: %s", kpc_last_error());
    free(spv);
    free(cl);
    printf("bad_args: %d checks passed\n", kpc_test_checks);
    return 0;
}
