/*
 * AVX2 + FMA + F16C kernels (this file is compiled with -mavx2 -mfma -mf16c; simd.c only hands
 * the table out when the CPU has them).
 *
 * Conventions shared by every kernel here:
 *   - 8-float ymm vectors, unaligned loads everywhere (quantized rows are 34-byte blocks, and
 *     callers pass pointers into an mmap), fused multiply-add, horizontal sums once at the end.
 *   - Dots keep four independent accumulators so the 4-cycle FMA latency is hidden; the row
 *     batches (rows_*) do four rows at a time with two accumulators per row, sharing each x
 *     load between the rows and folding the four final sums with one hadd tree.
 *   - Tails shorter than a vector go through a zero-padded stack copy (16-bit types) or
 *     vmaskmov (f32), never reading past the caller's arrays.
 *   - Q8_0 dots use the sign trick that works on plain AVX2: |w| as unsigned bytes times x with
 *     w's sign moved onto it (vpsignb), vpmaddubsw to int16 pairs, vpmaddwd to int32, then one
 *     float FMA per block with the product of the two f16 scales. This needs x != -128, which
 *     our quantizer guarantees (it produces -127..127); weights may hold -128.
 *   - exp uses the classic Cephes split: 2^n · e^r with n = round(x·log2 e), |r| <= ln2/2 and a
 *     degree-7 polynomial (rel. error ~2e-7); inputs below ln(FLT_MIN) = -87.3365 give exactly
 *     0 (the true value is below FLT_MIN), -inf included, without producing NaN.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/prefill_gemm.h"
#include "kernels/simd_internal.h"
#include "kernels/simd_quant_x86.h"
#include "kernels/types.h"

enum { W_F32, W_F16, W_BF16 }; /* element kind for the generic float loaders */

/* ============================== helpers ============================== */

KVP_INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* [Σa, Σb, Σc, Σd] in one hadd tree. */
KVP_INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b);
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* Lane mask with the first k lanes set, 0 <= k <= 8. */
KVP_INLINE __m256i tail_mask(int64_t k)
{
    static const int32_t bits[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(bits + 8 - k));
}

KVP_INLINE size_t elem_size(int kind)
{
    return kind == W_F32 ? 4 : 2;
}

/* Eight elements of the given kind at p as floats. */
KVP_INLINE __m256 load8(const void *p, int kind)
{
    if (kind == W_F32)
        return _mm256_loadu_ps(p);
    __m128i h = _mm_loadu_si128(p);
    if (kind == W_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The first k (< 8) elements at p, zero-padded to eight. */
KVP_INLINE __m256 load8_tail(const void *p, int64_t k, int kind)
{
    uint8_t buf[32] = {0};
    memcpy(buf, p, (size_t)k * elem_size(kind));
    return load8(buf, kind);
}

KVP_INLINE const void *elem_at(const void *p, int64_t i, int kind)
{
    return (const char *)p + (size_t)i * elem_size(kind);
}

KVP_INLINE float f16_at(const void *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ============================== float dots ============================== */

/* The vocabulary of simd_float_x86.inc: 8 lanes, 16-bit tails through a zero-padded copy. */
#define VF __m256
#define VF_LANES 8
#define VF_ZERO() _mm256_setzero_ps()
#define VF_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VF_ADD(a, b) _mm256_add_ps(a, b)
#define VF_LOADX(p) _mm256_loadu_ps(p)
#define VF_LOADW(p, kind) load8(p, kind)
#define VF_TAIL __m256i
#define VF_TAIL_OF(n) tail_mask(n)
#define VF_LOADX_TAIL(p, t, n) _mm256_maskload_ps(p, t)
#define VF_LOADW_TAIL(p, kind, t, n) load8_tail(p, n, kind)
#define VF_ROWS_PF_PLAN(nrows, row_bytes) ((void)0)
#define VF_ROWS_PF_STEP(w0, row_bytes, i, kind) ((void)0)
#include "kernels/simd_float_x86.inc"

/* ============================== Q8_0 ============================== */

/* Eight int32 partial sums of one block pair's 32 products, as floats (exact: |Σ| < 2^24). */
KVP_INLINE __m256 q8_block_dot(const uint8_t *wb, const uint8_t *xb)
{
    /* |w| read as unsigned (so -128 -> 128) times x with w's sign: |pair| <= 2*128*127, no
     * saturation */
    return _mm256_cvtepi32_ps(qx_dot_i8(qx_load(wb + 2), qx_load(xb + 2)));
}

static float dot_q8_0(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    int64_t nb = n / KVP_QK8_0, b = 0;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *w0 = pw + b * 34, *x0 = px + b * 34;
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w0) * f16_at(x0)), q8_block_dot(w0, x0), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w0 + 34) * f16_at(x0 + 34)),
                             q8_block_dot(w0 + 34, x0 + 34), a1);
    }
    if (b < nb) {
        const uint8_t *w0 = pw + b * 34, *x0 = px + b * 34;
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w0) * f16_at(x0)), q8_block_dot(w0, x0), a0);
    }
    return hsum(_mm256_add_ps(a0, a1));
}

