/*
 * Quest's per-block key metadata (docs/methods.md §3.5), shared by the `quest` policy,
 * the query-aware predictor `qpredictor` and the trace recorder: for every (layer, KV head) and
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
 * the query heads of a group share each load. With an f16 key cache (the default) the keys, and
 * so their maxima and minima, are f16 values: those tiles hold f16 ([tile][d][max|min] of
 * uint16, 2 KB per tile), converted back exactly, so the bounds are still bit-identical and the
 * pass reads half the bytes (at long context it streams the metadata from memory, the KV reads
 * having evicted it).
 */
#ifndef KVP_POLICY_QUEST_META_H
#define KVP_POLICY_QUEST_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_kvcache;

#define KVP_QMETA_TILE 16 /* blocks per metadata tile: one AVX-512 vector of f32 */
#define KVP_QMETA_SEL_HD    256 /* head dimensions and query heads of a group the one-product */
#define KVP_QMETA_SEL_HEADS 16  /* path of the bound takes (quest_meta.c) */

struct kvp_qmeta {
    int n_lh, max_blocks, head_dim, block_size, n_tiles;
    float *tiles; /* [n_lh][n_tiles][head_dim][2][KVP_QMETA_TILE] max then min, f32 or (half)
                     f16 tiles of half the size from the same (layer, KV head) start (owned) */
    int *done;    /* [n_lh] tokens folded in */
    bool *half;   /* [n_lh] f16 tiles (set by the fold from the cache's key type) */
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

/* Tile t of (layer, KV head) lh: f32 or, half[lh], f16 values. */
static inline void *kvp_qmeta_tile(const struct kvp_qmeta *m, int lh, int t)
{
    const size_t per = (size_t)m->head_dim * 2 * KVP_QMETA_TILE; /* values per tile */
    return (char *)(m->tiles + (size_t)lh * m->n_tiles * per) +
           (size_t)t * per * (m->half[lh] ? sizeof(uint16_t) : sizeof(float));
}
/* Every dimension of block blk's max and min (as float), into mx[head_dim] and mn[head_dim]. */
void kvp_qmeta_block(const struct kvp_qmeta *m, int lh, int blk, float *mx, float *mn);
/* Dimension d of block blk's max and min (as float). */
float kvp_qmeta_max(const struct kvp_qmeta *m, int lh, int blk, int d);
float kvp_qmeta_min(const struct kvp_qmeta *m, int lh, int blk, int d);

/* For each of the g queries q[j] (head_dim floats apart): out[j·stride + b - b0] =
 * bound(q[j], block b) · scale for b in [b0, b1) (scale 1 gives quest's value exactly). */
void kvp_qmeta_bounds(const struct kvp_qmeta *m, int lh, const float *q, int g, float scale,
                      int b0, int b1, float *out, int stride);

/* The coarse level (coarse-to-fine selection, src/policy/coarse_sel.h): a second kvp_qmeta whose
 * "blocks" are groups of G consecutive blocks, each holding the element-wise max and min of its
 * blocks' maxima and minima (the same values a fold of the group's keys would give, f16 where the
 * blocks are). As the bound is monotone in every term (products with a fixed q_d, then sums in a
 * fixed order, each step rounded monotonically), a group's bound is >= the bound of each of its
 * blocks computed by the same kernel, which is what makes skipping a group exact. Derived from
 * the blocks, never from the keys, so a tiered store is never asked for cold blocks. 0, or -1 out
 * of memory or G < 1 (nothing left allocated). */
int kvp_qmeta_group_init(struct kvp_qmeta *grp, const struct kvp_qmeta *blk, int G);
/* Bring lh's groups up to the blocks' state after blk was folded to n_tokens: appended tokens
 * widen only the groups their blocks are in (one group per decode step); a cut below what was
 * done (a truncated context) or a rebuild of the blocks (done restarted) rebuilds the groups from
 * the blocks. */
void kvp_qmeta_group_update(struct kvp_qmeta *grp, const struct kvp_qmeta *blk, int lh,
                            int n_tokens);

/* The same in two steps, for callers that bound many ranges with one query (the coarse-to-fine
 * pass): what the query decides once (the row of each term), then the bounds of a range. qq is
 * valid while q is, with any kvp_qmeta of the same head_dim. */
struct kvp_qmeta_query {
    const float *q;
    int g;
    float scale;
    bool signed_q; /* no q_d is zero or NaN: one product per term, from sel */
    uint8_t sel[KVP_QMETA_SEL_HEADS][KVP_QMETA_SEL_HD];
};
void kvp_qmeta_query_prep(const struct kvp_qmeta *m, struct kvp_qmeta_query *qq, const float *q,
                          int g, float scale);
void kvp_qmeta_bounds_q(const struct kvp_qmeta *m, int lh, const struct kvp_qmeta_query *qq,
                        int b0, int b1, float *out, int stride);

/* Internal (quest_meta_avx512.c): G <= 4 heads' scaled bounds over n_tiles consecutive f16
 * tiles, each term from the row sel[j][d] (0: max, KVP_QMETA_TILE: min), head j's bound of
 * block 16·t + i of the run into out[j·ostride + 16·t + i]. */
void kvp_qmeta_tiles_sel_f16_avx512(const uint16_t *tile, int n_tiles, int hd, const float *q,
                                    int G, const uint8_t (*sel)[KVP_QMETA_SEL_HD], float scale,
                                    float *out, int ostride);
/* The same with NEON (quest_meta_neon.c, aarch64 builds only). */
void kvp_qmeta_tiles_sel_f16_neon(const uint16_t *tile, int n_tiles, int hd, const float *q, int G,
                                  const uint8_t (*sel)[KVP_QMETA_SEL_HD], float scale, float *out,
                                  int ostride);

#endif
