/*
 * Tests for the kernel layer: f16/bf16 scalars, the Q8_0 quantizer, every kernel of every SIMD
 * table this CPU can run (scalar, avx2, avx512), the mat-vec entry points and the KVP_SIMD
 * override.
 *
 * The oracle for every kernel is a plain double-precision loop written here, fed with the exact
 * values the kernel sees (f16/bf16/Q8_0 inputs are decoded by the scalar converters first, which
 * are exact). Float kernels then differ from the oracle only by float rounding, so each bound is
 * stated relative to the sum of absolute terms Σ|a_i·b_i| (the natural scale of summation
 * error) and is written next to the kernel's test. Sizes are deliberately odd so that every
 * remainder path (masked tails, single-row leftovers, odd Q8_0 block counts) runs, and inputs sit
 * at unaligned addresses. The largest relative error seen per check is printed for the record.
 *
 * Invoked as `test_kernels --print-simd`, the binary instead prints the name of kvp_simd() as
 * chosen from its environment by several racing threads; the override test runs itself that way.
 */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fastmath.h"
#include "core/platform.h"
#include "kernels/matvec.h"
#include "kernels/simd.h"
#include "kernels/types.h"

/* ---- per-kernel bounds (relative to Σ|terms| unless noted) ----
 * Sums and dots of n f32 terms: gamma(n) (testutil.h), whatever order and lane split a table
 * uses; two kernels against each other: twice that. The kernels' inputs are exact (f16, bf16 and
 * Q8_0 decode exactly; Q8_0 products are exact integers times f32 scales, n/32 + 2 roundings per
 * block sum, inside gamma(n)). Against the original f32 matrix the weight type's own rounding
 * adds (check_matvec_type). */
#define GAMMA(n) kvp_test_gamma((double)(n))
#define U32 0x1p-24 /* f32 unit roundoff */
/* y + a·x: the product and the sum each round once (FMA: once in all): 2u·(|y| + |a·x|) */
#define TOL_AXPY (2 * U32)
/* exp_sum per element, relative to exp(x) of the float argument: Cephes' polynomial on
 * |r| <= ln2/2 is accurate to 2^-24-ish (Moshier), the two-part reduction r = x - n·ln2 adds
 * u·|r|, the six Horner FMAs round once each on values below 1.5, and 2^n is exact: under 8u. */
#define TOL_EXP (8 * U32)
/* the returned sum: each element within TOL_EXP, then gamma(n) for the additions */
#define TOL_EXP_SUM(n) (TOL_EXP + GAMMA(n))

/* ============================== fixtures ============================== */

static uint64_t rng_state;

static void rng_seed(uint64_t s)
{
    rng_state = s * 0x9E3779B97F4A7C15ull + 1;
}

static uint64_t rng_next(void) /* xorshift64* */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static float rng_uniform(void) /* [-1, 1) */
{
    return (float)((double)(rng_next() >> 40) / (double)(1ull << 23) - 1.0);
}

static void fill(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * rng_uniform();
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* The tables this CPU can run, scalar first. */
static int tables(const struct kvp_simd_ops **out)
{
    int n = 0;
    out[n++] = kvp_simd_scalar();
    if (kvp_simd_avx2())
        out[n++] = kvp_simd_avx2();
    if (kvp_simd_avx512())
        out[n++] = kvp_simd_avx512();
    if (kvp_simd_avx512vnni())
        out[n++] = kvp_simd_avx512vnni();
    if (kvp_simd_neon())
        out[n++] = kvp_simd_neon();
    return n;
}

/* Fail with context unless |got - ref| <= bound (NaN fails). Tracks the worst ratio seen. */
static double worst_ratio;

static void check_close(double got, double ref, double bound, const char *what, const char *tab,
                        long a, long b)
{
    double e = fabs(got - ref);
    if (bound > 0 && e / bound > worst_ratio) {
        worst_ratio = e / bound;
        if (getenv("KVP_TEST_VERBOSE"))
            print_message("      worst so far %s [%s] (%ld, %ld): err %.3g bound %.3g\n", what, tab,
                          a, b, e, bound);
    }
    if (!(e <= bound)) {
        print_error("%s [%s] (%ld, %ld): got %.9g ref %.9g err %.3g bound %.3g\n", what, tab, a, b,
                    got, ref, e, bound);
        fail();
    }
}

static void report_worst(const char *what)
{
    print_message("    %-28s worst error %.3f of its bound\n", what, worst_ratio);
    worst_ratio = 0;
}

/* ============================== scalars ============================== */

/* kvp_calloc_huge: zeroed over its whole size, writable to its last byte, 2 MiB aligned from one
 * huge page up (so THP can back it), and freed without touching what it handed out. */
static void test_calloc_huge(void **state)
{
    (void)state;
    const size_t huge = KVP_HUGE_PAGE;
    const size_t sizes[] = {1, 63, 4095, 4096, 100000, huge - 1, huge, huge + 1, 5 * huge + 4097};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        const size_t n = sizes[i];
        uint8_t *p = kvp_calloc_huge(n);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        if (n >= huge)
            assert_int_equal((uintptr_t)p % huge, 0);
        for (size_t j = 0; j < n; j += 4093)
            assert_int_equal(p[j], 0);
        assert_int_equal(p[n - 1], 0);
        memset(p, 0xA5, n);
        assert_int_equal(p[n - 1], 0xA5);
        kvp_free_huge(p);
    }
    assert_null(kvp_calloc_huge(0));
    assert_null(kvp_calloc_huge(SIZE_MAX));
    kvp_free_huge(NULL);
}

