/*
 * `qpredictor`: the query-aware AttentionPredictor. The paper-faithful `predictor`
 * (docs/methods.md §1) predicts the next step's blocks from the attention history alone,
 * and a history cannot foresee the first answer token's jump to a needle, which only the query
 * reveals. This policy gives its CNN a second input channel: the current query's per-block
 * relevance bound, Quest's Σ_d max(q_d·M_d, q_d·m_d) over each block's element-wise key max M and
 * min m (the metadata quest keeps, src/kv/quest_meta.h, 1/8 of the keys), as the feature
 * exp(bound/√d − max bound/√d) in (0, 1] (kvp_qfeat_row), in the newest row of the second channel
 * next to the history. It scores the blocks of step t+1 from (history up to t, query t): in select
 * that is the step's own query (the history ends at the previous step), in predict_next the current
 * step's query after the current row was appended, so it still predicts one step ahead and can
 * drive the tiered store's prefetch.
 *
 * Per (compressed layer, KV head):
 *   history   one ring of H rows (the file's H), each the group's block max of the step's sparse
 *             probabilities (zero on blocks not read; no dense calibration rows: the query
 *             channel brings what calibration brought, without reading every key); prefill
 *             starts it from the observation window's rows;
 *   bounds    for every candidate block of the plan, each query head's bound (two SIMD row
 *             dots per head over the metadata); the group's feature is the max of its heads';
 *   candidates the k + extra blocks with the best feature (option prune=1, the default;
 *             prune=0 scores every block); recent=1 adds every block the newest history row
 *             holds (the blocks just read), which lets the history pull distractor needles
 *             back in: off by default (seed 1234, niah_multikey at 1/8: 40 % with it, 75 %
 *             without);
 *   CNN       only at the candidates (kvp_cnn_forward_cols: the receptive field is 5 blocks), and
 *             of each candidate only the rows whose 5-block neighbourhood holds history or the
 *             query row (rows that see zeros only are constants);
 *   selection the sink, the block-aligned local window and the k best candidates (kvp_block_plan,
 *             as quest and predictor), one selection per KV head.
 * Files made for it are trained with `kvpred train-predictor --query --group --sparse-history`
 * on version 2 traces (they record the bounds); a one-channel file is refused.
 *
 * Options (p.opts): extra=N candidates beyond k [16]; prune=0|1 [1]; recent=0|1 [0];
 * margin=N blocks the prediction for the tiered store takes beyond the k + extra candidates
 * [128: at 32768 tokens the paired disk/RAM ratio was 1.16-1.20x with 64 (hit rate 97.2 %)
 * and 1.08-1.14x with 128 (99.1 %), three alternating pairs each, for ~6 % more hot tier];
 * q8=0|1 the bound pass over an 8-bit copy of the metadata (quest_meta8.h) [0]; groups=G,
 * coarse=exact|approx, visit=V, floor=N the candidate pass coarse-to-fine, as quest's (below)
 * [0: flat; floor 1024 blocks].
 *
 * Coarse-to-fine candidates (groups=G > 0, prune=1; q8=1 with coarse=approx only, which then
 * bounds groups and blocks from 8-bit copies of both levels; policy/coarse_sel.h). The feature
 * needs each head's largest bound over the candidates, M_j: the groups' bounds per head are
 * visited best first until the next one cannot beat the largest block bound found (exact), and
 * a group's feature bound is then max_j(group bound_j − M_j), >= its blocks' features (every step
 * monotone); the k + extra best features come from the same branch and bound over groups, and
 * the CNN's neighbourhoods outside the visited groups are bounded on demand. So in the exact mode
 * the candidates, their features and the selection are the flat pass's; coarse=approx ranks
 * the groups once for all heads and bounds the best ceil(V·(k + extra)/G) of them, and at least
 * the ceil(N/G) that hold `floor` blocks; up to N candidate blocks it ranks flat (see
 * approx_prepare below and quest's notes). The tiered store's prediction takes its
 * k + extra + margin from the same pass (the groups' feature bounds of select, kept).
 *
 * Threading: state per (layer, KV head), scratch per KV head (layers run one after another).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "kernels/simd.h"
#include "kv/kvcache.h"
#include "policy/options.h"
#include "policy/policy.h"
#include "kv/quest_meta.h"
#include "kv/quest_meta8.h"
#include "policy/coarse_sel.h"
#include "predictor/cnn.h"
#include "predictor/history.h"

struct qp_kvh { /* scratch of one KV head */
    struct kvp_cnn_cols_scratch cols;
    float *ub;         /* [g][max_blocks] the heads' bounds over the candidates */
    float *comb;       /* [max_blocks] group max of bound − head max (log feature) */
    float *feat;       /* [max_blocks] feature, valid where fmark is set */
    float *fval;       /* [max_blocks] features to exponentiate, at columns fcol */
    int *fcol;         /* [max_blocks] */
    uint8_t *fmark;    /* [max_blocks] */
    uint8_t *cmark;    /* [max_blocks] */
    float *row, *grow; /* [max_blocks] pooled rows */
    float *cscore;     /* [max_blocks] candidate scores */
    int *cand;         /* [max_blocks] candidate columns */
    int *top, *heap;   /* [max_blocks] */
    int32_t *chosen;   /* [max_blocks] */
    uint64_t *masks;   /* [max_blocks] */
    const float **rows;/* [H] */
    /* which ranking comb holds: choose()'s for (layer, KV head) comb_lh, columns from comb_first,
     * comb_w of them (comb_lh -1: none); predict_next reuses it */
    int comb_lh, comb_first, comb_w;
    /* coarse-to-fine (groups > 0): per head the groups' bounds [g][n_groups] and largest block
     * bound mj[g], the groups' feature bounds, which groups hold bounds (for comb's ranking) */
    float *gub, *gcomb, *mj;
    uint8_t *gvis;
    int *gheap, *bheap;
    int32_t *gout;   /* [max_blocks] */
    float *cval;     /* [max_blocks] the approximate ranking's scored blocks */
    bool coarse_ok;  /* comb's ranking came from the groups (only visited columns valid) */
    int q_first, q_end; /* that ranking's candidate range */
};