static void rows_q8_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                      float *y)
{
    const uint8_t *px = xq;
    int64_t nb = n / KVP_QK8_0, r = 0;
    for (; r + 4 <= nrows; r += 4) {
        const uint8_t *w0 = (const uint8_t *)w + (size_t)r * row_bytes;
        const uint8_t *w1 = w0 + row_bytes, *w2 = w1 + row_bytes, *w3 = w2 + row_bytes;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t b = 0; b < nb; b++) {
            size_t o = (size_t)b * 34;
            const uint8_t *xb = px + o;
            float dx = f16_at(xb);
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w0 + o) * dx), q8_block_dot(w0 + o, xb), a0);
            a1 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w1 + o) * dx), q8_block_dot(w1 + o, xb), a1);
            a2 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w2 + o) * dx), q8_block_dot(w2 + o, xb), a2);
            a3 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w3 + o) * dx), q8_block_dot(w3 + o, xb), a3);
        }
        _mm_storeu_ps(y + r, hsum4(a0, a1, a2, a3));
    }
    for (; r < nrows; r++)
        y[r] = dot_q8_0((const uint8_t *)w + (size_t)r * row_bytes, xq, n);
}

/* The multi-vector row kernels' prefetch: the `rows` rows eight rows past row w (past the call's
 * last rows too: the caller's next group follows, and a prefetch never faults). Without it the
 * rows streamed at the hardware prefetcher's pace, one tile's reads and products after the
 * other: two sequences decoded at 172-182 tok/s in aggregate against one's 200-210, with it
 * 294-309 (SmolLM2-135M shape Q8_0, 2 threads; 4 and 32 rows ahead no better). */
KVP_INLINE void prefetch_rows_ahead(const uint8_t *w, size_t row_bytes, int rows)
{
    const char *ahead = (const char *)w + 8 * row_bytes;
    for (const char *a = ahead; a < ahead + (size_t)rows * row_bytes; a += 64)
        _mm_prefetch(a, _MM_HINT_T0);
}

/* Rows r0..r0+3 against NV (1 or 2) vectors: y[j][r0 + i] = rows_q8_0's result for row i and
 * vector j, bit for bit (each (row, vector) accumulator takes q8_block_dot and the same fused
 * multiply-add per block in column order, and the same hsum4). What the tile shares is the
 * weight block's load and |w|, so the weights stream once for every vector instead of once per
 * vector from the L1. */
KVP_INLINE void q8_multi_tile4(const uint8_t *w0, size_t rb, const uint8_t *const *px, int64_t nb,
                               float *const *y, int64_t r0, const int NV)
{
    __m256 acc[4][2];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < NV; j++)
            acc[i][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const size_t o = (size_t)b * 34;
        __m256i qx[2];
        float dx[2];
        for (int j = 0; j < NV; j++) {
            qx[j] = qx_load(px[j] + o + 2);
            dx[j] = f16_at(px[j] + o);
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const uint8_t *wb = w0 + (size_t)i * rb + o;
            const __m256i qw = qx_load(wb + 2), aw = _mm256_sign_epi8(qw, qw);
            const float dw = f16_at(wb);
#pragma GCC unroll 2
            for (int j = 0; j < NV; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx[j]),
                                            _mm256_cvtepi32_ps(qx_dot_i8_abs(aw, qw, qx[j])),
                                            acc[i][j]);
        }
    }
    for (int j = 0; j < NV; j++)
        _mm_storeu_ps(y[j] + r0, hsum4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
}

