/*
 * `quest` (Quest, Tang et al. 2024; docs/methods.md §3.5): query-aware block ("page")
 * selection with nothing evicted. For every block and KV head the policy keeps the element-wise max
 * M and min m of the block's keys, read from the cache after RoPE. At each decode step the bound
 *
 *     ub_h(block) = Σ_d max(q_d · M_d, q_d · m_d)  >=  q · k  for every key k of the block
 *
 * is computed for each query head h of the group (unscaled: 1/√d does not change the ranking),
 * the g bounds are combined with gqa_agg, and the best blocks are read.
 *
 * What kvpred does differently, and why:
 *  - one selection per KV head (upstream's kernel is MHA and its evaluation path selects per
 *    query head). The bounds are combined with p.gqa_agg; docs/methods.md §5 names sum
 *    for Quest, the framework default is mean: both rank identically, max (CateKV + Quest) is an
 *    option;
 *  - the forced set and the budget are the block plan every block policy shares
 *    (kvp_block_plan, policy.h): sink [0, sink) and the local window from the block boundary at
 *    or below n - local, both counted in the budget. The block holding the current token is
 *    always in the local window, which is Quest's "last page forced" (its kernel's choice;
 *    methods.md §8.4: the evaluation path forgets it). With sink = -1 and local = -1 this is exactly
 *    Quest: top (budget/bs - 1) blocks among all but the last, plus the last;
 *  - metadata is rebuilt from the cache after the prompt (on_prefill) and then folded in one
 *    token at a time as tokens are appended, so each step touches only the newest block.
 *    Upstream starts a new page from ∓FP16_MAX; here a block starts from its first key, which is
 *    the same thing without the sentinel.
 *
 * Prefetching (predict_next, for the tiered store; docs/methods.md §1.9). Quest needs the
 * query, and the next step has not computed it yet. The query of consecutive steps is strongly
 * correlated (that note cites a cosine autocorrelation of about 0.87), so select keeps the last
 * query of every (layer, KV head) and predict_next ranks the blocks with the same bound over the
 * metadata, for the plan of the next step's context (its forced newest block included). The
 * metadata of every candidate block of that plan is complete already: candidates end below the
 * local window, which holds the only block the next token changes. A predicted set that misses a
 * block costs an on-demand read, one that has a block too many costs only a transfer, so the
 * prediction takes `margin` more candidates per KV head than the budget (option margin=N, default
 * 64 blocks): only what is fetched grows, what attention reads is still exactly the selection of
 * select. After a prompt the last query is the prompt's last token's (on_prefill), which predicts
 * the first decode step; before any query the prediction is the forced set alone. Once predict_next
 * has been called for a (layer, KV head), select ranks its candidates once for both (option
 * share=1, the default): it keeps the top k + margin + 2 blocks and takes its own top k among them,
 * and predict_next ranks only those plus the candidates its plan adds; share=0 ranks every
 * candidate again (the same blocks: tested).
 *
 * Coarse-to-fine ranking (option groups=G, coarse=exact|approx, visit=V; policy/coarse_sel.h).
 * With groups=G a second level of metadata holds, per group of G blocks, the element-wise max and
 * min of its blocks' (kv/quest_meta.h), kept up to date at every fold. A selection then bounds the
 * groups first, ranks them and bounds blocks only inside groups, best group first, until the next
 * group's bound is below the k-th best block bound found (exact: the same blocks as the flat pass,
 * ties included); coarse=approx stops after ceil(V·k/G) groups as well, but visits at least the
 * ceil(N/G) groups that hold floor=N blocks (1024 by default), so that up to N candidate blocks it
 * is the flat pass (ranked flat): at the contexts a model is trained on the pass costs little
 * next to the step, and bounds over groups of 256 tokens lose needles there (docs/policies.md).
 * groups=0 is the flat pass over every block. The prediction for the tiered store ranks through
 * the same pass, so the groups' bounds decide what is prefetched. See docs/policies.md for the
 * measured defaults.
 *
 * Memory: 2 × head_dim floats per block and (layer, KV head), 1/8 of the keys at bs = 16 (plus
 * 1/G of that for the groups), and one query group per (layer, KV head).
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvcache.h"
#include "policy/policy.h"
#include "kv/quest_meta.h"
#include "kv/quest_meta8.h"
#include "policy/coarse_sel.h"

struct quest_state {
    struct kvp_qmeta meta; /* element-wise max and min of every block's keys (quest_meta.h) */
    float *lastq;/* [n_layer*n_head_kv][g][head_dim] query of the last select (or prompt) */
    bool *has_q; /* [n_layer*n_head_kv] lastq holds a query of this sequence */
    float *score;/* [n_layer*n_head_kv][max_blocks] combined bounds of lastq, valid for the
                    blocks [first, scored_end) of the last select's plan */
    int *scored_end; /* [n_layer*n_head_kv] */
    int margin;  /* extra candidate blocks per KV head a prediction takes */
    bool share;  /* option share: select keeps its wider ranking for predict_next */
    bool *predicting; /* [n_layer*n_head_kv] predict_next was called: select keeps its ranking */
    int32_t *kept;   /* [n_layer*n_head_kv][max_blocks] the best candidates of the last select,
                        ascending: its top k + margin + KEEP_SLACK */
    int *n_kept;     /* [n_layer*n_head_kv] how many, or -1 (nothing kept) */
    int *kept_first, *kept_end; /* [n_layer*n_head_kv] that select's candidate range */
    struct kvp_scratch scr;
    /* coarse-to-fine ranking (groups > 0) */
    int groups;            /* G blocks per group, 0: the flat pass */
    float visit;           /* approximate mode: groups visited per group of k blocks, 0: exact */
    int floor_blocks;      /* approximate mode: blocks bounded at least (option floor) */
    struct kvp_qmeta gmeta;/* the groups' max and min */
    float *gscore;         /* [n_head_kv][n_groups] combined group bounds */
    int *gheap, *bheap;    /* [n_head_kv][2 n_groups], [n_head_kv][3 max_blocks] */
    float *cval;           /* [n_head_kv][max_blocks] the approximate ranking's scored blocks */
    int32_t *chosen;       /* [n_head_kv][max_blocks] */
    int n_groups;
    /* q8=1: the approximate pass ranks through 8-bit copies of both levels (quest_meta8.h) */
    bool q8;
    struct kvp_qmeta8 meta8, gmeta8;
};

