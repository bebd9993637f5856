/*
 * Matrix-vector products over weights stored as F32, F16, BF16 or any quantized type in quant.h.
 *
 * Decode spends its time here. At long context it is memory-bound on the weights, so the kernels
 * stream each row once with unaligned loads straight from the mapping (quantized rows are runs
 * of 18- to 210-byte blocks and are never aligned). At short context a token runs ~30 small
 * mat-vecs (a 64x64 matrix takes ~0.3 µs), so the per-call path is kept to one table load, one
 * switch on the type and one call into a row-batched kernel (kvp_simd_ops.rows_*), which handles
 * four rows per pass and shares their horizontal sums; the other quantized types call their
 * integer dot (kvp_simd_ops.dot_q) once per row. Quantized weights need x quantized once per
 * vector (Q8_0 or Q8_K, kvp_type_vec_dot_type) by kvp_matvec_prepare into caller-owned scratch;
 * a caller that passes no prepared x gets it quantized here, in column chunks on the stack.
 * Nothing here allocates.
 */
#include "kernels/matvec.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/platform.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/simd_internal.h"
#include "kernels/types.h"

size_t kvp_matvec_xq_bytes(int type, int64_t cols)
{
    switch (kvp_type_vec_dot_type(type)) {
    case KVP_TYPE_Q8_0:
        return (size_t)(cols / KVP_QK8_0) * sizeof(struct kvp_block_q8_0);
    case KVP_TYPE_Q8_K:
        return (size_t)(cols / KVP_QK_K) * sizeof(struct kvp_block_q8_k);
    default:
        return 0;
    }
}

/* Quantize n activations for weights of type with the given table. */
static void prepare_ops(const struct kvp_simd_ops *ops, int type, const float *x, int64_t n,
                        void *xq)
{
    int vt = kvp_type_vec_dot_type(type);
    if (vt == KVP_TYPE_Q8_0)
        ops->quantize_q8_0(x, xq, n);
    else if (vt == KVP_TYPE_Q8_K)
        ops->quantize_q8_k(x, xq, n);
}

void kvp_matvec_prepare(int type, const float *x, int64_t cols, void *xq)
{
    prepare_ops(kvp_simd(), type, x, cols, xq);
}

/* y[r] = dot(row r, x) for nrows rows starting at w, x prepared (xq) for W's type. */
static void rows_quant(const struct kvp_simd_ops *ops, int type, const char *w, size_t row_bytes,
                       const void *xq, int64_t n, int64_t nrows, float *y)
{
    if (type == KVP_TYPE_Q8_0) {
        ops->rows_q8_0(w, row_bytes, xq, n, nrows, y);
        return;
    }
    if (ops->rows_q[type]) {
        ops->rows_q[type](w, row_bytes, xq, n, nrows, y);
        return;
    }
    float (*dot)(const void *, const void *, int64_t) = ops->dot_q[type];
    for (int64_t r = 0; r < nrows; r++)
        y[r] = dot(w + (size_t)r * row_bytes, xq, n);
}

enum { XQ_CHUNK = 4096 }; /* columns per stack chunk when the caller passes no prepared x */

/* rows_quant for a caller without prepared activations: quantize x in chunks of XQ_CHUNK
 * columns (a multiple of every block size) into a stack buffer and accumulate the partial dots.
 * With cols <= XQ_CHUNK the result is bit-identical to the prepared path. */
static void rows_quant_unprepared(const struct kvp_simd_ops *ops, int type, const char *w,
                                  size_t row_bytes, const float *x, int64_t n, int64_t nrows,
                                  float *y)
{
    uint8_t buf[XQ_CHUNK / KVP_QK_K * sizeof(struct kvp_block_q8_k)];
    _Static_assert(XQ_CHUNK / KVP_QK8_0 * sizeof(struct kvp_block_q8_0) <= sizeof(buf),
                   "chunk buffer holds Q8_0 activations too");
    float part[64];
    for (int64_t r = 0; r < nrows; r++)
        y[r] = 0.0f;
    for (int64_t c0 = 0; c0 < n; c0 += XQ_CHUNK) {
        int64_t nc = n - c0 < XQ_CHUNK ? n - c0 : XQ_CHUNK;
        size_t woff = 0;
        kvp_type_row_bytes(type, c0, &woff);
        prepare_ops(ops, type, x + c0, nc, buf);
        for (int64_t r0 = 0; r0 < nrows; r0 += 64) {
            int64_t k = nrows - r0 < 64 ? nrows - r0 : 64;
            rows_quant(ops, type, w + (size_t)r0 * row_bytes + woff, row_bytes, buf, nc, k, part);
            for (int64_t i = 0; i < k; i++)
                y[r0 + i] += part[i];
        }
    }
}

