/*
 * 256-bit integer dot kernels for the quantized weight types of quant.h, private to the kernel
 * layer. This header is included by simd_avx2.c and by simd_avx512.c, so the same source is
 * compiled once under each file's target flags (the AVX-512 build lets the compiler use EVEX
 * encodings and 32 registers); simd_avx512.c replaces the hottest ones with zmm versions. Every
 * function here is static inline and needs AVX2 + FMA + F16C.
 *
 * The recipe is the one simd_avx2.c uses for Q8_0 (read its file comment first):
 *   - unpack one block's codes into 32 bytes, in element order, with nibble masks, byte shifts
 *     and vpshufb (IQ4_NL's code book, Q5's fifth bits);
 *   - signed codes × activations: vpmaddubsw(|w|, x with w's sign) → int16 pairs, vpmaddwd with
 *     ones → int32; unsigned codes (Q4_1, Q5_1, K-quants) skip the sign step;
 *   - K-quant sub-block scales multiply the int16 pairs in vpmaddwd (a 16-element sub-block is
 *     exactly one 128-bit lane of int16 pairs), so a whole super-block sums in int32 before the
 *     one float multiply by d · x.d;
 *   - constant offsets (Q6_K's -32, Q3_K's -4) and the affine mins use Q8_K's bsums in scalar
 *     code, once per super-block, instead of widening the vector work.
 * No int16 or int32 sum can saturate: the largest vpmaddubsw pair is 2·63·127 (Q6_K codes),
 * times a scale of at most 128, times two, summed over at most 16 lanes per super-block.
 * Activations are in -127..127 (both quantizers guarantee it), which the sign trick needs.
 */
#ifndef KVP_KERNELS_SIMD_QUANT_X86_H
#define KVP_KERNELS_SIMD_QUANT_X86_H

#include <immintrin.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/types.h"

#define KVP_QINLINE static inline __attribute__((always_inline))

/* ============================== helpers ============================== */

KVP_QINLINE float qx_f16(const void *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

KVP_QINLINE float qx_f32(const void *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}

KVP_QINLINE float qx_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KVP_QINLINE __m256i qx_load(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* qx_dot_i8 with |a| (aa = sign(a, a)) given, for codes that several activation vectors
 * share: |a| as unsigned bytes times b with a's sign moved onto it. */
KVP_QINLINE __m256i qx_dot_i8_abs(__m256i aa, __m256i a, __m256i b)
{
    __m256i p16 = _mm256_maddubs_epi16(aa, _mm256_sign_epi8(b, a));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* Signed codes a (any int8) times activations b (no -128): eight int32 partial sums. */
KVP_QINLINE __m256i qx_dot_i8(__m256i a, __m256i b)
{
    return qx_dot_i8_abs(_mm256_sign_epi8(a, a), a, b);
}

/* Unsigned codes a (0..127) times signed activations b: eight int32 partial sums. */
KVP_QINLINE __m256i qx_dot_u8(__m256i a, __m256i b)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

/* 16 packed nibbles → 32 bytes: low nibbles first (elements 0..15), then high (16..31). */
KVP_QINLINE __m256i qx_nibbles(const uint8_t *qs)
{
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* The 32 bits of a LE u32 at qh as bytes: 0xFF where bit j is set, 0 elsewhere. */
KVP_QINLINE __m256i qx_bits(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                            2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* int16 lanes 0..7 times s0, lanes 8..15 times s1 (two 16-element sub-blocks), pairs summed. */
KVP_QINLINE __m256i qx_scale2(__m256i p16, int s0, int s1)
{
    __m256i sc = _mm256_set_m128i(_mm_set1_epi16((short)s1), _mm_set1_epi16((short)s0));
    return _mm256_madd_epi16(p16, sc);
}

/* ============================== 32-element types × Q8_0 ============================== */

enum { QX_Q4_0, QX_Q4_1, QX_Q5_0, QX_Q5_1, QX_IQ4_NL };

/* One block's contribution: codes × activations as eight float lanes times d_w·d_x, plus (for
 * the affine types) m·d_x times the activation sum, accumulated into *acc / *accm. */
KVP_QINLINE void qx_block32(const uint8_t *wb, const uint8_t *xb, int kind, __m256 *acc,
                            __m256 *accm)
{
    __m256i x = qx_load(xb + 2);
    float dxf = qx_f16(xb);
    __m256 dd = _mm256_set1_ps(qx_f16(wb) * dxf);
    __m256i s;
    switch (kind) {
    case QX_Q4_0:
        s = qx_dot_i8(_mm256_sub_epi8(qx_nibbles(wb + 2), _mm256_set1_epi8(8)), x);
        break;
    case QX_Q5_0: {
        /* q - 16 = nibble where the fifth bit is set, nibble - 16 (= nibble | 0xF0) where not */
        __m256i q = _mm256_or_si256(qx_nibbles(wb + 6),
                                    _mm256_andnot_si256(qx_bits(wb + 2), _mm256_set1_epi8(-16)));
        s = qx_dot_i8(q, x);
        break;
    }
    case QX_IQ4_NL: {
        __m256i tbl =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvp_iq4nl_table));
        s = qx_dot_i8(_mm256_shuffle_epi8(tbl, qx_nibbles(wb + 2)), x);
        break;
    }
    default: { /* Q4_1, Q5_1: unsigned codes plus m times the activation sum */
        __m256i q;
        if (kind == QX_Q4_1)
            q = qx_nibbles(wb + 4);
        else
            q = _mm256_or_si256(qx_nibbles(wb + 8),
                                _mm256_and_si256(qx_bits(wb + 4), _mm256_set1_epi8(0x10)));
        s = qx_dot_u8(q, x);
        __m256i xs = qx_dot_u8(_mm256_set1_epi8(1), x);
        *accm =
            _mm256_fmadd_ps(_mm256_set1_ps(qx_f16(wb + 2) * dxf), _mm256_cvtepi32_ps(xs), *accm);
        break;
    }
    }
    *acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(s), *acc);
}

KVP_QINLINE float qx_dot32(const void *w, const void *xq, int64_t n, int kind, size_t bytes)
{
    const uint8_t *pw = w, *px = xq;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, m0 = a0, m1 = a0;
    int64_t nb = n / 32, b = 0;
    for (; b + 2 <= nb; b += 2) {
        qx_block32(pw + (size_t)b * bytes, px + (size_t)b * 34, kind, &a0, &m0);
        qx_block32(pw + (size_t)(b + 1) * bytes, px + (size_t)(b + 1) * 34, kind, &a1, &m1);
    }
    if (b < nb)
        qx_block32(pw + (size_t)b * bytes, px + (size_t)b * 34, kind, &a0, &m0);
    return qx_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(m0, m1)));
}

