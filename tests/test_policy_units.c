/*
 * The baseline policies on hand-made data: a tiny KV cache filled with random keys and a policy
 * instance built by hand, each checked against a slow, obvious re-computation (sorting instead of
 * heaps, doubles instead of floats): top-k ties, the shared block plan and budget counting,
 * Quest's bound and selection, SnapKV's pooled scores and keep set, H2O's accumulation and
 * eviction order, PyramidKV's per-layer budgets and fallbacks, and the random policy's seeding.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvcache.h"
#include "kvpred.h"
#include "policy/host.h"
#include "testutil.h"

/* ---- fixtures ---- */

static uint64_t rng_state = 12345;

static double urand(void) /* [0, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

struct bench {
    struct kvp_kvcache kv;
    struct kvp_policy p;
    struct kvp_sel sel;
    int32_t blocks[256];
    uint64_t mask[256];
};

/* A cache of n_layer x n_kv heads and a policy `name` on it; sink/local/budget as given (no
 * defaults applied: 0 means 0), dense_layers 0, gqa mean. */
static int unit_type; /* KV cache type of the run of the group (main) */

static void bench_init(struct bench *b, const char *name, int n_layer, int n_head, int n_kv,
                       int hd, int bs, int n_ctx, int budget, int sink, int local)
{
    struct kvp_err err = {0};
    memset(b, 0, sizeof(*b));
    assert_int_equal(kvp_kvcache_init(&b->kv, n_layer, n_kv, hd, bs, n_ctx, unit_type, unit_type,
                                      &err), 0);
    b->p.ops = kvp_policy_find(name);
    assert_non_null(b->p.ops);
    b->p.p = (struct kvp_policy_params){.name = name, .budget = budget, .sink = sink,
                                        .local = local, .window = 8, .pool = 5,
                                        .gqa_agg = KVP_AGG_MEAN};
    b->p.env = (struct kvp_policy_env){.n_layer = n_layer, .n_head = n_head, .n_head_kv = n_kv,
                                       .head_dim = hd, .block_size = bs, .n_ctx = n_ctx,
                                       .kv = &b->kv};
    assert_int_equal(kvp_policy_start(&b->p, &err), 0);
    b->sel.blocks = b->blocks;
    b->sel.mask = b->mask;
}

static void bench_free(struct bench *b)
{
    kvp_policy_stop(&b->p);
    kvp_kvcache_free(&b->kv);
}

/* Store n random keys (and values) in every (layer, KV head). */
static void fill_keys(struct bench *b, int n)
{
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_reserve(&b->kv, n, &err), 0);
    float k[64], v[64];
    for (int l = 0; l < b->kv.n_layer; l++)
        for (int h = 0; h < b->kv.n_head_kv; h++)
            for (int t = 0; t < n; t++) {
                for (int d = 0; d < b->kv.head_dim; d++) {
                    k[d] = (float)(urand() * 2 - 1);
                    v[d] = (float)(urand() * 2 - 1);
                }
                kvp_kvcache_store(&b->kv, l, h, t, k, v);
            }
}

/* A stored key as the policies read it (dequantized) */
static float key_at(const struct kvp_kvcache *kv, int l, int h, int t, int d)
{
    return kvp_kvcache_key_at(kv, l, h, t, d);
}

static bool sel_has(const struct kvp_sel *sel, int t, int bs)
{
    for (int i = 0; i < sel->n; i++)
        if (sel->blocks[i] == t / bs)
            return (sel->mask[i] >> (t % bs)) & 1;
    return false;
}

/* Tokens a selection reads: selected, below n_tokens, not evicted. */
static int sel_count(const struct kvp_sel *sel, const struct kvp_kvcache *kv, int l, int h,
                     int n_tokens)
{
    int c = 0;
    for (int t = 0; t < n_tokens; t++)
        if (sel_has(sel, t, kv->block_size) &&
            !((kvp_kvcache_evicted(kv, l, h, t / kv->block_size) >> (t % kv->block_size)) & 1))
            c++;
    return c;
}

static bool is_evicted(const struct kvp_kvcache *kv, int l, int h, int t)
{
    int bs = kv->block_size;
    return (kvp_kvcache_evicted(kv, l, h, t / bs) >> (t % bs)) & 1;
}

/* Is the token of position pos still in the cache of n tokens (in whichever slot compaction put
 * it)? */
static bool pos_alive(const struct kvp_kvcache *kv, int l, int h, int n, int pos)
{
    for (int s = 0; s < n; s++)
        if (!is_evicted(kv, l, h, s) && kvp_kvcache_pos(kv, l, h, s) == pos)
            return true;
    return false;
}

/* Brute-force top-k: indices of the k largest of x[0..n) (ties to the lower index), by repeated
 * scans. chosen[] gets 1 for the chosen. */
