/* Quest's bound over f16 metadata tiles with NEON (quest_meta.c's one-product path; aarch64
 * builds only): each term's row converted from f16 as it is loaded instead of through a float
 * copy of the tile. A tile's 16 blocks are four vectors of four lanes, each block's sum its own
 * lane, its terms added in the order d = 0, 1, ... with a separate multiply and add, as the
 * portable loop does, so the sums are the same to the bit (test_policy_units compares them).
 * Two tiles run side by side: each lane's sum is a chain of head_dim dependent adds, and more
 * independent chains hide the adder's latency. */
#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/quest_meta.h"

#define QM_NT 2 /* tiles side by side */

static inline __attribute__((always_inline)) void
group_sel(const uint16_t *base, size_t per, int hd, const float *q, const int G, const int NT,
          const uint8_t (*sel)[KVP_QMETA_SEL_HD], float scale, float *out, int ostride)
{
    float32x4_t acc[4][QM_NT][4];
    for (int j = 0; j < G; j++)
        for (int u = 0; u < NT; u++)
            for (int k = 0; k < 4; k++)
                acc[j][u][k] = vdupq_n_f32(0.0f);
    for (int d = 0; d < hd; d++) {
        const uint16_t *row = base + (size_t)d * 2 * KVP_QMETA_TILE;
        for (int j = 0; j < G; j++) {
            const float32x4_t qv = vdupq_n_f32(q[(size_t)j * hd + d]);
            const uint16_t *r = row + sel[j][d];
            for (int u = 0; u < NT; u++) {
                const float16x8_t h0 = vreinterpretq_f16_u16(vld1q_u16(r + u * per));
                const float16x8_t h1 = vreinterpretq_f16_u16(vld1q_u16(r + u * per + 8));
                acc[j][u][0] =
                    vaddq_f32(acc[j][u][0], vmulq_f32(qv, vcvt_f32_f16(vget_low_f16(h0))));
                acc[j][u][1] = vaddq_f32(acc[j][u][1], vmulq_f32(qv, vcvt_high_f32_f16(h0)));
                acc[j][u][2] =
                    vaddq_f32(acc[j][u][2], vmulq_f32(qv, vcvt_f32_f16(vget_low_f16(h1))));
                acc[j][u][3] = vaddq_f32(acc[j][u][3], vmulq_f32(qv, vcvt_high_f32_f16(h1)));
            }
        }
    }
    for (int j = 0; j < G; j++)
        for (int u = 0; u < NT; u++)
            for (int k = 0; k < 4; k++)
                vst1q_f32(out + (size_t)j * ostride + (size_t)u * KVP_QMETA_TILE + 4 * k,
                          vmulq_n_f32(acc[j][u][k], scale));
}

static inline __attribute__((always_inline)) void tiles_sel(const uint16_t *tile, int n_tiles,
                                                            int hd, const float *q, const int G,
                                                            const uint8_t (*sel)[KVP_QMETA_SEL_HD],
                                                            float scale, float *out, int ostride)
{
    const size_t per = (size_t)hd * 2 * KVP_QMETA_TILE; /* values per tile */
    int t = 0;
    for (; t + QM_NT <= n_tiles; t += QM_NT)
        group_sel(tile + (size_t)t * per, per, hd, q, G, QM_NT, sel, scale,
                  out + (size_t)t * KVP_QMETA_TILE, ostride);
    for (; t < n_tiles; t++)
        group_sel(tile + (size_t)t * per, per, hd, q, G, 1, sel, scale,
                  out + (size_t)t * KVP_QMETA_TILE, ostride);
}

void kvp_qmeta_tiles_sel_f16_neon(const uint16_t *tile, int n_tiles, int hd, const float *q, int G,
                                  const uint8_t (*sel)[KVP_QMETA_SEL_HD], float scale, float *out,
                                  int ostride)
{
    switch (G) { /* G <= 4: bounds_run takes the heads four at a time; G a constant per copy */
    case 1:
        tiles_sel(tile, n_tiles, hd, q, 1, sel, scale, out, ostride);
        break;
    case 2:
        tiles_sel(tile, n_tiles, hd, q, 2, sel, scale, out, ostride);
        break;
    case 3:
        tiles_sel(tile, n_tiles, hd, q, 3, sel, scale, out, ostride);
        break;
    default:
        tiles_sel(tile, n_tiles, hd, q, 4, sel, scale, out, ostride);
        break;
    }
}
