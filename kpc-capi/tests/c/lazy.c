/* kpc C API: generic while specialized. saxpy with bias 5 (spec constant 1) is requested with the
 * unspecialized saxpy as its fallback (kpc_kernel_get_or_generic):
 * - under KPC_SEAL_GENERIC the fallback is served and nothing specialized is queued;
 * - unsealed, the request queues the specialized build and is itself served the fallback;
 * - once no background build is pending (a deadline poll of kpc_stats.lazy), the request gets the
 *   specialized kernel, counted as swapped in;
 * then the argument checks of both calls.
 *
 * usage: lazy SELECTOR KERNEL_FILE
 *   KERNEL_FILE ending in .spv is SPIR-V, anything else OpenCL C. The cache directory comes from the
 *   environment (kpc_config_from_env: KPC_CACHE_DIR, empty for a cold start).
 */
#include <sched.h>
#include <time.h>

#include "kpc_test.h"

static kpc_status lazily(const kpc_context *ctx, const kpc_image *img, kpc_kernel **k) {
    kpc_spec_constant c;
    memset(&c, 0, sizeof c);
    c.id = 1;
    c.kind = KPC_SPEC_I32;
    c.value.i32 = 5;
    return kpc_kernel_get_or_generic(ctx, img, "saxpy", &c, 1, NULL, img, "saxpy", NULL, 0, NULL, k);
}

static uint32_t generic_of(const kpc_kernel *k) {
    uint32_t g = 7;
    CHECK(kpc_kernel_is_generic(k, &g));
    return g;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: lazy SELECTOR KERNEL_FILE\n");
        return 2;
    }
    const char *file = argv[2];
    size_t n = strlen(file);
    uint32_t format = n > 4 && strcmp(file + n - 4, ".spv") == 0 ? KPC_IMAGE_SPIRV : KPC_IMAGE_OPENCL_C;
    size_t len;
    unsigned char *bytes = read_file(file, &len);
    kpc_config *cfg = NULL;
    kpc_context *ctx = NULL;
    kpc_image *img = NULL;
    kpc_kernel *k1 = NULL, *k2 = NULL, *k3 = NULL, *bad = NULL;
    CHECK(kpc_config_from_env(&cfg));
    CHECK(kpc_context_create(cfg, argv[1], &ctx));
    CHECK(kpc_image_create("saxpy", format, bytes, len, &img));

    uint32_t put = 0;
    CHECK(kpc_context_seal(ctx, KPC_SEAL_GENERIC, &put));
    ASSERT(put == KPC_SEAL_GENERIC, "generic seal in force: %u", put);
    CHECK(lazily(ctx, img, &k1));
    ASSERT(generic_of(k1) == 1, "the fallback under the generic seal");
    kpc_stats s = stats_of(ctx);
    ASSERT(s.lazy.served_generic == 1 && s.lazy.sealed_generic == 1 && s.lazy.pending == 0,
           "served generic, nothing queued: served %llu sealed %llu pending %llu",
           (unsigned long long)s.lazy.served_generic, (unsigned long long)s.lazy.sealed_generic,
           (unsigned long long)s.lazy.pending);
    ASSERT(s.seal.mode == KPC_SEAL_GENERIC, "stats say generic: %llu", (unsigned long long)s.seal.mode);
    ASSERT(s.seal.budget_left == UINT64_MAX, "no budget counting");
    printf("sealed: the fallback served, nothing specialized queued\n");

    CHECK(kpc_context_seal(ctx, KPC_SEAL_OFF, NULL));
    CHECK(lazily(ctx, img, &k2));
    ASSERT(generic_of(k2) == 1, "the first unsealed request queues the build and gets the fallback");
    time_t deadline = time(NULL) + 120;
    while (stats_of(ctx).lazy.pending > 0) {
        ASSERT(time(NULL) < deadline, "the background build is still pending");
        sched_yield();
    }
    CHECK(lazily(ctx, img, &k3));
    ASSERT(generic_of(k3) == 0, "the specialized kernel once built");
    s = stats_of(ctx);
    ASSERT(s.lazy.swapped_in == 1 && s.lazy.background_builds == 1 && s.lazy.served_generic == 2 &&
               s.lazy.background_failures == 0 && s.lazy.background_build_time_ns > 0,
           "counted: swapped %llu builds %llu served %llu", (unsigned long long)s.lazy.swapped_in,
           (unsigned long long)s.lazy.background_builds, (unsigned long long)s.lazy.served_generic);
    printf("unsealed: the fallback served while the specialized kernel built, then swapped in\n");

    /* A plain kernel is never generic; bad arguments are refused, naming the argument. */
    kpc_kernel *plain = NULL;
    CHECK(kpc_kernel_create(ctx, img, "saxpy", NULL, 0, NULL, &plain));
    ASSERT(generic_of(plain) == 0, "kpc_kernel_create gives no fallback");
    kpc_kernel_destroy(plain);
    EXPECT(KPC_STATUS_INVALID_ARGUMENT,
           kpc_kernel_get_or_generic(ctx, img, "saxpy", NULL, 0, NULL, NULL, "saxpy", NULL, 0, NULL, &bad));
    ASSERT(strstr(kpc_last_error(), "generic_image") != NULL, "names generic_image: %s",
           kpc_last_error());
    EXPECT(KPC_STATUS_INVALID_ARGUMENT,
           kpc_kernel_get_or_generic(ctx, img, "saxpy", NULL, 0, NULL, img, NULL, NULL, 0, NULL, &bad));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT,
           kpc_kernel_get_or_generic(ctx, img, "saxpy", NULL, 0, NULL, img, "saxpy", NULL, 2, NULL, &bad));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT,
           kpc_kernel_get_or_generic(ctx, img, "saxpy", NULL, 0, NULL, img, "saxpy", NULL, 0, NULL, NULL));
    ASSERT(bad == NULL, "no kernel on a refusal");
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_kernel_is_generic(NULL, &put));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_kernel_is_generic(k3, NULL));
    printf("arguments: checked\n");

    kpc_kernel_destroy(k3);
    kpc_kernel_destroy(k2);
    kpc_kernel_destroy(k1);
    kpc_image_destroy(img);
    kpc_context_destroy(ctx);
    kpc_config_destroy(cfg);
    free(bytes);
    printf("%d checks passed\n", kpc_test_checks);
    return 0;
}
