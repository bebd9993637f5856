/*
 * Block-paged KV cache.
 *
 * Per layer and KV head, token positions are grouped into logical blocks of block_size tokens
 * (default 16, at most 64). A block table maps each logical block to a physical block of a shared
 * pool, so attention can read any subset of blocks, policies can evict, and memory comes back to
 * the pool when every token of a block has been evicted. Within a physical block, keys are stored
 * transposed ([head_dim][bs]) so the score kernel vectorises over the block's tokens whatever the
 * head size (bs = 16 floats is one AVX-512 register), and values are stored [bs][head_dim] so the
 * weighted sum vectorises over the head dimension. Keys are cached after RoPE, at their true
 * positions; a token's slot is its position, so evicting never moves data (only compaction
 * does, below).
 *
 * Eviction is per token: a 64-bit mask per logical block marks evicted tokens, which attention
 * never reads. With `release` set, a block whose tokens are all evicted returns its physical block
 * to the pool (real memory); without it (measurement runs) the data stays so dense attention can
 * still be computed for measuring, while the accounting reports what would have been freed.
 *
 * Compaction (kvp_kvcache_compact): token-scattered evictors (h2o, snapkv, pyramidkv, catekv)
 * leave a few live tokens in almost every block, so no block would ever come back. Compacting
 * slots [0, limit) of one (layer, KV head) moves its live tokens from the highest slots into the
 * holes of the lowest blocks and frees the blocks that empty. Attention never needs positions
 * (keys are stored after RoPE), so this is exact up to float summation order; below the limit a
 * slot is then no longer its token's position, which kvp_kvcache_pos still tells.
 */
#ifndef KVP_KV_KVCACHE_H
#define KVP_KV_KVCACHE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#define KVP_MAX_BLOCK_SIZE 64 /* token masks are one uint64_t per block */

/* Physical block p of a layer: keys at k + p*stride, values at v + p*stride. Per layer because
 * a tiered store interleaves K and V of the blocks it transfers (stride 2*block_floats) but keeps
 * the layers it never transfers in the untiered layout (stride block_floats), which streams. */
struct kvp_kvpool {
    float *k, *v;
    size_t stride;
};

struct kvp_kvcache {
    int n_layer;
    int n_head_kv;
    int head_dim;
    int block_size;
    int max_blocks;        /* logical blocks per (layer, KV head): ceil(n_ctx / block_size) */
    size_t block_floats;   /* head_dim * block_size */
    int n_pool;            /* physical blocks in the pool */
    float *k_pool;         /* owned [n_pool][head_dim][block_size] (NULL when external) */
    float *v_pool;         /* owned [n_pool][block_size][head_dim] (NULL when external) */
    struct kvp_kvpool *pools; /* owned [n_layer]: where each layer's physical blocks are */
    bool external;         /* pools and table are managed by a tiered store (store.h) */
    int32_t *table;        /* owned [n_layer*n_head_kv][max_blocks]: physical block or -1 */
    uint64_t *evicted;     /* owned [n_layer*n_head_kv][max_blocks]: bit t = token evicted */
    int32_t *n_evicted;    /* owned [n_layer*n_head_kv]: evicted tokens */
    int32_t *released;     /* owned [n_layer*n_head_kv]: logical blocks fully evicted */
    int32_t *free_stack;   /* owned [n_pool] */
    int n_free;
    bool release;          /* give fully evicted blocks back to the pool */
    bool compact;          /* kvp_kvcache_compact is on (the default; off to compare runs) */
    int32_t *compact_limit;/* owned [n_layer*n_head_kv]: largest limit compacted so far (cut
                              to n_tokens by truncate) */
    int32_t *pos;          /* owned [n_layer*n_head_kv][max_blocks*block_size]: position of the
                              token in each slot, valid below compact_limit (NULL when external) */
    pthread_mutex_t pool_lock; /* evictions of different heads run on different threads */
};

int kvp_kvcache_init(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                     int block_size, int n_ctx, struct kvp_err *err);
void kvp_kvcache_free(struct kvp_kvcache *c);

/* Same as kvp_kvcache_init, but without a pool: a tiered store (src/store/store.h) owns the
 * memory and maps logical blocks to its hot slots itself, then hands the pool over with
 * kvp_kvcache_attach. reserve and truncate must not be called on such a cache. */
int kvp_kvcache_init_external(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                              int block_size, int n_ctx, struct kvp_err *err);

/* External caches: physical block p of layer has its keys at k + p*stride, its values at
 * v + p*stride (borrowed; valid until the next attach or kvp_kvcache_free). */
void kvp_kvcache_attach(struct kvp_kvcache *c, int layer, float *k, float *v, size_t stride);

/* Forget everything: all blocks back to the pool, no evictions. */
void kvp_kvcache_clear(struct kvp_kvcache *c);

/* Forget positions >= n_tokens (after a truncate); blocks past the end go back to the pool, and
 * tokens of such positions that compaction moved below n_tokens are evicted. */
