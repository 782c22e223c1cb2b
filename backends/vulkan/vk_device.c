/* The Vulkan backend's table: the loader (dlopen'ed, so a machine without
 * libvulkan still runs twinkle), devices, contexts and pipelines. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vk_internal.h"

static void *loader_handle;
static char loader_error[256];
static pthread_once_t loader_once = PTHREAD_ONCE_INIT;

static void load_loader(void) {
    /* TWK_VULKAN_LOADER names another loader (tests use a missing one) */
    const char *env = getenv("TWK_VULKAN_LOADER");
    const char *names[] = {env && *env ? env : "libvulkan.so.1", env && *env ? NULL : "libvulkan.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && names[i] && !loader_handle; i++)
        loader_handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!loader_handle) {
        const char *e = dlerror();
        snprintf(loader_error, sizeof loader_error, "no Vulkan loader (%s): %s", names[0], e ? e : "not found");
    }
}

twk_status vk_instance_new(VkInstance *inst, vk_fns *f) {
    pthread_once(&loader_once, load_loader);
    if (!loader_handle) return twk_error(TWK_ERR_UNSUPPORTED, "vulkan: %s", loader_error);
    memset(f, 0, sizeof *f);
    *(void **)&f->vkGetInstanceProcAddr = dlsym(loader_handle, "vkGetInstanceProcAddr");
    if (!f->vkGetInstanceProcAddr)
        return twk_error(TWK_ERR_UNSUPPORTED, "vulkan: the loader has no vkGetInstanceProcAddr");
    f->vkCreateInstance = (PFN_vkCreateInstance)f->vkGetInstanceProcAddr(NULL, "vkCreateInstance");
    if (!f->vkCreateInstance) return twk_error(TWK_ERR_UNSUPPORTED, "vulkan: no vkCreateInstance");
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "twinkle",
                             .pEngineName = "twinkle", .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkResult r = f->vkCreateInstance(&ci, NULL, inst);
    if (r != VK_SUCCESS)
        return twk_error(TWK_ERR_UNSUPPORTED, "vulkan: vkCreateInstance failed (VkResult %d): no usable driver",
                         (int)r);
#define VK_FN_LOAD_(fn)                                                                         \
    f->fn = (PFN_##fn)f->vkGetInstanceProcAddr(*inst, #fn);                                      \
    if (!f->fn) {                                                                               \
        PFN_vkDestroyInstance di = (PFN_vkDestroyInstance)f->vkGetInstanceProcAddr(*inst, "vkDestroyInstance"); \
        if (di) di(*inst, NULL);                                                                \
        return twk_error(TWK_ERR_UNSUPPORTED, "vulkan: the loader lacks %s", #fn);            \
    }
    VK_INSTANCE_FNS(VK_FN_LOAD_)
#undef VK_FN_LOAD_
    return TWK_OK;
}

static int compute_family(VkPhysicalDevice pd, const vk_fns *f, uint32_t *family) {
    uint32_t nq = 0;
    f->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    VkQueueFamilyProperties qp[32];
    if (nq > 32) nq = 32;
    f->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qp);
    for (uint32_t i = 0; i < nq; i++)
        if (qp[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *family = i;
            return 1;
        }
    return 0;
}

int vk_compute_devices(VkInstance inst, const vk_fns *f, VkPhysicalDevice *devs, int max) {
    uint32_t n = 0;
    if (f->vkEnumeratePhysicalDevices(inst, &n, NULL) != VK_SUCCESS || n == 0) return 0;
    VkPhysicalDevice all[16];
    if (n > 16) n = 16;
    if (f->vkEnumeratePhysicalDevices(inst, &n, all) < 0) return 0;
    int k = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t fam;
        VkPhysicalDeviceProperties p;
        f->vkGetPhysicalDeviceProperties(all[i], &p);
        if (p.apiVersion < VK_API_VERSION_1_1) continue; /* the shaders are SPIR-V 1.3 */
        if (!compute_family(all[i], f, &fam)) continue;
        if (devs && k < max) devs[k] = all[i];
        k++;
    }
    return k;
}

static int device_count_cached = -1;
static VkInstance probe_instance; /* never destroyed: see vk_device_count */
static char no_device_reason[512];
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;

/* Counted once per process (an instance is costly); with none, every call
 * leaves the reason as the thread's error, which device_open reports. */
static int vk_device_count(void) {
    pthread_mutex_lock(&count_lock);
    if (device_count_cached < 0) {
        VkInstance inst;
        vk_fns f;
        if (vk_instance_new(&inst, &f) != TWK_OK) {
            device_count_cached = 0;
            snprintf(no_device_reason, sizeof no_device_reason, "%s", twk_last_error());
        } else {
            device_count_cached = vk_compute_devices(inst, &f, NULL, 0);
            if (device_count_cached == 0)
                snprintf(no_device_reason, sizeof no_device_reason,
                         "vulkan: the driver reports no device with a compute queue");
            /* The probe instance lives as long as the process: it keeps the driver loaded, so
             * later opens do not load it again (Mesa 22's lavapipe leaks a block per load,
             * which LeakSanitizer reports once the library is gone). */
            probe_instance = inst;
        }
    }
    int n = device_count_cached;
    pthread_mutex_unlock(&count_lock);
    if (n == 0) twk_error(TWK_ERR_NOT_FOUND, "%s", no_device_reason);
    return n;
}

/* Opens instance + physical device `index`; the caller destroys the instance. */
static twk_status pick(int index, VkInstance *inst, vk_fns *f, VkPhysicalDevice *pd) {
    twk_status st = vk_instance_new(inst, f);
    if (st != TWK_OK) return st;
    VkPhysicalDevice devs[16];
    int n = vk_compute_devices(*inst, f, devs, 16);
    if (index < 0 || index >= n || index >= 16) {
        f->vkDestroyInstance(*inst, NULL);
        return twk_error(TWK_ERR_NOT_FOUND, "vulkan: no device %d (%d found)", index, n);
    }
    *pd = devs[index];
    return TWK_OK;
}

static uint64_t device_local_bytes(const VkPhysicalDeviceMemoryProperties *mp) {
    uint64_t best = 0;
    for (uint32_t i = 0; i < mp->memoryHeapCount; i++)
        if ((mp->memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp->memoryHeaps[i].size > best)
            best = mp->memoryHeaps[i].size;
    return best;
}

static int has_extension(const vk_fns *f, VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    if (f->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || !n) return 0;
    VkExtensionProperties *e = twk_host_alloc(n * sizeof *e, "vulkan extensions");
    if (!e) return 0;
    int found = 0;
    if (f->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e) >= 0)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(e[i].extensionName, name) == 0;
    twk_host_free(e);
    return found;
}

/* SMs (NVIDIA) or CUs (AMD) where the driver reports them, host cores for a
 * CPU device (lavapipe), else 0. */
static int compute_units(const vk_fns *f, VkInstance inst, VkPhysicalDevice pd, const VkPhysicalDeviceProperties *p) {
    if (p->deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int)n : 0;
    }
    PFN_vkGetPhysicalDeviceProperties2 get2 =
        (PFN_vkGetPhysicalDeviceProperties2)f->vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceProperties2");
    if (!get2 || p->apiVersion < VK_API_VERSION_1_1) return 0;
    if (has_extension(f, pd, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME)) {
        VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
        VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sm};
        get2(pd, &p2);
        return (int)sm.shaderSMCount;
    }
    if (has_extension(f, pd, VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME)) {
        VkPhysicalDeviceShaderCorePropertiesAMD cp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
        VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &cp};
        get2(pd, &p2);
        return (int)(cp.shaderEngineCount * cp.shaderArraysPerEngineCount * cp.computeUnitsPerShaderArray);
    }
    return 0;
}

