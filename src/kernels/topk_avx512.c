/* The top-k's compaction step with AVX-512 (topk.c, topk_bisect): the indices and
 * selection keys of the values whose key is >= lo, in index order, written with compress
 * stores sixteen values at a time instead of one by one. The keys are topk.c's
 * order_key: the float's bits with the sign flipped (all bits for a negative), both zeros one
 * key. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/topk.h"

int kvp_topk_compact_avx512(const float *x, int n, uint32_t lo, int *idx, uint32_t *key)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u), lane =
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lov = _mm512_set1_epi32((int)lo);
    int w = 0;
    for (int i = 0; i < n; i += 16) {
        const __mmask16 live = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512i u = _mm512_maskz_loadu_epi32(live, x + i);
        /* both zeros: key of +0 */
        u = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(_mm512_slli_epi32(u, 1),
                                                          _mm512_slli_epi32(u, 1)),
                                   u);
        const __m512i kv = _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), sign));
        const __mmask16 keep = _mm512_mask_cmpge_epu32_mask(live, kv, lov);
        _mm512_mask_compressstoreu_epi32(idx + w, keep,
                                         _mm512_add_epi32(lane, _mm512_set1_epi32(i)));
        _mm512_mask_compressstoreu_epi32(key + w, keep, kv);
        w += __builtin_popcount(keep);
    }
    return w;
}
