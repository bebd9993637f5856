/*
 * CateKV (docs/methods.md §2): the classification arithmetic on hand-made matrices whose
 * results are worked out in the comments (exact quantiles with interpolation, the (k, α) threshold,
 * chunk hits, CV, chunk scores, the observation matrix renormalised over the middle keys, the
 * global split, voting with its per-r reset), the chunk geometry and its edge cases, the policy end
 * to end on a random fixture model (r = 1 reproduces full attention, resident bytes match the
 * consistent/adaptive formula exactly, static profiles drive the classes), head-profile files
 * (round trip, hostile inputs) and the PNG drawing. A slow sort-based quantile is the oracle of the
 * quickselect.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward/context.h"
#include "kvpred.h"
#include "kvpred_lab.h"
#include "policy/catekv_classify.h"
#include "forward/catekv_ctx.h"
#include "policy/catekv_profile.h"
#include "predictor/cnn.h"
#include "testutil.h"

#define NEAR(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

/* ---- quantiles and thresholds ------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The obvious version: sort, then interpolate. */
static double quantile_oracle(const double *x, size_t n, double p)
{
    double *s = malloc(n * sizeof(double));
    memcpy(s, x, n * sizeof(double));
    qsort(s, n, sizeof(double), cmp_double);
    double pos = p * (double)(n - 1);
    size_t k = (size_t)floor(pos);
    double v = k + 1 < n ? s[k] + (s[k + 1] - s[k]) * (pos - (double)k) : s[k];
    free(s);
    return v;
}

static void test_quantile_by_hand(void **state)
{
    (void)state;
    double x[5];
    const double src[5] = {5, 1, 3, 2, 4}; /* sorted: 1 2 3 4 5 */
    /* p = 0.9: position 3.6 -> 4 + 0.6·(5 − 4) = 4.6; p = 0.25: position 1 -> 2 exactly */
    const double p[6] = {0.0, 0.25, 0.5, 0.9, 1.0, 0.1};
    const double want[6] = {1.0, 2.0, 3.0, 4.6, 5.0, 1.4};
    for (int i = 0; i < 6; i++) {
        memcpy(x, src, sizeof(x));
        NEAR(kvp_catekv_quantile_d(x, 5, p[i]), want[i], 1e-12);
    }
    /* ties: 0 0 0 1, p = 0.9 -> position 2.7 -> 0 + 0.7·1 */
    float t[4] = {1, 0, 0, 0};
    /* exact: position 0.9·3 = 2.7 splits into k = 2 and frac = 0.9·3 - 2 in double, and the
     * interpolation 0 + (1 - 0)·frac is frac itself (was 1e-7 against 0.7) */
    NEAR(kvp_catekv_quantile_f(t, 4, 0.9), 0.9 * 3.0 - 2.0, 0);
    float one[1] = {3};
    NEAR(kvp_catekv_quantile_f(one, 1, 0.7), 3.0, 0);
    /* random arrays with many duplicates against the sorting oracle */
    unsigned seed = 12345;
    for (int trial = 0; trial < 200; trial++) {
        size_t n = 1 + (size_t)(trial * 37 % 301);
        double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            a[i] = (double)((seed >> 16) % (trial % 3 ? 1000 : 4)); /* some arrays mostly ties */
        }
        double q = (double)(trial % 11) / 10.0;
        memcpy(b, a, n * sizeof(double));
        NEAR(kvp_catekv_quantile_d(b, n, q), quantile_oracle(a, n, q), 1e-9);
        free(a);
        free(b);
    }
}

static void test_threshold_k_alpha(void **state)
{
    (void)state;
    float a[10];
    /* entries 0.0 .. 0.9: q(0.9) at position 8.1 = 0.81, q(0.1) at 0.9 = 0.09 */
    for (int i = 0; i < 10; i++)
        a[i] = (float)i / 10.0f;
    /* exact: the quantiles of the sorted f32 entries s[i] = i/10 interpolated as the code
     * defines them (pos = p·(n-1), lo + (s[k+1] - lo)·frac in double), and the threshold
     * vmin + (vmax - vmin)·α, are the same double operations on the same inputs (were 1e-6
     * against the decimal values 0.81, 0.45, 0.09) */
    double qs[2];
    for (int j = 0; j < 2; j++) {
        double pos = (j ? 0.9 : 1.0 - 0.9) * 9.0, frac = pos - floor(pos);
        int k = (int)floor(pos);
        double lo = (double)((float)k / 10.0f), nx = (double)((float)(k + 1) / 10.0f);
        qs[j] = frac == 0.0 ? lo : lo + (nx - lo) * frac;
    }
    /* and they are the decimal quantiles up to the f32 rounding of the entries (a convex
     * combination of two entries, each within u·|x| <= u of its decimal value) plus a few
     * double roundings */
    assert_true(fabs(qs[1] - 0.81) <= 0x1p-24 + 1e-15 && fabs(qs[0] - 0.09) <= 0x1p-24 + 1e-15);
    NEAR(kvp_catekv_threshold(a, 10, 0.9, 1.0), qs[0] + (qs[1] - qs[0]) * 1.0, 0);
    for (int i = 0; i < 10; i++)
        a[9 - i] = (float)i / 10.0f; /* order does not matter */
    /* α = 0.5: 0.09 + (0.81 − 0.09)·0.5 = 0.45 */
    NEAR(kvp_catekv_threshold(a, 10, 0.9, 0.5), qs[0] + (qs[1] - qs[0]) * 0.5, 0);
    /* α = 0: the lower quantile */
    NEAR(kvp_catekv_threshold(a, 10, 0.9, 0.0), qs[0] + (qs[1] - qs[0]) * 0.0, 0);
    /* all zeros: the 1e-9 floor */
    float z[4] = {0};
    NEAR(kvp_catekv_threshold(z, 4, 0.995, 1.0), 1e-9, 0);
}

/* ---- hits, CV, scores, observation matrix -------------------------------------------------- */

/* w = 3 rows, chunk 2, 4 chunks; τ = 0.5 (strict). */
static const float hand_A[3][8] = {
    {0.9f, 0.0f, 0.0f, 0.0f, 0.6f, 0.7f, 0.0f, 0.0f},  /* hits chunks 0, 2 */
    {0.0f, 0.8f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},  /* chunk 0 */
    {0.0f, 0.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.55f}, /* 0.5 is not > 0.5: chunk 3 only */
};

