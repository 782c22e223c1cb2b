/* Device buffers and transfers: mapped memcpy when buffers are host-visible
 * (lavapipe, integrated GPUs), else copies through a staging buffer. */
#include <string.h>

#include "vk_internal.h"

twk_status vk_buffer_new(vk_ctx *c, size_t bytes, int staging, vk_buffer **out) {
    const vk_fns *f = &c->f;
    vk_buffer *b = twk_host_calloc(sizeof *b, "vulkan buffer");
    if (!b) return TWK_ERR_OOM;
    b->base.size = bytes;
    b->alloc = (bytes + 3) / 4 * 4;
    if (b->alloc < 16) b->alloc = 16;
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = b->alloc,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    if (f->vkCreateBuffer(c->dev, &bi, NULL, &b->buf) != VK_SUCCESS) {
        twk_host_free(b);
        return twk_error(TWK_ERR_OOM, "vulkan: cannot create a buffer of %zu bytes", bytes);
    }
    VkMemoryRequirements req;
    f->vkGetBufferMemoryRequirements(c->dev, b->buf, &req);
    uint32_t type = staging ? c->staging_type : c->mem_type;
    int mapped = staging || c->host_visible;
    if (!(req.memoryTypeBits & (1u << type))) {
        f->vkDestroyBuffer(c->dev, b->buf, NULL);
        twk_host_free(b);
        return twk_error(TWK_ERR_BACKEND, "vulkan: buffers cannot use memory type %u", type);
    }
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size,
                               .memoryTypeIndex = type};
    VkResult r = f->vkAllocateMemory(c->dev, &ai, NULL, &b->mem);
    if (r != VK_SUCCESS) {
        f->vkDestroyBuffer(c->dev, b->buf, NULL);
        twk_host_free(b);
        return twk_error(TWK_ERR_OOM, "vulkan: cannot allocate %zu bytes of device memory (VkResult %d)", bytes, (int)r);
    }
    void *p = NULL;
    if (f->vkBindBufferMemory(c->dev, b->buf, b->mem, 0) != VK_SUCCESS ||
        (mapped && f->vkMapMemory(c->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &p) != VK_SUCCESS)) {
        f->vkFreeMemory(c->dev, b->mem, NULL);
        f->vkDestroyBuffer(c->dev, b->buf, NULL);
        twk_host_free(b);
        return twk_error(TWK_ERR_BACKEND, "vulkan: cannot bind or map a buffer of %zu bytes", bytes);
    }
    b->map = p;
    *out = b;
    return TWK_OK;
}

void vk_buffer_destroy(vk_ctx *c, vk_buffer *b) {
    if (!b) return;
    const vk_fns *f = &c->f;
    if (b->map) f->vkUnmapMemory(c->dev, b->mem);
    f->vkDestroyBuffer(c->dev, b->buf, NULL);
    f->vkFreeMemory(c->dev, b->mem, NULL);
    twk_host_free(b);
}

twk_status vk_submit_wait(vk_ctx *c, VkCommandBuffer cb) {
    const vk_fns *f = &c->f;
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    VkResult r = f->vkQueueSubmit(c->queue, 1, &si, c->fence);
    if (r == VK_SUCCESS) r = f->vkWaitForFences(c->dev, 1, &c->fence, VK_TRUE, UINT64_MAX);
    f->vkResetFences(c->dev, 1, &c->fence);
    if (r != VK_SUCCESS) return twk_error(TWK_ERR_BACKEND, "vulkan: queue submit or wait failed (VkResult %d)", (int)r);
    return TWK_OK;
}

/* One-shot transfer: a copy (src != NULL) or a fill of zeros. */
static twk_status transfer(vk_ctx *c, VkBuffer dst, size_t doff, VkBuffer src, size_t soff, size_t bytes) {
    const vk_fns *f = &c->f;
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = c->cpool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkCommandBuffer cb;
    if (f->vkAllocateCommandBuffers(c->dev, &ai, &cb) != VK_SUCCESS)
        return twk_error(TWK_ERR_BACKEND, "vulkan: cannot allocate a command buffer");
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    f->vkBeginCommandBuffer(cb, &bi);
    if (src) {
        VkBufferCopy region = {.srcOffset = soff, .dstOffset = doff, .size = bytes};
        f->vkCmdCopyBuffer(cb, src, dst, 1, &region);
    } else {
        f->vkCmdFillBuffer(cb, dst, doff, bytes, 0);
    }
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT | VK_ACCESS_SHADER_READ_BIT};
    f->vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                            0, 1, &mb, 0, NULL, 0, NULL);
    f->vkEndCommandBuffer(cb);
    twk_status st = vk_submit_wait(c, cb);
    f->vkFreeCommandBuffers(c->dev, c->cpool, 1, &cb);
    return st;
}

