/* Vulkan backend internals: the dlopen'ed function table, the device
 * context, buffers, pipelines and the per-op lowering into dispatches. */
#ifndef TWK_VK_INTERNAL_H
#define TWK_VK_INTERNAL_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <stdint.h>

#include "twk_backend.h"
#include "twinkle/log.h"

/* Every Vulkan entry point the backend calls, loaded through
 * vkGetInstanceProcAddr (the loader is dlopen'ed, never linked). */
#define VK_INSTANCE_FNS(X)                                                                      \
    X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)        \
    X(vkGetPhysicalDeviceMemoryProperties) X(vkGetPhysicalDeviceQueueFamilyProperties)         \
    X(vkCreateDevice) X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer) \
    X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) \
    X(vkMapMemory) X(vkUnmapMemory) X(vkCreateShaderModule) X(vkDestroyShaderModule)          \
    X(vkCreateDescriptorSetLayout) X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout)  \
    X(vkDestroyPipelineLayout) X(vkCreateComputePipelines) X(vkDestroyPipeline)               \
    X(vkCreateDescriptorPool) X(vkDestroyDescriptorPool) X(vkAllocateDescriptorSets)          \
    X(vkUpdateDescriptorSets) X(vkCreateCommandPool) X(vkDestroyCommandPool)                  \
    X(vkAllocateCommandBuffers) X(vkFreeCommandBuffers) X(vkBeginCommandBuffer)               \
    X(vkEndCommandBuffer) X(vkResetCommandBuffer) X(vkCmdBindPipeline)                        \
    X(vkCmdBindDescriptorSets) X(vkCmdPushConstants) X(vkCmdDispatch) X(vkCmdPipelineBarrier) \
    X(vkCmdCopyBuffer) X(vkCmdFillBuffer) X(vkCreateFence) X(vkDestroyFence)                  \
    X(vkWaitForFences) X(vkResetFences) X(vkQueueSubmit) X(vkDeviceWaitIdle)                  \
    X(vkEnumerateDeviceExtensionProperties)

typedef struct vk_fns {
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    PFN_vkCreateInstance vkCreateInstance;
#define VK_FN_FIELD_(f) PFN_##f f;
    VK_INSTANCE_FNS(VK_FN_FIELD_)
#undef VK_FN_FIELD_
} vk_fns;

/* An instance with its entry points; TWK_ERR_UNSUPPORTED (message says why:
 * no libvulkan.so.1, no driver) when Vulkan is unusable. */
twk_status vk_instance_new(VkInstance *inst, vk_fns *fns);
/* Physical devices usable for compute (Vulkan >= 1.1, a compute queue); count only
 * when devs is NULL. Returns the count, 0 on failure. */
int vk_compute_devices(VkInstance inst, const vk_fns *f, VkPhysicalDevice *devs, int max);

typedef struct vk_buffer {
    struct twk_buffer base; /* first: the HAL reads the size */
    VkBuffer buf;
    VkDeviceMemory mem;
    size_t alloc; /* bytes allocated (>= 4, a multiple of 4) */
    unsigned char *map; /* persistently mapped when host-visible, else NULL */
} vk_buffer;

/* The compiled shaders (shaders/<name>.comp), in vk_shaders.c's table. */
typedef enum vk_shader {
    VKS_ELTWISE, VKS_BROADCAST, VKS_SUM_TO, VKS_REDUCE, VKS_COPY, VKS_CHECK, VKS_MATMUL,
    VKS_ROWS, VKS_ROWNORM, VKS_ROPE, VKS_ATTN, VKS_ATTN_BACK, VKS_MATMUL_COOPMAT, VKS_OPTIM, VKS_UNEMBED, VKS_MOE, VKS_ATTN_TILE, VKS_FUSED, VKS_COUNT
} vk_shader;

const uint32_t *vk_shader_code(vk_shader s, size_t *bytes);
const char *vk_shader_name(vk_shader s);

#define VK_NSPEC 13 /* spec constants: 0 threads, 1 mode, 2..9 shader-specific, 10..12 16-bit operand dtypes */
#define VK_NBIND 8 /* tensor bindings; binding 8 is the error word */

