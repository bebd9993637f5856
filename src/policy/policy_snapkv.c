/*
 * `snapkv` (SnapKV, Li et al. 2024; docs/methods.md §3.3): one-shot prompt compression.
 * After the dense prefill of each compressed layer, the attention rows of the last w = min(window,
 * n) prompt queries (the observation window, causal, from the prefill itself: .wants_obs) vote for
 * the past positions j < n - w:
 *
 *     s[j] = Σ_{window queries i} attn[i][j]        per query head,
 *
 * combined over the GQA group with gqa_agg (mean by default, as kvpress; the original repeats
 * K/V per query head, docs/methods.md §8.3 item 1), then smoothed by a 1-D pool along positions
 * (p.pool_max: max, else average; kernel p.pool, padding pool/2, stride 1; the average divides
 * by the kernel size including padding, PyTorch's default as in the original, so the first and
 * last pool/2 positions are damped; max pooling ignores the padding). Each KV head then keeps
 *
 *     the first `sink` tokens  ∪  the last max(w, local) prompt tokens (the window)  ∪
 *     the best budget - sink - max(w, local) positions by pooled score (ties to the lower one)
 *
 * and evicts the other prompt tokens for good, then compacts the prompt (kvp_kvcache_compact) so
 * the blocks of evicted tokens really come back. Only when n > budget; otherwise nothing is
 * compressed. Decode tokens are appended and never evicted (uncounted, as upstream, §4), so a
 * step reads budget + generated tokens.
 *
 * Choices, and why: the budget includes the window (SnapKV's C) and the sink, which kvpred
 * forces in every policy; sink = -1 gives the original rule (top C - w plus the window). The
 * group is combined before pooling (KVCache-Factory's kv_head layout); with the mean and the
 * average pool the two orders are the same.
 */
#include <stdlib.h>

#include "kv/kvcache.h"
#include "policy/policy.h"

int kvp_snap_init_scratch(struct kvp_policy *p, struct kvp_scratch *scr)
{
    size_t g = (size_t)(p->env.n_head / p->env.n_head_kv);
    size_t cap =
        (size_t)(p->env.n_ctx + p->env.block_size - 1) / p->env.block_size * p->env.block_size;
    return kvp_scratch_init(scr, &p->env, (g + 1) * cap);
}

void kvp_snap_compress(struct kvp_policy *p, struct kvp_scratch *scr, int layer,
                       const struct kvp_prefill_obs *obs, int budget)
{
    const int g = p->env.n_head / p->env.n_head_kv, n = obs->n_prompt;
    if (budget >= n || obs->n_obs <= 0)
        return;
    int recent = obs->n_obs > kvp_policy_recent(p) ? obs->n_obs : kvp_policy_recent(p);
    for (int h = 0; h < p->env.n_head_kv; h++) {
        float *score = kvp_scratch_f(scr, h); /* [cap] pooled scores */
        float *fscr = score + scr->cap;       /* [cap] top-k values */
        float *tmp = fscr + scr->cap;         /* [(g + 1) * cap] per-head sums */
        uint64_t *keep = kvp_scratch_m(scr, h);
        kvp_snap_scores(obs, h * g, g, p->p.gqa_agg, p->p.pool, p->p.pool_max != 0, score, tmp);
        kvp_keep_tokens(score, n, p->p.sink, recent, budget, p->env.kv, layer, h, p->env.block_size,
                        keep, fscr, kvp_scratch_i(scr, h));
        kvp_evict_unkept(p->env.kv, layer, h, keep, n);
        /* the kept prompt tokens are scattered: pack them so their blocks come back (nothing
         * here depends on slots after the prompt, select reads whatever is resident) */
        kvp_kvcache_compact(p->env.kv, layer, h, n, n, NULL, NULL);
    }
}

static int snapkv_init(struct kvp_policy *p, struct kvp_err *err)
{
    struct kvp_scratch *s = calloc(1, sizeof(*s));
    if (!s || kvp_snap_init_scratch(p, s) < 0) {
        free(s);
        return kvp_err_set(err, KVP_ENOMEM, "snapkv: out of memory");
    }
    p->state = s;
    return 0;
}

static void snapkv_free(struct kvp_policy *p)
{
    kvp_scratch_free(p->state);
    free(p->state);
}

static void snapkv_prefill(struct kvp_policy *p, int layer, const struct kvp_prefill_obs *obs)
{
    if (layer < p->p.dense_layers)
        return;
    kvp_snap_compress(p, p->state, layer, obs, kvp_policy_budget(p, obs->n_prompt));
}

static void snapkv_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                          struct kvp_sel *sel)
{
    (void)q;
    struct kvp_scratch *s = p->state;
    kvp_sel_resident(sel, p->env.kv, layer, kvh, n_tokens, kvp_scratch_m(s, kvh));
}

const struct kvp_policy_ops kvp_policy_snapkv = {
    .name = "snapkv",
    .help = "SnapKV: prompt compressed once by the observation window's pooled votes",
    .evicting = true,
    .wants_obs = true,
    .init = snapkv_init,
    .free = snapkv_free,
    .on_prefill = snapkv_prefill,
    .select = snapkv_select,
};
