/*
 * AVX-512 (F, BW, VL, DQ) kernels; compiled with those flags plus AVX2/FMA/F16C, and handed out
 * by simd.c only when the CPU and OS support them.
 *
 * Same structure and accuracy contract as simd_avx2.c (read its file comment first), with three
 * differences that AVX-512 makes natural:
 *   - Every tail is a masked load/store (k registers), so there are no stack copies and no
 *     scalar remainders; a 16-bit tail is vmovdqu16 under a mask, then converted.
 *   - block_scores with the usual bs = 16 is exactly one zmm per dimension; block_accum over a
 *     head of 8 (or any hd % 16) is one masked zmm.
 *   - Q8_0 works on two 34-byte blocks per zmm (two 32-byte loads joined). AVX-512 has no
 *     vpsignb, so x takes w's sign with a masked subtract (mask = w's sign bits); the rest is
 *     the AVX2 recipe: vpmaddubsw(|w|, ±x) then vpmaddwd with ones, no VNNI needed. An odd last
 *     block uses the ymm recipe.
 */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/simd_internal.h"
#include "kernels/simd_pairs_avx512.h"
#include "kernels/simd_prefetch_x86.h"
#include "kernels/simd_quant_x86.h"
#include "kernels/types.h"

enum { W_F32, W_F16, W_BF16 }; /* element kind for the generic float loaders */

/* ============================== helpers ============================== */

KVP_INLINE __mmask16 tail_mask(int64_t k) /* first k lanes, 0 <= k <= 16 */
{
    return (__mmask16)((1u << k) - 1u);
}

KVP_INLINE __m256 fold(__m512 v) /* 16 lanes -> 8 lanes */
{
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}

KVP_INLINE float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KVP_INLINE float hsum(__m512 v)
{
    return hsum256(fold(v));
}

/* [Σa, Σb, Σc, Σd] in one fold + hadd tree. */
KVP_INLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    __m256 ab = _mm256_hadd_ps(fold(a), fold(b));
    __m256 cd = _mm256_hadd_ps(fold(c), fold(d));
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

KVP_INLINE const void *elem_at(const void *p, int64_t i, int kind)
{
    return (const char *)p + (size_t)i * (kind == W_F32 ? 4u : 2u);
}

/* Sixteen elements at p as floats (lanes outside m read as 0 and are not touched in memory). */
KVP_INLINE __m512 load16(const void *p, int kind, __mmask16 m, int full)
{
    if (kind == W_F32)
        return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
    __m256i h = full ? _mm256_loadu_si256(p) : _mm256_maskz_loadu_epi16(m, p);
    if (kind == W_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

KVP_INLINE float f16_at(const void *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ============================== float dots ============================== */

/* The vocabulary of simd_float_x86.inc: 16 lanes, every tail a masked load; the row batches
 * prefetch what their next pass reads (simd_prefetch_x86.h). */
#define VF __m512
#define VF_LANES 16
#define VF_ZERO() _mm512_setzero_ps()
#define VF_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VF_ADD(a, b) _mm512_add_ps(a, b)
#define VF_LOADX(p) _mm512_loadu_ps(p)
#define VF_LOADW(p, kind) load16(p, kind, 0, 1)
#define VF_TAIL __mmask16
#define VF_TAIL_OF(n) tail_mask(n)
#define VF_LOADX_TAIL(p, t, n) _mm512_maskz_loadu_ps(t, p)
#define VF_LOADW_TAIL(p, kind, t, n) load16(p, kind, t, 0)
#define VF_ROWS_PF_PLAN(nrows, row_bytes)                                                          \
    const struct kvp_pf_plan pfp = kvp_pf_plan(nrows, row_bytes, 4)
#define VF_ROWS_PF_STEP(w0, row_bytes, i, kind)                                                    \
    do {                                                                                           \
        const size_t esz = (kind) == W_F32 ? 4 : 2;                                                \
        kvp_pf_step(&pfp, w0, row_bytes, 4, (size_t)(i) * esz, 32 * esz, (size_t)(i) * esz,       \
                    (kind) == W_F32 ? 2 : 1);                                                      \
    } while (0)
#include "kernels/simd_float_x86.inc"

/* ============================== Q8_0 ============================== */

/* Int32 partial sums (8 per block) of two block pairs' products, as floats. */
KVP_INLINE __m512 q8_pair_dot(__m512i qw, __m512i qx)
{
    __m512i sx = _mm512_mask_sub_epi8(qx, _mm512_movepi8_mask(qw), _mm512_setzero_si512(), qx);
    __m512i p16 = _mm512_maddubs_epi16(_mm512_abs_epi8(qw), sx);
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(p16, _mm512_set1_epi16(1)));
}

/* Lanes 0..7 = s0, lanes 8..15 = s1. */
KVP_INLINE __m512 scale_pair(float s0, float s1)
{
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0)), _mm256_set1_ps(s1), 1);
}