struct qp_state {
    struct kvp_cnn cnn;
    struct kvp_qmeta meta;
    struct kvp_qmeta8 meta8; /* the 8-bit copy the bound pass reads (q8=1) */
    struct kvp_hist hist; /* series (layer - first_layer) * n_head_kv + kvh */
    int first_layer, n_head_kv, g, hd, max_blocks;
    int extra, prune, margin, recent, q8;
    int groups;          /* coarse-to-fine candidates: blocks per group (0: flat) */
    float visit;         /* approx: groups visited per group's worth of candidates (0: exact) */
    int floor_blocks;    /* approx: blocks bounded at least (option floor) */
    struct kvp_qmeta gmeta;
    struct kvp_qmeta8 gmeta8; /* q8=1 with groups: the groups' 8-bit copy */
    int n_groups;
    float *lastq;         /* [n_layer * n_head_kv][g][hd] the last query (select or prompt) */
    bool *has_q;          /* [n_layer * n_head_kv] */
    struct qp_kvh *kv;    /* [n_head_kv] */
};

/* Options (p.opts, "key=value,...", read through the table below). */
struct qp_opts {
    int extra, prune, recent, margin, q8, groups, coarse;
    float visit;
    int floor;
};

static const char *const qp_coarse_names[] = {"exact", "approx", NULL};

static const struct kvp_policy_opt qp_opt_table[] = {
    {.type = KVP_OPT_INT, .key = "extra", .offset = offsetof(struct qp_opts, extra), .min = 0,
     .max = 1 << 20, .def = 16, .help = "candidate blocks beyond the budget's k, by the bound"},
    {.type = KVP_OPT_INT, .key = "prune", .offset = offsetof(struct qp_opts, prune), .min = 0,
     .max = 1, .def = 1, .help = "run the CNN only at the candidates (0: at every block)"},
    {.type = KVP_OPT_INT, .key = "recent", .offset = offsetof(struct qp_opts, recent), .min = 0,
     .max = 1, .def = 0, .help = "add the blocks the newest history row holds to the candidates"},
    {.type = KVP_OPT_INT, .key = "margin", .offset = offsetof(struct qp_opts, margin), .min = 0,
     .max = 1 << 20, .def = 128,
     .help = "the tiered store's prefetch margin in blocks (predictions read this many more)"},
    {.type = KVP_OPT_INT, .key = "q8", .offset = offsetof(struct qp_opts, q8), .min = 0,
     .max = 1, .def = 0,
     .help = "bound pass over 8-bit metadata (conservative ranges, u8 query; 0: exact bounds)"},
    {.type = KVP_OPT_INT, .key = "groups", .offset = offsetof(struct qp_opts, groups), .min = 0,
     .max = 4096, .def = 0,
     .help = "coarse-to-fine candidates: blocks per group (0: flat pass; needs prune=1, and "
             "coarse=approx with q8=1)"},
    {.type = KVP_OPT_CHOICE, .key = "coarse", .offset = offsetof(struct qp_opts, coarse),
     .choices = qp_coarse_names, .def = 0,
     .help = "coarse-to-fine mode: exact (the flat candidates) or approx (visit-limited)"},
    {.type = KVP_OPT_FLOAT, .key = "visit", .offset = offsetof(struct qp_opts, visit),
     .min = 0.01, .max = 1 << 20, .def = 4,
     .help = "coarse=approx: groups visited, as a multiple of ceil((k + extra) / groups)"},
    {.type = KVP_OPT_INT, .key = "floor", .offset = offsetof(struct qp_opts, floor), .min = 0,
     .max = 1 << 30, .def = KVP_COARSE_FLOOR_DEFAULT,
     .help = "coarse=approx: blocks bounded at least (the flat pass up to this many candidates)"},
    {0},
};

static void qp_free(struct kvp_policy *p)
{
    struct qp_state *s = p->state;
    if (!s)
        return;
    if (s->kv)
        for (int h = 0; h < s->n_head_kv; h++) {
            struct qp_kvh *k = &s->kv[h];
            kvp_cnn_cols_scratch_free(&k->cols);
            free(k->ub);
            free(k->comb);
            free(k->feat);
            free(k->fmark);
            free(k->cmark);
            free(k->row);
            free(k->grow);
            free(k->cscore);
            free(k->cand);
            free(k->top);
            free(k->heap);
            free(k->chosen);
            free(k->masks);
            free(k->rows);
            free(k->gub);
            free(k->gcomb);
            free(k->mj);
            free(k->gvis);
            free(k->gheap);
            free(k->bheap);
            free(k->cval);
            free(k->gout);
            free(k->fval);
            free(k->fcol);
        }
    free(s->kv);
    free(s->lastq);
    free(s->has_q);
    kvp_hist_free(&s->hist);
    kvp_qmeta8_free(&s->meta8);
    kvp_qmeta8_free(&s->gmeta8);
    kvp_qmeta_free(&s->gmeta);
    kvp_qmeta_free(&s->meta);
    kvp_cnn_free(&s->cnn);
    free(s);
    p->state = NULL;
}