#define STAGING_CHUNK ((size_t)64 << 20)

static twk_status staging_ready(vk_ctx *c, size_t bytes) {
    if (c->staging && c->staging->alloc >= bytes) return TWK_OK;
    vk_buffer_destroy(c, c->staging);
    c->staging = NULL;
    return vk_buffer_new(c, bytes, 1, &c->staging);
}

twk_status vk_upload(void *ctx, twk_buffer *dst, size_t off, const void *src, size_t bytes) {
    vk_ctx *c = ctx;
    vk_buffer *d = (vk_buffer *)dst;
    if (d->map) {
        memcpy(d->map + off, src, bytes);
        return TWK_OK;
    }
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < STAGING_CHUNK ? bytes - done : STAGING_CHUNK;
        twk_status st = staging_ready(c, n);
        if (st != TWK_OK) return st;
        memcpy(c->staging->map, (const unsigned char *)src + done, n);
        st = transfer(c, d->buf, off + done, c->staging->buf, 0, n);
        if (st != TWK_OK) return st;
        done += n;
    }
    return TWK_OK;
}

twk_status vk_download(void *ctx, const twk_buffer *src, size_t off, void *dst, size_t bytes) {
    vk_ctx *c = ctx;
    const vk_buffer *s = (const vk_buffer *)src;
    if (s->map) {
        memcpy(dst, s->map + off, bytes);
        return TWK_OK;
    }
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < STAGING_CHUNK ? bytes - done : STAGING_CHUNK;
        twk_status st = staging_ready(c, n);
        if (st != TWK_OK) return st;
        st = transfer(c, c->staging->buf, 0, s->buf, off + done, n);
        if (st != TWK_OK) return st;
        memcpy((unsigned char *)dst + done, c->staging->map, n);
        done += n;
    }
    return TWK_OK;
}

twk_status vk_copy(void *ctx, twk_buffer *dst, size_t doff, const twk_buffer *src, size_t soff, size_t bytes) {
    vk_ctx *c = ctx;
    vk_buffer *d = (vk_buffer *)dst;
    const vk_buffer *s = (const vk_buffer *)src;
    if (!bytes) return TWK_OK;
    if (d->map && s->map) {
        memmove(d->map + doff, s->map + soff, bytes);
        return TWK_OK;
    }
    if (d == s && doff < soff + bytes && soff < doff + bytes) { /* overlapping: go through the host */
        void *tmp = twk_host_alloc(bytes, "vulkan copy");
        if (!tmp) return TWK_ERR_OOM;
        twk_status st = vk_download(ctx, src, soff, tmp, bytes);
        if (st == TWK_OK) st = vk_upload(ctx, dst, doff, tmp, bytes);
        twk_host_free(tmp);
        return st;
    }
    return transfer(c, d->buf, doff, s->buf, soff, bytes);
}

twk_status vk_memset_zero(void *ctx, twk_buffer *dst, size_t off, size_t bytes) {
    vk_ctx *c = ctx;
    vk_buffer *d = (vk_buffer *)dst;
    if (!bytes) return TWK_OK;
    if (d->map) {
        memset(d->map + off, 0, bytes);
        return TWK_OK;
    }
    if (off % 4 == 0 && bytes % 4 == 0) return transfer(c, d->buf, off, VK_NULL_HANDLE, 0, bytes);
    void *zeros = twk_host_calloc(bytes, "vulkan zero fill");
    if (!zeros) return TWK_ERR_OOM;
    twk_status st = vk_upload(ctx, dst, off, zeros, bytes);
    twk_host_free(zeros);
    return st;
}
