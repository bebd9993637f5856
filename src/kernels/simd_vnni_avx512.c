/*
 * AVX-512 VNNI row kernels for the weight types that dominate real files, Q8_0, Q4_0, Q5_0 and
 * Q4_K;
 * compiled with the AVX-512 flags plus -mavx512vnni (this file only, so that the compiler cannot
 * put VNNI instructions into the plain AVX-512 table), and used only through the "avx512vnni"
 * table that simd.c builds from the AVX-512 one when the CPU has VNNI.
 *
 * Decode at short context on these types is bound by instructions, not memory (simd_avx512.c's
 * kernels read SmolLM2-135M's Q8_0 weights at ~13 GB/s from one core), so these kernels cut
 * the work per weight byte:
 *   - Q8_0: vpdpbusd takes unsigned × signed bytes. The weights are made unsigned by flipping
 *     their sign bit (w ^ 0x80 = w + 128) and the activations stay signed, so
 *     Σ(w + 128)·x = Σw·x + 128·Σx, and 128·Σx, which depends on x only, is taken off by
 *     starting each accumulation from -128·Σx (computed once per block pair for all rows).
 *     Per row and block pair that is one xor and one vpdpbusd where the sign trick of
 *     simd_avx512.c needs five operations; the two f16 row scales become one vcvtph2ps.
 *   - Q4_0 / Q5_0: the codes are unsigned already (vpdpbusd's signedness), so the offset (8, 16)
 *     times Σx is the starting value, shared by the rows, as above.
 *   - Q4_K: one 64-byte load per 128 codes, the nibbles split with two ands and a shift (the
 *     activations are rearranged once per super-block, for all rows, to match that order);
 *     vpmaddubsw then vpdpwssd applies the sub-block scales and accumulates in one step; the
 *     mins use int16 pair sums of the activations' bsums (|Σ| ≤ 32·127 fits int16).
 * Eight rows per pass for Q8_0, four for the others, share the activation loads; each pass
 * prefetches what a later one reads (simd_prefetch_x86.h). Integer sums are exact, so
 * results match the scalar table to float rounding, as every table does. The end of the file is
 * prefill's integer GEMM (prefill_gemm.h), the same offset trick with tokens in the lanes.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/prefill_gemm.h"
#include "kernels/simd_internal.h"
#include "kernels/simd_pairs_avx512.h"
#include "kernels/simd_prefetch_x86.h"
#include "kernels/simd_quant_x86.h"
#include "kernels/types.h"

enum { PF_AHEAD_BYTES = 8192 }; /* row-wise: how far ahead the Q8_0 kernel prefetches */

/* The Q8_0 kernel's row-wise distance: about PF_AHEAD_BYTES, a whole number of nr-row passes and
 * at least the next one (Llama-3.2-1B's 2176-byte rows: the next 8). */
static inline int64_t pf_rows(size_t rb, int nr)
{
    int64_t ahead = (int64_t)(PF_AHEAD_BYTES / (rb ? rb : 1)) + nr - 1;
    ahead -= ahead % nr;
    return ahead > nr ? ahead : nr;
}

KVP_INLINE float hsum(__m512 v)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ============================== Q8_0 ============================== */

/* The f16 scales (first two bytes) of blocks b and b+1, bs bytes apart, as floats: lanes 0..7
 * the first, 8..15 the second. */
KVP_INLINE __m512 q8_scale_pair(const uint8_t *blk, size_t bs, __m512i spread)
{
    uint16_t a, b;
    memcpy(&a, blk, 2);
    memcpy(&b, blk + bs, 2);
    __m128 s = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)a | (uint32_t)b << 16)));
    return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s));
}

/* The permutation of q8_scale_pair: lanes 0..7 from lane 0, 8..15 from lane 1. */
KVP_INLINE __m512i scale_spread(void)
{
    return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
}

/* What the rows of a pass share of an activation block pair (two Q8_0 blocks at xb): the codes,
 * the starting sum -off·codes that takes off the offset off (128, 8 or 16 in every byte) that
 * makes the weights' codes unsigned, and the two scales. */
struct x_pair {
    __m512i qx, base;
    __m512 dx;
};

KVP_INLINE struct x_pair x_pair_at(const uint8_t *xb, __m512i off, __m512i spread)
{
    struct x_pair x;
    x.qx = q8_pair(xb);
    x.base = _mm512_sub_epi32(_mm512_setzero_si512(),
                              _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, x.qx));
    x.dx = q8_scale_pair(xb, 34, spread);
    return x;
}

/* acc + (the row's two block scales at wb, bs bytes apart) · (the activations') · uw·codes, uw
 * the row's block pair as unsigned codes. */
