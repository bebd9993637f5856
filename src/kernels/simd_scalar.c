/*
 * Scalar kernels: the portable fallback and the test oracle for the AVX2 and AVX-512 tables.
 *
 * These are written for clarity, not speed: plain loops, libm's expf, the branchy f16 converter
 * from types.c. Dots keep four float partial sums (so the summation order is fixed and simple to
 * reason about) and Q8_0 dots sum each block's int8 products exactly in an int32 before applying
 * the two scales, exactly as ggml's reference vec_dot_q8_0_q8_0 does. Every SIMD kernel must
 * agree with its counterpart here to within float rounding.
 */
#include "kernels/simd_internal.h"

#include <math.h>
#include <string.h>

#include "kernels/prefill_gemm.h"
#include "kernels/quant.h"
#include "kernels/types.h"

static float dot_f32(const float *w, const float *x, int64_t n)
{
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++)
            s[k] += w[i + k] * x[i + k];
    for (; i < n; i++)
        s[0] += w[i] * x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static float dot_f16(const uint16_t *w, const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += kvp_f16_to_f32(w[i]) * x[i];
    return s;
}

float kvp_scalar_dot_bf16(const uint16_t *w, const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += kvp_bf16_to_f32(w[i]) * x[i];
    return s;
}

/* One Q8_0 x Q8_0 block pair: exact int32 sum of products, then both scales. */
static float dot_q8_0_block(const uint8_t *wb, const uint8_t *xb)
{
    struct kvp_block_q8_0 bw, bx;
    memcpy(&bw, wb, sizeof(bw));
    memcpy(&bx, xb, sizeof(bx));
    int32_t isum = 0;
    for (int j = 0; j < KVP_QK8_0; j++)
        isum += (int32_t)bw.qs[j] * (int32_t)bx.qs[j];
    return (float)isum * (kvp_f16_to_f32(bw.d) * kvp_f16_to_f32(bx.d));
}

static float dot_q8_0(const void *w, const void *xq, int64_t n)
{
    const uint8_t *pw = w;
    const uint8_t *px = xq;
    float s = 0.0f;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++)
        s += dot_q8_0_block(pw + b * 34, px + b * 34);
    return s;
}

static void axpy(float a, const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

float kvp_scalar_exp_sum(float *x, int64_t n, float max)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        s += x[i];
    }
    return s;
}

static void block_scores(const float *q, const float *kt, int hd, int bs, float scale,
                         float *scores)
{
    for (int t = 0; t < bs; t++) {
        float s = 0.0f;
        for (int d = 0; d < hd; d++)
            s += q[d] * kt[(size_t)d * (size_t)bs + (size_t)t];
        scores[t] = s * scale;
    }
}

static void block_accum(const float *p, const float *v, int hd, int n, float *out)
{
    for (int t = 0; t < n; t++)
        for (int d = 0; d < hd; d++)
            out[d] += p[t] * v[(size_t)t * (size_t)hd + (size_t)d];
}

/* Row batches are plain loops over the single-row dots here; the SIMD files do real batching.
 * Float rows are read through memcpy-free casts: GGUF keeps f32 rows 4-aligned and f16/bf16 rows
 * 2-aligned (docs/formats.md §1.5), which is all these loads need. */
static void rows_f32(const void *w, size_t row_bytes, const float *x, int64_t n, int64_t nrows,
                     float *y)
{
    for (int64_t r = 0; r < nrows; r++)
        y[r] = dot_f32((const float *)((const char *)w + (size_t)r * row_bytes), x, n);
}

static void rows_f16(const void *w, size_t row_bytes, const float *x, int64_t n, int64_t nrows,
                     float *y)
{
    for (int64_t r = 0; r < nrows; r++)
        y[r] = dot_f16((const uint16_t *)((const char *)w + (size_t)r * row_bytes), x, n);
}

void kvp_scalar_rows_bf16(const void *w, size_t row_bytes, const float *x, int64_t n, int64_t nrows,
                          float *y)
{
    for (int64_t r = 0; r < nrows; r++)
        y[r] =
            kvp_scalar_dot_bf16((const uint16_t *)((const char *)w + (size_t)r * row_bytes), x, n);
}

static void rows_q8_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                      float *y)
{
    for (int64_t r = 0; r < nrows; r++)
        y[r] = dot_q8_0((const char *)w + (size_t)r * row_bytes, xq, n);
}