/* Contract as kvp_matvec_rows. W->type must be F32, F16, BF16 or a type with an integer dot (the
 * model loader rejects the others before any product runs); any other type fills y[r0..r1) with
 * NaN so that a mistake shows up in the logits instead of as stale numbers. */
/* For kernels that do not prefetch themselves (kvp_simd_ops.rows_prefetch), rows go to the
 * kernels in chunks of about MV_CHUNK bytes (at least four rows), and before each chunk the rows
 * about MV_AHEAD bytes further on are prefetched: the hardware prefetcher alone keeps too few
 * lines in flight (SmolLM2-135M's shape, Q8_0, one thread: 5 GB/s without, 11-16 GB/s with,
 * though the prefetches inside the kernel loops do better still). A range of at most
 * MV_SMALL bytes goes in one call without prefetching: a tiny model's matrices live in the
 * caches, where the extra calls and prefetches cost time (stories260K decode). */
enum { MV_CHUNK = 2048, MV_AHEAD = 8192, MV_SMALL = 128 * 1024 };

static void rows_one_chunk(const struct kvp_simd_ops *ops, const struct kvp_mat *W, const float *x,
                           const void *xq, float *y, int64_t r0, int64_t r1);

void kvp_matvec_rows_ops(const struct kvp_simd_ops *ops, const struct kvp_mat *W, const float *x,
                         const void *xq, float *y, int64_t r0, int64_t r1)
{
    bool quant = kvp_type_vec_dot_type(W->type) != KVP_TYPE_F32;
    bool own = ops->rows_prefetch && (!quant || W->type == KVP_TYPE_Q8_0 ||
                                      (W->type >= 0 && W->type < KVP_SIMD_NTYPES &&
                                       ops->rows_q[W->type]));
    size_t rb = W->row_bytes ? W->row_bytes : 1;
    /* !xq: x is quantized per call; own: the kernel prefetches */
    if ((quant && !xq) || own || r1 - r0 <= (int64_t)(MV_SMALL / rb)) {
        rows_one_chunk(ops, W, x, xq, y, r0, r1);
        return;
    }
    const char *base = (const char *)W->data;
    int64_t chunk = (int64_t)(MV_CHUNK / rb) & ~(int64_t)3;
    chunk = chunk > 4 ? chunk : 4;
    int64_t ahead = (int64_t)(MV_AHEAD / rb) > chunk ? (int64_t)(MV_AHEAD / rb) : chunk;
    for (int64_t r = r0; r < r1; r += chunk) {
        int64_t e = r + chunk < r1 ? r + chunk : r1;
        int64_t p0 = r + ahead, p1 = e + ahead < r1 ? e + ahead : r1;
        for (const char *a = base + (size_t)p0 * rb, *b = base + (size_t)p1 * rb; a < b; a += 64)
            __builtin_prefetch(a, 0, 3);
        rows_one_chunk(ops, W, x, xq, y, r, e);
    }
}

