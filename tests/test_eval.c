/*
 * The measuring instruments: each metric on hand-made arrays with known answers (KL, top-1,
 * log-likelihood, recovery, retention, the block and token oracles, ties included); the harness
 * on a random-weight fixture (full attention measures as perfect, a small streaming budget as
 * imperfect but within the oracle bound); and `kvpred eval --json` and `kvpred viz` end to end,
 * including the one-line errors for bad flags.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "eval/measure.h"
#include "eval/metrics.h"
#include "eval/perplexity.h"
#include "kvpred.h"
#include "policy/policy.h"
#include "testutil.h"

/* ---- metrics on hand-made arrays ---- */

static void test_kl_top1_nll(void **state)
{
    (void)state;
    float a[4] = {1.0f, -2.0f, 0.5f, 3.0f}, b[4];
    assert_true(kvp_metric_kl(a, a, 4) == 0.0);
    for (int i = 0; i < 4; i++)
        b[i] = a[i] + 7.0f; /* softmax is shift-invariant */
    /* exact: a + 7 is exact in f32 and the shifted logits minus their max equal a's minus its
     * max bit for bit, so every log-probability is the same double (was 1e-12) */
    assert_true(kvp_metric_kl(a, b, 4) == 0.0);
    /* p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3) */
    float p[2] = {0.0f, 0.0f}, q[2] = {logf(0.25f), logf(0.75f)};
    /* against the KL of the f32 logits actually passed (logf rounds ln 1/4, ln 3/4), worked out
     * in double: only double rounding of a few exp/log/sums on O(1) values is left, below
     * 32·DBL_EPSILON (was 1e-7 against 1/2 ln(4/3), which hid the logf rounding) */
    const double lse_q = log(exp((double)q[0]) + exp((double)q[1]));
    const double kl_want = 0.5 * (log(0.5) - (q[0] - lse_q)) + 0.5 * (log(0.5) - (q[1] - lse_q));
    assert_true(fabs(kvp_metric_kl(p, q, 2) - kl_want) < 32 * DBL_EPSILON);
    /* and that is 1/2 ln(4/3) up to logf's rounding: dKL = sum (softmax(q) - p)_i·dq_i with
     * |softmax(q) - p|_i = 1/4 and |dq_i| <= 1 ulp of ln 1/4 (2^-23) and of ln 3/4 (2^-25) */
    assert_true(fabs(kl_want - 0.5 * log(4.0 / 3.0)) <= 0.25 * (0x1p-23 + 0x1p-25));
    assert_true(kvp_metric_kl(q, p, 2) > 0);
    assert_int_equal(kvp_metric_argmax(a, 4), 3);
    float tie[4] = {0.0f, 2.0f, 2.0f, 1.0f};
    assert_int_equal(kvp_metric_argmax(tie, 4), 1);
    /* two equal logits: log(e^0 + e^0) - 0 = ln 2, a double exp, sum and log: 4 ulps */
    assert_true(fabs(kvp_metric_nll(p, 2, 1) - log(2.0)) <= 4 * DBL_EPSILON * log(2.0));
    /* the same: against the f32 logits in double (was 1e-7 against -ln 3/4) */
    assert_true(fabs(kvp_metric_nll(q, 2, 1) - (lse_q - q[1])) < 32 * DBL_EPSILON);
}

static void test_recovery_and_retention(void **state)
{
    (void)state;
    /* 20 keys, bs = 8: blocks 0..2 */
    float a[20] = {0};
    a[0] = 0.3f;
    a[5] = 0.2f;
    a[9] = 0.25f;
    a[17] = 0.15f;
    a[19] = 0.1f;
    uint64_t m[3] = {1ULL << 0, 1ULL << 1 /* token 9 */, (1ULL << 1) | (1ULL << 3)};
    /* exact: the double sum of the selected f32 weights in key order (was 1e-6 against the
     * decimal values, which the f32 inputs only approximate) */
    assert_true(kvp_metric_recovery(a, 20, m, 8) == (double)a[0] + a[9] + a[17] + a[19]);
    assert_int_equal(kvp_metric_set_size(m, 20, 8), 4);
    /* bits past n_keys do not count */
    uint64_t m2[3] = {0, 0, ~0ULL};
    assert_int_equal(kvp_metric_set_size(m2, 20, 8), 4);
    int scratch[40];
    /* retention is a count ratio: exact. top 4 = {0, 9, 5, 17}; S holds 0, 9 and 17 */
    assert_true(kvp_metric_retention(a, 20, m, 8, 4, scratch) == 3.0 / 4.0);
    /* top 5 adds 19, also in S */
    assert_true(kvp_metric_retention(a, 20, m, 8, 5, scratch) == 4.0 / 5.0);
    /* ties go to the lower index: all equal, top 2 = {0, 1} */
    float flat[20];
    for (int i = 0; i < 20; i++)
        flat[i] = 0.05f;
    uint64_t first[3] = {1ULL << 0, 0, 0};
    assert_true(kvp_metric_retention(flat, 20, first, 8, 2, scratch) == 0.5);
    /* K larger than the row: K = n_keys */
    uint64_t all[3] = {~0ULL, ~0ULL, ~0ULL};
    assert_true(kvp_metric_retention(a, 20, all, 8, 32, scratch) == 1.0);
}

