/*
 * Quantized tensor types and `kvpred quantize`.
 *
 * Layers of checks, each against an independent oracle:
 *   - block sizes and hand-made blocks with hand-computed values (docs/formats.md §4.4 by
 *     hand);
 *   - quantize → dequantize round trips of Gaussian weights, with a stated RMS relative error
 *     bound per type (measured values are printed; bounds have ~25% headroom);
 *   - the scalar integer dot equals, to float rounding, the double-precision dot of the
 *     dequantized weight row with the dequantized activations;
 *   - every SIMD table's dot equals the scalar table's dot to float rounding, on unaligned rows;
 *   - matvec with prepared and unprepared activations;
 *   - kvp_quantize_file on a random fixture whose dims are multiples of 256 (so K-quants are
 *     really used) and the CLI end to end on stories260K, whose n_embd 64 and n_ff 172 make every
 *     K-quant fall back (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0; ffn_down, 172 wide, → F16).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "kernels/matvec.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/types.h"
#include "gguf/gguf.h"
#include "model/quantize.h"

/* ---- helpers ---- */

static unsigned rng_state = 12345;

static float urand(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)((rng_state >> 8) & 0xffffff) / 16777216.0f;
}

static float gauss(void)
{
    float u = urand() + 1e-7f, v = urand();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

struct qtype {
    int type;
    double rms_bound; /* RMS relative round-trip error bound on Gaussian data */
};

/* Quality thresholds, empirical by nature, not rounding bounds: how far a quantizer moves
 * Gaussian weights depends on its choice of scales (the K-quants search for them, with no
 * closed form for the result), and what is guarded against is a quantizer that chooses worse
 * (a regression in that search), not an arithmetic error. They are the measured RMS relative
 * error on 8192 N(0,1) weights x ~1.25 (the run is deterministic: fixed seed, scalar code, the
 * same on every table). Measured: Q8_0 0.0054, Q4_0 0.0859, Q4_1 0.0782, Q5_0 0.0427, Q5_1
 * 0.0379, IQ4_NL 0.0746, Q2_K 0.269, Q3_K 0.143, Q4_K 0.0713, Q5_K 0.0357, Q6_K 0.0172. That
 * the kernels compute with the quantized weights exactly what the dequantized weights give is
 * checked with derived bounds (test_dot_*, test_matvec, and test_forward's check_type). */
static const struct qtype qtypes[] = {
    {KVP_TYPE_Q8_0, 0.0068}, {KVP_TYPE_Q4_0, 0.108}, {KVP_TYPE_Q4_1, 0.098},
    {KVP_TYPE_Q5_0, 0.054},  {KVP_TYPE_Q5_1, 0.048}, {KVP_TYPE_IQ4_NL, 0.094},
    {KVP_TYPE_Q2_K, 0.34},   {KVP_TYPE_Q3_K, 0.18},  {KVP_TYPE_Q4_K, 0.090},
    {KVP_TYPE_Q5_K, 0.045},  {KVP_TYPE_Q6_K, 0.022},
};
#define N_QTYPES (sizeof(qtypes) / sizeof(qtypes[0]))

static const struct kvp_simd_ops *tables[5];
static int n_tables;

static void load_tables(void)
{
    n_tables = 0;
    tables[n_tables++] = kvp_simd_scalar();
    if (kvp_simd_avx2())
        tables[n_tables++] = kvp_simd_avx2();
    if (kvp_simd_avx512())
        tables[n_tables++] = kvp_simd_avx512();
    if (kvp_simd_avx512vnni())
        tables[n_tables++] = kvp_simd_avx512vnni();
    if (kvp_simd_neon())
        tables[n_tables++] = kvp_simd_neon();
}

/* Quantize n floats to type (row of whole blocks) into a new buffer. */
static uint8_t *quantize_new(int type, const float *x, int64_t n)
{
    size_t bytes;
    assert_true(kvp_type_row_bytes(type, n, &bytes));
    uint8_t *q = malloc(bytes + 1);
    assert_non_null(q);
    kvp_type_traits(type)->from_f32(x, q, n);
    return q;
}

static float *dequant_new(int type, const void *q, int64_t n)
{
    float *y = malloc((size_t)n * sizeof(float));
    assert_non_null(y);
    kvp_type_traits(type)->to_f32(q, y, n);
    return y;
}

/* ---- sizes and hand-made blocks ---- */

static void test_block_sizes(void **state)
{
    (void)state;
    assert_int_equal(sizeof(struct kvp_block_q4_0), 18);
    assert_int_equal(sizeof(struct kvp_block_q4_1), 20);
    assert_int_equal(sizeof(struct kvp_block_q5_0), 22);
    assert_int_equal(sizeof(struct kvp_block_q5_1), 24);
    assert_int_equal(sizeof(struct kvp_block_iq4_nl), 18);
    assert_int_equal(sizeof(struct kvp_block_q2_k), 84);
    assert_int_equal(sizeof(struct kvp_block_q3_k), 110);
    assert_int_equal(sizeof(struct kvp_block_q4_k), 144);
    assert_int_equal(sizeof(struct kvp_block_q5_k), 176);
    assert_int_equal(sizeof(struct kvp_block_q6_k), 210);
    assert_int_equal(sizeof(struct kvp_block_q8_k), 292);
    for (size_t i = 0; i < N_QTYPES; i++) {
        const struct kvp_type_traits *t = kvp_type_traits(qtypes[i].type);
        assert_non_null(t);
        assert_true(t->supported);
        assert_non_null(t->to_f32);
        assert_non_null(t->from_f32);
    }
    assert_int_equal(kvp_type_traits(KVP_TYPE_Q4_K)->type_size, sizeof(struct kvp_block_q4_k));
    assert_int_equal(kvp_type_traits(KVP_TYPE_Q6_K)->type_size, sizeof(struct kvp_block_q6_k));
    assert_false(kvp_type_traits(KVP_TYPE_Q8_K)->supported); /* activations only */
    assert_int_equal(kvp_type_vec_dot_type(KVP_TYPE_Q4_0), KVP_TYPE_Q8_0);
    assert_int_equal(kvp_type_vec_dot_type(KVP_TYPE_Q6_K), KVP_TYPE_Q8_K);
    assert_int_equal(kvp_type_vec_dot_type(KVP_TYPE_F16), KVP_TYPE_F32);
    assert_int_equal(kvp_matvec_xq_bytes(KVP_TYPE_Q4_K, 512), 2 * 292);
    assert_int_equal(kvp_matvec_xq_bytes(KVP_TYPE_Q5_1, 64), 2 * 34);
}

static void decode(int type, const void *blk, float *y, int n)
{
    kvp_type_traits(type)->to_f32(blk, y, n);
}

static void test_hand_32(void **state)
{
    (void)state;
    float y[32];
    /* Q4_0, d = 0.5: low nibble j, high nibble 15 - j */
    struct kvp_block_q4_0 a = {.d = 0x3800};
    for (int j = 0; j < 16; j++)
        a.qs[j] = (uint8_t)(j | (15 - j) << 4);
    decode(KVP_TYPE_Q4_0, &a, y, 32);
    assert_true(y[0] == -4.0f && y[7] == -0.5f && y[15] == 3.5f);
    assert_true(y[16] == 3.5f && y[31] == -4.0f);

    /* Q4_1, d = 0.5, m = -1: y = q/2 - 1 */
    struct kvp_block_q4_1 b = {.d = 0x3800, .m = 0xBC00};
    memcpy(b.qs, a.qs, 16);
    decode(KVP_TYPE_Q4_1, &b, y, 32);
    assert_true(y[0] == -1.0f && y[15] == 6.5f && y[16] == 6.5f && y[31] == -1.0f);

    /* Q5_0, d = 1, fifth bits for elements 0 and 31 only, nibbles j | j << 4 */
    struct kvp_block_q5_0 c = {.d = 0x3C00, .qh = {0x01, 0, 0, 0x80}};
    for (int j = 0; j < 16; j++)
        c.qs[j] = (uint8_t)(j | j << 4);
    decode(KVP_TYPE_Q5_0, &c, y, 32);
    assert_true(y[0] == 0.0f);    /* 0 | 16 - 16 */
    assert_true(y[1] == -15.0f);  /* 1 - 16 */
    assert_true(y[16] == -16.0f); /* 0 - 16 */
    assert_true(y[31] == 15.0f);  /* 15 | 16 - 16 */

    /* Q5_1, d = 2, m = 1: y = 2q + 1 */
    struct kvp_block_q5_1 e = {.d = 0x4000, .m = 0x3C00, .qh = {0x01, 0, 0, 0x80}};
    memcpy(e.qs, c.qs, 16);
    decode(KVP_TYPE_Q5_1, &e, y, 32);
    assert_true(y[0] == 33.0f && y[1] == 3.0f && y[16] == 1.0f && y[31] == 63.0f);

    /* IQ4_NL, d = 0.5: the code book in order, then reversed */
    struct kvp_block_iq4_nl f = {.d = 0x3800};
    memcpy(f.qs, a.qs, 16);
    decode(KVP_TYPE_IQ4_NL, &f, y, 32);
    assert_true(y[0] == -63.5f && y[8] == 0.5f && y[15] == 56.5f);
    assert_true(y[16] == 56.5f && y[31] == -63.5f);
}

static void test_hand_k(void **state)
{
    (void)state;
    float y[256];
    /* Q4_K: sc = {1,2,3,4,17,33,63,5}, m = {0,1,2,3,16,40,63,7}, packed by hand */
    static const uint8_t ks[12] = {0x41, 0x82, 0xC3, 0x04, 0x40, 0x81,
                                   0xC2, 0x03, 0x01, 0x81, 0xFF, 0x75};
    uint8_t sc[8], m[8];
    kvp_k_scales_unpack(ks, sc, m);
    static const uint8_t want_sc[8] = {1, 2, 3, 4, 17, 33, 63, 5};
    static const uint8_t want_m[8] = {0, 1, 2, 3, 16, 40, 63, 7};
    assert_memory_equal(sc, want_sc, 8);
    assert_memory_equal(m, want_m, 8);
    struct kvp_block_q4_k k4 = {.d = 0x3C00, .dmin = 0x3800};
    memcpy(k4.scales, ks, 12);
    memset(k4.qs, 0x3A, sizeof(k4.qs)); /* low nibble 10, high nibble 3 */
    decode(KVP_TYPE_Q4_K, &k4, y, 256);
    /* chunk c: low half d·sc[2c]·10 - dmin·m[2c], high half d·sc[2c+1]·3 - dmin·m[2c+1] */
    static const float q4k[8] = {10, 5.5f, 29, 10.5f, 162, 79, 598.5f, 11.5f};
    for (int e = 0; e < 256; e++)
        assert_true(y[e] == q4k[e / 32]);

    /* Q5_K: same scales; qh = 0x55 sets the fifth bit of every low half (bits 0, 2, 4, 6) */
    struct kvp_block_q5_k k5 = {.d = 0x3C00, .dmin = 0x3800};
    memcpy(k5.scales, ks, 12);
    memset(k5.qs, 0x3A, sizeof(k5.qs));
    memset(k5.qh, 0x55, sizeof(k5.qh));
    decode(KVP_TYPE_Q5_K, &k5, y, 256);
    static const float q5k[8] = {26, 5.5f, 77, 10.5f, 434, 79, 1606.5f, 11.5f};
    for (int e = 0; e < 256; e++)
        assert_true(y[e] == q5k[e / 32]);

    /* Q6_K: d = 0.5, scales[s] = s - 8, ql = 0x21 (lo 1, hi 2), qh = 0xE4 (2-bit fields 0,1,2,3):
     * quants per 32-run k of each half: 1-32 = -31, 17-32 = -15, 34-32 = 2, 50-32 = 18 */
    struct kvp_block_q6_k k6 = {.d = 0x3800};
    memset(k6.ql, 0x21, sizeof(k6.ql));
    memset(k6.qh, 0xE4, sizeof(k6.qh));
    for (int s = 0; s < 16; s++)
        k6.scales[s] = (int8_t)(s - 8);
    decode(KVP_TYPE_Q6_K, &k6, y, 256);
    static const float q6[4] = {-31, -15, 2, 18};
    for (int e = 0; e < 256; e++)
        assert_true(y[e] == 0.5f * (float)(e / 16 - 8) * q6[(e % 128) / 32]);

    /* Q2_K: d = 1, dmin = 0.5, scales[s] = s | (15 - s) << 4, qs = 0xE4 → quant j in run j */
    struct kvp_block_q2_k k2 = {.d = 0x3C00, .dmin = 0x3800};
    for (int s = 0; s < 16; s++)
        k2.scales[s] = (uint8_t)(s | (15 - s) << 4);
    memset(k2.qs, 0xE4, sizeof(k2.qs));
    decode(KVP_TYPE_Q2_K, &k2, y, 256);
    for (int e = 0; e < 256; e++) {
        int s = e / 16, j = (e % 128) / 32;
        assert_true(y[e] == (float)(s * j) - 0.5f * (float)(15 - s));
    }

    /* Q3_K: stored 6-bit scales i + 24 (so sc_i = i - 8), packed by hand; hmask 0x0F: the
     * first half has the high bit (no -4), the second half not; qs = 0xE4 → low bits j */
    static const uint8_t s3[12] = {0x08, 0x19, 0x2A, 0x3B, 0x4C, 0x5D,
                                   0x6E, 0x7F, 0xA5, 0xA5, 0xA5, 0xA5};
    int8_t sc3[16];
    kvp_q3_k_scales_unpack(s3, sc3);
    for (int i = 0; i < 16; i++)
        assert_int_equal(sc3[i], i - 8);
    struct kvp_block_q3_k k3 = {.d = 0x3C00};
    memcpy(k3.scales, s3, 12);
    memset(k3.hmask, 0x0F, sizeof(k3.hmask));
    memset(k3.qs, 0xE4, sizeof(k3.qs));
    decode(KVP_TYPE_Q3_K, &k3, y, 256);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, j = (e % 128) / 32;
        assert_true(y[e] == (float)((e / 16 - 8) * (j - 4 * h)));
    }

    /* Q8_K: f32 d, bsums */
    struct kvp_block_q8_k k8 = {.d = 0.25f};
    for (int j = 0; j < 256; j++)
        k8.qs[j] = (int8_t)(j % 255 - 127);
    decode(KVP_TYPE_Q8_K, &k8, y, 256);
    assert_true(y[0] == -31.75f && y[254] == 31.75f);
}

