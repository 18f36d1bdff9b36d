/* kpc C API: warnings reach a C program. The cache directory given is a regular file, so the disk
 * cache cannot be used: with a callback installed (kpc_set_log_callback) the context's creation
 * delivers one "unusable-root" warning to it, kpc_stats.disk.enabled is 0 and
 * kpc_context_disk_unusable_reason says why; kernels still build. With the callback removed, a
 * second context warns on stderr instead (the harness checks stderr).
 *
 * usage: warnings SELECTOR NOT_A_DIR
 */
#include "kpc_test.h"

static int warnings_seen = 0;
static char last_cause[64];
static char last_message[1024];

static void on_warning(void *user_data, const char *target, const char *cause, const char *message) {
    int *tag = user_data;
    if (*tag != 42) {
        fprintf(stderr, "FAIL callback got user_data %p, not the one given\n", user_data);
        exit(1);
    }
    warnings_seen++;
    snprintf(last_cause, sizeof last_cause, "%s", cause);
    snprintf(last_message, sizeof last_message, "%s", message);
    printf("callback: target=%s cause=%s message=%s\n", target, cause, message);
}

static kpc_context *open_context(const char *selector, const char *cache_dir) {
    kpc_config *cfg = NULL;
    kpc_context *ctx = NULL;
    CHECK(kpc_config_create(&cfg));
    CHECK(kpc_config_set_cache_dir(cfg, cache_dir));
    CHECK(kpc_context_create(cfg, selector, &ctx));
    CHECK(kpc_config_destroy(cfg));
    return ctx;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: warnings SELECTOR NOT_A_DIR\n");
        return 2;
    }
    const char *selector = argv[1], *file = argv[2];
    (void)read_file; /* kpc_test.h's helper: this program reads no kernel file */
    static int tag = 42;
    CHECK(kpc_set_log_callback(on_warning, &tag));

    kpc_context *ctx = open_context(selector, file);
    ASSERT(warnings_seen == 1, "%d warnings delivered, expected 1", warnings_seen);
    ASSERT(strcmp(last_cause, "unusable-root") == 0, "cause %s", last_cause);
    ASSERT(strstr(last_message, "not a directory") != NULL, "message: %s", last_message);

    kpc_stats st = stats_of(ctx);
    ASSERT(st.disk.enabled == 0, "disk.enabled is %llu for an unusable root",
           (unsigned long long)st.disk.enabled);

    size_t size = 0;
    CHECK(kpc_context_disk_unusable_reason(ctx, NULL, 0, &size)); /* the size only */
    char small[4];
    EXPECT(KPC_STATUS_BUFFER_TOO_SMALL, kpc_context_disk_unusable_reason(ctx, small, sizeof small, &size));
    char *why = malloc(size);
    CHECK(kpc_context_disk_unusable_reason(ctx, why, size, &size));
    ASSERT(strstr(why, file) != NULL && strstr(why, "not a directory") != NULL, "reason: %s", why);
    printf("reason: %s\n", why);
    free(why);
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_context_disk_unusable_reason(NULL, NULL, 0, &size));
    CHECK(kpc_context_destroy(ctx));

    /* Back to the default: the next context's warning goes to stderr, not to the callback. */
    CHECK(kpc_set_log_callback(NULL, NULL));
    ctx = open_context(selector, file);
    ASSERT(warnings_seen == 1, "the removed callback was called (%d)", warnings_seen);
    CHECK(kpc_context_destroy(ctx));
    printf("warnings: callback, stats and reason checked (%d checks)\n", kpc_test_checks);
    return 0;
}
