/*
 * The AttentionPredictor's selection state, shared by the `predictor` policy and catekv's
 * adaptive heads (predict_sel.h). The algorithm and the options are described in
 * policy_predictor.c; this file holds the machinery itself: per (compressed layer, query head)
 * a history of the last H block-max-pooled attention rows (or one per KV head with hist=kv),
 * the CNN that scores every block for the next step from it, and the block plan that turns the
 * scores into a selection.
 *
 * Everything the hooks touch is per (layer, KV head), per series, or per KV head scratch (layers
 * run one after another), so calls for different KV heads may run on different threads. The
 * struct kvp_policy a call receives only supplies parameters (budget, sink, local, gqa_agg) and
 * the cache; the state lives here.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kv/attention.h"
#include "predictor/cnn.h"
#include "predictor/history.h"
#include "policy/predict_sel.h"

struct pred_kvh { /* scratch of one KV head */
    struct kvp_cnn_scratch cnn;
    float *dense;        /* [g][dstride] dense probabilities of a calibration step */
    float *row, *drow;   /* [max_blocks] pooled sparse and dense rows */
    float *grow, *gdrow; /* [max_blocks] group max of them (hist=kv) */
    float *agg;          /* [max_blocks] combined scores */
    uint64_t *masks;     /* [max_blocks] */
    int *top;            /* [2 * max_blocks] */
    int *heap;           /* [max_blocks] */
    const float **rows;  /* [H] */
    int calib_now;       /* this step appends dense rows */
};

struct kvp_predsel {
    struct kvp_predsel_opts o;
    struct kvp_cnn cnn;
    struct kvp_hist hist;
    int n_layer, n_head_kv, g; /* of the model */
    int first_layer;           /* the first layer with histories (the dense layers come before) */
    int per_layer; /* series per compressed layer: n_head, or n_head_kv (hist=kv) */
    int max_blocks;
    int dstride;             /* max_blocks * block_size */
    struct kvp_cnn_inc *inc; /* [n_series] */
    float *scores;           /* [n_series][max_blocks] the last prediction of each series */
    int *score_w;            /* [n_series] columns it covers (0: none) */
    int *score_c0;           /* [n_series] its first column */
    uint64_t *score_gen;     /* [n_series] history generation it was computed on */
    int *step;               /* [n_layer * n_head_kv] decode steps since the prefill */
    struct pred_kvh *kv;     /* [n_head_kv] */
};

/* ---- options ------------------------------------------------------------------------------- */

static const char *const gqa_names[] = {"pooled", "union", NULL};
static const char *const hist_names[] = {"head", "kv", NULL};

#define OPT(field) .offset = offsetof(struct kvp_predsel_opts, field)
const struct kvp_policy_opt kvp_predsel_opt_table[] = {
    {.type = KVP_OPT_INT, .key = "every", OPT(every), .min = 1, .max = 1000000, .def = 1,
     .help = "predict every K steps (reuse the last scores in between)"},
    {.type = KVP_OPT_INT, .key = "calib", OPT(calib), .min = 0, .max = 1000000, .def = 5,
     .help = "every M-th step appends the dense row (0: never)"},
    {.type = KVP_OPT_CHOICE, .key = "gqa", OPT(gqa_union), .choices = gqa_names, .def = 0,
     .help = "one top-k per KV head (pooled) or the union of the heads' top-k"},
    {.type = KVP_OPT_CHOICE, .key = "hist", OPT(hist_kv), .choices = hist_names, .def = 0,
     .help = "one history per query head, or per KV head"},
    {.type = KVP_OPT_INT, .key = "inc", OPT(inc), .min = 0, .max = 1, .def = 1,
     .help = "incremental CNN"},
    {.type = KVP_OPT_INT, .key = "refresh", OPT(refresh), .min = 0, .max = 1000000, .def = 64,
     .help = "recompute from scratch every N steps (0: never)"},
    {0},
};
#undef OPT

/* ---- lifetime ------------------------------------------------------------------------------ */

