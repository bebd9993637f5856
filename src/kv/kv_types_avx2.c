/*
 * AVX2 kernels of the KV cache types (see kv_types.h), for CPUs without AVX-512: f16 widens with
 * F16C's vcvtph2ps, bf16 with a 16-bit shift, q8_0 with vpmovsxbd and its per-group f16 scales,
 * f32 reads as is, 8 lanes per ymm. One set of group kernels (g query heads per pass, each row
 * loaded and widened once; written once for both widths in kv_types_x86.h) also serves as the
 * per-head kernels (g = 1). Tails (bs or head_dim not a multiple of 8) go through a zero-padded
 * copy, since AVX2 has no masked 16- or 8-bit loads.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/types.h"
#include "kv/kv_types.h"

static size_t elem_bytes(int ty)
{
    return ty == KVP_KV_F32 ? 4 : ty == KVP_KV_Q8_0 ? 1 : 2;
}

/* 8 elements of a block of type ty from element i as f32 (q8_0: the int8 codes, unscaled);
 * only the first n are read when n < 8, the others are 0. ty is a constant wherever this is
 * inlined. */
KVP_INLINE __m256 load8(int ty, const void *b, size_t i, int n)
{
    const uint8_t *p = (const uint8_t *)b + i * elem_bytes(ty);
    uint8_t tmp[32] = {0};
    if (n < 8) {
        memcpy(tmp, p, (size_t)n * elem_bytes(ty));
        p = tmp;
    }
    switch (ty) {
    case KVP_KV_F32:
        return _mm256_loadu_ps((const float *)p);
    case KVP_KV_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    case KVP_KV_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    default:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    }
}

/* The first n (<= 8) floats of x to p. */
KVP_INLINE void store8(float *p, __m256 x, int n)
{
    if (n >= 8) {
        _mm256_storeu_ps(p, x);
        return;
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, x);
    memcpy(p, tmp, (size_t)n * sizeof(float));
}

/* 8 f16 scales from p (the first n, the others 0). */
KVP_INLINE __m256 load8_f16(const uint16_t *p, int n)
{
    return load8(KVP_KV_F16, p, 0, n);
}

/* The vocabulary of kv_types_x86.h: 8 lanes; a chunk's live lanes are its first n. */
#define VEC            __m256
#define V_LANES        8
#define V_ZERO()       _mm256_setzero_ps()
#define V_ADD(a, b)    _mm256_add_ps(a, b)
#define V_MUL(a, b)    _mm256_mul_ps(a, b)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_SET1(x)      _mm256_set1_ps(x)
#define V_BCAST(p)     _mm256_broadcast_ss(p)

struct lanes {
    int n;
};

KVP_INLINE struct lanes lanes_full(void)
{
    return (struct lanes){8};
}

KVP_INLINE struct lanes lanes_tail(int n)
{
    return (struct lanes){n};
}

KVP_INLINE __m256 vload(int ty, const void *b, size_t i, struct lanes l)
{
    return load8(ty, b, i, l.n);
}

KVP_INLINE void vstore(float *p, __m256 x, struct lanes l)
{
    store8(p, x, l.n);
}

/* Independent FMA chains per head (G·S about 6: sixteen ymm registers hold them, the group
 * sums and the row being widened). */
#define CHAINS(G) ((G) >= 6 ? 1 : (G) >= 3 ? 2 : (G) == 2 ? 3 : 4)

#include "kv/kv_types_x86.h"

