/*
 * Tests of the trainer's bf16 fast path against the f32 reference: the GEMM kernel on exactly
 * representable operands (so only the f32 accumulation differs from a double reference), the
 * AVX512-BF16 conversions bit for bit against the portable ones, the fused attention forward and
 * backward against the per-block f32 attention, the SIMD cross-entropy, and a whole model's loss
 * and gradients. Every kernel test runs on each table this CPU has (portable C always).
 *
 * Bounds, stated once here: GEMM |C − ref| ≤ 1e-5·Σ|a·b| + 1e-6 (f32 accumulation only);
 * attention outputs and gradients within 2 % of the largest reference magnitude (bf16 rounds
 * q, k, v, P and dS to 8 significant bits); the model's loss within 0.5 % and every tensor's
 * gradient within 3 % (relative L2) of the f32 model's.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kernels/types.h"
#include "train/train.h"

static void fill(float *x, size_t n, struct kvp_rng *r, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * kvp_rng_uniform(r);
}

/* The tables to test: portable C and, when the CPU has it, AVX512-BF16. */
static int tables(const struct kvp_tk_ops *t[2])
{
    t[0] = kvp_tk_scalar();
    t[1] = kvp_tk_avx512bf16();
    if (!t[1])
        print_message("  (no AVX512-BF16 on this CPU: portable kernels only)\n");
    return t[1] ? 2 : 1;
}

/* ======================================== GEMM ================================================ */

static void check_gemm(const struct kvp_tk_ops *tk, int M, int N, int kp, bool acc)
{
    struct kvp_rng rng;
    kvp_rng_seed(&rng, (uint64_t)(M * 1000 + N * 10 + kp));
    size_t lda = 2 * (size_t)kp + 2, ldb = 2 * (size_t)N + 4, ldc = (size_t)N + 3;
    uint16_t *A = calloc((size_t)M * lda, 2), *B = calloc((size_t)kp * ldb, 2);
    float *C = calloc((size_t)M * ldc, 4), *C0 = calloc((size_t)M * ldc, 4);
    assert_true(A && B && C && C0);
    for (size_t i = 0; i < (size_t)M * lda; i++)
        A[i] = kvp_f32_to_bf16(2.0f * kvp_rng_uniform(&rng) - 1.0f);
    for (size_t i = 0; i < (size_t)kp * ldb; i++)
        B[i] = kvp_f32_to_bf16(2.0f * kvp_rng_uniform(&rng) - 1.0f);
    fill(C0, (size_t)M * ldc, &rng, -1, 1);
    memcpy(C, C0, sizeof(float) * (size_t)M * ldc);
    tk->gemm(M, N, kp, A, lda, 2, B, ldb, C, ldc, acc);
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N + 3; j++) {
            float got = C[(size_t)i * ldc + j];
            if (j >= N) { /* outside the tile: untouched */
                bad += got != C0[(size_t)i * ldc + j];
                continue;
            }
            double ref = acc ? C0[(size_t)i * ldc + j] : 0.0, mag = 0.0;
            for (int p = 0; p < 2 * kp; p++) {
                double a = kvp_bf16_to_f32(A[(size_t)i * lda + p]);
                double b = kvp_bf16_to_f32(B[(size_t)(p / 2) * ldb + 2 * (size_t)j + p % 2]);
                ref += a * b;
                mag += fabs(a * b);
            }
            if (fabs(got - ref) > 1e-5 * mag + 1e-6) {
                if (bad < 3)
                    print_message("  %s gemm %dx%dx%d [%d][%d]: %g vs %g\n", tk->name, M, N, kp,
                                  i, j, got, ref);
                bad++;
            }
        }
    assert_int_equal(bad, 0);
    /* the same A pair-interleaved ([kp][M][2]: lda 2, ldp 2·M) gives the same C bit for bit */
    uint16_t *Ap = malloc(sizeof(uint16_t) * 2 * (size_t)kp * M);
    float *C2 = malloc(sizeof(float) * (size_t)M * ldc);
    assert_true(Ap && C2);
    for (int i = 0; i < M; i++)
        for (int p = 0; p < kp; p++) {
            Ap[((size_t)p * M + i) * 2] = A[(size_t)i * lda + 2 * p];
            Ap[((size_t)p * M + i) * 2 + 1] = A[(size_t)i * lda + 2 * p + 1];
        }
    memcpy(C2, C0, sizeof(float) * (size_t)M * ldc);
    tk->gemm(M, N, kp, Ap, 2, 2 * (size_t)M, B, ldb, C2, ldc, acc);
    assert_memory_equal(C, C2, sizeof(float) * (size_t)M * ldc);
    free(Ap);
    free(C2);
    free(A);
    free(B);
    free(C);
    free(C0);
}