static void brute_topk(const double *x, int n, int k, const bool *eligible, bool *chosen)
{
    if (n <= 0)
        return;
    memset(chosen, 0, (size_t)n * sizeof(bool));
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if ((!eligible || eligible[i]) && !chosen[i] && (best < 0 || x[i] > x[best]))
                best = i;
        if (best < 0)
            return;
        chosen[best] = true;
    }
}

/* ---- top-k and the block plan ---- */

/* Token ranges into block masks (one word per block) against setting one bit per token, for
 * every range over a few blocks and block sizes up to the 64-bit limit. */
static void test_mask_add_range(void **state)
{
    (void)state;
    const int sizes[] = {1, 3, 16, 63, 64};
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        const int bs = sizes[si], n = 3 * bs + 2;
        for (int b = -1; b <= n; b++)
            for (int e = b; e <= n; e++) {
                uint64_t got[5] = {1, 0, 0, 0, 1 << 4}, want[5] = {1, 0, 0, 0, 1 << 4};
                kvp_mask_add_range(got, b, e, bs);
                for (int t = b < 0 ? 0 : b; t < e; t++)
                    want[t / bs] |= 1ULL << (t % bs);
                assert_memory_equal(got, want, sizeof(got));
            }
    }
}

/* kvp_sel_chosen (the forced ranges, the chosen blocks and the budget's fill below the local
 * window) against a token-by-token marking, over random plans and chosen sets: ascending ones
 * (the short path that never touches the blocks between them), shuffled ones and short ones (the
 * pass over every block's mask). */
static void test_sel_chosen_against_tokens(void **state)
{
    (void)state;
    enum { MAXT = 2048, MAXB = MAXT };
    static int32_t chosen[MAXB], sblocks[MAXB], pool[MAXB];
    static uint64_t smask[MAXB], scratch[MAXB];
    static unsigned char want[MAXT], blk_full[MAXB];
    const int sizes[] = {4, 16, 64};
    for (int it = 0; it < 3000; it++) {
        const int bs = sizes[it % 3];
        const int n = 1 + (int)(urand() * (MAXT - 1));
        const int nb = (n + bs - 1) / bs;
        struct kvp_block_plan bp = {.n_blocks = nb};
        bp.sink = (int)(urand() * (n < 100 ? n : 100));
        int ls = bp.sink + (int)(urand() * (n - bp.sink + 1));
        if (urand() < 0.7)
            ls = ls / bs * bs; /* the window moved down to a block boundary */
        bp.local_start = ls;
        bp.first = (bp.sink + bs - 1) / bs;
        bp.end = ls / bs > bp.first ? ls / bs : bp.first;
        const int n_cand = bp.end - bp.first;
        bp.k = (int)(urand() * (n_cand + 1));
        bp.left = urand() < 0.8 ? (int)(urand() * bs) : (int)(urand() * 4 * bs);
        /* k distinct candidates (a partial shuffle), sometimes fewer, sometimes out of order */
        for (int i = 0; i < n_cand; i++)
            pool[i] = bp.first + i;
        for (int i = 0; i < bp.k; i++) {
            int j = i + (int)(urand() * (n_cand - i));
            int32_t t = pool[i];
            pool[i] = pool[j];
            pool[j] = t;
        }
        int n_chosen = bp.k > 0 && urand() < 0.1 ? bp.k - 1 : bp.k;
        memcpy(chosen, pool, (size_t)n_chosen * sizeof(int32_t));
        if (urand() < 0.75) /* ascending (insertion sort: k is small enough here) */
            for (int i = 1; i < n_chosen; i++)
                for (int j = i; j > 0 && chosen[j] < chosen[j - 1]; j--) {
                    int32_t t = chosen[j];
                    chosen[j] = chosen[j - 1];
                    chosen[j - 1] = t;
                }
        /* the reference: tokens marked one by one */
        memset(want, 0, (size_t)n);
        for (int t = 0; t < bp.sink; t++)
            want[t] = 1;
        for (int t = ls; t < n; t++)
            want[t] = 1;
        for (int i = 0; i < n_chosen; i++)
            for (int t = chosen[i] * bs; t < (chosen[i] + 1) * bs && t < n; t++)
                want[t] = 1;
        for (int b = 0; b < nb; b++) {
            blk_full[b] = 1;
            for (int t = b * bs; t < (b + 1) * bs; t++)
                blk_full[b] &= t < n && want[t];
        }
        int left = bp.left + (n_chosen < bp.k ? (bp.k - n_chosen) * bs : 0);
        for (int t = ls - 1; t >= bp.sink && left > 0; t--)
            if (!blk_full[t / bs] && !want[t]) {
                want[t] = 1;
                left--;
            }
        struct kvp_sel sel = {.blocks = sblocks, .mask = smask};
        kvp_sel_chosen(&bp, chosen, n_chosen, n, bs, &sel, scratch);
        int w = 0;
        for (int b = 0; b < nb; b++) {
            uint64_t m = 0;
            for (int t = b * bs; t < (b + 1) * bs && t < n; t++)
                m |= (uint64_t)want[t] << (t - b * bs);
            if (!m)
                continue;
            assert_true(w < sel.n);
            assert_int_equal(sel.blocks[w], b);
            assert_true(sel.mask[w] == m);
            w++;
        }
        assert_int_equal(sel.n, w);
    }
}

