/*
 * The policy framework: the sparse path reproduces the dense one when it selects everything,
 * evicting policies really free KV blocks, measuring never changes what a policy computes,
 * recovery is 1 for the full cache, and the read counts say what the selections let attention read.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpred.h"
#include "kvpred_lab.h"
#include "testutil.h"

static kvp_model *fixture_model(char **path)
{
    struct kvp_test_model_spec sp = KVP_TEST_FIXTURE_SPEC(80, 11);
    return kvp_test_model(&sp, path);
}

/* Prefill n_prompt tokens, then decode n_dec forced tokens; logits of every decode step. */
static float *run(kvp_model *m, const struct kvp_policy_params *pp, bool measure, int n_prompt,
                  int n_dec, size_t *resident, double *recovery)
{
    struct kvp_ctx_params cp = {.n_ctx = n_prompt + n_dec, .n_threads = 2};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    kvp_ctx_set_measure(c, measure);
    assert_int_equal(kvp_ctx_set_policy(c, pp, &err), 0);
    int32_t *ids = malloc((size_t)(n_prompt + n_dec) * sizeof(int32_t));
    for (int i = 0; i < n_prompt + n_dec; i++)
        ids[i] = (i * 7 + 3) % 80;
    float *lg = malloc((size_t)n_dec * 80 * sizeof(float));
    assert_int_equal(kvp_eval(c, ids, n_prompt, NULL, false, &err), 0);
    double rec = 0;
    int n_rec = 0;
    for (int i = 0; i < n_dec; i++) {
        assert_int_equal(kvp_eval(c, ids + n_prompt + i, 1, lg + (size_t)i * 80, false, &err), 0);
        for (int l = 0; l < 4; l++)
            for (int h = 0; h < 4; h++) {
                double r = kvp_ctx_recovery(c, l, h);
                if (r >= 0) {
                    rec += r;
                    n_rec++;
                }
            }
    }
    if (resident)
        kvp_ctx_kv_bytes(c, resident, NULL);
    if (recovery)
        *recovery = n_rec ? rec / n_rec : -1;
    kvp_ctx_free(c);
    free(ids);
    return lg;
}

static void test_full_and_large_budgets_match_dense(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture_model(&path);
    float *dense = run(m, NULL, false, 100, 30, NULL, NULL);
    struct kvp_policy_params full = {.name = "full"};
    double rec;
    float *f = run(m, &full, true, 100, 30, NULL, &rec);
    /* Recovery is the dense probabilities' sum over the selection, here all n <= 130 keys:
     * p_t = e_t * fl(1 / fl(sum e)), so |sum p - 1| <= gamma(n + 2) (the n - 1 additions of the
     * exp-sum, the reciprocal and the product; the double sum adds nothing at this size). */
    const double u = 0x1p-24, nk = 100 + 30 + 2, rec_bound = nk * u / (1 - nk * u);
    print_message("full vs dense: %.3g, recovery %.9f (bound 1 +- %.3g)\n",
                  kvp_test_max_diff(dense, f, 30 * 80), rec, rec_bound);
    /* A selection of every token is computed by the dense kernel (kv/attention.c,
     * sel_is_everything): the full policy has the bits of no policy, on every SIMD table and
     * BLAS kernel. Within rounding is not enough: with the f16 cache, an ulp on the attention
     * output can round the next key or value to the other f16 neighbour, which later steps
     * amplify (2e-4 here under the AVX2 table when the two took different roads). */
    assert_true(kvp_test_max_diff(dense, f, 30 * 80) == 0.0);
    assert_true(fabs(rec - 1.0) <= rec_bound);
    /* a streaming budget of all 130 tokens selects everything too: the same road */
    struct kvp_policy_params st = {.name = "streaming", .budget = 130};
    float *s = run(m, &st, false, 100, 30, NULL, NULL);
    assert_true(kvp_test_max_diff(dense, s, 30 * 80) == 0.0);
    free(dense);
    free(f);
    free(s);
    kvp_test_model_free(m, path);
}

