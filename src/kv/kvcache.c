/* Block-paged KV cache storage (see kvcache.h). */
#include "kv/kvcache.h"

#include <stdlib.h>
#include <string.h>

#include "core/cursor.h"
#include "core/platform.h"

static int kvcache_init(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                        int block_size, int n_ctx, int type_k, int type_v, bool external,
                        const int *window, int n_batch, struct kvp_err *err)
{
    memset(c, 0, sizeof(*c));
    if (block_size < 1 || block_size > KVP_MAX_BLOCK_SIZE)
        return kvp_err_set(err, KVP_EINVAL, "block size %d out of range 1..%d", block_size,
                           KVP_MAX_BLOCK_SIZE);
    type_k = kvp_kv_type_resolve(type_k);
    type_v = kvp_kv_type_resolve(type_v);
    if (type_k < 0 || type_k >= KVP_KV_COUNT || type_v < 0 || type_v >= KVP_KV_COUNT)
        return kvp_err_set(err, KVP_EINVAL, "unknown KV cache types %d, %d", type_k, type_v);
    c->type_k = type_k;
    c->type_v = type_v;
    c->kk = kvp_kv_kernels(type_k);
    c->vk = kvp_kv_kernels(type_v);
    c->k_bytes = kvp_kv_block_bytes(type_k, head_dim, block_size);
    c->v_bytes = kvp_kv_block_bytes(type_v, head_dim, block_size);
    c->n_layer = n_layer;
    c->n_head_kv = n_head_kv;
    c->head_dim = head_dim;
    c->block_size = block_size;
    c->max_blocks = (n_ctx + block_size - 1) / block_size;
    c->external = external;
    c->release = true;
    c->compact = true;
    pthread_mutex_init(&c->pool_lock, NULL);
    size_t n_lh = (size_t)n_layer * n_head_kv, n_tab, k_all, v_all;
    if (!kvp_mul_ok(n_lh, (size_t)c->max_blocks, &n_tab) || n_tab > INT32_MAX ||
        !kvp_mul_ok(n_tab, c->k_bytes, &k_all) || !kvp_mul_ok(n_tab, c->v_bytes, &v_all))
        return kvp_err_set(err, KVP_ENOMEM, "KV cache size overflows");
    c->n_pool = external ? 0 : (int)n_tab;
    if (window) {
        /* a windowed layer's heads hold their ring only (kvcache.h); with a tiered store, the
         * pool holds the rings alone and the store the other layers */
        c->ring = calloc((size_t)n_layer, sizeof(int32_t));
        c->ring_end = calloc((size_t)n_layer, sizeof(int32_t));
        if (!c->ring || !c->ring_end) {
            kvp_kvcache_free(c);
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        }
        size_t pool = 0;
        for (int l = 0; l < n_layer; l++) {
            if (window[l] > 0)
                c->ring[l] = kvp_kvcache_ring_blocks(window[l], n_batch, block_size,
                                                     c->max_blocks);
            pool += (size_t)n_head_kv * (c->ring[l]   ? (size_t)c->ring[l]
                                         : external ? 0
                                                    : (size_t)c->max_blocks);
        }
        c->n_pool = (int)pool;
        if (!kvp_mul_ok(pool, c->k_bytes, &k_all) || !kvp_mul_ok(pool, c->v_bytes, &v_all))
            return kvp_err_set(err, KVP_ENOMEM, "KV cache size overflows");
    }
    const bool own_pool = !external || c->n_pool > 0;
    if (own_pool) {
        c->k_pool = kvp_alloc_huge(k_all, 64);
        c->v_pool = kvp_alloc_huge(v_all, 64);
    }
    c->table = malloc(n_tab * sizeof(int32_t));
    c->evicted = calloc(n_tab, sizeof(uint64_t));
    c->n_evicted = calloc(n_lh, sizeof(int32_t));
    c->released = calloc(n_lh, sizeof(int32_t));
    c->free_stack = malloc(n_tab * sizeof(int32_t));
    c->compact_limit = calloc(n_lh, sizeof(int32_t));
    c->pools = calloc((size_t)n_layer, sizeof(*c->pools));
    if (!external)
        c->pos = malloc(n_tab * block_size * sizeof(int32_t));
    if ((own_pool && (!c->k_pool || !c->v_pool)) || (!external && !c->pos) || !c->table ||
        !c->evicted ||
        !c->n_evicted || !c->released || !c->free_stack || !c->compact_limit || !c->pools) {
        kvp_kvcache_free(c);
        return kvp_err_set(err, KVP_ENOMEM, "cannot allocate the KV cache (%zu MiB)",
                           (k_all + v_all) >> 20);
    }
    /* zero so the unused tail of a partial block holds finite values (it is masked anyway) */
    if (own_pool) {
        memset(c->k_pool, 0, k_all);
        memset(c->v_pool, 0, v_all);
        for (int l = 0; l < n_layer; l++) /* an external cache's other layers: the store's */
            if (!external || c->ring[l])
                c->pools[l] = (struct kvp_kvpool){.k = c->k_pool, .v = c->v_pool,
                                                  .k_unit = c->k_bytes, .v_unit = c->v_bytes};
    }
    for (size_t i = 0; i < n_tab; i++)
        c->table[i] = -1;
    kvp_kvcache_clear(c);
    return 0;
}