/* rows_q8_0 for nv vectors, each result bit-identical to rows_q8_0's for that vector alone: the
 * same groups of four rows from the call's first (two vectors per pass over a group, whose 136
 * bytes a block stay in the L1 between passes), the rows past the last group through dot_q8_0. */
static void rows_q8_0_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                            int64_t n, int64_t nrows, float *const *y)
{
    const int64_t nb = n / KVP_QK8_0;
    int64_t r = 0;
    for (; r + 4 <= nrows; r += 4) {
        const uint8_t *w0 = (const uint8_t *)w + (size_t)r * row_bytes;
        prefetch_rows_ahead(w0, row_bytes, 4);
        for (int j = 0; j < nv; j += 2) {
            const uint8_t *px[2] = {xq[j], j + 1 < nv ? xq[j + 1] : NULL};
            float *const yj[2] = {y[j], j + 1 < nv ? y[j + 1] : NULL};
            if (j + 1 < nv)
                q8_multi_tile4(w0, row_bytes, px, nb, yj, r, 2);
            else
                q8_multi_tile4(w0, row_bytes, px, nb, yj, r, 1);
        }
    }
    for (; r < nrows; r++)
        for (int j = 0; j < nv; j++)
            y[j][r] = dot_q8_0((const uint8_t *)w + (size_t)r * row_bytes, xq[j], n);
}

/* The signed codes of a Q4_0 or Q5_0 block as qx_block32 forms them. */
KVP_INLINE __m256i q32_codes(const uint8_t *wb, int kind)
{
    if (kind == QX_Q4_0)
        return _mm256_sub_epi8(qx_nibbles(wb + 2), _mm256_set1_epi8(8));
    return _mm256_or_si256(qx_nibbles(wb + 6),
                           _mm256_andnot_si256(qx_bits(wb + 2), _mm256_set1_epi8(-16)));
}

/* One Q4_0 / Q5_0 row against NV (1..4) vectors: out[j] = qx_dot32 of the row with vector j,
 * bit for bit (each vector keeps qx_dot32's two accumulators, even and odd blocks, the same
 * operations per block and the same final sums); the codes are unpacked once per block for all
 * the vectors, which is most of a block's work for one vector. */
KVP_INLINE void q32_row_multi(const uint8_t *w, const uint8_t *const *px, int64_t nb,
                              size_t bytes, int kind, float *out, const int NV)
{
    __m256 acc[2][4];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < NV; j++)
            acc[h][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int h = (int)(b & 1); /* an odd last block is even: a0, as in qx_dot32 */
        const uint8_t *wb = w + (size_t)b * bytes;
        const __m256i q = q32_codes(wb, kind), aq = _mm256_sign_epi8(q, q);
        const float dw = qx_f16(wb);
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            const uint8_t *xb = px[j] + (size_t)b * 34;
            __m256i p32 = qx_dot_i8_abs(aq, q, qx_load(xb + 2));
            acc[h][j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * qx_f16(xb)), _mm256_cvtepi32_ps(p32),
                                        acc[h][j]);
        }
    }
    const __m256 z = _mm256_setzero_ps();
    for (int j = 0; j < NV; j++)
        out[j] = qx_hsum(_mm256_add_ps(_mm256_add_ps(acc[0][j], acc[1][j]), _mm256_add_ps(z, z)));
}

/* One Q4_K row against NV (1 or 2) vectors: out[j] = qx_dot_q4_k of the row with vector j, bit
 * for bit (the integer sums of a super-block are exact in any order; the float operations are
 * qx_dot_k45's, in its order). A super-block's scales, mins and nibbles are unpacked once for
 * the vectors. */
