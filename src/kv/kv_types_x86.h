/*
 * What the x86 kernels of the KV types share, written once for both vector widths:
 * kv_types_avx512.c (16 lanes, masked tails) and kv_types_avx2.c (8 lanes, tails through a
 * zero-padded copy) include it, each compiled with its own target flags, after defining:
 *
 *   VEC, V_LANES        the f32 vector type and its lane count
 *   V_ZERO() V_ADD(a, b) V_MUL(a, b) V_FMA(a, b, c) V_SET1(x) V_BCAST(p)   (V_BCAST: *p in
 *                       every lane)
 *   struct lanes        which lanes of a chunk are live; lanes_full(), lanes_tail(n) (n < V_LANES)
 *   vload(ty, b, i, l)  V_LANES elements of a block of type ty from element i as f32 (q8_0: the
 *                       int8 codes, unscaled); lanes outside l read as 0
 *   vstore(p, x, l)     the live lanes of x to p
 *   CHAINS(G)           independent FMA chains per head (at most 4)
 *
 * and gets the group kernels (g query heads per pass over a block, each row loaded and widened
 * once for all g) through GROUP_KERNELS(T, TYPE), plus the scalar stores the two share. ty and G
 * are constants wherever the inline bodies are expanded, so every (type, G) compiles to its own
 * straight-line kernel with the accumulators in registers.
 */
#ifndef KVP_KV_KV_TYPES_X86_H
#define KVP_KV_KV_TYPES_X86_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/types.h"
#include "kv/kv_types.h"

/* The f16 at element i of p as f32; q8_0 scale arrays may be odd-aligned (a block of odd
 * head_dim x bs), so read through memcpy. */
KVP_INLINE float f16_at(const uint16_t *p, size_t i)
{
    uint16_t h;
    memcpy(&h, (const uint8_t *)p + 2 * i, 2);
    return _cvtsh_ss(h);
}

/* Scores of G heads for the tokens [t, t + V_LANES) live in l: each key row is loaded and
 * widened once and feeds G FMAs. q8_0 sums a group's int8 rows per head, then scales the sum by
 * the group's per-token scales. */