static twk_status vk_device_props(int index, twk_device_props *out) {
    VkInstance inst;
    vk_fns f;
    VkPhysicalDevice pd = VK_NULL_HANDLE;
    twk_status st = pick(index, &inst, &f, &pd);
    if (st != TWK_OK) return st;
    VkPhysicalDeviceProperties p;
    VkPhysicalDeviceMemoryProperties mp;
    f.vkGetPhysicalDeviceProperties(pd, &p);
    f.vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%.127s", p.deviceName);
    const char *kind = "gpu";
    if (p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) kind = "cpu";
    else if (p.deviceType == VK_PHYSICAL_DEVICE_TYPE_OTHER) kind = "other";
    snprintf(out->kind, sizeof out->kind, "%s", kind);
    out->memory_bytes = device_local_bytes(&mp);
    out->compute_units = compute_units(&f, inst, pd, &p);
    vk_coop co;
    vk_coop_probe(&f, inst, pd, &co);
    if (co.m) /* the shape TWK_VULKAN_GEMM=fp16 would use */
        snprintf(out->name, sizeof out->name, "%.96s (coopmat f16 %ux%ux%u)", p.deviceName, co.m, co.n, co.k);
    out->max_threads = 0; /* not a CPU backend */
    f.vkDestroyInstance(inst, NULL);
    return TWK_OK;
}