static int qp_init(struct kvp_policy *p, struct kvp_err *err)
{
    const struct kvp_policy_env *e = &p->env;
    struct qp_state *s = calloc(1, sizeof(*s));
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "qpredictor: out of memory");
    p->state = s;
    const struct qp_opts *o = p->opt;
    s->extra = o->extra;
    s->prune = o->prune;
    s->recent = o->recent;
    s->margin = o->margin;
    s->q8 = o->q8;
    s->groups = o->groups;
    s->visit = o->coarse == 1 ? o->visit : 0.0f;
    s->floor_blocks = o->floor;
    int rc;
    if (!p->p.aux_path || !*p->p.aux_path) {
        rc = kvp_err_set(err, KVP_EINVAL,
                         "qpredictor: no predictor file (set aux_path, "
                         "e.g. --aux models/kvpred-default.qkvpp)");
        goto fail;
    }
    if ((rc = kvp_cnn_load(p->p.aux_path, &s->cnn, err)) < 0)
        goto fail;
    if (s->cnn.cin != 2) {
        rc = kvp_err_set(err, KVP_EINVAL,
                         "qpredictor: %s has %d input channel(s); it needs the query channel "
                         "(train-predictor --query)",
                         p->p.aux_path, s->cnn.cin);
        goto fail;
    }
    if (s->cnn.c2 > KVP_CNN_COLS_C2) {
        rc = kvp_err_set(err, KVP_EINVAL, "qpredictor: %s has %d conv2 channels (at most %d)",
                         p->p.aux_path, s->cnn.c2, KVP_CNN_COLS_C2);
        goto fail;
    }
    if (s->cnn.block_size != e->block_size) {
        rc = kvp_err_set(err, KVP_EINVAL,
                         "qpredictor: %s was trained for blocks of %d tokens, the cache uses %d",
                         p->p.aux_path, s->cnn.block_size, e->block_size);
        goto fail;
    }
    s->first_layer = p->p.dense_layers;
    s->n_head_kv = e->n_head_kv;
    s->g = e->n_head / e->n_head_kv;
    s->hd = e->head_dim;
    s->max_blocks = (e->n_ctx + e->block_size - 1) / e->block_size;
    const int mb = s->max_blocks, n_comp = e->n_layer - s->first_layer;
    const size_t n_lh = (size_t)e->n_layer * e->n_head_kv;
    if ((rc = kvp_hist_init(&s->hist, n_comp * e->n_head_kv, s->cnn.H, mb, err)) < 0)
        goto fail;
    s->lastq = malloc(n_lh * s->g * s->hd * sizeof(float));
    s->has_q = calloc(n_lh, sizeof(bool));
    s->kv = calloc((size_t)e->n_head_kv, sizeof(*s->kv));
    if (kvp_qmeta_init(&s->meta, e->n_layer, e->n_head_kv, mb, e->head_dim, e->block_size) < 0 ||
        !s->lastq || !s->has_q || !s->kv)
        goto nomem;
    if (s->q8 && kvp_qmeta8_init(&s->meta8, &s->meta) < 0) {
        rc = kvp_err_set(err, KVP_EINVAL, "qpredictor: q8=1 needs head_dim <= 256 (%d), and memory",
                         e->head_dim);
        goto fail;
    }
    if (s->groups > 0 && (!s->prune || (s->q8 && s->visit <= 0.0f))) {
        rc = kvp_err_set(err, KVP_EINVAL,
                         "qpredictor: groups=%d needs pruned candidates (prune=1), and with "
                         "q8=1 coarse=approx (the exact mode needs the exact bounds)",
                         s->groups);
        goto fail;
    }
    if (s->groups > 0) {
        s->n_groups = (mb + s->groups - 1) / s->groups;
        if (kvp_qmeta_group_init(&s->gmeta, &s->meta, s->groups) < 0)
            goto nomem;
        if (s->q8 && (s->g > KVP_QMETA_SEL_HEADS || kvp_qmeta8_init(&s->gmeta8, &s->gmeta) < 0)) {
            rc = kvp_err_set(err, KVP_EINVAL,
                             "qpredictor: q8=1 with groups needs at most %d query heads a KV "
                             "head, and memory",
                             KVP_QMETA_SEL_HEADS);
            goto fail;
        }
    }
    for (int h = 0; h < e->n_head_kv; h++) {
        struct qp_kvh *k = &s->kv[h];
        if (s->groups > 0) {
            const size_t ng = (size_t)s->n_groups;
            k->gub = malloc((size_t)s->g * ng * sizeof(float));
            k->gcomb = malloc(ng * sizeof(float));
            k->mj = malloc((size_t)s->g * sizeof(float));
            k->gvis = calloc(ng, 1);
            k->gheap = malloc(2 * ng * sizeof(int));
            k->bheap = malloc(KVP_COARSE_APPROX_INTS((size_t)mb) * sizeof(int));
            k->cval = malloc((size_t)mb * sizeof(float));
            k->gout = malloc((size_t)mb * sizeof(int32_t));
            if (!k->gub || !k->gcomb || !k->mj || !k->gvis || !k->gheap || !k->bheap ||
                !k->cval || !k->gout)
                goto nomem;
        }
        if ((rc = kvp_cnn_cols_scratch_init(&k->cols, &s->cnn, s->cnn.H, mb, err)) < 0)
            goto fail;
        k->ub = malloc((size_t)s->g * mb * sizeof(float));
        k->comb = malloc((size_t)mb * sizeof(float));
        k->feat = malloc((size_t)mb * sizeof(float));
        k->fval = malloc((size_t)mb * sizeof(float));
        k->fcol = malloc((size_t)mb * sizeof(int));
        k->fmark = calloc((size_t)mb, 1);
        k->cmark = calloc((size_t)mb, 1);
        k->row = malloc((size_t)mb * sizeof(float));
        k->grow = malloc((size_t)mb * sizeof(float));
        k->cscore = malloc((size_t)mb * sizeof(float));
        k->cand = malloc((size_t)mb * sizeof(int));
        k->top = malloc((size_t)mb * sizeof(int));
        k->heap = malloc((size_t)mb * sizeof(int));
        k->chosen = malloc((size_t)mb * sizeof(int32_t));
        k->masks = malloc((size_t)mb * sizeof(uint64_t));
        k->rows = malloc((size_t)s->cnn.H * sizeof(*k->rows));
        k->comb_lh = -1;
        if (!k->ub || !k->comb || !k->feat || !k->fval || !k->fcol || !k->fmark || !k->cmark ||
            !k->row || !k->grow || !k->cscore || !k->cand || !k->top || !k->heap || !k->chosen ||
            !k->masks || !k->rows)
            goto nomem;
    }
    p->p.window = s->cnn.H; /* the prefill rows start the history */
    p->prefetch_margin = s->margin;
    return 0;
nomem:
    rc = kvp_err_set(err, KVP_ENOMEM, "qpredictor: out of memory for context %d", e->n_ctx);
fail:
    qp_free(p);
    return rc;
}

static void qp_reset(struct kvp_policy *p)
{
    struct qp_state *s = p->state;
    kvp_hist_reset(&s->hist);
    kvp_qmeta_reset(&s->meta);
    if (s->groups > 0)
        kvp_qmeta_reset(&s->gmeta);
    if (s->q8)
        kvp_qmeta8_reset(&s->meta8);
    if (s->q8 && s->groups > 0)
        kvp_qmeta8_reset(&s->gmeta8);
    memset(s->has_q, 0, (size_t)p->env.n_layer * s->n_head_kv * sizeof(bool));
    for (int h = 0; h < s->n_head_kv; h++)
        s->kv[h].comb_lh = -1;
}

static int series_of(const struct qp_state *s, int layer, int kvh)
{
    return (layer - s->first_layer) * s->n_head_kv + kvh;
}