/* Coarse-to-fine defaults (docs/policies.md has the measurements behind them). */
#define KVP_QUEST_GROUPS_DEFAULT 0
#define KVP_QUEST_VISIT_DEFAULT 4

/* Candidates kept beyond the prediction's k + margin: the next step's plan may rank one more
 * block (a budget ratio grows with the context), and the kept set must hold its whole top. */
#define KEEP_SLACK 2

/* Options (p.opts, "key=value,...", read through the table below). */
struct quest_opts {
    int margin; /* extra candidate blocks per KV head a prediction takes */
    int share;  /* select keeps its wider ranking for predict_next */
    int groups; /* coarse-to-fine: blocks per group (0: flat) */
    int coarse; /* 0 exact, 1 approx */
    float visit;/* approx: groups visited per group's worth of the k blocks */
    int floor;  /* approx: blocks bounded at least */
    int q8;     /* approx: bound through 8-bit copies of the metadata */
};

static const char *const quest_coarse_names[] = {"exact", "approx", NULL};

static const struct kvp_policy_opt quest_opt_table[] = {
    {.type = KVP_OPT_INT, .key = "margin", .offset = offsetof(struct quest_opts, margin),
     .min = 0, .max = 1 << 20, .def = 64,
     .help = "the tiered store's prefetch margin in blocks (predictions read this many more)"},
    {.type = KVP_OPT_INT, .key = "share", .offset = offsetof(struct quest_opts, share),
     .min = 0, .max = 1, .def = 1,
     .help = "whether select keeps its wider ranking for the prediction"},
    {.type = KVP_OPT_INT, .key = "groups", .offset = offsetof(struct quest_opts, groups),
     .min = 0, .max = 4096, .def = KVP_QUEST_GROUPS_DEFAULT,
     .help = "coarse-to-fine: blocks per group of the second metadata level (0: flat pass)"},
    {.type = KVP_OPT_CHOICE, .key = "coarse", .offset = offsetof(struct quest_opts, coarse),
     .choices = quest_coarse_names, .def = 0,
     .help = "coarse-to-fine mode: exact (the flat pass's blocks) or approx (visit-limited)"},
    {.type = KVP_OPT_FLOAT, .key = "visit", .offset = offsetof(struct quest_opts, visit),
     .min = 0.01, .max = 1 << 20, .def = KVP_QUEST_VISIT_DEFAULT,
     .help = "coarse=approx: groups visited, as a multiple of ceil(k / groups)"},
    {.type = KVP_OPT_INT, .key = "floor", .offset = offsetof(struct quest_opts, floor),
     .min = 0, .max = 1 << 30, .def = KVP_COARSE_FLOOR_DEFAULT,
     .help = "coarse=approx: blocks bounded at least (the flat pass up to this many candidates)"},
    {.type = KVP_OPT_INT, .key = "q8", .offset = offsetof(struct quest_opts, q8), .min = 0,
     .max = 1, .def = 0,
     .help = "coarse=approx: rank through 8-bit copies of the block and group bounds (half the "
             "bytes, bounds widened by their rounding)"},
    {0},
};

