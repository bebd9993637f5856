/*
 * Decode rows with weight rows in the lanes (AVX-512 VNNI; the avx512vnni table's lanes_pack and
 * lanes_rows, simd.h): every decode token where the CPU has this table, one sequence or many
 * (forward.c, KVP_SINGLES_LANES).
 *
 * Why: the row-by-row kernels of simd_vnni_avx512.c (one vector, or several in the multi-vector
 * ones) keep the file's layout, a zmm holds 64 codes of one row, so every (row, vector, block
 * pair) needs its own int-to-float conversion, scale multiply, fused add and in the end a
 * horizontal sum: their arithmetic, not the memory, binds them. Here 16 rows are turned once
 * into a tile where a zmm holds four consecutive codes of each of the 16 rows (a 16 × 16 dword
 * transpose of two blocks of each row), so one vpdpbusd with four activation bytes broadcast
 * from memory adds four products into each of 16 rows: eight of them finish a 32-element block
 * for 16 rows with no horizontal sum, and the float work (one convert, one multiply, one fused
 * add, plus one for Q4_K's mins) is shared by the 16 rows. The tile (the transpose, codes made
 * unsigned, 4- and 5-bit codes kept as nibbles and bit masks) is built once per matrix
 * (kvp_lanes_pack) and serves every call and vector.
 *
 * Signedness: vpdpbusd multiplies unsigned by signed bytes; the tile holds unsigned codes (Q8_0
 * with the sign bit flipped, i.e. + 128; Q4_0, Q5_0 and Q4_K as stored, 0..15 or 0..31) and the
 * activations stay signed. The offset (128, 8, 16; 0 for Q4_K) times the block's activation sum
 * is the int32 sum's starting value, so each block's sum is the exact Σ code·x; Q4_K's mins
 * (dmin·m per sub-block) are taken off against the sub-block's activation sum in float.
 *
 * Rounding: per row and vector the blocks are added in column order, each as one fused
 * multiply-add of the exact int32 sum (|sum| < 2^24, so its conversion is exact) by dw·dx; so a
 * result differs from the single-vector kernel's (which adds per-lane partial sums in another
 * order) only by float rounding, within the bound tests/test_batch.c derives. A vector's
 * results depend neither on the other vectors of a call nor on the rows asked for (a tile the
 * range cuts is computed whole), so exact steps may use it: a sequence gets the same logits in
 * any step.
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/simd_internal.h"
#include "kernels/simd_pairs_avx512.h"
#include "kernels/simd_quant_x86.h"
#include "kernels/types.h"

#define LN_INLINE static inline __attribute__((always_inline))

enum {
    LN_ROWS = 16, /* rows per tile: one per lane */
    LN_CB = 64,   /* 32-element blocks per chunk: the tile of 16 rows is 32 KiB */
    LN_NV = 16,   /* vectors per pass (the accumulators stay in registers) */
};

/* What the rows of a tile need from one vector's 32-element block: its codes (broadcast four at
 * a time), the starting value -offset·Σx, its scale and (Q4_K) scale · Σx for the mins. */
struct ln_x {
    int32_t q[8];
    int32_t corr;
    float dx;
    float ms;
    int32_t pad;
};

enum { LN_Q8_0, LN_Q4_0, LN_Q5_0, LN_Q4_K };

/* A view of 16 rows' packed blocks from a chunk's first on, in the layout kvp_lanes_tile_bytes
 * describes (simd_internal.h). A tile holds the codes of all its blocks, then (Q5_0) their fifth
 * bits, then their scales, each part a stream of constant stride, which the cores' stride
 * prefetchers follow (units of two blocks with all their parts interleaved, so strides of 512 and
 * 576 bytes by turns, ran Q8_0's batched steps 15-20 % slower). Per block b:
 *   codes   Q8_0: 8 zmm, zmm k holding bytes 4k..4k+3 of the block of each of the 16 rows (lane
 *           i is row i); the other kinds: 4 zmm of nibble pairs, zmm p holding zmm p's codes (as
 *           Q8_0's zmm p would) in its low nibbles and zmm p+4's in its high ones
 *   hi      Q5_0: 8 masks, bit j of mask k the fifth bit of byte j of zmm k
 *   dh      not Q4_K: the 16 rows' f16 block scales
 *   sc, mn  Q4_K: the 16 rows' 6-bit sub-block scales; their mins
 *   dk      Q4_K, per super-block (8 blocks): the 16 rows' f16 d, then their f16 dmin
 * The file's f16 scales are kept as they are (not as floats), and Q4_K's d·sc is formed in the
 * kernel as the pack used to form it in floats, so the packed matrix is no larger than the file
 * and the results are the same. */