static void qp_prefill(struct kvp_policy *p, int layer, const struct kvp_prefill_obs *obs)
{
    struct qp_state *s = p->state;
    if (layer < s->first_layer)
        return;
    const int bs = p->env.block_size, g = s->g, n = obs->n_prompt;
    const int first = obs->n_obs > s->cnn.H ? obs->n_obs - s->cnn.H : 0;
    for (int kvh = 0; kvh < s->n_head_kv; kvh++) {
        struct qp_kvh *k = &s->kv[kvh];
        const int lh = layer * s->n_head_kv + kvh, ser = series_of(s, layer, kvh);
        kvp_qmeta_restart(&s->meta, lh);
        kvp_qmeta_fold(&s->meta, p->env.kv, layer, kvh, n);
        if (s->groups > 0) {
            kvp_qmeta_restart(&s->gmeta, lh);
            kvp_qmeta_group_update(&s->gmeta, &s->meta, lh, n);
        }
        if (s->q8) {
            kvp_qmeta8_restart(&s->meta8, lh);
            kvp_qmeta8_update(&s->meta8, &s->meta, lh, n);
        }
        if (s->q8 && s->groups > 0) {
            kvp_qmeta8_restart(&s->gmeta8, lh);
            kvp_qmeta8_update(&s->gmeta8, &s->gmeta, lh, n);
        }
        if (obs->q_last) {
            size_t gq = (size_t)g * s->hd;
            memcpy(s->lastq + lh * gq, obs->q_last + kvh * gq, gq * sizeof(float));
            s->has_q[lh] = true;
        }
        kvp_hist_clear(&s->hist, ser);
        for (int i = first; i < obs->n_obs; i++) {
            int nb = 0;
            for (int j = 0; j < g; j++) {
                const float *row = obs->obs + ((size_t)(kvh * g + j) * obs->n_obs + i) * n;
                nb = kvp_hist_pool_dense(row, n, bs, k->row);
                for (int c = 0; c < nb; c++)
                    k->grow[c] = j == 0 || k->row[c] > k->grow[c] ? k->row[c] : k->grow[c];
            }
            kvp_hist_append(&s->hist, ser, k->grow, nb);
        }
    }
}

/* The group's log feature over W bounds per head (rows stride apart): comb[x] = max over the
 * heads of ub[x] − the head's largest bound. Lane by lane: every lane starts from ub[0] and
 * keeps "larger, else the kept one" as the scalar loop does, so the max is the same value
 * (NaN in ub[0] stays, NaN elsewhere is skipped), up to the sign of a zero, which the
 * differences, exp and the rankings treat alike. */
KVP_X86_CLONES static void group_feature(const float *ub0, int g, int stride, int W, float *comb)
{
    typedef float v16 __attribute__((vector_size(64)));
    typedef int32_t i16 __attribute__((vector_size(64)));
    const int W16 = W / 16 * 16;
    for (int j = 0; j < g; j++) {
        const float *ub = ub0 + (size_t)j * stride;
        v16 m = (v16){0} + ub[0], x, c;
        for (int i = 0; i < W16; i += 16) {
            memcpy(&x, ub + i, sizeof(x));
            i16 gt = x > m;
            m = (v16)((gt & (i16)x) | (~gt & (i16)m));
        }
        float mx = m[0];
        for (int l = 1; l < 16; l++)
            mx = m[l] > mx ? m[l] : mx;
        for (int i = W16; i < W; i++)
            mx = ub[i] > mx ? ub[i] : mx;
        const v16 mv = (v16){0} + mx;
        for (int i = 0; i < W16; i += 16) {
            memcpy(&x, ub + i, sizeof(x));
            x -= mv;
            if (j > 0) {
                memcpy(&c, comb + i, sizeof(c));
                i16 gt = x > c;
                x = (v16)((gt & (i16)x) | (~gt & (i16)c));
            }
            memcpy(comb + i, &x, sizeof(x));
        }
        for (int i = W16; i < W; i++) {
            float v = ub[i] - mx;
            comb[i] = j == 0 || v > comb[i] ? v : comb[i];
        }
    }
}

/* The group's bounds over blocks [first, end) (exact, or from the 8-bit copy with q8=1) and
 * their log feature into k->comb. */
static void rank_bounds(struct qp_state *s, struct qp_kvh *k, int lh, const float *q, int first,
                        int end)
{
    const float scale = 1.0f / sqrtf((float)s->hd);
    if (s->q8)
        kvp_qmeta8_bounds(&s->meta8, lh, q, s->g, scale, first, end, k->ub, s->max_blocks);
    else
        kvp_qmeta_bounds(&s->meta, lh, q, s->g, scale, first, end, k->ub, s->max_blocks);
    group_feature(k->ub, s->g, s->max_blocks, end - first, k->comb);
}

/* *mx (in: the running maximum) raised to the largest of u[b] over the blocks b of groups gids[0,
 * m) (group i: blocks [i·G, (i + 1)·G) clipped to [first, end); a whole row of n is the one
 * group 0 with G = end = n); "larger, else the kept one" in 16 lanes kept across the groups, as in
 * group_feature (so the same value up to the sign of a zero); false when one of them is a NaN.
 * The approximate pass takes each head's maximum over ~1000 bounds a step, which as one chain of
 * compares waited on each compare's latency. */
KVP_X86_CLONES static bool max_no_nan(const float *u, const int *gids, int m, int G, int first,
                                      int end, float *mx)
{
    typedef float v16 __attribute__((vector_size(64)));
    typedef int32_t i16 __attribute__((vector_size(64)));
    v16 acc = (v16){0} + *mx, x;
    i16 bad = (i16){0};
    float r = *mx;
    for (int i = 0; i < m; i++) {
        const int b1 = kvp_coarse_hi(gids[i], G, end);
        int b = kvp_coarse_lo(gids[i], G, first);
        for (; b + 16 <= b1; b += 16) {
            memcpy(&x, u + b, sizeof(x));
            bad |= x != x;
            i16 gt = x > acc;
            acc = (v16)((gt & (i16)x) | (~gt & (i16)acc));
        }
        for (; b < b1; b++) {
            if (u[b] != u[b])
                return false;
            r = u[b] > r ? u[b] : r;
        }
    }
    for (int l = 0; l < 16; l++) {
        if (bad[l])
            return false;
        r = acc[l] > r ? acc[l] : r;
    }
    *mx = r;
    return true;
}

/* ---- coarse-to-fine candidates (see the top of the file) ---- */

