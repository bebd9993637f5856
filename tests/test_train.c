/*
 * Tests of the trainer (src/train): finite-difference gradient checks of every op's backward
 * pass and of the whole model, AdamW against hand-computed updates, the schedule and clipping,
 * BPE learning and the SPM encoder, task generation, checkpoint resume bit for bit, GGUF export,
 * and a short training run whose loss must fall.
 *
 * Gradient checks perturb float inputs by ±h, ±2h and compare the five-point derivative with the
 * analytic gradient, where L = Σ y·r for a fixed random r (so dL/dy = r), accumulated in double.
 * Tolerances are |num − ana| ≤ atol + rtol·max(|num|, |ana|); gradcheck_detects_errors shows
 * the check fails on a gradient that is 5 % off.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvpred.h"
#include "tokenizer/vocab.h"
#include "train/train.h"

/* The trainer's vocabulary as the corpus's sentence counter (a compound literal: lives in the
 * enclosing block) */
#define TOK(v) (&(struct kvp_task_tok){.encode = kvp_tvocab_task_tok(v).encode, .ud = (v)})

/* ===================================== helpers ================================================ */

typedef double (*loss_fn)(void *ctx);

/* Number of mismatches between numeric and analytic gradients over (a stride of) x.
 *
 * The tolerances (atol + rtol·max|gradient|, given per call) are empirical, and this is why: the
 * five-point difference is off by its truncation error, h⁴/30·|f⁽⁵⁾| somewhere in [x - 2h,
 * x + 2h], and by the loss's f32 rounding amplified by the stencil, (1 + 8 + 8 + 1)/12 · ε_L / h
 * = 1.5·ε_L/h. The second is small and known (ε_L about u·|L| per few operations: with |L| of
 * order 1 and h = 1e-2, about 1e-5), but the first has no closed form for these functions (the
 * fifth derivative of a softmax or a normalisation of random data). So the tolerances are 1 % of
 * the gradient plus 1e-4 (2 % and 2e-4 through attention's softmax, whose higher derivatives are
 * larger), ten times the rounding part, and they are shown to catch what they guard against: a
 * wrong gradient (a dropped term, a wrong sign or factor) misses by far more, as the planted
 * wrong gradient in test_grad_rmsnorm shows. */
static int gradcheck(const char *what, loss_fn f, void *ctx, float *x, const float *g, size_t n,
                     size_t max_checks, float h, double rtol, double atol)
{
    size_t stride = n > max_checks ? n / max_checks : 1;
    int bad = 0;
    for (size_t i = 0; i < n; i += stride) {
        /* five-point stencil: truncation error O(h⁴), so h can stay well above float noise */
        float old = x[i];
        double l[4];
        const int k[4] = {-2, -1, 1, 2};
        for (int j = 0; j < 4; j++) {
            x[i] = old + (float)k[j] * h;
            l[j] = f(ctx);
        }
        x[i] = old;
        double num = (l[0] - 8.0 * l[1] + 8.0 * l[2] - l[3]) / (12.0 * (double)h);
        double ana = g[i];
        if (fabs(num - ana) > atol + rtol * fmax(fabs(num), fabs(ana))) {
            if (bad < 5)
                print_message("  %s[%zu]: numeric %.6g analytic %.6g\n", what, i, num, ana);
            bad++;
        }
    }
    return bad;
}

static void fill_uniform(float *x, size_t n, struct kvp_rng *r, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * kvp_rng_uniform(r);
}

static double dotd(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* ====================================== RMSNorm =============================================== */

struct norm_t {
    float x[3 * 8], w[8], y[3 * 8], rstd[3], r[3 * 8];
};

static double norm_loss(void *p)
{
    struct norm_t *t = p;
    kvp_op_rmsnorm_fwd(t->y, t->rstd, t->x, t->w, 3, 8, 1e-5f);
    return dotd(t->y, t->r, 24);
}

static void test_grad_rmsnorm(void **state)
{
    (void)state;
    struct norm_t t;
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 1);
    fill_uniform(t.x, 24, &rng, -1, 1);
    fill_uniform(t.w, 8, &rng, 0.5f, 1.5f);
    fill_uniform(t.r, 24, &rng, -1, 1);
    float dx[24] = {0}, dw[8] = {0};
    norm_loss(&t);
    kvp_op_rmsnorm_bwd(dx, dw, t.r, t.x, t.w, t.rstd, 3, 8);
    assert_int_equal(gradcheck("rmsnorm.dx", norm_loss, &t, t.x, dx, 24, 24, 1e-2f, 1e-2, 1e-4), 0);
    assert_int_equal(gradcheck("rmsnorm.dw", norm_loss, &t, t.w, dw, 8, 8, 1e-2f, 1e-2, 1e-4), 0);
}

static void test_gradcheck_detects_errors(void **state)
{
    (void)state;
    struct norm_t t;
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 2);
    fill_uniform(t.x, 24, &rng, -1, 1);
    fill_uniform(t.w, 8, &rng, 0.5f, 1.5f);
    fill_uniform(t.r, 24, &rng, -1, 1);
    float dx[24] = {0}, dw[8] = {0};
    norm_loss(&t);
    kvp_op_rmsnorm_bwd(dx, dw, t.r, t.x, t.w, t.rstd, 3, 8);
    for (int i = 0; i < 8; i++)
        dw[i] *= 1.05f; /* a 5 % error must be caught */
    assert_true(gradcheck("rmsnorm.dw(wrong)", norm_loss, &t, t.w, dw, 8, 8, 1e-2f, 1e-2, 1e-4) > 0);
}

/* ======================================= linear =============================================== */

struct lin_t {
    float x[4 * 5], w[3 * 5], y[4 * 3], r[4 * 3];
};

static double lin_loss(void *p)
{
    struct lin_t *t = p;
    kvp_op_linear_fwd(t->y, t->x, t->w, 4, 5, 3, 0.0f);
    return dotd(t->y, t->r, 12);
}

static void test_grad_linear(void **state)
{
    (void)state;
    struct lin_t t;
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 3);
    fill_uniform(t.x, 20, &rng, -1, 1);
    fill_uniform(t.w, 15, &rng, -1, 1);
    fill_uniform(t.r, 12, &rng, -1, 1);
    float dx[20], dw[15] = {0};
    fill_uniform(dx, 20, &rng, -1, 1); /* beta 0 must overwrite */
    kvp_op_linear_bwd(dx, dw, t.r, t.x, t.w, 4, 5, 3, 0.0f);
    assert_int_equal(gradcheck("linear.dx", lin_loss, &t, t.x, dx, 20, 20, 1e-2f, 1e-2, 1e-4), 0);
    assert_int_equal(gradcheck("linear.dw", lin_loss, &t, t.w, dw, 15, 15, 1e-2f, 1e-2, 1e-4), 0);
}

/* ======================================== RoPE ================================================ */

#define RP_SEQ 2
#define RP_T 5
#define RP_H 2
#define RP_HD 6
#define RP_N (RP_SEQ * RP_T * RP_H * RP_HD)

struct rope_t {
    float x[RP_N], y[RP_N], r[RP_N], cosv[RP_T * RP_HD / 2], sinv[RP_T * RP_HD / 2];
};

static double rope_loss(void *p)
{
    struct rope_t *t = p;
    memcpy(t->y, t->x, sizeof(t->y));
    kvp_op_rope(t->y, t->cosv, t->sinv, RP_SEQ, RP_T, RP_H, RP_HD, false);
    return dotd(t->y, t->r, RP_N);
}

static void test_grad_rope(void **state)
{
    (void)state;
    struct rope_t t;
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 4);
    fill_uniform(t.x, RP_N, &rng, -1, 1);
    fill_uniform(t.r, RP_N, &rng, -1, 1);
    kvp_op_rope_table(t.cosv, t.sinv, RP_T, RP_HD, 10000.0f);
    /* adjacent pairs: position 3, pair 1 of head 1 in sequence 0, against the formula */
    float v[RP_N];
    memcpy(v, t.x, sizeof(v));
    kvp_op_rope(v, t.cosv, t.sinv, RP_SEQ, RP_T, RP_H, RP_HD, false);
    size_t o = (size_t)(3 * RP_H + 1) * RP_HD + 2;
    double th = 3.0 * pow(10000.0, -2.0 * 1 / RP_HD);
    /* cos and sin rounded to f32 (u each), two products and a sum (gamma(2)): gamma(3) of the
     * terms' magnitude */
    double mag = fabs(t.x[o]) + fabs(t.x[o + 1]);
    assert_float_equal(v[o], t.x[o] * cos(th) - t.x[o + 1] * sin(th), kvp_test_gamma(3) * mag);
    assert_float_equal(v[o + 1], t.x[o] * sin(th) + t.x[o + 1] * cos(th),
                       kvp_test_gamma(3) * mag);
    float dx[RP_N];
    memcpy(dx, t.r, sizeof(dx));
    kvp_op_rope(dx, t.cosv, t.sinv, RP_SEQ, RP_T, RP_H, RP_HD, true);
    assert_int_equal(gradcheck("rope.dx", rope_loss, &t, t.x, dx, RP_N, RP_N, 1e-2f, 1e-2, 1e-4), 0);
}

/* ===================================== attention ============================================== */

/* T spans two query blocks (128 rows each) so block boundaries are covered. */
#define AT_T 133
#define AT_HD 4
#define AT_REP 2
#define AT_LDQ (AT_REP * AT_HD + 3) /* strided rows, as inside the model */
#define AT_LDKV (AT_HD + 2)

struct attn_t {
    float q[AT_T * AT_LDQ], k[AT_T * AT_LDKV], v[AT_T * AT_LDKV];
    float out[AT_T * AT_LDQ], r[AT_T * AT_LDQ], lse[AT_REP * AT_T];
    float *scratch;
};

static double attn_loss(void *p)
{
    struct attn_t *t = p;
    memset(t->out, 0, sizeof(t->out));
    kvp_op_attn_fwd(t->out, t->lse, t->q, t->k, t->v, AT_T, AT_HD, AT_REP, AT_LDQ, AT_LDKV,
                    t->scratch);
    return dotd(t->out, t->r, AT_T * AT_LDQ);
}

/* Naive reference: out[i] = Σ_{j≤i} softmax_j(q_i·k_j/√hd) v_j, in double. */
/* The attention in double, and in bound how far an f32 evaluation may be from it: each score
 * within gamma(hd + 2)·Σ|q·k|/sqrt(hd) (the dot, the scaling), so every softmax weight within a
 * factor e^±(2·max score error) of its value (the max cancels), times the exp's own error (8u,
 * covering libm's and a polynomial's), the sum's gamma(i + 1) and the scaling's 2u; the value sum
 * adds gamma(i + 1)·Σ p·|v|. */