static void dequant_f16(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = kvp_f16_to_f32(h);
    }
}

static void dequant_q8_0(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        struct kvp_block_q8_0 blk;
        memcpy(&blk, s + b * 34, sizeof(blk));
        float d = kvp_f16_to_f32(blk.d);
        for (int j = 0; j < KVP_QK8_0; j++)
            dst[b * KVP_QK8_0 + j] = (float)blk.qs[j] * d;
    }
}

/* ============================== quantized weights ==============================
 *
 * Each dot decodes one weight block into its integer codes (exactly the integers
 * docs/formats.md §4.4 multiplies by the scales), sums code × activation products in
 * int32 per sub-block, applies the integer sub-block scales in int32, and only then the float
 * scales: the same arithmetic the SIMD kernels do, written out plainly. */

static float f16_of(const void *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kvp_f16_to_f32(h);
}

/* The 32 codes of a 32-element block: nibbles plus an optional fifth bit from qh. */
static void codes32(const uint8_t qs[16], const uint8_t *qh, int q[32])
{
    uint32_t h = 0;
    if (qh)
        h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xF) | (int)((h >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((h >> (j + 16)) & 1) << 4;
    }
}

/* Σ (q[j] - off)·x[j] and Σ x[j] for one block pair. */
static int32_t isum32(const int q[32], int off, const int8_t *x, int32_t *xsum)
{
    int32_t s = 0, t = 0;
    for (int j = 0; j < 32; j++) {
        s += (q[j] - off) * x[j];
        t += x[j];
    }
    *xsum = t;
    return s;
}

/* Generic 32-element dot: kind selects the decode (see the callers). */
enum { K32_Q4_0, K32_Q4_1, K32_Q5_0, K32_Q5_1, K32_IQ4_NL };

static float dot_q32(const void *w, const void *xq, int64_t n, int kind)
{
    static const size_t bytes[] = {18, 20, 22, 24, 18};
    const uint8_t *pw = w, *px = xq;
    float s = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *wb = pw + (size_t)b * bytes[kind], *xb = px + (size_t)b * 34;
        struct kvp_block_q8_0 x;
        memcpy(&x, xb, sizeof(x));
        float dw = f16_of(wb), dx = kvp_f16_to_f32(x.d);
        int q[32];
        int32_t xsum, isum;
        switch (kind) {
        case K32_Q4_0:
            codes32(wb + 2, NULL, q);
            s += (float)isum32(q, 8, x.qs, &xsum) * (dw * dx);
            break;
        case K32_Q4_1:
            codes32(wb + 4, NULL, q);
            isum = isum32(q, 0, x.qs, &xsum);
            s += (float)isum * (dw * dx) + (float)xsum * (f16_of(wb + 2) * dx);
            break;
        case K32_Q5_0:
            codes32(wb + 6, wb + 2, q);
            s += (float)isum32(q, 16, x.qs, &xsum) * (dw * dx);
            break;
        case K32_Q5_1:
            codes32(wb + 8, wb + 4, q);
            isum = isum32(q, 0, x.qs, &xsum);
            s += (float)isum * (dw * dx) + (float)xsum * (f16_of(wb + 2) * dx);
            break;
        default: /* IQ4_NL: codes index the table */
            codes32(wb + 2, NULL, q);
            for (int j = 0; j < 32; j++)
                q[j] = kvp_iq4nl_table[q[j]];
            s += (float)isum32(q, 0, x.qs, &xsum) * (dw * dx);
            break;
        }
    }
    return s;
}

static float dot_q4_0(const void *w, const void *xq, int64_t n)
{
    return dot_q32(w, xq, n, K32_Q4_0);
}

float kvp_scalar_dot_q4_1(const void *w, const void *xq, int64_t n)
{
    return dot_q32(w, xq, n, K32_Q4_1);
}

float kvp_scalar_dot_q5_0(const void *w, const void *xq, int64_t n)
{
    return dot_q32(w, xq, n, K32_Q5_0);
}

float kvp_scalar_dot_q5_1(const void *w, const void *xq, int64_t n)
{
    return dot_q32(w, xq, n, K32_Q5_1);
}

float kvp_scalar_dot_iq4_nl(const void *w, const void *xq, int64_t n)
{
    return dot_q32(w, xq, n, K32_IQ4_NL);
}

