/*
 * Element types of the KV cache (enum kvp_kv_type in kvpred.h) and the kernels that read and
 * write each: one table per type, chosen at run time (AVX-512, AVX2 or NEON following kvp_simd(),
 * else the scalar oracle), so attention, prefill, policies and the store never look at the bytes.
 *
 * Block layouts (one (layer, KV head) block of bs tokens; the attention layouts of kvcache.h):
 *   keys   [hd][bs] elements (transposed: a dimension's bs tokens are contiguous)
 *   values [bs][hd] elements
 * f32, f16 and bf16 store just that. q8_0 quantizes each token's head vector in groups of 32
 * dimensions (the last group shorter when hd % 32 != 0), one f16 scale d = max|x|/127 per group
 * and token, x ≈ d·q with q = round(x/d) in int8, like ggml's Q8_0 but laid out for the kernels:
 *   keys   int8 [hd][bs], then f16 scales [groups][bs]
 *   values int8 [bs][hd], then f16 scales [bs][groups]
 * Every block is padded to 64 bytes, so block starts stay cache-line aligned.
 */
#ifndef KVP_KV_KV_TYPES_H
#define KVP_KV_KV_TYPES_H

#include <stddef.h>

#include "kvpred.h"

#define KVP_KV_Q8_GROUP  32
#define KVP_KV_GROUP_MAX 8 /* query heads per call of the group kernels (scores_g, accum_g) */

static inline int kvp_kv_groups(int hd)
{
    return (hd + KVP_KV_Q8_GROUP - 1) / KVP_KV_Q8_GROUP;
}

/* The type a kvp_kv_type value stands for (KVP_KV_DEFAULT is f16). */
static inline int kvp_kv_type_resolve(int type)
{
    return type == KVP_KV_DEFAULT ? KVP_KV_F16 : type;
}

/* Bytes of one key (or value) block of hd x bs elements of the type, padded to 64. */
size_t kvp_kv_block_bytes(int type, int hd, int bs);

/* The kernels of one element type. All arithmetic is f32; blocks may be at any alignment. */
struct kvp_kv_kernels {
    const char *name; /* "scalar", "avx2", "avx512" or "neon" */
    /* scores[t] = scale * Σ_d q[d]·k[d][t] for t < bs; kt is a key block */
    void (*scores)(const float *q, const void *kt, int hd, int bs, float scale, float *scores);
    /* out[d] += Σ_t p[t]·v[t][d] for t < n (n <= bs); vb is a value block */
    void (*accum)(const float *p, const void *vb, int hd, int bs, int n, float *out);
    /* The two above for g query heads of a GQA group at once (1 <= g <= KVP_KV_GROUP_MAX), each
     * key or value row loaded and widened once for all g (the per-head kernels convert a
     * block once per head): scores[j*ss + t] for q[j*hd ..]; out[j*os + d] += Σ_t
     * p[j*ps + t]·v[t][d]. Same sums as the per-head kernels up to float rounding. */
    void (*scores_g)(const float *q, int g, const void *kt, int hd, int bs, float scale,
                     float *scores, size_t ss);
    void (*accum_g)(const float *p, size_t ps, int g, const void *vb, int hd, int bs, int n,
                    float *out, size_t os);
    /* Keys of a block as f32: dst[d*ld + t] = k[d][t] for t < n */
    void (*k_rows)(const void *kt, int hd, int bs, int n, float *dst, size_t ld);
    /* Values of a block as f32: dst[t*hd + d] = v[t][d] for t < n */
    void (*v_rows)(const void *vb, int hd, int bs, int n, float *dst);
    /* Store one token's key (hd floats) as column t of a key block / value as row t */
    void (*put_k)(const float *k, void *kt, int hd, int bs, int t);
    void (*put_v)(const float *v, void *vb, int hd, int bs, int t);
};

/* The kernels for this CPU (following kvp_simd(): KVP_SIMD=scalar forces the scalar ones). */
const struct kvp_kv_kernels *kvp_kv_kernels(int type);
/* For tests: the scalar kernels, the AVX-512 ones (NULL without AVX-512), the AVX2 ones (NULL
 * without AVX2) and the NEON ones (NULL except on aarch64). */
const struct kvp_kv_kernels *kvp_kv_kernels_scalar(int type);
const struct kvp_kv_kernels *kvp_kv_kernels_avx512(int type);
const struct kvp_kv_kernels *kvp_kv_kernels_avx2(int type);
const struct kvp_kv_kernels *kvp_kv_kernels_neon(int type);

/* Copy token tf of key block src into token tt of key block dst (column: elements and, for
 * q8_0, scales); the same for a value row. Compaction moves tokens with these. */
void kvp_kv_copy_key(int type, int hd, int bs, const void *src, int tf, void *dst, int tt);
void kvp_kv_copy_value(int type, int hd, int bs, const void *src, int tf, void *dst, int tt);

/* Element (d, t) of a key block, element (t, d) of a value block, as f32 (scalar; for
 * policies that read single keys, and tests). */
float kvp_kv_key_at(int type, const void *kt, int hd, int bs, int d, int t);
float kvp_kv_value_at(int type, const void *vb, int hd, int bs, int t, int d);

/* Internal: the q8_0 stores (scalar, shared by both tables: one token, off the hot path), the
 * AVX-512 group kernels of f32 (the AVX-512 f32 row takes its per-head kernels from kvp_simd())
 * and the AVX-512 and AVX2 tables, indexed by type (kv_types_avx512.c, kv_types_avx2.c). */
void kvp_kv_put_k_q8_0(const float *k, void *kt, int hd, int bs, int t);
void kvp_kv_put_v_q8_0(const float *v, void *vb, int hd, int bs, int t);
void kvp_kv_scores_g_f32_avx512(const float *q, int g, const void *kt, int hd, int bs, float scale,
                                float *scores, size_t ss);
void kvp_kv_accum_g_f32_avx512(const float *p, size_t ps, int g, const void *vb, int hd, int bs,
                               int n, float *out, size_t os);
extern const struct kvp_kv_kernels kvp_kv_avx512_tab[KVP_KV_COUNT];
extern const struct kvp_kv_kernels kvp_kv_avx2_tab[KVP_KV_COUNT];
/* The NEON kernels of f16 and q8_0 (kv_types_neon.c, aarch64 only; the other rows are empty). */
extern const struct kvp_kv_kernels kvp_kv_neon_tab[KVP_KV_COUNT];

#endif
