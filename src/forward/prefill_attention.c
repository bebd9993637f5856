/* Prefill attention over the block-paged KV cache (see prefill_attention.h). */
#include "forward/prefill_attention.h"

#include <math.h>
#include <string.h>

#include <cblas.h>

#include "forward/context_internal.h"
#include "kernels/simd.h"

/* Keys and values [0, n) of one KV head as f32, whatever the cache's types: keys as [hd][n]
 * (the blocks' transposed rows side by side), values as contiguous [n][hd] rows. */
static void gather_kv(const struct kvp_kvcache *kv, int l, int kvh, int n, float *kc, float *vc)
{
    const int hd = kv->head_dim, bs = kv->block_size;
    for (int b = 0; b * bs < n; b++) {
        int nt = n - b * bs < bs ? n - b * bs : bs;
        kv->kk->k_rows(kvp_kvcache_kblock(kv, l, kvh, b), hd, bs, nt, kc + (size_t)b * bs,
                       (size_t)n);
        kv->vk->v_rows(kvp_kvcache_vblock(kv, l, kvh, b), hd, bs, nt, vc + (size_t)b * bs * hd);
    }
}

/* Attention of nq queries starting at batch row qs for query head h, keys [0, n_keys). */
static void prefill_head(struct kvp_ctx *c, int l, int h, int qs, int nq, int n_keys,
                         struct kvp_thread_scratch *ts)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = c->hp.head_dim, q_dim = c->hp.n_head * hd, pos0 = c->job_pos0;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *qp = c->q + (size_t)qs * q_dim + (size_t)h * hd;
    const int obs_first = c->job_end - c->obs_n; /* first observed query position */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, n_keys, hd, scale, qp, q_dim,
                ts->kc, n_keys, 0.0f, ts->s, n_keys);
    for (int i = 0; i < nq; i++) {
        float *row = ts->s + (size_t)i * n_keys;
        int pos = pos0 + qs + i;
        int visible = pos + 1; /* causal: keys 0 .. own position */
        float mx = -INFINITY;
        for (int t = 0; t < visible; t++)
            mx = row[t] > mx ? row[t] : mx;
        float inv = 1.0f / ops->exp_sum(row, visible, mx);
        for (int t = 0; t < visible; t++)
            row[t] *= inv;
        memset(row + visible, 0, (size_t)(n_keys - visible) * sizeof(float));
        if (c->pol.colsum) {
            float *cs = c->pol.colsum + ((size_t)l * c->hp.n_head + h) * c->n_ctx;
            for (int t = 0; t < visible; t++)
                cs[t] += row[t];
        }
        if (c->pol.obs && pos >= obs_first) {
            float *o = c->pol.obs + ((size_t)h * c->obs_n + (pos - obs_first)) * c->job_end;
            memcpy(o, row, (size_t)visible * sizeof(float));
            memset(o + visible, 0, (size_t)(c->job_end - visible) * sizeof(float));
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, n_keys, 1.0f, ts->s, n_keys,
                ts->vc, hd, 0.0f, c->att + (size_t)qs * q_dim + (size_t)h * hd, q_dim);
}

void kvp_attn_prefill_layer(struct kvp_ctx *c, int l, int ith, int nth)
{
    struct kvp_thread_scratch *ts = &c->sh->ts[ith];
    const int n = c->job_n, pos0 = c->job_pos0;
    const int g = c->hp.n_head / c->hp.n_head_kv;
    const int n_chunks = (n + KVP_QCHUNK - 1) / KVP_QCHUNK;
    /* work items: (KV head, chunk), each covering the g query heads of the group so one gather
     * serves g heads. With column sums, one item is a whole KV head so that no two threads add
     * into the same sums. */
    const int per_item = c->pol.colsum ? n_chunks : 1;
    long w0, w1;
    kvp_split_range((long)c->hp.n_head_kv * n_chunks / per_item, ith, nth, &w0, &w1);
    for (long w = w0; w < w1; w++) {
        for (int k = 0; k < per_item; k++) {
            long item = w * per_item + k;
            int kvh = (int)(item / n_chunks), chunk = (int)(item % n_chunks);
            int qs = chunk * KVP_QCHUNK;
            int nq = n - qs < KVP_QCHUNK ? n - qs : KVP_QCHUNK;
            int n_keys = pos0 + qs + nq; /* keys visible to the chunk's last query */
            gather_kv(&c->kv, l, kvh, n_keys, ts->kc, ts->vc);
            for (int j = 0; j < g; j++)
                prefill_head(c, l, kvh * g + j, qs, nq, n_keys, ts);
        }
    }
}
