/* Quest's per-block key metadata (see quest_meta.h). */
#include "kv/quest_meta.h"
#include "core/settings.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "kernels/simd.h"
#include "kernels/types.h"
#include "kv/kv_types.h"
#include "kv/kvcache.h"

/* Floats of one widened key block on the stack (hd x bs; larger blocks fold element-wise). */
#define KVP_QMETA_FAST_MAX 8192

int kvp_qmeta_init(struct kvp_qmeta *m, int n_layer, int n_head_kv, int max_blocks, int head_dim,
                   int block_size)
{
    memset(m, 0, sizeof(*m));
    m->n_lh = n_layer * n_head_kv;
    m->max_blocks = max_blocks;
    m->head_dim = head_dim;
    m->block_size = block_size;
    m->n_tiles = (max_blocks + KVP_QMETA_TILE - 1) / KVP_QMETA_TILE;
    size_t n = (size_t)m->n_lh * m->n_tiles * head_dim * 2 * KVP_QMETA_TILE;
    /* zeroed: a tile's blocks beyond the folded ones are computed (never returned); on huge
     * pages: a selection reads a few KB in each of hundreds of places */
    m->tiles = n <= SIZE_MAX / sizeof(float) ? kvp_calloc_huge((n ? n : 1) * sizeof(float)) : NULL;
    m->done = calloc((size_t)(m->n_lh ? m->n_lh : 1), sizeof(int));
    m->half = calloc((size_t)(m->n_lh ? m->n_lh : 1), 1);
    if (!m->tiles || !m->done || !m->half) {
        kvp_qmeta_free(m);
        return -1;
    }
    return 0;
}

void kvp_qmeta_free(struct kvp_qmeta *m)
{
    if (!m)
        return;
    kvp_free_huge(m->tiles);
    free(m->done);
    free(m->half);
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
    const int bs = m->block_size, hd = m->head_dim, T = KVP_QMETA_TILE;
    const int lh = layer * kv->n_head_kv + kvh;
    /* The context was truncated (kvp_ctx_truncate tells no policy). Only a decode step calls
     * this after a truncation, with one new token, so the cut is at n_tokens - 1: blocks below
     * the newest one are unchanged, and the newest is refolded from its start. That block is
     * the only one a tiered store is sure to hold (a refold from 0 would read blocks that are
     * not resident). */
    if (m->done[lh] > n_tokens)
        m->done[lh] = (n_tokens - 1) / bs * bs;
    /* f16 keys have f16 maxima and minima: kept as f16, exactly, in half the bytes */
    const bool half = kv->type_k == KVP_KV_F16;
    if (m->done[lh] > 0 && m->half[lh] != half)
        m->done[lh] = 0; /* another cache's type (never within one context): refold */
    m->half[lh] = half;
    /* Whole blocks from their first token: the block's keys widened at once by the type's
     * k_rows kernel (the same f32 values kvp_kvcache_key_at gives), then each dimension's bs
     * contiguous values compared in token order as below, so the bounds are the same bits. A
     * whole prompt folded after its KV was copied in (a server's cached prefix) took 0.6 s
     * through the element-wise loop at 4096 tokens of 30 layers; this is several times less. */
    float kb[KVP_QMETA_FAST_MAX];
    const struct kvp_kv_kernels *kk =
        (size_t)hd * bs <= KVP_QMETA_FAST_MAX ? kvp_kv_kernels(kv->type_k) : NULL;
    while (kk && m->done[lh] % bs == 0 && m->done[lh] + bs <= n_tokens) {
        int b = m->done[lh] / bs;
        const uint8_t *blk = kvp_kvcache_kblock(kv, layer, kvh, b);
        if (!blk)
            break;
        kk->k_rows(blk, hd, bs, bs, kb, (size_t)bs);
        for (int d = 0; d < hd; d++) {
            const float *r = kb + (size_t)d * bs;
            float x = r[0], n = r[0];
            for (int o = 1; o < bs; o++) {
                x = r[o] > x ? r[o] : x;
                n = r[o] < n ? r[o] : n;
            }
            if (half) {
                uint16_t *tile = (uint16_t *)kvp_qmeta_tile(m, lh, b / T) + b % T;
                tile[(size_t)d * 2 * T] = kvp_f32_to_f16(x);
                tile[(size_t)d * 2 * T + T] = kvp_f32_to_f16(n);
            } else {
                float *tile = (float *)kvp_qmeta_tile(m, lh, b / T) + b % T;
                tile[(size_t)d * 2 * T] = x;
                tile[(size_t)d * 2 * T + T] = n;
            }
        }
        m->done[lh] += bs;
    }
    for (int t = m->done[lh]; t < n_tokens; t++) {
        int b = t / bs, o = t % bs;
        if (half) {
            uint16_t *tile = (uint16_t *)kvp_qmeta_tile(m, lh, b / T) + b % T;
            for (int d = 0; d < hd; d++) {
                float k = kvp_kvcache_key_at(kv, layer, kvh, t, d);
                uint16_t *x = tile + (size_t)d * 2 * T, *n = x + T;
                if (o == 0 || k > kvp_f16_to_f32(*x))
                    *x = kvp_f32_to_f16(k);
                if (o == 0 || k < kvp_f16_to_f32(*n))
                    *n = kvp_f32_to_f16(k);
            }
            continue;
        }
        float *tile = (float *)kvp_qmeta_tile(m, lh, b / T) + b % T;
        for (int d = 0; d < hd; d++) {
            float k = kvp_kvcache_key_at(kv, layer, kvh, t, d); /* as stored, kept f32 */
            float *x = tile + (size_t)d * 2 * T, *n = x + T;
            if (o == 0 || k > *x)
                *x = k;
            if (o == 0 || k < *n)
                *n = k;
        }
    }
    m->done[lh] = n_tokens;
}