/* A resolved policy for the oracles: only sink, local, budget and the block size matter. */
static struct kvp_policy plan_policy(int bs, int sink, int local, int budget)
{
    struct kvp_policy p = {.p = {.sink = sink, .local = local, .budget = budget},
                           .env = {.block_size = bs}};
    return p;
}

static void test_block_oracle(void **state)
{
    (void)state;
    /* 40 keys, bs = 8 (blocks 0..4), sink 8 and local 8 forced; budget 24 leaves k = 1 block of
     * blocks 1..3. Block 1 has the largest single token but block 2 the largest sum. */
    float s[40] = {0};
    s[8] = 0.30f;
    for (int t = 16; t < 24; t++)
        s[t] = 0.05f; /* block 2 sums to 0.40 */
    s[25] = 0.10f;
    uint64_t m[5];
    _Alignas(8) char scratch[40 * 64];
    struct kvp_policy p = plan_policy(8, 8, 8, 24);
    kvp_oracle_block(&p, s, 40, m, scratch);
    assert_int_equal(m[0], 0xff);
    assert_int_equal(m[1], 0);
    assert_int_equal(m[2], 0xff);
    assert_int_equal(m[3], 0);
    assert_int_equal(m[4], 0xff);
    /* ties between block sums go to the lower block */
    float t2[40] = {0};
    t2[10] = 0.2f;
    t2[30] = 0.2f;
    kvp_oracle_block(&p, t2, 40, m, scratch);
    assert_int_equal(m[1], 0xff);
    assert_int_equal(m[3], 0);
    /* a budget that does not buy a whole block: the forced tokens, and the 7 left right below
     * the local window (tokens 25..31, which the oracle cannot place elsewhere) */
    p = plan_policy(8, 8, 8, 23);
    kvp_oracle_block(&p, s, 40, m, scratch);
    assert_int_equal(m[1] | m[2], 0);
    assert_int_equal(m[3], 0xfe);
    assert_int_equal(kvp_metric_set_size(m, 40, 8), 23);
    /* budget 28: one whole block and 4 tokens more. Block 2 whole (0.40) with the 4 on block
     * 3's top (0): 0.40; block 3 (0.10) with the 4 pushed down onto block 2's top (0.20): 0.30;
     * block 1: 0.30 */
    p = plan_policy(8, 8, 8, 28);
    kvp_oracle_block(&p, s, 40, m, scratch);
    assert_int_equal(m[1], 0);
    assert_int_equal(m[2], 0xff);
    assert_int_equal(m[3], 0xf0);
    assert_int_equal(kvp_metric_set_size(m, 40, 8), 28);
    /* where the rest falls decides: block 3 has the largest sum (0.5, all on its top four
     * tokens) and block 1 0.35. Taking block 3 leaves the 4 on block 2's top (0): 0.5; taking
     * block 1 leaves them on block 3's top: 0.85. A ranking by block sums alone takes block 3 */
    float w[40] = {0};
    w[9] = 0.35f;
    for (int t = 28; t < 32; t++)
        w[t] = 0.125f;
    kvp_oracle_block(&p, w, 40, m, scratch);
    assert_int_equal(m[1], 0xff);
    assert_int_equal(m[2], 0);
    assert_int_equal(m[3], 0xf0);
    /* and the same mass on block 3's low four tokens: taking it, with the 4 on block 2's top
     * (0.04 each), is best: 0.66 against 0.35 */
    float v[40] = {0};
    v[9] = 0.35f;
    for (int t = 24; t < 28; t++)
        v[t] = 0.125f;
    for (int t = 20; t < 24; t++)
        v[t] = 0.04f;
    kvp_oracle_block(&p, v, 40, m, scratch);
    assert_int_equal(m[1], 0);
    assert_int_equal(m[2], 0xf0);
    assert_int_equal(m[3], 0xff);
    /* a budget >= n_keys keeps everything, including a partial last block */
    p = plan_policy(8, 8, 8, 64);
    kvp_oracle_block(&p, s, 37, m, scratch);
    assert_int_equal(m[4], 0x1f);
    assert_int_equal(kvp_metric_set_size(m, 37, 8), 37);
    /* unaligned sink and local: forced [0, 4) and the block-aligned local window [32, 40) (the
     * last 6 tokens rounded down to a block boundary); candidates are the whole blocks 1..3, so
     * the rest of block 0 is never read however much attention it holds */
    float u[40] = {0};
    u[6] = 0.5f;
    u[12] = 0.01f;
    u[20] = 0.03f;
    p = plan_policy(8, 4, 6, 20);
    kvp_oracle_block(&p, u, 40, m, scratch);
    assert_int_equal(m[0], 0x0f);
    assert_int_equal(m[1], 0);
    assert_int_equal(m[2], 0xff);
    assert_int_equal(m[3], 0);
    assert_int_equal(m[4], 0xff);
    assert_true(kvp_metric_set_size(m, 40, 8) <= 20);
}

