/*
 * Prefill's integer GEMM, the portable half (prefill_gemm.h): the activation layout, weight tiles
 * and the KVP_PREFILL switch; the kernels are the table's gemm_tile (simd_vnni_avx512.c) and
 * gemm_tile_k (simd_vnni_avx512.c, simd_avx2.c, simd_scalar.c).
 *
 * Why: prefill through dequantized tiles and OpenBLAS sgemm runs at the cores' f32 FMA peak
 * (Llama-3.2-1B's shape, Q8_0, 2 threads: ~230 GFLOP/s), where vpdpbusd does 64 multiply-adds
 * per instruction against the FMA's 16. Rows are converted a tile at a time (int8 codes, f32
 * scales, the block sums the kernel starts from), a cost per weight byte that the batch's tokens
 * share, like the dequantized tiles of the sgemm path.
 */
#include "kernels/prefill_gemm.h"
#include "core/settings.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/types.h"

enum { TILE_ROWS = 64 }; /* weight rows per tile: about 128 KiB of codes at 2048 columns */

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static bool env_sgemm; /* KVP_PREFILL=sgemm: keep the dequantize + sgemm path */

static void env_init(void)
{
    env_sgemm = kvp_setting_is(KVP_SETTING_PREFILL, "sgemm");
}

static bool is_k(int type)
{
    return type == KVP_TYPE_Q4_K || type == KVP_TYPE_Q6_K;
}

bool kvp_gemm_has(const struct kvp_simd_ops *ops, int type)
{
    if (type == KVP_TYPE_Q8_0 || type == KVP_TYPE_Q4_0 || type == KVP_TYPE_Q5_0)
        return ops->gemm_tile != NULL;
    return is_k(type) && ops->gemm_tile_k != NULL;
}

bool kvp_gemm_wants(int type, int n)
{
    if (n < 2)
        return false;
    pthread_once(&env_once, env_init);
    return !env_sgemm && kvp_gemm_has(kvp_simd(), type);
}

size_t kvp_gemm_xq_bytes(int n, int64_t cols)
{
    return (size_t)((n + 15) / 16) * (size_t)(cols / 32) * KVP_GEMM_BLOCK_BYTES;
}

/* Token j of group blocks gx (one group's blocks, in column order) from the Q8_0 row q. */
static void scatter_token(const struct kvp_block_q8_0 *q, int64_t nb, int j, uint8_t *gx)
{
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = gx + (size_t)b * KVP_GEMM_BLOCK_BYTES;
        for (int k = 0; k < 8; k++) {
            uint32_t v;
            memcpy(&v, q[b].qs + 4 * k, 4);
            v ^= 0x80808080u; /* +128 per byte */
            memcpy(blk + 64 * k + 4 * j, &v, 4);
        }
        float d = kvp_f16_to_f32(q[b].d);
        memcpy(blk + 512 + 4 * j, &d, 4);
    }
}

/* Token j of group blocks gx from the Q8_K row q (nb blocks of 32): each block of 32 takes its
 * super-block's scale, and its scale times its sum (two of Q8_K's sums of 16) for the mins. */
static void scatter_token_k(const struct kvp_block_q8_k *q, int64_t nb, int j, uint8_t *gx)
{
    for (int64_t b = 0; b < nb; b++) {
        const struct kvp_block_q8_k *s = &q[b / 8];
        const int8_t *qs = s->qs + 32 * (b % 8);
        uint8_t *blk = gx + (size_t)b * KVP_GEMM_BLOCK_BYTES;
        for (int k = 0; k < 8; k++) {
            uint32_t v;
            memcpy(&v, qs + 4 * k, 4);
            v ^= 0x80808080u;
            memcpy(blk + 64 * k + 4 * j, &v, 4);
        }
        float xs = s->d * (float)(s->bsums[2 * (b % 8)] + s->bsums[2 * (b % 8) + 1]);
        memcpy(blk + 512 + 4 * j, &s->d, 4);
        memcpy(blk + 576 + 4 * j, &xs, 4);
    }
}

