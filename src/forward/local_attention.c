/*
 * Sliding-window attention, soft-capped where the model caps (see local_attention.h).
 *
 * Work items are (sequence, KV head, chunk of up to KVP_QCHUNK query rows), split evenly among
 * the pool's threads. An item gathers the keys and values its queries can see as f32 once (the
 * union of their windows: from the first query's window start to the last query's position),
 * then each query head of the group scores its visible keys, caps them, and takes the softmax
 * and the weighted sum of the values in one pass over its own range. An item's arithmetic does
 * not depend on the thread that runs it nor on the other sequences of the pass.
 */
#include "forward/local_attention.h"

#include <math.h>
#include <string.h>

#include "forward/context_internal.h"
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

/* Queries [qs, qs + nq) of sequence c against KV head kvh of layer l. */
static void attend_chunk(struct kvp_ctx *c, int l, int kvh, int qs, int nq,
                         struct kvp_thread_scratch *ts)
{
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
    const float scale = hp->attn_scale, cap = hp->attn_softcap;
    float *s = ts->s;
    for (int i = 0; i < nq; i++) {
        const int pos = first + i, lo = window_start(hp, l, pos) - base, n = pos + 1 - base - lo;
        for (int j = 0; j < g; j++) {
            const int h = kvh * g + j;
            const float *q = c->q + (size_t)(qs + i) * q_dim + (size_t)h * hd;
            float mx = -INFINITY;
            for (int t = 0; t < n; t++) {
                const float *kcol = ts->kc + lo + t;
                float dot = 0.0f;
                for (int d = 0; d < hd; d++)
                    dot += q[d] * kcol[(size_t)d * nk];
                dot *= scale;
                if (cap > 0)
                    dot = cap * tanhf(dot / cap);
                s[t] = dot;
                mx = dot > mx ? dot : mx;
            }
            float sum = 0.0f;
            for (int t = 0; t < n; t++)
                sum += s[t] = expf(s[t] - mx);
            float *out = c->att + (size_t)(qs + i) * q_dim + (size_t)h * hd;
            memset(out, 0, (size_t)hd * sizeof(float));
            for (int t = 0; t < n; t++) {
                const float *v = ts->vc + (size_t)(lo + t) * hd;
                for (int d = 0; d < hd; d++)
                    out[d] += s[t] * v[d];
            }
            const float inv = 1.0f / sum;
            for (int d = 0; d < hd; d++)
                out[d] *= inv;
        }
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