static void test_hits_and_cv(void **state)
{
    (void)state;
    int counts[4];
    /* counts 2 0 1 1: mean 1, unbiased variance (1 + 1 + 0 + 0)/3, CV = sqrt(2/3) */
    double cv = kvp_catekv_cv(&hand_A[0][0], 3, 4, 2, 0.5, counts);
    assert_int_equal(counts[0], 2);
    assert_int_equal(counts[1], 0);
    assert_int_equal(counts[2], 1);
    assert_int_equal(counts[3], 1);
    NEAR(cv, sqrt(2.0 / 3.0), 1e-12);
    /* no hits at all: mean 0 -> floor 1e-10, std 0 -> CV 0 */
    NEAR(kvp_catekv_cv(&hand_A[0][0], 3, 4, 2, 0.95, counts), 0.0, 0);
    /* one chunk: CV is defined as 0 */
    NEAR(kvp_catekv_cv(&hand_A[0][0], 3, 1, 8, 0.5, NULL), 0.0, 0);
    /* every chunk hit by every row: std 0 -> CV 0 */
    float flat[2][4] = {{1, 0, 0, 1}, {0, 1, 1, 0}};
    NEAR(kvp_catekv_cv(&flat[0][0], 2, 2, 2, 0.5, NULL), 0.0, 0);
    /* head CV with k, α: 24 entries, q(0.9) at position 20.7 of the sorted entries
     * (18 zeros, then 0.5 0.55 0.6 0.7 0.8 0.9): 0.6 + 0.7·0.1 = 0.67 -> hits only 0.7, 0.8,
     * 0.9: counts 2 0 1 0, mean 0.75, var (1.5625 + 0.5625 + 0.0625 + 0.5625)/3 */
    float scratch[24];
    double want = sqrt((1.5625 + 0.5625 + 0.0625 + 0.5625) / 3.0) / 0.75;
    NEAR(kvp_catekv_head_cv(&hand_A[0][0], 3, 4, 2, 0.9, 1.0, scratch), want, 1e-9);
}

static void test_chunk_scores_and_selection(void **state)
{
    (void)state;
    float score[4];
    /* chunk maxima per row: (0.9 0 0.7 0), (0.8 0 0 0), (0 0.5 0 0.55) */
    kvp_catekv_chunk_scores(&hand_A[0][0], 3, 4, 2, score);
    /* exact: a score is the double sum over rows of the f32 chunk maxima, rounded once to f32,
     * so it is that expression of the same inputs (was 1e-6 against the decimal values, which
     * f32 only approximates) */
    NEAR(score[0], (float)((double)0.9f + 0.8f + 0.0f), 0);
    NEAR(score[1], 0.5f, 0);
    NEAR(score[2], 0.7f, 0);
    NEAR(score[3], 0.55f, 0);
    int idx[5], tmp[5]; /* scratch: n ints */
    kvp_topk_indices(score, 4, 2, idx, tmp);
    assert_int_equal(idx[0], 0);
    assert_int_equal(idx[1], 2);
    /* ties go to the lower index */
    float tie[5] = {0.3f, 0.5f, 0.5f, 0.1f, 0.5f};
    kvp_topk_indices(tie, 5, 2, idx, tmp);
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 2);
}

static void test_obs_matrix_renormalised(void **state)
{
    (void)state;
    /* n = 8, c = 2, S = 2, R = 0, tail 2: chunks 3, chunk_end 6, middle [2, 6) */
    struct kvp_catekv_geom g;
    assert_int_equal(kvp_catekv_geometry(8, 2, 2, 0, 2, 4, &g, NULL), 0);
    assert_int_equal(g.mid_begin, 2);
    assert_int_equal(g.mid_end, 6);
    /* two query heads of one KV head, one window row each */
    const float rows[2][8] = {
        {0.1f, 0.1f, 0.2f, 0.2f, 0.1f, 0.1f, 0.1f, 0.1f}, /* middle mass 0.6: 1/3 1/3 1/6 1/6 */
        {0.0f, 0.0f, 0.4f, 0.0f, 0.0f, 0.4f, 0.1f, 0.1f}, /* middle mass 0.8: 1/2 0 0 1/2 */
    };
    struct kvp_prefill_obs obs = {.n_prompt = 8, .n_obs = 1, .obs = &rows[0][0]};
    float A[4];
    kvp_catekv_obs_matrix(&obs, 0, 2, &g, A);
    /* f32 sums and one division over at most 8 terms in [0, 1]: gamma(9) * 1 = 5.4e-7 < 1e-6
     * (the decimal row values are themselves f32 roundings, 2^-24 relative, inside that) */
    NEAR(A[0], 5.0 / 12.0, 1e-6);
    NEAR(A[1], 1.0 / 6.0, 1e-6);
    NEAR(A[2], 1.0 / 12.0, 1e-6);
    NEAR(A[3], 1.0 / 3.0, 1e-6);
}

/* ---- split and voting --------------------------------------------------------------------- */

static void test_split(void **state)
{
    (void)state;
    /* sorted 0.1 0.2 0.3 0.5 0.9; r = 0.4 -> position 1.6 -> thr 0.26 -> heads 1 and 3 */
    const double cv[5] = {0.5, 0.1, 0.3, 0.2, 0.9};
    uint8_t ad[5];
    double scratch[5];
    assert_int_equal(kvp_catekv_split(cv, 5, 0.4, ad, scratch), 2);
    assert_int_equal(ad[1] + ad[3], 2);
    assert_int_equal(kvp_catekv_split(cv, 5, 1.0, ad, scratch), 5);
    assert_int_equal(kvp_catekv_split(cv, 5, 0.0, ad, scratch), 0);
}