/* One block pair with the ymm recipe of simd_avx2.c. */
KVP_INLINE __m256 q8_block_dot(const uint8_t *wb, const uint8_t *xb)
{
    __m256i qw = _mm256_loadu_si256((const __m256i *)(wb + 2));
    __m256i qx = _mm256_loadu_si256((const __m256i *)(xb + 2));
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* One block pair times d_w * dx, in the low half of a zmm (high half zero). */
KVP_INLINE __m512 q8_block_dot_scaled(const uint8_t *wb, const uint8_t *xb, float dx)
{
    __m256 v = _mm256_mul_ps(_mm256_set1_ps(f16_at(wb) * dx), q8_block_dot(wb, xb));
    return _mm512_zextps256_ps512(v);
}

static float dot_q8_0(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    int64_t nb = n / KVP_QK8_0, b = 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *w0 = pw + b * 34, *x0 = px + b * 34;
        __m512 s0 = scale_pair(f16_at(w0) * f16_at(x0), f16_at(w0 + 34) * f16_at(x0 + 34));
        __m512 s1 =
            scale_pair(f16_at(w0 + 68) * f16_at(x0 + 68), f16_at(w0 + 102) * f16_at(x0 + 102));
        a0 = _mm512_fmadd_ps(s0, q8_pair_dot(q8_pair(w0), q8_pair(x0)), a0);
        a1 = _mm512_fmadd_ps(s1, q8_pair_dot(q8_pair(w0 + 68), q8_pair(x0 + 68)), a1);
    }
    if (b + 2 <= nb) {
        const uint8_t *w0 = pw + b * 34, *x0 = px + b * 34;
        __m512 s0 = scale_pair(f16_at(w0) * f16_at(x0), f16_at(w0 + 34) * f16_at(x0 + 34));
        a0 = _mm512_fmadd_ps(s0, q8_pair_dot(q8_pair(w0), q8_pair(x0)), a0);
        b += 2;
    }
    __m256 t = fold(_mm512_add_ps(a0, a1));
    if (b < nb) {
        const uint8_t *w0 = pw + b * 34, *x0 = px + b * 34;
        t = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w0) * f16_at(x0)), q8_block_dot(w0, x0), t);
    }
    return hsum256(t);
}

static void rows_q8_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                      float *y)
{
    const uint8_t *px = xq;
    int64_t nb = n / KVP_QK8_0, r = 0;
    const struct kvp_pf_plan pfp = kvp_pf_plan(nrows, row_bytes, 4);
    for (; r + 4 <= nrows; r += 4) {
        const uint8_t *w0 = (const uint8_t *)w + (size_t)r * row_bytes;
        const uint8_t *w1 = w0 + row_bytes, *w2 = w1 + row_bytes, *w3 = w2 + row_bytes;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            size_t o = (size_t)b * 34;
            kvp_pf_step(&pfp, w0, row_bytes, 4, o, 68, o + 64, 1);
            __m512i qx = q8_pair(px + o);
            float dx0 = f16_at(px + o), dx1 = f16_at(px + o + 34);
            a0 = _mm512_fmadd_ps(scale_pair(f16_at(w0 + o) * dx0, f16_at(w0 + o + 34) * dx1),
                                 q8_pair_dot(q8_pair(w0 + o), qx), a0);
            a1 = _mm512_fmadd_ps(scale_pair(f16_at(w1 + o) * dx0, f16_at(w1 + o + 34) * dx1),
                                 q8_pair_dot(q8_pair(w1 + o), qx), a1);
            a2 = _mm512_fmadd_ps(scale_pair(f16_at(w2 + o) * dx0, f16_at(w2 + o + 34) * dx1),
                                 q8_pair_dot(q8_pair(w2 + o), qx), a2);
            a3 = _mm512_fmadd_ps(scale_pair(f16_at(w3 + o) * dx0, f16_at(w3 + o + 34) * dx1),
                                 q8_pair_dot(q8_pair(w3 + o), qx), a3);
        }
        if (b < nb) { /* odd last block: ymm recipe in the low half */
            size_t o = (size_t)b * 34;
            const uint8_t *xb = px + o;
            float dx = f16_at(xb);
            a0 = _mm512_add_ps(a0, q8_block_dot_scaled(w0 + o, xb, dx));
            a1 = _mm512_add_ps(a1, q8_block_dot_scaled(w1 + o, xb, dx));
            a2 = _mm512_add_ps(a2, q8_block_dot_scaled(w2 + o, xb, dx));
            a3 = _mm512_add_ps(a3, q8_block_dot_scaled(w3 + o, xb, dx));
        }
        _mm_storeu_ps(y + r, hsum4(a0, a1, a2, a3));
    }
    for (; r < nrows; r++)
        y[r] = dot_q8_0((const uint8_t *)w + (size_t)r * row_bytes, xq, n);
}