static void test_token_oracle(void **state)
{
    (void)state;
    float s[40] = {0};
    s[8] = 0.30f;
    for (int t = 16; t < 24; t++)
        s[t] = 0.05f;
    s[25] = 0.10f;
    s[3] = 0.9f; /* in the sink: forced anyway */
    uint64_t m[5];
    _Alignas(8) char scratch[40 * 64];
    /* budget 19 = 16 forced + 3 best free tokens: 8, 25 and the lowest-index 0.05, 16 */
    struct kvp_policy p = plan_policy(8, 8, 8, 19);
    kvp_oracle_token(&p, s, 40, m, scratch);
    assert_int_equal(m[0], 0xff);
    assert_int_equal(m[1], 1ULL << 0);
    assert_int_equal(m[2], 1ULL << 0);
    assert_int_equal(m[3], 1ULL << 1);
    assert_int_equal(m[4], 0xff);
    /* the token oracle never holds less than the block oracle on the same scores */
    uint64_t mb[5];
    p = plan_policy(8, 8, 8, 24);
    kvp_oracle_block(&p, s, 40, mb, scratch);
    kvp_oracle_token(&p, s, 40, m, scratch);
    assert_true(kvp_metric_recovery(s, 40, m, 8) >= kvp_metric_recovery(s, 40, mb, 8));
    /* sink and local longer than the row: everything */
    p = plan_policy(8, 16, 16, 4);
    kvp_oracle_token(&p, s, 10, m, scratch);
    assert_int_equal(kvp_metric_set_size(m, 10, 8), 10);
}

/* ---- the harness on a fixture ---- */

static const struct kvp_test_model_spec fixture = KVP_TEST_FIXTURE_SPEC(80, 5);

static void test_harness(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = kvp_test_model(&fixture, &path);
    struct kvp_err err = {0};
    enum { N = 160, M = 24 };
    int32_t tok[N + M + 1];
    for (int i = 0; i < N + M + 1; i++)
        tok[i] = (i * 37 + 11) % 80;
    struct kvp_ctx_params cp = {.n_threads = 2};
    struct kvp_measure_params mp = {.n_prefill = N, .n_decode = M};
    struct kvp_measure *ms = NULL;
    assert_int_equal(kvp_measure_init(m, tok, &cp, &mp, &ms, &err), 0);

    struct kvp_measure_result r;
    struct kvp_policy_params full = {.name = "full"};
    assert_int_equal(kvp_measure_run(ms, &full, NULL, NULL, &r, &err), 0);
    print_message("full: recovery %.8f kl %.3g top1 %.3f ppl %.5f / %.5f\n", r.recovery, r.kl,
                  r.top1, r.ppl, r.ppl_full);
    /* full reads every position through the dense kernel: its logits are the dense run's bit
     * for bit, so KL is exactly 0 and the perplexities are equal (measured; were 1e-8 and
     * 1e-5). A recovery is a double sum of the n <= N + M f32 dense probabilities
     * e_t * (1 / S), S an f32 sum of n terms: 1 within gamma(n - 1) + 2u <= gamma(N + M + 1),
     * and means over heads and steps keep that bound (was 1e-5) */
    const double rec_tol = kvp_test_gamma(N + M + 1);
    assert_true(fabs(r.recovery - 1.0) <= rec_tol);
    assert_true(fabs(r.oracle_block - 1.0) <= rec_tol);
    assert_true(r.kl == 0);
    assert_true(r.top1 == 1.0);
    assert_true(r.retention == 1.0);
    assert_true(r.ppl == r.ppl_full);
    assert_true(r.compression == 0.0);
    assert_true(r.layer_recovery[0] == -1.0 && r.layer_recovery[1] == -1.0);
    assert_true(fabs(r.layer_recovery[3] - 1.0) <= rec_tol);
    assert_int_equal(r.kv_resident, r.kv_resident_full);
    kvp_measure_result_free(&r);

    struct kvp_policy_params st = {.name = "streaming", .budget = 48};
    assert_int_equal(kvp_measure_run(ms, &st, NULL, NULL, &r, &err), 0);
    print_message("streaming-48: recovery %.4f block oracle %.4f token oracle %.4f retention "
                  "%.3f kl %.4g top1 %.3f compression %.3f read %.3f\n",
                  r.recovery, r.oracle_block, r.oracle_token, r.retention, r.kl, r.top1,
                  r.compression, r.read_fraction);
    assert_true(r.recovery > 0 && r.recovery < 1);
    /* the token oracle's k heaviest tokens hold at least what any selection of as many does;
     * the three are means of double sums of the same f32 probabilities in their own orders:
     * within gamma(N + M + 1) of each other's rounding (rec_tol, above) */
    assert_true(r.recovery <= r.oracle_token + 2 * rec_tol);
    assert_true(r.oracle_block <= r.oracle_token + 2 * rec_tol);
    assert_true(r.retention > 0 && r.retention < 1);
    assert_true(r.kl > 0);
    assert_true(r.compression > 0.6 && r.compression < 0.8);
    /* a mean of exact counts 48: exact; the read fraction and the compression are the same
     * double quotient and its complement: one rounding of 1 - x */
    assert_true(r.budget_tokens == 48);
    assert_true(fabs(r.read_fraction - (1.0 - r.compression)) <= DBL_EPSILON);
    assert_true(r.kv_resident < r.kv_resident_full);
    kvp_measure_result_free(&r);

    struct kvp_policy_params bad = {.name = "nope"};
    assert_int_equal(kvp_measure_run(ms, &bad, NULL, NULL, &r, &err), KVP_EINVAL);
    kvp_measure_free(ms);
    kvp_measure_free(NULL);
    kvp_test_model_free(m, path);
}

