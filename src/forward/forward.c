/*
 * Forward pass of the `llama` architecture (docs/formats.md §3.3): batched prefill and
 * single-token decode over the block-paged KV cache.
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
 * decode and prefill attention, the policy's hooks) is one call per layer for all the pass's
 * sequences, kvp_kv_step (kv_step.h).
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "core/err.h"
#include "core/fastmath.h"
#include "core/platform.h"
#include "forward/context_internal.h"
#include "forward/kv_step.h"
#include "forward/local_attention.h"
#include "forward/sparse_prefill.h"
#include "kernels/prefill_gemm.h"
#include "kernels/simd.h"
#include "kernels/types.h"
#include "kv/attention.h"
#include "model/rope.h"
#include "policy/host.h"
#include "kvpred_lab.h"

/* ---- setup -------------------------------------------------------------------------------- */

static float *falloc(size_t n)
{
    return kvp_alloc_aligned(n * sizeof(float));
}

static void free_packed(struct kvp_shared *sh);

/* Widest input of any product: activations are quantized or tiled at this width. */
static size_t max_cols_of(const struct kvp_hparams *hp)
{
    size_t q_dim = (size_t)hp->n_head * hp->head_dim;
    size_t max_cols = (size_t)hp->n_embd;
    if ((size_t)hp->n_ff > max_cols)
        max_cols = (size_t)hp->n_ff;
    return q_dim > max_cols ? q_dim : max_cols;
}

int kvp_shared_init(const struct kvp_model *model, int n_threads, int n_batch, int n_ctx,
                    struct kvp_shared **out, struct kvp_err *err)
{
    const struct kvp_hparams *hp = &model->hp;
    struct kvp_shared *sh = calloc(1, sizeof(*sh));
    if (!sh)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    sh->model = model;
    sh->n_threads = n_threads;
    sh->n_batch = n_batch;
    sh->n_ctx = n_ctx;
    int rc = kvp_pool_init(n_threads, &sh->pool, err);
    if (rc < 0) {
        kvp_shared_free(sh);
        return rc;
    }
    size_t nb = (size_t)n_batch;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim;
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t max_cols = max_cols_of(hp);
    sh->inv_freq = calloc((size_t)hp->head_dim / 2, sizeof(double));
    sh->x = falloc(nb * hp->n_embd);
    sh->xn = falloc(nb * hp->n_embd);
    sh->q = falloc(nb * q_dim);
    sh->k = falloc(nb * kv_dim);
    sh->v = falloc(nb * kv_dim);
    sh->att = falloc(nb * q_dim);
    sh->gate = falloc(nb * hp->n_ff);
    sh->up = falloc(nb * hp->n_ff);
    sh->rope = falloc(nb * hp->head_dim);
    sh->row_tok = calloc(nb, sizeof(int32_t));
    sh->row_pos = calloc(nb, sizeof(int32_t));
    sh->seqs = calloc(nb, sizeof(*sh->seqs));
    sh->multi = calloc(nb + 1, sizeof(*sh->multi));
    sh->single = calloc(nb, sizeof(*sh->single));
    sh->out_multi = calloc(nb, sizeof(*sh->out_multi));
    sh->out_single = calloc(nb, sizeof(*sh->out_single));
    sh->ts = calloc((size_t)n_threads, sizeof(*sh->ts));
    atomic_init(&sh->pair_next, 0);
    atomic_init(&sh->prefill_next, 0);
    /* one decode row's activations quantized for the mat-vec (Q8_0 or Q8_K: under 2 bytes per
     * column), whole cache lines apart */
    sh->xv_stride = (max_cols * 2 + 64 + 63) & ~(size_t)63;
    sh->tile_bytes = (size_t)KVP_TILE_ROWS * max_cols * sizeof(float);
    /* the integer GEMM's quantized batch, when this CPU has the kernel */
    if ((kvp_simd()->gemm_tile || kvp_simd()->gemm_tile_k) &&
        !(sh->xg = kvp_alloc_aligned(kvp_gemm_xq_bytes(n_batch, (int64_t)max_cols))))
        goto fail_nomem;
    if (!sh->inv_freq || !sh->x || !sh->xn || !sh->q || !sh->k || !sh->v || !sh->att ||
        !sh->gate || !sh->up || !sh->rope || !sh->row_tok || !sh->row_pos || !sh->seqs ||
        !sh->multi || !sh->single || !sh->out_multi || !sh->out_single || !sh->ts)
        goto fail_nomem;
    for (int t = 0; t < n_threads; t++) {
        struct kvp_thread_scratch *s = &sh->ts[t];
        /* prefill attention's chunks reach the end of their window of KVP_QCHUNK positions */
        const size_t keys = ((size_t)n_ctx + KVP_QCHUNK - 1) / KVP_QCHUNK * KVP_QCHUNK;
        s->kc = falloc(keys * hp->head_dim);
        s->vc = falloc(keys * hp->head_dim);
        s->s = falloc((size_t)KVP_QCHUNK * keys);
        s->qwin = falloc((size_t)KVP_QCHUNK * hp->head_dim);
        s->owin = falloc((size_t)KVP_QCHUNK * hp->head_dim);
        s->tile = falloc((size_t)KVP_TILE_ROWS * max_cols);
        s->win = falloc((size_t)KVP_SGEMM_TOKENS * max_cols);
        s->wout = falloc((size_t)KVP_SGEMM_TOKENS * KVP_TILE_ROWS);
        s->xq = kvp_alloc_aligned(max_cols * 2 + 64);
        s->xv = kvp_alloc_aligned(nb * sh->xv_stride);
        s->xvp = calloc(nb, sizeof(*s->xvp));
        s->yvp = calloc(nb, sizeof(*s->yvp));
        s->xq_type = -1;
        s->xv_type = -1;
        if (!s->kc || !s->vc || !s->s || !s->qwin || !s->owin || !s->tile || !s->win ||
            !s->wout || !s->xq || !s->xv || !s->xvp || !s->yvp)
            goto fail_nomem;
        /* the slots a piece leaves empty are read by sgemm (their results are dropped): zeros,
         * not whatever the allocator left there */
        memset(s->win, 0, (size_t)KVP_SGEMM_TOKENS * max_cols * sizeof(float));
        memset(s->wout, 0, (size_t)KVP_SGEMM_TOKENS * KVP_TILE_ROWS * sizeof(float));
        memset(s->qwin, 0, (size_t)KVP_QCHUNK * hp->head_dim * sizeof(float));
    }
    /* θ_i = pos · inv_freq_i: base^(−2i/d), scaled (linear, YaRN) and divided by a file's
     * frequency factors (model/rope.h) */
    kvp_rope_freqs(model, n_ctx, false, sh->inv_freq, &sh->rope_mscale);
    if (hp->n_swa > 0 && hp->rope_base_local != hp->rope_base) {
        double mscale_local;
        sh->inv_freq_local = calloc((size_t)hp->head_dim / 2, sizeof(double));
        sh->rope_local = falloc(nb * hp->head_dim);
        if (!sh->inv_freq_local || !sh->rope_local)
            goto fail_nomem;
        kvp_rope_freqs(model, n_ctx, true, sh->inv_freq_local, &mscale_local);
    }
    /* each pool thread calls sgemm on its own slice: keep OpenBLAS itself single-threaded */
    openblas_set_num_threads(1);
    *out = sh;
    return 0;

fail_nomem:
    kvp_shared_free(sh);
    return kvp_err_set(err, KVP_ENOMEM, "cannot allocate buffers for %d threads, batch %d, "
                       "context %d", n_threads, n_batch, n_ctx);
}