static void test_gemm(void **state)
{
    (void)state;
    const struct kvp_tk_ops *t[2];
    int n = tables(t);
    const int shapes[][3] = {{8, 32, 5}, {64, 64, 16}, {13, 40, 7}, {17, 352, 64}, {3, 16, 1},
                             {70, 33, 3}, {1, 1, 1}};
    for (int k = 0; k < n; k++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
            for (int acc = 0; acc < 2; acc++)
                check_gemm(t[k], shapes[s][0], shapes[s][1], shapes[s][2], acc);
}

/* The SIMD conversions round exactly like the portable ones (normal numbers). */
static void test_conversions(void **state)
{
    (void)state;
    const struct kvp_tk_ops *t[2];
    if (tables(t) < 2)
        kvp_test_skip_unsupported("one trainer kernel table on this CPU");
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 3);
    enum { N = 77 };
    float a[N], b[N];
    fill(a, N, &rng, -100, 100);
    fill(b, N, &rng, -1e-3f, 1e-3f);
    for (int n = 1; n <= N; n += 19) {
        uint16_t x[2 * N + 2], y[2 * N + 2];
        memset(x, 0xab, sizeof(x));
        memset(y, 0xab, sizeof(y));
        t[0]->cvt(x, a, (size_t)n, 0.37f);
        t[1]->cvt(y, a, (size_t)n, 0.37f);
        assert_memory_equal(x, y, sizeof(x));
        t[0]->cvt_pair(x, a, b, (size_t)n, 1.0f);
        t[1]->cvt_pair(y, a, b, (size_t)n, 1.0f);
        assert_memory_equal(x, y, sizeof(x));
        t[0]->cvt_pair(x, b, NULL, (size_t)n, 3.0f);
        t[1]->cvt_pair(y, b, NULL, (size_t)n, 3.0f);
        assert_memory_equal(x, y, sizeof(x));
    }
}

/* The SIMD SwiGLU (own exponential) against the libm one: 1e-6 relative, over gates far into
 * both saturated ends. */
static void test_swiglu(void **state)
{
    (void)state;
    const struct kvp_tk_ops *t[2];
    if (tables(t) < 2)
        kvp_test_skip_unsupported("one trainer kernel table on this CPU");
    enum { N = 1003 };
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 4);
    float g[N], u[N], da[N], a0[N], a1[N], dg0[N], dg1[N], du0[N], du1[N];
    fill(g, N, &rng, -30, 30);
    fill(u, N, &rng, -2, 2);
    fill(da, N, &rng, -1, 1);
    g[0] = -200.0f;
    g[1] = 200.0f;
    kvp_op_swiglu_fwd(a0, g, u, N);
    t[1]->swiglu_fwd(a1, g, u, N);
    kvp_op_swiglu_bwd(dg0, du0, da, g, u, N);
    t[1]->swiglu_bwd(dg1, du1, da, g, u, N);
    for (int i = 0; i < N; i++) {
        assert_true(fabsf(a0[i] - a1[i]) <= 1e-6f * fabsf(a0[i]) + 1e-30f);
        assert_true(fabsf(du0[i] - du1[i]) <= 1e-6f * fabsf(du0[i]) + 1e-30f);
        assert_true(fabsf(dg0[i] - dg1[i]) <= 1e-5f * fabsf(dg0[i]) + 1e-30f);
    }
}