struct ln_tile {
    uint8_t *codes, *sc, *mn;
    uint64_t *hi;
    uint16_t *dh, *dk;
};

/* Code bytes of one block. */
LN_INLINE size_t ln_code_bytes(int kind)
{
    return kind == LN_Q8_0 ? 512 : 256;
}

/* Block b's parts. */
LN_INLINE uint8_t *ln_codes_at(const struct ln_tile *t, int64_t b, int kind)
{
    return t->codes + (size_t)b * ln_code_bytes(kind);
}
LN_INLINE uint64_t *ln_hi_at(const struct ln_tile *t, int64_t b) /* Q5_0 */
{
    return t->hi + 8 * (size_t)b;
}
LN_INLINE uint16_t *ln_dh_at(const struct ln_tile *t, int64_t b) /* not Q4_K */
{
    return t->dh + 16 * (size_t)b;
}
LN_INLINE uint8_t *ln_sc_at(const struct ln_tile *t, int64_t b) /* Q4_K */
{
    return t->sc + 16 * (size_t)b;
}
LN_INLINE uint8_t *ln_mn_at(const struct ln_tile *t, int64_t b) /* Q4_K */
{
    return t->mn + 16 * (size_t)b;
}
LN_INLINE uint16_t *ln_dk_at(const struct ln_tile *t, int64_t b) /* Q4_K: b's super-block */
{
    return t->dk + 32 * (size_t)(b / 8);
}

/* The GGUF type of a kind. */
LN_INLINE int ln_type(int kind)
{
    return kind == LN_Q8_0 ? KVP_TYPE_Q8_0
         : kind == LN_Q4_0 ? KVP_TYPE_Q4_0
         : kind == LN_Q5_0 ? KVP_TYPE_Q5_0
                           : KVP_TYPE_Q4_K;
}

/* The view of tile base (of n columns) from block b0 on (a multiple of 8 for Q4_K). */
LN_INLINE struct ln_tile ln_view(const void *base, int64_t n, int64_t b0, int kind)
{
    const size_t nb = (size_t)(n / 32), b = (size_t)b0;
    uint8_t *p = (uint8_t *)base, *rest = p + nb * ln_code_bytes(kind);
    struct ln_tile t = {p + b * ln_code_bytes(kind), NULL, NULL, NULL, NULL, NULL};
    if (kind == LN_Q4_K) {
        t.sc = rest + 16 * b;
        t.mn = rest + 16 * nb + 16 * b;
        t.dk = (uint16_t *)(rest + 32 * nb) + 32 * (b / 8);
    } else if (kind == LN_Q5_0) {
        t.hi = (uint64_t *)rest + 8 * b;
        t.dh = (uint16_t *)(rest + 64 * nb) + 16 * b;
    } else {
        t.dh = (uint16_t *)rest + 16 * b;
    }
    return t;
}

/* The 16 × 16 dword transpose: r[c] becomes dword c of every input row (lane i = row i). */
LN_INLINE void transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

/* Bytes of a type's row per 32-element block (Q4_K: per super-block of 256). */
LN_INLINE size_t ln_block_bytes(int kind)
{
    return kind == LN_Q8_0 ? 34 : kind == LN_Q4_0 ? 18 : kind == LN_Q5_0 ? 22 : 144;
}

/* Unsigned codes of 32-element blocks b and b+1 (b even) of a row, in one zmm in element
 * order; `two` false: block b only (the upper half zero). */
