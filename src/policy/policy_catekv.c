/*
 * `catekv` (CateKV, docs/methods.md §2): KV heads split into consistent and adaptive ones
 * by the CV of their chunk hit counts over the observation window, with a different cache for each
 * kind.
 *
 * Consistent heads keep the sink [0, S), the select_sets middle chunks with the highest summed
 * chunk-max attention over the window, and the tail [chunk_end − R, n); everything else of the
 * prompt is evicted for good at the end of prefill (kvp_kvcache_evict) and the prompt compacted
 * (kvp_kvcache_compact; not on quest-mode adaptive heads, whose landmarks address chunks by
 * slot), so resident memory really falls. The selection is fixed after prefill; every generated
 * token is appended and never evicted. Adaptive heads run one of four modes
 * (params.adaptive_mode):
 *   full       the whole cache (η = 1, the paper's default);
 *   fraction   sink + the top ⌊η·middle_chunks⌋ middle chunks by the same score + tail, fixed
 *              and evicted like the consistent heads (η default 0.5);
 *   quest      the η-cache (default η = 1) read through Quest page selection every step: min/max
 *              key landmarks per c-token chunk of [0, chunk_end) computed once after prefill,
 *              score Σ_d max(q_d·kmin_d, q_d·kmax_d), **max** over the GQA group
 *              (docs/methods.md §5), top B/c chunks plus the unlandmarked tail
 *              [chunk_end, n_tokens) (§2.6);
 *   predictor  AttentionPredictor on the adaptive heads (docs/methods.md §1): the
 *              whole cache stays resident (η is ignored, nothing is evicted) and each decode
 *              step reads the sink,
 *              the block-aligned local window and the best blocks the CNN predicts from the
 *              head's own attention history, within the same budget B as the consistent heads
 *              (B counts sink and local, as for the `predictor` policy; a budget that covers the
 *              context reads everything). The machinery is the predictor policy's
 *              (src/policy/predict_sel.h), with the predictor file from aux_path and its
 *              options from opts (every, calib, gqa, hist, inc, refresh). Histories start from
 *              the prefill observation window (its last H rows; a window shorter than the
 *              network's H starts them shorter) and follow each step's attention only on
 *              adaptive heads, so consistent heads cost nothing per step.
 *
 * Classes come either from a head-profile file (static identification, kvpred profile-heads) or,
 * without one, from the prompt itself (dynamic): each layer's CVs are computed in its on_prefill,
 * and the global quantile split over layers × KV heads happens at the last layer, after which the
 * evictions of every layer are applied (prefill attention has already run dense by then).
 * Every layer is treated alike: dense_layers is forced to 0. The observation window is the
 * framework's `window` (the paper uses 64); the framework's rows are softmaxes over all prompt
 * keys, which catekv_classify renormalises over the middle keys (identical to §2.3's softmax over
 * M). A prompt too short for the budget (geometry keep_all) leaves every head dense.
 *
 * Parameters: sink = S, local = R, budget = B (or budget_ratio·n, rounded down to S + R + a
 * multiple of c; no budget at all means no compression), chunk = c, tail_tokens, window = w,
 * percentile = k, alpha = α, adaptive_ratio = r, eta = η.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvcache.h"
#include "policy/catekv_classify.h"
#include "policy/catekv_profile.h"
#include "policy/policy.h"
#include "policy/predict_sel.h"

struct catekv_state {
    int n_lh;                         /* n_layer × n_head_kv */
    int max_blocks;                   /* logical KV blocks per head */
    int max_chunks;                   /* n_ctx / c */
    struct kvp_head_profile *profile; /* owned; NULL in dynamic mode */
    uint8_t *adaptive;                /* [n_lh] 1 = adaptive (valid once prefilled) */
    double *cv;                       /* [n_lh] CVs of the last prompt (dynamic mode) */
    double *cv_scratch;               /* [n_lh] */
    float *score;                     /* [n_lh][max_chunks] chunk scores of the last prompt */
    float *A;                         /* [window][n_ctx] observation matrix of one head */
    float *A_scratch;                 /* [window][n_ctx] copy for the quantiles */
    int *topk;                        /* [max_chunks] chosen chunks */
    int *topk_scratch;                /* [max_chunks] */
    uint64_t *masks;                  /* [n_lh][max_blocks] selection scratch */
    /* quest mode only */
    float *kmin, *kmax;         /* [n_lh][max_chunks][head_dim] landmarks of [0, chunk_end) */
    uint8_t *stored;            /* [n_lh][max_chunks] chunk still in the cache after prefill */
    float *qscore;              /* [n_lh][max_chunks] */
    int *qcand, *qidx, *qtmp;   /* [n_lh][max_chunks] candidates, chosen, top-k scratch */
    /* predictor mode only */
    struct kvp_predsel *pred;   /* histories and CNN of the adaptive heads */
    struct kvp_policy plan;     /* copy of the policy with budget = geo.budget, for block plans */
    struct kvp_catekv_geom geo; /* of the last prompt */
    bool prefilled;
};

