/* Attention kernels over the block-paged KV cache (see attention.h). */
#include "forward/attention.h"

#include <math.h>
#include <string.h>

#include <cblas.h>

#include "forward/context.h"
#include "kernels/simd.h"

void kvp_attn_decode_group(const struct kvp_ctx *c, int l, int kvh, const float *q, int g,
                           int n_keys, float *probs, int probs_stride, float *out)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const struct kvp_kvcache *kv = &c->kv;
    const int hd = kv->head_dim, bs = kv->block_size;
    const int n_blocks = (n_keys + bs - 1) / bs;
    const float scale = 1.0f / sqrtf((float)hd);

    /* scores: blocks outer so each key block is loaded once for the whole group */
    for (int b = 0; b < n_blocks; b++) {
        const float *kt = kvp_kvcache_kblock(kv, l, kvh, b);
        for (int j = 0; j < g; j++)
            ops->block_scores(q + (size_t)j * hd, kt, hd, bs, scale,
                              probs + (size_t)j * probs_stride + (size_t)b * bs);
    }
    for (int j = 0; j < g; j++) {
        float *p = probs + (size_t)j * probs_stride;
        float mx = -INFINITY;
        for (int t = 0; t < n_keys; t++)
            mx = p[t] > mx ? p[t] : mx;
        float sum = ops->exp_sum(p, n_keys, mx);
        float inv = 1.0f / sum;
        for (int t = 0; t < n_keys; t++)
            p[t] *= inv;
        memset(out + (size_t)j * hd, 0, (size_t)hd * sizeof(float));
    }
    for (int b = 0; b < n_blocks; b++) {
        const float *vb = kvp_kvcache_vblock(kv, l, kvh, b);
        int nt = n_keys - b * bs < bs ? n_keys - b * bs : bs;
        for (int j = 0; j < g; j++)
            ops->block_accum(probs + (size_t)j * probs_stride + (size_t)b * bs, vb, hd, nt,
                             out + (size_t)j * hd);
    }
}

void kvp_attn_decode_layer(struct kvp_ctx *c, int l, const float *q, float *out, int ith, int nth)
{
    const int hd = c->hp.head_dim;
    const int g = c->hp.n_head / c->hp.n_head_kv;
    const int n_keys = c->job_pos0 + 1;
    long h0, h1;
    kvp_split_range(c->hp.n_head_kv, ith, nth, &h0, &h1);
    for (long kvh = h0; kvh < h1; kvh++) {
        size_t first = (size_t)kvh * g; /* first query head of the group */
        kvp_attn_decode_group(c, l, (int)kvh, q + first * hd, g, n_keys,
                              c->probs + first * c->probs_stride, c->probs_stride,
                              out + first * hd);
    }
}

/* Copy keys and values [0, n) of one KV head into contiguous [n][hd] rows. */
static void gather_kv(const struct kvp_kvcache *kv, int l, int kvh, int n, float *kc, float *vc)
{
    const int hd = kv->head_dim, bs = kv->block_size;
    for (int b = 0; b * bs < n; b++) {
        const float *kt = kvp_kvcache_kblock(kv, l, kvh, b);
        const float *vb = kvp_kvcache_vblock(kv, l, kvh, b);
        int nt = n - b * bs < bs ? n - b * bs : bs;
        for (int t = 0; t < nt; t++)
            for (int d = 0; d < hd; d++)
                kc[(size_t)(b * bs + t) * hd + d] = kt[(size_t)d * bs + t];
        memcpy(vc + (size_t)b * bs * hd, vb, (size_t)nt * hd * sizeof(float));
    }
}

void kvp_attn_prefill_layer(struct kvp_ctx *c, int l, int ith, int nth)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    struct kvp_thread_scratch *ts = &c->ts[ith];
    const int hd = c->hp.head_dim, n = c->job_n, pos0 = c->job_pos0;
    const int g = c->hp.n_head / c->hp.n_head_kv;
    const int q_dim = c->hp.n_head * hd;
    const int n_chunks = (n + KVP_QCHUNK - 1) / KVP_QCHUNK;
    const float scale = 1.0f / sqrtf((float)hd);
    /* work items: (KV head, chunk), each covering the g query heads of the group, so one
     * gather serves g heads */
    long w0, w1;
    kvp_split_range((long)c->hp.n_head_kv * n_chunks, ith, nth, &w0, &w1);
    for (long w = w0; w < w1; w++) {
        int kvh = (int)(w / n_chunks), chunk = (int)(w % n_chunks);
        int qs = chunk * KVP_QCHUNK;
        int nq = n - qs < KVP_QCHUNK ? n - qs : KVP_QCHUNK;
        int n_keys = pos0 + qs + nq; /* keys visible to the chunk's last query */
        gather_kv(&c->kv, l, kvh, n_keys, ts->kc, ts->vc);
        for (int j = 0; j < g; j++) {
            int h = kvh * g + j;
            const float *qp = c->q + (size_t)qs * q_dim + (size_t)h * hd;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, n_keys, hd, scale, qp, q_dim,
                        ts->kc, hd, 0.0f, ts->s, n_keys);
            for (int i = 0; i < nq; i++) {
                float *row = ts->s + (size_t)i * n_keys;
                int visible = pos0 + qs + i + 1; /* causal: keys 0 .. own position */
                float mx = -INFINITY;
                for (int t = 0; t < visible; t++)
                    mx = row[t] > mx ? row[t] : mx;
                float inv = 1.0f / ops->exp_sum(row, visible, mx);
                for (int t = 0; t < visible; t++)
                    row[t] *= inv;
                memset(row + visible, 0, (size_t)(n_keys - visible) * sizeof(float));
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, n_keys, 1.0f, ts->s,
                        n_keys, ts->vc, hd, 0.0f, c->att + (size_t)qs * q_dim + (size_t)h * hd,
                        q_dim);
        }
    }
}
