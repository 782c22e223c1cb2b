/* The cooperative-matrix GEMM option (TWK_VULKAN_GEMM=fp16): what the device
 * offers (VK_NV_cooperative_matrix), and the features to enable for it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

static int has_ext(const VkExtensionProperties *e, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(e[i].extensionName, name) == 0) return 1;
    return 0;
}

/* Bytes of shared memory matmul_coopmat.comp declares for a shape (its
 * SM = SN = 2 accumulator tiles per subgroup, 2 x 2 subgroup blocks). */
static uint64_t coop_shared_bytes(uint32_t mm, uint32_t mn, uint32_t mk) {
    uint64_t bm = 4ull * mm, bn = 4ull * mn, bk = 2ull * mk;
    return 2 * (bm * (bk + 8) + bk * (bn + 8)) + 4 * bm * (bn + 4);
}

static void why_not(vk_coop *o, const char *fmt, const char *arg) {
    o->m = o->n = o->k = 0;
    snprintf(o->why, sizeof o->why, fmt, arg);
}

void vk_coop_probe(const vk_fns *f, VkInstance inst, VkPhysicalDevice pd, vk_coop *o) {
    memset(o, 0, sizeof *o);
    VkPhysicalDeviceProperties p;
    f->vkGetPhysicalDeviceProperties(pd, &p);
    static const char *const need[] = {VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME,
                                       VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME,
                                       VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME};
    uint32_t ne = 0;
    if (f->vkEnumerateDeviceExtensionProperties(pd, NULL, &ne, NULL) != VK_SUCCESS || !ne) {
        why_not(o, "the device lists no extensions%s", "");
        return;
    }
    VkExtensionProperties *e = twk_host_alloc(ne * sizeof *e, "vulkan extensions");
    if (!e) {
        why_not(o, "no memory to list the extensions%s", "");
        return;
    }
    int missing = -1;
    if (f->vkEnumerateDeviceExtensionProperties(pd, NULL, &ne, e) < 0) ne = 0;
    for (int i = 0; i < 3 && missing < 0; i++)
        if (!has_ext(e, ne, need[i])) missing = i;
    twk_host_free(e);
    if (missing >= 0) {
        why_not(o, "the device lacks %s", need[missing]);
        return;
    }
    PFN_vkGetPhysicalDeviceFeatures2 feat2 =
        (PFN_vkGetPhysicalDeviceFeatures2)f->vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceFeatures2");
    PFN_vkGetPhysicalDeviceProperties2 prop2 =
        (PFN_vkGetPhysicalDeviceProperties2)f->vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceProperties2");
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV shapes =
        (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)f->vkGetInstanceProcAddr(
            inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
    if (!feat2 || !prop2 || !shapes) {
        why_not(o, "the loader lacks %s", !feat2 ? "vkGetPhysicalDeviceFeatures2"
                                          : !prop2 ? "vkGetPhysicalDeviceProperties2"
                                                   : "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
        return;
    }
    VkPhysicalDeviceVulkanMemoryModelFeaturesKHR mm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES_KHR};
    VkPhysicalDeviceShaderFloat16Int8FeaturesKHR f16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES_KHR, .pNext = &mm};
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, .pNext = &f16};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &cf};
    feat2(pd, &f2);
    if (!cf.cooperativeMatrix || !f16.shaderFloat16 || !mm.vulkanMemoryModel) {
        why_not(o, "the device lacks the feature %s", !cf.cooperativeMatrix ? "cooperativeMatrix"
                                                     : !f16.shaderFloat16 ? "shaderFloat16"
                                                                          : "vulkanMemoryModel");
        return;
    }
    VkPhysicalDeviceCooperativeMatrixPropertiesNV cp = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_NV};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                             .pNext = &cp};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    prop2(pd, &p2);
    if (!(cp.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) ||
        !(sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) ||
        !(sg.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) || sg.subgroupSize == 0) {
        why_not(o, "cooperative matrices or basic subgroup operations are not offered to compute shaders%s", "");
        return;
    }
    o->subgroup = sg.subgroupSize;
    uint32_t n = 0;
    if (shapes(pd, &n, NULL) != VK_SUCCESS || n == 0) {
        why_not(o, "the device lists no cooperative-matrix shapes%s", "");
        return;
    }
    VkCooperativeMatrixPropertiesNV *s = twk_host_calloc(n * sizeof *s, "vulkan cooperative-matrix shapes");
    if (!s) {
        why_not(o, "no memory to list the cooperative-matrix shapes%s", "");
        return;
    }
    for (uint32_t i = 0; i < n; i++) s[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
    if (shapes(pd, &n, s) < 0) n = 0;
    /* fp16 x fp16 + fp32 -> fp32 on a subgroup; 16 x 16 x 16 when offered. The
     * shader's shared-memory offsets stay 16-byte aligned when N and K are
     * multiples of 8; the tile must fit the work-group and shared-memory limits. */
    const VkPhysicalDeviceLimits *lim = &p.limits;
    uint32_t wg = 4 * sg.subgroupSize;
    for (uint32_t i = 0; i < n; i++) {
        const VkCooperativeMatrixPropertiesNV *c = &s[i];
        if (c->AType != VK_COMPONENT_TYPE_FLOAT16_NV || c->BType != VK_COMPONENT_TYPE_FLOAT16_NV ||
            c->CType != VK_COMPONENT_TYPE_FLOAT32_NV || c->DType != VK_COMPONENT_TYPE_FLOAT32_NV ||
            c->scope != VK_SCOPE_SUBGROUP_NV)
            continue;
        if (!c->MSize || c->NSize % 8 || c->KSize % 8 || !c->NSize || !c->KSize || c->MSize > 64 || c->NSize > 64 ||
            c->KSize > 64)
            continue;
        if (coop_shared_bytes(c->MSize, c->NSize, c->KSize) > lim->maxComputeSharedMemorySize) continue;
        if (wg > lim->maxComputeWorkGroupInvocations || wg > lim->maxComputeWorkGroupSize[0]) continue;
        int best = c->MSize == 16 && c->NSize == 16 && c->KSize == 16;
        if (!o->m || best) {
            o->m = c->MSize;
            o->n = c->NSize;
            o->k = c->KSize;
        }
        if (best) break;
    }
    twk_host_free(s);
    if (!o->m) why_not(o, "the device offers no fp16 x fp16 -> fp32 subgroup cooperative-matrix shape that fits%s", "");
}

twk_status vk_gemm_mode(int *fp16) {
    const char *g = getenv("TWK_VULKAN_GEMM");
    *fp16 = 0;
    if (!g || !*g || !strcmp(g, "fp32")) return TWK_OK;
    if (!strcmp(g, "fp16")) {
        *fp16 = 1;
        return TWK_OK;
    }
    return twk_error(TWK_ERR_INVALID_ARG, "vulkan: TWK_VULKAN_GEMM='%s'; want fp32 (the default) or fp16", g);
}
