/*
 * Coarse-to-fine selection (policy/coarse_sel.h, the group level of kv/quest_meta.h, quest's
 * groups/coarse/visit options and qpredictor's candidate pass):
 *  - the ranking itself on made-up scores: the exact mode returns the flat top-k (ties to the
 *    lower block, as kvp_topk_indices) whatever the group bounds as long as they bound their
 *    blocks; the approximate mode returns every top-k block that lies in a group it visited (its
 *    derived recall statement), and each visit count;
 *  - the group metadata equals the element-wise max/min of its blocks' after appends that cross
 *    group boundaries, a truncation (the newest block refolded) and a restart, on every KV type;
 *  - quest with groups selects and predicts exactly what the flat pass does on every KV type, for
 *    random and structured keys and queries (planted needles, tied blocks, zero query entries),
 *    token by token across group boundaries, after a truncation and after a reset (what a
 *    sequence copy or fork does to a policy), and prints the approximate mode's recall;
 *  - quest's q8=1: visiting every group it selects the top blocks of the 8-bit bounds of every
 *    block (a reference built here from the cache), below the floor it is the flat exact pass,
 *    and its recall of the flat pass is printed beside the f16 approximate mode's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvcache.h"
#include "kv/quest_meta.h"
#include "kv/quest_meta8.h"
#include "kernels/topk.h"
#include "kvpred.h"
#include "policy/coarse_sel.h"
#include "policy/host.h"
#include "testutil.h"

static uint64_t rng_state = 99;

static double urand(void) /* [0, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static int cur_type; /* KV type of the group of tests being run (main) */

/* ---- the ranking on made-up scores ---------------------------------------------------------- */

struct fake {
    const float *src; /* the scores the callback reveals */
    float *score;
    unsigned char *seen;
};

static void fake_fn(void *ctx, int b0, int b1)
{
    struct fake *f = ctx;
    for (int b = b0; b < b1; b++) {
        f->score[b] = f->src[b];
        f->seen[b] = 1;
    }
}

/* The k best of x[first, end) by (value desc, index asc), by sorting (slow and obvious). */
static void slow_topk(const float *x, int first, int end, int k, unsigned char *in)
{
    memset(in, 0, (size_t)end);
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int b = first; b < end; b++)
            if (!in[b] && (best < 0 || x[b] > x[best]))
                best = b;
        in[best] = 1;
    }
}