KVP_INLINE __m512 row_pair_fma(__m512 acc, const uint8_t *wb, size_t bs, __m512i uw,
                               const struct x_pair *x, __m512i spread)
{
    __m512i s = _mm512_dpbusd_epi32(x->base, uw, x->qx);
    return _mm512_fmadd_ps(_mm512_mul_ps(q8_scale_pair(wb, bs, spread), x->dx),
                           _mm512_cvtepi32_ps(s), acc);
}

/* nr rows (1, 4 or 8) from w0 on, row_bytes apart: y[i] = dot(row i, x). */
KVP_INLINE void q8_rows_nr(const uint8_t *w0, size_t rb, const uint8_t *px, int64_t nb, float *y,
                           int nr, const struct kvp_pf_plan *pf)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80), spread = scale_spread();
    __m512 acc[8];
    for (int i = 0; i < nr; i++)
        acc[i] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        size_t o = (size_t)b * 34;
        kvp_pf_step(pf, w0, rb, nr, o, 68, o + 64, 1);
        struct x_pair x = x_pair_at(px + o, flip, spread);
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++) {
            const uint8_t *wb = w0 + (size_t)i * rb + o;
            acc[i] = row_pair_fma(acc[i], wb, 34, _mm512_xor_si512(q8_pair(wb), flip), &x, spread);
        }
    }
    if (b < nb) { /* odd last block: the same recipe on one ymm */
        size_t o = (size_t)b * 34;
        const __m256i f8 = _mm256_set1_epi8((char)0x80);
        __m256i qx = _mm256_loadu_si256((const __m256i *)(px + o + 2));
        __m256i base = _mm256_sub_epi32(_mm256_setzero_si256(),
                                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), f8, qx));
        float dx = qx_f16(px + o);
#pragma GCC unroll 8
        for (int i = 0; i < nr; i++) {
            const uint8_t *wb = w0 + (size_t)i * rb + o;
            __m256i qw = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + 2)), f8);
            __m256 s = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(base, qw, qx));
            s = _mm256_mul_ps(s, _mm256_set1_ps(qx_f16(wb) * dx));
            acc[i] = _mm512_add_ps(acc[i], _mm512_zextps256_ps512(s));
        }
    }
    for (int i = 0; i < nr; i++)
        y[i] = hsum(acc[i]);
}

void kvp_vnni_rows_q8_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y)
{
    const struct kvp_pf_plan pf = kvp_pf_plan(nrows, row_bytes, pf_rows(row_bytes, 8));
    int64_t nb = n / KVP_QK8_0, r = 0;
    for (; r + 8 <= nrows; r += 8)
        q8_rows_nr((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, xq, nb, y + r, 8, &pf);
    for (; r + 4 <= nrows; r += 4)
        q8_rows_nr((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, xq, nb, y + r, 4, &pf);
    for (; r < nrows; r++)
        q8_rows_nr((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, xq, nb, y + r, 1, &pf);
}

/* nr rows (1..4) from w0 on against nv activation vectors px[0..nv) (1..4): y[j][i] = dot(row i,
 * x_j). Every (row, vector) accumulator takes the same operations in the same order as
 * q8_rows_nr's for that row and vector alone, so each result is that kernel's bit for bit; what
 * the tile shares is the loads and conversions: a weight pair's unsigned codes and scales serve
 * every vector, a vector's codes, offset sum and scales serve every row. */
KVP_INLINE void q8_tile(const uint8_t *w0, size_t rb, const uint8_t *const *px, int nv,
                        int64_t nb, float *const *y, int nr, const struct kvp_pf_plan *pf)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80), spread = scale_spread();
    __m512 acc[4][4];
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nv; j++)
            acc[i][j] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        size_t o = (size_t)b * 34;
        kvp_pf_step(pf, w0, rb, nr, o, 68, o + 64, 1);
        struct x_pair x[4];
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++)
            x[j] = x_pair_at(px[j] + o, flip, spread);
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const uint8_t *wb = w0 + (size_t)i * rb + o;
            __m512i uw = _mm512_xor_si512(q8_pair(wb), flip);
            __m512 sw = q8_scale_pair(wb, 34, spread);