/* The per-head kernels (the group ones with G = 1) and the block conversions of prefill. */
#define HEAD_AND_ROW_KERNELS(T, TYPE)                                                              \
    static void scores_##T(const float *q, const void *kt, int hd, int bs, float scale, float *s)  \
    {                                                                                              \
        scores_g1_##T(q, kt, hd, bs, scale, s, 0);                                                 \
    }                                                                                              \
    static void accum_##T(const float *p, const void *vb, int hd, int bs, int n, float *out)       \
    {                                                                                              \
        accum_g1_##T(p, 0, vb, hd, bs, n, out, 0);                                                 \
    }                                                                                              \
    static void k_rows_##T(const void *kt, int hd, int bs, int n, float *dst, size_t ld)           \
    {                                                                                              \
        const uint16_t *sc = (const uint16_t *)((const uint8_t *)kt + (size_t)hd * bs);            \
        for (int d = 0; d < hd; d++)                                                               \
            for (int t = 0; t < n; t += 8) {                                                       \
                int m = n - t < 8 ? n - t : 8;                                                     \
                __m256 x = load8(TYPE, kt, (size_t)d * bs + t, m);                                 \
                if (TYPE == KVP_KV_Q8_0)                                                           \
                    x = _mm256_mul_ps(x,                                                           \
                                      load8_f16(sc + (size_t)(d / KVP_KV_Q8_GROUP) * bs + t, m));  \
                store8(dst + (size_t)d * ld + t, x, m);                                            \
            }                                                                                      \
    }                                                                                              \
    static void v_rows_##T(const void *vb, int hd, int bs, int n, float *dst)                      \
    {                                                                                              \
        const int ng = kvp_kv_groups(hd);                                                          \
        const uint16_t *sc = (const uint16_t *)((const uint8_t *)vb + (size_t)bs * hd);            \
        for (int t = 0; t < n; t++)                                                                \
            for (int d = 0; d < hd; d += 8) {                                                      \
                int m = hd - d < 8 ? hd - d : 8;                                                   \
                __m256 x = load8(TYPE, vb, (size_t)t * hd + d, m);                                 \
                if (TYPE == KVP_KV_Q8_0)                                                           \
                    x = _mm256_mul_ps(                                                             \
                        x, _mm256_set1_ps(f16_at(sc, (size_t)t * ng + d / KVP_KV_Q8_GROUP)));      \
                store8(dst + (size_t)t * hd + d, x, m);                                            \
            }                                                                                      \
    }

GROUP_KERNELS(f32, KVP_KV_F32)
GROUP_KERNELS(f16, KVP_KV_F16)
GROUP_KERNELS(bf16, KVP_KV_BF16)
GROUP_KERNELS(q8_0, KVP_KV_Q8_0)
HEAD_AND_ROW_KERNELS(f32, KVP_KV_F32)
HEAD_AND_ROW_KERNELS(f16, KVP_KV_F16)
HEAD_AND_ROW_KERNELS(bf16, KVP_KV_BF16)
HEAD_AND_ROW_KERNELS(q8_0, KVP_KV_Q8_0)

/* Stores (the others are kv_types_x86.h's): one token per decode step, off the hot path; the
 * conversions round to nearest even like the scalar ones (the same bytes). */
static void put_k_f32(const float *k, void *kt, int hd, int bs, int t)
{
    for (int d = 0; d < hd; d++)
        memcpy((float *)kt + (size_t)d * bs + t, &k[d], sizeof(float));
}

static void put_v_f32(const float *v, void *vb, int hd, int bs, int t)
{
    (void)bs;
    memcpy((float *)vb + (size_t)t * hd, v, (size_t)hd * sizeof(float));
}

static void put_v_f16(const float *v, void *vb_, int hd, int bs, int t)
{
    (void)bs;
    uint16_t *vb = (uint16_t *)vb_ + (size_t)t * hd;
    int d = 0;
    for (; d + 8 <= hd; d += 8)
        _mm_storeu_si128((__m128i *)(vb + d),
                         _mm256_cvtps_ph(_mm256_loadu_ps(v + d), _MM_FROUND_TO_NEAREST_INT));
    for (; d < hd; d++)
        vb[d] = _cvtss_sh(v[d], _MM_FROUND_TO_NEAREST_INT);
}

#define ROW(T, PUT_K, PUT_V)                                                                       \
    {                                                                                              \
        "avx2", scores_##T, accum_##T, scores_g_##T, accum_g_##T, k_rows_##T, v_rows_##T, PUT_K,   \
            PUT_V                                                                                  \
    }

const struct kvp_kv_kernels kvp_kv_avx2_tab[KVP_KV_COUNT] = {
    [KVP_KV_F32] = ROW(f32, put_k_f32, put_v_f32),
    [KVP_KV_F16] = ROW(f16, put_k_f16, put_v_f16),
    [KVP_KV_BF16] = ROW(bf16, put_k_bf16, put_v_bf16),
    [KVP_KV_Q8_0] = ROW(q8_0, kvp_kv_put_k_q8_0, kvp_kv_put_v_q8_0),
};