int kvp_kvcache_init(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                     int block_size, int n_ctx, int type_k, int type_v, struct kvp_err *err)
{
    return kvcache_init(c, n_layer, n_head_kv, head_dim, block_size, n_ctx, type_k, type_v,
                        false, NULL, 0, err);
}

int kvp_kvcache_init_external(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                              int block_size, int n_ctx, int type_k, int type_v,
                              struct kvp_err *err)
{
    return kvcache_init(c, n_layer, n_head_kv, head_dim, block_size, n_ctx, type_k, type_v,
                        true, NULL, 0, err);
}

int kvp_kvcache_init_windowed(struct kvp_kvcache *c, int n_layer, int n_head_kv, int head_dim,
                              int block_size, int n_ctx, int type_k, int type_v,
                              const int *window, int n_batch, bool external,
                              struct kvp_err *err)
{
    return kvcache_init(c, n_layer, n_head_kv, head_dim, block_size, n_ctx, type_k, type_v,
                        external, window, n_batch > 0 ? n_batch : 1, err);
}

int kvp_kvcache_ring_advance(struct kvp_kvcache *c, int n_tokens, struct kvp_err *err)
{
    if (!c->ring)
        return 0;
    int n_blocks = (n_tokens + c->block_size - 1) / c->block_size;
    if (n_blocks > c->max_blocks)
        n_blocks = c->max_blocks;
    for (int l = 0; l < c->n_layer; l++) {
        const int R = c->ring[l];
        if (!R || c->ring_end[l] >= n_blocks)
            continue;
        for (int h = 0; h < c->n_head_kv; h++) {
            int lh = kvp_kvcache_lh(c, l, h);
            int32_t *tab = c->table + (size_t)lh * c->max_blocks;
            for (int b = c->ring_end[l]; b < n_blocks; b++) {
                if (tab[b] >= 0)
                    continue;
                if (b >= R && tab[b - R] >= 0) { /* the block no query sees any more */
                    tab[b] = tab[b - R];
                    tab[b - R] = -1;
                    c->released[lh]++;
                } else { /* the live blocks stay within [b - R + 1, b]: the pool has room */
                    if (c->n_free == 0)
                        return kvp_err_set(err, KVP_ENOMEM, "KV block pool exhausted");
                    tab[b] = c->free_stack[--c->n_free];
                }
            }
        }
        c->ring_end[l] = n_blocks;
    }
    return 0;
}

void kvp_kvcache_attach(struct kvp_kvcache *c, int layer, struct kvp_kvpool pool)
{
    c->pools[layer] = pool;
}

void kvp_kvcache_free(struct kvp_kvcache *c)
{
    if (!c)
        return;
    kvp_free_aligned(c->k_pool); /* NULL when the store holds every layer */
    kvp_free_aligned(c->v_pool);
    free(c->table);
    free(c->evicted);
    free(c->n_evicted);
    free(c->released);
    free(c->free_stack);
    free(c->compact_limit);
    free(c->pos);
    free(c->pools);
    free(c->ring);
    free(c->ring_end);
    pthread_mutex_destroy(&c->pool_lock);
    memset(c, 0, sizeof(*c));
}