struct qp_coarse_ctx {
    struct qp_state *s;
    struct qp_kvh *k;
    int lh, first, end;
    const float *q;
    struct kvp_qmeta_query qq;   /* q's term rows (scaled by 1/√d), decided once */
    struct kvp_qmeta8_query qq8; /* q8=1: q packed once (scaled by 1/√d) */
};

/* A context for ranking [first, end) of lh under q; the prepared queries (12 KB) are left
 * alone until query_prep fills them. */
static void coarse_ctx_init(struct qp_coarse_ctx *c, struct qp_state *s, struct qp_kvh *k, int lh,
                            int first, int end, const float *q)
{
    c->s = s;
    c->k = k;
    c->lh = lh;
    c->first = first;
    c->end = end;
    c->q = q;
}

/* q's prepared forms for the bounds of this ranking (exact or 8-bit). */
static void coarse_query_prep(struct qp_coarse_ctx *c)
{
    const float scale = 1.0f / sqrtf((float)c->s->hd);
    if (c->s->q8)
        kvp_qmeta8_query_prep(&c->s->meta8, &c->qq8, c->q, c->s->g, scale); /* g checked */
    else
        kvp_qmeta_query_prep(&c->s->meta, &c->qq, c->q, c->s->g, scale);
}

/* Every head's bounds of blocks [b0, b1), or with groups of groups [b0, b1), into out (heads
 * stride apart), from the exact tiles or the 8-bit copies (q8). */
static void coarse_bounds(const struct qp_coarse_ctx *c, bool groups, int b0, int b1, float *out,
                          int stride)
{
    const struct qp_state *s = c->s;
    if (s->q8)
        kvp_qmeta8_bounds_q(groups ? &s->gmeta8 : &s->meta8, c->lh, &c->qq8, b0, b1, out, stride);
    else
        kvp_qmeta_bounds_q(groups ? &s->gmeta : &s->meta, c->lh, &c->qq, b0, b1, out, stride);
}

/* The bounds of group gi's candidate columns, once per ranking. */
static void visit_group(struct qp_coarse_ctx *c, int gi)
{
    struct qp_kvh *k = c->k;
    if (k->gvis[gi])
        return;
    const int G = c->s->groups;
    const int b0 = kvp_coarse_lo(gi, G, c->first), b1 = kvp_coarse_hi(gi, G, c->end);
    coarse_bounds(c, false, b0, b1, k->ub + (b0 - c->first), c->s->max_blocks);
    k->gvis[gi] = 1;
}

/* comb over columns [x0, x1) from the heads' bounds and maxima, as group_feature computes it
 * (head 0's difference, then "larger, else the kept one" over the heads) */
static void comb_cols(const struct qp_state *s, struct qp_kvh *k, int x0, int x1)
{
    for (int x = x0; x < x1; x++) {
        float c = k->ub[x] - k->mj[0];
        for (int j = 1; j < s->g; j++) {
            const float v = k->ub[(size_t)j * s->max_blocks + x] - k->mj[j];
            c = v > c ? v : c;
        }
        k->comb[x] = c;
    }
}

/* Blocks [b0, b1): whole groups but the ends' (a run of adjacent groups in the approximate
 * ranking, one group in the exact one). */
static void coarse_fn(void *ctx, int b0, int b1)
{
    struct qp_coarse_ctx *c = ctx;
    for (int gi = b0 / c->s->groups; gi * c->s->groups < b1; gi++)
        visit_group(c, gi);
    comb_cols(c->s, c->k, b0 - c->first, b1 - c->first);
}

/* Most groups either search visits (approximate mode), for a top of `want`. */
static int coarse_limit(const struct qp_state *s, int want)
{
    if (s->visit <= 0.0f)
        return 0;
    return kvp_coarse_limit(s->visit, s->floor_blocks, s->groups, want);
}

/* Whether candidates [first, end) rank through the groups (kvp_coarse_pays). */
static bool coarse_pays(const struct qp_state *s, int first, int end)
{
    return kvp_coarse_pays(s->visit, s->floor_blocks, end - first);
}

/* Group i's feature bound: the largest, over the g query heads, of its bound (gub, ng groups a
 * head) minus that head's largest bound M_j (mj). */
static float group_gap(const struct qp_kvh *k, int g, int ng, int i)
{
    float cg = k->gub[i] - k->mj[0];
    for (int j = 1; j < g; j++) {
        const float v = k->gub[(size_t)j * ng + i] - k->mj[j];
        cg = v > cg ? v : cg;
    }
    return cg;
}

/* The exact mode: each head's largest bound over [first, end), M_j, by branch and bound over its
 * groups' bounds (gub, columns from group g0); then every group's feature bound into gcomb. False
 * on a NaN (the caller ranks flat). */
static bool coarse_prepare(struct qp_coarse_ctx *c)
{
    struct qp_state *s = c->s;
    struct qp_kvh *k = c->k;
    const int G = s->groups, g0 = c->first / G, g1 = (c->end - 1) / G + 1, ng = g1 - g0;
    memset(k->gvis + g0, 0, (size_t)ng);
    coarse_query_prep(c); /* the exact bounds: q8 is refused with the exact mode */
    coarse_bounds(c, true, g0, g1, k->gub, ng);
    for (int i = 0; i < s->g * ng; i++)
        if (k->gub[i] != k->gub[i])
            return false;
    for (int j = 0; j < s->g; j++) {
        const float *gj = k->gub + (size_t)j * ng;
        for (int i = 0; i < ng; i++) /* by group id, as the ordering reads it */
            k->gcomb[g0 + i] = gj[i];
        int n_heap = kvp_coarse_order_init(k->gcomb, g0, g1, k->gheap);
        float best = -INFINITY;
        bool found = false;
        while (n_heap > 0) {
            const int gi = kvp_coarse_order_pop(k->gcomb, k->gheap, &n_heap);
            if (found && k->gcomb[gi] <= best)
                break; /* no block of this group or a later one has a larger bound */
            visit_group(c, gi);
            const int b0 = kvp_coarse_lo(gi, G, c->first), b1 = kvp_coarse_hi(gi, G, c->end);
            for (int b = b0; b < b1; b++) {
                const float v = k->ub[(size_t)j * s->max_blocks + (b - c->first)];
                if (v != v)
                    return false;
                best = !found || v > best ? v : best;
                found = true;
            }
        }
        k->mj[j] = best;
    }
    for (int i = 0; i < ng; i++) {
        const float cg = group_gap(k, s->g, ng, i);
        if (cg != cg)
            return false;
        k->gcomb[g0 + i] = cg;
    }
    return true;
}

