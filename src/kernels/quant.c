/*
 * Reference quantizers and dequantizers for the block types in quant.h.
 *
 * Dequantizers transcribe docs/formats.md §4.4 one formula per loop, so that they can be
 * checked line by line against the spec; they are also the prefill path (a weight tile is
 * dequantized and handed to sgemm), where they run once per tile row and are not the bottleneck.
 *
 * Quantizers run once per model (kvpred quantize) and favour quality over speed:
 *   - Q4_0 / Q5_0: ggml's absmax rule. The element with the largest magnitude maps exactly to
 *     the most negative code (-8 / -16), which uses the extra negative level of the range.
 *   - Q4_1 / Q5_1: ggml's min/max rule, d = (max - min) / (2^bits - 1), m = min.
 *   - IQ4_NL: a scan of 33 candidate scales around absmax / 127, each followed by a least-squares
 *     refit of d for the chosen code-book entries; the lowest squared error wins.
 *   - K-quants: each sub-block gets its own scale (and min, for the affine types) from a scan of
 *     candidate rounding scales with a least-squares refit per candidate (fit_affine and
 *     fit_symmetric below). The sub-block scales are then quantized against one super-block
 *     scale (6-bit for Q3_K/Q4_K/Q5_K, 4-bit for Q2_K, int8 for Q6_K) and every element is
 *     re-rounded against the scale it will actually be decoded with (after the f16 round trip).
 * Non-finite inputs are not supported (the quantizer CLI checks rows first).
 */
#include "kernels/quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/types.h"

const int8_t kvp_iq4nl_table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                    1,    13,   25,  38,  53,  69,  89,  113};

/* ============================== scale packing ============================== */

/* Inverse of kvp_k_scales_unpack; sc and m must be < 64. */
static void k_scales_pack(const uint8_t sc[8], const uint8_t m[8], uint8_t s[KVP_K_SCALE_SIZE])
{
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

/* Inverse of kvp_q3_k_scales_unpack; sc in -32..31. */
static void q3_k_scales_pack(const int8_t sc[16], uint8_t s[12])
{
    memset(s, 0, 12);
    for (int i = 0; i < 16; i++) {
        int u = sc[i] + 32;
        if (i < 8)
            s[i] |= (uint8_t)(u & 0xF);
        else
            s[i - 8] |= (uint8_t)((u & 0xF) << 4);
        s[8 + i % 4] |= (uint8_t)((u >> 4) << (2 * (i / 4)));
    }
}

/* ============================== dequantization ============================== */

static inline float f16(uint16_t h)
{
    return kvp_f16_to_f32(h);
}

void kvp_dequant_row_q4_0(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, dst += 32) {
        struct kvp_block_q4_0 k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d);
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)((k.qs[j] & 0xF) - 8) * d;
            dst[j + 16] = (float)((k.qs[j] >> 4) - 8) * d;
        }
    }
}

void kvp_dequant_row_q4_1(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, dst += 32) {
        struct kvp_block_q4_1 k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d), m = f16(k.m);
        for (int j = 0; j < 16; j++) {
            dst[j] = (float)(k.qs[j] & 0xF) * d + m;
            dst[j + 16] = (float)(k.qs[j] >> 4) * d + m;
        }
    }
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void kvp_dequant_row_q5_0(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, dst += 32) {
        struct kvp_block_q5_0 k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d);
        uint32_t h = le32(k.qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (k.qs[j] & 0xF) | (int)((h >> j) & 1) << 4;
            int q1 = (k.qs[j] >> 4) | (int)((h >> (j + 16)) & 1) << 4;
            dst[j] = (float)(q0 - 16) * d;
            dst[j + 16] = (float)(q1 - 16) * d;
        }
    }
}

void kvp_dequant_row_q5_1(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, dst += 32) {
        struct kvp_block_q5_1 k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d), m = f16(k.m);
        uint32_t h = le32(k.qh);
        for (int j = 0; j < 16; j++) {
            int q0 = (k.qs[j] & 0xF) | (int)((h >> j) & 1) << 4;
            int q1 = (k.qs[j] >> 4) | (int)((h >> (j + 16)) & 1) << 4;
            dst[j] = (float)q0 * d + m;
            dst[j + 16] = (float)q1 * d + m;
        }
    }
}

