/*
 * Prefill's integer GEMM: Y[t][r] (+)= dot(row r of W, x_t) for a batch of tokens, with the
 * activations quantized once per batch to Q8_0 blocks (the rounding decode's mat-vec applies to
 * every token) and the products summed in int32 by AVX-512 VNNI. Each output is the same sum of
 * per-block integer dots times dw·dx that the decode dot computes, so prefill and decode differ
 * only in float summation order. Weight types: Q8_0, Q4_0 and Q5_0 (their codes are small
 * integers with one scale per 32, so a tile of rows converts exactly to int8 codes).
 *
 * Used only where the kernel table has a GEMM (the avx512vnni one); elsewhere, and with
 * KVP_PREFILL=sgemm in the environment, prefill dequantizes tiles for OpenBLAS sgemm as before
 * (that path is the reference the tests compare with).
 *
 * Activation layout (kvp_gemm_quantize): tokens in groups of 16; per group, for each block of
 * 32 columns, KVP_GEMM_BLOCK_BYTES bytes: eight 64-byte slices, slice k holding bytes 4k..4k+3
 * of the 16 tokens' quants (token j at 4j, each +128 so that they are vpdpbusd's unsigned side),
 * then the 16 tokens' f32 scales. Tokens past n in the last group have scale 0.
 */
#ifndef KVP_KERNELS_PREFILL_GEMM_H
#define KVP_KERNELS_PREFILL_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/matvec.h"

#define KVP_GEMM_BLOCK_BYTES (8 * 64 + 16 * 4) /* one block of 32 columns for 16 tokens */

/* Rows of W converted for the kernel: int8 codes [rows][cols], and per row and block of 32 the
 * f32 scale dw and corr = -128·Σ codes (what the +128 of the activations adds). */
struct kvp_gemm_tile {
    const int8_t *codes;
    const float *dw;
    const int32_t *corr;
    int64_t rows, cols;
};

/* Whether prefill of n tokens against weights of this type goes through the integer GEMM here
 * (the CPU has the kernel, the type converts, KVP_PREFILL is not "sgemm"). */
bool kvp_gemm_wants(int type, int n);

/* Bytes of the quantized activations of n tokens of cols columns (cols a multiple of 32). */
size_t kvp_gemm_xq_bytes(int n, int64_t cols);

/* Quantize tokens [t0, t1) of the n in X (rows ldx floats apart) into xg. Threads may fill
 * disjoint token ranges of one xg concurrently; the one whose range holds token n-1 pads the last
 * group. row_scratch holds one Q8_0 row (cols / 32 · 34 bytes). */
void kvp_gemm_quantize(const float *X, int ldx, int64_t cols, int n, long t0, long t1, void *xg,
                       void *row_scratch);

/* Bytes of scratch kvp_gemm_rows needs for a tile of at least 4 rows (it uses what it gets). */
size_t kvp_gemm_scratch_bytes(int64_t cols);

/* Y[t][r] = dot(row r of W, x_t) (accumulate: +=) for t < n and r in [r0, r1), x prepared in xg
 * by kvp_gemm_quantize; Y rows are ldy floats apart, indexed by absolute row. scratch is this
 * caller's (scratch_bytes >= kvp_gemm_scratch_bytes(W->cols)). Only when kvp_gemm_wants. */
void kvp_gemm_rows(const struct kvp_mat *W, const void *xg, int n, float *Y, int ldy,
                   bool accumulate, int64_t r0, int64_t r1, void *scratch, size_t scratch_bytes);

#endif