/* The `want` best columns of [first, end) by comb through the groups (exact mode), into k->top
 * (columns, ascending); comb is valid on every visited group. -1: rank flat. */
static int coarse_top(struct qp_coarse_ctx *c, int want)
{
    struct qp_state *s = c->s;
    struct qp_kvh *k = c->k;
    int n = kvp_coarse_topk(k->gcomb, k->comb, s->groups, c->first, c->end, want, 0, coarse_fn,
                            NULL, c, k->gheap, k->bheap, k->cval, k->gout, NULL);
    if (n < 0)
        return -1;
    for (int i = 0; i < n; i++)
        k->top[i] = k->gout[i] - c->first;
    return n;
}

/* comb valid at column x (its group bounded). */
static void coarse_ensure(struct qp_coarse_ctx *c, int x)
{
    const int gi = (c->first + x) / c->s->groups;
    if (!c->k->gvis[gi]) {
        visit_group(c, gi);
        const int G = c->s->groups;
        const int b0 = kvp_coarse_lo(gi, G, c->first), b1 = kvp_coarse_hi(gi, G, c->end);
        comb_cols(c->s, c->k, b0 - c->first, b1 - c->first);
    }
}

/* ---- the approximate candidate pass (coarse=approx): one pass shared by the group's heads ----
 *
 * The exact pass above searches each head's largest bound M_j over the groups separately (a head
 * visits the groups its own bounds favour), then the candidates over the combined feature: up to
 * g + 1 searches, each visiting its own groups, so at long context its hooks cost more than
 * quest's flat pass (22-24 ms against 20.7 per token at 131072 tokens, 1/32). Here the groups are
 * ranked once, by the group-level feature max_j(group bound_j − max over groups of bound_j) (the
 * feature's formula on the groups' bounds: a group whose bound is far below its head's best group
 * holds no block near that head's best block), the ceil(V·(k + extra)/G) best groups (more if they
 * hold fewer than k + extra blocks: kvp_coarse_pick) are bounded for every head in one call per
 * run of adjacent groups, M_j is the largest bound of head j over the blocks bounded, and the
 * candidates are the k + extra best of those blocks by the feature. Only the CNN's neighbourhood
 * columns in a group not visited are bounded besides (coarse_ensure), their feature capped at 1
 * (their bound may exceed the M_j of the visited blocks). */

/* q8: the 8-bit tiles of a group to come, unless visited (as quest's, only the 8-bit ones). */
static void approx_fetch(void *ctx, int b0, int b1)
{
    const struct qp_coarse_ctx *c = ctx;
    if (!c->k->gvis[b0 / c->s->groups])
        kvp_qmeta8_prefetch(&c->s->meta8, c->lh, b0, b1);
}

/* Bounds of every head and the feature over the groups gids[0, m) (ascending), run by run;
 * groups visited before are skipped. */
static void approx_visit(struct qp_coarse_ctx *c, const int *gids, int m, bool comb)
{
    struct qp_kvh *k = c->k;
    const int G = c->s->groups;
    int fetched = 0;
    for (int i = 0; i < m;) {
        if (k->gvis[gids[i]]) {
            i++;
            continue;
        }
        int j = i + 1; /* a run of adjacent groups not visited yet */
        while (j < m && gids[j] == gids[j - 1] + 1 && !k->gvis[gids[j]])
            j++;
        kvp_coarse_fetch_until(gids, m, j + KVP_COARSE_FETCH_AHEAD, G, c->first, c->end,
                               c->s->q8 ? approx_fetch : NULL, c, &fetched);
        const int b0 = kvp_coarse_lo(gids[i], G, c->first);
        const int b1 = kvp_coarse_hi(gids[j - 1], G, c->end);
        coarse_bounds(c, false, b0, b1, k->ub + (b0 - c->first), c->s->max_blocks);
        for (int x = i; x < j; x++)
            k->gvis[gids[x]] = 1;
        if (comb)
            comb_cols(c->s, k, b0 - c->first, b1 - c->first);
        i = j;
    }
}

/* Group bounds, the group ranking, the visit of the groups a top of `want` takes, M_j and the
 * feature over them. False on a NaN (the caller ranks flat). */
static bool approx_prepare(struct qp_coarse_ctx *c, int want)
{
    struct qp_state *s = c->s;
    struct qp_kvh *k = c->k;
    const int G = s->groups, g0 = c->first / G, g1 = (c->end - 1) / G + 1, ng = g1 - g0;
    memset(k->gvis + g0, 0, (size_t)ng);
    coarse_query_prep(c);
    coarse_bounds(c, true, g0, g1, k->gub, ng);
    static const int whole_row = 0;
    for (int j = 0; j < s->g; j++) { /* each head's best group bound */
        k->mj[j] = -INFINITY;
        if (!max_no_nan(k->gub + (size_t)j * ng, &whole_row, 1, ng, 0, ng, &k->mj[j]))
            return false;
    }
    for (int i = 0; i < ng; i++)
        k->gcomb[g0 + i] = group_gap(k, s->g, ng, i);
    int nb, *gids = k->gheap;
    const int m = kvp_coarse_pick(k->gcomb, G, c->first, c->end, want, coarse_limit(s, want),
                                  gids, k->gheap + ng, &nb);
    approx_visit(c, gids, m, false);
    for (int j = 0; j < s->g; j++) { /* M_j over the blocks bounded */
        k->mj[j] = -INFINITY;
        if (!max_no_nan(k->ub + (size_t)j * s->max_blocks - c->first, gids, m, G, c->first,
                        c->end, &k->mj[j]))
            return false;
    }
    for (int i = 0; i < m; i++) {
        const int b0 = kvp_coarse_lo(gids[i], G, c->first), b1 = kvp_coarse_hi(gids[i], G, c->end);
        comb_cols(s, k, b0 - c->first, b1 - c->first);
    }
    return true;
}

/* The `want` best columns by comb among the blocks of the groups a top of `want` takes (visiting
 * those not visited yet), into k->top (columns, ascending). Returns how many (want unless the
 * candidates are fewer). */