static void test_streaming_frees_memory(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture_model(&path);
    size_t full_bytes, small_bytes, measured_bytes;
    float *d = run(m, NULL, false, 256, 32, &full_bytes, NULL);
    struct kvp_policy_params st = {.name = "streaming", .budget = 64, .sink = 16};
    float *s = run(m, &st, false, 256, 32, &small_bytes, NULL);
    double rec;
    float *sm = run(m, &st, true, 256, 32, &measured_bytes, &rec);
    print_message("resident bytes: full %zu, streaming-64 %zu (measure mode %zu), recovery %.3f\n",
                  full_bytes, small_bytes, measured_bytes, rec);
    /* 2 dense layers keep everything; 2 compressed layers keep about 64 of 288 tokens */
    assert_true(small_bytes < full_bytes * 0.75);
    assert_int_equal(small_bytes, measured_bytes);
    /* measuring computes dense attention on the side but changes nothing that is read */
    assert_true(kvp_test_max_diff(s, sm, 32 * 80) == 0.0);
    assert_true(rec > 0 && rec < 1);
    /* the budget does change the result: more than the f32 rounding of a dense step (the
     * roads differ, so the sizes of the two differences are what can be compared) */
    assert_true(kvp_test_max_diff(d, s, 32 * 80) > 1e-4);
    free(d);
    free(s);
    free(sm);
    kvp_test_model_free(m, path);
}

/* Tokens read and selections made over n_dec decode steps after a prefill of n_prompt. */
static void read_counts(kvp_model *m, const struct kvp_policy_params *pp, int n_prompt, int n_dec,
                        double *tokens, double *selects)
{
    struct kvp_ctx_params cp = {.n_ctx = n_prompt + n_dec, .n_threads = 2};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    assert_int_equal(kvp_ctx_set_policy(c, pp, &err), 0);
    int32_t ids[512];
    for (int i = 0; i < n_prompt + n_dec; i++)
        ids[i] = (i * 5 + 1) % 80;
    assert_int_equal(kvp_eval(c, ids, n_prompt, NULL, false, &err), 0);
    kvp_ctx_policy_reset_seconds(c);
    for (int i = 0; i < n_dec; i++)
        assert_int_equal(kvp_eval(c, ids + n_prompt + i, 1, NULL, false, &err), 0);
    kvp_ctx_policy_reads(c, tokens, selects);
    double t, s;
    kvp_ctx_policy_reset_seconds(c);
    kvp_ctx_policy_reads(c, &t, &s);
    assert_true(t == 0 && s == 0);
    kvp_ctx_free(c);
}

static void test_read_counts(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture_model(&path);
    const int n_prompt = 100, n_dec = 30;
    double tokens, selects;
    read_counts(m, NULL, n_prompt, n_dec, &tokens, &selects);
    assert_true(tokens == 0 && selects == 0); /* no policy, no selections */
    /* full: every key of every selecting (layer, KV head); decode step i sees n_prompt + i + 1 */
    struct kvp_policy_params full = {.name = "full"};
    read_counts(m, &full, n_prompt, n_dec, &tokens, &selects);
    double per_step = selects / n_dec, keys = 0;
    for (int i = 0; i < n_dec; i++)
        keys += n_prompt + i + 1;
    print_message("full: %.0f tokens in %.0f selections\n", tokens, selects);
    assert_true(per_step >= 1 && per_step == (int)per_step && per_step <= 4 * 2);
    assert_true(tokens == per_step * keys);
    /* streaming reads exactly its budget (sink + recent tokens) wherever it selects */
    struct kvp_policy_params st = {.name = "streaming", .budget = 64, .sink = 16};
    read_counts(m, &st, n_prompt, n_dec, &tokens, &selects);
    print_message("streaming-64: %.0f tokens in %.0f selections\n", tokens, selects);
    assert_true(selects == per_step * n_dec);
    assert_true(tokens == 64 * selects);
    kvp_test_model_free(m, path);
}

static void test_unknown_policy(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture_model(&path);
    struct kvp_ctx_params cp = {.n_ctx = 64};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    struct kvp_policy_params bad = {.name = "nonsense"};
    assert_int_equal(kvp_ctx_set_policy(c, &bad, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "streaming"));
    kvp_ctx_free(c);
    kvp_test_model_free(m, path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_and_large_budgets_match_dense),
        cmocka_unit_test(test_streaming_frees_memory),
        cmocka_unit_test(test_read_counts),
        cmocka_unit_test(test_unknown_policy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