static inline float qx_dot_q4_0(const void *w, const void *xq, int64_t n)
{
    return qx_dot32(w, xq, n, QX_Q4_0, 18);
}

static inline float qx_dot_q4_1(const void *w, const void *xq, int64_t n)
{
    return qx_dot32(w, xq, n, QX_Q4_1, 20);
}

static inline float qx_dot_q5_0(const void *w, const void *xq, int64_t n)
{
    return qx_dot32(w, xq, n, QX_Q5_0, 22);
}

static inline float qx_dot_q5_1(const void *w, const void *xq, int64_t n)
{
    return qx_dot32(w, xq, n, QX_Q5_1, 24);
}

static inline float qx_dot_iq4_nl(const void *w, const void *xq, int64_t n)
{
    return qx_dot32(w, xq, n, QX_IQ4_NL, 18);
}

/* ============================== K-quants × Q8_K ============================== */

/* Q8_K block fields: d at 0, qs at 4, bsums at 260. */
#define QX_K_QS    4
#define QX_K_BSUMS 260

KVP_QINLINE void qx_bsums(const uint8_t *xb, int16_t bs[16])
{
    memcpy(bs, xb + QX_K_BSUMS, 32);
}

/* kvp_k_scales_unpack with four 32-bit word operations (x86 is little-endian, so byte k of a
 * word is s[4w + k]): sc0-3 / m0-3 are the low six bits of words 0 / 1; sc4-7 / m4-7 take the
 * low / high nibbles of word 2 and the top two bits of words 0 / 1. */
KVP_QINLINE void qx_k_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
    uint32_t u[3], v[4];
    memcpy(u, s, 12);
    v[0] = u[0] & 0x3f3f3f3fu;
    v[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
    v[2] = u[1] & 0x3f3f3f3fu;
    v[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
    memcpy(sc, v, 8);
    memcpy(m, v + 2, 8);
}

/* Σ_j m[j] · (bsums[2j] + bsums[2j+1]) in eight int32 lanes (Q4_K/Q5_K mins, 32-element
 * sub-blocks). */
KVP_QINLINE __m256i qx_k_mins(const uint8_t m[8], const uint8_t *xb)
{
    __m256i bs = qx_load(xb + QX_K_BSUMS);
    __m256i pairs = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
    __m256i mv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)m));
    return _mm256_mullo_epi32(mv, pairs);
}