static void test_f16_values(void **state)
{
    (void)state;
    static const struct {
        uint16_t h;
        float f;
    } cases[] = {
        {0x3C00, 1.0f},     {0xC000, -2.0f},      {0x7BFF, 65504.0f},
        {0x0001, 0x1p-24f}, {0x7C00, INFINITY},   {0xFC00, -INFINITY},
        {0x0400, 0x1p-14f}, {0x03FF, 0x3FFp-24f}, {0x3555, 0.333251953125f},
        {0x0000, 0.0f},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_true(kvp_f16_to_f32(cases[i].h) == cases[i].f);
        assert_int_equal(kvp_f32_to_f16(cases[i].f), cases[i].h);
    }
    /* signed zero survives both ways */
    assert_true(signbit(kvp_f16_to_f32(0x8000)) && kvp_f16_to_f32(0x8000) == 0.0f);
    assert_false(signbit(kvp_f16_to_f32(0x0000)));
    assert_int_equal(kvp_f32_to_f16(-0.0f), 0x8000);
    /* f32 -> f16 rounds to nearest, ties to even */
    assert_int_equal(kvp_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);            /* tie, even below */
    assert_int_equal(kvp_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);        /* tie, even above */
    assert_int_equal(kvp_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01); /* above the tie */
    assert_int_equal(kvp_f32_to_f16(65519.0f), 0x7BFF);
    assert_int_equal(kvp_f32_to_f16(65520.0f), 0x7C00); /* overflow to inf */
    assert_int_equal(kvp_f32_to_f16(1e10f), 0x7C00);
    assert_int_equal(kvp_f32_to_f16(0x1p-25f), 0x0000); /* subnormal tie -> 0 */
    assert_int_equal(kvp_f32_to_f16(0x1.8p-25f), 0x0001);
    assert_int_equal(kvp_f32_to_f16(0x1.8p-24f), 0x0002);   /* 1.5 ulp tie -> 2 */
    assert_int_equal(kvp_f32_to_f16(0x1.ffcp-15f), 0x0400); /* rounds up to min normal */
    assert_int_equal(kvp_f32_to_f16(0x1p-30f), 0x0000);
}

static void test_f16_round_trip(void **state)
{
    (void)state;
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    uint16_t *all = xmalloc(65536 * 2 + 2);
    float *conv = xmalloc(65536 * sizeof(float));
    uint16_t *src = all + 1; /* 2-byte aligned only */
    for (uint32_t h = 0; h < 65536; h++) {
        src[h] = (uint16_t)h;
        float f = kvp_f16_to_f32((uint16_t)h);
        uint16_t back = kvp_f32_to_f16(f);
        bool is_nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
        if (is_nan) {
            assert_true(isnan(f));
            assert_true((back & 0x7C00) == 0x7C00 && (back & 0x3FF) != 0);
        } else if (back != h) {
            print_error("f16 0x%04x -> %g -> 0x%04x\n", h, (double)f, back);
            fail();
        }
    }
    /* every table's bulk converter agrees (NaN payloads may be quietened by F16C) */
    for (int t = 0; t < nt; t++) {
        tab[t]->dequant_f16(src, conv, 65536);
        for (uint32_t h = 0; h < 65536; h++) {
            float f = kvp_f16_to_f32((uint16_t)h);
            if (isnan(f))
                assert_true(isnan(conv[h]));
            else if (memcmp(&f, &conv[h], 4) != 0)
                fail_msg("dequant_f16 [%s] 0x%04x", tab[t]->name, h);
        }
        /* odd lengths exercise the tails */
        for (int64_t n = 1; n < 40; n += 3) {
            float tail[40];
            tab[t]->dequant_f16(src + 0x3C00, tail, n);
            for (int64_t i = 0; i < n; i++)
                assert_true(tail[i] == kvp_f16_to_f32((uint16_t)(0x3C00 + i)));
        }
    }
    free(all);
    free(conv);
}

static void test_bf16(void **state)
{
    (void)state;
    assert_true(kvp_bf16_to_f32(0x3F80) == 1.0f);
    assert_true(kvp_bf16_to_f32(0xC000) == -2.0f);
    assert_true(kvp_bf16_to_f32(0x7F80) == INFINITY);
    assert_true(signbit(kvp_bf16_to_f32(0x8000)));
    assert_int_equal(kvp_f32_to_bf16(1.0f), 0x3F80);
    /* round to nearest even on the dropped 16 bits */
    uint32_t tie_even = 0x3F808000, tie_odd = 0x3F818000, above = 0x3F808001;
    float f;
    memcpy(&f, &tie_even, 4);
    assert_int_equal(kvp_f32_to_bf16(f), 0x3F80);
    memcpy(&f, &tie_odd, 4);
    assert_int_equal(kvp_f32_to_bf16(f), 0x3F82);
    memcpy(&f, &above, 4);
    assert_int_equal(kvp_f32_to_bf16(f), 0x3F81);
    for (uint32_t h = 0; h < 65536; h++) {
        float v = kvp_bf16_to_f32((uint16_t)h);
        uint16_t back = kvp_f32_to_bf16(v);
        if (isnan(v))
            assert_true(isnan(kvp_bf16_to_f32(back)));
        else
            assert_int_equal(back, h);
    }
}

/* ============================== Q8_0 quantizer ============================== */

