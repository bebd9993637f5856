/* Attention kernels over the block-paged KV cache (see attention.h). */
#include "forward/attention.h"

#include <math.h>
#include <string.h>

#include <cblas.h>

#include "forward/context.h"
#include "kernels/simd.h"

void kvp_attn_dense_group(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                          int n_keys, float *probs, int probs_stride, float *out)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = kv->head_dim, bs = kv->block_size;
    const int n_blocks = (n_keys + bs - 1) / bs;
    const float scale = 1.0f / sqrtf((float)hd);

    /* scores: blocks outer so each key block is loaded once for the whole group; a block
     * without storage (a tiered store's cold block seen from a policy) reads as absent */
    for (int b = 0; b < n_blocks; b++) {
        const float *kt = kvp_kvcache_kblock(kv, l, kvh, b);
        for (int j = 0; j < g; j++) {
            float *s = probs + (size_t)j * probs_stride + (size_t)b * bs;
            if (!kt)
                for (int t = 0; t < bs; t++)
                    s[t] = -INFINITY;
            else
                ops->block_scores(q + (size_t)j * hd, kt, hd, bs, scale, s);
        }
    }
    /* softmax; when an output is wanted the probabilities stay unnormalised and the output is
     * scaled once instead (one pass over n_keys fewer: this loop is the long-context hot spot) */
    float inv[64];
    for (int j = 0; j < g; j++) {
        float *p = probs + (size_t)j * probs_stride;
        float mx = kvp_simd_max(ops, p, n_keys);
        inv[j] = 1.0f / ops->exp_sum(p, n_keys, mx);
        if (!out)
            for (int t = 0; t < n_keys; t++)
                p[t] *= inv[j];
    }
    if (!out)
        return;
    memset(out, 0, (size_t)g * hd * sizeof(float));
    for (int b = 0; b < n_blocks; b++) {
        const float *vb = kvp_kvcache_vblock(kv, l, kvh, b);
        if (!vb)
            continue;
        int nt = n_keys - b * bs < bs ? n_keys - b * bs : bs;
        for (int j = 0; j < g; j++)
            ops->block_accum(probs + (size_t)j * probs_stride + (size_t)b * bs, vb, hd, nt,
                             out + (size_t)j * hd);
    }
    for (int j = 0; j < g; j++)
        for (int d = 0; d < hd; d++)
            out[(size_t)j * hd + d] *= inv[j];
}

/* Ask for the first KiB of the next selected block while this one computes: selected blocks
 * are scattered (in a tiered store's hot tier, one 4 KiB unit each), so the hardware
 * prefetchers, which stay within a page, cannot run ahead across them. */
static inline void prefetch_block(const float *p, size_t n)
{
    if (!p)
        return;
    size_t bytes = n * sizeof(float) < 1024 ? n * sizeof(float) : 1024;
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch((const char *)p + o);
}

/* The first KiB of both the keys and the values of block b (prefetch_block). */
static inline void prefetch_kv(const struct kvp_kvcache *kv, int l, int kvh, int b)
{
    prefetch_block(kvp_kvcache_kblock(kv, l, kvh, b), kv->block_floats);
    prefetch_block(kvp_kvcache_vblock(kv, l, kvh, b), kv->block_floats);
}

/* Whether selected block i of sel may be read for keys [0, n_keys), and which of its tokens
 * (bit t), after eviction and the end of the cache; 0 when nothing in it is readable. */
static uint64_t readable_tokens(const struct kvp_kvcache *kv, int l, int kvh, int n_keys,
                                const struct kvp_sel *sel, int i)
{
    const int bs = kv->block_size, last = (n_keys - 1) / bs, b = sel->blocks[i];
    if (b > last)
        return 0;
    uint64_t m = sel->mask[i] & ~kvp_kvcache_evicted(kv, l, kvh, b);
    if (b == last && n_keys % bs)
        m &= (1ULL << (n_keys % bs)) - 1;
    return m;
}

/* Reduce selected block i on its own, for the g query heads: the scores go to probs[j][i*bs..]
 * and are replaced by e_t = exp(s_t - bmax_j), bmax[j * ab->bmax_stride + i] = bmax_j (-inf when
 * nothing is readable, and then e = 0), o[j][hd] = Σ_t e_t·v_t, and l[j] = Σ_t e_t. */