static void attn_naive(const struct attn_t *t, double *out, double *bound)
{
    const double u = 0x1p-24;
    for (int r = 0; r < AT_REP; r++)
        for (int i = 0; i < AT_T; i++) {
            double s[AT_T], mx = -1e300, z = 0.0, es = 0.0;
            for (int j = 0; j <= i; j++) {
                double d = 0.0, mag = 0.0;
                for (int e = 0; e < AT_HD; e++) {
                    double pr = (double)t->q[i * AT_LDQ + r * AT_HD + e] * t->k[j * AT_LDKV + e];
                    d += pr;
                    mag += fabs(pr);
                }
                s[j] = d / sqrt((double)AT_HD);
                es = fmax(es, kvp_test_gamma(AT_HD + 2) * mag / sqrt((double)AT_HD));
                mx = s[j] > mx ? s[j] : mx;
            }
            double esub = 0; /* the rounding of s - max */
            for (int j = 0; j <= i; j++) {
                z += exp(s[j] - mx);
                esub = fmax(esub, u * (mx - s[j]));
            }
            es += esub;
            double rel = exp(2 * es) * (1 + 8 * u) * (1 + kvp_test_gamma(i + 1)) * (1 + 2 * u) /
                             (1 - kvp_test_gamma(i + 1)) -
                         1;
            for (int e = 0; e < AT_HD; e++) {
                double acc = 0.0, mag = 0.0;
                for (int j = 0; j <= i; j++) {
                    double pv = exp(s[j] - mx) / z * t->v[j * AT_LDKV + e];
                    acc += pv;
                    mag += fabs(pv);
                }
                out[(i * AT_REP + r) * AT_HD + e] = acc;
                bound[(i * AT_REP + r) * AT_HD + e] =
                    (rel + kvp_test_gamma(i + 1) * (1 + rel)) * mag;
            }
        }
}

static void test_grad_attention(void **state)
{
    (void)state;
    struct attn_t *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    t->scratch = malloc(kvp_op_attn_scratch(AT_T) * sizeof(float));
    assert_non_null(t->scratch);
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 5);
    fill_uniform(t->q, AT_T * AT_LDQ, &rng, -1.5f, 1.5f);
    fill_uniform(t->k, AT_T * AT_LDKV, &rng, -1.5f, 1.5f);
    fill_uniform(t->v, AT_T * AT_LDKV, &rng, -1, 1);
    fill_uniform(t->r, AT_T * AT_LDQ, &rng, -1, 1);
    attn_loss(t);
    double *ref = malloc(sizeof(double) * AT_T * AT_REP * AT_HD);
    double *bnd = malloc(sizeof(double) * AT_T * AT_REP * AT_HD);
    assert_true(ref && bnd);
    attn_naive(t, ref, bnd);
    double worst = 0;
    for (int i = 0; i < AT_T; i++)
        for (int r = 0; r < AT_REP; r++)
            for (int e = 0; e < AT_HD; e++) {
                size_t o = (size_t)(i * AT_REP + r) * AT_HD + e;
                double d = fabs(t->out[i * AT_LDQ + r * AT_HD + e] - ref[o]);
                worst = fmax(worst, d / bnd[o]);
                assert_true(d <= bnd[o]);
            }
    print_message("  attention vs float64: at most %.3g of the bound\n", worst);
    free(ref);
    free(bnd);
    float *dq = calloc(AT_T * AT_LDQ, sizeof(float));
    float *dk = calloc(AT_T * AT_LDKV, sizeof(float));
    float *dv = calloc(AT_T * AT_LDKV, sizeof(float));
    kvp_op_attn_bwd(dq, dk, dv, t->r, t->out, t->lse, t->q, t->k, t->v, AT_T, AT_HD, AT_REP,
                    AT_LDQ, AT_LDKV, t->scratch);
    /* only the used columns of the strided rows carry gradient; check those */
    int bad = 0;
    for (int i = 0; i < AT_T; i += 3) {
        bad += gradcheck("attn.dq", attn_loss, t, t->q + i * AT_LDQ, dq + i * AT_LDQ,
                         AT_REP * AT_HD, 8, 1e-2f, 2e-2, 2e-4);
        bad += gradcheck("attn.dk", attn_loss, t, t->k + i * AT_LDKV, dk + i * AT_LDKV, AT_HD, 4,
                         1e-2f, 2e-2, 2e-4);
        bad += gradcheck("attn.dv", attn_loss, t, t->v + i * AT_LDKV, dv + i * AT_LDKV, AT_HD, 4,
                         1e-2f, 2e-2, 2e-4);
    }
    assert_int_equal(bad, 0);
    free(dq);
    free(dk);
    free(dv);
    free(t->scratch);
    free(t);
}

/* ======================================= SwiGLU =============================================== */

struct glu_t {
    float g[20], u[20], a[20], r[20];
};

static double glu_loss(void *p)
{
    struct glu_t *t = p;
    kvp_op_swiglu_fwd(t->a, t->g, t->u, 20);
    return dotd(t->a, t->r, 20);
}

static void test_grad_swiglu(void **state)
{
    (void)state;
    struct glu_t t;
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 6);
    fill_uniform(t.g, 20, &rng, -4, 4);
    fill_uniform(t.u, 20, &rng, -2, 2);
    fill_uniform(t.r, 20, &rng, -1, 1);
    float dg[20], du[20];
    kvp_op_swiglu_bwd(dg, du, t.r, t.g, t.u, 20);
    assert_int_equal(gradcheck("swiglu.dg", glu_loss, &t, t.g, dg, 20, 20, 1e-2f, 1e-2, 1e-4), 0);
    assert_int_equal(gradcheck("swiglu.du", glu_loss, &t, t.u, du, 20, 20, 1e-2f, 1e-2, 1e-4), 0);
}

/* =================================== cross-entropy ============================================ */

struct xent_t {
    float logits[4 * 7], work[4 * 7], w[4];
    int32_t tgt[4];
};

static double xent_loss(void *p)
{
    struct xent_t *t = p;
    memcpy(t->work, t->logits, sizeof(t->work));
    return kvp_op_xent(t->work, t->tgt, t->w, 4, 7, 0.5f, NULL) * 0.5;
}

static void test_grad_xent(void **state)
{
    (void)state;
    struct xent_t t = {.w = {1.0f, 0.0f, 3.0f, 0.5f}, .tgt = {2, 0, 6, 3}};
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 7);
    fill_uniform(t.logits, 28, &rng, -3, 3);
    float nll[4];
    memcpy(t.work, t.logits, sizeof(t.work));
    double total = kvp_op_xent(t.work, t.tgt, t.w, 4, 7, 0.5f, nll);
    /* row 0 by hand */
    double z = 0.0;
    for (int j = 0; j < 7; j++)
        z += exp(t.logits[j]);
    /* log-sum-exp in f32: seven exps (8u each, covering libm's and a polynomial's) summed
     * (gamma(7)), relative, which the log makes absolute, then the log, the max added back and
     * the target subtracted round once each on values up to |lse| + |logit| */
    double lse = log(z), u = 0x1p-24;
    assert_float_equal(nll[0], lse - t.logits[2],
                       8 * u + kvp_test_gamma(7) + 3 * u * (fabs(lse) + fabs(t.logits[2])));
    /* the weighted sum of the f32 losses: gamma(4) of its terms */
    assert_float_equal(total, nll[0] + 3.0 * nll[2] + 0.5 * nll[3],
                       kvp_test_gamma(4) * (fabs(nll[0]) + 3.0 * fabs(nll[2]) +
                                            0.5 * fabs(nll[3])));
    float g[28];
    memcpy(g, t.work, sizeof(g));
    assert_int_equal(gradcheck("xent.dlogits", xent_loss, &t, t.logits, g, 28, 28, 1e-2f, 1e-2, 1e-4), 0);
}

/* ===================================== embedding ============================================== */

struct emb_t {
    float e[6 * 3], y[5 * 3], r[5 * 3];
    int32_t tok[5];
};

static double emb_loss(void *p)
{
    struct emb_t *t = p;
    kvp_op_embed_fwd(t->y, t->e, t->tok, 5, 3);
    return dotd(t->y, t->r, 15);
}

static void test_grad_embedding(void **state)
{
    (void)state;
    struct emb_t t = {.tok = {4, 1, 4, 0, 5}};
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 8);
    fill_uniform(t.e, 18, &rng, -1, 1);
    fill_uniform(t.r, 15, &rng, -1, 1);
    float de[18] = {0};
    kvp_op_embed_bwd(de, t.r, t.tok, 5, 3);
    assert_int_equal(gradcheck("embed.dE", emb_loss, &t, t.e, de, 18, 18, 1e-2f, 1e-2, 1e-4), 0);
    for (int j = 0; j < 3; j++)
        assert_float_equal(de[2 * 3 + j], 0.0f, 0.0); /* token 2 unused */
}

/* ==================================== whole model ============================================= */

struct model_t {
    struct kvp_train_model *m;
    int32_t tok[2 * 6], tgt[2 * 6];
    float w[2 * 6];
    double wsum;
};

static double model_loss(void *p)
{
    struct model_t *t = p;
    assert_int_equal(kvp_train_model_forward(t->m, t->tok, 2, 6, NULL), 0);
    return kvp_train_model_loss(t->m, t->tgt, t->w, t->wsum, NULL) / t->wsum;
}

static void check_model_grad(int tied, int n_threads)
{
    struct kvp_train_config cfg = {.n_vocab = 261, .n_embd = 8, .n_layer = 2, .n_head = 2,
                                   .n_head_kv = 1, .n_ff = 12, .n_ctx = 6, .rope_base = 100.0f,
                                   .norm_eps = 1e-5f, .tied = tied};
    struct model_t t;
    struct kvp_err err;
    assert_int_equal(kvp_train_model_init(&t.m, &cfg, 12, n_threads, 42, &err), 0);
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 9);
    /* matrices 8× the 0.02 init so every gradient is well above float noise; norms near 1 */
    for (int i = 0; i < t.m->n_tensors; i++) {
        const struct kvp_train_tensor *ts = &t.m->tensors[i];
        float *p = t.m->params + ts->off;
        for (int64_t j = 0; j < ts->ne[0] * ts->ne[1]; j++)
            p[j] = ts->n_dims == 1 ? 1.0f + 0.2f * kvp_rng_normal(&rng) : p[j] * 8.0f;
    }
    for (int i = 0; i < 12; i++) {
        t.tok[i] = (int32_t)kvp_rng_below(&rng, 6) * 50 + 3;
        t.tgt[i] = (int32_t)kvp_rng_below(&rng, 6) * 50 + 5;
        t.w[i] = i % 5 == 4 ? 0.0f : 1.0f + (float)(i % 3);
    }
    t.wsum = 0.0;
    for (int i = 0; i < 12; i++)
        t.wsum += t.w[i];
    kvp_train_model_zero_grad(t.m);
    model_loss(&t);
    kvp_train_model_backward(t.m);
    float *g = malloc(t.m->n_params * sizeof(float));
    memcpy(g, t.m->grads, t.m->n_params * sizeof(float));
    int bad = 0;
    for (int i = 0; i < t.m->n_tensors; i++) {
        const struct kvp_train_tensor *ts = &t.m->tensors[i];
        size_t n = (size_t)ts->ne[0] * (size_t)ts->ne[1];
        size_t off = ts->off;
        if (!strcmp(ts->name, "token_embd.weight") || !strcmp(ts->name, "output.weight")) {
            /* rows of the used tokens (inputs 3+50k, targets 5+50k) and a few others */
            for (int row = 3; row < 261; row += 1)
                if ((row - 3) % 50 == 0 || (row - 5) % 50 == 0 || row == 100)
                    bad += gradcheck(ts->name, model_loss, &t, t.m->params + off + (size_t)row * 8,
                                     g + off + (size_t)row * 8, 8, 8, 4e-3f, 2e-2, 3e-4);
            continue;
        }
        bad += gradcheck(ts->name, model_loss, &t, t.m->params + off, g + off, n, 24, 4e-3f, 2e-2,
                         3e-4);
    }
    assert_int_equal(bad, 0);
    free(g);
    kvp_train_model_free(t.m);
}