/* One lane per block of a tile, so each block's terms add in the order d = 0, 1, ... exactly as
 * the scalar loop does (no contraction: the max sits between product and sum). Each dimension's
 * max and min vectors are loaded once for G query heads. */
typedef float qm_vec __attribute__((vector_size(64)));
typedef int32_t qm_mask __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) void
tile_heads(const float *tile, int d0, int d1, int hd, const float *q, int G, qm_vec *acc)
{
    for (int d = d0; d < d1; d++) {
        qm_vec M, N;
        memcpy(&M, tile + (size_t)(d - d0) * 2 * KVP_QMETA_TILE, sizeof(M));
        memcpy(&N, tile + (size_t)(d - d0) * 2 * KVP_QMETA_TILE + KVP_QMETA_TILE, sizeof(N));
        for (int j = 0; j < G; j++) {
            qm_vec a = q[(size_t)j * hd + d] * M, b = q[(size_t)j * hd + d] * N;
            qm_mask gt = a > b;
            acc[j] += (qm_vec)((gt & (qm_mask)a) | (~gt & (qm_mask)b));
        }
    }
}

/* The same sum when no q_d is zero or NaN: max(q·M, q·N) is q·M for q > 0 and q·N for q < 0
 * (M >= N: both come from the same keys, and the monotone rounding keeps the order of the
 * products; where they are equal either is the max), so one product per term, from the row
 * sel[j][d] (0: max, KVP_QMETA_TILE: min) picked once per call. The terms are the same
 * floats added in the same order, so the same sum to the bit. */
static inline __attribute__((always_inline)) void
tile_heads_sel(const float *tile, int d0, int d1, int hd, const float *q,
               const uint8_t (*sel)[KVP_QMETA_SEL_HD], int G, qm_vec *acc)
{
    for (int d = d0; d < d1; d++) {
        const float *row = tile + (size_t)(d - d0) * 2 * KVP_QMETA_TILE;
        for (int j = 0; j < G; j++) {
            qm_vec V;
            memcpy(&V, row + sel[j][d], sizeof(V));
            acc[j] += q[(size_t)j * hd + d] * V;
        }
    }
}

/* Dimensions converted from f16 per chunk (2 KB of floats on the stack). */
#define QM_HALF_DIMS 16

