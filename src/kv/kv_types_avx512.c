/*
 * AVX-512 kernels of the KV cache types (see kv_types.h). f16 blocks widen with vcvtph2ps (the
 * 512-bit F16C conversion of AVX-512F), bf16 with a 16-bit shift, q8_0 with vpmovsxbd and a
 * per-group f16 scale, then the f32 FMAs of the f32 kernels: an f16 cache reads half the bytes
 * of f32 for the same arithmetic, which is what long-context decode is bound by. The scores
 * run 16 tokens per zmm (bs = 16 is one register) with four accumulators over the head
 * dimension; the value sums run 16 dimensions per zmm with four accumulators over the tokens.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/types.h"
#include "kv/kv_types.h"

static inline __mmask16 tail_mask(int n)
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* 16 elements of each plain type as f32; masked (lanes outside m read as 0) only when !full, so
 * the usual bs = 16 and head_dim 16k run on plain loads. */
KVP_INLINE __m512 load_f16(const uint16_t *p, __mmask16 m, int full)
{
    return _mm512_cvtph_ps(full ? _mm256_loadu_si256((const __m256i *)p)
                                : _mm256_maskz_loadu_epi16(m, p));
}

KVP_INLINE __m512 load_bf16(const uint16_t *p, __mmask16 m, int full)
{
    __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

KVP_INLINE __m512 load_i8(const int8_t *p, __mmask16 m, int full)
{
    __m128i b = full ? _mm_loadu_si128((const __m128i *)p) : _mm_maskz_loadu_epi8(m, p);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

KVP_INLINE void store16(float *p, __m512 x, __mmask16 m, int full)
{
    if (full)
        _mm512_storeu_ps(p, x);
    else
        _mm512_mask_storeu_ps(p, m, x);
}

/* ---- what the group kernels of kv_types_x86.h are written in --------------------------- */

/* 16 elements from element i of a block of type ty as f32 (q8_0: the int8 codes, unscaled). ty
 * is a constant wherever this is inlined, so the switch folds away. */
KVP_INLINE __m512 load16(int ty, const void *b, size_t i, __mmask16 m, int full)
{
    switch (ty) {
    case KVP_KV_F32:
        return full ? _mm512_loadu_ps((const float *)b + i)
                    : _mm512_maskz_loadu_ps(m, (const float *)b + i);
    case KVP_KV_F16:
        return load_f16((const uint16_t *)b + i, m, full);
    case KVP_KV_BF16:
        return load_bf16((const uint16_t *)b + i, m, full);
    default:
        return load_i8((const int8_t *)b + i, m, full);
    }
}

/* Independent FMA chains per head: S rows (or tokens) in flight, so that G·S >= 8 chains cover
 * the FMA latency (S <= 4). */
#define CHAINS(G) ((G) >= 8 ? 1 : (G) >= 3 ? (8 + (G)-1) / (G) : 4)

/* The vocabulary of kv_types_x86.h: 16 lanes; a chunk is full (plain loads and stores) or
 * masked. */
#define VEC            __m512
#define V_LANES        16
#define V_ZERO()       _mm512_setzero_ps()
#define V_ADD(a, b)    _mm512_add_ps(a, b)
#define V_MUL(a, b)    _mm512_mul_ps(a, b)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_SET1(x)      _mm512_set1_ps(x)
#define V_BCAST(p)     _mm512_set1_ps(*(p))

struct lanes {
    __mmask16 m;
    int full;
};

KVP_INLINE struct lanes lanes_full(void)
{
    return (struct lanes){0, 1};
}

KVP_INLINE struct lanes lanes_tail(int n)
{
    return (struct lanes){tail_mask(n), 0};
}

KVP_INLINE __m512 vload(int ty, const void *b, size_t i, struct lanes l)
{
    return load16(ty, b, i, l.m, l.full);
}

KVP_INLINE void vstore(float *p, __m512 x, struct lanes l)
{
    store16(p, x, l.m, l.full);
}

#include "kv/kv_types_x86.h"

/* ---- f16 and bf16: the same kernels over a 16-lane loader ------------------------------- */

#define PLAIN_KERNELS(T, LOAD)                                                                     \
    KVP_INLINE void scores16_##T(const float *q, const uint16_t *k, int hd, int bs, float scale,   \
                                 float *s, __mmask16 m, int full)                                  \
    {                                                                                              \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                \
        int d = 0;                                                                                 \
        for (; d + 4 <= hd; d += 4) {                                                              \
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), LOAD(k + (size_t)d * bs, m, full), a0);     \
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]),                                         \
                                 LOAD(k + (size_t)(d + 1) * bs, m, full), a1);                     \
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 2]),                                         \
                                 LOAD(k + (size_t)(d + 2) * bs, m, full), a2);                     \
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 3]),                                         \
                                 LOAD(k + (size_t)(d + 3) * bs, m, full), a3);                     \
        }                                                                                          \
        for (; d < hd; d++)                                                                        \
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), LOAD(k + (size_t)d * bs, m, full), a0);     \
        __m512 r = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),      \
                                 _mm512_set1_ps(scale));                                           \
        store16(s, r, m, full);                                                                    \
    }                                                                                              \
    static void scores_##T(const float *q, const void *kt_, int hd, int bs, float scale, float *s) \
    {                                                                                              \
        const uint16_t *kt = kt_;                                                                  \
        int t = 0;                                                                                 \
        for (; t + 16 <= bs; t += 16)                                                              \
            scores16_##T(q, kt + t, hd, bs, scale, s + t, 0, 1);                                   \
        if (t < bs)                                                                                \
            scores16_##T(q, kt + t, hd, bs, scale, s + t, tail_mask(bs - t), 0);                   \
    }                                                                                              \
    KVP_INLINE void accum16_##T(const float *p, const uint16_t *v, int hd, int n, float *out,      \
                                __mmask16 m, int full)                                             \
    {                                                                                              \
        __m512 a0 = full ? _mm512_loadu_ps(out) : _mm512_maskz_loadu_ps(m, out);                   \
        __m512 a1 = _mm512_setzero_ps(), a2 = a1, a3 = a1;                                         \
        int t = 0;                                                                                 \
        for (; t + 4 <= n; t += 4) {                                                               \
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), LOAD(v + (size_t)t * hd, m, full), a0);     \
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(p[t + 1]),                                         \
                                 LOAD(v + (size_t)(t + 1) * hd, m, full), a1);                     \
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(p[t + 2]),                                         \
                                 LOAD(v + (size_t)(t + 2) * hd, m, full), a2);                     \
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(p[t + 3]),                                         \
                                 LOAD(v + (size_t)(t + 3) * hd, m, full), a3);                     \
        }                                                                                          \
        for (; t < n; t++)                                                                         \
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), LOAD(v + (size_t)t * hd, m, full), a0);     \
        store16(out, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), m, full);        \
    }                                                                                              \
    static void accum_##T(const float *p, const void *vb_, int hd, int bs, int n, float *out)      \
    {                                                                                              \
        (void)bs;                                                                                  \
        const uint16_t *vb = vb_;                                                                  \
        int d = 0;                                                                                 \
        for (; d + 16 <= hd; d += 16)                                                              \
            accum16_##T(p, vb + d, hd, n, out + d, 0, 1);                                          \
        if (d < hd)                                                                                \
            accum16_##T(p, vb + d, hd, n, out + d, tail_mask(hd - d), 0);                          \
    }                                                                                              \
    static void k_rows_##T(const void *kt_, int hd, int bs, int n, float *dst, size_t ld)          \
    {                                                                                              \
        const uint16_t *kt = kt_;                                                                  \
        for (int d = 0; d < hd; d++)                                                               \
            for (int t = 0; t < n; t += 16) {                                                      \
                __mmask16 m = tail_mask(n - t);                                                    \
                _mm512_mask_storeu_ps(dst + (size_t)d * ld + t, m,                                 \
                                      LOAD(kt + (size_t)d * bs + t, m, 0));                        \
            }                                                                                      \
    }                                                                                              \
    static void v_rows_##T(const void *vb_, int hd, int bs, int n, float *dst)                     \
    {                                                                                              \
        (void)bs;                                                                                  \
        const uint16_t *vb = vb_;                                                                  \
        size_t total = (size_t)n * hd;                                                             \
        for (size_t i = 0; i < total; i += 16) {                                                   \
            __mmask16 m = tail_mask((int)(total - i < 16 ? total - i : 16));                       \
            _mm512_mask_storeu_ps(dst + i, m, LOAD(vb + i, m, 0));                                 \
        }                                                                                          \
    }

