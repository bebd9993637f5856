/*
 * The trainer's model: one flat parameter array (so AdamW, clipping and checkpoints see a single
 * vector), a table of named tensors inside it in GGUF order, and the whole-model forward and
 * backward passes over a micro-batch of n_seq sequences of T tokens.
 *
 * Every activation the backward pass needs is saved per layer (train.h, struct kvp_train_acts)
 * except the SwiGLU product and the attention probabilities, which are recomputed. Memory is
 * therefore linear in the micro-batch size: about (5·D + 2·Hq·hd + 2·Hkv·hd + 2·F) floats per
 * token and layer, 14 KB for D=256, F=704, 8 heads, 4 KV heads.
 *
 * Threads: in f32, OpenBLAS parallelises the large matrix products itself; in bf16 the linear
 * maps split their output rows (dW: its rows) over our own threads, a persistent pool (f32 keeps
 * a thread start per op, as it always ran). Attention runs on the same threads over (sequence,
 * KV head) tasks (OpenBLAS switched to one thread in f32), each task owning its query heads
 * and its dK/dV rows, so results do not depend on scheduling. Row-wise ops (norms, SwiGLU, the
 * loss) are split over the same threads by row ranges; per-thread loss
 * partial sums are added in thread order, so a run is bit-for-bit reproducible for a fixed
 * thread count.
 */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "core/threadpool.h"
#include "kernels/types.h"
#include "train/train.h"

#define KVP_TRAIN_MAX_THREADS 64

/* ==================================== threads ================================================= */

typedef void (*par_fn)(void *ctx, int ith, int nth);

struct par_job {
    par_fn fn;
    void *ctx;
    int ith, nth;
};

static void *par_main(void *arg)
{
    struct par_job *j = arg;
    j->fn(j->ctx, j->ith, j->nth);
    return NULL;
}

/* Run fn on nth threads (the caller is thread 0). A thread that cannot be created has its share
 * run by the caller afterwards, so the split (and the result) never changes. */