#pragma GCC unroll 4
            for (int j = 0; j < nv; j++) {
                __m512i d = _mm512_dpbusd_epi32(x[j].base, uw, x[j].qx);
                acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(sw, x[j].dx), _mm512_cvtepi32_ps(d),
                                            acc[i][j]);
            }
        }
    }
    if (b < nb) { /* odd last block: q8_rows_nr's one-ymm recipe */
        size_t o = (size_t)b * 34;
        const __m256i f8 = _mm256_set1_epi8((char)0x80);
        for (int j = 0; j < nv; j++) {
            __m256i qx = _mm256_loadu_si256((const __m256i *)(px[j] + o + 2));
            __m256i base = _mm256_sub_epi32(_mm256_setzero_si256(),
                                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), f8, qx));
            float dx = qx_f16(px[j] + o);
            for (int i = 0; i < nr; i++) {
                const uint8_t *wb = w0 + (size_t)i * rb + o;
                __m256i qw = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wb + 2)), f8);
                __m256 s = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(base, qw, qx));
                s = _mm256_mul_ps(s, _mm256_set1_ps(qx_f16(wb) * dx));
                acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_zextps256_ps512(s));
            }
        }
    }
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nv; j++)
            y[j][i] = hsum(acc[i][j]);
}

void kvp_vnni_rows_q8_0_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                              int64_t n, int64_t nrows, float *const *y)
{
    int64_t nb = n / KVP_QK8_0;
    /* the callers pass a few rows at a time (a group of rows, all vectors, then the next): the
     * plan is on whatever this call's size, as the pass over the whole matrix would have it */
    struct kvp_pf_plan pf = kvp_pf_plan(nrows, row_bytes, pf_rows(row_bytes, 4));
    pf.on = true;
    for (int j0 = 0; j0 < nv; j0 += 4) {
        int m = nv - j0 < 4 ? nv - j0 : 4;
        const uint8_t *px[4];
        float *yr[4];
        for (int j = 0; j < m; j++)
            px[j] = xq[j0 + j];
        for (int64_t r = 0; r < nrows; r += 4) {
            int nr = nrows - r < 4 ? (int)(nrows - r) : 4;
            for (int j = 0; j < m; j++)
                yr[j] = y[j0 + j] + r;
            const uint8_t *w0 = (const uint8_t *)w + (size_t)r * row_bytes;
            /* a constant vector count (and row count for whole tiles), so the accumulators
             * stay in registers */
            switch (m * 8 + (nr == 4 ? 4 : 0)) {
            case 36: q8_tile(w0, row_bytes, px, 4, nb, yr, 4, &pf); break;
            case 28: q8_tile(w0, row_bytes, px, 3, nb, yr, 4, &pf); break;
            case 20: q8_tile(w0, row_bytes, px, 2, nb, yr, 4, &pf); break;
            case 12: q8_tile(w0, row_bytes, px, 1, nb, yr, 4, &pf); break;
            case 32: q8_tile(w0, row_bytes, px, 4, nb, yr, nr, &pf); break;
            case 24: q8_tile(w0, row_bytes, px, 3, nb, yr, nr, &pf); break;
            case 16: q8_tile(w0, row_bytes, px, 2, nb, yr, nr, &pf); break;
            default: q8_tile(w0, row_bytes, px, 1, nb, yr, nr, &pf); break;
            }
        }
    }
}

/* Prefill GEMM's weight tile from Q8_0 rows (prefill_gemm.h, struct kvp_gemm_tile): the codes as
 * they are, the f16 scales as floats, corr = -128·Σ codes per block (the sum of the flipped,
 * unsigned codes by vpsadbw, less 32·128). The same values as the portable conversion in
 * prefill_gemm.c, a few instructions per block instead of a loop per byte: for a decode-sized
 * batch the conversion was most of the product's time. */
void kvp_vnni_gemm_convert_q8_0(const void *w, size_t row_bytes, int64_t rows, int64_t nb,
                                int8_t *codes, float *dw, int32_t *corr)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t i = 0; i < rows; i++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)i * row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + (size_t)b * 34;
            __m256i c = _mm256_loadu_si256((const __m256i *)(blk + 2));
            _mm256_storeu_si256((__m256i *)(codes + (size_t)(i * nb + b) * 32), c);
            __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(c, flip), _mm256_setzero_si256());
            __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad),
                                       _mm256_extracti128_si256(sad, 1));
            int64_t sum = _mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1) - 32 * 128;
            corr[i * nb + b] = -128 * (int32_t)sum;
            dw[i * nb + b] = qx_f16(blk);
        }
    }
}

/* ============================== Q4_0 / Q5_0 ============================== */

/* Unsigned codes (ucodes_pair) × signed activations is vpdpbusd's own signedness; the offset
 * (8 or 16) times the activations' sums starts the accumulation, computed once per block pair
 * for all rows. nr rows (1 or 4) from w0 on. */