static void quest_free(struct kvp_policy *p);

static int quest_init(struct kvp_policy *p, struct kvp_err *err)
{
    const struct quest_opts *o = p->opt;
    int margin = o->margin;
    bool share = o->share != 0;
    struct quest_state *s = calloc(1, sizeof(*s));
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "quest: out of memory");
    s->margin = margin;
    s->share = share;
    s->groups = o->groups;
    s->visit = o->coarse == 1 ? o->visit : 0.0f;
    s->floor_blocks = o->floor;
    s->q8 = o->q8 != 0;
    p->prefetch_margin = margin;
    if (s->q8 && (o->groups == 0 || o->coarse != 1)) {
        free(s);
        return kvp_err_set(err, KVP_EINVAL, "quest: q8=1 needs groups=G and coarse=approx");
    }
    size_t n_lh = (size_t)p->env.n_layer * p->env.n_head_kv;
    size_t mb = (size_t)(p->env.n_ctx + p->env.block_size - 1) / p->env.block_size;
    int meta_rc = kvp_qmeta_init(&s->meta, p->env.n_layer, p->env.n_head_kv, (int)mb,
                                 p->env.head_dim, p->env.block_size);
    size_t g = (size_t)(p->env.n_head / p->env.n_head_kv);
    s->lastq = malloc(n_lh * g * p->env.head_dim * sizeof(float));
    s->has_q = calloc(n_lh, sizeof(bool));
    s->score = malloc(n_lh * mb * sizeof(float));
    s->scored_end = calloc(n_lh, sizeof(int));
    s->kept = malloc(n_lh * mb * sizeof(int32_t));
    s->n_kept = malloc(n_lh * sizeof(int));
    s->kept_first = calloc(n_lh, sizeof(int));
    s->kept_end = calloc(n_lh, sizeof(int));
    s->predicting = calloc(n_lh, sizeof(bool));
    if (meta_rc < 0 || !s->lastq || !s->has_q || !s->score ||
        !s->scored_end || !s->kept || !s->n_kept || !s->kept_first || !s->kept_end ||
        !s->predicting ||
        kvp_scratch_init(&s->scr, &p->env, g * mb * p->env.block_size) < 0) {
        p->state = s; /* quest_free frees what was made; the rest is still NULL or zero */
        quest_free(p);
        return kvp_err_set(err, KVP_ENOMEM, "quest: out of memory for block metadata");
    }
    for (size_t i = 0; i < n_lh; i++)
        s->n_kept[i] = -1;
    p->state = s;
    if (s->groups > 0) {
        const size_t nkv = (size_t)p->env.n_head_kv;
        s->n_groups = (int)((mb + (size_t)s->groups - 1) / (size_t)s->groups);
        int grc = kvp_qmeta_group_init(&s->gmeta, &s->meta, s->groups);
        s->gscore = malloc(nkv * (size_t)s->n_groups * sizeof(float));
        s->gheap = malloc(nkv * 2 * (size_t)s->n_groups * sizeof(int));
        s->bheap = malloc(nkv * KVP_COARSE_APPROX_INTS(mb) * sizeof(int));
        s->cval = malloc(nkv * mb * sizeof(float));
        s->chosen = malloc(nkv * mb * sizeof(int32_t));
        /* the group bounds of g heads go through the scratch's per-head rows (score_blocks) */
        if (grc < 0 || !s->gscore || !s->gheap || !s->bheap || !s->cval || !s->chosen) {
            quest_free(p);
            return kvp_err_set(err, KVP_ENOMEM, "quest: out of memory for group metadata");
        }
        if (s->q8 && (g > KVP_QMETA_SEL_HEADS || kvp_qmeta8_init(&s->meta8, &s->meta) < 0 ||
                      kvp_qmeta8_init(&s->gmeta8, &s->gmeta) < 0)) {
            quest_free(p);
            return kvp_err_set(err, KVP_EINVAL,
                               "quest: q8=1 needs head_dim <= 256, at most %d query heads a KV "
                               "head, and memory for the 8-bit metadata",
                               KVP_QMETA_SEL_HEADS);
        }
    }
    return 0;
}

