/*
 * An 8-bit copy of Quest's block metadata for the query-aware predictor's bound pass
 * (`qpredictor`, option q8=1). The exact f16/f32 tiles of quest_meta.h stay the source (quest
 * reads only those, bit for bit); this copy is requantized from them one block at a time as the
 * fold moves on, and is what qpredictor's per-token bound pass streams: 1 + 1/16 bytes per value
 * instead of 2 (f16) or 4 (f32), and a bound that is a small integer mat-vec (`vpdpbusd`).
 *
 * Per block b, one scale s_b = max_d max(|M_d|, |m_d|) / 127 (rounded up) and, per dimension,
 *   Mq_d = ceil(M_d / s_b),  Nq_d = ceil(-m_d / s_b)      (s8 in [-127, 127])
 * so Mq_d·s_b >= M_d and -Nq_d·s_b <= m_d: the block's range only widens (conservative). For a
 * query q with c = max_d |q_d| / 255 and the u8 magnitudes P_d = round(max(q_d, 0) / c),
 * Q_d = round(max(-q_d, 0) / c), the bound Σ_d max(q_d·M_d, q_d·m_d) = Σ q⁺·M + |q⁻|·(-m) is
 *   bound8_b = (float)(Σ_d P_d·Mq_d + Q_d·Nq_d) · s_b · (c · scale)
 * The integer sum is exact, so the SIMD kernel (AVX512-VNNI) and the scalar loop give the same
 * float to the bit. It differs from the exact bound by the rounding of q (half a step of c per
 * dimension) and the widening of the range (under a step of s_b per dimension).
 *
 * Tile layout per (layer, KV head), KVP_QMETA_TILE blocks: float s[16], then s8 Mq[hd4][16][4],
 * then s8 Nq[hd4][16][4] (hd4 = head_dim / 4 rounded up, padding dimensions zero): one 64-byte
 * vector holds 4 dimensions of 16 blocks, the operand layout of vpdpbusd.
 */
#ifndef KVP_POLICY_QUEST_META8_H
#define KVP_POLICY_QUEST_META8_H

#include <stddef.h>
#include <stdint.h>

#include "kv/quest_meta.h"

struct kvp_qmeta8 {
    int n_lh, n_tiles, head_dim, hd4, block_size;
    size_t tile_bytes; /* 64 + 2 · hd4 · 64 */
    uint8_t *tiles;    /* [n_lh][n_tiles][tile_bytes] (owned, 64-byte aligned) */
    int *done;         /* [n_lh] tokens requantized */
};

/* 0, or -1 out of memory or head_dim > 256 (nothing left allocated). */
int kvp_qmeta8_init(struct kvp_qmeta8 *q, const struct kvp_qmeta *m);
void kvp_qmeta8_free(struct kvp_qmeta8 *q); /* accepts a zeroed struct */
void kvp_qmeta8_reset(struct kvp_qmeta8 *q);
void kvp_qmeta8_restart(struct kvp_qmeta8 *q, int lh);
/* Requantize the blocks of lh that changed since the last call, from m (folded up to n_tokens
 * first); a cut below what was done redoes the newest block, as kvp_qmeta_fold does. */
void kvp_qmeta8_update(struct kvp_qmeta8 *q, const struct kvp_qmeta *m, int lh, int n_tokens);
/* As kvp_qmeta_bounds: out[j·stride + b - b0] = bound8(q[j], block b) · scale, b in [b0, b1). */
void kvp_qmeta8_bounds(const struct kvp_qmeta8 *q, int lh, const float *qv, int g, float scale,
                       int b0, int b1, float *out, int stride);
/* The same in two steps, for callers that bound many ranges with one query (quest's
 * coarse-to-fine pass): the query packed once (at most KVP_QMETA_SEL_HEADS heads), then the
 * bounds of a range, equal to kvp_qmeta8_bounds' to the bit. qq works with any kvp_qmeta8 of the
 * same head_dim (the block level and the group level). */
struct kvp_qmeta8_query {
    int g;
    uint32_t pq[KVP_QMETA_SEL_HEADS * 64], nq[KVP_QMETA_SEL_HEADS * 64]; /* [g][hd4] */
    float cs[KVP_QMETA_SEL_HEADS]; /* each head's step times the scale */
};
/* 0, or -1 when g > KVP_QMETA_SEL_HEADS (use kvp_qmeta8_bounds). */
int kvp_qmeta8_query_prep(const struct kvp_qmeta8 *q, struct kvp_qmeta8_query *qq,
                          const float *qv, int g, float scale);
void kvp_qmeta8_bounds_q(const struct kvp_qmeta8 *q, int lh, const struct kvp_qmeta8_query *qq,
                         int b0, int b1, float *out, int stride);
/* Ask for the tiles holding blocks [b0, b1) of lh (prefetch): the approximate coarse-to-fine
 * pass bounds scattered groups of blocks, which no hardware prefetcher anticipates, and at long
 * context their tiles are in memory, not in a cache (the KV reads evicted them). */
void kvp_qmeta8_prefetch(const struct kvp_qmeta8 *q, int lh, int b0, int b1);

/* The scalar loop (the reference the SIMD kernel is tested against). */
void kvp_qmeta8_bounds_scalar(const struct kvp_qmeta8 *q, int lh, const float *qv, int g,
                              float scale, int b0, int b1, float *out, int stride);

/* Internal (quest_meta8_vnni.c): the bounds of G <= 4 heads over one tile, packed queries
 * pq/nq [G][hd4] (4 u8 each) with steps cs[G] (times the caller's scale), into out[G][16]. */
void kvp_qmeta8_tile_vnni(const uint8_t *tile, int hd4, const uint32_t *pq, const uint32_t *nq,
                          int G, const float *cs, float *out);

#endif