static void reduce_block(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                         int n_keys, const struct kvp_sel *sel, int i, float *probs,
                         int probs_stride, struct kvp_attn_blocks *ab, float *o, int o_stride,
                         float *lsum)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = kv->head_dim, bs = kv->block_size, b = sel->blocks[i];
    const float scale = 1.0f / sqrtf((float)hd);
    const float *kt = kvp_kvcache_kblock(kv, l, kvh, b);
    const float *vb = kvp_kvcache_vblock(kv, l, kvh, b);
    uint64_t m = kt && vb ? readable_tokens(kv, l, kvh, n_keys, sel, i) : 0;
    int nt = b == (n_keys - 1) / bs ? n_keys - b * bs : bs;
    for (int j = 0; j < g; j++) {
        float *s = probs + (size_t)j * probs_stride + (size_t)i * bs;
        float *oj = o + (size_t)j * o_stride;
        float *bm = &ab->bmax[(size_t)j * ab->bmax_stride + i];
        memset(oj, 0, (size_t)hd * sizeof(float));
        if (!m) {
            memset(s, 0, (size_t)bs * sizeof(float));
            *bm = -INFINITY;
            lsum[j] = 0.0f;
            continue;
        }
        ops->block_scores(q + (size_t)j * hd, kt, hd, bs, scale, s);
        float mx = -INFINITY;
        for (int t = 0; t < bs; t++) {
            if (!((m >> t) & 1))
                s[t] = -INFINITY;
            else if (s[t] > mx)
                mx = s[t];
        }
        *bm = mx;
        lsum[j] = ops->exp_sum(s, bs, mx);
        ops->block_accum(s, vb, hd, nt, oj);
    }
}

void kvp_attn_sparse_early(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                           int n_keys, const struct kvp_sel *sel, const uint8_t *pending,
                           float *probs, int probs_stride, struct kvp_attn_blocks *ab)
{
    const int hd = kv->head_dim;
    ab->n = 0;
    for (int i = 0; i < sel->n && ab->n < ab->cap; i++) {
        if (pending[sel->blocks[i]])
            continue;
        for (int nx = i + 1; nx < sel->n; nx++)
            if (!pending[sel->blocks[nx]]) {
                prefetch_kv(kv, l, kvh, sel->blocks[nx]);
                break;
            }
        int k = ab->n++;
        ab->idx[k] = i;
        reduce_block(kv, l, kvh, q, g, n_keys, sel, i, probs, probs_stride, ab,
                     ab->o + (size_t)k * hd, ab->cap * hd, ab->lsum + (size_t)k * g);
    }
}

/* Fold one block's state (max m, exp-sum ls, value sum o) into the running one (M, L, O). */
static void merge_block(float *M, float *L, float *O, float m, float ls, const float *o, int hd)
{
    if (ls == 0.0f)
        return;
    if (m > *M) {
        float c = expf(*M - m); /* 0 for the first block (M = -inf) */
        for (int d = 0; d < hd; d++)
            O[d] = O[d] * c + o[d];
        *L = *L * c + ls;
        *M = m;
        return;
    }
    float c = expf(m - *M);
    for (int d = 0; d < hd; d++)
        O[d] += c * o[d];
    *L += c * ls;
}