static int find_type(const VkPhysicalDeviceMemoryProperties *mp, VkMemoryPropertyFlags want) {
    for (uint32_t i = 0; i < mp->memoryTypeCount; i++)
        if ((mp->memoryTypes[i].propertyFlags & want) == want) return (int)i;
    return -1;
}

static void vk_close(void *vctx);

static twk_status vk_open(int index, void **out) {
    int want_fp16;
    twk_status st = vk_gemm_mode(&want_fp16);
    if (st != TWK_OK) return st;
    vk_ctx *c = twk_host_calloc(sizeof *c, "vulkan context");
    if (!c) return TWK_ERR_OOM;
    st = pick(index, &c->inst, &c->f, &c->phys);
    if (st != TWK_OK) {
        twk_host_free(c);
        return st;
    }
    const vk_fns *f = &c->f;
    f->vkGetPhysicalDeviceProperties(c->phys, &c->props);
    f->vkGetPhysicalDeviceMemoryProperties(c->phys, &c->memprops);
    compute_family(c->phys, f, &c->queue_family);
    vk_coop_probe(f, c->inst, c->phys, &c->coop);
    c->gemm_fp16 = want_fp16 && c->coop.m;
    if (want_fp16 && !c->coop.m)
        twk_log(TWK_LOG_WARN, "vulkan: TWK_VULKAN_GEMM=fp16 but %s on %s: using the fp32 GEMM", c->coop.why,
                c->props.deviceName);
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                  .queueFamilyIndex = c->queue_family, .queueCount = 1, .pQueuePriorities = &prio};
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi};
    /* the fp16 GEMM's extensions and features, only when it is asked for and offered */
    static const char *const coop_exts[] = {VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME,
                                            VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME,
                                            VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME};
    VkPhysicalDeviceVulkanMemoryModelFeaturesKHR mm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES_KHR, .vulkanMemoryModel = VK_TRUE};
    VkPhysicalDeviceShaderFloat16Int8FeaturesKHR f16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES_KHR, .pNext = &mm,
        .shaderFloat16 = VK_TRUE};
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, .pNext = &f16,
        .cooperativeMatrix = VK_TRUE};
    if (c->gemm_fp16) {
        di.pNext = &cf;
        di.enabledExtensionCount = 3;
        di.ppEnabledExtensionNames = coop_exts;
    }
    VkResult r = f->vkCreateDevice(c->phys, &di, NULL, &c->dev);
    if (r != VK_SUCCESS) {
        f->vkDestroyInstance(c->inst, NULL);
        twk_host_free(c);
        return twk_error(TWK_ERR_BACKEND, "vulkan: vkCreateDevice failed (VkResult %d)", (int)r);
    }
    f->vkGetDeviceQueue(c->dev, c->queue_family, 0, &c->queue);
    c->profile = getenv("TWK_PROFILE") && atoi(getenv("TWK_PROFILE")) > 0;
    c->max_groups = c->props.limits.maxComputeWorkGroupCount[0];
    for (int i = 1; i < 3; i++)
        if (c->props.limits.maxComputeWorkGroupCount[i] < c->max_groups)
            c->max_groups = c->props.limits.maxComputeWorkGroupCount[i];
    if (c->max_groups > 65535) c->max_groups = 65535;
    c->compute_units = compute_units(f, c->inst, c->phys, &c->props);

    /* memory: host-visible device memory where the device shares it with the
     * host (lavapipe, integrated GPUs), else device-local plus staging */
    const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    int shared = c->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ||
                 c->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU;
    const char *force = getenv("TWK_VULKAN_STAGING");
    if (force && atoi(force) > 0) shared = 0;
    int t_dl_hv = find_type(&c->memprops, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | hv);
    int t_dl = find_type(&c->memprops, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    int t_hv = find_type(&c->memprops, hv);
    if (shared && t_dl_hv >= 0) {
        c->mem_type = (uint32_t)t_dl_hv;
        c->host_visible = 1;
    } else if (t_dl >= 0) {
        c->mem_type = (uint32_t)t_dl;
        c->host_visible = (c->memprops.memoryTypes[t_dl].propertyFlags & hv) == hv && shared;
    } else if (t_hv >= 0) {
        c->mem_type = (uint32_t)t_hv;
        c->host_visible = 1;
    } else {
        vk_close(c);
        return twk_error(TWK_ERR_BACKEND, "vulkan: no usable memory type");
    }
    if (t_hv < 0) {
        vk_close(c);
        return twk_error(TWK_ERR_BACKEND, "vulkan: no host-visible coherent memory type for transfers");
    }
    c->staging_type = (uint32_t)t_hv;

    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                  .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                  .queueFamilyIndex = c->queue_family};
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkDescriptorSetLayoutBinding b[VK_NBIND + 1];
    for (int i = 0; i <= VK_NBIND; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = (uint32_t)i, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1, .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                          .bindingCount = VK_NBIND + 1, .pBindings = b};
    VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = 128};
    if (f->vkCreateCommandPool(c->dev, &pi, NULL, &c->cpool) != VK_SUCCESS ||
        f->vkCreateFence(c->dev, &fi, NULL, &c->fence) != VK_SUCCESS ||
        f->vkCreateDescriptorSetLayout(c->dev, &li, NULL, &c->dsl) != VK_SUCCESS) {
        vk_close(c);
        return twk_error(TWK_ERR_BACKEND, "vulkan: cannot create the command pool, fence or descriptor layout");
    }
    VkPipelineLayoutCreateInfo pl = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1,
                                     .pSetLayouts = &c->dsl, .pushConstantRangeCount = 1, .pPushConstantRanges = &pr};
    if (f->vkCreatePipelineLayout(c->dev, &pl, NULL, &c->layout) != VK_SUCCESS) {
        vk_close(c);
        return twk_error(TWK_ERR_BACKEND, "vulkan: cannot create the pipeline layout");
    }
    st = vk_buffer_new(c, 16, 0, &c->err);
    if (st != TWK_OK) {
        vk_close(c);
        return st;
    }
    *out = c;
    return TWK_OK;
}