/* ================================== fused attention =========================================== */

static double max_abs(const float *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* Largest |a − b| over the used columns (cols of every row of stride ld) relative to max |b|,
 * or to 0.1 when the reference is smaller (T = 1 has dq = 0 exactly, where bf16 leaves ~1e-3). */
static double rel_err(const float *a, const float *b, int rows, int cols, int ld)
{
    double d = 0.0, m = 0.0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            d = fmax(d, fabs(a[(size_t)i * ld + j] - b[(size_t)i * ld + j]));
            m = fmax(m, fabs(b[(size_t)i * ld + j]));
        }
    return d / fmax(m, 0.1);
}

static void check_attention(const struct kvp_tk_ops *tk, int T)
{
    enum { HD = 32, REP = 2, LDQ = REP * HD + 5, LDKV = HD + 3 };
    struct kvp_rng rng;
    kvp_rng_seed(&rng, (uint64_t)T);
    size_t nq = (size_t)T * LDQ, nkv = (size_t)T * LDKV;
    float *q = malloc(nq * 4), *k = malloc(nkv * 4), *v = malloc(nkv * 4), *dout = malloc(nq * 4);
    float *o_ref = calloc(nq, 4), *o = calloc(nq, 4), *l_ref = malloc((size_t)REP * T * 4),
          *l = malloc((size_t)REP * T * 4);
    float *dq_ref = calloc(nq, 4), *dq = calloc(nq, 4), *dk_ref = calloc(nkv, 4),
          *dk = calloc(nkv, 4), *dv_ref = calloc(nkv, 4), *dv = calloc(nkv, 4);
    float *s_ref = malloc(kvp_op_attn_scratch(T) * 4), *s = malloc(kvp_fa_scratch(T, HD) * 4);
    assert_true(q && k && v && dout && o_ref && o && l_ref && l && dq_ref && dq && dk_ref && dk &&
                dv_ref && dv && s_ref && s);
    /* sharp enough that some rows attend to a few keys (scores up to ~±10) */
    fill(q, nq, &rng, -2, 2);
    fill(k, nkv, &rng, -2, 2);
    fill(v, nkv, &rng, -1, 1);
    fill(dout, nq, &rng, -1, 1);
    kvp_op_attn_fwd(o_ref, l_ref, q, k, v, T, HD, REP, LDQ, LDKV, s_ref);
    kvp_fa_fwd(tk, o, l, q, k, v, T, HD, REP, LDQ, LDKV, s);
    double e_o = rel_err(o, o_ref, T, REP * HD, LDQ), e_l = rel_err(l, l_ref, 1, REP * T, 0);
    kvp_op_attn_bwd(dq_ref, dk_ref, dv_ref, dout, o_ref, l_ref, q, k, v, T, HD, REP, LDQ, LDKV,
                    s_ref);
    /* dk, dv accumulate: start both from the same non-zero values */
    for (size_t i = 0; i < nkv; i++) {
        dk[i] = 0.25f;
        dv[i] = -0.5f;
        dk_ref[i] += 0.25f;
        dv_ref[i] += -0.5f;
    }
    kvp_fa_bwd(tk, dq, dk, dv, dout, o, l, q, k, v, T, HD, REP, LDQ, LDKV, s);
    double e_dq = rel_err(dq, dq_ref, T, REP * HD, LDQ), e_dk = rel_err(dk, dk_ref, T, HD, LDKV),
           e_dv = rel_err(dv, dv_ref, T, HD, LDKV);
    print_message("  %s T=%d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e (max |dq| %.3g)\n",
                  tk->name, T, e_o, e_l, e_dq, e_dk, e_dv, max_abs(dq_ref, nq));
    assert_true(e_o < 2e-2 && e_l < 2e-2 && e_dq < 2e-2 && e_dk < 2e-2 && e_dv < 2e-2);
    /* columns outside this group's heads are never written */
    for (int t = 0; t < T; t++)
        for (int j = REP * HD; j < LDQ; j++)
            assert_true(o[(size_t)t * LDQ + j] == 0.0f && dq[(size_t)t * LDQ + j] == 0.0f);
    free(q), free(k), free(v), free(dout), free(o_ref), free(o), free(l_ref), free(l);
    free(dq_ref), free(dq), free(dk_ref), free(dk), free(dv_ref), free(dv), free(s_ref), free(s);
}