static void test_vote_resets_per_ratio(void **state)
{
    (void)state;
    const double cvs[3][4] = {
        {0.1, 0.2, 0.3, 0.4},
        {0.2, 0.1, 0.4, 0.3},
        {0.1, 0.4, 0.2, 0.3},
    };
    int votes[4];
    uint8_t ad[4];
    /* r = 0.25: per-sample threshold at position 0.75 = 0.175 -> votes 2 1 0 0; num_top 1,
     * threshold 2 -> head 0 */
    assert_int_equal(kvp_catekv_vote(&cvs[0][0], 3, 4, 0.25, votes, ad, NULL), 1);
    assert_int_equal(votes[0], 2);
    assert_int_equal(votes[1], 1);
    assert_int_equal(ad[0], 1);
    /* r = 0.75 on the same buffer: threshold 0.325 -> votes 3 2 2 2 (not 5 3 2 2); num_top 3,
     * threshold 2 -> all four heads (ties push above r, as upstream) */
    assert_int_equal(kvp_catekv_vote(&cvs[0][0], 3, 4, 0.75, votes, ad, NULL), 4);
    assert_int_equal(votes[0], 3);
    assert_int_equal(votes[1], 2);
    assert_int_equal(votes[2], 2);
    assert_int_equal(votes[3], 2);
    /* r = 0.5 after both: threshold 0.25 -> votes 3 2 1 0, num_top 2 -> heads 0 and 1 */
    assert_int_equal(kvp_catekv_vote(&cvs[0][0], 3, 4, 0.5, votes, ad, NULL), 2);
    assert_int_equal(votes[0] * 1000 + votes[1] * 100 + votes[2] * 10 + votes[3], 3210);
    assert_int_equal(ad[0] + ad[1], 2);
    /* r = 0: nobody; bad input */
    assert_int_equal(kvp_catekv_vote(&cvs[0][0], 3, 4, 0.0, votes, ad, NULL), 0);
    struct kvp_err err = {0};
    assert_int_equal(kvp_catekv_vote(&cvs[0][0], 3, 4, 1.5, votes, ad, &err), KVP_EINVAL);
    /* the profile builder: mean CVs and the same mask */
    struct kvp_head_profile *hp;
    assert_int_equal(kvp_head_profile_vote(&cvs[0][0], 3, 2, 2, 0.5, &hp, NULL), 0);
    NEAR(hp->cv[0], 0.4 / 3, 1e-12);
    assert_int_equal(hp->adaptive[0] + hp->adaptive[1], 2);
    assert_int_equal(hp->n_samples, 3);
    kvp_head_profile_free(hp);
}

/* ---- geometry ----------------------------------------------------------------------------- */

static void test_geometry(void **state)
{
    (void)state;
    struct kvp_catekv_geom g;
    struct kvp_err err = {0};
    /* docs/methods.md §2.2's example: n = 131072 with the defaults */
    assert_int_equal(kvp_catekv_geometry(131072, 8, 64, 256, 32, 2048, &g, &err), 0);
    assert_int_equal(g.chunks, 16380);
    assert_int_equal(g.chunk_end, 131040);
    assert_int_equal(g.mid_end - g.mid_begin, 130720);
    assert_int_equal(g.middle_chunks, 16340);
    assert_int_equal(g.select_sets, 216);
    assert_int_equal(131072 - (g.chunk_end - g.recent), 288); /* |T| */
    assert_false(g.keep_all);
    /* n = 131075 (rem 3): tail grows by the remainder */
    assert_int_equal(kvp_catekv_geometry(131075, 8, 64, 256, 32, 2048, &g, &err), 0);
    assert_int_equal(131075 - (g.chunk_end - g.recent), 291);
    /* the scaled-down setting of the stories260K runs */
    assert_int_equal(kvp_catekv_geometry(256, 8, 8, 8, 8, 32, &g, &err), 0);
    assert_int_equal(g.chunk_end, 248);
    assert_int_equal(g.middle_chunks, 29);
    assert_int_equal(g.select_sets, 2);
    /* rule violations are errors */
    assert_int_equal(kvp_catekv_geometry(256, 8, 60, 8, 8, 76, &g, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "multiples"));
    assert_int_equal(kvp_catekv_geometry(256, 8, 8, 8, 12, 32, &g, &err), KVP_EINVAL);
    assert_int_equal(kvp_catekv_geometry(256, 8, 8, 8, 8, 33, &g, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "budget"));
    assert_int_equal(kvp_catekv_geometry(256, 8, 16, 16, 8, 24, &g, &err), KVP_EINVAL);
    assert_int_equal(kvp_catekv_geometry(256, 0, 0, 0, 0, 0, &g, &err), KVP_EINVAL);
    /* a tiny prompt with the paper's S = 64, R = 256 has no middle region: clamped, keep all */
    assert_int_equal(kvp_catekv_geometry(256, 8, 64, 256, 32, 2048, &g, &err), 0);
    assert_true(g.keep_all);
    assert_int_equal(g.middle_chunks, 0);
    /* B >= n and select_sets >= middle_chunks: keep all */
    assert_int_equal(kvp_catekv_geometry(256, 8, 8, 8, 8, 256, &g, &err), 0);
    assert_true(g.keep_all);
    assert_int_equal(kvp_catekv_geometry(100, 8, 8, 8, 8, 96, &g, &err), 0);
    assert_true(g.keep_all); /* 9 middle chunks, select_sets 10 */
    assert_int_equal(kvp_catekv_geometry(4, 8, 0, 0, 8, 0, &g, &err), 0);
    assert_true(g.keep_all);
}

/* ---- the policy end to end ---------------------------------------------------------------- */

#define NV  80
#define NL  4
#define NKV 2

static kvp_model *fixture_model(char **path)
{
    struct kvp_test_model_spec sp = {.n_vocab = NV,
                                     .n_embd = 64,
                                     .n_layer = NL,
                                     .n_head = 4,
                                     .n_head_kv = NKV,
                                     .n_ff = 96,
                                     .n_ctx = 512,
                                     .type = 0,
                                     .embd_type = 0,
                                     .tied = 1,
                                     .seed = 23};
    return kvp_test_model(&sp, path);
}

struct run_out {
    float *logits; /* [n_dec][NV] */
    size_t resident, kept;
    uint8_t adaptive[NL * NKV];
    int n_adaptive;
    double recovery;
};