void kvp_dequant_row_iq4_nl(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, dst += 32) {
        struct kvp_block_iq4_nl k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)kvp_iq4nl_table[k.qs[j] & 0xF];
            dst[j + 16] = d * (float)kvp_iq4nl_table[k.qs[j] >> 4];
        }
    }
}

void kvp_dequant_row_q2_k(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, dst += KVP_QK_K) {
        struct kvp_block_q2_k k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d), dmin = f16(k.dmin);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int p = 0; p < 2; p++) {
                    uint8_t sc = k.scales[8 * h + 2 * j + p];
                    float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++) {
                        int q = (k.qs[32 * h + 16 * p + l] >> (2 * j)) & 3;
                        dst[128 * h + 32 * j + 16 * p + l] = dl * (float)q - ml;
                    }
                }
    }
}

void kvp_dequant_row_q3_k(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, dst += KVP_QK_K) {
        struct kvp_block_q3_k k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d);
        int8_t sc[16];
        kvp_q3_k_scales_unpack(k.scales, sc);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int p = 0; p < 2; p++) {
                    float dl = d * (float)sc[8 * h + 2 * j + p];
                    for (int l = 0; l < 16; l++) {
                        int idx = 16 * p + l;
                        int low = (k.qs[32 * h + idx] >> (2 * j)) & 3;
                        int hbit = (k.hmask[idx] >> (4 * h + j)) & 1;
                        dst[128 * h + 32 * j + 16 * p + l] = dl * (float)(low - (hbit ? 0 : 4));
                    }
                }
    }
}

void kvp_dequant_row_q4_k(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, dst += KVP_QK_K) {
        struct kvp_block_q4_k k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d), dmin = f16(k.dmin);
        uint8_t sc[8], m[8];
        kvp_k_scales_unpack(k.scales, sc, m);
        for (int c = 0; c < 4; c++) {
            float d0 = d * (float)sc[2 * c], m0 = dmin * (float)m[2 * c];
            float d1 = d * (float)sc[2 * c + 1], m1 = dmin * (float)m[2 * c + 1];
            for (int l = 0; l < 32; l++) {
                uint8_t q = k.qs[32 * c + l];
                dst[64 * c + l] = d0 * (float)(q & 0xF) - m0;
                dst[64 * c + 32 + l] = d1 * (float)(q >> 4) - m1;
            }
        }
    }
}

void kvp_dequant_row_q5_k(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, dst += KVP_QK_K) {
        struct kvp_block_q5_k k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d), dmin = f16(k.dmin);
        uint8_t sc[8], m[8];
        kvp_k_scales_unpack(k.scales, sc, m);
        for (int c = 0; c < 4; c++) {
            float d0 = d * (float)sc[2 * c], m0 = dmin * (float)m[2 * c];
            float d1 = d * (float)sc[2 * c + 1], m1 = dmin * (float)m[2 * c + 1];
            for (int l = 0; l < 32; l++) {
                uint8_t q = k.qs[32 * c + l];
                int h0 = (k.qh[l] >> (2 * c)) & 1, h1 = (k.qh[l] >> (2 * c + 1)) & 1;
                dst[64 * c + l] = d0 * (float)((q & 0xF) + 16 * h0) - m0;
                dst[64 * c + 32 + l] = d1 * (float)((q >> 4) + 16 * h1) - m1;
            }
        }
    }
}

void kvp_dequant_row_q6_k(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, dst += KVP_QK_K) {
        struct kvp_block_q6_k k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        float d = f16(k.d);
        for (int h = 0; h < 2; h++) {
            const uint8_t *L = k.ql + 64 * h, *Q = k.qh + 32 * h;
            const int8_t *S = k.scales + 8 * h;
            float *y = dst + 128 * h;
            for (int l = 0; l < 32; l++) {
                int s = l / 16;
                int q0 = ((L[l] & 0xF) | ((Q[l] >> 0) & 3) << 4) - 32;
                int q1 = ((L[l + 32] & 0xF) | ((Q[l] >> 2) & 3) << 4) - 32;
                int q2 = ((L[l] >> 4) | ((Q[l] >> 4) & 3) << 4) - 32;
                int q3 = ((L[l + 32] >> 4) | ((Q[l] >> 6) & 3) << 4) - 32;
                y[l] = d * (float)S[s + 0] * (float)q0;
                y[l + 32] = d * (float)S[s + 2] * (float)q1;
                y[l + 64] = d * (float)S[s + 4] * (float)q2;
                y[l + 96] = d * (float)S[s + 6] * (float)q3;
            }
        }
    }
}