static void test_ranking_exact_and_approx(void **state)
{
    (void)state;
    enum { NB = 300 };
    float src[NB], score[NB], gs[NB];
    int32_t out[NB];
    int gheap[2 * NB], bheap[KVP_COARSE_APPROX_INTS(NB)];
    float cval[NB];
    unsigned char want[NB], seen[NB];
    double recall_sum = 0;
    int recall_n = 0;
    for (int trial = 0; trial < 400; trial++) {
        const int G = 1 + trial % 9, first = trial % 7, end = NB - (trial % 5) * 13;
        const int n_cand = end - first, k = 1 + (int)(urand() * (n_cand - 1));
        for (int b = 0; b < NB; b++) /* coarse values: many exact ties */
            src[b] = trial % 3 == 0 ? (float)(int)(urand() * 6) : (float)urand();
        for (int gi = 0; gi * G < NB; gi++) { /* a bound >= the group's blocks, some slack */
            float m = -INFINITY;
            for (int b = gi * G; b < (gi + 1) * G && b < NB; b++)
                m = src[b] > m ? src[b] : m;
            gs[gi] = m + (trial % 2 ? (float)urand() * 0.5f : 0.0f);
        }
        slow_topk(src, first, end, k, want);
        for (int approx = 0; approx < 2; approx++) {
            struct fake f = {src, score, seen};
            memset(seen, 0, sizeof(seen));
            struct kvp_coarse_stats st;
            const int max_groups = approx ? 1 + trial % 4 : 0;
            int n = kvp_coarse_topk(gs, score + first, G, first, end, k, max_groups, fake_fn, NULL, &f,
                                    gheap, bheap, cval, out, &st);
            assert_int_equal(n, k);
            int hit = 0, in_seen = 0;
            for (int i = 0; i < k; i++) {
                assert_true(out[i] >= first && out[i] < end);
                assert_true(seen[out[i]]);
                if (i > 0)
                    assert_true(out[i] > out[i - 1]);
                hit += want[out[i]];
            }
            for (int b = first; b < end; b++)
                in_seen += want[b] && seen[b];
            int scored = 0;
            for (int b = first; b < end; b++)
                scored += seen[b];
            assert_int_equal(st.blocks, scored);
            if (approx) {
                /* the groups themselves: the m best by bound (ties to the lower group), m the
                 * limit or as many as holding k blocks needs, in ascending order */
                const int g0 = first / G, ng = (end - 1) / G + 1 - g0;
                int gids[NB], work[NB], nb = -1;
                unsigned char gwant[NB];
                const int m = kvp_coarse_pick(gs, G, first, end, k, max_groups, gids, work, &nb);
                slow_topk(gs, g0, g0 + ng, m, gwant);
                int held = 0;
                for (int i = 0; i < m; i++) {
                    assert_true(gwant[gids[i]]);
                    if (i > 0)
                        assert_true(gids[i] > gids[i - 1]);
                    const int lo = gids[i] * G > first ? gids[i] * G : first;
                    const int hi = (gids[i] + 1) * G < end ? (gids[i] + 1) * G : end;
                    held += hi - lo;
                }
                assert_int_equal(nb, held);
                assert_true(m >= (max_groups < ng ? max_groups : ng));
                assert_true(held >= k || m == ng);
                /* beyond the limit only what holding k needs (two partial groups at most) */
                const int need = (k + G - 1) / G + 2;
                assert_true(m <= (max_groups > need ? max_groups : need));
            }
            if (!approx) {
                assert_int_equal(hit, k); /* the flat top-k, ties included */
            } else {
                /* derived: the approximate set is the exact top-k of the blocks it scored, so
                 * it holds every flat top-k block of a visited group */
                assert_int_equal(hit, in_seen);
                /* it visits no more groups than its limit, or than holding k blocks needs
                 * (at most two partial groups at the ends of the candidates, then whole ones) */
                const int need = (k + G - 1) / G + 2;
                assert_true(st.groups <= (max_groups > need ? max_groups : need));
                recall_sum += (double)hit / k;
                recall_n++;
            }
        }
    }
    print_message("# ranking on made-up scores: approximate recall %.3f (mean of %d)\n",
                  recall_sum / recall_n, recall_n);
    /* NaN in a bound: the caller must rank flat */
    for (int b = 0; b < 32; b++)
        src[b] = (float)b;
    gs[0] = NAN;
    gs[1] = 100;
    struct fake f = {src, score, seen};
    assert_int_equal(
        kvp_coarse_topk(gs, score, 16, 0, 32, 4, 0, fake_fn, NULL, &f, gheap, bheap, NULL, out, NULL), -1);
    /* the approximate limit: visit groups per group of k, and at least the floor's blocks */
    assert_int_equal(kvp_coarse_limit(4.0f, 0, 16, 252), 64);
    assert_int_equal(kvp_coarse_limit(4.0f, 1024, 16, 30), 64);
    assert_int_equal(kvp_coarse_limit(4.0f, 1000, 16, 30), 63);
    assert_int_equal(kvp_coarse_limit(4.0f, 16, 16, 30), 8);
    assert_int_equal(kvp_coarse_limit(0.5f, 0, 16, 1), 1);
    assert_int_equal(kvp_coarse_limit(1.0f, 1 << 30, 4096, 1), (1 << 30) / 4096);
    for (int gi = 0; gi < 75; gi++)
        gs[gi] = 1000.0f - (float)gi;
    for (int b = 0; b < NB; b++)
        src[b] = (float)urand();
    struct kvp_coarse_stats st;
    memset(seen, 0, sizeof(seen));
    assert_int_equal(kvp_coarse_topk(gs, score, 4, 0, NB, 4, kvp_coarse_limit(1.0f, 48, 4, 4),
                                     fake_fn, NULL, &f, gheap, bheap, cval, out, &st),
                     4);
    assert_int_equal(st.blocks, 48); /* 12 groups of 4, not the 1 that visit=1 takes */
}

/* ---- the group metadata -----------------------------------------------------------------------
 */

static void store_random_key(struct kvp_kvcache *kv, int l, int h, int t, float amp)
{
    float k[64], v[64] = {0};
    for (int d = 0; d < kv->head_dim; d++)
        k[d] = (float)(urand() * 2 - 1) * amp;
    kvp_kvcache_store(kv, l, h, t, k, v);
}

/* Every group of lh equals the element-wise max/min of its blocks over n tokens. */
static void check_groups(const struct kvp_qmeta *blk, const struct kvp_qmeta *grp, int lh, int n)
{
    const int bs = blk->block_size, G = grp->block_size / bs, nb = (n + bs - 1) / bs;
    for (int gi = 0; gi * G < nb; gi++)
        for (int d = 0; d < blk->head_dim; d++) {
            float mx = kvp_qmeta_max(blk, lh, gi * G, d), mn = kvp_qmeta_min(blk, lh, gi * G, d);
            for (int b = gi * G; b < (gi + 1) * G && b < nb; b++) {
                mx = fmaxf(mx, kvp_qmeta_max(blk, lh, b, d));
                mn = fminf(mn, kvp_qmeta_min(blk, lh, b, d));
            }
            if (kvp_qmeta_max(grp, lh, gi, d) != mx || kvp_qmeta_min(grp, lh, gi, d) != mn)
                print_message("group %d d %d: %g %g, want %g %g\n", gi, d,
                              kvp_qmeta_max(grp, lh, gi, d), kvp_qmeta_min(grp, lh, gi, d), mx, mn);
            assert_true(kvp_qmeta_max(grp, lh, gi, d) == mx);
            assert_true(kvp_qmeta_min(grp, lh, gi, d) == mn);
        }
}

