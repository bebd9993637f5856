/*
 * Forward pass of the `llama` architecture (formats.md §3.3): batched prefill and single-token
 * decode over the block-paged KV cache.
 *
 * One call to kvp_eval runs as a single thread-pool region: every thread walks the same sequence
 * of operations, takes its share of each (rows of a weight matrix, tokens, or attention heads),
 * and meets the others at a barrier where an operation depends on the previous one's full
 * output. That keeps the per-token overhead of a tiny model to a few barriers instead of dozens
 * of thread wake-ups. Matrix products of a batch go through the integer GEMM
 * (kernels/prefill_gemm.h: Q8_0/Q4_0/Q5_0 weights on a CPU with AVX-512 VNNI, the batch quantized
 * once per input) or else OpenBLAS sgemm on dequantized tiles (single-threaded per call); each
 * pool thread owns a slice of the output rows. A single token uses the SIMD mat-vec.
 * Everything a layer does with the KV cache (writing K and V, selection, the tiered store,
 * decode and prefill attention, the policy's hooks) is one call, kvp_kv_layer (kv_step.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "core/err.h"
#include "core/platform.h"
#include "forward/context.h"
#include "forward/kv_step.h"
#include "kernels/prefill_gemm.h"
#include "kernels/simd.h"
#include "kernels/types.h"
#include "policy/host.h"

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
    if ((rc = kvp_kv_init(c, &p, err)) < 0)
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
    /* the integer GEMM's quantized batch, when this CPU has the kernel */
    if (kvp_simd()->gemm_tile &&
        !(c->xg = kvp_alloc_aligned(kvp_gemm_xq_bytes(c->n_batch, (int64_t)max_cols))))
        goto fail_nomem;
    if (!c->inv_freq || !c->x || !c->xn || !c->q || !c->k || !c->v || !c->att || !c->gate ||
        !c->up || !c->rope || !c->probs || !c->ts)
        goto fail_nomem;
    for (int t = 0; t < p.n_threads; t++) {
        struct kvp_thread_scratch *s = &c->ts[t];
        s->kc = falloc((size_t)c->n_ctx * hp->head_dim);
        s->vc = falloc((size_t)c->n_ctx * hp->head_dim);
        s->s = falloc((size_t)KVP_QCHUNK * c->n_ctx);
        s->tile = falloc((size_t)KVP_TILE_ROWS * max_cols);
        c->tile_bytes = (size_t)KVP_TILE_ROWS * max_cols * sizeof(float);
        s->xq = kvp_alloc_aligned(max_cols * 2 + 64);
        s->xq_type = -1;
        if (!s->kc || !s->vc || !s->s || !s->tile || !s->xq)
            goto fail_nomem;
    }
    c->pol.env = (struct kvp_policy_env){.n_layer = hp->n_layer, .n_head = hp->n_head,
                                         .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                                         .block_size = c->kv.block_size, .n_ctx = c->n_ctx,
                                         .kv = &c->kv};
    c->pol.dense_layers = hp->n_layer;
    for (int i = 0; i < hp->head_dim / 2; i++) {
        /* θ_i = pos · base^(−2i/d) · freq_scale / ff_i (formats.md §3.4, §3.5) */
        c->inv_freq[i] = pow((double)hp->rope_base, -2.0 * i / hp->head_dim) * hp->rope_freq_scale;
        if (model->rope_freqs)
            c->inv_freq[i] /= model->rope_freqs[i];
    }
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

/* Drop the policy and every buffer that exists only for it. */
static void free_policy(struct kvp_ctx *c)
{
    kvp_policy_host_clear(&c->pol);
    kvp_kv_release(c);
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
    free_policy(c);
    kvp_free_aligned(c->dense_probs);
    kvp_free_aligned(c->xg);
    free(c->dense_q);
    free(c->recovery);
    kvp_kv_free(c);
    kvp_pool_free(c->pool);
    free(c);
}

void kvp_ctx_reset(kvp_ctx *c)
{
    c->n_tokens = 0;
    kvp_kv_clear(c);
    kvp_policy_reset(&c->pol);
}

