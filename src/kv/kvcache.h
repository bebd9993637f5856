/*
 * Block-paged KV cache.
 *
 * Per layer and KV head, token positions are grouped into logical blocks of block_size tokens
 * (default 16, at most 64). A block table maps each logical block to a physical block of a shared
 * pool, so attention can read any subset of blocks, policies can evict, and memory comes back to
 * the pool when every token of a block has been evicted. Within a physical block, keys are stored
 * transposed ([head_dim][bs]) so the score kernel vectorises over the block's tokens whatever the
 * head size (bs = 16 floats is one AVX-512 register), and values are stored [bs][head_dim] so the
 * weighted sum vectorises over the head dimension. Keys and values have their own element types
 * (f32, f16, bf16, q8_0: kv_types.h, which also holds the kernels that read and write them);
 * blocks are bytes here, and everything that reads keys or values goes through those kernels. Keys are cached after RoPE, at their true
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
#include "kv/kv_types.h"

#define KVP_MAX_BLOCK_SIZE 64 /* token masks are one uint64_t per block */

/* Where physical block p of a layer is: keys at k + (p >> shift)*k_unit + (p & mask)*stride,
 * values the same from v with v_unit. Per layer because a tiered store interleaves K and V of
 * the blocks it transfers (2^shift head slots of `stride` bytes per 4 KiB-aligned unit of
 * k_unit = v_unit bytes) but keeps the layers it never transfers in the untiered layout (shift
 * 0, mask 0: keys every k_unit = k_bytes, values every v_unit = v_bytes), which streams. */
struct kvp_kvpool {
    uint8_t *k, *v;
    size_t k_unit, v_unit, stride;
    int shift;
    uint32_t mask;
};

struct kvp_kvcache {
    int n_layer;
    int n_head_kv;
    int head_dim;
    int block_size;
    int max_blocks;        /* logical blocks per (layer, KV head): ceil(n_ctx / block_size) */
    int type_k, type_v;    /* enum kvp_kv_type of keys and values (never KVP_KV_DEFAULT) */
    size_t k_bytes, v_bytes; /* one key / value block: kvp_kv_block_bytes */
    const struct kvp_kv_kernels *kk, *vk; /* the kernels of type_k and type_v */
    int n_pool;            /* physical blocks in the pool */
    uint8_t *k_pool;       /* owned [n_pool] key blocks (NULL when external) */
    uint8_t *v_pool;       /* owned [n_pool] value blocks (NULL when external) */
    struct kvp_kvpool *pools; /* owned [n_layer]: where each layer's physical blocks are */
    bool external;         /* pools and table are managed by a tiered store (store.h), but
                              for the rings of sliding-window layers (ring below) */
    int32_t *table;        /* owned [n_layer*n_head_kv][max_blocks]: physical block or -1 */
    uint64_t *evicted;     /* owned [n_layer*n_head_kv][max_blocks]: bit t = token evicted */
    int32_t *n_evicted;    /* owned [n_layer*n_head_kv]: evicted tokens */
    int32_t *released;     /* owned [n_layer*n_head_kv]: logical blocks fully evicted */
    int32_t *free_stack;   /* owned [n_pool] */
    int n_free;
    int reserved_blocks;   /* logical blocks [0, this) of every (layer, KV head) are backed or
                              fully evicted: reserve starts there (a decode step's reserve then
                              visits one block per (layer, KV head), not the whole context) */
    bool release;          /* give fully evicted blocks back to the pool */
    bool compact;          /* kvp_kvcache_compact is on (the default; off to compare runs) */
    int32_t *compact_limit;/* owned [n_layer*n_head_kv]: largest limit compacted so far (cut
                              to n_tokens by truncate) */
    int32_t *pos;          /* owned [n_layer*n_head_kv][max_blocks*block_size]: position of the
                              token in each slot, valid below compact_limit (NULL when external) */
    pthread_mutex_t pool_lock; /* evictions of different heads run on different threads */
    int32_t *ring;         /* owned [n_layer] or NULL: blocks of a sliding-window layer's ring
                              per KV head (0: a global layer; see kvp_kvcache_init_windowed) */
    int32_t *ring_end;     /* owned [n_layer]: logical blocks [0, this) mapped by ring_advance */
    float score_cap;       /* attention scores s -> score_cap·tanh(s / score_cap) before the
                              softmax in every kernel that reads this cache (Gemma 2's
                              attn_logit_softcapping; 0: none). Set by the owner after init. */
};