static double eff_ratio(const struct kvp_policy *p)
{
    float r = p->p.adaptive_ratio;
    return r == 0.0f ? 0.4 : r < 0.0f ? 0.0 : (double)r;
}

static double eff_eta(const struct kvp_policy *p)
{
    if (p->p.eta > 0.0f)
        return p->p.eta > 1.0f ? 1.0 : (double)p->p.eta;
    return p->p.adaptive_mode == KVP_ADAPTIVE_FRACTION ? 0.5 : 1.0;
}

static void catekv_free(struct kvp_policy *p)
{
    struct catekv_state *s = p->state;
    if (!s)
        return;
    kvp_head_profile_free(s->profile);
    kvp_predsel_free(s->pred);
    void *bufs[] = {s->adaptive, s->cv,           s->cv_scratch, s->score, s->A,    s->A_scratch,
                    s->topk,     s->topk_scratch, s->masks,      s->kmin,  s->kmax, s->stored,
                    s->qscore,   s->qcand,        s->qidx,       s->qtmp};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
    free(s);
    p->state = NULL;
}

/* Fill the catekv defaults and check what does not depend on the prompt. */
static int resolve_params(struct kvp_policy *p, struct kvp_err *err)
{
    struct kvp_policy_params *q = &p->p;
    if (q->chunk <= 0)
        q->chunk = 8;
    if (q->tail_tokens == 0)
        q->tail_tokens = 32;
    else if (q->tail_tokens < 0)
        q->tail_tokens = 0;
    if (q->percentile == 0.0f)
        q->percentile = 0.995f;
    if (q->alpha == 0.0f)
        q->alpha = 1.0f;
    else if (q->alpha < 0.0f)
        q->alpha = 0.0f;
    q->dense_layers = 0; /* CateKV treats every layer alike (§2.7) */
    if (q->chunk > 4096)
        return kvp_err_set(err, KVP_EINVAL, "catekv: chunk size %d too large", q->chunk);
    if (!(q->percentile > 0.5f && q->percentile < 1.0f))
        return kvp_err_set(err, KVP_EINVAL, "catekv: percentile %g outside (0.5, 1)",
                           (double)q->percentile);
    if (q->alpha > 1.0f)
        return kvp_err_set(err, KVP_EINVAL, "catekv: alpha %g outside [0, 1]", (double)q->alpha);
    if (q->adaptive_mode < KVP_ADAPTIVE_FULL || q->adaptive_mode > KVP_ADAPTIVE_PREDICTOR)
        return kvp_err_set(err, KVP_EINVAL, "catekv: unknown adaptive mode %d", q->adaptive_mode);
    if (q->adaptive_mode == KVP_ADAPTIVE_PREDICTOR && (!q->aux_path || !*q->aux_path))
        return kvp_err_set(err, KVP_EINVAL,
                           "catekv: adaptive mode 'predictor' needs a predictor file (set "
                           "aux_path, e.g. --aux models/stories260K.kvpp)");
    if (q->budget > 0) {
        struct kvp_catekv_geom g;
        int rc = kvp_catekv_geometry(q->budget + 1, q->chunk, q->sink, q->local, q->tail_tokens,
                                     q->budget, &g, err);
        if (rc < 0)
            return rc;
    } else {
        struct kvp_catekv_geom g; /* structural rules only */
        int rc = kvp_catekv_geometry(1, q->chunk, q->sink, q->local, q->tail_tokens,
                                     q->sink + q->local, &g, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int catekv_init(struct kvp_policy *p, struct kvp_err *err)
{
    int rc = resolve_params(p, err);
    if (rc < 0)
        return rc;
    const struct kvp_policy_env *e = &p->env;
    struct catekv_state *s = calloc(1, sizeof(*s));
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "catekv: out of memory");
    p->state = s;
    if (p->p.head_profile) {
        rc = kvp_head_profile_read(p->p.head_profile, &s->profile, err);
        if (rc < 0)
            goto fail;
        if (s->profile->n_layer != e->n_layer || s->profile->n_head_kv != e->n_head_kv) {
            rc = kvp_err_set(err, KVP_EINVAL,
                             "head profile %s is for %d layers x %d KV heads, the model has "
                             "%d x %d",
                             p->p.head_profile, s->profile->n_layer, s->profile->n_head_kv,
                             e->n_layer, e->n_head_kv);
            goto fail;
        }
    }
    s->n_lh = e->n_layer * e->n_head_kv;
    s->max_blocks = (e->n_ctx + e->block_size - 1) / e->block_size;
    s->max_chunks = e->n_ctx / p->p.chunk + 1;
    size_t n_lh = (size_t)s->n_lh, mc = (size_t)s->max_chunks;
    size_t a_len = (size_t)p->p.window * e->n_ctx;
    s->adaptive = calloc(n_lh, 1);
    s->cv = calloc(n_lh, sizeof(double));
    s->cv_scratch = calloc(n_lh, sizeof(double));
    s->score = calloc(n_lh * mc, sizeof(float));
    s->A = malloc(a_len * sizeof(float));
    s->A_scratch = malloc(a_len * sizeof(float));
    s->topk = malloc(mc * sizeof(int));
    s->topk_scratch = malloc(mc * sizeof(int));
    s->masks = calloc(n_lh * s->max_blocks, sizeof(uint64_t));
    if (!s->adaptive || !s->cv || !s->cv_scratch || !s->score || !s->A || !s->A_scratch ||
        !s->topk || !s->topk_scratch || !s->masks)
        goto fail_nomem;
    if (p->p.adaptive_mode == KVP_ADAPTIVE_QUEST) {
        size_t lm = n_lh * mc * e->head_dim;
        s->kmin = malloc(lm * sizeof(float));
        s->kmax = malloc(lm * sizeof(float));
        s->stored = calloc(n_lh * mc, 1);
        s->qscore = malloc(n_lh * mc * sizeof(float));
        s->qcand = malloc(n_lh * mc * sizeof(int));
        s->qidx = malloc(n_lh * mc * sizeof(int));
        s->qtmp = malloc(n_lh * mc * sizeof(int));
        if (!s->kmin || !s->kmax || !s->stored || !s->qscore || !s->qcand || !s->qidx || !s->qtmp)
            goto fail_nomem;
    }
    if (p->p.adaptive_mode == KVP_ADAPTIVE_PREDICTOR) {
        rc = kvp_predsel_init(&s->pred, p, p->opt, "catekv", err);
        if (rc < 0)
            goto fail;
    }
    return 0;

fail_nomem:
    rc = kvp_err_set(err, KVP_ENOMEM, "catekv: out of memory for context %d", e->n_ctx);
fail:
    catekv_free(p);
    return rc;
}

static void catekv_reset(struct kvp_policy *p)
{
    struct catekv_state *s = p->state;
    s->prefilled = false;
    if (s->pred)
        kvp_predsel_reset(s->pred);
}

/* B for an n-token prompt: the budget, or the ratio rounded down to S + R + a multiple of c;
 * n (no compression) when neither is set. */
static int prompt_budget(const struct kvp_policy *p, int n)
{
    const struct kvp_policy_params *q = &p->p;
    if (q->budget > 0)
        return q->budget;
    if (q->budget_ratio <= 0.0f)
        return q->sink + q->local + (n / q->chunk + 1) * q->chunk; /* > n: keep_all */
    int b = kvp_budget_tokens(q, n) - q->sink - q->local;
    b = b < 0 ? 0 : b / q->chunk * q->chunk;
    return q->sink + q->local + b;
}

/* Evict the middle chunks of (layer, kvh) not among the k best by score (ties: lower index). */
static void keep_top_chunks(struct kvp_policy *p, int layer, int kvh, int k)
{
    struct catekv_state *s = p->state;
    const struct kvp_catekv_geom *g = &s->geo;
    const float *score = s->score + (size_t)(layer * p->env.n_head_kv + kvh) * s->max_chunks;
    if (k >= g->middle_chunks)
        return;
    kvp_topk_indices(score, g->middle_chunks, k, s->topk, s->topk_scratch);
    int next = 0; /* s->topk is ascending */
    for (int m = 0; m < g->middle_chunks; m++) {
        if (next < k && s->topk[next] == m) {
            next++;
            continue;
        }
        int t0 = g->mid_begin + m * g->chunk;
        for (int t = t0; t < t0 + g->chunk; t++)
            kvp_kvcache_evict(p->env.kv, layer, kvh, t, g->n);
    }
}

/* Quest landmarks of (layer, kvh): per chunk of [0, chunk_end) still stored, the element-wise
 * min and max of its keys (post-RoPE, read back from the cache). */
static void build_landmarks(struct kvp_policy *p, int layer, int kvh)
{
    struct catekv_state *s = p->state;
    const struct kvp_kvcache *kv = p->env.kv;
    const int hd = p->env.head_dim, bs = p->env.block_size, c = s->geo.chunk;
    size_t base = (size_t)(layer * p->env.n_head_kv + kvh) * s->max_chunks;
    for (int m = 0; m < s->geo.chunks; m++) {
        int t0 = m * c;
        uint64_t ev = kvp_kvcache_evicted(kv, layer, kvh, t0 / bs);
        s->stored[base + m] = !((ev >> (t0 % bs)) & 1); /* chunks are kept or evicted whole */
        if (!s->stored[base + m])
            continue;
        float *mn = s->kmin + (base + m) * hd, *mx = s->kmax + (base + m) * hd;
        for (int t = t0; t < t0 + c; t++) {
            for (int d = 0; d < hd; d++) {
                float v = kvp_kvcache_key_at(kv, layer, kvh, t, d);
                mn[d] = t == t0 || v < mn[d] ? v : mn[d];
                mx[d] = t == t0 || v > mx[d] ? v : mx[d];
            }
        }
    }
}

/* After the last layer's prefill: classify (dynamic mode) and apply every head's cache. */
static void finish_prefill(struct kvp_policy *p)
{
    struct catekv_state *s = p->state;
    const struct kvp_catekv_geom *g = &s->geo;
    if (g->keep_all) {
        memset(s->adaptive, 1, (size_t)s->n_lh); /* nothing to compress: every head is dense */
        return;
    }
    if (s->profile)
        memcpy(s->adaptive, s->profile->adaptive, (size_t)s->n_lh);
    else
        kvp_catekv_split(s->cv, s->n_lh, eff_ratio(p), s->adaptive, s->cv_scratch);
    int mode = p->p.adaptive_mode;
    int eta_chunks = (int)floor(eff_eta(p) * g->middle_chunks + 1e-9);
    for (int l = 0; l < p->env.n_layer; l++)
        for (int h = 0; h < p->env.n_head_kv; h++) {
            bool adaptive = s->adaptive[l * p->env.n_head_kv + h];
            if (!adaptive)
                keep_top_chunks(p, l, h, g->select_sets);
            else if (mode == KVP_ADAPTIVE_FRACTION || mode == KVP_ADAPTIVE_QUEST)
                keep_top_chunks(p, l, h, eta_chunks);
            if (adaptive && mode == KVP_ADAPTIVE_QUEST)
                build_landmarks(p, l, h); /* chunks by slot: this head must not compact */
            else if (!adaptive || mode == KVP_ADAPTIVE_FRACTION)
                /* chunks smaller than a block, or not aligned to one, leave the blocks of
                 * evicted chunks partly alive: pack the prompt (these heads read every
                 * resident token, nothing of theirs depends on slots) */
                kvp_kvcache_compact(p->env.kv, l, h, g->n, g->n, NULL, NULL);
        }
}

static void catekv_prefill(struct kvp_policy *p, int layer, const struct kvp_prefill_obs *obs)
{
    struct catekv_state *s = p->state;
    const int g = p->env.n_head / p->env.n_head_kv;
    if (layer == 0) {
        s->prefilled = false;
        /* parameters were checked at init, so this cannot fail */
        kvp_catekv_geometry(obs->n_prompt, p->p.chunk, p->p.sink, p->p.local, p->p.tail_tokens,
                            prompt_budget(p, obs->n_prompt), &s->geo, NULL);
        if (s->pred) { /* adaptive heads read B tokens per step, whatever the context grows to */
            s->plan = *p;
            s->plan.p.budget = s->geo.budget;
            s->plan.p.budget_ratio = 0.0f;
        }
    }
    if (s->pred && !s->geo.keep_all)
        /* classes are known at the last layer (dynamic mode): start every head's history */
        for (int h = 0; h < p->env.n_head_kv; h++)
            if (!s->profile || s->profile->adaptive[layer * p->env.n_head_kv + h])
                kvp_predsel_prefill(s->pred, p, layer, h, obs);
    const struct kvp_catekv_geom *geo = &s->geo;
    if (!geo->keep_all) {
        for (int h = 0; h < p->env.n_head_kv; h++) {
            int lh = layer * p->env.n_head_kv + h;
            kvp_catekv_obs_matrix(obs, h, g, geo, s->A);
            kvp_catekv_chunk_scores(s->A, obs->n_obs, geo->middle_chunks, geo->chunk,
                                    s->score + (size_t)lh * s->max_chunks);
            if (!s->profile)
                s->cv[lh] = kvp_catekv_head_cv(s->A, obs->n_obs, geo->middle_chunks, geo->chunk,
                                               p->p.percentile, p->p.alpha, s->A_scratch);
        }
    }
    if (layer == p->env.n_layer - 1) {
        finish_prefill(p);
        s->prefilled = true;
    }
}

/* Quest selection over an adaptive head's stored chunks; false when it would keep them all. */
static bool quest_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                         uint64_t *masks)
{
    struct catekv_state *s = p->state;
    const struct kvp_catekv_geom *geo = &s->geo;
    const int hd = p->env.head_dim, g = p->env.n_head / p->env.n_head_kv, c = geo->chunk;
    const int bs = p->env.block_size;
    size_t base = (size_t)(layer * p->env.n_head_kv + kvh) * s->max_chunks;
    int *cand = s->qcand + base, *idx = s->qidx + base, *tmp = s->qtmp + base;
    float *sc = s->qscore + base;
    int n_cand = 0, k = geo->budget / c;
    for (int m = 0; m < geo->chunks; m++)
        if (s->stored[base + m])
            cand[n_cand++] = m;
    if (n_cand <= k)
        return false;
    for (int i = 0; i < n_cand; i++) {
        const float *mn = s->kmin + (base + cand[i]) * hd, *mx = s->kmax + (base + cand[i]) * hd;
        float best = -INFINITY;
        for (int j = 0; j < g; j++) {
            const float *qj = q + (size_t)j * hd;
            float ub = 0;
            for (int d = 0; d < hd; d++) {
                float a = qj[d] * mn[d], b = qj[d] * mx[d];
                ub += a > b ? a : b;
            }
            best = ub > best ? ub : best; /* max over the group (docs/methods.md §5) */
        }
        sc[i] = best;
    }
    kvp_topk_indices(sc, n_cand, k, idx, tmp);
    for (int i = 0; i < k; i++)
        kvp_mask_add_range(masks, cand[idx[i]] * c, cand[idx[i]] * c + c, bs);
    kvp_mask_add_range(masks, geo->chunk_end, n_tokens, bs);
    return true;
}

/* (layer, KV head) lh is an adaptive head that the CNN drives this sequence. */
static bool predicting(const struct catekv_state *s, int lh)
{
    return s->pred && s->prefilled && !s->geo.keep_all && s->adaptive[lh];
}

static void catekv_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                          struct kvp_sel *sel)
{
    struct catekv_state *s = p->state;
    const int bs = p->env.block_size, nb = (n_tokens + bs - 1) / bs;
    int lh = layer * p->env.n_head_kv + kvh;
    uint64_t *m = s->masks + (size_t)lh * s->max_blocks;
    memset(m, 0, (size_t)nb * sizeof(uint64_t));
    if (s->prefilled && !s->geo.keep_all && s->adaptive[lh] &&
        p->p.adaptive_mode == KVP_ADAPTIVE_QUEST && quest_select(p, layer, kvh, q, n_tokens, m)) {
        kvp_sel_from_masks(sel, m, nb);
        return;
    }
    if (predicting(s, lh)) {
        kvp_predsel_select(s->pred, &s->plan, layer, kvh, q, n_tokens, sel);
        return;
    }
    /* everything this head still stores: its fixed cache plus all generated tokens */
    const uint64_t full = bs == 64 ? ~0ULL : (1ULL << bs) - 1;
    for (int b = 0; b < nb; b++)
        m[b] = full & ~kvp_kvcache_evicted(p->env.kv, layer, kvh, b);
    kvp_sel_from_masks(sel, m, nb);
}