void kvp_shared_free(struct kvp_shared *sh)
{
    if (!sh)
        return;
    if (sh->ts) {
        for (int t = 0; t < sh->n_threads; t++) {
            kvp_free_aligned(sh->ts[t].kc);
            kvp_free_aligned(sh->ts[t].vc);
            kvp_free_aligned(sh->ts[t].s);
            kvp_free_aligned(sh->ts[t].tile);
            kvp_free_aligned(sh->ts[t].win);
            kvp_free_aligned(sh->ts[t].qwin);
            kvp_free_aligned(sh->ts[t].owin);
            kvp_free_aligned(sh->ts[t].wout);
            kvp_free_aligned(sh->ts[t].xq);
            kvp_free_aligned(sh->ts[t].xv);
            free(sh->ts[t].xvp);
            free(sh->ts[t].yvp);
        }
        free(sh->ts);
    }
    float *bufs[] = {sh->x, sh->xn, sh->q, sh->k, sh->v, sh->att, sh->gate, sh->up, sh->rope};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        kvp_free_aligned(bufs[i]);
    kvp_free_aligned(sh->xg);
    free_packed(sh);
    free(sh->inv_freq);
    free(sh->inv_freq_local);
    kvp_free_aligned(sh->rope_local);
    free(sh->row_tok);
    free(sh->row_pos);
    free(sh->seqs);
    free(sh->multi);
    free(sh->single);
    free(sh->out_multi);
    free(sh->out_single);
    kvp_pool_free(sh->pool);
    free(sh);
}

int kvp_seq_setup(struct kvp_shared *sh, const struct kvp_ctx_params *params, struct kvp_ctx **out,
                  struct kvp_err *err)
{
    struct kvp_ctx_params p = *params;
    const struct kvp_hparams *hp = &sh->model->hp;
    if (p.n_ctx <= 0)
        p.n_ctx = sh->n_ctx;
    if (p.block_size <= 0)
        p.block_size = 16;
    if (p.n_ctx > sh->n_ctx)
        return kvp_err_set(err, KVP_EINVAL, "context %d exceeds the engine's %d", p.n_ctx,
                           sh->n_ctx);
    struct kvp_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    c->model = sh->model;
    c->hp = *hp;
    c->sh = sh;
    c->pool = sh->pool;
    c->n_ctx = p.n_ctx;
    if (p.kv_ring) { /* copied, so that a fork may open its store after the caller's is gone */
        c->ring = *p.kv_ring;
        p.kv_ring = &c->ring;
    }
    c->params = p;
    int rc = kvp_kv_init(c, &p, err);
    if (rc < 0)
        goto fail;
    c->probs_stride = c->kv.max_blocks * c->kv.block_size;
    c->probs = falloc((size_t)hp->n_head * c->probs_stride);
    /* the chunk states of dense decode spread over the pool: only where a context has chunks */
    const int g = hp->n_head / hp->n_head_kv;
    c->dchunk_max = kvp_attn_dense_chunks(c->probs_stride, c->kv.block_size);
    const bool chunks = c->dchunk_max > 1 && kvp_attn_chunked(g, hp->head_dim);
    if (chunks)
        c->dchunk = falloc((size_t)hp->n_head_kv * c->dchunk_max *
                           kvp_attn_state_floats(g, hp->head_dim));
    if (!c->probs || (chunks && !c->dchunk)) {
        rc = kvp_err_set(err, KVP_ENOMEM, "cannot allocate buffers for context %d", p.n_ctx);
        goto fail;
    }
    c->pol.env = (struct kvp_policy_env){.n_layer = hp->n_layer, .n_head = hp->n_head,
                                         .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                                         .block_size = c->kv.block_size, .n_ctx = c->n_ctx,
                                         .kv = &c->kv};
    c->pol.dense_layers = hp->n_layer;
    if (p.prefill && (rc = kvp_spf_set(c, &c->spf, p.prefill, err)) < 0)
        goto fail;
    c->params.prefill = NULL; /* borrowed only here: a fork starts dense */
    *out = c;
    return 0;

fail:
    kvp_ctx_free(c);
    return rc;
}

int kvp_ctx_init(const kvp_model *model, const struct kvp_ctx_params *params, kvp_ctx **out,
                 struct kvp_err *err)
{
    struct kvp_ctx_params p = params ? *params : (struct kvp_ctx_params){0};
    if (p.n_ctx <= 0)
        p.n_ctx = model->hp.n_ctx_train;
    if (p.n_threads <= 0)
        p.n_threads = 1;
    if (p.n_batch <= 0)
        p.n_batch = 512;
    if (p.n_ctx > (1 << 24))
        return kvp_err_set(err, KVP_EINVAL, "context %d too large", p.n_ctx);
    if (p.n_batch > p.n_ctx)
        p.n_batch = p.n_ctx;
    struct kvp_shared *sh;
    int rc = kvp_shared_init(model, p.n_threads, p.n_batch, p.n_ctx, &sh, err);
    if (rc < 0)
        return rc;
    sh->pack = !p.no_pack;
    if ((rc = kvp_seq_setup(sh, &p, out, err)) < 0) {
        kvp_shared_free(sh);
        return rc;
    }
    (*out)->own_sh = true;
    return 0;
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
    kvp_free_aligned(c->probs);
    kvp_free_aligned(c->dchunk);
    kvp_spf_free(c->spf);
    free_policy(c);
    kvp_free_aligned(c->dense_probs);
    free(c->dense_q);
    free(c->recovery);
    kvp_kv_free(c);
    if (c->own_sh)
        kvp_shared_free(c->sh);
    free(c);
}

void kvp_ctx_reset(kvp_ctx *c)
{
    kvp_ctx_tokens_set(c, 0);
    c->job_end = 0;
    c->pol_seen = 0;
    kvp_spf_forget(c->spf, 0);
    kvp_kv_clear(c);
    kvp_policy_reset(&c->pol);
}

bool kvp_ctx_truncate_keeps(const kvp_ctx *c, int n)
{
    return n >= c->n_tokens || kvp_kvcache_truncate_keeps(&c->kv, n); /* rings, if any */
}

