/*
 * Quest's per-block key metadata (methods.md §3.5), shared by the `quest` policy, the
 * query-aware predictor `qpredictor` and the trace recorder: for every (layer, KV head) and
 * block, the element-wise max and min of the block's keys after RoPE, folded in one token at a
 * time. 2 × head_dim floats per block and (layer, KV head): 1/8 of the keys at bs = 16.
 *
 * The bound of a query q over a block, Σ_d max(q_d·M_d, q_d·m_d), is >= q·k for every key k of
 * the block. The metadata is stored dimension-major ([d][block] per (layer, KV head)), so
 * kvp_qmeta_bounds runs along the blocks with SIMD vectors while each block's sum still adds its
 * terms in the order d = 0, 1, ...: the bounds are bit-identical to kvp_quest_bound's term-by-term
 * loop (policy.h) on the same keys, whatever the vector width.
 */
#ifndef KVP_POLICY_QUEST_META_H
#define KVP_POLICY_QUEST_META_H

#include <stddef.h>

struct kvp_kvcache;

struct kvp_qmeta {
    int n_lh, max_blocks, head_dim, block_size;
    float *kmax; /* [n_lh][head_dim][max_blocks] (owned) */
    float *kmin; /* [n_lh][head_dim][max_blocks] (owned) */
    int *done;   /* [n_lh] tokens folded in */
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

/* Dimension d of block blk's max and min. */
static inline float kvp_qmeta_max(const struct kvp_qmeta *m, int lh, int blk, int d)
{
    return m->kmax[((size_t)lh * m->head_dim + d) * m->max_blocks + blk];
}
static inline float kvp_qmeta_min(const struct kvp_qmeta *m, int lh, int blk, int d)
{
    return m->kmin[((size_t)lh * m->head_dim + d) * m->max_blocks + blk];
}

/* For each of the g queries q[j] (head_dim floats apart): out[j·stride + b - b0] =
 * bound(q[j], block b) · scale for b in [b0, b1) (scale 1 gives quest's value exactly). */
void kvp_qmeta_bounds(const struct kvp_qmeta *m, int lh, const float *q, int g, float scale,
                      int b0, int b1, float *out, int stride);

#endif