/* Blocks with awkward contents: zero, one spike, huge, tiny, ties at .5 steps. */
static void fill_q8_input(float *x, int64_t n)
{
    fill(x, n, 1.0f);
    for (int64_t b = 0; b < n / 32; b++) {
        float *xb = x + b * 32;
        switch (b % 6) {
        case 0:
            memset(xb, 0, 32 * sizeof(float));
            break;
        case 1:
            memset(xb, 0, 32 * sizeof(float));
            xb[b % 32] = -3.5f;
            break;
        case 2:
            for (int j = 0; j < 32; j++)
                xb[j] *= 1e4f;
            break;
        case 3:
            for (int j = 0; j < 32; j++)
                xb[j] *= 1e-6f;
            break;
        case 4: /* amax 127 -> d = 1, x = k + 0.5 are exact ties */
            for (int j = 0; j < 32; j++)
                xb[j] = (float)(j - 16) + 0.5f;
            xb[31] = 127.0f;
            break;
        default:
            break;
        }
    }
}

static void test_q8_0_quantize(void **state)
{
    (void)state;
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    rng_seed(8);
    const int64_t n = 32 * 61;
    float *x = xmalloc((size_t)n * sizeof(float));
    size_t qbytes = (size_t)(n / 32) * 34;
    uint8_t *ref = xmalloc(qbytes), *buf = xmalloc(qbytes + 1), *got = buf + 1; /* odd address */
    float *deq = xmalloc((size_t)n * sizeof(float));
    fill_q8_input(x, n);
    kvp_quantize_row_q8_0_ref(x, ref, n);

    for (int t = 0; t < nt; t++) {
        memset(got, 0xAA, qbytes);
        tab[t]->quantize_q8_0(x, got, n);
        if (memcmp(got, ref, qbytes) != 0)
            fail_msg("quantize_q8_0 [%s] differs from the reference quantizer", tab[t]->name);
        tab[t]->dequant_q8_0(got, deq, n);
        float *deq_ref = xmalloc((size_t)n * sizeof(float));
        kvp_type_traits(KVP_TYPE_Q8_0)->to_f32(ref, deq_ref, n);
        assert_memory_equal(deq, deq_ref, (size_t)n * sizeof(float));
        free(deq_ref);
    }
    memset(got, 0, qbytes);
    kvp_quantize_row_q8_0(x, got, n);
    assert_memory_equal(got, ref, qbytes);

    /* Error bound. The quantizer rounds with the exact f32 step d = amax/127, so |q·d − x| <= d/2;
     * the block then stores d as f16 (relative error <= 2^-11), which adds at most 127·|d16 − d|.
     * So the per-element bound after dequantization is d/2 + 127·|d16 − d| (~0.56·d). */
    for (int64_t b = 0; b < n / 32; b++) {
        struct kvp_block_q8_0 blk;
        memcpy(&blk, ref + b * 34, sizeof(blk));
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        double d = (double)(amax / 127.0f), d16 = kvp_f16_to_f32(blk.d);
        for (int j = 0; j < 32; j++) {
            double xv = x[b * 32 + j];
            assert_true(blk.qs[j] >= -127 && blk.qs[j] <= 127);
            assert_true(fabs(blk.qs[j] * d - xv) <= d / 2 * (1 + 1e-6));
            assert_true(fabs(blk.qs[j] * d16 - xv) <= d / 2 + 127 * fabs(d16 - d) + 1e-30);
        }
    }
    free(x);
    free(ref);
    free(buf);
    free(deq);
}

/* ============================== dots ============================== */

static const int64_t dot_sizes[] = {1,  3,  7,   8,   15,  16,  17,  31,   32,   33,   47,   63,
                                    64, 65, 100, 127, 129, 255, 257, 1000, 1023, 2049, 4095, 4096};
static const int64_t q8_sizes[] = {32, 64, 96, 128, 160, 224, 288, 1024, 2016, 4064, 4096};

static void test_dot_float(void **state)
{
    (void)state;
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    rng_seed(1);
    const int64_t nmax = 4096;
    float *wbuf = xmalloc((size_t)(nmax + 1) * sizeof(float)), *w = wbuf + 1;
    float *xbuf = xmalloc((size_t)(nmax + 1) * sizeof(float)), *x = xbuf + 1;
    uint16_t *hbuf = xmalloc((size_t)(nmax + 1) * 2), *h = hbuf + 1;
    uint16_t *bbuf = xmalloc((size_t)(nmax + 1) * 2), *bh = bbuf + 1;
    for (size_t si = 0; si < sizeof(dot_sizes) / sizeof(dot_sizes[0]); si++) {
        int64_t n = dot_sizes[si];
        fill(w, n, 1.0f);
        fill(x, n, 2.0f);
        double r32 = 0, a32 = 0, r16 = 0, a16 = 0, rb = 0, ab = 0;
        for (int64_t i = 0; i < n; i++) {
            h[i] = kvp_f32_to_f16(w[i]);
            bh[i] = kvp_f32_to_bf16(w[i]);
            double wf = kvp_f16_to_f32(h[i]), wb = kvp_bf16_to_f32(bh[i]);
            r32 += (double)w[i] * x[i], a32 += fabs((double)w[i] * x[i]);
            r16 += wf * x[i], a16 += fabs(wf * x[i]);
            rb += wb * x[i], ab += fabs(wb * x[i]);
        }
        float scal32 = tab[0]->dot_f32(w, x, n);
        for (int t = 0; t < nt; t++) {
            const char *nm = tab[t]->name;
            float g32 = tab[t]->dot_f32(w, x, n);
            check_close(g32, r32, GAMMA(n) * a32, "dot_f32", nm, (long)n, 0);
            check_close(g32, scal32, 2 * GAMMA(n) * a32, "dot_f32 vs scalar", nm, (long)n, 0);
            check_close(tab[t]->dot_f16(h, x, n), r16, GAMMA(n) * a16, "dot_f16", nm, (long)n, 0);
            check_close(tab[t]->dot_bf16(bh, x, n), rb, GAMMA(n) * ab, "dot_bf16", nm, (long)n, 0);
        }
    }
    report_worst("dot_f32/f16/bf16 (gamma(n))");
    free(wbuf);
    free(xbuf);
    free(hbuf);
    free(bbuf);
}