LN_INLINE __m512i ln_codes(const uint8_t *row, int64_t b, bool two, int kind)
{
    if (kind == LN_Q4_K) { /* b even: sub-blocks b, b+1 are one 32-byte run's low, high nibbles */
        const uint8_t *qs = row + (size_t)(b / 8) * 144 + 16 + 16 * (size_t)(b % 8);
        __m256i c = _mm256_loadu_si256((const __m256i *)qs);
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(c, m4)),
                                  _mm256_and_si256(_mm256_srli_epi16(c, 4), m4), 1);
    }
    const size_t bs = ln_block_bytes(kind);
    const uint8_t *wb = row + (size_t)b * bs;
    if (kind == LN_Q8_0) {
        __m256i lo = _mm256_loadu_si256((const __m256i *)(wb + 2));
        if (!two)
            return _mm512_zextsi256_si512(lo);
        return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                  _mm256_loadu_si256((const __m256i *)(wb + 34 + 2)), 1);
    }
    if (two)
        return ucodes_pair(wb, kind == LN_Q4_0 ? PAIR_Q4_0 : PAIR_Q5_0, bs);
    /* the last odd block: ucodes_pair would read past it, so one block by hand */
    __m128i a = _mm_loadu_si128((const __m128i *)(wb + (kind == LN_Q4_0 ? 2 : 6)));
    __m256i lo = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(a, 4), a),
                                  _mm256_set1_epi8(0x0F));
    if (kind == LN_Q5_0) {
        uint32_t h;
        memcpy(&h, wb + 2, 4);
        lo = _mm256_mask_add_epi8(lo, (__mmask32)h, lo, _mm256_set1_epi8(0x10));
    }
    return _mm512_zextsi256_si512(lo);
}

/* Block b's eight code zmm (unsigned codes, zmm k as in ln_tile) stored at codes: as they are
 * for Q8_0; as four zmm of nibble pairs and (Q5_0) eight masks of fifth bits for the others. */
LN_INLINE void ln_store_codes(const __m512i r[8], uint8_t *codes, uint64_t *hi, int kind)
{
    if (kind == LN_Q8_0) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            _mm512_storeu_si512(codes + 64 * k, r[k]);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        __m512i lo = _mm512_and_si512(r[p], m4), up = _mm512_and_si512(r[p + 4], m4);
        _mm512_storeu_si512(codes + 64 * p, _mm512_or_si512(lo, _mm512_slli_epi16(up, 4)));
    }
    if (kind == LN_Q5_0)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            hi[k] = (uint64_t)_mm512_test_epi8_mask(r[k], _mm512_set1_epi8(0x10));
}

/* The tile of rows w0 .. w0 + nr - 1 (nr <= 16; missing rows are zero) over blocks
 * [b0, b0 + nbc). NR is nr where it is a constant 16 (whole tiles), else 0. */