/* ---- the CLI ---- */

static const char *const json_fields[] = {"model",
                                          "text",
                                          "offset",
                                          "token_seed",
                                          "n_prefill",
                                          "n_decode",
                                          "policy",
                                          "budget",
                                          "budget_tokens",
                                          "budget_ratio",
                                          "sink",
                                          "local",
                                          "window",
                                          "pool",
                                          "pool_max",
                                          "dense_layers",
                                          "gqa_agg",
                                          "seed",
                                          "block_size",
                                          "retention_k",
                                          "recovery",
                                          "recovery_layers",
                                          "oracle_block_recovery",
                                          "oracle_block_recovery_layers",
                                          "oracle_token_recovery",
                                          "oracle_relative",
                                          "oracle_token_relative",
                                          "retention",
                                          "kl",
                                          "kl_max",
                                          "top1",
                                          "ppl",
                                          "ppl_full",
                                          "ppl_ratio",
                                          "read_fraction",
                                          "compression",
                                          "kv_resident_bytes",
                                          "kv_kept_bytes",
                                          "kv_resident_bytes_full",
                                          "kv_kept_bytes_full",
                                          "seconds",
                                          NULL};

/* Measuring on a tiered context (kvpred eval --kv-tier): the dense pass reads the cold tier too,
 * so every number equals the untiered run's, with a hot tier too small to hold the layer. */
static void test_tiered_measure_equals_untiered(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = kvp_test_model(&fixture, &path);
    struct kvp_err err = {0};
    enum { N = 160, M = 16 };
    int32_t tok[N + M + 1];
    for (int i = 0; i < N + M + 1; i++)
        tok[i] = (i * 29 + 7) % 80;
    static const char *const names[] = {"quest", "oracle", "random"};
    struct kvp_measure_result ref[3];
    static const int tiers[] = {KVP_TIER_NONE, KVP_TIER_RAM, KVP_TIER_DISK};
    static const int modes[] = {KVP_PREFETCH_TOKEN, KVP_PREFETCH_LAYER, KVP_PREFETCH_NONE};
    for (int t = 0; t < 3; t++)
        for (int md = 0; md < (t ? 3 : 1); md++) {
            struct kvp_ctx_params cp = {.n_threads = 2, .kv_tier = tiers[t], .hot_budget = 64,
                                        .prefetch = modes[md]};
            struct kvp_measure_params mp = {.n_prefill = N, .n_decode = M};
            struct kvp_measure *ms = NULL;
            assert_int_equal(kvp_measure_init(m, tok, &cp, &mp, &ms, &err), 0);
            for (int i = 0; i < 3; i++) {
                struct kvp_policy_params pp = {.name = names[i], .budget = 48, .seed = 3};
                struct kvp_measure_result r;
                if (kvp_measure_run(ms, &pp, NULL, NULL, &r, &err) != 0)
                    fail_msg("%s: %s", names[i], err.msg);
                if (t == 0) {
                    ref[i] = r;
                    continue;
                }
                print_message("%s tier %d mode %d: recovery %.6f (untiered %.6f) kl %.4g (%.4g)\n",
                              names[i], tiers[t], modes[md], r.recovery, ref[i].recovery, r.kl,
                              ref[i].kl);
                assert_true(r.recovery == ref[i].recovery);
                assert_true(r.oracle_block == ref[i].oracle_block);
                assert_true(r.oracle_token == ref[i].oracle_token);
                assert_true(r.retention == ref[i].retention);
                assert_true(r.kl == ref[i].kl && r.kl_max == ref[i].kl_max);
                assert_true(r.top1 == ref[i].top1 && r.ppl == ref[i].ppl);
                assert_true(r.recovery > 0 && r.recovery < 1);
                kvp_measure_result_free(&r);
            }
            kvp_measure_free(ms);
        }
    for (int i = 0; i < 3; i++)
        kvp_measure_result_free(&ref[i]);
    kvp_test_model_free(m, path);
}

