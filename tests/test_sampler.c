/* Sampling: greedy, temperature, top-k, top-p, repetition penalty and seeds. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvpred.h"
#include "testutil.h"

static kvp_sampler *make(float temp, int top_k, float top_p, float rep, uint64_t seed)
{
    struct kvp_sampler_params sp = {.temperature = temp, .top_k = top_k, .top_p = top_p,
                                    .repeat_penalty = rep, .repeat_last_n = 8, .seed = seed};
    kvp_sampler *s = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_sampler_init(&sp, 6, &s, &err), 0);
    return s;
}

static void test_greedy(void **state)
{
    (void)state;
    kvp_sampler *s = make(0, 0, 1, 1, 1);
    float lg[6] = {0.1f, 2.0f, 3.0f, 3.0f, -1.0f, 0.0f};
    assert_int_equal(kvp_sampler_sample(s, lg), 2); /* ties go to the lower id */
    kvp_sampler_free(s);
}

/* Empirical frequencies follow softmax(logits / T) within sampling error. */
static void test_temperature_distribution(void **state)
{
    (void)state;
    const float base[6] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
    const float T = 0.8f;
    kvp_sampler *s = make(T, 0, 1, 1, 1234);
    int counts[6] = {0};
    const int n = 60000;
    for (int i = 0; i < n; i++) {
        float lg[6];
        memcpy(lg, base, sizeof(lg));
        counts[kvp_sampler_sample(s, lg)]++;
    }
    double z = 0;
    for (int i = 0; i < 6; i++)
        z += exp(base[i] / T);
    for (int i = 0; i < 6; i++) {
        double p = exp(base[i] / T) / z, f = (double)counts[i] / n;
        double sd = sqrt(p * (1 - p) / n);
        assert_true(fabs(f - p) < 5 * sd + 1e-4);
    }
    kvp_sampler_free(s);
}

static void test_top_k_and_top_p(void **state)
{
    (void)state;
    const float base[6] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
    kvp_sampler *k2 = make(1.0f, 2, 1.0f, 1, 7);
    kvp_sampler *p1 = make(1.0f, 0, 0.3f, 1, 7); /* id 1 alone holds > 30% */
    for (int i = 0; i < 2000; i++) {
        float a[6], b[6];
        memcpy(a, base, sizeof(a));
        memcpy(b, base, sizeof(b));
        int t = kvp_sampler_sample(k2, a);
        assert_true(t == 1 || t == 4);
        assert_int_equal(kvp_sampler_sample(p1, b), 1);
    }
    kvp_sampler_free(k2);
    kvp_sampler_free(p1);
}

static void test_seed_reproducible(void **state)
{
    (void)state;
    const float base[6] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    kvp_sampler *a = make(1.0f, 0, 1, 1, 99), *b = make(1.0f, 0, 1, 1, 99), *c = make(1, 0, 1, 1, 98);
    int diff = 0;
    for (int i = 0; i < 200; i++) {
        float x[6], y[6], z[6];
        memcpy(x, base, sizeof(x));
        memcpy(y, base, sizeof(y));
        memcpy(z, base, sizeof(z));
        int ta = kvp_sampler_sample(a, x), tb = kvp_sampler_sample(b, y);
        assert_int_equal(ta, tb);
        diff += ta != kvp_sampler_sample(c, z);
    }
    assert_true(diff > 50);
    kvp_sampler_free(a);
    kvp_sampler_free(b);
    kvp_sampler_free(c);
}

static void test_repetition_penalty(void **state)
{
    (void)state;
    kvp_sampler *s = make(0, 0, 1, 2.0f, 1);
    float lg[6] = {0.0f, 3.0f, 2.0f, -1.0f, 0.0f, 0.0f};
    kvp_sampler_accept(s, 1);
    kvp_sampler_accept(s, 1);
    /* 3.0 / 2 = 1.5 < 2.0: the repeated token loses (penalised once, not twice) */
    assert_int_equal(kvp_sampler_sample(s, lg), 2);
    assert_true(fabsf(lg[1] - 1.5f) < 1e-6f);
    /* a negative logit is multiplied, not divided (llama.cpp's rule): a repeated token at -1.0
     * goes to -2.0, below the unrepeated -1.5, where dividing would lift it to -0.5 above it */
    float neg[6] = {-3.0f, -1.0f, -1.5f, -4.0f, -5.0f, -6.0f};
    kvp_sampler_accept(s, 1);
    assert_int_equal(kvp_sampler_sample(s, neg), 2);
    assert_true(fabsf(neg[1] - -2.0f) < 1e-6f);
    /* unrepeated logits are left as they were, positive or negative */
    assert_true(neg[0] == -3.0f && neg[2] == -1.5f && lg[2] == 2.0f && lg[3] == -1.0f);
    /* a penalty below 1 rewards instead: the same rule, the other way */
    kvp_sampler *r = make(0, 0, 1, 0.5f, 1);
    float low[6] = {-1.0f, -0.6f, 0.0f, 0.5f, -2.0f, -2.0f};
    kvp_sampler_accept(r, 1);
    kvp_sampler_accept(r, 3);
    assert_int_equal(kvp_sampler_sample(r, low), 3); /* 0.5 / 0.5 = 1.0 */
    assert_true(fabsf(low[1] - -0.3f) < 1e-6f && fabsf(low[3] - 1.0f) < 1e-6f);
    kvp_sampler_free(r);
    kvp_sampler_free(s);
}

static void test_bad_params(void **state)
{
    (void)state;
    struct kvp_sampler_params sp = {0};
    kvp_sampler *s = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_sampler_init(&sp, 0, &s, &err), KVP_EINVAL);
    assert_null(s);
    kvp_sampler_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),          cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_top_k_and_top_p), cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_repetition_penalty), cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