KVP_INLINE void k4_row_multi(const uint8_t *w, const uint8_t *const *px, int64_t nsb, float *out,
                             const int NV)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[2], mins[2];
    for (int j = 0; j < NV; j++)
        acc[j] = mins[j] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *wb = w + (size_t)sb * 144;
        uint8_t sc[8], m[8];
        qx_k_scales(wb + 4, sc, m);
        const float dw = qx_f16(wb), dm = qx_f16(wb + 2);
        __m256i lo[4], hi[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i q = qx_load(wb + 16 + 32 * c);
            lo[c] = _mm256_and_si256(q, m4);
            hi[c] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        }
#pragma GCC unroll 2
        for (int j = 0; j < NV; j++) {
            const uint8_t *xb = px[j] + (size_t)sb * 292, *xqs = xb + QX_K_QS;
            const float xd = qx_f32(xb);
            __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m256i p0 = _mm256_maddubs_epi16(lo[c], qx_load(xqs + 64 * c));
                __m256i p1 = _mm256_maddubs_epi16(hi[c], qx_load(xqs + 64 * c + 32));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * c])));
                sum = _mm256_add_epi32(sum,
                                       _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * c + 1])));
            }
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xd), _mm256_cvtepi32_ps(sum), acc[j]);
            mins[j] = _mm256_fmadd_ps(_mm256_set1_ps(dm * xd),
                                      _mm256_cvtepi32_ps(qx_k_mins(m, xb)), mins[j]);
        }
    }
    for (int j = 0; j < NV; j++)
        out[j] = qx_hsum(_mm256_sub_ps(acc[j], mins[j]));
}

/* One Q6_K row against NV (1 or 2) vectors: out[j] = qx_dot_q6_k of the row with vector j, bit
 * for bit (exact integer sums; qx_dot_q6_k's float operations per vector, in its order). The
 * 6-bit codes of each half super-block are assembled once for the vectors. */
KVP_INLINE void k6_row_multi(const uint8_t *w, const uint8_t *const *px, int64_t nsb, float *out,
                             const int NV)
{
    __m256 acc[2];
    float corr[2];
    for (int j = 0; j < NV; j++) {
        acc[j] = _mm256_setzero_ps();
        corr[j] = 0.0f;
    }
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *wb = w + (size_t)sb * 210;
        const int8_t *S = (const int8_t *)(wb + 192);
        __m256i sum[2];
        for (int j = 0; j < NV; j++)
            sum[j] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            qx_q6_codes(wb, h, q);
#pragma GCC unroll 2
            for (int j = 0; j < NV; j++) {
                const uint8_t *xb = px[j] + (size_t)sb * 292;
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    __m256i p =
                        _mm256_maddubs_epi16(q[k], qx_load(xb + QX_K_QS + 128 * h + 32 * k));
                    sum[j] = _mm256_add_epi32(
                        sum[j], qx_scale2(p, S[8 * h + 2 * k], S[8 * h + 2 * k + 1]));
                }
            }
        }
        for (int j = 0; j < NV; j++) {
            const uint8_t *xb = px[j] + (size_t)sb * 292;
            float dd = qx_f16(wb + 208) * qx_f32(xb);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(sum[j]), acc[j]);
            int16_t bs[16];
            qx_bsums(xb, bs);
            int32_t c = 0;
            for (int t = 0; t < 16; t++)
                c += S[t] * bs[t];
            corr[j] += dd * (float)(32 * c);
        }
    }
    for (int j = 0; j < NV; j++)
        out[j] = qx_hsum(acc[j]) - corr[j];
}

/* One row of GGUF type `type` (Q4_0, Q5_0, Q4_K or Q6_K) against m vectors through that type's
 * kernel above, the count passed as a constant so that the accumulators stay in registers. */
