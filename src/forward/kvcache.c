/* Block-paged KV cache storage (see kvcache.h). */
#include "forward/kvcache.h"

#include <stdlib.h>
#include <string.h>

#include "core/cursor.h"
#include "core/platform.h"

static int kvcache_init(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                        int block_size, int n_ctx, bool external, struct kvp_err *err)
{
    memset(c, 0, sizeof(*c));
    if (block_size < 1 || block_size > KVP_MAX_BLOCK_SIZE)
        return kvp_err_set(err, KVP_EINVAL, "block size %d out of range 1..%d", block_size,
                           KVP_MAX_BLOCK_SIZE);
    c->n_layer = n_layer;
    c->n_head_kv = n_head_kv;
    c->head_dim = head_dim;
    c->block_size = block_size;
    c->max_blocks = (n_ctx + block_size - 1) / block_size;
    c->block_floats = (size_t)head_dim * block_size;
    c->external = external;
    c->release = true;
    pthread_mutex_init(&c->pool_lock, NULL);
    size_t n_lh = (size_t)n_layer * n_head_kv, n_tab, bytes;
    if (!kvp_mul_ok(n_lh, (size_t)c->max_blocks, &n_tab) || n_tab > INT32_MAX ||
        !kvp_mul_ok(n_tab, c->block_floats * sizeof(float), &bytes))
        return kvp_err_set(err, KVP_ENOMEM, "KV cache size overflows");
    c->n_pool = external ? 0 : (int)n_tab;
    if (!external) {
        c->k_pool = kvp_alloc_aligned(bytes);
        c->v_pool = kvp_alloc_aligned(bytes);
    }
    c->table = malloc(n_tab * sizeof(int32_t));
    c->evicted = calloc(n_tab, sizeof(uint64_t));
    c->n_evicted = calloc(n_lh, sizeof(int32_t));
    c->released = calloc(n_lh, sizeof(int32_t));
    c->free_stack = malloc(n_tab * sizeof(int32_t));
    c->pools = calloc((size_t)n_layer, sizeof(*c->pools));
    if ((!external && (!c->k_pool || !c->v_pool)) || !c->table || !c->evicted || !c->n_evicted ||
        !c->released || !c->free_stack || !c->pools) {
        kvp_kvcache_free(c);
        return kvp_err_set(err, KVP_ENOMEM, "cannot allocate the KV cache (%zu MiB)",
                           2 * bytes >> 20);
    }
    /* zero so the unused tail of a partial block holds finite values (it is masked anyway) */
    if (!external) {
        memset(c->k_pool, 0, bytes);
        memset(c->v_pool, 0, bytes);
        for (int l = 0; l < n_layer; l++)
            c->pools[l] = (struct kvp_kvpool){c->k_pool, c->v_pool, c->block_floats};
    }
    kvp_kvcache_clear(c);
    return 0;
}

int kvp_kvcache_init(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                     int block_size, int n_ctx, struct kvp_err *err)
{
    return kvcache_init(c, n_layer, n_head_kv, head_dim, block_size, n_ctx, false, err);
}

int kvp_kvcache_init_external(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                              int block_size, int n_ctx, struct kvp_err *err)
{
    return kvcache_init(c, n_layer, n_head_kv, head_dim, block_size, n_ctx, true, err);
}

void kvp_kvcache_attach(struct kvp_kvcache *c, int layer, float *k, float *v, size_t stride)
{
    c->pools[layer] = (struct kvp_kvpool){k, v, stride};
}

void kvp_kvcache_free(struct kvp_kvcache *c)
{
    if (!c)
        return;
    if (!c->external) {
        kvp_free_aligned(c->k_pool);
        kvp_free_aligned(c->v_pool);
    }
    free(c->table);
    free(c->evicted);
    free(c->n_evicted);
    free(c->released);
    free(c->free_stack);
    free(c->pools);
    pthread_mutex_destroy(&c->pool_lock);
    memset(c, 0, sizeof(*c));
}

void kvp_kvcache_clear(struct kvp_kvcache *c)
{
    size_t n_lh = (size_t)c->n_layer * c->n_head_kv;
    size_t n_tab = n_lh * c->max_blocks;
    for (size_t i = 0; i < n_tab; i++)
        c->table[i] = -1;
    memset(c->evicted, 0, n_tab * sizeof(uint64_t));
    memset(c->n_evicted, 0, n_lh * sizeof(int32_t));
    memset(c->released, 0, n_lh * sizeof(int32_t));
    /* pop order 0, 1, 2, ...: physical blocks fill the pool front to back */
    c->n_free = c->n_pool;
    for (int i = 0; i < c->n_pool; i++)
        c->free_stack[i] = c->n_pool - 1 - i;
}