static void quest_free(struct kvp_policy *p)
{
    struct quest_state *s = p->state;
    if (!s)
        return;
    kvp_qmeta_free(&s->meta);
    free(s->lastq);
    free(s->has_q);
    free(s->score);
    free(s->scored_end);
    free(s->kept);
    free(s->n_kept);
    free(s->kept_first);
    free(s->kept_end);
    free(s->predicting);
    kvp_scratch_free(&s->scr);
    kvp_qmeta_free(&s->gmeta);
    kvp_qmeta8_free(&s->meta8);
    kvp_qmeta8_free(&s->gmeta8);
    free(s->gscore);
    free(s->gheap);
    free(s->bheap);
    free(s->cval);
    free(s->chosen);
    free(s);
    p->state = NULL;
}

static void quest_reset(struct kvp_policy *p)
{
    struct quest_state *s = p->state;
    kvp_qmeta_reset(&s->meta);
    if (s->groups > 0)
        kvp_qmeta_reset(&s->gmeta);
    if (s->q8) {
        kvp_qmeta8_reset(&s->meta8);
        kvp_qmeta8_reset(&s->gmeta8);
    }
    memset(s->has_q, 0, (size_t)p->env.n_layer * p->env.n_head_kv * sizeof(bool));
    memset(s->scored_end, 0, (size_t)p->env.n_layer * p->env.n_head_kv * sizeof(int));
    for (int i = 0; i < p->env.n_layer * p->env.n_head_kv; i++)
        s->n_kept[i] = -1;
}

float kvp_quest_bound(const float *q, const float *kmax, const float *kmin, int hd)
{
    float ub = 0.0f;
    for (int d = 0; d < hd; d++) {
        float a = q[d] * kmax[d], b = q[d] * kmin[d];
        ub += a > b ? a : b;
    }
    return ub;
}

/* Fold the prompt into the layer's metadata, and take the prompt's last query as the last
 * query, so that predict_next can rank blocks for the first decode step too. Blocks wholly below
 * obs->first still hold their keys' bounds and are kept (refolding 4096 tokens of 30 layers
 * from the start took a quarter of a follow-up question's prefill); the block holding
 * obs->first and all after it are folded again from their first key. */