void kvp_predsel_free(struct kvp_predsel *s)
{
    if (!s)
        return;
    int n_series = s->hist.n_series;
    if (s->inc)
        for (int i = 0; i < n_series; i++)
            kvp_cnn_inc_free(&s->inc[i]);
    if (s->kv)
        for (int h = 0; h < s->n_head_kv; h++) {
            struct pred_kvh *k = &s->kv[h];
            kvp_cnn_scratch_free(&k->cnn);
            free(k->dense);
            free(k->row);
            free(k->drow);
            free(k->grow);
            free(k->gdrow);
            free(k->agg);
            free(k->masks);
            free(k->top);
            free(k->heap);
            free(k->rows);
        }
    free(s->kv);
    free(s->inc);
    free(s->scores);
    free(s->score_w);
    free(s->score_c0);
    free(s->score_gen);
    free(s->step);
    kvp_hist_free(&s->hist);
    kvp_cnn_free(&s->cnn);
    free(s);
}

int kvp_predsel_init(struct kvp_predsel **out, const struct kvp_policy *p,
                     const struct kvp_predsel_opts *opts, const char *who, struct kvp_err *err)
{
    *out = NULL;
    struct kvp_predsel *s = calloc(1, sizeof(*s));
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", who);
    const struct kvp_policy_env *e = &p->env;
    s->n_layer = e->n_layer;
    s->n_head_kv = e->n_head_kv;
    s->g = e->n_head / e->n_head_kv;
    s->first_layer = p->p.dense_layers;
    s->o = *opts;
    int rc;
    if (!p->p.aux_path || !*p->p.aux_path) {
        rc = kvp_err_set(err, KVP_EINVAL,
                         "%s: no predictor file (set aux_path, "
                         "e.g. --aux models/stories260K.kvpp)",
                         who);
        goto fail;
    }
    rc = kvp_cnn_load(p->p.aux_path, &s->cnn, err);
    if (rc < 0)
        goto fail;
    if (s->cnn.cin != 1) {
        rc = kvp_err_set(err, KVP_EINVAL,
                         "%s: %s has %d input channels (a query-aware file: use it with "
                         "--policy qpredictor)",
                         who, p->p.aux_path, s->cnn.cin);
        goto fail;
    }
    if (s->cnn.block_size != e->block_size) {
        rc = kvp_err_set(err, KVP_EINVAL,
                         "%s: %s was trained for blocks of %d tokens, "
                         "the cache uses %d",
                         who, p->p.aux_path, s->cnn.block_size, e->block_size);
        goto fail;
    }
    const int g = s->g, n_comp = e->n_layer - s->first_layer;
    s->per_layer = s->o.hist_kv ? e->n_head_kv : e->n_head;
    s->max_blocks = (e->n_ctx + e->block_size - 1) / e->block_size;
    s->dstride = s->max_blocks * e->block_size;
    const int n_series = n_comp * s->per_layer, mb = s->max_blocks;
    rc = kvp_hist_init(&s->hist, n_series, s->cnn.H, mb, err);
    if (rc < 0)
        goto fail;
    s->inc = calloc((size_t)(n_series ? n_series : 1), sizeof(*s->inc));
    s->scores = calloc((size_t)(n_series ? n_series : 1) * mb, sizeof(float));
    s->score_w = calloc((size_t)(n_series ? n_series : 1), sizeof(int));
    s->score_c0 = calloc((size_t)(n_series ? n_series : 1), sizeof(int));
    s->score_gen = calloc((size_t)(n_series ? n_series : 1), sizeof(uint64_t));
    s->step = calloc((size_t)e->n_layer * e->n_head_kv, sizeof(int));
    s->kv = calloc((size_t)e->n_head_kv, sizeof(*s->kv));
    if (!s->inc || !s->scores || !s->score_w || !s->score_c0 || !s->score_gen || !s->step ||
        !s->kv)
        goto fail_nomem;
    for (int i = 0; i < n_series; i++)
        if ((rc = kvp_cnn_inc_init(&s->inc[i], &s->cnn, mb, err)) < 0)
            goto fail;
    for (int h = 0; h < e->n_head_kv; h++) {
        struct pred_kvh *k = &s->kv[h];
        if ((rc = kvp_cnn_scratch_init(&k->cnn, &s->cnn, mb, err)) < 0)
            goto fail;
        k->dense = malloc((size_t)g * s->dstride * sizeof(float));
        k->row = malloc((size_t)mb * sizeof(float));
        k->drow = malloc((size_t)mb * sizeof(float));
        k->grow = malloc((size_t)mb * sizeof(float));
        k->gdrow = malloc((size_t)mb * sizeof(float));
        k->agg = malloc((size_t)mb * sizeof(float));
        k->masks = malloc((size_t)mb * sizeof(uint64_t));
        k->top = malloc((size_t)2 * mb * sizeof(int)); /* kvp_sel_blocks: 2 × candidates */
        k->heap = malloc((size_t)mb * sizeof(int));
        k->rows = malloc((size_t)s->cnn.H * sizeof(*k->rows));
        if (!k->dense || !k->row || !k->drow || !k->grow || !k->gdrow || !k->agg || !k->masks ||
            !k->top || !k->heap || !k->rows)
            goto fail_nomem;
    }
    *out = s;
    return 0;

fail_nomem:
    rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for context %d", who, e->n_ctx);
fail:
    kvp_predsel_free(s);
    return rc;
}