/* Bit-identical to kvp_quantize_row_q8_0_ref, for the reasons given in simd_avx2.c: exact max,
 * the same scalar d and 1/d, the same f32 products, rounding by the current MXCSR mode like
 * lrintf. vpmovsdb truncates int32 to int8; values are already within [-127, 127]. */
static void quantize_q8_0(const float *x, void *dst, int64_t n)
{
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        const float *xb = x + b * KVP_QK8_0;
        __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = kvp_f32_to_f16(d);
        __m512 vid = _mm512_set1_ps(id);
        __m128i q0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)));
        __m128i q1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vid)));
        uint8_t *ob = out + b * 34;
        memcpy(ob, &dh, 2);
        _mm_storeu_si128((__m128i *)(ob + 2), q0);
        _mm_storeu_si128((__m128i *)(ob + 18), q1);
    }
}

static void dequant_f16(const void *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, load16(elem_at(src, i, W_F16), W_F16, 0, 1));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, load16(elem_at(src, i, W_F16), W_F16, m, 0));
    }
}

static void dequant_q8_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        const uint8_t *blk = s + b * 34;
        __m512 d = _mm512_set1_ps(f16_at(blk));
        for (int j = 0; j < KVP_QK8_0; j += 16) {
            __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + j)));
            _mm512_storeu_ps(dst + b * KVP_QK8_0 + j, _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
        }
    }
}

/* ============================== vector ops ============================== */

static void axpy(float a, const float *x, float *y, int64_t n)
{
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        for (int k = 0; k < 64; k += 16)
            _mm512_storeu_ps(y + i + k, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i + k),
                                                        _mm512_loadu_ps(y + i + k)));
    }
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 r =
            _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

/* e^x, same method and constants as exp8 in simd_avx2.c. */
KVP_INLINE __m512 exp16(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.33654f);           /* ln(FLT_MIN) */
    __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ); /* false below ln(FLT_MIN), -inf, NaN */
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i k =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, e, _mm512_castsi512_ps(k));
}

static float exp_sum(float *x, int64_t n, float max)
{
    __m512 vmax = _mm512_set1_ps(max);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 e0 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax));
        __m512 e1 = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vmax));
        _mm512_storeu_ps(x + i, e0);
        _mm512_storeu_ps(x + i + 16, e1);
        s0 = _mm512_add_ps(s0, e0);
        s1 = _mm512_add_ps(s1, e1);
    }
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax));
        _mm512_storeu_ps(x + i, e);
        s0 = _mm512_add_ps(s0, e);
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 e =
            _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmax)));
        _mm512_mask_storeu_ps(x + i, m, e);
        s1 = _mm512_add_ps(s1, e);
    }
    return hsum(_mm512_add_ps(s0, s1));
}

/* Largest element: four independent max chains, one reduction at the end. */
static float vmax(const float *x, int64_t n)
{
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + i + 16));
        m2 = _mm512_max_ps(m2, _mm512_loadu_ps(x + i + 32));
        m3 = _mm512_max_ps(m3, _mm512_loadu_ps(x + i + 48));
    }
    for (; i + 16 <= n; i += 16)
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + i));
    if (i < n)
        m1 = _mm512_mask_max_ps(m1, tail_mask(n - i), m1, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

/* ============================== attention blocks ============================== */

/* Scores for tokens [t, t+16) (lanes in m only when !full): four accumulators over d. */
KVP_INLINE void scores16(const float *q, const float *kt, int hd, int bs, float scale, float *out,
                         __mmask16 m, int full)
{
#define KT(dd)                                                                                     \
    (full ? _mm512_loadu_ps(kt + (size_t)(dd) * (size_t)bs)                                        \
          : _mm512_maskz_loadu_ps(m, kt + (size_t)(dd) * (size_t)bs))
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int d = 0;
    for (; d + 4 <= hd; d += 4) {
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), KT(d), a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]), KT(d + 1), a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 2]), KT(d + 2), a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 3]), KT(d + 3), a3);
    }
    for (; d < hd; d++)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), KT(d), a0);
#undef KT
    __m512 s = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_set1_ps(scale));
    if (full)
        _mm512_storeu_ps(out, s);
    else
        _mm512_mask_storeu_ps(out, m, s);
}

static void block_scores(const float *q, const float *kt, int hd, int bs, float scale,
                         float *scores)
{
    int t = 0;
    for (; t + 16 <= bs; t += 16)
        scores16(q, kt + t, hd, bs, scale, scores + t, 0, 1);
    if (t < bs)
        scores16(q, kt + t, hd, bs, scale, scores + t, tail_mask(bs - t), 0);
}