static void test_cli_eval_json(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char *path = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(&fixture, path, NULL), 0);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "%s eval -m %s --tokens-from-seed 3 --prefill 96 --decode 16 -t 2 "
             "--policy full,streaming --budget 32,1/4 --gqa-agg max --json 2>/dev/null",
             cli, path);
    char *out = NULL;
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    int lines = 0;
    const char *expect[3][2] = {{"full", "all"}, {"streaming", "32"}, {"streaming", "1/4"}};
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        for (int f = 0; json_fields[f]; f++)
            if (!cJSON_GetObjectItem(j, json_fields[f])) {
                print_message("missing field %s in %s\n", json_fields[f], line);
                fail();
            }
        assert_true(lines < 3);
        assert_string_equal(cJSON_GetObjectItem(j, "policy")->valuestring, expect[lines][0]);
        assert_string_equal(cJSON_GetObjectItem(j, "budget")->valuestring, expect[lines][1]);
        assert_string_equal(cJSON_GetObjectItem(j, "gqa_agg")->valuestring, "max");
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "recovery_layers")), 4);
        double rec = cJSON_GetObjectItem(j, "recovery")->valuedouble;
        if (lines == 0) {
            /* full: the dense kernel's logits bit for bit (KL exactly 0), and its recovery 1
             * within gamma(n + 1), n = 96 + 16 keys at most (test_measure_full_and_streaming;
             * cJSON prints doubles so that they read back exactly) */
            assert_true(fabs(rec - 1.0) <= kvp_test_gamma(96 + 16 + 1));
            assert_true(cJSON_GetObjectItem(j, "kl")->valuedouble == 0);
            assert_true(cJSON_GetObjectItem(j, "top1")->valuedouble == 1.0);
        } else {
            assert_true(rec < 1.0);
        }
        if (lines == 2) /* 1/4 of 97..112 keys */
            assert_true(cJSON_GetObjectItem(j, "budget_ratio")->valuedouble == 0.25);
        cJSON_Delete(j);
    }
    assert_int_equal(lines, 3);
    free(out);
    /* without --json: a table on stdout */
    snprintf(cmd, sizeof(cmd),
             "%s eval -m %s --tokens-from-seed 3 --prefill 64 --decode 4 --policy streaming "
             "--budget 32",
             cli, path);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    assert_non_null(strstr(out, "recovery"));
    assert_non_null(strstr(out, "streaming"));
    free(out);
    remove(path);
    free(path);
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void test_cli_viz(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char *path = kvp_test_tmpfile(".gguf");
    char *png = kvp_test_tmpfile(".png");
    assert_int_equal(kvp_test_write_model(&fixture, path, NULL), 0);
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "%s viz -m %s --tokens-from-seed 9 --prefill 64 --decode 32 --layer 3 --head 1 "
             "--policy streaming --budget 32 -o %s 2>/dev/null",
             cli, path, png);
    char *out = NULL;
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    free(out);
    size_t n = 0;
    unsigned char *d = (unsigned char *)kvp_test_read_file(png, &n);
    assert_non_null(d);
    assert_true(n > 33);
    assert_memory_equal(d, "\x89PNG\r\n\x1a\n", 8);
    assert_memory_equal(d + 12, "IHDR", 4);
    /* 6 key blocks of 16 px per panel plus a 3 px separator; 32 steps of 8 px */
    assert_int_equal(be32(d + 16), 2 * 6 * 16 + 3);
    assert_int_equal(be32(d + 20), 32 * 8);
    assert_int_equal(d[24], 8); /* bit depth */
    assert_int_equal(d[25], 2); /* RGB */
    free(d);

    char base[4096];
    snprintf(base, sizeof(base), "%s viz -m %s --tokens-from-seed 9 --prefill 64 --decode 8 -o %s",
             cli, path, png);
    snprintf(cmd, sizeof(cmd), "%s --layer 0 --head 0", base);
    kvp_test_expect_error(cmd, "runs dense");
    snprintf(cmd, sizeof(cmd), "%s --layer 9 --head 0", base);
    kvp_test_expect_error(cmd, "4 layers");
    snprintf(cmd, sizeof(cmd), "%s --layer 3 --head 4", base);
    kvp_test_expect_error(cmd, "query heads");
    snprintf(cmd, sizeof(cmd), "%s --head 0", base);
    kvp_test_expect_error(cmd, "--layer");
    snprintf(cmd, sizeof(cmd), "%s --layer 3 --head 0 --policy nope", base);
    kvp_test_expect_error(cmd, "unknown policy 'nope'");
    remove(path);
    remove(png);
    free(path);
    free(png);
}