void kvp_attn_sparse_group(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                           int n_keys, const struct kvp_sel *sel, float *probs, int probs_stride,
                           struct kvp_attn_blocks *ab, float *out)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = kv->head_dim, bs = kv->block_size;
    float M[64], L[64];
    for (int j = 0; j < g; j++) {
        M[j] = -INFINITY;
        L[j] = 0.0f;
    }
    memset(out, 0, (size_t)g * hd * sizeof(float));
    /* blocks in selection order: reduced now, or taken from the early pass */
    for (int i = 0, k = 0; i < sel->n; i++) {
        const float *o = ab->tmp, *ls = ab->tmp_l;
        int o_stride = hd;
        if (k < ab->n && ab->idx[k] == i) {
            o = ab->o + (size_t)k * hd;
            o_stride = ab->cap * hd;
            ls = ab->lsum + (size_t)k * g;
            k++;
        } else {
            if (i + 1 < sel->n)
                prefetch_kv(kv, l, kvh, sel->blocks[i + 1]);
            reduce_block(kv, l, kvh, q, g, n_keys, sel, i, probs, probs_stride, ab, ab->tmp, hd,
                         ab->tmp_l);
        }
        for (int j = 0; j < g; j++)
            merge_block(&M[j], &L[j], out + (size_t)j * hd,
                        ab->bmax[(size_t)j * ab->bmax_stride + i], ls[j],
                        o + (size_t)j * o_stride, hd);
    }
    ab->n = 0;
    /* normalise: out /= L, and e_t of block i becomes e_t * exp(bmax_i - M) / L */
    for (int j = 0; j < g; j++) {
        float *p = probs + (size_t)j * probs_stride;
        if (L[j] == 0.0f) { /* nothing readable: attention output stays 0 */
            memset(p, 0, (size_t)sel->n * bs * sizeof(float));
            continue;
        }
        float inv = 1.0f / L[j];
        for (int d = 0; d < hd; d++)
            out[(size_t)j * hd + d] *= inv;
        float *c = ab->bmax + (size_t)j * ab->bmax_stride;
        ops->exp_sum(c, sel->n, M[j]);
        for (int i = 0; i < sel->n; i++) {
            float f = c[i] * inv;
            for (int t = 0; t < bs; t++)
                p[(size_t)i * bs + t] *= f;
        }
    }
}

/* Dense attention mass on the tokens a selection read, for one query head. */
static double recovery_of(const float *dense, const struct kvp_sel *sel, const float *sparse,
                          int bs)
{
    double r = 0;
    for (int i = 0; i < sel->n; i++)
        for (int t = 0; t < bs; t++)
            if (sparse[(size_t)i * bs + t] > 0.0f)
                r += dense[(size_t)sel->blocks[i] * bs + t];
    return r;
}

void kvp_attn_decode_layer(struct kvp_ctx *c, int l, const float *q, float *out, int ith, int nth)
{
    const int hd = c->hp.head_dim;
    const int g = c->hp.n_head / c->hp.n_head_kv;
    const int n_keys = c->job_pos0 + 1;
    const bool sparse = c->policy && l >= c->dense_layers;
    long h0, h1;
    kvp_split_range(c->hp.n_head_kv, ith, nth, &h0, &h1);
    for (long kvh = h0; kvh < h1; kvh++) {
        size_t first = (size_t)kvh * g; /* first query head of the group */
        const float *qg = q + first * hd;
        if (!sparse) {
            kvp_attn_dense_group(&c->kv, l, (int)kvh, qg, g, n_keys,
                                 c->probs + first * c->probs_stride, c->probs_stride,
                                 out + first * hd);
            continue;
        }
        struct kvp_policy *p = c->policy;
        struct kvp_sel *sel = &c->sel[(size_t)l * c->hp.n_head_kv + kvh];
        if (!c->store)
            p->ops->select(p, l, (int)kvh, qg, n_keys, sel);
        float *sp = c->sparse_probs + first * c->probs_stride;
        kvp_attn_sparse_group(&c->kv, l, (int)kvh, qg, g, n_keys, sel, sp, c->probs_stride,
                              &c->ab[kvh], out + first * hd);
        if (c->measure && !c->store) {
            float *dp = c->dense_probs + ((size_t)l * c->hp.n_head + first) * c->probs_stride;
            kvp_attn_dense_group(&c->kv, l, (int)kvh, qg, g, n_keys, dp, c->probs_stride, NULL);
            memcpy(c->dense_q + ((size_t)l * c->hp.n_head + first) * hd, qg,
                   (size_t)g * hd * sizeof(float));
            for (int j = 0; j < g; j++)
                c->recovery[(size_t)l * c->hp.n_head + first + j] =
                    recovery_of(dp + (size_t)j * c->probs_stride, sel,
                                sp + (size_t)j * c->probs_stride, c->kv.block_size);
        }
        if (p->ops->on_step)
            p->ops->on_step(p, l, (int)kvh, sel, sp, c->probs_stride, n_keys);
    }
}

