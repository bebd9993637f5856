/* KV cache element types: block sizes, the scalar kernels (the oracle) and the dispatch (see
 * kv_types.h). */
#include "kv/kv_types.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/simd.h"
#include "kernels/types.h"

static const char *const type_names[KVP_KV_COUNT] = {"f16", "f32", "f16", "bf16", "q8_0"};

const char *kvp_kv_type_name(int type)
{
    return type >= 0 && type < KVP_KV_COUNT ? type_names[type] : "?";
}

int kvp_kv_type_parse(const char *name)
{
    char low[8];
    size_t n = strlen(name);
    if (n >= sizeof(low))
        return -1;
    for (size_t i = 0; i <= n; i++)
        low[i] = (char)tolower((unsigned char)name[i]);
    for (int t = KVP_KV_F32; t < KVP_KV_COUNT; t++)
        if (!strcmp(low, type_names[t]))
            return t;
    return -1;
}

size_t kvp_kv_block_bytes(int type, int hd, int bs)
{
    size_t n = (size_t)hd * bs, bytes;
    switch (type) {
    case KVP_KV_F32:
        bytes = 4 * n;
        break;
    case KVP_KV_Q8_0:
        bytes = n + 2 * (size_t)kvp_kv_groups(hd) * bs;
        break;
    default: /* f16, bf16 */
        bytes = 2 * n;
        break;
    }
    return (bytes + 63) & ~(size_t)63;
}

/* ---- element access ------------------------------------------------------------------------ */

static inline uint16_t u16_at(const void *p, size_t i)
{
    uint16_t h;
    memcpy(&h, (const uint8_t *)p + 2 * i, 2);
    return h;
}

static inline void u16_put(void *p, size_t i, uint16_t h)
{
    memcpy((uint8_t *)p + 2 * i, &h, 2);
}

/* Element i of a plain (f32, f16, bf16) block. */
static inline float plain_at(int type, const void *b, size_t i)
{
    if (type == KVP_KV_F32) {
        float f;
        memcpy(&f, (const uint8_t *)b + 4 * i, 4);
        return f;
    }
    return type == KVP_KV_F16 ? kvp_f16_to_f32(u16_at(b, i)) : kvp_bf16_to_f32(u16_at(b, i));
}

static inline void plain_put(int type, void *b, size_t i, float x)
{
    if (type == KVP_KV_F32)
        memcpy((uint8_t *)b + 4 * i, &x, 4);
    else
        u16_put(b, i, type == KVP_KV_F16 ? kvp_f32_to_f16(x) : kvp_f32_to_bf16(x));
}

/* q8_0 scale of group g of token t: keys [g][bs] after the int8 [hd][bs] */
static inline float q8_kscale(const void *kt, int hd, int bs, int g, int t)
{
    return kvp_f16_to_f32(u16_at((const uint8_t *)kt + (size_t)hd * bs, (size_t)g * bs + t));
}

/* values [bs][groups] after the int8 [bs][hd] */
static inline float q8_vscale(const void *vb, int hd, int bs, int t, int g)
{
    return kvp_f16_to_f32(
        u16_at((const uint8_t *)vb + (size_t)bs * hd, (size_t)t * kvp_kv_groups(hd) + g));
}

float kvp_kv_key_at(int type, const void *kt, int hd, int bs, int d, int t)
{
    size_t i = (size_t)d * bs + t;
    if (type != KVP_KV_Q8_0)
        return plain_at(type, kt, i);
    return (float)((const int8_t *)kt)[i] * q8_kscale(kt, hd, bs, d / KVP_KV_Q8_GROUP, t);
}

float kvp_kv_value_at(int type, const void *vb, int hd, int bs, int t, int d)
{
    size_t i = (size_t)t * hd + d;
    if (type != KVP_KV_Q8_0)
        return plain_at(type, vb, i);
    return (float)((const int8_t *)vb)[i] * q8_vscale(vb, hd, bs, t, d / KVP_KV_Q8_GROUP);
}

/* Quantize x[0..n) (one group) to int8 with stride `step` at q; returns the f16 scale. */
static uint16_t q8_group(const float *x, int n, int8_t *q, size_t step)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < n; i++)
        q[(size_t)i * step] = (int8_t)roundf(x[i] * id);
    return kvp_f32_to_f16(d);
}

/* Bytes of one element of the type (q8_0: the int8 code; its scales are copied separately). */
static size_t elem_bytes(int type)
{
    return type == KVP_KV_F32 ? 4 : type == KVP_KV_Q8_0 ? 1 : 2;
}