static void vk_close(void *vctx) {
    vk_ctx *c = vctx;
    if (!c) return;
    const vk_fns *f = &c->f;
    if (c->profile) {
        double total = 0;
        for (int i = 0; i < TWK_OP_COUNT; i++) total += c->prof_s[i];
        twk_log(TWK_LOG_INFO, "vulkan profile (%.3f s in launches, each submitted alone):", total);
        for (int i = 0; i < TWK_OP_COUNT; i++)
            if (c->prof_n[i])
                twk_log(TWK_LOG_INFO, "  %-16s %8ld launches %9.3f s %5.1f%%", twk_op_name((twk_op)i), c->prof_n[i],
                        c->prof_s[i], 100 * c->prof_s[i] / (total > 0 ? total : 1));
    }
    if (c->dev) {
        f->vkDeviceWaitIdle(c->dev);
        for (int i = 0; i < c->n_pipes; i++) f->vkDestroyPipeline(c->dev, c->pipes[i].pipe, NULL);
        for (int i = 0; i < VKS_COUNT; i++)
            if (c->modules[i]) f->vkDestroyShaderModule(c->dev, c->modules[i], NULL);
        if (c->layout) f->vkDestroyPipelineLayout(c->dev, c->layout, NULL);
        if (c->dsl) f->vkDestroyDescriptorSetLayout(c->dev, c->dsl, NULL);
        vk_buffer_destroy(c, c->err);
        vk_buffer_destroy(c, c->staging);
        if (c->fence) f->vkDestroyFence(c->dev, c->fence, NULL);
        if (c->cpool) f->vkDestroyCommandPool(c->dev, c->cpool, NULL);
        f->vkDestroyDevice(c->dev, NULL);
    }
    f->vkDestroyInstance(c->inst, NULL);
    twk_host_free(c->pipes);
    twk_host_free(c);
}