void kvp_attn_decode_early(struct kvp_ctx *c, int l, const float *q, const uint8_t *pending,
                           int ith, int nth)
{
    const int hd = c->hp.head_dim, g = c->hp.n_head / c->hp.n_head_kv;
    long h0, h1;
    kvp_split_range(c->hp.n_head_kv, ith, nth, &h0, &h1);
    for (long kvh = h0; kvh < h1; kvh++)
        kvp_attn_sparse_early(&c->kv, l, (int)kvh, q + (size_t)kvh * g * hd, g, c->job_pos0 + 1,
                              &c->sel[(size_t)l * c->hp.n_head_kv + kvh], pending,
                              c->sparse_probs + (size_t)kvh * g * c->probs_stride,
                              c->probs_stride, &c->ab[kvh]);
}

void kvp_attn_select_head(struct kvp_ctx *c, int l, const float *q, int kvh)
{
    const int hd = c->hp.head_dim, g = c->hp.n_head / c->hp.n_head_kv;
    c->policy->ops->select(c->policy, l, kvh, q + (size_t)kvh * g * hd, c->job_pos0 + 1,
                           &c->sel[(size_t)l * c->hp.n_head_kv + kvh]);
}

void kvp_attn_predict_layer(struct kvp_ctx *c, int l, int n_tokens_next, int ith, int nth)
{
    long h0, h1;
    kvp_split_range(c->hp.n_head_kv, ith, nth, &h0, &h1);
    for (long kvh = h0; kvh < h1; kvh++) {
        size_t lh = (size_t)l * c->hp.n_head_kv + kvh;
        struct kvp_sel *next = &c->sel_next[lh];
        const struct kvp_sel *last = &c->sel[lh];
        if (c->policy->ops->predict_next) {
            c->policy->ops->predict_next(c->policy, l, (int)kvh, n_tokens_next, next);
            continue;
        }
        next->n = last->n;
        memcpy(next->blocks, last->blocks, (size_t)last->n * sizeof(int32_t));
        memcpy(next->mask, last->mask, (size_t)last->n * sizeof(uint64_t));
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

/* Attention of nq queries starting at batch row qs for query head h, keys [0, n_keys). */
static void prefill_head(struct kvp_ctx *c, int l, int h, int qs, int nq, int n_keys,
                         struct kvp_thread_scratch *ts)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = c->hp.head_dim, q_dim = c->hp.n_head * hd, pos0 = c->job_pos0;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *qp = c->q + (size_t)qs * q_dim + (size_t)h * hd;
    const int obs_first = c->job_end - c->obs_n; /* first observed query position */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, n_keys, hd, scale, qp, q_dim, ts->kc,
                hd, 0.0f, ts->s, n_keys);
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
        if (c->colsum) {
            float *cs = c->colsum + ((size_t)l * c->hp.n_head + h) * c->n_ctx;
            for (int t = 0; t < visible; t++)
                cs[t] += row[t];
        }
        if (c->obs && pos >= obs_first) {
            float *o = c->obs + ((size_t)h * c->obs_n + (pos - obs_first)) * c->job_end;
            memcpy(o, row, (size_t)visible * sizeof(float));
            memset(o + visible, 0, (size_t)(c->job_end - visible) * sizeof(float));
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, n_keys, 1.0f, ts->s, n_keys,
                ts->vc, hd, 0.0f, c->att + (size_t)qs * q_dim + (size_t)h * hd, q_dim);
}

void kvp_attn_prefill_layer(struct kvp_ctx *c, int l, int ith, int nth)
{
    struct kvp_thread_scratch *ts = &c->ts[ith];
    const int n = c->job_n, pos0 = c->job_pos0;
    const int g = c->hp.n_head / c->hp.n_head_kv;
    const int n_chunks = (n + KVP_QCHUNK - 1) / KVP_QCHUNK;
    /* work items: (KV head, chunk), each covering the g query heads of the group so one gather
     * serves g heads. With column sums, one item is a whole KV head so that no two threads add
     * into the same sums. */
    const int per_item = c->colsum ? n_chunks : 1;
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
