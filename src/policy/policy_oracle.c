/*
 * `oracle` and `oracle_token`: upper bounds, not methods (docs/methods.md §6). Both
 * compute the current step's true dense attention inside select, from the query the step is about
 * to use (kvp_attn_dense_group over every cached key), and keep what that attention says is best.
 * Only an oracle may look at the answer like this; nothing is evicted.
 *
 *  - `oracle` is block-granular: the same forced sink and local window and the same number k of
 *    blocks as every block policy (kvp_block_plan), choosing among every selection the plan allows
 *    the one with the largest SUM of the group-aggregated true attention (gqa_agg, mean by
 *    default; kvp_sel_best: the blocks and where the budget's rest then falls). With the mean
 *    this maximises the group's mean recovery among all selections with that plan, so it is the
 *    denominator of the oracle-relative accuracy R(S_pred) / R(S_oracle).
 *  - `oracle_token` is token-granular: the forced sink and the last max(local, 1) tokens, plus
 *    the budget's remaining best tokens by the group-aggregated true attention. A token policy
 *    (h2o, snapkv, streaming) can beat the block oracle at the same budget because it need not
 *    take whole blocks; the token oracle bounds those too ("oracle granularity" in §6).
 *
 * Cost: a dense attention per step and KV head on top of the sparse one, so these are for
 * measuring runs only.
 */
#include <stdlib.h>
#include <string.h>

#include "kv/attention.h"
#include "kv/kvcache.h"
#include "policy/policy.h"

/* scratch floats per KV head: [cap] combined attention, [cap] block scores / top-k values,
 * [g][cap] the group's dense probabilities */
static int oracle_init(struct kvp_policy *p, struct kvp_err *err)
{
    struct kvp_scratch *s = calloc(1, sizeof(*s));
    size_t g = (size_t)(p->env.n_head / p->env.n_head_kv);
    size_t cap =
        (size_t)(p->env.n_ctx + p->env.block_size - 1) / p->env.block_size * p->env.block_size;
    if (!s || kvp_scratch_init(s, &p->env, g * cap) < 0) {
        free(s);
        return kvp_err_set(err, KVP_ENOMEM, "oracle: out of memory");
    }
    p->state = s;
    return 0;
}

static void oracle_free(struct kvp_policy *p)
{
    kvp_scratch_free(p->state);
    free(p->state);
}

/* Dense attention of the group, combined over its query heads into agg[0 .. n_tokens). */
static float *true_attention(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens)
{
    const struct kvp_scratch *s = p->state;
    const int g = p->env.n_head / p->env.n_head_kv;
    float *agg = kvp_scratch_f(s, kvh);
    float *probs = agg + 2 * (size_t)s->cap;
    kvp_attn_dense_group(p->env.kv, layer, kvh, q, g, n_tokens, probs, s->cap, NULL);
    kvp_gqa_combine(probs, g, s->cap, n_tokens, p->p.gqa_agg, agg);
    return agg;
}

static void oracle_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                          struct kvp_sel *sel)
{
    const struct kvp_scratch *s = p->state;
    const int bs = p->env.block_size;
    struct kvp_block_plan bp;
    kvp_block_plan(p, n_tokens, &bp);
    if (bp.all || bp.k >= bp.end - bp.first) { /* no choice to make */
        kvp_sel_blocks(&bp, NULL, n_tokens, bs, sel, kvp_scratch_m(s, kvh), kvp_scratch_i(s, kvh));
        return;
    }
    const float *agg = true_attention(p, layer, kvh, q, n_tokens);
    kvp_sel_best(&bp, agg, n_tokens, bs, sel, kvp_scratch_m(s, kvh),
                 kvp_scratch_f(s, kvh) + s->cap, kvp_scratch_i(s, kvh));
}

static void oracle_token_select(struct kvp_policy *p, int layer, int kvh, const float *q,
                                int n_tokens, struct kvp_sel *sel)
{
    const struct kvp_scratch *s = p->state;
    const int bs = p->env.block_size;
    int budget = kvp_policy_budget(p, n_tokens);
    if (budget >= n_tokens) {
        kvp_sel_all(sel, n_tokens, bs);
        return;
    }
    const float *agg = true_attention(p, layer, kvh, q, n_tokens);
    uint64_t *keep = kvp_scratch_m(s, kvh);
    kvp_keep_tokens(agg, n_tokens, p->p.sink, kvp_policy_recent(p), budget, NULL, layer, kvh, bs,
                    keep, kvp_scratch_f(s, kvh) + s->cap, kvp_scratch_i(s, kvh));
    kvp_sel_from_masks(sel, keep, (n_tokens + bs - 1) / bs);
}

/* Every select scores every key: a tiered store on a device reads the layer in first. */
static bool oracle_reads_all_keys(const struct kvp_policy *p, int layer)
{
    (void)p;
    (void)layer;
    return true;
}

const struct kvp_policy_ops kvp_policy_oracle = {
    .name = "oracle",
    .block_plan = true,
    .help = "upper bound: the true top blocks of each step's dense attention (measuring only)",
    .init = oracle_init,
    .free = oracle_free,
    .select = oracle_select,
    .reads_all_keys = oracle_reads_all_keys,
};

const struct kvp_policy_ops kvp_policy_oracle_token = {
    .name = "oracle_token",
    .help = "upper bound: the true top tokens of each step's dense attention (measuring only)",
    .init = oracle_init,
    .free = oracle_free,
    .select = oracle_token_select,
    .reads_all_keys = oracle_reads_all_keys,
};