/* The cooperative-matrix GEMM a device offers (vk_coopmat.c). */
typedef struct vk_coop {
    uint32_t m, n, k;  /* an fp16 x fp16 -> fp32 subgroup shape (VK_NV_cooperative_matrix); 0 when none */
    uint32_t subgroup; /* subgroupSize: the work-group is 4 subgroups */
    char why[160];     /* why there is none, when m == 0 */
} vk_coop;

/* Fills *o with the device's usable shape (16x16x16 preferred) or, with
 * m == 0, the reason there is none; never fails otherwise. */
void vk_coop_probe(const vk_fns *f, VkInstance inst, VkPhysicalDevice pd, vk_coop *o);
/* TWK_VULKAN_GEMM: unset/"fp32" -> *fp16 = 0, "fp16" -> 1; anything else
 * TWK_ERR_INVALID_ARG with a message. */
twk_status vk_gemm_mode(int *fp16);

typedef struct vk_pipe {
    vk_shader shader;
    uint32_t spec[VK_NSPEC];
    VkPipeline pipe;
} vk_pipe;

typedef struct vk_ctx {
    vk_fns f;
    VkInstance inst;
    VkPhysicalDevice phys;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memprops;
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    uint32_t mem_type;       /* for every buffer */
    int host_visible;        /* mem_type is host-visible + coherent: buffers are mapped */
    uint32_t staging_type;   /* host-visible + coherent type for staging */
    VkCommandPool cpool;     /* one-shot transfers */
    VkFence fence;
    vk_buffer *staging;      /* grown on demand when !host_visible */
    vk_buffer *err;          /* the error word */
    VkDescriptorSetLayout dsl;
    VkPipelineLayout layout;
    VkShaderModule modules[VKS_COUNT];
    vk_pipe *pipes;          /* every (shader, spec constants) pipeline made so far, grown on demand */
    int n_pipes, cap_pipes;
    uint32_t max_groups;     /* maxComputeWorkGroupCount, min over dims used */
    int compute_units;       /* as device_props reports them (0: unknown): the wide reductions' groups */
    vk_coop coop;            /* what the device offers for the fp16 GEMM */
    int gemm_fp16;           /* TWK_VULKAN_GEMM=fp16 and coop.m: MATMUL runs matmul_coopmat.comp */
    int profile;             /* TWK_PROFILE=1: time each launch, print per-op totals at close */
    double prof_s[TWK_OP_COUNT];
    long prof_n[TWK_OP_COUNT];
} vk_ctx;

/* Buffers (vk_buffers.c): same failure contract as the iface functions. */
twk_status vk_buffer_new(vk_ctx *c, size_t bytes, int staging, vk_buffer **out);
void vk_buffer_destroy(vk_ctx *c, vk_buffer *b);
twk_status vk_upload(void *ctx, twk_buffer *dst, size_t off, const void *src, size_t bytes);
twk_status vk_download(void *ctx, const twk_buffer *src, size_t off, void *dst, size_t bytes);
twk_status vk_copy(void *ctx, twk_buffer *dst, size_t doff, const twk_buffer *src, size_t soff, size_t bytes);
twk_status vk_memset_zero(void *ctx, twk_buffer *dst, size_t off, size_t bytes);
/* Submits a recorded command buffer and waits for it; TWK_ERR_BACKEND on failure. */
twk_status vk_submit_wait(vk_ctx *c, VkCommandBuffer cb);

/* A pipeline for (shader, spec constants), created once per context; NULL
 * (error set) on failure — with the cache full (n_pipes == cap_pipes) when it could not grow. */
VkPipeline vk_pipeline(vk_ctx *c, vk_shader s, const uint32_t spec[VK_NSPEC]);

/* ---- lowering (vk_lower.c) ---- */

/* A binding of a dispatch: a launch tensor or a plan-owned buffer. */
enum { VKB_NONE = -100, VKB_DST = -1, VKB_SCRATCH = -2, VKB_CONST = -3 };

typedef struct vk_dispatch {
    vk_shader shader;
    uint32_t spec[VK_NSPEC];
    int bind[VK_NBIND];        /* VKB_* or a source index */
    uint32_t add_off[VK_NBIND]; /* extra words added to the binding's element offset */
    int32_t p[16];
    float fp[8];
    uint32_t groups[3];
} vk_dispatch;