/* out[d0..d0+16) += Σ_t p[t]·v[t][d0..] (lanes in m only when !full): four accumulators over t. */
KVP_INLINE void accum16(const float *p, const float *v, int hd, int n, float *out, __mmask16 m,
                        int full)
{
#define VT(tt)                                                                                     \
    (full ? _mm512_loadu_ps(v + (size_t)(tt) * (size_t)hd)                                         \
          : _mm512_maskz_loadu_ps(m, v + (size_t)(tt) * (size_t)hd))
    __m512 a0 = full ? _mm512_loadu_ps(out) : _mm512_maskz_loadu_ps(m, out);
    __m512 a1 = _mm512_setzero_ps(), a2 = a1, a3 = a1;
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), VT(t), a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(p[t + 1]), VT(t + 1), a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(p[t + 2]), VT(t + 2), a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(p[t + 3]), VT(t + 3), a3);
    }
    for (; t < n; t++)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), VT(t), a0);
#undef VT
    __m512 s = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
    if (full)
        _mm512_storeu_ps(out, s);
    else
        _mm512_mask_storeu_ps(out, m, s);
}

static void block_accum(const float *p, const float *v, int hd, int n, float *out)
{
    int d = 0;
    for (; d + 16 <= hd; d += 16)
        accum16(p, v + d, hd, n, out + d, 0, 1);
    if (d < hd)
        accum16(p, v + d, hd, n, out + d, tail_mask(hd - d), 0);
}

/* ============================== quantized weights (zmm) ==============================
 *
 * zmm versions of the dots for the types that dominate published files (Q4_0 in older and
 * ARM-oriented repos, Q4_K and Q6_K in every Q4_K_M); the other types use the shared 256-bit
 * kernels of simd_quant_x86.h. Same arithmetic as those (exact int32 per block or super-block,
 * then the float scales), so the contract is unchanged. */

/* Q4_0 × Q8_0, two blocks per zmm: codes - 8 in the block order, paired with q8_pair's x. */
KVP_INLINE __m512i q4_0_pair(const uint8_t *wb)
{
    __m128i a = _mm_loadu_si128((const __m128i *)(wb + 2));
    __m128i b = _mm_loadu_si128((const __m128i *)(wb + 18 + 2));
    __m256i lo = _mm256_set_m128i(_mm_srli_epi16(a, 4), a);
    __m256i hi = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return _mm512_sub_epi8(_mm512_and_si512(v, _mm512_set1_epi8(0x0F)), _mm512_set1_epi8(8));
}

static float dot_q4_0(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    int64_t nb = n / 32, b = 0;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *w0 = pw + b * 18, *x0 = px + b * 34;
        __m512 s0 = scale_pair(f16_at(w0) * f16_at(x0), f16_at(w0 + 18) * f16_at(x0 + 34));
        __m512 s1 =
            scale_pair(f16_at(w0 + 36) * f16_at(x0 + 68), f16_at(w0 + 54) * f16_at(x0 + 102));
        a0 = _mm512_fmadd_ps(s0, q8_pair_dot(q4_0_pair(w0), q8_pair(x0)), a0);
        a1 = _mm512_fmadd_ps(s1, q8_pair_dot(q4_0_pair(w0 + 36), q8_pair(x0 + 68)), a1);
    }
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *w0 = pw + b * 18, *x0 = px + b * 34;
        __m512 s0 = scale_pair(f16_at(w0) * f16_at(x0), f16_at(w0 + 18) * f16_at(x0 + 34));
        a0 = _mm512_fmadd_ps(s0, q8_pair_dot(q4_0_pair(w0), q8_pair(x0)), a0);
    }
    float s = hsum(_mm512_add_ps(a0, a1));
    if (b < nb) /* odd last block: the 256-bit kernel */
        s += qx_dot_q4_0(pw + b * 18, px + b * 34, 32);
    return s;
}

/* Q4_K × Q8_K: one zmm per 64-element chunk (low nibbles = sub-block 2c in the low half, high
 * nibbles = 2c+1 in the high half), which lines up with 64 contiguous activations. */
static float dot_q4_k(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512 acc = _mm512_setzero_ps();
    __m256 mins = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / KVP_QK_K; b++) {
        const uint8_t *wb = pw + (size_t)b * 144, *xb = px + (size_t)b * 292;
        uint8_t sc[8], m[8];
        qx_k_scales(wb + 4, sc, m);
        __m512i sum = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            __m512i q =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wb + 16 + 32 * c)));
            q = _mm512_and_si512(_mm512_srlv_epi16(q, shift), m4);
            __m512i x = _mm512_loadu_si512(xb + 4 + 64 * c);
            __m512i scv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(sc[2 * c])),
                                             _mm256_set1_epi16(sc[2 * c + 1]), 1);
            sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(q, x), scv));
        }
        float xd = qx_f32(xb);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(f16_at(wb) * xd), _mm512_cvtepi32_ps(sum), acc);
        mins = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(wb + 2) * xd),
                               _mm256_cvtepi32_ps(qx_k_mins(m, xb)), mins);
    }
    return hsum256(_mm256_sub_ps(fold(acc), mins));
}

/* Q6_K × Q8_K: per half, two zmm of 64 codes (runs 0|1 and 2|3 of docs/formats.md §4.4);
 * the eight int8 scales of the half are widened and spread over the int16 pairs with vpermw. */
