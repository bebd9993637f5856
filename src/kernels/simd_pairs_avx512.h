/*
 * Block-pair loaders shared by the two AVX-512 kernel files (simd_avx512.c and
 * simd_vnni_avx512.c): two 32-element blocks of a row in one zmm, in element order.
 */
#ifndef KVP_KERNELS_SIMD_PAIRS_AVX512_H
#define KVP_KERNELS_SIMD_PAIRS_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define KVP_PINLINE static inline __attribute__((always_inline))

/* The 32 quants of block b and b+1 (34 bytes apart) in one zmm. */
KVP_PINLINE __m512i q8_pair(const uint8_t *blk)
{
    __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m256i hi = _mm256_loadu_si256((const __m256i *)(blk + 34 + 2));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

enum { PAIR_Q4_0, PAIR_Q5_0 };

/* Unsigned codes (0..15 or 0..31) of blocks b and b+1, bs bytes apart, in one zmm: the low then
 * high nibbles of each block (element order), plus Q5_0's fifth bit (qh, element j at bit j). */
KVP_PINLINE __m512i ucodes_pair(const uint8_t *wb, int kind, size_t bs)
{
    size_t qs = kind == PAIR_Q4_0 ? 2 : 6;
    __m128i a = _mm_loadu_si128((const __m128i *)(wb + qs));
    __m128i b = _mm_loadu_si128((const __m128i *)(wb + bs + qs));
    __m256i lo = _mm256_set_m128i(_mm_srli_epi16(a, 4), a);
    __m256i hi = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    __m512i q = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                                 _mm512_set1_epi8(0x0F));
    if (kind == PAIR_Q5_0) {
        uint32_t h0, h1;
        memcpy(&h0, wb + 2, 4);
        memcpy(&h1, wb + bs + 2, 4);
        __mmask64 set = (__mmask64)h0 | (__mmask64)h1 << 32;
        q = _mm512_mask_add_epi8(q, set, q, _mm512_set1_epi8(0x10));
    }
    return q;
}

#endif
