/*
 * Prefill's integer GEMM, the portable half (prefill_gemm.h): the activation layout, weight tiles
 * and the KVP_PREFILL switch; the kernel is the table's gemm_tile (simd_vnni_avx512.c).
 *
 * Why: prefill through dequantized tiles and OpenBLAS sgemm runs at the cores' f32 FMA peak
 * (Llama-3.2-1B's shape, Q8_0, 2 threads: ~230 GFLOP/s), where vpdpbusd does 64 multiply-adds
 * per instruction against the FMA's 16. Rows are converted a tile at a time (int8 codes, f32
 * scales, the block sums the kernel starts from), a cost per weight byte that the batch's tokens
 * share, like the dequantized tiles of the sgemm path.
 */
#include "kernels/prefill_gemm.h"

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
    const char *v = getenv("KVP_PREFILL");
    env_sgemm = v && strcmp(v, "sgemm") == 0;
}

bool kvp_gemm_wants(int type, int n)
{
    if (n < 2 || (type != KVP_TYPE_Q8_0 && type != KVP_TYPE_Q4_0 && type != KVP_TYPE_Q5_0))
        return false;
    pthread_once(&env_once, env_init);
    return !env_sgemm && kvp_simd()->gemm_tile != NULL;
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

void kvp_gemm_quantize(const float *X, int ldx, int64_t cols, int n, long t0, long t1, void *xg,
                       void *row_scratch)
{
    const int64_t nb = cols / 32;
    const size_t gstride = (size_t)nb * KVP_GEMM_BLOCK_BYTES;
    struct kvp_block_q8_0 *q = row_scratch;
    for (long t = t0; t < t1; t++) {
        kvp_quantize_row_q8_0(X + (size_t)t * ldx, q, cols);
        scatter_token(q, nb, (int)(t % 16), (uint8_t *)xg + (size_t)(t / 16) * gstride);
    }
    if (n % 16 && t0 <= n - 1 && n - 1 < t1) { /* pad: zero quants and scales */
        memset(q, 0, (size_t)nb * sizeof(*q));
        for (int j = n % 16; j < 16; j++)
            scatter_token(q, nb, j, (uint8_t *)xg + (size_t)(n / 16) * gstride);
    }
}

/* Scratch per tile row: the codes, then dw and corr per block. */
static size_t tile_row_bytes(int64_t cols)
{
    return (size_t)cols + (size_t)(cols / 32) * (sizeof(float) + sizeof(int32_t));
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

void kvp_gemm_rows(const struct kvp_mat *W, const void *xg, int n, float *Y, int ldy,
                   bool accumulate, int64_t r0, int64_t r1, void *scratch, size_t scratch_bytes)
{
    const int64_t K = W->cols, nb = K / 32;
    int64_t tile_rows = (int64_t)(scratch_bytes / tile_row_bytes(K));
    tile_rows = tile_rows < TILE_ROWS ? tile_rows : TILE_ROWS;
    int8_t *codes = scratch;
    float *dw = (float *)((uint8_t *)scratch + (size_t)tile_rows * K);
    int32_t *corr = (int32_t *)(dw + tile_rows * nb);
    void (*kernel)(const struct kvp_gemm_tile *, const void *, int, float *, int, bool) =
        kvp_simd()->gemm_tile;
    void (*convert)(const void *, size_t, int64_t, int64_t, int8_t *, float *, int32_t *) =
        W->type == KVP_TYPE_Q8_0 ? kvp_simd()->gemm_convert_q8_0 : NULL;
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
        struct kvp_gemm_tile tile = {codes, dw, corr, rows, K};
        kernel(&tile, xg, n, Y + a, ldy, accumulate);
    }
}