void kvp_dequant_row_q8_k(const void *src, float *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, dst += KVP_QK_K) {
        struct kvp_block_q8_k k;
        memcpy(&k, (const uint8_t *)src + b * sizeof(k), sizeof(k));
        for (int j = 0; j < KVP_QK_K; j++)
            dst[j] = k.d * (float)k.qs[j];
    }
}

/* ============================== 32-element quantizers ============================== */

/* The element of largest magnitude, with its sign (the first one on ties). */
static float signed_absmax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Symmetric 2^bits-level codes q in 0..2^bits-1 with y = (q - half)·d (Q4_0: bits 4, Q5_0: 5). */
static float quant_sym32(const float *x, int bits, uint8_t q[32])
{
    int half = 1 << (bits - 1), top = (1 << bits) - 1;
    float d = signed_absmax(x, 32) / (float)-half;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++)
        q[j] = (uint8_t)clampi((int)(x[j] * id + (float)half + 0.5f), 0, top);
    return d;
}

/* Affine codes q in 0..2^bits-1 with y = q·d + m (Q4_1, Q5_1). */
static float quant_affine32(const float *x, int bits, uint8_t q[32], float *m)
{
    int top = (1 << bits) - 1;
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    float d = (hi - lo) / (float)top;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++)
        q[j] = (uint8_t)clampi((int)((x[j] - lo) * id + 0.5f), 0, top);
    *m = lo;
    return d;
}

static void pack_nibbles(const uint8_t q[32], uint8_t qs[16])
{
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
}

static void pack_fifth_bits(const uint8_t q[32], uint8_t qh[4])
{
    uint32_t h = 0;
    for (int j = 0; j < 32; j++)
        h |= (uint32_t)(q[j] >> 4) << j;
    for (int i = 0; i < 4; i++)
        qh[i] = (uint8_t)(h >> (8 * i));
}

void kvp_quantize_row_q4_0_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        struct kvp_block_q4_0 k;
        uint8_t q[32];
        k.d = kvp_f32_to_f16(quant_sym32(x, 4, q));
        pack_nibbles(q, k.qs);
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

void kvp_quantize_row_q5_0_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        struct kvp_block_q5_0 k;
        uint8_t q[32];
        k.d = kvp_f32_to_f16(quant_sym32(x, 5, q));
        pack_nibbles(q, k.qs);
        pack_fifth_bits(q, k.qh);
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

void kvp_quantize_row_q4_1_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        struct kvp_block_q4_1 k;
        uint8_t q[32];
        float m;
        k.d = kvp_f32_to_f16(quant_affine32(x, 4, q, &m));
        k.m = kvp_f32_to_f16(m);
        pack_nibbles(q, k.qs);
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

void kvp_quantize_row_q5_1_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        struct kvp_block_q5_1 k;
        uint8_t q[32];
        float m;
        k.d = kvp_f32_to_f16(quant_affine32(x, 5, q, &m));
        k.m = kvp_f32_to_f16(m);
        pack_nibbles(q, k.qs);
        pack_fifth_bits(q, k.qh);
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

/* Index of the code-book entry nearest to v (the table is ascending). */
static int iq4nl_nearest(float v)
{
    int best = 0;
    float be = fabsf(v - (float)kvp_iq4nl_table[0]);
    for (int i = 1; i < 16; i++) {
        float e = fabsf(v - (float)kvp_iq4nl_table[i]);
        if (e < be) {
            be = e;
            best = i;
        }
    }
    return best;
}

/* Squared error of x against d·T[q] with q the nearest codes for scale d; fills q. */
static float iq4nl_try(const float *x, float d, uint8_t q[32])
{
    float id = d != 0.0f ? 1.0f / d : 0.0f, err = 0.0f;
    for (int j = 0; j < 32; j++) {
        q[j] = (uint8_t)iq4nl_nearest(x[j] * id);
        float e = d * (float)kvp_iq4nl_table[q[j]] - x[j];
        err += e * e;
    }
    return err;
}