LN_INLINE void ln_convert(const uint8_t *w0, size_t rb, int nr, int64_t b0, int nbc,
                          const struct ln_tile *t, int kind, int NR)
{
    if (NR)
        nr = NR;
    /* the scales: one gather of the 16 rows' f16 block scales per block (4 bytes from each
     * block's start, the low two the scale); Q4_K's per sub-block by row, once per super-block */
    const __mmask16 live = (__mmask16)((1u << nr) - 1);
    if (kind != LN_Q4_K && rb > (size_t)(INT32_MAX / 16)) { /* offsets past a gather's int32 */
        for (int b = 0; b < nbc; b++)
            for (int i = 0; i < 16; i++) {
                uint16_t h = 0;
                if (i < nr)
                    memcpy(&h, w0 + (size_t)i * rb + (size_t)(b0 + b) * ln_block_bytes(kind), 2);
                ln_dh_at(t, b)[i] = h;
            }
    } else if (kind != LN_Q4_K) {
        const __m512i vidx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32((int)rb));
        const size_t bs = ln_block_bytes(kind);
        for (int b = 0; b < nbc; b++) {
            __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, vidx,
                                                    w0 + (size_t)(b0 + b) * bs, 1);
            _mm256_storeu_si256((__m256i *)ln_dh_at(t, b), _mm512_cvtepi32_epi16(g));
        }
    } else {
        for (int i = 0; i < 16; i++)
            for (int sb = 0; sb < nbc / 8; sb++) {
                const uint8_t *blk = w0 + (size_t)i * rb + (size_t)(b0 / 8 + sb) * 144;
                uint8_t sc[8], mn[8];
                uint16_t dd = 0, dm = 0;
                memset(sc, 0, 8), memset(mn, 0, 8);
                if (i < nr) {
                    kvp_k_scales_unpack(blk + 4, sc, mn);
                    memcpy(&dd, blk, 2), memcpy(&dm, blk + 2, 2);
                }
                uint16_t *dk = ln_dk_at(t, 8 * sb);
                dk[i] = dd;
                dk[16 + i] = dm;
                for (int s = 0; s < 8; s++) {
                    ln_sc_at(t, 8 * sb + s)[i] = sc[s];
                    ln_mn_at(t, 8 * sb + s)[i] = mn[s];
                }
            }
    }
    const __m512i flip = _mm512_set1_epi8((char)(kind == LN_Q8_0 ? 0x80 : 0));
    for (int b = 0; b < nbc; b += 2) {
        const bool two = b + 1 < nbc;
        __m512i r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            r[i] = i < nr ? ln_codes(w0 + (size_t)i * rb, b0 + b, two, kind)
                          : _mm512_set1_epi8((char)(kind == LN_Q8_0 ? 0x80 : 0));
        transpose16(r);
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++)
            r[k] = _mm512_xor_si512(r[k], flip);
        ln_store_codes(r, ln_codes_at(t, b, kind), kind == LN_Q5_0 ? ln_hi_at(t, b) : NULL, kind);
        if (two)
            ln_store_codes(r + 8, ln_codes_at(t, b + 1, kind),
                           kind == LN_Q5_0 ? ln_hi_at(t, b + 1) : NULL, kind);
    }
}

/* One vector's blocks [b0, b0 + nbc) as struct ln_x. */
LN_INLINE void ln_prep(const uint8_t *xq, int64_t b0, int nbc, struct ln_x *out, int kind)
{
    const int off = kind == LN_Q8_0 ? 128 : kind == LN_Q4_0 ? 8 : kind == LN_Q5_0 ? 16 : 0;
    for (int b = 0; b < nbc; b++) {
        int64_t g = b0 + b;
        const uint8_t *codes;
        int32_t sum;
        if (kind == LN_Q4_K) {
            const uint8_t *xb = xq + (size_t)(g / 8) * sizeof(struct kvp_block_q8_k);
            int s = (int)(g % 8);
            codes = xb + QX_K_QS + 32 * s;
            int16_t bs[2];
            memcpy(bs, xb + QX_K_BSUMS + 4 * s, 4);
            sum = bs[0] + bs[1];
            out[b].dx = qx_f32(xb);
            out[b].ms = out[b].dx * (float)sum;
        } else {
            const uint8_t *xb = xq + (size_t)g * 34;
            codes = xb + 2;
            __m256i c = _mm256_loadu_si256((const __m256i *)codes);
            __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), c);
            __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
            sum = _mm_cvtsi128_si32(h);
            out[b].dx = qx_f16(xb);
            out[b].ms = 0.0f;
        }
        memcpy(out[b].q, codes, 32);
        out[b].corr = -off * sum;
        out[b].pad = 0;
    }
}

/* Block b's eight code zmm from the tile (unsigned codes, zmm k as in ln_tile). */
LN_INLINE void ln_load_codes(const struct ln_tile *t, int b, __m512i w[8], int kind)
{
    if (kind == LN_Q8_0) {
        const uint8_t *c = ln_codes_at(t, b, kind);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            w[k] = _mm512_loadu_si512(c + 64 * k);
        return;
    }
    const uint8_t *c = ln_codes_at(t, b, kind);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        __m512i v = _mm512_loadu_si512(c + 64 * p);
        w[p] = _mm512_and_si512(v, m4);
        w[p + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if (kind == LN_Q5_0) {
        const __m512i bit4 = _mm512_set1_epi8(0x10);
        const uint64_t *hi = ln_hi_at(t, b);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            w[k] = _mm512_mask_add_epi8(w[k], (__mmask64)hi[k], w[k], bit4);
    }
}

/* The 16 rows' f16 values at h times the 16 bytes at u (Q4_K's d·sc and dmin·m: exact). */
LN_INLINE __m512 ln_k_scale(const uint16_t *h, const uint8_t *u)
{
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)),
                         _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                             _mm_loadu_si128((const __m128i *)u))));
}

