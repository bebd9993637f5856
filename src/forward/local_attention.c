/*
 * Sliding-window attention, soft-capped where the model caps (see local_attention.h).
 *
 * Work items are (sequence, KV head, chunk of up to KVP_QCHUNK query rows), split evenly among
 * the pool's threads. The kernels are those of the global layers, so every KV type and SIMD
 * table they support runs here too (KVP_SIMD=scalar: the portable ones): a decode row (one
 * query) reads its window's blocks in place through the block table with the dense kernels
 * (kvp_attn_window_group); a chunk of prefill rows gathers the keys and values its queries can
 * see as f32 once (the union of their windows: from the first query's window start to the last
 * query's position) and runs two sgemm calls per query head, as the global layers' prefill
 * does. A ring's blocks are addressed by logical block through the table, so its wrap needs no
 * care here. An item's arithmetic does not depend on the thread that runs it nor on the other
 * sequences of the pass.
 */
#include "forward/local_attention.h"

#include <math.h>
#include <string.h>

#include <cblas.h>

#include "forward/context_internal.h"
#include "kernels/simd.h"
#include "kv/attention.h"
#include "kv/kvcache.h"

bool kvp_local_attn_wants(const struct kvp_hparams *hp, int l)
{
    /* the KV step's kernels scale scores by 1/sqrt(head_dim) (and soft-cap them: kvcache.h,
     * score_cap): another scale runs here too */
    const float usual = 1.0f / sqrtf((float)hp->head_dim); /* a rounding apart at most */
    return kvp_layer_is_local(hp, l) || fabsf(hp->attn_scale - usual) > 1e-6f * usual;
}

/* First position a query at pos sees in layer l. */
static int window_start(const struct kvp_hparams *hp, int l, int pos)
{
    if (!kvp_layer_is_local(hp, l))
        return 0;
    int lo = pos - hp->n_swa + 1;
    return lo > 0 ? lo : 0;
}

/* One query (decode): its group's heads straight from the cache's blocks with the SIMD
 * kernels of the cache's types, as the global layers' dense attention reads them
 * (kv/attention.h); no gather. False when the scores would not fit the scratch (then the
 * gathered road below runs). */
static bool attend_one(struct kvp_ctx *c, int l, int kvh, int qs, struct kvp_thread_scratch *ts)
{
    const struct kvp_hparams *hp = &c->hp;
    const int hd = hp->head_dim, g = hp->n_head / hp->n_head_kv, q_dim = hp->n_head * hd;
    const int pos = c->job_pos0 + qs, k0 = window_start(hp, l, pos);
    const int stride = kvp_attn_window_stride(k0, pos + 1, c->kv.block_size);
    if (g > 64 || (size_t)g * stride > (size_t)KVP_QCHUNK * c->sh->n_ctx)
        return false;
    const size_t off = (size_t)qs * q_dim + (size_t)kvh * g * hd; /* the group's heads */
    kvp_attn_window_group(&c->kv, l, kvh, c->q + off, g, k0, pos + 1, hp->attn_scale, ts->s,
                          stride, c->att + off);
    return true;
}

/* Queries [qs, qs + nq) of sequence c against KV head kvh of layer l: the keys and values
 * they see gathered as f32 once, then per query head two sgemm calls (scores, outputs) as
 * the global layers' prefill (prefill_attention.c), each row's keys outside its window given
 * weight 0 before the second. */
