/*
 * The dispatch shared by the SIMD group kernels of the KV types (kv_types_avx512.c,
 * kv_types_avx2.c): a file defines GROUP_KERNELS_G(T, TYPE, G), which writes scores_g<G>_<T> and
 * accum_g<G>_<T> for a compile-time number of heads G (so the accumulators stay in registers),
 * then GROUP_KERNELS(T, TYPE) instantiates G = 1..8 and the scores_g_<T> / accum_g_<T> entries
 * of struct kvp_kv_kernels that pick one by g.
 */
#ifndef KVP_KV_KV_GROUP_DISPATCH_H
#define KVP_KV_KV_GROUP_DISPATCH_H

#include <stddef.h>

#define GROUP_KERNELS(T, TYPE)                                                                     \
    GROUP_KERNELS_G(T, TYPE, 1)                                                                    \
    GROUP_KERNELS_G(T, TYPE, 2)                                                                    \
    GROUP_KERNELS_G(T, TYPE, 3)                                                                    \
    GROUP_KERNELS_G(T, TYPE, 4)                                                                    \
    GROUP_KERNELS_G(T, TYPE, 5)                                                                    \
    GROUP_KERNELS_G(T, TYPE, 6)                                                                    \
    GROUP_KERNELS_G(T, TYPE, 7)                                                                    \
    GROUP_KERNELS_G(T, TYPE, 8)                                                                    \
    static void (*const scores_g_tab_##T[])(const float *, const void *, int, int, float, float *, \
                                            size_t) = {                                            \
        scores_g1_##T, scores_g2_##T, scores_g3_##T, scores_g4_##T,                                \
        scores_g5_##T, scores_g6_##T, scores_g7_##T, scores_g8_##T};                               \
    static void (*const accum_g_tab_##T[])(const float *, size_t, const void *, int, int, int,     \
                                           float *, size_t) = {                                    \
        accum_g1_##T, accum_g2_##T, accum_g3_##T, accum_g4_##T,                                    \
        accum_g5_##T, accum_g6_##T, accum_g7_##T, accum_g8_##T};                                   \
    static void scores_g_##T(const float *q, int g, const void *kt, int hd, int bs, float scale,   \
                             float *s, size_t ss)                                                  \
    {                                                                                              \
        scores_g_tab_##T[g - 1](q, kt, hd, bs, scale, s, ss);                                      \
    }                                                                                              \
    static void accum_g_##T(const float *p, size_t ps, int g, const void *vb, int hd, int bs,      \
                            int n, float *out, size_t os)                                          \
    {                                                                                              \
        accum_g_tab_##T[g - 1](p, ps, vb, hd, bs, n, out, os);                                     \
    }

#endif
