/* The 8-bit copy of Quest's block metadata (see quest_meta8.h). */
#include "kv/quest_meta8.h"
#include "core/settings.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"

#define T KVP_QMETA_TILE

int kvp_qmeta8_init(struct kvp_qmeta8 *q, const struct kvp_qmeta *m)
{
    memset(q, 0, sizeof(*q));
    if (m->head_dim > 256)
        return -1; /* the packed queries live on the stack (run) */
    q->n_lh = m->n_lh;
    q->n_tiles = m->n_tiles;
    q->head_dim = m->head_dim;
    q->hd4 = (m->head_dim + 3) / 4;
    q->block_size = m->block_size;
    q->tile_bytes = (size_t)T * sizeof(float) + (size_t)2 * q->hd4 * T * 4;
    size_t n = (size_t)q->n_lh * q->n_tiles * q->tile_bytes;
    /* zeroed (blocks beyond the folded ones are computed, never used); huge pages as
     * kvp_qmeta's tiles */
    q->tiles = kvp_calloc_huge(n ? n : 64);
    q->done = calloc((size_t)(q->n_lh ? q->n_lh : 1), sizeof(int));
    if (!q->tiles || !q->done) {
        kvp_qmeta8_free(q);
        return -1;
    }
    /* touched now, as the KV pool is (kvcache.c): a first touch of fresh memory in a decode
     * step would stall it (on the Xeon VM, a cache's first touch cost 0.8 to 16 s of system
     * time for 3.3 GB from one run to the next) */
    memset(q->tiles, 0, n ? n : 64);
    return 0;
}

void kvp_qmeta8_free(struct kvp_qmeta8 *q)
{
    if (!q)
        return;
    kvp_free_huge(q->tiles);
    free(q->done);
    memset(q, 0, sizeof(*q));
}

void kvp_qmeta8_reset(struct kvp_qmeta8 *q)
{
    memset(q->done, 0, (size_t)q->n_lh * sizeof(int));
}

void kvp_qmeta8_restart(struct kvp_qmeta8 *q, int lh)
{
    q->done[lh] = 0;
}

static uint8_t *tile_of(const struct kvp_qmeta8 *q, int lh, int t)
{
    return q->tiles + ((size_t)lh * q->n_tiles + t) * q->tile_bytes;
}

/* ceil(x / s) in [-127, 127] (the quotient in double: a float quotient that rounds down onto
 * an integer would lose the bound) */