/* type_k, type_v: enum kvp_kv_type (KVP_KV_DEFAULT: f16). */
int kvp_kvcache_init(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                     int block_size, int n_ctx, int type_k, int type_v, struct kvp_err *err);
void kvp_kvcache_free(struct kvp_kvcache *c);

/* Same as kvp_kvcache_init, but without a pool: a tiered store (src/store/store.h) owns the
 * memory and maps logical blocks to its hot slots itself, then hands the pool over with
 * kvp_kvcache_attach. reserve must not be called on such a cache; clear and truncate touch
 * only the rings of its sliding-window layers (kvp_kvcache_init_windowed), none without. */
int kvp_kvcache_init_external(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                              int block_size, int n_ctx, int type_k, int type_v,
                              struct kvp_err *err);

/* Same as kvp_kvcache_init, for a model whose layer l attends within a window of window[l]
 * positions (0: a global layer). Such a layer keeps a ring: logical block b takes over the
 * physical block of block b - R, which no query can see any more, so it holds at most R blocks
 * per KV head, R = ceil((window + n_batch) / block_size) + 2 (a pass of up to n_batch tokens
 * writes its tokens before its first query reads back to window - 1 positions earlier), and
 * the pool holds exactly that for it. Its blocks are mapped by kvp_kvcache_ring_advance before
 * each pass, never by reserve; a block that left the ring counts as released (memory
 * accounting). Truncating such a cache below the oldest position its rings still hold loses
 * those positions: tokens evaluated again after that see zeros for them. With external set
 * (a tiered store, store.h), the pool holds the rings alone: the global layers are the store's
 * as with kvp_kvcache_init_external (it attaches their memory and maps their blocks; clear and
 * truncate leave their table entries to it), while the windowed layers keep their rings here,
 * in RAM, mapped by ring_advance as without a store. */
int kvp_kvcache_init_windowed(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                              int block_size, int n_ctx, int type_k, int type_v,
                              const int *window, int n_batch, bool external,
                              struct kvp_err *err);

/* Blocks of a windowed layer's ring per KV head (see kvp_kvcache_init_windowed). */
static inline int kvp_kvcache_ring_blocks(int window, int n_batch, int block_size, int max_blocks)
{
    long r = ((long)window + n_batch + block_size - 1) / block_size + 2;
    return r < max_blocks ? (int)r : max_blocks;
}

/* Map the blocks of positions [0, n_tokens) of every windowed layer (kvp_kvcache_init_windowed),
 * releasing the blocks that fall out of the ring. Before a pass that ends at n_tokens; cheap (a
 * few table entries per layer), never allocates. KVP_ENOMEM only if the pool was not sized for
 * passes this long (a cache shared beyond its n_batch). */
int kvp_kvcache_ring_advance(struct kvp_kvcache *c, int n_tokens, struct kvp_err *err);

/* External caches: where layer's physical blocks are (struct kvp_kvpool; the memory is
 * borrowed, valid until the next attach or kvp_kvcache_free). */
void kvp_kvcache_attach(struct kvp_kvcache *c, int layer, struct kvp_kvpool pool);

/* Forget everything: all blocks back to the pool, no evictions. */
void kvp_kvcache_clear(struct kvp_kvcache *c);

/* Forget positions >= n_tokens (after a truncate); blocks past the end go back to the pool, and
 * tokens of such positions that compaction moved below n_tokens are evicted. */
void kvp_kvcache_truncate(struct kvp_kvcache *c, int n_tokens);
/* Whether truncating to n_tokens keeps what tokens evaluated after the cut will read: false when
 * a sliding-window layer's ring released a block among the ring's worth of blocks before the cut
 * (a ring spans at least the window, so this never misses a needed key; it may refuse a cut a
 * narrower window would allow). Always true without rings. */
bool kvp_kvcache_truncate_keeps(const struct kvp_kvcache *c, int n_tokens);

/* Make sure physical blocks exist for positions [0, n_tokens) of every (layer, KV head) that has
 * not released them. KVP_ENOMEM when the pool is exhausted. Single-threaded; called before a
 * forward pass so the pass itself never allocates. */
int kvp_kvcache_reserve(struct kvp_kvcache *c, int n_tokens, struct kvp_err *err);

static inline int kvp_kvcache_lh(const struct kvp_kvcache *c, int layer, int kvh)
{
    return layer * c->n_head_kv + kvh;
}