/* Exact double reference of a Q8_0 x Q8_0 dot, plus Σ|terms|. */
static double q8_ref_dot(const uint8_t *w, const uint8_t *x, int64_t n, double *abs_sum)
{
    double s = 0, a = 0;
    for (int64_t b = 0; b < n / 32; b++) {
        struct kvp_block_q8_0 bw, bx;
        memcpy(&bw, w + b * 34, 34);
        memcpy(&bx, x + b * 34, 34);
        double d = (double)kvp_f16_to_f32(bw.d) * kvp_f16_to_f32(bx.d);
        for (int j = 0; j < 32; j++) {
            s += d * bw.qs[j] * bx.qs[j];
            a += fabs(d * bw.qs[j] * bx.qs[j]);
        }
    }
    *abs_sum = a;
    return s;
}

static void test_dot_q8_0(void **state)
{
    (void)state;
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    rng_seed(2);
    const int64_t nmax = 4096;
    float *wf = xmalloc((size_t)nmax * sizeof(float)), *xf = xmalloc((size_t)nmax * sizeof(float));
    uint8_t *wbuf = xmalloc((size_t)(nmax / 32) * 34 + 1), *w = wbuf + 1;
    uint8_t *xbuf = xmalloc((size_t)(nmax / 32) * 34 + 3), *xq = xbuf + 3;
    for (size_t si = 0; si < sizeof(q8_sizes) / sizeof(q8_sizes[0]); si++) {
        int64_t n = q8_sizes[si];
        fill(wf, n, 0.5f);
        fill(xf, n, 3.0f);
        /* weights may legitimately hold -128 (other quantizers); the activations never do */
        kvp_quantize_row_q8_0_ref(wf, w, n);
        w[2 + 5] = 0x80;
        kvp_quantize_row_q8_0_ref(xf, xq, n);
        double a, r = q8_ref_dot(w, xq, n, &a);
        float scal = tab[0]->dot_q8_0(w, xq, n);
        for (int t = 0; t < nt; t++) {
            float g = tab[t]->dot_q8_0(w, xq, n);
            check_close(g, r, GAMMA(n) * a, "dot_q8_0", tab[t]->name, (long)n, 0);
            check_close(g, scal, 2 * GAMMA(n) * a, "dot_q8_0 vs scalar", tab[t]->name, (long)n, 0);
        }
    }
    report_worst("dot_q8_0 (gamma(n))");
    free(wf);
    free(xf);
    free(wbuf);
    free(xbuf);
}

/* ============================== vector ops ============================== */

/* max equals the plain maximum exactly, at every length and with -inf entries (scores of
 * masked tokens), wherever the largest element sits. */
/* kvp_tanh_fast against double tanh over [-12, 12] every 1e-4 and at the edges. The bound: the
 * reduced exponential's relative error (~1.2e-7, its polynomial's and the rounding of x / ln2)
 * moves tanh = 1 - 2 / (e + 1) by at most half of it, and the final 1 - 2 / (...) rounds by half
 * an ulp of 1 (6e-8); 3e-7 leaves room for the roundings in between. A planted error in the
 * polynomial's fourth coefficient (4.1665795894e-2 -> 4.17e-2) gives 3.9e-7 and fails. */
static void test_tanh_fast(void **state)
{
    (void)state;
    double worst = 0.0, at = 0.0;
    for (int i = -120000; i <= 120000; i++) {
        float y = (float)i * 1e-4f;
        double e = fabs((double)kvp_tanh_fast(y) - tanh((double)y));
        if (e > worst)
            worst = e, at = y;
    }
    const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 8.999f, 9.0f, 9.001f, -9.0f, 88.0f,
                           -88.0f, 1e30f, -1e30f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
        double e = fabs((double)kvp_tanh_fast(edges[i]) - tanh((double)edges[i]));
        if (e > worst)
            worst = e, at = edges[i];
    }
    print_message("kvp_tanh_fast: worst absolute error %.3g at %g\n", worst, at);
    assert_true(worst < 3e-7);
    assert_true(isnan(kvp_tanh_fast(NAN)));
}

static void test_max(void **state)
{
    (void)state;
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    rng_seed(17);
    for (int64_t n = 1; n <= 200; n++) {
        float *x = xmalloc((size_t)n * sizeof(float));
        for (int pos = 0; pos < 3; pos++) {
            fill(x, n, 4.0f);
            for (int64_t i = 0; i < n; i += 3)
                x[i] = -INFINITY;
            int64_t at = pos == 0 ? 0 : pos == 1 ? n - 1 : n / 2;
            x[at] = 100.0f + (float)n;
            for (int t = 0; t < nt; t++)
                assert_true(kvp_simd_max(tab[t], x, n) == x[at]);
        }
        for (int64_t i = 0; i < n; i++)
            x[i] = -INFINITY;
        for (int t = 0; t < nt; t++)
            assert_true(kvp_simd_max(tab[t], x, n) == -INFINITY);
        free(x);
    }
}