/* Prefill n_prompt tokens then decode n_dec forced tokens with block size bs. */
static int run(kvp_model *m, const struct kvp_policy_params *pp, int bs, bool measure, int n_prompt,
               int n_dec, struct run_out *o)
{
    /* f32 KV: the memory formulas below count 4-byte elements */
    struct kvp_ctx_params cp = {.n_ctx = n_prompt + n_dec, .n_threads = 2, .block_size = bs,
                                .type_k = KVP_KV_F32, .type_v = KVP_KV_F32};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    kvp_ctx_set_measure(c, measure);
    int rc = kvp_ctx_set_policy(c, pp, &err);
    if (rc < 0) {
        kvp_ctx_free(c);
        return rc;
    }
    int32_t *ids = malloc((size_t)(n_prompt + n_dec) * sizeof(int32_t));
    unsigned s = 7;
    for (int i = 0; i < n_prompt + n_dec; i++) {
        s = s * 1103515245u + 12345u;
        ids[i] = (int32_t)((s >> 16) % NV);
    }
    o->logits = malloc((size_t)n_dec * NV * sizeof(float));
    assert_int_equal(kvp_eval(c, ids, n_prompt, NULL, false, &err), 0);
    o->n_adaptive = pp ? kvp_catekv_ctx_classes(c, o->adaptive) : -1;
    double rec = 0;
    int n_rec = 0;
    for (int i = 0; i < n_dec; i++) {
        assert_int_equal(
            kvp_eval(c, ids + n_prompt + i, 1, o->logits + (size_t)i * NV, false, &err), 0);
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < 4; h++) {
                double r = kvp_ctx_recovery(c, l, h);
                if (r >= 0) {
                    rec += r;
                    n_rec++;
                }
            }
    }
    o->recovery = n_rec ? rec / n_rec : -1;
    kvp_ctx_kv_bytes(c, &o->resident, &o->kept);
    kvp_ctx_free(c);
    free(ids);
    return 0;
}

/* The scaled-down setting: c 8, S 8, R 8, tail 8, B 64 (select_sets 6 of 29 middle chunks). */
static struct kvp_policy_params small_params(float r, int mode)
{
    return (struct kvp_policy_params){.name = "catekv",
                                      .budget = 64,
                                      .sink = 8,
                                      .local = 8,
                                      .chunk = 8,
                                      .tail_tokens = 8,
                                      .window = 32,
                                      .adaptive_ratio = r,
                                      .adaptive_mode = mode,
                                      .percentile = 0.98f};
}

static void test_policy_all_adaptive_is_full(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture_model(&path);
    struct run_out dense, cat, tiny_dense, tiny;
    assert_int_equal(run(m, NULL, 16, false, 256, 24, &dense), 0);
    struct kvp_policy_params pp = small_params(1.0f, KVP_ADAPTIVE_FULL);
    assert_int_equal(run(m, &pp, 16, true, 256, 24, &cat), 0);
    print_message("r = 1: max |logit diff| %.3g, recovery %.6f, %d adaptive\n",
                  kvp_test_max_diff(dense.logits, cat.logits, 24 * NV), cat.recovery,
                  cat.n_adaptive);
    /* every head adaptive with budget >= context reads every token in order, which takes the
     * dense kernel (one road, see docs/testing.md): bit-equal under every table and BLAS kernel */
    assert_true(kvp_test_max_diff(dense.logits, cat.logits, 24 * NV) == 0.0);
    assert_int_equal(cat.n_adaptive, NL * NKV);
    /* recovery: a ratio of two f32 sums of the same <= 256 probabilities in another order,
     * gamma(257) * 2 = 3.1e-5 relative at worst; measured 0 */
    NEAR(cat.recovery, 1.0, 3.1e-5);
    assert_int_equal(cat.resident, dense.resident);
    /* paper defaults on a 200-token prompt: no middle region, every head dense */
    assert_int_equal(run(m, NULL, 16, false, 200, 8, &tiny_dense), 0);
    struct kvp_policy_params paper = {.name = "catekv", .budget = 2048, .sink = 64, .local = 256};
    assert_int_equal(run(m, &paper, 16, false, 200, 8, &tiny), 0);
    assert_true(kvp_test_max_diff(tiny_dense.logits, tiny.logits, 8 * NV) == 0.0);
    free(dense.logits);
    free(cat.logits);
    free(tiny_dense.logits);
    free(tiny.logits);
    kvp_test_model_free(m, path);
}

/* Exact kept tokens with block size 8 = c: consistent B + tail + rem + gen, adaptive
 * adaptive_keep + gen. */
static size_t expected_bytes(const struct run_out *o, int adaptive_keep, int consistent_keep)
{
    size_t tokens = 0;
    for (int i = 0; i < NL * NKV; i++)
        tokens += (size_t)(o->adaptive[i] ? adaptive_keep : consistent_keep);
    return tokens * 16 * 2 * sizeof(float); /* head_dim 16, K and V */
}

static void test_policy_memory_formula(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture_model(&path);
    const int n = 256, gen = 32, B = 64, tail = 8, L = n + gen;
    struct run_out full, cons, half, frac, b16;
    assert_int_equal(run(m, NULL, 8, false, n, gen, &full), 0);
    /* r = 0: every head consistent, keeps B + tail + gen = 104 of 288 tokens */
    struct kvp_policy_params pp = small_params(-1.0f, KVP_ADAPTIVE_FULL);
    assert_int_equal(run(m, &pp, 8, false, n, gen, &cons), 0);
    assert_int_equal(cons.n_adaptive, 0);
    assert_int_equal(cons.resident, expected_bytes(&cons, L, B + tail + gen));
    assert_int_equal(cons.kept, cons.resident);
    /* r = 0.5, dynamic: the formula with the measured split */
    pp = small_params(0.5f, KVP_ADAPTIVE_FULL);
    assert_int_equal(run(m, &pp, 8, false, n, gen, &half), 0);
    size_t want = expected_bytes(&half, L, B + tail + gen);
    double r = (double)half.n_adaptive / (NL * NKV);
    double factor = 1.0 / (r + (1 - r) * (double)(B + tail + gen) / L);
    print_message("resident KV bytes: full %zu, r=0 %zu, r=0.5 (%d adaptive) measured %zu, "
                  "formula %zu; compression %.3f (1/(r + (1-r)(B+32'+gen)/L) = %.3f)\n",
                  full.resident, cons.resident, half.n_adaptive, half.resident, want,
                  (double)full.resident / half.resident, factor);
    assert_int_equal(half.resident, want);
    NEAR((double)full.resident / half.resident, factor, 1e-9);
    assert_true(half.n_adaptive >= 3 && half.n_adaptive <= 4); /* ⌈0.5·7⌉ of 8 heads */
    /* fraction mode, η = 0.5: adaptive heads keep S + 14 chunks + [240, 256) + gen = 168 */
    pp = small_params(0.5f, KVP_ADAPTIVE_FRACTION);
    assert_int_equal(run(m, &pp, 8, false, n, gen, &frac), 0);
    assert_int_equal(frac.resident, expected_bytes(&frac, 8 + 14 * 8 + 16 + gen, B + tail + gen));
    /* block size 16: blocks are freed only when both chunks go, resident >= kept */
    pp = small_params(0.5f, KVP_ADAPTIVE_FULL);
    assert_int_equal(run(m, &pp, 16, false, n, gen, &b16), 0);
    print_message("block 16: resident %zu, kept %zu (block 8: %zu)\n", b16.resident, b16.kept,
                  half.resident);
    assert_true(b16.resident >= b16.kept && b16.kept == half.kept);
    assert_true(b16.resident < full.resident);
    free(full.logits);
    free(cons.logits);
    free(half.logits);
    free(frac.logits);
    free(b16.logits);
    kvp_test_model_free(m, path);
}

