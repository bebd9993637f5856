/*
 * Forward-pass tests: agreement with an independent engine (llama.cpp logits and perplexity on
 * stories260K), greedy generation against float64 golden outputs for the llama2.c checkpoints,
 * every weight type against an F32 model holding the same (dequantized) weights, and
 * invariance to threads, block size and prefill/decode path.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "forward/context.h"
#include "kernels/prefill_gemm.h"
#include "kernels/types.h"
#include "kvpred.h"
#include "model/model.h"
#include "testutil.h"

/* Logits of every position, with keys and values cached as kv_type (enum kvp_kv_type). When
 * kv_out is not NULL it receives the cache's keys then values as f32, [layer][2][pos][kv dim]. */
static float *eval_all_kv(kvp_model *m, const int32_t *ids, int n, int threads, int block,
                          bool decode, int kv_type, double **kv_out)
{
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_ctx_params cp = {.n_ctx = n, .n_threads = threads, .block_size = block,
                                .type_k = kv_type, .type_v = kv_type};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    float *lg = malloc((size_t)n * in.n_vocab * sizeof(float));
    assert_non_null(lg);
    if (decode) {
        for (int i = 0; i < n; i++)
            assert_int_equal(kvp_eval(c, ids + i, 1, lg + (size_t)i * in.n_vocab, false, &err), 0);
    } else {
        assert_int_equal(kvp_eval(c, ids, n, lg, true, &err), 0);
    }
    if (kv_out) {
        const struct kvp_kvcache *kv = &c->kv;
        int hd = kv->head_dim, kvd = kv->n_head_kv * hd, bs = kv->block_size;
        double *o = malloc((size_t)kv->n_layer * 2 * n * kvd * sizeof(double));
        assert_non_null(o);
        for (int l = 0; l < kv->n_layer; l++)
            for (int t = 0; t < n; t++)
                for (int h = 0; h < kv->n_head_kv; h++)
                    for (int d = 0; d < hd; d++) {
                        size_t i = (((size_t)l * 2) * n + t) * kvd + (size_t)h * hd + d;
                        o[i] = kvp_kvcache_key_at(kv, l, h, t, d);
                        o[i + (size_t)n * kvd] = kvp_kv_value_at(
                            kv->type_v, kvp_kvcache_vblock(kv, l, h, t / bs), hd, bs, t % bs, d);
                    }
        *kv_out = o;
    }
    kvp_ctx_free(c);
    return lg;
}

