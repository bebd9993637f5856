/*
 * The type table (see types.h). Sizes follow docs/formats.md §4.1/§4.3 for every GGUF
 * type id so that files holding types kvpred cannot compute with yet still parse and get a precise
 * error later.
 */
#include "kernels/types.h"

#include "kernels/quant.h"

#include <math.h>
#include <string.h>


float kvp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: m * 2^-24 */
            float f = (float)man * 0x1p-24f;
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

uint16_t kvp_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));
    if (absx >= 0x477ff000) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (absx < 0x38800000) { /* below the smallest normal half: subnormal or zero */
        float a;
        memcpy(&a, &absx, 4);
        /* value / 2^-24, rounded to nearest even by the FPU's default mode */
        uint32_t m = (uint32_t)lrintf(a * 0x1p24f);
        return (uint16_t)(sign | m);
    }
    /* normal: rebias exponent, round mantissa from 23 to 10 bits, nearest even */
    uint32_t mant = absx & 0x7fffff;
    uint32_t exp = (absx >> 23) - 112;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* may carry into the exponent, which is still correct */
    return (uint16_t)(sign | h);
}

float kvp_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t kvp_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) /* nan: keep it quiet */
        return (uint16_t)((x >> 16) | 64);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static void f32_to_f32(const void *src, float *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f32_from_f32(const float *src, void *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_to_f32(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = kvp_f16_to_f32(h);
    }
}

static void f32_from_f16(const float *src, void *dst, int64_t n)
{
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = kvp_f32_to_f16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

static void bf16_to_f32(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = kvp_bf16_to_f32(h);
    }
}

static void f32_from_bf16(const float *src, void *dst, int64_t n)
{
    uint8_t *d = dst;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = kvp_f32_to_bf16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

static void q8_0_to_f32(const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        struct kvp_block_q8_0 blk;
        memcpy(&blk, s + b * sizeof(blk), sizeof(blk));
        float d = kvp_f16_to_f32(blk.d);
        for (int j = 0; j < KVP_QK8_0; j++)
            dst[b * KVP_QK8_0 + j] = (float)blk.qs[j] * d;
    }
}

void kvp_quantize_row_q8_0_ref(const float *x, void *dst, int64_t n)
{
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / KVP_QK8_0; b++) {
        const float *xb = x + b * KVP_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < KVP_QK8_0; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        struct kvp_block_q8_0 blk;
        blk.d = kvp_f32_to_f16(d);
        for (int j = 0; j < KVP_QK8_0; j++)
            blk.qs[j] = (int8_t)lrintf(xb[j] * id);
        memcpy(out + b * sizeof(blk), &blk, sizeof(blk));
    }
}

#define ROW(id, nm, bs, ts) [id] = {.name = nm, .blck_size = bs, .type_size = ts}
/* A quantized type with kernels: converters from quant.c. */
#define QROW(id, nm, bs, ts, sfx)                                                                  \
    [id] = {nm, bs, ts, true, kvp_dequant_row_##sfx, kvp_quantize_row_##sfx##_ref}

static const struct kvp_type_traits type_table[KVP_TYPE_COUNT] = {
    [KVP_TYPE_F32] = {"F32", 1, 4, true, f32_to_f32, f32_from_f32},
    [KVP_TYPE_F16] = {"F16", 1, 2, true, f16_to_f32, f32_from_f16},
    [KVP_TYPE_BF16] = {"BF16", 1, 2, true, bf16_to_f32, f32_from_bf16},
    [KVP_TYPE_Q8_0] = {"Q8_0", 32, 34, true, q8_0_to_f32, kvp_quantize_row_q8_0_ref},
    QROW(KVP_TYPE_Q4_0, "Q4_0", 32, 18, q4_0),
    QROW(KVP_TYPE_Q4_1, "Q4_1", 32, 20, q4_1),
    QROW(KVP_TYPE_Q5_0, "Q5_0", 32, 22, q5_0),
    QROW(KVP_TYPE_Q5_1, "Q5_1", 32, 24, q5_1),
    ROW(KVP_TYPE_Q8_1, "Q8_1", 32, 36),
    QROW(KVP_TYPE_Q2_K, "Q2_K", 256, 84, q2_k),
    QROW(KVP_TYPE_Q3_K, "Q3_K", 256, 110, q3_k),
    QROW(KVP_TYPE_Q4_K, "Q4_K", 256, 144, q4_k),
    QROW(KVP_TYPE_Q5_K, "Q5_K", 256, 176, q5_k),
    QROW(KVP_TYPE_Q6_K, "Q6_K", 256, 210, q6_k),
    /* activations only: converters for tests, but no weight kernels (never in model files) */
    [KVP_TYPE_Q8_K] = {"Q8_K", 256, 292, false, kvp_dequant_row_q8_k, kvp_quantize_row_q8_k_ref},
    ROW(16, "IQ2_XXS", 256, 66),
    ROW(17, "IQ2_XS", 256, 74),
    ROW(18, "IQ3_XXS", 256, 98),
    ROW(19, "IQ1_S", 256, 50),
    QROW(KVP_TYPE_IQ4_NL, "IQ4_NL", 32, 18, iq4_nl),
    ROW(21, "IQ3_S", 256, 110),
    ROW(22, "IQ2_S", 256, 82),
    ROW(23, "IQ4_XS", 256, 136),
    ROW(24, "I8", 1, 1),
    ROW(25, "I16", 1, 2),
    ROW(26, "I32", 1, 4),
    ROW(27, "I64", 1, 8),
    ROW(28, "F64", 1, 8),
    ROW(29, "IQ1_M", 256, 56),
    ROW(34, "TQ1_0", 256, 54),
    ROW(35, "TQ2_0", 256, 66),
};

const struct kvp_type_traits *kvp_type_traits(int type)
{
    if (type < 0 || type >= KVP_TYPE_COUNT || !type_table[type].name)
        return NULL;
    return &type_table[type];
}

const char *kvp_type_name(int type)
{
    const struct kvp_type_traits *t = kvp_type_traits(type);
    return t ? t->name : "unknown";
}

int kvp_type_vec_dot_type(int type)
{
    switch (type) {
    case KVP_TYPE_F32:
    case KVP_TYPE_F16:
    case KVP_TYPE_BF16:
        return KVP_TYPE_F32;
    case KVP_TYPE_Q4_0:
    case KVP_TYPE_Q4_1:
    case KVP_TYPE_Q5_0:
    case KVP_TYPE_Q5_1:
    case KVP_TYPE_Q8_0:
    case KVP_TYPE_IQ4_NL:
        return KVP_TYPE_Q8_0;
    case KVP_TYPE_Q2_K:
    case KVP_TYPE_Q3_K:
    case KVP_TYPE_Q4_K:
    case KVP_TYPE_Q5_K:
    case KVP_TYPE_Q6_K:
        return KVP_TYPE_Q8_K;
    default:
        return -1;
    }
}

bool kvp_type_row_bytes(int type, int64_t n, size_t *out)
{
    const struct kvp_type_traits *t = kvp_type_traits(type);
    if (!t || n < 0 || n % t->blck_size != 0)
        return false;
    return !__builtin_mul_overflow((size_t)(n / t->blck_size), t->type_size, out);
}