static void test_group_metadata(void **state)
{
    (void)state;
    const int bs = 8, hd = 16, n_ctx = 512, G = 4;
    struct kvp_err err = {0};
    struct kvp_kvcache kv;
    assert_int_equal(kvp_kvcache_init(&kv, 1, 2, hd, bs, n_ctx, cur_type, cur_type, &err), 0);
    assert_int_equal(kvp_kvcache_reserve(&kv, n_ctx, &err), 0);
    struct kvp_qmeta blk, grp;
    assert_int_equal(kvp_qmeta_init(&blk, 1, 2, n_ctx / bs, hd, bs), 0);
    assert_int_equal(kvp_qmeta_group_init(&grp, &blk, G), 0);
    for (int h = 0; h < 2; h++) {
        /* a prompt, then tokens one at a time past several group boundaries, with growing
         * magnitudes so that every append widens its group */
        int n = 37;
        for (int t = 0; t < n; t++)
            store_random_key(&kv, 0, h, t, 1.0f);
        kvp_qmeta_fold(&blk, &kv, 0, h, n);
        kvp_qmeta_group_update(&grp, &blk, h, n);
        check_groups(&blk, &grp, h, n);
        for (; n < 200; n++) {
            store_random_key(&kv, 0, h, n, 1.0f + (float)n / 50.0f);
            kvp_qmeta_fold(&blk, &kv, 0, h, n + 1);
            kvp_qmeta_group_update(&grp, &blk, h, n + 1);
            check_groups(&blk, &grp, h, n + 1);
        }
        /* a truncation to 150 then one new small token: the newest block is refolded, and its
         * group must shrink back (a stale group would keep the cut tokens' wide range) */
        store_random_key(&kv, 0, h, 150, 0.01f);
        kvp_qmeta_fold(&blk, &kv, 0, h, 151);
        kvp_qmeta_group_update(&grp, &blk, h, 151);
        check_groups(&blk, &grp, h, 151);
        for (n = 151; n < 170; n++) {
            store_random_key(&kv, 0, h, n, 0.5f);
            kvp_qmeta_fold(&blk, &kv, 0, h, n + 1);
            kvp_qmeta_group_update(&grp, &blk, h, n + 1);
            check_groups(&blk, &grp, h, n + 1);
        }
        /* a restart (a new prompt folded from 0) */
        for (int t = 0; t < 90; t++)
            store_random_key(&kv, 0, h, t, 0.25f);
        kvp_qmeta_restart(&blk, h);
        kvp_qmeta_restart(&grp, h);
        kvp_qmeta_fold(&blk, &kv, 0, h, 90);
        kvp_qmeta_group_update(&grp, &blk, h, 90);
        check_groups(&blk, &grp, h, 90);
    }
    kvp_qmeta_free(&grp);
    kvp_qmeta_free(&blk);
    kvp_kvcache_free(&kv);
}

/* ---- quest: coarse against flat ----------------------------------------------------------- */

#define HD   32
#define MAXB 1024

struct qbench {
    struct kvp_policy p;
    struct kvp_sel sel;
    int32_t blocks[MAXB];
    uint64_t mask[MAXB];
};

/* Start policy name (quest or qpredictor, with its aux file or NULL) over kv with its options
 * and budget ratio: the setup every "coarse against flat" comparison shares. */
static void policy_bench_start(struct qbench *b, const char *name, struct kvp_kvcache *kv,
                               const char *aux, const char *opts, int n_ctx, float ratio)
{
    struct kvp_err err = {0};
    memset(b, 0, sizeof(*b));
    b->p.ops = kvp_policy_find(name);
    assert_non_null(b->p.ops);
    b->p.p = (struct kvp_policy_params){.name = name,
                                        .budget_ratio = ratio,
                                        .sink = 16,
                                        .local = 16,
                                        .gqa_agg = KVP_AGG_MEAN,
                                        .opts = opts,
                                        .aux_path = aux};
    b->p.env = (struct kvp_policy_env){.n_layer = kv->n_layer,
                                       .n_head = 2 * kv->n_head_kv,
                                       .n_head_kv = kv->n_head_kv,
                                       .head_dim = HD,
                                       .block_size = kv->block_size,
                                       .n_ctx = n_ctx,
                                       .kv = kv};
    int rc = kvp_policy_start(&b->p, &err);
    if (rc)
        print_message("%s\n", err.msg);
    assert_int_equal(rc, 0);
    b->sel.blocks = b->blocks;
    b->sel.mask = b->mask;
}