/* Σ over sub-blocks of len elements: sc[s] · Σ q·x (q already offset to its signed range). */
static int32_t isum_k(const int8_t q[KVP_QK_K], const int8_t *x, const int *sc, int len)
{
    int32_t total = 0;
    for (int s = 0; s < KVP_QK_K / len; s++) {
        int32_t t = 0;
        for (int l = 0; l < len; l++)
            t += q[s * len + l] * x[s * len + l];
        total += sc[s] * t;
    }
    return total;
}

/* Σ_s m[s] · (sum of the activations in sub-block s), from Q8_K's 16-element bsums. */
static int32_t msum_k(const int16_t bsums[16], const int *m, int len)
{
    int32_t total = 0;
    for (int s = 0; s < KVP_QK_K / len; s++) {
        int32_t t = 0;
        for (int g = 0; g < len / 16; g++)
            t += bsums[s * (len / 16) + g];
        total += m[s] * t;
    }
    return total;
}

enum { KK_Q2, KK_Q3, KK_Q4, KK_Q5, KK_Q6 };

/* Decode one K block into codes q[256] (signed: Q3_K -4..3, Q6_K -32..31; unsigned otherwise),
 * integer sub-block scales sc[] and mins m[], and the float d and dmin. Returns the sub-block
 * length (16 or 32). */
static int decode_k(const uint8_t *wb, int kind, int8_t q[KVP_QK_K], int sc[16], int m[16],
                    float *d, float *dmin)
{
    *dmin = 0.0f;
    if (kind == KK_Q4 || kind == KK_Q5) {
        struct kvp_block_q5_k k5;
        struct kvp_block_q4_k k4;
        const uint8_t *qs, *qh = NULL, *scales;
        if (kind == KK_Q4) {
            memcpy(&k4, wb, sizeof(k4));
            qs = k4.qs;
            scales = k4.scales;
            *d = kvp_f16_to_f32(k4.d);
            *dmin = kvp_f16_to_f32(k4.dmin);
        } else {
            memcpy(&k5, wb, sizeof(k5));
            qs = k5.qs;
            qh = k5.qh;
            scales = k5.scales;
            *d = kvp_f16_to_f32(k5.d);
            *dmin = kvp_f16_to_f32(k5.dmin);
        }
        uint8_t usc[8], um[8];
        kvp_k_scales_unpack(scales, usc, um);
        for (int j = 0; j < 8; j++) {
            sc[j] = usc[j];
            m[j] = um[j];
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int h0 = qh ? (qh[l] >> (2 * c)) & 1 : 0, h1 = qh ? (qh[l] >> (2 * c + 1)) & 1 : 0;
                q[64 * c + l] = (int8_t)((qs[32 * c + l] & 0xF) | h0 << 4);
                q[64 * c + 32 + l] = (int8_t)((qs[32 * c + l] >> 4) | h1 << 4);
            }
        return 32;
    }
    if (kind == KK_Q6) {
        struct kvp_block_q6_k k;
        memcpy(&k, wb, sizeof(k));
        *d = kvp_f16_to_f32(k.d);
        for (int s = 0; s < 16; s++)
            sc[s] = k.scales[s];
        for (int h = 0; h < 2; h++) {
            const uint8_t *L = k.ql + 64 * h, *Q = k.qh + 32 * h;
            int8_t *y = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                y[l] = (int8_t)(((L[l] & 0xF) | ((Q[l] >> 0) & 3) << 4) - 32);
                y[l + 32] = (int8_t)(((L[l + 32] & 0xF) | ((Q[l] >> 2) & 3) << 4) - 32);
                y[l + 64] = (int8_t)(((L[l] >> 4) | ((Q[l] >> 4) & 3) << 4) - 32);
                y[l + 96] = (int8_t)(((L[l + 32] >> 4) | ((Q[l] >> 6) & 3) << 4) - 32);
            }
        }
        return 16;
    }
    if (kind == KK_Q2) {
        struct kvp_block_q2_k k;
        memcpy(&k, wb, sizeof(k));
        *d = kvp_f16_to_f32(k.d);
        *dmin = kvp_f16_to_f32(k.dmin);
        for (int s = 0; s < 16; s++) {
            sc[s] = k.scales[s] & 0xF;
            m[s] = k.scales[s] >> 4;
        }
        for (int e = 0; e < KVP_QK_K; e++)
            q[e] = (int8_t)((k.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3);
        return 16;
    }
    struct kvp_block_q3_k k;
    memcpy(&k, wb, sizeof(k));
    *d = kvp_f16_to_f32(k.d);
    int8_t s8[16];
    kvp_q3_k_scales_unpack(k.scales, s8);
    for (int s = 0; s < 16; s++)
        sc[s] = s8[s];
    for (int e = 0; e < KVP_QK_K; e++) {
        int h = e / 128, j = (e % 128) / 32, r = e % 32;
        int low = (k.qs[32 * h + r] >> (2 * j)) & 3, hbit = (k.hmask[r] >> (4 * h + j)) & 1;
        q[e] = (int8_t)(low - (hbit ? 0 : 4));
    }
    return 16;
}