/* G heads over one tile, the dimensions in order; f16 tiles are converted a chunk of
 * dimensions at a time (exact: every f16 is a float) by the run-time SIMD table. */
static inline __attribute__((always_inline)) void
tile_bounds(const void *tile, bool half, int hd, const float *q, int G, float scale,
            const struct kvp_simd_ops *ops, const uint8_t (*sel)[KVP_QMETA_SEL_HD], qm_vec *acc)
{
    for (int j = 0; j < G; j++)
        acc[j] = (qm_vec){0};
    if (!half) {
        if (sel)
            tile_heads_sel(tile, 0, hd, hd, q, sel, G, acc);
        else
            tile_heads(tile, 0, hd, hd, q, G, acc);
    } else
        for (int d0 = 0; d0 < hd; d0 += QM_HALF_DIMS) {
            float buf[QM_HALF_DIMS * 2 * KVP_QMETA_TILE];
            const int d1 = d0 + QM_HALF_DIMS < hd ? d0 + QM_HALF_DIMS : hd;
            ops->dequant_f16((const uint16_t *)tile + (size_t)d0 * 2 * KVP_QMETA_TILE, buf,
                             (int64_t)(d1 - d0) * 2 * KVP_QMETA_TILE);
            if (sel)
                tile_heads_sel(buf, d0, d1, hd, q, sel, G, acc);
            else
                tile_heads(buf, d0, d1, hd, q, G, acc);
        }
    for (int j = 0; j < G; j++)
        acc[j] *= scale;
}

typedef void (*qm_f16_tile_fn)(const uint16_t *tile, int n_tiles, int hd, const float *q, int G,
                               const uint8_t (*sel)[KVP_QMETA_SEL_HD], float scale, float *out,
                               int ostride);

KVP_X86_CLONES static void bounds_run(const struct kvp_qmeta *m, int lh,
                                      const struct kvp_qmeta_query *qq, int b0, int b1,
                                      float *out, int stride, qm_f16_tile_fn f16_tile)
{
    const int hd = m->head_dim, g = qq->g;
    const float *q = qq->q, scale = qq->scale;
    const bool half = m->half[lh], signed_q = qq->signed_q;
    const struct kvp_simd_ops *ops = kvp_simd();
    const uint8_t(*sel_rows)[KVP_QMETA_SEL_HD] = qq->sel;
    const int T = KVP_QMETA_TILE;
    for (int t = b0 / T; t * T < b1; t++) {
        const void *tile = kvp_qmeta_tile(m, lh, t);
        const int lo = t * T > b0 ? t * T : b0, hi = (t + 1) * T < b1 ? (t + 1) * T : b1;
        if (signed_q && half && f16_tile && lo == t * T && hi == (t + 1) * T) {
            /* a run of whole tiles in one kernel call, written in place */
            const int n_tiles = b1 / T - t;
            for (int j0 = 0; j0 < g; j0 += 4)
                f16_tile(tile, n_tiles, hd, q + (size_t)j0 * hd, g - j0 < 4 ? g - j0 : 4,
                         &sel_rows[j0], scale,
                         out + (size_t)j0 * stride + (lo - b0), stride);
            t += n_tiles - 1;
            continue;
        }
        for (int j0 = 0; j0 < g; j0 += 4) {
            qm_vec acc[4];
            const int G = g - j0 < 4 ? g - j0 : 4;
            const float *qj = q + (size_t)j0 * hd;
            const uint8_t(*sel)[KVP_QMETA_SEL_HD] = signed_q ? &sel_rows[j0] : NULL;
            if (sel && half && f16_tile)
                f16_tile(tile, 1, hd, qj, G, sel, scale, (float *)acc, KVP_QMETA_TILE);
            else if (G == 4)
                tile_bounds(tile, half, hd, qj, 4, scale, ops, sel, acc);
            else if (G == 2)
                tile_bounds(tile, half, hd, qj, 2, scale, ops, sel, acc);
            else if (G == 1)
                tile_bounds(tile, half, hd, qj, 1, scale, ops, sel, acc);
            else
                tile_bounds(tile, half, hd, qj, 3, scale, ops, sel, acc);
            for (int j = 0; j < G; j++) {
                float lane[KVP_QMETA_TILE];
                memcpy(lane, &acc[j], sizeof(lane));
                memcpy(out + (size_t)(j0 + j) * stride + (lo - b0), lane + (lo - t * T),
                       (size_t)(hi - lo) * sizeof(float));
            }
        }
    }
}