static float *eval_all(kvp_model *m, const int32_t *ids, int n, int threads, int block, bool decode,
                       int kv_type)
{
    return eval_all_kv(m, ids, n, threads, block, decode, kv_type, NULL);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* ---- the slow, obvious oracle: the whole forward pass in double precision ---- */

static double *mat_f64(const struct kvp_mat *w)
{
    assert_int_equal(w->type, 0); /* the oracle reads F32 models only */
    size_t n = (size_t)(w->rows * w->cols);
    double *o = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        o[i] = ((const float *)w->data)[i];
    return o;
}

/* y[r] = sum_c W[r][c] x[c] */
static void mv64(const double *W, const double *x, double *y, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++)
            s += W[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rms64(double *o, const double *x, const float *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        o[i] = x[i] * sc * w[i];
}

static void rope64(double *v, int nh, int hd, int pos, const kvp_model *m)
{
    const struct kvp_hparams *hp = &m->hp;
    bool neox = hp->rope_style == KVP_ROPE_NEOX;
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < hd / 2; i++) {
            double th = pos * pow(hp->rope_base, -2.0 * i / hd) * hp->rope_freq_scale;
            if (m->rope_freqs)
                th /= m->rope_freqs[i];
            double c = cos(th), s = sin(th);
            double *a = v + h * hd + (neox ? i : 2 * i), *b = a + (neox ? hd / 2 : 1);
            double x0 = *a, x1 = *b;
            *a = x0 * c - x1 * s;
            *b = x0 * s + x1 * c;
        }
}

static void addb(double *y, const float *b, int n)
{
    for (int i = 0; b && i < n; i++)
        y[i] += b[i];
}

/* How the oracle treats the attention inputs: exactly (float64), or the way an engine with an
 * f16 KV cache and f16 attention products does (llama.cpp's default: Q, K, V and the softmax
 * output rounded to f16 before the two products). F16_NUDGED first moves every value to be
 * rounded by one float32 ulp, the size of a change in summation order. */
enum oracle_mode { ORACLE_F64, ORACLE_F16, ORACLE_F16_NUDGED };

static double to_f16(double x, enum oracle_mode mode)
{
    if (mode == ORACLE_F64)
        return x;
    float f = (float)x;
    if (mode == ORACLE_F16_NUDGED)
        f = nextafterf(f, INFINITY);
    return kvp_f16_to_f32(kvp_f32_to_f16(f));
}

/* Half the f16 spacing at x: how far rounding to f16 may move x (2^-25 below the normal range). */
static double f16_half_ulp(double x)
{
    int e;
    frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
    return ldexp(1.0, (e - 1 > -14 ? e - 1 : -14) - 11);
}

/* The oracle; with kv_given (keys and values as eval_all_kv copies them from kvpred's cache) it
 * uses those instead of its own K and V after checking that each is its own value rounded to f16
 * up to a change in the last f32 bits: |given - exact| <= half an f16 ulp + kv_slack * max |row|.
 * *kv_excess receives the largest (|given - exact| - half ulp) / max |row|, *kv_flips how many
 * given values are not the nearest f16 of the exact one. */
static double *oracle_core(const kvp_model *m, const int32_t *ids, int n, enum oracle_mode mode,
                           const double *kv_given, double *kv_excess, int *kv_flips)
{
    const struct kvp_hparams *hp = &m->hp;
    int D = hp->n_embd, hd = hp->head_dim, H = hp->n_head, KV = hp->n_head_kv, F = hp->n_ff;
    int qd = H * hd, kvd = KV * hd, g = H / KV;
    double *emb = mat_f64(&m->tok_embd), *out = mat_f64(&m->output);
    double *x = calloc((size_t)n * D, 8), *h = malloc(D * 8), *q = malloc((size_t)n * qd * 8);
    double *k = malloc((size_t)n * kvd * 8), *v = malloc((size_t)n * kvd * 8);
    double *att = malloc(qd * 8), *o = malloc(D * 8), *gt = malloc(F * 8), *up = malloc(F * 8);
    double *sc = malloc((size_t)n * 8), *lg = malloc((size_t)n * hp->n_vocab * 8);
    for (int i = 0; i < n; i++)
        memcpy(x + (size_t)i * D, emb + (size_t)ids[i] * D, D * 8);
    for (int l = 0; l < hp->n_layer; l++) {
        const struct kvp_layer_weights *L = &m->layers[l];
        double *wq = mat_f64(&L->wq), *wk = mat_f64(&L->wk), *wv = mat_f64(&L->wv);
        double *wo = mat_f64(&L->wo), *w1 = mat_f64(&L->w_gate), *w3 = mat_f64(&L->w_up);
        double *w2 = mat_f64(&L->w_down);
        for (int i = 0; i < n; i++) {
            rms64(h, x + (size_t)i * D, L->attn_norm, D, hp->norm_eps);
            mv64(wq, h, q + (size_t)i * qd, qd, D);
            mv64(wk, h, k + (size_t)i * kvd, kvd, D);
            mv64(wv, h, v + (size_t)i * kvd, kvd, D);
            addb(q + (size_t)i * qd, L->bq, qd);
            addb(k + (size_t)i * kvd, L->bk, kvd);
            addb(v + (size_t)i * kvd, L->bv, kvd);
            rope64(q + (size_t)i * qd, H, hd, i, m);
            rope64(k + (size_t)i * kvd, KV, hd, i, m);
            for (int e = 0; e < qd; e++)
                q[(size_t)i * qd + e] = to_f16(q[(size_t)i * qd + e], mode);
            for (int e = 0; e < kvd; e++) {
                k[(size_t)i * kvd + e] = to_f16(k[(size_t)i * kvd + e], mode);
                v[(size_t)i * kvd + e] = to_f16(v[(size_t)i * kvd + e], mode);
            }
            for (int kvv = 0; kv_given && kvv < 2; kvv++) {
                double *xs = (kvv ? v : k) + (size_t)i * kvd, top = 0;
                const double *gv = kv_given + (((size_t)l * 2 + kvv) * n + i) * kvd;
                for (int e = 0; e < kvd; e++)
                    top = fmax(top, fabs(xs[e]));
                for (int e = 0; e < kvd; e++) {
                    double hu = f16_half_ulp(xs[e]), r = fabs(gv[e] - xs[e]);
                    *kv_excess = fmax(*kv_excess, (r - hu) / top);
                    *kv_flips += gv[e] != kvp_f16_to_f32(kvp_f32_to_f16((float)xs[e]));
                    xs[e] = gv[e];
                }
            }
        }
        for (int i = 0; i < n; i++) {
            for (int hh = 0; hh < H; hh++) {
                const double *qi = q + (size_t)i * qd + hh * hd;
                int kh = hh / g;
                double mx = -1e300, sum = 0;
                for (int t = 0; t <= i; t++) {
                    double s = 0;
                    for (int d = 0; d < hd; d++)
                        s += qi[d] * k[(size_t)t * kvd + kh * hd + d];
                    sc[t] = s / sqrt((double)hd);
                    mx = fmax(mx, sc[t]);
                }
                for (int t = 0; t <= i; t++)
                    sum += (sc[t] = exp(sc[t] - mx));
                for (int t = 0; t <= i; t++)
                    sc[t] = to_f16(sc[t] / sum, mode);
                for (int d = 0; d < hd; d++) {
                    double a = 0;
                    for (int t = 0; t <= i; t++)
                        a += sc[t] * v[(size_t)t * kvd + kh * hd + d];
                    att[hh * hd + d] = a;
                }
            }
            mv64(wo, att, o, D, qd);
            addb(o, L->bo, D);
            for (int d = 0; d < D; d++)
                x[(size_t)i * D + d] += o[d];
            rms64(h, x + (size_t)i * D, L->ffn_norm, D, hp->norm_eps);
            mv64(w1, h, gt, F, D);
            mv64(w3, h, up, F, D);
            for (int f = 0; f < F; f++)
                gt[f] = gt[f] / (1 + exp(-gt[f])) * up[f];
            mv64(w2, gt, o, D, F);
            for (int d = 0; d < D; d++)
                x[(size_t)i * D + d] += o[d];
        }
        free(wq), free(wk), free(wv), free(wo), free(w1), free(w3), free(w2);
    }
    for (int i = 0; i < n; i++) {
        rms64(h, x + (size_t)i * D, m->output_norm, D, hp->norm_eps);
        mv64(out, h, lg + (size_t)i * hp->n_vocab, hp->n_vocab, D);
    }
    free(emb), free(out), free(x), free(h), free(q), free(k), free(v), free(att), free(o);
    free(gt), free(up), free(sc);
    return lg;
}

static double *oracle_logits_as(const kvp_model *m, const int32_t *ids, int n,
                                enum oracle_mode mode)
{
    return oracle_core(m, ids, n, mode, NULL, NULL, NULL);
}

static double *oracle_logits(const kvp_model *m, const int32_t *ids, int n)
{
    return oracle_logits_as(m, ids, n, ORACLE_F64);
}

/* ---- reference logits ---- */

/* max |reference row - x| over one position's logits */
static double row_diff(const cJSON *row, const double *x)
{
    double d = 0;
    int j = 0;
    for (const cJSON *e = row->child; e; e = e->next, j++)
        d = fmax(d, fabs(e->valuedouble - x[j]));
    return d;
}

/* Evidence for docs/performance.md: the reference was computed with an f16 KV cache, and at
 * that precision agreement within 1e-3 is not a property an f32-order-dependent engine can
 * have. Checked against the float64 oracle run three ways (see enum oracle_mode). */
static void check_reference_is_f16_kv(const kvp_model *m, const int32_t *ids, int n,
                                      const cJSON *rlog, int n_vocab)
{
    double *f64 = oracle_logits_as(m, ids, n, ORACLE_F64);
    double *f16 = oracle_logits_as(m, ids, n, ORACLE_F16);
    double *f16n = oracle_logits_as(m, ids, n, ORACLE_F16_NUDGED);
    /* position 0 attends to itself only: its output is V[0], exact in f32, rounded in f16 */
    const cJSON *row0 = cJSON_GetArrayItem(rlog, 0);
    double pos0_f64 = row_diff(row0, f64), pos0_f16 = row_diff(row0, f16);
    double ref_f64 = 0, ref_f16 = 0, nudge = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *row = cJSON_GetArrayItem(rlog, i);
        ref_f64 = fmax(ref_f64, row_diff(row, f64 + (size_t)i * n_vocab));
        ref_f16 = fmax(ref_f16, row_diff(row, f16 + (size_t)i * n_vocab));
    }
    for (size_t i = 0; i < (size_t)n * n_vocab; i++)
        nudge = fmax(nudge, fabs(f16[i] - f16n[i]));
    print_message("position 0: |reference - float64| = %.3g, |reference - f16 KV| = %.3g\n",
                  pos0_f64, pos0_f16);
    print_message("all positions: |reference - float64| = %.3g, |reference - f16 KV| = %.3g, "
                  "|f16 KV - f16 KV nudged by 1 f32 ulp| = %.3g\n",
                  ref_f64, ref_f16, nudge);
    assert_true(pos0_f16 < 1e-4 && pos0_f64 > 1e-3); /* the reference rounds V to f16 */
    assert_true(ref_f16 < ref_f64);                  /* and is closer to an f16 KV evaluation */
    assert_true(nudge > 1e-3); /* one f32 ulp before rounding moves logits more than 1e-3 */
    free(f64), free(f16), free(f16n);
}