KVP_INLINE void pair32_rows_nr(const uint8_t *w0, size_t rb, const uint8_t *px, int64_t nb,
                               float *y, int nr, const struct kvp_pf_plan *pf, int kind)
{
    const size_t bs = kind == PAIR_Q4_0 ? 18 : 22;
    const __m512i off = _mm512_set1_epi8(kind == PAIR_Q4_0 ? 8 : 16), spread = scale_spread();
    __m512 acc[4];
    for (int i = 0; i < nr; i++)
        acc[i] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        kvp_pf_step(pf, w0, rb, nr, (size_t)b * bs, 2 * bs, (size_t)b * bs + 64, 1);
        struct x_pair x = x_pair_at(px + (size_t)b * 34, off, spread);
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const uint8_t *wb = w0 + (size_t)i * rb + (size_t)b * bs;
            acc[i] = row_pair_fma(acc[i], wb, bs, ucodes_pair(wb, kind, bs), &x, spread);
        }
    }
    for (int i = 0; i < nr; i++) {
        y[i] = hsum(acc[i]);
        if (b < nb) /* odd last block: the shared one-block dot */
            y[i] += (kind == PAIR_Q4_0 ? qx_dot_q4_0 : qx_dot_q5_0)(
                w0 + (size_t)i * rb + (size_t)b * bs, px + (size_t)b * 34, 32);
    }
}

KVP_INLINE void pair32_rows(const void *w, size_t row_bytes, const void *xq, int64_t n,
                            int64_t nrows, float *y, int kind)
{
    const struct kvp_pf_plan pf = kvp_pf_plan(nrows, row_bytes, 4);
    int64_t nb = n / 32, r = 0;
    for (; r + 4 <= nrows; r += 4)
        pair32_rows_nr((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, xq, nb, y + r, 4,
                       &pf, kind);
    for (; r < nrows; r++)
        pair32_rows_nr((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, xq, nb, y + r, 1,
                       &pf, kind);
}

void kvp_vnni_rows_q4_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y)
{
    pair32_rows(w, row_bytes, xq, n, nrows, y, PAIR_Q4_0);
}

void kvp_vnni_rows_q5_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y)
{
    pair32_rows(w, row_bytes, xq, n, nrows, y, PAIR_Q5_0);
}

/* pair32_rows_nr for nr rows (1..4) against nv vectors (1..4): every (row, vector) takes that
 * kernel's operations in its order, bit for bit, sharing a weight pair's codes and scales among
 * the vectors and a vector's codes, offset sum and scales among the rows. Prefetches the rows
 * after the tile at the same offsets (the next tile's, or past the caller's range, the next
 * group's). */
KVP_INLINE void pair32_tile(const uint8_t *w0, size_t rb, const uint8_t *const *px, int nv,
                            int64_t nb, float *const *y, int nr, int kind)
{
    const size_t bs = kind == PAIR_Q4_0 ? 18 : 22;
    const __m512i off = _mm512_set1_epi8(kind == PAIR_Q4_0 ? 8 : 16), spread = scale_spread();
    __m512 acc[4][4];
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nv; j++)
            acc[i][j] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const size_t o = (size_t)b * bs;
        struct x_pair x[4];
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++)
            x[j] = x_pair_at(px[j] + (size_t)b * 34, off, spread);
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const uint8_t *wb = w0 + (size_t)i * rb + o;
            _mm_prefetch((const char *)wb + (size_t)nr * rb, _MM_HINT_T0);
            __m512i uw = ucodes_pair(wb, kind, bs);
            __m512 sw = q8_scale_pair(wb, bs, spread);
#pragma GCC unroll 4
            for (int j = 0; j < nv; j++) {
                __m512i d = _mm512_dpbusd_epi32(x[j].base, uw, x[j].qx);
                acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(sw, x[j].dx), _mm512_cvtepi32_ps(d),
                                            acc[i][j]);
            }
        }
    }
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nv; j++) {
            y[j][i] = hsum(acc[i][j]);
            if (b < nb)
                y[j][i] += (kind == PAIR_Q4_0 ? qx_dot_q4_0 : qx_dot_q5_0)(
                    w0 + (size_t)i * rb + (size_t)b * bs, px[j] + (size_t)b * 34, 32);
        }
}

static void pair32_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                         int64_t n, int64_t nrows, float *const *y, int kind)
{
    int64_t nb = n / 32;
    for (int j0 = 0; j0 < nv; j0 += 4) {
        int m = nv - j0 < 4 ? nv - j0 : 4;
        const uint8_t *px[4];
        float *yr[4];
        for (int j = 0; j < m; j++)
            px[j] = xq[j0 + j];
        /* whole tiles of 4 rows, then single rows, as pair32_rows groups them */
        for (int64_t r = 0; r < nrows;) {
            int nr = nrows - r >= 4 ? 4 : 1;
            for (int j = 0; j < m; j++)
                yr[j] = y[j0 + j] + r;
            const uint8_t *w0 = (const uint8_t *)w + (size_t)r * row_bytes;
#define PAIR_TILE(NV, NR) pair32_tile(w0, row_bytes, px, NV, nb, yr, NR, kind)
            switch (m * 8 + nr) {
            case 36: PAIR_TILE(4, 4); break;
            case 28: PAIR_TILE(3, 4); break;
            case 20: PAIR_TILE(2, 4); break;
            case 12: PAIR_TILE(1, 4); break;
            case 33: PAIR_TILE(4, 1); break;
            case 25: PAIR_TILE(3, 1); break;
            case 17: PAIR_TILE(2, 1); break;
            default: PAIR_TILE(1, 1); break;
            }
#undef PAIR_TILE
            r += nr;
        }
    }
}

