/*
 * Metrics of KV selection (methods.md §6), as small pure functions over plain arrays so that the
 * tests can check each one on hand-made data and the measuring harness (measure.h) only has to
 * gather the arrays.
 *
 * Conventions shared by every function here:
 *   - a token set S is a dense per-block mask array masks[n_blocks] (bit t of masks[b] = token
 *     b*bs + t), the same layout the policy helpers build (policy.h, kvp_mask_add_range);
 *   - attention rows are the dense softmax a_t over n_keys keys; they sum to 1;
 *   - top-k ties go to the lower index (kvp_topk_indices), so every number is reproducible;
 *   - softmax, log-likelihood and KL are computed in double precision from float logits.
 */
#ifndef KVP_EVAL_METRICS_H
#define KVP_EVAL_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* KL(p ‖ q) in nats, p = softmax(logits_p), q = softmax(logits_q), over n entries, in double
 * precision. 0 for equal logits; never negative (rounding is clamped). */
double kvp_metric_kl(const float *logits_p, const float *logits_q, int n);

/* Index of the largest of x[0..n), the lower index on ties. */
int kvp_metric_argmax(const float *x, int n);

/* -log softmax(logits)[target] in double precision. */
double kvp_metric_nll(const float *logits, int n, int target);

/* Attention recovery R(S) = Σ_{i ∈ S, i < n_keys} a[i]. */
double kvp_metric_recovery(const float *a, int n_keys, const uint64_t *masks, int bs);

/* Tokens of S below n_keys. */
int kvp_metric_set_size(const uint64_t *masks, int n_keys, int bs);

/* Token retention |TopK(a) ∩ S| / K with K = min(k, n_keys) (methods.md §6). scratch holds
 * 2 * n_keys ints. 1 when n_keys is 0. */
double kvp_metric_retention(const float *a, int n_keys, const uint64_t *masks, int bs, int k,
                            int *scratch);

/* Oracle selections at a token budget (methods.md §6, "oracle granularity"). Both keep the forced
 * tokens [0, sink) and [n_keys - local, n_keys), then spend what is left of `budget` tokens on the
 * rest by `score` (one value per key: for GQA the group-summed dense attention):
 *   block oracle: whole blocks of bs tokens, k = (budget - forced) / bs of them, chosen by the
 *                 SUM of the scores of their not-forced tokens (a block that overlaps the forced
 *                 tokens costs one of the k like any other, so at most `budget` tokens are kept);
 *   token oracle: the budget - forced best single tokens.
 * masks[(n_keys + bs - 1) / bs] is overwritten with the selection. A budget >= n_keys keeps every
 * token. scratch must hold kvp_oracle_scratch(n_keys) bytes. */
void kvp_oracle_block(const float *score, int n_keys, int bs, int sink, int local, int budget,
                      uint64_t *masks, void *scratch);
void kvp_oracle_token(const float *score, int n_keys, int bs, int sink, int local, int budget,
                      uint64_t *masks, void *scratch);

/* Bytes of scratch the oracle functions need for n_keys keys. */
static inline size_t kvp_oracle_scratch(int n_keys)
{
    return (size_t)(n_keys > 0 ? n_keys : 1) * (3 * sizeof(int) + sizeof(float));
}

#endif