static void test_cli_eval_errors(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char *path = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(&fixture, path, NULL), 0);
    char base[4096], cmd[8192];
    snprintf(base, sizeof(base), "%s eval -m %s --tokens-from-seed 1 --prefill 32 --decode 4", cli,
             path);
    snprintf(cmd, sizeof(cmd), "%s --budget 0", base);
    kvp_test_expect_error(cmd, "--budget: '0'");
    snprintf(cmd, sizeof(cmd), "%s --budget 3/2", base);
    kvp_test_expect_error(cmd, "--budget: '3/2'");
    snprintf(cmd, sizeof(cmd), "%s --budget 32,,64", base);
    kvp_test_expect_error(cmd, "--budget");
    snprintf(cmd, sizeof(cmd), "%s --budget 1.5", base);
    kvp_test_expect_error(cmd, "--budget: '1.5'");
    snprintf(cmd, sizeof(cmd), "%s --policy streaming,bogus", base);
    kvp_test_expect_error(cmd, "unknown policy 'bogus'");
    snprintf(cmd, sizeof(cmd), "%s --gqa-agg median", base);
    kvp_test_expect_error(cmd, "--gqa-agg");
    snprintf(cmd, sizeof(cmd), "%s --pool 4", base);
    kvp_test_expect_error(cmd, "--pool");
    snprintf(cmd, sizeof(cmd), "%s --frobnicate", base);
    kvp_test_expect_error(cmd, "unknown flag '--frobnicate'");
    snprintf(cmd, sizeof(cmd), "%s --prefill", base);
    kvp_test_expect_error(cmd, "needs a value");
    snprintf(cmd, sizeof(cmd), "%s eval -m %s", cli, path);
    kvp_test_expect_error(cmd, "-f FILE");
    snprintf(cmd, sizeof(cmd), "%s eval -m %s -f /nonexistent/text.txt --decode 4", cli, path);
    kvp_test_expect_error(cmd, "/nonexistent/text.txt");
    snprintf(cmd, sizeof(cmd), "%s -c 16", base);
    kvp_test_expect_error(cmd, "exceed the context");
    snprintf(cmd, sizeof(cmd), "%s -f /tmp/none.txt", base);
    kvp_test_expect_error(cmd, "either -f or --tokens-from-seed");
    snprintf(cmd, sizeof(cmd), "%s run -m %s --policy bogus", cli, path);
    kvp_test_expect_error(cmd, "unknown policy 'bogus'");
    snprintf(cmd, sizeof(cmd), "%s run -m %s --budget x", cli, path);
    kvp_test_expect_error(cmd, "--budget: 'x'");
    remove(path);
    free(path);
}

/* kvp_perplexity on the fixture: chunk count, tokens scored, the mean NLL equal to the one this
 * test computes from the chunks' logits itself, and the errors. */
static void progress_count(void *ud, long done, long total, double ppl)
{
    int *calls = ud;
    assert_true(done >= 1 && done <= total && ppl > 1.0);
    (*calls)++;
}

