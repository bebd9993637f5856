/*
 * Attention kernels over the block-paged KV cache, for one KV head group at a time: pure
 * functions of the cache, the queries and a selection (no context, no policy, no store).
 *
 * Dense: the query heads of the group are scored against every cached block (keys transposed
 * in the block, SIMD over the block's tokens), a softmax turns the scores into probabilities,
 * and the value rows are accumulated (SIMD over the head dimension). At long context this
 * kernel dominates decode time: it streams K and V once and touches nothing else.
 *
 * Sparse: the same over the blocks a policy selected, with a token mask per block; the softmax
 * is renormalised over the selection. Each selected block is reduced on its own (its max score,
 * exp-sum and value sum) and the blocks are folded in selection order, so a tiered store can
 * have the hot blocks reduced while its misses are read and still get the bits of the untiered
 * cache (struct kvp_attn_blocks). A selection of every readable token is computed by the dense
 * kernel, so it has the dense result's bits.
 */
#ifndef KVP_KV_ATTENTION_H
#define KVP_KV_ATTENTION_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/fastmath.h"
#include "kv/kvcache.h"
#include "kv/sel.h"

/* Soft-capping of n scores (kvcache.h, score_cap): s -> cap·tanh(s / cap); nothing when cap is
 * 0. Monotone, so a ranking of scores (or of bounds on them, quest's) is the same before and
 * after; the softmax is what changes. */
static inline void kvp_attn_softcap(float *s, int n, float cap)
{
    if (cap <= 0.0f)
        return;
    const float inv = 1.0f / cap;
    for (int t = 0; t < n; t++)
        s[t] = cap * kvp_tanh_fast(s[t] * inv);
}

/* Dense attention of one KV head group over its first n_keys tokens (no token may have been
 * freed): q is [g][hd], probs [g][probs_stride] receives the probabilities (left unnormalised when
 * out is given: they are scratch for the output then), out [g][hd] (NULL:
 * probabilities only). */
void kvp_attn_dense_group(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                          int n_keys, float *probs, int probs_stride, float *out);

/* Dense attention of one KV head group over the keys [k0, k1) alone: a sliding-window layer's
 * (its ring holds the blocks of those keys only, kvcache.h) or any layer whose scores are
 * scaled by `scale` rather than 1/sqrt(head_dim). Reads blocks k0 / bs .. (k1 - 1) / bs through
 * the block table, so a ring's wrap is the table's business; the keys of the first block below
 * k0 weigh nothing. Scores soft-capped as the cache says (score_cap). q is [g][hd], probs
 * [g][probs_stride] is scratch (probs_stride >= the blocks read times bs), out [g][hd]. A block
 * without storage (none should be in a window) reads as absent. */
void kvp_attn_window_group(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                           int k0, int k1, float scale, float *probs, int probs_stride,
                           float *out);

/* The probs_stride kvp_attn_window_group needs for keys [k0, k1). */
static inline int kvp_attn_window_stride(int k0, int k1, int bs)
{
    return ((k1 + bs - 1) / bs - k0 / bs) * bs;
}

/* With an output (and the probabilities left as scratch) dense attention runs in chunks of
 * KVP_ATTN_CHUNK_BLOCKS blocks: each chunk's softmax state (per head its largest score m, its
 * sum of exp(score - m) and the value sum weighted by those) is computed on its own, and the
 * states are folded in chunk order. So a long context's chunks can be spread over threads
 * (kvp_attn_dense_chunk, then kvp_attn_dense_merge; a KV head per thread leaves one of two
 * threads idle a third of the time on three KV heads) with the bits of kvp_attn_dense_group,
 * which runs the same chunks one after another. Up to one chunk (2048 tokens at bs = 16) it
 * computes what the single softmax did, bit for bit. Groups whose state is larger than
 * KVP_ATTN_STATE_MAX floats keep the single softmax (kvp_attn_chunked). */
#define KVP_ATTN_CHUNK_BLOCKS 128
#define KVP_ATTN_STATE_MAX    4352

/* Floats of one chunk's state for g heads of hd dimensions: [g] maxima, [g] sums, [g][hd]. */
static inline size_t kvp_attn_state_floats(int g, int hd)
{
    return (size_t)g * (size_t)(hd + 2);
}

/* Whether a group of g heads of hd dimensions runs its dense attention in chunks. */
static inline bool kvp_attn_chunked(int g, int hd)
{
    return kvp_attn_state_floats(g, hd) <= KVP_ATTN_STATE_MAX;
}

/* The chunks of a dense attention over n_keys tokens in blocks of bs. */
static inline int kvp_attn_dense_chunks(int n_keys, int bs)
{
    const int nb = (n_keys + bs - 1) / bs;
    return (nb + KVP_ATTN_CHUNK_BLOCKS - 1) / KVP_ATTN_CHUNK_BLOCKS;
}