void kvp_ctx_truncate(kvp_ctx *c, int n)
{
    if (n >= 0 && n < c->n_tokens && !kvp_kvcache_truncate_keeps(&c->kv, n)) {
        kvp_ctx_reset(c); /* a sliding-window ring no longer holds what the cut would need */
        return;
    }
    if (n >= 0 && n < c->n_tokens) {
        kvp_ctx_tokens_set(c, n);
        c->job_end = 0;
        if (c->pol_seen > n)
            c->pol_seen = n;
        kvp_spf_forget(c->spf, n);
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

const struct kvp_hparams *kvp_ctx_hparams(const kvp_ctx *c)
{
    return &c->hp;
}

struct kvp_kvcache *kvp_ctx_kvcache(kvp_ctx *c)
{
    return &c->kv;
}

const struct kvp_kvcache *kvp_ctx_kvcache_const(const kvp_ctx *c)
{
    return &c->kv;
}

struct kvp_policy_host *kvp_ctx_policy_host(kvp_ctx *c)
{
    return &c->pol;
}

const struct kvp_policy_host *kvp_ctx_policy_host_const(const kvp_ctx *c)
{
    return &c->pol;
}

int kvp_ctx_probs_stride(const kvp_ctx *c)
{
    return c->probs_stride;
}

int kvp_ctx_n_batch(const kvp_ctx *c)
{
    return c->sh->n_batch;
}

struct kvp_store *kvp_ctx_store(kvp_ctx *c)
{
    return c->store;
}

bool kvp_ctx_has_store(const kvp_ctx *c)
{
    return c->store != NULL;
}

void kvp_ctx_set_n_tokens(kvp_ctx *c, int n)
{
    kvp_spf_forget(c->spf, 0); /* the caller wrote every block */
    kvp_ctx_tokens_set(c, n);
}

bool kvp_ctx_measuring(const kvp_ctx *c)
{
    return c->measure;
}

/* ---- weights packed in lanes ------------------------------------------------------------- */

/* Entry i of sh->lanes: matrix i % KVP_PACK_PER_LAYER of layer i / KVP_PACK_PER_LAYER, or the
 * classifier (the last entry). */
static const struct kvp_mat *pack_mat(const struct kvp_model *m, size_t i)
{
    const int l = (int)(i / KVP_PACK_PER_LAYER), k = (int)(i % KVP_PACK_PER_LAYER);
    if (l == m->hp.n_layer)
        return &m->output;
    const struct kvp_layer_weights *L = &m->layers[l];
    const struct kvp_mat *mats[KVP_PACK_PER_LAYER] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
                                                      &L->w_gate, &L->w_up, &L->w_down};
    return mats[k];
}

static size_t n_packable(const struct kvp_model *m)
{
    return (size_t)m->hp.n_layer * KVP_PACK_PER_LAYER + 1;
}

/* Matrix k of layer l packed in lanes (l == n_layer: the classifier), or NULL (not packed: the
 * mat-vec kernels' paths). */
static const struct kvp_lanes *packed(const struct kvp_shared *sh, int l, int k)
{
    if (!sh->lanes)
        return NULL;
    const struct kvp_lanes *P = &sh->lanes[(size_t)l * KVP_PACK_PER_LAYER + k];
    return P->mem ? P : NULL;
}

/* Each thread packs its share of every packed matrix's tiles. */
static void pack_worker(void *arg, int ith, int nth)
{
    struct kvp_shared *sh = arg;
    const struct kvp_model *m = sh->model;
    for (size_t i = 0; i < n_packable(m); i++) {
        struct kvp_lanes *P = &sh->lanes[i];
        if (!P->mem)
            continue;
        long t0, t1;
        kvp_split_range((long)kvp_lanes_tiles(P), ith, nth, &t0, &t1);
        kvp_lanes_pack(P, pack_mat(m, i), t0, t1);
    }
}

static void free_packed(struct kvp_shared *sh)
{
    if (!sh->lanes)
        return;
    for (size_t i = 0; i < n_packable(sh->model); i++)
        kvp_lanes_free(&sh->lanes[i]);
    free(sh->lanes);
    kvp_free_aligned(sh->lanes_arena);
    sh->lanes = NULL;
    sh->lanes_arena = NULL;
    sh->lanes_bytes = 0;
}

/* Where matrix i's tiles start in the arena: each matrix on a 4 KiB page of its own, where the
 * L2 streamer starts afresh. */
static size_t arena_step(size_t bytes)
{
    return (bytes + 4095) & ~(size_t)4095;
}

/* Pack every layer matrix whose type has a lanes kernel, once, on the first step with a decode
 * token (before the pool runs that step, so no thread reads sh->lanes while it is made). Why
 * once: turning 16 rows into a lanes tile costs about three vectors' products, which per call
 * made the kernel lose to the mat-vec and the GEMM; packed, a step's decode tokens cost one read
 * of the packed weights plus a few microseconds per token (docs/batched.md, "Exact or fast
 * steps"). Out of memory is not an error: steps run without. */
static void pack_weights(struct kvp_shared *sh)
{
    const struct kvp_model *m = sh->model;
    sh->pack_tried = true;
    if (!(sh->lanes = calloc(n_packable(m), sizeof(*sh->lanes))))
        return;
    /* one allocation on huge pages: a step streams every matrix once, and on 4 KiB pages each
     * page of it is a TLB miss the L2 streamer cannot cross (Q4_K file of the SmolLM2-135M
     * shape, 2 threads: 402-430 -> 438-446 tok/s for one sequence, 718-735 -> 777-787 for
     * eight, alternating; docs/performance.md) */
    size_t total = 0;
    for (size_t i = 0; i < n_packable(m); i++) {
        size_t b = arena_step(kvp_lanes_bytes(pack_mat(m, i)));
        if (b > SIZE_MAX - total) {
            free_packed(sh);
            return;
        }
        total += b;
    }
    if (total == 0 || !(sh->lanes_arena = kvp_alloc_huge(total, KVP_HUGE_PAGE))) {
        free_packed(sh);
        return;
    }
    uint8_t *at = sh->lanes_arena;
    for (size_t i = 0; i < n_packable(m); i++) {
        const struct kvp_mat *W = pack_mat(m, i);
        size_t b = kvp_lanes_bytes(W);
        if (!b)
            continue;
        if (kvp_lanes_init_at(&sh->lanes[i], W, at) < 0) {
            free_packed(sh);
            return;
        }
        at += arena_step(b);
        sh->lanes_bytes += sh->lanes[i].bytes;
    }
    kvp_pool_run(sh->pool, pack_worker, sh);
}

size_t kvp_shared_pack(struct kvp_shared *sh)
{
    if (sh->pack && !sh->pack_tried)
        pack_weights(sh);
    return sh->lanes ? sh->lanes_bytes : 0;
}

size_t kvp_ctx_pack_weights(kvp_ctx *c)
{
    return c ? kvp_shared_pack(c->sh) : 0;
}

/* ---- building blocks ---------------------------------------------------------------------- */

/* Y[i][0..nr) (+)= dot(w row r, X[i]) for the n rows of X, w nr <= KVP_TILE_ROWS f32 weight rows
 * of K columns. pos0 is the position of X's first row when the rows are one sequence's tokens:
 * then every sgemm call has the same shape, KVP_SGEMM_TOKENS rows, and the token at position p
 * sits in slot p mod KVP_SGEMM_TOKENS, a piece's first and last rows copied into the thread's
 * window at their slots (the other slots' results are dropped). OpenBLAS's sums for a row depend
 * on the call's shape and on the row's slot in it: its Haswell kernel rounds the rows of a
 * call's last partial tile otherwise than full tiles, and within a full tile of 12 its two
 * halves differently; its SkylakeX kernel takes another path for small calls. A prompt
 * prefilled in two pieces (a follow-up after a cut, a piece of a batched step) then differed from
 * one prefill. Fixed calls make a token's products a function of its position and inputs alone.
 * pos0 < 0 (a lone context, an engine that need not be exact): one call as the rows come. */
static void sgemm_tokens(struct kvp_thread_scratch *ts, const float *w, long nr, long K,
                         const float *X, int n, int ldx, int pos0, float *Y, int ldy, float beta)
{
    if (pos0 < 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)nr, (int)K, 1.0f, X, ldx, w,
                    (int)K, beta, Y, ldy);
        return;
    }
    const int T = KVP_SGEMM_TOKENS;
    for (int w0 = -(pos0 % T); w0 < n; w0 += T) {
        const int v0 = w0 > 0 ? w0 : 0, v1 = w0 + T < n ? w0 + T : n;
        if (v0 == w0 && v1 == w0 + T) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, (int)nr, (int)K, 1.0f,
                        X + (size_t)w0 * ldx, ldx, w, (int)K, beta, Y + (size_t)w0 * ldy, ldy);
            continue;
        }
        /* the same call on the window: the rows (and what they accumulate onto) at their slots */
        for (int i = v0; i < v1; i++) {
            memcpy(ts->win + (size_t)(i - w0) * K, X + (size_t)i * ldx, (size_t)K * sizeof(float));
            if (beta != 0.0f)
                memcpy(ts->wout + (size_t)(i - w0) * nr, Y + (size_t)i * ldy,
                       (size_t)nr * sizeof(float));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, (int)nr, (int)K, 1.0f, ts->win,
                    (int)K, w, (int)K, beta, ts->wout, (int)nr);
        for (int i = v0; i < v1; i++)
            memcpy(Y + (size_t)i * ldy, ts->wout + (size_t)(i - w0) * nr,
                   (size_t)nr * sizeof(float));
    }
}

