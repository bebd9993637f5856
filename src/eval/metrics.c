/*
 * Metrics of KV selection (see metrics.h): logit fidelity (KL, top-1, log-likelihood), attention
 * recovery, token retention and the block and token oracles of methods.md §6.
 *
 * The oracles reuse the policy library's helpers (select_util.c): kvp_mask_add_range for the
 * forced sink and local windows and kvp_topk_indices for the ranking, so an oracle row and an
 * oracle policy break ties the same way (lower index first). They run once per (step, layer,
 * KV head) of a measurement over at most n_ctx keys, so they are O(n log k) with no allocation.
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

/* Forced tokens of both oracles: [0, sink) and [n_keys - local, n_keys), clipped so they never
 * overlap. Writes the boundaries of the free middle [*mid0, *mid1) and returns the forced count. */
static int add_forced(uint64_t *masks, int n_keys, int bs, int sink, int local, int *mid0,
                      int *mid1)
{
    int nb = (n_keys + bs - 1) / bs;
    memset(masks, 0, (size_t)nb * sizeof(uint64_t));
    int s_end = sink < n_keys ? (sink > 0 ? sink : 0) : n_keys;
    int l_begin = n_keys - (local > 0 ? local : 0);
    if (l_begin < s_end)
        l_begin = s_end;
    kvp_mask_add_range(masks, 0, s_end, bs);
    kvp_mask_add_range(masks, l_begin, n_keys, bs);
    *mid0 = s_end;
    *mid1 = l_begin;
    return s_end + (n_keys - l_begin);
}

void kvp_oracle_block(const float *score, int n_keys, int bs, int sink, int local, int budget,
                      uint64_t *masks, void *scratch)
{
    int nb = (n_keys + bs - 1) / bs;
    if (budget >= n_keys) {
        memset(masks, 0, (size_t)nb * sizeof(uint64_t));
        kvp_mask_add_range(masks, 0, n_keys, bs);
        return;
    }
    int mid0, mid1;
    int forced = add_forced(masks, n_keys, bs, sink, local, &mid0, &mid1);
    int k = (budget - forced) / bs;
    if (k <= 0 || mid0 >= mid1)
        return;
    /* candidates: the blocks that hold at least one token of the free middle, scored by the sum
     * of the scores of those tokens (the forced ones are kept anyway) */
    float *bscore = scratch;
    int *cand = (int *)(bscore + n_keys);
    int *top = cand + n_keys, *heap = top + n_keys;
    int b0 = mid0 / bs, b1 = (mid1 - 1) / bs, n_cand = 0;
    for (int b = b0; b <= b1; b++) {
        int t0 = b * bs > mid0 ? b * bs : mid0;
        int t1 = (b + 1) * bs < mid1 ? (b + 1) * bs : mid1;
        double s = 0.0;
        for (int t = t0; t < t1; t++)
            s += score[t];
        bscore[n_cand] = (float)s;
        cand[n_cand++] = b;
    }
    if (k > n_cand)
        k = n_cand;
    kvp_topk_indices(bscore, n_cand, k, top, heap);
    for (int i = 0; i < k; i++) {
        int b = cand[top[i]];
        int t1 = (b + 1) * bs < n_keys ? (b + 1) * bs : n_keys;
        kvp_mask_add_range(masks, b * bs, t1, bs);
    }
}

void kvp_oracle_token(const float *score, int n_keys, int bs, int sink, int local, int budget,
                      uint64_t *masks, void *scratch)
{
    int nb = (n_keys + bs - 1) / bs;
    if (budget >= n_keys) {
        memset(masks, 0, (size_t)nb * sizeof(uint64_t));
        kvp_mask_add_range(masks, 0, n_keys, bs);
        return;
    }
    int mid0, mid1;
    int forced = add_forced(masks, n_keys, bs, sink, local, &mid0, &mid1);
    int k = budget - forced;
    if (k <= 0 || mid0 >= mid1)
        return;
    int *top = scratch, *heap = top + n_keys;
    int n = mid1 - mid0;
    if (k > n)
        k = n;
    kvp_topk_indices(score + mid0, n, k, top, heap);
    for (int i = 0; i < k; i++) {
        int t = mid0 + top[i];
        masks[t / bs] |= 1ULL << (t % bs);
    }
}