void kvp_quantize_row_iq4_nl_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        struct kvp_block_iq4_nl k;
        uint8_t q[32], qt[32];
        float d0 = signed_absmax(x, 32) / -127.0f, best_d = d0;
        float best = iq4nl_try(x, d0, q);
        for (int s = -16; s <= 16 && d0 != 0.0f; s++) {
            float d = d0 * (1.0f + 0.02f * (float)s);
            iq4nl_try(x, d, qt);
            /* least-squares scale for these codes */
            float sxt = 0.0f, stt = 0.0f;
            for (int j = 0; j < 32; j++) {
                float t = (float)kvp_iq4nl_table[qt[j]];
                sxt += x[j] * t;
                stt += t * t;
            }
            d = stt > 0.0f ? sxt / stt : d;
            float err = iq4nl_try(x, d, qt);
            if (err < best) {
                best = err;
                best_d = d;
                memcpy(q, qt, sizeof(q));
            }
        }
        k.d = kvp_f32_to_f16(best_d);
        /* re-pick the codes for the scale as stored */
        iq4nl_try(x, kvp_f16_to_f32(k.d), q);
        pack_nibbles(q, k.qs);
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

/* ============================== K-quant scale search ============================== */

enum { FIT_STEPS = 10 }; /* candidates per side of the plain min/max or absmax scale */

/* Fit x[0..n) ≈ s·q - m with integer q in 0..nmax, s >= 0 and m >= 0 (so 0 is always
 * representable, as the K-quant formats assume). Scans rounding scales (nmax + k/10) / range
 * for |k| <= FIT_STEPS, refits s and m by least squares for each rounding, and keeps the fit with
 * the lowest squared error. Returns s; *m_out receives m. */
static float fit_affine(const float *x, int n, int nmax, float *m_out)
{
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    lo = fminf(lo, 0.0f);
    if (hi <= lo) {
        *m_out = -lo;
        return 0.0f;
    }
    float best_err = FLT_MAX, best_s = (hi - lo) / (float)nmax, best_b = lo;
    for (int k = -FIT_STEPS; k <= FIT_STEPS; k++) {
        float iscale = ((float)nmax + 0.1f * (float)k) / (hi - lo);
        float sq = 0.0f, sqq = 0.0f, sx = 0.0f, sqx = 0.0f;
        for (int i = 0; i < n; i++) {
            float q = (float)clampi((int)lrintf(iscale * (x[i] - lo)), 0, nmax);
            sq += q;
            sqq += q * q;
            sx += x[i];
            sqx += q * x[i];
        }
        float det = (float)n * sqq - sq * sq, s, b;
        if (det <= 0.0f)
            continue;
        s = ((float)n * sqx - sq * sx) / det;
        b = (sqq * sx - sq * sqx) / det;
        if (b > 0.0f) { /* the min must stay <= 0: refit the scale alone */
            b = 0.0f;
            s = sqq > 0.0f ? sqx / sqq : 0.0f;
        }
        if (s < 0.0f)
            continue;
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float q = (float)clampi((int)lrintf(iscale * (x[i] - lo)), 0, nmax);
            float e = s * q + b - x[i];
            err += e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_s = s;
            best_b = b;
        }
    }
    *m_out = -best_b;
    return best_s;
}

/* Fit x[0..n) ≈ s·q with integer q in -nmax..nmax-1. Scans scales that map the element of
 * largest magnitude to -(nmax + k/10), refits s by least squares for each rounding, keeps the
 * lowest squared error. Returns s (negative when the extreme element is positive). */
static float fit_symmetric(const float *x, int n, int nmax)
{
    float max = signed_absmax(x, n);
    if (max == 0.0f)
        return 0.0f;
    float best_err = FLT_MAX, best_s = max / (float)-nmax;
    for (int k = -FIT_STEPS; k <= FIT_STEPS; k++) {
        float iscale = -((float)nmax + 0.1f * (float)k) / max;
        float sqq = 0.0f, sqx = 0.0f, sxx = 0.0f;
        for (int i = 0; i < n; i++) {
            float q = (float)clampi((int)lrintf(iscale * x[i]), -nmax, nmax - 1);
            sqq += q * q;
            sqx += q * x[i];
            sxx += x[i] * x[i];
        }
        if (sqq <= 0.0f)
            continue;
        float err = sxx - sqx * sqx / sqq;
        if (err < best_err) {
            best_err = err;
            best_s = sqx / sqq;
        }
    }
    return best_s;
}