/* The f32 cache against llama.cpp's f32-KV logits: within 1e-3 at every position. */
static void check_f32kv_reference(const float *lg, int n, int n_vocab)
{
    const char *path = kvp_test_shared("reference/stories260K_logits_f32kv.json");
    if (!path) {
        print_message("reference/stories260K_logits_f32kv.json not found: f32-KV check skipped\n");
        return;
    }
    char *json = kvp_test_read_file(path, NULL);
    assert_non_null(json);
    cJSON *ref = cJSON_Parse(json);
    assert_non_null(ref);
    const cJSON *rlog = cJSON_GetObjectItem(ref, "logits");
    assert_int_equal(cJSON_GetArraySize(rlog), n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *row = cJSON_GetArrayItem(rlog, i);
        assert_int_equal(cJSON_GetArraySize(row), n_vocab);
        double x[4096];
        assert_true(n_vocab <= 4096);
        for (int j = 0; j < n_vocab; j++)
            x[j] = lg[(size_t)i * n_vocab + j];
        worst = fmax(worst, row_diff(row, x));
    }
    print_message("f32 KV: max |kvpred - llama.cpp f32-KV reference| = %.3g (bound 1e-3)\n", worst);
    assert_true(worst < 1e-3);
    cJSON_Delete(ref);
    free(json);
}