static int count_bits(uint64_t x)
{
    return __builtin_popcountll(x);
}

/* Mask of all bs token bits of a block. */
static uint64_t full_mask(const struct kvp_kvcache *c)
{
    return c->block_size == 64 ? ~0ULL : (1ULL << c->block_size) - 1;
}

void kvp_kvcache_truncate(struct kvp_kvcache *c, int n_tokens)
{
    int bs = c->block_size;
    int first_gone = (n_tokens + bs - 1) / bs; /* blocks wholly past the end */
    for (int lh = 0; lh < c->n_layer * c->n_head_kv; lh++) {
        int32_t *tab = c->table + (size_t)lh * c->max_blocks;
        uint64_t *ev = c->evicted + (size_t)lh * c->max_blocks;
        for (int b = 0; b < c->max_blocks; b++) {
            uint64_t keep = b < n_tokens / bs ? ~0ULL
                            : b == n_tokens / bs ? ((1ULL << (n_tokens % bs)) - 1) : 0;
            c->n_evicted[lh] -= count_bits(ev[b] & ~keep);
            ev[b] &= keep;
            if (b >= first_gone && tab[b] >= 0) {
                c->free_stack[c->n_free++] = tab[b];
                tab[b] = -1;
            }
        }
        /* fully evicted blocks stay freed only below the cut */
        int rel = 0;
        for (int b = 0; b < first_gone; b++)
            rel += (ev[b] & full_mask(c)) == full_mask(c);
        c->released[lh] = rel;
    }
}

int kvp_kvcache_reserve(struct kvp_kvcache *c, int n_tokens, struct kvp_err *err)
{
    int bs = c->block_size;
    int n_blocks = (n_tokens + bs - 1) / bs;
    if (n_blocks > c->max_blocks)
        return kvp_err_set(err, KVP_ERANGE, "KV cache holds at most %d tokens",
                           c->max_blocks * bs);
    for (int lh = 0; lh < c->n_layer * c->n_head_kv; lh++) {
        int32_t *tab = c->table + (size_t)lh * c->max_blocks;
        uint64_t *ev = c->evicted + (size_t)lh * c->max_blocks;
        for (int b = 0; b < n_blocks; b++) {
            if (tab[b] >= 0 || (ev[b] & full_mask(c)) == full_mask(c))
                continue; /* present, or freed after full eviction */
            if (c->n_free == 0)
                return kvp_err_set(err, KVP_ENOMEM, "KV block pool exhausted");
            tab[b] = c->free_stack[--c->n_free];
        }
    }
    return 0;
}

void kvp_kvcache_evict(struct kvp_kvcache *c, int layer, int kvh, int pos, int n_tokens)
{
    int bs = c->block_size, lh = kvp_kvcache_lh(c, layer, kvh), b = pos / bs;
    uint64_t *ev = &c->evicted[(size_t)lh * c->max_blocks + b];
    uint64_t bit = 1ULL << (pos % bs);
    if (*ev & bit)
        return;
    *ev |= bit;
    c->n_evicted[lh]++;
    /* a block is done when all bs of its tokens are evicted; the block of the newest token is
     * still being filled */
    uint64_t full = full_mask(c);
    if ((*ev & full) != full || b == (n_tokens - 1) / bs)
        return;
    c->released[lh]++;
    int32_t *slot = &c->table[(size_t)lh * c->max_blocks + b];
    if (c->release && *slot >= 0) {
        pthread_mutex_lock(&c->pool_lock);
        c->free_stack[c->n_free++] = *slot;
        pthread_mutex_unlock(&c->pool_lock);
        *slot = -1;
    }
}

size_t kvp_kvcache_resident_bytes(const struct kvp_kvcache *c, int n_tokens)
{
    size_t blocks = (size_t)(n_tokens + c->block_size - 1) / c->block_size;
    size_t live = 0;
    for (int lh = 0; lh < c->n_layer * c->n_head_kv; lh++)
        live += blocks - (size_t)c->released[lh];
    return live * c->block_floats * 2 * sizeof(float);
}

size_t kvp_kvcache_kept_bytes(const struct kvp_kvcache *c, int n_tokens)
{
    size_t kept = 0;
    for (int lh = 0; lh < c->n_layer * c->n_head_kv; lh++)
        kept += (size_t)(n_tokens - c->n_evicted[lh]);
    return kept * kvp_kvcache_token_bytes(c);
}