/* kvp_gqa_combine (vectorized) against the element-by-element loop, to the bit: sum, mean and
 * max over 1-8 heads, lengths around the vector width, NaNs, signed zeros and ties. */
static void test_gqa_combine_bits(void **state)
{
    (void)state;
    enum { MAXN = 70, MAXG = 8 };
    float rows[MAXG * (MAXN + 3)], got[MAXN], want[MAXN];
    const int aggs[] = {KVP_AGG_SUM, KVP_AGG_MEAN, KVP_AGG_MAX};
    const int gs[] = {1, 2, 3, 4, 8};
    for (int it = 0; it < 400; it++) {
        const int g = gs[it % 5], n = (it * 7) % (MAXN + 1), stride = n + it % 3;
        for (int i = 0; i < g * stride; i++) {
            const double u = urand();
            rows[i] = u < 0.05 ? NAN : u < 0.1 ? -0.0f : u < 0.2 ? 1.0f : (float)(urand() * 8 - 4);
        }
        for (int a = 0; a < 3; a++) {
            const int agg = aggs[a];
            for (int i = 0; i < n; i++) {
                float o = rows[i];
                for (int j = 1; j < g; j++) {
                    const float r = rows[(size_t)j * stride + i];
                    o = agg == KVP_AGG_MAX ? (r > o ? r : o) : o + r;
                }
                want[i] = agg == KVP_AGG_MEAN && g > 1 ? o / (float)g : o;
            }
            kvp_gqa_combine(rows, g, stride, n, agg, got);
            assert_memory_equal(got, want, (size_t)n * sizeof(float));
        }
    }
}

static void test_topk_ties_to_lower_index(void **state)
{
    (void)state;
    const float x[] = {1, 3, 3, 2, 3, 0, 3};
    int out[8], scratch[8]; /* scratch: n ints */
    kvp_topk_indices(x, 7, 2, out, scratch);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 2);
    kvp_topk_indices(x, 7, 4, out, scratch);
    assert_int_equal(out[3], 6);
    assert_int_equal(out[2], 4);
    const float z[8] = {0};
    kvp_topk_indices(z, 8, 3, out, scratch);
    for (int i = 0; i < 3; i++)
        assert_int_equal(out[i], i);
    /* random values against the brute force */
    float r[200];
    double rd[200];
    int o[200], s[200];
    bool ch[200];
    for (int i = 0; i < 200; i++)
        rd[i] = r[i] = (float)(int)(urand() * 20); /* many ties */
    kvp_topk_indices(r, 200, 37, o, s);
    brute_topk(rd, 200, 37, NULL, ch);
    for (int i = 0; i < 37; i++)
        assert_true(ch[o[i]]);
}

/* The top-k (bisection on the keys; the quickselect and the heap behind it take NaN) against
 * the brute force on shapes that trouble a selection: sorted either way, all equal, few
 * distinct values, organ pipe, random, large values at a regular stride, negative values (log
 * features), both zeros and infinities mixed, values that differ only in the last bits of the
 * mantissa; k from 1 to n, at n = 2048, 300 and 37 (vector tails); output ascending. With NaN
 * in the scores it still returns k distinct indices in ascending order. */
static void test_topk_shapes(void **state)
{
    (void)state;
    enum { N = 2048 };
    static const int ks[] = {1, 2, 3, 5, 8, 37, 100, 191, 200, 255, 256, 300, 1000, N};
    static const int ns[] = {N, 300, 37};
    float x[N];
    double xd[N];
    int o[N], s[N];
    bool ch[N];
    for (int ni = 0; ni < 3; ni++)
        for (int shape = 0; shape < 10; shape++)
            for (size_t r = 0; r < sizeof(ks) / sizeof(ks[0]); r++) {
                const int n = ns[ni], k = ks[r] < n ? ks[r] : n;
                for (int i = 0; i < n; i++) {
                    const float zinf[] = {0.0f, -0.0f, INFINITY, -INFINITY, 1.0f, -1.0f};
                    float v[] = {(float)i,
                                 (float)(n - i),
                                 1.0f,
                                 (float)(int)(urand() * 4),
                                 (float)(i < n / 2 ? i : n - i),
                                 (float)urand(),
                                 i % 16 ? (float)(i % 7) : 100.0f,
                                 -5.0f * (float)urand(),
                                 zinf[(int)(urand() * 6)],
                                 -4.0f - (float)(int)(urand() * 64) * 0x1p-21f};
                    x[i] = v[shape];
                    xd[i] = x[i];
                }
                kvp_topk_indices(x, n, k, o, s);
                brute_topk(xd, n, k, NULL, ch);
                for (int i = 0; i < k; i++) {
                    assert_true(ch[o[i]]);
                    if (i > 0)
                        assert_true(o[i - 1] < o[i]);
                }
            }
    for (int i = 0; i < N; i++)
        x[i] = i % 7 == 3 ? NAN : (float)urand();
    kvp_topk_indices(x, N, 100, o, s);
    for (int i = 1; i < 100; i++)
        assert_true(o[i - 1] < o[i] && o[i] >= 0 && o[i] < N);
}