/* The f16 cache (the default): the same argmax as llama.cpp's f16-KV reference at every
 * position, and the float64 oracle's logits when the oracle uses the keys and values kvpred
 * stored. Comparing with an oracle that rounds its own K and V to f16 cannot be tight: a value
 * within an f32 rounding error of an f16 rounding midpoint lands on either side depending on the
 * summation order (prefill, decode, each SIMD table and BLAS kernel sum in their own), and one
 * f16 ulp of one value moves these logits by up to ~0.02 (check_reference_is_f16_kv measures
 * it). So the stored values are checked one by one instead: each must be the oracle's exact value
 * rounded to f16, up to the f32 error of the path that computed it (half an f16 ulp plus
 * kv_slack of the vector's largest entry), and given them, the rest of the forward pass is f32
 * arithmetic against float64, the same bound as the f32 cache (f32_bound). */
static void check_f16_cache(kvp_model *m, const int32_t *ids, int n, const cJSON *rlog,
                            int n_vocab, double f32_bound, double kv_slack)
{
    double *kv_pre = NULL, *kv_dec = NULL;
    float *lg = eval_all_kv(m, ids, n, 2, 16, false, KVP_KV_F16, &kv_pre);
    float *dec = eval_all_kv(m, ids, n, 1, 16, true, KVP_KV_DEFAULT, &kv_dec);
    double ex_pre = 0, ex_dec = 0;
    int fl_pre = 0, fl_dec = 0;
    double *o_pre = oracle_core(m, ids, n, ORACLE_F64, kv_pre, &ex_pre, &fl_pre);
    double *o_dec = oracle_core(m, ids, n, ORACLE_F64, kv_dec, &ex_dec, &fl_dec);
    double *f16 = oracle_logits_as(m, ids, n, ORACLE_F16);
    double worst = 0, vs_llama_oracle = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *row = cJSON_GetArrayItem(rlog, i);
        const float *o = lg + (size_t)i * n_vocab;
        int am = 0, am_ref = 0, j = 0;
        double best_ref = -1e30;
        for (const cJSON *e = row->child; e; e = e->next, j++) {
            if (e->valuedouble > best_ref) {
                best_ref = e->valuedouble;
                am_ref = j;
            }
            am = o[j] > o[am] ? j : am;
            worst = fmax(worst, fabs(e->valuedouble - o[j]));
            vs_llama_oracle = fmax(vs_llama_oracle, fabs(o[j] - f16[(size_t)i * n_vocab + j]));
        }
        assert_int_equal(am, am_ref);
    }
    double e_pre = 0, e_dec = 0;
    for (size_t i = 0; i < (size_t)n * n_vocab; i++) {
        e_pre = fmax(e_pre, fabs(lg[i] - o_pre[i]));
        e_dec = fmax(e_dec, fabs(dec[i] - o_dec[i]));
    }
    print_message("f16 KV: max |kvpred - llama.cpp f16-KV reference| = %.3g, argmax agrees at "
                  "%d/%d, |kvpred - oracle with f16 Q, K, V, P (llama.cpp's rounding)| = %.3g\n",
                  worst, n, n, vs_llama_oracle);
    print_message("f16 KV: stored K, V vs exact: excess over half an f16 ulp %.3g / %.3g of the "
                  "row (bound %.3g), %d / %d not the nearest f16 (prefill / decode)\n",
                  ex_pre, ex_dec, kv_slack, fl_pre, fl_dec);
    print_message("f16 KV: max |kvpred - oracle on kvpred's K, V| = %.3g prefill, %.3g decode "
                  "(bound %.3g)\n", e_pre, e_dec, f32_bound);
    assert_true(ex_pre <= kv_slack && ex_dec <= kv_slack);
    assert_true(e_pre < f32_bound && e_dec < f32_bound);
    assert_true(worst < 0.05); /* the two engines round differently (above) */
    free(lg), free(dec), free(o_pre), free(o_dec), free(f16), free(kv_pre), free(kv_dec);
}