static void quest_prefill(struct kvp_policy *p, int layer, const struct kvp_prefill_obs *obs)
{
    struct quest_state *s = p->state;
    if (layer < p->p.dense_layers)
        return;
    const size_t gq = (size_t)(p->env.n_head / p->env.n_head_kv) * p->env.head_dim;
    for (int h = 0; h < p->env.n_head_kv; h++) {
        int lh = layer * p->env.n_head_kv + h;
        int keep = obs->first / s->meta.block_size * s->meta.block_size;
        if (keep <= 0)
            kvp_qmeta_restart(&s->meta, lh);
        else if (s->meta.done[lh] > keep)
            s->meta.done[lh] = keep;
        s->n_kept[lh] = -1; /* the prompt's query ranks afresh */
        kvp_qmeta_fold(&s->meta, p->env.kv, layer, h, obs->n_prompt);
        if (s->groups > 0) {
            kvp_qmeta_restart(&s->gmeta, lh);
            kvp_qmeta_group_update(&s->gmeta, &s->meta, lh, obs->n_prompt);
        }
        if (s->q8) {
            /* the kept blocks' 8-bit copies stand; the groups are redone, as above */
            if (keep <= 0)
                kvp_qmeta8_restart(&s->meta8, lh);
            else if (s->meta8.done[lh] > keep)
                s->meta8.done[lh] = keep;
            kvp_qmeta8_update(&s->meta8, &s->meta, lh, obs->n_prompt);
            kvp_qmeta8_restart(&s->gmeta8, lh);
            kvp_qmeta8_update(&s->gmeta8, &s->gmeta, lh, obs->n_prompt);
        }
        if (!obs->q_last)
            continue;
        memcpy(s->lastq + lh * gq, obs->q_last + h * gq, gq * sizeof(float));
        s->has_q[lh] = true;
        s->scored_end[lh] = 0; /* no bound computed with this query yet */
    }
}

/* Combined bounds of the g queries q (prepared in qq or, with q8, qq8; or NULL) for blocks
 * [b0, b1) of (layer, kvh) into s->score: from the 8-bit copy when q8 (the option, for a plan
 * that ranks through the groups), else the exact tiles. */
static void score_blocks_q(struct kvp_policy *p, int layer, int kvh, const float *q,
                           const struct kvp_qmeta_query *qq, const struct kvp_qmeta8_query *qq8,
                           bool q8, int b0, int b1)
{
    struct quest_state *s = p->state;
    const int g = p->env.n_head / p->env.n_head_kv;
    const int lh = layer * p->env.n_head_kv + kvh, n = b1 - b0;
    float *ub = kvp_scratch_f(&s->scr, kvh) + s->scr.cap; /* [g][n] per-head bounds */
    if (n <= 0)
        return;
    /* every head's bounds in one pass, kvp_quest_bound's values bit for bit (quest_meta.h), or
     * the 8-bit copy's (q8: one scoring for every block a selection compares) */
    if (q8 && qq8)
        kvp_qmeta8_bounds_q(&s->meta8, lh, qq8, b0, b1, ub, n);
    else if (q8)
        kvp_qmeta8_bounds(&s->meta8, lh, q, g, 1.0f, b0, b1, ub, n);
    else if (qq)
        kvp_qmeta_bounds_q(&s->meta, lh, qq, b0, b1, ub, n);
    else
        kvp_qmeta_bounds(&s->meta, lh, q, g, 1.0f, b0, b1, ub, n);
    kvp_gqa_combine(ub, g, n, n, p->p.gqa_agg, s->score + (size_t)lh * s->scr.max_blocks + b0);
}

static void score_blocks(struct kvp_policy *p, int layer, int kvh, const float *q, bool q8, int b0,
                         int b1)
{
    score_blocks_q(p, layer, kvh, q, NULL, NULL, q8, b0, b1);
}

/* Whether a plan's candidates rank through the groups' approximate pass, and with q8 through
 * the 8-bit copies (below the floor the flat pass ranks them, over the exact tiles). */