static void test_fused_attention(void **state)
{
    (void)state;
    const struct kvp_tk_ops *t[2];
    int n = tables(t);
    const int lens[] = {1, 63, 64, 150, 300};
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
            check_attention(t[k], lens[i]);
}

/* =================================== cross-entropy ============================================ */

static void test_xent_fast(void **state)
{
    (void)state;
    enum { N = 7, V = 301 };
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 11);
    float a[N * V], b[N * V], w[N], na[N], nb[N];
    int32_t tgt[N];
    fill(a, N * V, &rng, -8, 8);
    memcpy(b, a, sizeof(a));
    for (int i = 0; i < N; i++) {
        tgt[i] = (int32_t)kvp_rng_below(&rng, V);
        w[i] = i == 3 ? 0.0f : 0.5f + (float)i;
    }
    double la = kvp_op_xent(a, tgt, w, N, V, 0.1f, na);
    double lb = kvp_op_xent_fast(b, tgt, w, N, V, 0.1f, nb);
    assert_true(fabs(la - lb) <= 1e-5 * fabs(la));
    for (int i = 0; i < N; i++)
        assert_true(fabsf(na[i] - nb[i]) <= 1e-5f * fabsf(na[i]) + 1e-6f);
    for (int i = 0; i < N * V; i++)
        assert_true(fabsf(a[i] - b[i]) <= 1e-6f);
}

/* ===================================== whole model ============================================ */

/* the small model of the whole-model tests (run_model and the tests that read its layout) */
static const struct kvp_train_config small_model = {
    .n_vocab = 300, .n_embd = 64, .n_layer = 2, .n_head = 2, .n_head_kv = 1, .n_ff = 96,
    .n_ctx = 100, .rope_base = 1000.0f, .norm_eps = 1e-5f, .tied = 1};

/* Loss and gradients of one micro-batch; params (optional) receives the weights after one AdamW
 * step on them. */
static void run_model(int precision, int threads, float *grads, double *loss, float *params)
{
    struct kvp_train_config cfg = small_model;
    enum { SEQ = 2, T = 100 };
    struct kvp_train_model *m;
    struct kvp_err err;
    assert_int_equal(kvp_train_model_init(&m, &cfg, SEQ * T, threads, 7, &err), 0);
    assert_int_equal(kvp_train_model_set_precision(m, precision, &err), 0);
    /* weights 2× the init so attention is not uniform and gradients are well above noise (much
     * larger makes the logits so large that any rounding of them moves the softmax) */
    for (size_t i = 0; i < m->n_params; i++)
        m->params[i] *= 2.0f;
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 12);
    int32_t tok[SEQ * T + 1];
    for (int i = 0; i <= SEQ * T; i++)
        tok[i] = (int32_t)kvp_rng_below(&rng, 300);
    assert_int_equal(kvp_train_model_forward(m, tok, SEQ, T, &err), 0);
    *loss = kvp_train_model_loss(m, tok + 1, NULL, SEQ * T, NULL) / (SEQ * T);
    kvp_train_model_zero_grad(m);
    kvp_train_model_backward(m);
    memcpy(grads, m->grads, m->n_params * sizeof(float));
    if (params) {
        struct kvp_adamw opt;
        assert_int_equal(kvp_adamw_init(&opt, m->n_params, 0.9f, 0.95f, 1e-8f, 0.1f, &err), 0);
        kvp_adamw_step(&opt, m, 1e-3f);
        memcpy(params, m->params, m->n_params * sizeof(float));
        kvp_adamw_free(&opt);
    }
    kvp_train_model_free(m);
}