static void test_axpy(void **state)
{
    (void)state;
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    rng_seed(3);
    for (size_t si = 0; si < sizeof(dot_sizes) / sizeof(dot_sizes[0]); si++) {
        int64_t n = dot_sizes[si];
        float *x = xmalloc((size_t)n * sizeof(float)), *y0 = xmalloc((size_t)n * sizeof(float));
        float *y = xmalloc((size_t)n * sizeof(float));
        fill(x, n, 1.0f);
        fill(y0, n, 1.0f);
        float a = 0.75f * rng_uniform();
        for (int t = 0; t < nt; t++) {
            memcpy(y, y0, (size_t)n * sizeof(float));
            tab[t]->axpy(a, x, y, n);
            for (int64_t i = 0; i < n; i++) {
                double ref = y0[i] + (double)a * x[i];
                double bound = TOL_AXPY * (fabs(y0[i]) + fabs((double)a * x[i])) + 1e-30;
                check_close(y[i], ref, bound, "axpy", tab[t]->name, (long)n, (long)i);
            }
        }
        free(x);
        free(y0);
        free(y);
    }
    report_worst("axpy");
}

static double exp_worst; /* worst relative error of exp_sum elements in the normal range */

static void check_exp_sum(const struct kvp_simd_ops *ops, const float *x0, int64_t n, float max)
{
    float *x = xmalloc((size_t)n * sizeof(float));
    memcpy(x, x0, (size_t)n * sizeof(float));
    float s = ops->exp_sum(x, n, max);
    double ref_sum = 0;
    for (int64_t i = 0; i < n; i++) {
        /* the kernel's input is the float x - max; the subtraction's rounding is the caller's */
        double e = exp((double)(x0[i] - max));
        ref_sum += e;
        /* below FLT_MIN a relative bound is meaningless: allow FLT_MIN absolute */
        check_close(x[i], e, TOL_EXP * e + FLT_MIN, "exp_sum element", ops->name, (long)n, (long)i);
        assert_false(isnan(x[i]));
        if (e >= FLT_MIN)
            exp_worst = fmax(exp_worst, fabs(x[i] - e) / e);
    }
    check_close(s, ref_sum, TOL_EXP_SUM(n) * ref_sum + FLT_MIN, "exp_sum sum", ops->name, (long)n,
                0);
    free(x);
}

static void test_exp_sum(void **state)
{
    (void)state;
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    rng_seed(4);
    static const int64_t sizes[] = {1, 5, 8, 15, 16, 17, 33, 100, 1000, 4099};
    float *x = xmalloc(4099 * sizeof(float));
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        int64_t n = sizes[si];
        float max = -1e30f;
        for (int64_t i = 0; i < n; i++) {
            x[i] = 3.0f + 12.0f * rng_uniform(); /* exponents down to about -30 */
            max = fmaxf(max, x[i]);
        }
        for (int t = 0; t < nt; t++)
            check_exp_sum(tab[t], x, n, max);
    }
    /* a dense sweep of the whole normal range, -87.3 .. 0 */
    float *sweep = xmalloc(8731 * sizeof(float));
    for (int i = 0; i < 8731; i++)
        sweep[i] = -0.01f * (float)i - 0.003f;
    for (int t = 0; t < nt; t++)
        check_exp_sum(tab[t], sweep, 8731, 0.0f);
    free(sweep);
    /* Very negative inputs, -inf and -FLT_MAX: finite results, no NaN, 0 below FLT_MIN. */
    static const float neg[] = {0.0f,      -1e-8f,  -0.5f,        -1.0f,   -10.0f,
                                -80.0f,    -87.0f,  -87.3f,       -87.34f, -88.0f,
                                -89.0f,    -100.0f, -1000.0f,     -1e30f,  -FLT_MAX,
                                -INFINITY, -103.0f, -0.69314718f, -50.5f};
    int64_t nn = (int64_t)(sizeof(neg) / sizeof(neg[0]));
    for (int t = 0; t < nt; t++) {
        check_exp_sum(tab[t], neg, nn, 0.0f);
        for (int64_t k = 1; k <= nn; k++) /* every tail length */
            check_exp_sum(tab[t], neg + nn - k, k, 0.0f);
        /* shift by a positive max: x - max stays <= 0 */
        float shifted[19];
        for (int64_t i = 0; i < nn; i++)
            shifted[i] = neg[i] + 40.0f;
        check_exp_sum(tab[t], shifted, nn, 40.0f);
    }
    print_message("    exp_sum elements             worst rel. error %.2e above FLT_MIN (bound %.2e)\n",
                  exp_worst, TOL_EXP);
    worst_ratio = 0;
    free(x);
}

/* ============================== attention blocks ============================== */

static const int block_hd[] = {1, 3, 8, 16, 64, 128, 80};
static const int block_bs[] = {1, 7, 16, 32, 13};

static void test_block_scores(void **state)
{
    (void)state;
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    rng_seed(5);
    for (size_t hi = 0; hi < sizeof(block_hd) / sizeof(block_hd[0]); hi++) {
        for (size_t bi = 0; bi < sizeof(block_bs) / sizeof(block_bs[0]); bi++) {
            int hd = block_hd[hi], bs = block_bs[bi];
            float *q = xmalloc((size_t)hd * sizeof(float));
            float *kt = xmalloc((size_t)hd * (size_t)bs * sizeof(float));
            float *sc = xmalloc((size_t)bs * sizeof(float));
            fill(q, hd, 1.0f);
            fill(kt, (int64_t)hd * bs, 1.0f);
            float scale = 1.0f / sqrtf((float)hd);
            for (int t = 0; t < nt; t++) {
                tab[t]->block_scores(q, kt, hd, bs, scale, sc);
                for (int k = 0; k < bs; k++) {
                    double r = 0, a = 0;
                    for (int d = 0; d < hd; d++) {
                        r += (double)q[d] * kt[(size_t)d * (size_t)bs + (size_t)k];
                        a += fabs((double)q[d] * kt[(size_t)d * (size_t)bs + (size_t)k]);
                    }
                    /* hd products summed, then the scale: gamma(hd + 1) */
                    check_close(sc[k], r * scale, GAMMA(hd + 1) * a * scale + 1e-30,
                                "block_scores", tab[t]->name, hd, bs);
                }
            }
            free(q);
            free(kt);
            free(sc);
        }
    }
    report_worst("block_scores (gamma(hd+1))");
}