KVP_INLINE void row_multi(int type, const uint8_t *wr, const uint8_t *const *px, int64_t n,
                          float *out, int m)
{
    if (type == KVP_TYPE_Q4_K || type == KVP_TYPE_Q6_K) {
        const int64_t nsb = n / KVP_QK_K;
        if (type == KVP_TYPE_Q4_K && m == 2)
            k4_row_multi(wr, px, nsb, out, 2);
        else if (type == KVP_TYPE_Q4_K)
            k4_row_multi(wr, px, nsb, out, 1);
        else if (m == 2)
            k6_row_multi(wr, px, nsb, out, 2);
        else
            k6_row_multi(wr, px, nsb, out, 1);
        return;
    }
    const int kind = type == KVP_TYPE_Q4_0 ? QX_Q4_0 : QX_Q5_0;
    const size_t bytes = type == KVP_TYPE_Q4_0 ? 18 : 22;
    switch (m) {
    case 4: q32_row_multi(wr, px, n / 32, bytes, kind, out, 4); break;
    case 3: q32_row_multi(wr, px, n / 32, bytes, kind, out, 3); break;
    case 2: q32_row_multi(wr, px, n / 32, bytes, kind, out, 2); break;
    default: q32_row_multi(wr, px, n / 32, bytes, kind, out, 1); break;
    }
}

/* rows_q_multi for the types with a row kernel above (the table's row kernel for each is its
 * qx_dot_* per row), so each result is bit-identical to that vector's alone: row by row, the
 * vectors four at a time (the K-quants two: their unpacked codes take more registers), rows
 * prefetched eight ahead. */
KVP_INLINE void rows_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                           int64_t n, int64_t nrows, float *const *y, int type)
{
    const int per = type == KVP_TYPE_Q4_K || type == KVP_TYPE_Q6_K ? 2 : 4;
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
        prefetch_rows_ahead(wr, row_bytes, 1);
        for (int j0 = 0; j0 < nv; j0 += per) {
            const int m = nv - j0 < per ? nv - j0 : per;
            const uint8_t *px[4];
            float out[4];
            for (int j = 0; j < m; j++)
                px[j] = xq[j0 + j];
            row_multi(type, wr, px, n, out, m);
            for (int j = 0; j < m; j++)
                y[j0 + j][r] = out[j];
        }
    }
}

#define ROWS_MULTI_ENTRY(NAME, TYPE)                                                               \
    static void NAME(const void *w, size_t row_bytes, const void *const *xq, int nv, int64_t n,  \
                     int64_t nrows, float *const *y)                                               \
    {                                                                                              \
        rows_multi(w, row_bytes, xq, nv, n, nrows, y, TYPE);                                       \
    }
ROWS_MULTI_ENTRY(rows_q4_0_multi, KVP_TYPE_Q4_0)
ROWS_MULTI_ENTRY(rows_q5_0_multi, KVP_TYPE_Q5_0)
ROWS_MULTI_ENTRY(rows_q4_k_multi, KVP_TYPE_Q4_K)
ROWS_MULTI_ENTRY(rows_q6_k_multi, KVP_TYPE_Q6_K)
#undef ROWS_MULTI_ENTRY

/* Bit-identical to kvp_quantize_row_q8_0_ref: the same max (max is exact in any order), the same
 * f32 division and reciprocal, the same f32 product x*id, and vcvtps2dq rounds with the current
 * MXCSR mode exactly as lrintf does with the current mode (nearest-even by default). Values are
 * within [-127, 127], so the saturating packs never clip. */
static void quantize_q8_0(const float *x, void *dst, int64_t n)
{
    uint8_t *out = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        const float *xb = x + b * KVP_QK8_0;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m =
            _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                          _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = kvp_f32_to_f16(d);
        __m256 vid = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        q = _mm256_permutevar8x32_epi32(q, order); /* undo the per-lane interleave of the packs */
        uint8_t *ob = out + b * 34;
        memcpy(ob, &dh, 2);
        _mm256_storeu_si256((__m256i *)(ob + 2), q);
    }
}

static void dequant_f16(const void *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, load8(elem_at(src, i, W_F16), W_F16));
    for (; i < n; i++)
        dst[i] = f16_at(elem_at(src, i, W_F16));
}