/* Block policies: the selection always holds sink and local, never exceeds the budget when the
 * budget leaves room for the local window's block rounding, and is everything when the budget
 * covers the context. Checked for quest, oracle and random on random keys. */
static void test_block_budget_semantics(void **state)
{
    (void)state;
    const char *names[] = {"quest", "oracle", "random"};
    const int bs = 16, n_ctx = 300;
    for (int pi = 0; pi < 3; pi++)
        for (int budget = 32; budget <= 320; budget += 24)
            for (int n = 40; n <= n_ctx; n += 37) {
                struct bench b;
                bench_init(&b, names[pi], 1, 4, 2, 8, bs, n_ctx, budget, 16, 8);
                fill_keys(&b, n);
                float q[16];
                for (int i = 0; i < 16; i++)
                    q[i] = (float)(urand() * 2 - 1);
                for (int h = 0; h < 2; h++) {
                    b.p.ops->select(&b.p, 0, h, q, n, &b.sel);
                    int cnt = sel_count(&b.sel, &b.kv, 0, h, n);
                    for (int t = 0; t < 16; t++)
                        assert_true(sel_has(&b.sel, t, bs));
                    for (int t = n - 8; t < n; t++)
                        assert_true(sel_has(&b.sel, t, bs));
                    for (int i = 1; i < b.sel.n; i++)
                        assert_true(b.sel.blocks[i] > b.sel.blocks[i - 1]);
                    /* forced: 16 + 8..23 tokens (8 when the budget cannot pay for the local
                     * window's block rounding); above that, whole blocks */
                    if (budget >= n)
                        assert_int_equal(cnt, n);
                    else
                        assert_true(cnt <= budget && cnt > budget - bs);
                }
                bench_free(&b);
            }
}

/* Token policies count sink and local in the budget: exactly min(budget, n) tokens. */
static void test_token_budget_semantics(void **state)
{
    (void)state;
    const int bs = 16, n_ctx = 300;
    for (int budget = 24; budget <= 320; budget += 40)
        for (int n = 30; n <= n_ctx; n += 41) {
            struct bench b;
            bench_init(&b, "oracle_token", 1, 4, 2, 8, bs, n_ctx, budget, 16, 8);
            fill_keys(&b, n);
            float q[16];
            for (int i = 0; i < 16; i++)
                q[i] = (float)(urand() * 2 - 1);
            b.p.ops->select(&b.p, 0, 1, q, n, &b.sel);
            assert_int_equal(sel_count(&b.sel, &b.kv, 0, 1, n), budget < n ? budget : n);
            for (int t = 0; t < 16 && t < n; t++)
                assert_true(sel_has(&b.sel, t, bs));
            for (int t = n - 8; t < n; t++)
                assert_true(sel_has(&b.sel, t, bs));
            bench_free(&b);
        }
}

/* ---- Quest ---- */

