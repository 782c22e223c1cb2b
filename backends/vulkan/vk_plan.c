/* Plans: prepare turns a plan into descriptor sets (one per dispatch, buffers
 * bound whole, or a window when a buffer exceeds maxStorageBufferRange) and a
 * command pool; run(n) records ONE command buffer with every dispatch and
 * a barrier wherever a dispatch touches bytes an earlier one wrote (or
 * writes bytes an earlier one read), kept for reuse per n in a small LRU
 * cache; submits it, waits on the context's fence and checks the error word. */
#include <stdio.h>
#include <string.h>

#include "vk_internal.h"

#define CB_CACHE 8

typedef struct vk_prepared {
    int n_disp;
    int *first;          /* per launch: its first dispatch; first[n_launches] = n_disp */
    size_t *const_off;   /* per launch: its bytes in the constant buffer */
    VkDescriptorSet *sets;
    size_t (*base)[VK_NBIND]; /* per dispatch and binding: the window's start in bytes */
    VkDescriptorPool dpool;
    VkCommandPool cpool;
    vk_buffer *scratch, *consts;
    struct {
        int64_t n;
        uint64_t used;
        VkCommandBuffer cb;
    } cache[CB_CACHE];
    uint64_t clock;
} vk_prepared;

static vk_buffer *binding_buffer(vk_ctx *c, vk_prepared *pp, const twk_launch *l, int b, size_t *off) {
    *off = 0;
    if (b == VKB_NONE) return c->err;
    if (b == VKB_SCRATCH) return pp->scratch;
    if (b == VKB_CONST) return pp->consts;
    const twk_tensor_desc *t = b == VKB_DST ? &l->dst : &l->src[b];
    *off = t->offset;
    return (vk_buffer *)t->buf;
}

/* The unit of binding b's offset in the push constants: 2 bytes for a 16-bit tensor (read
 * as packed words, common.glsl), else 4 (32-bit words). */
static size_t binding_unit(const twk_launch *l, int b) {
    if (b != VKB_DST && b < 0) return 4;
    return twk_dtype_is_half((b == VKB_DST ? &l->dst : &l->src[b])->type) ? 2 : 4;
}

void vk_release(void *ctx, void *prepared) {
    vk_ctx *c = ctx;
    vk_prepared *pp = prepared;
    if (!pp) return;
    const vk_fns *f = &c->f;
    f->vkDeviceWaitIdle(c->dev);
    if (pp->cpool) f->vkDestroyCommandPool(c->dev, pp->cpool, NULL); /* frees its command buffers */
    if (pp->dpool) f->vkDestroyDescriptorPool(c->dev, pp->dpool, NULL);
    vk_buffer_destroy(c, pp->scratch);
    vk_buffer_destroy(c, pp->consts);
    twk_host_free(pp->first);
    twk_host_free(pp->const_off);
    twk_host_free(pp->sets);
    twk_host_free(pp->base);
    twk_host_free(pp);
}