static void test_reference_logits(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(mpath_s, "models/stories260K.gguf");
    char mpath[4096];
    snprintf(mpath, sizeof(mpath), "%s", mpath_s);
    KVP_REQUIRE_SHARED(ref_s, "reference/stories260K_logits.json");
    char *json = kvp_test_read_file(ref_s, NULL);
    KVP_REQUIRE_SHARED(in_s, "reference/stories260K_logits.input.txt");
    size_t tlen;
    char *text = kvp_test_read_file(in_s, &tlen);
    assert_non_null(json);
    assert_non_null(text);
    cJSON *ref = cJSON_Parse(json);
    assert_non_null(ref);
    cJSON *rtok = cJSON_GetObjectItem(ref, "tokens"), *rlog = cJSON_GetObjectItem(ref, "logits");
    int n = cJSON_GetArraySize(rtok);
    assert_int_equal(n, 256);

    kvp_model *m = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_model_open(mpath, NULL, &m, &err), 0);
    int32_t *ids = malloc((tlen + 8) * sizeof(int32_t));
    size_t nid = 0;
    assert_int_equal(kvp_tokenize(m, text, tlen, true, ids, tlen + 8, &nid, &err), 0);
    assert_true(nid >= (size_t)n);
    for (int i = 0; i < n; i++)
        assert_int_equal(ids[i], cJSON_GetArrayItem(rtok, i)->valueint);

    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    float *lg = eval_all(m, ids, n, 2, 16, false, KVP_KV_F32);
    double *truth = oracle_logits(m, ids, n);
    double worst = 0, ref_vs_truth = 0, ours_vs_truth = 0;
    for (int i = 0; i < n; i++) {
        cJSON *row = cJSON_GetArrayItem(rlog, i);
        assert_int_equal(cJSON_GetArraySize(row), in.n_vocab);
        int am_ref = 0, am = 0;
        double best_ref = -1e30;
        int j = 0;
        for (cJSON *e = row->child; e; e = e->next, j++) {
            double r = e->valuedouble, o = lg[(size_t)i * in.n_vocab + j];
            double t = truth[(size_t)i * in.n_vocab + j];
            if (r > best_ref) {
                best_ref = r;
                am_ref = j;
            }
            worst = fmax(worst, fabs(r - o));
            ref_vs_truth = fmax(ref_vs_truth, fabs(r - t));
            ours_vs_truth = fmax(ours_vs_truth, fabs(o - t));
            if (o > lg[(size_t)i * in.n_vocab + am])
                am = j;
        }
        assert_int_equal(am, am_ref);
    }
    /* The reference engine keeps K and V in f16 (llama.cpp's default cache type), which moves its
     * logits up to ~0.04 away from the exact function; kvpred with an f32 cache computes in f32
     * and lands within 1e-4 of a float64 evaluation. So the checks are: same tokens, same argmax
     * everywhere, kvpred closer to the exact result than the reference is, and both within the
     * reference's own distance to it. */
    print_message("f32 KV: max |kvpred - llama.cpp f16-KV reference| = %.3g\n", worst);
    print_message("f32 KV: max |kvpred - float64 oracle| = %.3g, max |reference - float64 oracle| "
                  "= %.3g\n",
                  ours_vs_truth, ref_vs_truth);
    assert_true(ours_vs_truth < 1e-4);
    assert_true(ours_vs_truth < ref_vs_truth);
    assert_true(worst < ref_vs_truth + 1e-4);
    free(truth);
    check_reference_is_f16_kv(m, ids, n, rlog, in.n_vocab);
    check_f32kv_reference(lg, n, in.n_vocab);
    check_f16_cache(m, ids, n, rlog, in.n_vocab, 1e-4, 1e-4);

    /* the decode path (one token at a time) computes the same function */
    float *lg2 = eval_all(m, ids, n, 1, 16, true, KVP_KV_F32);
    double dd = max_abs_diff(lg, lg2, (size_t)n * in.n_vocab);
    print_message("max |prefill - decode| = %.3g\n", dd);
    assert_true(dd < 1e-4);
    free(lg2);
    /* a different block size and thread count change nothing beyond rounding: the block size
     * only lays out the KV pages and kvpred's own kernels compute whole rows and heads per thread
     * in a fixed order (0 with OpenBLAS's own kernel here), but the prefill's sgemm is
     * OpenBLAS's, and some of its kernels (Haswell's) split the sums across threads. 1e-4 is a
     * measured margin over those f32 ulps, not a derived bound */
    lg2 = eval_all(m, ids, n, 1, 7, false, KVP_KV_F32);
    assert_true(max_abs_diff(lg, lg2, (size_t)n * in.n_vocab) < 1e-4);
    free(lg2);

    free(lg);
    free(ids);
    kvp_model_close(m);
    cJSON_Delete(ref);
    free(json);
    free(text);
}

