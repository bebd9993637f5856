/* Prefill attention over the block-paged KV cache (see prefill_attention.h). */
#include "forward/prefill_attention.h"

#include <math.h>
#include <string.h>

#include <cblas.h>

#include "forward/context_internal.h"
#include "core/platform.h"
#include "core/threadpool.h"
#include "forward/local_attention.h"
#include "forward/sparse_prefill.h"
#include "kernels/simd.h"
#include "kv/attention.h"

/* Keys and values of the runs of one KV head (n_cols keys in all, the last pad of them zeros)
 * as f32, whatever the cache's types: keys as [hd][n_cols] (the blocks' transposed rows side by
 * side, in run order), values as contiguous [n_cols][hd] rows. Runs start on cache blocks; one
 * run [0, n) is the dense gather. The pad keys end the runs (positions the piece has not
 * written): zeros, not read from the cache, so that the zero weights they get multiply finite
 * values. */
static void gather_kv(const struct kvp_kvcache *kv, int l, int kvh,
                      const struct kvp_key_run *runs, int n_runs, int n_cols, int pad, float *kc,
                      float *vc)
{
    const int hd = kv->head_dim, bs = kv->block_size;
    const int n_gather = n_cols - pad;
    int col = 0;
    for (int r = 0; r < n_runs && col < n_gather; r++) {
        const int len = runs[r].n < n_gather - col ? runs[r].n : n_gather - col;
        const int end = runs[r].start + len;
        for (int t = runs[r].start; t < end; t += bs) {
            const int nt = end - t < bs ? end - t : bs;
            kv->kk->k_rows(kvp_kvcache_kblock(kv, l, kvh, t / bs), hd, bs, nt, kc + col,
                           (size_t)n_cols);
            kv->vk->v_rows(kvp_kvcache_vblock(kv, l, kvh, t / bs), hd, bs, nt,
                           vc + (size_t)col * hd);
            col += nt;
        }
    }
    if (pad <= 0)
        return;
    for (int d = 0; d < hd; d++)
        memset(kc + (size_t)d * n_cols + n_gather, 0, (size_t)pad * sizeof(float));
    memset(vc + (size_t)n_gather * hd, 0, (size_t)pad * hd * sizeof(float));
}

/* Attention of nq queries starting at batch row qs for query head h over the gathered keys of
 * the runs (n_cols of the n_keys the last query sees; the runs end at n_keys, so the keys a
 * query must not see are the last ones gathered). The queries sit at slots slot.. of a call of
 * m >= slot + nq rows (the other rows are zeros whose results are dropped): with m fixed and the
 * slot a function of the position, a query's scores and output do not depend on how its prompt
 * was cut into pieces, which OpenBLAS's sums do otherwise (forward.c, sgemm_tokens). Each row of
 * scores is exponentiated in place but left unnormalised: the value product sums the
 * unnormalised weights and its hd outputs are divided by the row's sum afterwards, which scales
 * hd numbers a row instead of every visible key (at 12288 tokens the per-key scaling and a scalar
 * max were 30 % of the prefill's samples). The column sums and the observed rows, which want the
 * probabilities themselves, scale as they copy, each run to its keys' positions (keys not read
 * have probability 0). */
static void prefill_head(struct kvp_ctx *c, int l, int h, int qs, int nq, int slot, int m,
                         int n_keys, const struct kvp_key_run *runs, int n_runs, int n_cols,
                         struct kvp_thread_scratch *ts)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = c->hp.head_dim, q_dim = c->hp.n_head * hd, pos0 = c->job_pos0;
    const float scale = 1.0f / sqrtf((float)hd);
    const int obs_first = c->job_end - c->obs_n; /* first observed query position */
    float inv[KVP_QCHUNK];
    for (int i = 0; i < nq; i++)
        memcpy(ts->qwin + (size_t)(slot + i) * hd, c->q + (size_t)(qs + i) * q_dim + (size_t)h * hd,
               (size_t)hd * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n_cols, hd, scale, ts->qwin, hd,
                ts->kc, n_cols, 0.0f, ts->s, n_cols);
    for (int i = 0; i < nq; i++) {
        float *row = ts->s + (size_t)(slot + i) * n_cols;
        int pos = pos0 + qs + i;
        int visible = n_cols - (n_keys - (pos + 1)); /* causal: keys up to its own position */
        kvp_attn_softcap(row, visible, c->kv.score_cap); /* Gemma 2 (kvcache.h) */
        inv[i] = 1.0f / ops->exp_sum(row, visible, kvp_simd_max(ops, row, visible));
        memset(row + visible, 0, (size_t)(n_cols - visible) * sizeof(float));
        if (c->pol.colsum) {
            float *cs = c->pol.colsum + ((size_t)l * c->hp.n_head + h) * c->n_ctx;
            for (int r = 0, col = 0; r < n_runs && col < visible; col += runs[r++].n) {
                int n = visible - col < runs[r].n ? visible - col : runs[r].n;
                ops->axpy(inv[i], row + col, cs + runs[r].start, n);
            }
        }
        if (c->pol.obs && pos >= obs_first) {
            float *o = c->pol.obs + ((size_t)h * c->obs_n + (pos - obs_first)) * c->job_end;
            memset(o, 0, (size_t)c->job_end * sizeof(float));
            for (int r = 0, col = 0; r < n_runs && col < visible; col += runs[r++].n) {
                int n = visible - col < runs[r].n ? visible - col : runs[r].n;
                for (int t = 0; t < n; t++)
                    o[runs[r].start + t] = row[col + t] * inv[i];
            }
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hd, n_cols, 1.0f, ts->s, n_cols,
                ts->vc, hd, 0.0f, ts->owin, hd);
    for (int i = 0; i < nq; i++) {
        float *out = c->att + (size_t)(qs + i) * q_dim + (size_t)h * hd;
        const float *o = ts->owin + (size_t)(slot + i) * hd;
        for (int d = 0; d < hd; d++)
            out[d] = o[d] * inv[i];
    }
}