KVP_INLINE void scores_gv(int ty, int G, const float *q, const void *kt, int hd, int bs, int t,
                          struct lanes l, float scale, float *s, size_t ss)
{
    const int S = CHAINS(G), span = ty == KVP_KV_Q8_0 ? KVP_KV_Q8_GROUP : hd;
    const uint16_t *sc = (const uint16_t *)((const uint8_t *)kt + (size_t)hd * bs);
    VEC tot[KVP_KV_GROUP_MAX], part[4][KVP_KV_GROUP_MAX];
#pragma GCC unroll 8
    for (int j = 0; j < G; j++)
        tot[j] = V_ZERO();
    for (int d0 = 0; d0 < hd; d0 += span) {
        int d1 = d0 + span < hd ? d0 + span : hd, d = d0;
#pragma GCC unroll 4
        for (int u = 0; u < S; u++)
#pragma GCC unroll 8
            for (int j = 0; j < G; j++)
                part[u][j] = V_ZERO();
        for (; d + S <= d1; d += S)
#pragma GCC unroll 4
            for (int u = 0; u < S; u++) {
                VEC k = vload(ty, kt, (size_t)(d + u) * bs + t, l);
#pragma GCC unroll 8
                for (int j = 0; j < G; j++)
                    part[u][j] = V_FMA(V_BCAST(q + (size_t)j * hd + d + u), k, part[u][j]);
            }
        for (; d < d1; d++) {
            VEC k = vload(ty, kt, (size_t)d * bs + t, l);
#pragma GCC unroll 8
            for (int j = 0; j < G; j++)
                part[0][j] = V_FMA(V_BCAST(q + (size_t)j * hd + d), k, part[0][j]);
        }
        VEC ksc = ty == KVP_KV_Q8_0 ? vload(KVP_KV_F16, sc + (size_t)(d0 / span) * bs + t, 0, l)
                                    : V_ZERO();
#pragma GCC unroll 8
        for (int j = 0; j < G; j++) {
            VEC x = part[0][j];
#pragma GCC unroll 4
            for (int u = 1; u < S; u++)
                x = V_ADD(x, part[u][j]);
            tot[j] = ty == KVP_KV_Q8_0 ? V_FMA(x, ksc, tot[j]) : x;
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < G; j++)
        vstore(s + (size_t)j * ss + t, V_MUL(tot[j], V_SET1(scale)), l);
}

/* Value sums of G heads for the dimensions [d, d + V_LANES) live in l: each value row is loaded
 * and widened once (q8_0: and scaled by its token's group scale) and feeds G FMAs. */
KVP_INLINE void accum_gv(int ty, int G, const float *p, size_t ps, const void *vb, int hd, int bs,
                         int n, int d, struct lanes l, float *out, size_t os)
{
    const int S = CHAINS(G), ng = kvp_kv_groups(hd), grp = d / KVP_KV_Q8_GROUP;
    const uint16_t *sc = (const uint16_t *)((const uint8_t *)vb + (size_t)bs * hd);
    VEC acc[4][KVP_KV_GROUP_MAX];
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) {
        acc[0][j] = vload(KVP_KV_F32, out + (size_t)j * os + d, 0, l);
#pragma GCC unroll 4
        for (int u = 1; u < S; u++)
            acc[u][j] = V_ZERO();
    }
    int t = 0;
    for (; t + S <= n; t += S)
#pragma GCC unroll 4
        for (int u = 0; u < S; u++) {
            VEC v = vload(ty, vb, (size_t)(t + u) * hd + d, l);
            if (ty == KVP_KV_Q8_0)
                v = V_MUL(v, V_SET1(f16_at(sc, (size_t)(t + u) * ng + grp)));
#pragma GCC unroll 8
            for (int j = 0; j < G; j++)
                acc[u][j] = V_FMA(V_BCAST(p + (size_t)j * ps + t + u), v, acc[u][j]);
        }
    for (; t < n; t++) {
        VEC v = vload(ty, vb, (size_t)t * hd + d, l);
        if (ty == KVP_KV_Q8_0)
            v = V_MUL(v, V_SET1(f16_at(sc, (size_t)t * ng + grp)));
#pragma GCC unroll 8
        for (int j = 0; j < G; j++)
            acc[0][j] = V_FMA(V_BCAST(p + (size_t)j * ps + t), v, acc[0][j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) {
        VEC x = acc[0][j];
#pragma GCC unroll 4
        for (int u = 1; u < S; u++)
            x = V_ADD(x, acc[u][j]);
        vstore(out + (size_t)j * os + d, x, l);
    }
}

/* One function per (type, G): full chunks of V_LANES, then the tail. */
#define GROUP_KERNELS_G(T, TYPE, G)                                                                \
    static void scores_g##G##_##T(const float *q, const void *kt, int hd, int bs, float scale,     \
                                  float *s, size_t ss)                                             \
    {                                                                                              \
        int t = 0;                                                                                 \
        for (; t + V_LANES <= bs; t += V_LANES)                                                    \
            scores_gv(TYPE, G, q, kt, hd, bs, t, lanes_full(), scale, s, ss);                      \
        if (t < bs)                                                                                \
            scores_gv(TYPE, G, q, kt, hd, bs, t, lanes_tail(bs - t), scale, s, ss);                \
    }                                                                                              \
    static void accum_g##G##_##T(const float *p, size_t ps, const void *vb, int hd, int bs, int n, \
                                 float *out, size_t os)                                            \
    {                                                                                              \
        int d = 0;                                                                                 \
        for (; d + V_LANES <= hd; d += V_LANES)                                                    \
            accum_gv(TYPE, G, p, ps, vb, hd, bs, n, d, lanes_full(), out, os);                     \
        if (d < hd)                                                                                \
            accum_gv(TYPE, G, p, ps, vb, hd, bs, n, d, lanes_tail(hd - d), out, os);               \
    }

/* G = 1..8, and the scores_g_<T> / accum_g_<T> entries of struct kvp_kv_kernels that pick one
 * by g. */
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

/* Stores of one token, off the hot path: the conversions round to nearest even like the scalar
 * ones (the same bits). A value row of f16 is converted a vector at a time by each file. */
static void put_k_f16(const float *k, void *kt_, int hd, int bs, int t)
{
    uint16_t *kt = kt_;
    for (int d = 0; d < hd; d++)
        kt[(size_t)d * bs + t] = _cvtss_sh(k[d], _MM_FROUND_TO_NEAREST_INT);
}

static void put_k_bf16(const float *k, void *kt_, int hd, int bs, int t)
{
    uint16_t *kt = kt_;
    for (int d = 0; d < hd; d++)
        kt[(size_t)d * bs + t] = kvp_f32_to_bf16(k[d]);
}

static void put_v_bf16(const float *v, void *vb_, int hd, int bs, int t)
{
    (void)bs;
    uint16_t *vb = (uint16_t *)vb_ + (size_t)t * hd;
    for (int d = 0; d < hd; d++)
        vb[d] = kvp_f32_to_bf16(v[d]);
}

#endif