void kvp_kv_copy_key(int type, int hd, int bs, const void *src, int tf, void *dst, int tt)
{
    const size_t es = elem_bytes(type);
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (int i = 0; i < hd; i++)
        memcpy(d + ((size_t)i * bs + tt) * es, s + ((size_t)i * bs + tf) * es, es);
    if (type != KVP_KV_Q8_0)
        return;
    for (int g = 0; g < kvp_kv_groups(hd); g++)
        memcpy(d + (size_t)hd * bs + 2 * ((size_t)g * bs + tt),
               s + (size_t)hd * bs + 2 * ((size_t)g * bs + tf), 2);
}

void kvp_kv_copy_value(int type, int hd, int bs, const void *src, int tf, void *dst, int tt)
{
    const size_t row = (size_t)hd * elem_bytes(type);
    memcpy((uint8_t *)dst + (size_t)tt * row, (const uint8_t *)src + (size_t)tf * row, row);
    if (type != KVP_KV_Q8_0)
        return;
    const size_t srow = 2 * (size_t)kvp_kv_groups(hd);
    memcpy((uint8_t *)dst + (size_t)bs * hd + (size_t)tt * srow,
           (const uint8_t *)src + (size_t)bs * hd + (size_t)tf * srow, srow);
}

/* ---- scalar kernels, one set per type through the element accessors above --------------- */

#define SCALAR_KERNELS(T, TYPE)                                                                    \
    static void scores_##T(const float *q, const void *kt, int hd, int bs, float scale, float *s)  \
    {                                                                                              \
        for (int t = 0; t < bs; t++) {                                                             \
            float acc = 0.0f;                                                                      \
            for (int d = 0; d < hd; d++)                                                           \
                acc += q[d] * kvp_kv_key_at(TYPE, kt, hd, bs, d, t);                               \
            s[t] = acc * scale;                                                                    \
        }                                                                                          \
    }                                                                                              \
    static void accum_##T(const float *p, const void *vb, int hd, int bs, int n, float *out)       \
    {                                                                                              \
        for (int t = 0; t < n; t++)                                                                \
            for (int d = 0; d < hd; d++)                                                           \
                out[d] += p[t] * kvp_kv_value_at(TYPE, vb, hd, bs, t, d);                          \
    }                                                                                              \
    static void k_rows_##T(const void *kt, int hd, int bs, int n, float *dst, size_t ld)           \
    {                                                                                              \
        for (int d = 0; d < hd; d++)                                                               \
            for (int t = 0; t < n; t++)                                                            \
                dst[(size_t)d * ld + t] = kvp_kv_key_at(TYPE, kt, hd, bs, d, t);                   \
    }                                                                                              \
    static void v_rows_##T(const void *vb, int hd, int bs, int n, float *dst)                      \
    {                                                                                              \
        for (int t = 0; t < n; t++)                                                                \
            for (int d = 0; d < hd; d++)                                                           \
                dst[(size_t)t * hd + d] = kvp_kv_value_at(TYPE, vb, hd, bs, t, d);                 \
    }

SCALAR_KERNELS(f16, KVP_KV_F16)
SCALAR_KERNELS(bf16, KVP_KV_BF16)
SCALAR_KERNELS(q8_0, KVP_KV_Q8_0)

/* The group kernels: each element widened once (into a row of up to 64) for the g heads, whose
 * sums then run over contiguous floats; per head the same sums in the same order as the per-head
 * scalar kernels (f32's: simd_scalar.c's block kernels), so the same bits. */