static int approx_top(struct qp_coarse_ctx *c, int want)
{
    struct qp_state *s = c->s;
    struct qp_kvh *k = c->k;
    const int G = s->groups, ng = (c->end - 1) / G + 1 - c->first / G;
    const size_t mb = (size_t)s->max_blocks;
    int nb, *gids = k->gheap;
    const int m = kvp_coarse_pick(k->gcomb, G, c->first, c->end, want, coarse_limit(s, want),
                                  gids, k->gheap + ng, &nb);
    approx_visit(c, gids, m, true);
    int *idx = k->bheap, *scr = k->bheap + mb, *top = k->bheap + 2 * mb, n = 0;
    for (int i = 0; i < m; i++) {
        const int b0 = kvp_coarse_lo(gids[i], G, c->first), b1 = kvp_coarse_hi(gids[i], G, c->end);
        for (int b = b0; b < b1; b++) {
            idx[n] = b - c->first;
            k->cval[n++] = k->comb[b - c->first];
        }
    }
    const int kk = want < n ? want : n;
    kvp_topk_indices(k->cval, n, kk, top, scr);
    for (int i = 0; i < kk; i++)
        k->top[i] = idx[top[i]];
    return kk;
}

/* The blocks of a plan with Lk = n_tokens from the history as it is and the queries q of the
 * group: the k_take best candidates. */
static void choose(struct qp_state *s, const struct kvp_policy *p, int layer, int kvh,
                   const float *q, const struct kvp_block_plan *bp, int k_take, int n_tokens,
                   struct kvp_sel *sel)
{
    struct qp_kvh *k = &s->kv[kvh];
    const int lh = layer * s->n_head_kv + kvh, W = bp->end - bp->first, P = s->cnn.k / 2;
    const int want = k_take + s->extra;
    struct qp_coarse_ctx cc;
    coarse_ctx_init(&cc, s, k, lh, bp->first, bp->end, q);
    /* the candidates through the groups where they are kept (see the top of the file) */
    bool coarse = false;
    if (s->groups > 0 && s->prune && want < W && coarse_pays(s, bp->first, bp->end))
        coarse = s->visit > 0.0f ? approx_prepare(&cc, want) && approx_top(&cc, want) == want
                                 : coarse_prepare(&cc) && coarse_top(&cc, want) == want;
    if (!coarse)
        rank_bounds(s, k, lh, q, bp->first, bp->end);
    k->coarse_ok = coarse;
    k->comb_lh = lh;
    k->comb_first = bp->first;
    k->comb_w = W;
    /* candidates */
    int nc = 0;
    bool ascending = true; /* the candidates' order (below) */
    const float *rows0 = NULL;
    int n_rows = kvp_hist_rows(&s->hist, series_of(s, layer, kvh), k->rows);
    if (n_rows > 0)
        rows0 = k->rows[n_rows - 1] + bp->first; /* the newest row: blocks just read */
    if (!s->prune || k_take + s->extra >= W) {
        for (int x = 0; x < W; x++)
            k->cand[nc++] = x;
    } else {
        if (!coarse) /* else coarse_top left them in k->top */
            kvp_topk_indices(k->comb, W, want, k->top, k->heap);
        memcpy(k->cand, k->top, (size_t)want * sizeof(int));
        nc = want;
        if (rows0 && s->recent) {
            for (int i = 0; i < want; i++)
                k->cmark[k->top[i]] = 1;
            for (int x = 0; x < W; x++)
                if (rows0[x] != 0.0f && !k->cmark[x])
                    k->cand[nc++] = x;
            for (int i = 0; i < want; i++)
                k->cmark[k->top[i]] = 0;
            ascending = nc == want;
        }
    }
    /* the feature where the CNN reads it: the candidates' neighbourhoods, each column once,
     * exponentiated together by the SIMD table (a libm call per column was 5 % of the hooks at
     * 131072 tokens). The candidates ascend (kvp_topk_indices' order, or every column), so a
     * neighbourhood starts past the previous one's end; recent=1's appended columns do not, and
     * there the columns taken are marked. */
    int nf = 0, next = 0;
    for (int i = 0; i < nc; i++) {
        int lo = k->cand[i] - 2 * P, hi = k->cand[i] + 2 * P;
        lo = lo < 0 ? 0 : lo;
        hi = hi >= W ? W - 1 : hi;
        if (ascending) {
            lo = lo > next ? lo : next;
            next = hi + 1 > next ? hi + 1 : next;
        }
        for (int c = lo; c <= hi; c++) {
            if (!ascending) {
                if (k->fmark[c])
                    continue;
                k->fmark[c] = 1;
            }
            if (coarse)
                coarse_ensure(&cc, c); /* a neighbour in a group not visited */
            /* approx: a neighbour's bound may pass the M_j of the blocks visited */
            k->fcol[nf] = c;
            k->fval[nf++] = coarse && k->comb[c] > 0.0f ? 0.0f : k->comb[c];
        }
    }
    kvp_simd()->exp_sum(k->fval, nf, 0.0f); /* exp(x - 0) = exp(x) */
    for (int f = 0; f < nf; f++)
        k->feat[k->fcol[f]] = k->fval[f];
    struct kvp_cnn_input in = {
        .rows = k->rows, .n_rows = n_rows, .col0 = bp->first, .W = W, .qrow = k->feat};
    kvp_cnn_forward_cols(&s->cnn, &in, k->cand, nc, &k->cols, k->cscore);
    if (!ascending)
        for (int f = 0; f < nf; f++)
            k->fmark[k->fcol[f]] = 0;
    if (k_take > nc)
        k_take = nc;
    kvp_topk_indices(k->cscore, nc, k_take, k->top, k->heap);
    for (int i = 0; i < k_take; i++)
        k->chosen[i] = bp->first + k->cand[k->top[i]];
    kvp_sel_chosen(bp, k->chosen, k_take, n_tokens, p->env.block_size, sel, k->masks);
}

static bool plan_ranks(const struct kvp_block_plan *bp)
{
    return !bp->all && bp->k > 0 && bp->k < bp->end - bp->first && bp->end - bp->first >= 3;
}