static float dot_q6_k(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x30);
    const __m512i sh_a = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh_b = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    /* int16 lane i of run pair 0|1 uses scale i/8, of run pair 2|3 scale 4 + i/8 */
    __m512i idx0 = _mm512_setzero_si512(), idx1;
    {
        int16_t ix[32];
        for (int i = 0; i < 32; i++)
            ix[i] = (int16_t)(i / 8);
        idx0 = _mm512_loadu_si512(ix);
        idx1 = _mm512_add_epi16(idx0, _mm512_set1_epi16(4));
    }
    __m512 acc = _mm512_setzero_ps();
    float corr = 0.0f;
    for (int64_t b = 0; b < n / KVP_QK_K; b++) {
        const uint8_t *wb = pw + (size_t)b * 210, *xb = px + (size_t)b * 292;
        const int8_t *S = (const int8_t *)(wb + 192);
        __m512i sum = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m256i L0 = _mm256_loadu_si256((const __m256i *)(wb + 64 * h));
            __m256i L1 = _mm256_loadu_si256((const __m256i *)(wb + 64 * h + 32));
            __m512i L = _mm512_inserti64x4(_mm512_castsi256_si512(L0), L1, 1);
            __m512i Q =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(wb + 128 + 32 * h)));
            __m512i qa = _mm512_or_si512(_mm512_and_si512(L, m4),
                                         _mm512_and_si512(_mm512_sllv_epi16(Q, sh_a), m2));
            __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4),
                                         _mm512_and_si512(_mm512_srlv_epi16(Q, sh_b), m2));
            __m512i s16 = _mm512_castsi128_si512(
                _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(S + 8 * h))));
            __m512i xa = _mm512_loadu_si512(xb + 4 + 128 * h);
            __m512i xb2 = _mm512_loadu_si512(xb + 4 + 128 * h + 64);
            sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(qa, xa),
                                                          _mm512_permutexvar_epi16(idx0, s16)));
            sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(qb, xb2),
                                                          _mm512_permutexvar_epi16(idx1, s16)));
        }
        float dd = f16_at(wb + 208) * qx_f32(xb);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(dd), _mm512_cvtepi32_ps(sum), acc);
        int16_t bs[16];
        qx_bsums(xb, bs);
        int32_t c = 0;
        for (int s = 0; s < 16; s++)
            c += S[s] * bs[s];
        corr += dd * (float)(32 * c);
    }
    return hsum(acc) - corr;
}

/* ---- several rows per pass ----
 *
 * The row kernels below take four rows per pass and share each activation load (and for the
 * K-quants the activation's scale) between them; a remainder of one to three rows uses the
 * one-row dots above. */

/* Q4_0 / Q5_0 rows against Q8_0 activations, two blocks per zmm, four rows per pass. The codes
 * stay unsigned (vpmaddubsw cannot overflow with them) and the offset (8 or 16) times the
 * activations' sums is subtracted in int32; those sums are computed once per block pair for the
 * four rows, which saves the sign trick's three operations per row. */
KVP_INLINE void rows_pair32(const void *w, size_t row_bytes, const void *xq, int64_t n,
                            int64_t nrows, float *y, int kind,
                            float (*dot1)(const void *, const void *, int64_t))
{
    const size_t bs = kind == PAIR_Q4_0 ? 18 : 22;
    const __m512i off = _mm512_set1_epi8(kind == PAIR_Q4_0 ? 8 : 16), ones = _mm512_set1_epi16(1);
    const uint8_t *px = xq;
    int64_t nb = n / 32, r = 0;
    const struct kvp_pf_plan pfp = kvp_pf_plan(nrows, row_bytes, 4);
    for (; r + 4 <= nrows; r += 4) {
        const uint8_t *wr[4];
        for (int i = 0; i < 4; i++)
            wr[i] = (const uint8_t *)w + (size_t)(r + i) * row_bytes;
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            kvp_pf_step(&pfp, wr[0], row_bytes, 4, (size_t)b * bs, 2 * bs, (size_t)b * bs + 64, 1);
            const uint8_t *xb = px + (size_t)b * 34;
            __m512i qx = q8_pair(xb);
            __m512i corr = _mm512_madd_epi16(_mm512_maddubs_epi16(off, qx), ones);
            float dx0 = f16_at(xb), dx1 = f16_at(xb + 34);
            for (int i = 0; i < 4; i++) {
                const uint8_t *wb = wr[i] + (size_t)b * bs;
                __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(ucodes_pair(wb, kind, bs), qx),
                                              ones);
                a[i] = _mm512_fmadd_ps(scale_pair(f16_at(wb) * dx0, f16_at(wb + bs) * dx1),
                                       _mm512_cvtepi32_ps(_mm512_sub_epi32(p, corr)), a[i]);
            }
        }
        __m128 s4 = hsum4(a[0], a[1], a[2], a[3]);
        if (b < nb) { /* odd last block: the one-row dot on it */
            float t[4];
            for (int i = 0; i < 4; i++)
                t[i] = dot1(wr[i] + (size_t)b * bs, px + (size_t)b * 34, 32);
            s4 = _mm_add_ps(s4, _mm_loadu_ps(t));
        }
        _mm_storeu_ps(y + r, s4);
    }
    for (; r < nrows; r++)
        y[r] = dot1((const uint8_t *)w + (size_t)r * row_bytes, xq, n);
}