#define SCALAR_GROUP_KERNELS(T, TYPE)                                                              \
    static void scores_g_##T(const float *q, int g, const void *kt, int hd, int bs, float scale,   \
                             float *s, size_t ss)                                                  \
    {                                                                                              \
        for (int t0 = 0; t0 < bs; t0 += 64) {                                                      \
            int nt = bs - t0 < 64 ? bs - t0 : 64;                                                  \
            float acc[KVP_KV_GROUP_MAX][64] = {{0}}, k[64];                                        \
            for (int d = 0; d < hd; d++) {                                                         \
                for (int t = 0; t < nt; t++)                                                       \
                    k[t] = kvp_kv_key_at(TYPE, kt, hd, bs, d, t0 + t);                             \
                for (int j = 0; j < g; j++)                                                        \
                    for (int t = 0; t < nt; t++)                                                   \
                        acc[j][t] += q[(size_t)j * hd + d] * k[t];                                 \
            }                                                                                      \
            for (int j = 0; j < g; j++)                                                            \
                for (int t = 0; t < nt; t++)                                                       \
                    s[(size_t)j * ss + t0 + t] = acc[j][t] * scale;                                \
        }                                                                                          \
    }                                                                                              \
    static void accum_g_##T(const float *p, size_t ps, int g, const void *vb, int hd, int bs,      \
                            int n, float *out, size_t os)                                          \
    {                                                                                              \
        for (int d0 = 0; d0 < hd; d0 += 64) {                                                      \
            int nd = hd - d0 < 64 ? hd - d0 : 64;                                                  \
            float v[64];                                                                           \
            for (int t = 0; t < n; t++) {                                                          \
                for (int d = 0; d < nd; d++)                                                       \
                    v[d] = kvp_kv_value_at(TYPE, vb, hd, bs, t, d0 + d);                           \
                for (int j = 0; j < g; j++) {                                                      \
                    float w = p[(size_t)j * ps + t], *o = out + (size_t)j * os + d0;               \
                    for (int d = 0; d < nd; d++)                                                   \
                        o[d] += w * v[d];                                                          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

SCALAR_GROUP_KERNELS(f32, KVP_KV_F32)
SCALAR_GROUP_KERNELS(f16, KVP_KV_F16)
SCALAR_GROUP_KERNELS(bf16, KVP_KV_BF16)
SCALAR_GROUP_KERNELS(q8_0, KVP_KV_Q8_0)

static void put_k_plain(int type, const float *k, void *kt, int hd, int bs, int t)
{
    for (int d = 0; d < hd; d++)
        plain_put(type, kt, (size_t)d * bs + t, k[d]);
}

static void put_v_plain(int type, const float *v, void *vb, int hd, int t)
{
    for (int d = 0; d < hd; d++)
        plain_put(type, vb, (size_t)t * hd + d, v[d]);
}

static void put_k_f16(const float *k, void *kt, int hd, int bs, int t)
{
    put_k_plain(KVP_KV_F16, k, kt, hd, bs, t);
}

static void put_v_f16(const float *v, void *vb, int hd, int bs, int t)
{
    (void)bs;
    put_v_plain(KVP_KV_F16, v, vb, hd, t);
}

static void put_k_bf16(const float *k, void *kt, int hd, int bs, int t)
{
    put_k_plain(KVP_KV_BF16, k, kt, hd, bs, t);
}

static void put_v_bf16(const float *v, void *vb, int hd, int bs, int t)
{
    (void)bs;
    put_v_plain(KVP_KV_BF16, v, vb, hd, t);
}

static void put_k_f32(const float *k, void *kt, int hd, int bs, int t)
{
    put_k_plain(KVP_KV_F32, k, kt, hd, bs, t);
}

static void put_v_f32(const float *v, void *vb, int hd, int bs, int t)
{
    (void)bs;
    memcpy((float *)vb + (size_t)t * hd, v, (size_t)hd * sizeof(float));
}

void kvp_kv_put_k_q8_0(const float *k, void *kt, int hd, int bs, int t)
{
    for (int g = 0, d0 = 0; d0 < hd; g++, d0 += KVP_KV_Q8_GROUP) {
        int n = hd - d0 < KVP_KV_Q8_GROUP ? hd - d0 : KVP_KV_Q8_GROUP;
        uint16_t sc = q8_group(k + d0, n, (int8_t *)kt + (size_t)d0 * bs + t, (size_t)bs);
        u16_put((uint8_t *)kt + (size_t)hd * bs, (size_t)g * bs + t, sc);
    }
}

void kvp_kv_put_v_q8_0(const float *v, void *vb, int hd, int bs, int t)
{
    const int ng = kvp_kv_groups(hd);
    for (int g = 0, d0 = 0; d0 < hd; g++, d0 += KVP_KV_Q8_GROUP) {
        int n = hd - d0 < KVP_KV_Q8_GROUP ? hd - d0 : KVP_KV_Q8_GROUP;
        uint16_t sc = q8_group(v + d0, n, (int8_t *)vb + (size_t)t * hd + d0, 1);
        u16_put((uint8_t *)vb + (size_t)bs * hd, (size_t)t * ng + g, sc);
    }
}

/* f32 goes through the matching simd table's block kernels (the f32 kernels of src/kernels). */
#define F32_KERNELS(ISA, OPS)                                                                      \
    static void scores_f32_##ISA(const float *q, const void *kt, int hd, int bs, float scale,      \
                                 float *s)                                                         \
    {                                                                                              \
        OPS->block_scores(q, kt, hd, bs, scale, s);                                                \
    }                                                                                              \
    static void accum_f32_##ISA(const float *p, const void *vb, int hd, int bs, int n, float *out) \
    {                                                                                              \
        (void)bs;                                                                                  \
        OPS->block_accum(p, vb, hd, n, out);                                                       \
    }

F32_KERNELS(scalar, kvp_simd_scalar())
#if defined(__x86_64__) || defined(__aarch64__) /* the SIMD tables' f32 rows below */
F32_KERNELS(best, kvp_simd())
#endif

static void k_rows_f32(const void *kt, int hd, int bs, int n, float *dst, size_t ld)
{
    for (int d = 0; d < hd; d++)
        memcpy(dst + (size_t)d * ld, (const float *)kt + (size_t)d * bs, (size_t)n * sizeof(float));
}

static void v_rows_f32(const void *vb, int hd, int bs, int n, float *dst)
{
    (void)bs;
    memcpy(dst, vb, (size_t)n * hd * sizeof(float));
}

static const struct kvp_kv_kernels scalar_tab[KVP_KV_COUNT] = {
    [KVP_KV_F32] = {"scalar", scores_f32_scalar, accum_f32_scalar, scores_g_f32, accum_g_f32,
                    k_rows_f32, v_rows_f32, put_k_f32, put_v_f32},
    [KVP_KV_F16] = {"scalar", scores_f16, accum_f16, scores_g_f16, accum_g_f16, k_rows_f16,
                    v_rows_f16, put_k_f16, put_v_f16},
    [KVP_KV_BF16] = {"scalar", scores_bf16, accum_bf16, scores_g_bf16, accum_g_bf16, k_rows_bf16,
                     v_rows_bf16, put_k_bf16, put_v_bf16},
    [KVP_KV_Q8_0] = {"scalar", scores_q8_0, accum_q8_0, scores_g_q8_0, accum_g_q8_0, k_rows_q8_0,
                     v_rows_q8_0, kvp_kv_put_k_q8_0, kvp_kv_put_v_q8_0},
};

const struct kvp_kv_kernels *kvp_kv_kernels_scalar(int type)
{
    type = kvp_kv_type_resolve(type);
    return type > 0 && type < KVP_KV_COUNT ? &scalar_tab[type] : NULL;
}

#if defined(__x86_64__)
/* The AVX-512 table's f32 row: the best simd table's kernels (AVX-512 whenever this table is
 * in use), the plain copies and stores. */
static const struct kvp_kv_kernels kvp_kv_f32_best = {"avx512",
                                                      scores_f32_best,
                                                      accum_f32_best,
                                                      kvp_kv_scores_g_f32_avx512,
                                                      kvp_kv_accum_g_f32_avx512,
                                                      k_rows_f32,
                                                      v_rows_f32,
                                                      put_k_f32,
                                                      put_v_f32};

const struct kvp_kv_kernels *kvp_kv_kernels_avx512(int type)
{
    type = kvp_kv_type_resolve(type);
    if (!kvp_simd_avx512() || type <= 0 || type >= KVP_KV_COUNT)
        return NULL;
    return type == KVP_KV_F32 ? &kvp_kv_f32_best : &kvp_kv_avx512_tab[type];
}

const struct kvp_kv_kernels *kvp_kv_kernels_avx2(int type)
{
    type = kvp_kv_type_resolve(type);
    if (!kvp_simd_avx2() || type <= 0 || type >= KVP_KV_COUNT)
        return NULL;
    return &kvp_kv_avx2_tab[type];
}

const struct kvp_kv_kernels *kvp_kv_kernels_neon(int type)
{
    (void)type;
    return NULL;
}
#else
/* No x86 tables on this processor (kv_types_avx*.c are built for x86-64 only). */
const struct kvp_kv_kernels *kvp_kv_kernels_avx512(int type)
{
    (void)type;
    return NULL;
}

const struct kvp_kv_kernels *kvp_kv_kernels_avx2(int type)
{
    (void)type;
    return NULL;
}

#if defined(__aarch64__)
/* The NEON table's f32 row: the simd table's block kernels (NEON whenever this table is in use),
 * the scalar group kernels, the plain copies and stores. f16 and q8_0 (the cache types of the
 * decode) have their own NEON kernels (kv_types_neon.c); bf16 keeps the scalar ones. */
static const struct kvp_kv_kernels kvp_kv_f32_neon = {"neon",       scores_f32_best, accum_f32_best,
                                                      scores_g_f32, accum_g_f32,     k_rows_f32,
                                                      v_rows_f32,   put_k_f32,       put_v_f32};

const struct kvp_kv_kernels *kvp_kv_kernels_neon(int type)
{
    type = kvp_kv_type_resolve(type);
    if (!kvp_simd_neon() || type <= 0 || type >= KVP_KV_COUNT)
        return NULL;
    if (type == KVP_KV_F32)
        return &kvp_kv_f32_neon;
    return kvp_kv_neon_tab[type].scores ? &kvp_kv_neon_tab[type] : &scalar_tab[type];
}
#else
const struct kvp_kv_kernels *kvp_kv_kernels_neon(int type)
{
    (void)type;
    return NULL;
}
#endif
#endif

const struct kvp_kv_kernels *kvp_kv_kernels(int type)
{
    const char *isa = kvp_simd()->name;
    if (!strncmp(isa, "avx512", 6)) /* "avx512" and "avx512vnni" */
        return kvp_kv_kernels_avx512(type);
    if (!strcmp(isa, "avx2"))
        return kvp_kv_kernels_avx2(type);
    if (!strcmp(isa, "neon"))
        return kvp_kv_kernels_neon(type);
    return kvp_kv_kernels_scalar(type);
}