VkPipeline vk_pipeline(vk_ctx *c, vk_shader s, const uint32_t spec[VK_NSPEC]) {
    for (int i = 0; i < c->n_pipes; i++)
        if (c->pipes[i].shader == s && memcmp(c->pipes[i].spec, spec, sizeof c->pipes[i].spec) == 0)
            return c->pipes[i].pipe;
    if (c->n_pipes == c->cap_pipes) { /* the cache doubles: a long-lived context meets many shapes' pipelines */
        int cap = c->cap_pipes ? 2 * c->cap_pipes : 64;
        vk_pipe *g = twk_host_realloc(c->pipes, (size_t)c->cap_pipes * sizeof *g, (size_t)cap * sizeof *g, "vulkan pipelines");
        if (!g) {
            twk_error(TWK_ERR_OOM, "vulkan: out of memory for %d pipelines", cap);
            return VK_NULL_HANDLE;
        }
        c->pipes = g;
        c->cap_pipes = cap;
    }
    const vk_fns *f = &c->f;
    if (!c->modules[s]) {
        size_t bytes;
        const uint32_t *code = vk_shader_code(s, &bytes);
        VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = bytes,
                                       .pCode = code};
        if (f->vkCreateShaderModule(c->dev, &mi, NULL, &c->modules[s]) != VK_SUCCESS) {
            twk_error(TWK_ERR_BACKEND, "vulkan: cannot create shader module %s", vk_shader_name(s));
            return VK_NULL_HANDLE;
        }
    }
    VkSpecializationMapEntry me[VK_NSPEC];
    for (int i = 0; i < VK_NSPEC; i++)
        me[i] = (VkSpecializationMapEntry){.constantID = (uint32_t)i, .offset = (uint32_t)(4 * i), .size = 4};
    VkSpecializationInfo si = {.mapEntryCount = VK_NSPEC, .pMapEntries = me, .dataSize = 4 * VK_NSPEC, .pData = spec};
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = c->modules[s], .pName = "main", .pSpecializationInfo = &si},
        .layout = c->layout};
    VkPipeline p;
    VkResult r = f->vkCreateComputePipelines(c->dev, VK_NULL_HANDLE, 1, &ci, NULL, &p);
    if (r != VK_SUCCESS) {
        twk_error(TWK_ERR_BACKEND, "vulkan: cannot create the %s pipeline (VkResult %d)", vk_shader_name(s), (int)r);
        return VK_NULL_HANDLE;
    }
    c->pipes[c->n_pipes].shader = s;
    memcpy(c->pipes[c->n_pipes].spec, spec, sizeof c->pipes[c->n_pipes].spec);
    c->pipes[c->n_pipes++].pipe = p;
    return p;
}

static twk_status vk_buffer_alloc(void *ctx, size_t bytes, twk_buffer **out) {
    vk_buffer *b;
    twk_status st = vk_buffer_new(ctx, bytes, 0, &b);
    if (st != TWK_OK) return st;
    *out = &b->base;
    return TWK_OK;
}

static void vk_buffer_free(void *ctx, twk_buffer *buf) { vk_buffer_destroy(ctx, (vk_buffer *)buf); }

static bool vk_supports_op(void *ctx, const twk_launch *l, char *why, size_t why_len) {
    (void)ctx;
    return vk_supports(l, why, why_len);
}

static twk_status vk_synchronize(void *ctx) {
    (void)ctx; /* run waits on its fence */
    return TWK_OK;
}

static const twk_backend_iface vk_iface = {
    .name = "vulkan",
    .device_count = vk_device_count,
    .device_props = vk_device_props,
    .open = vk_open,
    .close = vk_close,
    .buffer_alloc = vk_buffer_alloc,
    .buffer_free = vk_buffer_free,
    .upload = vk_upload,
    .download = vk_download,
    .copy = vk_copy,
    .memset_zero = vk_memset_zero,
    .supports_op = vk_supports_op,
    .op_kernel = vk_op_kernel,
    .prepare = vk_prepare,
    .release = vk_release,
    .run = vk_run,
    .synchronize = vk_synchronize,
    .half_srcs = vk_half_srcs,
};

/* The Vulkan backend's table (registered by hal/ as "vulkan"). */
const twk_backend_iface *twk_vulkan_backend(void) { return &vk_iface; }