twk_status vk_prepare(void *ctx, const twk_hal_plan *plan, void **out) {
    vk_ctx *c = ctx;
    const vk_fns *f = &c->f;
    int nl = plan->n_launches;
    vk_prepared *pp = twk_host_calloc(sizeof *pp, "vulkan plan");
    if (!pp) return TWK_ERR_OOM;
    twk_status st = TWK_OK;
    pp->first = twk_host_calloc((size_t)(nl + 1) * sizeof *pp->first, "vulkan plan");
    pp->const_off = twk_host_calloc((size_t)(nl + 1) * sizeof *pp->const_off, "vulkan plan");
    if (!pp->first || !pp->const_off) {
        vk_release(c, pp);
        return TWK_ERR_OOM;
    }
    /* pass 1: dispatch counts, scratch and constants */
    size_t scratch = 16, consts = 0;
    vk_dispatch d[VK_MAX_DISPATCH];
    for (int i = 0; i < nl; i++) {
        const twk_launch *l = &plan->launches[i];
        pp->const_off[i] = consts;
        consts += vk_const_bytes(l);
        size_t sb;
        int k = vk_lower(c, l, i, plan->capacity, plan->capacity, pp->const_off[i], d, &sb);
        if (k < 0) {
            vk_release(c, pp);
            return TWK_ERR_UNSUPPORTED;
        }
        if (sb > scratch) scratch = sb;
        pp->first[i] = pp->n_disp;
        pp->n_disp += k;
    }
    pp->first[nl] = pp->n_disp;
    st = vk_buffer_new(c, scratch, 0, &pp->scratch);
    if (st == TWK_OK) st = vk_buffer_new(c, consts ? consts : 16, 0, &pp->consts);
    if (st == TWK_OK && consts) {
        unsigned char *host = twk_host_calloc(consts, "vulkan plan constants");
        if (!host) st = TWK_ERR_OOM;
        for (int i = 0; host && i < nl; i++)
            if (vk_const_bytes(&plan->launches[i])) vk_write_consts(&plan->launches[i], host + pp->const_off[i]);
        if (host) st = vk_upload(c, &pp->consts->base, 0, host, consts);
        twk_host_free(host);
    }
    if (st != TWK_OK) {
        vk_release(c, pp);
        return st;
    }
    /* pass 2: descriptor sets */
    int nd = pp->n_disp ? pp->n_disp : 1;
    pp->sets = twk_host_calloc((size_t)nd * sizeof *pp->sets, "vulkan plan");
    pp->base = twk_host_calloc((size_t)nd * sizeof *pp->base, "vulkan plan");
    if (!pp->sets || !pp->base) {
        vk_release(c, pp);
        return TWK_ERR_OOM;
    }
    VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = (uint32_t)nd * (VK_NBIND + 1)};
    VkDescriptorPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = (uint32_t)nd,
                                     .poolSizeCount = 1, .pPoolSizes = &ps};
    VkCommandPoolCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                  .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                  .queueFamilyIndex = c->queue_family};
    if (f->vkCreateDescriptorPool(c->dev, &pi, NULL, &pp->dpool) != VK_SUCCESS ||
        f->vkCreateCommandPool(c->dev, &ci, NULL, &pp->cpool) != VK_SUCCESS) {
        vk_release(c, pp);
        return twk_error(TWK_ERR_BACKEND, "vulkan: cannot create the plan's descriptor or command pool");
    }
    const VkDeviceSize max_range = c->props.limits.maxStorageBufferRange;
    const VkDeviceSize align = c->props.limits.minStorageBufferOffsetAlignment ? c->props.limits.minStorageBufferOffsetAlignment : 16;
    for (int i = 0; i < nl; i++) {
        const twk_launch *l = &plan->launches[i];
        size_t sb;
        vk_lower(c, l, i, plan->capacity, plan->capacity, pp->const_off[i], d, &sb);
        for (int j = 0; j < pp->first[i + 1] - pp->first[i]; j++) {
            int di = pp->first[i] + j;
            if (!vk_pipeline(c, d[j].shader, d[j].spec)) { /* created now, so failures surface at compile */
                vk_release(c, pp);
                return c->n_pipes == c->cap_pipes ? TWK_ERR_OOM : TWK_ERR_BACKEND; /* a full cache: it could not grow */
            }
            VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                              .descriptorPool = pp->dpool, .descriptorSetCount = 1,
                                              .pSetLayouts = &c->dsl};
            if (f->vkAllocateDescriptorSets(c->dev, &ai, &pp->sets[di]) != VK_SUCCESS) {
                vk_release(c, pp);
                return twk_error(TWK_ERR_BACKEND, "vulkan: cannot allocate descriptor sets");
            }
            VkDescriptorBufferInfo bi[VK_NBIND + 1];
            VkWriteDescriptorSet w[VK_NBIND + 1];
            for (int b = 0; b <= VK_NBIND; b++) {
                size_t off = 0;
                vk_buffer *buf = b == VK_NBIND ? c->err : binding_buffer(c, pp, l, d[j].bind[b], &off);
                if (!buf) {
                    vk_release(c, pp);
                    return twk_error(TWK_ERR_INVALID_ARG, "vulkan: %s '%s' has a tensor without a buffer",
                                     twk_op_name(l->op), l->name);
                }
                size_t unit = b < VK_NBIND ? binding_unit(l, d[j].bind[b]) : 4;
                if (off % unit) {
                    vk_release(c, pp);
                    return twk_error(TWK_ERR_UNSUPPORTED, "vulkan: %s '%s': offset %zu is not %zu-byte aligned",
                                     twk_op_name(l->op), l->name, off, unit);
                }
                VkDeviceSize base = 0, range = VK_WHOLE_SIZE;
                if (buf->alloc > max_range) { /* a window from the tensor's aligned start */
                    base = off / align * align;
                    range = buf->alloc - base < max_range ? buf->alloc - base : max_range;
                    range = range / 4 * 4;
                    size_t need = off - base;
                    int ref = d[j].bind[b];
                    if (b < VK_NBIND && ref != VKB_NONE && ref != VKB_SCRATCH && ref != VKB_CONST) {
                        const twk_tensor_desc *t = ref == VKB_DST ? &l->dst : &l->src[ref];
                        need += (size_t)twk_desc_nelem(t, plan->capacity) * twk_dtype_size(t->type);
                    }
                    if (need > range) {
                        vk_release(c, pp);
                        return twk_error(TWK_ERR_UNSUPPORTED,
                                         "vulkan: %s '%s': a tensor of %zu bytes exceeds the device's storage buffer range (%llu)",
                                         twk_op_name(l->op), l->name, need, (unsigned long long)max_range);
                    }
                }
                if (b < VK_NBIND) pp->base[di][b] = base;
                bi[b] = (VkDescriptorBufferInfo){.buffer = buf->buf, .offset = base, .range = range};
                w[b] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = pp->sets[di],
                                              .dstBinding = (uint32_t)b, .descriptorCount = 1,
                                              .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi[b]};
            }
            f->vkUpdateDescriptorSets(c->dev, VK_NBIND + 1, w, 0, NULL);
        }
    }
    *out = pp;
    return TWK_OK;
}