static void rows_q4_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                      float *y)
{
    rows_pair32(w, row_bytes, xq, n, nrows, y, PAIR_Q4_0, dot_q4_0);
}

static void rows_q5_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                      float *y)
{
    rows_pair32(w, row_bytes, xq, n, nrows, y, PAIR_Q5_0, qx_dot_q5_0);
}

/* Q4_K and Q5_K rows against Q8_K activations, four per pass: the recipe of dot_q4_k, with the
 * 256 activations of a super-block loaded once for the four rows and each row's eight 6-bit
 * scales widened once and spread over the int16 pairs with vpermw. Q5_K's fifth bit of element
 * 64c + l is bit 2c of qh[l] (2c + 1 for element 64c + 32 + l): one variable shift per chunk
 * puts it at bit 0 of each byte in both halves. */
KVP_INLINE void rows_k45(const void *w, size_t row_bytes, const void *xq, int64_t n,
                         int64_t nrows, float *y, int five)
{
    const size_t bytes = five ? 176 : 144, qs_at = five ? 48 : 16;
    const uint8_t *px = xq;
    const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m512i idx[4], hshift[4]; /* int16 lane i of chunk c takes scale 2c + i/16 */
    for (int c = 0; c < 4; c++) {
        int16_t ix[32];
        for (int i = 0; i < 32; i++)
            ix[i] = (int16_t)(2 * c + i / 16);
        idx[c] = _mm512_loadu_si512(ix);
        hshift[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(2 * c))),
                                       _mm256_set1_epi16((short)(2 * c + 1)), 1);
    }
    const struct kvp_pf_plan pfp = kvp_pf_plan(nrows, row_bytes, 4);
    int64_t r = 0;
    for (; r + 4 <= nrows; r += 4) {
        const uint8_t *wr[4];
        for (int i = 0; i < 4; i++)
            wr[i] = (const uint8_t *)w + (size_t)(r + i) * row_bytes;
        __m512 acc[4];
        __m256 mins[4];
        for (int i = 0; i < 4; i++) {
            acc[i] = _mm512_setzero_ps();
            mins[i] = _mm256_setzero_ps();
        }
        for (int64_t b = 0; b < n / KVP_QK_K; b++) {
            kvp_pf_step(&pfp, wr[0], row_bytes, 4, (size_t)b * bytes, bytes,
                        (size_t)b * bytes + 64, (int)((bytes + 63) / 64));
            const uint8_t *xb = px + (size_t)b * 292;
            __m512i x[4];
            for (int c = 0; c < 4; c++)
                x[c] = _mm512_loadu_si512(xb + 4 + 64 * c);
            float xd = qx_f32(xb);
            for (int i = 0; i < 4; i++) {
                const uint8_t *wb = wr[i] + (size_t)b * bytes;
                uint8_t sc[8], m[8];
                qx_k_scales(wb + 4, sc, m);
                __m512i sc16 = _mm512_castsi128_si512(
                    _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
                __m512i hv = five ? _mm512_broadcast_i64x4(
                                        _mm256_loadu_si256((const __m256i *)(wb + 16)))
                                  : _mm512_setzero_si512();
                __m512i sum = _mm512_setzero_si512();
                for (int c = 0; c < 4; c++) {
                    __m512i q = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(wb + qs_at + 32 * c)));
                    q = _mm512_and_si512(_mm512_srlv_epi16(q, shift), m4);
                    if (five) {
                        __m512i h = _mm512_and_si512(_mm512_srlv_epi16(hv, hshift[c]), one);
                        q = _mm512_or_si512(q, _mm512_slli_epi16(h, 4));
                    }
                    __m512i p = _mm512_maddubs_epi16(q, x[c]);
                    sum = _mm512_add_epi32(
                        sum, _mm512_madd_epi16(p, _mm512_permutexvar_epi16(idx[c], sc16)));
                }
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(f16_at(wb) * xd), _mm512_cvtepi32_ps(sum),
                                         acc[i]);
                mins[i] = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(wb + 2) * xd),
                                          _mm256_cvtepi32_ps(qx_k_mins(m, xb)), mins[i]);
            }
        }
        for (int i = 0; i < 4; i++)
            acc[i] = _mm512_sub_ps(acc[i], _mm512_zextps256_ps512(mins[i]));
        _mm_storeu_ps(y + r, hsum4(acc[0], acc[1], acc[2], acc[3]));
    }
    for (; r < nrows; r++)
        y[r] = five ? qx_dot_q5_k((const uint8_t *)w + (size_t)r * row_bytes, xq, n)
                    : dot_q4_k((const uint8_t *)w + (size_t)r * row_bytes, xq, n);
}

