/*
 * NEON kernels (aarch64 builds only; NEON is part of every aarch64 CPU, so no flag and no probe).
 *
 * The decode's hot path: the mat-vec dots of F32, F16, Q8_0, Q4_0, Q4_K and Q6_K, the Q8_0
 * quantizer of the activations, the f32 attention block kernels and the dequantizers. The other
 * fields (bf16, the rarer quantized types, exp_sum, Q8_K quantization) hold the scalar kernels.
 *
 * Most kernels here give the scalar table's bits exactly, by construction:
 *   - the integer dots (Q8_0, Q4_0, Q4_K, Q6_K) sum each block's or sub-block's products exactly
 *     in int32 (int8 x int8 products widened to int16, which hold them, then pairwise into
 *     int32), and then apply the float scales in simd_scalar.c's order, block by block;
 *   - dot_f32 keeps simd_scalar.c's four partial sums as the four lanes of one vector;
 *   - block_scores, block_accum and axpy run the scalar loops' independent sums side by side
 *     (one lane per token or per dimension), each in the scalar order;
 *   - the quantizer and dequantizers are exact conversions or round the same products the same
 *     way (vcvtnq: to nearest, ties to even, as lrintf in the default mode).
 * Multiplies and adds are separate instructions there (no fused multiply-add: the C11 build
 * does not contract, and a fused step would round once where the scalar code rounds twice).
 * The exception is dot_f16 / rows_f16: the scalar dot is one running sum in element order,
 * which no vector kernel can follow, so it uses four vectors of fused multiply-adds; it differs
 * from the scalar sum by summation rounding only, which test_kernels bounds against a
 * double-precision oracle relative to Σ|w·x| (the same contract as the AVX tables).
 */
#include "kernels/simd_internal.h"

#include <arm_neon.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/types.h"

static inline float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kvp_f16_to_f32(h);
}

/* ---- float kernels ------------------------------------------------------------------------ */

static float dot_f32(const float *w, const float *x, int64_t n)
{
    float32x4_t s = vdupq_n_f32(0.0f); /* lane k: simd_scalar.c's s[k] */
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        s = vaddq_f32(s, vmulq_f32(vld1q_f32(w + i), vld1q_f32(x + i)));
    float l[4];
    vst1q_f32(l, s);
    for (; i < n; i++)
        l[0] += w[i] * x[i];
    return (l[0] + l[1]) + (l[2] + l[3]);
}