static void test_perplexity_library(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = kvp_test_model(&fixture, &path);
    struct kvp_err err = {0};
    enum { N = 200, CTX = 64, V = 80 };
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (i * 29 + 7) % V;
    kvp_ctx *ctx = NULL;
    struct kvp_ctx_params cp = {.n_ctx = CTX, .n_threads = 2};
    assert_int_equal(kvp_ctx_init(m, &cp, &ctx, &err), 0);

    struct kvp_ppl_result r;
    int calls = 0;
    assert_int_equal(kvp_perplexity(ctx, m, tok, N, CTX, 0, progress_count, &calls, &r, &err), 0);
    assert_int_equal(r.chunks, N / CTX);
    assert_int_equal(calls, N / CTX);
    assert_int_equal(r.scored, (N / CTX) * (CTX - 1 - CTX / 2));
    /* the same sum by hand: every chunk alone, BOS first, the second half scored */
    static float logits[CTX * V];
    int32_t chunk[CTX];
    double sum = 0.0, sumabs = 0.0;
    for (int c = 0; c < N / CTX; c++) {
        memcpy(chunk, tok + c * CTX, sizeof(chunk));
        chunk[0] = kvp_token_bos(m);
        kvp_ctx_reset(ctx);
        assert_int_equal(kvp_eval(ctx, chunk, CTX, logits, true, &err), 0);
        for (int j = CTX / 2; j < CTX - 1; j++) {
            const float *l = logits + j * V;
            double mx = l[0], z = 0.0;
            for (int k = 1; k < V; k++)
                mx = l[k] > mx ? l[k] : mx;
            for (int k = 0; k < V; k++)
                z += exp(l[k] - mx);
            sum += log(z) - (l[tok[c * CTX + j + 1]] - mx);
            sumabs += log(z) + fabs(l[tok[c * CTX + j + 1]] - mx);
        }
    }
    print_message("perplexity %.6f (nll %.6f, by hand %.6f) ± %.6f\n", r.ppl, r.nll,
                  sum / (double)r.scored, r.ppl_stderr);
    /* the same logits (the same context and chunks), both sums in double: each term a log of a
     * sum of V exps within (V + 3) ulps of its terms, the sum of the terms within as many
     * ulps as terms (DBL_EPSILON = 2 ulps of 1), twice for two evaluations; the perplexity
     * is exp of the mean nll, one more rounding of exp */
    const double tol = 2 * (V + 3 + r.scored) * DBL_EPSILON * sumabs / r.scored;
    assert_true(fabs(r.nll - sum / (double)r.scored) <= tol);
    assert_true(fabs(r.ppl - exp(r.nll)) <= 2 * DBL_EPSILON * r.ppl);
    assert_true(r.ppl_stderr > 0.0);

    /* --chunks caps the count; too short a text and too small a context are errors */
    assert_int_equal(kvp_perplexity(ctx, m, tok, N, CTX, 1, NULL, NULL, &r, &err), 0);
    assert_int_equal(r.chunks, 1);
    assert_int_equal(kvp_perplexity(ctx, m, tok, CTX - 1, CTX, 0, NULL, NULL, &r, &err),
                     KVP_EINVAL);
    assert_non_null(strstr(err.msg, "fewer than one context"));
    assert_int_equal(kvp_perplexity(ctx, m, tok, N, 3, 0, NULL, NULL, &r, &err), KVP_EINVAL);
    kvp_ctx_free(ctx);
    kvp_test_model_free(m, path);
}

/* The evaluation table's command (scripts/eval_tables.sh) on the real model and text, shortened. */
static void test_cli_eval_stories(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    KVP_REQUIRE_SHARED(m, "models/stories260K.gguf");
    KVP_REQUIRE_SHARED(txt, "data/tinystories/tinystories_val.txt");
    char cmd[10000];
    snprintf(cmd, sizeof(cmd),
             "%s eval -m %s -f %s --offset 1000 --prefill 128 --decode 32 --budget 32,1/4 "
             "--json 2>/dev/null",
             cli, m, txt);
    char *out = NULL;
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    int lines = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const char *pol = cJSON_GetObjectItem(j, "policy")->valuestring;
        double rec = cJSON_GetObjectItem(j, "recovery")->valuedouble;
        double orc_b = cJSON_GetObjectItem(j, "oracle_block_recovery")->valuedouble;
        double orc_t = cJSON_GetObjectItem(j, "oracle_token_recovery")->valuedouble;
        print_message("%-12s %-4s recovery %.4f block oracle %.4f token oracle %.4f\n", pol,
                      cJSON_GetObjectItem(j, "budget")->valuestring, rec, orc_b, orc_t);
        /* recoveries are means of double sums of at most n = 128 + 32 f32 probabilities
         * normalised by an f32 sum: at most 1 + gamma(n + 1) (test_measure_full_and_streaming).
         * The oracle policies select what the instruments' oracles select, up to ranking
         * blocks (or tokens) by f32 masses: two within 2^-24 relative may swap, which moves
         * a recovery by at most their difference, 2u on masses <= 1, per (step, head) and so
         * in the mean */
        const double rtol = kvp_test_gamma(128 + 32 + 1), swap = 2 * 0x1p-24;
        assert_true(rec > 0 && rec <= 1.0 + rtol);
        assert_true(orc_b <= 1.0 + rtol && orc_t <= 1.0 + rtol);
        if (!strcmp(pol, "full"))
            assert_true(fabs(rec - 1.0) <= rtol);
        if (!strcmp(pol, "oracle"))
            assert_true(fabs(rec - orc_b) <= swap + 2 * rtol);
        if (!strcmp(pol, "oracle_token"))
            assert_true(fabs(rec - orc_t) <= swap + 2 * rtol);
        cJSON_Delete(j);
    }
    assert_true(lines >= 3);
    free(out);
}