static void rows_q4_k(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                      float *y)
{
    rows_k45(w, row_bytes, xq, n, nrows, y, 0);
}

static void rows_q5_k(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                      float *y)
{
    rows_k45(w, row_bytes, xq, n, nrows, y, 1);
}

/* Q6_K rows against Q8_K activations, four per pass: dot_q6_k's recipe with the activations of a
 * super-block loaded once for the four rows. */
static void rows_q6_k(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                      float *y)
{
    const uint8_t *px = xq;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x30);
    const __m512i sh_a = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sh_b = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    __m512i idx0, idx1; /* int16 lane i of run pair 0|1 uses scale i/8, of 2|3 scale 4 + i/8 */
    {
        int16_t ix[32];
        for (int i = 0; i < 32; i++)
            ix[i] = (int16_t)(i / 8);
        idx0 = _mm512_loadu_si512(ix);
        idx1 = _mm512_add_epi16(idx0, _mm512_set1_epi16(4));
    }
    const struct kvp_pf_plan pfp = kvp_pf_plan(nrows, row_bytes, 4);
    int64_t r = 0;
    for (; r + 4 <= nrows; r += 4) {
        const uint8_t *wr[4];
        for (int i = 0; i < 4; i++)
            wr[i] = (const uint8_t *)w + (size_t)(r + i) * row_bytes;
        __m512 acc[4];
        float corr[4] = {0, 0, 0, 0};
        for (int i = 0; i < 4; i++)
            acc[i] = _mm512_setzero_ps();
        for (int64_t b = 0; b < n / KVP_QK_K; b++) {
            kvp_pf_step(&pfp, wr[0], row_bytes, 4, (size_t)b * 210, 210, (size_t)b * 210 + 64, 4);
            const uint8_t *xb = px + (size_t)b * 292;
            __m512i x[4];
            for (int k = 0; k < 4; k++)
                x[k] = _mm512_loadu_si512(xb + 4 + 64 * k);
            int16_t bs[16];
            qx_bsums(xb, bs);
            float xd = qx_f32(xb);
            for (int i = 0; i < 4; i++) {
                const uint8_t *wb = wr[i] + (size_t)b * 210;
                const int8_t *S = (const int8_t *)(wb + 192);
                __m512i sum = _mm512_setzero_si512();
                for (int h = 0; h < 2; h++) {
                    __m256i L0 = _mm256_loadu_si256((const __m256i *)(wb + 64 * h));
                    __m256i L1 = _mm256_loadu_si256((const __m256i *)(wb + 64 * h + 32));
                    __m512i L = _mm512_inserti64x4(_mm512_castsi256_si512(L0), L1, 1);
                    __m512i Q = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(wb + 128 + 32 * h)));
                    __m512i qa = _mm512_or_si512(_mm512_and_si512(L, m4),
                                                 _mm512_and_si512(_mm512_sllv_epi16(Q, sh_a), m2));
                    __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4),
                                                 _mm512_and_si512(_mm512_srlv_epi16(Q, sh_b), m2));
                    __m512i s16 = _mm512_castsi128_si512(
                        _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(S + 8 * h))));
                    sum = _mm512_add_epi32(
                        sum, _mm512_madd_epi16(_mm512_maddubs_epi16(qa, x[2 * h]),
                                               _mm512_permutexvar_epi16(idx0, s16)));
                    sum = _mm512_add_epi32(
                        sum, _mm512_madd_epi16(_mm512_maddubs_epi16(qb, x[2 * h + 1]),
                                               _mm512_permutexvar_epi16(idx1, s16)));
                }
                float dd = f16_at(wb + 208) * xd;
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(dd), _mm512_cvtepi32_ps(sum), acc[i]);
                int32_t c = 0;
                for (int k = 0; k < 16; k++)
                    c += S[k] * bs[k];
                corr[i] += dd * (float)(32 * c);
            }
        }
        __m128 s4 = _mm_sub_ps(hsum4(acc[0], acc[1], acc[2], acc[3]), _mm_loadu_ps(corr));
        _mm_storeu_ps(y + r, s4);
    }
    for (; r < nrows; r++)
        y[r] = dot_q6_k((const uint8_t *)w + (size_t)r * row_bytes, xq, n);
}

/* Quantized-type dots: the shared 256-bit kernels of simd_quant_x86.h (compiled here with the
 * AVX-512 flags), except the types that dominate real files, which have zmm versions above. */
#define DOT_Q4_0 dot_q4_0
#define DOT_Q4_K dot_q4_k
#define DOT_Q6_K dot_q6_k