static qm_f16_tile_fn f16_tile_best;

static void pick_f16_tile(void)
{
#if defined(__x86_64__)
    const char *want = kvp_setting(KVP_SETTING_SIMD);
    if ((kvp_cpu_features() & KVP_CPU_AVX512) &&
        !(want && (!strcmp(want, "scalar") || !strcmp(want, "avx2"))))
        f16_tile_best = kvp_qmeta_tiles_sel_f16_avx512;
#elif defined(__aarch64__)
    if (!strcmp(kvp_simd()->name, "neon")) /* KVP_SIMD=scalar keeps the float copy */
        f16_tile_best = kvp_qmeta_tiles_sel_f16_neon;
#endif
}

void kvp_qmeta_query_prep(const struct kvp_qmeta *m, struct kvp_qmeta_query *qq, const float *q,
                          int g, float scale)
{
    const int hd = m->head_dim;
    qq->q = q;
    qq->g = g;
    qq->scale = scale;
    /* the row of each term when no q_d is zero or NaN (tile_heads_sel) */
    bool signed_q = hd <= KVP_QMETA_SEL_HD && g <= KVP_QMETA_SEL_HEADS;
    for (int i = 0; signed_q && i < g * hd; i++) {
        signed_q = q[i] > 0.0f || q[i] < 0.0f;
        qq->sel[i / hd][i % hd] = q[i] > 0.0f ? 0 : KVP_QMETA_TILE;
    }
    qq->signed_q = signed_q;
}

void kvp_qmeta_bounds_q(const struct kvp_qmeta *m, int lh, const struct kvp_qmeta_query *qq,
                        int b0, int b1, float *out, int stride)
{
    /* f16 tiles on the one-product path: converted as loaded where the CPU has AVX-512 or NEON
     * (KVP_SIMD=scalar|avx2 keeps the float copy) */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pick_f16_tile);
    if (b1 > b0)
        bounds_run(m, lh, qq, b0, b1, out, stride, f16_tile_best);
}

void kvp_qmeta_bounds(const struct kvp_qmeta *m, int lh, const float *q, int g, float scale,
                      int b0, int b1, float *out, int stride)
{
    struct kvp_qmeta_query qq;
    kvp_qmeta_query_prep(m, &qq, q, g, scale);
    kvp_qmeta_bounds_q(m, lh, &qq, b0, b1, out, stride);
}

/* Dimension d of block blk's max (row 0) or min (row 1), as float. */
static float tile_value(const struct kvp_qmeta *m, int lh, int blk, int d, int row)
{
    size_t i = ((size_t)d * 2 + row) * KVP_QMETA_TILE + blk % KVP_QMETA_TILE;
    const void *t = kvp_qmeta_tile(m, lh, blk / KVP_QMETA_TILE);
    return m->half[lh] ? kvp_f16_to_f32(((const uint16_t *)t)[i]) : ((const float *)t)[i];
}

float kvp_qmeta_max(const struct kvp_qmeta *m, int lh, int blk, int d)
{
    return tile_value(m, lh, blk, d, 0);
}

float kvp_qmeta_min(const struct kvp_qmeta *m, int lh, int blk, int d)
{
    return tile_value(m, lh, blk, d, 1);
}

void kvp_qmeta_block(const struct kvp_qmeta *m, int lh, int blk, float *mx, float *mn)
{
    for (int d = 0; d < m->head_dim; d++) {
        mx[d] = tile_value(m, lh, blk, d, 0);
        mn[d] = tile_value(m, lh, blk, d, 1);
    }
}