static void test_policy_quest(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture_model(&path);
    struct run_out full, q, qm;
    assert_int_equal(run(m, NULL, 16, false, 256, 16, &full), 0);
    /* all heads adaptive with Quest: reads B/c = 8 chunks + the tail per step, stores all */
    struct kvp_policy_params pp = small_params(1.0f, KVP_ADAPTIVE_QUEST);
    assert_int_equal(run(m, &pp, 16, false, 256, 16, &q), 0);
    assert_int_equal(run(m, &pp, 16, true, 256, 16, &qm), 0);
    print_message("quest: recovery %.4f, logit diff to full %.3g\n", qm.recovery,
                  kvp_test_max_diff(full.logits, q.logits, 16 * NV));
    assert_int_equal(q.resident, full.resident);
    assert_true(qm.recovery > 0.2 && qm.recovery < 1.0);
    assert_true(kvp_test_max_diff(q.logits, qm.logits, 16 * NV) ==
                0.0); /* measuring changes nothing */
    assert_true(kvp_test_max_diff(full.logits, q.logits, 16 * NV) > 1e-6);
    for (size_t i = 0; i < 16 * NV; i++)
        assert_true(isfinite(q.logits[i]));
    struct run_out unused;
    /* bad parameters are reported at set_policy */
    pp = small_params(0.5f, KVP_ADAPTIVE_FULL);
    pp.budget = 65;
    assert_int_equal(run(m, &pp, 16, false, 256, 4, &unused), KVP_EINVAL);
    pp = small_params(0.5f, KVP_ADAPTIVE_FULL);
    pp.percentile = 1.5f;
    assert_int_equal(run(m, &pp, 16, false, 256, 4, &unused), KVP_EINVAL);
    free(full.logits);
    free(q.logits);
    free(qm.logits);
    kvp_test_model_free(m, path);
}

/* A random-weight predictor file (H 16, conv 16/32 channels, kernel 3) for blocks of bs tokens. */
static char *write_predictor(int bs)
{
    struct kvp_cnn n;
    assert_int_equal(kvp_cnn_init(&n, 16, 32, 3, 16, bs, NULL), 0);
    unsigned x = 99;
    size_t np = kvp_cnn_n_params(&n);
    for (size_t i = 0; i < np; i++) {
        x = x * 1103515245u + 12345u;
        n.params[i] = 0.3f * ((float)((x >> 8) & 0xffff) / 32768.0f - 1.0f);
    }
    kvp_cnn_prepare(&n);
    n.meta.loss = KVP_LOSS_CE;
    char *path = kvp_test_tmpfile(".kvpp");
    assert_int_equal(kvp_cnn_save(&n, path, NULL), 0);
    kvp_cnn_free(&n);
    return path;
}

/* Per decode step and (layer, KV head): which prompt tokens the selection reads (bitmap of
 * n_prompt bits) and how many tokens it reads in all. */
struct sel_log {
    uint8_t *prompt; /* [n_dec][NL * NKV][n_prompt] */
    int *count;      /* [n_dec][NL * NKV] */
};

static void run_logged(kvp_model *m, const struct kvp_policy_params *pp, int bs, int n_prompt,
                       int n_dec, struct run_out *o, struct sel_log *lg)
{
    /* f32 KV: the memory formulas below count 4-byte elements */
    struct kvp_ctx_params cp = {.n_ctx = n_prompt + n_dec, .n_threads = 2, .block_size = bs,
                                .type_k = KVP_KV_F32, .type_v = KVP_KV_F32};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    if (kvp_ctx_set_policy(c, pp, &err) < 0) {
        print_message("set_policy: %s\n", err.msg);
        fail();
    }
    int32_t *ids = malloc((size_t)(n_prompt + n_dec) * sizeof(int32_t));
    unsigned r = 7;
    for (int i = 0; i < n_prompt + n_dec; i++) {
        r = r * 1103515245u + 12345u;
        ids[i] = (int32_t)((r >> 16) % NV);
    }
    o->logits = malloc((size_t)n_dec * NV * sizeof(float));
    lg->prompt = calloc((size_t)n_dec * NL * NKV * n_prompt, 1);
    lg->count = calloc((size_t)n_dec * NL * NKV, sizeof(int));
    assert_int_equal(kvp_eval(c, ids, n_prompt, NULL, false, &err), 0);
    o->n_adaptive = kvp_catekv_ctx_classes(c, o->adaptive);
    for (int i = 0; i < n_dec; i++) {
        assert_int_equal(
            kvp_eval(c, ids + n_prompt + i, 1, o->logits + (size_t)i * NV, false, &err), 0);
        int Lk = n_prompt + i + 1;
        const struct kvp_kvcache *kv = kvp_ctx_kvcache(c);
        for (int lh = 0; lh < NL * NKV; lh++) {
            const struct kvp_sel *sel = &kvp_ctx_policy_host(c)->sel[lh];
            uint8_t *bits = lg->prompt + ((size_t)i * NL * NKV + lh) * n_prompt;
            int *count = &lg->count[i * NL * NKV + lh];
            for (int b = 0; b < sel->n; b++)
                for (int t = 0; t < bs; t++) {
                    int tok = sel->blocks[b] * bs + t;
                    if (!((sel->mask[b] >> t) & 1) || tok >= Lk ||
                        ((kvp_kvcache_evicted(kv, lh / NKV, lh % NKV, sel->blocks[b]) >> t) & 1))
                        continue;
                    ++*count;
                    if (tok < n_prompt)
                        bits[tok] = 1;
                }
        }
    }
    kvp_ctx_kv_bytes(c, &o->resident, &o->kept);
    kvp_ctx_free(c);
    free(ids);
}

