/*
 * Forward pass of the `llama` architecture (formats.md §3.3): batched prefill and single-token
 * decode over the block-paged KV cache.
 *
 * One call to kvp_eval runs as a single thread-pool region: every thread walks the same sequence
 * of operations, takes its share of each (rows of a weight matrix, tokens, or attention heads),
 * and meets the others at a barrier where an operation depends on the previous one's full
 * output. That keeps the per-token overhead of a tiny model to a few barriers instead of dozens
 * of thread wake-ups. Matrix products of a batch go through OpenBLAS sgemm (single-threaded per
 * call; each pool thread owns a slice of the output rows); a single token uses the SIMD mat-vec.
 * Decode attention is the blocked kernel of attention.c; prefill attention gathers each KV head
 * into contiguous rows and uses sgemm per chunk of 64 queries.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "core/err.h"
#include "core/platform.h"
#include "forward/attention.h"
#include "forward/context.h"
#include "kernels/simd.h"
#include "kernels/types.h"

/* ---- setup -------------------------------------------------------------------------------- */

static float *falloc(size_t n)
{
    return kvp_alloc_aligned(n * sizeof(float));
}

int kvp_ctx_init(const kvp_model *model, const struct kvp_ctx_params *params, kvp_ctx **out,
                 struct kvp_err *err)
{
    struct kvp_ctx_params p = params ? *params : (struct kvp_ctx_params){0};
    const struct kvp_hparams *hp = &model->hp;
    if (p.n_ctx <= 0)
        p.n_ctx = hp->n_ctx_train;
    if (p.n_threads <= 0)
        p.n_threads = 1;
    if (p.block_size <= 0)
        p.block_size = 16;
    if (p.n_batch <= 0)
        p.n_batch = 512;
    if (p.n_ctx > (1 << 24))
        return kvp_err_set(err, KVP_EINVAL, "context %d too large", p.n_ctx);
    if (p.n_batch > p.n_ctx)
        p.n_batch = p.n_ctx;

    struct kvp_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    c->model = model;
    c->hp = *hp;
    c->n_ctx = p.n_ctx;
    c->n_batch = p.n_batch;
    c->n_threads = p.n_threads;
    int rc = kvp_pool_init(p.n_threads, &c->pool, err);
    if (rc < 0)
        goto fail;
    rc = kvp_kvcache_init(&c->kv, hp->n_layer, hp->n_head_kv, hp->head_dim, p.block_size, p.n_ctx,
                          err);
    if (rc < 0)
        goto fail;

    size_t nb = (size_t)c->n_batch;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim;
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t max_cols = (size_t)hp->n_embd;
    if ((size_t)hp->n_ff > max_cols)
        max_cols = (size_t)hp->n_ff;
    if (q_dim > max_cols)
        max_cols = q_dim;
    c->inv_freq = calloc((size_t)hp->head_dim / 2, sizeof(double));
    c->x = falloc(nb * hp->n_embd);
    c->xn = falloc(nb * hp->n_embd);
    c->q = falloc(nb * q_dim);
    c->k = falloc(nb * kv_dim);
    c->v = falloc(nb * kv_dim);
    c->att = falloc(nb * q_dim);
    c->gate = falloc(nb * hp->n_ff);
    c->up = falloc(nb * hp->n_ff);
    c->rope = falloc(nb * hp->head_dim);
    c->probs_stride = c->kv.max_blocks * c->kv.block_size;
    c->probs = falloc((size_t)hp->n_head * c->probs_stride);
    c->ts = calloc((size_t)p.n_threads, sizeof(*c->ts));
    if (!c->inv_freq || !c->x || !c->xn || !c->q || !c->k || !c->v || !c->att || !c->gate ||
        !c->up || !c->rope || !c->probs || !c->ts)
        goto fail_nomem;
    for (int t = 0; t < p.n_threads; t++) {
        struct kvp_thread_scratch *s = &c->ts[t];
        s->kc = falloc((size_t)c->n_ctx * hp->head_dim);
        s->vc = falloc((size_t)c->n_ctx * hp->head_dim);
        s->s = falloc((size_t)KVP_QCHUNK * c->n_ctx);
        s->tile = falloc((size_t)KVP_TILE_ROWS * max_cols);
        s->xq = kvp_alloc_aligned(max_cols * 2 + 64);
        if (!s->kc || !s->vc || !s->s || !s->tile || !s->xq)
            goto fail_nomem;
    }
    for (int i = 0; i < hp->head_dim / 2; i++)
        c->inv_freq[i] = pow((double)hp->rope_base, -2.0 * i / hp->head_dim);
    /* each pool thread calls sgemm on its own slice: keep OpenBLAS itself single-threaded */
    openblas_set_num_threads(1);
    *out = c;
    return 0;

fail_nomem:
    rc = kvp_err_set(err, KVP_ENOMEM, "cannot allocate buffers for context %d", p.n_ctx);
fail:
    kvp_ctx_free(c);
    return rc;
}