static void test_quest_bound_and_selection(void **state)
{
    (void)state;
    const int bs = 8, hd = 16, n = 203, g = 2;
    struct bench b;
    bench_init(&b, "quest", 2, 4, 2, hd, bs, 256, 64, 8, 8);
    fill_keys(&b, n - 1);
    /* prefill rebuild, then one appended token folded in by select */
    struct kvp_prefill_obs ob = {.n_prompt = n - 1};
    for (int l = 0; l < 2; l++)
        b.p.ops->on_prefill(&b.p, l, &ob);
    {
        struct kvp_err err = {0};
        assert_int_equal(kvp_kvcache_reserve(&b.kv, n, &err), 0);
        float k[16], v[16] = {0};
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++) {
                for (int d = 0; d < hd; d++)
                    k[d] = (float)(urand() * 4 - 2);
                kvp_kvcache_store(&b.kv, l, h, n - 1, k, v);
            }
    }
    for (int trial = 0; trial < 20; trial++) {
        float q[32];
        for (int i = 0; i < g * hd; i++)
            q[i] = (float)(urand() * 2 - 1);
        int l = trial % 2, h = (trial / 2) % 2;
        b.p.ops->select(&b.p, l, h, q, n, &b.sel);
        /* brute force: min/max of each block, the bound, true scores under it */
        int nb = (n + bs - 1) / bs;
        double ub[32];
        for (int blk = 0; blk < nb; blk++) {
            float mx[16], mn[16];
            int nt = n - blk * bs < bs ? n - blk * bs : bs;
            for (int d = 0; d < hd; d++) {
                mx[d] = mn[d] = key_at(&b.kv, l, h, blk * bs, d);
                for (int t = 1; t < nt; t++) {
                    float kk = key_at(&b.kv, l, h, blk * bs + t, d);
                    mx[d] = kk > mx[d] ? kk : mx[d];
                    mn[d] = kk < mn[d] ? kk : mn[d];
                }
            }
            ub[blk] = 0;
            for (int j = 0; j < g; j++) {
                float bound = kvp_quest_bound(q + j * hd, mx, mn, hd);
                for (int t = 0; t < nt; t++) {
                    double dot = 0;
                    for (int d = 0; d < hd; d++)
                        dot += (double)q[j * hd + d] * key_at(&b.kv, l, h, blk * bs + t, d);
                    assert_true(bound >= dot - 1e-5);
                }
                ub[blk] += bound / g;
            }
        }
        /* plan: sink block 0, local from 8*floor((203-8)/8) = 192: blocks 24, 25 (11 tokens);
         * forced 8 + 11 = 19, k = (64 - 19) / 8 = 5 among blocks 1..23; the 5 tokens left go
         * to the top of the highest block below the window not chosen */
        bool eligible[32] = {0}, chosen[32];
        for (int blk = 1; blk < 24; blk++)
            eligible[blk] = true;
        brute_topk(ub, nb, 5, eligible, chosen);
        int fill = 23;
        while (chosen[fill])
            fill--;
        assert_int_equal(b.sel.n, 1 + 5 + 1 + 2);
        int n_read = 0;
        for (int blk = 0; blk < nb; blk++) {
            bool want = blk == 0 || blk >= 24 || chosen[blk] || blk == fill;
            bool got = false;
            for (int i = 0; i < b.sel.n; i++) {
                got = got || b.sel.blocks[i] == blk;
                if (b.sel.blocks[i] == blk) {
                    n_read += __builtin_popcountll(b.sel.mask[i]);
                    if (blk == fill)
                        assert_int_equal(b.sel.mask[i], 0xf8); /* tokens 3..7 */
                }
            }
            if (want != got)
                print_message("block %d: want %d got %d (ub %.4f)\n", blk, want, got, ub[blk]);
            assert_true(want == got);
        }
        assert_int_equal(n_read, 64); /* the whole budget */
    }
    bench_free(&b);
}

/* ---- SnapKV ---- */

