/* kpc C API test: the MultiHeadAttention layer on device tensors, from an embedder that owns its
 * device and passes its own buffers. The program creates its VkDevice (or cl_context and queue),
 * a kpc context over it, and buffers of its own that kpc imports without a copy (a VkBuffer at an
 * offset, a cl_mem). One layer runs the host-pointer calls, a twin with the same weights the tensor
 * calls on the imported buffers: their outputs must be the same bits, and the embedder reads them
 * straight from its own memory. Every bad argument (NULL, wrong dtype, wrong shape, a tensor of
 * another context, a too-small or foreign imported buffer) is a status with a message, and the
 * layer is unchanged after each.
 *
 * usage: mha_tensor vulkan|opencl DEVICE_INDEX
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdint.h>
#include <vulkan/vulkan.h>

#include "kpc_test.h"

#define VK_CHECK(call)                                                                             \
    do {                                                                                           \
        VkResult r_ = (call);                                                                      \
        if (r_ != VK_SUCCESS) {                                                                    \
            fprintf(stderr, "FAIL %s:%d: %s -> VkResult %d\n", __FILE__, __LINE__, #call, r_);     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CL_CHECK(call)                                                                             \
    do {                                                                                           \
        cl_int e_ = (call);                                                                        \
        if (e_ != CL_SUCCESS) {                                                                    \
            fprintf(stderr, "FAIL %s:%d: %s -> cl error %d\n", __FILE__, __LINE__, #call, e_);     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define E 32u
#define H 4u
#define HKV 2u
#define PROMPT 3u
#define STEPS 3u

/* The embedder's device and its buffers, one API or the other. */
typedef struct {
    int vulkan;
    VkInstance instance;
    VkPhysicalDevice pd;
    VkDevice dev;
    VkQueue queue;
    uint32_t family;
    VkDeviceSize align;
    cl_context clctx, other_clctx;
    cl_device_id cldev;
    cl_command_queue q;
} embedder;

typedef struct {
    VkBuffer buf;
    VkDeviceMemory mem;
    float *ptr; /* Vulkan: mapped */
    cl_mem clmem;
    uint64_t bytes;
} own_buffer;

static uint32_t rng = 12345u;
static float rnd(void) {
    rng = rng * 1664525u + 1013904223u;
    return ((float)(rng >> 8) / 16777216.0f - 0.5f) * 0.5f;
}

static own_buffer make_buffer(embedder *em, uint64_t bytes) {
    own_buffer b;
    memset(&b, 0, sizeof b);
    b.bytes = bytes;
    if (!em->vulkan) {
        cl_int err;
        b.clmem = clCreateBuffer(em->clctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        CL_CHECK(err);
        return b;
    }
    VkBufferCreateInfo bi = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = bytes;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
               VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    VK_CHECK(vkCreateBuffer(em->dev, &bi, NULL, &b.buf));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(em->dev, b.buf, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(em->pd, &mp);
    /* Host-visible, so that the embedder can read what kpc wrote in place. */
    VkMemoryPropertyFlags want =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t type = UINT32_MAX;
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++)
        if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) {
            type = i;
            break;
        }
    ASSERT(type != UINT32_MAX, "host-visible coherent memory");
    VkMemoryAllocateInfo ai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = type;
    VK_CHECK(vkAllocateMemory(em->dev, &ai, NULL, &b.mem));
    VK_CHECK(vkBindBufferMemory(em->dev, b.buf, b.mem, 0));
    VK_CHECK(vkMapMemory(em->dev, b.mem, 0, VK_WHOLE_SIZE, 0, (void **)&b.ptr));
    return b;
}

/* Imports `size` bytes of `b` from `offset` (Vulkan only) into kpc. */
static kpc_status import(embedder *em, const kpc_context *ctx, own_buffer *b, uint64_t offset,
                         uint64_t size, kpc_buffer **out) {
    if (em->vulkan)
        return kpc_buffer_import_vulkan(ctx, (uint64_t)(uintptr_t)b->buf,
                                        (uint64_t)(uintptr_t)b->mem, offset, size, out);
    return kpc_buffer_import_opencl(ctx, b->clmem, size, out);
}

/* The embedder reads `n` floats at byte `offset` of its own buffer. */
static void read_own(embedder *em, own_buffer *b, uint64_t offset, float *out, size_t n) {
    if (em->vulkan) {
        memcpy(out, (const char *)b->ptr + offset, n * sizeof(float));
        return;
    }
    CL_CHECK(clEnqueueReadBuffer(em->q, b->clmem, CL_TRUE, offset, n * sizeof(float), out, 0, NULL,
                                 NULL));
}

