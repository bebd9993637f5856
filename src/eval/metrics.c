/*
 * Metrics of KV selection (see metrics.h): logit fidelity (KL, top-1, log-likelihood), attention
 * recovery, token retention and the block and token oracles of docs/methods.md §6.
 *
 * The oracles are the policy library's selection helpers (select_util.c: kvp_block_plan,
 * kvp_sel_best, kvp_keep_tokens) applied to the true attention, so an oracle row here and the
 * `oracle` / `oracle_token` policies share the forced windows, the block count and the tie rule
 * (lower index first). They run once per (step, layer, KV head) of a measurement over at most
 * n_ctx keys: O(n log k), no allocation.
 */
#include "eval/metrics.h"

#include <math.h>
#include <string.h>

#include "policy/policy.h"

/* log Σ exp(x[i]) in double precision, shifted by the max for range. */
static double log_sum_exp(const float *x, int n, double *mx_out)
{
    double mx = x[0];
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += exp((double)x[i] - mx);
    *mx_out = mx;
    return log(s);
}

double kvp_metric_kl(const float *logits_p, const float *logits_q, int n)
{
    if (n <= 0)
        return 0.0;
    double mp, mq;
    double lp = log_sum_exp(logits_p, n, &mp), lq = log_sum_exp(logits_q, n, &mq);
    double kl = 0.0;
    for (int i = 0; i < n; i++) {
        double log_p = (double)logits_p[i] - mp - lp;
        double log_q = (double)logits_q[i] - mq - lq;
        kl += exp(log_p) * (log_p - log_q);
    }
    return kl > 0.0 ? kl : 0.0;
}

int kvp_metric_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

double kvp_metric_nll(const float *logits, int n, int target)
{
    double mx;
    double lse = log_sum_exp(logits, n, &mx);
    return lse - ((double)logits[target] - mx);
}

double kvp_metric_recovery(const float *a, int n_keys, const uint64_t *masks, int bs)
{
    double r = 0.0;
    for (int t = 0; t < n_keys; t++)
        if ((masks[t / bs] >> (t % bs)) & 1)
            r += a[t];
    return r;
}

int kvp_metric_set_size(const uint64_t *masks, int n_keys, int bs)
{
    int n = 0;
    for (int t = 0; t < n_keys; t++)
        n += (int)((masks[t / bs] >> (t % bs)) & 1);
    return n;
}

double kvp_metric_retention(const float *a, int n_keys, const uint64_t *masks, int bs, int k,
                            int *scratch)
{
    if (k > n_keys)
        k = n_keys;
    if (k <= 0)
        return 1.0;
    int *top = scratch, *heap = scratch + n_keys;
    kvp_topk_indices(a, n_keys, k, top, heap);
    int hit = 0;
    for (int i = 0; i < k; i++)
        hit += (int)((masks[top[i] / bs] >> (top[i] % bs)) & 1);
    return (double)hit / k;
}

/* Every token of [0, n_keys). */
static void select_all(uint64_t *masks, int n_keys, int bs)
{
    memset(masks, 0, (size_t)((n_keys + bs - 1) / bs) * sizeof(uint64_t));
    kvp_mask_add_range(masks, 0, n_keys, bs);
}

void kvp_oracle_block(const struct kvp_policy *p, const float *score, int n_keys, uint64_t *masks,
                      void *scratch)
{
    const int bs = p->env.block_size;
    struct kvp_block_plan bp;
    kvp_block_plan(p, n_keys, &bp);
    if (bp.all) {
        select_all(masks, n_keys, bs);
        return;
    }
    /* scratch: [n] selection masks, [n] block scores, [n] selection blocks, [2n] top-k ints */
    const size_t n = (size_t)n_keys;
    uint64_t *sel_mask = scratch;
    float *bscore = (float *)(sel_mask + n);
    int32_t *sel_blocks = (int32_t *)(bscore + n);
    int *iscratch = (int *)(sel_blocks + n);
    struct kvp_sel sel = {.blocks = sel_blocks, .mask = sel_mask};
    /* kvp_sel_best builds the dense per-block masks we want in its masks argument */
    kvp_sel_best(&bp, score, n_keys, bs, &sel, masks, bscore, iscratch);
}

void kvp_oracle_token(const struct kvp_policy *p, const float *score, int n_keys, uint64_t *masks,
                      void *scratch)
{
    const int bs = p->env.block_size;
    const int budget = kvp_policy_budget(p, n_keys);
    if (budget >= n_keys) {
        select_all(masks, n_keys, bs);
        return;
    }
    float *fscratch = scratch;
    int *iscratch = (int *)(fscratch + n_keys);
    kvp_keep_tokens(score, n_keys, p->p.sink, kvp_policy_recent(p), budget, NULL, 0, 0, bs, masks,
                    fscratch, iscratch);
}
