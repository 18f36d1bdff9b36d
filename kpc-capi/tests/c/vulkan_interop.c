/* kpc C API tests a, c, d on Vulkan: the program is the embedder. It creates its own VkInstance and
 * VkDevice through the Vulkan loader, hands them to kpc, gets the shipped saxpy pipeline (SPIR-V read
 * from kernels/saxpy.spv), records and submits its own command buffer with it, and checks the output.
 *
 * usage: vulkan_interop MODE DEVICE_INDEX SAXPY_SPV BLOB_FILE
 *   build   a: the kernel must be compiled (an empty cache directory)
 *   disk    c: a new process on the same cache directory: the kernel must come from disk; also saves
 *           the kernel's cache blob and blob id to BLOB_FILE and BLOB_FILE.id
 *   blob    d: a fresh cache directory; the kernel is made from BLOB_FILE without a build
 *           (backend stats: programs_built == 0), after a damaged and a mismatched blob are refused
 * The cache directory is KPC_CACHE_DIR (kpc_config_from_env).
 *
 * With SAXPY_SPV naming a .comp file (GLSL), the image is made with kpc_image_from_glsl and kpc
 * compiles it through its SPIR-V cache (modes build and disk only): build stores the SPIR-V and the
 * program, disk finds both. It also checks kpc_image_from_glsl's argument errors and that a compile
 * error comes back as KPC_STATUS_GLSL_COMPILE citing its line.
 */
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

#define N 1000u
#define BIAS 2

typedef struct {
    VkBuffer buf;
    VkDeviceMemory mem;
    float *ptr;
} host_buffer;

static host_buffer make_buffer(VkPhysicalDevice pd, VkDevice dev, VkDeviceSize bytes) {
    host_buffer b;
    VkBufferCreateInfo bi = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = bytes;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    VK_CHECK(vkCreateBuffer(dev, &bi, NULL, &b.buf));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, b.buf, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
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
    VK_CHECK(vkAllocateMemory(dev, &ai, NULL, &b.mem));
    VK_CHECK(vkBindBufferMemory(dev, b.buf, b.mem, 0));
    VK_CHECK(vkMapMemory(dev, b.mem, 0, VK_WHOLE_SIZE, 0, (void **)&b.ptr));
    return b;
}

static void free_buffer(VkDevice dev, host_buffer *b) {
    vkUnmapMemory(dev, b->mem);
    vkDestroyBuffer(dev, b->buf, NULL);
    vkFreeMemory(dev, b->mem, NULL);
}

/* Records saxpy with kpc's raw handles into this program's own command buffer, submits it to its
 * own queue, and checks out[i] == a * x[i] + y[i] + BIAS. */