static void dequant_q8_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        const uint8_t *blk = s + b * 34;
        __m256 d = _mm256_set1_ps(f16_at(blk));
        for (int j = 0; j < KVP_QK8_0; j += 8) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + j)));
            _mm256_storeu_ps(dst + b * KVP_QK8_0 + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}

/* ============================== vector ops ============================== */

static void axpy(float a, const float *x, float *y, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
        _mm256_storeu_ps(
            y + i + 8, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8)));
        _mm256_storeu_ps(y + i + 16, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i + 16),
                                                     _mm256_loadu_ps(y + i + 16)));
        _mm256_storeu_ps(y + i + 24, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i + 24),
                                                     _mm256_loadu_ps(y + i + 24)));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 r = _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m));
        _mm256_maskstore_ps(y + i, m, r);
    }
}

/* e^x for x <= ~88; see the file comment for the method and the range handling. */
KVP_INLINE __m256 exp8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.33654f);   /* ln(FLT_MIN) */
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ); /* false below ln(FLT_MIN), -inf and NaN */
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i k =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(e, _mm256_castsi256_ps(k)), keep);
}

static float exp_sum(float *x, int64_t n, float max)
{
    __m256 vmax = _mm256_set1_ps(max);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
        __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vmax));
        _mm256_storeu_ps(x + i, e0);
        _mm256_storeu_ps(x + i + 8, e1);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
        _mm256_storeu_ps(x + i, e);
        s0 = _mm256_add_ps(s0, e);
    }
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), vmax));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(x + i, m, e);
        s1 = _mm256_add_ps(s1, e);
    }
    return hsum(_mm256_add_ps(s0, s1));
}

/* ============================== attention blocks ============================== */

/* Scores for tokens [t, t+8) (only the lanes in m when !full): four accumulators over d. */
KVP_INLINE void scores8(const float *q, const float *kt, int hd, int bs, float scale, float *out,
                        __m256i m, int full)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int d = 0;
#define KT(dd)                                                                                     \
    (full ? _mm256_loadu_ps(kt + (size_t)(dd) * (size_t)bs)                                        \
          : _mm256_maskload_ps(kt + (size_t)(dd) * (size_t)bs, m))
    for (; d + 4 <= hd; d += 4) {
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d), KT(d), a0);
        a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d + 1), KT(d + 1), a1);
        a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d + 2), KT(d + 2), a2);
        a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d + 3), KT(d + 3), a3);
    }
    for (; d < hd; d++)
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d), KT(d), a0);
#undef KT
    __m256 s = _mm256_mul_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_set1_ps(scale));
    if (full)
        _mm256_storeu_ps(out, s);
    else
        _mm256_maskstore_ps(out, m, s);
}

static void block_scores(const float *q, const float *kt, int hd, int bs, float scale,
                         float *scores)
{
    int t = 0;
    for (; t + 8 <= bs; t += 8)
        scores8(q, kt + t, hd, bs, scale, scores + t, _mm256_setzero_si256(), 1);
    if (t < bs)
        scores8(q, kt + t, hd, bs, scale, scores + t, tail_mask(bs - t), 0);
}

/* out[d0..d0+8) += Σ_t p[t]·v[t][d0..] (lanes in m only when !full): four accumulators over t. */
KVP_INLINE void accum8(const float *p, const float *v, int hd, int n, float *out, __m256i m,
                       int full)
{
#define VT(tt)                                                                                     \
    (full ? _mm256_loadu_ps(v + (size_t)(tt) * (size_t)hd)                                         \
          : _mm256_maskload_ps(v + (size_t)(tt) * (size_t)hd, m))
    __m256 a0 = full ? _mm256_loadu_ps(out) : _mm256_maskload_ps(out, m);
    __m256 a1 = _mm256_setzero_ps(), a2 = a1, a3 = a1;
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t), VT(t), a0);
        a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t + 1), VT(t + 1), a1);
        a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t + 2), VT(t + 2), a2);
        a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t + 3), VT(t + 3), a3);
    }
    for (; t < n; t++)
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t), VT(t), a0);
#undef VT
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    if (full)
        _mm256_storeu_ps(out, s);
    else
        _mm256_maskstore_ps(out, m, s);
}