static void par_run(int nth, par_fn fn, void *ctx)
{
    if (nth <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_t th[KVP_TRAIN_MAX_THREADS];
    struct par_job jobs[KVP_TRAIN_MAX_THREADS];
    bool started[KVP_TRAIN_MAX_THREADS] = {false};
    for (int i = 1; i < nth; i++) {
        jobs[i] = (struct par_job){fn, ctx, i, nth};
        started[i] = pthread_create(&th[i], NULL, par_main, &jobs[i]) == 0;
    }
    fn(ctx, 0, nth);
    for (int i = 1; i < nth; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            fn(ctx, i, nth);
    }
}

static void split(long n, int ith, int nth, long *b, long *e)
{
    kvp_split_range(n, ith, nth, b, e);
}

/* Run fn on the model's threads: the bf16 path's persistent pool (a wake-up instead of a thread
 * start per op, and barriers inside an op), the f32 reference's thread per op as it always was.
 * The split is the same either way, so the results are too. */
static void par(struct kvp_train_model *m, par_fn fn, void *ctx)
{
    if (m->pool && m->precision == KVP_PREC_BF16)
        kvp_pool_run(m->pool, fn, ctx);
    else
        par_run(m->n_threads, fn, ctx);
}

/* ==================================== layout ================================================== */

int kvp_train_config_check(const struct kvp_train_config *c, struct kvp_err *err)
{
    if (c->n_vocab < 259 || c->n_vocab > 65536)
        return kvp_err_set(err, KVP_EINVAL, "vocab %d: must be 259..65536", c->n_vocab);
    if (c->n_embd < 2 || c->n_layer < 1 || c->n_head < 1 || c->n_head_kv < 1 || c->n_ff < 1)
        return kvp_err_set(err, KVP_EINVAL, "model sizes must be positive");
    if (c->n_embd % c->n_head || (c->n_embd / c->n_head) % 2)
        return kvp_err_set(err, KVP_EINVAL, "dim %d: must be a multiple of 2·heads (%d)",
                           c->n_embd, c->n_head);
    if (c->n_head % c->n_head_kv)
        return kvp_err_set(err, KVP_EINVAL, "heads %d: not a multiple of kv-heads %d", c->n_head,
                           c->n_head_kv);
    if (c->n_ctx < 2 || c->n_ctx > 65536)
        return kvp_err_set(err, KVP_EINVAL, "ctx %d: must be 2..65536", c->n_ctx);
    if (!(c->rope_base > 1.0f) || !(c->norm_eps > 0.0f))
        return kvp_err_set(err, KVP_EINVAL, "rope base must be > 1 and norm eps > 0");
    return 0;
}

static void add_tensor(struct kvp_train_model *m, const char *name, size_t *off, int64_t ne0,
                       int64_t ne1, bool decay)
{
    struct kvp_train_tensor *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->off = *off;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->n_dims = ne1 > 0 ? 2 : 1;
    if (ne1 <= 0)
        t->ne[1] = 1;
    t->decay = decay;
    *off += (size_t)ne0 * (size_t)t->ne[1];
}

/* Lay the tensors out in GGUF order and count the parameters. */
static int layout(struct kvp_train_model *m, struct kvp_err *err)
{
    const struct kvp_train_config *c = &m->cfg;
    int D = c->n_embd, hd = D / c->n_head, F = c->n_ff;
    int qd = c->n_head * hd, kvd = c->n_head_kv * hd;
    m->head_dim = hd;
    m->layers = calloc((size_t)c->n_layer, sizeof(*m->layers));
    m->tensors = calloc((size_t)c->n_layer * 9 + 3, sizeof(*m->tensors));
    if (!m->layers || !m->tensors)
        return kvp_err_set(err, KVP_ENOMEM, "model tables");
    size_t off = 0;
    char nm[48];
    m->tok_embd = off;
    add_tensor(m, "token_embd.weight", &off, D, c->n_vocab, false);
    for (int l = 0; l < c->n_layer; l++) {
        struct kvp_train_layer *L = &m->layers[l];
#define T_(field, suffix, ne0, ne1, dec)                                                           \
    do {                                                                                           \
        snprintf(nm, sizeof(nm), "blk.%d.%s", l, suffix);                                          \
        L->field = off;                                                                            \
        add_tensor(m, nm, &off, ne0, ne1, dec);                                                    \
    } while (0)
        T_(attn_norm, "attn_norm.weight", D, 0, false);
        T_(wq, "attn_q.weight", D, qd, true);
        T_(wk, "attn_k.weight", D, kvd, true);
        T_(wv, "attn_v.weight", D, kvd, true);
        T_(wo, "attn_output.weight", qd, D, true);
        T_(ffn_norm, "ffn_norm.weight", D, 0, false);
        T_(w_gate, "ffn_gate.weight", D, F, true);
        T_(w_up, "ffn_up.weight", D, F, true);
        T_(w_down, "ffn_down.weight", F, D, true);
#undef T_
    }
    m->output_norm = off;
    add_tensor(m, "output_norm.weight", &off, D, 0, false);
    if (c->tied) {
        m->output = m->tok_embd;
    } else {
        m->output = off;
        add_tensor(m, "output.weight", &off, D, c->n_vocab, true);
    }
    m->n_params = off;
    return 0;
}

static void init_weights(struct kvp_train_model *m, uint64_t seed)
{
    struct kvp_rng rng;
    kvp_rng_seed(&rng, seed);
    float proj_scale = 1.0f / sqrtf(2.0f * (float)m->cfg.n_layer);
    for (int i = 0; i < m->n_tensors; i++) {
        const struct kvp_train_tensor *t = &m->tensors[i];
        float *p = m->params + t->off;
        size_t n = (size_t)t->ne[0] * (size_t)t->ne[1];
        if (t->n_dims == 1) {
            for (size_t j = 0; j < n; j++)
                p[j] = 1.0f;
            continue;
        }
        float sd = 0.02f;
        if (strstr(t->name, "attn_output") || strstr(t->name, "ffn_down"))
            sd *= proj_scale; /* GPT-2's residual-branch scaling */
        for (size_t j = 0; j < n; j++)
            p[j] = sd * kvp_rng_normal(&rng);
    }
}

static float *falloc(size_t n, bool *ok)
{
    float *p = kvp_alloc_aligned((n ? n : 1) * sizeof(float));
    if (!p)
        *ok = false;
    return p;
}

static int alloc_run_state(struct kvp_train_model *m, struct kvp_err *err)
{
    const struct kvp_train_config *c = &m->cfg;
    size_t N = (size_t)m->cap_tokens, D = (size_t)c->n_embd, F = (size_t)c->n_ff;
    size_t qd = (size_t)c->n_head * m->head_dim, kvd = (size_t)c->n_head_kv * m->head_dim;
    size_t V = (size_t)c->n_vocab;
    bool ok = true;
    m->acts = calloc((size_t)c->n_layer, sizeof(*m->acts));
    if (!m->acts)
        return kvp_err_set(err, KVP_ENOMEM, "activations");
    for (int l = 0; l < c->n_layer; l++) {
        struct kvp_train_acts *A = &m->acts[l];
        A->x = falloc(N * D, &ok);
        A->xn1 = falloc(N * D, &ok);
        A->rstd1 = falloc(N, &ok);
        A->q = falloc(N * qd, &ok);
        A->k = falloc(N * kvd, &ok);
        A->v = falloc(N * kvd, &ok);
        A->lse = falloc(N * (size_t)c->n_head, &ok);
        A->att = falloc(N * qd, &ok);
        A->xmid = falloc(N * D, &ok);
        A->xn2 = falloc(N * D, &ok);
        A->rstd2 = falloc(N, &ok);
        A->gate = falloc(N * F, &ok);
        A->up = falloc(N * F, &ok);
    }
    m->xf = falloc(N * D, &ok);
    m->xnf = falloc(N * D, &ok);
    m->rstdf = falloc(N, &ok);
    m->logits = falloc(N * V, &ok);
    m->dx = falloc(N * D, &ok);
    m->dtmp = falloc(N * D, &ok);
    m->dq = falloc(N * qd, &ok);
    m->dk = falloc(N * kvd, &ok);
    m->dv = falloc(N * kvd, &ok);
    m->datt = falloc(N * qd, &ok);
    m->dg = falloc(N * F, &ok);
    m->du = falloc(N * F, &ok);
    m->dff = falloc(N * F, &ok);
    m->rope_cos = falloc((size_t)c->n_ctx * m->head_dim / 2, &ok);
    m->rope_sin = falloc((size_t)c->n_ctx * m->head_dim / 2, &ok);
    m->attn_scratch = falloc(kvp_op_attn_scratch(c->n_ctx) * (size_t)m->n_threads, &ok);
    m->tok = malloc(N * sizeof(int32_t));
    if (!ok || !m->tok)
        return kvp_err_set(err, KVP_ENOMEM, "run state for %ld tokens", m->cap_tokens);
    kvp_op_rope_table(m->rope_cos, m->rope_sin, c->n_ctx, m->head_dim, c->rope_base);
    return 0;
}

int kvp_train_model_init(struct kvp_train_model **out, const struct kvp_train_config *cfg,
                         long cap_tokens, int n_threads, uint64_t seed, struct kvp_err *err)
{
    int rc = kvp_train_config_check(cfg, err);
    if (rc < 0)
        return rc;
    if (cap_tokens < 2)
        return kvp_err_set(err, KVP_EINVAL, "micro-batch of %ld tokens", cap_tokens);
    struct kvp_train_model *m = calloc(1, sizeof(*m));
    if (!m)
        return kvp_err_set(err, KVP_ENOMEM, "model");
    m->cfg = *cfg;
    m->cap_tokens = cap_tokens;
    m->n_threads = n_threads < 1 ? 1 : n_threads > KVP_TRAIN_MAX_THREADS ? KVP_TRAIN_MAX_THREADS
                                                                         : n_threads;
    if ((rc = layout(m, err)) < 0)
        goto fail_free_model;
    bool ok = true;
    m->params = falloc(m->n_params, &ok);
    m->grads = falloc(m->n_params, &ok);
    if (!ok) {
        rc = kvp_err_set(err, KVP_ENOMEM, "%zu parameters", m->n_params);
        goto fail_free_model;
    }
    memset(m->grads, 0, m->n_params * sizeof(float));
    if ((rc = alloc_run_state(m, err)) < 0)
        goto fail_free_model;
    init_weights(m, seed);
    *out = m;
    return 0;

fail_free_model:
    kvp_train_model_free(m);
    return rc;
}

void kvp_train_model_free(struct kvp_train_model *m)
{
    if (!m)
        return;
    if (m->acts) {
        for (int l = 0; l < m->cfg.n_layer; l++) {
            struct kvp_train_acts *A = &m->acts[l];
            float *bufs[] = {A->x,   A->xn1,  A->rstd1, A->q,   A->k,     A->v,    A->lse,
                             A->att, A->xmid, A->xn2,   A->rstd2, A->gate, A->up};
            for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
                kvp_free_aligned(bufs[i]);
        }
        free(m->acts);
    }
    float *bufs[] = {m->xf,   m->xnf, m->rstdf, m->logits, m->dx,       m->dtmp,
                     m->dq,   m->dk,  m->dv,    m->datt,   m->dg,       m->du,
                     m->dff,  m->rope_cos, m->rope_sin, m->attn_scratch, m->params, m->grads,
                     m->fa_scratch};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        kvp_free_aligned(bufs[i]);
    kvp_free_aligned(m->bf_a);
    kvp_free_aligned(m->bf_b);
    kvp_free_aligned(m->bf_w);
    kvp_pool_free(m->pool);
    free(m->tok);
    free(m->layers);
    free(m->tensors);
    free(m);
}

/* The linear maps of the model as (in, out), for sizing the bf16 scratch. */
static void linear_shapes(const struct kvp_train_model *m, int shapes[6][2])
{
    const struct kvp_train_config *c = &m->cfg;
    int D = c->n_embd, qd = c->n_head * m->head_dim, kvd = c->n_head_kv * m->head_dim;
    int s[6][2] = {{D, qd}, {D, kvd}, {qd, D}, {D, c->n_ff}, {c->n_ff, D}, {D, c->n_vocab}};
    memcpy(shapes, s, sizeof(s));
}

static uint16_t *balloc(size_t n, bool *ok)
{
    uint16_t *p = kvp_alloc_aligned((n ? n : 1) * sizeof(uint16_t));
    if (!p)
        *ok = false;
    return p;
}

int kvp_train_model_set_precision(struct kvp_train_model *m, int precision, struct kvp_err *err)
{
    if (precision != KVP_PREC_F32 && precision != KVP_PREC_BF16)
        return kvp_err_set(err, KVP_EINVAL, "precision %d", precision);
    if (precision == KVP_PREC_F32 || m->bf_a) {
        m->precision = precision;
        return 0;
    }
    m->tk = kvp_tk();
    int shapes[6][2];
    linear_shapes(m, shapes);
    size_t wmax = 0, dmax = 0;
    for (int i = 0; i < 6; i++) {
        size_t in = (size_t)shapes[i][0] + 1, out = (size_t)shapes[i][1] + 1;
        wmax = in * out > wmax ? in * out : wmax;
        dmax = in > dmax ? in : dmax;
        dmax = out > dmax ? out : dmax;
    }
    size_t n = (size_t)m->cap_tokens + 1;
    bool ok = true;
    m->bf_a = balloc(n * dmax, &ok);
    m->bf_b = balloc(n * dmax, &ok);
    m->bf_w = balloc(wmax, &ok);
    m->fa_scratch = falloc(kvp_fa_scratch(m->cfg.n_ctx, m->head_dim) * (size_t)m->n_threads, &ok);
    /* waits spin ~40 µs, then sleep: an op is a millisecond or more, and on a shared host a
     * thread spinning for a descheduled one would burn the CPU the other needs */
    if (ok && kvp_pool_init_sleepy(m->n_threads, 2000, &m->pool, err) < 0)
        ok = false;
    if (!ok) { /* the model stays f32, without a partial bf16 state */
        kvp_free_aligned(m->bf_a);
        kvp_free_aligned(m->bf_b);
        kvp_free_aligned(m->bf_w);
        kvp_free_aligned(m->fa_scratch);
        m->bf_a = m->bf_b = m->bf_w = NULL;
        m->fa_scratch = NULL;
        m->pool = NULL;
        return kvp_err_set(err, KVP_ENOMEM, "bf16 run state for %ld tokens", m->cap_tokens);
    }
    m->precision = precision;
    return 0;
}

void kvp_train_model_zero_grad(struct kvp_train_model *m)
{
    memset(m->grads, 0, m->n_params * sizeof(float));
}

/* ================================ parallel row ops ============================================ */

struct rows_ctx {
    float *y, *rstd, *dx, *dw_part;
    const float *x, *w, *dy, *rstd_in;
    long n;
    int dim;
    float eps;
};

static void rmsnorm_fwd_worker(void *p, int ith, int nth)
{
    struct rows_ctx *c = p;
    long b, e;
    split(c->n, ith, nth, &b, &e);
    kvp_op_rmsnorm_fwd(c->y + b * c->dim, c->rstd + b, c->x + b * c->dim, c->w, e - b, c->dim,
                       c->eps);
}

static void rmsnorm_fwd(struct kvp_train_model *m, float *y, float *rstd, const float *x,
                        const float *w, long n)
{
    struct rows_ctx c = {.y = y, .rstd = rstd, .x = x, .w = w, .n = n, .dim = m->cfg.n_embd,
                         .eps = m->cfg.norm_eps};
    par(m, rmsnorm_fwd_worker, &c);
}

static void rmsnorm_bwd_worker(void *p, int ith, int nth)
{
    struct rows_ctx *c = p;
    long b, e;
    split(c->n, ith, nth, &b, &e);
    float *dw = c->dw_part + (size_t)ith * c->dim;
    memset(dw, 0, sizeof(float) * (size_t)c->dim);
    kvp_op_rmsnorm_bwd(c->dx + b * c->dim, dw, c->dy + b * c->dim, c->x + b * c->dim, c->w,
                       c->rstd_in + b, e - b, c->dim);
}

/* dx += rmsnorm backward; dw += its weight gradient (per-thread partials added in order). */
static void rmsnorm_bwd(struct kvp_train_model *m, float *dx, float *dw, const float *dy,
                        const float *x, const float *w, const float *rstd, long n)
{
    int D = m->cfg.n_embd;
    float part[KVP_TRAIN_MAX_THREADS * 1024];
    float *parts = D <= 1024 ? part : NULL;
    float *heap = NULL;
    if (!parts)
        parts = heap = malloc(sizeof(float) * (size_t)D * m->n_threads);
    if (!parts) { /* cannot happen for sane widths; fall back to one thread */
        kvp_op_rmsnorm_bwd(dx, dw, dy, x, w, rstd, n, D);
        return;
    }
    struct rows_ctx c = {.dx = dx, .dw_part = parts, .x = x, .w = w, .dy = dy, .rstd_in = rstd,
                         .n = n, .dim = D};
    par(m, rmsnorm_bwd_worker, &c);
    for (int t = 0; t < m->n_threads; t++)
        for (int j = 0; j < D; j++)
            dw[j] += parts[(size_t)t * D + j];
    free(heap);
}

struct glu_ctx {
    float *a, *dg, *du;
    const float *g, *u, *da;
    long n;
    bool bwd;
    const struct kvp_tk_ops *tk; /* SIMD versions (bf16 path); NULL: the f32 reference ops */
};

static void glu_worker(void *p, int ith, int nth)
{
    struct glu_ctx *c = p;
    long b, e;
    split(c->n, ith, nth, &b, &e);
    if (c->bwd)
        (c->tk ? c->tk->swiglu_bwd : kvp_op_swiglu_bwd)(c->dg + b, c->du + b, c->da + b, c->g + b,
                                                        c->u + b, e - b);
    else
        (c->tk ? c->tk->swiglu_fwd : kvp_op_swiglu_fwd)(c->a + b, c->g + b, c->u + b, e - b);
}

struct xent_ctx {
    float *logits, *nll;
    const int32_t *targets;
    const float *w;
    long n;
    int V;
    float scale;
    bool fast;
    double part[KVP_TRAIN_MAX_THREADS];
};

static void xent_worker(void *p, int ith, int nth)
{
    struct xent_ctx *c = p;
    long b, e;
    split(c->n, ith, nth, &b, &e);
    c->part[ith] = (c->fast ? kvp_op_xent_fast : kvp_op_xent)(c->logits + b * c->V, c->targets + b, c->w ? c->w + b : NULL, e - b,
                               c->V, c->scale, c->nll ? c->nll + b : NULL);
}

/* ================================== linear maps =============================================== */

/* The bf16 linear maps run as one pool region each. The operands every thread reads (the packed
 * weight, the token-paired activations of dW) are packed by all threads, each its share, then a
 * barrier; the rest splits rows of the outputs, each thread converting the rows it needs, so
 * nothing else synchronises inside an op. */
struct lin_ctx {
    struct kvp_pool *pool;
    const struct kvp_tk_ops *tk;
    float *y, *dw, *dx;
    const float *x, *dy, *w, *res;
    uint16_t *a, *b, *wb; /* bf16 A scratch, B scratch (token-paired activations for dW), weight */
    long n;
    int in, out, ina, outa; /* ina/outa: in/out rounded up to even */
    bool acc;
    bool reuse_x; /* x is the previous call's x: its bf16 copy is still in the scratch */
};

/* Pair-interleave the rows of an f32 matrix [n][cols] (row 2p with 2p+1) into dst [n/2][cols][2]. */
static void pair_rows(const struct kvp_tk_ops *tk, uint16_t *dst, const float *src, long n,
                      int cols, long pb, long pe)
{
    for (long p = pb; p < pe; p++)
        tk->cvt_pair(dst + (size_t)p * 2 * cols, src + (size_t)2 * p * cols,
                     2 * p + 1 < n ? src + (size_t)(2 * p + 1) * cols : NULL, (size_t)cols, 1.0f);
}

/* Convert rows [b, e) of src [n][cols] to bf16 rows of even length colsa in dst. */
static void cvt_rows(const struct kvp_tk_ops *tk, uint16_t *dst, const float *src, int cols,
                     int colsa, long b, long e)
{
    for (long i = b; i < e; i++) {
        uint16_t *row = dst + (size_t)i * colsa;
        tk->cvt(row, src + (size_t)i * cols, (size_t)cols, 1.0f);
        if (colsa > cols)
            row[cols] = 0;
    }
}

static void lin_fwd_worker(void *p, int ith, int nth)
{
    struct lin_ctx *c = p;
    long b, e;
    /* B[k = in][n = out] pair-interleaved: (W[o][2p], W[o][2p+1]), split by output rows o */
    split(c->out, ith, nth, &b, &e);
    for (long o = b; o < e; o++) {
        const float *wr = c->w + (size_t)o * c->in;
        for (int pi = 0; pi < c->ina / 2; pi++) {
            uint16_t *d = c->wb + ((size_t)pi * c->out + o) * 2;
            d[0] = kvp_f32_to_bf16(wr[2 * pi]);
            d[1] = 2 * pi + 1 < c->in ? kvp_f32_to_bf16(wr[2 * pi + 1]) : 0;
        }
    }
    split(c->n, ith, nth, &b, &e);
    if (!c->reuse_x)
        cvt_rows(c->tk, c->a, c->x, c->in, c->ina, b, e);
    if (c->res) /* y = res + x·Wᵀ: this thread's rows of the residual */
        memcpy(c->y + (size_t)b * c->out, c->res + (size_t)b * c->out,
               sizeof(float) * (size_t)(e - b) * c->out);
    kvp_pool_barrier(c->pool);
    if (e > b)
        c->tk->gemm((int)(e - b), c->out, c->ina / 2, c->a + (size_t)b * c->ina, (size_t)c->ina, 2,
                    c->wb, (size_t)2 * c->out, c->y + (size_t)b * c->out, (size_t)c->out,
                    c->acc || c->res);
}

static void lin_bwd_worker(void *p, int ith, int nth)
{
    struct lin_ctx *c = p;
    long b, e;
    /* dW += dyᵀ·x: B = x paired by tokens [n/2][in][2], A = dyᵀ pair-interleaved the same */
    split((c->n + 1) / 2, ith, nth, &b, &e);
    if (!c->reuse_x)
        pair_rows(c->tk, c->b, c->x, c->n, c->in, b, e);
    pair_rows(c->tk, c->a, c->dy, c->n, c->out, b, e);
    kvp_pool_barrier(c->pool);
    split(c->out, ith, nth, &b, &e);
    if (e > b)
        c->tk->gemm((int)(e - b), c->in, (int)((c->n + 1) / 2), c->a + 2 * (size_t)b, 2,
                    (size_t)2 * c->out, c->b, (size_t)2 * c->in, c->dw + (size_t)b * c->in,
                    (size_t)c->in, true);
    if (!c->dx)
        return;
    /* dx = dy·W: B[k = out][n = in] pair-interleaved, rows 2p and 2p+1 of W; A (dy as bf16
     * rows) reuses the scratch the dW products read, hence the second barrier */
    split((c->out + 1) / 2, ith, nth, &b, &e);
    pair_rows(c->tk, c->wb, c->w, c->out, c->in, b, e);
    kvp_pool_barrier(c->pool);
    split(c->n, ith, nth, &b, &e);
    cvt_rows(c->tk, c->a, c->dy, c->out, c->outa, b, e);
    if (e > b)
        c->tk->gemm((int)(e - b), c->in, c->outa / 2, c->a + (size_t)b * c->outa, (size_t)c->outa, 2,
                    c->wb, (size_t)2 * c->in, c->dx + (size_t)b * c->in, (size_t)c->in, c->acc);
}

/* kvp_op_linear_fwd in the model's precision. reuse_x: x is the same (same contents) as in the
 * previous linear_fwd call, whose bf16 copy of it is reused (Q, K, V read one input, as do gate
 * and up). res: y = res + x·Wᵀ (a residual; in bf16 each thread copies its rows of it). */
static void linear_fwd(struct kvp_train_model *m, float *y, const float *x, const float *w, long n,
                       int in, int out, float beta, bool reuse_x, const float *res)
{
    if (m->precision == KVP_PREC_F32) {
        if (res)
            memcpy(y, res, sizeof(float) * (size_t)n * out);
        kvp_op_linear_fwd(y, x, w, n, in, out, res ? 1.0f : beta);
        return;
    }
    struct lin_ctx c = {.pool = m->pool, .tk = m->tk, .y = y, .x = x, .w = w, .res = res,
                        .a = m->bf_a, .wb = m->bf_w, .n = n, .in = in, .out = out,
                        .ina = (in + 1) & ~1, .acc = beta != 0.0f, .reuse_x = reuse_x};
    par(m, lin_fwd_worker, &c);
}

/* kvp_op_linear_bwd in the model's precision (dW first, so dx may alias x); reuse_x as for
 * linear_fwd, with the previous linear_bwd call. */
static void linear_bwd(struct kvp_train_model *m, float *dx, float *dw, const float *dy,
                       const float *x, const float *w, long n, int in, int out, float beta_dx,
                       bool reuse_x)
{
    if (m->precision == KVP_PREC_F32) {
        kvp_op_linear_bwd(dx, dw, dy, x, w, n, in, out, beta_dx);
        return;
    }
    struct lin_ctx c = {.pool = m->pool, .tk = m->tk, .dw = dw, .dx = dx, .x = x, .dy = dy,
                        .w = w, .a = m->bf_a, .b = m->bf_b, .wb = m->bf_w, .n = n, .in = in,
                        .out = out, .outa = (out + 1) & ~1, .acc = beta_dx != 0.0f,
                        .reuse_x = reuse_x};
    par(m, lin_bwd_worker, &c);
}

/* ===================================== attention ============================================== */

struct attn_ctx {
    struct kvp_train_model *m;
    struct kvp_train_acts *A;
    int n_seq, T;
    bool bwd;
};

static void attn_worker(void *p, int ith, int nth)
{
    struct attn_ctx *c = p;
    struct kvp_train_model *m = c->m;
    struct kvp_train_acts *A = c->A;
    int H = m->cfg.n_head, Hkv = m->cfg.n_head_kv, hd = m->head_dim, rep = H / Hkv;
    int ldq = H * hd, ldkv = Hkv * hd;
    bool fused = m->precision == KVP_PREC_BF16;
    float *scratch = fused ? m->fa_scratch + kvp_fa_scratch(m->cfg.n_ctx, hd) * (size_t)ith
                           : m->attn_scratch + kvp_op_attn_scratch(m->cfg.n_ctx) * (size_t)ith;
    for (int task = ith; task < c->n_seq * Hkv; task += nth) {
        int b = task / Hkv, g = task % Hkv;
        size_t row = (size_t)b * c->T;
        size_t qo = row * ldq + (size_t)g * rep * hd, kvo = row * ldkv + (size_t)g * hd;
        float *lse = A->lse + ((size_t)b * H + (size_t)g * rep) * c->T;
        if (fused && !c->bwd) {
            kvp_fa_fwd(m->tk, A->att + qo, lse, A->q + qo, A->k + kvo, A->v + kvo, c->T, hd, rep,
                       ldq, ldkv, scratch);
        } else if (fused) {
            kvp_fa_bwd(m->tk, m->dq + qo, m->dk + kvo, m->dv + kvo, m->datt + qo, A->att + qo, lse,
                       A->q + qo, A->k + kvo, A->v + kvo, c->T, hd, rep, ldq, ldkv, scratch);
        } else if (!c->bwd) {
            kvp_op_attn_fwd(A->att + qo, lse, A->q + qo, A->k + kvo, A->v + kvo, c->T, hd, rep,
                            ldq, ldkv, scratch);
        } else {
            kvp_op_attn_bwd(m->dq + qo, m->dk + kvo, m->dv + kvo, m->datt + qo, A->att + qo, lse,
                            A->q + qo, A->k + kvo, A->v + kvo, c->T, hd, rep, ldq, ldkv, scratch);
        }
    }
}

static void attention(struct kvp_train_model *m, struct kvp_train_acts *A, int n_seq, int T,
                      bool bwd)
{
    struct attn_ctx c = {m, A, n_seq, T, bwd};
    int nth = m->n_threads;
    if (nth > n_seq * m->cfg.n_head_kv)
        nth = n_seq * m->cfg.n_head_kv;
    bool blas = m->precision == KVP_PREC_F32 && nth > 1;
    if (blas)
        openblas_set_num_threads(1);
    if (m->precision == KVP_PREC_BF16)
        par(m, attn_worker, &c); /* the whole pool: a thread without a task returns at once */
    else
        par_run(nth, attn_worker, &c);
    if (blas)
        openblas_set_num_threads(m->n_threads);
}

/* ======================================= RoPE ================================================= */

struct rope_ctx {
    const struct kvp_train_model *m;
    float *q, *k;
    long n;
    int T;
    bool inverse;
};

static void rope_worker(void *p, int ith, int nth)
{
    struct rope_ctx *c = p;
    const struct kvp_train_model *m = c->m;
    long b, e;
    split(c->n, ith, nth, &b, &e);
    kvp_op_rope_rows(c->q, m->rope_cos, m->rope_sin, b, e, c->T, m->cfg.n_head, m->head_dim,
                     c->inverse);
    kvp_op_rope_rows(c->k, m->rope_cos, m->rope_sin, b, e, c->T, m->cfg.n_head_kv, m->head_dim,
                     c->inverse);
}

/* RoPE on q [N][H·hd] and k [N][Hkv·hd]: split by token rows on the pool in bf16, on the
 * caller's thread in the f32 reference (as it always ran). */
static void rope_qk(struct kvp_train_model *m, float *q, float *k, int n_seq, int T, bool inverse)
{
    struct rope_ctx c = {m, q, k, (long)n_seq * T, T, inverse};
    if (m->pool && m->precision == KVP_PREC_BF16)
        kvp_pool_run(m->pool, rope_worker, &c);
    else
        rope_worker(&c, 0, 1);
}

/* ===================================== forward ================================================ */

int kvp_train_model_forward(struct kvp_train_model *m, const int32_t *tok, int n_seq, int T,
                            struct kvp_err *err)
{
    const struct kvp_train_config *c = &m->cfg;
    long N = (long)n_seq * T;
    if (n_seq < 1 || T < 1 || T > c->n_ctx || N > m->cap_tokens)
        return kvp_err_set(err, KVP_EINVAL, "batch %d×%d exceeds the run state (%ld tokens, ctx %d)",
                           n_seq, T, m->cap_tokens, c->n_ctx);
    for (long i = 0; i < N; i++)
        if (tok[i] < 0 || tok[i] >= c->n_vocab)
            return kvp_err_set(err, KVP_EINVAL, "token %d out of range", tok[i]);
    if (m->precision == KVP_PREC_F32)
        openblas_set_num_threads(m->n_threads);
    memcpy(m->tok, tok, sizeof(int32_t) * (size_t)N);
    m->cur_seq = n_seq;
    m->cur_T = T;
    int D = c->n_embd, F = c->n_ff, hd = m->head_dim;
    int qd = c->n_head * hd, kvd = c->n_head_kv * hd;
    const float *P = m->params;
    const struct kvp_tk_ops *fast = m->precision == KVP_PREC_BF16 ? m->tk : NULL;

    kvp_op_embed_fwd(m->acts[0].x, P + m->tok_embd, tok, N, D);
    for (int l = 0; l < c->n_layer; l++) {
        struct kvp_train_acts *A = &m->acts[l];
        const struct kvp_train_layer *L = &m->layers[l];
        float *xnext = l + 1 < c->n_layer ? m->acts[l + 1].x : m->xf;
        rmsnorm_fwd(m, A->xn1, A->rstd1, A->x, P + L->attn_norm, N);
        linear_fwd(m, A->q, A->xn1, P + L->wq, N, D, qd, 0.0f, false, NULL);
        linear_fwd(m, A->k, A->xn1, P + L->wk, N, D, kvd, 0.0f, true, NULL);
        linear_fwd(m, A->v, A->xn1, P + L->wv, N, D, kvd, 0.0f, true, NULL);
        rope_qk(m, A->q, A->k, n_seq, T, false);
        attention(m, A, n_seq, T, false);
        linear_fwd(m, A->xmid, A->att, P + L->wo, N, qd, D, 0.0f, false, A->x);
        rmsnorm_fwd(m, A->xn2, A->rstd2, A->xmid, P + L->ffn_norm, N);
        linear_fwd(m, A->gate, A->xn2, P + L->w_gate, N, D, F, 0.0f, false, NULL);
        linear_fwd(m, A->up, A->xn2, P + L->w_up, N, D, F, 0.0f, true, NULL);
        struct glu_ctx g = {.a = m->dff, .g = A->gate, .u = A->up, .n = N * F, .bwd = false,
                            .tk = fast};
        par(m, glu_worker, &g);
        linear_fwd(m, xnext, m->dff, P + L->w_down, N, F, D, 0.0f, false, A->xmid);
    }
    rmsnorm_fwd(m, m->xnf, m->rstdf, m->xf, P + m->output_norm, N);
    linear_fwd(m, m->logits, m->xnf, P + m->output, N, D, c->n_vocab, 0.0f, false, NULL);
    return 0;
}

double kvp_train_model_loss(struct kvp_train_model *m, const int32_t *targets, const float *w,
                            double wsum, float *nll)
{
    struct xent_ctx c = {.logits = m->logits, .nll = nll, .targets = targets, .w = w,
                         .n = (long)m->cur_seq * m->cur_T, .V = m->cfg.n_vocab,
                         .scale = (float)(1.0 / wsum), .fast = m->precision == KVP_PREC_BF16};
    par(m, xent_worker, &c);
    double total = 0.0;
    for (int t = 0; t < m->n_threads; t++)
        total += c.part[t];
    return total;
}

/* ===================================== backward =============================================== */

void kvp_train_model_backward(struct kvp_train_model *m)
{
    const struct kvp_train_config *c = &m->cfg;
    int n_seq = m->cur_seq, T = m->cur_T;
    long N = (long)n_seq * T;
    int D = c->n_embd, F = c->n_ff, hd = m->head_dim, V = c->n_vocab;
    int qd = c->n_head * hd, kvd = c->n_head_kv * hd;
    const float *P = m->params;
    float *G = m->grads;
    const struct kvp_tk_ops *fast = m->precision == KVP_PREC_BF16 ? m->tk : NULL;
    if (m->precision == KVP_PREC_F32)
        openblas_set_num_threads(m->n_threads);

    /* head and final norm: dx = rmsnorm_bwd(dlogits·Wout) */
    linear_bwd(m, m->dtmp, G + m->output, m->logits, m->xnf, P + m->output, N, D, V, 0.0f, false);
    memset(m->dx, 0, sizeof(float) * (size_t)N * D);
    rmsnorm_bwd(m, m->dx, G + m->output_norm, m->dtmp, m->xf, P + m->output_norm, m->rstdf, N);

    for (int l = c->n_layer - 1; l >= 0; l--) {
        struct kvp_train_acts *A = &m->acts[l];
        const struct kvp_train_layer *L = &m->layers[l];
        /* FFN: x_next = xmid + Wdown·swiglu(gate, up); dx holds d x_next */
        struct glu_ctx g = {.a = m->dff, .g = A->gate, .u = A->up, .n = N * F, .bwd = false,
                            .tk = fast};
        par(m, glu_worker, &g);
        linear_bwd(m, m->dff, G + L->w_down, m->dx, m->dff, P + L->w_down, N, F, D, 0.0f, false);
        g = (struct glu_ctx){.dg = m->dg, .du = m->du, .da = m->dff, .g = A->gate, .u = A->up,
                             .n = N * F, .bwd = true, .tk = fast};
        par(m, glu_worker, &g);
        linear_bwd(m, m->dtmp, G + L->w_gate, m->dg, A->xn2, P + L->w_gate, N, D, F, 0.0f, false);
        linear_bwd(m, m->dtmp, G + L->w_up, m->du, A->xn2, P + L->w_up, N, D, F, 1.0f, true);
        rmsnorm_bwd(m, m->dx, G + L->ffn_norm, m->dtmp, A->xmid, P + L->ffn_norm, A->rstd2, N);

        /* attention: xmid = x + Wo·att; dx now holds d xmid */
        linear_bwd(m, m->datt, G + L->wo, m->dx, A->att, P + L->wo, N, qd, D, 0.0f, false);
        memset(m->dk, 0, sizeof(float) * (size_t)N * kvd);
        memset(m->dv, 0, sizeof(float) * (size_t)N * kvd);
        attention(m, A, n_seq, T, true);
        rope_qk(m, m->dq, m->dk, n_seq, T, true);
        linear_bwd(m, m->dtmp, G + L->wq, m->dq, A->xn1, P + L->wq, N, D, qd, 0.0f, false);
        linear_bwd(m, m->dtmp, G + L->wk, m->dk, A->xn1, P + L->wk, N, D, kvd, 1.0f, true);
        linear_bwd(m, m->dtmp, G + L->wv, m->dv, A->xn1, P + L->wv, N, D, kvd, 1.0f, true);
        rmsnorm_bwd(m, m->dx, G + L->attn_norm, m->dtmp, A->x, P + L->attn_norm, A->rstd1, N);
    }
    kvp_op_embed_bwd(G + m->tok_embd, m->dx, m->tok, N, D);
}
