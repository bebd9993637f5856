/* The 8-bit bound pass's tile kernel with AVX512-VNNI (quest_meta8.h): per 4 dimensions, one
 * 64-byte vector of each row (Mq, Nq) shared by the heads, and one vpdpbusd per head and row
 * with the head's 4 query bytes broadcast. Integer sums (exact), then the same two float
 * products per bound as the scalar loop: equal to it to the bit. */
#include <immintrin.h>
#include <stdint.h>

#include "kv/quest_meta8.h"

/* G a compile-time constant in each copy, so the accumulators stay in registers (with a
 * run-time G they were kept on the stack, a store and a reload per dot). */
static inline __attribute__((always_inline)) void
tile_g(const uint8_t *tile, int hd4, const uint32_t *pq, const uint32_t *nq, const int G,
       const float *cs, float *out)
{
    const uint8_t *mq = tile + KVP_QMETA_TILE * sizeof(float), *nn = mq + (size_t)hd4 * 64;
    __m512i ap[4], an[4];
#pragma GCC unroll 4
    for (int j = 0; j < G; j++)
        ap[j] = an[j] = _mm512_setzero_si512();
    for (int i = 0; i < hd4; i++) {
        __m512i vm = _mm512_load_si512((const void *)(mq + (size_t)i * 64));
        __m512i vn = _mm512_load_si512((const void *)(nn + (size_t)i * 64));
#pragma GCC unroll 4
        for (int j = 0; j < G; j++) {
            ap[j] = _mm512_dpbusd_epi32(ap[j], _mm512_set1_epi32((int)pq[(size_t)j * hd4 + i]), vm);
            an[j] = _mm512_dpbusd_epi32(an[j], _mm512_set1_epi32((int)nq[(size_t)j * hd4 + i]), vn);
        }
    }
    const __m512 sc = _mm512_loadu_ps((const float *)tile); /* the blocks' scales */
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) /* (float)sum · s · c, the scalar loop's order */
        _mm512_storeu_ps(out + (size_t)j * KVP_QMETA_TILE,
                         _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(ap[j], an[j])), sc),
                                       _mm512_set1_ps(cs[j])));
}

void kvp_qmeta8_tile_vnni(const uint8_t *tile, int hd4, const uint32_t *pq, const uint32_t *nq,
                          int G, const float *cs, float *out)
{
    switch (G) { /* G <= 4 (quest_meta8.c takes the heads four at a time) */
    case 1: tile_g(tile, hd4, pq, nq, 1, cs, out); break;
    case 2: tile_g(tile, hd4, pq, nq, 2, cs, out); break;
    case 3: tile_g(tile, hd4, pq, nq, 3, cs, out); break;
    default: tile_g(tile, hd4, pq, nq, 4, cs, out); break;
    }
}