static void block_accum(const float *p, const float *v, int hd, int n, float *out)
{
    int d = 0;
    for (; d + 8 <= hd; d += 8)
        accum8(p, v + d, hd, n, out + d, _mm256_setzero_si256(), 1);
    if (d < hd)
        accum8(p, v + d, hd, n, out + d, tail_mask(hd - d), 0);
}

/* The quantized-type dots are the shared 256-bit kernels of simd_quant_x86.h. */
#define DOT_Q4_0 qx_dot_q4_0
#define DOT_Q4_K qx_dot_q4_k
#define DOT_Q6_K qx_dot_q6_k

/* Largest element: four independent max chains, one reduction at the end. */
static float vmax(const float *x, int64_t n)
{
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
        m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + i + 16));
        m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + i + 24));
    }
    for (; i + 8 <= n; i += 8)
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++)
        r = x[i] > r ? x[i] : r;
    return r;
}

/* ---- prefill's integer GEMM over a K-quant tile (prefill_gemm.h; simd.h, gemm_tile_k) ----
 * A ymm holds one 4-byte slice of a block for 8 of a group's 16 tokens (+128: vpmaddubsw's
 * unsigned side), the weight slice is broadcast (signed). K-quant codes are small (|code| <= 32),
 * so a pair of products is at most 2·255·32 = 16320 and two slices' pairs still fit an int16
 * (32640) before vpmaddwd widens them; Q8_0's codes would not, hence no gemm_tile here. Then the
 * scalar table's float operations in its order: the tables agree bit for bit. */
enum { KG_RB = 4 }; /* rows per pass */

static inline __attribute__((always_inline)) void gemm_k8(const int8_t *codes, int64_t K,
                                                          const float *dw, const int32_t *corr,
                                                          const float *mn, int64_t nb,
                                                          const uint8_t *xg, int half, float *out,
                                                          int gr, bool q6)
{
    const int per = q6 ? 2 : 1, ks = 8 / per;
    const int64_t ns = nb * per;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[KG_RB];
    for (int r = 0; r < gr; r++)
        acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *xb = xg + (size_t)b * KVP_GEMM_BLOCK_BYTES + 32 * half;
        const __m256 dx = _mm256_loadu_ps((const float *)(xb + 512));
        for (int h = 0; h < per; h++) {
            __m256i s[KG_RB];
            for (int r = 0; r < gr; r++)
                s[r] = _mm256_set1_epi32(corr[r * ns + b * per + h]);
            for (int k = h * ks; k < (h + 1) * ks; k += 2) {
                __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb + 64 * k));
                __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb + 64 * (k + 1)));
                for (int r = 0; r < gr; r++) {
                    int32_t w0, w1;
                    memcpy(&w0, codes + r * K + b * 32 + 4 * k, 4);
                    memcpy(&w1, codes + r * K + b * 32 + 4 * k + 4, 4);
                    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(x0, _mm256_set1_epi32(w0)),
                                                 _mm256_maddubs_epi16(x1, _mm256_set1_epi32(w1)));
                    s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(p, ones));
                }
            }
            for (int r = 0; r < gr; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]),
                                         _mm256_mul_ps(_mm256_set1_ps(dw[r * ns + b * per + h]),
                                                       dx),
                                         acc[r]);
        }
        if (!q6) {
            const __m256 xs = _mm256_loadu_ps((const float *)(xb + 576));
            for (int r = 0; r < gr; r++)
                acc[r] = _mm256_fnmadd_ps(_mm256_set1_ps(mn[r * nb + b]), xs, acc[r]);
        }
    }
    for (int r = 0; r < gr; r++)
        _mm256_storeu_ps(out + 8 * r, acc[r]);
}

