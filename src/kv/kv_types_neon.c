/*
 * NEON kernels of the f16 and q8_0 KV cache (aarch64 builds only; see kv_types.h for the block
 * layouts). f32 takes the NEON simd table's block kernels and bf16 the scalar ones (kv_types.c).
 *
 * Same bits as the scalar kernels of kv_types.c, by construction: every element becomes the
 * same float (f16 -> f32 is exact; a q8_0 element is (float)code · scale, one rounding, as in
 * kvp_kv_key_at), and each output is the scalar loop's own running sum, one vector lane per
 * token (scores) or per dimension (accum), its terms added in the scalar order with a separate
 * multiply and add (no fused multiply-add, which would round once instead of twice). The group
 * kernels widen each row once for the g heads, as the scalar ones do. test_attention compares
 * the tables to the bit.
 */
#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "kernels/types.h"
#include "kv/kv_types.h"

/* ---- eight elements as two float vectors -------------------------------------------------- */

static inline void f16x8(const uint8_t *p, float32x4_t *lo, float32x4_t *hi)
{
    const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(p));
    *lo = vcvt_f32_f16(vget_low_f16(h));
    *hi = vcvt_high_f32_f16(h);
}

/* (float)code · scale for eight int8 codes, scales (as floats) in sl, sh */
static inline void q8x8(const int8_t *c, float32x4_t sl, float32x4_t sh, float32x4_t *lo,
                        float32x4_t *hi)
{
    const int16x8_t w = vmovl_s8(vld1_s8(c));
    *lo = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), sl);
    *hi = vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(w)), sh);
}

static inline float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kvp_f16_to_f32(h);
}

/* Keys (d, t .. t + 8) of a block as floats. For q8_0 the scales of group d / 32 are read per
 * call: the caller's loop over d keeps them in cache, and the kernels stay one code path. */
static inline void key8(int q8, const void *kt, int hd, int bs, int d, int t, float32x4_t *lo,
                        float32x4_t *hi)
{
    const uint8_t *b = kt;
    if (!q8) {
        f16x8(b + 2 * ((size_t)d * bs + t), lo, hi);
        return;
    }
    float32x4_t sl, sh;
    f16x8(b + (size_t)hd * bs + 2 * ((size_t)(d / KVP_KV_Q8_GROUP) * bs + t), &sl, &sh);
    q8x8((const int8_t *)b + (size_t)d * bs + t, sl, sh, lo, hi);
}

/* Values (t, d .. d + 8) of a block as floats (d .. d + 8 within one q8_0 group: d % 8 == 0). */
static inline void value8(int q8, const void *vb, int hd, int bs, int t, int d, float32x4_t *lo,
                          float32x4_t *hi)
{
    const uint8_t *b = vb;
    if (!q8) {
        f16x8(b + 2 * ((size_t)t * hd + d), lo, hi);
        return;
    }
    const float s =
        f16_at(b + (size_t)bs * hd + 2 * ((size_t)t * kvp_kv_groups(hd) + d / KVP_KV_Q8_GROUP));
    q8x8((const int8_t *)b + (size_t)t * hd + d, vdupq_n_f32(s), vdupq_n_f32(s), lo, hi);
}

/* Scalar element access for the tails (the oracle's own accessors). */
static inline float key1(int q8, const void *kt, int hd, int bs, int d, int t)
{
    return kvp_kv_key_at(q8 ? KVP_KV_Q8_0 : KVP_KV_F16, kt, hd, bs, d, t);
}

static inline float value1(int q8, const void *vb, int hd, int bs, int t, int d)
{
    return kvp_kv_value_at(q8 ? KVP_KV_Q8_0 : KVP_KV_F16, vb, hd, bs, t, d);
}

/* ---- kernels, written once for both types ------------------------------------------------- */

/* scores[j·ss + t] = scale · Σ_d q[j·hd + d]·k[d][t] for g heads (g = 1: the per-head kernel) */
static inline __attribute__((always_inline)) void scores_any(int q8, const float *q, int g,
                                                             const void *kt, int hd, int bs,
                                                             float scale, float *s, size_t ss)
{
    int t = 0;
    for (; t + 8 <= bs; t += 8) {
        float32x4_t acc[KVP_KV_GROUP_MAX][2];
        for (int j = 0; j < g; j++)
            acc[j][0] = acc[j][1] = vdupq_n_f32(0.0f);
        for (int d = 0; d < hd; d++) {
            float32x4_t lo, hi;
            key8(q8, kt, hd, bs, d, t, &lo, &hi);
            for (int j = 0; j < g; j++) {
                const float32x4_t qd = vdupq_n_f32(q[(size_t)j * hd + d]);
                acc[j][0] = vaddq_f32(acc[j][0], vmulq_f32(qd, lo));
                acc[j][1] = vaddq_f32(acc[j][1], vmulq_f32(qd, hi));
            }
        }
        for (int j = 0; j < g; j++) {
            vst1q_f32(s + (size_t)j * ss + t, vmulq_n_f32(acc[j][0], scale));
            vst1q_f32(s + (size_t)j * ss + t + 4, vmulq_n_f32(acc[j][1], scale));
        }
    }
    for (; t < bs; t++)
        for (int j = 0; j < g; j++) {
            float a = 0.0f;
            for (int d = 0; d < hd; d++)
                a += q[(size_t)j * hd + d] * key1(q8, kt, hd, bs, d, t);
            s[(size_t)j * ss + t] = a * scale;
        }
}