/* ---- the coarse level: groups of G blocks ------------------------------------------------- */

int kvp_qmeta_group_init(struct kvp_qmeta *grp, const struct kvp_qmeta *blk, int G)
{
    memset(grp, 0, sizeof(*grp));
    if (G < 1 || blk->block_size > (1 << 30) / G)
        return -1;
    const int n_groups = (blk->max_blocks + G - 1) / G;
    /* n_lh = n_layer · n_head_kv: one "layer" of n_lh heads gives the same layout */
    return kvp_qmeta_init(grp, 1, blk->n_lh, n_groups, blk->head_dim, blk->block_size * G);
}

/* Row 0 (max) or 1 (min), dimension d, of entry e of a kvp_qmeta's lh: its address. */
static void *tile_at(const struct kvp_qmeta *m, int lh, int e, int d, int row)
{
    size_t i = ((size_t)d * 2 + row) * KVP_QMETA_TILE + e % KVP_QMETA_TILE;
    char *t = kvp_qmeta_tile(m, lh, e / KVP_QMETA_TILE);
    return t + i * (m->half[lh] ? sizeof(uint16_t) : sizeof(float));
}

/* Group gi of lh widened by blocks [b0, b1) (fresh: set from b0 first). f16 values are compared
 * as floats and stored back exactly (each is one of the blocks' f16 values). */
static void group_merge(struct kvp_qmeta *grp, const struct kvp_qmeta *blk, int lh, int gi,
                        int b0, int b1, bool fresh)
{
    const bool half = blk->half[lh];
    for (int d = 0; d < blk->head_dim; d++) {
        float mx = fresh ? tile_value(blk, lh, b0, d, 0) : tile_value(grp, lh, gi, d, 0);
        float mn = fresh ? tile_value(blk, lh, b0, d, 1) : tile_value(grp, lh, gi, d, 1);
        for (int b = b0; b < b1; b++) {
            const float x = tile_value(blk, lh, b, d, 0), n = tile_value(blk, lh, b, d, 1);
            mx = x > mx ? x : mx;
            mn = n < mn ? n : mn;
        }
        void *px = tile_at(grp, lh, gi, d, 0), *pn = tile_at(grp, lh, gi, d, 1);
        if (half) {
            *(uint16_t *)px = kvp_f32_to_f16(mx);
            *(uint16_t *)pn = kvp_f32_to_f16(mn);
        } else {
            *(float *)px = mx;
            *(float *)pn = mn;
        }
    }
}

void kvp_qmeta_group_update(struct kvp_qmeta *grp, const struct kvp_qmeta *blk, int lh,
                            int n_tokens)
{
    const int bs = blk->block_size, G = grp->block_size / bs;
    int done = grp->done[lh];
    /* a cut (truncated context, restarted blocks) or another key type: the groups from the
     * one holding the cut are rebuilt from their blocks */
    bool rebuild = done > n_tokens || (done > 0 && grp->half[lh] != blk->half[lh]);
    if (rebuild && grp->half[lh] != blk->half[lh])
        done = 0;
    else if (rebuild)
        done = n_tokens - 1 < 0 ? 0 : n_tokens - 1;
    grp->half[lh] = blk->half[lh];
    if (!rebuild && done == n_tokens)
        return; /* nothing new (a second call for the same step) */
    if (n_tokens <= 0) {
        grp->done[lh] = 0;
        return;
    }
    const int fb = done / bs, lb = (n_tokens - 1) / bs; /* blocks that changed */
    for (int gi = fb / G; gi <= lb / G; gi++) {
        const int g0 = gi * G, g1 = (gi + 1) * G < lb + 1 ? (gi + 1) * G : lb + 1;
        /* a group the last update left whole up to block fb only widens; one it never saw, or
         * one holding the cut, is set afresh from its first block */
        const bool fresh = rebuild || done <= g0 * bs;
        const int from = fresh ? g0 : (fb > g0 ? fb : g0);
        group_merge(grp, blk, lh, gi, from, g1, fresh);
    }
    grp->done[lh] = n_tokens;
}