static bool plan_q8(const struct quest_state *s, const struct kvp_block_plan *bp)
{
    return s->q8 && kvp_coarse_pays(s->visit, s->floor_blocks, bp->end - bp->first);
}

/* Whether a plan ranks anything (otherwise kvp_sel_blocks reads no score). */
static bool plan_ranks(const struct kvp_block_plan *bp)
{
    return !bp->all && bp->k > 0 && bp->k < bp->end - bp->first;
}

/* The k best candidates of plan bp under the g queries q, into out (ascending block ids):
 * coarse-to-fine when groups are kept, else (or when a bound is NaN) the flat pass. The bounds of
 * the blocks it ranked are in s->score. Returns k. */
struct quest_rank_ctx {
    struct kvp_policy *p;
    int layer, kvh;
    const float *q;
    struct kvp_qmeta_query qq;   /* q's term rows, decided once for every group visited */
    struct kvp_qmeta8_query qq8; /* q8: q packed once */
};

static void quest_score_fn(void *ctx, int b0, int b1)
{
    struct quest_rank_ctx *c = ctx;
    const struct quest_state *s = c->p->state;
    score_blocks_q(c->p, c->layer, c->kvh, c->q, &c->qq, &c->qq8, s->q8, b0, b1);
}

/* q8: the 8-bit tiles of the groups to come (with the f16 tiles fetching ahead gained nothing:
 * docs/policies.md, so those are not fetched). */
static void quest_fetch_fn(void *ctx, int b0, int b1)
{
    struct quest_rank_ctx *c = ctx;
    const struct quest_state *s = c->p->state;
    kvp_qmeta8_prefetch(&s->meta8, c->layer * c->p->env.n_head_kv + c->kvh, b0, b1);
}

static int rank_top(struct kvp_policy *p, int layer, int kvh, const float *q,
                    const struct kvp_block_plan *bp, int k, int32_t *out)
{
    struct quest_state *s = p->state;
    const int lh = layer * p->env.n_head_kv + kvh, G = s->groups;
    const size_t mb = (size_t)s->scr.max_blocks;
    if (G > 0 && kvp_coarse_pays(s->visit, s->floor_blocks, bp->end - bp->first)) {
        const int max_groups =
            s->visit > 0.0f ? kvp_coarse_limit(s->visit, s->floor_blocks, G, k) : 0;
        const int g = p->env.n_head / p->env.n_head_kv;
        const int g0 = bp->first / G, g1 = (bp->end - 1) / G + 1, ng = g1 - g0;
        float *ub = kvp_scratch_f(&s->scr, kvh) + s->scr.cap; /* [g][ng] per-head bounds */
        float *gs = s->gscore + (size_t)kvh * s->n_groups;
        struct quest_rank_ctx ctx; /* fields one by one: the prepared queries are 12 KB */
        ctx.p = p;
        ctx.layer = layer;
        ctx.kvh = kvh;
        ctx.q = q;
        if (s->q8) {
            kvp_qmeta8_query_prep(&s->meta8, &ctx.qq8, q, g, 1.0f); /* g checked at init */
            kvp_qmeta8_bounds_q(&s->gmeta8, lh, &ctx.qq8, g0, g1, ub, ng);
        } else {
            kvp_qmeta_query_prep(&s->meta, &ctx.qq, q, g, 1.0f);
            kvp_qmeta_bounds_q(&s->gmeta, lh, &ctx.qq, g0, g1, ub, ng);
        }
        kvp_gqa_combine(ub, g, ng, ng, p->p.gqa_agg, gs + g0);
        int n = kvp_coarse_topk(gs, s->score + lh * mb + bp->first, G, bp->first, bp->end, k,
                                max_groups, quest_score_fn, s->q8 ? quest_fetch_fn : NULL, &ctx,
                                s->gheap + (size_t)kvh * 2 * s->n_groups,
                                s->bheap + (size_t)kvh * KVP_COARSE_APPROX_INTS(mb),
                                s->cval + (size_t)kvh * mb, out, NULL);
        if (n >= 0)
            return n;
    }
    const int n_cand = bp->end - bp->first;
    int *top = kvp_scratch_i(&s->scr, kvh), *heap = top + n_cand;
    score_blocks(p, layer, kvh, q, false, bp->first, bp->end);
    kvp_topk_indices(s->score + lh * mb + bp->first, n_cand, k, top, heap);
    for (int i = 0; i < k; i++)
        out[i] = bp->first + top[i];
    return k;
}