/* Software prefetch: a cursor that runs ahead of the blocks being computed through the packed
 * tiles in address order, a block's share of a tile per block. Without it the hardware
 * prefetcher does not overlap the reads with the products: a 128 MiB Q8_0 matrix of 576 columns
 * against 8 vectors, one thread, ran at 8.0 GB/s where the data in the L2 runs at 25 and a plain
 * read at 15.6 (bench/matvec_bw.c --lanes 8). */
/* How far ahead, in bytes. Measured on the Xeon VM (matvec_bw --threads 2 --lanes 8, 128 MiB,
 * GB/s of packed bytes against a plain read's 33-42): Q8_0 576 columns 16.7 without, 19.9 / 21.0
 * / 22.6-25.8 / 19.7 at 4 / 8 / 16 / 32 KiB ahead; Q5_0 576 11.2, 16.3 / 18.9 / 19.1-22.0 / 18.9;
 * Q4_K 1536 11.1, 16.0 / 16.1 / 18.2-18.5 / 18.0. */
enum { LN_PF_AHEAD = 16384 };
struct ln_pf {
    const char *cur; /* the next byte to prefetch */
    size_t step;     /* bytes per block */
    size_t next;     /* bytes to the next tile's same block when tiles are computed whole, else 0 */
};

/* The scale streams (and Q5_0's fifth bits) lie after all of a tile's codes, so the cursor, which
 * runs through the tile in address order, reaches them only late in the tile: a 3072-column tile
 * holds 24 KiB (Q4_K) or 48 KiB (Q8_0) of codes, and the first half to two thirds of its blocks
 * waited on their scales (perf put most of the Q4_K kernel's samples on those loads). So they
 * are prefetched on their own, LN_PF_SCALES blocks ahead, into the next tile's first blocks when
 * the tile is computed whole. */
enum { LN_PF_SCALES = 16 };
LN_INLINE void ln_pf_scales(const struct ln_tile *t, int b, int nbc, const struct ln_pf *pf,
                            int kind)
{
    int a = b + LN_PF_SCALES;
    size_t wrap = 0;
    if (a >= nbc) {
        a -= nbc;
        wrap = pf->next;
        if (!wrap || a >= nbc)
            return;
    }
    if (kind == LN_Q4_K) {
        if (a % 4 == 0) { /* 16 bytes a block: a line per four */
            _mm_prefetch((const char *)ln_sc_at(t, a) + wrap, _MM_HINT_T0);
            _mm_prefetch((const char *)ln_mn_at(t, a) + wrap, _MM_HINT_T0);
        }
        if (a % 8 == 0)
            _mm_prefetch((const char *)ln_dk_at(t, a) + wrap, _MM_HINT_T0);
        return;
    }
    if (kind == LN_Q5_0)
        _mm_prefetch((const char *)ln_hi_at(t, a) + wrap, _MM_HINT_T0);
    if (a % 2 == 0) /* 32 bytes a block */
        _mm_prefetch((const char *)ln_dh_at(t, a) + wrap, _MM_HINT_T0);
}

LN_INLINE void ln_pf_block(struct ln_pf *pf)
{
    if (!pf)
        return;
    const char *end = pf->cur + pf->step;
    for (const char *p = (const char *)((uintptr_t)pf->cur & ~(uintptr_t)63); p < end; p += 64)
        _mm_prefetch(p, _MM_HINT_T0);
    pf->cur = end;
}

/* acc[j] += the chunk's blocks of the tile against vector j's prepared blocks xp[j]; NV is nv
 * as a constant, so that the accumulators stay in registers through the chunk. The codes are
 * unpacked and the scales formed once per block for all the vectors. */
