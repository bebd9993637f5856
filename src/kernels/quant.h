/*
 * Quantized block formats beyond Q8_0: the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL),
 * the 256-element K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and Q8_K, the activation format the
 * K-quant dots consume. Layouts, byte offsets and dequantization formulas are
 * docs/formats.md §4.3 and §4.4, which match upstream ggml; the structs below pin those
 * layouts at compile time.
 *
 * This module holds the reference (scalar) converters only: dequantize a row to f32 and quantize
 * a row from f32. They are the type table's to_f32 / from_f32 (types.c) and the oracle for the
 * integer dot kernels in simd_*.c. Rows are runs of whole blocks starting at any byte address, so
 * every block is read and written through memcpy.
 *
 * Quantization follows ggml's rules where those are simple (absmax for the symmetric 32-element
 * types, min/max for the affine ones) and uses a small least-squares search for the K-quants'
 * per-sub-block scales and mins (not bit-identical to ggml's make_qkx2_quants, but of the same
 * quality; tests/test_quant.c states the RMS error bound per type).
 */
#ifndef KVP_KERNELS_QUANT_H
#define KVP_KERNELS_QUANT_H

#include <stdint.h>

#define KVP_QK4_0        32
#define KVP_QK_K         256
#define KVP_K_SCALE_SIZE 12

/* Q4_0: y = (q - 8)·d, q 4-bit; low nibbles are elements 0..15, high nibbles 16..31. */
struct kvp_block_q4_0 {
    uint16_t d;     /* f16 scale */
    uint8_t qs[16]; /* 32 nibbles */
};
_Static_assert(sizeof(struct kvp_block_q4_0) == 18, "q4_0 block is 18 bytes");

/* Q4_1: y = q·d + m. */
struct kvp_block_q4_1 {
    uint16_t d; /* f16 scale */
    uint16_t m; /* f16 offset (the block minimum) */
    uint8_t qs[16];
};
_Static_assert(sizeof(struct kvp_block_q4_1) == 20, "q4_1 block is 20 bytes");

/* Q5_0: y = (q - 16)·d, q = nibble | bit j of qh (LE u32) << 4. */
struct kvp_block_q5_0 {
    uint16_t d;
    uint8_t qh[4]; /* fifth bits, element j at bit j */
    uint8_t qs[16];
};
_Static_assert(sizeof(struct kvp_block_q5_0) == 22, "q5_0 block is 22 bytes");

/* Q5_1: y = q·d + m with the 5-bit q of Q5_0. */
struct kvp_block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[16];
};
_Static_assert(sizeof(struct kvp_block_q5_1) == 24, "q5_1 block is 24 bytes");

/* IQ4_NL: y = d·T[q] with the fixed non-linear table kvp_iq4nl_table. */
struct kvp_block_iq4_nl {
    uint16_t d;
    uint8_t qs[16];
};
_Static_assert(sizeof(struct kvp_block_iq4_nl) == 18, "iq4_nl block is 18 bytes");

/* Q2_K: 16 sub-blocks of 16; scales[k] = scale (low nibble) | min (high nibble). */
struct kvp_block_q2_k {
    uint8_t scales[16];
    uint8_t qs[64]; /* 2-bit quants, four per byte (docs/formats.md §4.4 for the order) */
    uint16_t d;     /* f16 super-block scale for the 4-bit scales */
    uint16_t dmin;  /* f16 super-block scale for the 4-bit mins */
};
_Static_assert(sizeof(struct kvp_block_q2_k) == 84, "q2_k block is 84 bytes");

/* Q3_K: 16 sub-blocks of 16, signed 6-bit scales packed in 12 bytes, quants -4..3. */
struct kvp_block_q3_k {
    uint8_t hmask[32]; /* third bit of each quant (set: no -4 offset) */
    uint8_t qs[64];    /* low two bits */
    uint8_t scales[12];
    uint16_t d;
};
_Static_assert(sizeof(struct kvp_block_q3_k) == 110, "q3_k block is 110 bytes");

/* Q4_K: 8 sub-blocks of 32; y = d·sc·q - dmin·m with 6-bit sc and m packed in scales[12]. */
struct kvp_block_q4_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[KVP_K_SCALE_SIZE];
    uint8_t qs[128];
};
_Static_assert(sizeof(struct kvp_block_q4_k) == 144, "q4_k block is 144 bytes");