void kvp_ctx_truncate(kvp_ctx *c, int n)
{
    if (n >= 0 && n < c->n_tokens) {
        c->n_tokens = n;
        kvp_kv_truncate(c, n);
    }
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

/* Y[i][r] (+)= dot(W row r, X[i]) for the rows [r0, r1) this thread owns, i < n. same_x: X is
 * the input of this thread's previous matmul_rows call, unchanged (K and V after Q, up after
 * gate), so a decode step, or a batch through the integer GEMM, reuses its quantized copy when
 * the weight types want the same one. Every thread calls this for every product (the GEMM path
 * has a barrier). */
static void matmul_rows(struct kvp_ctx *c, const struct kvp_mat *W, const float *X, int n, int ldx,
                        float *Y, int ldy, bool accumulate, bool same_x, long r0, long r1, int ith,
                        int nth)
{
    struct kvp_thread_scratch *ts = &c->ts[ith];
    if (c->xg && kvp_gemm_wants(W->type, n)) {
        /* prefill, integer GEMM: the batch quantized once into the shared c->xg, each thread
         * its tokens; every thread takes this branch for the same W and n, so all meet at the
         * barrier */
        if (!(same_x && ts->xg_ready)) {
            long t0, t1;
            kvp_split_range(n, ith, nth, &t0, &t1);
            kvp_gemm_quantize(X, ldx, W->cols, n, t0, t1, c->xg, ts->xq);
            kvp_pool_barrier(c->pool);
        }
        ts->xg_ready = true;
        ts->xq_type = -1;
        if (r0 < r1)
            kvp_gemm_rows(W, c->xg, n, Y, ldy, accumulate, r0, r1, ts->tile, c->tile_bytes);
        return;
    }
    ts->xg_ready = false;
    int vt = n == 1 && r0 < r1 && kvp_matvec_xq_bytes(W->type, W->cols) > 0
                 ? kvp_type_vec_dot_type(W->type)
                 : -1;
    bool reuse = same_x && vt >= 0 && ts->xq_type == vt;
    ts->xq_type = vt;
    if (r0 >= r1)
        return;
    if (n == 1) {
        /* decode: SIMD mat-vec; y indexed by absolute row */
        const void *xq = NULL;
        if (vt >= 0) {
            if (!reuse)
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
static void matmul(struct kvp_ctx *c, const struct kvp_mat *W, const float *X, int n, int ldx,
                   float *Y, int ldy, bool accumulate, int ith, int nth)
{
    long r0, r1;
    kvp_split_range((long)W->rows, ith, nth, &r0, &r1);
    matmul_rows(c, W, X, n, ldx, Y, ldy, accumulate, false, r0, r1, ith, nth);
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

/* Rotate every head in vec (n_heads heads of hd) by the angles in cs: pairs (2i, 2i+1) for NORM,
 * (i, i + hd/2) for NEOX. */
static void rope_apply(float *vec, int n_heads, int hd, const float *cs, int style)
{
    int stride = style == KVP_ROPE_NEOX ? 1 : 2;      /* distance between pair starts */
    int other = style == KVP_ROPE_NEOX ? hd / 2 : 1;  /* offset of the pair's second element */
    for (int h = 0; h < n_heads; h++) {
        float *p = vec + (size_t)h * hd;
        for (int i = 0; i < hd / 2; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float *a = p + i * stride, *b = a + other;
            float x0 = *a, x1 = *b;
            *a = x0 * c - x1 * s;
            *b = x0 * s + x1 * c;
        }
    }
}

/* y[i][r] += bias[r] for the rows [r0, r1) of n vectors of width ld. */
static void add_bias(float *y, int n, int ld, const float *bias, long r0, long r1)
{
    if (!bias)
        return;
    for (int i = 0; i < n; i++)
        for (long r = r0; r < r1; r++)
            y[(size_t)i * ld + r] += bias[r];
}

/* ---- the pass ----------------------------------------------------------------------------- */

static void forward_worker(void *arg, int ith, int nth)
{
    struct kvp_ctx *c = arg;
    const struct kvp_model *m = c->model;
    const struct kvp_hparams *hp = &c->hp;
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
        double t_layer = ith == 0 ? kvp_time_now() : 0;
        for (long i = t0; i < t1; i++)
            rmsnorm(c->xn + i * D, c->x + i * D, L->attn_norm, D, hp->norm_eps);
        kvp_pool_barrier(c->pool);

        long r0, r1;
        kvp_split_range(q_dim, ith, nth, &r0, &r1);
        matmul_rows(c, &L->wq, c->xn, n, D, c->q, q_dim, false, false, r0, r1, ith, nth);
        add_bias(c->q, n, q_dim, L->bq, r0, r1);
        kvp_split_range(kv_dim, ith, nth, &r0, &r1);
        matmul_rows(c, &L->wk, c->xn, n, D, c->k, kv_dim, false, true, r0, r1, ith, nth);
        add_bias(c->k, n, kv_dim, L->bk, r0, r1);
        matmul_rows(c, &L->wv, c->xn, n, D, c->v, kv_dim, false, true, r0, r1, ith, nth);
        add_bias(c->v, n, kv_dim, L->bv, r0, r1);
        kvp_pool_barrier(c->pool);

        for (long i = t0; i < t1; i++) {
            rope_apply(c->q + i * q_dim, hp->n_head, hd, c->rope + i * hd, hp->rope_style);
            rope_apply(c->k + i * kv_dim, hp->n_head_kv, hd, c->rope + i * hd, hp->rope_style);
        }
        /* K and V into the cache, attention into c->att (kv_step.h) */
        kvp_kv_layer(c, l, ith, nth);
        kvp_pool_barrier(c->pool);

        kvp_split_range(D, ith, nth, &r0, &r1);
        matmul_rows(c, &L->wo, c->att, n, q_dim, c->x, D, true, false, r0, r1, ith, nth);
        add_bias(c->x, n, D, L->bo, r0, r1);
        kvp_pool_barrier(c->pool);

        for (long i = t0; i < t1; i++)
            rmsnorm(c->xn + i * D, c->x + i * D, L->ffn_norm, D, hp->norm_eps);
        kvp_pool_barrier(c->pool);

        /* gate and up: each thread owns the same rows of both, so SwiGLU needs no barrier */
        long f0, f1;
        kvp_split_range(hp->n_ff, ith, nth, &f0, &f1);
        matmul_rows(c, &L->w_gate, c->xn, n, D, c->gate, hp->n_ff, false, false, f0, f1, ith,
                    nth);
        matmul_rows(c, &L->w_up, c->xn, n, D, c->up, hp->n_ff, false, true, f0, f1, ith, nth);
        for (int i = 0; i < n; i++) {
            float *g = c->gate + (size_t)i * hp->n_ff, *u = c->up + (size_t)i * hp->n_ff;
            for (long j = f0; j < f1; j++)
                g[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
        }
        kvp_pool_barrier(c->pool);

        matmul(c, &L->w_down, c->gate, n, hp->n_ff, c->x, D, true, ith, nth);
        kvp_pool_barrier(c->pool);
        kvp_kv_layer_done(c, l, t_layer, ith);
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
    matmul(c, &m->output, c->xn + (size_t)first * D, n_out, D, c->job_logits, hp->n_vocab, false,
           ith, nth);
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
    /* After an evicting policy has dropped tokens, prefill attention (which reads every cached
     * token) no longer applies: feed further tokens one at a time through the decode path. */
    if (n > 1 && kvp_policy_evicting(&c->pol) && c->n_tokens > 0) {
        for (int i = 0; i < n; i++) {
            float *out = !logits ? NULL : all_logits ? logits + (size_t)i * c->hp.n_vocab
                                        : (i == n - 1 ? logits : NULL);
            int rc = kvp_eval(c, tokens + i, 1, out, false, err);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    int rc = kvp_kv_check(c, err);
    if (rc < 0)
        return rc;
    rc = kvp_kv_reserve(c, n, err);
    if (rc < 0)
        return rc;
    c->job_end = c->n_tokens + n;
    c->job_prefill = n > 1 && kvp_policy_wants_prefill(&c->pol);
    c->obs_n = c->pol.obs_window < c->job_end ? c->pol.obs_window : c->job_end;
    if (c->job_prefill && c->pol.colsum && c->n_tokens == 0)
        memset(c->pol.colsum, 0,
               (size_t)c->hp.n_layer * c->hp.n_head * c->n_ctx * sizeof(float));
    /* micro-batches of at most n_batch tokens */
    for (int done = 0; done < n;) {
        int nb = n - done < c->n_batch ? n - done : c->n_batch;
        bool last = done + nb == n;
        c->job_last = last;
        c->job_tokens = tokens + done;
        c->job_n = nb;
        c->job_pos0 = c->n_tokens;
        c->job_all_logits = all_logits;
        if (logits && all_logits)
            c->job_logits = logits + (size_t)done * c->hp.n_vocab;
        else
            c->job_logits = (logits && last) ? logits : NULL;
        kvp_kv_batch_begin(c);
        kvp_pool_run(c->pool, forward_worker, c);
        rc = kvp_kv_batch_end(c, err);
        c->n_tokens += nb;
        done += nb;
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- policies and measuring --------------------------------------------------------------- */

int kvp_ctx_set_policy_ops(kvp_ctx *c, const struct kvp_policy_ops *ops,
                           const struct kvp_policy_params *params, struct kvp_err *err)
{
    free_policy(c);
    kvp_ctx_reset(c);
    int rc = kvp_kv_configure(c, err);
    if (rc < 0 || !params || (!ops && !params->name))
        return rc;
    if (!ops && !(ops = kvp_policy_lookup(params->name, err)))
        return KVP_EINVAL;
    if ((rc = kvp_kv_accepts(c, ops, err)) < 0)
        return rc;
    rc = kvp_policy_host_set(&c->pol, ops, params, &c->pol.env, kvp_kv_wants_predictions(c), err);
    if (rc < 0)
        return rc;
    if ((rc = kvp_kv_configure(c, err)) < 0) {
        free_policy(c);
        kvp_kv_configure(c, NULL);
        return rc;
    }
    c->kv.release = !c->measure;
    return 0;
}

int kvp_ctx_set_policy(kvp_ctx *c, const struct kvp_policy_params *params, struct kvp_err *err)
{
    return kvp_ctx_set_policy_ops(c, NULL, params, err);
}

double kvp_ctx_policy_seconds(const kvp_ctx *c)
{
    return kvp_policy_hook_time(&c->pol, false);
}

double kvp_ctx_policy_cpu_seconds(const kvp_ctx *c)
{
    return kvp_policy_hook_time(&c->pol, true);
}

void kvp_ctx_policy_reset_seconds(kvp_ctx *c)
{
    kvp_policy_reset_hook_time(&c->pol);
}

void kvp_ctx_set_measure(kvp_ctx *c, bool on)
{
    c->measure = on;
    c->kv.release = !on;
    if (on && !c->dense_probs) {
        size_t n_lh = (size_t)c->hp.n_layer * c->hp.n_head;
        c->dense_probs = falloc(n_lh * c->probs_stride);
        c->dense_q = calloc(n_lh * c->hp.head_dim, sizeof(float));
        c->recovery = malloc(n_lh * sizeof(double));
        if (!c->dense_probs || !c->dense_q || !c->recovery) {
            kvp_free_aligned(c->dense_probs);
            free(c->dense_q);
            free(c->recovery);
            c->dense_q = NULL;
            c->dense_probs = NULL;
            c->recovery = NULL;
            c->measure = false;
            return;
        }
    }
    if (c->recovery)
        for (size_t i = 0; i < (size_t)c->hp.n_layer * c->hp.n_head; i++)
            c->recovery[i] = -1.0;
}

const float *kvp_ctx_dense_probs(const kvp_ctx *c, int layer, int head, int *n_keys)
{
    if (!c->measure || !kvp_policy_sparse(&c->pol, layer) || layer >= c->hp.n_layer ||
        head < 0 || head >= c->hp.n_head)
        return NULL;
    if (n_keys)
        *n_keys = c->n_tokens;
    return c->dense_probs + ((size_t)layer * c->hp.n_head + head) * c->probs_stride;
}

const float *kvp_ctx_dense_query(const kvp_ctx *c, int layer, int head)
{
    if (!kvp_ctx_dense_probs(c, layer, head, NULL))
        return NULL;
    return c->dense_q + ((size_t)layer * c->hp.n_head + head) * c->hp.head_dim;
}

double kvp_ctx_recovery(const kvp_ctx *c, int layer, int head)
{
    if (!c->measure || !c->recovery || layer < 0 || layer >= c->hp.n_layer || head < 0 ||
        head >= c->hp.n_head)
        return -1.0;
    return c->recovery[(size_t)layer * c->hp.n_head + head];
}

void kvp_ctx_kv_bytes(const kvp_ctx *c, size_t *resident, size_t *kept)
{
    if (resident)
        *resident = kvp_kvcache_resident_bytes(&c->kv, c->n_tokens);
    if (kept)
        *kept = kvp_kvcache_kept_bytes(&c->kv, c->n_tokens);
}