static void test_grad_model_tied(void **state)
{
    (void)state;
    check_model_grad(1, 1);
}

static void test_grad_model_untied_threads(void **state)
{
    (void)state;
    check_model_grad(0, 2);
}

/* ===================================== optimiser ============================================== */

static void test_adamw(void **state)
{
    (void)state;
    struct kvp_adamw a;
    assert_int_equal(kvp_adamw_init(&a, 2, 0.9f, 0.999f, 1e-8f, 0.1f, NULL), 0);
    float p[2] = {1.0f, -2.0f};
    float g1[2] = {0.5f, 0.0f}, g2[2] = {-0.25f, 1.0f};
    kvp_adamw_step_raw(&a, p, g1, 2, 0.1f, true);
    /* t=1: m = 0.05, v = 0.00025, m̂ = 0.5, v̂ = 0.25 → step 1 (+ decay 0.1·1). A step is at
     * most 16 f32 operations (moments, bias corrections, sqrt, quotient, decay, update) on
     * values of at most 1 + |p|, rounding u each: 16u·(1 + |p|), ADAM_TOL */
#define ADAM_TOL(p) (16 * 0x1p-24 * (1 + fabs(p)))
    double e = 1.0 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.1 * 1.0);
    assert_float_equal(p[0], e, ADAM_TOL(e));
    e = -2.0 - 0.1 * (0.0 + 0.1 * -2.0);
    assert_float_equal(p[1], e, ADAM_TOL(e)); /* decay only */
    double p0 = p[0], p1 = p[1];
    kvp_adamw_step_raw(&a, p, g2, 2, 0.1f, true);
    /* t=2 by hand */
    double m0 = 0.9 * 0.05 + 0.1 * -0.25, v0 = 0.999 * 0.00025 + 0.001 * 0.0625;
    double m1 = 0.1 * 1.0, v1 = 0.001 * 1.0;
    double c1 = 1 - 0.81, c2 = 1 - 0.999 * 0.999;
    double e0 = p0 - 0.1 * ((m0 / c1) / (sqrt(v0 / c2) + 1e-8) + 0.1 * p0);
    double e1 = p1 - 0.1 * ((m1 / c1) / (sqrt(v1 / c2) + 1e-8) + 0.1 * p1);
    /* from the f32 results of the first step (p0, p1): one more step's error */
    assert_float_equal(p[0], e0, ADAM_TOL(e0));
    assert_float_equal(p[1], e1, ADAM_TOL(e1));
#undef ADAM_TOL
    kvp_adamw_free(&a);
}

static void test_schedule_and_clip(void **state)
{
    (void)state;
    /* at most four f32 roundings (the inputs 0.1f and 1.0f, a difference, a product, a sum)
     * on values up to 1, each u: 4u; step 9 of a 10-step warmup is 1·10/10, exact */
    const double u = 0x1p-24;
    assert_float_equal(kvp_lr_schedule(0, 10, 100, 1.0f, 0.1f), 0.1, 4 * u);
    assert_true(kvp_lr_schedule(9, 10, 100, 1.0f, 0.1f) == 1.0f);
    assert_float_equal(kvp_lr_schedule(10, 10, 100, 1.0f, 0.1f), 1.0, 4 * u);
    assert_float_equal(kvp_lr_schedule(55, 10, 100, 1.0f, 0.1f), 0.55, 4 * u);
    assert_float_equal(kvp_lr_schedule(100, 10, 100, 1.0f, 0.1f), 0.1, 4 * u);
    /* the norm is a double sum of exact squares, sqrt(25) = 5 exactly; the scale 1/5 rounds to
     * f32 (u) and each product once more (u): 2u of the result; the norm of the clipped
     * vector, in double, then within that of 1, and a vector under the limit is not touched */
    float g[2] = {3.0f, 4.0f};
    assert_true(kvp_clip_grad(g, 2, 1.0) == 5.0);
    assert_float_equal(g[0], 0.6, 2 * u * 0.6);
    assert_float_equal(g[1], 0.8, 2 * u * 0.8);
    float g0 = g[0];
    assert_float_equal(kvp_clip_grad(g, 2, 10.0), 1.0, 2 * u);
    assert_true(g[0] == g0);
}

static void test_rng(void **state)
{
    (void)state;
    struct kvp_rng a, b;
    kvp_rng_seed(&a, 123);
    kvp_rng_seed(&b, 123);
    for (int i = 0; i < 100; i++)
        assert_true(kvp_rng_next(&a) == kvp_rng_next(&b));
    double s = 0.0, ss = 0.0;
    for (int i = 0; i < 20000; i++) {
        float x = kvp_rng_normal(&a);
        s += x;
        ss += (double)x * x;
        assert_true(kvp_rng_below(&a, 7) < 7);
    }
    assert_true(fabs(s / 20000) < 0.05 && fabs(ss / 20000 - 1.0) < 0.05);
}

/* ===================================== tokenizer ============================================== */

static void test_bpe_learn_and_encode(void **state)
{
    (void)state;
    const char *unit = "the lower the lowest the newer the newest low low 123 123 4567\n";
    size_t ul = strlen(unit);
    char *text = malloc(ul * 50 + 1);
    for (int i = 0; i < 50; i++)
        memcpy(text + i * ul, unit, ul);
    text[ul * 50] = 0;
    struct kvp_tvocab *v;
    struct kvp_err err;
    assert_int_equal(kvp_tvocab_learn(text, ul * 50, 280, &v, &err), 0);
    assert_true(v->n > 262 && v->n <= 280);
    assert_string_equal(v->text[0], "<unk>");
    assert_string_equal(v->text[1], "<s>");
    assert_string_equal(v->text[2], "</s>");
    assert_string_equal(v->text[3], "<0x00>");
    assert_string_equal(v->text[258], "<0xFF>");
    assert_int_equal(v->type[3 + 0x41], 6);
    assert_string_equal(v->text[259], "\xE2\x96\x81");
    int the = kvp_tvocab_find(v, "\xE2\x96\x81the", 6);
    int low = kvp_tvocab_find(v, "\xE2\x96\x81low", 6);
    assert_true(the > 259 && low > 259);
    for (int i = 0; i < v->n; i++) {
        bool digit = false, inner_space = false;
        for (size_t j = 0; j < v->len[i]; j++) {
            digit |= v->type[i] == 1 && v->text[i][j] >= '0' && v->text[i][j] <= '9';
            inner_space |= j > 0 && j + 3 <= v->len[i] && !memcmp(v->text[i] + j, "\xE2\x96\x81", 3);
        }
        assert_false(digit);
        assert_false(inner_space);
        if (i > 259)
            assert_true(v->score[i] < v->score[i - 1] || i == 260); /* −rank */
    }
    int32_t ids[64];
    size_t n;
    assert_int_equal(kvp_tvocab_encode(v, "the lowest 42", 13, true, ids, 64, &n, &err), 0);
    /* ▁the ▁lowest (merged) ▁ 4 2 */
    assert_int_equal(ids[0], the);
    assert_int_equal(ids[n - 1], 3 + '2');
    assert_int_equal(ids[n - 2], 3 + '4');
    assert_int_equal(ids[n - 3], 259);
    assert_true(n <= 5);
    char buf[64];
    kvp_tvocab_decode(v, ids, n, buf, sizeof(buf));
    assert_string_equal(buf, " the lowest 42");
    /* newline and unknown characters fall back to bytes */
    assert_int_equal(kvp_tvocab_encode(v, "\n\xC3\xA9", 3, false, ids, 64, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 3 + 0x0A);
    assert_int_equal(ids[1], 3 + 0xC3);
    /* KVP_ERANGE with the full count */
    assert_int_equal(kvp_tvocab_encode(v, "the lowest 42", 13, true, ids, 2, &n, &err), KVP_ERANGE);
    assert_true(n > 2);
    kvp_tvocab_free(v);
    free(text);
}

/* The SPM rule "highest score first, ties to the left" on a hand-made vocabulary. */
static void test_spm_merge_order(void **state)
{
    (void)state;
    const char *texts[] = {"<unk>", "<s>", "</s>", "ab", "bc", "abc", "cd"};
    size_t lens[] = {5, 3, 4, 2, 2, 3, 2};
    float scores[] = {0, 0, 0, -2, -1, -3, -1};
    int32_t types[] = {2, 3, 3, 1, 1, 1, 1};
    struct kvp_tvocab *v;
    assert_int_equal(kvp_tvocab_create(7, texts, lens, scores, types, &v, NULL), 0);
    int32_t ids[16];
    size_t n;
    /* "abcd": bc (−1) and cd (−1) tie → bc (left) wins; then a+bc = abc (−3) merges; d alone */
    assert_int_equal(kvp_tvocab_encode(v, "abcd", 4, false, ids, 16, &n, NULL), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], KVP_TVOCAB_BYTE0 + 'd');
    kvp_tvocab_free(v);
}


/* ===================================== corpus fixture ========================================= */