/* Q4_K (nmax 15) and Q5_K (qh != NULL): int32 lanes of Σ sc·q·x for one super-block. */
KVP_QINLINE __m256i qx_k45_sum(const uint8_t *qs, const uint8_t *qh, const uint8_t sc[8],
                               const uint8_t *xqs)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    __m256i sum = _mm256_setzero_si256();
    __m256i hs = qh ? qx_load(qh) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i q = qx_load(qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh) { /* bit 2c of qh[l] → bit 4 of element 64c + l; bit 2c+1 → element 64c+32+l */
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hs, 4), b4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hs, 3), b4));
            hs = _mm256_srli_epi16(hs, 2);
        }
        __m256i p0 = _mm256_maddubs_epi16(lo, qx_load(xqs + 64 * c));
        __m256i p1 = _mm256_maddubs_epi16(hi, qx_load(xqs + 64 * c + 32));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * c])));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * c + 1])));
    }
    return sum;
}

KVP_QINLINE float qx_dot_k45(const void *w, const void *xq, int64_t n, int five)
{
    const size_t bytes = five ? 176 : 144;
    const uint8_t *pw = w, *px = xq;
    __m256 acc = _mm256_setzero_ps(), mins = acc;
    for (int64_t b = 0; b < n / KVP_QK_K; b++) {
        const uint8_t *wb = pw + (size_t)b * bytes, *xb = px + (size_t)b * 292;
        uint8_t sc[8], m[8];
        qx_k_scales(wb + 4, sc, m);
        float xd = qx_f32(xb);
        __m256i s = qx_k45_sum(wb + (five ? 48 : 16), five ? wb + 16 : NULL, sc, xb + QX_K_QS);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qx_f16(wb) * xd), _mm256_cvtepi32_ps(s), acc);
        mins = _mm256_fmadd_ps(_mm256_set1_ps(qx_f16(wb + 2) * xd),
                               _mm256_cvtepi32_ps(qx_k_mins(m, xb)), mins);
    }
    return qx_hsum(_mm256_sub_ps(acc, mins));
}

static inline float qx_dot_q4_k(const void *w, const void *xq, int64_t n)
{
    return qx_dot_k45(w, xq, n, 0);
}

static inline float qx_dot_q5_k(const void *w, const void *xq, int64_t n)
{
    return qx_dot_k45(w, xq, n, 1);
}

/* Q6_K: the 6-bit codes (0..63) of half h of super-block wb, 32 elements a vector. */
KVP_QINLINE void qx_q6_codes(const uint8_t *wb, int h, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    __m256i L0 = qx_load(wb + 64 * h), L1 = qx_load(wb + 64 * h + 32);
    __m256i Q = qx_load(wb + 128 + 32 * h);
    q[0] = _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(Q, 4), m2));
    q[1] = _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(_mm256_slli_epi16(Q, 2), m2));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4),
                           _mm256_and_si256(Q, m2));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(Q, 2), m2));
}

/* Q6_K: codes 0..63 (the -32 offset is applied through bsums). */
static inline float qx_dot_q6_k(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    __m256 acc = _mm256_setzero_ps();
    float corr = 0.0f;
    for (int64_t b = 0; b < n / KVP_QK_K; b++) {
        const uint8_t *wb = pw + (size_t)b * 210, *xb = px + (size_t)b * 292;
        const int8_t *S = (const int8_t *)(wb + 192);
        __m256i sum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            qx_q6_codes(wb, h, q);
            for (int k = 0; k < 4; k++) {
                __m256i p = _mm256_maddubs_epi16(q[k], qx_load(xb + QX_K_QS + 128 * h + 32 * k));
                sum = _mm256_add_epi32(sum, qx_scale2(p, S[8 * h + 2 * k], S[8 * h + 2 * k + 1]));
            }
        }
        float dd = qx_f16(wb + 208) * qx_f32(xb);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(sum), acc);
        int16_t bs[16];
        qx_bsums(xb, bs);
        int32_t c = 0;
        for (int s = 0; s < 16; s++)
            c += S[s] * bs[s];
        corr += dd * (float)(32 * c);
    }
    return qx_hsum(acc) - corr;
}

/* Q2_K (codes 0..3, 4-bit scale and min per 16) and Q3_K (codes 0..7 = quant + 4, signed
 * 6-bit scales): the same 2-bit walk over qs; Q3_K adds bit 2 from hmask. */