static void test_model_bf16_matches_f32(void **state)
{
    (void)state;
    struct kvp_train_config cfg = small_model;
    struct kvp_train_model *m;
    struct kvp_err err;
    assert_int_equal(kvp_train_model_init(&m, &cfg, 200, 1, 7, &err), 0);
    float *g32 = malloc(m->n_params * 4), *g16 = malloc(m->n_params * 4);
    assert_true(g32 && g16);
    double l32, l16;
    run_model(KVP_PREC_F32, 2, g32, &l32, NULL);
    run_model(KVP_PREC_BF16, 2, g16, &l16, NULL);
    print_message("  loss f32 %.6f bf16 %.6f\n", l32, l16);
    assert_true(fabs(l16 - l32) <= 5e-3 * l32);
    for (int i = 0; i < m->n_tensors; i++) {
        const struct kvp_train_tensor *ts = &m->tensors[i];
        size_t n = (size_t)ts->ne[0] * (size_t)ts->ne[1];
        double d = 0.0, r = 0.0;
        for (size_t j = 0; j < n; j++) {
            double a = g16[ts->off + j], b = g32[ts->off + j];
            d += (a - b) * (a - b);
            r += b * b;
        }
        double e = sqrt(d / (r > 0 ? r : 1));
        if (e > 3e-2)
            print_message("  %s: relative L2 error %.3g\n", ts->name, e);
        assert_true(e <= 3e-2); /* ~1e-2 measured */
    }
    free(g32);
    free(g16);
    kvp_train_model_free(m);
}

/* The bf16 path's thread pool only schedules: on 1, 2 and 3 threads (3 leaves uneven shares and
 * a thread without an attention task) every gradient but the norm weights' (whose per-thread
 * partial sums are added in thread order) is the same bits, as are the weights after an AdamW
 * step of those; the loss agrees to rounding. */
static void test_model_bf16_threads_agree(void **state)
{
    (void)state;
    struct kvp_train_config cfg = small_model;
    struct kvp_train_model *m;
    struct kvp_err err;
    assert_int_equal(kvp_train_model_init(&m, &cfg, 200, 1, 7, &err), 0);
    float *g[3], *p[3];
    double l[3];
    for (int t = 0; t < 3; t++) {
        g[t] = malloc(m->n_params * sizeof(float));
        p[t] = malloc(m->n_params * sizeof(float));
        assert_true(g[t] && p[t]);
        run_model(KVP_PREC_BF16, t + 1, g[t], &l[t], p[t]);
    }
    for (int t = 1; t < 3; t++) {
        assert_true(fabs(l[t] - l[0]) <= 1e-9 * l[0]);
        for (int i = 0; i < m->n_tensors; i++) {
            const struct kvp_train_tensor *ts = &m->tensors[i];
            if (ts->n_dims == 1)
                continue;
            size_t n = (size_t)ts->ne[0] * (size_t)ts->ne[1];
            assert_memory_equal(g[0] + ts->off, g[t] + ts->off, n * sizeof(float));
            assert_memory_equal(p[0] + ts->off, p[t] + ts->off, n * sizeof(float));
        }
    }
    for (int t = 0; t < 3; t++) {
        free(g[t]);
        free(p[t]);
    }
    kvp_train_model_free(m);
}

/* ======================================= CLI ================================================== */

/* --bench prints one JSON object with both precisions and their ratio; a bad --precision is one
 * error line. */