static inline float32x4_t f16x4(const uint16_t *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static float dot_f16(const uint16_t *w, const float *x, int64_t n)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const float16x8_t h0 = vreinterpretq_f16_u16(vld1q_u16(w + i));
        const float16x8_t h1 = vreinterpretq_f16_u16(vld1q_u16(w + i + 8));
        a0 = vfmaq_f32(a0, vcvt_f32_f16(vget_low_f16(h0)), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vcvt_high_f32_f16(h0), vld1q_f32(x + i + 4));
        a2 = vfmaq_f32(a2, vcvt_f32_f16(vget_low_f16(h1)), vld1q_f32(x + i + 8));
        a3 = vfmaq_f32(a3, vcvt_high_f32_f16(h1), vld1q_f32(x + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        a0 = vfmaq_f32(a0, f16x4(w + i), vld1q_f32(x + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++)
        s += kvp_f16_to_f32(w[i]) * x[i];
    return s;
}

static void axpy(float a, const float *x, float *y, int64_t n)
{
    const float32x4_t va = vdupq_n_f32(a);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_f32(va, vld1q_f32(x + i))));
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* One lane per token: scores[t] gets q[d]·kt[d][t] added in the order d = 0, 1, ... */
static void block_scores(const float *q, const float *kt, int hd, int bs, float scale,
                         float *scores)
{
    int t = 0;
    for (; t + 16 <= bs; t += 16) {
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd; d++) {
            const float *k = kt + (size_t)d * (size_t)bs + (size_t)t;
            const float32x4_t qd = vdupq_n_f32(q[d]);
            a0 = vaddq_f32(a0, vmulq_f32(qd, vld1q_f32(k)));
            a1 = vaddq_f32(a1, vmulq_f32(qd, vld1q_f32(k + 4)));
            a2 = vaddq_f32(a2, vmulq_f32(qd, vld1q_f32(k + 8)));
            a3 = vaddq_f32(a3, vmulq_f32(qd, vld1q_f32(k + 12)));
        }
        vst1q_f32(scores + t, vmulq_n_f32(a0, scale));
        vst1q_f32(scores + t + 4, vmulq_n_f32(a1, scale));
        vst1q_f32(scores + t + 8, vmulq_n_f32(a2, scale));
        vst1q_f32(scores + t + 12, vmulq_n_f32(a3, scale));
    }
    for (; t < bs; t++) {
        float s = 0.0f;
        for (int d = 0; d < hd; d++)
            s += q[d] * kt[(size_t)d * (size_t)bs + (size_t)t];
        scores[t] = s * scale;
    }
}

/* One lane per dimension: out[d] gets p[t]·v[t][d] added in the order t = 0, 1, ... */
static void block_accum(const float *p, const float *v, int hd, int n, float *out)
{
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        float32x4_t o0 = vld1q_f32(out + d), o1 = vld1q_f32(out + d + 4);
        for (int t = 0; t < n; t++) {
            const float *vt = v + (size_t)t * (size_t)hd + (size_t)d;
            const float32x4_t pt = vdupq_n_f32(p[t]);
            o0 = vaddq_f32(o0, vmulq_f32(pt, vld1q_f32(vt)));
            o1 = vaddq_f32(o1, vmulq_f32(pt, vld1q_f32(vt + 4)));
        }
        vst1q_f32(out + d, o0);
        vst1q_f32(out + d + 4, o1);
    }
    for (; d < hd; d++)
        for (int t = 0; t < n; t++)
            out[d] += p[t] * v[(size_t)t * (size_t)hd + (size_t)d];
}

static void dequant_f16(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(s + 2 * i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++)
        dst[i] = f16_at(s + 2 * i);
}

/* ---- integer dots ------------------------------------------------------------------------- */

/* Σ a[i]·b[i] over 16 int8 pairs, exactly: each product fits int16 (|p| <= 2^14), pairs of
 * them int32. */
static inline int32x4_t dot16_acc(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}

static inline int32_t dot32(int8x16_t a0, int8x16_t a1, const int8_t *x)
{
    int32x4_t acc = dot16_acc(vdupq_n_s32(0), a0, vld1q_s8(x));
    return vaddvq_s32(dot16_acc(acc, a1, vld1q_s8(x + 16)));
}

static float dot_q8_0(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    float s = 0.0f;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        const uint8_t *wb = pw + b * 34, *xb = px + b * 34;
        const int8_t *wq = (const int8_t *)(wb + 2);
        const int32_t isum = dot32(vld1q_s8(wq), vld1q_s8(wq + 16), (const int8_t *)(xb + 2));
        s += (float)isum * (f16_at(wb) * f16_at(xb));
    }
    return s;
}

static float dot_q4_0(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    const uint8x16_t low = vdupq_n_u8(0xF);
    const int8x16_t eight = vdupq_n_s8(8);
    float s = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *wb = pw + b * 18, *xb = px + b * 34;
        const uint8x16_t qs = vld1q_u8(wb + 2);
        const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(qs, low)), eight);
        const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(qs, 4)), eight);
        const int32_t isum = dot32(lo, hi, (const int8_t *)(xb + 2));
        s += (float)isum * (f16_at(wb) * f16_at(xb));
    }
    return s;
}

/* Σ_s m[s] · (Σ of Q8_K's bsums over sub-block s), sub-blocks of 32 (two bsums each). */
static int32_t msum32(const int16_t bsums[16], const uint8_t m[8])
{
    int32_t total = 0;
    for (int s = 0; s < 8; s++)
        total += (int32_t)m[s] * ((int32_t)bsums[2 * s] + bsums[2 * s + 1]);
    return total;
}