KVP_QINLINE float qx_dot_k23(const void *w, const void *xq, int64_t n, int three)
{
    const size_t bytes = three ? 110 : 84;
    const uint8_t *pw = w, *px = xq;
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float corr = 0.0f;
    for (int64_t b = 0; b < n / KVP_QK_K; b++) {
        const uint8_t *wb = pw + (size_t)b * bytes, *xb = px + (size_t)b * 292;
        int sc[16], m[16];
        float d, dmin = 0.0f;
        const uint8_t *qs;
        __m256i hs = _mm256_setzero_si256();
        if (three) {
            int8_t s8[16];
            kvp_q3_k_scales_unpack(wb + 96, s8);
            for (int s = 0; s < 16; s++) {
                sc[s] = s8[s];
                m[s] = 4 * s8[s]; /* the -4 offset, folded in like a min */
            }
            qs = wb + 32;
            hs = qx_load(wb);
            d = qx_f16(wb + 108);
        } else {
            for (int s = 0; s < 16; s++) {
                sc[s] = wb[s] & 0xF;
                m[s] = wb[s] >> 4;
            }
            qs = wb + 16;
            d = qx_f16(wb + 80);
            dmin = qx_f16(wb + 82);
        }
        __m256i sum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i qv = qx_load(qs + 32 * h);
            for (int j = 0; j < 4; j++) {
                __m256i q = _mm256_and_si256(qv, m3);
                qv = _mm256_srli_epi16(qv, 2);
                if (three) { /* hmask bit 4h + j */
                    q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(hs, one), 2));
                    hs = _mm256_srli_epi16(hs, 1);
                }
                __m256i p = _mm256_maddubs_epi16(q, qx_load(xb + QX_K_QS + 128 * h + 32 * j));
                sum = _mm256_add_epi32(sum, qx_scale2(p, sc[8 * h + 2 * j], sc[8 * h + 2 * j + 1]));
            }
        }
        float xd = qx_f32(xb);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * xd), _mm256_cvtepi32_ps(sum), acc);
        int16_t bs[16];
        qx_bsums(xb, bs);
        int32_t ms = 0;
        for (int s = 0; s < 16; s++)
            ms += m[s] * bs[s];
        corr += (three ? d : dmin) * xd * (float)ms;
    }
    return qx_hsum(acc) - corr;
}

static inline float qx_dot_q2_k(const void *w, const void *xq, int64_t n)
{
    return qx_dot_k23(w, xq, n, 0);
}

static inline float qx_dot_q3_k(const void *w, const void *xq, int64_t n)
{
    return qx_dot_k23(w, xq, n, 1);
}

/* ============================== Q8_K quantization ============================== */

/* Bit-identical to kvp_quantize_row_q8_k_ref: exact max, the same scalar d and 1/d, the same
 * f32 products, vcvtps2dq rounding like lrintf (nearest even by default); |x·id| <= 127 up to
 * one ulp, so no clamp is needed and the saturating packs never clip. */
static inline void qx_quantize_q8_k(const float *x, void *dst, int64_t n)
{
    uint8_t *out = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < n / KVP_QK_K; b++) {
        const float *xb = x + b * KVP_QK_K;
        uint8_t *ob = out + b * 292;
        __m256 mx = _mm256_setzero_ps();
        for (int j = 0; j < KVP_QK_K; j += 8)
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float d = _mm_cvtss_f32(m4) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        memcpy(ob, &d, 4);
        __m256 vid = _mm256_set1_ps(id);
        for (int j = 0; j < KVP_QK_K; j += 32) {
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), vid));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8), vid));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 16), vid));
            __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 24), vid));
            __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            q = _mm256_permutevar8x32_epi32(q, order);
            _mm256_storeu_si256((__m256i *)(ob + QX_K_QS + j), q);
            /* bsums of the two 16-element groups: int8 → int16 pairs → int32 */
            __m256i s32 = qx_dot_u8(_mm256_set1_epi8(1), q);
            __m128i s4 =
                _mm_hadd_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            s4 = _mm_hadd_epi32(s4, s4); /* [g0, g1, g0, g1] */
            int16_t g[2] = {(int16_t)_mm_cvtsi128_si32(s4), (int16_t)_mm_extract_epi32(s4, 1)};
            memcpy(ob + QX_K_BSUMS + 2 * (j / 16), g, 4);
        }
    }
}

#endif
