/*
 * `h2o` (H2O, Zhang et al. 2023; docs/methods.md §3.2): heavy hitters plus recent tokens,
 * evicted for good. Each (layer, KV head) scores every key by the attention it has accumulated: the
 * column sums of the whole prompt's attention (from the prefill, .wants_colsum) and then, after
 * every decode step, the probabilities that step gave it (on_step). The g query heads of a group
 * are combined with gqa_agg (mean by default, as kvpress; upstream H2O is MHA only,
 * docs/methods.md §8.3 item 2). Whenever the context exceeds the budget, the policy keeps
 *
 *     the first `sink` tokens  ∪  the last max(local, 1) tokens  ∪  the best
 *     budget - sink - local of the tokens in between, by score (ties to the lower position)
 *
 * and evicts the rest from the cache. Eviction happens at the end of the prompt (on_prefill) and
 * in select, before the step's attention, so a step reads exactly `budget` tokens including the
 * current one; once the cache is full that is one eviction per step, as upstream. Decode
 * probabilities are those of the sparse attention that actually ran (softmax over the kept
 * tokens), as in upstream's real-drop code. The heavy hitters are scattered, so after every
 * eviction the cache is compacted below the recent window (kvp_kvcache_compact, scores move
 * with their tokens): resident memory follows the budget, about ceil(budget / bs) + 2 blocks
 * per (layer, KV head). Sink and recent slots never move, so the slot rules stay position
 * rules, and ranking uses the tokens' positions (kvp_kvcache_pos).
 *
 * Choices, and why:
 *  - the budget counts sink and local (§4: "H2O: hh + recent, recent included"); the sink is
 *    forced because every kvpred policy forces it. Upstream H2O has no sink: sink = -1 gives
 *    exactly heavy hitters + recent (hh = budget - local);
 *  - p.normalize = 1 ranks by score / (number of queries that could see the key), i.e. divides
 *    key t's sum by n - t (kvpress ObservedAttention, extended from the prompt to decode steps),
 *    removing the raw sum's bias towards old keys. Scores themselves stay raw sums.
 */
#include <stdlib.h>
#include <string.h>

#include "kv/kvcache.h"
#include "policy/policy.h"

struct h2o_state {
    float *score; /* [n_layer*n_head_kv][cap] accumulated attention per position */
    struct kvp_scratch scr;
};

static int h2o_init(struct kvp_policy *p, struct kvp_err *err)
{
    struct h2o_state *s = calloc(1, sizeof(*s));
    if (!s || kvp_scratch_init(&s->scr, &p->env, 0) < 0) {
        free(s);
        return kvp_err_set(err, KVP_ENOMEM, "h2o: out of memory");
    }
    s->score = calloc((size_t)p->env.n_layer * p->env.n_head_kv * s->scr.cap, sizeof(float));
    if (!s->score) {
        kvp_scratch_free(&s->scr);
        free(s);
        return kvp_err_set(err, KVP_ENOMEM, "h2o: out of memory for scores");
    }
    p->state = s;
    return 0;
}

static void h2o_free(struct kvp_policy *p)
{
    struct h2o_state *s = p->state;
    if (!s)
        return;
    free(s->score);
    kvp_scratch_free(&s->scr);
    free(s);
}

static void h2o_reset(struct kvp_policy *p)
{
    struct h2o_state *s = p->state;
    memset(s->score, 0, (size_t)p->env.n_layer * p->env.n_head_kv * s->scr.cap * sizeof(float));
}

static float *scores_of(const struct kvp_policy *p, int layer, int kvh)
{
    const struct h2o_state *s = p->state;
    return s->score + (size_t)(layer * p->env.n_head_kv + kvh) * s->scr.cap;
}

/* Compaction moves a token's score with it (user: the KV head's score array). */
static void h2o_move(void *user, int from, int to)
{
    float *score = user;
    score[to] = score[from];
    score[from] = 0.0f;
}

/* Evict (layer, kvh) down to the budget for n_tokens, with n_queries queries accumulated so far
 * (query at position i saw keys 0..i), then compact below the recent window (whose slots are
 * kept by slot number, so they must stay put). */
static void h2o_evict(struct kvp_policy *p, int layer, int kvh, int n_tokens, int n_queries)
{
    struct h2o_state *s = p->state;
    const int bs = p->env.block_size;
    float *score = scores_of(p, layer, kvh);
    const float *by = score;
    float *rank = kvp_scratch_f(&s->scr, kvh);
    uint64_t *keep = kvp_scratch_m(&s->scr, kvh);
    if (p->p.normalize) {
        for (int t = 0; t < n_tokens; t++) {
            int seen = n_queries - kvp_kvcache_pos(p->env.kv, layer, kvh, t);
            rank[t] = score[t] / (float)(seen > 1 ? seen : 1);
        }
        by = rank;
    }
    kvp_keep_tokens(by, n_tokens, p->p.sink, kvp_policy_recent(p),
                    kvp_policy_budget(p, n_tokens), p->env.kv, layer, kvh, bs, keep,
                    rank + s->scr.cap, kvp_scratch_i(&s->scr, kvh));
    kvp_evict_unkept(p->env.kv, layer, kvh, keep, n_tokens);
    kvp_kvcache_compact(p->env.kv, layer, kvh, n_tokens - kvp_policy_recent(p), n_tokens,
                        h2o_move, score);
}

static void h2o_prefill(struct kvp_policy *p, int layer, const struct kvp_prefill_obs *obs)
{
    if (layer < p->p.dense_layers || !obs->colsum)
        return;
    const int g = p->env.n_head / p->env.n_head_kv, n = obs->n_prompt;
    for (int h = 0; h < p->env.n_head_kv; h++) {
        kvp_gqa_combine(obs->colsum + (size_t)h * g * p->env.n_ctx, g, p->env.n_ctx, n,
                        p->p.gqa_agg, scores_of(p, layer, h));
        h2o_evict(p, layer, h, n, n);
    }
}

static void h2o_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                       struct kvp_sel *sel)
{
    (void)q;
    struct h2o_state *s = p->state;
    float *score = scores_of(p, layer, kvh);
    score[n_tokens - 1] = 0.0f; /* the new token has no history yet */
    /* the current query has not been accumulated yet: n_tokens - 1 queries so far */
    h2o_evict(p, layer, kvh, n_tokens, n_tokens - 1);
    kvp_sel_resident(sel, p->env.kv, layer, kvh, n_tokens, kvp_scratch_m(&s->scr, kvh));
}

static void h2o_step(struct kvp_policy *p, int layer, int kvh, const struct kvp_sel *sel,
                     const float *probs, int probs_stride, int n_tokens)
{
    (void)n_tokens;
    struct h2o_state *s = p->state;
    const int bs = p->env.block_size, g = p->env.n_head / p->env.n_head_kv;
    float *agg = kvp_scratch_f(&s->scr, kvh);
    float *score = scores_of(p, layer, kvh);
    kvp_gqa_combine(probs, g, probs_stride, sel->n * bs, p->p.gqa_agg, agg);
    for (int i = 0; i < sel->n; i++)
        for (int t = 0; t < bs; t++)
            score[sel->blocks[i] * bs + t] += agg[i * bs + t];
}

const struct kvp_policy_ops kvp_policy_h2o = {
    .name = "h2o",
    .help = "H2O: sink + recent + heavy hitters by accumulated attention, evicting the rest",
    .evicting = true,
    .wants_colsum = true,
    .init = h2o_init,
    .free = h2o_free,
    .reset = h2o_reset,
    .on_prefill = h2o_prefill,
    .select = h2o_select,
    .on_step = h2o_step,
};