/* Adaptive heads in predictor mode: the step's attention extends their history. */
static void catekv_step(struct kvp_policy *p, int layer, int kvh, const struct kvp_sel *sel,
                        const float *probs, int probs_stride, int n_tokens)
{
    struct catekv_state *s = p->state;
    if (predicting(s, layer * p->env.n_head_kv + kvh))
        kvp_predsel_step(s->pred, &s->plan, layer, kvh, sel, probs, probs_stride, n_tokens);
}

int kvp_catekv_policy_cvs(const struct kvp_policy *p, double *cv, struct kvp_err *err)
{
    if (!p || strcmp(p->ops->name, "catekv") != 0)
        return kvp_err_set(err, KVP_EINVAL, "catekv CVs: the context does not run catekv");
    const struct catekv_state *s = p->state;
    if (!s->prefilled)
        return kvp_err_set(err, KVP_EINVAL, "catekv CVs: no prompt has been evaluated");
    if (s->profile)
        return kvp_err_set(err, KVP_EINVAL, "catekv CVs: a head profile is loaded (static mode)");
    if (s->geo.keep_all)
        return kvp_err_set(err, KVP_ERANGE,
                           "catekv CVs: prompt of %d tokens has no middle region to classify "
                           "(sink %d, recent %d, tail %d, budget %d)",
                           s->geo.n, s->geo.sink, s->geo.recent, s->geo.tail, s->geo.budget);
    memcpy(cv, s->cv, (size_t)s->n_lh * sizeof(double));
    return 0;
}