void kvp_gemm_quantize(int type, const float *X, int ldx, int64_t cols, int n, long t0, long t1,
                       void *xg, void *row_scratch)
{
    const int64_t nb = cols / 32;
    const size_t gstride = (size_t)nb * KVP_GEMM_BLOCK_BYTES;
    const bool k = kvp_type_vec_dot_type(type) == KVP_TYPE_Q8_K;
    for (long t = t0; t < t1; t++) {
        uint8_t *gx = (uint8_t *)xg + (size_t)(t / 16) * gstride;
        if (k) {
            kvp_quantize_row_q8_k(X + (size_t)t * ldx, row_scratch, cols);
            scatter_token_k(row_scratch, nb, (int)(t % 16), gx);
        } else {
            kvp_quantize_row_q8_0(X + (size_t)t * ldx, row_scratch, cols);
            scatter_token(row_scratch, nb, (int)(t % 16), gx);
        }
    }
    if (n % 16 && t0 <= n - 1 && n - 1 < t1) { /* pad: zero quants, scales and sums */
        memset(row_scratch, 0, kvp_matvec_xq_bytes(type, cols));
        for (int j = n % 16; j < 16; j++) {
            uint8_t *gx = (uint8_t *)xg + (size_t)(n / 16) * gstride;
            if (k)
                scatter_token_k(row_scratch, nb, j, gx);
            else
                scatter_token(row_scratch, nb, j, gx);
        }
    }
}

/* Scratch per tile row: the codes, then dw and corr per sub-block (of 16 at the finest), then mn
 * per block of 32. */
static size_t tile_row_bytes(int64_t cols)
{
    return (size_t)cols + (size_t)(cols / 16) * (sizeof(float) + sizeof(int32_t)) +
           (size_t)(cols / 32) * sizeof(float);
}

size_t kvp_gemm_scratch_bytes(int64_t cols)
{
    return 4 * tile_row_bytes(cols) + 64;
}

