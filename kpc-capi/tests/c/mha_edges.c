/* kpc C API test: the MultiHeadAttention layer's edges that an independent client found (issue 40,
 * item 6), each a regression check:
 *   - a refused prefill (mask of the wrong size, NaN or +inf in the mask, no mask on an attn_mask
 *     layer, more positions than the capacity) changes nothing: the length and the exported cache
 *     stay as they were, with caching on and off;
 *   - +inf in a mask is KPC_STATUS_INVALID_ARGUMENT, for prefill and step;
 *   - importing a value outside fp16's range into an fp16 cache is KPC_STATUS_INVALID_ARGUMENT and
 *     changes nothing; 65504 (fp16's largest) imports and exports exactly;
 *   - a query row whose every key is masked with -inf attends nothing: the layer outputs its output
 *     bias; a row of equal finite values (-1e30, -FLT_MAX) is a softmax of equal logits, so both
 *     give the same (uniform) row.
 * The weights are random, made here; nothing needs a reference.
 *
 * usage: mha_edges SELECTOR
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "kpc_test.h"

enum { E = 32, H = 4, HKV = 2, KV = HKV * (E / H), CAP = 8 };
#define WN ((size_t)E * E + E + 2 * ((size_t)KV * E + KV) + (size_t)E * E + E)

static uint32_t rng = 12345u;
static float rnd(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffffu) / 65536.0f - 0.5f;
}

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = rnd() * scale;
}

static kpc_mha *make(const kpc_context *ctx, const float *w, int kv_cache, int cross, int causal,
                     int f16) {
    kpc_mha_params p;
    CHECK(kpc_mha_params_init(&p, E, H));
    p.num_kv_heads = HKV;
    p.capacity = CAP;
    p.attn_mask = 1;
    p.kv_cache = kv_cache;
    p.cross = cross;
    p.causal = causal;
    p.weight_f16 = 0;
    p.cache_f16 = f16;
    kpc_mha *layer = NULL;
    CHECK(kpc_mha_create(ctx, &p, w, WN, &layer));
    return layer;
}

/* The layer's length and its exported cache (SDPA layout) into k and v (CAP * KV floats each). */
static uint32_t snapshot(const kpc_mha *layer, float *k, float *v, size_t *count) {
    uint32_t n = 0;
    CHECK(kpc_mha_len(layer, &n));
    CHECK(kpc_mha_export_cache(layer, KPC_CACHE_LAYOUT_SDPA, k, v, (size_t)CAP * KV, count));
    return n;
}

/* Nothing changed since `snapshot` gave len0, k0, v0. */
static void unchanged(const kpc_mha *layer, uint32_t len0, const float *k0, const float *v0,
                      const char *after) {
    float k[CAP * KV], v[CAP * KV];
    size_t count = 0;
    uint32_t n = snapshot(layer, k, v, &count);
    ASSERT(n == len0, "after %s: len %u, was %u", after, n, len0);
    ASSERT(count == (size_t)len0 * KV, "after %s: count %zu", after, count);
    ASSERT(memcmp(k, k0, count * 4) == 0 && memcmp(v, v0, count * 4) == 0,
           "after %s: the cache changed", after);
}