static float dot_q4_k(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    const uint8x16_t low = vdupq_n_u8(0xF);
    float s = 0.0f;
    for (int64_t b = 0; b < n / KVP_QK_K; b++) {
        const uint8_t *wb = pw + (size_t)b * 144, *xb = px + (size_t)b * 292;
        float xd;
        int16_t bsums[16];
        memcpy(&xd, xb, 4);
        memcpy(bsums, xb + 4 + KVP_QK_K, sizeof(bsums));
        const int8_t *x = (const int8_t *)(xb + 4);
        uint8_t sc[8], m[8];
        kvp_k_scales_unpack(wb + 4, sc, m);
        const uint8_t *qs = wb + 4 + KVP_K_SCALE_SIZE;
        int32_t isum = 0;
        for (int c = 0; c < 4; c++) { /* sub-blocks 2c (low nibbles) and 2c + 1 (high) */
            const uint8x16_t q0 = vld1q_u8(qs + 32 * c), q1 = vld1q_u8(qs + 32 * c + 16);
            const int32_t tl = dot32(vreinterpretq_s8_u8(vandq_u8(q0, low)),
                                     vreinterpretq_s8_u8(vandq_u8(q1, low)), x + 64 * c);
            const int32_t th = dot32(vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)),
                                     vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)), x + 64 * c + 32);
            isum += (int32_t)sc[2 * c] * tl + (int32_t)sc[2 * c + 1] * th;
        }
        const float d = f16_at(wb), dmin = f16_at(wb + 2);
        s += (d * xd) * (float)isum;
        s -= (dmin * xd) * (float)msum32(bsums, m);
    }
    return s;
}

static inline int32_t dot16(int8x16_t a, const int8_t *x)
{
    return vaddvq_s32(dot16_acc(vdupq_n_s32(0), a, vld1q_s8(x)));
}

static float dot_q6_k(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w, *px = xq;
    const uint8x16_t low = vdupq_n_u8(0xF), three = vdupq_n_u8(3);
    const int8x16_t off = vdupq_n_s8(32);
    float s = 0.0f;
    for (int64_t b = 0; b < n / KVP_QK_K; b++) {
        const uint8_t *wb = pw + (size_t)b * 210, *xb = px + (size_t)b * 292;
        float xd;
        memcpy(&xd, xb, 4);
        const int8_t *x = (const int8_t *)(xb + 4);
        const int8_t *sc = (const int8_t *)(wb + 192);
        int32_t isum = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *L = wb + 64 * h, *Q = wb + 128 + 32 * h;
            for (int l0 = 0; l0 < 32; l0 += 16) {
                const uint8x16_t l_a = vld1q_u8(L + l0), l_b = vld1q_u8(L + 32 + l0);
                const uint8x16_t qh = vld1q_u8(Q + l0);
                /* elements 128h + {0, 32, 64, 96} + l0 .. + 16: codes in 0..63, minus 32 */
                const uint8x16_t c0 =
                    vorrq_u8(vandq_u8(l_a, low), vshlq_n_u8(vandq_u8(qh, three), 4));
                const uint8x16_t c1 =
                    vorrq_u8(vandq_u8(l_b, low), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 2), three), 4));
                const uint8x16_t c2 =
                    vorrq_u8(vshrq_n_u8(l_a, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 4), three), 4));
                const uint8x16_t c3 =
                    vorrq_u8(vshrq_n_u8(l_b, 4), vshlq_n_u8(vshrq_n_u8(qh, 6), 4));
                const int e = 128 * h + l0;
                isum += sc[e / 16] * dot16(vsubq_s8(vreinterpretq_s8_u8(c0), off), x + e);
                isum +=
                    sc[(e + 32) / 16] * dot16(vsubq_s8(vreinterpretq_s8_u8(c1), off), x + e + 32);
                isum +=
                    sc[(e + 64) / 16] * dot16(vsubq_s8(vreinterpretq_s8_u8(c2), off), x + e + 64);
                isum +=
                    sc[(e + 96) / 16] * dot16(vsubq_s8(vreinterpretq_s8_u8(c3), off), x + e + 96);
            }
        }
        s += (f16_at(wb + 208) * xd) * (float)isum;
    }
    return s;
}

/* ---- row batches -------------------------------------------------------------------------- */

