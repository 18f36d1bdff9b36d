/* The C package as a user installs it (scripts/install-capi.sh PREFIX): this program includes only
 * <kpc.h>, is compiled against PREFIX through pkg-config (shared) or the static recipe, and runs
 * without LD_LIBRARY_PATH. It opens a context on SELECTOR, takes kpc's shipped saxpy for that
 * context's backend (no kernel file), gets the kernel and prints where it came from (a second run on
 * the same cache directory, KPC_CACHE_DIR, loads it from disk), then runs it on kpc's own queue over
 * kpc buffers, with no Vulkan or OpenCL code here, and checks the launch's refusals.
 *
 * usage: installed SELECTOR EXPECTED_SOURCE   (EXPECTED_SOURCE: built or disk)
 */
#include <stdint.h>
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

    /* out = a * x + y on the device, through kpc's queue. */
    const float x[3] = {1, 2, 3}, y[3] = {10, 20, 30};
    float out[3] = {0, 0, 0};
    kpc_buffer *bx = NULL, *by = NULL, *bo = NULL;
    TRY(kpc_buffer_create(ctx, sizeof x, &bx));
    TRY(kpc_buffer_create(ctx, sizeof y, &by));
    TRY(kpc_buffer_create(ctx, sizeof out, &bo));
    TRY(kpc_buffer_upload(bx, 0, x, sizeof x));
    TRY(kpc_buffer_upload(by, 0, y, sizeof y));
    const kpc_buffer *args[3] = {bx, by, bo};
    struct {
        uint32_t n;
        float a;
    } push = {3, 2.0f};
    const uint32_t groups[3] = {1, 1, 1};
    TRY(kpc_kernel_launch(ctx, k, groups, args, 3, &push, sizeof push));
    TRY(kpc_buffer_download(bo, 0, out, sizeof out));
    for (int i = 0; i < 3; i++) {
        if (out[i] != 2.0f * x[i] + y[i]) {
            fprintf(stderr, "FAIL out[%d] = %g, expected %g\n", i, out[i], 2.0f * x[i] + y[i]);
            return 1;
        }
    }
    /* Refused, nothing launched: more elements than the buffers hold, a missing buffer, no groups,
     * push constants of the wrong size. */
    struct {
        kpc_status want;
        kpc_status got;
        const char *what;
    } refusals[4];
    push.n = 4;
    refusals[0].want = KPC_STATUS_SIZE;
    refusals[0].got = kpc_kernel_launch(ctx, k, groups, args, 3, &push, sizeof push);
    refusals[0].what = "n = 4 over 3-element buffers";
    push.n = 3;
    refusals[1].want = KPC_STATUS_LAUNCH;
    refusals[1].got = kpc_kernel_launch(ctx, k, groups, args, 2, &push, sizeof push);
    refusals[1].what = "2 buffers for 3 bindings";
    refusals[2].want = KPC_STATUS_INVALID_ARGUMENT;
    refusals[2].got = kpc_kernel_launch(ctx, k, NULL, args, 3, &push, sizeof push);
    refusals[2].what = "NULL groups";
    refusals[3].want = KPC_STATUS_SIZE;
    refusals[3].got = kpc_kernel_launch(ctx, k, groups, args, 3, &push, 4);
    refusals[3].what = "4 bytes of push constants";
    for (int i = 0; i < 4; i++) {
        if (refusals[i].got != refusals[i].want) {
            fprintf(stderr, "FAIL %s: %s, expected %s\n", refusals[i].what,
                    kpc_status_name(refusals[i].got), kpc_status_name(refusals[i].want));
            return 1;
        }
    }
    TRY(kpc_buffer_download(bo, 0, out, sizeof out));
    if (out[0] != 12.0f) {
        fprintf(stderr, "FAIL a refused launch changed the output: %g\n", out[0]);
        return 1;
    }
    TRY(kpc_buffer_destroy(bx));
    TRY(kpc_buffer_destroy(by));
    TRY(kpc_buffer_destroy(bo));
    TRY(kpc_kernel_destroy(k));
    TRY(kpc_image_destroy(img));
    TRY(kpc_context_destroy(ctx));
    TRY(kpc_config_destroy(cfg));
    printf("installed: %s saxpy %s, launched: %g %g %g\n",
           backend == KPC_BACKEND_VULKAN ? "vulkan" : "opencl", got, out[0], out[1], out[2]);
    if (strcmp(got, argv[2]) != 0) {
        fprintf(stderr, "FAIL expected saxpy %s, got %s\n", argv[2], got);
        return 1;
    }
    return 0;
}