void kvp_vnni_rows_q4_0_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                              int64_t n, int64_t nrows, float *const *y)
{
    pair32_multi(w, row_bytes, xq, nv, n, nrows, y, PAIR_Q4_0);
}

void kvp_vnni_rows_q5_0_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                              int64_t n, int64_t nrows, float *const *y)
{
    pair32_multi(w, row_bytes, xq, nv, n, nrows, y, PAIR_Q5_0);
}

/* ============================== Q4_K ============================== */

/* Super-block layout: f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins, 128 bytes of
 * codes; code byte 32c + l holds element 64c + l (low nibble) and 64c + 32 + l (high). */
enum { Q4K_BYTES = 144, Q4K_QS = 16, Q8K_BYTES = 292 };

/* nr rows (1 or 4) from w0 on. */
KVP_INLINE void q4k_rows_nr(const uint8_t *w0, size_t rb, const uint8_t *px, int64_t nsb,
                            float *y, int nr, const struct kvp_pf_plan *pf)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* int16 lane i of activation vector k takes the scale of sub-block sub[k][i / 16] */
    static const int sub[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
    __m512i idx[4];
    for (int k = 0; k < 4; k++)
        idx[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)sub[k][0])),
                                    _mm256_set1_epi16((short)sub[k][1]), 1);
    __m512 acc[4];
    __m128 mins[4];
    for (int i = 0; i < nr; i++) {
        acc[i] = _mm512_setzero_ps();
        mins[i] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < nsb; b++) {
        kvp_pf_step(pf, w0, rb, nr, (size_t)b * Q4K_BYTES, Q4K_BYTES, (size_t)b * Q4K_BYTES + 64,
                    3);
        const uint8_t *xb = px + (size_t)b * Q8K_BYTES, *xs = xb + QX_K_QS;
        /* activations in the order of the split nibbles: [x 0..31 | x 64..95], [32..63 |
         * 96..127], then the same for the second half */
        __m512i x[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const uint8_t *p = xs + 128 * (k / 2) + 32 * (k % 2);
            x[k] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                _mm256_loadu_si256((const __m256i *)(p + 64)), 1);
        }
        /* Σ of each 32-element sub-block's activations, as int16 */
        __m128i xsum = _mm256_cvtepi32_epi16(_mm256_madd_epi16(
            _mm256_loadu_si256((const __m256i *)(xb + QX_K_BSUMS)), _mm256_set1_epi16(1)));
        float xd = qx_f32(xb);
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            const uint8_t *wb = w0 + (size_t)i * rb + (size_t)b * Q4K_BYTES;
            uint8_t sc[8], m[8];
            qx_k_scales(wb + 4, sc, m);
            __m512i sc16 =
                _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
            __m512i q01 = _mm512_loadu_si512(wb + Q4K_QS);
            __m512i q23 = _mm512_loadu_si512(wb + Q4K_QS + 64);
            __m512i q[4] = {_mm512_and_si512(q01, m4),
                            _mm512_and_si512(_mm512_srli_epi16(q01, 4), m4),
                            _mm512_and_si512(q23, m4),
                            _mm512_and_si512(_mm512_srli_epi16(q23, 4), m4)};
            __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(q[k], x[k]),
                                          _mm512_permutexvar_epi16(idx[k], sc16));
            __m128i mn = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m)),
                                        xsum);
            acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(qx_f16(wb) * xd), _mm512_cvtepi32_ps(sum),
                                     acc[i]);
            mins[i] = _mm_fmadd_ps(_mm_set1_ps(qx_f16(wb + 2) * xd), _mm_cvtepi32_ps(mn), mins[i]);
        }
    }
    for (int i = 0; i < nr; i++)
        y[i] = hsum(_mm512_sub_ps(acc[i], _mm512_zextps128_ps512(mins[i])));
}

