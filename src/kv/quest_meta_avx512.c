/* Quest's bound over f16 metadata tiles with AVX-512 (quest_meta.c's one-product path): each
 * term's row converted from f16 as it is loaded (vcvtph2ps) instead of through a float copy of
 * the tile. Multiplies and adds are separate instructions in the scalar loop's order (no fused
 * multiply-add), so the sums are the same to the bit.
 *
 * Each block's sum is one chain of head_dim dependent adds, so one tile at a time leaves the
 * adder waiting on its own latency. Four tiles run side by side (4 × G independent chains, the
 * same terms in the same order per lane), and G is a compile-time constant in each copy so the
 * accumulators stay in registers (with a run-time G they were spilled to the stack, a store and
 * a reload per term: ~10 µs for 1024 blocks of a 32-wide pair of heads, now ~1). */
#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/quest_meta.h"

#define QM_NT 4 /* tiles side by side */

/* NT tiles from base (per values apart) side by side, G heads: their scaled bounds to out
 * (out + j·ostride + u·16 for head j, tile u); prefetch: the same rows two groups further on. */
static inline __attribute__((always_inline)) void
group_sel(const uint16_t *base, size_t per, int hd, const float *q, const int G, const int NT,
          const uint8_t (*sel)[KVP_QMETA_SEL_HD], __m512 sc, float *out, int ostride,
          bool prefetch)
{
    __m512 acc[4][QM_NT];
#pragma GCC unroll 4
    for (int j = 0; j < G; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++)
            acc[j][u] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const uint16_t *row = base + (size_t)d * 2 * KVP_QMETA_TILE;
        /* at long context the metadata streams from memory, the KV reads having evicted it;
         * four tiles are four streams the hardware prefetcher follows only slowly: fetch the
         * same rows two groups ahead */
        if (prefetch)
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++)
                _mm_prefetch((const char *)(row + (2 * QM_NT + u) * per), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) {
            const __m512 qv = _mm512_set1_ps(q[(size_t)j * hd + d]);
            const uint16_t *r = row + sel[j][d];
#pragma GCC unroll 4
            for (int u = 0; u < NT; u++) {
                __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + u * per)));
                acc[j][u] = _mm512_add_ps(acc[j][u], _mm512_mul_ps(qv, v));
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < G; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NT; u++)
            _mm512_storeu_ps(out + (size_t)j * ostride + (size_t)u * KVP_QMETA_TILE,
                             _mm512_mul_ps(acc[j][u], sc));
}

static inline __attribute__((always_inline)) void
tiles_sel(const uint16_t *tile, int n_tiles, int hd, const float *q, const int G,
          const uint8_t (*sel)[KVP_QMETA_SEL_HD], float scale, float *out, int ostride)
{
    const size_t per = (size_t)hd * 2 * KVP_QMETA_TILE; /* values per tile */
    const __m512 sc = _mm512_set1_ps(scale);
    /* the loop's prefetches run two groups ahead: start the first two groups' lines now */
    {
        const size_t bytes =
            (size_t)(n_tiles < 2 * QM_NT ? n_tiles : 2 * QM_NT) * per * sizeof(uint16_t);
        for (size_t b = 0; b < bytes; b += 64)
            _mm_prefetch((const char *)tile + b, _MM_HINT_T0);
    }
    int t = 0;
    for (; t + QM_NT <= n_tiles; t += QM_NT) /* the lines past the end are not prefetched */
        group_sel(tile + (size_t)t * per, per, hd, q, G, QM_NT, sel, sc,
                  out + (size_t)t * KVP_QMETA_TILE, ostride, t + 3 * QM_NT <= n_tiles);
    for (; t < n_tiles; t++) /* the last n_tiles % QM_NT, one at a time */
        group_sel(tile + (size_t)t * per, per, hd, q, G, 1, sel, sc,
                  out + (size_t)t * KVP_QMETA_TILE, ostride, false);
}

void kvp_qmeta_tiles_sel_f16_avx512(const uint16_t *tile, int n_tiles, int hd, const float *q,
                                    int G, const uint8_t (*sel)[KVP_QMETA_SEL_HD], float scale,
                                    float *out, int ostride)
{
    switch (G) { /* G <= 4: bounds_run takes the heads four at a time */
    case 1: tiles_sel(tile, n_tiles, hd, q, 1, sel, scale, out, ostride); break;
    case 2: tiles_sel(tile, n_tiles, hd, q, 2, sel, scale, out, ostride); break;
    case 3: tiles_sel(tile, n_tiles, hd, q, 3, sel, scale, out, ostride); break;
    default: tiles_sel(tile, n_tiles, hd, q, 4, sel, scale, out, ostride); break;
    }
}