/* A deterministic synthetic story text of about n bytes (no ../shared needed). */
static char *make_text(size_t n, uint64_t seed, size_t *len)
{
    static const char *const names[] = {"Tom", "Lily", "Ben", "Sue", "Max", "Anna"};
    static const char *const verbs[] = {"saw", "liked", "found", "wanted", "made", "took"};
    static const char *const adjs[] = {"big", "red", "small", "happy", "shiny", "old"};
    static const char *const nouns[] = {"dog", "ball", "tree", "cake", "boat", "house", "bird"};
    struct kvp_rng r;
    kvp_rng_seed(&r, seed);
    char *t = malloc(n + 256);
    size_t k = 0;
    while (k < n) {
        k += (size_t)sprintf(t + k, "%s %s a %s %s. ", names[kvp_rng_below(&r, 6)],
                             verbs[kvp_rng_below(&r, 6)], adjs[kvp_rng_below(&r, 6)],
                             nouns[kvp_rng_below(&r, 7)]);
        if (kvp_rng_below(&r, 8) == 0)
            k += (size_t)sprintf(t + k, "\n\n");
    }
    t[k] = 0;
    *len = k;
    return t;
}

struct fixture {
    char *text;
    size_t len;
    struct kvp_tvocab *v;
    struct kvp_task_tok tok; /* v as the task generator's tokenizer */
    struct kvp_corpus *c;
};

static void fixture_init(struct fixture *f, int n_vocab)
{
    struct kvp_err err;
    f->text = make_text(60000, 11, &f->len);
    /* as the trainer does: learn from the text plus the task templates */
    struct kvp_corpus *c0;
    char *tmpl;
    size_t tlen;
    assert_int_equal(kvp_corpus_init(&c0, f->text, f->len, NULL, 0.1, &err), 0);
    assert_int_equal(kvp_task_template_text(c0, 10, 1, &tmpl, &tlen, &err), 0);
    assert_non_null(strstr(tmpl, "One of the special magic numbers for "));
    kvp_corpus_free(c0);
    char *all = malloc(f->len + tlen);
    memcpy(all, f->text, f->len);
    memcpy(all + f->len, tmpl, tlen);
    assert_int_equal(kvp_tvocab_learn(all, f->len + tlen, n_vocab, &f->v, &err), 0);
    free(all);
    free(tmpl);
    assert_int_equal(kvp_corpus_init(&f->c, f->text, f->len, TOK(f->v), 0.1, &err), 0);
    f->tok = kvp_tvocab_task_tok(f->v);
}

static void fixture_free(struct fixture *f)
{
    kvp_corpus_free(f->c);
    kvp_tvocab_free(f->v);
    free(f->text);
}

/* ======================================= data ================================================= */

/* The train/eval seed contract: kvp_task_seed gives training seeds, kvp_task_eval_seed moves one
 * into the evaluation range, and kvp_sample_make refuses a seed of the other range. */
static void test_seed_contract(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f, 320);
    struct kvp_task_mix mix;
    kvp_task_mix_default(&mix);
    struct kvp_sample a;
    struct kvp_err err;
    assert_int_equal(kvp_sample_alloc(&a, 256, &err), 0);
    for (uint64_t i = 0; i < 64; i++) {
        uint64_t s = kvp_task_seed(7, i), e = kvp_task_eval_seed(s);
        assert_true((s & (3ULL << 62)) == 0 && e == (s | KVP_EVAL_SEED_BIT));
        assert_true(kvp_task_seed_ok(s, false) && !kvp_task_seed_ok(s, true));
        assert_true(kvp_task_seed_ok(e, true) && !kvp_task_seed_ok(e, false));
    }
    uint64_t s = kvp_task_seed(7, 1);
    assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, -1, s, false, 1.0f, &err), 0);
    assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, -1, kvp_task_eval_seed(s), true, 1.0f,
                                     &err),
                     0);
    assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, -1, s, true, 1.0f, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "evaluation range"));
    assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, -1, kvp_task_eval_seed(s), false, 1.0f,
                                     &err),
                     KVP_EINVAL);
    assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, -1, s | (1ULL << 63), false, 1.0f, &err),
                     KVP_EINVAL);
    kvp_sample_free(&a);
    fixture_free(&f);
}

static void test_corpus_and_samples(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f, 320);
    assert_true(f.c->n_sent > 1000);
    assert_true(f.c->n_train < f.c->n_sent);
    assert_true(f.c->n_words >= 16);
    /* sentences are split after the period and carry no surrounding space */
    const char *s0 = f.c->text + f.c->sent_off[0];
    size_t l0 = f.c->sent_off[1] - 1 - f.c->sent_off[0];
    assert_true(s0[0] != ' ' && s0[l0 - 1] == '.');
    struct kvp_task_mix mix;
    kvp_task_mix_default(&mix);
    struct kvp_sample a, b;
    struct kvp_err err;
    assert_int_equal(kvp_sample_alloc(&a, 1024, &err), 0);
    assert_int_equal(kvp_sample_alloc(&b, 1024, &err), 0);
    for (int task = 1; task < KVP_TASK_COPY; task++) {
        assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, task, 1000 + task, false, 4.0f, &err), 0);
        assert_int_equal(a.task, task);
        assert_int_equal(a.tok[0], 1); /* BOS */
        assert_true(a.ans_end > a.ans_begin);
        /* the answer tokens are the separately encoded answer, followed by EOS */
        char buf[512];
        kvp_tvocab_decode(f.v, a.tok + a.ans_begin + 1, (size_t)(a.ans_end - a.ans_begin), buf,
                          sizeof(buf));
        char *prompt, *answer;
        assert_int_equal(kvp_task_render(f.c, &f.tok, task, 1000 + task, false, 1000, &prompt, &answer,
                                         &err), 0);
        assert_string_equal(buf, answer); /* same seed, same task instance */
        assert_int_equal(a.tok[a.ans_end + 1], 2); /* EOS */
        assert_float_equal(a.weight[a.ans_begin], 4.0, 0.0);
        assert_float_equal(a.weight[a.ans_end], 4.0, 0.0);
        assert_float_equal(a.weight[a.ans_begin - 1], 1.0, 0.0);
        for (int i = 0; i <= 1024; i++)
            assert_true(a.tok[i] >= 0 && a.tok[i] < f.v->n);
        /* deterministic */
        assert_int_equal(kvp_sample_make(&b, f.c, &f.tok, &mix, task, 1000 + task, false, 4.0f, &err), 0);
        assert_memory_equal(a.tok, b.tok, sizeof(int32_t) * 1025);
        free(prompt);
        free(answer);
    }
    /* the copy task: the answer is the list again, right after the newline */
    assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, KVP_TASK_COPY, 3, false, 4.0f, &err), 0);
    assert_true(a.ans_end - a.ans_begin >= 1024 / 16 - 8);
    assert_float_equal(a.weight[a.ans_begin + 1], 4.0, 0.0); /* repeats weigh like answers */
    assert_int_equal(a.tok[a.ans_begin], KVP_TVOCAB_BYTE0 + '\n');
    assert_true(a.tok[a.ans_end + 1] == 2 || a.tok[a.ans_end + 1] == KVP_TVOCAB_BYTE0 + '\n');
    {
        char l1[4096], l2[4096];
        kvp_tvocab_decode(f.v, a.tok + 1, (size_t)(a.ans_begin - 1), l1, sizeof(l1));
        kvp_tvocab_decode(f.v, a.tok + a.ans_begin + 1, (size_t)(a.ans_end - a.ans_begin), l2,
                          sizeof(l2));
        assert_string_equal(l1 + 1, l2); /* l1 has the space prefix */
    }
    /* fill_min: a retrieval sample takes at least that share of the context; the default (0.5)
     * leaves some answers far from the end */
    {
        struct kvp_task_mix full = mix;
        full.fill_min = 0.95f;
        int short_default = 0;
        for (int i = 0; i < 24; i++) {
            int task = KVP_TASK_PASSKEY + i % 3;
            assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &full, task, 700 + i, false, 4.0f,
                                             &err), 0);
            assert_true(a.ans_end >= 870); /* 0.95 T less a haystack unit or two */
            assert_int_equal(kvp_sample_make(&b, f.c, &f.tok, &mix, task, 700 + i, false, 4.0f,
                                             &err), 0);
            short_default += b.ans_end < 870;
        }
        assert_true(short_default >= 6);
    }
    /* a passkey sample holds its key in the prompt and answers it */
    assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, KVP_TASK_PASSKEY, 5, false, 2.0f, &err), 0);
    char *text = malloc(8192);
    kvp_tvocab_decode(f.v, a.tok, (size_t)a.ans_end + 1, text, 8192);
    char ans[64];
    kvp_tvocab_decode(f.v, a.tok + a.ans_begin + 1, (size_t)(a.ans_end - a.ans_begin), ans, 64);
    char needle[96];
    snprintf(needle, sizeof(needle), "The pass key is%.*s. Remember it.", (int)strlen(ans) - 1, ans);
    assert_non_null(strstr(text, needle));
    assert_non_null(strstr(text, "What is the pass key? The pass key is"));
    free(text);
    kvp_sample_free(&a);
    kvp_sample_free(&b);
    fixture_free(&f);
}

/* A corpus of n sentences "<Word> i <marker> ..." whose marker is `train` for the first 90 % and
 * `held` for the rest, so a haystack shows which share it was read from. */
static struct kvp_corpus *marked_corpus(const char *word, const struct kvp_tvocab *v)
{
    size_t cap = 1 << 16, k = 0;
    char *t = malloc(cap);
    static const char *const w[] = {"apple", "brook", "cliff", "dune", "ember", "fjord",
                                    "grove", "heath", "inlet", "jetty", "knoll", "ledge",
                                    "marsh", "nook", "oasis", "pond", "quay", "ridge"};
    for (int i = 0; i < 400; i++)
        k += (size_t)snprintf(t + k, cap - k, "%s %d %s went by the %s and the %s today. ", word,
                              i, i < 360 ? "train" : "held", w[i % 18], w[(i * 7 + 3) % 18]);
    struct kvp_corpus *c;
    struct kvp_err err;
    assert_int_equal(kvp_corpus_init(&c, t, k, TOK(v), 0.1, &err), 0);
    free(t);
    assert_int_equal(c->n_sent - c->n_train, 40);
    return c;
}

/* Haystack kinds: with hay_frac 1 the passkey and niah samples draw their haystack among noise
 * lines, the corpus's own sentences and each extra corpus, every kind shows up, samples stay a
 * pure function of their seed, training samples read only training sentences and evaluation
 * samples only held-out ones; with hay_frac 0 the extra corpora change nothing. Needles land at
 * the edges of the haystack as often as edge_frac says. */