void kvp_vnni_rows_q4_k(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y)
{
    const struct kvp_pf_plan pf = kvp_pf_plan(nrows, row_bytes, 4);
    int64_t nsb = n / KVP_QK_K, r = 0;
    for (; r + 4 <= nrows; r += 4)
        q4k_rows_nr((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, xq, nsb, y + r, 4,
                    &pf);
    for (; r < nrows; r++)
        q4k_rows_nr((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, xq, nsb, y + r, 1,
                    &pf);
}

/* q4k_rows_nr for nr rows (1 or 2) against nv vectors (1..4), bit for bit per (row, vector):
 * a row's nibbles, scales and mins are unpacked once for all vectors; each vector's activations
 * are rearranged once per super-block (for all rows) into xa. */
struct q4k_xa {
    __m512i x[4];
    __m128i xsum;
    float xd;
};

KVP_INLINE void q4k_tile(const uint8_t *w0, size_t rb, const struct q4k_xa *xa, int nv, int64_t b,
                         __m512 acc[2][4], __m128 mins[2][4], int nr, const __m512i idx[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 2
    for (int i = 0; i < nr; i++) {
        const uint8_t *wb = w0 + (size_t)i * rb + (size_t)b * Q4K_BYTES;
        _mm_prefetch((const char *)wb + (size_t)nr * rb, _MM_HINT_T0);
        _mm_prefetch((const char *)wb + (size_t)nr * rb + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)wb + (size_t)nr * rb + 128, _MM_HINT_T0);
        uint8_t sc[8], m[8];
        qx_k_scales(wb + 4, sc, m);
        __m512i sc16 =
            _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        __m512i q01 = _mm512_loadu_si512(wb + Q4K_QS);
        __m512i q23 = _mm512_loadu_si512(wb + Q4K_QS + 64);
        __m512i q[4] = {_mm512_and_si512(q01, m4), _mm512_and_si512(_mm512_srli_epi16(q01, 4), m4),
                        _mm512_and_si512(q23, m4), _mm512_and_si512(_mm512_srli_epi16(q23, 4), m4)};
        __m512i scp[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            scp[k] = _mm512_permutexvar_epi16(idx[k], sc16);
        __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m));
        float d = qx_f16(wb), dmin = qx_f16(wb + 2);
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++) {
            __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(q[k], xa[j].x[k]), scp[k]);
            __m128i mn = _mm_madd_epi16(m16, xa[j].xsum);
            acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(d * xa[j].xd), _mm512_cvtepi32_ps(sum),
                                        acc[i][j]);
            mins[i][j] =
                _mm_fmadd_ps(_mm_set1_ps(dmin * xa[j].xd), _mm_cvtepi32_ps(mn), mins[i][j]);
        }
    }
}

void kvp_vnni_rows_q4_k_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                              int64_t n, int64_t nrows, float *const *y)
{
    static const int sub[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}}; /* as q4k_rows_nr */
    __m512i idx[4];
    for (int k = 0; k < 4; k++)
        idx[k] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)sub[k][0])),
                                    _mm256_set1_epi16((short)sub[k][1]), 1);
    const int64_t nsb = n / KVP_QK_K;
    for (int j0 = 0; j0 < nv; j0 += 4) {
        int m = nv - j0 < 4 ? nv - j0 : 4;
        /* rows in the grouping of kvp_vnni_rows_q4_k (fours, then ones) do not change any
         * row's sums; here twos keep the accumulators in registers */
        for (int64_t r = 0; r < nrows;) {
            int nr = nrows - r >= 2 ? 2 : 1;
            const uint8_t *w0 = (const uint8_t *)w + (size_t)r * row_bytes;
            __m512 acc[2][4];
            __m128 mins[2][4];
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 4; j++) {
                    acc[i][j] = _mm512_setzero_ps();
                    mins[i][j] = _mm_setzero_ps();
                }
            for (int64_t b = 0; b < nsb; b++) {
                struct q4k_xa xa[4];
                for (int j = 0; j < m; j++) {
                    const uint8_t *xb = (const uint8_t *)xq[j0 + j] + (size_t)b * Q8K_BYTES;
                    const uint8_t *xs = xb + QX_K_QS;
                    for (int k = 0; k < 4; k++) {
                        const uint8_t *p = xs + 128 * (k / 2) + 32 * (k % 2);
                        xa[j].x[k] = _mm512_inserti64x4(
                            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                            _mm256_loadu_si256((const __m256i *)(p + 64)), 1);
                    }
                    xa[j].xsum = _mm256_cvtepi32_epi16(
                        _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xb + QX_K_BSUMS)),
                                          _mm256_set1_epi16(1)));
                    xa[j].xd = qx_f32(xb);
                }