static void attend_chunk(struct kvp_ctx *c, int l, int kvh, int qs, int nq,
                         struct kvp_thread_scratch *ts)
{
    if (nq == 1 && attend_one(c, l, kvh, qs, ts))
        return;
    const struct kvp_simd_ops *ops = kvp_simd();
    const struct kvp_hparams *hp = &c->hp;
    const struct kvp_kvcache *kv = &c->kv;
    const int hd = hp->head_dim, bs = kv->block_size, q_dim = hp->n_head * hd;
    const int g = hp->n_head / hp->n_head_kv;
    const int first = c->job_pos0 + qs, last = first + nq - 1;
    const int b0 = window_start(hp, l, first) / bs, base = b0 * bs;
    const int nk = last + 1 - base; /* keys gathered: positions [base, last] */
    for (int b = b0; b * bs <= last; b++) {
        int nt = last + 1 - b * bs < bs ? last + 1 - b * bs : bs;
        kv->kk->k_rows(kvp_kvcache_kblock(kv, l, kvh, b), hd, bs, nt, ts->kc + (b - b0) * bs,
                       (size_t)nk);
        kv->vk->v_rows(kvp_kvcache_vblock(kv, l, kvh, b), hd, bs, nt,
                       ts->vc + (size_t)(b - b0) * bs * hd);
    }
    float inv[KVP_QCHUNK];
    for (int j = 0; j < g; j++) {
        const int h = kvh * g + j;
        const float *q = c->q + (size_t)qs * q_dim + (size_t)h * hd;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, nk, hd, hp->attn_scale, q,
                    q_dim, ts->kc, nk, 0.0f, ts->s, nk);
        for (int i = 0; i < nq; i++) {
            const int pos = first + i, lo = window_start(hp, l, pos) - base;
            const int n = pos + 1 - base - lo; /* keys [lo, lo + n) of the row */
            float *row = ts->s + (size_t)i * nk;
            kvp_attn_softcap(row + lo, n, kv->score_cap);
            inv[i] = 1.0f / ops->exp_sum(row + lo, n, kvp_simd_max(ops, row + lo, n));
            memset(row, 0, (size_t)lo * sizeof(float));
            memset(row + lo + n, 0, (size_t)(nk - lo - n) * sizeof(float));
        }
        float *out = c->att + (size_t)qs * q_dim + (size_t)h * hd;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, ts->s, nk,
                    ts->vc, hd, 0.0f, out, q_dim);
        for (int i = 0; i < nq; i++)
            for (int d = 0; d < hd; d++)
                out[(size_t)i * q_dim + d] *= inv[i];
    }
}

void kvp_local_attn_layer(struct kvp_shared *sh, int l, int ith, int nth)
{
    long t0, t1;
    kvp_split_range(sh->n_rows, ith, nth, &t0, &t1); /* the rows this thread rotated */
    int items = 0;
    for (int s = 0; s < sh->n_seqs; s++) {
        struct kvp_ctx *c = sh->seqs[s];
        const int hd = c->hp.head_dim, kv_dim = c->hp.n_head_kv * hd;
        for (int j = 0; j < c->job_n; j++) {
            long row = c->job_row0 + j;
            if (row < t0 || row >= t1)
                continue;
            for (int h = 0; h < c->hp.n_head_kv; h++)
                kvp_kvcache_store(&c->kv, l, h, c->job_pos0 + j, c->k + (size_t)j * kv_dim + h * hd,
                                  c->v + (size_t)j * kv_dim + h * hd);
        }
        items += c->hp.n_head_kv * ((c->job_n + KVP_QCHUNK - 1) / KVP_QCHUNK);
    }
    kvp_pool_barrier(sh->pool);
    long i0, i1;
    kvp_split_range(items, ith, nth, &i0, &i1);
    int item = 0;
    for (int s = 0; s < sh->n_seqs && item < i1; s++) {
        struct kvp_ctx *c = sh->seqs[s];
        const int n_chunks = (c->job_n + KVP_QCHUNK - 1) / KVP_QCHUNK;
        for (int kvh = 0; kvh < c->hp.n_head_kv; kvh++)
            for (int ch = 0; ch < n_chunks; ch++, item++) {
                if (item < i0 || item >= i1)
                    continue;
                int qs = ch * KVP_QCHUNK;
                int nq = c->job_n - qs < KVP_QCHUNK ? c->job_n - qs : KVP_QCHUNK;
                attend_chunk(c, l, kvh, qs, nq, &sh->ts[ith]);
            }
    }
}