/* ---- round trips ---- */

enum { RT_N = 256 * 32 };

static double rms_rel(const float *x, const float *y, int64_t n)
{
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

static void test_roundtrip(void **state)
{
    (void)state;
    float *x = malloc(RT_N * sizeof(float));
    assert_non_null(x);
    rng_state = 7;
    for (int i = 0; i < RT_N; i++)
        x[i] = gauss();
    int bad = 0;
    for (size_t t = 0; t < N_QTYPES; t++) {
        uint8_t *q = quantize_new(qtypes[t].type, x, RT_N);
        float *y = dequant_new(qtypes[t].type, q, RT_N);
        double e = rms_rel(x, y, RT_N);
        print_message("  %-6s RMS relative error %.4f (bound %.4f)\n",
                      kvp_type_name(qtypes[t].type), e, qtypes[t].rms_bound);
        bad += e > qtypes[t].rms_bound;
        free(q);
        free(y);
    }
    assert_int_equal(bad, 0);
    /* constant and zero rows stay finite */
    float z[256] = {0}, c[256];
    for (int i = 0; i < 256; i++)
        c[i] = 0.75f;
    for (size_t t = 0; t < N_QTYPES; t++) {
        for (int pass = 0; pass < 2; pass++) {
            uint8_t *q = quantize_new(qtypes[t].type, pass ? c : z, 256);
            float *y = dequant_new(qtypes[t].type, q, 256);
            for (int i = 0; i < 256; i++) {
                assert_true(isfinite(y[i]));
                /* zero rows stay exactly zero (no 0/0). A constant row c is on every type's
                 * grid in exact arithmetic: all its (sub-)blocks have the same range, so each
                 * sub-block scale is the largest and takes the top integer level exactly, the
                 * quants the top level, a positive row's minimum is clamped to 0; what remains
                 * is the f16 rounding of the block's scale and of its minimum, 2^-11 relative
                 * on parts no larger than c: 2·2^-11·|c| (measured up to 0.58·2^-11·|c|, Q6_K) */
                if (pass == 0)
                    assert_true(y[i] == 0.0f);
                else
                    assert_true(fabsf(y[i] - 0.75f) <= 2 * 0x1p-11 * 0.75f);
            }
            free(q);
            free(y);
        }
    }
    free(x);
}

static void test_q8_k(void **state)
{
    (void)state;
    enum { N = 1024 };
    float x[N], y[N];
    rng_state = 11;
    for (int i = 0; i < N; i++)
        x[i] = gauss() * 3.0f;
    uint8_t ref[4 * 292], got[4 * 292 + 1];
    kvp_quantize_row_q8_k_ref(x, ref, N);
    for (int b = 0; b < 4; b++) {
        struct kvp_block_q8_k k;
        memcpy(&k, ref + b * 292, sizeof(k));
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) {
                s += k.qs[16 * g + j];
                assert_true(k.qs[16 * g + j] >= -127);
            }
            assert_int_equal(k.bsums[g], s);
        }
    }
    kvp_dequant_row_q8_k(ref, y, N);
    /* q = round(x / d) with d = amax / 127 and 1 / d each rounded once (2u relative on x / d):
     * every element within d/2 + 2u·|x| of its original, then y = q·d rounds once more (u) */
    for (int b = 0; b < N / 256; b++) {
        double amax = 0;
        for (int i = 0; i < 256; i++)
            amax = fmax(amax, fabs(x[b * 256 + i]));
        double d = amax / 127 * (1 + 0x1p-24);
        for (int i = b * 256; i < (b + 1) * 256; i++)
            assert_true(fabs((double)y[i] - x[i]) <= d / 2 + 3 * 0x1p-24 * (fabs(x[i]) + d / 2));
    }
    load_tables();
    for (int t = 0; t < n_tables; t++) {
        tables[t]->quantize_q8_k(x, got + 1, N); /* unaligned destination */
        assert_memory_equal(got + 1, ref, sizeof(ref));
    }
}