static void qb_init(struct qbench *b, struct kvp_kvcache *kv, const char *opts, int n_ctx,
                    float ratio)
{
    policy_bench_start(b, "quest", kv, NULL, opts, n_ctx, ratio);
}

static bool sel_equal(const struct kvp_sel *a, const struct kvp_sel *b)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (a->blocks[i] != b->blocks[i] || a->mask[i] != b->mask[i])
            return false;
    return true;
}

/* Selected blocks of a in b (whole candidate blocks only: masks full). */
static int sel_overlap(const struct kvp_sel *a, const struct kvp_sel *b, int *n_a)
{
    int hit = 0, na = 0;
    for (int i = 0; i < a->n; i++) {
        na++;
        for (int j = 0; j < b->n; j++)
            hit += a->blocks[i] == b->blocks[j];
    }
    *n_a = na;
    return hit;
}

/* Structured keys: a slow drift shared by all tokens, noise, and planted needles: blocks whose
 * keys lie along one direction, which queries then point at; some blocks copy an earlier block
 * exactly (tied bounds). */
static void key_structured(float *k, int t, int style, const float *dir)
{
    for (int d = 0; d < HD; d++)
        k[d] = 0.3f * sinf(0.01f * (float)t + (float)d) + 0.2f * (float)(urand() * 2 - 1);
    if (style == 1 && t % 97 < 9)
        for (int d = 0; d < HD; d++)
            k[d] += 2.0f * dir[d];
}

/* The token at position n in every one of the n_kv heads: a structured key of the style, or, as a
 * needle, a key far out of its group's range along dir. */
static void append_token(struct kvp_kvcache *kv, int n_kv, int n, int style, const float *dir,
                         bool needle)
{
    float k[HD], vv[HD] = {0};
    for (int h = 0; h < n_kv; h++) {
        key_structured(k, n, style, dir);
        if (needle)
            for (int d = 0; d < HD; d++)
                k[d] = 4.0f * dir[d];
        kvp_kvcache_store(kv, 0, h, n, k, vv);
    }
}

static void make_query(float *q, int mode, const float *dir)
{
    for (int i = 0; i < 2 * HD; i++) {
        q[i] = (float)(urand() * 2 - 1);
        if (mode == 1)
            q[i] = dir[i % HD] + 0.3f * q[i]; /* toward the needles */
        if (mode == 2 && i % 5 == 0)
            q[i] = 0.0f; /* zero entries: the two-product path of the bound */
    }
}

/* One layer of n_kv KV heads of cur_type, reserved for n_ctx tokens, and a random direction the
 * structured keys' needles and the queries share. */
static void coarse_cache(struct kvp_kvcache *kv, int bs, int n_ctx, int n_kv, float *dir)
{
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_init(kv, 1, n_kv, HD, bs, n_ctx, cur_type, cur_type, &err), 0);
    assert_int_equal(kvp_kvcache_reserve(kv, n_ctx, &err), 0);
    for (int d = 0; d < HD; d++)
        dir[d] = (float)(urand() * 2 - 1);
}

