/* Helpers shared by kpc's C tests (compiled by tests/capi_c.rs). Each program prints what it does;
 * any failed check prints "FAIL" with the call, its status and kpc_last_error(), and exits 1. */
#ifndef KPC_TEST_H
#define KPC_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kpc.h"

static int kpc_test_checks = 0;

/* A call that must succeed. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        kpc_status s_ = (call);                                                                    \
        if (s_ != KPC_STATUS_OK) {                                                                 \
            fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,               \
                    kpc_status_name(s_), kpc_last_error());                                        \
            exit(1);                                                                               \
        }                                                                                          \
        kpc_test_checks++;                                                                         \
    } while (0)

/* A call that must fail with status `want` and leave a non-empty last error. */
#define EXPECT(want, call)                                                                         \
    do {                                                                                           \
        kpc_status s_ = (call);                                                                    \
        const char *m_ = kpc_last_error();                                                         \
        if (s_ != (want) || m_ == NULL || m_[0] == '\0') {                                         \
            fprintf(stderr, "FAIL %s:%d: %s -> %s (want %s), last error \"%s\"\n", __FILE__,       \
                    __LINE__, #call, kpc_status_name(s_), kpc_status_name(want), m_ ? m_ : "(null)"); \
            exit(1);                                                                               \
        }                                                                                          \
        printf("ok %-28s <- %s\n   %s\n", kpc_status_name(s_), #call, m_);                        \
        kpc_test_checks++;                                                                         \
    } while (0)

/* A plain condition. */
#define ASSERT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
        kpc_test_checks++;                                                                         \
    } while (0)

/* The whole file at `path`, malloc'ed; its length in *len. Exits on failure. */
static inline unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "FAIL cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = (unsigned char *)malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "FAIL cannot read %s\n", path);
        exit(1);
    }
    buf[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* A stats struct ready to be filled. */
static inline kpc_stats stats_of(const kpc_context *ctx) {
    kpc_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK(kpc_context_stats(ctx, &s));
    return s;
}

#endif