static void free_buffer(embedder *em, own_buffer *b) {
    if (em->vulkan) {
        vkUnmapMemory(em->dev, b->mem);
        vkDestroyBuffer(em->dev, b->buf, NULL);
        vkFreeMemory(em->dev, b->mem, NULL);
    } else {
        clReleaseMemObject(b->clmem);
    }
}

static void open_vulkan(embedder *em, uint32_t index) {
    VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "kpc C tensor test";
    app.apiVersion = VK_API_VERSION_1_1;
    VkInstanceCreateInfo ici = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ici.pApplicationInfo = &app;
    VK_CHECK(vkCreateInstance(&ici, NULL, &em->instance));
    uint32_t count = 0;
    VK_CHECK(vkEnumeratePhysicalDevices(em->instance, &count, NULL));
    ASSERT(index < count && count <= 16, "device %u of %u", index, count);
    VkPhysicalDevice pds[16];
    VK_CHECK(vkEnumeratePhysicalDevices(em->instance, &count, pds));
    em->pd = pds[index];
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(em->pd, &props);
    em->align = props.limits.minStorageBufferOffsetAlignment;
    uint32_t nfam = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(em->pd, &nfam, NULL);
    VkQueueFamilyProperties fams[16];
    if (nfam > 16) nfam = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(em->pd, &nfam, fams);
    em->family = UINT32_MAX;
    for (uint32_t i = 0; i < nfam && em->family == UINT32_MAX; i++)
        if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) em->family = i;
    ASSERT(em->family != UINT32_MAX, "a compute queue family");
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = em->family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &prio;
    VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    VK_CHECK(vkCreateDevice(em->pd, &dci, NULL, &em->dev));
    vkGetDeviceQueue(em->dev, em->family, 0, &em->queue);
    printf("embedder: own VkDevice on %s, storage offset alignment %llu\n", props.deviceName,
           (unsigned long long)em->align);
}

static void open_opencl(embedder *em, int index) {
    cl_platform_id plats[16];
    cl_uint np = 0;
    CL_CHECK(clGetPlatformIDs(16, plats, &np));
    em->cldev = NULL;
    for (cl_uint p = 0; p < np && em->cldev == NULL; p++) {
        cl_device_id devs[16];
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, devs, &nd) != CL_SUCCESS) continue;
        if (index < (int)nd)
            em->cldev = devs[index];
        else
            index -= (int)nd;
    }
    ASSERT(em->cldev != NULL, "an OpenCL device");
    cl_int err;
    em->clctx = clCreateContext(NULL, 1, &em->cldev, NULL, NULL, &err);
    CL_CHECK(err);
    /* A second cl_context: its buffers are not the kpc context's. */
    em->other_clctx = clCreateContext(NULL, 1, &em->cldev, NULL, NULL, &err);
    CL_CHECK(err);
    em->q = clCreateCommandQueue(em->clctx, em->cldev, 0, &err);
    CL_CHECK(err);
    printf("embedder: own cl_context and in-order queue\n");
}

static kpc_mha *make_layer(const kpc_context *ctx, int mask, const float *w, size_t wn) {
    kpc_mha_params p;
    CHECK(kpc_mha_params_init(&p, E, H));
    p.num_kv_heads = HKV;
    p.capacity = 16;
    p.attn_mask = mask;
    kpc_mha *layer = NULL;
    CHECK(kpc_mha_create(ctx, &p, w, wn, &layer));
    return layer;
}

static kpc_tensor *tensor(const kpc_context *ctx, int32_t d, uint64_t a, uint64_t b, uint64_t c,
                          size_t rank) {
    uint64_t shape[3] = {a, b, c};
    kpc_tensor *t = NULL;
    CHECK(kpc_tensor_create(ctx, d, shape, rank, &t));
    return t;
}