LN_INLINE void ln_compute(const struct ln_tile *t, int nbc, const struct ln_x *const *xp,
                          __m512 *accm, struct ln_pf *pf, int kind, int NV)
{
    __m512 acc[LN_NV];
    for (int j = 0; j < NV; j++)
        acc[j] = accm[j];
    for (int b = 0; b < nbc; b++) {
        ln_pf_block(pf);
        if (pf)
            ln_pf_scales(t, b, nbc, pf, kind);
        __m512i w[8];
        ln_load_codes(t, b, w, kind);
        __m512 dw, mw = _mm512_setzero_ps();
        if (kind == LN_Q4_K) {
            const uint16_t *dk = ln_dk_at(t, b);
            dw = ln_k_scale(dk, ln_sc_at(t, b));
            mw = ln_k_scale(dk + 16, ln_mn_at(t, b));
        } else {
            dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)ln_dh_at(t, b)));
        }
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) {
            const struct ln_x *x = &xp[j][b];
            /* two chains of four, so that few vectors do not wait on vpdpbusd's latency; the
             * activation bytes broadcast from memory */
            const int32_t *q = x->q;
            __m512i s0 = _mm512_set1_epi32(x->corr), s1 = _mm512_setzero_si512();
            s0 = _mm512_dpbusd_epi32(s0, w[0], _mm512_set1_epi32(q[0]));
            s1 = _mm512_dpbusd_epi32(s1, w[1], _mm512_set1_epi32(q[1]));
            s0 = _mm512_dpbusd_epi32(s0, w[2], _mm512_set1_epi32(q[2]));
            s1 = _mm512_dpbusd_epi32(s1, w[3], _mm512_set1_epi32(q[3]));
            s0 = _mm512_dpbusd_epi32(s0, w[4], _mm512_set1_epi32(q[4]));
            s1 = _mm512_dpbusd_epi32(s1, w[5], _mm512_set1_epi32(q[5]));
            s0 = _mm512_dpbusd_epi32(s0, w[6], _mm512_set1_epi32(q[6]));
            s1 = _mm512_dpbusd_epi32(s1, w[7], _mm512_set1_epi32(q[7]));
            __m512 s = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            acc[j] = _mm512_fmadd_ps(s, _mm512_mul_ps(dw, _mm512_set1_ps(x->dx)), acc[j]);
            if (kind == LN_Q4_K)
                acc[j] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(x->ms), acc[j]);
        }
    }
    for (int j = 0; j < NV; j++)
        accm[j] = acc[j];
}

/* ln_compute for nv (1..8) vectors; more go in eights. Inlined into each kind's entry, so that
 * kind is a constant there. */
LN_INLINE void ln_compute_any(const struct ln_tile *t, int nbc, const struct ln_x *const *xp,
                              int nv, __m512 *acc, struct ln_pf *pf, int kind)
{
    for (int j0 = 0; j0 < nv; j0 += 8) {
        int m = nv - j0 < 8 ? nv - j0 : 8;
        const struct ln_x *const *x = xp + j0;
        __m512 *a = acc + j0;
        if (j0)
            pf = NULL; /* the first eight's pass over the chunk prefetched it */
        switch (m) {
        case 1: ln_compute(t, nbc, x, a, pf, kind, 1); break;
        case 2: ln_compute(t, nbc, x, a, pf, kind, 2); break;
        case 3: ln_compute(t, nbc, x, a, pf, kind, 3); break;
        case 4: ln_compute(t, nbc, x, a, pf, kind, 4); break;
        case 5: ln_compute(t, nbc, x, a, pf, kind, 5); break;
        case 6: ln_compute(t, nbc, x, a, pf, kind, 6); break;
        case 7: ln_compute(t, nbc, x, a, pf, kind, 7); break;
        default: ln_compute(t, nbc, x, a, pf, kind, 8); break;
        }
    }
}