/* Y[i][r] (+)= dot(W row r, X[i]) for the rows [r0, r1) this thread owns, i < n, n >= 2 (the
 * multi-token rows of one sequence, the first at position pos0; -1: no fixed windows, a lone
 * context's or a non-exact engine's rows, or the single rows of such a step together). same_x: X is the input of this thread's previous call,
 * unchanged (K and V after Q, up after gate), so a batch through the integer GEMM reuses its
 * quantized copy. Every thread calls this for every product (the GEMM path has a barrier). */
static void matmul_rows(struct kvp_shared *sh, const struct kvp_mat *W, const float *X, int n,
                        int ldx, int pos0, float *Y, int ldy, bool accumulate, bool same_x,
                        long r0, long r1, int ith, int nth)
{
    struct kvp_thread_scratch *ts = &sh->ts[ith];
    if (sh->xg && kvp_gemm_wants(W->type, n)) {
        /* integer GEMM: the rows quantized once into the shared sh->xg, each thread its tokens;
         * every thread takes this branch for the same W and n, so all meet at the barrier */
        int vt = kvp_type_vec_dot_type(W->type);
        if (!(same_x && ts->xg_ready == vt)) {
            long t0, t1;
            kvp_split_range(n, ith, nth, &t0, &t1);
            kvp_gemm_quantize(W->type, X, ldx, W->cols, n, t0, t1, sh->xg, ts->xq);
            kvp_pool_barrier(sh->pool);
        }
        ts->xg_ready = vt;
        if (r0 < r1)
            kvp_gemm_rows(W, sh->xg, n, Y, ldy, accumulate, r0, r1, ts->tile, sh->tile_bytes);
        return;
    }
    ts->xg_ready = -1;
    float beta = accumulate ? 1.0f : 0.0f;
    /* OpenBLAS sgemm on tiles of KVP_TILE_ROWS weight rows, dequantized unless they are f32 */
    for (long a = r0; a < r1; a += KVP_TILE_ROWS) {
        long b = a + KVP_TILE_ROWS < r1 ? a + KVP_TILE_ROWS : r1;
        const float *w = (const float *)W->data + (size_t)a * W->cols;
        if (W->type != KVP_TYPE_F32) {
            kvp_mat_dequant_rows(W, ts->tile, a, b);
            w = ts->tile;
        }
        sgemm_tokens(ts, w, b - a, (long)W->cols, X, n, ldx, pos0, Y + a, ldy, beta);
    }
}

/* Rows per pass of the multi-vector product: about 16 KiB of weights, so a group of rows stays in
 * L1 while every vector reads it, a multiple of 8 so the row kernels group the rows as one call
 * over the whole range would (their per-row sums do not depend on the grouping anyway). */
static long rows_per_group(const struct kvp_mat *W)
{
    size_t rb = W->row_bytes ? W->row_bytes : 1;
    long g = (long)(16384 / rb) & ~7L;
    return g > 8 ? g : 8;
}

/* The single rows segs[0..n) against rows [r0, r1) of W: each is the decode mat-vec of one token,
 * bit for bit (same quantized activations, same kernel per row), with the weight rows read from
 * memory once for all of them. Activations are quantized into this thread's ts->xv, reused when
 * same_x and the vec_dot type matches (the mat-vec's own reuse rule). */
static void matvec_multi(struct kvp_shared *sh, const struct kvp_mat *W,
                         const struct kvp_lanes *P, const float *X, int ldx,
                         const struct kvp_row_seg *segs, int n, float *Y, int ldy,
                         bool accumulate, bool same_x, long r0, long r1, int ith)
{
    struct kvp_thread_scratch *ts = &sh->ts[ith];
    int vt = r0 < r1 && kvp_matvec_xq_bytes(W->type, W->cols) > 0
                 ? kvp_type_vec_dot_type(W->type)
                 : -1;
    bool reuse = same_x && vt >= 0 && ts->xv_type == vt;
    ts->xv_type = vt;
    if (r0 >= r1 || n == 0)
        return;
    uint8_t *xv = ts->xv;
    if (vt >= 0 && !reuse)
        for (int j = 0; j < n; j++)
            kvp_matvec_prepare(W->type, X + (size_t)segs[j].row0 * ldx, W->cols,
                               xv + (size_t)j * sh->xv_stride);
    if (P && n >= KVP_SINGLES_LANES && vt >= 0) {
        /* weights packed in lanes: every vector in one call over this thread's rows, the
         * accumulating products added in place. Exact steps too: a vector's results do not
         * depend on the others in the call nor on the rows a thread owns, so a sequence gets
         * in any step what it gets alone. */
        for (int j = 0; j < n; j++) {
            ts->xvp[j] = xv + (size_t)j * sh->xv_stride;
            ts->yvp[j] = (segs[j].y ? segs[j].y : Y + (size_t)segs[j].row0 * ldy) + r0;
        }
        kvp_lanes_rows(P, ts->xvp, n, ts->yvp, r0, r1, accumulate);
        return;
    }
    long group = n == 1 ? r1 - r0 : rows_per_group(W);
    /* a kernel that loads each row once for all vectors; accumulating products collect a
     * group's outputs of up to `chunk` vectors in the tile first */
    const bool multi = n > 1 && vt >= 0 && kvp_matvec_has_multi(W);
    const long tile_floats = (long)(sh->tile_bytes / sizeof(float));
    const int chunk = accumulate ? (int)(tile_floats / group < n ? tile_floats / group : n) : n;
    for (long a = r0; a < r1; a += group) {
        long b = a + group < r1 ? a + group : r1;
        if (!multi && n > 1) {
            /* the next group's rows while the vectors take this one: the row kernels do not
             * prefetch within calls this small, and each group's first pass waited on memory
             * (plain AVX-512, the Q4_K file's Q4_K matrices and the rest of its Q5_0 ones, two
             * sequences: 195-196 -> 215-224 tok/s in aggregate) */
            const char *p0 = (const char *)W->data + (size_t)b * W->row_bytes;
            const char *p1 = (const char *)W->data +
                             (size_t)(b + group < r1 ? b + group : r1) * W->row_bytes;
            for (const char *p = p0; p < p1; p += 64)
                __builtin_prefetch(p, 0, 3);
        }
        if (multi && chunk > 0) {
            for (int j0 = 0; j0 < n; j0 += chunk) {
                int m = n - j0 < chunk ? n - j0 : chunk;
                for (int j = 0; j < m; j++) {
                    const struct kvp_row_seg *sg = &segs[j0 + j];
                    ts->xvp[j] = xv + (size_t)(j0 + j) * sh->xv_stride;
                    ts->yvp[j] = accumulate ? ts->tile + (size_t)j * group
                                 : (sg->y ? sg->y : Y + (size_t)sg->row0 * ldy) + a;
                }
                kvp_matvec_rows_multi(W, ts->xvp, m, ts->yvp, a, b);
                if (!accumulate)
                    continue;
                for (int j = 0; j < m; j++) {
                    const struct kvp_row_seg *sg = &segs[j0 + j];
                    float *y = sg->y ? sg->y : Y + (size_t)sg->row0 * ldy;
                    for (long r = a; r < b; r++)
                        y[r] += ts->tile[(size_t)j * group + (r - a)];
                }
            }
            continue;
        }
        for (int j = 0; j < n; j++) {
            const float *x = X + (size_t)segs[j].row0 * ldx;
            const void *xq = vt >= 0 ? xv + (size_t)j * sh->xv_stride : NULL;
            float *y = segs[j].y ? segs[j].y : Y + (size_t)segs[j].row0 * ldy;
            if (!accumulate) {
                kvp_matvec_rows(W, x, xq, y, a, b);
                continue;
            }
            /* wo and w_down accumulate into the residual; their rows (n_embd) fit in the tile */
            kvp_matvec_rows(W, x, xq, ts->tile, a, b);
            for (long r = a; r < b; r++)
                y[r] += ts->tile[r];
        }
    }
}