static void test_block_accum(void **state)
{
    (void)state;
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    rng_seed(6);
    for (size_t hi = 0; hi < sizeof(block_hd) / sizeof(block_hd[0]); hi++) {
        for (size_t bi = 0; bi < sizeof(block_bs) / sizeof(block_bs[0]); bi++) {
            int hd = block_hd[hi], bs = block_bs[bi];
            /* n = bs (full block) and n = bs - 3 (a partly filled last block) */
            for (int n = bs; n >= bs - 3 && n >= 1; n -= 3) {
                float *p = xmalloc((size_t)n * sizeof(float));
                float *v = xmalloc((size_t)n * (size_t)hd * sizeof(float)); /* only n rows */
                float *out0 = xmalloc((size_t)hd * sizeof(float));
                float *out = xmalloc((size_t)hd * sizeof(float));
                for (int k = 0; k < n; k++)
                    p[k] = 0.5f + 0.5f * rng_uniform();
                fill(v, (int64_t)n * hd, 1.0f);
                fill(out0, hd, 1.0f);
                for (int t = 0; t < nt; t++) {
                    memcpy(out, out0, (size_t)hd * sizeof(float));
                    tab[t]->block_accum(p, v, hd, n, out);
                    for (int d = 0; d < hd; d++) {
                        double r = out0[d], a = fabs(out0[d]);
                        for (int k = 0; k < n; k++) {
                            r += (double)p[k] * v[(size_t)k * (size_t)hd + (size_t)d];
                            a += fabs((double)p[k] * v[(size_t)k * (size_t)hd + (size_t)d]);
                        }
                        /* out + n products: gamma(n + 1) */
                        check_close(out[d], r, GAMMA(n + 1) * a, "block_accum", tab[t]->name, hd,
                                    n);
                    }
                }
                free(p);
                free(v);
                free(out0);
                free(out);
            }
        }
    }
    report_worst("block_accum (gamma(n+1))");
}

/* ============================== mat-vec ============================== */

struct mv_case {
    int64_t rows, cols;
};

static const struct mv_case mv_cases[] = {
    {1, 32}, {3, 64}, {4, 32}, {5, 96}, {64, 64}, {67, 160}, {9, 1056}, {130, 288}, {6, 4096},
    {203, 768}, /* over 128 KiB in every type: the prefetching paths */
};

/* Encode the f32 matrix m into type at an address with the given misalignment. */
static struct kvp_mat make_mat(int type, const float *m, int64_t rows, int64_t cols, void **owned)
{
    const struct kvp_type_traits *tr = kvp_type_traits(type);
    size_t rb;
    assert_true(kvp_type_row_bytes(type, cols, &rb));
    uint8_t *buf = xmalloc(rb * (size_t)rows + 5);
    uint8_t *data = buf + (type == KVP_TYPE_F32 ? 4 : type == KVP_TYPE_Q8_0 ? 1 : 2);
    for (int64_t r = 0; r < rows; r++)
        tr->from_f32(m + r * cols, data + (size_t)r * rb, cols);
    *owned = buf;
    return (struct kvp_mat){
        .type = type, .cols = cols, .rows = rows, .row_bytes = rb, .data = data};
}

/* How far the type's rounding may move weight w (f32 -> type), per element: f16 and bf16 round
 * to nearest (half an ulp: 2^-11 and 2^-8 relative, f16 subnormals 2^-25 absolute); Q8_0 as
 * test_q8_0_quantizer derives, d/2 + 127·|d16 - d| for its block's step d (here bounded with
 * the f16 rounding of d: 0.5·d + 127·2^-11·d). blk_amax: the largest |w| of w's 32-block. */
static double type_rounding(int type, double w, double blk_amax)
{
    switch (type) {
    case KVP_TYPE_F16:
        return fmax(fabs(w) * 0x1p-11, 0x1p-25);
    case KVP_TYPE_BF16:
        return fabs(w) * 0x1p-8;
    case KVP_TYPE_Q8_0:
        return (0.5 + 127 * 0x1p-11) * (blk_amax / 127) * (1 + 0x1p-23);
    default:
        return 0;
    }
}

