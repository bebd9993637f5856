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

static float dot_bf16(const uint16_t *w, const float *x, int64_t n)
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

static float exp_sum(float *x, int64_t n, float max)
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
 * 2-aligned (formats.md §1.5), which is all these loads need. */
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

static void rows_bf16(const void *w, size_t row_bytes, const float *x, int64_t n, int64_t nrows,
                      float *y)
{
    for (int64_t r = 0; r < nrows; r++)
        y[r] = dot_bf16((const uint16_t *)((const char *)w + (size_t)r * row_bytes), x, n);
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

const struct kvp_simd_ops kvp_simd_ops_scalar = {
    .name = "scalar",
    .dot_f32 = dot_f32,
    .dot_f16 = dot_f16,
    .dot_bf16 = dot_bf16,
    .dot_q8_0 = dot_q8_0,
    .axpy = axpy,
    .exp_sum = exp_sum,
    .block_scores = block_scores,
    .block_accum = block_accum,
    .rows_f32 = rows_f32,
    .rows_f16 = rows_f16,
    .rows_bf16 = rows_bf16,
    .rows_q8_0 = rows_q8_0,
    .quantize_q8_0 = kvp_quantize_row_q8_0_ref,
    .dequant_f16 = dequant_f16,
    .dequant_q8_0 = dequant_q8_0,
};
