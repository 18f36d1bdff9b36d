/* kpc C API: sealed mode. A first process (MODE "populate") builds saxpy with bias 2 into the disk
 * cache; a second ("sealed", run with KPC_CACHE_SEAL=error) gets that kernel from disk, is refused
 * bias 3 with KPC_STATUS_SEALED (nothing built), is switched to KPC_SEAL_WARN and builds it, and
 * checks the counters in kpc_stats.seal and the argument checks of the seal calls.
 *
 * usage: seal MODE SELECTOR KERNEL_FILE
 *   KERNEL_FILE ending in .spv is SPIR-V, anything else OpenCL C. The cache directory and the seal
 *   come from the environment (kpc_config_from_env: KPC_CACHE_DIR, KPC_CACHE_SEAL).
 */
#include "kpc_test.h"

static kpc_status saxpy(const kpc_context *ctx, const kpc_image *img, int bias, kpc_kernel **k) {
    kpc_spec_constant c;
    memset(&c, 0, sizeof c);
    c.id = 1;
    c.kind = KPC_SPEC_I32;
    c.value.i32 = bias;
    return kpc_kernel_create(ctx, img, "saxpy", &c, 1, NULL, k);
}

static kpc_source source_of(const kpc_kernel *k) {
    kpc_source s;
    CHECK(kpc_kernel_source(k, &s));
    return s;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: seal populate|sealed SELECTOR KERNEL_FILE\n");
        return 2;
    }
    const char *mode = argv[1], *file = argv[3];
    size_t n = strlen(file);
    uint32_t format = n > 4 && strcmp(file + n - 4, ".spv") == 0 ? KPC_IMAGE_SPIRV : KPC_IMAGE_OPENCL_C;
    size_t len;
    unsigned char *bytes = read_file(file, &len);
    kpc_config *cfg = NULL;
    kpc_context *ctx = NULL;
    kpc_image *img = NULL;
    kpc_kernel *k = NULL, *k2 = NULL;
    CHECK(kpc_config_from_env(&cfg));
    CHECK(kpc_context_create(cfg, argv[2], &ctx));
    CHECK(kpc_image_create("saxpy", format, bytes, len, &img));

    if (strcmp(mode, "populate") == 0) {
        CHECK(saxpy(ctx, img, 2, &k));
        ASSERT(source_of(k) == KPC_SOURCE_BUILT, "bias 2 built");
        kpc_stats s = stats_of(ctx);
        ASSERT(s.seal.mode == KPC_SEAL_OFF && s.seal.builds == 0 && s.seal.refused == 0,
               "unsealed: mode %llu", (unsigned long long)s.seal.mode);
        printf("populated: saxpy bias 2 built\n");
    } else {
        /* KPC_CACHE_SEAL=error and no warm start: sealed from creation. */
        kpc_stats s = stats_of(ctx);
        ASSERT(s.seal.mode == KPC_SEAL_ERROR, "sealed at creation: mode %llu",
               (unsigned long long)s.seal.mode);
        CHECK(saxpy(ctx, img, 2, &k));
        ASSERT(source_of(k) == KPC_SOURCE_DISK, "bias 2 from disk while sealed");
        EXPECT(KPC_STATUS_SEALED, saxpy(ctx, img, 3, &k2));
        ASSERT(k2 == NULL, "no kernel on a refusal");
        ASSERT(strstr(kpc_last_error(), "spec constant 1: 2 → 3") != NULL, "explained: %s",
               kpc_last_error());
        s = stats_of(ctx);
        ASSERT(s.seal.refused == 1 && s.seal.builds == 0 && s.backend_counters.programs_built == 0,
               "one refusal, nothing built");

        uint32_t put = 0;
        CHECK(kpc_context_seal(ctx, KPC_SEAL_WARN, &put));
        ASSERT(put == KPC_SEAL_WARN, "warn in force");
        CHECK(saxpy(ctx, img, 3, &k2));
        ASSERT(source_of(k2) == KPC_SOURCE_BUILT, "bias 3 built under warn");
        s = stats_of(ctx);
        ASSERT(s.seal.mode == KPC_SEAL_WARN && s.seal.builds == 1 && s.seal.refused == 1,
               "warn build counted: builds %llu", (unsigned long long)s.seal.builds);

        /* KPC_SEAL_CONFIGURED takes the configuration's mode (error here). */
        CHECK(kpc_context_seal(ctx, KPC_SEAL_CONFIGURED, &put));
        ASSERT(put == KPC_SEAL_ERROR, "configured mode is error: %u", put);
        CHECK(kpc_context_seal(ctx, KPC_SEAL_OFF, NULL));
        ASSERT(stats_of(ctx).seal.mode == KPC_SEAL_OFF, "unsealed");

        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_context_seal(ctx, 99, NULL));
        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_context_seal(NULL, KPC_SEAL_WARN, NULL));
        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_config_set_seal(cfg, KPC_SEAL_CONFIGURED));
        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_config_set_seal(NULL, KPC_SEAL_WARN));
        CHECK(kpc_config_set_seal(cfg, KPC_SEAL_WARN));
        ASSERT(stats_of(ctx).seal.mode == KPC_SEAL_OFF, "a context copied its configuration");
        printf("sealed: disk hit served, build refused then built under warn\n");
    }
    kpc_kernel_destroy(k2);
    kpc_kernel_destroy(k);
    kpc_image_destroy(img);
    kpc_context_destroy(ctx);
    kpc_config_destroy(cfg);
    free(bytes);
    printf("%d checks passed\n", kpc_test_checks);
    return 0;
}