int kvp_predsel_history_rows(const struct kvp_predsel *s)
{
    return s->cnn.H;
}

void kvp_predsel_reset(struct kvp_predsel *s)
{
    kvp_hist_reset(&s->hist);
    for (int i = 0; i < s->hist.n_series; i++) {
        s->inc[i].valid = false;
        s->score_w[i] = 0;
    }
    memset(s->step, 0, (size_t)s->n_layer * s->n_head_kv * sizeof(int));
}

/* Series of query head h (hist=head) or KV head h (hist=kv) in compressed layer `layer`. */
static int series_of(const struct kvp_predsel *s, int layer, int h)
{
    return (layer - s->first_layer) * s->per_layer + h;
}

/* ---- prefill ------------------------------------------------------------------------------- */

void kvp_predsel_prefill(struct kvp_predsel *s, const struct kvp_policy *p, int layer, int kvh,
                         const struct kvp_prefill_obs *obs)
{
    const int bs = p->env.block_size, g = s->g;
    const int n = obs->n_prompt, first = obs->n_obs > s->cnn.H ? obs->n_obs - s->cnn.H : 0;
    struct pred_kvh *k = &s->kv[kvh];
    s->step[layer * s->n_head_kv + kvh] = 0;
    for (int j = 0; j < (s->o.hist_kv ? 1 : g); j++) {
        int ser = series_of(s, layer, s->o.hist_kv ? kvh : kvh * g + j);
        /* the prompt defines the history: forget what an earlier sequence left */
        kvp_hist_clear(&s->hist, ser);
        s->inc[ser].valid = false;
        s->score_w[ser] = 0;
    }
    for (int i = first; i < obs->n_obs; i++) {
        int nb = 0;
        for (int j = 0; j < g; j++) {
            const float *row = obs->obs + ((size_t)(kvh * g + j) * obs->n_obs + i) * n;
            nb = kvp_hist_pool_dense(row, n, bs, k->row);
            if (!s->o.hist_kv) {
                kvp_hist_append(&s->hist, series_of(s, layer, kvh * g + j), k->row, nb);
                continue;
            }
            for (int c = 0; c < nb; c++)
                k->grow[c] = j == 0 || k->row[c] > k->grow[c] ? k->row[c] : k->grow[c];
        }
        if (s->o.hist_kv)
            kvp_hist_append(&s->hist, series_of(s, layer, kvh), k->grow, nb);
    }
}

/* ---- select -------------------------------------------------------------------------------- */

/* Scores of the W columns from col0 for series ser into out (predicting, or reusing the last
 * prediction with newer columns ranked first). */