static void quest_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                         struct kvp_sel *sel)
{
    struct quest_state *s = p->state;
    const int g = p->env.n_head / p->env.n_head_kv, hd = p->env.head_dim;
    const int lh = layer * p->env.n_head_kv + kvh;
    kvp_qmeta_fold(&s->meta, p->env.kv, layer, kvh, n_tokens);
    if (s->groups > 0)
        kvp_qmeta_group_update(&s->gmeta, &s->meta, lh, n_tokens);
    if (s->q8) {
        kvp_qmeta8_update(&s->meta8, &s->meta, lh, n_tokens);
        kvp_qmeta8_update(&s->gmeta8, &s->gmeta, lh, n_tokens);
    }
    struct kvp_block_plan bp;
    kvp_block_plan(p, n_tokens, &bp);
    bool ranks = plan_ranks(&bp);
    const size_t mb = (size_t)s->scr.max_blocks;
    const bool keep = s->share && s->predicting[lh];
    if (ranks && s->groups > 0) {
        /* as kvp_sel_blocks_keep: the wide top, kept for the prediction, then the top k of it
         * (the order is strict, so the same k as a top k of all) */
        const int n_cand = bp.end - bp.first, wide = bp.k + s->margin + KEEP_SLACK;
        int32_t *chosen = s->chosen + (size_t)kvh * mb;
        if (keep && wide < n_cand) {
            int32_t *kept = s->kept + lh * mb;
            rank_top(p, layer, kvh, q, &bp, wide, kept);
            float *val = kvp_scratch_f(&s->scr, kvh);
            int *top = kvp_scratch_i(&s->scr, kvh), *heap = top + wide;
            for (int i = 0; i < wide; i++)
                val[i] = s->score[lh * mb + (size_t)kept[i]];
            kvp_topk_indices(val, wide, bp.k, top, heap);
            for (int i = 0; i < bp.k; i++)
                chosen[i] = kept[top[i]];
            s->n_kept[lh] = wide;
        } else {
            rank_top(p, layer, kvh, q, &bp, bp.k, chosen);
            s->n_kept[lh] = -1;
        }
        kvp_sel_chosen(&bp, chosen, bp.k, n_tokens, p->env.block_size, sel,
                       kvp_scratch_m(&s->scr, kvh));
    } else {
        if (ranks)
            score_blocks(p, layer, kvh, q, false, bp.first, bp.end);
        s->n_kept[lh] = kvp_sel_blocks_keep(
            &bp, s->score + lh * mb, n_tokens, p->env.block_size, sel,
            kvp_scratch_m(&s->scr, kvh), kvp_scratch_i(&s->scr, kvh),
            keep ? s->margin + KEEP_SLACK : 0, keep ? s->kept + lh * mb : NULL,
            kvp_scratch_f(&s->scr, kvh));
    }
    s->kept_first[lh] = bp.first;
    s->kept_end[lh] = bp.end;
    memcpy(s->lastq + (size_t)lh * g * hd, q, (size_t)g * hd * sizeof(float));
    s->has_q[lh] = true;
    /* with groups only the ranked blocks hold bounds: the prediction scores the candidates past
     * this plan (as in the flat pass) and ranks afresh when the kept set does not serve */
    s->scored_end[lh] = ranks ? bp.end : bp.first;
}

/* The next step's selection as Quest will make it, with this step's query in place of the next
 * one and `margin` more candidates (see the top of the file). The bounds select computed with
 * that query are reused; only candidates that were in the local window then are scored (a
 * block or none). The metadata is not folded here: the next token's key does not exist yet,
 * and it only changes the newest block, which the plan forces. */