#define Q4K_TILE(NV, NR) q4k_tile(w0, row_bytes, xa, NV, b, acc, mins, NR, idx)
                switch (m * 8 + nr) {
                case 34: Q4K_TILE(4, 2); break;
                case 26: Q4K_TILE(3, 2); break;
                case 18: Q4K_TILE(2, 2); break;
                case 10: Q4K_TILE(1, 2); break;
                case 33: Q4K_TILE(4, 1); break;
                case 25: Q4K_TILE(3, 1); break;
                case 17: Q4K_TILE(2, 1); break;
                default: Q4K_TILE(1, 1); break;
                }
#undef Q4K_TILE
            }
            for (int i = 0; i < nr; i++)
                for (int j = 0; j < m; j++)
                    y[j0 + j][r + i] =
                        hsum(_mm512_sub_ps(acc[i][j], _mm512_zextps128_ps512(mins[i][j])));
            r += nr;
        }
    }
}

/* ============================== prefill GEMM (int8 tiles) ============================== */

/* The decode recipe turned around for a batch (prefill_gemm.h has the layouts): a zmm holds one
 * 4-byte slice of a block for 16 tokens (+128, the unsigned side of vpdpbusd), and one 4-byte
 * slice of a weight row is broadcast from memory (signed, as stored), so one vpdpbusd adds 64
 * products into 16 tokens' sums for one row and eight of them finish a block with no horizontal
 * sum. The +128 comes back as 128·Σw per row and block: the tile's corr, the starting value (the
 * decode kernels start from -128·Σx the same way). Then one convert and one multiply-add by
 * dw · dx per 16 tokens and block. A pass covers GEMM_RB rows × GEMM_TB groups of 16 tokens, so
 * each activation load serves GEMM_RB rows and each broadcast GEMM_TB groups (4 × 2: 16 int32 and
 * 8 float accumulators; 6 × 2, 8 × 1, 3 × 4 and 4 × 4 measured no better). Single thread,
 * 2048 × 2048 Q8_0 times 512 tokens: ~470 GOP/s of CPU time against ~150 GFLOP/s for the
 * dequantized tile through OpenBLAS sgemm. */
enum { GEMM_RB = 4, GEMM_TB = 2 }; /* rows and token groups of the full pass */

/* One pass of GEMM_RB (or 1) rows by GEMM_TB (or 1) groups of 16 tokens over the whole row.
 * kind: KIND_PLAIN (Q8_0/Q4_0/Q5_0 tiles: one scale per 32), KIND_Q4K (one scale per 32 and the
 * mins), KIND_Q6K (one scale per 16). Per sub-block the int32 sums start from corr and take that
 * sub-block's slices; each is converted and added with its own scale dw·dx, and for Q4_K the min
 * (mn times the tokens' block sums) is taken off after each block: for the K-quants the float
 * operations of the scalar gemm_tile_k, in its order. */
enum { KIND_PLAIN, KIND_Q4K, KIND_Q6K };

KVP_INLINE void gemm_pass(const int8_t *codes, int64_t K, const float *dw, const int32_t *corr,
                          const float *mn, int64_t nb, const uint8_t *xg, float *acc_out, int gr,
                          int gt, int kind)
{
    const bool q6 = kind == KIND_Q6K;
    const size_t gstride = (size_t)nb * KVP_GEMM_BLOCK_BYTES;
    const int per = q6 ? 2 : 1, ks = 8 / per; /* sub-blocks per block, slices per sub-block */
    const int64_t ns = nb * per;
    __m512 acc[GEMM_RB][GEMM_TB];
    for (int r = 0; r < gr; r++)
        for (int t = 0; t < gt; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *xb = xg + (size_t)b * KVP_GEMM_BLOCK_BYTES;
        __m512 dx[GEMM_TB];
#pragma GCC unroll GEMM_TB
        for (int t = 0; t < gt; t++)
            dx[t] = _mm512_loadu_ps(xb + t * gstride + 512);
#pragma GCC unroll 2
        for (int h = 0; h < per; h++) {
            __m512i s[GEMM_RB][GEMM_TB];
#pragma GCC unroll GEMM_RB
            for (int r = 0; r < gr; r++) {
                __m512i c0 = _mm512_set1_epi32(corr[r * ns + b * per + h]);
#pragma GCC unroll GEMM_TB
                for (int t = 0; t < gt; t++)
                    s[r][t] = c0;
            }
#pragma GCC unroll 8
            for (int k = h * ks; k < (h + 1) * ks; k++) {
                __m512i x[GEMM_TB];
#pragma GCC unroll GEMM_TB
                for (int t = 0; t < gt; t++)
                    x[t] = _mm512_loadu_si512(xb + t * gstride + 64 * k);
#pragma GCC unroll GEMM_RB
                for (int r = 0; r < gr; r++) {
                    int32_t wv;
                    memcpy(&wv, codes + r * K + b * 32 + 4 * k, 4);
                    __m512i w = _mm512_set1_epi32(wv);
#pragma GCC unroll GEMM_TB
                    for (int t = 0; t < gt; t++)
                        s[r][t] = _mm512_dpbusd_epi32(s[r][t], x[t], w);
                }
            }
#pragma GCC unroll GEMM_RB
            for (int r = 0; r < gr; r++) {
                __m512 d = _mm512_set1_ps(dw[r * ns + b * per + h]);
#pragma GCC unroll GEMM_TB
                for (int t = 0; t < gt; t++)
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][t]),
                                                _mm512_mul_ps(d, dx[t]), acc[r][t]);
            }
        }
        if (kind == KIND_Q4K) {
            __m512 xs[GEMM_TB];
#pragma GCC unroll GEMM_TB
            for (int t = 0; t < gt; t++)
                xs[t] = _mm512_loadu_ps(xb + t * gstride + 576);
#pragma GCC unroll GEMM_RB
            for (int r = 0; r < gr; r++) {
                __m512 m = _mm512_set1_ps(mn[r * nb + b]);
#pragma GCC unroll GEMM_TB
                for (int t = 0; t < gt; t++)
                    acc[r][t] = _mm512_fnmadd_ps(m, xs[t], acc[r][t]);
            }
        }
    }
    for (int r = 0; r < gr; r++)
        for (int t = 0; t < gt; t++)
            _mm512_storeu_ps(acc_out + (r * GEMM_TB + t) * 16, acc[r][t]);
}