static void barrier(const vk_fns *f, VkCommandBuffer cb, VkPipelineStageFlags src, VkAccessFlags sa,
                    VkPipelineStageFlags dst, VkAccessFlags da) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = sa, .dstAccessMask = da};
    f->vkCmdPipelineBarrier(cb, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
}

/* Hazard tracking for barriers: byte ranges read and written since the last
 * barrier; a dispatch that reads what is pending a write, or writes what is
 * pending a read or write, gets a barrier first. */
#define MAX_PENDING 64

typedef struct range {
    const vk_buffer *buf;
    size_t lo, hi;
} range;

typedef struct pending {
    range r[MAX_PENDING], w[MAX_PENDING];
    int nr, nw;
} pending;

static int overlaps(const range *a, const range *list, int n) {
    for (int i = 0; i < n; i++)
        if (list[i].buf == a->buf && a->lo < list[i].hi && list[i].lo < a->hi) return 1;
    return 0;
}

/* The bytes a binding covers at token count n (plan buffers: all of them). */
static range binding_range(vk_ctx *c, vk_prepared *pp, const twk_launch *l, int b, int64_t n) {
    range r;
    size_t off;
    r.buf = binding_buffer(c, pp, l, b, &off);
    if (b == VKB_DST || b >= 0) {
        const twk_tensor_desc *t = b == VKB_DST ? &l->dst : &l->src[b];
        r.lo = off;
        r.hi = off + (size_t)twk_desc_nelem(t, n) * twk_dtype_size(t->type);
    } else {
        r.lo = 0;
        r.hi = r.buf ? r.buf->alloc : 0;
    }
    return r;
}