/* Block b of a row of W's type as 32 int8 codes; returns the f16 scale. */
static uint16_t block_codes(int type, const uint8_t *row, int64_t b, int8_t *out)
{
    if (type == KVP_TYPE_Q8_0) {
        const struct kvp_block_q8_0 *q = (const struct kvp_block_q8_0 *)row + b;
        memcpy(out, q->qs, 32);
        return q->d;
    }
    if (type == KVP_TYPE_Q4_0) {
        const struct kvp_block_q4_0 *q = (const struct kvp_block_q4_0 *)row + b;
        for (int j = 0; j < 16; j++) {
            out[j] = (int8_t)((q->qs[j] & 0xF) - 8);
            out[j + 16] = (int8_t)((q->qs[j] >> 4) - 8);
        }
        return q->d;
    }
    const struct kvp_block_q5_0 *q = (const struct kvp_block_q5_0 *)row + b; /* Q5_0 */
    uint32_t qh;
    memcpy(&qh, q->qh, 4);
    for (int j = 0; j < 16; j++) {
        out[j] = (int8_t)(((q->qs[j] & 0xF) | ((qh >> j) & 1) << 4) - 16);
        out[j + 16] = (int8_t)(((q->qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
    return q->d;
}

/* One Q4_K row of nsb super-blocks as codes 0..15 with, per block of 32, dw = d·sc, mn = dmin·m
 * and corr = -128·Σ codes (code byte 32c + l holds element 64c + l in its low nibble and
 * 64c + 32 + l in its high one). */
static void convert_q4_k(const uint8_t *row, int64_t nsb, int8_t *codes, float *dw, int32_t *corr,
                         float *mn)
{
    for (int64_t s = 0; s < nsb; s++) {
        struct kvp_block_q4_k q;
        memcpy(&q, row + (size_t)s * sizeof(q), sizeof(q));
        uint8_t sc[8], m[8];
        kvp_k_scales_unpack(q.scales, sc, m);
        float d = kvp_f16_to_f32(q.d), dmin = kvp_f16_to_f32(q.dmin);
        for (int j = 0; j < 8; j++) {
            int8_t *c = codes + (s * 8 + j) * 32;
            int32_t sum = 0;
            for (int l = 0; l < 32; l++) {
                c[l] = (int8_t)((q.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF);
                sum += c[l];
            }
            dw[s * 8 + j] = d * (float)sc[j];
            mn[s * 8 + j] = dmin * (float)m[j];
            corr[s * 8 + j] = -128 * sum;
        }
    }
}

/* One Q6_K row as codes -32..31 with, per sub-block of 16, dw = d·sc and corr (element 128h +
 * 32i + l, i < 4, l < 32: low bits from ql[64h + l + 32(i%2)] (low nibble for i < 2), high two
 * bits from qh[32h + l] at bit 2i; sub-block e/16 has scales[e/16]). */
static void convert_q6_k(const uint8_t *row, int64_t nsb, int8_t *codes, float *dw, int32_t *corr)
{
    for (int64_t s = 0; s < nsb; s++) {
        struct kvp_block_q6_k q;
        memcpy(&q, row + (size_t)s * sizeof(q), sizeof(q));
        float d = kvp_f16_to_f32(q.d);
        int8_t *c = codes + s * 256;
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 4; i++)
                for (int l = 0; l < 32; l++) {
                    int lo = (q.ql[64 * h + l + 32 * (i % 2)] >> (4 * (i / 2))) & 0xF;
                    int hi = (q.qh[32 * h + l] >> (2 * i)) & 3;
                    c[128 * h + 32 * i + l] = (int8_t)((lo | hi << 4) - 32);
                }
        for (int j = 0; j < 16; j++) {
            int32_t sum = 0;
            for (int l = 0; l < 16; l++)
                sum += c[16 * j + l];
            dw[s * 16 + j] = d * (float)q.scales[j];
            corr[s * 16 + j] = -128 * sum;
        }
    }
}

/* Rows [r0, r1) of a K-quant W through the table's gemm_tile_k, a tile at a time. */
static void rows_k(const struct kvp_simd_ops *ops, const struct kvp_mat *W, const void *xg, int n,
                   float *Y, int ldy, bool accumulate, int64_t r0, int64_t r1, void *scratch,
                   int64_t tile_rows)
{
    const int64_t K = W->cols, nsb = K / KVP_QK_K;
    const int sub = W->type == KVP_TYPE_Q6_K ? 16 : 32;
    const int64_t ns = K / sub;
    int8_t *codes = scratch;
    float *dw = (float *)((uint8_t *)scratch + (size_t)tile_rows * K);
    int32_t *corr = (int32_t *)(dw + tile_rows * ns);
    float *mn = W->type == KVP_TYPE_Q4_K ? (float *)(corr + tile_rows * ns) : NULL;
    for (int64_t a = r0; a < r1; a += tile_rows) {
        int64_t rows = r1 - a < tile_rows ? r1 - a : tile_rows;
        for (int64_t i = 0; i < rows; i++) {
            const uint8_t *row = (const uint8_t *)W->data + (size_t)(a + i) * W->row_bytes;
            if (mn)
                convert_q4_k(row, nsb, codes + i * K, dw + i * ns, corr + i * ns, mn + i * ns);
            else
                convert_q6_k(row, nsb, codes + i * K, dw + i * ns, corr + i * ns);
        }
        struct kvp_gemm_tile tile = {codes, dw, corr, mn, rows, K, sub};
        ops->gemm_tile_k(&tile, xg, n, Y + a, ldy, accumulate);
    }
}

void kvp_gemm_rows(const struct kvp_mat *W, const void *xg, int n, float *Y, int ldy,
                   bool accumulate, int64_t r0, int64_t r1, void *scratch, size_t scratch_bytes)
{
    kvp_gemm_rows_ops(kvp_simd(), W, xg, n, Y, ldy, accumulate, r0, r1, scratch, scratch_bytes);
}

void kvp_gemm_rows_ops(const struct kvp_simd_ops *ops, const struct kvp_mat *W, const void *xg,
                       int n, float *Y, int ldy, bool accumulate, int64_t r0, int64_t r1,
                       void *scratch, size_t scratch_bytes)
{
    const int64_t K = W->cols, nb = K / 32;
    int64_t tile_rows = (int64_t)(scratch_bytes / tile_row_bytes(K));
    tile_rows = tile_rows < TILE_ROWS ? tile_rows : TILE_ROWS;
    if (is_k(W->type)) {
        rows_k(ops, W, xg, n, Y, ldy, accumulate, r0, r1, scratch, tile_rows);
        return;
    }
    int8_t *codes = scratch;
    float *dw = (float *)((uint8_t *)scratch + (size_t)tile_rows * K);
    int32_t *corr = (int32_t *)(dw + tile_rows * nb);
    void (*kernel)(const struct kvp_gemm_tile *, const void *, int, float *, int, bool) =
        ops->gemm_tile;
    void (*convert)(const void *, size_t, int64_t, int64_t, int8_t *, float *, int32_t *) =
        W->type == KVP_TYPE_Q8_0 ? ops->gemm_convert_q8_0 : NULL;
    for (int64_t a = r0; a < r1; a += tile_rows) {
        int64_t rows = r1 - a < tile_rows ? r1 - a : tile_rows;
        if (convert)
            convert((const uint8_t *)W->data + (size_t)a * W->row_bytes, W->row_bytes, rows, nb,
                    codes, dw, corr);
        for (int64_t i = 0; !convert && i < rows; i++) {
            const uint8_t *row = (const uint8_t *)W->data + (size_t)(a + i) * W->row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                int8_t *c = codes + i * K + b * 32;
                dw[i * nb + b] = kvp_f16_to_f32(block_codes(W->type, row, b, c));
                int32_t s = 0;
                for (int j = 0; j < 32; j++)
                    s += c[j];
                corr[i * nb + b] = -128 * s;
            }
        }
        struct kvp_gemm_tile tile = {codes, dw, corr, NULL, rows, K, 32};
        kernel(&tile, xg, n, Y + a, ldy, accumulate);
    }
}