static void qp_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                      struct kvp_sel *sel)
{
    struct qp_state *s = p->state;
    struct qp_kvh *k = &s->kv[kvh];
    const int lh = layer * s->n_head_kv + kvh;
    kvp_qmeta_fold(&s->meta, p->env.kv, layer, kvh, n_tokens);
    if (s->groups > 0)
        kvp_qmeta_group_update(&s->gmeta, &s->meta, lh, n_tokens);
    if (s->q8)
        kvp_qmeta8_update(&s->meta8, &s->meta, lh, n_tokens);
    if (s->q8 && s->groups > 0)
        kvp_qmeta8_update(&s->gmeta8, &s->gmeta, lh, n_tokens);
    memcpy(s->lastq + (size_t)lh * s->g * s->hd, q, (size_t)s->g * s->hd * sizeof(float));
    s->has_q[lh] = true;
    k->comb_lh = -1; /* choose() below sets it when this step ranks */
    struct kvp_block_plan bp;
    kvp_block_plan(p, n_tokens, &bp);
    if (!plan_ranks(&bp)) { /* nothing to rank: equal scores, lower blocks first */
        memset(k->cscore, 0, (size_t)bp.n_blocks * sizeof(float));
        kvp_sel_blocks(&bp, k->cscore, n_tokens, p->env.block_size, sel, k->masks, k->top);
        return;
    }
    choose(s, p, layer, kvh, q, &bp, bp.k, n_tokens, sel);
}

/* The tiered store's prefetch for step t + 1. select at t + 1 takes its k blocks among the
 * k + extra with the best feature under that step's query, so the prefetch is the
 * k + extra + margin best under this step's query (the query moves little from one token to the
 * next), and no CNN: the ranking select just made (comb, same query) is reused, and the columns
 * the next plan adds beyond it (at most a block or two as the local window slides) are fetched
 * outright. With the query select used, the prefetch holds select's blocks (tested). prune=0
 * (every block a candidate) still ranks with the CNN, k + margin of them. */
static void qp_predict_next(struct kvp_policy *p, int layer, int kvh, int n_tokens_next,
                            struct kvp_sel *sel)
{
    struct qp_state *s = p->state;
    struct qp_kvh *k = &s->kv[kvh];
    const int lh = layer * s->n_head_kv + kvh;
    struct kvp_block_plan bp;
    kvp_block_plan(p, n_tokens_next, &bp);
    if (!plan_ranks(&bp) || !s->has_q[lh]) {
        if (!s->has_q[lh])
            bp.k = 0;
        memset(k->cscore, 0, (size_t)bp.n_blocks * sizeof(float));
        kvp_sel_blocks(&bp, k->cscore, n_tokens_next, p->env.block_size, sel, k->masks, k->top);
        return;
    }
    const float *q = s->lastq + (size_t)lh * s->g * s->hd;
    const int n_cand = bp.end - bp.first;
    if (!s->prune) {
        int take = bp.k + s->margin < n_cand ? bp.k + s->margin : n_cand;
        choose(s, p, layer, kvh, q, &bp, take, n_tokens_next, sel);
        return;
    }
    if (k->comb_lh != lh || k->comb_first != bp.first || k->comb_w > n_cand) {
        /* select did not rank this head's blocks with this query (or the plan moved): rank */
        struct qp_coarse_ctx cc;
        coarse_ctx_init(&cc, s, k, lh, bp.first, bp.end, q);
        const int want = bp.k + s->extra;
        k->coarse_ok = s->groups > 0 && want < n_cand &&
                       coarse_pays(s, bp.first, bp.end) &&
                       (s->visit > 0.0f ? approx_prepare(&cc, want) : coarse_prepare(&cc));
        if (!k->coarse_ok)
            rank_bounds(s, k, lh, q, bp.first, bp.end);
        k->comb_lh = lh;
        k->comb_first = bp.first;
        k->comb_w = n_cand;
    }
    const int w = k->comb_w;
    int take = bp.k + s->extra + s->margin < w ? bp.k + s->extra + s->margin : w;
    struct qp_coarse_ctx cc;
    coarse_ctx_init(&cc, s, k, lh, bp.first, bp.first + w, q);
    if (k->coarse_ok)
        coarse_query_prep(&cc);
    if (k->coarse_ok && take < w &&
        (s->visit > 0.0f ? approx_top(&cc, take) : coarse_top(&cc, take)) == take) {
        /* the same pass as select's (its groups' feature bounds and visits kept) */
    } else {
        if (k->coarse_ok) { /* comb is not valid everywhere: bound every column */
            rank_bounds(s, k, lh, q, bp.first, bp.first + w);
            k->coarse_ok = false;
        }
        kvp_topk_indices(k->comb, w, take, k->top, k->heap);
    }
    int n = 0;
    for (int i = 0; i < take; i++)
        k->chosen[n++] = bp.first + k->top[i];
    for (int c = w; c < n_cand; c++) /* not ranked yet: the newest candidates */
        k->chosen[n++] = bp.first + c;
    kvp_sel_chosen(&bp, k->chosen, n, n_tokens_next, p->env.block_size, sel, k->masks);
}

static void qp_step(struct kvp_policy *p, int layer, int kvh, const struct kvp_sel *sel,
                    const float *probs, int probs_stride, int n_tokens)
{
    struct qp_state *s = p->state;
    struct qp_kvh *k = &s->kv[kvh];
    const int bs = p->env.block_size, nb = (n_tokens + bs - 1) / bs;
    /* the group's block max of the step's probabilities on the blocks read (zero elsewhere),
     * as kvp_hist_scatter_sparse and a max over the heads would give, straight into the ring;
     * probs holds the blocks' largest already (step_block_max) */
    for (int i = 0; i < sel->n; i++) {
        float m = probs[i];
        for (int j = 1; j < s->g; j++) {
            const float mj = probs[(size_t)j * probs_stride + i];
            m = mj > m ? mj : m;
        }
        k->row[i] = m;
    }
    kvp_hist_append_sparse(&s->hist, series_of(s, layer, kvh), sel->blocks, k->row, sel->n, nb);
}

const struct kvp_policy_ops kvp_policy_qpredictor = {
    .name = "qpredictor",
    .block_plan = true,
    .help = "query-aware AttentionPredictor: a CNN over the attention history and the query's "
            "block bounds scores candidate blocks (needs aux_path = a --query predictor file)",
    .wants_obs = true,
    .needs_aux = true,
    .step_block_max = true,
    .init = qp_init,
    .free = qp_free,
    .reset = qp_reset,
    .on_prefill = qp_prefill,
    .select = qp_select,
    .predict_next = qp_predict_next,
    .on_step = qp_step,
    .opts = qp_opt_table,
    .opts_size = sizeof(struct qp_opts),
};
