/*
 * Private to the kernel layer: the kvp_simd_ops tables, one per instruction set, each defined in
 * its own translation unit (simd_scalar.c, simd_avx2.c, simd_avx512.c, simd_neon.c) so that the
 * build can give each file its own -m flags. Only simd.c decides which one may run: the AVX
 * tables exist on every x86-64 build but must not be called unless kvp_cpu_features() says so.
 */
#ifndef KVP_KERNELS_SIMD_INTERNAL_H
#define KVP_KERNELS_SIMD_INTERNAL_H

#include "kernels/simd.h"
#include "kernels/types.h"

extern const struct kvp_simd_ops kvp_simd_ops_scalar;
extern const struct kvp_simd_ops kvp_simd_ops_avx2;
extern const struct kvp_simd_ops kvp_simd_ops_avx512;
extern const struct kvp_simd_ops kvp_simd_ops_avx512vnni; /* AVX-512 plus the VNNI row kernels */
extern const struct kvp_simd_ops kvp_simd_ops_neon;       /* aarch64 builds only (simd_neon.c) */

/* Scalar kernels (simd_scalar.c) that the NEON table shares where it has no kernel of its own:
 * the types and operations off the decode's hot path. */
float kvp_scalar_dot_bf16(const uint16_t *w, const float *x, int64_t n);
void kvp_scalar_rows_bf16(const void *w, size_t row_bytes, const float *x, int64_t n, int64_t nrows,
                          float *y);
float kvp_scalar_exp_sum(float *x, int64_t n, float max);
float kvp_scalar_dot_q4_1(const void *w, const void *xq, int64_t n);
float kvp_scalar_dot_q5_0(const void *w, const void *xq, int64_t n);
float kvp_scalar_dot_q5_1(const void *w, const void *xq, int64_t n);
float kvp_scalar_dot_iq4_nl(const void *w, const void *xq, int64_t n);
float kvp_scalar_dot_q2_k(const void *w, const void *xq, int64_t n);
float kvp_scalar_dot_q3_k(const void *w, const void *xq, int64_t n);
float kvp_scalar_dot_q5_k(const void *w, const void *xq, int64_t n);

/* Prefill's integer GEMM over a K-quant tile, the oracle's loops (simd_scalar.c). */
void kvp_scalar_gemm_tile_k(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y,
                            int ldy, bool accumulate);
/* The AVX2 one (simd_avx2.c) and the AVX-512 VNNI one (simd_vnni_avx512.c). */
void kvp_avx2_gemm_tile_k(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y,
                          int ldy, bool accumulate);
void kvp_vnni_gemm_tile_k(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y,
                          int ldy, bool accumulate);

/* AVX-512 VNNI row kernels (simd_vnni_avx512.c): the avx512vnni table, which simd.c hands out only
 * when the CPU has VNNI. */
void kvp_vnni_rows_q8_0_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                              int64_t n, int64_t nrows, float *const *y);
void kvp_vnni_rows_q4_0_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                              int64_t n, int64_t nrows, float *const *y);
void kvp_vnni_rows_q5_0_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                              int64_t n, int64_t nrows, float *const *y);
void kvp_vnni_rows_q4_k_multi(const void *w, size_t row_bytes, const void *const *xq, int nv,
                              int64_t n, int64_t nrows, float *const *y);
void kvp_vnni_gemm_convert_q8_0(const void *w, size_t row_bytes, int64_t rows, int64_t nb,
                                int8_t *codes, float *dw, int32_t *corr);
void kvp_vnni_rows_q8_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y);
void kvp_vnni_rows_q4_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y);
void kvp_vnni_rows_q5_0(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y);
void kvp_vnni_rows_q4_k(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                        float *y);
/* Weight rows in the lanes (simd_lanes_vnni_avx512.c): the avx512vnni table's lanes_pack and
 * lanes_rows. A packed matrix is a run of tiles of 16 rows; a tile holds its 32-element blocks'
 * codes (Q8_0: 512 bytes a block; the 4- and 5-bit types: 256 bytes of nibble pairs), for Q5_0
 * their fifth bits (64 bytes a block), then their scales (the 16 rows' f16 scales, 32 bytes a
 * block; Q4_K: 6-bit scales and mins, 32 bytes a block, and f16 d and dmin, 64 bytes a
 * super-block). So a packed matrix is the file's size (Q4_K: + 1/36) plus the padding of the last
 * tile. Bytes of one tile of n columns (rounded up to 64, so every tile starts a cache line): */
static inline size_t kvp_lanes_tile_bytes(int type, int64_t n)
{
    const size_t nb = (size_t)(n / 32);
    if (n <= 0 || nb > SIZE_MAX / 1024)
        return 0;
    size_t b;
    switch (type) {
    case KVP_TYPE_Q8_0: b = nb * (512 + 32); break;
    case KVP_TYPE_Q4_0: b = nb * (256 + 32); break;
    case KVP_TYPE_Q5_0: b = nb * (256 + 64 + 32); break;
    case KVP_TYPE_Q4_K: b = nb * (256 + 32) + nb / 8 * 64; break;
    default: return 0;
    }
    return (b + 63) / 64 * 64;
}

void kvp_lanes_rows_q8_0_pack(const void *w, size_t row_bytes, int64_t n, int64_t nrows,
                              int64_t t0, int64_t t1, void *dst);
void kvp_lanes_rows_q8_0(const void *packed, int64_t n, const void *const *xq, int nv, int64_t r0,
                         int64_t r1, float *const *y, bool accumulate);
void kvp_lanes_rows_q4_0_pack(const void *w, size_t row_bytes, int64_t n, int64_t nrows,
                              int64_t t0, int64_t t1, void *dst);
void kvp_lanes_rows_q4_0(const void *packed, int64_t n, const void *const *xq, int nv, int64_t r0,
                         int64_t r1, float *const *y, bool accumulate);
void kvp_lanes_rows_q5_0_pack(const void *w, size_t row_bytes, int64_t n, int64_t nrows,
                              int64_t t0, int64_t t1, void *dst);
void kvp_lanes_rows_q5_0(const void *packed, int64_t n, const void *const *xq, int nv, int64_t r0,
                         int64_t r1, float *const *y, bool accumulate);
void kvp_lanes_rows_q4_k_pack(const void *w, size_t row_bytes, int64_t n, int64_t nrows,
                              int64_t t0, int64_t t1, void *dst);
void kvp_lanes_rows_q4_k(const void *packed, int64_t n, const void *const *xq, int nv, int64_t r0,
                         int64_t r1, float *const *y, bool accumulate);
/* Prefill's integer GEMM over a tile (prefill_gemm.h), in the avx512vnni table. */
void kvp_vnni_gemm_tile(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y, int ldy,
                        bool accumulate);

#endif