PLAIN_KERNELS(f16, load_f16)
PLAIN_KERNELS(bf16, load_bf16)

/* A value row of f16, converted with the hardware's round-to-nearest-even (the same bits as the
 * scalar kvp_f32_to_f16 for finite values); the other stores are kv_types_x86.h's. */
static void put_v_f16(const float *v, void *vb_, int hd, int bs, int t)
{
    (void)bs;
    uint16_t *vb = (uint16_t *)vb_ + (size_t)t * hd;
    for (int d = 0; d < hd; d += 16) {
        __mmask16 m = tail_mask(hd - d);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, v + d), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(vb + d, m, h);
    }
}

/* ---- q8_0 ------------------------------------------------------------------------------------ */

/* Scores: per group of 32 dimensions the int8 products are summed in f32, then scaled by the
 * group's per-token scale (16 tokens of f16 scales per zmm). */
static void scores_q8_0(const float *q, const void *kt_, int hd, int bs, float scale, float *s)
{
    const int8_t *kt = kt_;
    const uint16_t *sc = (const uint16_t *)((const uint8_t *)kt_ + (size_t)hd * bs);
    for (int t = 0; t < bs; t += 16) {
        __mmask16 m = tail_mask(bs - t);
        int full = bs - t >= 16;
        __m512 acc = _mm512_setzero_ps();
        for (int g = 0, d0 = 0; d0 < hd; g++, d0 += KVP_KV_Q8_GROUP) {
            int d1 = d0 + KVP_KV_Q8_GROUP < hd ? d0 + KVP_KV_Q8_GROUP : hd;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0;
            int d = d0;
            for (; d + 2 <= d1; d += 2) {
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]),
                                     load_i8(kt + (size_t)d * bs + t, m, full), a0);
                a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]),
                                     load_i8(kt + (size_t)(d + 1) * bs + t, m, full), a1);
            }
            if (d < d1)
                a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]),
                                     load_i8(kt + (size_t)d * bs + t, m, full), a0);
            acc = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), load_f16(sc + (size_t)g * bs + t, m, full),
                                  acc);
        }
        _mm512_mask_storeu_ps(s + t, m, _mm512_mul_ps(acc, _mm512_set1_ps(scale)));
    }
}