/* The tile's conversion for one kind, whole (16 rows) or not. */
static void ln_convert_any(const uint8_t *w0, size_t rb, int nr, int64_t b0, int nbc,
                           const struct ln_tile *t, int kind)
{
#define LN_KIND(K)                                                                                 \
    case K:                                                                                        \
        if (nr == LN_ROWS)                                                                         \
            ln_convert(w0, rb, nr, b0, nbc, t, K, LN_ROWS);                                        \
        else                                                                                       \
            ln_convert(w0, rb, nr, b0, nbc, t, K, 0);                                              \
        break
    switch (kind) {
        LN_KIND(LN_Q8_0); LN_KIND(LN_Q4_0); LN_KIND(LN_Q5_0); default: LN_KIND(LN_Q4_K);
    }
#undef LN_KIND
}

/* Tiles [t0, t1) of the nrows × n matrix w packed into dst (the whole matrix's packed base):
 * each tile's blocks converted in chunks of LN_CB, rows past nrows zero. */
LN_INLINE void ln_pack(const void *w, size_t row_bytes, int64_t n, int64_t nrows, int64_t t0,
                    int64_t t1, void *dst, int kind)
{
    const int64_t nb = n / 32;
    const size_t tb = kvp_lanes_tile_bytes(ln_type(kind), n);
    for (int64_t t = t0; t < t1; t++) {
        int64_t r = t * LN_ROWS;
        int nr = nrows - r < LN_ROWS ? (int)(nrows - r) : LN_ROWS;
        const uint8_t *w0 = (const uint8_t *)w + (size_t)r * row_bytes;
        for (int64_t b0 = 0; b0 < nb; b0 += LN_CB) {
            int nbc = nb - b0 < LN_CB ? (int)(nb - b0) : LN_CB;
            struct ln_tile v = ln_view((uint8_t *)dst + (size_t)t * tb, n, b0, kind);
            ln_convert_any(w0, row_bytes, nr, b0, nbc, &v, kind);
        }
    }
}

/* Tiles per group where a row's blocks take more than one chunk (see ln_run). */
enum { LN_TG = 8 };

/* y[j][r - r0] (+)= rows [r0, r1) of the packed matrix against the nv prepared vectors xq[j]. A
 * tile that the range cuts is computed whole and stored for the range's rows only. The vectors'
 * blocks are prepared once per call where they fit the LN_NV × LN_CB blocks of `prep` (a row of
 * at most LN_CB blocks, or few vectors: one vector's 32768 columns), and each tile is then
 * computed whole, in address order, with the cursor LN_PF_AHEAD ahead through all its parts.
 * Otherwise (many vectors against long rows) they go a group of LN_TG tiles at a time, chunk by
 * chunk, so that a chunk's blocks are prepared once per group instead of once per tile
 * (preparing them for every tile doubled the arithmetic of one vector), each tile's sums kept
 * between chunks. The grouped walk jumps between tiles and between the Q4_K tile's codes and
 * scale streams, which the hardware prefetcher follows badly: one vector against Q4_K rows of
 * 2304 to 9216 columns (every matrix of a Gemma-2-2B or Phi-3.5-mini layer) took it and streamed
 * about 16.5 GB/s in decode. The blocks of each (row, vector) are added in column order on
 * either walk, so the results are the same. */