static void test_policy_adaptive_predictor(void **state)
{
    (void)state;
    char *path, *p16 = write_predictor(16), *p8 = write_predictor(8);
    kvp_model *m = fixture_model(&path);
    const int n = 256, gen = 24, B = 64, tail = 8;
    struct run_out dense, big, cat, pred, mix;
    struct sel_log lc, lp, lm;
    assert_int_equal(run(m, NULL, 16, false, n, gen, &dense), 0);

    /* r = 1, budget >= context: every head dense, the full logits */
    struct kvp_policy_params pp = small_params(1.0f, KVP_ADAPTIVE_PREDICTOR);
    pp.aux_path = p16;
    pp.budget = 8 + 8 + 34 * 8; /* 288 >= 280 */
    assert_int_equal(run(m, &pp, 16, false, n, gen, &big), 0);
    print_message("predictor mode, r = 1, B >= n: max |logit diff| %.3g\n",
                  kvp_test_max_diff(dense.logits, big.logits, (size_t)gen * NV));
    assert_true(kvp_test_max_diff(dense.logits, big.logits, (size_t)gen * NV) == 0.0);
    assert_int_equal(big.resident, dense.resident);

    /* r = 1, B = 64: every head adaptive, and each reads what the `predictor` policy with the
     * same budget, sink, local and no dense layers reads: identical logits */
    pp = small_params(1.0f, KVP_ADAPTIVE_PREDICTOR);
    pp.aux_path = p16;
    run_logged(m, &pp, 16, n, gen, &cat, &lc);
    assert_int_equal(cat.n_adaptive, NL * NKV);
    struct kvp_policy_params pr = {.name = "predictor",
                                   .aux_path = p16,
                                   .budget = B,
                                   .sink = 8,
                                   .local = 8,
                                   .dense_layers = -1};
    run_logged(m, &pr, 16, n, gen, &pred, &lp);
    print_message("predictor mode, r = 1, B = 64: max |logit diff| to `predictor` %.3g, "
                  "to full %.3g\n",
                  kvp_test_max_diff(pred.logits, cat.logits, (size_t)gen * NV),
                  kvp_test_max_diff(dense.logits, cat.logits, (size_t)gen * NV));
    assert_true(kvp_test_max_diff(pred.logits, cat.logits, (size_t)gen * NV) == 0.0);
    assert_true(kvp_test_max_diff(dense.logits, cat.logits, (size_t)gen * NV) > 1e-6);
    assert_memory_equal(lc.count, lp.count, (size_t)gen * NL * NKV * sizeof(int));
    for (int i = 0; i < gen * NL * NKV; i++)
        assert_true(lc.count[i] <= B);
    assert_int_equal(cat.resident, dense.resident); /* nothing evicted */

    /* r = 0.4, block 8: consistent heads read one fixed set of prompt tokens (plus the new
     * ones), adaptive heads B tokens chosen anew each step; adaptive heads stay resident */
    pp = small_params(0.4f, KVP_ADAPTIVE_PREDICTOR);
    pp.aux_path = p8;
    run_logged(m, &pp, 8, n, gen, &mix, &lm);
    assert_true(mix.n_adaptive > 0 && mix.n_adaptive < NL * NKV);
    int varying = 0;
    for (int lh = 0; lh < NL * NKV; lh++) {
        bool changed = false;
        for (int i = 1; i < gen; i++) {
            const uint8_t *a = lm.prompt + (size_t)lh * n, *b = lm.prompt + ((size_t)i * NL * NKV + lh) * n;
            changed |= memcmp(a, b, (size_t)n) != 0;
            int cnt = lm.count[i * NL * NKV + lh];
            if (mix.adaptive[lh])
                assert_true(cnt <= B);
            else
                assert_int_equal(cnt, B + tail + i + 1); /* fixed cache + every new token */
        }
        if (!mix.adaptive[lh])
            assert_false(changed);
        varying += changed;
    }
    print_message("r = 0.4: %d adaptive heads, %d of them change their selection\n",
                  mix.n_adaptive, varying);
    assert_true(varying >= 1);
    assert_int_equal(mix.resident, expected_bytes(&mix, n + gen, B + tail + gen));

    free(dense.logits);
    free(big.logits);
    free(cat.logits);
    free(pred.logits);
    free(mix.logits);
    free(lc.prompt);
    free(lc.count);
    free(lp.prompt);
    free(lp.count);
    free(lm.prompt);
    free(lm.count);
    kvp_test_model_free(m, path);
    remove(p16);
    free(p16);
    remove(p8);
    free(p8);
}