static void test_snapkv_scores_and_keep_set(void **state)
{
    (void)state;
    const int n = 90, w = 8, g = 2, n_head = 4, n_kv = 2, bs = 16;
    float *obs = malloc((size_t)n_head * w * n * sizeof(float));
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < w; i++) {
            float *row = obs + ((size_t)h * w + i) * n;
            int pos = n - w + i;
            double sum = 0;
            for (int t = 0; t < n; t++) {
                row[t] = t <= pos ? (float)(urand() * urand()) : 0.0f;
                if (t % 11 == 3 && t <= pos)
                    row[t] += 0.5f; /* a few heavy hitters */
                sum += row[t];
            }
            for (int t = 0; t <= pos; t++)
                row[t] = (float)(row[t] / sum);
        }
    struct kvp_prefill_obs ob = {.n_prompt = n, .n_obs = w, .obs = obs};
    for (int pool_max = 0; pool_max < 2; pool_max++)
        for (int pool = 1; pool <= 7; pool += 2) {
            struct bench b;
            bench_init(&b, "snapkv", 1, n_head, n_kv, 8, bs, 128, 40, 4, 4);
            b.p.p.pool = pool;
            b.p.p.pool_max = pool_max;
            fill_keys(&b, n);
            float *got = malloc((size_t)n * sizeof(float));
            float *tmp = malloc((size_t)(g + 1) * n * sizeof(float));
            for (int kvh = 0; kvh < n_kv; kvh++) {
                /* brute force: mean over the group of the window sums, then the pool */
                double s[128], pooled[128];
                for (int t = 0; t < n - w; t++) {
                    s[t] = 0;
                    for (int j = 0; j < g; j++)
                        for (int i = 0; i < w; i++)
                            s[t] += obs[((size_t)(kvh * g + j) * w + i) * n + t] / (double)g;
                }
                for (int t = 0; t < n - w; t++) {
                    double acc = pool_max ? -1e30 : 0;
                    for (int u = t - pool / 2; u <= t + pool / 2; u++) {
                        if (u < 0 || u >= n - w)
                            continue;
                        acc = pool_max ? fmax(acc, s[u]) : acc + s[u];
                    }
                    pooled[t] = pool_max ? acc : acc / pool;
                }
                kvp_snap_scores(&ob, kvh * g, g, KVP_AGG_MEAN, pool, pool_max, got, tmp);
                for (int t = 0; t < n - w; t++)
                    assert_true(fabs(got[t] - pooled[t]) < 1e-5);
                /* keep set: sink 4 + window 8 + top 28 of [4, 82) */
                bool elig[128] = {0}, chosen[128];
                for (int t = 4; t < n - w; t++)
                    elig[t] = true;
                brute_topk(pooled, n - w, 40 - 4 - 8, elig, chosen);
                b.p.ops->on_prefill(&b.p, 0, &ob);
                for (int t = 0; t < n; t++) {
                    bool keep = t < 4 || t >= n - w || chosen[t];
                    assert_true(keep == pos_alive(&b.kv, 0, kvh, n, t));
                }
                /* compacted: the 40 kept tokens fill three blocks, the others went back */
                assert_int_equal(b.kv.released[kvh], 3);
                assert_int_equal(kvp_kvcache_kept(&b.kv, 0, kvh, n), 40);
            }
            /* decode tokens are appended, never evicted */
            struct kvp_err err = {0};
            assert_int_equal(kvp_kvcache_reserve(&b.kv, n + 3, &err), 0);
            for (int t = n; t < n + 3; t++) {
                b.p.ops->select(&b.p, 0, 1, NULL, t + 1, &b.sel);
                assert_int_equal(sel_count(&b.sel, &b.kv, 0, 1, t + 1), 40 + t + 1 - n);
            }
            free(got);
            free(tmp);
            bench_free(&b);
        }
    free(obs);
}

/* ---- H2O ---- */

/* Prompt of 12 tokens with made-up column sums, then 10 decode steps with made-up probability
 * rows over whatever the policy selected. A double-precision replay of the rule (sort-based, by
 * position) must agree on every eviction, with and without normalisation, and with and without
 * compaction (which moves tokens and their scores to other slots and frees blocks). */
static void test_h2o_accumulation_and_eviction(void **state)
{
    (void)state;
    const int n0 = 12, steps = 10, bs = 4, n_ctx = 32, g = 2, budget = 8, sink = 1, local = 2;
    for (int variant = 0; variant < 4; variant++) {
        int norm = variant & 1;
        struct bench b;
        bench_init(&b, "h2o", 1, 2, 1, 4, bs, n_ctx, budget, sink, local);
        b.p.p.normalize = norm;
        b.kv.compact = variant >> 1;
        fill_keys(&b, n0);
        float *colsum = calloc((size_t)2 * n_ctx, sizeof(float));
        double score[32] = {0};
        bool alive[32];
        for (int t = 0; t < n_ctx; t++)
            alive[t] = true;
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < n0; t++) {
                colsum[h * n_ctx + t] = (float)(int)(urand() * 8); /* ties on purpose */
                score[t] += colsum[h * n_ctx + t] / 2.0;
            }
        struct kvp_prefill_obs ob = {.n_prompt = n0, .colsum = colsum};
        /* replay: keep sink, last `local`, top by (normalised) score among the live rest */
        int nq;
        for (int n = n0; n <= n0 + steps; n++) {
            if (n == n0) {
                b.p.ops->on_prefill(&b.p, 0, &ob);
                nq = n0;
            } else {
                struct kvp_err err = {0};
                assert_int_equal(kvp_kvcache_reserve(&b.kv, n, &err), 0);
                float k[4] = {0}, v[4] = {0};
                kvp_kvcache_store(&b.kv, 0, 0, n - 1, k, v);
                b.p.ops->select(&b.p, 0, 0, NULL, n, &b.sel);
                nq = n - 1;
            }
            double rank[32];
            bool elig[32], chosen[32];
            for (int t = 0; t < n; t++) {
                int seen = nq - t > 1 ? nq - t : 1;
                rank[t] = norm ? score[t] / seen : score[t];
                elig[t] = alive[t] && t >= sink && t < n - local;
            }
            if (n > budget) {
                brute_topk(rank, n, budget - sink - local, elig, chosen);
                for (int t = sink; t < n - local; t++)
                    if (alive[t] && !chosen[t])
                        alive[t] = false;
            }
            for (int t = 0; t < n; t++)
                assert_true(alive[t] == pos_alive(&b.kv, 0, 0, n, t));
            assert_int_equal(kvp_kvcache_kept(&b.kv, 0, 0, n), n < budget ? n : budget);
            /* compacted, the 8 tokens sit in at most budget / bs blocks below the recent
             * window plus the two it may straddle; otherwise nothing moves */
            if (b.kv.compact)
                assert_true(b.kv.n_pool - b.kv.n_free <= budget / bs + 2);
            for (int t = 0; t < n && !b.kv.compact; t++)
                assert_int_equal(kvp_kvcache_pos(&b.kv, 0, 0, t), t);
            if (n == n0)
                continue;
            assert_int_equal(sel_count(&b.sel, &b.kv, 0, 0, n), budget);
            /* made-up attention over the selection: probs[j][i*bs + t] */
            float probs[2][32] = {{0}};
            for (int j = 0; j < g; j++)
                for (int i = 0; i < b.sel.n; i++)
                    for (int t = 0; t < bs; t++) {
                        int slot = b.sel.blocks[i] * bs + t;
                        if (slot < n && !is_evicted(&b.kv, 0, 0, slot)) {
                            int pos = kvp_kvcache_pos(&b.kv, 0, 0, slot);
                            assert_true(alive[pos]);
                            probs[j][i * bs + t] = (float)(int)(urand() * 4) / 8.0f;
                            score[pos] += probs[j][i * bs + t] / 2.0;
                        }
                    }
            b.p.ops->on_step(&b.p, 0, 0, &b.sel, &probs[0][0], 32, n);
        }
        free(colsum);
        bench_free(&b);
    }
}