/* ---- golden greedy generations of the llama2.c checkpoints ---- */

static int greedy_match(kvp_model *m, cJSON *golden_ids, int steps)
{
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_ctx_params cp = {.n_ctx = steps + 1, .n_threads = 1};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    float *lg = malloc((size_t)in.n_vocab * sizeof(float));
    int32_t tok = kvp_token_bos(m);
    int matched = 0;
    for (int s = 0; s < steps; s++) {
        assert_int_equal(kvp_eval(c, &tok, 1, lg, false, &err), 0);
        int best = 0;
        for (int j = 1; j < in.n_vocab; j++)
            if (lg[j] > lg[best])
                best = j;
        if (best != cJSON_GetArrayItem(golden_ids, s)->valueint)
            break;
        matched++;
        tok = best;
    }
    free(lg);
    kvp_ctx_free(c);
    return matched;
}

static void test_golden_greedy(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(gpath, "models/golden_greedy.jsonl");
    char *gold = kvp_test_read_file(gpath, NULL);
    assert_non_null(gold);
    int checked = 0;
    for (char *line = strtok(gold, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *g = cJSON_Parse(line);
        assert_non_null(g);
        const char *model = cJSON_GetObjectItem(g, "model")->valuestring;
        const char *tokname = cJSON_GetObjectItem(g, "tokenizer")->valuestring;
        cJSON *ids = cJSON_GetObjectItem(g, "ids");
        int steps = cJSON_GetArraySize(ids);
        char rel[512], mp[4096], tp[4096];
        snprintf(rel, sizeof(rel), "models/%s", model);
        const char *p = kvp_test_shared(rel);
        assert_non_null(p);
        snprintf(mp, sizeof(mp), "%s", p);
        snprintf(rel, sizeof(rel), "models/%s", tokname);
        p = kvp_test_shared(rel);
        assert_non_null(p);
        snprintf(tp, sizeof(tp), "%s", p);
        struct kvp_model_params mpar = {.tokenizer_path = tp};
        kvp_model *m = NULL;
        struct kvp_err err = {0};
        assert_int_equal(kvp_model_open(mp, &mpar, &m, &err), 0);
        int got = greedy_match(m, ids, steps);
        print_message("%s (.bin): %d of %d greedy tokens match\n", model, got, steps);
        assert_true(got >= 64);
        kvp_model_close(m);

        /* the same through `kvpred convert` */
        const char *cli = kvp_test_cli();
        if (cli) {
            char *out = kvp_test_tmpfile(".gguf");
            char cmd[16384];
            snprintf(cmd, sizeof(cmd), "%s convert %s --tokenizer %s -o %s", cli, mp, tp, out);
            assert_int_equal(kvp_test_run(cmd, NULL, 1), 0);
            assert_int_equal(kvp_model_open(out, NULL, &m, &err), 0);
            int got2 = greedy_match(m, ids, steps);
            print_message("%s (converted GGUF): %d of %d greedy tokens match\n", model, got2, steps);
            assert_true(got2 >= 64);
            kvp_model_close(m);
            remove(out);
            free(out);
        }
        cJSON_Delete(g);
        checked++;
    }
    assert_int_equal(checked, 3);
    free(gold);
}

/* ---- every weight type against an F32 model with the same dequantized weights ---- */

static void check_type(int type, int embd_type, int tied, int n_head_kv)
{
    /* K-quants need rows that are whole 256-element super-blocks */
    bool k256 = kvp_type_traits(type)->blck_size == 256 ||
                kvp_type_traits(embd_type)->blck_size == 256;
    struct kvp_test_model_spec sp = {.n_vocab = 96, .n_embd = k256 ? 256 : 64, .n_layer = 2,
                                     .n_head = 4, .n_head_kv = n_head_kv,
                                     .n_ff = k256 ? 256 : 96, .n_ctx = 64,
                                     .type = type, .embd_type = embd_type, .tied = tied,
                                     .seed = (unsigned)(type * 31 + tied + 7)};
    char *qp = kvp_test_tmpfile(".gguf"), *fp = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(&sp, qp, fp), 0);
    kvp_model *mq = NULL, *mf = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_model_open(qp, NULL, &mq, &err), 0);
    assert_int_equal(kvp_model_open(fp, NULL, &mf, &err), 0);
    int32_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = (i * 37 + 5) % sp.n_vocab;
    size_t nl = (size_t)40 * sp.n_vocab;
    float *ref = eval_all(mf, ids, 40, 1, 16, false, KVP_KV_F32);
    float *pre = eval_all(mq, ids, 40, 2, 16, false, KVP_KV_F32);
    float *dec = eval_all(mq, ids, 40, 2, 16, true, KVP_KV_F32);
    double scale = 0;
    for (size_t i = 0; i < nl; i++)
        scale = fmax(scale, fabs(ref[i]));
    double e_pre = max_abs_diff(ref, pre, nl), e_dec = max_abs_diff(ref, dec, nl);
    /* Prefill dequantizes weights to F32 (only summation order differs) unless the CPU has the
     * integer GEMM for the type (kernels/prefill_gemm.h). Decode uses the SIMD dots; every
     * quantized type also quantizes the activations to 8 bits (Q8_0 blocks of 32 for the
     * 32-element types, Q8_K blocks of 256 for the K-quants), a ~1% effect on each product;
     * measured up to 0.012·scale, bound 0.03·scale. The integer GEMM quantizes each token as
     * decode does and sums the same block products, so there prefill must also stay close to
     * decode (measured up to 1e-7·scale: float order, through two layers). */
    bool quantized = kvp_type_traits(type)->blck_size > 1;
    bool gemm = kvp_gemm_wants(type, 40) || kvp_gemm_wants(embd_type, 40);
    double bound_dec = quantized ? 0.03 * scale : 1e-4 * scale + 1e-5;
    double e_pd = max_abs_diff(pre, dec, nl);
    print_message("type %d embd %d tied %d: |logit| max %.3g, prefill err %.3g, decode err %.3g "
                  "(bound %.3g), |prefill - decode| %.3g%s\n", type, embd_type, tied, scale, e_pre,
                  e_dec, bound_dec, e_pd, gemm ? " (integer GEMM)" : "");
    assert_true(e_pre <= (gemm ? bound_dec : 1e-4 * scale + 1e-5));
    assert_true(e_dec <= bound_dec);
    if (gemm)
        assert_true(e_pd <= 1e-4 * scale);
    free(ref);
    free(pre);
    free(dec);
    kvp_model_close(mq);
    kvp_model_close(mf);
    remove(qp);
    remove(fp);
    free(qp);
    free(fp);
}