static void test_policy_adaptive_predictor_errors(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture_model(&path);
    struct kvp_ctx_params cp = {.n_ctx = 300, .n_threads = 1, .block_size = 16,
                                .type_k = KVP_KV_F32, .type_v = KVP_KV_F32};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    struct kvp_policy_params pp = small_params(0.4f, KVP_ADAPTIVE_PREDICTOR);
    assert_int_equal(kvp_ctx_set_policy(c, &pp, &err), KVP_EINVAL);
    print_message("no --aux: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "catekv"));
    assert_non_null(strstr(err.msg, "predictor file"));
    assert_non_null(strstr(err.msg, "--aux"));
    pp.aux_path = "/nonexistent/p.kvpp";
    assert_true(kvp_ctx_set_policy(c, &pp, &err) < 0);
    assert_non_null(strstr(err.msg, "/nonexistent/p.kvpp"));
    char *p8 = write_predictor(8); /* trained for another block size */
    pp.aux_path = p8;
    assert_int_equal(kvp_ctx_set_policy(c, &pp, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "blocks of 8"));
    kvp_ctx_free(c);
    remove(p8);
    free(p8);
    kvp_test_model_free(m, path);
}

static void test_policy_static_profile(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture_model(&path);
    struct kvp_head_profile *hp;
    assert_int_equal(kvp_head_profile_alloc(NL, NKV, &hp, NULL), 0);
    const uint8_t mask[NL * NKV] = {1, 0, 0, 0, 0, 1, 1, 0};
    memcpy(hp->adaptive, mask, sizeof(mask));
    hp->ratio = 0.375;
    char *prof = kvp_test_tmpfile(".profile");
    assert_int_equal(kvp_head_profile_write(hp, prof, NULL), 0);
    struct kvp_policy_params pp = small_params(0.0f, KVP_ADAPTIVE_FULL);
    pp.head_profile = prof;
    struct run_out o;
    assert_int_equal(run(m, &pp, 8, false, 256, 16, &o), 0);
    assert_memory_equal(o.adaptive, mask, sizeof(mask));
    assert_int_equal(o.resident, expected_bytes(&o, 256 + 16, 64 + 8 + 16));
    free(o.logits);
    /* a profile for another shape is one clear error */
    kvp_head_profile_free(hp);
    assert_int_equal(kvp_head_profile_alloc(5, 4, &hp, NULL), 0);
    assert_int_equal(kvp_head_profile_write(hp, prof, NULL), 0);
    struct kvp_ctx_params cp = {.n_ctx = 64};
    kvp_ctx *c;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    assert_int_equal(kvp_ctx_set_policy(c, &pp, &err), KVP_EINVAL);
    print_message("mismatch: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "5 layers x 4 KV heads"));
    pp.head_profile = "/nonexistent/catekv.profile";
    assert_int_equal(kvp_ctx_set_policy(c, &pp, &err), KVP_EIO);
    assert_non_null(strstr(err.msg, "head profile"));
    kvp_ctx_free(c);
    kvp_head_profile_free(hp);
    remove(prof);
    free(prof);
    kvp_test_model_free(m, path);
}

/* ---- profile files ------------------------------------------------------------------------ */

static void test_profile_round_trip(void **state)
{
    (void)state;
    struct kvp_head_profile *hp, *back;
    assert_int_equal(kvp_head_profile_alloc(3, 2, &hp, NULL), 0);
    const double cv[6] = {0.5, 1.25, 3.0, 0.0, 2.125, 0.75};
    const uint8_t ad[6] = {1, 0, 0, 1, 0, 1};
    memcpy(hp->cv, cv, sizeof(cv));
    memcpy(hp->adaptive, ad, sizeof(ad));
    snprintf(hp->model, sizeof(hp->model), "stories 260K");
    hp->ratio = 0.4;
    hp->n_samples = 12;
    hp->n_prompt = 256;
    hp->chunk = 8;
    hp->tail_tokens = 8;
    hp->sink = 8;
    hp->recent = 16;
    hp->window = 32;
    hp->percentile = 0.98;
    hp->alpha = 0.8;
    char *f = kvp_test_tmpfile(".profile");
    assert_int_equal(kvp_head_profile_write(hp, f, NULL), 0);
    assert_int_equal(kvp_head_profile_read(f, &back, NULL), 0);
    assert_int_equal(back->n_layer, 3);
    assert_int_equal(back->n_head_kv, 2);
    assert_string_equal(back->model, "stories 260K");
    assert_memory_equal(back->adaptive, ad, sizeof(ad));
    assert_memory_equal(back->cv, cv, sizeof(cv));
    NEAR(back->ratio, 0.4, 1e-12);
    NEAR(back->percentile, 0.98, 1e-12);
    NEAR(back->alpha, 0.8, 1e-12);
    assert_int_equal(back->n_samples + back->n_prompt + back->chunk + back->tail_tokens +
                         back->sink + back->recent + back->window,
                     12 + 256 + 8 + 8 + 8 + 16 + 32);
    /* the drawing is a PNG of a sensible size */
    char *png = kvp_test_tmpfile(".png");
    assert_int_equal(kvp_head_profile_draw(back, png, NULL), 0);
    size_t n;
    unsigned char *b = (unsigned char *)kvp_test_read_file(png, &n);
    assert_non_null(b);
    assert_true(n > 33 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8));
    unsigned w = (unsigned)b[16] << 24 | b[17] << 16 | b[18] << 8 | b[19];
    unsigned h = (unsigned)b[20] << 24 | b[21] << 16 | b[22] << 8 | b[23];
    assert_true(w >= 2 * 28 && h >= 3 * 28 && w < 2000 && h < 2000);
    free(b);
    remove(png);
    free(png);
    kvp_head_profile_free(hp);
    kvp_head_profile_free(back);
    remove(f);
    free(f);
}

static const char good_profile[] = "kvpred-head-profile 1\n"
                                   "# a comment\n"
                                   "n_layer 2\n"
                                   "n_head_kv 2\n"
                                   "ratio 0.5\n"
                                   "n_adaptive 2\n"
                                   "adaptive\n"
                                   "1 0\n"
                                   "0 1\n"
                                   "cv\n"
                                   "0.5 1.5\n"
                                   "2 0.25\n"
                                   "end\n";

static void expect_bad(const char *text, size_t len, const char *what)
{
    struct kvp_head_profile *hp = NULL;
    struct kvp_err err = {0};
    int rc = kvp_head_profile_parse(text, len, "t.profile", &hp, &err);
    if (rc != KVP_EFORMAT)
        print_message("expected a format error for %s, got %d (%s)\n", what, rc, err.msg);
    assert_int_equal(rc, KVP_EFORMAT);
    assert_null(hp);
    assert_non_null(strstr(err.msg, "t.profile"));
}

/* good_profile with the first occurrence of `from` replaced by `to`. */
static void expect_bad_edit(const char *from, const char *to)
{
    char buf[1024];
    const char *at = strstr(good_profile, from);
    assert_non_null(at);
    size_t pre = (size_t)(at - good_profile);
    snprintf(buf, sizeof(buf), "%.*s%s%s", (int)pre, good_profile, to, at + strlen(from));
    expect_bad(buf, strlen(buf), from);
}

static void test_profile_hostile(void **state)
{
    (void)state;
    struct kvp_head_profile *hp = NULL;
    assert_int_equal(kvp_head_profile_parse(good_profile, strlen(good_profile), "g", &hp, NULL), 0);
    assert_int_equal(hp->adaptive[3], 1);
    NEAR(hp->cv[2], 2.0, 0);
    kvp_head_profile_free(hp);
    expect_bad("", 0, "empty");
    expect_bad_edit("kvpred-head-profile 1", "kvpred-head-profil 1");
    expect_bad_edit("kvpred-head-profile 1", "kvpred-head-profile 2");
    expect_bad_edit("n_layer 2\n", "");
    expect_bad_edit("n_layer 2", "n_layer 0");
    expect_bad_edit("n_layer 2", "n_layer 5000");
    expect_bad_edit("n_layer 2", "n_layer two");
    expect_bad_edit("n_layer 2", "n_layer 3");
    expect_bad_edit("n_head_kv 2", "n_head_kv 2\nn_head_kv 2");
    expect_bad_edit("ratio 0.5", "ratio 1.5");
    expect_bad_edit("ratio 0.5", "ratio nan");
    expect_bad_edit("ratio 0.5", "color blue");
    expect_bad_edit("ratio 0.5", "ratio");
    expect_bad_edit("n_adaptive 2", "n_adaptive 3");
    expect_bad_edit("1 0\n", "1\n");
    expect_bad_edit("1 0\n", "1 0 1\n");
    expect_bad_edit("1 0\n", "2 0\n");
    expect_bad_edit("1 0\n", "1 0x\n");
    expect_bad_edit("0.5 1.5", "-0.5 1.5");
    expect_bad_edit("0.5 1.5", "inf 1.5");
    expect_bad_edit("cv\n", "");
    expect_bad_edit("end\n", "");
    expect_bad_edit("end\n", "end\nextra\n");
    expect_bad_edit("0 1\n", "0 1\n1 1\n");
    expect_bad("kvpred-head-profile 1\nn_layer 2\0\n", 32, "NUL");
    /* a line longer than 64 KiB */
    size_t big = 70000;
    char *long_line = malloc(big + 64);
    int off = snprintf(long_line, 64, "kvpred-head-profile 1\nmodel ");
    memset(long_line + off, 'x', big);
    expect_bad(long_line, (size_t)off + big, "long line");
    free(long_line);
    /* byte mutations of a valid file never crash and either parse or fail with EFORMAT */
    char buf[sizeof(good_profile)];
    unsigned s = 99;
    for (int i = 0; i < 2000; i++) {
        memcpy(buf, good_profile, sizeof(good_profile));
        for (int k = 0; k < 3; k++) {
            s = s * 1103515245u + 12345u;
            size_t at = (s >> 8) % (sizeof(good_profile) - 1);
            s = s * 1103515245u + 12345u;
            buf[at] = (char)(s >> 16);
        }
        s = s * 1103515245u + 12345u;
        size_t len = (s >> 8) % sizeof(good_profile);
        hp = NULL;
        int rc = kvp_head_profile_parse(buf, len, "m", &hp, NULL);
        assert_true(rc == 0 || rc == KVP_EFORMAT || rc == KVP_EINVAL);
        assert_true((rc == 0) == (hp != NULL));
        kvp_head_profile_free(hp);
    }
}

/* ---- the CLI on the shipped model (skipped without ../shared) ------------------------------ */

static void test_cli_profile_heads(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(model, "models/stories260K.gguf");
    char model_path[4096];
    snprintf(model_path, sizeof(model_path), "%s", model);
    KVP_REQUIRE_SHARED(text, "data/tinystories/tinystories_val.txt");
    const char *cli = kvp_test_cli();
    if (!cli)
        kvp_test_skip_missing("KVP_CLI not set");
    char *prof = kvp_test_tmpfile(".profile"), *png = kvp_test_tmpfile(".png");
    char cmd[16384], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "%s profile-heads -m %s -f %s --skip-frac 0.5 -r 0.4 -o %s --samples 3 --sink 8 "
             "--recent 8 --tail 8 && %s viz-heads --head-profile %s -o %s",
             cli, model_path, text, prof, cli, prof, png);
    int rc = kvp_test_run(cmd, &out, 1);
    print_message("%s", out ? out : "");
    assert_int_equal(rc, 0);
    free(out);
    struct kvp_head_profile *hp;
    assert_int_equal(kvp_head_profile_read(prof, &hp, NULL), 0);
    assert_int_equal(hp->n_layer * hp->n_head_kv, 20);
    assert_int_equal(hp->n_samples, 3);
    assert_true(kvp_head_profile_n_adaptive(hp) >= 8); /* ⌈0.4·20⌉, more when votes tie */
    kvp_head_profile_free(hp);
    /* a broken profile: one error line, exit status 1 */
    kvp_test_write_file(prof, "kvpred-head-profile 1\nn_layer 5\n", 32);
    snprintf(cmd, sizeof(cmd), "%s viz-heads --head-profile %s -o %s", cli, prof, png);
    rc = kvp_test_run(cmd, &out, 1);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "kvpred: error: head profile"));
    free(out);
    remove(prof);
    remove(png);
    free(prof);
    free(png);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantile_by_hand),
        cmocka_unit_test(test_threshold_k_alpha),
        cmocka_unit_test(test_hits_and_cv),
        cmocka_unit_test(test_chunk_scores_and_selection),
        cmocka_unit_test(test_obs_matrix_renormalised),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_vote_resets_per_ratio),
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_policy_all_adaptive_is_full),
        cmocka_unit_test(test_policy_memory_formula),
        cmocka_unit_test(test_policy_quest),
        cmocka_unit_test(test_policy_adaptive_predictor),
        cmocka_unit_test(test_policy_adaptive_predictor_errors),
        cmocka_unit_test(test_policy_static_profile),
        cmocka_unit_test(test_profile_round_trip),
        cmocka_unit_test(test_profile_hostile),
        cmocka_unit_test(test_cli_profile_heads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
