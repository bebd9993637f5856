/*
 * Prefill's integer GEMM: Y[t][r] (+)= dot(row r of W, x_t) for a batch of tokens, with the
 * activations quantized once per batch the way decode's mat-vec quantizes every token (Q8_0
 * blocks of 32 for the 32-element types, Q8_K blocks of 256 for the K-quants) and the products
 * summed in int32. Each output is the same sum of per-block integer dots times the scales that
 * the decode dot computes, so prefill and decode differ only in float summation order.
 * Weight types:
 *   - Q8_0, Q4_0 and Q5_0 (codes are small integers with one scale per 32, so a tile of rows
 *     converts exactly to int8 codes): the table's gemm_tile, AVX-512 VNNI only (Q8_0's codes
 *     times activations +128 overflow the int16 pairs of AVX2's vpmaddubsw).
 *   - Q4_K and Q6_K: the table's gemm_tile_k (VNNI, AVX2 and scalar). Q4_K's codes 0..15 carry
 *     one scale d·sc and one min dmin·m per 32 (w = d·sc·q - dmin·m), Q6_K's codes -32..31 one
 *     scale d·sc per 16; both fit int8 with the sub-block scale kept as a float per 32 or per
 *     16 (d·sc is exact in f32: an f16 times a 6- or 8-bit integer), and the mins are applied as
 *     dmin·m times the activations' block sums. Their products stay within int16 pairs, so
 *     AVX2's vpmaddubsw serves too.
 *
 * Without a kernel, and with KVP_PREFILL=sgemm in the environment, prefill dequantizes tiles for
 * OpenBLAS sgemm as before (that path is the reference the tests compare with).
 *
 * Activation layout (kvp_gemm_quantize): tokens in groups of 16; per group, for each block of
 * 32 columns, KVP_GEMM_BLOCK_BYTES bytes: eight 64-byte slices, slice k holding bytes 4k..4k+3
 * of the 16 tokens' quants (token j at 4j, each +128 so that they are the unsigned side of
 * vpdpbusd / vpmaddubsw), then the 16 tokens' f32 scales of the block, then (K-quant
 * activations only) the 16 tokens' scale times Σ quants of the block, for the mins. Tokens past
 * n in the last group have scale 0.
 */
#ifndef KVP_KERNELS_PREFILL_GEMM_H
#define KVP_KERNELS_PREFILL_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/matvec.h"

#define KVP_GEMM_BLOCK_BYTES (8 * 64 + 2 * 16 * 4) /* one block of 32 columns for 16 tokens */

/* Rows of W converted for the kernel: int8 codes [rows][cols], and per row and sub-block of
 * `sub` columns (32, or 16 for Q6_K) the f32 scale dw and corr = -128·Σ codes (what the +128 of
 * the activations adds); for Q4_K also mn, the min dmin·m per row and block of 32 (else NULL).
 * gemm_tile reads only sub == 32 tiles without mins. */
struct kvp_gemm_tile {
    const int8_t *codes;
    const float *dw;
    const int32_t *corr;
    const float *mn;
    int64_t rows, cols;
    int sub;
};

/* Whether prefill of n tokens against weights of this type goes through the integer GEMM here
 * (the CPU has the kernel, the type converts, KVP_PREFILL is not "sgemm"). */
bool kvp_gemm_wants(int type, int n);

/* Whether KVP_PREFILL=sgemm asks prefill to keep the dequantize + OpenBLAS sgemm path (the
 * reference some tests compare with) where it would otherwise run kvpred's own kernels. */
bool kvp_gemm_sgemm_forced(void);

/* Bytes of the quantized activations of n tokens of cols columns (cols a multiple of 32). */
size_t kvp_gemm_xq_bytes(int n, int64_t cols);

/* Quantize tokens [t0, t1) of the n in X (rows ldx floats apart) into xg for weights of type
 * (kvp_type_vec_dot_type(type) says how: Q8_0 or Q8_K; one xg serves every weight type with the
 * same one). Threads may fill disjoint token ranges of one xg concurrently; the one whose range
 * holds token n-1 pads the last group. row_scratch holds kvp_matvec_xq_bytes(type, cols) bytes. */
void kvp_gemm_quantize(int type, const float *X, int ldx, int64_t cols, int n, long t0, long t1,
                       void *xg, void *row_scratch);

/* Bytes of scratch kvp_gemm_rows needs for a tile of at least 4 rows (it uses what it gets). */
size_t kvp_gemm_scratch_bytes(int64_t cols);

/* Y[t][r] = dot(row r of W, x_t) (accumulate: +=) for t < n and r in [r0, r1), x prepared in xg
 * by kvp_gemm_quantize; Y rows are ldy floats apart, indexed by absolute row. scratch is this
 * caller's (scratch_bytes >= kvp_gemm_scratch_bytes(W->cols)). Only when kvp_gemm_wants. */
void kvp_gemm_rows(const struct kvp_mat *W, const void *xg, int n, float *Y, int ldy,
                   bool accumulate, int64_t r0, int64_t r1, void *scratch, size_t scratch_bytes);

/* kvp_gemm_rows with an explicit kernel table that has the type's kernel (the tests compare the
 * tables; callers use kvp_gemm_rows, which takes kvp_simd()). */
struct kvp_simd_ops;
bool kvp_gemm_has(const struct kvp_simd_ops *ops, int type);
void kvp_gemm_rows_ops(const struct kvp_simd_ops *ops, const struct kvp_mat *W, const void *xg,
                       int n, float *Y, int ldy, bool accumulate, int64_t r0, int64_t r1,
                       void *scratch, size_t scratch_bytes);

#endif