/* out[j·os + d] += Σ_t p[j·ps + t]·v[t][d] for t < n, g heads */
static inline __attribute__((always_inline)) void accum_any(int q8, const float *p, size_t ps,
                                                            int g, const void *vb, int hd, int bs,
                                                            int n, float *out, size_t os)
{
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        float32x4_t o[KVP_KV_GROUP_MAX][2];
        for (int j = 0; j < g; j++) {
            o[j][0] = vld1q_f32(out + (size_t)j * os + d);
            o[j][1] = vld1q_f32(out + (size_t)j * os + d + 4);
        }
        for (int t = 0; t < n; t++) {
            float32x4_t lo, hi;
            value8(q8, vb, hd, bs, t, d, &lo, &hi);
            for (int j = 0; j < g; j++) {
                const float32x4_t pt = vdupq_n_f32(p[(size_t)j * ps + t]);
                o[j][0] = vaddq_f32(o[j][0], vmulq_f32(pt, lo));
                o[j][1] = vaddq_f32(o[j][1], vmulq_f32(pt, hi));
            }
        }
        for (int j = 0; j < g; j++) {
            vst1q_f32(out + (size_t)j * os + d, o[j][0]);
            vst1q_f32(out + (size_t)j * os + d + 4, o[j][1]);
        }
    }
    for (; d < hd; d++)
        for (int j = 0; j < g; j++) {
            float *o = out + (size_t)j * os + d;
            for (int t = 0; t < n; t++)
                *o += p[(size_t)j * ps + t] * value1(q8, vb, hd, bs, t, d);
        }
}

static inline __attribute__((always_inline)) void k_rows_any(int q8, const void *kt, int hd, int bs,
                                                             int n, float *dst, size_t ld)
{
    for (int d = 0; d < hd; d++) {
        float *o = dst + (size_t)d * ld;
        int t = 0;
        for (; t + 8 <= n; t += 8) {
            float32x4_t lo, hi;
            key8(q8, kt, hd, bs, d, t, &lo, &hi);
            vst1q_f32(o + t, lo);
            vst1q_f32(o + t + 4, hi);
        }
        for (; t < n; t++)
            o[t] = key1(q8, kt, hd, bs, d, t);
    }
}

static inline __attribute__((always_inline)) void v_rows_any(int q8, const void *vb, int hd, int bs,
                                                             int n, float *dst)
{
    for (int t = 0; t < n; t++) {
        float *o = dst + (size_t)t * hd;
        int d = 0;
        for (; d + 8 <= hd; d += 8) {
            float32x4_t lo, hi;
            value8(q8, vb, hd, bs, t, d, &lo, &hi);
            vst1q_f32(o + d, lo);
            vst1q_f32(o + d + 4, hi);
        }
        for (; d < hd; d++)
            o[d] = value1(q8, vb, hd, bs, t, d);
    }
}

#define NEON_KERNELS(T, Q8)                                                                        \
    static void scores_##T(const float *q, const void *kt, int hd, int bs, float scale, float *s)  \
    {                                                                                              \
        scores_any(Q8, q, 1, kt, hd, bs, scale, s, 0);                                             \
    }                                                                                              \
    static void accum_##T(const float *p, const void *vb, int hd, int bs, int n, float *out)       \
    {                                                                                              \
        accum_any(Q8, p, 0, 1, vb, hd, bs, n, out, 0);                                             \
    }                                                                                              \
    static void scores_g_##T(const float *q, int g, const void *kt, int hd, int bs, float scale,   \
                             float *s, size_t ss)                                                  \
    {                                                                                              \
        scores_any(Q8, q, g, kt, hd, bs, scale, s, ss);                                            \
    }                                                                                              \
    static void accum_g_##T(const float *p, size_t ps, int g, const void *vb, int hd, int bs,      \
                            int n, float *out, size_t os)                                          \
    {                                                                                              \
        accum_any(Q8, p, ps, g, vb, hd, bs, n, out, os);                                           \
    }                                                                                              \
    static void k_rows_##T(const void *kt, int hd, int bs, int n, float *dst, size_t ld)           \
    {                                                                                              \
        k_rows_any(Q8, kt, hd, bs, n, dst, ld);                                                    \
    }                                                                                              \
    static void v_rows_##T(const void *vb, int hd, int bs, int n, float *dst)                      \
    {                                                                                              \
        v_rows_any(Q8, vb, hd, bs, n, dst);                                                        \
    }

NEON_KERNELS(f16, 0)
NEON_KERNELS(q8_0, 1)

/* f16 stores: one token, off the hot path; kvp_f32_to_f16 as the scalar table does. */
static void put_k_f16(const float *k, void *kt, int hd, int bs, int t)
{
    for (int d = 0; d < hd; d++) {
        const uint16_t h = kvp_f32_to_f16(k[d]);
        memcpy((uint8_t *)kt + 2 * ((size_t)d * bs + t), &h, 2);
    }
}

static void put_v_f16(const float *v, void *vb, int hd, int bs, int t)
{
    (void)bs;
    for (int d = 0; d < hd; d++) {
        const uint16_t h = kvp_f32_to_f16(v[d]);
        memcpy((uint8_t *)vb + 2 * ((size_t)t * hd + d), &h, 2);
    }
}

const struct kvp_kv_kernels kvp_kv_neon_tab[KVP_KV_COUNT] = {
    [KVP_KV_F16] = {"neon", scores_f16, accum_f16, scores_g_f16, accum_g_f16, k_rows_f16,
                    v_rows_f16, put_k_f16, put_v_f16},
    [KVP_KV_Q8_0] = {"neon", scores_q8_0, accum_q8_0, scores_g_q8_0, accum_g_q8_0, k_rows_q8_0,
                     v_rows_q8_0, kvp_kv_put_k_q8_0, kvp_kv_put_v_q8_0},
};