int kvp_catekv_policy_classes(const struct kvp_policy *p, uint8_t *adaptive)
{
    if (!p || strcmp(p->ops->name, "catekv") != 0 || !((struct catekv_state *)p->state)->prefilled)
        return -1;
    const struct catekv_state *s = p->state;
    memcpy(adaptive, s->adaptive, (size_t)s->n_lh);
    int n = 0;
    for (int i = 0; i < s->n_lh; i++)
        n += s->adaptive[i];
    return n;
}

/* Options: CateKV's own live in the public parameters (typed fields of the API, and CLI flags);
 * the option block is the predictor's, for --adaptive predictor. */
static const char *const adaptive_names[] = {"full", "fraction", "quest", "predictor", NULL};

#define PARAM(field) .home = KVP_OPT_PARAMS, .offset = offsetof(struct kvp_policy_params, field)
static const struct kvp_policy_opt catekv_opt_table[] = {
    {.type = KVP_OPT_CHOICE, .key = "adaptive", .flag = "--adaptive", PARAM(adaptive_mode),
     .choices = adaptive_names, .help = "how adaptive heads decode (default full)"},
    {.type = KVP_OPT_FLOAT, .key = "adaptive-ratio", .flag = "--adaptive-ratio",
     PARAM(adaptive_ratio), .min = 0, .max = 1, .zero_unset = true,
     .help = "fraction r of adaptive KV heads (default 0.4)"},
    {.type = KVP_OPT_FLOAT, .key = "eta", .flag = "--eta", PARAM(eta), .min = 0, .max = 1,
     .help = "fraction of middle chunks adaptive heads keep (default 1; 0.5 for fraction)"},
    {.type = KVP_OPT_INT, .key = "chunk", .flag = "--chunk", PARAM(chunk), .min = 1,
     .max = 1 << 24, .help = "chunk size c in tokens (default 8)"},
    {.type = KVP_OPT_INT, .key = "tail", .flag = "--tail", PARAM(tail_tokens), .min = 0,
     .max = 1 << 24, .zero_unset = true, .help = "unchunked prompt tail in tokens (default 32)"},
    {.type = KVP_OPT_FLOAT, .key = "percentile", .flag = "--percentile", PARAM(percentile),
     .min = 0, .max = 1, .help = "binarization quantile k in (0.5, 1) (default 0.995)"},
    {.type = KVP_OPT_FLOAT, .key = "alpha", .flag = "--alpha", PARAM(alpha), .min = 0, .max = 1,
     .zero_unset = true, .help = "binarization interpolation in [0, 1] (default 1)"},
    {.type = KVP_OPT_STR, .key = "head-profile", .flag = "--head-profile", PARAM(head_profile),
     .help = "static classes from kvpred profile-heads (default: classify every prompt)"},
    {.type = KVP_OPT_INCLUDE, .key = "predictor", .offset = 0, .sub = kvp_predsel_opt_table},
    {0},
};
#undef PARAM

const struct kvp_policy_ops kvp_policy_catekv = {
    .name = "catekv",
    .help = "CateKV: consistent heads keep sink + top chunks + tail, adaptive heads "
            "full/η/Quest/AttentionPredictor (predictor needs aux_path)",
    .evicting = true,
    .wants_obs = true,
    .opts = catekv_opt_table,
    .opts_size = sizeof(struct kvp_predsel_opts),
    .init = catekv_init,
    .free = catekv_free,
    .reset = catekv_reset,
    .on_prefill = catekv_prefill,
    .select = catekv_select,
    .on_step = catekv_step,
    .step_block_max = true, /* the predictor's history rows only */
};
