/* Quest's per-block key metadata (see quest_meta.h). */
#include "policy/quest_meta.h"

#include <stdlib.h>
#include <string.h>

#include "forward/kvcache.h"
#include "kernels/simd.h"

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
    /* The context was truncated (kvp_ctx_truncate tells no policy). Only a decode step calls
     * this after a truncation, with one new token, so the cut is at n_tokens - 1: blocks below
     * the newest one are unchanged, and the newest is refolded from its start. That block is
     * the only one a tiered store is sure to hold (a refold from 0 would read blocks that are
     * not resident). */
    if (m->done[lh] > n_tokens)
        m->done[lh] = (n_tokens - 1) / bs * bs;
    for (int t = m->done[lh]; t < n_tokens; t++) {
        int b = t / bs, o = t % bs;
        const float *kt = kvp_kvcache_kblock(kv, layer, kvh, b); /* [hd][bs] */
        float *mx = m->kmax + ((size_t)lh * m->max_blocks + b) * hd;
        float *mn = m->kmin + ((size_t)lh * m->max_blocks + b) * hd;
        for (int d = 0; d < hd; d++) {
            float k = kt[(size_t)d * bs + o];
            if (o == 0 || k > mx[d])
                mx[d] = k;
            if (o == 0 || k < mn[d])
                mn[d] = k;
        }
    }
    m->done[lh] = n_tokens;
}

void kvp_qmeta_bounds(const struct kvp_qmeta *m, int lh, const float *q, float scale, int b0,
                      int b1, float *qpm, float *out)
{
    const int hd = m->head_dim, n = b1 - b0;
    if (n <= 0)
        return;
    for (int d = 0; d < hd; d++) {
        qpm[d] = q[d] > 0.0f ? q[d] * scale : 0.0f;
        qpm[hd + d] = q[d] < 0.0f ? q[d] * scale : 0.0f;
    }
    const struct kvp_simd_ops *ops = kvp_simd();
    const size_t rb = (size_t)hd * sizeof(float);
    float *lo = qpm + 2 * hd;
    ops->rows_f32(kvp_qmeta_kmax(m, lh, b0), rb, qpm, hd, n, out);
    ops->rows_f32(kvp_qmeta_kmin(m, lh, b0), rb, qpm + hd, hd, n, lo);
    for (int i = 0; i < n; i++)
        out[i] += lo[i];
}