void kvp_ctx_free(kvp_ctx *c)
{
    if (!c)
        return;
    if (c->ts) {
        for (int t = 0; t < c->n_threads; t++) {
            kvp_free_aligned(c->ts[t].kc);
            kvp_free_aligned(c->ts[t].vc);
            kvp_free_aligned(c->ts[t].s);
            kvp_free_aligned(c->ts[t].tile);
            kvp_free_aligned(c->ts[t].xq);
        }
        free(c->ts);
    }
    float *bufs[] = {c->x, c->xn, c->q, c->k, c->v, c->att, c->gate, c->up, c->rope, c->probs};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        kvp_free_aligned(bufs[i]);
    free(c->inv_freq);
    kvp_kvcache_free(&c->kv);
    kvp_pool_free(c->pool);
    free(c);
}

void kvp_ctx_reset(kvp_ctx *c)
{
    c->n_tokens = 0;
}

void kvp_ctx_truncate(kvp_ctx *c, int n)
{
    if (n >= 0 && n < c->n_tokens)
        c->n_tokens = n;
}

int kvp_ctx_n_tokens(const kvp_ctx *c)
{
    return c->n_tokens;
}

int kvp_ctx_n_ctx(const kvp_ctx *c)
{
    return c->n_ctx;
}

/* ---- building blocks ---------------------------------------------------------------------- */

/* Y[i][r] (+)= dot(W row r, X[i]) for the rows [r0, r1) this thread owns, i < n. */
static void matmul_rows(const struct kvp_mat *W, const float *X, int n, int ldx, float *Y, int ldy,
                        bool accumulate, long r0, long r1, struct kvp_thread_scratch *ts)
{
    if (r0 >= r1)
        return;
    if (n == 1) {
        /* decode: SIMD mat-vec; y indexed by absolute row */
        const void *xq = NULL;
        if (W->type == KVP_TYPE_Q8_0) {
            kvp_matvec_prepare(W->type, X, W->cols, ts->xq);
            xq = ts->xq;
        }
        if (!accumulate) {
            kvp_matvec_rows(W, X, xq, Y, r0, r1);
            return;
        }
        /* wo and w_down accumulate into the residual; their rows (n_embd) fit in the tile */
        kvp_matvec_rows(W, X, xq, ts->tile, r0, r1);
        for (long r = r0; r < r1; r++)
            Y[r] += ts->tile[r];
        return;
    }
    float beta = accumulate ? 1.0f : 0.0f;
    if (W->type == KVP_TYPE_F32) {
        const float *w = (const float *)W->data + (size_t)r0 * W->cols;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)(r1 - r0), (int)W->cols, 1.0f,
                    X, ldx, w, (int)W->cols, beta, Y + r0, ldy);
        return;
    }
    for (long a = r0; a < r1; a += KVP_TILE_ROWS) {
        long b = a + KVP_TILE_ROWS < r1 ? a + KVP_TILE_ROWS : r1;
        kvp_mat_dequant_rows(W, ts->tile, a, b);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)(b - a), (int)W->cols, 1.0f, X,
                    ldx, ts->tile, (int)W->cols, beta, Y + a, ldy);
    }
}

/* Split the rows of W among threads and multiply. */
static void matmul(const struct kvp_mat *W, const float *X, int n, int ldx, float *Y, int ldy,
                   bool accumulate, int ith, int nth, struct kvp_thread_scratch *ts)
{
    long r0, r1;
    kvp_split_range((long)W->rows, ith, nth, &r0, &r1);
    matmul_rows(W, X, n, ldx, Y, ldy, accumulate, r0, r1, ts);
}

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

