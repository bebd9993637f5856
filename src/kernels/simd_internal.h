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

#endif
