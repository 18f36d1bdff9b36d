/* kpc C API test: the MultiHeadAttention layer (kpc_mha) from C. A self-attention layer prefills a
 * prompt and runs decode steps, a cross-attention layer attends a memory set once; every output is
 * checked against the float64 reference values the Rust test wrote to DATA. The self-attention cache
 * is exported in both ncnn layouts and imported into a second layer, bit-exact; wrong sizes and call
 * orders give their status codes.
 *
 * usage: mha_decode SELECTOR DATA
 *   DATA: u32 magic 'KPCM', E, H, Hkv, P (prompt), N (steps), S (memory), 0; then f32 arrays:
 *         self weights, x [(P+N)][E], want_self [(P+N)][E], cross weights, memory [S][E],
 *         want_cross [N][E] (cross step i reads x row P+i). Weights in ncnn's order; fp16 storage.
 */
#include <math.h>
#include <stdint.h>

#include "kpc_test.h"

/* ||got - want|| / ||want|| over n floats. */
static double rel_err(const float *got, const float *want, size_t n) {
    double d = 0, w = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        w += (double)want[i] * want[i];
    }
    return sqrt(d / w);
}

#define TOLERANCE 1e-3

static kpc_mha *make_layer(const kpc_context *ctx, uint32_t e, uint32_t h, uint32_t hkv,
                           uint32_t capacity, int cross, const float *w, size_t wn) {
    kpc_mha_params p;
    CHECK(kpc_mha_params_init(&p, e, h));
    p.num_kv_heads = hkv;
    p.capacity = capacity;
    p.cross = cross;
    p.weight_f16 = 1;
    p.cache_f16 = 1;
    kpc_mha *layer = NULL;
    CHECK(kpc_mha_create(ctx, &p, w, wn, &layer));
    return layer;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: mha_decode SELECTOR DATA\n");
        return 2;
    }
    size_t len = 0;
    unsigned char *data = read_file(argv[2], &len);
    uint32_t hd[8];
    ASSERT(len >= sizeof hd, "DATA too short");
    memcpy(hd, data, sizeof hd);
    ASSERT(hd[0] == 0x4d43504bu, "DATA magic %x", hd[0]);
    uint32_t e = hd[1], h = hd[2], hkv = hd[3], P = hd[4], N = hd[5], S = hd[6];
    size_t kv = (size_t)hkv * (e / h);
    size_t wn = (size_t)e * e + e + 2 * (kv * e + kv) + (size_t)e * e + e;
    size_t total = P + N;
    size_t floats = 2 * wn + 2 * total * e + (size_t)S * e + (size_t)N * e;
    ASSERT(len == sizeof hd + 4 * floats, "DATA has %zu bytes, expected %zu", len,
           sizeof hd + 4 * floats);
    const float *f = (const float *)(data + sizeof hd);
    const float *self_w = f, *x = f + wn, *want_self = x + total * e;
    const float *cross_w = want_self + total * e, *memory = cross_w + wn;
    const float *want_cross = memory + (size_t)S * e;

    kpc_config *cfg = NULL;
    CHECK(kpc_config_create(&cfg));
    CHECK(kpc_config_set_persistent(cfg, 0));
    kpc_context *ctx = NULL;
    CHECK(kpc_context_create(cfg, argv[1], &ctx));

    /* Self-attention: prefill P positions, then N steps, each against the reference. */
    kpc_mha *self = make_layer(ctx, e, h, hkv, (uint32_t)total, 0, self_w, wn);
    float *out = (float *)malloc(total * e * sizeof(float));
    CHECK(kpc_mha_prefill(self, x, P * e, P, NULL, 0, out, P * e));
    double err = rel_err(out, want_self, P * e);
    ASSERT(err <= TOLERANCE, "prefill error %g", err);
    printf("prefill of %u positions checked: error %.3e\n", P, err);
    for (uint32_t t = 0; t < N; t++) {
        size_t row = (size_t)(P + t) * e;
        CHECK(kpc_mha_step(self, x + row, e, NULL, 0, out, e));
        err = rel_err(out, want_self + row, e);
        ASSERT(err <= TOLERANCE, "step %u error %g", t, err);
        printf("step %u checked: error %.3e\n", t, err);
    }
    uint32_t n = 0;
    CHECK(kpc_mha_len(self, &n));
    ASSERT(n == total, "len %u", n);

    /* Wrong sizes and call orders. */
    EXPECT(KPC_STATUS_SIZE, kpc_mha_step(self, x, e - 1, NULL, 0, out, e));
    EXPECT(KPC_STATUS_SIZE, kpc_mha_step(self, x, e, NULL, 0, out, e)); /* the cache is full */
    EXPECT(KPC_STATUS_CALL_ORDER, kpc_mha_set_memory(self, memory, (size_t)S * e, NULL, 0, S));
    kpc_mha *bad = NULL;
    kpc_mha_params p;
    CHECK(kpc_mha_params_init(&p, e, h));
    p.num_kv_heads = hkv;
    EXPECT(KPC_STATUS_SIZE, kpc_mha_create(ctx, &p, self_w, wn - 1, &bad));
    p.num_kv_heads = h + 1;
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_create(ctx, &p, self_w, wn, &bad));
    kpc_mha_params unset;
    memset(&unset, 0, sizeof unset);
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_create(ctx, &unset, self_w, wn, &bad));

    /* The cache in both layouts, into a second layer, and back: the same bits. */
    size_t count = 0;
    CHECK(kpc_mha_export_cache(self, KPC_CACHE_LAYOUT_SDPA, NULL, NULL, 0, &count));
    ASSERT(count == total * kv, "count %zu", count);
    float *sk = malloc(count * 4), *sv = malloc(count * 4), *mk = malloc(count * 4),
          *mv = malloc(count * 4), *k2 = malloc(count * 4), *v2 = malloc(count * 4);
    EXPECT(KPC_STATUS_BUFFER_TOO_SMALL,
           kpc_mha_export_cache(self, KPC_CACHE_LAYOUT_SDPA, sk, sv, count - 1, &count));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_export_cache(self, 7, sk, sv, count, &count));
    CHECK(kpc_mha_export_cache(self, KPC_CACHE_LAYOUT_SDPA, sk, sv, count, &count));
    CHECK(kpc_mha_export_cache(self, KPC_CACHE_LAYOUT_MHA, mk, mv, count, &count));
    kpc_mha *copy = make_layer(ctx, e, h, hkv, (uint32_t)total, 0, self_w, wn);
    EXPECT(KPC_STATUS_SIZE, kpc_mha_import_cache(copy, KPC_CACHE_LAYOUT_MHA, mk, mv, count - 1,
                                                 (uint32_t)total));
    CHECK(kpc_mha_import_cache(copy, KPC_CACHE_LAYOUT_MHA, mk, mv, count, (uint32_t)total));
    CHECK(kpc_mha_export_cache(copy, KPC_CACHE_LAYOUT_SDPA, k2, v2, count, &count));
    ASSERT(memcmp(k2, sk, count * 4) == 0 && memcmp(v2, sv, count * 4) == 0,
           "cache changed in the round trip");
    printf("cache round trip (MHA layout in, SDPA out) bit-exact: %zu floats per blob\n", count);

    /* Cross-attention: no step before the memory; then N steps over it. */
    kpc_mha *cross = make_layer(ctx, e, h, hkv, S, 1, cross_w, wn);
    EXPECT(KPC_STATUS_CALL_ORDER, kpc_mha_step(cross, x, e, NULL, 0, out, e));
    CHECK(kpc_mha_set_memory(cross, memory, (size_t)S * e, NULL, 0, S));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step(cross, x, e, x, 1, out, e)); /* no attn_mask */
    for (uint32_t t = 0; t < N; t++) {
        CHECK(kpc_mha_step(cross, x + (size_t)(P + t) * e, e, NULL, 0, out, e));
        err = rel_err(out, want_cross + (size_t)t * e, e);
        ASSERT(err <= TOLERANCE, "cross step %u error %g", t, err);
        printf("cross step %u checked: error %.3e\n", t, err);
    }

    /* Two self-attention layers and a cross-attention one of one shape share their kernels. */
    kpc_stats st = stats_of(ctx);
    printf("programs built %llu for three layers\n",
           (unsigned long long)st.backend_counters.programs_built);
    CHECK(kpc_mha_destroy(cross));
    CHECK(kpc_mha_destroy(copy));
    CHECK(kpc_mha_destroy(self));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step(self, x, e, NULL, 0, out, e));
    CHECK(kpc_context_destroy(ctx));
    CHECK(kpc_config_destroy(cfg));
    free(sk), free(sv), free(mk), free(mv), free(k2), free(v2), free(out), free(data);
    printf("mha_decode: %d checks passed\n", kpc_test_checks);
    return 0;
}