static void test_haystack_kinds(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f, 320);
    struct kvp_corpus *plain;
    struct kvp_err err;
    assert_int_equal(kvp_corpus_init(&plain, f.text, f.len, TOK(f.v), 0.1, &err), 0);
    assert_int_equal(kvp_corpus_add_hay(f.c, marked_corpus("Legal", f.v), &err), 0);
    assert_int_equal(kvp_corpus_add_hay(f.c, marked_corpus("Verse", f.v), &err), 0);
    struct kvp_task_mix mix;
    kvp_task_mix_default(&mix);
    struct kvp_sample a, b;
    assert_int_equal(kvp_sample_alloc(&a, 1024, &err), 0);
    assert_int_equal(kvp_sample_alloc(&b, 1024, &err), 0);
    char *text = malloc(16384);
    /* hay_frac 0: bit for bit the samples of a corpus without extra haystacks */
    for (int task = 1; task < KVP_TASK_COUNT; task++) {
        assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, task, 50 + task, false, 4.0f, &err), 0);
        assert_int_equal(kvp_sample_make(&b, plain, &f.tok, &mix, task, 50 + task, false, 4.0f, &err), 0);
        assert_memory_equal(a.tok, b.tok, sizeof(int32_t) * 1025);
    }
    mix.hay_frac = 1.0f;
    mix.edge_frac = 1.0f;
    int seen[4] = {0}, edge0 = 0, edge1 = 0;
    for (int i = 0; i < 64; i++) {
        int task = i % 2 ? KVP_TASK_PASSKEY : KVP_TASK_NIAH_SINGLE_2;
        for (int ev = 0; ev < 2; ev++) {
            uint64_t seed = (900 + (uint64_t)i) | (ev ? KVP_EVAL_SEED_BIT : 0);
            assert_int_equal(kvp_sample_make(&a, f.c, &f.tok, &mix, task, seed, ev, 4.0f, &err), 0);
            assert_int_equal(kvp_sample_make(&b, f.c, &f.tok, &mix, task, seed, ev, 4.0f, &err), 0);
            assert_memory_equal(a.tok, b.tok, sizeof(int32_t) * 1025);
            assert_int_equal(a.task, task);
            kvp_tvocab_decode(f.v, a.tok, (size_t)a.ans_begin + 1, text, 16384);
            bool noise = strstr(text, "The grass is green.") != NULL;
            bool legal = strstr(text, "Legal ") != NULL, verse = strstr(text, "Verse ") != NULL;
            bool story = !noise && !legal && !verse;
            assert_int_equal(noise + legal + verse + story, 1); /* one kind per haystack */
            seen[noise ? 0 : legal ? 1 : verse ? 2 : 3]++;
            if (legal || verse) /* the share of the corpus this side may read */
                assert_null(strstr(text, ev ? " train " : " held "));
            /* an extra corpus's haystack is read, not learnt; the answer always counts */
            assert_float_equal(a.weight[a.ans_begin / 2], legal || verse ? 0.0 : 1.0, 0.0);
            assert_float_equal(a.weight[a.ans_begin], 4.0, 0.0);
            /* every needle at an edge: right after the instruction or right before the
             * question */
            if (task == KVP_TASK_PASSKEY) {
                const char *q = strstr(text, "\nWhat is the pass key?");
                const char *nd = strstr(text, "\nThe pass key is");
                assert_non_null(q);
                assert_non_null(nd);
                bool first = !strncmp(nd - 7, "there.\n", 7);
                bool last = !strncmp(strstr(nd + 1, "\n"), "\n\nWhat is the pass key?", 23);
                assert_true(first || last);
                edge0 += first;
                edge1 += last;
            }
        }
    }
    print_message("  haystack kinds: noise %d, legal %d, verse %d, stories %d; passkey needles "
                  "first %d, last %d\n", seen[0], seen[1], seen[2], seen[3], edge0, edge1);
    for (int k = 0; k < 4; k++)
        assert_true(seen[k] >= 12);
    assert_true(edge0 >= 8 && edge1 >= 8);
    free(text);
    kvp_sample_free(&a);
    kvp_sample_free(&b);
    kvp_corpus_free(plain);
    fixture_free(&f);
}

/* The trainer's tokenization of a whole prompt equals the engine's (src/tokenizer) on the same
 * vocabulary: the model learns from exactly the ids it will see at evaluation. */
static void test_tokenizer_matches_engine(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f, 400);
    struct kvp_vocab *ev;
    struct kvp_err err;
    assert_int_equal(kvp_vocab_create_spm(f.v->n, (const char *const *)f.v->text, f.v->len,
                                          f.v->score, f.v->type, 1, 2, 0, &ev, &err), 0);
    int32_t *a = malloc(8192 * sizeof(int32_t)), *b = malloc(8192 * sizeof(int32_t));
    for (int task = 1; task < KVP_TASK_COPY; task++) {
        char *prompt, *answer;
        assert_int_equal(kvp_task_render(f.c, &f.tok, task, 77, true, 700, &prompt, &answer, &err), 0);
        size_t na, nb;
        assert_int_equal(kvp_tvocab_encode(f.v, prompt, strlen(prompt), true, a, 8192, &na, &err), 0);
        assert_int_equal(kvp_vocab_encode(ev, prompt, strlen(prompt), true, false, b, 8192, &nb, &err), 0);
        assert_int_equal(nb, na + 1); /* the engine adds BOS */
        assert_int_equal(b[0], 1);
        assert_memory_equal(a, b + 1, na * sizeof(int32_t));
        assert_true(na <= 700 && na > 500);
        free(prompt);
        free(answer);
    }
    /* the raw corpus too */
    size_t na, nb;
    assert_int_equal(kvp_tvocab_encode(f.v, f.text, 4000, true, a, 8192, &na, &err), 0);
    assert_int_equal(kvp_vocab_encode(ev, f.text, 4000, true, false, b, 8192, &nb, &err), 0);
    assert_memory_equal(a, b + 1, na * sizeof(int32_t));
    free(a);
    free(b);
    kvp_vocab_free(ev);
    fixture_free(&f);
}

/* With the real filler text: every task renders to a prompt close to the asked length. */
static void test_tasks_on_tinystories(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(path, "data/tinystories/tinystories_val.txt");
    const char *paths[] = {path};
    char *text;
    size_t len;
    struct kvp_err err;
    assert_int_equal(kvp_corpus_read(paths, 1, &text, &len, &err), 0);
    struct kvp_tvocab *v;
    assert_int_equal(kvp_tvocab_learn(text, len, 512, &v, &err), 0);
    struct kvp_corpus *c;
    assert_int_equal(kvp_corpus_init(&c, text, len, TOK(v), 0.05, &err), 0);
    struct kvp_task_tok tok = kvp_tvocab_task_tok(v);
    for (int task = 1; task < KVP_TASK_COPY; task++) {
        char *prompt, *answer;
        assert_int_equal(kvp_task_render(c, &tok, task, 9, true, 2000, &prompt, &answer, &err), 0);
        size_t n;
        kvp_tvocab_encode(v, prompt, strlen(prompt), true, NULL, 0, &n, NULL);
        assert_true(n <= 2000 && n >= 1900);
        free(prompt);
        free(answer);
    }
    kvp_corpus_free(c);
    kvp_tvocab_free(v);
    free(text);
}

/* Text stored as JSON: the "text" members, unescaped, in order (RULER's all_essays.json layout
 * and JSON Lines); a .json file without any is refused, and plain files are read as bytes. */
static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

static void test_corpus_json(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvp_json_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char obj[64], lines[64], bad[64], plain[64];
    snprintf(obj, sizeof(obj), "%s/a.json", dir);
    snprintf(lines, sizeof(lines), "%s/b.jsonl", dir);
    snprintf(bad, sizeof(bad), "%s/c.json", dir);
    snprintf(plain, sizeof(plain), "%s/d.txt", dir);
    write_file(obj, "{\"text\": \"One line.\\nTwo \\\"quoted\\\" \\u00e9.\"}");
    write_file(lines, "{\"id\": 1, \"text\": \"First.\"}\n{\"meta\": {\"text\": \"Nested.\"}}\n");
    write_file(bad, "{\"title\": \"no text here\"}");
    write_file(plain, "Raw \\n stays.");
    char *text;
    size_t len;
    struct kvp_err err;
    const char *p1[] = {obj, lines, plain};
    assert_int_equal(kvp_corpus_read_filler(p1, 3, &text, &len, &err), 0);
    assert_string_equal(text, "One line.\nTwo \"quoted\" \xc3\xa9.\n\n\n\nFirst.\n\nNested.\n\n\n\n"
                              "Raw \\n stays.\n\n");
    assert_int_equal(len, strlen(text));
    free(text);
    const char *p2[] = {bad};
    assert_int_equal(kvp_corpus_read_filler(p2, 1, &text, &len, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, "\"text\""));
    const char *p3[] = {dir}; /* a directory holding the bad file fails the same way */
    assert_int_equal(kvp_corpus_read_filler(p3, 1, &text, &len, &err), KVP_EFORMAT);
    remove(obj);
    remove(lines);
    remove(bad);
    remove(plain);
    rmdir(dir);
}

/* Evaluation-only text is refused as training data, by path and inside a directory, and read
 * as filler: the essays and the held-out stories (data/heldout_stories.txt). */
static void test_corpus_refuses_eval_text(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvp_heldout_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char story[64], held[64];
    snprintf(story, sizeof(story), "%s/a.txt", dir);
    snprintf(held, sizeof(held), "%s/heldout_stories.txt", dir);
    write_file(story, "A cat sat.");
    write_file(held, "A dog ran.");
    char *text;
    size_t len;
    struct kvp_err err;
    const char *ok[] = {story};
    assert_int_equal(kvp_corpus_read(ok, 1, &text, &len, &err), 0);
    free(text);
    const char *bad[][1] = {{held}, {dir}, {"../shared/data/pg_essays"}};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvp_corpus_read(bad[i], 1, &text, &len, &err), KVP_EINVAL);
        assert_non_null(strstr(err.msg, "never training data"));
    }
    const char *both[] = {dir};
    assert_int_equal(kvp_corpus_read_filler(both, 1, &text, &len, &err), 0);
    assert_string_equal(text, "A cat sat.\n\nA dog ran.\n\n");
    free(text);
    remove(story);
    remove(held);
    rmdir(dir);
}

/* Training text gets its mojibake punctuation repaired; other text, a cut prefix at the end and
 * the evaluation's filler are left as they are. Expected bytes written out by hand. */