static void refused_prefills(const kpc_context *ctx, const float *w, int kv_cache) {
    kpc_mha *layer = make(ctx, w, kv_cache, 0, 1, 1);
    float x[(CAP + 1) * E], out[(CAP + 1) * E], mask[(CAP + 1) * (CAP + 4)];
    fill(x, (CAP + 1) * E, 2.0f);
    memset(mask, 0, sizeof mask);
    CHECK(kpc_mha_prefill(layer, x, 3 * E, 3, mask, 3 * 3, out, 3 * E));
    float k0[CAP * KV], v0[CAP * KV];
    size_t count = 0;
    uint32_t len0 = snapshot(layer, k0, v0, &count);
    ASSERT(len0 == 3, "len %u after a prefill of 3", len0);

    /* A prefill of 2 more positions: kv_len 5 with caching on, 2 with it off. */
    size_t kv_len = kv_cache ? 5 : 2, right = 2 * kv_len;
    EXPECT(KPC_STATUS_SIZE, kpc_mha_prefill(layer, x, 2 * E, 2, mask, right + 1, out, 2 * E));
    unchanged(layer, len0, k0, v0, "a mask of the wrong size");
    mask[1] = NAN;
    EXPECT(KPC_STATUS_INVALID_ARGUMENT,
           kpc_mha_prefill(layer, x, 2 * E, 2, mask, right, out, 2 * E));
    unchanged(layer, len0, k0, v0, "a NaN in the mask");
    mask[1] = INFINITY;
    EXPECT(KPC_STATUS_INVALID_ARGUMENT,
           kpc_mha_prefill(layer, x, 2 * E, 2, mask, right, out, 2 * E));
    unchanged(layer, len0, k0, v0, "+inf in the mask");
    mask[1] = 0.0f;
    EXPECT(KPC_STATUS_INVALID_ARGUMENT,
           kpc_mha_prefill(layer, x, 2 * E, 2, NULL, 0, out, 2 * E));
    unchanged(layer, len0, k0, v0, "no mask on an attn_mask layer");
    size_t past = kv_cache ? CAP + 4 : CAP + 1; /* kv_len of CAP + 1 positions */
    EXPECT(KPC_STATUS_SIZE, kpc_mha_prefill(layer, x, (size_t)(CAP + 1) * E, CAP + 1, mask,
                                            (size_t)(CAP + 1) * past, out, (size_t)(CAP + 1) * E));
    unchanged(layer, len0, k0, v0, "more positions than the capacity");
    if (kv_cache) {
        /* A step's mask is checked the same way. */
        float step_mask[4] = {0.0f, 0.0f, INFINITY, 0.0f};
        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step(layer, x, E, step_mask, 4, out, E));
        unchanged(layer, len0, k0, v0, "+inf in a step's mask");
    }
    /* And the layer still works: the same prefill again succeeds. */
    CHECK(kpc_mha_prefill(layer, x, 2 * E, 2, mask, right, out, 2 * E));
    uint32_t n = 0;
    CHECK(kpc_mha_len(layer, &n));
    ASSERT(n == (kv_cache ? 5u : 2u), "len %u after the good prefill", n);
    printf("refused prefills (kv_cache %d) left the layer as it was: len 3, export bit-exact\n",
           kv_cache);
    CHECK(kpc_mha_destroy(layer));
}

static void fp16_import_range(const kpc_context *ctx, const float *w) {
    kpc_mha *layer = make(ctx, w, 1, 0, 1, 1);
    float x[3 * E], out[3 * E], mask[9] = {0};
    fill(x, 3 * E, 2.0f);
    CHECK(kpc_mha_prefill(layer, x, 3 * E, 3, mask, 9, out, 3 * E));
    float k0[CAP * KV], v0[CAP * KV];
    size_t count = 0;
    uint32_t len0 = snapshot(layer, k0, v0, &count);
    float k[CAP * KV], v[CAP * KV];
    memcpy(k, k0, count * 4);
    memcpy(v, v0, count * 4);
    k[5] = 1.0e5f;
    EXPECT(KPC_STATUS_INVALID_ARGUMENT,
           kpc_mha_import_cache(layer, KPC_CACHE_LAYOUT_SDPA, k, v, count, len0));
    unchanged(layer, len0, k0, v0, "an import of 1e5");
    k[5] = k0[5];
    v[count - 1] = -70000.0f;
    EXPECT(KPC_STATUS_INVALID_ARGUMENT,
           kpc_mha_import_cache(layer, KPC_CACHE_LAYOUT_MHA, k, v, count, len0));
    unchanged(layer, len0, k0, v0, "an import of -7e4");
    /* fp16's largest value is in range, and comes back exactly. */
    v[count - 1] = 65504.0f;
    k[0] = -65504.0f;
    CHECK(kpc_mha_import_cache(layer, KPC_CACHE_LAYOUT_SDPA, k, v, count, len0));
    float k2[CAP * KV], v2[CAP * KV];
    snapshot(layer, k2, v2, &count);
    ASSERT(k2[0] == -65504.0f && v2[count - 1] == 65504.0f, "got %g and %g", k2[0],
           v2[count - 1]);
    printf("imports outside fp16's range refused, the cache kept; 65504 imported exactly\n");
    CHECK(kpc_mha_destroy(layer));
}