/* ---- PyramidKV budgets ---- */

static void test_pyramid_budgets(void **state)
{
    (void)state;
    int caps[40];
    const char *why;
    /* the pyramid: 32 layers, 2 dense, n 4096, C 512, w 32 */
    int cases[][5] = {
        /* n, C, w, n_layer, dense */
        {4096, 512, 32, 32, 2}, {4096, 2048, 32, 32, 2}, {1000, 128, 8, 12, 2},
        {300, 96, 32, 5, 2},    {2100, 1024, 8, 7, 0},  {333, 100, 16, 9, 1},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int n = cases[c][0], C = cases[c][1], w = cases[c][2], L = cases[c][3], d = cases[c][4];
        int mode = kvp_pyramid_budgets(n, C, w, L, d, caps, &why);
        assert_int_equal(mode, KVP_PYRAMID_PYRAMID);
        assert_null(why);
        long sum = 0;
        for (int l = 0; l < L; l++) {
            if (l < d) {
                assert_int_equal(caps[l], n);
                continue;
            }
            sum += caps[l];
            assert_true(caps[l] >= w && caps[l] <= n);
            if (l > d)
                assert_true(caps[l] <= caps[l - 1]);
        }
        print_message("pyramid n=%d C=%d: layer %d keeps %d, last %d, mean %.3f\n", n, C, d,
                      caps[d], caps[L - 1], (double)sum / (L - d));
        assert_int_equal(sum, (long)C * (L - d)); /* averages to exactly the budget */
        assert_true(caps[d] > caps[L - 1]);
    }
    /* upstream's numbers before the trim: C 2048, w 32, 32 layers all compressed, n 8192:
     * min 100, max 3932, steps 123 -> layer 0 keeps 3932 + 32 (trim: 31 * 32 / 2 excess... ) */
    kvp_pyramid_budgets(8192, 2048, 32, 32, 0, caps, NULL);
    assert_true(caps[0] >= 3932 + 32 - 16 && caps[0] <= 3932 + 32);
    /* fallbacks, reported */
    assert_int_equal(kvp_pyramid_budgets(500, 512, 32, 8, 2, caps, &why), KVP_PYRAMID_NONE);
    assert_non_null(why);
    assert_int_equal(caps[5], 500);
    assert_int_equal(kvp_pyramid_budgets(900, 512, 32, 8, 2, caps, &why), KVP_PYRAMID_FLAT);
    assert_non_null(strstr(why, "2 x"));
    for (int l = 2; l < 8; l++)
        assert_int_equal(caps[l], 512);
    assert_int_equal(kvp_pyramid_budgets(4096, 512, 32, 3, 2, caps, &why), KVP_PYRAMID_FLAT);
    assert_non_null(why);
    assert_int_equal(kvp_pyramid_budgets(4096, 32, 32, 8, 2, caps, &why), KVP_PYRAMID_FLAT);
    assert_non_null(why);
}

/* ---- random ---- */

