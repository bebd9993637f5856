/*
 * Private to the kernel layer: the three kvp_simd_ops tables, one per instruction set, each
 * defined in its own translation unit (simd_scalar.c, simd_avx2.c, simd_avx512.c) so that the
 * build can give each file its own -m flags. Only simd.c decides which one may run: the AVX
 * tables exist on every x86-64 build but must not be called unless kvp_cpu_features() says so.
 */
#ifndef KVP_KERNELS_SIMD_INTERNAL_H
#define KVP_KERNELS_SIMD_INTERNAL_H

#include "kernels/simd.h"

extern const struct kvp_simd_ops kvp_simd_ops_scalar;
extern const struct kvp_simd_ops kvp_simd_ops_avx2;
extern const struct kvp_simd_ops kvp_simd_ops_avx512;
extern const struct kvp_simd_ops kvp_simd_ops_avx512vnni; /* AVX-512 plus the VNNI row kernels */

/* AVX-512 VNNI row kernels (simd_vnni_avx512.c): the avx512vnni table, which simd.c hands out only
 * when the CPU has VNNI. */
void kvp_vnni_rows_q8_0_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                              int64_t n, int64_t nrows, float *const *y);
void kvp_vnni_rows_q8_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y);
void kvp_vnni_rows_q4_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y);
void kvp_vnni_rows_q5_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y);
void kvp_vnni_rows_q4_k(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y);
/* Prefill's integer GEMM over a tile (prefill_gemm.h), in the avx512vnni table. */
void kvp_vnni_gemm_tile(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y, int ldy,
                        bool accumulate);

#endif