static void check_matvec_type(int type)
{
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    const struct kvp_type_traits *tr = kvp_type_traits(type);
    double worst_tight = 0, worst_orig = 0;
    for (size_t ci = 0; ci < sizeof(mv_cases) / sizeof(mv_cases[0]); ci++) {
        int64_t rows = mv_cases[ci].rows, cols = mv_cases[ci].cols;
        float *m = xmalloc((size_t)(rows * cols) * sizeof(float));
        float *md = xmalloc((size_t)(rows * cols) * sizeof(float));
        float *md2 = xmalloc((size_t)(rows * cols) * sizeof(float));
        float *x = xmalloc((size_t)cols * sizeof(float)),
              *xd = xmalloc((size_t)cols * sizeof(float));
        float *y = xmalloc((size_t)(rows + 2) * sizeof(float));
        fill(m, rows * cols, 0.2f);
        fill(x, cols, 1.0f);
        void *owned;
        struct kvp_mat W = make_mat(type, m, rows, cols, &owned);

        /* x as the kernels see it: Q8_0 weights take x quantized */
        size_t xqb = kvp_matvec_xq_bytes(type, cols);
        assert_int_equal(xqb, type == KVP_TYPE_Q8_0 ? (size_t)(cols / 32) * 34 : 0);
        void *xq = xqb ? xmalloc(xqb) : NULL;
        kvp_matvec_prepare(type, x, cols, xq);
        if (xq)
            tr->to_f32(xq, xd, cols);
        else
            memcpy(xd, x, (size_t)cols * sizeof(float));

        /* dequantized matrix from the independent scalar converter, and via kvp_mat_dequant_rows */
        for (int64_t r = 0; r < rows; r++)
            tr->to_f32((const uint8_t *)W.data + (size_t)r * W.row_bytes, md + r * cols, cols);
        kvp_mat_dequant_rows(&W, md2, 0, rows);
        assert_memory_equal(md, md2, (size_t)(rows * cols) * sizeof(float));

        for (int t = 0; t < nt; t++) {
            /* a sub-range with sentinels around it, then the full range */
            int64_t r0 = rows > 2 ? 1 : 0, r1 = rows > 2 ? rows - 1 : rows;
            for (int64_t r = 0; r < rows; r++)
                y[r] = -777.0f;
            kvp_matvec_rows_ops(tab[t], &W, x, xq, y, r0, r1);
            for (int64_t r = 0; r < r0; r++)
                assert_true(y[r] == -777.0f);
            for (int64_t r = r1; r < rows; r++)
                assert_true(y[r] == -777.0f);
            kvp_matvec_rows_ops(tab[t], &W, x, xq, y, 0, rows);
            for (int64_t r = 0; r < rows; r++) {
                /* vs the dequantized weights and x as the kernel sees them: summation only,
                 * gamma(cols); vs the f32 originals the types' rounding of each weight (and of x
                 * for Q8_0) adds Σ (dw_c·|x_c| + |w_c|·dx_c) */
                double tight = 0, tight_abs = 0, orig = 0, quant = 0;
                for (int64_t c = 0; c < cols; c++) {
                    const float *wb = m + r * cols + c / 32 * 32, *xb = x + c / 32 * 32;
                    double wa = 0, xa = 0;
                    for (int j = 0; type == KVP_TYPE_Q8_0 && j < 32; j++)
                        wa = fmax(wa, fabs(wb[j])), xa = fmax(xa, fabs(xb[j]));
                    double dx = type == KVP_TYPE_Q8_0 ? type_rounding(type, x[c], xa) : 0;
                    tight += (double)md[r * cols + c] * xd[c];
                    tight_abs += fabs((double)md[r * cols + c] * xd[c]);
                    orig += (double)m[r * cols + c] * x[c];
                    quant += type_rounding(type, m[r * cols + c], wa) * (fabs(x[c]) + dx) +
                             fabs(m[r * cols + c]) * dx;
                }
                double b_tight = GAMMA(cols) * tight_abs, b_orig = quant + b_tight;
                check_close(y[r], tight, b_tight, "matvec vs dequantized", tab[t]->name,
                            (long)rows, (long)cols);
                worst_tight = fmax(worst_tight, fabs(y[r] - tight) / b_tight);
                check_close(y[r], orig, b_orig, "matvec vs f32 original", tab[t]->name,
                            (long)rows, (long)cols);
                worst_orig = fmax(worst_orig, fabs(y[r] - orig) / b_orig);
            }
        }
        /* the default entry point uses kvp_simd() */
        float *y2 = xmalloc((size_t)rows * sizeof(float));
        kvp_matvec_rows(&W, x, xq, y2, 0, rows);
        kvp_matvec_rows_ops(kvp_simd(), &W, x, xq, y, 0, rows);
        assert_memory_equal(y, y2, (size_t)rows * sizeof(float));
        free(y2);
        free(owned);
        free(xq);
        free(m);
        free(md);
        free(md2);
        free(x);
        free(xd);
        free(y);
    }
    print_message("    matvec %-5s worst error %.3f of its bound vs dequantized, %.3f vs f32\n",
                  tr->name, worst_tight, worst_orig);
    worst_ratio = 0;
}

static void test_matvec_f32(void **state)
{
    (void)state;
    rng_seed(10);
    check_matvec_type(KVP_TYPE_F32);
}

static void test_matvec_f16(void **state)
{
    (void)state;
    rng_seed(11);
    check_matvec_type(KVP_TYPE_F16);
}

static void test_matvec_bf16(void **state)
{
    (void)state;
    rng_seed(12);
    check_matvec_type(KVP_TYPE_BF16);
}

static void test_matvec_q8_0(void **state)
{
    (void)state;
    rng_seed(13);
    check_matvec_type(KVP_TYPE_Q8_0);
}

/* ============================== dispatch ============================== */

