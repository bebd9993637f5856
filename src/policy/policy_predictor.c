/*
 * `predictor`: AttentionPredictor (docs/methods.md §1). Per (compressed layer, query
 * head) a history of the last H block-max-pooled attention rows, newest row last, as upstream
 * MIRALab-USTC/LLM-AttentionPredictor; a small CNN (src/predictor/cnn.h) reads it and scores every
 * block for the next step; each decode step keeps the sink, the local window and the best predicted
 * blocks. Nothing is evicted: the whole cache stays, each step reads a budget of it.
 *
 * One decode step of (layer, KV head), Lk keys (the current token included), with the block plan
 * shared by the block policies (kvp_block_plan in select_util.c):
 *   1. the local window starts at a block boundary, ls = b·⌊(Lk − local)/b⌋ (kvpred's fix of the
 *      reference's overlap and gap, §1.4; the plan keeps it exact when the budget cannot pay the
 *      extra tokens); the CNN sees the whole history columns between the sink and ls;
 *   2. k = ⌊(B − forced) / b⌋ blocks are predicted (B includes sink and local); if k covers every
 *      column they are all read; with fewer than 3 columns every column scores the same and
 *      ties go to the lower index;
 *   3. GQA (§1.6): `pooled` (default) combines the g heads' scores with gqa_agg (max, or mean,
 *      which ranks as sum) and takes one top-k per KV head, so the budget per KV head holds;
 *      `union` takes each head's top-k and reads their union (up to g·k blocks, the paper's
 *      per-head quality);
 *   4. after attention the history gets the block-max of the step's sparse probabilities (zero on
 *      blocks not read); every M-th step (calib, default 5; 0 = never) it gets the dense row
 *      instead, computed with kvp_attn_dense_group in select (where q is at hand).
 * Prefill initialises the history from the observation window (the last H prompt queries,
 * causal: the framework applies the mask, docs/methods.md §8.1).
 *
 * Options (p.opts, "key=value,..."): every=K predict every K steps (reuse the last scores in
 * between, new columns ranked first) [1]; calib=M [5]; gqa=pooled|union [pooled];
 * hist=head|kv one history per query head, or one per KV head max-pooled over the group (the CNN
 * then runs once per KV head) [head]; inc=1|0 incremental CNN [1]; refresh=N recompute from
 * scratch every N steps to bound rounding drift of the running sums [64].
 *
 * Cost: the CNN is the hot loop; with the incremental path a step recomputes 6 of the H conv2
 * rows per series. select and on_step of different KV heads run on different threads: all state
 * is per (layer, KV head) or per series, and scratch is per KV head (layers run one after another).
 *
 * The machinery lives in src/policy/predict_sel.c, shared with catekv's `--adaptive predictor`
 * (which drives only its adaptive KV heads with it); this file drives every KV head of every
 * compressed layer.
 */
#include "policy/policy.h"
#include "policy/predict_sel.h"

static void pred_free(struct kvp_policy *p)
{
    kvp_predsel_free(p->state);
    p->state = NULL;
}

static int pred_init(struct kvp_policy *p, struct kvp_err *err)
{
    struct kvp_predsel *ps;
    int rc = kvp_predsel_init(&ps, p, p->opt, "predictor", err);
    if (rc < 0)
        return rc;
    p->state = ps;
    p->p.window = kvp_predsel_history_rows(ps); /* the prefill rows initialise the history */
    return 0;
}

static void pred_reset(struct kvp_policy *p)
{
    kvp_predsel_reset(p->state);
}

static void pred_prefill(struct kvp_policy *p, int layer, const struct kvp_prefill_obs *obs)
{
    if (layer < p->p.dense_layers)
        return;
    for (int kvh = 0; kvh < p->env.n_head_kv; kvh++)
        kvp_predsel_prefill(p->state, p, layer, kvh, obs);
}

static void pred_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                        struct kvp_sel *sel)
{
    kvp_predsel_select(p->state, p, layer, kvh, q, n_tokens, sel);
}

/* The tiered store's cross-token prefetch: the blocks the next step will select, from the
 * history as it is after this step (the prediction needs no query). */
static void pred_predict_next(struct kvp_policy *p, int layer, int kvh, int n_tokens_next,
                              struct kvp_sel *sel)
{
    kvp_predsel_predict_next(p->state, p, layer, kvh, n_tokens_next, sel);
}

static bool pred_reads_all_keys(const struct kvp_policy *p, int layer)
{
    return kvp_predsel_calibrates_next(p->state, layer);
}

static void pred_step(struct kvp_policy *p, int layer, int kvh, const struct kvp_sel *sel,
                      const float *probs, int probs_stride, int n_tokens)
{
    kvp_predsel_step(p->state, p, layer, kvh, sel, probs, probs_stride, n_tokens);
}

const struct kvp_policy_ops kvp_policy_predictor = {
    .name = "predictor",
    .block_plan = true,
    .help = "AttentionPredictor: a CNN over the attention history predicts the blocks to read "
            "(needs aux_path = predictor file)",
    .wants_obs = true,
    .needs_aux = true,
    .step_block_max = true,
    .opts = kvp_predsel_opt_table,
    .opts_size = sizeof(struct kvp_predsel_opts),
    .init = pred_init,
    .free = pred_free,
    .reset = pred_reset,
    .on_prefill = pred_prefill,
    .select = pred_select,
    .predict_next = pred_predict_next,
    .on_step = pred_step,
    .reads_all_keys = pred_reads_all_keys,
};