static void test_quest_coarse_equals_flat(void **state)
{
    (void)state;
    const int bs = 16, n_ctx = 8192, n_kv = 2;
    struct kvp_kvcache kv;
    float dir[HD];
    coarse_cache(&kv, bs, n_ctx, n_kv, dir);
    /* the approximate mode visiting every group must be the flat pass too: its ranking is then
     * the top k of every block, gathered in block order */
    /* and up to `floor` candidates (default 1024 blocks, more than these contexts hold) the
     * approximate mode is the flat pass whatever visit says */
    const char *variants[] = {"groups=2",
                              "groups=5",
                              "groups=16",
                              "groups=64",
                              "groups=16,share=0",
                              "groups=16,coarse=approx,visit=100000,floor=0",
                              "groups=16,coarse=approx,visit=1",
                              "groups=8,coarse=approx,visit=0.5,floor=400"};
    const int n_var = 8;
    for (int style = 0; style < 3; style++) {
        const float ratio = style == 2 ? 1.0f / 8 : 1.0f / 16;
        struct qbench flat, co[8], ap;
        qb_init(&flat, &kv, "groups=0", n_ctx, ratio);
        for (int v = 0; v < n_var; v++)
            qb_init(&co[v], &kv, variants[v], n_ctx, ratio);
        qb_init(&ap, &kv, "groups=16,coarse=approx,visit=2,floor=0", n_ctx, ratio);
        int n = 1500 + style * 700;
        float k[HD], vv[HD] = {0};
        for (int h = 0; h < n_kv; h++)
            for (int t = 0; t < n; t++) {
                key_structured(k, t, style, dir);
                if (style == 2 && (t / bs) % 11 == 3 && t >= 11 * bs) /* tied blocks */
                    for (int d = 0; d < HD; d++)
                        k[d] = kvp_kvcache_key_at(&kv, 0, h, t - 11 * bs, d);
                kvp_kvcache_store(&kv, 0, h, t, k, vv);
            }
        struct kvp_prefill_obs ob = {.n_prompt = n};
        flat.p.ops->on_prefill(&flat.p, 0, &ob);
        for (int v = 0; v < n_var; v++)
            co[v].p.ops->on_prefill(&co[v].p, 0, &ob);
        ap.p.ops->on_prefill(&ap.p, 0, &ob);
        long hit = 0, tot = 0, forced = 0;
        for (int step = 0; step < 160; step++) {
            const int h = step % n_kv;
            if (step == 100) {
                /* a truncation: 400 tokens cut, the next token new (the newest block refolds) */
                n -= 400;
            }
            if (step == 130) {
                /* a reset and a prefill from the cache (a sequence copy or fork) */
                flat.p.ops->reset(&flat.p);
                for (int v = 0; v < n_var; v++)
                    co[v].p.ops->reset(&co[v].p);
                ap.p.ops->reset(&ap.p);
            }
            append_token(&kv, n_kv, n, style, dir, step % 17 == 5); /* the step's token */
            n++;
            float q[2 * HD];
            make_query(q, step % 3, dir);
            flat.p.ops->select(&flat.p, 0, h, q, n, &flat.sel);
            for (int v = 0; v < n_var; v++) {
                co[v].p.ops->select(&co[v].p, 0, h, q, n, &co[v].sel);
                if (!sel_equal(&flat.sel, &co[v].sel))
                    print_message("style %d step %d %s: %d vs %d blocks\n", style, step,
                                  variants[v], flat.sel.n, co[v].sel.n);
                assert_true(sel_equal(&flat.sel, &co[v].sel));
            }
            ap.p.ops->select(&ap.p, 0, h, q, n, &ap.sel);
            int na;
            hit += sel_overlap(&flat.sel, &ap.sel, &na);
            tot += na;
            forced += 1 + 2; /* sink block 0, and the local window's one or two blocks */
            if ((n - 16) % bs == 0 || n % bs == 0)
                forced -= 1;
            /* the tiered store's prediction for the next step: the same blocks too */
            if (step % 2 == 0) {
                flat.p.ops->predict_next(&flat.p, 0, h, n + 1, &flat.sel);
                for (int v = 0; v < n_var; v++) {
                    co[v].p.ops->predict_next(&co[v].p, 0, h, n + 1, &co[v].sel);
                    assert_true(sel_equal(&flat.sel, &co[v].sel));
                }
            }
        }
        /* the forced blocks count in both; recall of the whole selection */
        print_message("# %s style %d: approx (groups=16, visit=2) recall of flat %.4f\n",
                      kvp_kv_type_name(cur_type), style, (double)hit / tot);
        /* the lower bound the approximate mode has by construction: the forced blocks (sink
         * and local window) are in both selections; the ranking's own statement (every flat
         * block of a visited group is chosen) is checked on made-up scores above */
        assert_true(hit >= forced);
        kvp_policy_stop(&flat.p);
        for (int v = 0; v < n_var; v++)
            kvp_policy_stop(&co[v].p);
        kvp_policy_stop(&ap.p);
    }
    kvp_kvcache_free(&kv);
}

/* ---- quest q8=1: the approximate pass over the 8-bit copies ---------------------------------- */

/* What quest's approximate pass with q8=1 selects, built here from the cache: an exact fold, its
 * groups of G blocks, 8-bit copies of both; the groups ranked by the mean over the g heads of
 * their 8-bit bounds, the visit's groups picked (kvp_coarse_pick, max_groups; 0: every group),
 * and the plan's k best of their blocks by the mean of the blocks' 8-bit bounds. */
