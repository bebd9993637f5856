/*
 * Metrics of KV selection (docs/methods.md §6), as small pure functions over plain arrays
 * so that the tests can check each one on hand-made data and the measuring harness (measure.h) only
 * has to gather the arrays.
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

/* Token retention |TopK(a) ∩ S| / K with K = min(k, n_keys) (docs/methods.md §6). scratch
 * holds 2 * n_keys ints. 1 when n_keys is 0. */
double kvp_metric_retention(const float *a, int n_keys, const uint64_t *masks, int bs, int k,
                            int *scratch);

/* Oracle selections at the budget of a policy (docs/methods.md §6, "oracle granularity"),
 * built with the policy library's own helpers (select_util.c), so an oracle row here selects
 * exactly what the `oracle` and `oracle_token` policies would on the same scores:
 *   block oracle: kvp_block_plan(p, n_keys), the plan every block policy uses (forced sink,
 *                 block-aligned local window, k whole candidate blocks between them and the
 *                 budget's rest below the window), the selection with the largest SUM of
 *                 `score` among all the plan allows (kvp_sel_best);
 *   token oracle: kvp_keep_tokens, the forced sink and last max(local, 1) tokens plus the best
 *                 budget - forced single tokens by `score` (every token is a candidate: the truth
 *                 knows no eviction).
 * p supplies the resolved sink, local, budget (or ratio) and block size (p->env.block_size);
 * score holds one value per key (for GQA the group-summed dense attention). masks receives
 * ceil(n_keys / bs) per-block masks. A budget >= n_keys keeps every token. scratch must hold
 * kvp_oracle_scratch(n_keys) bytes, aligned for uint64_t. */
struct kvp_policy;
void kvp_oracle_block(const struct kvp_policy *p, const float *score, int n_keys, uint64_t *masks,
                      void *scratch);
void kvp_oracle_token(const struct kvp_policy *p, const float *score, int n_keys, uint64_t *masks,
                      void *scratch);

/* Bytes of scratch the oracle functions need for n_keys keys. */
static inline size_t kvp_oracle_scratch(int n_keys)
{
    size_t n = (size_t)(n_keys > 0 ? n_keys : 1);
    return n * (sizeof(uint64_t) + sizeof(int32_t) + 4 * sizeof(float) + 3 * sizeof(int));
}

#endif