void kvp_attn_prefill_layer(struct kvp_ctx *c, int l, int ith)
{
    struct kvp_thread_scratch *ts = &c->sh->ts[ith];
    struct kvp_spf *spf = c->spf;
    const int n = c->job_n, pos0 = c->job_pos0, n_kv = c->hp.n_head_kv;
    const int g = c->hp.n_head / n_kv;
    const bool planned = kvp_spf_staged(spf);
    /* chunks are fixed windows of positions (see prefill_head), dense or sparse */
    const int base = kvp_prefill_base(pos0), n_chunks = kvp_prefill_chunks(pos0, n);
    int first_layer = 0; /* the first layer this runs (sliding-window ones do not come here) */
    while (first_layer + 1 < c->hp.n_layer && kvp_local_attn_wants(&c->hp, first_layer))
        first_layer++;
    if (spf && l == first_layer && ith == 0)
        kvp_spf_count_tokens(spf, n);
    if (kvp_spf_needs_fold(spf, c)) {
        /* the estimate's per-block statistics of the blocks this piece wrote, every thread a
         * share, complete before any block is ranked */
        const int nth = c->sh->n_threads;
        kvp_spf_fold(spf, c, l, ith, nth);
        kvp_pool_barrier(c->pool);
        if (ith == 0)
            kvp_spf_folded(spf, c, l);
    }
    if (planned) {
        /* a tiered store staged the layer in part: every item's choice first, then the blocks
         * chosen are loaded, then attention */
        kvp_spf_plan(spf, c, l, ith, c->sh->n_threads, ts);
        kvp_pool_barrier(c->pool);
        if (ith == 0)
            kvp_spf_plan_load(spf, c, l);
        kvp_pool_barrier(c->pool);
    }
    /* Work items: (KV head, chunk of KVP_QCHUNK queries), each covering the g query heads of
     * the group so one gather serves g heads, taken from one queue by whichever thread is free,
     * the last chunks (the most keys: causal) first and the short ones last, so the threads end
     * together. Split in fixed shares, a head's chunks cost 1, 2, .. in keys and KV heads that
     * do not divide among the threads (3 on 2) left one thread waiting up to a quarter of the
     * attention. With column sums, one item is a whole KV head so that no two threads add into
     * the same sums. An item's arithmetic does not depend on the thread that runs it. */
    const bool whole = c->pol.colsum != NULL;
    const int items = whole ? n_kv : n_kv * n_chunks;
    for (;;) {
        const int w = atomic_fetch_add_explicit(&c->sh->prefill_next, 1, memory_order_relaxed);
        if (w >= items)
            break;
        const int kvh = whole ? w : w % n_kv;
        const int c0 = whole ? 0 : n_chunks - 1 - w / n_kv, c1 = whole ? n_chunks : c0 + 1;
        for (int chunk = c0; chunk < c1; chunk++) {
            const double t0 = spf ? kvp_time_now() : 0;
            /* the chunk is the window [w0, w0 + KVP_QCHUNK) of positions, its queries at their
             * slots and its keys up to the window's end, those not written yet zero: the same two
             * calls whatever piece the window's queries came in */
            const int w0 = base + chunk * KVP_QCHUNK;
            const int a = w0 > pos0 ? w0 : pos0;
            const int n_real = w0 + KVP_QCHUNK < pos0 + n ? w0 + KVP_QCHUNK : pos0 + n;
            const int qs = a - pos0, nq = n_real - a, slot = a - w0;
            const int m = KVP_QCHUNK, n_keys = w0 + KVP_QCHUNK;
            struct kvp_key_run all = {0, n_real};
            const struct kvp_key_run *runs = &all;
            int n_runs = 1, n_cols = n_real;
            double est = 0;
            if (planned)
                n_runs = kvp_spf_planned(spf, kvh, chunk, n_chunks, &runs, &n_cols, &est);
            else if (spf)
                n_runs = kvp_spf_select(spf, c, l, kvh, qs, nq, n_real, ith, ts, &runs, &n_cols,
                                        &est);
            /* the keys not written yet follow the runs as zeros */
            n_cols += n_keys - n_real;
            gather_kv(&c->kv, l, kvh, runs, n_runs, n_cols, n_keys - n_real, ts->kc, ts->vc);
            for (int j = 0; j < g; j++)
                prefill_head(c, l, kvh * g + j, qs, nq, slot, m, n_keys, runs, n_runs, n_cols, ts);
            if (spf)
                kvp_spf_count(spf, ith, l, est, kvp_time_now() - t0 - est,
                              n_cols - (n_keys - n_real), n_real);
        }
    }
}