/* ---- dots ---- */

/* Activations for weights of type: x quantized to the matching format, plus its dequantized
 * values. */
static uint8_t *prepare(int type, const float *x, int64_t n, float *xd)
{
    int vt = kvp_type_vec_dot_type(type);
    uint8_t *xq = malloc(kvp_matvec_xq_bytes(type, n) + 1);
    assert_non_null(xq);
    if (vt == KVP_TYPE_Q8_0) {
        kvp_quantize_row_q8_0_ref(x, xq, n);
        kvp_type_traits(KVP_TYPE_Q8_0)->to_f32(xq, xd, n);
    } else {
        kvp_quantize_row_q8_k_ref(x, xq, n);
        kvp_dequant_row_q8_k(xq, xd, n);
    }
    return xq;
}

/* A quantized dot sums integer products exactly per block and then rounds a few f32 terms per
 * 32 weights (scale products, the fused adds, the K-quants' minimums per 256): gamma(n/32 + 4)
 * relative to the terms (testutil.h), two kernels against each other twice that. The terms
 * (dot_terms) are Σ|w·x| of the dequantized values for the types without block minimums; for
 * Q4_1/Q5_1/Q2_K/Q4_K/Q5_K each weight is a scaled part plus its block's minimum (w = s + mn),
 * which the kernels sum apart, so the terms are Σ (|w - mn| + |mn|)·|x|. */