static void test_cli_bench(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "%s train-lm --bench --dim 32 --layers 1 --heads 2 --kv-heads 1 --ff 64 --vocab 300 "
             "--bench-ctx 64,128 --bench-steps 1 --bench-reps 2 2>/dev/null",
             cli);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    /* the model, steps and repetitions asked for */
    const cJSON *model = cJSON_GetObjectItem(j, "model");
    assert_int_equal(cJSON_GetObjectItem(model, "dim")->valueint, 32);
    assert_int_equal(cJSON_GetObjectItem(model, "layers")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(model, "heads")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(model, "kv_heads")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(model, "ff")->valueint, 64);
    assert_int_equal(cJSON_GetObjectItem(model, "vocab")->valueint, 300);
    assert_int_equal(cJSON_GetObjectItem(j, "steps")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(j, "reps")->valueint, 2);
    /* one result per (context, precision), f32 then bf16 at each context in the order given,
     * each with its two measurements and their median */
    const cJSON *res = cJSON_GetObjectItem(j, "results");
    assert_int_equal(cJSON_GetArraySize(res), 4);
    double med[4];
    for (int i = 0; i < 4; i++) {
        const cJSON *r = cJSON_GetArrayItem(res, i);
        assert_int_equal(cJSON_GetObjectItem(r, "ctx")->valueint, i < 2 ? 64 : 128);
        assert_string_equal(cJSON_GetObjectItem(r, "precision")->valuestring,
                            i % 2 ? "bf16" : "f32");
        /* a step is the shipped run's 8192 tokens (sequences of ctx tokens) */
        assert_int_equal(cJSON_GetObjectItem(r, "tokens_per_step")->valueint, 8192);
        const cJSON *tps = cJSON_GetObjectItem(r, "tokens_per_s");
        assert_int_equal(cJSON_GetArraySize(tps), 2);
        double a = cJSON_GetArrayItem(tps, 0)->valuedouble;
        double b = cJSON_GetArrayItem(tps, 1)->valuedouble;
        assert_true(a > 0 && b > 0);
        med[i] = cJSON_GetObjectItem(r, "tokens_per_s_median")->valuedouble;
        /* the median of two is their mean; each figure is printed cut to whole tokens/s, so
         * the printed ones can disagree by under 1 (the mean's cut) + 1 (the median's) */
        assert_true(fabs(med[i] - (a + b) / 2) < 2.0);
        assert_true(cJSON_GetObjectItem(r, "cpu_s_per_mtok_median")->valuedouble > 0);
    }
    /* the speed-up per context is bf16's median over f32's, printed cut to 2 decimals (up to
     * 0.01 below); the true medians are at most 1 above the printed ones (cut to whole
     * tokens/s), which bounds the ratio between p1 / (p0 + 1) and (p1 + 1) / p0 */
    const cJSON *sp = cJSON_GetObjectItem(j, "speedup");
    assert_int_equal(cJSON_GetArraySize(sp), 2);
    for (int c = 0; c < 2; c++) {
        const cJSON *e = cJSON_GetArrayItem(sp, c);
        assert_int_equal(cJSON_GetObjectItem(e, "ctx")->valueint, c ? 128 : 64);
        const double p0 = med[2 * c], p1 = med[2 * c + 1];
        double got = cJSON_GetObjectItem(e, "tokens_per_s")->valuedouble;
        assert_true(got <= (p1 + 1) / p0 + 1e-9 && got >= p1 / (p0 + 1) - 0.01 - 1e-9);
        assert_true(cJSON_GetObjectItem(e, "cpu_time")->valuedouble > 0);
    }
    cJSON_Delete(j);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s train-lm --bench --precision f16", cli);
    kvp_test_expect_error(cmd, "--precision");
    snprintf(cmd, sizeof(cmd), "%s train-lm --bench --bench-ctx 64,x", cli);
    kvp_test_expect_error(cmd, "--bench-ctx");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_fused_attention),
        cmocka_unit_test(test_xent_fast),
        cmocka_unit_test(test_model_bf16_matches_f32),
        cmocka_unit_test(test_model_bf16_threads_agree),
        cmocka_unit_test(test_cli_bench),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