static void q8_reference(struct kvp_policy *p, const struct kvp_kvcache *kv, int h, const float *q,
                         int n, int G, int max_groups, struct kvp_sel *sel)
{
    const int g = p->env.n_head / p->env.n_head_kv, mb = kv->max_blocks;
    struct kvp_qmeta m, gm;
    struct kvp_qmeta8 m8, gm8;
    assert_int_equal(kvp_qmeta_init(&m, 1, kv->n_head_kv, mb, HD, kv->block_size), 0);
    assert_int_equal(kvp_qmeta_group_init(&gm, &m, G), 0);
    assert_int_equal(kvp_qmeta8_init(&m8, &m), 0);
    assert_int_equal(kvp_qmeta8_init(&gm8, &gm), 0);
    kvp_qmeta_fold(&m, kv, 0, h, n);
    kvp_qmeta_group_update(&gm, &m, h, n);
    kvp_qmeta8_update(&m8, &m, h, n);
    kvp_qmeta8_update(&gm8, &gm, h, n);
    struct kvp_block_plan bp;
    kvp_block_plan(p, n, &bp);
    static float ub[4 * MAXB], comb[MAXB], gcomb[MAXB], val[MAXB];
    static int top[MAXB], scr[MAXB], gids[MAXB], idx[MAXB];
    static int32_t chosen[MAXB];
    static uint64_t masks[MAXB];
    const int g0 = bp.first / G, g1 = (bp.end - 1) / G + 1, ng = g1 - g0;
    kvp_qmeta8_bounds(&gm8, h, q, g, 1.0f, g0, g1, ub, ng);
    kvp_gqa_combine(ub, g, ng, ng, KVP_AGG_MEAN, gcomb + g0);
    int nb;
    const int m_g = kvp_coarse_pick(gcomb, G, bp.first, bp.end, bp.k, max_groups > 0 ? max_groups : ng,
                                    gids, scr, &nb);
    const int nc = bp.end - bp.first;
    kvp_qmeta8_bounds(&m8, h, q, g, 1.0f, bp.first, bp.end, ub, nc);
    kvp_gqa_combine(ub, g, nc, nc, KVP_AGG_MEAN, comb);
    int nv = 0;
    for (int i = 0; i < m_g; i++)
        for (int b = gids[i] * G; b < (gids[i] + 1) * G; b++)
            if (b >= bp.first && b < bp.end) {
                idx[nv] = b;
                val[nv++] = comb[b - bp.first];
            }
    kvp_topk_indices(val, nv, bp.k, top, scr);
    for (int i = 0; i < bp.k; i++)
        chosen[i] = idx[top[i]];
    kvp_sel_chosen(&bp, chosen, bp.k, n, kv->block_size, sel, masks);
    kvp_qmeta8_free(&gm8);
    kvp_qmeta8_free(&m8);
    kvp_qmeta_free(&gm);
    kvp_qmeta_free(&m);
}

static void test_quest_q8(void **state)
{
    (void)state;
    const int bs = 16, n_ctx = 8192, n_kv = 2;
    struct kvp_kvcache kv;
    float dir[HD];
    coarse_cache(&kv, bs, n_ctx, n_kv, dir);
    /* q8 needs the approximate pass: refused otherwise, with one clear error */
    {
        struct kvp_err err = {0};
        const char *bad[] = {"q8=1", "groups=16,q8=1", "groups=16,coarse=exact,q8=1"};
        for (int i = 0; i < 3; i++) {
            struct kvp_policy p = {.ops = kvp_policy_find("quest")};
            p.p = (struct kvp_policy_params){.name = "quest", .budget_ratio = 1.0f / 16,
                                             .sink = 16, .local = 16, .opts = bad[i]};
            p.env = (struct kvp_policy_env){.n_layer = 1, .n_head = 2 * n_kv, .n_head_kv = n_kv,
                                            .head_dim = HD, .block_size = bs, .n_ctx = n_ctx,
                                            .kv = &kv};
            assert_int_equal(kvp_policy_start(&p, &err), KVP_EINVAL);
            assert_non_null(strstr(err.msg, "q8=1"));
        }
    }
    for (int style = 0; style < 3; style++) {
        const float ratio = style == 2 ? 1.0f / 8 : 1.0f / 16;
        struct qbench flat, all8, below, ap, ap8;
        qb_init(&flat, &kv, "groups=0", n_ctx, ratio);
        qb_init(&all8, &kv, "groups=16,coarse=approx,visit=100000,floor=0,q8=1", n_ctx, ratio);
        qb_init(&below, &kv, "groups=16,coarse=approx,visit=1,q8=1", n_ctx, ratio);
        /* share=0: a select ranks for its own k (with share=1, once predictions run, it ranks
         * the k + margin it keeps for them, which visits more groups) */
        qb_init(&ap, &kv, "groups=16,coarse=approx,visit=2,floor=0,share=0", n_ctx, ratio);
        qb_init(&ap8, &kv, "groups=16,coarse=approx,visit=2,floor=0,q8=1,share=0", n_ctx, ratio);
        struct qbench *all[] = {&flat, &all8, &below, &ap, &ap8};
        int n = 1500 + style * 700;
        float k[HD], vv[HD] = {0};
        for (int h = 0; h < n_kv; h++)
            for (int t = 0; t < n; t++) {
                key_structured(k, t, style, dir);
                kvp_kvcache_store(&kv, 0, h, t, k, vv);
            }
        struct kvp_prefill_obs ob = {.n_prompt = n};
        for (int i = 0; i < 5; i++)
            all[i]->p.ops->on_prefill(&all[i]->p, 0, &ob);
        long hit = 0, hit8 = 0, tot = 0;
        struct qbench ref;
        memset(&ref, 0, sizeof(ref));
        ref.sel.blocks = ref.blocks;
        ref.sel.mask = ref.mask;
        for (int step = 0; step < 120; step++) {
            const int h = step % n_kv;
            if (step == 60)
                n -= 300; /* a truncation: the newest block and group requantized */
            if (step == 90)
                for (int i = 0; i < 5; i++) /* a reset: the prompt folded again */
                    all[i]->p.ops->reset(&all[i]->p);
            append_token(&kv, n_kv, n, style, dir, step % 13 == 4);
            n++;
            float q[2 * HD];
            make_query(q, step % 3, dir);
            for (int i = 0; i < 5; i++)
                all[i]->p.ops->select(&all[i]->p, 0, h, q, n, &all[i]->sel);
            q8_reference(&all8.p, &kv, h, q, n, 16, 0, &ref.sel);
            assert_true(sel_equal(&ref.sel, &all8.sel));
            struct kvp_block_plan bp;
            kvp_block_plan(&ap8.p, n, &bp);
            q8_reference(&ap8.p, &kv, h, q, n, 16, kvp_coarse_limit(2.0f, 0, 16, bp.k),
                         &ref.sel);
            assert_true(sel_equal(&ref.sel, &ap8.sel));
            assert_true(sel_equal(&flat.sel, &below.sel));
            int na;
            hit += sel_overlap(&flat.sel, &ap.sel, &na);
            hit8 += sel_overlap(&flat.sel, &ap8.sel, &na);
            tot += na;
            if (step % 2 == 0) /* predictions run (ASan watches) and hold their k blocks */
                for (int i = 1; i < 5; i++) {
                    all[i]->p.ops->predict_next(&all[i]->p, 0, h, n + 1, &all[i]->sel);
                    assert_true(all[i]->sel.n > 0);
                }
        }
        print_message("# %s style %d: approx visit=2 recall of flat %.4f, with q8=1 %.4f\n",
                      kvp_kv_type_name(cur_type), style, (double)hit / tot, (double)hit8 / tot);
        for (int i = 0; i < 5; i++)
            kvp_policy_stop(&all[i]->p);
    }
    kvp_kvcache_free(&kv);
}

