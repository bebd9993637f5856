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
#include "policy/policy.h"
#include "store/store.h"

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
    if (p.kv_tier == KVP_TIER_NONE)
        rc = kvp_kvcache_init(&c->kv, hp->n_layer, hp->n_head_kv, hp->head_dim, p.block_size,
                              p.n_ctx, err);
    else
        rc = kvp_kvcache_init_external(&c->kv, hp->n_layer, hp->n_head_kv, hp->head_dim,
                                       p.block_size, p.n_ctx, err);
    if (rc < 0)
        goto fail;
    if (p.kv_tier != KVP_TIER_NONE) {
        rc = kvp_store_init(&p, &c->kv, hp->n_layer, hp->n_head_kv, hp->head_dim, p.block_size,
                            c->kv.max_blocks, &c->store, err);
        if (rc < 0)
            goto fail;
        c->hot_budget = p.hot_budget;
    }

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
    c->dense_layers = hp->n_layer;
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
    if (c->policy) {
        if (c->policy->ops->free)
            c->policy->ops->free(c->policy);
        free(c->policy);
        c->policy = NULL;
    }
    free(c->sel);
    free(c->sel_blocks);
    free(c->sel_masks);
    free(c->sel_next);
    free(c->sel_next_blocks);
    free(c->sel_next_masks);
    c->sel_next = NULL;
    c->sel_next_blocks = NULL;
    c->sel_next_masks = NULL;
    kvp_free_aligned(c->sparse_probs);
    free(c->ab);
    kvp_free_aligned(c->ab_floats);
    free(c->ab_idx);
    c->ab = NULL;
    c->ab_floats = NULL;
    c->ab_idx = NULL;
    kvp_free_aligned(c->obs);
    kvp_free_aligned(c->colsum);
    c->sel = NULL;
    c->sel_blocks = NULL;
    c->sel_masks = NULL;
    c->sparse_probs = c->obs = c->colsum = NULL;
    c->obs_window = 0;
    c->dense_layers = c->hp.n_layer;
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
    free(c->dense_q);
    free(c->recovery);
    kvp_store_free(c->store);
    kvp_kvcache_free(&c->kv);
    kvp_pool_free(c->pool);
    free(c);
}

void kvp_ctx_reset(kvp_ctx *c)
{
    c->n_tokens = 0;
    if (c->store)
        kvp_store_truncate(c->store, 0);
    else
        kvp_kvcache_clear(&c->kv);
    if (c->colsum)
        memset(c->colsum, 0, (size_t)c->hp.n_layer * c->hp.n_head * c->n_ctx * sizeof(float));
    if (c->policy && c->policy->ops->reset)
        c->policy->ops->reset(c->policy);
}