static void test_corpus_fixes_mojibake(void **state)
{
    (void)state;
    struct {
        const char *in, *out;
    } cases[] = {
        {"don\xC3\xA2\xE2\x82\xAC\xE2\x84\xA2t", "don\xE2\x80\x99t"},            /* ’ */
        {"\xC3\xA2\xE2\x82\xAC\xC5\x93Hi\xC3\xA2\xE2\x82\xAC\xC2\x9D", "\xE2\x80\x9CHi\xE2\x80\x9D"},
        {"\xC3\xA2\xE2\x82\xAC\xCB\x9Cx", "\xE2\x80\x98x"},                      /* ‘ */
        {"a\xC3\xA2\xE2\x82\xAC\xE2\x80\x9C" "b", "a\xE2\x80\x93" "b"},          /* – */
        {"a\xC3\xA2\xE2\x82\xAC\xE2\x80\x9D" "b", "a\xE2\x80\x94" "b"},          /* — */
        {"so\xC3\xA2\xE2\x82\xAC\xC2\xA6", "so\xE2\x80\xA6"},                    /* … */
        {"\"Hi!\xC3\xA2\xE2\x82\xAC said", "\"Hi!\xE2\x80\x9D said"},            /* lost byte */
        {"caf\xC3\xA9 \xE2\x80\x99 plain", "caf\xC3\xA9 \xE2\x80\x99 plain"},    /* untouched */
        {"cut \xC3\xA2\xE2\x82", "cut \xC3\xA2\xE2\x82"},                        /* prefix cut */
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[64];
        size_t n = strlen(cases[i].in);
        memcpy(buf, cases[i].in, n + 1);
        size_t m = kvp_text_fix_mojibake(buf, n);
        assert_int_equal(m, strlen(cases[i].out));
        assert_memory_equal(buf, cases[i].out, m);
    }
    char path[] = "/tmp/kvp_mojibake_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "It\xC3\xA2\xE2\x82\xAC\xE2\x84\xA2s.");
    const char *paths[] = {path};
    char *text;
    size_t len;
    struct kvp_err err;
    assert_int_equal(kvp_corpus_read(paths, 1, &text, &len, &err), 0);
    assert_non_null(strstr(text, "It\xE2\x80\x99s."));
    assert_int_equal(len, strlen(text));
    free(text);
    assert_int_equal(kvp_corpus_read_filler(paths, 1, &text, &len, &err), 0);
    assert_non_null(strstr(text, "It\xC3\xA2\xE2\x82\xAC\xE2\x84\xA2s."));
    free(text);
    remove(path);
}

/* ===================================== training runs ========================================== */

struct losses {
    double loss[256];
    double ans[256];
    long n;
    double acc[KVP_TASK_COUNT];
    bool have_eval;
};

static void record(void *user, const struct kvp_train_progress *p)
{
    struct losses *l = user;
    if (p->event == KVP_TRAIN_EV_STEP && p->step >= 1 && p->step <= 256) {
        l->loss[p->step - 1] = p->loss;
        l->ans[p->step - 1] = p->answer_loss;
        if (p->step > l->n)
            l->n = p->step;
    }
    if (p->event == KVP_TRAIN_EV_EVAL) {
        memcpy(l->acc, p->acc, sizeof(l->acc));
        l->have_eval = true;
    }
}

static void tiny_opts(struct kvp_train_opts *o, const char **paths)
{
    kvp_train_opts_default(o);
    o->model = (struct kvp_train_config){.n_vocab = 300, .n_embd = 32, .n_layer = 2, .n_head = 4,
                                         .n_head_kv = 2, .n_ff = 64, .n_ctx = 128,
                                         .rope_base = 10000.0f, .norm_eps = 1e-5f, .tied = 1};
    o->hp.steps = 8;
    o->hp.tokens_per_step = 512;
    o->hp.micro_tokens = 256;
    o->hp.lr = 3e-3f;
    o->hp.lr_min = 3e-4f;
    o->hp.n_phases = 2;
    o->hp.phase_ctx[0] = 64;
    o->hp.phase_frac[0] = 0.5f;
    o->hp.phase_ctx[1] = 128;
    o->hp.phase_frac[1] = 0.5f;
    o->data_paths = paths;
    o->n_data_paths = 1;
    o->eval_samples = 0;
    o->n_threads = 2;
}

static char *write_text_file(void)
{
    size_t len;
    char *text = make_text(60000, 3, &len);
    char *path = kvp_test_tmpfile(".txt");
    assert_non_null(path);
    assert_int_equal(kvp_test_write_file(path, text, len), 0);
    free(text);
    return path;
}

/* Stopping after 3 steps and resuming from the checkpoint gives the same losses and the same
 * final weights as the uninterrupted run, in either precision. */
static void check_resume_bit_exact(int precision)
{
    char *data = write_text_file();
    const char *paths[] = {data};
    char *ck_a = kvp_test_tmpfile(".ckpt"), *ck_b = kvp_test_tmpfile(".ckpt");
    char *g_a = kvp_test_tmpfile(".gguf"), *g_b = kvp_test_tmpfile(".gguf");
    struct kvp_train_opts o;
    struct kvp_err err;
    struct losses la = {0}, lb = {0};
    tiny_opts(&o, paths);
    o.precision = precision;
    o.ckpt_path = ck_a;
    o.out_gguf = g_a;
    assert_int_equal(kvp_train_run(&o, record, &la, &err), 0);
    assert_int_equal(la.n, 8);
    tiny_opts(&o, paths);
    o.precision = precision;
    o.ckpt_path = ck_b;
    o.stop_after = 3;
    assert_int_equal(kvp_train_run(&o, record, &lb, &err), 0);
    assert_int_equal(lb.n, 3);
    tiny_opts(&o, paths);
    o.precision = precision;
    o.ckpt_path = ck_b;
    o.resume_path = ck_b;
    o.out_gguf = g_b;
    assert_int_equal(kvp_train_run(&o, record, &lb, &err), 0);
    assert_int_equal(lb.n, 8);
    for (int i = 0; i < 8; i++)
        assert_true(la.loss[i] == lb.loss[i]); /* bit for bit */
    size_t na, nb;
    char *a = kvp_test_read_file(ck_a, &na), *b = kvp_test_read_file(ck_b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
    a = kvp_test_read_file(g_a, &na);
    b = kvp_test_read_file(g_b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
    /* a corrupted checkpoint is refused */
    a = kvp_test_read_file(ck_a, &na);
    a[na / 2] ^= 1;
    assert_int_equal(kvp_test_write_file(ck_a, a, na), 0);
    free(a);
    tiny_opts(&o, paths);
    o.precision = precision;
    o.resume_path = ck_a;
    o.ckpt_path = ck_a;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), KVP_EFORMAT);
    remove(data);
    remove(ck_a);
    remove(ck_b);
    remove(g_a);
    remove(g_b);
    free(data);
    free(ck_a);
    free(ck_b);
    free(g_a);
    free(g_b);
}

static void test_checkpoint_resume_bit_exact_f32(void **state)
{
    (void)state;
    check_resume_bit_exact(KVP_PREC_F32);
}

static void test_checkpoint_resume_bit_exact_bf16(void **state)
{
    (void)state;
    check_resume_bit_exact(KVP_PREC_BF16);
}

/* The hyperparameters and state a checkpoint holds (model, moments and vocabulary freed). */
static void load_hp(const char *ck, struct kvp_train_hparams *hp, struct kvp_train_state *st)
{
    struct kvp_train_model *m = NULL;
    struct kvp_adamw opt;
    struct kvp_tvocab *v = NULL;
    struct kvp_err err;
    assert_int_equal(kvp_ckpt_load(ck, 0, 1, &m, &opt, &v, hp, st, &err), 0);
    kvp_train_model_free(m);
    kvp_adamw_free(&opt);
    kvp_tvocab_free(v);
}

/* A resumed run keeps the checkpoint's hyperparameters unless they are given again: then they
 * replace them (a fine-tuning stage), and the new values are what the next checkpoint holds. */
static void test_resume_overrides(void **state)
{
    (void)state;
    char *data = write_text_file();
    const char *paths[] = {data};
    char *ck = kvp_test_tmpfile(".ckpt");
    struct kvp_train_opts o;
    struct kvp_err err;
    tiny_opts(&o, paths);
    o.ckpt_path = ck;
    o.stop_after = 2;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), 0);
    struct kvp_train_hparams hp;
    struct kvp_train_state st;
    /* resumed without overrides: values given now (lr 1e-3) do not replace the checkpoint's */
    tiny_opts(&o, paths);
    o.ckpt_path = o.resume_path = ck;
    o.stop_after = 1;
    o.hp.lr = 1e-3f;
    o.hp.mix.edge_frac = 0.5f;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), 0);
    load_hp(ck, &hp, &st);
    assert_int_equal(st.step, 3);
    assert_true(hp.lr == 3e-3f); /* the checkpoint stores the f32 value: exact */
    assert_float_equal(hp.mix.edge_frac, KVP_EDGE_FRAC_DEFAULT, 0.0);
    assert_float_equal(hp.mix.fill_min, KVP_FILL_MIN_DEFAULT, 0.0);
    /* with overrides they do */
    o.resume_override = KVP_TRAIN_OVERRIDE_LR | KVP_TRAIN_OVERRIDE_EDGE_FRAC |
                        KVP_TRAIN_OVERRIDE_FILL_MIN;
    o.hp.mix.fill_min = 0.9f;
    o.hp.lr_min = 1e-4f;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), 0);
    load_hp(ck, &hp, &st);
    assert_int_equal(st.step, 4);
    assert_true(hp.lr == 1e-3f && hp.lr_min == 1e-4f); /* stored f32 values: exact */
    assert_float_equal(hp.mix.edge_frac, 0.5, 0.0);
    assert_true(hp.mix.fill_min == 0.9f);
    remove(data);
    remove(ck);
    free(data);
    free(ck);
}

struct lrs {
    float lr[16];
    long first, n;
};

static void record_lr(void *user, const struct kvp_train_progress *p)
{
    struct lrs *l = user;
    if (p->event == KVP_TRAIN_EV_STEP && l->n < 16) {
        if (l->n == 0)
            l->first = p->step;
        l->lr[l->n++] = p->lr;
    }
}

/* A resume with a new context, RoPE base and curriculum starts a new stage at the checkpoint's
 * step: the model keeps its weights, the schedule restarts (warm-up and cosine over the stage),
 * the checkpoint holds the new settings, and a resume inside that stage is still bit-exact. A
 * new stage that does not go beyond the step, or a resume with other haystack texts that starts
 * none, is refused. */