static void test_random_is_seeded(void **state)
{
    (void)state;
    const int n = 250, bs = 16;
    int32_t first[64];
    int n_first = 0, differs = 0;
    for (int run = 0; run < 3; run++) {
        struct bench b;
        bench_init(&b, "random", 2, 2, 2, 8, bs, 256, 96, 16, 16);
        b.p.p.seed = run == 2 ? 99 : 7;
        b.p.ops->reset(&b.p);
        fill_keys(&b, n);
        b.p.ops->select(&b.p, 1, 1, NULL, n, &b.sel);
        assert_true(sel_count(&b.sel, &b.kv, 1, 1, n) <= 96);
        if (run == 0) {
            n_first = b.sel.n;
            memcpy(first, b.sel.blocks, sizeof(int32_t) * (size_t)b.sel.n);
        } else {
            bool same = b.sel.n == n_first &&
                        !memcmp(first, b.sel.blocks, sizeof(int32_t) * (size_t)b.sel.n);
            if (run == 1)
                assert_true(same); /* same seed, same blocks */
            else
                differs += !same;
        }
        bench_free(&b);
    }
    assert_int_equal(differs, 1);
}

/* The option tables: one parser for every policy's keys, defaults from the table, params options
 * stored in the public fields (0 given as -1 where the API reads 0 as the default), included
 * tables (catekv takes the predictor's keys), and refusals naming the item and the known keys. */
static void test_option_tables(void **state)
{
    (void)state;
    struct kvp_err err = {0};
    const struct kvp_policy_ops *catekv = kvp_policy_find("catekv");
    const struct kvp_policy_ops *quest = kvp_policy_find("quest");
    assert_non_null(catekv);
    assert_non_null(quest);
    assert_true(catekv->opts_size > 0 && quest->opts_size >= 2 * sizeof(int));
    struct kvp_policy_params pp = {0};
    char block[256];
    assert_true(catekv->opts_size <= sizeof(block));
    kvp_policy_opts_defaults(catekv->opts, block);
    assert_int_equal(kvp_policy_opts_parse(catekv->opts, "catekv",
                                           "adaptive=quest,eta=0.5,tail=0,every=3,gqa=union", &pp,
                                           block, &err),
                     0);
    assert_int_equal(pp.adaptive_mode, KVP_ADAPTIVE_QUEST);
    assert_true(pp.eta == 0.5f);
    assert_int_equal(pp.tail_tokens, -1);
    const int *pred = (const int *)block; /* struct kvp_predsel_opts: every, calib, gqa_union */
    assert_int_equal(pred[0], 3);
    assert_int_equal(pred[1], 5); /* calib: the table's default */
    assert_int_equal(pred[2], 1);
    assert_int_equal(kvp_policy_opts_parse(catekv->opts, "catekv", "eta=2", &pp, block, &err),
                     KVP_EINVAL);
    assert_non_null(strstr(err.msg, "eta=2"));
    assert_int_equal(kvp_policy_opts_parse(quest->opts, "quest", "margin=3,share=0", &pp, block,
                                           &err),
                     0);
    assert_int_equal(((const int *)block)[0], 3);
    assert_int_equal(kvp_policy_opts_parse(quest->opts, "quest", "every=2", &pp, block, &err),
                     KVP_EINVAL);
    assert_non_null(strstr(err.msg, "margin=0..1048576"));
    assert_int_equal(kvp_policy_opts_parse(quest->opts, "quest", "margin", &pp, block, &err),
                     KVP_EINVAL);
    const struct kvp_policy_opt *o = kvp_policy_opt_by_flag(catekv->opts, "--adaptive-ratio");
    assert_non_null(o);
    assert_int_equal(kvp_policy_opt_set(o, "0", &pp, NULL, &err), 0);
    assert_true(pp.adaptive_ratio == -1.0f);
    assert_int_equal(kvp_policy_opt_set(o, "x", &pp, NULL, &err), KVP_EINVAL);
    assert_null(kvp_policy_opt_by_flag(quest->opts, "--adaptive"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_ties_to_lower_index),
        cmocka_unit_test(test_topk_shapes),
        cmocka_unit_test(test_block_budget_semantics),
        cmocka_unit_test(test_token_budget_semantics),
        cmocka_unit_test(test_mask_add_range),
        cmocka_unit_test(test_sel_chosen_against_tokens),
        cmocka_unit_test(test_gqa_combine_bits),
        cmocka_unit_test(test_quest_bound_and_selection),
        cmocka_unit_test(test_snapkv_scores_and_keep_set),
        cmocka_unit_test(test_h2o_accumulation_and_eviction),
        cmocka_unit_test(test_pyramid_budgets),
        cmocka_unit_test(test_random_is_seeded),
        cmocka_unit_test(test_option_tables),
    };
    /* f32, and q8_0: the type furthest from it (quest's metadata and every score read keys
     * back through the type's kernels) */
    const int types[] = {KVP_KV_F32, KVP_KV_Q8_0};
    int failed = 0;
    for (int i = 0; i < 2; i++) {
        unit_type = types[i];
        printf("# KV type %s\n", kvp_kv_type_name(unit_type));
        failed += cmocka_run_group_tests(tests, NULL, NULL);
    }
    return failed;
}