static double dot_bound(int64_t n)
{
    return kvp_test_gamma((double)n / 32 + 4);
}

/* Each weight's block-minimum part mn (0 for the types without): the row dequantized with every
 * quant set to 0 leaves y = m (Q4_1, Q5_1) or -dmin·m_j (Q2_K, Q4_K, Q5_K). */
static void min_part(int type, const uint8_t *wq, int64_t n, float *mn)
{
    const struct kvp_type_traits *t = kvp_type_traits(type);
    size_t off[2] = {0, 0}, len[2] = {0, 0}; /* the quant fields of a block */
#define FIELD(i, T, f) (off[i] = offsetof(struct T, f), len[i] = sizeof(((struct T *)0)->f))
    switch (type) {
    case KVP_TYPE_Q4_1: FIELD(0, kvp_block_q4_1, qs); break;
    case KVP_TYPE_Q5_1: FIELD(0, kvp_block_q5_1, qs), FIELD(1, kvp_block_q5_1, qh); break;
    case KVP_TYPE_Q2_K: FIELD(0, kvp_block_q2_k, qs); break;
    case KVP_TYPE_Q4_K: FIELD(0, kvp_block_q4_k, qs); break;
    case KVP_TYPE_Q5_K: FIELD(0, kvp_block_q5_k, qs), FIELD(1, kvp_block_q5_k, qh); break;
    default:
        memset(mn, 0, (size_t)n * sizeof(float));
        return;
    }
#undef FIELD
    size_t bytes;
    assert_true(kvp_type_row_bytes(type, n, &bytes));
    uint8_t *z = malloc(bytes);
    assert_non_null(z);
    memcpy(z, wq, bytes);
    for (int64_t b = 0; b < n / t->blck_size; b++)
        for (int f = 0; f < 2; f++)
            memset(z + (size_t)b * t->type_size + off[f], 0, len[f]);
    t->to_f32(z, mn, n);
    free(z);
}

/* Σ|terms| of the dot of a row wq (dequantized: wd) with xd, see dot_bound */
static double dot_terms(int type, const uint8_t *wq, const float *wd, const float *xd, int64_t n)
{
    float *mn = malloc((size_t)n * sizeof(float));
    assert_non_null(mn);
    min_part(type, wq, n, mn);
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (fabs((double)wd[i] - mn[i]) + fabs((double)mn[i])) * fabs((double)xd[i]);
    free(mn);
    return s;
}