/* One product of the pass: each multi-token sequence through the batch kernels exactly as it
 * would run alone, then every single row together through matvec_multi. Rows [r0, r1) of W are
 * this thread's. */
static void matmul_pass(struct kvp_shared *sh, const struct kvp_mat *W,
                        const struct kvp_lanes *P, const float *X, int ldx,
                        const struct kvp_row_seg *multi, int n_multi,
                        const struct kvp_row_seg *single, int n_single, float *Y, int ldy,
                        bool accumulate, bool same_x, long r0, long r1, int ith, int nth)
{
    /* the GEMM's quantized rows are one sequence's: reusable only when there is one */
    bool reuse = same_x && n_multi == 1;
    for (int i = 0; i < n_multi; i++) {
        const struct kvp_row_seg *s = &multi[i];
        /* the shared quantized rows of the previous sequence (or, for the first, of the
         * previous product, which K and V follow without a barrier) may still be read */
        if (n_multi > 1 && sh->xg && kvp_gemm_wants(W->type, s->n))
            kvp_pool_barrier(sh->pool);
        float *y = s->y ? s->y : Y + (size_t)s->row0 * ldy;
        /* sh->multi[0] holds the single rows of several sequences (steps that need not be
         * exact); every other piece is one sequence's consecutive tokens, in fixed windows of
         * positions where the engine is exact (sgemm_tokens) */
        int pos0 = !sh->exact || s == &sh->multi[0] ? -1 : sh->row_pos[s->row0];
        matmul_rows(sh, W, X + (size_t)s->row0 * ldx, s->n, ldx, pos0, y, ldy, accumulate, reuse,
                    r0, r1, ith, nth);
    }
    matvec_multi(sh, W, P, X, ldx, single, n_single, Y, ldy, accumulate, same_x, r0, r1, ith);
}

/* Single rows from which a step that need not be exact sends them through the batch kernels
 * together: the integer GEMM and the dequantizing sgemm convert every weight tile per call, which
 * pays against the multi-vector mat-vec from about 8 rows where the conversion is vectorized
 * (Q8_0; SmolLM2-135M shape, one thread, CPU per token: 12-14 ms alone, 5.4-6.0 ms at 8 through
 * the multi-vector kernel, 4.5 ms at 8 through the GEMM), never where it goes byte by byte (the
 * other types with a multi-vector kernel; SmolLM2-135M shape "Q4_K", i.e. Q5_0 and Q4_K
 * matrices, 2 threads, decode: 282 tok/s at npl 4 and 247 at 8 through the multi-vector kernel,
 * 171 at 16 through the GEMM), and against one mat-vec per row from about 4. A table that
 * measured its own crossover says so (singles_gemm_* in struct kvp_simd_ops): on AVX2 and plain
 * AVX-512 the byte-by-byte conversion lost to the row kernels up to 16 rows and more (81 against
 * 202 tok/s at 4), so 4 for every type sent a few sequences down the slowest road. */
static int singles_together_from(const struct kvp_mat *W)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const bool multi = kvp_matvec_has_multi(W);
    const bool quant = kvp_type_vec_dot_type(W->type) != KVP_TYPE_F32;
    int from = W->type == KVP_TYPE_Q8_0 ? ops->singles_gemm_q8_0
             : quant                    ? ops->singles_gemm_quant
                                        : 0;
    if (from > 0)
        return from;
    if (!multi)
        return KVP_SINGLES_GEMM;
    return W->type == KVP_TYPE_Q8_0 ? 2 * KVP_SINGLES_GEMM : INT_MAX;
}

/* A layer product over every row of the pass. */
static void matmul(struct kvp_shared *sh, const struct kvp_mat *W, const struct kvp_lanes *P,
                   const float *X, int ldx, float *Y, int ldy, bool accumulate, bool same_x,
                   long r0, long r1, int ith, int nth)
{
    if (!sh->exact && !P && sh->n_single >= singles_together_from(W))
        matmul_pass(sh, W, NULL, X, ldx, sh->multi, sh->n_multi + 1, NULL, 0, Y, ldy, accumulate,
                    same_x, r0, r1, ith, nth);
    else
        matmul_pass(sh, W, P, X, ldx, sh->multi + 1, sh->n_multi, sh->single, sh->n_single, Y,
                    ldy, accumulate, same_x, r0, r1, ith, nth);
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

/* Gemma's post-norms: x[i] += rmsnorm(y[i]) · w for the rows [t0, t1). */
static void post_norm_add(float *x, float *y, const float *w, int D, float eps, long t0, long t1)
{
    for (long i = t0; i < t1; i++) {
        rmsnorm(y + i * D, y + i * D, w, D, eps);
        for (int d = 0; d < D; d++)
            x[i * D + d] += y[i * D + d];
    }
}

/* g[j] = GELU(g[j]) · u[j], GELU in its tanh form (Gemma's gelu_pytorch_tanh). */
static void gelu_mul(float *g, const float *u, long n)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (long j = 0; j < n; j++) {
        float x = g[j];
        g[j] = 0.5f * x * (1.0f + kvp_tanh_fast(c * (x + 0.044715f * x * x * x))) * u[j];
    }
}