void kvp_ctx_truncate(kvp_ctx *c, int n)
{
    if (n >= 0 && n < c->n_tokens) {
        c->n_tokens = n;
        if (c->store)
            kvp_store_truncate(c->store, n);
        else
            kvp_kvcache_truncate(&c->kv, n);
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

/* Y[i][r] (+)= dot(W row r, X[i]) for the rows [r0, r1) this thread owns, i < n. */
static void matmul_rows(const struct kvp_mat *W, const float *X, int n, int ldx, float *Y, int ldy,
                        bool accumulate, long r0, long r1, struct kvp_thread_scratch *ts)
{
    if (r0 >= r1)
        return;
    if (n == 1) {
        /* decode: SIMD mat-vec; y indexed by absolute row */
        const void *xq = NULL;
        if (kvp_matvec_xq_bytes(W->type, W->cols) > 0) {
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

/* Decode attention of layer l with a tiered store (store.h): select, let worker 0 bring the
 * selected blocks into the hot tier (and start the cross-layer prefetch of layer l+1), attend,
 * then for cross-token prefetching predict layer l's next selection and start reading it while
 * the rest of this token and the first layers of the next one compute. */
/* The predicted selections of layer l for a step with n_next tokens (every thread's KV heads),
 * timed on worker 0 as prediction; join: wait for every thread's heads before the note. */
static void predict_timed(struct kvp_ctx *c, int l, int n_next, int ith, int nth, bool join)
{
    double tp = ith == 0 ? kvp_time_now() : 0;
    kvp_attn_predict_layer(c, l, n_next, ith, nth);
    if (join)
        kvp_pool_barrier(c->pool);
    if (ith == 0)
        kvp_store_note(c->store, KVP_EV_PREDICT, l, tp, kvp_time_now());
}

static void decode_tiered(struct kvp_ctx *c, int l, int ith, int nth)
{
    struct kvp_store *st = c->store;
    const int n_keys = c->job_pos0 + 1, n_kv = c->hp.n_head_kv;
    const bool sparse = c->policy && l >= c->dense_layers;
    const bool ahead = st->mode == KVP_PREFETCH_LAYER && c->policy && l + 1 < c->hp.n_layer &&
                       l + 1 >= c->dense_layers;
    if (ahead) {
        predict_timed(c, l + 1, n_keys, ith, nth, true);
        if (ith == 0)
            kvp_store_prefetch(st, l + 1, c->sel_next + (size_t)(l + 1) * n_kv, n_keys);
    }
    if (sparse && st->tier == KVP_TIER_RAM) {
        if (ith == 0)
            kvp_store_map_cold(st, l, n_keys, true);
        kvp_pool_barrier(c->pool);
    }
    /* a select that reads every key sees them all, read from disk first (and no early miss
     * read may evict a block under it) */
    const bool all_keys = sparse && st->tier == KVP_TIER_DISK &&
                          c->policy->ops->reads_all_keys &&
                          c->policy->ops->reads_all_keys(c->policy, l);
    if (all_keys) {
        if (ith == 0)
            kvp_store_load_cold(st, l, n_keys);
        kvp_pool_barrier(c->pool);
    }
    if (sparse) {
        /* the first KV heads' misses start while the policy selects for the others */
        long h0, h1;
        kvp_split_range(n_kv, ith, nth, &h0, &h1);
        for (long h = h0; h < h1; h++) {
            kvp_attn_select_head(c, l, c->q, (int)h);
            if (ith == 0 && h + 1 < n_kv && !all_keys)
                kvp_store_acquire_head(st, l, c->sel + (size_t)l * n_kv + h, n_keys);
        }
    }
    kvp_pool_barrier(c->pool);
    if (ith == 0) {
        if (sparse)
            kvp_store_map_cold(st, l, n_keys, false);
        c->store_waits = kvp_store_acquire_begin(st, l, sparse ? c->sel + (size_t)l * n_kv : NULL,
                                                 n_keys);
    }
    kvp_pool_barrier(c->pool);
    /* no step follows the context's last position (and its plan would not fit the buffers) */
    const bool predicts = st->mode == KVP_PREFETCH_TOKEN && sparse && n_keys < c->n_ctx;
    bool predicted = false;
    if (c->store_waits) {
        /* attend to the hot blocks while the rest is read (same bits: attention.h); a policy
         * without on_step predicts from what its select left, so that runs here too */
        if (sparse)
            kvp_attn_decode_early(c, l, c->q, st->pending, ith, nth);
        if (predicts && !c->policy->ops->on_step) {
            predict_timed(c, l, n_keys + 1, ith, nth, false);
            predicted = true;
        }
        kvp_pool_barrier(c->pool);
        if (ith == 0)
            kvp_store_acquire_wait(st);
        kvp_pool_barrier(c->pool);
    }
    kvp_attn_decode_layer(c, l, c->q, c->att, ith, nth);
    if (!predicts)
        return;
    kvp_pool_barrier(c->pool);
    if (!predicted)
        predict_timed(c, l, n_keys + 1, ith, nth, true);
    if (ith == 0)
        kvp_store_prefetch(st, l, c->sel_next + (size_t)l * n_kv, n_keys + 1);
}

/* At the end of a prompt (its last micro-batch, after on_prefill of layer l): the first decode
 * step's predicted selection of layer l, which the store copies into its hot tier while the
 * layer is staged; NULL when the store does not predict or no decode step can follow. */
static const struct kvp_sel *first_step_prediction(struct kvp_ctx *c, int l)
{
    const int mode = c->store->mode;
    if (!c->job_last || !c->policy || !c->policy->ops->predict_next || l < c->dense_layers ||
        c->job_end >= c->n_ctx || (mode != KVP_PREFETCH_TOKEN && mode != KVP_PREFETCH_LAYER))
        return NULL;
    kvp_attn_predict_layer(c, l, c->job_end + 1, 0, 1);
    return c->sel_next + (size_t)l * c->hp.n_head_kv;
}

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
        double t_layer = 0;
        if (c->store && ith == 0) {
            t_layer = kvp_time_now();
            if (n > 1) /* stage the layer's whole KV for prefill attention */
                kvp_store_prefill_begin(c->store, l, pos0, pos0 + n);
        }
        for (long i = t0; i < t1; i++)
            rmsnorm(c->xn + i * D, c->x + i * D, L->attn_norm, D, hp->norm_eps);
        kvp_pool_barrier(c->pool);

        long r0, r1;
        kvp_split_range(q_dim, ith, nth, &r0, &r1);
        matmul_rows(&L->wq, c->xn, n, D, c->q, q_dim, false, r0, r1, ts);
        add_bias(c->q, n, q_dim, L->bq, r0, r1);
        kvp_split_range(kv_dim, ith, nth, &r0, &r1);
        matmul_rows(&L->wk, c->xn, n, D, c->k, kv_dim, false, r0, r1, ts);
        add_bias(c->k, n, kv_dim, L->bk, r0, r1);
        matmul_rows(&L->wv, c->xn, n, D, c->v, kv_dim, false, r0, r1, ts);
        add_bias(c->v, n, kv_dim, L->bv, r0, r1);
        kvp_pool_barrier(c->pool);

        for (long i = t0; i < t1; i++) {
            rope_apply(c->q + i * q_dim, hp->n_head, hd, c->rope + i * hd, hp->rope_style);
            rope_apply(c->k + i * kv_dim, hp->n_head_kv, hd, c->rope + i * hd, hp->rope_style);
            for (int h = 0; h < hp->n_head_kv; h++)
                kvp_kvcache_store(&c->kv, l, h, pos0 + (int)i, c->k + i * kv_dim + h * hd,
                                  c->v + i * kv_dim + h * hd);
        }
        kvp_pool_barrier(c->pool);

        if (n == 1 && c->store)
            decode_tiered(c, l, ith, nth);
        else if (n == 1)
            kvp_attn_decode_layer(c, l, c->q, c->att, ith, nth);
        else
            kvp_attn_prefill_layer(c, l, ith, nth);
        kvp_pool_barrier(c->pool);
        if (c->job_prefill && c->job_last && ith == 0) {
            /* the prompt is complete for this layer: let the policy look at it (and evict) */
            struct kvp_prefill_obs ob = {
                .n_prompt = c->job_end,
                .n_obs = c->obs_n,
                .obs = c->obs,
                .colsum = c->colsum ? c->colsum + (size_t)l * hp->n_head * c->n_ctx : NULL,
                .q_last = c->q + (size_t)(n - 1) * q_dim,
            };
            c->policy->ops->on_prefill(c->policy, l, &ob);
        }
        if (c->store && n > 1 && ith == 0)
            kvp_store_prefill_end(c->store, l, pos0, pos0 + n, first_step_prediction(c, l),
                                  c->job_end + 1);

        kvp_split_range(D, ith, nth, &r0, &r1);
        matmul_rows(&L->wo, c->att, n, q_dim, c->x, D, true, r0, r1, ts);
        add_bias(c->x, n, D, L->bo, r0, r1);
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
        if (c->store && n == 1 && ith == 0)
            kvp_store_note(c->store, KVP_EV_LAYER, l, t_layer, kvp_time_now());
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
    /* After an evicting policy has dropped tokens, prefill attention (which reads every cached
     * token) no longer applies: feed further tokens one at a time through the decode path. */
    if (n > 1 && c->policy && c->policy->ops->evicting && c->n_tokens > 0) {
        for (int i = 0; i < n; i++) {
            float *out = !logits ? NULL : all_logits ? logits + (size_t)i * c->hp.n_vocab
                                        : (i == n - 1 ? logits : NULL);
            int rc = kvp_eval(c, tokens + i, 1, out, false, err);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    int rc = c->store ? 0 : kvp_kvcache_reserve(&c->kv, c->n_tokens + n, err);
    if (rc < 0)
        return rc;
    c->job_end = c->n_tokens + n;
    c->job_prefill = n > 1 && c->policy && c->policy->ops->on_prefill;
    c->obs_n = c->obs_window < c->job_end ? c->obs_window : c->job_end;
    if (c->job_prefill && c->colsum && c->n_tokens == 0)
        memset(c->colsum, 0, (size_t)c->hp.n_layer * c->hp.n_head * c->n_ctx * sizeof(float));
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
        if (c->store && nb == 1)
            kvp_store_step_begin(c->store, c->n_tokens);
        kvp_pool_run(c->pool, forward_worker, c);
        if (c->store && nb == 1)
            kvp_store_step_end(c->store);
        c->n_tokens += nb;
        done += nb;
        if (c->store && (rc = kvp_store_take_error(c->store, err)) < 0)
            return rc;
    }
    return 0;
}

/* ---- policies and measuring --------------------------------------------------------------- */

const char *kvp_policy_name(int i)
{
    for (int k = 0; kvp_policy_registry[k]; k++)
        if (k == i)
            return kvp_policy_registry[k]->name;
    return NULL;
}

/* Hot slots per tiered layer: hot_budget tokens, or by default twice what one step's selection
 * needs. One step needs, per KV head, the budget's blocks plus two partial ones at the window
 * edges, times the KV heads whose union a unit carries, plus the newest block; a policy whose
 * predictions read ahead of its budget (prefetch_margin) gets room for that too in the modes
 * that predict, so a prefetch does not run out of slots. The factor 2 is reuse room: blocks
 * that drop out of a selection come back a few steps later (scores oscillate around the top-k
 * threshold), and with only one step's room LRU has already replaced them (README, tiered store:
 * at 32K the shipped model's hit rate goes from 87 % to 98 % and reads per token fall 6x). */
static int hot_blocks_for(const struct kvp_ctx *c)
{
    const int bs = c->kv.block_size;
    if (c->hot_budget > 0)
        return (c->hot_budget + bs - 1) / bs;
    if (!c->policy)
        return 0;
    const struct kvp_policy_params *pp = &c->policy->p;
    long b = pp->budget > 0         ? pp->budget
             : pp->budget_ratio > 0 ? (long)(pp->budget_ratio * c->n_ctx + 0.999)
                                    : c->n_ctx;
    bool predicts = c->store && (c->store->mode == KVP_PREFETCH_TOKEN ||
                                 c->store->mode == KVP_PREFETCH_LAYER);
    long per_head = (b + bs - 1) / bs + 2 + (predicts ? c->policy->prefetch_margin : 0);
    long n = 2 * ((long)c->hp.n_head_kv * per_head + 1);
    return n > c->kv.max_blocks ? c->kv.max_blocks : (int)n;
}

/* Rebuild the hot tier for the current policy (no-op without a store). */
static int store_reconfigure(struct kvp_ctx *c, struct kvp_err *err)
{
    if (!c->store)
        return 0;
    int dense = c->policy ? c->dense_layers : c->hp.n_layer;
    return kvp_store_configure(c->store, dense, hot_blocks_for(c), err);
}

/* Sparse attention's per-block state (attention.h) for each KV head. With a tiered store the
 * early pass keeps up to one tiered layer's hot slots of reduced blocks per KV head (no more
 * blocks of a selection can be hot at once); without one it keeps none. */
static int alloc_attn_blocks(struct kvp_ctx *c)
{
    const int n_kv = c->hp.n_head_kv, g = c->hp.n_head / n_kv, hd = c->hp.head_dim;
    const int mb = c->kv.max_blocks;
    int cap = c->store ? hot_blocks_for(c) + 1 : 0;
    if (cap > mb)
        cap = mb;
    size_t per = (size_t)g * mb + (size_t)g * hd + g + (size_t)g * cap * hd + (size_t)cap * g;
    c->ab = calloc((size_t)n_kv, sizeof(*c->ab));
    c->ab_floats = falloc((size_t)n_kv * per);
    c->ab_idx = calloc((size_t)n_kv * (cap ? cap : 1), sizeof(int32_t));
    if (!c->ab || !c->ab_floats || !c->ab_idx)
        return -1;
    for (int h = 0; h < n_kv; h++) {
        float *f = c->ab_floats + (size_t)h * per;
        struct kvp_attn_blocks *ab = &c->ab[h];
        ab->bmax = f;
        ab->bmax_stride = mb;
        ab->tmp = f += (size_t)g * mb;
        ab->tmp_l = f += (size_t)g * hd;
        ab->o = f += g;
        ab->lsum = f + (size_t)g * cap * hd;
        ab->idx = c->ab_idx + (size_t)h * cap;
        ab->cap = cap;
    }
    return 0;
}

int kvp_ctx_set_policy(kvp_ctx *c, const struct kvp_policy_params *params, struct kvp_err *err)
{
    free_policy(c);
    kvp_ctx_reset(c);
    int rc0 = store_reconfigure(c, err);
    if (rc0 < 0 || !params || !params->name)
        return rc0;
    const struct kvp_policy_ops *ops = kvp_policy_find(params->name);
    if (!ops) {
        char names[512] = "";
        for (int k = 0; kvp_policy_registry[k]; k++) {
            strncat(names, k ? ", " : "", sizeof(names) - strlen(names) - 1);
            strncat(names, kvp_policy_registry[k]->name, sizeof(names) - strlen(names) - 1);
        }
        return kvp_err_set(err, KVP_EINVAL, "unknown policy '%s' (known: %s)", params->name,
                           names);
    }
    const struct kvp_hparams *hp = &c->hp;
    if (c->store && ops->evicting)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "policy '%s' evicts tokens; the tiered KV store needs a policy that "
                           "keeps the whole cache (it selects per step)",
                           ops->name);
    if (hp->n_head / hp->n_head_kv > 64)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "GQA groups larger than 64 heads");
    struct kvp_policy *p = calloc(1, sizeof(*p));
    if (!p)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    p->ops = ops;
    p->p = *params;
    /* defaults */
    if (p->p.sink <= 0)
        p->p.sink = p->p.sink < 0 ? 0 : 16;
    if (p->p.local <= 0)
        p->p.local = p->p.local < 0 ? 0 : 16;
    if (p->p.window <= 0)
        p->p.window = 32;
    if (p->p.pool <= 0)
        p->p.pool = 5;
    if (p->p.dense_layers == 0)
        p->p.dense_layers = 2;
    else if (p->p.dense_layers < 0)
        p->p.dense_layers = 0;
    if (p->p.dense_layers > hp->n_layer)
        p->p.dense_layers = hp->n_layer;
    if (p->p.gqa_agg < 0 || p->p.gqa_agg > KVP_AGG_SUM) {
        int agg = p->p.gqa_agg;
        free(p);
        return kvp_err_set(err, KVP_EINVAL, "unknown GQA aggregation %d", agg);
    }
    if (p->p.budget < 0 || p->p.budget_ratio < 0 || p->p.budget_ratio > 1) {
        free(p);
        return kvp_err_set(err, KVP_EINVAL, "budget must be >= 0 and ratio in (0, 1]");
    }
    p->env = (struct kvp_policy_env){.n_layer = hp->n_layer, .n_head = hp->n_head,
                                     .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                                     .block_size = c->kv.block_size, .n_ctx = c->n_ctx,
                                     .kv = &c->kv};
    int rc = ops->init ? ops->init(p, err) : 0;
    if (rc < 0) {
        free(p);
        return rc;
    }
    c->policy = p;
    c->dense_layers = p->p.dense_layers;
    size_t n_lh = (size_t)hp->n_layer * hp->n_head_kv, mb = (size_t)c->kv.max_blocks;
    c->sel = calloc(n_lh, sizeof(*c->sel));
    c->sel_blocks = calloc(n_lh * mb, sizeof(int32_t));
    c->sel_masks = calloc(n_lh * mb, sizeof(uint64_t));
    c->sparse_probs = falloc((size_t)hp->n_head * c->probs_stride);
    int rc_ab = alloc_attn_blocks(c);
    c->obs_window = ops->wants_obs ? p->p.window : 0;
    if (c->obs_window)
        c->obs = falloc((size_t)hp->n_head * c->obs_window * c->n_ctx);
    if (ops->wants_colsum)
        c->colsum = falloc((size_t)hp->n_layer * hp->n_head * c->n_ctx);
    if (!c->sel || !c->sel_blocks || !c->sel_masks || !c->sparse_probs || rc_ab < 0 ||
        (c->obs_window && !c->obs) || (ops->wants_colsum && !c->colsum)) {
        free_policy(c);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for policy buffers");
    }
    for (size_t i = 0; i < n_lh; i++) {
        c->sel[i].blocks = c->sel_blocks + i * mb;
        c->sel[i].mask = c->sel_masks + i * mb;
    }
    if (c->store) {
        c->sel_next = calloc(n_lh, sizeof(*c->sel_next));
        c->sel_next_blocks = calloc(n_lh * mb, sizeof(int32_t));
        c->sel_next_masks = calloc(n_lh * mb, sizeof(uint64_t));
        if (!c->sel_next || !c->sel_next_blocks || !c->sel_next_masks) {
            free_policy(c);
            store_reconfigure(c, NULL);
            return kvp_err_set(err, KVP_ENOMEM, "out of memory for policy buffers");
        }
        for (size_t i = 0; i < n_lh; i++) {
            c->sel_next[i].blocks = c->sel_next_blocks + i * mb;
            c->sel_next[i].mask = c->sel_next_masks + i * mb;
        }
        if ((rc = store_reconfigure(c, err)) < 0) {
            free_policy(c);
            store_reconfigure(c, NULL);
            return rc;
        }
    }
    if (c->colsum)
        memset(c->colsum, 0, (size_t)hp->n_layer * hp->n_head * c->n_ctx * sizeof(float));
    c->kv.release = !c->measure;
    return 0;
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
    if (!c->measure || !c->policy || layer < c->dense_layers || layer >= c->hp.n_layer ||
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