static void test_types(void **state)
{
    (void)state;
    const int types[] = {0 /*F32*/, 1 /*F16*/, 30 /*BF16*/, 8 /*Q8_0*/};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        check_type(types[i], types[i], 1, 2);
        check_type(types[i], 0, 0, 4);
    }
    /* the other quantized types: matrices and tied embeddings in the type (K-quants on a
     * 256-wide model, see check_type) */
    const int qtypes[] = {2 /*Q4_0*/,  3 /*Q4_1*/,  6 /*Q5_0*/,  7 /*Q5_1*/,  20 /*IQ4_NL*/,
                          10 /*Q2_K*/, 11 /*Q3_K*/, 12 /*Q4_K*/, 13 /*Q5_K*/, 14 /*Q6_K*/};
    for (size_t i = 0; i < sizeof(qtypes) / sizeof(qtypes[0]); i++)
        check_type(qtypes[i], qtypes[i], 1, 2);
    check_type(8, 1, 0, 1);  /* Q8_0 matrices, F16 embeddings, MQA */
    check_type(14, 12, 0, 2); /* Q4_K_M-like: Q6_K matrices, Q4_K embeddings */
}

/* ---- architectures: qwen2 (biases, split-half RoPE), rope_freqs, key_length ---- */

static void check_against_oracle(const struct kvp_test_model_spec *sp, const char *what)
{
    char *p = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(sp, p, NULL), 0);
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    if (kvp_model_open(p, NULL, &m, &err) < 0)
        print_message("%s: %s\n", what, err.msg);
    assert_non_null(m);
    int32_t ids[48];
    for (int i = 0; i < 48; i++)
        ids[i] = (i * 13 + 1) % sp->n_vocab;
    float *pre = eval_all(m, ids, 48, 2, 16, false, KVP_KV_F32);
    float *dec = eval_all(m, ids, 48, 1, 16, true, KVP_KV_F32);
    double *truth = oracle_logits(m, ids, 48);
    double e_pre = 0, e_dec = 0, scale = 0;
    for (size_t i = 0; i < (size_t)48 * sp->n_vocab; i++) {
        e_pre = fmax(e_pre, fabs(pre[i] - truth[i]));
        e_dec = fmax(e_dec, fabs(dec[i] - truth[i]));
        scale = fmax(scale, fabs(truth[i]));
    }
    print_message("%s: |logit| max %.3g, prefill err %.3g, decode err %.3g\n", what, scale, e_pre,
                  e_dec);
    assert_true(e_pre < 1e-4 * scale + 1e-5);
    assert_true(e_dec < 1e-4 * scale + 1e-5);
    free(pre);
    free(dec);
    free(truth);
    kvp_model_close(m);
    remove(p);
    free(p);
}

