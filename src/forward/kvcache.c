/* Block-paged KV cache storage (see kvcache.h). */
#include "forward/kvcache.h"

#include <string.h>

#include "core/cursor.h"
#include "core/platform.h"

int kvp_kvcache_init(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                     int block_size, int n_ctx, struct kvp_err *err)
{
    memset(c, 0, sizeof(*c));
    if (block_size < 1 || block_size > 4096)
        return kvp_err_set(err, KVP_EINVAL, "block size %d out of range 1..4096", block_size);
    c->n_layer = n_layer;
    c->n_head_kv = n_head_kv;
    c->head_dim = head_dim;
    c->block_size = block_size;
    c->max_blocks = (n_ctx + block_size - 1) / block_size;
    c->block_floats = (size_t)head_dim * block_size;
    size_t n, bytes;
    if (!kvp_mul_ok((size_t)n_layer * n_head_kv, (size_t)c->max_blocks, &n) ||
        !kvp_mul_ok(n, c->block_floats * sizeof(float), &bytes))
        return kvp_err_set(err, KVP_ENOMEM, "KV cache size overflows");
    c->k = kvp_alloc_aligned(bytes);
    c->v = kvp_alloc_aligned(bytes);
    if (!c->k || !c->v) {
        kvp_kvcache_free(c);
        return kvp_err_set(err, KVP_ENOMEM, "cannot allocate the KV cache (%zu MiB)",
                           2 * bytes >> 20);
    }
    /* zero so partially filled blocks hold finite values (masked anyway) */
    memset(c->k, 0, bytes);
    memset(c->v, 0, bytes);
    return 0;
}

void kvp_kvcache_free(struct kvp_kvcache *c)
{
    if (!c)
        return;
    kvp_free_aligned(c->k);
    kvp_free_aligned(c->v);
    c->k = c->v = NULL;
}

size_t kvp_kvcache_bytes(const struct kvp_kvcache *c, int n_tokens)
{
    size_t blocks = (size_t)(n_tokens + c->block_size - 1) / c->block_size;
    return blocks * c->block_floats * sizeof(float) * 2 * c->n_layer * c->n_head_kv;
}
