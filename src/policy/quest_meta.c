/* Quest's per-block key metadata (see quest_meta.h). */
#include "policy/quest_meta.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvcache.h"

int kvp_qmeta_init(struct kvp_qmeta *m, int n_layer, int n_head_kv, int max_blocks, int head_dim,
                   int block_size)
{
    memset(m, 0, sizeof(*m));
    m->n_lh = n_layer * n_head_kv;
    m->max_blocks = max_blocks;
    m->head_dim = head_dim;
    m->block_size = block_size;
    size_t n = (size_t)m->n_lh * max_blocks * head_dim;
    m->kmax = malloc((n ? n : 1) * sizeof(float));
    m->kmin = malloc((n ? n : 1) * sizeof(float));
    m->done = calloc((size_t)(m->n_lh ? m->n_lh : 1), sizeof(int));
    if (!m->kmax || !m->kmin || !m->done) {
        kvp_qmeta_free(m);
        return -1;
    }
    return 0;
}

void kvp_qmeta_free(struct kvp_qmeta *m)
{
    if (!m)
        return;
    free(m->kmax);
    free(m->kmin);
    free(m->done);
    memset(m, 0, sizeof(*m));
}

void kvp_qmeta_reset(struct kvp_qmeta *m)
{
    memset(m->done, 0, (size_t)m->n_lh * sizeof(int));
}

void kvp_qmeta_restart(struct kvp_qmeta *m, int lh)
{
    m->done[lh] = 0;
}

void kvp_qmeta_fold(struct kvp_qmeta *m, const struct kvp_kvcache *kv, int layer, int kvh,
                    int n_tokens)
{
    const int bs = m->block_size, hd = m->head_dim;
    const int lh = layer * kv->n_head_kv + kvh;
    const size_t mb = (size_t)m->max_blocks;
    /* The context was truncated (kvp_ctx_truncate tells no policy). Only a decode step calls
     * this after a truncation, with one new token, so the cut is at n_tokens - 1: blocks below
     * the newest one are unchanged, and the newest is refolded from its start. That block is
     * the only one a tiered store is sure to hold (a refold from 0 would read blocks that are
     * not resident). */
    if (m->done[lh] > n_tokens)
        m->done[lh] = (n_tokens - 1) / bs * bs;
    float *mx = m->kmax + (size_t)lh * hd * mb, *mn = m->kmin + (size_t)lh * hd * mb;
    for (int t = m->done[lh]; t < n_tokens; t++) {
        int b = t / bs, o = t % bs;
        for (int d = 0; d < hd; d++) {
            float k = kvp_kvcache_key_at(kv, layer, kvh, t, d); /* as stored, kept f32 */
            float *x = mx + d * mb + b, *n = mn + d * mb + b;
            if (o == 0 || k > *x)
                *x = k;
            if (o == 0 || k < *n)
                *n = k;
        }
    }
    m->done[lh] = n_tokens;
}

/* 16 blocks at a time; one lane per block, so each block's terms add in the order d = 0, 1, ...
 * exactly as the scalar loop does (no contraction: the max sits between product and sum). */
typedef float qm_vec __attribute__((vector_size(64)));
typedef int32_t qm_mask __attribute__((vector_size(64)));

__attribute__((target_clones("avx512f", "avx2", "default"))) static void
bounds_run(const float *mx, const float *mn, size_t mb, int hd, const float *q, int g,
           float scale, int b0, int n, float *out, int stride)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < g; j++) {
            const float *qj = q + (size_t)j * hd;
            qm_vec acc = {0};
            for (int d = 0; d < hd; d++) {
                qm_vec M, N;
                memcpy(&M, mx + d * mb + b0 + i, sizeof(M));
                memcpy(&N, mn + d * mb + b0 + i, sizeof(N));
                qm_vec a = qj[d] * M, b = qj[d] * N;
                qm_mask gt = a > b;
                qm_vec hi = (qm_vec)((gt & (qm_mask)a) | (~gt & (qm_mask)b));
                acc += hi;
            }
            acc *= scale;
            memcpy(out + (size_t)j * stride + i, &acc, sizeof(acc));
        }
    for (; i < n; i++)
        for (int j = 0; j < g; j++) {
            const float *qj = q + (size_t)j * hd;
            float ub = 0.0f;
            for (int d = 0; d < hd; d++) {
                float a = qj[d] * mx[d * mb + b0 + i], b = qj[d] * mn[d * mb + b0 + i];
                ub += a > b ? a : b;
            }
            out[(size_t)j * stride + i] = ub * scale;
        }
}

void kvp_qmeta_bounds(const struct kvp_qmeta *m, int lh, const float *q, int g, float scale,
                      int b0, int b1, float *out, int stride)
{
    const size_t mb = (size_t)m->max_blocks, off = (size_t)lh * m->head_dim * mb;
    if (b1 > b0)
        bounds_run(m->kmax + off, m->kmin + off, mb, m->head_dim, q, g, scale, b0, b1 - b0, out,
                   stride);
}