/* Quantize sub-block scales s[0..n) (all >= 0) to integers 0..top against one scale:
 * returns the super-block scale (max / top) and fills out[]. */
static float quant_scales_unsigned(const float *s, int n, int top, uint8_t *out)
{
    float max = 0.0f;
    for (int i = 0; i < n; i++)
        max = fmaxf(max, s[i]);
    float d = max / (float)top, id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++)
        out[i] = (uint8_t)clampi((int)lrintf(s[i] * id), 0, top);
    return d;
}

/* Signed sub-block scales to integers -lim..lim-1 (the largest magnitude maps to -lim). */
static float quant_scales_signed(const float *s, int n, int lim, int8_t *out)
{
    float max = signed_absmax(s, n);
    if (max == 0.0f) {
        memset(out, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-lim / max;
    for (int i = 0; i < n; i++)
        out[i] = (int8_t)clampi((int)lrintf(iscale * s[i]), -lim, lim - 1);
    return 1.0f / iscale;
}

/* Final codes for y = dl·q - ml, q in 0..nmax. */
static void requant_affine(const float *x, int n, float dl, float ml, int nmax, uint8_t *q)
{
    float id = dl != 0.0f ? 1.0f / dl : 0.0f;
    for (int i = 0; i < n; i++)
        q[i] = (uint8_t)clampi((int)lrintf((x[i] + ml) * id), 0, nmax);
}

/* Final codes q + nmax (so 0..2nmax-1) for y = dl·q, q in -nmax..nmax-1. */
static void requant_symmetric(const float *x, int n, float dl, int nmax, uint8_t *q)
{
    float id = dl != 0.0f ? 1.0f / dl : 0.0f;
    for (int i = 0; i < n; i++)
        q[i] = (uint8_t)(clampi((int)lrintf(x[i] * id), -nmax, nmax - 1) + nmax);
}

/* ============================== K-quantizers ============================== */

/* Shared by Q4_K and Q5_K: 8 sub-blocks of 32 with codes 0..nmax; fills d, dmin, the packed
 * scales and the 256 codes. */
static void quant_k_affine8(const float *x, int nmax, uint16_t *d, uint16_t *dmin,
                            uint8_t scales[KVP_K_SCALE_SIZE], uint8_t q[KVP_QK_K])
{
    float s[8], m[8];
    uint8_t sc[8], mq[8];
    for (int j = 0; j < 8; j++)
        s[j] = fit_affine(x + 32 * j, 32, nmax, &m[j]);
    *d = kvp_f32_to_f16(quant_scales_unsigned(s, 8, 63, sc));
    *dmin = kvp_f32_to_f16(quant_scales_unsigned(m, 8, 63, mq));
    k_scales_pack(sc, mq, scales);
    float dd = kvp_f16_to_f32(*d), dm = kvp_f16_to_f32(*dmin);
    for (int j = 0; j < 8; j++)
        requant_affine(x + 32 * j, 32, dd * (float)sc[j], dm * (float)mq[j], nmax, q + 32 * j);
}

void kvp_quantize_row_q4_k_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, x += KVP_QK_K) {
        struct kvp_block_q4_k k;
        uint8_t q[KVP_QK_K];
        quant_k_affine8(x, 15, &k.d, &k.dmin, k.scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                k.qs[32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

void kvp_quantize_row_q5_k_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, x += KVP_QK_K) {
        struct kvp_block_q5_k k;
        uint8_t q[KVP_QK_K];
        quant_k_affine8(x, 31, &k.d, &k.dmin, k.scales, q);
        memset(k.qh, 0, sizeof(k.qh));
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                uint8_t q0 = q[64 * c + l], q1 = q[64 * c + 32 + l];
                k.qs[32 * c + l] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
                k.qh[l] |= (uint8_t)((q0 >> 4) << (2 * c) | (q1 >> 4) << (2 * c + 1));
            }
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

void kvp_quantize_row_q6_k_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, x += KVP_QK_K) {
        struct kvp_block_q6_k k;
        float s[16];
        uint8_t q[KVP_QK_K]; /* codes 0..63 (= quant + 32) */
        for (int j = 0; j < 16; j++)
            s[j] = fit_symmetric(x + 16 * j, 16, 32);
        k.d = kvp_f32_to_f16(quant_scales_signed(s, 16, 128, k.scales));
        float dd = kvp_f16_to_f32(k.d);
        for (int j = 0; j < 16; j++)
            requant_symmetric(x + 16 * j, 16, dd * (float)k.scales[j], 32, q + 16 * j);
        for (int h = 0; h < 2; h++) {
            uint8_t *L = k.ql + 64 * h, *Q = k.qh + 32 * h;
            const uint8_t *y = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                L[l] = (uint8_t)((y[l] & 0xF) | (y[l + 64] & 0xF) << 4);
                L[l + 32] = (uint8_t)((y[l + 32] & 0xF) | (y[l + 96] & 0xF) << 4);
                Q[l] = (uint8_t)((y[l] >> 4) | (y[l + 32] >> 4) << 2 | (y[l + 64] >> 4) << 4 |
                                 (y[l + 96] >> 4) << 6);
            }
        }
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

void kvp_quantize_row_q2_k_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, x += KVP_QK_K) {
        struct kvp_block_q2_k k;
        float s[16], m[16];
        uint8_t sc[16], mq[16], q[KVP_QK_K];
        for (int j = 0; j < 16; j++)
            s[j] = fit_affine(x + 16 * j, 16, 3, &m[j]);
        k.d = kvp_f32_to_f16(quant_scales_unsigned(s, 16, 15, sc));
        k.dmin = kvp_f32_to_f16(quant_scales_unsigned(m, 16, 15, mq));
        float dd = kvp_f16_to_f32(k.d), dm = kvp_f16_to_f32(k.dmin);
        for (int j = 0; j < 16; j++) {
            k.scales[j] = (uint8_t)(sc[j] | mq[j] << 4);
            requant_affine(x + 16 * j, 16, dd * (float)sc[j], dm * (float)mq[j], 3, q + 16 * j);
        }
        /* element 128h + 32j + 16p + l lives in qs[32h + 16p + l], bits 2j..2j+1 */
        memset(k.qs, 0, sizeof(k.qs));
        for (int e = 0; e < KVP_QK_K; e++) {
            int h = e / 128, j = (e % 128) / 32, r = e % 32;
            k.qs[32 * h + r] |= (uint8_t)(q[e] << (2 * j));
        }
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

void kvp_quantize_row_q3_k_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, x += KVP_QK_K) {
        struct kvp_block_q3_k k;
        float s[16];
        int8_t sc[16];
        uint8_t q[KVP_QK_K]; /* codes 0..7 (= quant + 4) */
        for (int j = 0; j < 16; j++)
            s[j] = fit_symmetric(x + 16 * j, 16, 4);
        k.d = kvp_f32_to_f16(quant_scales_signed(s, 16, 32, sc));
        q3_k_scales_pack(sc, k.scales);
        float dd = kvp_f16_to_f32(k.d);
        for (int j = 0; j < 16; j++)
            requant_symmetric(x + 16 * j, 16, dd * (float)sc[j], 4, q + 16 * j);
        /* low two bits as Q2_K; bit 2 goes to hmask[16p + l], bit 4h + j */
        memset(k.qs, 0, sizeof(k.qs));
        memset(k.hmask, 0, sizeof(k.hmask));
        for (int e = 0; e < KVP_QK_K; e++) {
            int h = e / 128, j = (e % 128) / 32, r = e % 32;
            k.qs[32 * h + r] |= (uint8_t)((q[e] & 3) << (2 * j));
            k.hmask[r] |= (uint8_t)((q[e] >> 2) << (4 * h + j));
        }
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}

void kvp_quantize_row_q8_k_ref(const float *x, void *dst, int64_t n)
{
    for (int64_t b = 0; b < n / KVP_QK_K; b++, x += KVP_QK_K) {
        struct kvp_block_q8_k k;
        float amax = 0.0f;
        for (int j = 0; j < KVP_QK_K; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        k.d = amax / 127.0f;
        float id = k.d != 0.0f ? 1.0f / k.d : 0.0f;
        for (int j = 0; j < KVP_QK_K; j++)
            k.qs[j] = (int8_t)clampi((int)lrintf(x[j] * id), -127, 127);
        for (int g = 0; g < KVP_QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += k.qs[16 * g + j];
            k.bsums[g] = (int16_t)s;
        }
        memcpy((uint8_t *)dst + b * sizeof(k), &k, sizeof(k));
    }
}