static float scalar_dot(int type, const void *w, const void *xq, int64_t n)
{
    if (type == KVP_TYPE_Q8_0)
        return kvp_simd_scalar()->dot_q8_0(w, xq, n);
    return kvp_simd_scalar()->dot_q[type](w, xq, n);
}

static void test_dot_oracle(void **state)
{
    (void)state;
    enum { N = 256 * 8 };
    float *w = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float));
    float *xd = malloc(N * sizeof(float));
    assert_true(w && x && xd);
    for (int rep = 0; rep < 3; rep++) {
        rng_state = 100u + (unsigned)rep;
        for (int i = 0; i < N; i++) {
            w[i] = gauss() + (rep == 2 ? 0.5f : 0.0f); /* rep 2: offset weights (mins matter) */
            x[i] = gauss() * (rep == 1 ? 10.0f : 1.0f);
        }
        for (size_t t = 0; t < N_QTYPES; t++) {
            int type = qtypes[t].type;
            uint8_t *wq = quantize_new(type, w, N);
            float *wd = dequant_new(type, wq, N);
            uint8_t *xq = prepare(type, x, N, xd);
            double ref = 0, mag = dot_terms(type, wq, wd, xd, N);
            for (int i = 0; i < N; i++)
                ref += (double)wd[i] * xd[i];
            double got = scalar_dot(type, wq, xq, N);
            if (fabs(got - ref) > dot_bound(N) * mag)
                print_message("  %s: integer dot %.7g, dequantized dot %.7g\n", kvp_type_name(type),
                              got, ref);
            assert_true(fabs(got - ref) <= dot_bound(N) * mag);
            free(wq);
            free(wd);
            free(xq);
        }
    }
    free(w);
    free(x);
    free(xd);
}

static void test_dot_simd(void **state)
{
    (void)state;
    load_tables();
    print_message("  tables:");
    for (int k = 0; k < n_tables; k++)
        print_message(" %s", tables[k]->name);
    print_message("\n");
    /* 160 = five 32-element blocks (odd tails; K-quants skip it) */
    static const int64_t lens[] = {160, 256, 512, 256 * 7};
    float *w = malloc(256 * 7 * sizeof(float)), *x = malloc(256 * 7 * sizeof(float));
    float *xd = malloc(256 * 7 * sizeof(float));
    assert_true(w && x && xd);
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        int64_t n = lens[li];
        rng_state = 300u + (unsigned)li;
        for (int64_t i = 0; i < n; i++) {
            w[i] = gauss() + 0.3f;
            x[i] = gauss();
        }
        for (size_t t = 0; t < N_QTYPES; t++) {
            int type = qtypes[t].type;
            size_t wb;
            if (!kvp_type_row_bytes(type, n, &wb))
                continue;
            uint8_t *wq = quantize_new(type, w, n);
            uint8_t *wu = malloc(wb + 3); /* the same row at an odd address */
            memcpy(wu + 3, wq, wb);
            uint8_t *xq = prepare(type, x, n, xd);
            float ref = scalar_dot(type, wq, xq, n);
            float *wd = dequant_new(type, wq, n);
            double mag = dot_terms(type, wq, wd, xd, n);
            for (int k = 1; k < n_tables; k++) {
                float got = type == KVP_TYPE_Q8_0 ? tables[k]->dot_q8_0(wu + 3, xq, n)
                                                  : tables[k]->dot_q[type](wu + 3, xq, n);
                if (fabs((double)got - ref) > 2 * dot_bound(n) * mag)
                    print_message("  %s %s n=%lld: %.8g vs scalar %.8g\n", tables[k]->name,
                                  kvp_type_name(type), (long long)n, got, ref);
                assert_true(fabs((double)got - ref) <= 2 * dot_bound(n) * mag);
                /* NEON's integer dots sum each block exactly and then take the scalar kernel's
                 * float steps in its order (simd_neon.c); its other types are the scalar ones */
                if (!strcmp(tables[k]->name, "neon"))
                    assert_true(got == ref);
            }
            free(wq);
            free(wu);
            free(xq);
            free(wd);
        }
    }
    free(w);
    free(x);
    free(xd);
}

/* matvec: prepared vs unprepared activations, against per-row scalar dots; also the prefill
 * dequantizer. cols = 4352 crosses the 4096-column chunk of the unprepared path. */