static float dot_k(const void *w, const void *xq, int64_t n, int kind)
{
    static const size_t bytes[] = {84, 110, 144, 176, 210};
    const uint8_t *pw = w, *px = xq;
    float s = 0.0f;
    for (int64_t b = 0; b < n / KVP_QK_K; b++) {
        struct kvp_block_q8_k x;
        memcpy(&x, px + (size_t)b * sizeof(x), sizeof(x));
        int8_t q[KVP_QK_K];
        int sc[16], m[16];
        float d, dmin;
        int len = decode_k(pw + (size_t)b * bytes[kind], kind, q, sc, m, &d, &dmin);
        s += (d * x.d) * (float)isum_k(q, x.qs, sc, len);
        if (kind == KK_Q2 || kind == KK_Q4 || kind == KK_Q5)
            s -= (dmin * x.d) * (float)msum_k(x.bsums, m, len);
    }
    return s;
}

float kvp_scalar_dot_q2_k(const void *w, const void *xq, int64_t n)
{
    return dot_k(w, xq, n, KK_Q2);
}

float kvp_scalar_dot_q3_k(const void *w, const void *xq, int64_t n)
{
    return dot_k(w, xq, n, KK_Q3);
}

static float dot_q4_k(const void *w, const void *xq, int64_t n)
{
    return dot_k(w, xq, n, KK_Q4);
}

float kvp_scalar_dot_q5_k(const void *w, const void *xq, int64_t n)
{
    return dot_k(w, xq, n, KK_Q5);
}

static float dot_q6_k(const void *w, const void *xq, int64_t n)
{
    return dot_k(w, xq, n, KK_Q6);
}

/* Prefill's integer GEMM over a K-quant tile (simd.h, gemm_tile_k; layouts in prefill_gemm.h):
 * per (token, row), per sub-block in column order, the exact int32 sum of (x + 128)·code plus
 * corr, then fmaf into one float; Q4_K's min after each block of 32. The SIMD tables do the same
 * float operations in the same order, so they agree with this bit for bit. */
void kvp_scalar_gemm_tile_k(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y,
                            int ldy, bool accumulate)
{
    const int64_t K = tile->cols, nb = K / 32, ns = K / tile->sub;
    const int per = 32 / tile->sub; /* sub-blocks per block of 32 */
    const size_t gstride = (size_t)nb * KVP_GEMM_BLOCK_BYTES;
    for (int t = 0; t < n; t++) {
        const uint8_t *gx = (const uint8_t *)xg + (size_t)(t / 16) * gstride;
        const int j = t % 16;
        for (int64_t r = 0; r < tile->rows; r++) {
            const int8_t *c = tile->codes + r * K;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = gx + (size_t)b * KVP_GEMM_BLOCK_BYTES;
                float dx, xs;
                memcpy(&dx, blk + 512 + 4 * j, 4);
                memcpy(&xs, blk + 576 + 4 * j, 4);
                for (int h = 0; h < per; h++) {
                    int64_t si = b * per + h;
                    int32_t s = tile->corr[r * ns + si];
                    for (int e = h * tile->sub; e < (h + 1) * tile->sub; e++)
                        s += (int32_t)blk[64 * (e / 4) + 4 * j + e % 4] * c[b * 32 + e];
                    acc = fmaf((float)s, tile->dw[r * ns + si] * dx, acc);
                }
                if (tile->mn)
                    acc = fmaf(-tile->mn[r * nb + b], xs, acc);
            }
            float *out = y + (size_t)t * ldy + r;
            *out = accumulate ? *out + acc : acc;
        }
    }
}

const struct kvp_simd_ops kvp_simd_ops_scalar = {
    .name = "scalar",
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
    .quantize_q8_0 = kvp_quantize_row_q8_0_ref,
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
    .gemm_tile_k = kvp_scalar_gemm_tile_k,
};