static void test_simd_pick(void **state)
{
    (void)state;
#if defined(__aarch64__)
    /* aarch64: NEON unless "scalar" is asked for; x86 names, unknown ones and none mean the best */
    assert_string_equal(kvp_simd_pick(NULL, KVP_CPU_NEON)->name, "neon");
    assert_string_equal(kvp_simd_pick("neon", KVP_CPU_NEON)->name, "neon");
    assert_string_equal(kvp_simd_pick("avx512", KVP_CPU_NEON)->name, "neon");
    assert_string_equal(kvp_simd_pick("bogus", KVP_CPU_NEON)->name, "neon");
    assert_string_equal(kvp_simd_pick("scalar", KVP_CPU_NEON)->name, "scalar");
    assert_string_equal(kvp_simd_pick("neon", 0)->name, "scalar");
    assert_null(kvp_simd_avx2());
    assert_null(kvp_simd_avx512());
    assert_non_null(kvp_simd_neon());
#elif defined(__x86_64__)
    assert_string_equal(kvp_simd_pick("neon", KVP_CPU_AVX2)->name, "avx2"); /* unknown here */
    assert_null(kvp_simd_neon());
    const int both = KVP_CPU_AVX2 | KVP_CPU_AVX512;
    assert_string_equal(kvp_simd_pick(NULL, both)->name, "avx512");
    assert_string_equal(kvp_simd_pick("", both)->name, "avx512");
    assert_string_equal(kvp_simd_pick("bogus", KVP_CPU_AVX2)->name, "avx2");
    assert_string_equal(kvp_simd_pick(NULL, 0)->name, "scalar");
    assert_string_equal(kvp_simd_pick("scalar", both)->name, "scalar");
    assert_string_equal(kvp_simd_pick("avx2", both)->name, "avx2");
    assert_string_equal(kvp_simd_pick("avx2", 0)->name, "scalar");
    assert_string_equal(kvp_simd_pick("avx512", KVP_CPU_AVX2)->name, "avx2");
    assert_string_equal(kvp_simd_pick("avx512", KVP_CPU_AVX512)->name, "scalar"); /* needs both */
    assert_string_equal(kvp_simd_pick("avx512", 0)->name, "scalar");
    /* VNNI: the best table when present, but "avx512" still forces the plain one */
    const int vnni = both | KVP_CPU_AVX512VNNI;
    assert_string_equal(kvp_simd_pick(NULL, vnni)->name, "avx512vnni");
    assert_string_equal(kvp_simd_pick("avx512vnni", vnni)->name, "avx512vnni");
    assert_string_equal(kvp_simd_pick("avx512", vnni)->name, "avx512");
    assert_string_equal(kvp_simd_pick("avx512vnni", both)->name, "avx512");
    assert_string_equal(kvp_simd_pick("avx512vnni", KVP_CPU_AVX2 | KVP_CPU_AVX512VNNI)->name,
                        "avx2"); /* VNNI without the AVX-512 bit is ignored */
#endif
    /* this process: whatever the environment asked for, through the same rule */
    assert_ptr_equal(kvp_simd(), kvp_simd_pick(getenv("KVP_SIMD"), kvp_cpu_features()));
    print_message("    kvp_simd() here: %s (cpu features 0x%x)\n", kvp_simd()->name,
                  kvp_cpu_features());
}

static void test_simd_override(void **state)
{
    (void)state;
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0) {
        kvp_test_skip_unsupported("/proc/self/exe unavailable");
    }
    self[len] = 0;
    static const char *names[] = {"scalar", "avx2", "avx512", "avx512vnni", "neon", "bogus"};
    /* a cross build's tests run under an emulator, which starts this program again too */
    const char *emu = getenv("KVP_TEST_EMULATOR");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char cmd[4200], *out = NULL;
        snprintf(cmd, sizeof(cmd), "KVP_SIMD=%s %s '%s' --print-simd", names[i], emu ? emu : "",
                 self);
        int rc = kvp_test_run(cmd, &out, 0);
        assert_int_equal(rc, 0);
        assert_non_null(out);
        const char *want = kvp_simd_pick(names[i], kvp_cpu_features())->name;
        char expect[64];
        snprintf(expect, sizeof(expect), "%s\n", want);
        assert_string_equal(out, expect);
        free(out);
    }
}

/* --print-simd: race several threads into the lazy init, check they agree, print the choice. */
static void *simd_thread(void *arg)
{
    *(const struct kvp_simd_ops **)arg = kvp_simd();
    return NULL;
}

static int print_simd(void)
{
    pthread_t th[8];
    const struct kvp_simd_ops *got[8];
    for (int i = 0; i < 8; i++)
        if (pthread_create(&th[i], NULL, simd_thread, &got[i]) != 0)
            return 2;
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    for (int i = 1; i < 8; i++)
        if (got[i] != got[0])
            return 3;
    if (got[0] != kvp_simd())
        return 4;
    printf("%s\n", got[0]->name);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--print-simd") == 0)
        return print_simd();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calloc_huge),
        cmocka_unit_test(test_f16_values),   cmocka_unit_test(test_f16_round_trip),
        cmocka_unit_test(test_bf16),         cmocka_unit_test(test_q8_0_quantize),
        cmocka_unit_test(test_dot_float),    cmocka_unit_test(test_dot_q8_0),
        cmocka_unit_test(test_axpy),         cmocka_unit_test(test_exp_sum),
        cmocka_unit_test(test_max),          cmocka_unit_test(test_tanh_fast),
        cmocka_unit_test(test_block_scores), cmocka_unit_test(test_block_accum),
        cmocka_unit_test(test_matvec_f32),   cmocka_unit_test(test_matvec_f16),
        cmocka_unit_test(test_matvec_bf16),  cmocka_unit_test(test_matvec_q8_0),
        cmocka_unit_test(test_simd_pick),    cmocka_unit_test(test_simd_override),
    };
    const struct kvp_simd_ops *tab[4];
    int nt = tables(tab);
    print_message("SIMD tables under test:");
    for (int t = 0; t < nt; t++)
        print_message(" %s", tab[t]->name);
    print_message("\n");
    int total = (int)(sizeof(tests) / sizeof(tests[0]));
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    printf("%d passed, %d failed\n", total - failed, failed);
    return failed ? 1 : 0;
}