static int8_t up8(float x, float s)
{
    double v = ceil((double)x / (double)s);
    return (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
}

static void quantize_block(struct kvp_qmeta8 *q, const struct kvp_qmeta *m, int lh, int b)
{
    uint8_t *tile = tile_of(q, lh, b / T);
    int8_t *mq = (int8_t *)(tile + T * sizeof(float)), *nq = mq + (size_t)q->hd4 * T * 4;
    const int o = b % T;
    float mx[256], mn[256]; /* head_dim <= 256 (kvp_qmeta8_init) */
    kvp_qmeta_block(m, lh, b, mx, mn);
    float amax = 0.0f;
    for (int d = 0; d < q->head_dim; d++) {
        float x = fabsf(mx[d]), n = fabsf(mn[d]);
        amax = x > amax ? x : amax;
        amax = n > amax ? n : amax;
    }
    float s = 0.0f;
    if (amax > 0.0f && isfinite(amax)) { /* else every value 0: a zero bound */
        s = (float)((double)amax / 127.0);
        if ((double)s * 127.0 < (double)amax)
            s = nextafterf(s, INFINITY);
    }
    memcpy(tile + (size_t)o * sizeof(float), &s, sizeof(s));
    for (int d = 0; d < q->hd4 * 4; d++) {
        int8_t a = 0, c = 0;
        if (s > 0.0f && d < q->head_dim) {
            a = up8(mx[d], s);
            c = up8(-mn[d], s);
        }
        size_t i = ((size_t)(d / 4) * T + o) * 4 + d % 4;
        mq[i] = a;
        nq[i] = c;
    }
}

void kvp_qmeta8_update(struct kvp_qmeta8 *q, const struct kvp_qmeta *m, int lh, int n_tokens)
{
    const int bs = q->block_size;
    if (n_tokens <= 0) {
        q->done[lh] = 0;
        return;
    }
    int from = q->done[lh] > n_tokens ? (n_tokens - 1) / bs : q->done[lh] / bs;
    for (int b = from; b <= (n_tokens - 1) / bs; b++)
        quantize_block(q, m, lh, b);
    q->done[lh] = n_tokens;
}

/* Head j's query as u8 magnitudes of its positive and negative parts, 4 dimensions a word
 * (dimension 4i + r in byte r, as the tile), and its step c. */
static float pack_query(const float *qv, int hd, int hd4, uint32_t *pq, uint32_t *nq)
{
    float mx = 0.0f;
    for (int d = 0; d < hd; d++) {
        float a = fabsf(qv[d]);
        mx = a > mx ? a : mx;
    }
    memset(pq, 0, (size_t)hd4 * sizeof(uint32_t));
    memset(nq, 0, (size_t)hd4 * sizeof(uint32_t));
    if (!(mx > 0.0f) || !isfinite(mx))
        return 0.0f; /* zero (or unusable) query: every bound 0 */
    const float c = mx / 255.0f, inv = 255.0f / mx;
    for (int d = 0; d < hd; d++) {
        float v = qv[d] * inv;
        long u = lrintf(fabsf(v));
        uint32_t byte = (uint32_t)(u > 255 ? 255 : u < 0 ? 0 : u) << (8 * (d % 4));
        if (v > 0.0f)
            pq[d / 4] |= byte;
        else if (v < 0.0f)
            nq[d / 4] |= byte;
    }
    return c;
}

typedef void (*tile_fn)(const uint8_t *tile, int hd4, const uint32_t *pq, const uint32_t *nq,
                        int G, const float *cs, float *out);

static void tile_scalar(const uint8_t *tile, int hd4, const uint32_t *pq, const uint32_t *nq,
                        int G, const float *cs, float *out)
{
    const int8_t *mq = (const int8_t *)(tile + T * sizeof(float)), *nn = mq + (size_t)hd4 * T * 4;
    float s[T];
    memcpy(s, tile, sizeof(s));
    for (int j = 0; j < G; j++)
        for (int b = 0; b < T; b++) {
            int32_t acc = 0;
            for (int i = 0; i < hd4; i++)
                for (int r = 0; r < 4; r++) {
                    size_t x = ((size_t)i * T + b) * 4 + r;
                    acc += (int32_t)(pq[(size_t)j * hd4 + i] >> (8 * r) & 255) * mq[x] +
                           (int32_t)(nq[(size_t)j * hd4 + i] >> (8 * r) & 255) * nn[x];
                }
            out[j * T + b] = (float)acc * s[b] * cs[j];
        }
}

#define HEADS 4 /* heads per kernel call */

/* Heads [j0, j0 + G) of a packed query over blocks [b0, b1): whole tiles straight into out,
 * the ends through a tile's worth of room. */
static void run_heads(const struct kvp_qmeta8 *q, int lh, const uint32_t *pq, const uint32_t *nq,
                      const float *cs, int G, int b0, int b1, float *out, int stride, tile_fn fn)
{
    for (int t = b0 / T; t * T < b1; t++) {
        const int lo = t * T > b0 ? t * T : b0, hi = (t + 1) * T < b1 ? (t + 1) * T : b1;
        float o[HEADS * T];
        fn(tile_of(q, lh, t), q->hd4, pq, nq, G, cs, o);
        for (int j = 0; j < G; j++)
            memcpy(out + (size_t)j * stride + (lo - b0), o + j * T + (lo - t * T),
                   (size_t)(hi - lo) * sizeof(float));
    }
}

static void run(const struct kvp_qmeta8 *q, int lh, const float *qv, int g, float scale, int b0,
                int b1, float *out, int stride, tile_fn fn)
{
    const int hd4 = q->hd4;
    for (int j0 = 0; j0 < g; j0 += HEADS) {
        const int G = g - j0 < HEADS ? g - j0 : HEADS;
        uint32_t pq[HEADS * 64], nq[HEADS * 64]; /* hd4 <= 64 (kvp_qmeta8_init) */
        float cs[HEADS];
        for (int j = 0; j < G; j++)
            cs[j] = pack_query(qv + (size_t)(j0 + j) * q->head_dim, q->head_dim, hd4,
                               pq + (size_t)j * hd4, nq + (size_t)j * hd4) * scale;
        run_heads(q, lh, pq, nq, cs, G, b0, b1, out + (size_t)j0 * stride, stride, fn);
    }
}

void kvp_qmeta8_bounds_scalar(const struct kvp_qmeta8 *q, int lh, const float *qv, int g,
                              float scale, int b0, int b1, float *out, int stride)
{
    if (b1 > b0)
        run(q, lh, qv, g, scale, b0, b1, out, stride, tile_scalar);
}

static tile_fn tile_best = tile_scalar;

static void pick(void)
{
#if defined(__x86_64__)
    const char *want = kvp_setting(KVP_SETTING_SIMD);
    if ((kvp_cpu_features() & KVP_CPU_AVX512VNNI) &&
        !(want && (!strcmp(want, "scalar") || !strcmp(want, "avx2") || !strcmp(want, "avx512"))))
        tile_best = kvp_qmeta8_tile_vnni;
#endif
}

void kvp_qmeta8_bounds(const struct kvp_qmeta8 *q, int lh, const float *qv, int g, float scale,
                       int b0, int b1, float *out, int stride)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pick);
    if (b1 > b0)
        run(q, lh, qv, g, scale, b0, b1, out, stride, tile_best);
}

int kvp_qmeta8_query_prep(const struct kvp_qmeta8 *q, struct kvp_qmeta8_query *qq,
                          const float *qv, int g, float scale)
{
    if (g > KVP_QMETA_SEL_HEADS)
        return -1;
    qq->g = g;
    for (int j = 0; j < g; j++)
        qq->cs[j] = pack_query(qv + (size_t)j * q->head_dim, q->head_dim, q->hd4,
                               qq->pq + (size_t)j * q->hd4, qq->nq + (size_t)j * q->hd4) * scale;
    return 0;
}

void kvp_qmeta8_bounds_q(const struct kvp_qmeta8 *q, int lh, const struct kvp_qmeta8_query *qq,
                         int b0, int b1, float *out, int stride)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pick);
    for (int j0 = 0; b1 > b0 && j0 < qq->g; j0 += HEADS)
        run_heads(q, lh, qq->pq + (size_t)j0 * q->hd4, qq->nq + (size_t)j0 * q->hd4, qq->cs + j0,
                  qq->g - j0 < HEADS ? qq->g - j0 : HEADS, b0, b1, out + (size_t)j0 * stride,
                  stride, tile_best);
}

void kvp_qmeta8_prefetch(const struct kvp_qmeta8 *q, int lh, int b0, int b1)
{
    for (int t = b0 / T; t * T < b1; t++) {
        const char *tile = (const char *)tile_of(q, lh, t);
        for (size_t o = 0; o < q->tile_bytes; o += 64)
            __builtin_prefetch(tile + o);
    }
}
