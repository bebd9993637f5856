/*
 * Block-paged KV cache.
 *
 * Per layer and KV head, tokens live in fixed-size blocks (block_size tokens, default 16) so that
 * attention can read any subset of blocks: the policies of later issues choose blocks, and the
 * tiered store moves whole blocks. Within a block, keys are stored transposed ([head_dim][bs]) so
 * the score kernel vectorises over the block's tokens whatever the head size (bs = 16 floats is
 * exactly one AVX-512 register), and values are stored [bs][head_dim] so the weighted sum
 * vectorises over the head dimension. Keys are cached after RoPE, at their true positions.
 */
#ifndef KVP_FORWARD_KVCACHE_H
#define KVP_FORWARD_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

struct kvp_kvcache {
    int n_layer;
    int n_head_kv;
    int head_dim;
    int block_size;
    int max_blocks;       /* per (layer, KV head): ceil(n_ctx / block_size) */
    size_t block_floats;  /* head_dim * block_size */
    float *k;             /* owned [n_layer][n_head_kv][max_blocks][head_dim][block_size] */
    float *v;             /* owned [n_layer][n_head_kv][max_blocks][block_size][head_dim] */
};

int kvp_kvcache_init(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                     int block_size, int n_ctx, struct kvp_err *err);
void kvp_kvcache_free(struct kvp_kvcache *c);

static inline float *kvp_kvcache_kblock(const struct kvp_kvcache *c, int layer, int kvh, int blk)
{
    return c->k + (((size_t)layer * c->n_head_kv + kvh) * c->max_blocks + blk) * c->block_floats;
}

static inline float *kvp_kvcache_vblock(const struct kvp_kvcache *c, int layer, int kvh, int blk)
{
    return c->v + (((size_t)layer * c->n_head_kv + kvh) * c->max_blocks + blk) * c->block_floats;
}

/* Store one token's key and value (head_dim floats each) at position pos. */
static inline void kvp_kvcache_store(const struct kvp_kvcache *c, int layer, int kvh, int pos,
                                     const float *k, const float *v)
{
    int bs = c->block_size;
    float *kb = kvp_kvcache_kblock(c, layer, kvh, pos / bs);
    float *vb = kvp_kvcache_vblock(c, layer, kvh, pos / bs);
    int t = pos % bs;
    for (int d = 0; d < c->head_dim; d++) {
        kb[(size_t)d * bs + t] = k[d];
        vb[(size_t)t * c->head_dim + d] = v[d];
    }
}

/* Bytes the cache holds for n_tokens tokens (whole blocks, both K and V). */
size_t kvp_kvcache_bytes(const struct kvp_kvcache *c, int n_tokens);

#endif