#define VK_MAX_DISPATCH 4

/* The dispatches of launch `li` at token count n (their number and bindings
 * do not depend on n: choices that could are made at the plan's capacity cap). *scratch_bytes gets the plan scratch it needs;
 * const_off is where its constants (rope's inv_freq) live in the plan's
 * constant buffer. Returns the count, or -1 with an error naming the op. */
int vk_lower(const vk_ctx *c, const twk_launch *l, int li, int64_t n, int64_t cap, size_t const_off, vk_dispatch *d,
             size_t *scratch_bytes);
/* A cleared dispatch d[(*k)++] of shader s (work-group size wg, MODE mode), every binding VKB_NONE. */
vk_dispatch *vk_next_dispatch(vk_dispatch *d, int *k, vk_shader s, uint32_t wg, int mode);
/* (vk_lower_attn.c) TWK_ATTN_UNTILED=1 in the environment: training attention on the per-token shaders. */
int vk_attn_untiled(void);
/* The largest head size attn_tile.comp takes (larger ones go to the per-token shaders). */
#define VK_ATTN_TILE_MAXD 512
/* 1 when launch l is attn, attn_lse or attn_back with a bf16 / f16 q, k or v (only attn_tile.comp reads those). */
int vk_attn_half(const twk_launch *l);
/* 1 when launch l (attn, attn_lse, attn_back at head size D) runs on attn_tile.comp. */
int vk_attn_tiled(const vk_ctx *c, const twk_launch *l, int64_t D);
/* Pieces per (query, head) of attn_cache in a plan of capacity cap (1: no split), the rule of
 * backends/kernels/kd_lower_attn.c's kd_attn_splits taken at cap (TWK_ATTN_UNSPLIT=1: 1). */
int64_t vk_attn_splits(const twk_launch *l, int64_t cap);
/* Appends l's tiled dispatches to d (count in *k) and sets *scratch (attn_back's delta); returns 0. */
int vk_lower_attn_tile(const vk_ctx *c, const twk_launch *l, int64_t n, vk_dispatch *d, int *k, size_t *scratch);
/* (vk_lower_fused.c) Sources a FUSED_EW launch may have: fused.comp binds them at 1..7. */
#define VK_FUSED_MAX_SRC 7
/* true when fused.comp runs FUSED_EW launch l (1..VK_FUSED_MAX_SRC sources, steps it knows);
 * else false and the reason in why (may be NULL). */
bool vk_fused_ok(const twk_launch *l, char *why, size_t why_len);
/* Appends l's fused.comp dispatch to d (count in *k); 0, or -1 with the error set. */
int vk_lower_fused(const vk_ctx *c, const twk_launch *l, int64_t ny, vk_dispatch *d, int *k);
/* Bytes of plan constants a launch needs (written by vk_write_consts). */
size_t vk_const_bytes(const twk_launch *l);
void vk_write_consts(const twk_launch *l, void *dst);
/* The lowering table's entry for op: 1 when Vulkan runs it; else 0 and *why =
 * the declared reason, or NULL when it is missing. */
int vk_op_kernel(twk_op op, const char **why);
/* The sources of op whose bf16 / f16 the shaders widen (the backend's half_srcs); 0 for none. */
unsigned vk_half_srcs(twk_op op);
/* true if the launch has a lowering; else false and a reason. */
bool vk_supports(const twk_launch *l, char *why, size_t why_len);
/* (vk_errors.c) The CPU backend's message for launch l's bad ids at token
 * count n, read back from the device; TWK_ERR_RANGE (generic text if none is
 * found), or the download's error. */
twk_status vk_range_error(vk_ctx *c, const twk_launch *l, int64_t n);

/* ---- plans (vk_plan.c) ---- */
twk_status vk_prepare(void *ctx, const twk_hal_plan *plan, void **prepared);
void vk_release(void *ctx, void *prepared);
twk_status vk_run(void *ctx, void *prepared, const twk_hal_plan *plan, int64_t n);

#endif