/* One pass's shape and kind, as constants for the inlined kernel. */
#define GEMM_SHAPES(KIND)                                                                          \
    if (gr == GEMM_RB && gt == GEMM_TB)                                                            \
        gemm_pass(c, K, d, o, m, nb, x, out, GEMM_RB, GEMM_TB, KIND);                              \
    else if (gr == GEMM_RB)                                                                        \
        gemm_pass(c, K, d, o, m, nb, x, out, GEMM_RB, 1, KIND);                                    \
    else if (gt == GEMM_TB)                                                                        \
        gemm_pass(c, K, d, o, m, nb, x, out, 1, GEMM_TB, KIND);                                    \
    else                                                                                           \
        gemm_pass(c, K, d, o, m, nb, x, out, 1, 1, KIND)

static void gemm_pass_any(const int8_t *c, int64_t K, const float *d, const int32_t *o,
                          const float *m, int64_t nb, const uint8_t *x, float *out, int gr, int gt,
                          int kind)
{
    if (kind == KIND_Q6K) {
        GEMM_SHAPES(KIND_Q6K);
    } else if (kind == KIND_Q4K) {
        GEMM_SHAPES(KIND_Q4K);
    } else {
        GEMM_SHAPES(KIND_PLAIN);
    }
}
#undef GEMM_SHAPES

/* The passes over a tile; the pass holds tokens in lanes, y is [token][row]. */
static void gemm_tile_run(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y,
                          int ldy, bool accumulate, int kind)
{
    const int64_t K = tile->cols, nb = K / 32, ns = K / tile->sub;
    const int ng = (n + 15) / 16;
    const size_t gstride = (size_t)nb * KVP_GEMM_BLOCK_BYTES;
    float out[GEMM_RB * GEMM_TB * 16];
    for (int g = 0; g < ng;) {
        int gt = ng - g >= GEMM_TB ? GEMM_TB : 1;
        const uint8_t *x = (const uint8_t *)xg + (size_t)g * gstride;
        for (int64_t r = 0; r < tile->rows;) {
            int gr = tile->rows - r >= GEMM_RB ? GEMM_RB : 1;
            gemm_pass_any(tile->codes + r * K, K, tile->dw + r * ns, tile->corr + r * ns,
                          tile->mn ? tile->mn + r * nb : NULL, nb, x, out, gr, gt, kind);
            for (int t = 0; t < gt; t++)
                for (int j = 0; j < 16 && (g + t) * 16 + j < n; j++) {
                    float *yt = y + (size_t)((g + t) * 16 + j) * ldy + r;
                    for (int i = 0; i < gr; i++) {
                        float v = out[(i * GEMM_TB + t) * 16 + j];
                        yt[i] = accumulate ? yt[i] + v : v;
                    }
                }
            r += gr;
        }
        g += gt;
    }
}

void kvp_vnni_gemm_tile(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y,
                        int ldy, bool accumulate)
{
    gemm_tile_run(tile, xg, n, y, ldy, accumulate, KIND_PLAIN);
}

void kvp_vnni_gemm_tile_k(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y,
                          int ldy, bool accumulate)
{
    gemm_tile_run(tile, xg, n, y, ldy, accumulate, tile->sub == 16 ? KIND_Q6K : KIND_Q4K);
}