/* The fields both AVX-512 tables share; they differ in the row kernels the VNNI file replaces. */
#define AVX512_COMMON_FIELDS                                                                       \
    .dot_f32 = dot_f32, .dot_f16 = dot_f16, .dot_bf16 = dot_bf16, .dot_q8_0 = dot_q8_0,            \
    .axpy = axpy, .exp_sum = exp_sum, .max = vmax, .block_scores = block_scores,                   \
    .block_accum = block_accum, .rows_f32 = rows_f32, .rows_f16 = rows_f16,                        \
    .rows_bf16 = rows_bf16, .quantize_q8_0 = quantize_q8_0, .dequant_f16 = dequant_f16,            \
    .dequant_q8_0 = dequant_q8_0,                                                                  \
    .dot_q =                                                                                       \
        {                                                                                          \
            [KVP_TYPE_Q4_0] = DOT_Q4_0,                                                            \
            [KVP_TYPE_Q4_1] = qx_dot_q4_1,                                                         \
            [KVP_TYPE_Q5_0] = qx_dot_q5_0,                                                         \
            [KVP_TYPE_Q5_1] = qx_dot_q5_1,                                                         \
            [KVP_TYPE_IQ4_NL] = qx_dot_iq4_nl,                                                     \
            [KVP_TYPE_Q2_K] = qx_dot_q2_k,                                                         \
            [KVP_TYPE_Q3_K] = qx_dot_q3_k,                                                         \
            [KVP_TYPE_Q4_K] = DOT_Q4_K,                                                            \
            [KVP_TYPE_Q5_K] = qx_dot_q5_k,                                                         \
            [KVP_TYPE_Q6_K] = DOT_Q6_K,                                                            \
        },                                                                                         \
    .quantize_q8_k = qx_quantize_q8_k, .rows_prefetch = true

const struct kvp_simd_ops kvp_simd_ops_avx512 = {
    .name = "avx512",
    AVX512_COMMON_FIELDS,
    /* as simd_avx2.c measures them: Q8_0 212 / 211 / 301 tok/s against 188 / 218 / 244 at 4 / 8 /
     * 16 rows; the Q5_0 and Q4_K file 81 / 128 / 190 / 272 against 202 / 222 / 238 / 260 at 4 / 8
     * / 16 / 24 */
    .singles_gemm_q8_0 = 4,
    .singles_gemm_quant = 20,
    .rows_q8_0 = rows_q8_0,
    .rows_q =
        {
            [KVP_TYPE_Q4_0] = rows_q4_0,
            [KVP_TYPE_Q5_0] = rows_q5_0,
            [KVP_TYPE_Q4_K] = rows_q4_k,
            [KVP_TYPE_Q5_K] = rows_q5_k,
            [KVP_TYPE_Q6_K] = rows_q6_k,
        },
};

/* Handed out only when the CPU has AVX-512 VNNI (simd.c). */
const struct kvp_simd_ops kvp_simd_ops_avx512vnni = {
    .name = "avx512vnni",
    AVX512_COMMON_FIELDS,
    .rows_q8_0 = kvp_vnni_rows_q8_0,
    .rows_q =
        {
            [KVP_TYPE_Q4_0] = kvp_vnni_rows_q4_0,
            [KVP_TYPE_Q5_0] = kvp_vnni_rows_q5_0,
            [KVP_TYPE_Q4_K] = kvp_vnni_rows_q4_k,
            [KVP_TYPE_Q5_K] = rows_q5_k,
            [KVP_TYPE_Q6_K] = rows_q6_k,
        },
    .gemm_tile = kvp_vnni_gemm_tile,
    .rows_q8_0_multi = kvp_vnni_rows_q8_0_multi,
    .gemm_convert_q8_0 = kvp_vnni_gemm_convert_q8_0,
    .gemm_tile_k = kvp_vnni_gemm_tile_k,
    .rows_q_multi =
        {
            [KVP_TYPE_Q4_0] = kvp_vnni_rows_q4_0_multi,
            [KVP_TYPE_Q5_0] = kvp_vnni_rows_q5_0_multi,
            [KVP_TYPE_Q4_K] = kvp_vnni_rows_q4_k_multi,
        },
    .lanes_pack =
        {
            [KVP_TYPE_Q8_0] = kvp_lanes_rows_q8_0_pack,
            [KVP_TYPE_Q4_0] = kvp_lanes_rows_q4_0_pack,
            [KVP_TYPE_Q5_0] = kvp_lanes_rows_q5_0_pack,
            [KVP_TYPE_Q4_K] = kvp_lanes_rows_q4_k_pack,
        },
    .lanes_rows =
        {
            [KVP_TYPE_Q8_0] = kvp_lanes_rows_q8_0,
            [KVP_TYPE_Q4_0] = kvp_lanes_rows_q4_0,
            [KVP_TYPE_Q5_0] = kvp_lanes_rows_q5_0,
            [KVP_TYPE_Q4_K] = kvp_lanes_rows_q4_k,
        },
};