void kvp_kvcache_clear(struct kvp_kvcache *c)
{
    size_t n_lh = (size_t)c->n_layer * c->n_head_kv;
    size_t n_tab = n_lh * c->max_blocks;
    /* an external cache's other layers are mapped by the store (store.h) */
    for (size_t lh = 0; lh < n_lh; lh++)
        if (!c->external || (c->ring && c->ring[lh / c->n_head_kv]))
            for (int b = 0; b < c->max_blocks; b++)
                c->table[lh * c->max_blocks + b] = -1;
    memset(c->evicted, 0, n_tab * sizeof(uint64_t));
    memset(c->n_evicted, 0, n_lh * sizeof(int32_t));
    memset(c->released, 0, n_lh * sizeof(int32_t));
    memset(c->compact_limit, 0, n_lh * sizeof(int32_t)); /* every slot is its position again */
    if (c->ring_end)
        memset(c->ring_end, 0, (size_t)c->n_layer * sizeof(int32_t));
    /* pop order 0, 1, 2, ...: physical blocks fill the pool front to back */
    c->n_free = c->n_pool;
    c->reserved_blocks = 0;
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

/* Give the physical block in a table slot back to the pool (the caller checked one is there). */
static void free_block(struct kvp_kvcache *c, int32_t *slot)
{
    pthread_mutex_lock(&c->pool_lock);
    c->free_stack[c->n_free++] = *slot;
    pthread_mutex_unlock(&c->pool_lock);
    *slot = -1;
}

/* Drop the tokens of positions >= n_tokens that compaction moved below n_tokens; the slots from
 * n_tokens on will hold their own positions again. */
static void truncate_compacted(struct kvp_kvcache *c, int lh, int n_tokens)
{
    int bs = c->block_size, lim = c->compact_limit[lh];
    if (lim == 0)
        return;
    const int32_t *pos = c->pos + (size_t)lh * c->max_blocks * bs;
    uint64_t *ev = c->evicted + (size_t)lh * c->max_blocks;
    for (int s = 0; s < lim && s < n_tokens; s++) {
        uint64_t bit = 1ULL << (s % bs);
        if (pos[s] >= n_tokens && !(ev[s / bs] & bit)) {
            ev[s / bs] |= bit;
            c->n_evicted[lh]++;
        }
    }
    c->compact_limit[lh] = lim < n_tokens ? lim : n_tokens;
}

bool kvp_kvcache_has_evicted(const struct kvp_kvcache *c)
{
    for (int i = 0; i < c->n_layer * c->n_head_kv; i++)
        if (c->n_evicted[i] > 0 || c->released[i] > 0)
            return true;
    return false;
}

bool kvp_kvcache_truncate_keeps(const struct kvp_kvcache *c, int n_tokens)
{
    if (!c->ring)
        return true;
    int last = (n_tokens + c->block_size - 1) / c->block_size; /* blocks holding [0, n_tokens) */
    for (int l = 0; l < c->n_layer; l++) {
        if (!c->ring[l])
            continue;
        int lo = last > c->ring[l] ? last - c->ring[l] : 0;
        int hi = last < c->ring_end[l] ? last : c->ring_end[l];
        for (int h = 0; h < c->n_head_kv; h++) {
            const int32_t *tab = c->table + ((size_t)l * c->n_head_kv + h) * c->max_blocks;
            for (int b = lo; b < hi; b++)
                if (tab[b] < 0)
                    return false;
        }
    }
    return true;
}

void kvp_kvcache_truncate(struct kvp_kvcache *c, int n_tokens)
{
    int bs = c->block_size;
    int first_gone = (n_tokens + bs - 1) / bs; /* blocks wholly past the end */
    /* the block holding the cut may have been freed fully evicted and now holds live tokens */
    if (c->reserved_blocks > n_tokens / bs)
        c->reserved_blocks = n_tokens / bs;
    for (int lh = 0; lh < c->n_layer * c->n_head_kv; lh++) {
        int32_t *tab = c->table + (size_t)lh * c->max_blocks;
        uint64_t *ev = c->evicted + (size_t)lh * c->max_blocks;
        if (c->external && !(c->ring && c->ring[lh / c->n_head_kv]))
            continue; /* the store's (kvp_store_truncate) */
        truncate_compacted(c, lh, n_tokens);
        for (int b = 0; b < c->max_blocks; b++) {
            uint64_t keep = b < n_tokens / bs ? ~0ULL
                            : b == n_tokens / bs ? ((1ULL << (n_tokens % bs)) - 1) : 0;
            c->n_evicted[lh] -= count_bits(ev[b] & ~keep);
            ev[b] &= keep;
            if (b >= first_gone && tab[b] >= 0)
                free_block(c, &tab[b]);
        }
        if (c->ring && c->ring[lh / c->n_head_kv]) {
            /* a ring: the blocks it released below the cut stay released */
            int l = lh / c->n_head_kv, rel = 0;
            if (c->ring_end[l] > first_gone)
                c->ring_end[l] = first_gone;
            for (int b = 0; b < c->ring_end[l]; b++)
                rel += tab[b] < 0;
            c->released[lh] = rel;
            continue;
        }
        /* fully evicted blocks stay freed only below the cut; those truncate_compacted emptied
         * are freed now (a full block lies wholly below the cut: nothing is written there) */
        int rel = 0;
        for (int b = 0; b < first_gone; b++) {
            if ((ev[b] & full_mask(c)) != full_mask(c))
                continue;
            rel++;
            if (c->release && tab[b] >= 0)
                free_block(c, &tab[b]);
        }
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
        if (c->ring && c->ring[lh / c->n_head_kv])
            continue; /* mapped pass by pass (kvp_kvcache_ring_advance) */
        for (int b = c->reserved_blocks; b < n_blocks; b++) {
            if (tab[b] >= 0 || (ev[b] & full_mask(c)) == full_mask(c))
                continue; /* present, or freed after full eviction */
            if (c->n_free == 0)
                return kvp_err_set(err, KVP_ENOMEM, "KV block pool exhausted");
            tab[b] = c->free_stack[--c->n_free];
        }
    }
    /* below n_blocks a block only leaves the table fully evicted (which it stays) or by a
     * truncate, which lowers this mark */
    if (n_blocks > c->reserved_blocks)
        c->reserved_blocks = n_blocks;
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
    if (c->release && *slot >= 0)
        free_block(c, slot);
}

/* Slot to of lh takes the token of slot from (K column, V row, position, masks). */
static void move_token(struct kvp_kvcache *c, int lh, int from, int to)
{
    const int bs = c->block_size, hd = c->head_dim;
    const int32_t *tab = c->table + (size_t)lh * c->max_blocks;
    uint64_t *ev = c->evicted + (size_t)lh * c->max_blocks;
    int32_t *pos = c->pos + (size_t)lh * c->max_blocks * bs;
    const struct kvp_kvpool *pl = &c->pools[lh / c->n_head_kv];
    int tf = from % bs, tt = to % bs;
    kvp_kv_copy_key(c->type_k, hd, bs, pl->k + kvp_kvpool_off(pl, tab[from / bs], pl->k_unit), tf,
                    pl->k + kvp_kvpool_off(pl, tab[to / bs], pl->k_unit), tt);
    kvp_kv_copy_value(c->type_v, hd, bs,
                      pl->v + kvp_kvpool_off(pl, tab[from / bs], pl->v_unit), tf,
                      pl->v + kvp_kvpool_off(pl, tab[to / bs], pl->v_unit), tt);
    pos[to] = pos[from];
    ev[to / bs] &= ~(1ULL << tt);
    ev[from / bs] |= 1ULL << tf;
}

/* Is slot s of lh a held (not released) slot whose token is evicted (want_hole) or live? */
static bool slot_is(const struct kvp_kvcache *c, int lh, int s, bool want_hole)
{
    int bs = c->block_size;
    size_t i = (size_t)lh * c->max_blocks + s / bs;
    if (c->table[i] < 0)
        return false;
    return ((c->evicted[i] >> (s % bs)) & 1) == want_hole;
}

int kvp_kvcache_compact(struct kvp_kvcache *c, int layer, int kvh, int limit, int n_tokens,
                        kvp_kvcache_move_fn move, void *user)
{
    const int bs = c->block_size, lh = kvp_kvcache_lh(c, layer, kvh);
    int newest_start = (n_tokens - 1) / bs * bs;
    limit = (limit < newest_start ? limit : newest_start) / bs * bs;
    if (c->external || !c->compact || limit <= 0)
        return 0;
    if (limit > c->compact_limit[lh]) {
        /* the new part of the region starts out with every slot holding its own position */
        int32_t *pos = c->pos + (size_t)lh * c->max_blocks * bs;
        for (int s = c->compact_limit[lh]; s < limit; s++)
            pos[s] = s;
        c->compact_limit[lh] = limit;
    }
    if (!c->release)
        return 0; /* measuring: data stays, kvp_kvcache_resident_bytes accounts the rest */
    /* two fingers: the lowest hole and the highest live token; whole blocks without a hole
     * (going up) or released (going down) are skipped at once, so a step costs O(blocks) */
    int32_t *tab = c->table + (size_t)lh * c->max_blocks;
    const uint64_t *ev = c->evicted + (size_t)lh * c->max_blocks;
    const uint64_t full = full_mask(c);
    int lo = 0, hi = limit - 1;
    for (;;) {
        while (lo < hi && !slot_is(c, lh, lo, true)) {
            bool no_hole = tab[lo / bs] < 0 || (ev[lo / bs] & full) == 0;
            lo = lo % bs == 0 && no_hole ? lo + bs : lo + 1;
        }
        while (hi > lo && !slot_is(c, lh, hi, false)) {
            bool no_live = tab[hi / bs] < 0 || (ev[hi / bs] & full) == full;
            hi = hi % bs == bs - 1 && no_live ? hi - bs : hi - 1;
        }
        if (lo >= hi)
            break;
        move_token(c, lh, hi, lo);
        if (move)
            move(user, hi, lo);
    }
    int freed = 0;
    for (int b = 0; b < limit / bs; b++)
        if (tab[b] >= 0 && (ev[b] & full) == full) {
            free_block(c, &tab[b]);
            c->released[lh]++;
            freed++;
        }
    return freed;
}

size_t kvp_kvcache_pool_bytes(const struct kvp_kvcache *c)
{
    return (size_t)(c->n_pool - c->n_free) * kvp_kvcache_block_bytes(c);
}

/* Blocks a measurement run's compacted region [0, compact_limit) of lh would hold once
 * compacted, ceil(live / bs), minus the blocks of the region with live tokens (those the
 * released counter leaves counted): <= 0. */
static long compaction_saving(const struct kvp_kvcache *c, int lh)
{
    const int bs = c->block_size, nb = c->compact_limit[lh] / bs;
    const uint64_t *ev = c->evicted + (size_t)lh * c->max_blocks;
    long live = 0, held = 0;
    for (int b = 0; b < nb; b++) {
        int n = bs - count_bits(ev[b] & full_mask(c));
        live += n;
        held += n > 0;
    }
    return (live + bs - 1) / bs - held;
}

size_t kvp_kvcache_resident_bytes(const struct kvp_kvcache *c, int n_tokens)
{
    long blocks = (n_tokens + c->block_size - 1) / c->block_size;
    long live = 0;
    for (int lh = 0; lh < c->n_layer * c->n_head_kv; lh++) {
        live += blocks - c->released[lh];
        if (!c->release)
            live += compaction_saving(c, lh);
    }
    return (size_t)live * kvp_kvcache_block_bytes(c);
}

size_t kvp_kvcache_ring_resident_bytes(const struct kvp_kvcache *c, int n_tokens)
{
    long blocks = (n_tokens + c->block_size - 1) / c->block_size;
    long live = 0;
    for (int lh = 0; c->ring && lh < c->n_layer * c->n_head_kv; lh++)
        if (c->ring[lh / c->n_head_kv]) /* rings are never compacted */
            live += blocks - c->released[lh];
    return (size_t)live * kvp_kvcache_block_bytes(c);
}

size_t kvp_kvcache_kept_bytes(const struct kvp_kvcache *c, int n_tokens)
{
    size_t kept = 0;
    for (int lh = 0; lh < c->n_layer * c->n_head_kv; lh++)
        kept += (size_t)(n_tokens - c->n_evicted[lh]);
    return kept * kvp_kvcache_block_bytes(c) / (size_t)c->block_size;
}