/* Soft-capping: v -> cap · tanh(v / cap). */
static void softcap(float *v, long n, float cap)
{
    for (long j = 0; j < n; j++)
        v[j] = cap * kvp_tanh_fast(v[j] / cap);
}

/* Qwen3's and Gemma 3's q/k norm: each head of vec normalised on its own, in place, with the
 * same weights for every head. */
static void head_rmsnorm(float *vec, int n_heads, int hd, const float *w, float eps)
{
    for (int h = 0; h < n_heads; h++)
        rmsnorm(vec + (size_t)h * hd, vec + (size_t)h * hd, w, hd, eps);
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
    struct kvp_shared *sh = arg;
    const struct kvp_model *m = sh->model;
    const struct kvp_hparams *hp = &m->hp;
    const int n = sh->n_rows;
    const int D = hp->n_embd, hd = hp->head_dim;
    const int q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    long t0, t1;
    kvp_split_range(n, ith, nth, &t0, &t1); /* this thread's rows */

    /* embeddings and RoPE angles for this thread's rows */
    const struct kvp_type_traits *et = kvp_type_traits(m->tok_embd.type);
    for (long i = t0; i < t1; i++) {
        const uint8_t *row = (const uint8_t *)m->tok_embd.data +
                             (size_t)sh->row_tok[i] * m->tok_embd.row_bytes;
        et->to_f32(row, sh->x + i * D, D);
        if (hp->embd_scale) /* Gemma: embeddings times sqrt(n_embd) */
            for (int d = 0; d < D; d++)
                sh->x[i * D + d] *= sqrtf((float)D);
        double pos = (double)sh->row_pos[i];
        for (int j = 0; j < hd / 2; j++) {
            double th = pos * sh->inv_freq[j];
            sh->rope[i * hd + 2 * j] = (float)(cos(th) * sh->rope_mscale);
            sh->rope[i * hd + 2 * j + 1] = (float)(sin(th) * sh->rope_mscale);
        }
        for (int j = 0; sh->rope_local && j < hd / 2; j++) {
            double th = pos * sh->inv_freq_local[j];
            sh->rope_local[i * hd + 2 * j] = (float)cos(th);
            sh->rope_local[i * hd + 2 * j + 1] = (float)sin(th);
        }
    }
    kvp_pool_barrier(sh->pool);

    for (int l = 0; l < hp->n_layer; l++) {
        const struct kvp_layer_weights *L = &m->layers[l];
        double t_layer = ith == 0 ? kvp_time_now() : 0;
        for (long i = t0; i < t1; i++)
            rmsnorm(sh->xn + i * D, sh->x + i * D, L->attn_norm, D, hp->norm_eps);
        kvp_pool_barrier(sh->pool);

        long r0, r1;
        kvp_split_range(q_dim, ith, nth, &r0, &r1);
        matmul(sh, &L->wq, packed(sh, l, 0),
               sh->xn, D, sh->q, q_dim, false, false, r0, r1, ith, nth);
        add_bias(sh->q, n, q_dim, L->bq, r0, r1);
        kvp_split_range(kv_dim, ith, nth, &r0, &r1);
        matmul(sh, &L->wk, packed(sh, l, 1),
               sh->xn, D, sh->k, kv_dim, false, true, r0, r1, ith, nth);
        add_bias(sh->k, n, kv_dim, L->bk, r0, r1);
        matmul(sh, &L->wv, packed(sh, l, 2),
               sh->xn, D, sh->v, kv_dim, false, true, r0, r1, ith, nth);
        add_bias(sh->v, n, kv_dim, L->bv, r0, r1);
        kvp_pool_barrier(sh->pool);

        const float *cs = sh->rope_local && kvp_layer_is_local(hp, l) ? sh->rope_local
                                                                      : sh->rope;
        for (long i = t0; i < t1; i++) {
            if (L->q_norm) {
                head_rmsnorm(sh->q + i * q_dim, hp->n_head, hd, L->q_norm, hp->norm_eps);
                head_rmsnorm(sh->k + i * kv_dim, hp->n_head_kv, hd, L->k_norm, hp->norm_eps);
            }
            rope_apply(sh->q + i * q_dim, hp->n_head, hd, cs + i * hd, hp->rope_style);
            rope_apply(sh->k + i * kv_dim, hp->n_head_kv, hd, cs + i * hd, hp->rope_style);
        }
        /* K and V into each sequence's cache, attention into its rows of sh->att (kv_step.h;
         * sliding-window and soft-capped layers: local_attention.h) */
        const double t_attn = ith == 0 ? kvp_time_now() : 0;
        if (kvp_local_attn_wants(hp, l))
            kvp_local_attn_layer(sh, l, ith, nth);
        else
            kvp_kv_step(sh, l, ith, nth);
        kvp_pool_barrier(sh->pool);
        if (ith == 0) { /* every thread is past the attention (kvp_ctx_attention_seconds) */
            const double dt = kvp_time_now() - t_attn;
            for (int s = 0; s < sh->n_seqs; s++)
                sh->seqs[s]->attn_s[kvp_layer_is_local(hp, l) ? 0 : 1] += dt;
        }

        kvp_split_range(D, ith, nth, &r0, &r1);
        if (L->attn_post_norm) {
            /* Gemma: the attention output is normalised before it joins the residual */
            matmul(sh, &L->wo, packed(sh, l, 3),
                   sh->att, q_dim, sh->xn, D, false, false, r0, r1, ith, nth);
            kvp_pool_barrier(sh->pool);
            post_norm_add(sh->x, sh->xn, L->attn_post_norm, D, hp->norm_eps, t0, t1);
        } else {
            matmul(sh, &L->wo, packed(sh, l, 3),
                   sh->att, q_dim, sh->x, D, true, false, r0, r1, ith, nth);
            add_bias(sh->x, n, D, L->bo, r0, r1);
        }
        kvp_pool_barrier(sh->pool);

        for (long i = t0; i < t1; i++)
            rmsnorm(sh->xn + i * D, sh->x + i * D, L->ffn_norm, D, hp->norm_eps);
        kvp_pool_barrier(sh->pool);

        /* gate and up: each thread owns the same rows of both, so SwiGLU needs no barrier */
        long f0, f1;
        kvp_split_range(hp->n_ff, ith, nth, &f0, &f1);
        matmul(sh, &L->w_gate, packed(sh, l, 4),
               sh->xn, D, sh->gate, hp->n_ff, false, false, f0, f1, ith, nth);
        matmul(sh, &L->w_up, packed(sh, l, 5),
               sh->xn, D, sh->up, hp->n_ff, false, true, f0, f1, ith, nth);
        for (int i = 0; i < n; i++) {
            float *g = sh->gate + (size_t)i * hp->n_ff, *u = sh->up + (size_t)i * hp->n_ff;
            if (hp->gelu)
                gelu_mul(g + f0, u + f0, f1 - f0);
            else
                for (long j = f0; j < f1; j++)
                    g[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
        }
        kvp_pool_barrier(sh->pool);

        kvp_split_range(D, ith, nth, &r0, &r1);
        if (L->ffn_post_norm) {
            matmul(sh, &L->w_down, packed(sh, l, 6),
                   sh->gate, hp->n_ff, sh->xn, D, false, false, r0, r1, ith, nth);
            kvp_pool_barrier(sh->pool);
            post_norm_add(sh->x, sh->xn, L->ffn_post_norm, D, hp->norm_eps, t0, t1);
        } else {
            matmul(sh, &L->w_down, packed(sh, l, 6),
                   sh->gate, hp->n_ff, sh->x, D, true, false, r0, r1, ith, nth);
        }
        kvp_pool_barrier(sh->pool);
        for (int s = 0; s < sh->n_seqs; s++)
            kvp_kv_layer_done(sh->seqs[s], l, t_layer, ith);
    }

    if (sh->n_out_multi + sh->n_out_single == 0)
        return;
    /* final norm of the rows whose logits are wanted, then the classifier */
    for (int i = 0; i < sh->n_out_multi + sh->n_out_single; i++) {
        const struct kvp_row_seg *s = i < sh->n_out_multi ? &sh->out_multi[i]
                                                          : &sh->out_single[i - sh->n_out_multi];
        long o0, o1;
        kvp_split_range(s->n, ith, nth, &o0, &o1);
        for (long r = s->row0 + o0; r < s->row0 + o1; r++)
            rmsnorm(sh->xn + r * D, sh->x + r * D, m->output_norm, D, hp->norm_eps);
    }
    kvp_pool_barrier(sh->pool);
    long r0, r1;
    kvp_split_range((long)m->output.rows, ith, nth, &r0, &r1);
    matmul_pass(sh, &m->output, packed(sh, hp->n_layer, 0), sh->xn, D, sh->out_multi,
                sh->n_out_multi, sh->out_single, sh->n_out_decode, NULL, hp->n_vocab, false,
                false, r0, r1, ith, nth);
    matvec_multi(sh, &m->output, NULL, sh->xn, D, sh->out_single + sh->n_out_decode,
                 sh->n_out_single - sh->n_out_decode, NULL, hp->n_vocab, false, false, r0, r1,
                 ith);
    /* Gemma 2's logit soft-capping, on the classifier rows this thread computed */
    if (hp->final_softcap > 0)
        for (int i = 0; i < sh->n_out_multi + sh->n_out_single; i++) {
            const struct kvp_row_seg *s = i < sh->n_out_multi ? &sh->out_multi[i]
                                                              : &sh->out_single[i - sh->n_out_multi];
            for (int j = 0; j < s->n; j++)
                softcap(s->y + (size_t)j * hp->n_vocab + r0, r1 - r0, hp->final_softcap);
        }
}

void kvp_job_open(struct kvp_ctx *c, int n)
{
    c->job_end = c->n_tokens + n;
    c->job_prefill = n > 1 && kvp_policy_wants_prefill(&c->pol);
    c->obs_n = c->pol.obs_window < c->job_end ? c->pol.obs_window : c->job_end;
    if (c->job_prefill && c->pol.colsum && c->n_tokens == 0)
        memset(c->pol.colsum, 0,
               (size_t)c->hp.n_layer * c->hp.n_head * c->n_ctx * sizeof(float));
}

int kvp_forward_pass(struct kvp_shared *sh, const struct kvp_pass_item *items, int n_items,
                     struct kvp_err *err)
{
    const struct kvp_hparams *hp = &sh->model->hp;
    const int q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    /* single tokens take the first rows, so that they are one block of rows when they go
     * through the batch kernels together (fast steps) */
    int n_single = 0;
    for (int i = 0; i < n_items; i++)
        n_single += items[i].n == 1;
    int row = 0, row_multi = n_single;
    sh->n_seqs = n_items;
    sh->n_multi = sh->n_single = sh->n_out_multi = sh->n_out_single = 0;
    /* multi[0]: all single rows as one block, for the products that take them together */
    sh->multi[0] = (struct kvp_row_seg){.row0 = 0, .n = n_single};
    for (int i = 0; i < n_items; i++) {
        const struct kvp_pass_item *it = &items[i];
        struct kvp_ctx *c = it->c;
        int r = it->n == 1 ? row++ : row_multi;
        if (it->n > 1)
            row_multi += it->n;
        sh->seqs[i] = c;
        c->job_row0 = r;
        c->job_n = it->n;
        c->job_pos0 = c->n_tokens;
        c->job_all_logits = it->all_logits;
        c->job_logits = it->logits;
        c->job_last = it->last;
        c->q = sh->q + (size_t)r * q_dim;
        c->k = sh->k + (size_t)r * kv_dim;
        c->v = sh->v + (size_t)r * kv_dim;
        c->att = sh->att + (size_t)r * q_dim;
        for (int j = 0; j < it->n; j++) {
            sh->row_tok[r + j] = it->tokens[j];
            sh->row_pos[r + j] = c->n_tokens + j;
        }
        struct kvp_row_seg seg = {.row0 = r, .n = it->n};
        if (it->n > 1)
            sh->multi[1 + sh->n_multi++] = seg;
        else
            sh->single[sh->n_single++] = seg;
        if (it->logits && it->all_logits && it->n > 1)
            sh->out_multi[sh->n_out_multi++] = (struct kvp_row_seg){r, it->n, it->logits};
        else if (it->logits && it->n == 1)
            sh->out_single[sh->n_out_single++] = (struct kvp_row_seg){r, 1, it->logits};
    }
    /* then the last rows of prompt pieces that want only those logits (see n_out_decode) */
    sh->n_out_decode = sh->n_out_single;
    for (int i = 0; i < n_items; i++)
        if (items[i].logits && !items[i].all_logits && items[i].n > 1)
            sh->out_single[sh->n_out_single++] = (struct kvp_row_seg){
                items[i].c->job_row0 + items[i].n - 1, 1, items[i].logits};
    row = row_multi;
    sh->n_rows = row;
    if (n_single >= KVP_SINGLES_LANES)
        kvp_shared_pack(sh);
    for (int i = 0; i < n_items; i++) {
        /* sliding-window layers map this pass's blocks onto their rings */
        int rc = kvp_kvcache_ring_advance(&items[i].c->kv, items[i].c->n_tokens + items[i].n,
                                          err);
        if (rc < 0)
            return rc;
    }
    for (int i = 0; i < n_items; i++)
        kvp_kv_batch_begin(items[i].c);
    kvp_pool_run(sh->pool, forward_worker, sh);
    int rc = 0;
    for (int i = 0; i < n_items; i++) {
        struct kvp_ctx *c = items[i].c;
        int r = kvp_kv_batch_end(c, rc < 0 ? NULL : err);
        if (r < 0 && rc == 0)
            rc = r;
        kvp_ctx_tokens_set(c, c->n_tokens + items[i].n);
        if (items[i].last)
            c->job_end = 0;
    }
    return rc;
}

/* kvp_eval, and kvp_eval_prompt_head with rest > 0: n tokens of a job that ends rest tokens
 * after them (its last pass then does not end the job). */
static int eval_job(kvp_ctx *c, const int32_t *tokens, int n, int rest, float *logits,
                    bool all_logits, struct kvp_err *err)
{
    if (n <= 0)
        return kvp_err_set(err, KVP_EINVAL, "no tokens to evaluate");
    if (rest < 0)
        return kvp_err_set(err, KVP_EINVAL, "negative rest of a prompt %d", rest);
    if ((long)n + rest > (long)c->n_ctx - c->n_tokens)
        return kvp_err_set(err, KVP_ERANGE,
                           "%ld tokens do not fit: %d of the context's %d are already used",
                           (long)n + rest, c->n_tokens, c->n_ctx);
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
    kvp_job_open(c, n + rest);
    /* passes of at most n_batch tokens */
    for (int done = 0; done < n;) {
        int nb = n - done < c->sh->n_batch ? n - done : c->sh->n_batch;
        bool last = done + nb == n && rest == 0;
        struct kvp_pass_item it = {.c = c, .tokens = tokens + done, .n = nb,
                                   .all_logits = all_logits, .last = last};
        if (logits && all_logits)
            it.logits = logits + (size_t)done * c->hp.n_vocab;
        else
            it.logits = (logits && last) ? logits : NULL;
        rc = kvp_forward_pass(c->sh, &it, 1, err);
        done += nb;
        if (rc < 0) {
            c->job_end = 0;
            return rc;
        }
        if (c->progress && nb < n)
            c->progress(c->progress_user, done, n);
    }
    return 0;
}

int kvp_eval(kvp_ctx *c, const int32_t *tokens, int n, float *logits, bool all_logits,
             struct kvp_err *err)
{
    return eval_job(c, tokens, n, 0, logits, all_logits, err);
}

int kvp_eval_prompt_head(kvp_ctx *c, const int32_t *tokens, int n, int rest, struct kvp_err *err)
{
    if (c->pol.p)
        return kvp_err_set(err, KVP_EINVAL, "a prompt's head is evaluated without a policy");
    return eval_job(c, tokens, n, rest, NULL, false, err);
}

/* ---- policies and measuring --------------------------------------------------------------- */

/* Attach a policy (ops, or the one params names; none: dense), clearing the cache unless keep. */
static int attach_policy(kvp_ctx *c, const struct kvp_policy_ops *ops,
                         const struct kvp_policy_params *params, bool keep, struct kvp_err *err)
{
    free_policy(c);
    if (!keep)
        kvp_ctx_reset(c);
    int rc = kvp_kv_configure(c, err);
    if (rc < 0 || !params || (!ops && !params->name))
        return rc;
    if (!ops && !(ops = kvp_policy_lookup(params->name, err)))
        return KVP_EINVAL;
    /* The layers of local_attention.h have no policy hooks: a sliding-window layer needs no
     * selection and nothing to evict (its keys are bounded by the window and its ring holds
     * them), so a policy selects, evicts and watches the prompt's attention on the global
     * layers only (docs/architectures.md). Global layers that attend there too, whose scores
     * are scaled otherwise than the KV step's kernels scale them (the Gemma 27B models), run
     * dense ("full") only. */
    bool global_elsewhere = false;
    for (int l = 0; l < c->hp.n_layer; l++)
        global_elsewhere |= kvp_local_attn_wants(&c->hp, l) && !kvp_layer_is_local(&c->hp, l);
    if (global_elsewhere && strcmp(ops->name, "full") != 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "policy %s: this %s model scales its attention scores by %g, not "
                           "1/sqrt(head_dim), on its global layers, which therefore take full "
                           "attention only", ops->name, c->model->arch, (double)c->hp.attn_scale);
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

int kvp_ctx_set_policy_ops(kvp_ctx *c, const struct kvp_policy_ops *ops,
                           const struct kvp_policy_params *params, struct kvp_err *err)
{
    return attach_policy(c, ops, params, false, err);
}

int kvp_ctx_set_policy(kvp_ctx *c, const struct kvp_policy_params *params, struct kvp_err *err)
{
    return attach_policy(c, NULL, params, false, err);
}

int kvp_ctx_set_policy_keep(kvp_ctx *c, const struct kvp_policy_params *params,
                            struct kvp_err *err)
{
    const struct kvp_policy_ops *ops = NULL;
    if (params && params->name && !(ops = kvp_policy_lookup(params->name, err)))
        return KVP_EINVAL;
    /* an evicting policy would drop keys on its first look at the cache, and its state after a
     * prompt is what it evicted while reading it: it has to see the prompt itself */
    if (ops && ops->evicting)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "policy '%s' evicts tokens; attach it before the prompt "
                           "(kvp_ctx_set_policy)", ops->name);
    /* a tiered cache's hot tier and staging are sized and filled for the policy it was
     * filled with */
    if (c->store)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "a policy on a filled tiered cache: set it before the prompt");
    if (kvp_kvcache_has_evicted(&c->kv))
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "a policy on a cache that has given up keys (evicted tokens or a "
                           "sliding-window ring): set it before the prompt");
    const int n = c->n_tokens;
    int rc = attach_policy(c, ops, params, true, err);
    if (rc < 0 || !c->pol.p)
        return rc;
    /* what a copy of the cache shows its policy (kvp_seq_copy): the cached tokens as a prompt
     * that has just ended, without observation rows or a last query */
    struct kvp_prefill_obs ob = {.n_prompt = n};
    if (n > 0 && c->pol.p->ops->on_prefill)
        for (int l = 0; l < c->hp.n_layer; l++)
            if (!kvp_local_attn_wants(&c->hp, l))
                kvp_policy_on_prefill(&c->pol, l, &ob);
    c->pol_seen = n;
    c->job_end = 0;
    return 0;
}

