/*
 * The AttentionPredictor's per-(layer, KV head) selection machinery (docs/methods.md §1),
 * shared by the `predictor` policy (every compressed KV head) and catekv's `--adaptive predictor`
 * mode (the adaptive KV heads only). It owns the CNN read from a predictor file, one history ring
 * per series (query head, or KV head with hist=kv) of every compressed layer, the last prediction
 * of each series and the scratch of each KV head; see policy_predictor.c for the algorithm and the
 * options (every, calib, gqa, hist, inc, refresh).
 *
 * The caller decides which KV heads it drives: a KV head is only touched by the calls made for
 * it, so a policy may prefill every head and then select / step only some. The budget, sink,
 * local window and GQA aggregation of a selection come from the `struct kvp_policy` passed to
 * kvp_predsel_select (its parameters feed kvp_block_plan), so a caller can hand in a copy with
 * its own budget. Threading is the policy framework's: calls for different KV heads may run
 * concurrently, calls for one KV head run one after another.
 */
#ifndef KVP_PREDICTOR_PREDICT_SEL_H
#define KVP_PREDICTOR_PREDICT_SEL_H

#include "core/err.h"
#include "policy/policy.h"

struct kvp_predsel;

/* Its options (policy_predictor.c documents them), declared once in kvp_predsel_opt_table: the
 * predictor policy's option block, and the part of catekv's that its adaptive heads read. */
struct kvp_predsel_opts {
    int every, calib, gqa_union, hist_kv, inc, refresh;
};
extern const struct kvp_policy_opt kvp_predsel_opt_table[];

/* Load the predictor file p->p.aux_path and allocate histories for the layers
 * [p->p.dense_layers, n_layer) of p->env, with the options opts. `who`
 * prefixes every error message ("predictor", "catekv"). Returns 0 and *out, or KVP_EINVAL
 * (no file, bad option, block size mismatch), KVP_EIO / KVP_EFORMAT (the file), KVP_ENOMEM;
 * *out is NULL on failure. */
int kvp_predsel_init(struct kvp_predsel **out, const struct kvp_policy *p,
                     const struct kvp_predsel_opts *opts, const char *who, struct kvp_err *err);
void kvp_predsel_free(struct kvp_predsel *ps); /* NULL-safe */

/* History rows H the network reads (the observation window that fills a history). */
int kvp_predsel_history_rows(const struct kvp_predsel *ps);

/* A new sequence: forget every history, prediction and step count. */
void kvp_predsel_reset(struct kvp_predsel *ps);

/* Start the history of (layer, kvh) from the prefill observation (its last H rows) and reset
 * its step count. layer must be compressed (>= the dense layers given at init). */
void kvp_predsel_prefill(struct kvp_predsel *ps, const struct kvp_policy *p, int layer, int kvh,
                         const struct kvp_prefill_obs *obs);

/* One decode step's selection of (layer, kvh): sink, block-aligned local window and the best
 * predicted blocks within kvp_policy_budget(p, n_tokens) (everything when it covers the
 * context). q: the group's queries, used on calibration steps for the dense row. */
void kvp_predsel_select(struct kvp_predsel *ps, const struct kvp_policy *p, int layer, int kvh,
                        const float *q, int n_tokens, struct kvp_sel *sel);

/* Whether the next select of layer is a calibration step (it reads every key). */
bool kvp_predsel_calibrates_next(const struct kvp_predsel *ps, int layer);

/* What the next select of (layer, kvh) will read (the store's prefetch), without its query. */
void kvp_predsel_predict_next(struct kvp_predsel *ps, const struct kvp_policy *p, int layer,
                              int kvh, int n_tokens_next, struct kvp_sel *sel);

/* After the attention of a step selected by kvp_predsel_select: append the step's pooled row
 * (the dense one on calibration steps) to the histories of (layer, kvh). probs: the selected
 * blocks' largest probabilities, [j][i] (the policies set step_block_max). */
void kvp_predsel_step(struct kvp_predsel *ps, const struct kvp_policy *p, int layer, int kvh,
                      const struct kvp_sel *sel, const float *probs, int probs_stride,
                      int n_tokens);

#endif
