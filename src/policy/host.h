/*
 * The policy host: the one place a selection policy is created, given its defaults and buffers,
 * called and timed. The forward pass and the KV step hold a struct kvp_policy_host and never
 * touch a policy's ops table.
 *
 *   creation   kvp_policy_host_set: the registry lookup (or an ops table handed in: the seam
 *              for test doubles), the defaults of the shared parameters, the policy's option
 *              table applied to p.opts, init;
 *   buffers    the current step's selections of every (layer, KV head), the predicted next
 *              ones (when the caller asks for them: a tiered store), the prefill observation
 *              rows and column sums the policy asked for;
 *   dispatch   kvp_policy_select, kvp_policy_on_step, kvp_policy_predict, ... (hooks a policy
 *              leaves NULL have their documented fallbacks here);
 *   timing     the seconds spent inside select and on_step, per KV head (hooks of different KV
 *              heads run on different threads), a statistic kept at no extra cost beyond two
 *              clock reads per hook call.
 */
#ifndef KVP_POLICY_HOST_H
#define KVP_POLICY_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "policy/policy.h"

struct kvp_policy_host {
    struct kvp_policy *p;     /* owned; NULL: dense everywhere */
    struct kvp_policy_env env;
    int max_blocks;
    int dense_layers;         /* layers [0, dense_layers) run dense (n_layer without a policy) */
    struct kvp_sel *sel;      /* [n_layer*n_head_kv] the current step's selections */
    struct kvp_sel *next;     /* [n_layer*n_head_kv] predicted next selections, or NULL */
    int32_t *blocks;          /* backing of sel and next: [2][n_layer*n_head_kv][max_blocks] */
    uint64_t *masks;          /* the same for the masks */
    float *obs;               /* [n_head][obs_window][n_ctx] prefill observation rows */
    int obs_window;           /* rows the policy asked for (0: none) */
    float *colsum;            /* [n_layer][n_head][n_ctx] prompt attention column sums */
    double *hook_s;           /* [n_head_kv * HOOK_STRIDE] seconds inside select/on_step */
};

/* A registered policy by name, or NULL and KVP_EINVAL in err listing the registered names. */
const struct kvp_policy_ops *kvp_policy_lookup(const char *name, struct kvp_err *err);

/* Start a policy whose ops, p and env are filled (parameters taken as they are: no defaults):
 * its option block from the table's defaults and p->p.opts, then init. stop frees both. The
 * host uses these; so do unit tests that drive one policy without a context. */
int kvp_policy_start(struct kvp_policy *p, struct kvp_err *err);
void kvp_policy_stop(struct kvp_policy *p);

/* Drop the policy and every buffer that exists for it (NULL-safe, idempotent). */
void kvp_policy_host_clear(struct kvp_policy_host *h);

/* Replace the policy: ops (NULL: looked up by params->name in the registry; KVP_EINVAL listing
 * the names when unknown) created with params, defaults filled, options applied, init run and
 * buffers allocated (with predicted-selection buffers when with_next). On failure the host is
 * left without a policy. */
int kvp_policy_host_set(struct kvp_policy_host *h, const struct kvp_policy_ops *ops,
                        const struct kvp_policy_params *params,
                        const struct kvp_policy_env *env, bool with_next, struct kvp_err *err);

/* The selection buffers of (layer, kvh). */
static inline struct kvp_sel *kvp_policy_sel(const struct kvp_policy_host *h, int layer, int kvh)
{
    return &h->sel[(size_t)layer * h->env.n_head_kv + kvh];
}
static inline struct kvp_sel *kvp_policy_next(const struct kvp_policy_host *h, int layer, int kvh)
{
    return &h->next[(size_t)layer * h->env.n_head_kv + kvh];
}

/* Whether layer reads a selection (a policy is set and the layer is past the dense ones). */
static inline bool kvp_policy_sparse(const struct kvp_policy_host *h, int layer)
{
    return h->p && layer >= h->dense_layers;
}

/* ---- hooks (same threading rules as policy.h) ---- */

/* select of (layer, kvh) into kvp_policy_sel; q the group's queries, n_tokens keys. Timed. */
struct kvp_sel *kvp_policy_select(struct kvp_policy_host *h, int layer, int kvh, const float *q,
                                  int n_tokens);
/* on_step of (layer, kvh) after attention over its selection (no-op without the hook). Timed. */
void kvp_policy_on_step(struct kvp_policy_host *h, int layer, int kvh, const float *probs,
                        int probs_stride, int n_tokens);
bool kvp_policy_has_on_step(const struct kvp_policy_host *h);
/* Whether on_step reads the selected blocks' largest probabilities rather than every token's
 * (kvp_policy_ops.step_block_max). */
bool kvp_policy_step_block_max(const struct kvp_policy_host *h);
/* The predicted next selection of (layer, kvh) for a step with n_tokens_next keys into
 * kvp_policy_next: predict_next, or the last selection of the same (layer, KV head). */
void kvp_policy_predict(struct kvp_policy_host *h, int layer, int kvh, int n_tokens_next);
bool kvp_policy_has_predict(const struct kvp_policy_host *h);
/* Whether the next select of layer reads the keys of every block. */
bool kvp_policy_reads_all_keys(const struct kvp_policy_host *h, int layer);
/* on_prefill of layer (when the policy has the hook). */
bool kvp_policy_wants_prefill(const struct kvp_policy_host *h);
void kvp_policy_on_prefill(struct kvp_policy_host *h, int layer,
                           const struct kvp_prefill_obs *obs);
bool kvp_policy_evicting(const struct kvp_policy_host *h);
/* A new sequence: the policy's reset and zeroed column sums. */
void kvp_policy_reset(struct kvp_policy_host *h);

/* Seconds spent inside select and on_step since the last kvp_policy_reset_hook_time, summed
 * over KV heads (thread time; wall time with one thread), or with cpu the CPU time of the threads
 * that ran them (which leaves out the time a thread waited for a core on a busy host). */
double kvp_policy_hook_time(const struct kvp_policy_host *h, bool cpu);
void kvp_policy_reset_hook_time(struct kvp_policy_host *h);
/* Tokens the selections let attention read, and the selections made, since the same reset
 * (summed over layers and KV heads; layers without a select, e.g. dense ones, not counted). */
void kvp_policy_read_counts(const struct kvp_policy_host *h, double *tokens, double *selects);

#endif