/* Row `row` of `out` is the output bias, to rounding. */
static int is_bias(const float *out, size_t row, const float *bias) {
    for (size_t c = 0; c < E; c++) {
        if (fabsf(out[row * E + c] - bias[c]) > 1e-6f) return 0;
    }
    return 1;
}

static void fully_masked_rows(const kpc_context *ctx, const float *w) {
    const float *bias = w + WN - E;
    float x[2 * E], a[2 * E], b[2 * E], c[2 * E];
    fill(x, 2 * E, 2.0f);
    /* Prefill of 2 queries over 2 keys, not causal: row 0 fully masked, row 1 not. */
    kpc_mha *layer = make(ctx, w, 0, 0, 0, 0);
    float inf_mask[4] = {-INFINITY, -INFINITY, 0.0f, 0.0f};
    CHECK(kpc_mha_prefill(layer, x, 2 * E, 2, inf_mask, 4, a, 2 * E));
    ASSERT(is_bias(a, 0, bias), "a row masked with -inf is not the output bias");
    ASSERT(!is_bias(a, 1, bias), "an unmasked row is the output bias");
    float big[4] = {-1.0e30f, -1.0e30f, 0.0f, 0.0f};
    CHECK(kpc_mha_prefill(layer, x, 2 * E, 2, big, 4, b, 2 * E));
    float max[4] = {-FLT_MAX, -FLT_MAX, 0.0f, 0.0f};
    CHECK(kpc_mha_prefill(layer, x, 2 * E, 2, max, 4, c, 2 * E));
    ASSERT(memcmp(b, c, E * 4) == 0, "rows masked with -1e30 and -FLT_MAX differ");
    ASSERT(!is_bias(b, 0, bias), "a row of equal finite mask values gave zeros");
    ASSERT(memcmp(a + E, b + E, E * 4) == 0, "the unmasked row changed with the other row's mask");
    CHECK(kpc_mha_destroy(layer));

    /* A step: self-attention (the new token's own key too) and cross-attention. */
    layer = make(ctx, w, 1, 0, 1, 0);
    float m3[9] = {0};
    CHECK(kpc_mha_prefill(layer, x, 2 * E, 2, m3, 4, a, 2 * E));
    float step_mask[3] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK(kpc_mha_step(layer, x + E, E, step_mask, 3, a, E));
    ASSERT(is_bias(a, 0, bias), "a fully masked self-attention step is not the output bias");
    CHECK(kpc_mha_destroy(layer));
    kpc_mha *cross = make(ctx, w, 1, 1, 0, 0);
    CHECK(kpc_mha_set_memory(cross, x, 2 * E, NULL, 0, 2));
    float per_head[H * 2];
    for (size_t i = 0; i < H * 2; i++) per_head[i] = -INFINITY;
    CHECK(kpc_mha_step(cross, x, E, per_head, H * 2, a, E));
    ASSERT(is_bias(a, 0, bias), "a fully masked cross-attention step is not the output bias");
    CHECK(kpc_mha_destroy(cross));
    printf("fully masked rows: -inf gives the output bias (prefill, step, cross step); -1e30 and "
           "-FLT_MAX give the same uniform row\n");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: mha_edges SELECTOR\n");
        return 2;
    }
    float *w = (float *)malloc(WN * sizeof(float));
    fill(w, WN, 0.4f);
    kpc_config *cfg = NULL;
    CHECK(kpc_config_create(&cfg));
    CHECK(kpc_config_set_persistent(cfg, 0));
    kpc_context *ctx = NULL;
    CHECK(kpc_context_create(cfg, argv[1], &ctx));
    refused_prefills(ctx, w, 1);
    refused_prefills(ctx, w, 0);
    fp16_import_range(ctx, w);
    fully_masked_rows(ctx, w);
    CHECK(kpc_context_destroy(ctx));
    CHECK(kpc_config_destroy(cfg));
    free(w);
    printf("mha_edges: %d checks passed\n", kpc_test_checks);
    return 0;
}
