/* The C package as a user installs it (scripts/install-capi.sh PREFIX): this program includes only
 * <kpc.h>, is compiled against PREFIX through pkg-config (shared) or the static recipe, and runs
 * without LD_LIBRARY_PATH. It opens a context on SELECTOR, takes kpc's shipped saxpy for that
 * context's backend (no kernel file), gets the kernel and prints where it came from; a second run on
 * the same cache directory (KPC_CACHE_DIR) loads it from disk.
 *
 * usage: installed SELECTOR EXPECTED_SOURCE   (EXPECTED_SOURCE: built or disk)
 */
#include <stdio.h>
#include <string.h>

#include <kpc.h>

static int fail(const char *call, kpc_status s) {
    fprintf(stderr, "FAIL %s -> %s: %s\n", call, kpc_status_name(s), kpc_last_error());
    return 1;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        kpc_status s_ = (call);                                                                    \
        if (s_ != KPC_STATUS_OK) return fail(#call, s_);                                           \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: installed SELECTOR built|disk\n");
        return 2;
    }
    kpc_config *cfg = NULL;
    kpc_context *ctx = NULL;
    kpc_image *img = NULL;
    kpc_kernel *k = NULL;
    enum kpc_backend backend;
    kpc_source source;
    TRY(kpc_config_from_env(&cfg));
    TRY(kpc_context_create(cfg, argv[1], &ctx));
    TRY(kpc_context_backend(ctx, &backend));
    TRY(kpc_image_shipped("saxpy", backend, &img));
    TRY(kpc_kernel_create(ctx, img, "saxpy", NULL, 0, NULL, &k));
    TRY(kpc_kernel_source(k, &source));
    const char *got = source == KPC_SOURCE_BUILT ? "built" : source == KPC_SOURCE_DISK ? "disk" : "other";
    /* A name kpc does not ship is refused with a message naming the ones it does. */
    kpc_image *none = NULL;
    kpc_status s = kpc_image_shipped("no_such_kernel", backend, &none);
    if (s != KPC_STATUS_INVALID_ARGUMENT || none != NULL || strstr(kpc_last_error(), "saxpy") == NULL)
        return fail("kpc_image_shipped(\"no_such_kernel\")", s);
    TRY(kpc_kernel_destroy(k));
    TRY(kpc_image_destroy(img));
    TRY(kpc_context_destroy(ctx));
    TRY(kpc_config_destroy(cfg));
    printf("installed: %s saxpy %s\n", backend == KPC_BACKEND_VULKAN ? "vulkan" : "opencl", got);
    if (strcmp(got, argv[2]) != 0) {
        fprintf(stderr, "FAIL expected saxpy %s, got %s\n", argv[2], got);
        return 1;
    }
    return 0;
}