void kvp_kvcache_truncate(struct kvp_kvcache *c, int n_tokens);

/* Make sure physical blocks exist for positions [0, n_tokens) of every (layer, KV head) that has
 * not released them. KVP_ENOMEM when the pool is exhausted. Single-threaded; called before a
 * forward pass so the pass itself never allocates. */
int kvp_kvcache_reserve(struct kvp_kvcache *c, int n_tokens, struct kvp_err *err);

static inline int kvp_kvcache_lh(const struct kvp_kvcache *c, int layer, int kvh)
{
    return layer * c->n_head_kv + kvh;
}

/* Physical block behind logical block blk, or NULL when it was released. */
static inline float *kvp_kvcache_kblock(const struct kvp_kvcache *c, int layer, int kvh, int blk)
{
    int32_t p = c->table[(size_t)kvp_kvcache_lh(c, layer, kvh) * c->max_blocks + blk];
    return p < 0 ? (float *)0 : c->pools[layer].k + (size_t)p * c->pools[layer].stride;
}

static inline float *kvp_kvcache_vblock(const struct kvp_kvcache *c, int layer, int kvh, int blk)
{
    int32_t p = c->table[(size_t)kvp_kvcache_lh(c, layer, kvh) * c->max_blocks + blk];
    return p < 0 ? (float *)0 : c->pools[layer].v + (size_t)p * c->pools[layer].stride;
}

/* Evicted-token mask of a logical block. */
static inline uint64_t kvp_kvcache_evicted(const struct kvp_kvcache *c, int layer, int kvh, int blk)
{
    return c->evicted[(size_t)kvp_kvcache_lh(c, layer, kvh) * c->max_blocks + blk];
}

/* Store one token's key and value (head_dim floats each) at position pos; its block must have
 * been reserved. */
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

/* Evict one token (idempotent; thread-safe across different (layer, KV head) pairs). Releases its block when all of the block's n_tokens-visible
 * tokens are evicted and release is on. n_tokens: tokens in the cache (the block holding the
 * newest token is never released, since the next token will be written there). */
void kvp_kvcache_evict(struct kvp_kvcache *c, int layer, int kvh, int pos, int n_tokens);

/* Tokens of (layer, KV head) not evicted, out of n_tokens. */
static inline int kvp_kvcache_kept(const struct kvp_kvcache *c, int layer, int kvh, int n_tokens)
{
    return n_tokens - c->n_evicted[kvp_kvcache_lh(c, layer, kvh)];
}

/* Position of the token in slot `slot` of (layer, KV head): the slot itself unless compaction
 * moved a token there. */
static inline int kvp_kvcache_pos(const struct kvp_kvcache *c, int layer, int kvh, int slot)
{
    int lh = kvp_kvcache_lh(c, layer, kvh);
    if (slot >= c->compact_limit[lh])
        return slot;
    return c->pos[(size_t)lh * c->max_blocks * c->block_size + slot];
}

/* Called for every token compaction moves, so a policy can move its per-slot state with it. */
typedef void (*kvp_kvcache_move_fn)(void *user, int from_slot, int to_slot);

/* Compact slots [0, limit) of (layer, KV head) in a cache of n_tokens tokens: live tokens move
 * from the highest slots into the evicted holes of the lowest blocks still held (K column, V row,
 * position; move, which may be NULL, is told each move), then the blocks left empty go back to
 * the pool. limit is rounded down to a block boundary and capped below the block of the newest
 * token, which is never released. A caller that keeps per-slot rules ("the last `local` slots
 * are recent") passes a limit at or below where they start, so those slots never move.
 * Thread-safe across different (layer, KV head) pairs. Only a releasing cache moves data; in
 * measurement runs (release off) the limit is recorded and kvp_kvcache_resident_bytes accounts
 * what compaction would hold. External caches and `compact` off: nothing. Returns the blocks
 * freed. */
int kvp_kvcache_compact(struct kvp_kvcache *c, int layer, int kvh, int limit, int n_tokens,
                        kvp_kvcache_move_fn move, void *user);

/* Bytes of the physical blocks taken from the pool (K and V): the memory really held. 0 for
 * external caches. */
size_t kvp_kvcache_pool_bytes(const struct kvp_kvcache *c);

/* Bytes of K and V per token of one (layer, KV head). */
static inline size_t kvp_kvcache_token_bytes(const struct kvp_kvcache *c)
{
    return (size_t)c->head_dim * 2 * sizeof(float);
}

/* Resident bytes for n_tokens: physical blocks holding live tokens (blocks that are fully
 * evicted count as freed whether or not release is on; without release, a compacted region
 * counts ceil(its live tokens / block_size) blocks, as compaction would hold), K and V, all
 * layers and heads. */
size_t kvp_kvcache_resident_bytes(const struct kvp_kvcache *c, int n_tokens);

/* Bytes of the tokens kept (not evicted), as a token-compacting store would hold them. */
size_t kvp_kvcache_kept_bytes(const struct kvp_kvcache *c, int n_tokens);

#endif