static void test_matvec(void **state)
{
    (void)state;
    /* ROWS: odd, so the four-row kernels leave a remainder, and more than 128 KiB of every
     * type but Q2_K, so the prefetching paths run too */
    enum { COLS = 4352, ROWS = 67 };
    float *w = malloc((size_t)COLS * ROWS * sizeof(float)), *x = malloc(COLS * sizeof(float));
    float *xd = malloc(COLS * sizeof(float)), *deq = malloc((size_t)COLS * ROWS * sizeof(float));
    assert_true(w && x && xd && deq);
    rng_state = 99;
    for (int i = 0; i < COLS * ROWS; i++)
        w[i] = gauss();
    for (int i = 0; i < COLS; i++)
        x[i] = gauss();
    load_tables();
    for (size_t t = 0; t < N_QTYPES; t++) {
        int type = qtypes[t].type;
        size_t rb;
        kvp_type_row_bytes(type, COLS, &rb);
        uint8_t *q = malloc(rb * ROWS);
        for (int r = 0; r < ROWS; r++)
            kvp_type_traits(type)->from_f32(w + (size_t)r * COLS, q + r * rb, COLS);
        struct kvp_mat M = {.type = type, .cols = COLS, .rows = ROWS, .row_bytes = rb, .data = q};
        uint8_t *xq = prepare(type, x, COLS, xd);
        float ref[ROWS], y1[ROWS], y2[ROWS];
        double mag[ROWS];
        for (int r = 0; r < ROWS; r++) {
            ref[r] = scalar_dot(type, q + r * rb, xq, COLS);
            float row[COLS];
            kvp_type_traits(type)->to_f32(q + r * rb, row, COLS);
            mag[r] = dot_terms(type, q + r * rb, row, xd, COLS);
        }
        for (int k = 0; k < n_tables; k++) {
            kvp_matvec_rows_ops(tables[k], &M, x, xq, y1, 0, ROWS);
            kvp_matvec_rows_ops(tables[k], &M, x, NULL, y2, 0, ROWS);
            for (int r = 0; r < ROWS; r++) {
                assert_true(fabs((double)y1[r] - ref[r]) <= 2 * dot_bound(COLS) * mag[r]);
                assert_true(fabs((double)y2[r] - ref[r]) <= 2 * dot_bound(COLS) * mag[r]);
            }
            /* the ranges threads get (kvp_split_range over 2 and 3 threads, and odd pieces)
             * agree with the oracle as the full range does */
            static const int cuts[][4] = {{0, 34, 67, 67}, {0, 23, 46, 67}, {0, 5, 38, 67}};
            for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
                for (int r = 0; r < ROWS; r++)
                    y2[r] = NAN;
                for (int p = 0; p < 3; p++)
                    kvp_matvec_rows_ops(tables[k], &M, x, xq, y2, cuts[c][p], cuts[c][p + 1]);
                for (int r = 0; r < ROWS; r++)
                    assert_true(fabs((double)y2[r] - ref[r]) <= 2 * dot_bound(COLS) * mag[r]);
            }
        }
        kvp_mat_dequant_rows(&M, deq, 2, 5);
        float row[COLS];
        kvp_type_traits(type)->to_f32(q + 3 * rb, row, COLS);
        assert_memory_equal(deq + COLS, row, sizeof(row));
        free(q);
        free(xq);
    }
    free(w);
    free(x);
    free(xd);
    free(deq);
}

/* ---- kvp_quantize_file ---- */

static void test_pick_type(void **state)
{
    (void)state;
    assert_int_equal(kvp_quantize_pick_type(KVP_TYPE_Q4_K, 4096), KVP_TYPE_Q4_K);
    assert_int_equal(kvp_quantize_pick_type(KVP_TYPE_Q4_K, 896), KVP_TYPE_Q5_0);
    assert_int_equal(kvp_quantize_pick_type(KVP_TYPE_Q5_K, 576), KVP_TYPE_Q5_1);
    assert_int_equal(kvp_quantize_pick_type(KVP_TYPE_Q6_K, 64), KVP_TYPE_Q8_0);
    assert_int_equal(kvp_quantize_pick_type(KVP_TYPE_Q3_K, 64), KVP_TYPE_IQ4_NL);
    assert_int_equal(kvp_quantize_pick_type(KVP_TYPE_Q4_K, 172), KVP_TYPE_F16);
    assert_int_equal(kvp_quantize_pick_type(KVP_TYPE_Q4_0, 172), KVP_TYPE_F16);
    assert_int_equal(kvp_quantize_pick_type(KVP_TYPE_BF16, 172), KVP_TYPE_BF16);
    assert_int_equal(kvp_quantize_pick_type(KVP_TYPE_Q8_1, 64), -1);
    assert_int_equal(kvp_quantize_type_from_name("q4_k"), KVP_TYPE_Q4_K);
    assert_int_equal(kvp_quantize_type_from_name("IQ4_NL"), KVP_TYPE_IQ4_NL);
    assert_int_equal(kvp_quantize_type_from_name("Q8_K"), -1);
    assert_int_equal(kvp_quantize_ftype(KVP_TYPE_Q6_K), 18);
    assert_int_equal(kvp_quantize_ftype(KVP_TYPE_Q5_0), 8);
}

/* Max |logit difference| / max |logit| between two models over a short sequence (decode path,
 * one token at a time, so the integer dots run). */
static double logit_error(const char *a, const char *b)
{
    kvp_model *ma = NULL, *mb = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_model_open(a, NULL, &ma, &err), 0);
    if (kvp_model_open(b, NULL, &mb, &err) != 0)
        fail_msg("%s", err.msg);
    struct kvp_ctx_params cp = {.n_ctx = 16};
    kvp_ctx *ca = NULL, *cb = NULL;
    assert_int_equal(kvp_ctx_init(ma, &cp, &ca, &err), 0);
    assert_int_equal(kvp_ctx_init(mb, &cp, &cb, &err), 0);
    struct kvp_model_info info;
    kvp_model_get_info(ma, &info);
    int nv = info.n_vocab;
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
    double emax = 0, smax = 0;
    for (int i = 0; i < 8; i++) {
        int32_t id = (i * 37 + 5) % nv;
        assert_int_equal(kvp_eval(ca, &id, 1, la, false, &err), 0);
        assert_int_equal(kvp_eval(cb, &id, 1, lb, false, &err), 0);
        for (int v = 0; v < nv; v++) {
            emax = fmax(emax, fabs((double)la[v] - lb[v]));
            smax = fmax(smax, fabs((double)la[v]));
        }
    }
    free(la);
    free(lb);
    kvp_ctx_free(ca);
    kvp_ctx_free(cb);
    kvp_model_close(ma);
    kvp_model_close(mb);
    return emax / smax;
}