static void test_new_stage_on_resume(void **state)
{
    (void)state;
    char *data = write_text_file();
    const char *paths[] = {data};
    char *ck = kvp_test_tmpfile(".ckpt"), *ck_a = kvp_test_tmpfile(".ckpt");
    char *ck_b = kvp_test_tmpfile(".ckpt");
    struct kvp_train_opts o;
    struct kvp_err err;
    struct kvp_train_hparams hp;
    struct kvp_train_state st;
    tiny_opts(&o, paths);
    o.ckpt_path = ck;
    o.stop_after = 4;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), 0);
    struct kvp_train_model *m0 = NULL;
    struct kvp_adamw opt0;
    struct kvp_tvocab *v0 = NULL;
    assert_int_equal(kvp_ckpt_load(ck, 0, 1, &m0, &opt0, &v0, &hp, &st, &err), 0);
    /* the stage: ctx 256, base 40000, all steps at 256, to step 10 */
    tiny_opts(&o, paths);
    o.resume_path = ck;
    o.ckpt_path = ck_a;
    o.model.n_ctx = 256;
    o.model.rope_base = 40000.0f;
    o.hp.n_phases = 1;
    o.hp.phase_ctx[0] = 256;
    o.hp.phase_frac[0] = 1.0f;
    o.hp.tokens_per_step = 512;
    o.hp.micro_tokens = 512;
    o.hp.warmup_frac = 0.25f;
    o.resume_override = KVP_TRAIN_OVERRIDE_CTX | KVP_TRAIN_OVERRIDE_ROPE |
                        KVP_TRAIN_OVERRIDE_CURRICULUM | KVP_TRAIN_OVERRIDE_BATCH;
    o.hp.steps = 4;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), KVP_EINVAL); /* not beyond step 4 */
    o.hp.steps = 10;
    o.stop_after = 1;
    struct lrs l = {0};
    assert_int_equal(kvp_train_run(&o, record_lr, &l, &err), 0);
    /* the first step of the stage is step 0 of its schedule (warm-up from the checkpoint's
     * warmup_frac over the 6 steps of the stage) */
    assert_int_equal(l.first, 5);
    long warm = (long)(hp.warmup_frac * 6.0f);
    assert_true(l.lr[0] == kvp_lr_schedule(0, warm, 6, hp.lr, hp.lr_min));
    struct kvp_train_model *m1 = NULL;
    struct kvp_adamw opt1;
    struct kvp_tvocab *v1 = NULL;
    struct kvp_train_hparams hp1;
    assert_int_equal(kvp_ckpt_load(ck_a, 0, 1, &m1, &opt1, &v1, &hp1, &st, &err), 0);
    assert_int_equal(st.step, 5);
    assert_int_equal(m1->cfg.n_ctx, 256);
    assert_float_equal(m1->cfg.rope_base, 40000.0, 0.0);
    assert_int_equal(hp1.stage_step, 4);
    assert_int_equal(hp1.steps, 10);
    assert_int_equal(hp1.n_phases, 1);
    assert_int_equal(hp1.phase_ctx[0], 256);
    assert_int_equal(hp1.micro_tokens, 512);
    assert_int_equal(kvp_train_phase_at(&hp1, 5), 0);
    /* one step moved the weights, but only by about lr per parameter */
    double moved = 0.0;
    for (size_t i = 0; i < m0->n_params; i++)
        moved = fmax(moved, fabs((double)m1->params[i] - m0->params[i]));
    assert_true(moved > 0.0 && moved < 4.0 * hp.lr);
    kvp_train_model_free(m0);
    kvp_adamw_free(&opt0);
    kvp_tvocab_free(v0);
    kvp_train_model_free(m1);
    kvp_adamw_free(&opt1);
    kvp_tvocab_free(v1);
    /* inside the stage a resume is bit-exact: 5 -> 10 at once, or 5 -> 7 -> 10 */
    char *a, *b;
    size_t na, nb;
    a = kvp_test_read_file(ck_a, &na);
    assert_int_equal(kvp_test_write_file(ck_b, a, na), 0);
    free(a);
    tiny_opts(&o, paths);
    o.resume_path = o.ckpt_path = ck_a;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), 0);
    tiny_opts(&o, paths);
    o.resume_path = o.ckpt_path = ck_b;
    o.stop_after = 2;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), 0);
    /* the stage's own settings given again (the command that started it) change nothing */
    o.model.n_ctx = 256;
    o.model.rope_base = 40000.0f;
    o.hp.n_phases = 1;
    o.hp.phase_ctx[0] = 256;
    o.hp.phase_frac[0] = 1.0f;
    o.hp.tokens_per_step = 512;
    o.hp.micro_tokens = 512;
    o.hp.steps = 10;
    o.resume_override = KVP_TRAIN_OVERRIDE_CTX | KVP_TRAIN_OVERRIDE_ROPE |
                        KVP_TRAIN_OVERRIDE_CURRICULUM | KVP_TRAIN_OVERRIDE_BATCH;
    o.stop_after = 0;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), 0);
    a = kvp_test_read_file(ck_a, &na);
    b = kvp_test_read_file(ck_b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
    load_hp(ck_a, &hp, &st);
    assert_int_equal(st.step, 10);
    /* other haystack texts without a new stage: refused */
    tiny_opts(&o, paths);
    o.resume_path = o.ckpt_path = ck_a;
    o.hay_paths = paths;
    o.n_hay_paths = 1;
    o.hp.steps = 12;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "--hay"));
    remove(data);
    remove(ck);
    remove(ck_a);
    remove(ck_b);
    free(data);
    free(ck);
    free(ck_a);
    free(ck_b);
}

/* --init-from: a GGUF the trainer exported comes back with its configuration, vocabulary and
 * weights (re-exported byte for byte), a new context and RoPE base replace the file's and reach
 * the engine, and a run started from it begins at step 0 with fresh optimiser state and the
 * file's weights. A truncated file is refused. */
static void test_init_from_gguf(void **state)
{
    (void)state;
    char *data = write_text_file();
    const char *paths[] = {data};
    char *ck = kvp_test_tmpfile(".ckpt"), *g = kvp_test_tmpfile(".gguf");
    char *g2 = kvp_test_tmpfile(".gguf");
    struct kvp_train_opts o;
    struct kvp_err err;
    tiny_opts(&o, paths);
    o.out_gguf = g;
    o.stop_after = 3;
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), 0);
    struct kvp_train_model *m;
    struct kvp_tvocab *v;
    assert_int_equal(kvp_train_import_gguf(g, 0, 0.0f, 128, 1, &m, &v, &err), 0);
    assert_int_equal(m->cfg.n_ctx, 128);
    assert_int_equal(m->cfg.n_embd, 32);
    assert_int_equal(m->cfg.n_head_kv, 2);
    assert_true(m->cfg.tied);
    assert_int_equal(kvp_train_export_gguf(g2, m, v, NULL, &err), 0);
    size_t na, nb;
    char *a = kvp_test_read_file(g, &na), *b = kvp_test_read_file(g2, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(b);
    kvp_train_model_free(m);
    kvp_tvocab_free(v);
    /* a longer context and a larger RoPE base, as the engine reads them */
    assert_int_equal(kvp_train_import_gguf(g, 512, 40000.0f, 128, 1, &m, &v, &err), 0);
    assert_int_equal(kvp_train_export_gguf(g2, m, v, NULL, &err), 0);
    kvp_model *em;
    assert_int_equal(kvp_model_open(g2, NULL, &em, &err), 0);
    struct kvp_model_info info;
    kvp_model_get_info(em, &info);
    assert_int_equal(info.n_ctx_train, 512);
    assert_float_equal(info.rope_base, 40000.0, 0.0);
    kvp_model_close(em);
    kvp_train_model_free(m);
    kvp_tvocab_free(v);
    /* a run from the file: step 0, one step of a fresh Adam, weights near the file's */
    tiny_opts(&o, paths);
    o.init_gguf = g;
    o.ckpt_path = ck;
    o.model.n_vocab = 999; /* ignored: the shape comes from the file */
    o.stop_after = 1;
    struct lrs l = {0};
    assert_int_equal(kvp_train_run(&o, record_lr, &l, &err), 0);
    assert_int_equal(l.first, 1);
    struct kvp_adamw opt;
    struct kvp_train_hparams hp;
    struct kvp_train_state st;
    assert_int_equal(kvp_ckpt_load(ck, 0, 1, &m, &opt, &v, &hp, &st, &err), 0);
    assert_int_equal(st.step, 1);
    assert_int_equal(opt.t, 1);
    struct kvp_train_model *mf;
    struct kvp_tvocab *vf;
    assert_int_equal(kvp_train_import_gguf(g, 0, 0.0f, 128, 1, &mf, &vf, &err), 0);
    assert_int_equal(v->n, vf->n);
    double moved = 0.0;
    for (size_t i = 0; i < m->n_params; i++)
        moved = fmax(moved, fabs((double)m->params[i] - mf->params[i]));
    assert_true(moved > 0.0 && moved < 4.0 * hp.lr);
    kvp_train_model_free(mf);
    kvp_tvocab_free(vf);
    kvp_train_model_free(m);
    kvp_adamw_free(&opt);
    kvp_tvocab_free(v);
    /* a truncated file is one error, not a crash */
    assert_int_equal(kvp_test_write_file(g2, a, na / 2), 0);
    assert_true(kvp_train_import_gguf(g2, 0, 0.0f, 128, 1, &m, &v, &err) < 0);
    free(a);
    remove(data);
    remove(ck);
    remove(g);
    remove(g2);
    free(data);
    free(ck);
    free(g);
    free(g2);
}