double kvp_ctx_policy_seconds(const kvp_ctx *c)
{
    return kvp_policy_hook_time(&c->pol, false);
}

double kvp_ctx_policy_cpu_seconds(const kvp_ctx *c)
{
    return kvp_policy_hook_time(&c->pol, true);
}

void kvp_ctx_policy_reads(const kvp_ctx *c, double *tokens, double *selects)
{
    kvp_policy_read_counts(&c->pol, tokens, selects);
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
    if (!c->measure || layer < 0 || layer >= c->hp.n_layer || !kvp_policy_sparse(&c->pol, layer) ||
        head < 0 || head >= c->hp.n_head || kvp_local_attn_wants(&c->hp, layer))
        return NULL; /* (a sliding-window layer is never measured: local_attention.h) */
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

void kvp_ctx_kv_bytes_by_kind(const kvp_ctx *c, size_t *windowed, size_t *global)
{
    size_t all = kvp_kvcache_resident_bytes(&c->kv, c->n_tokens);
    size_t w = kvp_kvcache_ring_resident_bytes(&c->kv, c->n_tokens);
    if (windowed)
        *windowed = w;
    if (global)
        *global = all - w;
}

void kvp_ctx_attention_seconds(const kvp_ctx *c, double *windowed, double *global)
{
    if (windowed)
        *windowed = c->attn_s[0];
    if (global)
        *global = c->attn_s[1];
}

void kvp_ctx_reset_attention_seconds(kvp_ctx *c)
{
    c->attn_s[0] = c->attn_s[1] = 0;
}

void kvp_ctx_kv_bytes(const kvp_ctx *c, size_t *resident, size_t *kept)
{
    if (resident)
        *resident = kvp_kvcache_resident_bytes(&c->kv, c->n_tokens);
    if (kept)
        *kept = kvp_kvcache_kept_bytes(&c->kv, c->n_tokens);
}