static void test_quantize_fixture(void **state)
{
    (void)state;
    /* dims multiples of 256, so every K-quant is used as such; vocab 96 rows */
    struct kvp_test_model_spec sp = {.n_vocab = 96,
                                     .n_embd = 256,
                                     .n_layer = 1,
                                     .n_head = 4,
                                     .n_head_kv = 2,
                                     .n_ff = 256,
                                     .n_ctx = 32,
                                     .type = 0,
                                     .embd_type = 0,
                                     .tied = 0,
                                     .seed = 5};
    char *src = kvp_test_tmpfile(".gguf"), *dst = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(&sp, src, NULL), 0);
    /* logit error thresholds (relative to the largest logit): quality thresholds like the RMS
     * ones above, empirical for the same reason (what quantization does to a model's output is
     * the quantizer's choice of scales, not a rounding error with a bound; that the quantized
     * model computes what its dequantized weights give is test_forward's check_type, derived).
     * The run is deterministic up to f32 rounding, far below these. Measured: F16 0.0003,
     * Q4_0 0.106, Q2_K 0.334,
     * Q3_K 0.219, Q4_K 0.077, Q5_K 0.041, Q6_K 0.023 (the other 32-element types run in
     * test_forward.c and on stories260K below; this fixture is for the K-quants) */
    static const struct {
        int type;
        double bound;
    } cases[] = {
        {KVP_TYPE_F16, 1e-3},  {KVP_TYPE_Q4_0, 0.15}, {KVP_TYPE_Q2_K, 0.6},  {KVP_TYPE_Q3_K, 0.3},
        {KVP_TYPE_Q4_K, 0.15}, {KVP_TYPE_Q5_K, 0.08}, {KVP_TYPE_Q6_K, 0.04},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct kvp_quantize_params p = {.type = cases[c].type};
        struct kvp_quantize_stats st;
        struct kvp_err err = {0};
        if (kvp_quantize_file(src, dst, &p, &st, &err) != 0)
            fail_msg("%s", err.msg);
        assert_int_equal(st.n_fallback, 0);
        assert_int_equal(st.n_converted, 9); /* token_embd, output, 7 layer matrices */
        struct kvp_gguf *g = NULL;
        assert_int_equal(kvp_gguf_open(dst, &g, &err), 0);
        assert_int_equal(kvp_gguf_find_tensor(g, "blk.0.ffn_down.weight")->type, cases[c].type);
        assert_int_equal(kvp_gguf_find_tensor(g, "output.weight")->type, cases[c].type);
        assert_int_equal(kvp_gguf_find_tensor(g, "blk.0.attn_norm.weight")->type, KVP_TYPE_F32);
        int64_t ft;
        assert_int_equal(kvp_gguf_get_int(g, "general.file_type", &ft, &err), 0);
        assert_int_equal(ft, kvp_quantize_ftype(cases[c].type));
        const char *s;
        size_t len;
        assert_int_equal(kvp_gguf_get_str(g, "general.name", &s, &len, &err), 0);
        assert_int_equal(len, strlen("random test model"));
        kvp_gguf_close(g);
        double e = logit_error(src, dst);
        print_message("  fixture %-6s max logit error %.4f (bound %.3f)\n",
                      kvp_type_name(cases[c].type), e, cases[c].bound);
        assert_true(e <= cases[c].bound);
    }
    /* --keep-output leaves output.weight alone */
    struct kvp_quantize_params p = {.type = KVP_TYPE_Q4_K, .keep_output = true};
    struct kvp_err err = {0};
    assert_int_equal(kvp_quantize_file(src, dst, &p, NULL, &err), 0);
    struct kvp_gguf *g = NULL;
    assert_int_equal(kvp_gguf_open(dst, &g, &err), 0);
    assert_int_equal(kvp_gguf_find_tensor(g, "output.weight")->type, KVP_TYPE_F32);
    assert_int_equal(kvp_gguf_find_tensor(g, "token_embd.weight")->type, KVP_TYPE_Q4_K);
    kvp_gguf_close(g);
    /* the thread count does not change the output */
    {
        char *d2 = kvp_test_tmpfile(".gguf");
        struct kvp_quantize_params p1 = {.type = KVP_TYPE_Q4_K, .n_threads = 1};
        struct kvp_quantize_params p3 = {.type = KVP_TYPE_Q4_K, .n_threads = 3};
        assert_int_equal(kvp_quantize_file(src, dst, &p1, NULL, &err), 0);
        assert_int_equal(kvp_quantize_file(src, d2, &p3, NULL, &err), 0);
        size_t n1, n2;
        char *b1 = kvp_test_read_file(dst, &n1), *b2 = kvp_test_read_file(d2, &n2);
        assert_true(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0);
        free(b1);
        free(b2);
        remove(d2);
        free(d2);
    }
    /* a quantized input can be re-quantized; a bad target is refused */
    struct kvp_quantize_params p2 = {.type = KVP_TYPE_Q8_0};
    assert_int_equal(kvp_quantize_file(dst, dst, &p2, NULL, &err), 0);
    struct kvp_quantize_params bad = {.type = KVP_TYPE_Q8_K};
    assert_int_equal(kvp_quantize_file(src, dst, &bad, NULL, &err), KVP_EINVAL);
    assert_int_equal(kvp_quantize_file("/nonexistent.gguf", dst, &p2, NULL, &err), KVP_EIO);
    remove(src);
    remove(dst);
    free(src);
    free(dst);
}

/* ---- CLI end to end on stories260K ---- */