/* Whether dispatch d (binding 0 written, except by check.comp whose only
 * write is an atomic on the error word) needs a barrier; updates pending. */
static int needs_barrier(vk_ctx *c, vk_prepared *pp, const twk_launch *l, const vk_dispatch *d, int64_t n,
                         pending *p) {
    range rd[VK_NBIND], wr;
    int nrd = 0, has_w = d->shader != VKS_CHECK, need = 0;
    wr = binding_range(c, pp, l, d->bind[0], n);
    for (int b = has_w ? 1 : 0; b < VK_NBIND; b++)
        if (d->bind[b] != VKB_NONE) rd[nrd++] = binding_range(c, pp, l, d->bind[b], n);
    for (int i = 0; i < nrd && !need; i++) need = overlaps(&rd[i], p->w, p->nw);
    if (has_w && !need) need = overlaps(&wr, p->w, p->nw) || overlaps(&wr, p->r, p->nr);
    if (!need && (p->nr + nrd > MAX_PENDING || p->nw + 1 > MAX_PENDING)) need = 1;
    if (need) p->nr = p->nw = 0;
    for (int i = 0; i < nrd; i++) p->r[p->nr++] = rd[i];
    if (has_w) p->w[p->nw++] = wr;
    return need;
}

/* Records launches [l0, l1) into cb; the error word is reset first when l0 == 0. */
static twk_status record(vk_ctx *c, vk_prepared *pp, const twk_hal_plan *plan, int64_t n, VkCommandBuffer cb, int l0,
                         int l1) {
    const vk_fns *f = &c->f;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    if (f->vkBeginCommandBuffer(cb, &bi) != VK_SUCCESS)
        return twk_error(TWK_ERR_BACKEND, "vulkan: cannot begin a command buffer");
    if (l0 == 0) {
        f->vkCmdFillBuffer(cb, c->err->buf, 0, 16, 0xffffffffu);
        barrier(f, cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    }
    VkPipeline bound = VK_NULL_HANDLE;
    vk_dispatch d[VK_MAX_DISPATCH];
    pending pend;
    pend.nr = pend.nw = 0;
    for (int i = l0; i < l1; i++) {
        const twk_launch *l = &plan->launches[i];
        size_t sb;
        int k = vk_lower(c, l, i, n, plan->capacity, pp->const_off[i], d, &sb);
        if (k != pp->first[i + 1] - pp->first[i]) {
            f->vkEndCommandBuffer(cb);
            return k < 0 ? TWK_ERR_UNSUPPORTED
                         : twk_error(TWK_ERR_BACKEND, "vulkan: %s '%s' lowered differently at n = %lld",
                                     twk_op_name(l->op), l->name, (long long)n);
        }
        for (int j = 0; j < k; j++) {
            int di = pp->first[i] + j;
            if (needs_barrier(c, pp, l, &d[j], n, &pend))
                barrier(f, cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
            VkPipeline p = vk_pipeline(c, d[j].shader, d[j].spec);
            if (!p) {
                f->vkEndCommandBuffer(cb);
                return TWK_ERR_BACKEND;
            }
            if (p != bound) {
                f->vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p);
                bound = p;
            }
            f->vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, c->layout, 0, 1, &pp->sets[di], 0, NULL);
            uint32_t push[32];
            memset(push, 0, sizeof push);
            for (int b = 0; b < VK_NBIND; b++) {
                size_t off;
                binding_buffer(c, pp, l, d[j].bind[b], &off);
                push[b] = (uint32_t)((off - pp->base[di][b]) / binding_unit(l, d[j].bind[b])) + d[j].add_off[b];
            }
            memcpy(push + 8, d[j].p, sizeof d[j].p);
            memcpy(push + 24, d[j].fp, sizeof d[j].fp);
            f->vkCmdPushConstants(cb, c->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof push, push);
            f->vkCmdDispatch(cb, d[j].groups[0], d[j].groups[1], d[j].groups[2]);
        }
    }
    barrier(f, cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
            VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_HOST_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT);
    if (f->vkEndCommandBuffer(cb) != VK_SUCCESS) return twk_error(TWK_ERR_BACKEND, "vulkan: cannot end a command buffer");
    return TWK_OK;
}

