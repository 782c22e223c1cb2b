/* The SPIR-V of every shader, embedded at build time (spv_*.h are generated
 * from shaders/<name>.comp by glslc and ../../cmake/embed.cmake). */
#include "vk_internal.h"

#include "spv_attn.h"
#include "spv_attn_back.h"
#include "spv_attn_tile.h"
#include "spv_broadcast.h"
#include "spv_check.h"
#include "spv_copy.h"
#include "spv_eltwise.h"
#include "spv_matmul.h"
#include "spv_matmul_coopmat.h"
#include "spv_reduce.h"
#include "spv_rope.h"
#include "spv_rownorm.h"
#include "spv_rows.h"
#include "spv_sum_to.h"
#include "spv_optim.h"
#include "spv_unembed.h"
#include "spv_moe.h"
#include "spv_fused.h"

static const struct {
    const char *name;
    const uint32_t *code;
    size_t bytes;
} table[VKS_COUNT] = {
    [VKS_ELTWISE] = {"eltwise", spv_eltwise, sizeof spv_eltwise},
    [VKS_BROADCAST] = {"broadcast", spv_broadcast, sizeof spv_broadcast},
    [VKS_SUM_TO] = {"sum_to", spv_sum_to, sizeof spv_sum_to},
    [VKS_REDUCE] = {"reduce", spv_reduce, sizeof spv_reduce},
    [VKS_COPY] = {"copy", spv_copy, sizeof spv_copy},
    [VKS_CHECK] = {"check", spv_check, sizeof spv_check},
    [VKS_MATMUL] = {"matmul", spv_matmul, sizeof spv_matmul},
    [VKS_ROWS] = {"rows", spv_rows, sizeof spv_rows},
    [VKS_ROWNORM] = {"rownorm", spv_rownorm, sizeof spv_rownorm},
    [VKS_ROPE] = {"rope", spv_rope, sizeof spv_rope},
    [VKS_ATTN] = {"attn", spv_attn, sizeof spv_attn},
    [VKS_ATTN_BACK] = {"attn_back", spv_attn_back, sizeof spv_attn_back},
    [VKS_MATMUL_COOPMAT] = {"matmul_coopmat", spv_matmul_coopmat, sizeof spv_matmul_coopmat},
    [VKS_OPTIM] = {"optim", spv_optim, sizeof spv_optim},
    [VKS_UNEMBED] = {"unembed", spv_unembed, sizeof spv_unembed},
    [VKS_MOE] = {"moe", spv_moe, sizeof spv_moe},
    [VKS_FUSED] = {"fused", spv_fused, sizeof spv_fused},
    [VKS_ATTN_TILE] = {"attn_tile", spv_attn_tile, sizeof spv_attn_tile},
};

const uint32_t *vk_shader_code(vk_shader s, size_t *bytes) {
    *bytes = table[s].bytes;
    return table[s].code;
}

const char *vk_shader_name(vk_shader s) { return s < VKS_COUNT ? table[s].name : "?"; }
