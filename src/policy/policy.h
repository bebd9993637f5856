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
 * Budget semantics (docs/methods.md §4): `budget` counts tokens per (layer, KV head) and
 * includes the sink and local windows; budget_ratio (0 < r <= 1) makes it r × the current context
 * instead. GQA: one selection per KV head; scores of the g query heads of a group are combined with
 * gqa_agg (max, mean or sum of probabilities). Adding a policy = one policy_NAME.c file defining a
 * `const struct kvp_policy_ops kvp_policy_NAME` (with its option table, options.h, when it has
 * parameters of its own) and one line in registry.c. The forward pass never calls the hooks
 * directly: the policy host (host.h) creates the policy, owns its buffers, dispatches the hooks and
 * times them.
 */
#ifndef KVP_POLICY_POLICY_H
#define KVP_POLICY_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "kernels/topk.h" /* kvp_topk_indices, which every policy ranks with */
#include "kv/sel.h"
#include "kvpred.h"
#include "policy/options.h"

struct kvp_kvcache;
struct kvp_scratch;

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
 *                 policy asked for it); rows are env.n_ctx floats apart, the first n_prompt
 *                 are used;
 *   q_last[h]:    the query of the prompt's last token after RoPE (head_dim floats per head;
 *                 may be NULL), a stand-in for the first decode query in predict_next;
 *   first:        the cache's tokens [0, first) are those the policy saw at its previous
 *                 on_prefill or decode steps since (nothing cut them off and wrote others in
 *                 their place), so state kept per token or block below it still holds: a prompt
 *                 appended to a kept prefix (a server's follow-up question) need not be looked
 *                 at from token 0 again. 0: anything may have changed. */
struct kvp_prefill_obs {
    int n_prompt;
    int first;
    int n_obs;
    const float *obs;      /* [n_head][n_obs][n_prompt] */
    const float *colsum;   /* [n_head][env.n_ctx] or NULL */
    const float *q_last;   /* [n_head][head_dim] or NULL */
};

/* A policy instance. */
struct kvp_policy {
    const struct kvp_policy_ops *ops;
    struct kvp_policy_params p;  /* resolved parameters (defaults filled in) */
    struct kvp_policy_env env;
    void *state;                 /* owned by the policy */
    void *opt;                   /* the policy's option block (ops->opts_size bytes, from its
                                    table's defaults and p.opts; NULL without one), owned by
                                    the host */
    int prefetch_margin;         /* blocks per (layer, KV head) that predict_next may return
                                    beyond the budget; set by init (0 by default), the tiered
                                    store sizes its hot tier with it */
};

struct kvp_policy_ops {
    const char *name;
    const char *help;           /* one line for --help */
    bool evicting;              /* evicts tokens for good (memory falls with the budget) */
    bool wants_obs;             /* on_prefill needs the observation window's attention rows */
    bool wants_colsum;          /* on_prefill needs the prompt's attention column sums */
    bool needs_aux;             /* cannot run without p.aux_path ("all" lists skip it then) */
    bool block_plan;            /* selects k blocks of kvp_block_plan through kvp_sel_chosen:
                                   reads as many tokens as the block oracle, which bounds its
                                   recovery (test_eval checks it for every such policy) */
    bool step_block_max;        /* on_step reads each selected block's largest probability
                                   only: its probs[j·probs_stride + i] is the largest
                                   probability query head j gave a token of selected block i
                                   (0 where none was read), i < sel->n, which the attention has
                                   without normalising every token's */
    /* Its options (options.h): the table every way of setting them reads, and the bytes of
     * the block the table's KVP_OPT_BLOCK rows live in (0: none). */
    const struct kvp_policy_opt *opts;
    size_t opts_size;
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
     * group gave token blocks[i]*bs + t (0 for tokens not read); with step_block_max,
     * probs[j][i] the largest of block blocks[i]'s. May evict. */
    void (*on_step)(struct kvp_policy *p, int layer, int kvh, const struct kvp_sel *sel,
                    const float *probs, int probs_stride, int n_tokens);
    /* Optional, for the tiered store's prefetching (src/store/store.h, docs/methods.md
     * §1.9): the blocks the next select of (layer, kvh) is expected to read, for a step with
     * n_tokens_next tokens, without that step's query. Called after on_step of the current step
     * (cross-token prefetching), for cross-layer prefetching before the step's select of the layer,
     * and after on_prefill of the prompt's last micro-batch (for the first decode step); same
     * threading rules as select; must not change what select will return. NULL: the store
     * prefetches the last selection of the same (layer, KV head) (re-access). */
    void (*predict_next)(struct kvp_policy *p, int layer, int kvh, int n_tokens_next,
                         struct kvp_sel *sel);
    /* Optional: whether the next select of layer reads the keys of every block (the
     * AttentionPredictor's calibration rows). A tiered store whose cold tier is on disk then
     * reads the layer's cold blocks in before that select, so it sees what the untiered cache
     * would; without this hook select must read nothing but the newest block. */
    bool (*reads_all_keys)(const struct kvp_policy *p, int layer);
};

/* Registry (registry.c): NULL-terminated table of every policy. */
extern const struct kvp_policy_ops *const kvp_policy_registry[];
const struct kvp_policy_ops *kvp_policy_find(const char *name);

/* ---- helpers shared by the policy files (select_util.c) ---- */

/* The one rule that turns a budget into tokens, for every policy and every caller (the block
 * plan, token keep sets, CateKV's geometry, the tiered store's hot room, the measurements):
 * tokens per (layer, KV head) in a context of n_tokens: pp->budget, or budget_ratio x n_tokens
 * rounded down, or n_tokens when neither is set; at least sink + local (pp's resolved values;
 * negative ones count as 0). */
int kvp_budget_tokens(const struct kvp_policy_params *pp, int n_tokens);
/* kvp_budget_tokens of a policy's (resolved) parameters. */
int kvp_policy_budget(const struct kvp_policy *p, int n_tokens);

/* Select every block of [0, n_tokens) with full masks. */
void kvp_sel_all(struct kvp_sel *sel, int n_tokens, int block_size);

/* Add token range [begin, end) to a selection being built in a dense per-block mask array
 * masks[max_blocks] (zeroed by the caller), then kvp_sel_from_masks turns it into the sparse
 * list. */
void kvp_mask_add_range(uint64_t *masks, int begin, int end, int block_size);
void kvp_sel_from_masks(struct kvp_sel *sel, const uint64_t *masks, int n_blocks);

/* Combine g rows (stride apart) of n values into out with agg (KVP_AGG_MAX/MEAN/SUM). */
void kvp_gqa_combine(const float *rows, int g, int stride, int n, int agg, float *out);

/* ---- the forced set every policy shares ----
 *
 * Every policy keeps the first `sink` tokens and the most recent max(local, 1) tokens (the
 * current token is always read, so attention is never empty), and the budget counts both
 * (docs/methods.md §4). sink = -1 / local = -1 in the parameters turn them off (local
 * then still keeps the current token, or its block for block policies). */
int kvp_policy_recent(const struct kvp_policy *p);

/* Block selection plan for a context of n_tokens (quest, oracle, random, attnpred):
 *   forced tokens [0, sink) and [local_start, n_tokens). The local window is the last
 *   max(local, 1) tokens, moved down to the block boundary below its start when the budget can
 *   pay for the extra tokens (docs/methods.md §1.4 kvpred default: no gap and no overlap
 *   between the selected blocks and the window); otherwise it stays exact, and the rest of the
 *   block it starts in is not read; candidates: the whole blocks [first, end) between the sink and
 *   the local window (a sink that is not a multiple of bs leaves the rest of its last block
 *   unread); k = floor((budget - forced) / bs) candidates, at most end - first; what the k whole
 *   blocks leave of the budget (< bs tokens) goes to the tokens right below the local window that
 *   no chosen block holds (kvp_sel_chosen), so a plan that ranks reads exactly the budget, every
 *   block policy reads as many tokens as any other and as the block oracle (kvp_sel_best), which
 *   therefore bounds their recovery; all: the budget covers the context, so everything is read
 *   (reproduces full attention).
 * A selection never reads more than the budget (which kvp_policy_budget keeps >= sink + local),
 * so budgets are comparable across block and token policies (§4); the one exception is the
 * current token when local = 0 and the budget is exactly the sink. */
struct kvp_block_plan {
    int n_blocks;     /* ceil(n_tokens / bs) */
    int sink;         /* forced [0, sink) */
    int local_start;  /* forced [local_start, n_tokens), a multiple of bs */
    int left;         /* the budget the forced tokens and k whole blocks leave: what
                         kvp_sel_chosen spends below the local window (a caller that raises k
                         to predict more keeps it, so the prediction holds the selection) */
    int forced;       /* tokens in the two forced ranges */
    int first, end;   /* candidate blocks [first, end) */
    int k;            /* candidates to select, 0 <= k <= end - first */
    bool all;         /* budget >= n_tokens: select every block */
};
void kvp_block_plan(const struct kvp_policy *p, int n_tokens, struct kvp_block_plan *bp);

/* Apply a plan: the forced ranges plus the k best candidates by score[b] (indexed by block id;
 * only [first, end) is read), ties to the lower block. masks: [n_blocks] scratch; iscratch:
 * 2 * (end - first) ints. */
void kvp_sel_blocks(const struct kvp_block_plan *bp, const float *score, int n_tokens, int bs,
                    struct kvp_sel *sel, uint64_t *masks, int *iscratch);
/* The same selection, and the k + extra best candidates in keep[] (ascending block ids;
 * fscratch: k + extra floats); returns how many were kept, or -1 (nothing kept: extra <= 0,
 * keep NULL, or the plan ranks nothing or too few candidates). */
int kvp_sel_blocks_keep(const struct kvp_block_plan *bp, const float *score, int n_tokens, int bs,
                        struct kvp_sel *sel, uint64_t *masks, int *iscratch, int extra,
                        int32_t *keep, float *fscratch);
/* The forced ranges of a plan plus the candidate blocks chosen[0..n_chosen) (any order), and
 * the budget they leave on the tokens right below the local window that no chosen block holds.
 * kvp_sel_blocks and kvp_sel_blocks_keep end here, so every block policy reads the same number
 * of tokens at the same budget. masks: [n_blocks] scratch (ascending chosen blocks, all k of
 * the plan, take a path that does not touch it: its cost is then that of the chosen blocks,
 * not of the context). */
void kvp_sel_chosen(const struct kvp_block_plan *bp, const int32_t *chosen, int n_chosen,
                    int n_tokens, int bs, struct kvp_sel *sel, uint64_t *masks);

/* The block oracle's selection: of every selection the plan allows (k whole candidate blocks
 * and the fill kvp_sel_chosen adds), the one with the largest sum of score[t] (per token, e.g.
 * the true attention), so no block policy reading as many tokens recovers more. masks:
 * [n_blocks], left holding the selection's mask of every block; bscore: [n_blocks] floats; iscratch: 3 * (end - first) ints. */
void kvp_sel_best(const struct kvp_block_plan *bp, const float *score, int n_tokens, int bs,
                  struct kvp_sel *sel, uint64_t *masks, float *bscore, int *iscratch);

/* Token keep set (h2o, snapkv, pyramidkv, oracle_token): keep[b] (n_blocks masks, overwritten)
 * gets slots [0, sink) ∪ [max(n_tokens - recent, sink), n_tokens) plus the best
 * budget - |forced| tokens by score[t] among the live slots in between (ties to the lower
 * position, kvp_kvcache_pos once compaction moved tokens). Tokens evicted from kv (layer, kvh)
 * are not candidates; kv may be NULL. fscratch: n_tokens floats; iscratch: 3 * n_tokens ints. */
void kvp_keep_tokens(const float *score, int n_tokens, int sink, int recent, int budget,
                     const struct kvp_kvcache *kv, int layer, int kvh, int bs, uint64_t *keep,
                     float *fscratch, int *iscratch);

/* Evict every live token of (layer, kvh) in [0, n_tokens) whose keep bit is clear. */
void kvp_evict_unkept(struct kvp_kvcache *kv, int layer, int kvh, const uint64_t *keep,
                      int n_tokens);

/* Select every live token of (layer, kvh) in [0, n_tokens). masks: [n_blocks] scratch. */
void kvp_sel_resident(struct kvp_sel *sel, const struct kvp_kvcache *kv, int layer, int kvh,
                      int n_tokens, uint64_t *masks);

/* SnapKV score of one KV head (docs/methods.md §3.3) from a prefill observation: for each
 * query head j of the group (first_head + j, j < g), s_j[t] = sum over the n_obs window rows of
 * their attention to t, for the past positions t < n_prompt - n_obs; combined over the group with
 * agg, then pooled along positions with a centred window of `pool` (padding pool/2, stride 1;
 * average counts the padding as PyTorch's default does, max ignores it; pool <= 1: none). out:
 * n_prompt - n_obs floats; tmp: (g + 1) * n_prompt floats. */
void kvp_snap_scores(const struct kvp_prefill_obs *obs, int first_head, int g, int agg, int pool,
                     bool pool_max, float *out, float *tmp);

/* SnapKV's compression of one layer with a given budget (policy_snapkv.c), shared with
 * pyramidkv: scores every KV head with kvp_snap_scores, evicts all prompt tokens outside
 * sink ∪ window ∪ the best budget - |sink ∪ window| (window = max(n_obs, local)) and compacts
 * the prompt; nothing when budget >= n_prompt. scr must come from kvp_snap_init_scratch (0, or
 * -1 out of memory). */
int kvp_snap_init_scratch(struct kvp_policy *p, struct kvp_scratch *scr);
void kvp_snap_compress(struct kvp_policy *p, struct kvp_scratch *scr, int layer,
                       const struct kvp_prefill_obs *obs, int budget);

/* PyramidKV per-layer budgets (docs/methods.md §3.4), see policy_pyramidkv.c. */
enum kvp_pyramid_mode {
    KVP_PYRAMID_NONE = 0,    /* n_prompt <= budget: nothing is compressed */
    KVP_PYRAMID_FLAT = 1,    /* fallback: every compressed layer gets the budget (= SnapKV) */
    KVP_PYRAMID_PYRAMID = 2, /* the pyramid */
};
/* Token budget of every layer for a prompt of n_prompt tokens and an average budget, where
 * `forced` tokens are kept by every layer (upstream: the window w; kvpred: sink + window, see
 * pyramidkv_forced); layers < dense_layers get n_prompt (dense). Returns the mode, so callers
 * can report a fallback; *reason (may be NULL) gets a static string saying why a fallback
 * happened (NULL for the pyramid). caps: [n_layer]. */
int kvp_pyramid_budgets(int n_prompt, int budget, int forced, int n_layer, int dense_layers,
                        int *caps, const char **reason);
/* The forced tokens of a pyramidkv policy for a prompt of n_prompt tokens:
 * sink + max(min(window, n_prompt), local), capped at n_prompt. */
int kvp_pyramid_forced(const struct kvp_policy *p, int n_prompt);

/* Quest's bound for one query head and one block: Σ_d max(q_d·kmax_d, q_d·kmin_d), an upper
 * bound of q·k for every key k with kmin <= k <= kmax element-wise (policy_quest.c). */
float kvp_quest_bound(const float *q, const float *kmax, const float *kmin, int hd);

/* Scratch per KV head for select/on_step, which run concurrently for different KV heads (and
 * in sequence for the layers of one KV head). */
struct kvp_scratch {
    int max_blocks;   /* ceil(n_ctx / bs) */
    int cap;          /* max_blocks * bs */
    size_t nf, ni;    /* floats and ints per KV head: 2 * cap + extra, 3 * cap */
    float *f;         /* owned [n_head_kv][nf] */
    int *i;           /* owned [n_head_kv][ni] */
    uint64_t *masks;  /* owned [n_head_kv][max_blocks] */
};
/* 0, or -1 when out of memory (nothing left allocated). */
int kvp_scratch_init(struct kvp_scratch *s, const struct kvp_policy_env *env,
                     size_t extra_floats);
void kvp_scratch_free(struct kvp_scratch *s); /* NULL-safe, idempotent */
static inline float *kvp_scratch_f(const struct kvp_scratch *s, int kvh)
{
    return s->f + (size_t)kvh * s->nf;
}
static inline int *kvp_scratch_i(const struct kvp_scratch *s, int kvh)
{
    return s->i + (size_t)kvh * s->ni;
}
static inline uint64_t *kvp_scratch_m(const struct kvp_scratch *s, int kvh)
{
    return s->masks + (size_t)kvh * s->max_blocks;
}

#endif