/* Chunk `chunk` of the dense attention of kvp_attn_dense_group: its scores into probs (the
 * chunk's columns only, so chunks of one group may run on different threads) and its state into
 * st (kvp_attn_state_floats(g, head_dim)). */
void kvp_attn_dense_chunk(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                          int n_keys, int chunk, float *probs, int probs_stride, float *st);

/* Fold the n states st[0..n) (each kvp_attn_state_floats(g, hd) apart, in chunk order; st[0] is
 * overwritten) and write the output out [g][hd]. */
void kvp_attn_dense_merge(float *st, int n, int g, int hd, float *out);

/* Per-block softmax state of sparse attention for one KV head group. Each selected block is
 * reduced on its own (its max score, the exp-sum and the exp-weighted value sum against that
 * max) and the blocks are then folded in selection order, so the output does not depend on
 * which blocks were reduced first: a tiered store has the blocks that are already hot reduced
 * while its misses are read (kvp_attn_sparse_early), and the result has the same bits as with
 * the whole cache in memory. */
struct kvp_attn_blocks {
    float *bmax;      /* [g][bmax_stride] max score of each selected block (scratch) */
    int bmax_stride;  /* >= the largest selection (max_blocks) */
    float *tmp;       /* [g][hd] one block's value sums */
    float *tmp_l;     /* [g] its exp-sums */
    /* blocks reduced by the early pass (cap 0: none is ever kept) */
    float *o;         /* [g][cap][hd] value sums */
    float *lsum;      /* [cap][g] exp-sums */
    int32_t *idx;     /* [cap] their selection indices, ascending */
    int n, cap;
    /* blocks reduced by kvp_attn_sparse_part, by selection index (pcap 0: that pass is off) */
    float *po;        /* [pcap][g][hd] value sums */
    float *pl;        /* [pcap][g] exp-sums */
    int pcap;
    bool parts;       /* set by the caller once kvp_attn_sparse_part reduced every block:
                         kvp_attn_sparse_group folds from po, pl (and clears it) */
    bool skip_probs;  /* set by the caller when nothing reads probs after kvp_attn_sparse_group
                         (no policy step hook, no measurement): they are left unnormalised */
    bool block_max;   /* set by the caller: kvp_attn_sparse_group leaves in bmax[j·bmax_stride
                         + i] the largest probability head j gave a token of selected block i (0
                         where none was read), equal to the bits of the largest of probs[j][i·bs
                         + t] when those are normalised (a step hook that needs no more than
                         that, with skip_probs, costs no pass over every token) */
};

/* Sparse attention over a selection: probs[j][i*bs + t] for selected block i (0 for tokens not
 * read; scratch when ab->skip_probs), out [g][hd]. Evicted tokens and tokens >= n_keys are never read. Blocks that
 * kvp_attn_sparse_early reduced into ab are taken from there (and ab is emptied). */
void kvp_attn_sparse_group(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                           int n_keys, const struct kvp_sel *sel, float *probs, int probs_stride,
                           struct kvp_attn_blocks *ab, float *out);

/* The early part of kvp_attn_sparse_group: reduce every selected block b with !pending[b] (up
 * to ab->cap of them) into ab, scores into probs. */
void kvp_attn_sparse_early(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                           int n_keys, const struct kvp_sel *sel, const uint8_t *pending,
                           float *probs, int probs_stride, struct kvp_attn_blocks *ab);

/* Reduce selected blocks [i0, i1) of sel (those the early pass did not already reduce) into
 * ab->po / ab->pl at their selection index, scores into probs; needs sel->n <= ab->pcap.
 * Calls for disjoint ranges of one selection may run on different threads at once (each
 * writes only its blocks' rows of probs, bmax, po and pl), so one group's blocks can be spread
 * over a pool. Once every block of [0, sel->n) is reduced (the calls joined), one caller sets
 * ab->parts and kvp_attn_sparse_group folds them in selection order, with the bits of the
 * single-threaded call. Nothing is done for a selection that does not fit
 * (kvp_attn_sparse_parts_fit). */
void kvp_attn_sparse_part(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                          int n_keys, const struct kvp_sel *sel, int i0, int i1, float *probs,
                          int probs_stride, struct kvp_attn_blocks *ab);

/* Whether kvp_attn_sparse_part can take sel (it fits ab and is not the dense road). */
bool kvp_attn_sparse_parts_fit(const struct kvp_kvcache *kv, int l, int kvh, int n_keys,
                               const struct kvp_sel *sel, const struct kvp_attn_blocks *ab);

#endif