void kvp_avx2_gemm_tile_k(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y,
                          int ldy, bool accumulate)
{
    const int64_t K = tile->cols, nb = K / 32, ns = K / tile->sub;
    const bool q6 = tile->sub == 16;
    const size_t gstride = (size_t)nb * KVP_GEMM_BLOCK_BYTES;
    float out[KG_RB * 8];
    for (int t0 = 0; t0 < n; t0 += 8) {
        const uint8_t *x = (const uint8_t *)xg + (size_t)(t0 / 16) * gstride;
        const int half = (t0 / 8) % 2;
        for (int64_t r = 0; r < tile->rows;) {
            int gr = tile->rows - r >= KG_RB ? KG_RB : 1;
            const int8_t *c = tile->codes + r * K;
            const float *d = tile->dw + r * ns, *m = tile->mn ? tile->mn + r * nb : NULL;
            const int32_t *o = tile->corr + r * ns;
            if (gr == KG_RB && q6)
                gemm_k8(c, K, d, o, m, nb, x, half, out, KG_RB, true);
            else if (gr == KG_RB)
                gemm_k8(c, K, d, o, m, nb, x, half, out, KG_RB, false);
            else if (q6)
                gemm_k8(c, K, d, o, m, nb, x, half, out, 1, true);
            else
                gemm_k8(c, K, d, o, m, nb, x, half, out, 1, false);
            for (int j = 0; j < 8 && t0 + j < n; j++) {
                float *yt = y + (size_t)(t0 + j) * ldy + r;
                for (int i = 0; i < gr; i++)
                    yt[i] = accumulate ? yt[i] + out[8 * i + j] : out[8 * i + j];
            }
            r += gr;
        }
    }
}

const struct kvp_simd_ops kvp_simd_ops_avx2 = {
    .name = "avx2",
    .dot_f32 = dot_f32,
    .dot_f16 = dot_f16,
    .dot_bf16 = dot_bf16,
    .dot_q8_0 = dot_q8_0,
    .axpy = axpy,
    .exp_sum = exp_sum,
    .max = vmax,
    .block_scores = block_scores,
    .block_accum = block_accum,
    .rows_f32 = rows_f32,
    .rows_f16 = rows_f16,
    .rows_bf16 = rows_bf16,
    .rows_q8_0 = rows_q8_0,
    .rows_q8_0_multi = rows_q8_0_multi,
    .quantize_q8_0 = quantize_q8_0,
    .dequant_f16 = dequant_f16,
    .dequant_q8_0 = dequant_q8_0,
    .dot_q =
        {
            [KVP_TYPE_Q4_0] = DOT_Q4_0,
            [KVP_TYPE_Q4_1] = qx_dot_q4_1,
            [KVP_TYPE_Q5_0] = qx_dot_q5_0,
            [KVP_TYPE_Q5_1] = qx_dot_q5_1,
            [KVP_TYPE_IQ4_NL] = qx_dot_iq4_nl,
            [KVP_TYPE_Q2_K] = qx_dot_q2_k,
            [KVP_TYPE_Q3_K] = qx_dot_q3_k,
            [KVP_TYPE_Q4_K] = DOT_Q4_K,
            [KVP_TYPE_Q5_K] = qx_dot_q5_k,
            [KVP_TYPE_Q6_K] = DOT_Q6_K,
        },
    .quantize_q8_k = qx_quantize_q8_k,
    .gemm_tile_k = kvp_avx2_gemm_tile_k,
    .rows_q_multi =
        {
            [KVP_TYPE_Q4_0] = rows_q4_0_multi,
            [KVP_TYPE_Q5_0] = rows_q5_0_multi,
            [KVP_TYPE_Q4_K] = rows_q4_k_multi,
            [KVP_TYPE_Q6_K] = rows_q6_k_multi,
        },
    /* 2 threads, aggregate decode tok/s, the batch kernels against the multi-vector row kernels
     * above (docs/batched.md): SmolLM2-135M shape Q8_0 343 / 439 / 465 against 410 / 423 / 440
     * at 16 / 24 / 32 rows, its Q5_0 and Q4_K file 292 / 320 / 421 against 359 / 348 / 349 at
     * 24 / 32 / 48; Llama-3.2-1B shape (4 layers) Q4_K 221 / 270 / 322 against 289 / 292 / 287
     * at 16 / 32 / 48 */
    .singles_gemm_q8_0 = 24,
    .singles_gemm_quant = 40,
};