/* Equal reads: at a budget every block policy reads exactly what the block oracle reads (the
 * budget, once the plan ranks), and the oracle's recovery bounds each one's, on stories260K's
 * held-out text (the tail of tinystories_val.txt past the predictors' training bytes, as the
 * README's table), prefill 256, decode 256. Every registered policy with block_plan is run; one
 * that needs a file takes it from models/ (a new one must be added to aux_for). */
static const char *aux_for(const char *policy)
{
    if (!strcmp(policy, "predictor"))
        return "models/stories260K.kvpp";
    if (!strcmp(policy, "qpredictor"))
        return "models/stories260K.qkvpp";
    return NULL;
}

static void test_oracle_bounds_block_policies(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(model_path, "models/stories260K.gguf");
    char mpath[4096];
    snprintf(mpath, sizeof(mpath), "%s", model_path);
    KVP_REQUIRE_SHARED(txt, "data/tinystories/tinystories_val.txt");
    const char *src = getenv("KVP_SOURCE_DIR");
    assert_non_null(src);
    size_t size = 0;
    char *text = kvp_test_read_file(txt, &size);
    assert_non_null(text);
    const size_t offset = 753415, len = 8192; /* ~2000 tokens of text, 513 needed */
    assert_true(size >= offset + len);
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_model_open(mpath, NULL, &m, &err), 0);
    enum { N = 256, M = 256 };
    int32_t *tok = malloc(len * sizeof(int32_t));
    size_t n_tok = 0;
    assert_int_equal(kvp_tokenize(m, text + offset, len, true, tok, len, &n_tok, &err), 0);
    assert_true(n_tok >= N + M + 1);
    struct kvp_ctx_params cp = {.n_threads = 2};
    struct kvp_measure_params mp = {.n_prefill = N, .n_decode = M};
    struct kvp_measure *ms = NULL;
    assert_int_equal(kvp_measure_init(m, tok, &cp, &mp, &ms, &err), 0);
    static const int budgets[] = {32, 48, 64, 100, 128};
    int n_policies = 0;
    for (int i = 0; kvp_policy_registry[i]; i++) {
        const struct kvp_policy_ops *ops = kvp_policy_registry[i];
        if (!ops->block_plan)
            continue;
        n_policies++;
        char aux[4096] = "";
        if (ops->needs_aux) {
            const char *rel = aux_for(ops->name);
            if (!rel)
                fail_msg("block policy %s needs a file: add it to aux_for", ops->name);
            snprintf(aux, sizeof(aux), "%s/%s", src, rel);
        }
        for (size_t b = 0; b < sizeof(budgets) / sizeof(budgets[0]); b++) {
            struct kvp_policy_params pp = {.name = ops->name, .budget = budgets[b],
                                           .aux_path = aux[0] ? aux : NULL};
            struct kvp_measure_result r;
            assert_int_equal(kvp_measure_run(ms, &pp, NULL, NULL, &r, &err), 0);
            print_message("%-11s budget %3d: recovery %.4f block oracle %.4f, reads %.2f of "
                          "%.2f budgeted\n",
                          ops->name, budgets[b], r.recovery, r.oracle_block, r.read_tokens,
                          r.budget_tokens);
            /* equal reads: both are means over the same (step, layer, KV head) of exact counts,
             * the same double operations in the same order */
            assert_true(r.read_tokens == r.budget_tokens);
            /* the bound is exact but for float sums: the oracle ranks blocks by sums rounded to
             * float (2^-24 relative, on masses <= 1: a swap of two blocks within that moves a
             * recovery by at most 2u) and recoveries are double sums of N + M f32 probabilities
             * normalised by an f32 sum (gamma(N + M + 1) each), per (step, head) and in the
             * mean */
            const double tol = 2 * 0x1p-24 + 2 * kvp_test_gamma(N + M + 1);
            assert_true(r.recovery <= r.oracle_block + tol);
            if (!strcmp(ops->name, "oracle")) /* the policy is the instrument */
                assert_true(fabs(r.recovery - r.oracle_block) <= tol);
            kvp_measure_result_free(&r);
        }
    }
    assert_true(n_policies >= 5); /* quest, oracle, random, predictor, qpredictor */
    kvp_measure_free(ms);
    kvp_model_close(m);
    free(tok);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kl_top1_nll),      cmocka_unit_test(test_recovery_and_retention),
        cmocka_unit_test(test_block_oracle),     cmocka_unit_test(test_token_oracle),
        cmocka_unit_test(test_harness),          cmocka_unit_test(test_cli_eval_json),
        cmocka_unit_test(test_tiered_measure_equals_untiered),
        cmocka_unit_test(test_cli_viz),          cmocka_unit_test(test_cli_eval_errors),
        cmocka_unit_test(test_cli_eval_stories), cmocka_unit_test(test_perplexity_library),
        cmocka_unit_test(test_oracle_bounds_block_policies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
