/*
 * Quest's per-block key metadata (methods.md §3.5), shared by the `quest` policy, the
 * query-aware predictor `qpredictor` and the trace recorder: for every (layer, KV head) and
 * block, the element-wise max and min of the block's keys after RoPE, folded in one token at a
 * time. 2 × head_dim floats per block and (layer, KV head): 1/8 of the keys at bs = 16.
 *
 * The bound of a query q over a block, Σ_d max(q_d·M_d, q_d·m_d), is >= q·k for every key k of
 * the block. The metadata is stored in tiles of KVP_QMETA_TILE = 16 blocks, each tile
 * dimension-major with the max and min rows of a dimension side by side
 * ([tile][d][max 16 | min 16] per (layer, KV head), 4 KB per tile at head_dim 32): one SIMD
 * lane per block, so each block's sum still adds its terms in the order d = 0, 1, ... (the bounds
 * are bit-identical to kvp_quest_bound's term-by-term loop, policy.h, on the same keys, whatever
 * the vector width), while the pass over the blocks reads one contiguous stream (the former
 * [d][block] rows were 2·head_dim streams max_blocks apart, more than a prefetcher follows) and
 * the query heads of a group share each load.
 */
#ifndef KVP_POLICY_QUEST_META_H
#define KVP_POLICY_QUEST_META_H

#include <stddef.h>

struct kvp_kvcache;

#define KVP_QMETA_TILE 16 /* blocks per metadata tile: one AVX-512 vector of f32 */

struct kvp_qmeta {
    int n_lh, max_blocks, head_dim, block_size, n_tiles;
    float *tiles; /* [n_lh][n_tiles][head_dim][2][KVP_QMETA_TILE] max then min (owned) */
    int *done;    /* [n_lh] tokens folded in */
};

/* 0, or -1 out of memory (nothing left allocated). */
int kvp_qmeta_init(struct kvp_qmeta *m, int n_layer, int n_head_kv, int max_blocks, int head_dim,
                   int block_size);
void kvp_qmeta_free(struct kvp_qmeta *m); /* accepts a zeroed struct */
void kvp_qmeta_reset(struct kvp_qmeta *m);

/* Fold the keys of tokens [done, n_tokens) of (layer, kvh) = lh into their blocks; a token at
 * offset 0 starts its block afresh, so done = 0 rebuilds. A context truncated below done (only a
 * decode step follows, with one new token) refolds the newest block from its start. */
void kvp_qmeta_fold(struct kvp_qmeta *m, const struct kvp_kvcache *kv, int layer, int kvh,
                    int n_tokens);
/* Forget what (layer, kvh) folded (the prompt is refolded from token 0). */
void kvp_qmeta_restart(struct kvp_qmeta *m, int lh);

/* Tile t of (layer, KV head) lh. */
static inline float *kvp_qmeta_tile(const struct kvp_qmeta *m, int lh, int t)
{
    return m->tiles + (((size_t)lh * m->n_tiles + t) * m->head_dim) * 2 * KVP_QMETA_TILE;
}
/* Dimension d of block blk's max and min. */
static inline float kvp_qmeta_max(const struct kvp_qmeta *m, int lh, int blk, int d)
{
    return kvp_qmeta_tile(m, lh, blk / KVP_QMETA_TILE)[(size_t)d * 2 * KVP_QMETA_TILE +
                                                        blk % KVP_QMETA_TILE];
}
static inline float kvp_qmeta_min(const struct kvp_qmeta *m, int lh, int blk, int d)
{
    return kvp_qmeta_tile(m, lh, blk / KVP_QMETA_TILE)[(size_t)d * 2 * KVP_QMETA_TILE +
                                                        KVP_QMETA_TILE + blk % KVP_QMETA_TILE];
}

/* For each of the g queries q[j] (head_dim floats apart): out[j·stride + b - b0] =
 * bound(q[j], block b) · scale for b in [b0, b1) (scale 1 gives quest's value exactly). */
void kvp_qmeta_bounds(const struct kvp_qmeta *m, int lh, const float *q, int g, float scale,
                      int b0, int b1, float *out, int stride);

#endif