/* Byte offset of physical block p in a layer's pool (keys: unit = k_unit, values: v_unit). */
static inline size_t kvp_kvpool_off(const struct kvp_kvpool *pl, int32_t p, size_t unit)
{
    return (size_t)((uint32_t)p >> pl->shift) * unit + (size_t)((uint32_t)p & pl->mask) * pl->stride;
}

/* Key block (type_k, layout of kv_types.h) behind logical block blk, or NULL when it was
 * released. */
static inline uint8_t *kvp_kvcache_kblock(const struct kvp_kvcache *c, int layer, int kvh, int blk)
{
    int32_t p = c->table[(size_t)kvp_kvcache_lh(c, layer, kvh) * c->max_blocks + blk];
    const struct kvp_kvpool *pl = &c->pools[layer];
    return p < 0 ? (uint8_t *)0 : pl->k + kvp_kvpool_off(pl, p, pl->k_unit);
}

static inline uint8_t *kvp_kvcache_vblock(const struct kvp_kvcache *c, int layer, int kvh, int blk)
{
    int32_t p = c->table[(size_t)kvp_kvcache_lh(c, layer, kvh) * c->max_blocks + blk];
    const struct kvp_kvpool *pl = &c->pools[layer];
    return p < 0 ? (uint8_t *)0 : pl->v + kvp_kvpool_off(pl, p, pl->v_unit);
}

/* Evicted-token mask of a logical block. */
static inline uint64_t kvp_kvcache_evicted(const struct kvp_kvcache *c, int layer, int kvh, int blk)
{
    return c->evicted[(size_t)kvp_kvcache_lh(c, layer, kvh) * c->max_blocks + blk];
}

/* Store one token's key and value (head_dim floats each, converted to the cache's types) at
 * position pos; its block must have been reserved. */
static inline void kvp_kvcache_store(const struct kvp_kvcache *c, int layer, int kvh, int pos,
                                     const float *k, const float *v)
{
    int bs = c->block_size;
    c->kk->put_k(k, kvp_kvcache_kblock(c, layer, kvh, pos / bs), c->head_dim, bs, pos % bs);
    c->vk->put_v(v, kvp_kvcache_vblock(c, layer, kvh, pos / bs), c->head_dim, bs, pos % bs);
}

/* Dimension d of the key in slot `slot` of (layer, KV head) as f32 (its block must be held):
 * for policies that read single keys. */
static inline float kvp_kvcache_key_at(const struct kvp_kvcache *c, int layer, int kvh, int slot,
                                       int d)
{
    int bs = c->block_size;
    return kvp_kv_key_at(c->type_k, kvp_kvcache_kblock(c, layer, kvh, slot / bs), c->head_dim,
                         bs, d, slot % bs);
}

/* Evict one token (idempotent; thread-safe across different (layer, KV head) pairs). Releases its block when all of the block's n_tokens-visible
 * tokens are evicted and release is on. n_tokens: tokens in the cache (the block holding the
 * newest token is never released, since the next token will be written there). */
void kvp_kvcache_evict(struct kvp_kvcache *c, int layer, int kvh, int pos, int n_tokens);

/* Whether any (layer, KV head) has evicted tokens or released blocks (a sliding-window ring
 * counts: it gave up its oldest blocks), so the cache no longer holds every key it was given. */
bool kvp_kvcache_has_evicted(const struct kvp_kvcache *c);

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

/* Bytes of K and V of one block of one (layer, KV head). */
static inline size_t kvp_kvcache_block_bytes(const struct kvp_kvcache *c)
{
    return c->k_bytes + c->v_bytes;
}

/* Resident bytes for n_tokens: physical blocks holding live tokens (blocks that are fully
 * evicted count as freed whether or not release is on; without release, a compacted region
 * counts ceil(its live tokens / block_size) blocks, as compaction would hold), K and V, all
 * layers and heads. */
size_t kvp_kvcache_resident_bytes(const struct kvp_kvcache *c, int n_tokens);

/* The part of kvp_kvcache_resident_bytes held by sliding-window layers' rings (0 without). */
size_t kvp_kvcache_ring_resident_bytes(const struct kvp_kvcache *c, int n_tokens);

/* Bytes of the tokens kept (not evicted), as a token-compacting store would hold them. */
size_t kvp_kvcache_kept_bytes(const struct kvp_kvcache *c, int n_tokens);

#endif