static void rows_one_chunk(const struct kvp_simd_ops *ops, const struct kvp_mat *W, const float *x,
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
    default:
        if (W->type != KVP_TYPE_Q8_0 &&
            (W->type < 0 || W->type >= KVP_SIMD_NTYPES || !ops->dot_q[W->type])) {
            assert(!"kvp_matvec_rows: unsupported weight type");
            for (int64_t r = r0; r < r1; r++)
                y[r] = NAN;
            break;
        }
        if (xq)
            rows_quant(ops, W->type, w, W->row_bytes, xq, n, nrows, y + r0);
        else
            rows_quant_unprepared(ops, W->type, w, W->row_bytes, x, n, nrows, y + r0);
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

/* The table's multi-vector kernel for W's type, or NULL. */
static void (*multi_kernel(const struct kvp_simd_ops *ops, int type))(const void *, size_t,
                                                                       const void *const *, int,
                                                                       int64_t, int64_t,
                                                                       float *const *)
{
    if (type == KVP_TYPE_Q8_0)
        return ops->rows_q8_0_multi;
    return type >= 0 && type < KVP_SIMD_NTYPES ? ops->rows_q_multi[type] : NULL;
}

bool kvp_matvec_has_multi(const struct kvp_mat *W)
{
    return multi_kernel(kvp_simd(), W->type) != NULL;
}

void kvp_matvec_rows_multi(const struct kvp_mat *W, const void *const *xq, int nv,
                           float *const *y, int64_t r0, int64_t r1)
{
    if (r1 > r0)
        multi_kernel(kvp_simd(), W->type)((const char *)W->data + (size_t)r0 * W->row_bytes,
                                          W->row_bytes, xq, nv, W->cols, r1 - r0, y);
}

bool kvp_lanes_has(int type)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    return type >= 0 && type < KVP_SIMD_NTYPES && ops->lanes_pack[type] && ops->lanes_rows[type];
}

size_t kvp_lanes_bytes(const struct kvp_mat *W)
{
    if (!kvp_lanes_has(W->type) || W->rows <= 0 || W->cols <= 0 || W->cols % 32 ||
        (W->type == KVP_TYPE_Q4_K && W->cols % KVP_QK_K))
        return 0;
    size_t tile = kvp_lanes_tile_bytes(W->type, W->cols), tiles = (size_t)((W->rows + 15) / 16);
    return tile == 0 || tiles > SIZE_MAX / tile ? 0 : tiles * tile;
}

/* P describing W packed into mem (borrowed: the caller's); -1 with P zeroed when W cannot be
 * packed or there is no mem. */
static int lanes_set(struct kvp_lanes *P, const struct kvp_mat *W, void *mem, bool borrowed)
{
    memset(P, 0, sizeof(*P));
    size_t bytes = kvp_lanes_bytes(W);
    if (bytes == 0 || !mem)
        return -1;
    *P = (struct kvp_lanes){.mem = mem, .bytes = bytes, .type = W->type, .rows = W->rows,
                            .cols = W->cols, .borrowed = borrowed};
    return 0;
}

int kvp_lanes_init_at(struct kvp_lanes *P, const struct kvp_mat *W, void *mem)
{
    return lanes_set(P, W, mem, true);
}

int kvp_lanes_init(struct kvp_lanes *P, const struct kvp_mat *W)
{
    size_t bytes = kvp_lanes_bytes(W);
    void *mem = bytes ? kvp_alloc_aligned(bytes) : NULL;
    if (lanes_set(P, W, mem, false) < 0) {
        kvp_free_aligned(mem);
        return -1;
    }
    return 0;
}

int64_t kvp_lanes_tiles(const struct kvp_lanes *P)
{
    return (P->rows + 15) / 16;
}

void kvp_lanes_pack(struct kvp_lanes *P, const struct kvp_mat *W, int64_t t0, int64_t t1)
{
    if (t0 < t1)
        kvp_simd()->lanes_pack[P->type](W->data, W->row_bytes, W->cols, W->rows, t0, t1, P->mem);
}

void kvp_lanes_free(struct kvp_lanes *P)
{
    if (!P->borrowed)
        kvp_free_aligned(P->mem);
    memset(P, 0, sizeof(*P));
}

void kvp_lanes_rows(const struct kvp_lanes *P, const void *const *xq, int nv, float *const *y,
                    int64_t r0, int64_t r1, bool accumulate)
{
    if (r1 > r0)
        kvp_simd()->lanes_rows[P->type](P->mem, P->cols, xq, nv, r0, r1, y, accumulate);
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
        default: {
            /* the other quantized types: the reference dequantizer (prefill cost is sgemm) */
            const struct kvp_type_traits *tt = kvp_type_traits(W->type);
            if (tt && tt->supported && tt->to_f32) {
                tt->to_f32(src, out, n);
                break;
            }
            assert(!"kvp_mat_dequant_rows: unsupported weight type");
            for (int64_t i = 0; i < n; i++)
                out[i] = NAN;
            break;
        }
        }
    }
}
