/*
 * `streaming` (StreamingLLM, docs/methods.md §3.1): keep the first `sink` tokens and the
 * most recent budget - sink tokens; everything in between is evicted for good as it leaves the
 * window, so resident memory stays at the budget. Score-free and the same for every head. Positions
 * are kept as cached (kvpred caches keys after RoPE at their true positions), not re-assigned.
 */
#include <stdlib.h>
#include <string.h>

#include "kv/kvcache.h"
#include "policy/policy.h"

struct streaming_state {
    int *evicted_upto; /* [n_layer*n_head_kv]: tokens [sink, evicted_upto) are evicted */
    uint64_t *masks;   /* [n_layer*n_head_kv][max_blocks] scratch for building selections */
};

static int streaming_init(struct kvp_policy *p, struct kvp_err *err)
{
    struct streaming_state *s = calloc(1, sizeof(*s));
    size_t n_lh = (size_t)p->env.n_layer * p->env.n_head_kv;
    size_t mb = (size_t)(p->env.n_ctx + p->env.block_size - 1) / p->env.block_size;
    if (s) {
        s->evicted_upto = calloc(n_lh, sizeof(int));
        s->masks = calloc(n_lh * mb, sizeof(uint64_t));
    }
    if (!s || !s->evicted_upto || !s->masks) {
        if (s) {
            free(s->evicted_upto);
            free(s->masks);
        }
        free(s);
        return kvp_err_set(err, KVP_ENOMEM, "streaming: out of memory");
    }
    p->state = s;
    return 0;
}

static void streaming_free(struct kvp_policy *p)
{
    struct streaming_state *s = p->state;
    if (!s)
        return;
    free(s->evicted_upto);
    free(s->masks);
    free(s);
}

static void streaming_reset(struct kvp_policy *p)
{
    struct streaming_state *s = p->state;
    memset(s->evicted_upto, 0, (size_t)p->env.n_layer * p->env.n_head_kv * sizeof(int));
}

/* Evict [sink, n_tokens - recent) of (layer, kvh), incrementally. */
static void evict_outside(struct kvp_policy *p, int layer, int kvh, int n_tokens)
{
    struct streaming_state *s = p->state;
    int lh = layer * p->env.n_head_kv + kvh;
    int budget = kvp_policy_budget(p, n_tokens);
    int sink = p->p.sink, recent = budget - sink;
    int end = n_tokens - recent;
    int from = s->evicted_upto[lh] > sink ? s->evicted_upto[lh] : sink;
    for (int t = from; t < end; t++)
        kvp_kvcache_evict(p->env.kv, layer, kvh, t, n_tokens);
    if (end > s->evicted_upto[lh])
        s->evicted_upto[lh] = end;
}

static void streaming_prefill(struct kvp_policy *p, int layer, const struct kvp_prefill_obs *obs)
{
    if (layer < p->p.dense_layers)
        return;
    for (int h = 0; h < p->env.n_head_kv; h++)
        evict_outside(p, layer, h, obs->n_prompt);
}

static void streaming_select(struct kvp_policy *p, int layer, int kvh, const float *q,
                             int n_tokens, struct kvp_sel *sel)
{
    (void)q;
    struct streaming_state *s = p->state;
    int bs = p->env.block_size, nb = (n_tokens + bs - 1) / bs;
    evict_outside(p, layer, kvh, n_tokens);
    int budget = kvp_policy_budget(p, n_tokens);
    uint64_t *m = s->masks + (size_t)(layer * p->env.n_head_kv + kvh) *
                                 ((p->env.n_ctx + bs - 1) / bs);
    memset(m, 0, (size_t)nb * sizeof(uint64_t));
    kvp_mask_add_range(m, 0, p->p.sink < n_tokens ? p->p.sink : n_tokens, bs);
    kvp_mask_add_range(m, n_tokens - (budget - p->p.sink), n_tokens, bs);
    kvp_sel_from_masks(sel, m, nb);
}

const struct kvp_policy_ops kvp_policy_streaming = {
    .name = "streaming",
    .help = "StreamingLLM: sink + most recent tokens, evicting the rest",
    .evicting = true,
    .init = streaming_init,
    .free = streaming_free,
    .reset = streaming_reset,
    .on_prefill = streaming_prefill,
    .select = streaming_select,
};
