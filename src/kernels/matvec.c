/*
 * Matrix-vector products over weights stored as F32, F16, BF16 or Q8_0 rows.
 *
 * Decode spends its time here. At long context it is memory-bound on the weights, so the kernels
 * stream each row once with unaligned loads straight from the mapping (Q8_0 rows are runs of
 * 34-byte blocks and are never aligned). At short context a token runs ~30 small mat-vecs (a
 * 64x64 matrix takes ~0.3 µs), so the per-call path is kept to one table load, one switch on
 * the type and one call into a row-batched kernel (kvp_simd_ops.rows_*), which handles four rows
 * per pass and shares their horizontal sums. Nothing here allocates; Q8_0 weights need x
 * quantized once per vector by kvp_matvec_prepare into caller-owned scratch.
 */
#include "kernels/matvec.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/simd.h"
#include "kernels/types.h"

size_t kvp_matvec_xq_bytes(int type, int64_t cols)
{
    if (type != KVP_TYPE_Q8_0)
        return 0;
    return (size_t)(cols / KVP_QK8_0) * sizeof(struct kvp_block_q8_0);
}

void kvp_matvec_prepare(int type, const float *x, int64_t cols, void *xq)
{
    if (type == KVP_TYPE_Q8_0)
        kvp_quantize_row_q8_0(x, xq, cols);
}

/* Contract as kvp_matvec_rows. W->type must be F32, F16, BF16 or Q8_0 (the model loader rejects
 * the others before any product runs); any other type fills y[r0..r1) with NaN so that a
 * mistake shows up in the logits instead of as stale numbers. */
void kvp_matvec_rows_ops(const struct kvp_simd_ops *ops, const struct kvp_mat *W, const float *x,
                         const void *xq, float *y, int64_t r0, int64_t r1)
{
    if (r1 <= r0)
        return;
    const char *w = (const char *)W->data + (size_t)r0 * W->row_bytes;
    int64_t n = W->cols, nrows = r1 - r0;
    switch (W->type) {
    case KVP_TYPE_F32:
        ops->rows_f32(w, W->row_bytes, x, n, nrows, y + r0);
        break;
    case KVP_TYPE_F16:
        ops->rows_f16(w, W->row_bytes, x, n, nrows, y + r0);
        break;
    case KVP_TYPE_BF16:
        ops->rows_bf16(w, W->row_bytes, x, n, nrows, y + r0);
        break;
    case KVP_TYPE_Q8_0:
        ops->rows_q8_0(w, W->row_bytes, xq, n, nrows, y + r0);
        break;
    default:
        assert(!"kvp_matvec_rows: unsupported weight type");
        for (int64_t r = r0; r < r1; r++)
            y[r] = NAN;
        break;
    }
}

void kvp_matvec_rows(const struct kvp_mat *W, const float *x, const void *xq, float *y, int64_t r0,
                     int64_t r1)
{
    kvp_matvec_rows_ops(kvp_simd(), W, x, xq, y, r0, r1);
}

static void bf16_row_to_f32(const char *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        uint32_t bits = (uint32_t)h << 16;
        memcpy(dst + i, &bits, 4);
    }
}

/* Same type contract as kvp_matvec_rows_ops; other types write NaN rows. */
void kvp_mat_dequant_rows(const struct kvp_mat *W, float *dst, int64_t r0, int64_t r1)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    int64_t n = W->cols;
    for (int64_t r = r0; r < r1; r++) {
        const char *src = (const char *)W->data + (size_t)r * W->row_bytes;
        float *out = dst + (size_t)(r - r0) * (size_t)n;
        switch (W->type) {
        case KVP_TYPE_F32:
            memcpy(out, src, (size_t)n * sizeof(float));
            break;
        case KVP_TYPE_F16:
            ops->dequant_f16(src, out, n);
            break;
        case KVP_TYPE_BF16:
            bf16_row_to_f32(src, out, n);
            break;
        case KVP_TYPE_Q8_0:
            ops->dequant_q8_0(src, out, n);
            break;
        default:
            assert(!"kvp_mat_dequant_rows: unsupported weight type");
            for (int64_t i = 0; i < n; i++)
                out[i] = NAN;
            break;
        }
    }
}