/* ---- qpredictor: coarse candidates against flat ------------------------------------------ */

static void qp_start(struct qbench *b, struct kvp_kvcache *kv, const char *aux, const char *opts,
                     int n_ctx, float ratio)
{
    policy_bench_start(b, "qpredictor", kv, aux, opts, n_ctx, ratio);
}

static void test_qpredictor_coarse_equals_flat(void **state)
{
    (void)state;
    const char *src = getenv("KVP_SOURCE_DIR");
    char aux[4096];
    snprintf(aux, sizeof(aux), "%s/models/kvpred-default.qkvpp", src ? src : ".");
    FILE *f = fopen(aux, "rb");
    if (!f) {
        kvp_test_skip_missing(aux);
    }
    fclose(f);
    const int bs = 16, n_ctx = 8192, n_kv = 2;
    struct kvp_kvcache kv;
    float dir[HD];
    coarse_cache(&kv, bs, n_ctx, n_kv, dir);
    /* the shared approximate pass visiting every group: M_j is then each head's largest bound,
     * the feature the flat one and the candidates its top k + extra (the flat selection) */
    const char *variants[] = {"groups=4",
                              "groups=16",
                              "groups=16,recent=1",
                              "groups=64",
                              "groups=16,coarse=approx,visit=100000,floor=0",
                              "groups=5,coarse=approx,visit=100000,floor=0",
                              "groups=16,coarse=approx,visit=1",
                              "groups=8,coarse=approx,visit=0.5,floor=400"};
    const int n_var = 8;
    static float probs[2 * MAXB * 16];
    for (int style = 0; style < 2; style++) {
        const float ratio = style ? 1.0f / 8 : 1.0f / 16;
        struct qbench flat, flat_r, co[8], ap, flat8, co8, ap8;
        qp_start(&flat, &kv, aux, "groups=0", n_ctx, ratio);
        qp_start(&flat_r, &kv, aux, "groups=0,recent=1", n_ctx, ratio);
        for (int v = 0; v < n_var; v++)
            qp_start(&co[v], &kv, aux, variants[v], n_ctx, ratio);
        qp_start(&ap, &kv, aux, "groups=16,coarse=approx,visit=4,floor=0", n_ctx, ratio);
        /* q8=1: the approximate pass over 8-bit copies of both levels, visiting every group,
         * is the flat pass over the 8-bit copy */
        qp_start(&flat8, &kv, aux, "groups=0,q8=1", n_ctx, ratio);
        qp_start(&co8, &kv, aux, "groups=16,coarse=approx,visit=100000,floor=0,q8=1", n_ctx,
                 ratio);
        qp_start(&ap8, &kv, aux, "groups=16,coarse=approx,visit=4,floor=0,q8=1", n_ctx, ratio);
        int n = 2000 + style * 900;
        float k[HD], vv[HD] = {0};
        for (int h = 0; h < n_kv; h++)
            for (int t = 0; t < n; t++) {
                key_structured(k, t, 1, dir);
                kvp_kvcache_store(&kv, 0, h, t, k, vv);
            }
        struct kvp_prefill_obs ob = {.n_prompt = n};
        struct qbench *all[14] = {&flat,  &flat_r, &co[0], &co[1], &co[2], &co[3], &co[4],
                                  &co[5], &co[6],  &co[7], &ap,    &flat8, &co8,   &ap8};
        const int n_all = 14;
        for (int i = 0; i < n_all; i++)
            all[i]->p.ops->on_prefill(&all[i]->p, 0, &ob);
        long hit = 0, hit8 = 0, tot = 0;
        for (int step = 0; step < 120; step++) {
            const int h = step % n_kv;
            if (step == 80)
                n -= 300; /* a truncation */
            append_token(&kv, n_kv, n, 1, dir, step % 13 == 4);
            n++;
            float q[2 * HD];
            make_query(q, step % 3, dir);
            for (int i = 0; i < n_all; i++)
                all[i]->p.ops->select(&all[i]->p, 0, h, q, n, &all[i]->sel);
            for (int v = 0; v < n_var; v++) {
                const struct kvp_sel *ref = v == 2 ? &flat_r.sel : &flat.sel;
                if (!sel_equal(ref, &co[v].sel))
                    print_message("qpredictor style %d step %d %s differs\n", style, step,
                                  variants[v]);
                assert_true(sel_equal(ref, &co[v].sel));
            }
            assert_true(sel_equal(&flat8.sel, &co8.sel));
            int na;
            hit += sel_overlap(&flat.sel, &ap.sel, &na);
            hit8 += sel_overlap(&flat.sel, &ap8.sel, &na);
            tot += na;
            /* the same history for all: probabilities over each one's own selection */
            for (int i = 0; i < n_all; i++) {
                const struct kvp_sel *sl = &all[i]->sel;
                for (int j = 0; j < 2; j++)
                    for (int x = 0; x < sl->n * bs; x++)
                        probs[(size_t)j * MAXB * bs + x] =
                            (float)(((sl->blocks[x / bs] * 7 + x % bs + step) % 11) / 11.0);
                if (all[i]->p.ops->step_block_max) /* each block's largest, in place */
                    for (int j = 0; j < 2; j++)
                        for (int b = 0; b < sl->n; b++) {
                            const float *pb = probs + (size_t)j * MAXB * bs + (size_t)b * bs;
                            float m = 0.0f;
                            for (int t = 0; t < bs; t++)
                                m = pb[t] > m ? pb[t] : m;
                            probs[(size_t)j * MAXB * bs + b] = m; /* b <= b * bs: read before */
                        }
                all[i]->p.ops->on_step(&all[i]->p, 0, h, sl, probs, MAXB * bs, n);
            }
            if (step % 2 == 0) {
                for (int i = 0; i < n_all; i++)
                    all[i]->p.ops->predict_next(&all[i]->p, 0, h, n + 1, &all[i]->sel);
                for (int v = 0; v < n_var; v++)
                    assert_true(sel_equal(v == 2 ? &flat_r.sel : &flat.sel, &co[v].sel));
                assert_true(sel_equal(&flat8.sel, &co8.sel));
            }
        }
        print_message("# %s qpredictor style %d: approx (groups=16, visit=4) recall of flat "
                      "%.4f, with q8=1 %.4f\n",
                      kvp_kv_type_name(cur_type), style, (double)hit / tot, (double)hit8 / tot);
        for (int i = 0; i < n_all; i++)
            kvp_policy_stop(&all[i]->p);
    }
    kvp_kvcache_free(&kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_metadata),
        cmocka_unit_test(test_quest_coarse_equals_flat),
        cmocka_unit_test(test_quest_q8),
        cmocka_unit_test(test_qpredictor_coarse_equals_flat),
    };
    const struct CMUnitTest once[] = {
        cmocka_unit_test(test_ranking_exact_and_approx),
    };
    int failed = cmocka_run_group_tests(once, NULL, NULL);
    const int types[] = {KVP_KV_F32, KVP_KV_F16, KVP_KV_BF16, KVP_KV_Q8_0};
    for (int i = 0; i < 4; i++) {
        cur_type = types[i];
        printf("# KV type %s\n", kvp_kv_type_name(cur_type));
        failed += cmocka_run_group_tests(tests, NULL, NULL);
    }
    return failed;
}