static double run_ppl(const char *cli, const char *model, const char *text)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s perplexity -m %s -f %s --bytes 60000 -c 256 --json", cli, model,
             text);
    char *out = NULL;
    int rc = kvp_test_run(cmd, &out, 0);
    assert_int_equal(rc, 0);
    const char *p = strstr(out, "\"ppl\":");
    assert_non_null(p);
    double ppl = atof(p + 6);
    free(out);
    return ppl;
}

static void test_cli_stories(void **state)
{
    (void)state;
    const char *cli = kvp_test_cli();
    if (!cli)
        kvp_test_skip_missing("KVP_CLI not set");
    KVP_REQUIRE_SHARED(mpath, "models/stories260K.gguf");
    KVP_REQUIRE_SHARED(tpath, "data/tinystories/tinystories_val.txt");
    /* stories260K's rows are 64 (and ffn_down's 172) wide: every K-quant falls back, and
     * ffn_down (172 is not a multiple of 32) becomes F16 in every quantized file. Perplexity
     * margins above the reference F32 3.9152 (reference/stories260K_ppl.json): quality
     * thresholds, empirical (see qtypes above), not rounding bounds; measured delta in
     * parentheses: F16 0.005 (-0.0002), BF16 0.005 (+0.0004), Q8_0 and Q6_K 0.01 (+0.0035),
     * Q5_1 and Q5_K 0.06 (+0.035), Q5_0 and Q4_K 0.17 (+0.109), Q4_1 0.45 (+0.304), Q4_0 0.55
     * (+0.369), IQ4_NL, Q3_K and Q2_K 0.5 (+0.335). A perplexity run takes ~5 s under ASan, so
     * by default Q4_K (Q5_0 + F16, what a Q4_K_M download of a model this narrow holds) runs at the
     * full 60000 bytes and the rest are quantized and opened;
     * KVP_TEST_FULL=1 runs every type. */
    static const struct {
        const char *name;
        double margin;
        const char *types; /* `kvpred info` matrix types line */
        bool always;
    } cases[] = {
        {"F16", 0.005, "F16×37", false},           {"BF16", 0.005, "BF16×37", false},
        {"Q8_0", 0.01, "F16×5 Q8_0×32", false},    {"Q6_K", 0.01, "F16×5 Q8_0×32", false},
        {"Q5_1", 0.06, "F16×5 Q5_1×32", false},    {"Q5_K", 0.06, "F16×5 Q5_1×32", false},
        {"Q5_0", 0.17, "F16×5 Q5_0×32", false},    {"Q4_K", 0.17, "F16×5 Q5_0×32", true},
        {"Q4_1", 0.45, "F16×5 Q4_1×32", false},    {"Q4_0", 0.55, "F16×5 Q4_0×32", false},
        {"IQ4_NL", 0.5, "F16×5 IQ4_NL×32", false}, {"Q3_K", 0.5, "F16×5 IQ4_NL×32", false},
        {"Q2_K", 0.5, "F16×5 IQ4_NL×32", false},
    };
    const double f32 = 3.9152;
    const char *full = getenv("KVP_TEST_FULL");
    bool all = full && *full && strcmp(full, "0") != 0;
    char *out = kvp_test_tmpfile(".gguf");
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char cmd[2048];
        snprintf(cmd, sizeof(cmd), "%s quantize %s %s --type %s", cli, mpath, out, cases[c].name);
        char *msg = NULL;
        assert_int_equal(kvp_test_run(cmd, &msg, 1), 0);
        free(msg);
        snprintf(cmd, sizeof(cmd), "%s info -m %s", cli, out);
        assert_int_equal(kvp_test_run(cmd, &msg, 1), 0);
        if (!strstr(msg, cases[c].types))
            fail_msg("%s: expected matrix types %s in:\n%s", cases[c].name, cases[c].types, msg);
        free(msg);
        if (!cases[c].always && !all)
            continue;
        double ppl = run_ppl(cli, out, tpath);
        print_message("  stories260K %-6s ppl %.4f (F32 %.4f, margin %.3f)\n", cases[c].name, ppl,
                      f32, cases[c].margin);
        /* below: empirical too; noise in the rounding may help by a little (F16 measured
         * -0.0002), a quantized model better than its original by 0.01 means the evaluation
         * changed */
        assert_true(ppl <= f32 + cases[c].margin && ppl >= f32 - 0.01);
    }
    /* CLI errors: one line each */
    char cmd[2048], *msg = NULL;
    snprintf(cmd, sizeof(cmd), "%s quantize %s %s --type Q9_9", cli, mpath, out);
    kvp_test_expect_error(cmd, "unknown type 'Q9_9'");
    snprintf(cmd, sizeof(cmd), "%s quantize %s %s", cli, mpath, out);
    kvp_test_expect_error(cmd, "--type is required");
    snprintf(cmd, sizeof(cmd), "%s quantize --help", cli);
    assert_int_equal(kvp_test_run(cmd, &msg, 1), 0);
    assert_non_null(strstr(msg, "usage: kvpred quantize"));
    free(msg);
    remove(out);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_sizes), cmocka_unit_test(test_hand_32),
        cmocka_unit_test(test_hand_k),      cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_q8_k),        cmocka_unit_test(test_dot_oracle),
        cmocka_unit_test(test_dot_simd),    cmocka_unit_test(test_matvec),
        cmocka_unit_test(test_pick_type),   cmocka_unit_test(test_quantize_fixture),
        cmocka_unit_test(test_cli_stories),
    };
    /* KVP_TEST_FILTER=PATTERN runs only the matching tests (cmocka's * and ? wildcards): the
     * emulated aarch64 run in CI takes the dots alone (scripts/test_arm64.sh) */
    const char *filter = getenv("KVP_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