static void run_saxpy(VkPhysicalDevice pd, VkDevice dev, uint32_t family, VkQueue queue,
                      const kpc_kernel *k) {
    kpc_vulkan_kernel_handles h;
    memset(&h, 0, sizeof h);
    h.struct_size = sizeof h;
    CHECK(kpc_kernel_vulkan_handles(k, &h));
    printf("raw handles: pipeline 0x%llx, layout 0x%llx, %u set layout(s), %u bindings, push "
           "constants %u bytes (stages 0x%x), local size %ux%ux%u\n",
           (unsigned long long)h.pipeline, (unsigned long long)h.pipeline_layout,
           h.descriptor_set_layout_count, h.binding_count, h.push_constant_size,
           h.push_constant_stage_flags, h.local_size[0], h.local_size[1], h.local_size[2]);
    ASSERT(h.pipeline != 0 && h.pipeline_layout != 0, "handles");
    ASSERT(h.descriptor_set_layout_count == 1 && h.binding_count == 3, "set 0 with 3 bindings");
    ASSERT(h.push_constant_size == 8, "push constants n and a");

    host_buffer b[3];
    for (int i = 0; i < 3; i++) b[i] = make_buffer(pd, dev, N * sizeof(float));
    for (uint32_t i = 0; i < N; i++) {
        b[0].ptr[i] = (float)i * 0.5f;
        b[1].ptr[i] = 100.0f - (float)i;
        b[2].ptr[i] = -1.0f;
    }
    VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, h.binding_count};
    VkDescriptorPoolCreateInfo pi = {VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = 1;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &ps;
    VkDescriptorPool pool;
    VK_CHECK(vkCreateDescriptorPool(dev, &pi, NULL, &pool));
    VkDescriptorSetLayout set_layout = (VkDescriptorSetLayout)h.descriptor_set_layouts[0];
    VkDescriptorSetAllocateInfo dai = {VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    dai.descriptorPool = pool;
    dai.descriptorSetCount = 1;
    dai.pSetLayouts = &set_layout;
    VkDescriptorSet set;
    VK_CHECK(vkAllocateDescriptorSets(dev, &dai, &set));
    VkDescriptorBufferInfo dbi[3];
    VkWriteDescriptorSet w[3];
    for (uint32_t i = 0; i < 3; i++) {
        /* bindings[] is in launch order: x, y, out. */
        dbi[i].buffer = b[i].buf;
        dbi[i].offset = 0;
        dbi[i].range = VK_WHOLE_SIZE;
        memset(&w[i], 0, sizeof w[i]);
        w[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        w[i].dstSet = set;
        w[i].dstBinding = h.bindings[i].binding;
        w[i].descriptorCount = 1;
        w[i].descriptorType = (VkDescriptorType)h.bindings[i].descriptor_type;
        w[i].pBufferInfo = &dbi[i];
    }
    vkUpdateDescriptorSets(dev, 3, w, 0, NULL);

    VkCommandPoolCreateInfo cpi = {VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    cpi.queueFamilyIndex = family;
    VkCommandPool cpool;
    VK_CHECK(vkCreateCommandPool(dev, &cpi, NULL, &cpool));
    VkCommandBufferAllocateInfo cai = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    cai.commandPool = cpool;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    VkCommandBuffer cmd;
    VK_CHECK(vkAllocateCommandBuffers(dev, &cai, &cmd));
    VkCommandBufferBeginInfo cbi = {VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    VK_CHECK(vkBeginCommandBuffer(cmd, &cbi));
    VkPipelineLayout layout = (VkPipelineLayout)h.pipeline_layout;
    vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, (VkPipeline)h.pipeline);
    vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, &set, 0, NULL);
    struct {
        uint32_t n;
        float a;
    } pc = {N, 3.0f};
    vkCmdPushConstants(cmd, layout, h.push_constant_stage_flags, h.push_constant_offset,
                       h.push_constant_size, &pc);
    vkCmdDispatch(cmd, (N + h.local_size[0] - 1) / h.local_size[0], 1, 1);
    VkMemoryBarrier mb = {VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0,
                         1, &mb, 0, NULL, 0, NULL);
    VK_CHECK(vkEndCommandBuffer(cmd));
    VkFenceCreateInfo fi = {VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkFence fence;
    VK_CHECK(vkCreateFence(dev, &fi, NULL, &fence));
    VkSubmitInfo si = {VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    VK_CHECK(vkQueueSubmit(queue, 1, &si, fence));
    VK_CHECK(vkWaitForFences(dev, 1, &fence, VK_TRUE, UINT64_MAX));
    int bad = 0;
    for (uint32_t i = 0; i < N; i++) {
        float want = 3.0f * b[0].ptr[i] + b[1].ptr[i] + (float)BIAS;
        if (b[2].ptr[i] != want && bad++ < 5)
            fprintf(stderr, "out[%u] = %g, want %g\n", i, b[2].ptr[i], want);
    }
    ASSERT(bad == 0, "%d wrong outputs", bad);
    printf("own command buffer: saxpy of %u elements checked (out[7] = %g)\n", N, b[2].ptr[7]);
    vkDestroyFence(dev, fence, NULL);
    vkDestroyCommandPool(dev, cpool, NULL);
    vkDestroyDescriptorPool(dev, pool, NULL);
    for (int i = 0; i < 3; i++) free_buffer(dev, &b[i]);
}

/* The engine's own lock over its queue (one thread here, so a flag that must be free when taken). */
struct engine_queue_lock {
    int held;
    unsigned long taken;
};
static struct engine_queue_lock engine_queue;

static void engine_lock(void *user_data) {
    struct engine_queue_lock *l = user_data;
    ASSERT(!l->held, "the queue lock is taken twice");
    l->held = 1;
    l->taken++;
}

static void engine_unlock(void *user_data) {
    struct engine_queue_lock *l = user_data;
    ASSERT(l->held, "the queue lock is released while free");
    l->held = 0;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    ASSERT(f && fwrite(p, 1, n, f) == n && fclose(f) == 0, "write %s", path);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: vulkan_interop build|disk|blob DEVICE_INDEX SAXPY_SPV BLOB_FILE\n");
        return 2;
    }
    const char *mode = argv[1];
    uint32_t index = (uint32_t)atoi(argv[2]);
    char id_path[4096];
    snprintf(id_path, sizeof id_path, "%s.id", argv[4]);

    /* The embedder's own instance and device: no kpc involved yet. */
    uint32_t api = VK_API_VERSION_1_0;
    VK_CHECK(vkEnumerateInstanceVersion(&api));
    if (api > VK_API_VERSION_1_3) api = VK_API_VERSION_1_3;
    VkApplicationInfo app = {VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "kpc C interop test";
    app.apiVersion = api;
    VkInstanceCreateInfo ici = {VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ici.pApplicationInfo = &app;
    VkInstance instance;
    VK_CHECK(vkCreateInstance(&ici, NULL, &instance));
    uint32_t count = 0;
    VK_CHECK(vkEnumeratePhysicalDevices(instance, &count, NULL));
    ASSERT(index < count && count <= 16, "device %u of %u", index, count);
    VkPhysicalDevice pds[16];
    VK_CHECK(vkEnumeratePhysicalDevices(instance, &count, pds));
    VkPhysicalDevice pd = pds[index];
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(pd, &props);
    uint32_t nfam = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nfam, NULL);
    VkQueueFamilyProperties fams[16];
    if (nfam > 16) nfam = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &nfam, fams);
    uint32_t family = UINT32_MAX;
    for (uint32_t i = 0; i < nfam && family == UINT32_MAX; i++)
        if (fams[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
    ASSERT(family != UINT32_MAX, "a compute queue family");
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qci.queueFamilyIndex = family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &prio;
    VkDeviceCreateInfo dci = {VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    VkDevice dev;
    VK_CHECK(vkCreateDevice(pd, &dci, NULL, &dev));
    VkQueue queue;
    vkGetDeviceQueue(dev, family, 0, &queue);
    printf("embedder: own VkInstance (API %u.%u) and VkDevice on %s, queue family %u\n",
           VK_API_VERSION_MAJOR(api), VK_API_VERSION_MINOR(api), props.deviceName, family);

    /* kpc borrows them. */
    kpc_config *cfg = NULL;
    CHECK(kpc_config_from_env(&cfg));
    kpc_vulkan_handles vh;
    memset(&vh, 0, sizeof vh);
    vh.struct_size = sizeof vh;
    vh.instance_api_version = api;
    vh.get_instance_proc_addr = (void *)vkGetInstanceProcAddr;
    vh.instance = instance;
    vh.physical_device = pd;
    vh.device = dev;
    vh.queue_family_index = family;
    vh.queue = queue;
    vh.enabled_features = 0; /* nothing optional was enabled */
    /* The engine's lock over its queue, which kpc takes around its own submissions. */
    vh.queue_lock = engine_lock;
    vh.queue_unlock = engine_unlock;
    vh.queue_lock_user_data = &engine_queue;
    kpc_context *ctx = NULL;
    CHECK(kpc_context_create_vulkan(cfg, &vh, &ctx));
    CHECK(kpc_config_destroy(cfg)); /* the context keeps its own copy */
    kpc_backend be;
    CHECK(kpc_context_backend(ctx, &be));
    ASSERT(be == KPC_BACKEND_VULKAN, "backend %d", be);

    size_t spv_len = 0;
    unsigned char *spv = read_file(argv[3], &spv_len);
    kpc_image *img = NULL;
    size_t path_len = strlen(argv[3]);
    int glsl = path_len > 5 && strcmp(argv[3] + path_len - 5, ".comp") == 0;
    if (glsl) {
        ASSERT(strcmp(mode, "blob") != 0, "GLSL runs modes build and disk");
        char *src = (char *)malloc(spv_len + 1);
        memcpy(src, spv, spv_len);
        src[spv_len] = 0;
        const char *defines[] = {"KPC_C_TEST", "UNUSED_SCALE=2"};
        EXPECT(KPC_STATUS_INVALID_ARGUMENT,
               kpc_image_from_glsl(NULL, src, defines, 2, KPC_SPIRV_VULKAN_1_1,
                                   KPC_GLSL_OPTIMIZE_NONE, NULL, &img));
        EXPECT(KPC_STATUS_INVALID_ARGUMENT,
               kpc_image_from_glsl("saxpy", NULL, defines, 2, KPC_SPIRV_VULKAN_1_1,
                                   KPC_GLSL_OPTIMIZE_NONE, NULL, &img));
        EXPECT(KPC_STATUS_INVALID_ARGUMENT,
               kpc_image_from_glsl("saxpy", src, NULL, 2, KPC_SPIRV_VULKAN_1_1,
                                   KPC_GLSL_OPTIMIZE_NONE, NULL, &img));
        EXPECT(KPC_STATUS_INVALID_ARGUMENT,
               kpc_image_from_glsl("saxpy", src, defines, 2, 9, KPC_GLSL_OPTIMIZE_NONE, NULL, &img));
        EXPECT(KPC_STATUS_INVALID_ARGUMENT,
               kpc_image_from_glsl("saxpy", src, defines, 2, KPC_SPIRV_VULKAN_1_1,
                                   KPC_GLSL_OPTIMIZE_NONE, NULL, NULL));
        /* `y` is undeclared on line 3: the error names the line, and comes back again (cached). */
        const char *broken = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() { int x = y; }\n";
        kpc_image *bad = NULL;
        CHECK(kpc_image_from_glsl("broken", broken, NULL, 0, KPC_SPIRV_VULKAN_1_1,
                                  KPC_GLSL_OPTIMIZE_NONE, NULL, &bad));
        kpc_kernel *none = NULL;
        for (int i = 0; i < 2; i++) {
            EXPECT(KPC_STATUS_GLSL_COMPILE, kpc_kernel_create(ctx, bad, "broken", NULL, 0, NULL, &none));
            ASSERT(strstr(kpc_last_error(), "broken:3:") != NULL, "no line in: %s", kpc_last_error());
        }
        printf("compile error: %s\n", kpc_last_error());
        CHECK(kpc_image_destroy(bad));
        CHECK(kpc_image_from_glsl("saxpy", src, defines, 2, KPC_SPIRV_VULKAN_1_1,
                                  KPC_GLSL_OPTIMIZE_NONE, NULL, &img));
        free(src);
    } else {
        CHECK(kpc_image_create("saxpy", KPC_IMAGE_SPIRV, spv, spv_len, &img));
    }
    free(spv); /* kpc copied it */
    kpc_spec_constant spec;
    memset(&spec, 0, sizeof spec);
    spec.id = 1; /* BIAS */
    spec.kind = KPC_SPEC_I32;
    spec.value.i32 = BIAS;

    kpc_kernel *k = NULL;
    kpc_source want = strcmp(mode, "build") == 0 ? KPC_SOURCE_BUILT : KPC_SOURCE_DISK;
    if (strcmp(mode, "blob") != 0) {
        CHECK(kpc_kernel_create(ctx, img, "saxpy", &spec, 1, NULL, &k));
    } else {
        size_t blob_len = 0, id_len = 0;
        unsigned char *blob = read_file(argv[4], &blob_len);
        unsigned char *saved_id = read_file(id_path, &id_len);
        /* The blob id is stable across processes. */
        size_t n = 0;
        CHECK(kpc_cache_blob_id(ctx, img, &spec, 1, NULL, NULL, 0, &n));
        unsigned char *id = (unsigned char *)malloc(n);
        CHECK(kpc_cache_blob_id(ctx, img, &spec, 1, NULL, id, n, &n));
        ASSERT(n == id_len && memcmp(id, saved_id, n) == 0, "the blob id changed");
        printf("blob id: %zu bytes, the same as the saving process's\n", n);
        /* Another key (BIAS = 5) and a damaged blob are refused before any driver call. */
        kpc_spec_constant other = spec;
        other.value.i32 = 5;
        EXPECT(KPC_STATUS_BLOB_MISMATCH,
               kpc_kernel_create_from_blob(ctx, img, "saxpy", &other, 1, NULL, blob, blob_len, &k));
        blob[blob_len / 2] ^= 0x40;
        EXPECT(KPC_STATUS_CORRUPT_BLOB,
               kpc_kernel_create_from_blob(ctx, img, "saxpy", &spec, 1, NULL, blob, blob_len, &k));
        blob[blob_len / 2] ^= 0x40;
        CHECK(kpc_kernel_create_from_blob(ctx, img, "saxpy", &spec, 1, NULL, blob, blob_len, &k));
        want = KPC_SOURCE_BLOB;
        free(blob);
        free(saved_id);
        free(id);
    }
    kpc_kernel_info ki;
    memset(&ki, 0, sizeof ki);
    ki.struct_size = sizeof ki;
    CHECK(kpc_kernel_info_get(k, &ki));
    printf("saxpy from %s (%.3f ms)\n", kpc_source_name((int)ki.source), ki.acquire_time_ns / 1e6);
    ASSERT(ki.source == (uint32_t)want, "source %s, want %s", kpc_source_name((int)ki.source),
           kpc_source_name(want));

    run_saxpy(pd, dev, family, queue, k);

    if (strcmp(mode, "disk") == 0) {
        size_t n = 0;
        uint8_t tiny[1];
        EXPECT(KPC_STATUS_BUFFER_TOO_SMALL, kpc_kernel_cache_blob(k, tiny, sizeof tiny, &n));
        unsigned char *blob = (unsigned char *)malloc(n);
        CHECK(kpc_kernel_cache_blob(k, blob, n, &n));
        write_bytes(argv[4], blob, n);
        printf("saved the cache blob: %zu bytes\n", n);
        free(blob);
        CHECK(kpc_cache_blob_id(ctx, img, &spec, 1, NULL, NULL, 0, &n));
        unsigned char *id = (unsigned char *)malloc(n);
        CHECK(kpc_cache_blob_id(ctx, img, &spec, 1, NULL, id, n, &n));
        write_bytes(id_path, id, n);
        free(id);
    }
    /* An OpenCL-only operation on a Vulkan kernel is refused. */
    kpc_lease *lease = NULL;
    EXPECT(KPC_STATUS_WRONG_BACKEND, kpc_lease_acquire(k, &lease));

    kpc_stats st = stats_of(ctx);
    printf("stats: programs built %llu, loaded %llu; disk hits %llu, puts %llu; memory hits %llu\n",
           (unsigned long long)st.backend_counters.programs_built,
           (unsigned long long)st.backend_counters.programs_loaded,
           (unsigned long long)st.disk.hits, (unsigned long long)st.disk.puts,
           (unsigned long long)st.memory.hits);
    ASSERT(st.disk.enabled == 1, "the disk cache is on (KPC_CACHE_DIR)");
    /* A GLSL image's SPIR-V is one more disk entry, stored and found like the program. */
    uint64_t entries = glsl ? 2 : 1;
    if (strcmp(mode, "build") == 0)
        ASSERT(st.backend_counters.programs_built == 1 && st.disk.puts == entries, "built and stored");
    else if (strcmp(mode, "disk") == 0)
        ASSERT(st.backend_counters.programs_built == 0 && st.disk.hits == entries, "from disk");
    else
        ASSERT(st.backend_counters.programs_built == 0 && st.backend_counters.programs_loaded == 1 &&
                   st.disk.puts == 0,
               "from the blob, without a build, nothing written to disk");

    /* Nothing of kpc's in flight on the device once quiesce returns. (This API's calls only build:
     * kpc took the engine's queue lock engine_queue.taken times, which is none.) */
    CHECK(kpc_context_quiesce(ctx));
    printf("quiesced; the engine's queue lock was taken %lu times\n", engine_queue.taken);

    /* kpc's objects go first; then the embedder destroys its own device, which kpc never did. */
    CHECK(kpc_kernel_destroy(k));
    CHECK(kpc_image_destroy(img));
    CHECK(kpc_context_destroy(ctx));
    VK_CHECK(vkDeviceWaitIdle(dev));
    vkDestroyDevice(dev, NULL);
    vkDestroyInstance(instance, NULL);
    printf("vulkan_interop %s: passed (%d checks)\n", mode, kpc_test_checks);
    return 0;
}