static void series_scores(struct kvp_predsel *s, int ser, int col0, int W, bool predict,
                          bool refresh, struct pred_kvh *k, float *out)
{
    float *last = s->scores + (size_t)ser * s->max_blocks;
    /* the tiered store may already have run this prediction (predict_next) on the same history
     * and columns: reuse it instead of running the CNN twice */
    bool fresh = s->score_w[ser] == W && s->score_c0[ser] == col0 &&
                 s->score_gen[ser] == s->hist.gen[ser];
    if ((predict && !fresh) || s->score_w[ser] == 0) {
        struct kvp_cnn_input in = {.rows = k->rows, .col0 = col0, .W = W};
        in.n_rows = kvp_hist_rows(&s->hist, ser, k->rows);
        if (s->o.inc)
            kvp_cnn_forward_inc(&s->cnn, &in, s->hist.gen[ser], refresh, &s->inc[ser], &k->cnn,
                                last);
        else
            kvp_cnn_forward(&s->cnn, &in, &k->cnn, last);
        s->score_w[ser] = W;
        s->score_c0[ser] = col0;
        s->score_gen[ser] = s->hist.gen[ser];
    }
    int w = s->score_w[ser] < W ? s->score_w[ser] : W;
    float top = last[0];
    for (int x = 0; x < w; x++) {
        out[x] = last[x];
        top = last[x] > top ? last[x] : top;
    }
    for (int x = w; x < W; x++) /* columns that left the local window since the prediction */
        out[x] = top + 1.0f;
}

