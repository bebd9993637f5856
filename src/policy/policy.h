/*
 * KV selection policies: the framework every policy plugs into.
 *
 * At every decode step, for every compressed layer (layers >= dense_layers) and every KV head, a
 * policy chooses which KV blocks attention reads, with an optional token mask inside each block
 * for policies that work per token. Evicting policies also evict tokens for good (kvcache.h):
 * evicted tokens are never read again and their blocks go back to the pool once empty.
 *
 * The forward pass calls three hooks:
 *   on_prefill  once per layer after a multi-token eval (the prompt): the attention rows of the
 *               last `window` prompt queries and, if asked for, the column sums of the whole
 *               prompt's attention, so prompt-time policies need no second pass;
 *   select      before each decode step's attention, per (layer, KV head);
 *   on_step     after it, with the probabilities the step computed over the selection.
 * select and on_step of different KV heads run concurrently on different threads; a policy keeps
 * per-(layer, KV head) state and touches nothing shared in them.
 *
 * Budget semantics (methods.md §4): `budget` counts tokens per (layer, KV head) and includes the
 * sink and local windows; budget_ratio (0 < r <= 1) makes it r × the current context instead.
 * GQA: one selection per KV head; scores of the g query heads of a group are combined with
 * gqa_agg (max, mean or sum of probabilities). Adding a policy = one policy_NAME.c file defining
 * a `const struct kvp_policy_ops kvp_policy_NAME` and one line in registry.c.
 */
#ifndef KVP_POLICY_POLICY_H
#define KVP_POLICY_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "kvpred.h"

struct kvp_kvcache;

/* One (layer, KV head) selection: logical blocks in ascending order, each with the mask of its
 * tokens to read (bit t = token blk*bs + t). Evicted tokens and tokens past the end are removed
 * by the attention kernel whatever the mask says. */
struct kvp_sel {
    int n;             /* selected blocks */
    int32_t *blocks;   /* [max_blocks] ascending logical block ids (owned by the context) */
    uint64_t *mask;    /* [max_blocks] token masks, parallel to blocks */
};

/* What a policy is told about the model and the context when it is created. */
struct kvp_policy_env {
    int n_layer, n_head, n_head_kv, head_dim;
    int block_size;
    int n_ctx;
    struct kvp_kvcache *kv; /* borrowed: the cache (read keys, evict) */
};

/* Prefill observation of one layer, for every query head h:
 *   obs[h][i][j]: attention of prompt query n_prompt - n_obs + i to key j (j < n_prompt),
 *                 causal, rows sum to 1; n_obs = min(window, n_prompt);
 *   colsum[h][j]: sum over all prompt queries of their attention to key j (NULL unless the
 *                 policy asked for it). */
struct kvp_prefill_obs {
    int n_prompt;
    int n_obs;
    const float *obs;      /* [n_head][n_obs][n_prompt] */
    const float *colsum;   /* [n_head][n_prompt] or NULL */
};

/* A policy instance. */
struct kvp_policy {
    const struct kvp_policy_ops *ops;
    struct kvp_policy_params p;  /* resolved parameters (defaults filled in) */
    struct kvp_policy_env env;
    void *state;                 /* owned by the policy */
};

struct kvp_policy_ops {
    const char *name;
    const char *help;           /* one line for --help */
    bool evicting;              /* evicts tokens for good (memory falls with the budget) */
    bool wants_obs;             /* on_prefill needs the observation window's attention rows */
    bool wants_colsum;          /* on_prefill needs the prompt's attention column sums */
    /* Set up p->state. Called once; p->p and p->env are filled. */
    int (*init)(struct kvp_policy *p, struct kvp_err *err);
    void (*free)(struct kvp_policy *p);
    /* A new sequence starts (the cache was cleared). */
    void (*reset)(struct kvp_policy *p);
    /* Called once per layer at the end of a multi-token eval. May evict. */
    void (*on_prefill)(struct kvp_policy *p, int layer, const struct kvp_prefill_obs *obs);
    /* Choose blocks for (layer, kvh). q holds the g = n_head/n_head_kv query vectors of the group
     * after RoPE ([g][head_dim]); n_tokens counts every cached token including the current one
     * (position n_tokens - 1). */
    void (*select)(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                   struct kvp_sel *sel);
    /* After attention of (layer, kvh): probs[j][i*bs + t] is the probability query head j of the
     * group gave token blocks[i]*bs + t (0 for tokens not read). May evict. */
    void (*on_step)(struct kvp_policy *p, int layer, int kvh, const struct kvp_sel *sel,
                    const float *probs, int probs_stride, int n_tokens);
    /* Optional, for the tiered store's prefetching (src/store/store.h, methods.md §1.9): the
     * blocks the next select of (layer, kvh) is expected to read, for a step with n_tokens_next
     * tokens, without that step's query. Called after on_step of the current step (cross-token
     * prefetching) or, for cross-layer prefetching, before the step's select of the layer; same
     * threading rules as select; must not change what select will return. NULL: the store
     * prefetches the last selection of the same (layer, KV head) (re-access). */
    void (*predict_next)(struct kvp_policy *p, int layer, int kvh, int n_tokens_next,
                         struct kvp_sel *sel);
};

/* Registry (registry.c): NULL-terminated table of every policy. */
extern const struct kvp_policy_ops *const kvp_policy_registry[];
const struct kvp_policy_ops *kvp_policy_find(const char *name);

/* ---- helpers shared by the policy files (select_util.c) ---- */

/* Token budget for a context of n_tokens: p->budget, or budget_ratio × n_tokens; at least
 * sink + local. */
int kvp_policy_budget(const struct kvp_policy *p, int n_tokens);

/* Select every block of [0, n_tokens) with full masks. */
void kvp_sel_all(struct kvp_sel *sel, int n_tokens, int block_size);

/* Add token range [begin, end) to a selection being built in a dense per-block mask array
 * masks[max_blocks] (zeroed by the caller), then kvp_sel_from_masks turns it into the sparse
 * list. */
void kvp_mask_add_range(uint64_t *masks, int begin, int end, int block_size);
void kvp_sel_from_masks(struct kvp_sel *sel, const uint64_t *masks, int n_blocks);

/* Indices of the k largest of x[0..n), ties to the lower index, written to out in ascending
 * index order. scratch holds n ints. */
void kvp_topk_indices(const float *x, int n, int k, int *out, int *scratch);

/* Combine g rows (stride apart) of n values into out with agg (KVP_AGG_MAX/MEAN/SUM). */
void kvp_gqa_combine(const float *rows, int g, int stride, int n, int agg, float *out);

#endif