static uint64_t fnv1a64(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* A version-1 checkpoint (no edge_frac / fill_min / hay_frac / stage_step after the task
 * weights, no hay_hash after the Adam step) still loads, with the defaults for those fields and
 * everything else as written. The file is made from a version-3 one by cutting those 20 and 8
 * bytes, setting the version and recomputing the checksum. */
static void test_checkpoint_version1_loads(void **state)
{
    (void)state;
    char *data = write_text_file();
    const char *paths[] = {data};
    char *ck = kvp_test_tmpfile(".ckpt");
    struct kvp_train_opts o;
    struct kvp_err err;
    tiny_opts(&o, paths);
    o.ckpt_path = ck;
    o.stop_after = 1;
    o.hp.mix.edge_frac = 0.75f; /* not the default, so a wrong read shows */
    assert_int_equal(kvp_train_run(&o, NULL, NULL, &err), 0);
    size_t n;
    uint8_t *v2 = (uint8_t *)kvp_test_read_file(ck, &n);
    assert_non_null(v2);
    /* magic 8, version 4, pad 4, config 8 i32 + 2 f32, seed 8, 3 i64, 9 f32, n_phases 4,
     * 8 i32, 8 f32, n_tasks 4, task weights */
    size_t at = 16 + 40 + 8 + 24 + 36 + 4 + 32 + 32 + 4 + 4 * (size_t)KVP_TASK_COUNT;
    float ef;
    memcpy(&ef, v2 + at, 4);
    assert_float_equal(ef, 0.75, 0.0); /* the layout this test assumes */
    /* the version-3 fields: f32 edge_frac fill_min hay_frac, i64 stage_step; then the state
     * (i64 step, 4 u64 rng, u64 cursor, f64 tokens, u64 adam_t) and u64 hay_hash */
    size_t hh = at + 20 + 8 + 32 + 8 + 8 + 8, n1 = n - 28;
    uint8_t *v1 = malloc(n1);
    assert_non_null(v1);
    memcpy(v1, v2, at);
    memcpy(v1 + at, v2 + at + 20, hh - at - 20);
    memcpy(v1 + hh - 20, v2 + hh + 8, n - hh - 8);
    uint32_t one = 1;
    memcpy(v1 + 8, &one, 4);
    uint64_t sum = fnv1a64(v1, n1 - 8);
    memcpy(v1 + n1 - 8, &sum, 8);
    assert_int_equal(kvp_test_write_file(ck, v1, n1), 0);
    struct kvp_train_model *m = NULL;
    struct kvp_adamw opt;
    struct kvp_tvocab *v = NULL;
    struct kvp_train_hparams hp;
    struct kvp_train_state st;
    load_hp(ck, &hp, &st);
    assert_int_equal(st.step, 1);
    assert_true(hp.lr == 3e-3f); /* the checkpoint stores the f32 value: exact */
    assert_float_equal(hp.mix.edge_frac, KVP_EDGE_FRAC_DEFAULT, 0.0);
    assert_float_equal(hp.mix.fill_min, KVP_FILL_MIN_DEFAULT, 0.0);
    assert_float_equal(hp.mix.hay_frac, 0.0, 0.0);
    assert_int_equal(hp.stage_step, 0);
    /* a version-1 header on a version-3 body does not load */
    memcpy(v2 + 8, &one, 4);
    sum = fnv1a64(v2, n - 8);
    memcpy(v2 + n - 8, &sum, 8);
    assert_int_equal(kvp_test_write_file(ck, v2, n), 0);
    assert_true(kvp_ckpt_load(ck, 0, 1, &m, &opt, &v, &hp, &st, &err) < 0);
    free(v1);
    free(v2);
    remove(data);
    remove(ck);
    free(data);
    free(ck);
}

/* The exported GGUF runs in the engine with the trainer's logits and tokenization. */
static void test_gguf_matches_engine(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f, 300);
    struct kvp_train_config cfg = {.n_vocab = f.v->n, .n_embd = 64, .n_layer = 2, .n_head = 4,
                                   .n_head_kv = 2, .n_ff = 96, .n_ctx = 160,
                                   .rope_base = 10000.0f, .norm_eps = 1e-5f, .tied = 0};
    struct kvp_train_model *m;
    struct kvp_err err;
    assert_int_equal(kvp_train_model_init(&m, &cfg, 160, 2, 5, &err), 0);
    /* weights well away from the init so every path matters */
    struct kvp_rng rng;
    kvp_rng_seed(&rng, 3);
    for (size_t i = 0; i < m->n_params; i++)
        m->params[i] += 0.05f * kvp_rng_normal(&rng);
    char *path = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_train_export_gguf(path, m, f.v, "test", &err), 0);
    kvp_model *em;
    assert_int_equal(kvp_model_open(path, NULL, &em, &err), 0);
    struct kvp_model_info info;
    kvp_model_get_info(em, &info);
    assert_int_equal(info.n_vocab, f.v->n);
    assert_int_equal(info.n_head_kv, 2);
    assert_int_equal(info.n_ctx_train, 160);
    assert_false(info.tied_output);
    const char *text = "Tom saw a big red dog. The dog ran to the old house and found a cake.";
    int32_t ids[200], mine[200];
    size_t n, nm;
    assert_int_equal(kvp_tokenize(em, text, strlen(text), true, ids, 200, &n, &err), 0);
    mine[0] = 1;
    assert_int_equal(kvp_tvocab_encode(f.v, text, strlen(text), true, mine + 1, 199, &nm, &err), 0);
    assert_int_equal(n, nm + 1);
    assert_memory_equal(ids, mine, n * sizeof(int32_t));
    /* a full context of tokens */
    int T = 160;
    int32_t tok[160];
    for (int i = 0; i < T; i++)
        tok[i] = i < (int)n ? ids[i] : (int32_t)kvp_rng_below(&rng, (uint64_t)f.v->n);
    assert_int_equal(kvp_train_model_forward(m, tok, 1, T, &err), 0);
    kvp_ctx *ctx;
    /* an f32 cache: the trainer keeps K and V in f32 (the default f16 cache moves these logits
     * by 2e-4) */
    struct kvp_ctx_params cp = {.n_ctx = T, .n_threads = 1, .type_k = KVP_KV_F32,
                                .type_v = KVP_KV_F32};
    assert_int_equal(kvp_ctx_init(em, &cp, &ctx, &err), 0);
    float *logits = malloc(sizeof(float) * (size_t)T * f.v->n);
    assert_int_equal(kvp_eval(ctx, tok, T, logits, true, &err), 0);
    double maxd = 0.0, maxv = 0.0;
    for (size_t i = 0; i < (size_t)T * f.v->n; i++) {
        maxd = fmax(maxd, fabs((double)logits[i] - m->logits[i]));
        maxv = fmax(maxv, fabs((double)m->logits[i]));
    }
    print_message("  engine vs trainer logits: max |diff| %.3g (max |logit| %.3g)\n", maxd, maxv);
    /* Empirical, and why: two f32 implementations of the same forward pass (the trainer's ops
     * and the engine's kernels) in different orders; the engine is within the probabilistic f32
     * bound test_forward derives against a float64 oracle (about 5e-6 of the largest logit on
     * models of this size), but this test has no oracle for the trainer's order. Measured
     * 6.6e-7 (4e-7 of the largest logit); 1e-4 of it is ten times twice that bound, and a wrong
     * export (a transposed or misplaced tensor, a norm or RoPE convention) exceeds it by orders
     * of magnitude */
    assert_true(maxd < 1e-4 * fmax(1.0, maxv));
    free(logits);
    kvp_ctx_free(ctx);
    kvp_model_close(em);
    remove(path);
    free(path);
    kvp_train_model_free(m);
    fixture_free(&f);
}

/* A short run on repetitive text: the loss must fall well below its start. */
static void test_training_loss_falls(void **state)
{
    (void)state;
    char *data = write_text_file();
    const char *paths[] = {data};
    struct kvp_train_opts o;
    struct kvp_err err;
    struct losses l = {0};
    tiny_opts(&o, paths);
    o.hp.steps = 60;
    o.hp.warmup_frac = 0.05f;
    o.hp.n_phases = 1;
    o.hp.phase_ctx[0] = 128;
    o.hp.phase_frac[0] = 1.0f;
    o.hp.mix.w[KVP_TASK_LM] = 1.0f; /* mostly plain text: the loss is comparable step to step */
    assert_int_equal(kvp_train_run(&o, record, &l, &err), 0);
    assert_int_equal(l.n, 60);
    double first = (l.loss[0] + l.loss[1]) / 2, last = (l.loss[58] + l.loss[59]) / 2;
    print_message("  loss %.3f -> %.3f\n", first, last);
    assert_true(last < 0.6 * first);
    remove(data);
    free(data);
}


/* The train-lm command: flag errors are one line and exit 1; a tiny run writes a checkpoint and a
 * GGUF, and --export-only rewrites the GGUF from the checkpoint. */
static void test_cli_train_lm(void **state)
{
    (void)state;
    const char *cli = kvp_test_cli();
    if (!cli) {
        kvp_test_skip_missing("KVP_CLI not set");
    }
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof(cmd), "%s train-lm --data x --steps abc", cli);
    assert_int_equal(kvp_test_run(cmd, &out, 1), 1);
    assert_non_null(strstr(out, "kvpred: error: --steps"));
    assert_null(strchr(strchr(out, '\n') + 1, '\n')); /* one line */
    free(out);
    snprintf(cmd, sizeof(cmd), "%s train-lm --data x -o y.gguf --frobnicate", cli);
    assert_int_equal(kvp_test_run(cmd, &out, 1), 1);
    free(out);
    /* the sampling flags: a share and a fraction of the context, nothing else */
    static const char *const bad[] = {"--edge-frac 1.5", "--edge-frac x", "--fill-min 0",
                                      "--fill-min 2", "--mix passkey:1,nope:1"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        snprintf(cmd, sizeof(cmd), "%s train-lm --data x -o y.gguf %s", cli, bad[k]);
        assert_int_equal(kvp_test_run(cmd, &out, 1), 1);
        assert_non_null(strstr(out, "kvpred: error: --"));
        assert_null(strchr(strchr(out, '\n') + 1, '\n')); /* one line */
        free(out);
    }
    char *data = write_text_file();
    char *ck = kvp_test_tmpfile(".ckpt"), *g1 = kvp_test_tmpfile(".gguf"),
         *g2 = kvp_test_tmpfile(".gguf");
    snprintf(cmd, sizeof(cmd),
             "%s train-lm --data %s -o %s --ckpt %s --dim 32 --layers 1 --heads 2 --kv-heads 1 "
             "--ff 48 --vocab 300 --ctx 128 --batch 2 --steps 3 --eval-samples 1 --threads 1",
             cli, data, g1, ck);
    int rc = kvp_test_run(cmd, &out, 1);
    if (rc != 0)
        print_message("%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "step 3/3"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s train-lm --data %s --resume %s --export-only -o %s", cli, data,
             ck, g2);
    assert_int_equal(kvp_test_run(cmd, &out, 1), 0);
    free(out);
    size_t n1, n2;
    char *a = kvp_test_read_file(g1, &n1), *b = kvp_test_read_file(g2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a);
    free(b);
    remove(data);
    remove(ck);
    remove(g1);
    remove(g2);
    free(data);
    free(ck);
    free(g1);
    free(g2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_grad_rmsnorm),
        cmocka_unit_test(test_gradcheck_detects_errors),
        cmocka_unit_test(test_grad_linear),
        cmocka_unit_test(test_grad_rope),
        cmocka_unit_test(test_grad_attention),
        cmocka_unit_test(test_grad_swiglu),
        cmocka_unit_test(test_grad_xent),
        cmocka_unit_test(test_grad_embedding),
        cmocka_unit_test(test_grad_model_tied),
        cmocka_unit_test(test_grad_model_untied_threads),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_schedule_and_clip),
        cmocka_unit_test(test_bpe_learn_and_encode),
        cmocka_unit_test(test_spm_merge_order),
        cmocka_unit_test(test_corpus_and_samples), cmocka_unit_test(test_corpus_json),
        cmocka_unit_test(test_corpus_refuses_eval_text),
        cmocka_unit_test(test_corpus_fixes_mojibake), cmocka_unit_test(test_seed_contract),
        cmocka_unit_test(test_haystack_kinds),
        cmocka_unit_test(test_tokenizer_matches_engine),
        cmocka_unit_test(test_tasks_on_tinystories),
        cmocka_unit_test(test_checkpoint_resume_bit_exact_f32),
        cmocka_unit_test(test_checkpoint_resume_bit_exact_bf16),
        cmocka_unit_test(test_resume_overrides),
        cmocka_unit_test(test_checkpoint_version1_loads),
        cmocka_unit_test(test_new_stage_on_resume),
        cmocka_unit_test(test_init_from_gguf),
        cmocka_unit_test(test_gguf_matches_engine),
        cmocka_unit_test(test_training_loss_falls),
        cmocka_unit_test(test_cli_train_lm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