static void softmax(float *x, int n)
{
    float mx = x[0], sum = 0;
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

static void add_blocks(uint64_t *masks, const int *top, int kb, int col0, int bs)
{
    for (int i = 0; i < kb; i++)
        kvp_mask_add_range(masks, (col0 + top[i]) * bs, (col0 + top[i] + 1) * bs, bs);
}

/* The blocks of decode step `step` (n_tokens keys) from the history as it is now. */
static void choose(struct kvp_predsel *s, const struct kvp_policy *p, int layer, int kvh,
                   int n_tokens, int step, struct kvp_sel *sel)
{
    struct pred_kvh *k = &s->kv[kvh];
    const int bs = p->env.block_size, g = s->g;

    /* the shared block plan: sink, block-aligned local window, k candidates in [first, end) */
    struct kvp_block_plan bp;
    kvp_block_plan(p, n_tokens, &bp);
    const int col0 = bp.first, W = bp.end - bp.first;
    float *score = k->agg; /* indexed by block id, as kvp_sel_blocks wants */
    if (bp.all || bp.k == 0 || bp.k >= W || W < 3) {
        /* nothing to predict (or too narrow for the CNN: equal scores, lower index first) */
        memset(score, 0, (size_t)bp.n_blocks * sizeof(float));
        kvp_sel_blocks(&bp, score, n_tokens, bs, sel, k->masks, k->top);
        return;
    }
    bool predict = (step - 1) % s->o.every == 0;
    bool refresh = s->o.refresh > 0 && step % s->o.refresh == 0;
    if (s->o.hist_kv) {
        series_scores(s, series_of(s, layer, kvh), col0, W, predict, refresh, k, score + col0);
        kvp_sel_blocks(&bp, score, n_tokens, bs, sel, k->masks, k->top);
        return;
    }
    if (s->o.gqa_union) { /* each head's top-k, read together */
        memset(k->masks, 0, (size_t)bp.n_blocks * sizeof(uint64_t));
        kvp_mask_add_range(k->masks, 0, bp.sink, bs);
        kvp_mask_add_range(k->masks, bp.local_start, n_tokens, bs);
        for (int j = 0; j < g; j++) {
            series_scores(s, series_of(s, layer, kvh * g + j), col0, W, predict, refresh, k,
                          k->row);
            kvp_topk_indices(k->row, W, bp.k, k->top, k->heap);
            add_blocks(k->masks, k->top, bp.k, col0, bs);
        }
        kvp_sel_from_masks(sel, k->masks, bp.n_blocks);
        return;
    }
    /* pooled: one top-k per KV head over the group's combined scores. A CE-trained network
     * outputs the logits of a distribution over the blocks, so each head's scores become that
     * distribution first: the group's predicted mass on a block is then the sum (or max) of its
     * heads' probabilities, which logits cannot be summed into. */
    for (int j = 0; j < g; j++) {
        series_scores(s, series_of(s, layer, kvh * g + j), col0, W, predict, refresh, k, k->row);
        if (s->cnn.meta.loss == KVP_LOSS_CE)
            softmax(k->row, W);
        for (int x = 0; x < W; x++) {
            float *o = &score[col0 + x];
            if (j == 0)
                *o = k->row[x];
            else if (p->p.gqa_agg == KVP_AGG_MAX)
                *o = k->row[x] > *o ? k->row[x] : *o;
            else
                *o += k->row[x]; /* mean and sum rank alike */
        }
    }
    kvp_sel_blocks(&bp, score, n_tokens, bs, sel, k->masks, k->top);
}

void kvp_predsel_select(struct kvp_predsel *s, const struct kvp_policy *p, int layer, int kvh,
                        const float *q, int n_tokens, struct kvp_sel *sel)
{
    struct pred_kvh *k = &s->kv[kvh];
    int step = ++s->step[layer * s->n_head_kv + kvh];
    k->calib_now = kvp_hist_is_calibration(step, s->o.calib);
    if (k->calib_now)
        kvp_attn_dense_group(p->env.kv, layer, kvh, q, s->g, n_tokens, k->dense, s->dstride,
                             NULL);
    choose(s, p, layer, kvh, n_tokens, step, sel);
}

bool kvp_predsel_calibrates_next(const struct kvp_predsel *s, int layer)
{
    for (int h = 0; h < s->n_head_kv; h++) /* the KV heads of a layer step together */
        if (kvp_hist_is_calibration(s->step[layer * s->n_head_kv + h] + 1, s->o.calib))
            return true;
    return false;
}

void kvp_predsel_predict_next(struct kvp_predsel *s, const struct kvp_policy *p, int layer,
                              int kvh, int n_tokens_next, struct kvp_sel *sel)
{
    choose(s, p, layer, kvh, n_tokens_next, s->step[layer * s->n_head_kv + kvh] + 1, sel);
}

/* ---- after attention ----------------------------------------------------------------------- */

void kvp_predsel_step(struct kvp_predsel *s, const struct kvp_policy *p, int layer, int kvh,
                      const struct kvp_sel *sel, const float *probs, int probs_stride,
                      int n_tokens)
{
    struct pred_kvh *k = &s->kv[kvh];
    const int bs = p->env.block_size, g = s->g;
    const int step = s->step[layer * s->n_head_kv + kvh];
    int nb = 0;
    for (int j = 0; j < g; j++) {
        const float *pr = probs + (size_t)j * probs_stride;
        nb = kvp_hist_scatter_sparse(pr, sel->blocks, sel->n, n_tokens, bs, k->row);
        if (k->calib_now)
            kvp_hist_pool_dense(k->dense + (size_t)j * s->dstride, n_tokens, bs, k->drow);
        if (!s->o.hist_kv) {
            kvp_hist_step(&s->hist, series_of(s, layer, kvh * g + j), step, s->o.calib, k->row,
                          k->calib_now ? k->drow : NULL, nb);
            continue;
        }
        for (int c = 0; c < nb; c++) {
            k->grow[c] = j == 0 || k->row[c] > k->grow[c] ? k->row[c] : k->grow[c];
            if (k->calib_now)
                k->gdrow[c] = j == 0 || k->drow[c] > k->gdrow[c] ? k->drow[c] : k->gdrow[c];
        }
    }
    if (s->o.hist_kv)
        kvp_hist_step(&s->hist, series_of(s, layer, kvh), step, s->o.calib, k->grow,
                      k->calib_now ? k->gdrow : NULL, nb);
}