static uint32_t len_of(const kpc_mha *l) {
    uint32_t n = 0;
    CHECK(kpc_mha_len(l, &n));
    return n;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: mha_tensor vulkan|opencl DEVICE_INDEX\n");
        return 2;
    }
    embedder em;
    memset(&em, 0, sizeof em);
    em.vulkan = strcmp(argv[1], "vulkan") == 0;
    int index = atoi(argv[2]);
    kpc_config *cfg = NULL;
    CHECK(kpc_config_from_env(&cfg));
    kpc_context *ctx = NULL;
    if (em.vulkan) {
        open_vulkan(&em, (uint32_t)index);
        kpc_vulkan_handles vh;
        memset(&vh, 0, sizeof vh);
        vh.struct_size = sizeof vh;
        vh.instance_api_version = VK_API_VERSION_1_1;
        vh.get_instance_proc_addr = (void *)vkGetInstanceProcAddr;
        vh.instance = em.instance;
        vh.physical_device = em.pd;
        vh.device = em.dev;
        vh.queue_family_index = em.family;
        vh.queue = em.queue;
        CHECK(kpc_context_create_vulkan(cfg, &vh, &ctx));
    } else {
        open_opencl(&em, index);
        kpc_opencl_handles oh;
        memset(&oh, 0, sizeof oh);
        oh.struct_size = sizeof oh;
        oh.context = em.clctx;
        oh.device = em.cldev;
        oh.queue = em.q;
        CHECK(kpc_context_create_opencl(cfg, &oh, &ctx));
    }
    /* Another context on kpc's own device: its tensors are not this layer's. */
    char selector[64];
    snprintf(selector, sizeof selector, "%s:%d", argv[1], atoi(argv[2]));
    kpc_context *other = NULL;
    CHECK(kpc_context_create(cfg, selector, &other));
    CHECK(kpc_config_destroy(cfg));

    size_t kv = (size_t)HKV * (E / H);
    size_t wn = (size_t)E * E + E + 2 * (kv * E + kv) + (size_t)E * E + E;
    float *w = malloc(wn * sizeof(float));
    for (size_t i = 0; i < wn; i++) w[i] = rnd();
    kpc_mha *host = make_layer(ctx, 0, w, wn);
    kpc_mha *dev = make_layer(ctx, 0, w, wn);

    /* The prompt: host pointers on one layer, kpc-made tensors on the other. */
    float xp[PROMPT * E], yh[PROMPT * E], yd[PROMPT * E];
    for (size_t i = 0; i < PROMPT * E; i++) xp[i] = rnd();
    CHECK(kpc_mha_prefill(host, xp, PROMPT * E, PROMPT, NULL, 0, yh, PROMPT * E));
    kpc_tensor *tx = tensor(ctx, KPC_DTYPE_F32, 1, PROMPT, E, 3);
    kpc_tensor *ty = tensor(ctx, KPC_DTYPE_F32, 1, PROMPT, E, 3);
    CHECK(kpc_tensor_write_f32(tx, xp, PROMPT * E));
    CHECK(kpc_mha_prefill_tensor(dev, tx, ty, NULL));
    CHECK(kpc_tensor_read_f32(ty, yd, PROMPT * E));
    ASSERT(memcmp(yh, yd, sizeof yh) == 0, "prefill: tensor call differs from the host call");
    printf("prefill: %u positions, tensor call = host call (bit-exact)\n", PROMPT);

    /* Steps on the embedder's own buffers: x at the start of one, out at an aligned offset of
     * another (Vulkan; OpenCL imports a whole cl_mem). */
    uint64_t off = em.vulkan ? (em.align > 64 ? em.align : 64) : 0;
    own_buffer bx = make_buffer(&em, E * sizeof(float));
    own_buffer by = make_buffer(&em, off + E * sizeof(float));
    kpc_buffer *ix = NULL, *iy = NULL;
    CHECK(import(&em, ctx, &bx, 0, E * sizeof(float), &ix));
    CHECK(import(&em, ctx, &by, off, E * sizeof(float), &iy));
    uint64_t size = 0;
    CHECK(kpc_buffer_size(iy, &size));
    ASSERT(size == E * sizeof(float), "imported size %llu", (unsigned long long)size);
    uint64_t shape[2] = {1, E};
    kpc_tensor *sx = NULL, *sy = NULL;
    CHECK(kpc_tensor_from_buffer(ix, KPC_DTYPE_F32, shape, 2, &sx));
    CHECK(kpc_tensor_from_buffer(iy, KPC_DTYPE_F32, shape, 2, &sy));
    /* The tensors keep the memory; the handles can go. */
    CHECK(kpc_buffer_destroy(ix));
    float x[E], a[E], b[E], own[E];
    for (uint32_t s = 0; s < STEPS; s++) {
        for (uint32_t i = 0; i < E; i++) x[i] = rnd();
        CHECK(kpc_mha_step(host, x, E, NULL, 0, a, E));
        CHECK(kpc_tensor_write_f32(sx, x, E));
        CHECK(kpc_mha_step_tensor(dev, sx, sy, NULL));
        CHECK(kpc_tensor_read_f32(sy, b, E));
        ASSERT(memcmp(a, b, sizeof a) == 0, "step %u: tensor call differs from the host call", s);
        read_own(&em, &by, off, own, E);
        ASSERT(memcmp(a, own, sizeof a) == 0, "step %u: the embedder's buffer does not hold it", s);
    }
    printf("steps: %u on the embedder's own buffers (out at offset %llu), equal to the host calls "
           "and read from the embedder's memory\n",
           STEPS, (unsigned long long)off);

    /* Buffers: bad arguments. */
    kpc_buffer *kb = NULL, *bad = NULL;
    CHECK(kpc_buffer_create(ctx, 64, &kb));
    unsigned char bytes[64];
    memset(bytes, 7, sizeof bytes);
    CHECK(kpc_buffer_upload(kb, 0, bytes, sizeof bytes));
    unsigned char back[64];
    CHECK(kpc_buffer_download(kb, 0, back, sizeof back));
    ASSERT(memcmp(bytes, back, sizeof back) == 0, "buffer round trip");
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_create(ctx, 0, &bad));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_create(NULL, 64, &bad));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_create(ctx, 64, NULL));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_upload(kb, 0, NULL, 4));
    EXPECT(KPC_STATUS_SIZE, kpc_buffer_upload(kb, 62, bytes, 4));
    EXPECT(KPC_STATUS_SIZE, kpc_buffer_download(kb, 64, back, 4));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_size(NULL, &size));
    /* Imports: too small, foreign, NULL, the other API. */
    EXPECT(KPC_STATUS_SIZE, import(&em, ctx, &bx, 0, 1 << 20, &bad));
    EXPECT(KPC_STATUS_SIZE, import(&em, ctx, &bx, 0, 0, &bad));
    if (em.vulkan) {
        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_import_vulkan(ctx, 0, 0, 0, 16, &bad));
        EXPECT(KPC_STATUS_SIZE, kpc_buffer_import_vulkan(ctx, (uint64_t)(uintptr_t)by.buf,
                                                         (uint64_t)(uintptr_t)by.mem, off,
                                                         off + E * sizeof(float), &bad));
        if (em.align > 1)
            EXPECT(KPC_STATUS_INVALID_ARGUMENT,
                   kpc_buffer_import_vulkan(ctx, (uint64_t)(uintptr_t)by.buf,
                                            (uint64_t)(uintptr_t)by.mem, 1, 16, &bad));
        int dummy = 0;
        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_import_opencl(ctx, &dummy, 16, &bad));
    } else {
        cl_int err;
        cl_mem foreign = clCreateBuffer(em.other_clctx, CL_MEM_READ_WRITE, 256, NULL, &err);
        CL_CHECK(err);
        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_import_opencl(ctx, foreign, 64, &bad));
        clReleaseMemObject(foreign);
        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_import_opencl(ctx, NULL, 64, &bad));
        EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_import_vulkan(ctx, 1, 1, 0, 16, &bad));
    }

    /* Tensors: bad arguments. */
    kpc_tensor *bt = NULL;
    uint64_t zero[2] = {1, 0}, odd[1] = {3};
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_tensor_create(ctx, KPC_DTYPE_F32, shape, 0, &bt));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_tensor_create(ctx, KPC_DTYPE_F32, zero, 2, &bt));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_tensor_create(ctx, KPC_DTYPE_F16, odd, 1, &bt));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_tensor_create(ctx, 9, shape, 2, &bt));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_tensor_create(ctx, KPC_DTYPE_F32, NULL, 2, &bt));
    uint64_t big[2] = {1, 64};
    EXPECT(KPC_STATUS_SIZE, kpc_tensor_from_buffer(kb, KPC_DTYPE_F32, big, 2, &bt));
    EXPECT(KPC_STATUS_SIZE, kpc_tensor_write_f32(sx, x, E - 1));
    EXPECT(KPC_STATUS_SIZE, kpc_tensor_read_f32(sy, b, E + 1));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_tensor_write_f32(sx, NULL, E));
    float huge[E];
    for (uint32_t i = 0; i < E; i++) huge[i] = 1e6f;
    kpc_tensor *h16 = tensor(ctx, KPC_DTYPE_F16, 1, E, 0, 2);
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_tensor_write_f32(h16, huge, E));

    /* The layer's tensor calls: bad arguments, each refused with the layer unchanged. */
    uint32_t before = len_of(dev);
    kpc_tensor *wide = tensor(ctx, KPC_DTYPE_F32, 2, E, 0, 2);
    kpc_tensor *flat = tensor(ctx, KPC_DTYPE_F32, E, 0, 0, 1);
    kpc_tensor *theirs = tensor(other, KPC_DTYPE_F32, 1, E, 0, 2);
    kpc_tensor *m = tensor(ctx, KPC_DTYPE_F32, 1, before + 1, 0, 2);
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step_tensor(NULL, sx, sy, NULL));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step_tensor(dev, NULL, sy, NULL));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step_tensor(dev, sx, NULL, NULL));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step_tensor(dev, (kpc_tensor *)kb, sy, NULL));
    EXPECT(KPC_STATUS_SIZE, kpc_mha_step_tensor(dev, wide, sy, NULL));
    EXPECT(KPC_STATUS_SIZE, kpc_mha_step_tensor(dev, flat, sy, NULL));
    EXPECT(KPC_STATUS_SIZE, kpc_mha_step_tensor(dev, sx, wide, NULL));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step_tensor(dev, theirs, sy, NULL));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step_tensor(dev, sx, theirs, NULL));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step_tensor(dev, sx, sy, m));
    EXPECT(KPC_STATUS_SIZE, kpc_mha_prefill_tensor(dev, sx, sy, NULL));
    EXPECT(KPC_STATUS_CALL_ORDER, kpc_mha_set_memory_tensor(dev, tx, NULL));
    ASSERT(len_of(dev) == before, "refused calls moved the cache: %u, was %u", len_of(dev), before);
    /* A masked layer: the mask is an f32 tensor [1][kv_len]. */
    kpc_mha *masked = make_layer(ctx, 1, w, wn);
    kpc_tensor *m16 = tensor(ctx, KPC_DTYPE_F16, H, 1, 1, 3);
    kpc_tensor *m3 = tensor(ctx, KPC_DTYPE_F32, 1, 3, 0, 2);
    kpc_tensor *m1 = tensor(ctx, KPC_DTYPE_F32, 1, 1, 0, 2);
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step_tensor(masked, sx, sy, NULL));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_mha_step_tensor(masked, sx, sy, m16));
    EXPECT(KPC_STATUS_SIZE, kpc_mha_step_tensor(masked, sx, sy, m3));
    ASSERT(len_of(masked) == 0, "refused masked steps moved the cache");
    float zero1 = 0.0f;
    CHECK(kpc_tensor_write_f32(m1, &zero1, 1));
    CHECK(kpc_mha_step_tensor(masked, sx, sy, m1));
    ASSERT(len_of(masked) == 1, "the masked step appended");

    /* After every refusal the twin layers still agree. */
    for (uint32_t i = 0; i < E; i++) x[i] = rnd();
    CHECK(kpc_mha_step(host, x, E, NULL, 0, a, E));
    CHECK(kpc_tensor_write_f32(sx, x, E));
    CHECK(kpc_mha_step_tensor(dev, sx, sy, NULL));
    CHECK(kpc_tensor_read_f32(sy, b, E));
    ASSERT(memcmp(a, b, sizeof a) == 0, "the step after the refusals differs");
    printf("refused tensor calls left the layer as it was\n");

    kpc_tensor *all[] = {tx, ty, sx, sy, h16, wide, flat, theirs, m, m16, m3, m1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CHECK(kpc_tensor_destroy(all[i]));
    CHECK(kpc_buffer_destroy(iy));
    CHECK(kpc_buffer_destroy(kb));
    EXPECT(KPC_STATUS_INVALID_ARGUMENT, kpc_buffer_destroy(kb));
    CHECK(kpc_mha_destroy(host));
    CHECK(kpc_mha_destroy(dev));
    CHECK(kpc_mha_destroy(masked));
    CHECK(kpc_context_destroy(other));
    CHECK(kpc_context_destroy(ctx));
    free_buffer(&em, &bx);
    free_buffer(&em, &by);
    if (em.vulkan) {
        vkDestroyDevice(em.dev, NULL);
        vkDestroyInstance(em.instance, NULL);
    } else {
        clReleaseCommandQueue(em.q);
        clReleaseContext(em.clctx);
        clReleaseContext(em.other_clctx);
    }
    free(w);
    printf("mha_tensor: %d checks passed\n", kpc_test_checks);
    return 0;
}