/* One row at a time through the dots above (kvp_matvec_rows prefetches the next rows). */
#define ROWS(NAME, DOT, WT, XT)                                                                    \
    static void NAME(const void *w, size_t row_bytes, const XT *x, int64_t n, int64_t nrows,       \
                     float *y)                                                                     \
    {                                                                                              \
        for (int64_t r = 0; r < nrows; r++)                                                        \
            y[r] = DOT((const WT *)((const char *)w + (size_t)r * row_bytes), x, n);               \
    }

ROWS(rows_f32, dot_f32, float, float)
ROWS(rows_f16, dot_f16, uint16_t, float)
ROWS(rows_q8_0, dot_q8_0, void, void)

/* ---- quantize / dequantize ---------------------------------------------------------------- */

/* kvp_quantize_row_q8_0_ref's steps: the exact max of |x| (maxNum, like fmaxf), the same scalar
 * d and 1/d, the same products rounded to nearest even. */
static void quantize_q8_0(const float *x, void *dst, int64_t n)
{
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        const float *xb = x + b * KVP_QK8_0;
        float32x4_t v[8], m = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(xb + 4 * k);
            m = vmaxnmq_f32(m, vabsq_f32(v[k]));
        }
        const float amax = vmaxnmvq_f32(m);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        struct kvp_block_q8_0 blk;
        blk.d = kvp_f32_to_f16(d);
        for (int k = 0; k < 8; k += 2) {
            const int32x4_t q0 = vcvtnq_s32_f32(vmulq_n_f32(v[k], id));
            const int32x4_t q1 = vcvtnq_s32_f32(vmulq_n_f32(v[k + 1], id));
            const int16x8_t h = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
            vst1_s8(blk.qs + 4 * k, vqmovn_s16(h));
        }
        memcpy(out + b * sizeof(blk), &blk, sizeof(blk));
    }
}

static void dequant_q8_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        const uint8_t *sb = s + b * 34;
        const float d = f16_at(sb);
        float *o = dst + b * KVP_QK8_0;
        for (int k = 0; k < 2; k++) {
            const int8x16_t q = vld1q_s8((const int8_t *)(sb + 2 + 16 * k));
            const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
            vst1q_f32(o + 16 * k, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
            vst1q_f32(o + 16 * k + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
            vst1q_f32(o + 16 * k + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
            vst1q_f32(o + 16 * k + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
        }
    }
}

const struct kvp_simd_ops kvp_simd_ops_neon = {
    .name = "neon",
    .dot_f32 = dot_f32,
    .dot_f16 = dot_f16,
    .dot_bf16 = kvp_scalar_dot_bf16,
    .dot_q8_0 = dot_q8_0,
    .axpy = axpy,
    .exp_sum = kvp_scalar_exp_sum,
    .block_scores = block_scores,
    .block_accum = block_accum,
    .rows_f32 = rows_f32,
    .rows_f16 = rows_f16,
    .rows_bf16 = kvp_scalar_rows_bf16,
    .rows_q8_0 = rows_q8_0,
    .quantize_q8_0 = quantize_q8_0,
    .dequant_f16 = dequant_f16,
    .dequant_q8_0 = dequant_q8_0,
    .dot_q =
        {
            [KVP_TYPE_Q4_0] = dot_q4_0,
            [KVP_TYPE_Q4_1] = kvp_scalar_dot_q4_1,
            [KVP_TYPE_Q5_0] = kvp_scalar_dot_q5_0,
            [KVP_TYPE_Q5_1] = kvp_scalar_dot_q5_1,
            [KVP_TYPE_IQ4_NL] = kvp_scalar_dot_iq4_nl,
            [KVP_TYPE_Q2_K] = kvp_scalar_dot_q2_k,
            [KVP_TYPE_Q3_K] = kvp_scalar_dot_q3_k,
            [KVP_TYPE_Q4_K] = dot_q4_k,
            [KVP_TYPE_Q5_K] = kvp_scalar_dot_q5_k,
            [KVP_TYPE_Q6_K] = dot_q6_k,
        },
    .quantize_q8_k = kvp_quantize_row_q8_k_ref,
};