LN_INLINE void ln_run(const void *packed, int64_t n, const void *const *xq, int nv, int64_t r0,
                      int64_t r1, float *const *y, bool accumulate, int kind)
{
    struct ln_x prep[LN_NV * LN_CB];
    const int64_t nb = n / 32;
    const size_t tb = kvp_lanes_tile_bytes(ln_type(kind), n), cb = ln_code_bytes(kind);
    /* vectors whose whole rows of blocks fit prep */
    const int64_t fit = nb <= LN_CB ? LN_NV : (int64_t)LN_NV * LN_CB / nb;
    const bool once = nv <= fit || nb <= LN_CB;
    const int per_pass = once ? (int)fit : LN_NV;
    const int64_t chunk = once ? nb : LN_CB;
    const int tg = once ? 1 : LN_TG;
    const int64_t t_first = r0 / LN_ROWS, t_end = (r1 + LN_ROWS - 1) / LN_ROWS;
    /* once: the cursor runs LN_PF_AHEAD through the tiles in address order; else: it runs
     * through the (tile, chunk) computed next, that region's codes */
    struct ln_pf pf = {NULL, once ? (tb + (size_t)nb - 1) / (size_t)nb : cb, once ? tb : 0};
    for (int j0 = 0; j0 < nv; j0 += per_pass) {
        int m = nv - j0 < per_pass ? nv - j0 : per_pass;
        const struct ln_x *xp[LN_NV];
        for (int j = 0; j < m; j++) {
            struct ln_x *pj = prep + (once ? (size_t)j * (size_t)nb : (size_t)j * LN_CB);
            if (once)
                ln_prep((const uint8_t *)xq[j0 + j], 0, (int)nb, pj, kind);
            xp[j] = pj;
        }
        for (int64_t g = t_first; g < t_end; g += tg) {
            const int gn = t_end - g < tg ? (int)(t_end - g) : tg;
            __m512 acc[LN_TG][LN_NV];
            for (int i = 0; i < gn; i++)
                for (int j = 0; j < m; j++)
                    acc[i][j] = _mm512_setzero_ps();
            for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
                int nbc = nb - b0 < chunk ? (int)(nb - b0) : (int)chunk;
                if (!once)
                    for (int j = 0; j < m; j++)
                        ln_prep((const uint8_t *)xq[j0 + j], b0, nbc, prep + (size_t)j * LN_CB,
                                kind);
                for (int i = 0; i < gn; i++) {
                    const uint8_t *base = (const uint8_t *)packed + (size_t)(g + i) * tb;
                    if (once) {
                        if (pf.cur < (const char *)base + LN_PF_AHEAD) /* a slow cursor */
                            pf.cur = (const char *)base + LN_PF_AHEAD;
                    } else { /* the next tile of the group, else the next chunk or group */
                        int64_t nt = i + 1 < gn ? g + i + 1 : b0 + LN_CB < nb ? g : g + gn;
                        int64_t nc = i + 1 < gn ? b0 : b0 + LN_CB < nb ? b0 + LN_CB : 0;
                        pf.cur = (const char *)packed + (size_t)nt * tb + (size_t)nc * cb;
                    }
                    struct ln_tile v = ln_view(base, n, b0, kind);
                    ln_compute_any(&v, nbc, xp, m, acc[i], &pf, kind);
                }
            }
            for (int i = 0; i < gn; i++) {
                /* lanes lo..hi-1 are rows ta+lo .. ta+hi-1, stored at y + ta - r0 */
                const int64_t ta = (g + i) * LN_ROWS;
                const int lo = ta < r0 ? (int)(r0 - ta) : 0;
                const int hi = r1 - ta < LN_ROWS ? (int)(r1 - ta) : LN_ROWS;
                const __mmask16 mk = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
                for (int j = 0; j < m; j++) {
                    float *yj = y[j0 + j] + (ta - r0);
                    __m512 v = acc[i][j];
                    if (accumulate)
                        v = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, yj), v);
                    _mm512_mask_storeu_ps(yj, mk, v);
                }
            }
        }
    }
}

/* The table's entries, one per kind. */
#define LN_ENTRY(NAME, KIND)                                                                       \
    void NAME##_pack(const void *w, size_t row_bytes, int64_t n, int64_t nrows, int64_t t0,       \
                     int64_t t1, void *dst)                                                        \
    {                                                                                              \
        ln_pack(w, row_bytes, n, nrows, t0, t1, dst, KIND);                                        \
    }                                                                                              \
    void NAME(const void *packed, int64_t n, const void *const *xq, int nv, int64_t r0,          \
              int64_t r1, float *const *y, bool accumulate)                                        \
    {                                                                                              \
        ln_run(packed, n, xq, nv, r0, r1, y, accumulate, KIND);                                    \
    }
LN_ENTRY(kvp_lanes_rows_q8_0, LN_Q8_0)
LN_ENTRY(kvp_lanes_rows_q4_0, LN_Q4_0)
LN_ENTRY(kvp_lanes_rows_q5_0, LN_Q5_0)
LN_ENTRY(kvp_lanes_rows_q4_k, LN_Q4_K)
#undef LN_ENTRY