/* Value sums: each token's weight is folded into its group scales first (w = p[t]·d[t][g]). */
static void accum_q8_0(const float *p, const void *vb_, int hd, int bs, int n, float *out)
{
    const int8_t *vb = vb_;
    const int ng = kvp_kv_groups(hd);
    const uint16_t *sc = (const uint16_t *)((const uint8_t *)vb_ + (size_t)bs * hd);
    for (int d = 0; d < hd; d += 16) {
        __mmask16 m = tail_mask(hd - d);
        int full = hd - d >= 16;
        int g = d / KVP_KV_Q8_GROUP;
        __m512 a0 = _mm512_maskz_loadu_ps(m, out + d), a1 = _mm512_setzero_ps();
        int t = 0;
        for (; t + 2 <= n; t += 2) {
            float w0 = p[t] * f16_at(sc, (size_t)t * ng + g);
            float w1 = p[t + 1] * f16_at(sc, (size_t)(t + 1) * ng + g);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(w0), load_i8(vb + (size_t)t * hd + d, m, full), a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(w1),
                                 load_i8(vb + (size_t)(t + 1) * hd + d, m, full), a1);
        }
        if (t < n) {
            float w0 = p[t] * f16_at(sc, (size_t)t * ng + g);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(w0), load_i8(vb + (size_t)t * hd + d, m, full), a0);
        }
        _mm512_mask_storeu_ps(out + d, m, _mm512_add_ps(a0, a1));
    }
}