static void test_architectures(void **state)
{
    (void)state;
    struct kvp_test_model_spec base = {.n_vocab = 96, .n_embd = 64, .n_layer = 2, .n_head = 4,
                                       .n_head_kv = 2, .n_ff = 96, .n_ctx = 64, .type = 0,
                                       .embd_type = 0, .tied = 0, .seed = 21};
    struct kvp_test_model_spec q = base;
    q.arch = "qwen2";
    q.rope_base = 1e6f;
    check_against_oracle(&q, "qwen2 (biases, NEOX RoPE)");
    struct kvp_test_model_spec r = base;
    r.rope_freqs = 1;
    r.rope_base = 500000.0f;
    check_against_oracle(&r, "llama with rope_freqs");
    struct kvp_test_model_spec k = base;
    k.head_dim = 32; /* q_dim = 128 != n_embd */
    k.biases = 1;
    check_against_oracle(&k, "llama with key_length 32 and biases");
}

/* ---- errors ---- */

static void test_eval_errors(void **state)
{
    (void)state;
    struct kvp_test_model_spec sp = {.n_vocab = 64, .n_embd = 32, .n_layer = 1, .n_head = 2,
                                     .n_head_kv = 1, .n_ff = 32, .n_ctx = 16, .type = 0,
                                     .embd_type = 0, .tied = 1, .seed = 3};
    char *p = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(&sp, p, NULL), 0);
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_model_open(p, NULL, &m, &err), 0);
    struct kvp_ctx_params cp = {.n_ctx = 8};
    kvp_ctx *c = NULL;
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(kvp_eval(c, ids, 9, NULL, false, &err), KVP_ERANGE);
    assert_non_null(strstr(err.msg, "do not fit"));
    int32_t bad = 64;
    assert_int_equal(kvp_eval(c, &bad, 1, NULL, false, &err), KVP_EINVAL);
    bad = -1;
    assert_int_equal(kvp_eval(c, &bad, 1, NULL, false, &err), KVP_EINVAL);
    assert_int_equal(kvp_eval(c, ids, 8, NULL, false, &err), 0);
    assert_int_equal(kvp_eval(c, ids, 1, NULL, false, &err), KVP_ERANGE);
    kvp_ctx_truncate(c, 4);
    assert_int_equal(kvp_ctx_n_tokens(c), 4);
    assert_int_equal(kvp_eval(c, ids, 4, NULL, false, &err), 0);
    kvp_ctx_free(c);
    kvp_model_close(m);
    remove(p);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_logits),
        cmocka_unit_test(test_golden_greedy),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_architectures),
        cmocka_unit_test(test_eval_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