static void quest_predict_next(struct kvp_policy *p, int layer, int kvh, int n_tokens_next,
                               struct kvp_sel *sel)
{
    struct quest_state *s = p->state;
    const int g = p->env.n_head / p->env.n_head_kv, hd = p->env.head_dim;
    const int lh = layer * p->env.n_head_kv + kvh;
    struct kvp_block_plan bp;
    kvp_block_plan(p, n_tokens_next, &bp);
    int n_cand = bp.end - bp.first;
    if (!s->has_q[lh])
        bp.k = 0;
    else
        bp.k = bp.k + s->margin < n_cand ? bp.k + s->margin : n_cand;
    s->predicting[lh] = true;
    const size_t mb = (size_t)s->scr.max_blocks;
    const float *score = s->score + lh * mb;
    /* with groups, the blocks past select's plan are scored only when its kept set serves */
    const bool kept_serves = s->n_kept[lh] >= bp.k && s->kept_first[lh] == bp.first &&
                             s->kept_end[lh] <= bp.end;
    if (plan_ranks(&bp) && (s->groups == 0 || kept_serves)) {
        int from = s->scored_end[lh] > bp.first ? s->scored_end[lh] : bp.first;
        score_blocks(p, layer, kvh, s->lastq + (size_t)lh * g * hd, plan_q8(s, &bp), from,
                     bp.end);
        if (bp.end > s->scored_end[lh])
            s->scored_end[lh] = bp.end;
        /* With the ranking select kept (same query, candidates [first, kept_end)), the top k
         * of this plan is among the kept blocks and the candidates after kept_end: a block
         * select did not keep has k + margin + KEEP_SLACK >= k stronger ones. */
        const int n_kept = s->n_kept[lh], kend = s->kept_end[lh];
        if (n_kept >= bp.k && s->kept_first[lh] == bp.first && kend <= bp.end) {
            int32_t *cand = (int32_t *)kvp_scratch_i(&s->scr, kvh) + 2 * (bp.end - bp.first);
            float *val = kvp_scratch_f(&s->scr, kvh);
            int *out = kvp_scratch_i(&s->scr, kvh), *heap = out + (bp.end - bp.first);
            int n = 0;
            for (int i = 0; i < n_kept; i++)
                cand[n++] = s->kept[lh * mb + i];
            for (int b = kend; b < bp.end; b++)
                cand[n++] = b;
            for (int i = 0; i < n; i++)
                val[i] = score[cand[i]];
            kvp_topk_indices(val, n, bp.k, out, heap);
            for (int i = 0; i < bp.k; i++)
                out[i] = cand[out[i]];
            kvp_sel_chosen(&bp, out, bp.k, n_tokens_next, p->env.block_size, sel,
                           kvp_scratch_m(&s->scr, kvh));
            return;
        }
    }
    if (plan_ranks(&bp) && s->groups > 0) {
        /* the bounds outside the kept set are not all computed: rank through the groups */
        int32_t *chosen = s->chosen + (size_t)kvh * mb;
        rank_top(p, layer, kvh, s->lastq + (size_t)lh * g * hd, &bp, bp.k, chosen);
        kvp_sel_chosen(&bp, chosen, bp.k, n_tokens_next, p->env.block_size, sel,
                       kvp_scratch_m(&s->scr, kvh));
        return;
    }
    kvp_sel_blocks(&bp, score, n_tokens_next, p->env.block_size, sel,
                   kvp_scratch_m(&s->scr, kvh), kvp_scratch_i(&s->scr, kvh));
}

const struct kvp_policy_ops kvp_policy_quest = {
    .name = "quest",
    .block_plan = true,
    .help = "Quest: per-step top blocks by the min/max key bound, nothing evicted",
    .init = quest_init,
    .free = quest_free,
    .reset = quest_reset,
    .on_prefill = quest_prefill,
    .select = quest_select,
    .predict_next = quest_predict_next,
    .opts = quest_opt_table,
    .opts_size = sizeof(struct quest_opts),
};