/* Rotate adjacent pairs of every head in vec (n_heads heads of hd) by the angles in cs. */
static void rope_apply(float *vec, int n_heads, int hd, const float *cs)
{
    for (int h = 0; h < n_heads; h++) {
        float *p = vec + (size_t)h * hd;
        for (int i = 0; i < hd / 2; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = p[2 * i], x1 = p[2 * i + 1];
            p[2 * i] = x0 * c - x1 * s;
            p[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

/* ---- the pass ----------------------------------------------------------------------------- */

static void forward_worker(void *arg, int ith, int nth)
{
    struct kvp_ctx *c = arg;
    const struct kvp_model *m = c->model;
    const struct kvp_hparams *hp = &c->hp;
    struct kvp_thread_scratch *ts = &c->ts[ith];
    const int n = c->job_n;
    const int pos0 = c->job_pos0;
    const int D = hp->n_embd, hd = hp->head_dim;
    const int q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    long t0, t1;
    kvp_split_range(n, ith, nth, &t0, &t1); /* this thread's tokens */

    /* embeddings and RoPE angles for this thread's tokens */
    const struct kvp_type_traits *et = kvp_type_traits(m->tok_embd.type);
    for (long i = t0; i < t1; i++) {
        const uint8_t *row = (const uint8_t *)m->tok_embd.data +
                             (size_t)c->job_tokens[i] * m->tok_embd.row_bytes;
        et->to_f32(row, c->x + i * D, D);
        double pos = (double)(pos0 + i);
        for (int j = 0; j < hd / 2; j++) {
            double th = pos * c->inv_freq[j];
            c->rope[i * hd + 2 * j] = (float)cos(th);
            c->rope[i * hd + 2 * j + 1] = (float)sin(th);
        }
    }
    kvp_pool_barrier(c->pool);

    for (int l = 0; l < hp->n_layer; l++) {
        const struct kvp_layer_weights *L = &m->layers[l];
        for (long i = t0; i < t1; i++)
            rmsnorm(c->xn + i * D, c->x + i * D, L->attn_norm, D, hp->norm_eps);
        kvp_pool_barrier(c->pool);

        matmul(&L->wq, c->xn, n, D, c->q, q_dim, false, ith, nth, ts);
        matmul(&L->wk, c->xn, n, D, c->k, kv_dim, false, ith, nth, ts);
        matmul(&L->wv, c->xn, n, D, c->v, kv_dim, false, ith, nth, ts);
        kvp_pool_barrier(c->pool);

        for (long i = t0; i < t1; i++) {
            rope_apply(c->q + i * q_dim, hp->n_head, hd, c->rope + i * hd);
            rope_apply(c->k + i * kv_dim, hp->n_head_kv, hd, c->rope + i * hd);
            for (int h = 0; h < hp->n_head_kv; h++)
                kvp_kvcache_store(&c->kv, l, h, pos0 + (int)i, c->k + i * kv_dim + h * hd,
                                  c->v + i * kv_dim + h * hd);
        }
        kvp_pool_barrier(c->pool);

        if (n == 1)
            kvp_attn_decode_layer(c, l, c->q, c->att, ith, nth);
        else
            kvp_attn_prefill_layer(c, l, ith, nth);
        kvp_pool_barrier(c->pool);

        matmul(&L->wo, c->att, n, q_dim, c->x, D, true, ith, nth, ts);
        kvp_pool_barrier(c->pool);

        for (long i = t0; i < t1; i++)
            rmsnorm(c->xn + i * D, c->x + i * D, L->ffn_norm, D, hp->norm_eps);
        kvp_pool_barrier(c->pool);

        /* gate and up: each thread owns the same rows of both, so SwiGLU needs no barrier */
        long f0, f1;
        kvp_split_range(hp->n_ff, ith, nth, &f0, &f1);
        matmul_rows(&L->w_gate, c->xn, n, D, c->gate, hp->n_ff, false, f0, f1, ts);
        matmul_rows(&L->w_up, c->xn, n, D, c->up, hp->n_ff, false, f0, f1, ts);
        for (int i = 0; i < n; i++) {
            float *g = c->gate + (size_t)i * hp->n_ff, *u = c->up + (size_t)i * hp->n_ff;
            for (long j = f0; j < f1; j++)
                g[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
        }
        kvp_pool_barrier(c->pool);

        matmul(&L->w_down, c->gate, n, hp->n_ff, c->x, D, true, ith, nth, ts);
        kvp_pool_barrier(c->pool);
    }

    if (!c->job_logits)
        return;
    /* final norm and classifier, for every token or only the last */
    int first = c->job_all_logits ? 0 : n - 1;
    int n_out = n - first;
    long o0, o1;
    kvp_split_range(n_out, ith, nth, &o0, &o1);
    for (long i = o0; i < o1; i++)
        rmsnorm(c->xn + (first + i) * D, c->x + (first + i) * D, m->output_norm, D, hp->norm_eps);
    kvp_pool_barrier(c->pool);
    matmul(&m->output, c->xn + (size_t)first * D, n_out, D, c->job_logits, hp->n_vocab, false, ith,
           nth, ts);
}

int kvp_eval(kvp_ctx *c, const int32_t *tokens, int n, float *logits, bool all_logits,
             struct kvp_err *err)
{
    if (n <= 0)
        return kvp_err_set(err, KVP_EINVAL, "no tokens to evaluate");
    if (n > c->n_ctx - c->n_tokens)
        return kvp_err_set(err, KVP_ERANGE,
                           "%d tokens do not fit: %d of the context's %d are already used", n,
                           c->n_tokens, c->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->hp.n_vocab)
            return kvp_err_set(err, KVP_EINVAL, "token id %d out of range 0..%d", tokens[i],
                               c->hp.n_vocab - 1);
    /* micro-batches of at most n_batch tokens */
    for (int done = 0; done < n;) {
        int nb = n - done < c->n_batch ? n - done : c->n_batch;
        bool last = done + nb == n;
        c->job_tokens = tokens + done;
        c->job_n = nb;
        c->job_pos0 = c->n_tokens;
        c->job_all_logits = all_logits;
        if (logits && all_logits)
            c->job_logits = logits + (size_t)done * c->hp.n_vocab;
        else
            c->job_logits = (logits && last) ? logits : NULL;
        kvp_pool_run(c->pool, forward_worker, c);
        c->n_tokens += nb;
        done += nb;
    }
    return 0;
}
