/* Quest's bound over one f16 metadata tile with AVX-512 (quest_meta.c's one-product path):
 * each term's row converted from f16 as it is loaded (vcvtph2ps) instead of through a float
 * copy of the tile. Multiplies and adds are separate instructions in the scalar loop's order
 * (no fused multiply-add), so the sums are the same to the bit. */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/quest_meta.h"

void kvp_qmeta_tile_sel_f16_avx512(const uint16_t *tile, int hd, const float *q, int G,
                                   const uint8_t (*sel)[KVP_QMETA_SEL_HD], float scale,
                                   float *out)
{
    __m512 acc[4]; /* G <= 4: bounds_run takes the heads four at a time */
    for (int j = 0; j < G; j++)
        acc[j] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const uint16_t *row = tile + (size_t)d * 2 * KVP_QMETA_TILE;
        for (int j = 0; j < G; j++) {
            __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + sel[j][d])));
            acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(_mm512_set1_ps(q[(size_t)j * hd + d]), v));
        }
    }
    for (int j = 0; j < G; j++)
        _mm512_storeu_ps(out + (size_t)j * KVP_QMETA_TILE,
                         _mm512_mul_ps(acc[j], _mm512_set1_ps(scale)));
}