static void k_rows_q8_0(const void *kt_, int hd, int bs, int n, float *dst, size_t ld)
{
    const int8_t *kt = kt_;
    const uint16_t *sc = (const uint16_t *)((const uint8_t *)kt_ + (size_t)hd * bs);
    for (int d = 0; d < hd; d++)
        for (int t = 0; t < n; t += 16) {
            __mmask16 m = tail_mask(n - t);
            __m512 x = _mm512_mul_ps(load_i8(kt + (size_t)d * bs + t, m, 0),
                                     load_f16(sc + (size_t)(d / KVP_KV_Q8_GROUP) * bs + t, m, 0));
            _mm512_mask_storeu_ps(dst + (size_t)d * ld + t, m, x);
        }
}

static void v_rows_q8_0(const void *vb_, int hd, int bs, int n, float *dst)
{
    const int8_t *vb = vb_;
    const int ng = kvp_kv_groups(hd);
    const uint16_t *sc = (const uint16_t *)((const uint8_t *)vb_ + (size_t)bs * hd);
    for (int t = 0; t < n; t++)
        for (int d = 0; d < hd; d += 16) {
            __mmask16 m = tail_mask(hd - d);
            float w = f16_at(sc, (size_t)t * ng + d / KVP_KV_Q8_GROUP);
            _mm512_mask_storeu_ps(
                dst + (size_t)t * hd + d, m,
                _mm512_mul_ps(load_i8(vb + (size_t)t * hd + d, m, 0), _mm512_set1_ps(w)));
        }
}

/* ---- group kernels: g query heads per pass over a block (kv_types_x86.h) ---------------- */

GROUP_KERNELS(f32, KVP_KV_F32)
GROUP_KERNELS(f16, KVP_KV_F16)
GROUP_KERNELS(bf16, KVP_KV_BF16)
GROUP_KERNELS(q8_0, KVP_KV_Q8_0)

void kvp_kv_scores_g_f32_avx512(const float *q, int g, const void *kt, int hd, int bs, float scale,
                                float *scores, size_t ss)
{
    scores_g_f32(q, g, kt, hd, bs, scale, scores, ss);
}

void kvp_kv_accum_g_f32_avx512(const float *p, size_t ps, int g, const void *vb, int hd, int bs,
                               int n, float *out, size_t os)
{
    accum_g_f32(p, ps, g, vb, hd, bs, n, out, os);
}

const struct kvp_kv_kernels kvp_kv_avx512_tab[KVP_KV_COUNT] = {
    [KVP_KV_F16] = {"avx512", scores_f16, accum_f16, scores_g_f16, accum_g_f16, k_rows_f16,
                    v_rows_f16, put_k_f16, put_v_f16},
    [KVP_KV_BF16] = {"avx512", scores_bf16, accum_bf16, scores_g_bf16, accum_g_bf16, k_rows_bf16,
                     v_rows_bf16, put_k_bf16, put_v_bf16},
    [KVP_KV_Q8_0] = {"avx512", scores_q8_0, accum_q8_0, scores_g_q8_0, accum_g_q8_0, k_rows_q8_0,
                     v_rows_q8_0, kvp_kv_put_k_q8_0, kvp_kv_put_v_q8_0},
};