/* Q5_K: Q4_K plus a fifth bit per quant in qh (bit 2c / 2c+1 of qh[l] for chunk c). */
struct kvp_block_q5_k {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[KVP_K_SCALE_SIZE];
    uint8_t qh[32];
    uint8_t qs[128];
};
_Static_assert(sizeof(struct kvp_block_q5_k) == 176, "q5_k block is 176 bytes");

/* Q6_K: 16 sub-blocks of 16 with int8 scales; 6-bit quants minus 32. */
struct kvp_block_q6_k {
    uint8_t ql[128]; /* low four bits */
    uint8_t qh[64];  /* high two bits */
    int8_t scales[16];
    uint16_t d;
};
_Static_assert(sizeof(struct kvp_block_q6_k) == 210, "q6_k block is 210 bytes");

/* Q8_K: activations only. f32 scale, int8 quants, bsums[k] = Σ qs[16k..16k+15]. */
struct kvp_block_q8_k {
    float d;
    int8_t qs[KVP_QK_K];
    int16_t bsums[KVP_QK_K / 16];
};
_Static_assert(sizeof(struct kvp_block_q8_k) == 292, "q8_k block is 292 bytes");

/* The IQ4_NL code book (docs/formats.md §4.4). */
extern const int8_t kvp_iq4nl_table[16];

/* Unpack the 12-byte Q4_K/Q5_K scale field into eight 6-bit scales and eight 6-bit mins
 * (docs/formats.md §4.4). Inline: the SIMD dots call it once per 256 weights. */
static inline void kvp_k_scales_unpack(const uint8_t s[KVP_K_SCALE_SIZE], uint8_t sc[8],
                                       uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        m[j] = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Unpack the 12-byte Q3_K scale field into sixteen signed scales (-32..31), byte-wise as in
 * docs/formats.md §4.4 (endian-free). */
static inline void kvp_q3_k_scales_unpack(const uint8_t s[12], int8_t sc[16])
{
    for (int i = 0; i < 16; i++) {
        int low4 = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
        int high2 = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (int8_t)((low4 | (high2 << 4)) - 32);
    }
}

/*
 * Row converters. n is a multiple of the block size (32 or 256); src/dst may be unaligned.
 * Dequantizers apply docs/formats.md §4.4 exactly. Quantizers write n / block_size
 * blocks; the K-quant ones choose per-sub-block scales with a least-squares search (see quant.c).
 */
void kvp_dequant_row_q4_0(const void *src, float *dst, int64_t n);
void kvp_dequant_row_q4_1(const void *src, float *dst, int64_t n);
void kvp_dequant_row_q5_0(const void *src, float *dst, int64_t n);
void kvp_dequant_row_q5_1(const void *src, float *dst, int64_t n);
void kvp_dequant_row_iq4_nl(const void *src, float *dst, int64_t n);
void kvp_dequant_row_q2_k(const void *src, float *dst, int64_t n);
void kvp_dequant_row_q3_k(const void *src, float *dst, int64_t n);
void kvp_dequant_row_q4_k(const void *src, float *dst, int64_t n);
void kvp_dequant_row_q5_k(const void *src, float *dst, int64_t n);
void kvp_dequant_row_q6_k(const void *src, float *dst, int64_t n);
void kvp_dequant_row_q8_k(const void *src, float *dst, int64_t n);

void kvp_quantize_row_q4_0_ref(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q4_1_ref(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q5_0_ref(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q5_1_ref(const float *x, void *dst, int64_t n);
void kvp_quantize_row_iq4_nl_ref(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q2_k_ref(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q3_k_ref(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q4_k_ref(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q5_k_ref(const float *x, void *dst, int64_t n);
void kvp_quantize_row_q6_k_ref(const float *x, void *dst, int64_t n);

/* Q8_K activation quantization: d = max|x| / 127, q = round(x / d) (nearest even, so q stays in
 * -127..127, which the SIMD sign trick needs), bsums from the rounded quants. */
void kvp_quantize_row_q8_k_ref(const float *x, void *dst, int64_t n);

#endif