static twk_status check_error_word(vk_ctx *c, const twk_hal_plan *plan, int64_t n) {
    uint32_t err = 0xffffffffu;
    twk_status st = vk_download(c, &c->err->base, 0, &err, 4);
    if (st != TWK_OK) return st;
    if (err != 0xffffffffu && err < (uint32_t)plan->n_launches) return vk_range_error(c, &plan->launches[err], n);
    return TWK_OK;
}

/* TWK_PROFILE=1: each launch in its own submission, timed on the host
 * (per-op totals are printed when the device closes). */
static twk_status run_profiled(vk_ctx *c, vk_prepared *pp, const twk_hal_plan *plan, int64_t n) {
    const vk_fns *f = &c->f;
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = pp->cpool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkCommandBuffer cb;
    if (f->vkAllocateCommandBuffers(c->dev, &ai, &cb) != VK_SUCCESS)
        return twk_error(TWK_ERR_BACKEND, "vulkan: cannot allocate a command buffer");
    twk_status st = TWK_OK;
    for (int i = 0; i < plan->n_launches && st == TWK_OK; i++) {
        f->vkResetCommandBuffer(cb, 0);
        double t0 = twk_now();
        st = record(c, pp, plan, n, cb, i, i + 1);
        if (st == TWK_OK) st = vk_submit_wait(c, cb);
        c->prof_s[plan->launches[i].op] += twk_now() - t0;
        c->prof_n[plan->launches[i].op]++;
    }
    f->vkFreeCommandBuffers(c->dev, pp->cpool, 1, &cb);
    return st == TWK_OK ? check_error_word(c, plan, n) : st;
}

twk_status vk_run(void *ctx, void *prepared, const twk_hal_plan *plan, int64_t n) {
    vk_ctx *c = ctx;
    vk_prepared *pp = prepared;
    const vk_fns *f = &c->f;
    if (n < 1 || n > plan->capacity)
        return twk_error(TWK_ERR_INVALID_ARG, "vulkan: run with n = %lld outside [1, %lld]", (long long)n,
                         (long long)plan->capacity);
    if (c->profile) return run_profiled(c, pp, plan, n);
    int slot = -1, lru = 0;
    for (int i = 0; i < CB_CACHE; i++) {
        if (pp->cache[i].cb && pp->cache[i].n == n) slot = i;
        if (pp->cache[i].used < pp->cache[lru].used) lru = i;
    }
    if (slot < 0) {
        slot = lru;
        if (!pp->cache[slot].cb) {
            VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                              .commandPool = pp->cpool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                              .commandBufferCount = 1};
            if (f->vkAllocateCommandBuffers(c->dev, &ai, &pp->cache[slot].cb) != VK_SUCCESS)
                return twk_error(TWK_ERR_BACKEND, "vulkan: cannot allocate a command buffer");
        } else {
            f->vkResetCommandBuffer(pp->cache[slot].cb, 0);
        }
        pp->cache[slot].n = -1;
        twk_status st = record(c, pp, plan, n, pp->cache[slot].cb, 0, plan->n_launches);
        if (st != TWK_OK) return st;
        pp->cache[slot].n = n;
    }
    pp->cache[slot].used = ++pp->clock;
    twk_status st = vk_submit_wait(c, pp->cache[slot].cb);
    if (st != TWK_OK) return st;
    return check_error_word(c, plan, n);
}
