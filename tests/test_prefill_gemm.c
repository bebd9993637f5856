/*
 * Tests for prefill's integer GEMM (kernels/prefill_gemm.h) on random Q8_0, Q4_0 and Q5_0 rows,
 * and (test_k_quants, below) Q4_K and Q6_K rows through every table's kernel.
 *
 * The oracle is a double-precision loop over the exact values the kernel multiplies: the weights
 * decoded by the scalar dequantizers (f16 scale times a small integer, exact in f32) and each
 * token quantized to Q8_0 by the reference quantizer and decoded the same way. The kernel sums
 * the block products exactly in int32, so it differs from the oracle only by float rounding of
 * the per-block terms: each block's integer sum (exact) times its two scales (one rounding for
 * their product, one for the fused add), K/32 blocks, and the old value of y when accumulating:
 * gamma(K/32 + 3) relative to Σ|w_i·x_i| + |y_old| (testutil.h). Sizes are odd on purpose: token
 * counts that leave a partial group of 16 and an odd number of groups, row ranges that leave a
 * partial pass and a partial tile, 1 to 65 blocks per row. Skips where the CPU has no kernel.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "kernels/prefill_gemm.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/types.h"

/* relative to Σ|w·x| (+ |y_old|), for rows of K weights: see above */
#define TOL(K) kvp_test_gamma((double)(K) / 32 + 3)

static uint64_t rng_state;

static float rng_uniform(void) /* [-1, 1), xorshift64* */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1u << 23) - 1.0f;
}

static bool have_kernel(void)
{
    return kvp_gemm_wants(KVP_TYPE_Q8_0, 16);
}

/* W (rows × K of type) times n tokens, rows [r0, r1), tokens quantized in nslice thread-like
 * slices, tiles limited to scratch_rows rows; checked against the oracle, and every other entry
 * of Y left as it was. Returns the largest error relative to Σ|w·x|. */
static double check(int type, int rows, int K, int n, int r0, int r1, int nslice,
                    int scratch_rows, bool accumulate)
{
    const struct kvp_type_traits *tt = kvp_type_traits(type);
    size_t rb = 0;
    assert_true(kvp_type_row_bytes(type, K, &rb));
    uint8_t *w = malloc((size_t)rows * rb);
    float *wf = malloc((size_t)rows * K * sizeof(float));
    float *X = malloc((size_t)n * K * sizeof(float));
    float *xf = malloc((size_t)n * K * sizeof(float));
    struct kvp_block_q8_0 *xq = malloc((size_t)K / 32 * sizeof(*xq));
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < K; i++)
            wf[(size_t)r * K + i] = rng_uniform() * (1.0f + (float)(r % 3));
        tt->from_f32(wf + (size_t)r * K, w + (size_t)r * rb, K);
        tt->to_f32(w + (size_t)r * rb, wf + (size_t)r * K, K); /* the values the kernel sees */
    }
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < K; i++)
            X[(size_t)t * K + i] = rng_uniform() * (t % 4 == 1 ? 10.0f : 1.0f);
        kvp_quantize_row_q8_0_ref(X + (size_t)t * K, xq, K);
        kvp_type_traits(KVP_TYPE_Q8_0)->to_f32(xq, xf + (size_t)t * K, K);
    }
    /* Y wider than the rows and with spare token rows, filled with a marker */
    int ldy = rows + 3;
    size_t ny = (size_t)(n + 1) * ldy;
    float *Y = malloc(ny * sizeof(float)), *Y0 = malloc(ny * sizeof(float));
    for (size_t i = 0; i < ny; i++)
        Y[i] = Y0[i] = rng_uniform();
    void *xg = kvp_alloc_aligned(kvp_gemm_xq_bytes(n, K));
    memset(xg, 0xA5, kvp_gemm_xq_bytes(n, K)); /* stale bytes must not matter */
    for (int s = 0; s < nslice; s++) {
        long t0 = (long)n * s / nslice, t1 = (long)n * (s + 1) / nslice;
        kvp_gemm_quantize(type, X, K, K, n, t0, t1, xg, xq);
    }
    size_t sb = kvp_gemm_scratch_bytes(K) / 4 * (size_t)scratch_rows; /* ~scratch_rows rows */
    void *scratch = kvp_alloc_aligned(sb);
    struct kvp_mat W = {type, K, rows, rb, w};
    kvp_gemm_rows(&W, xg, n, Y, ldy, accumulate, r0, r1, scratch, sb);

    double worst = 0;
    for (int t = 0; t <= n; t++)
        for (int r = 0; r < ldy; r++) {
            size_t i = (size_t)t * ldy + r;
            if (t == n || r < r0 || r >= r1) {
                assert_true(Y[i] == Y0[i]);
                continue;
            }
            double dot = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)wf[(size_t)r * K + k] * xf[(size_t)t * K + k];
                dot += p;
                mag += fabs(p);
            }
            double want = accumulate ? dot + Y0[i] : dot;
            double err = fabs(Y[i] - want) / (mag + fabs(Y0[i]) + 1e-30);
            if (err > TOL(K))
                print_message("type %d rows %d K %d n %d: y[%d][%d] = %.9g, want %.9g\n", type,
                              rows, K, n, t, r, Y[i], want);
            assert_true(err <= TOL(K));
            worst = fmax(worst, err);
        }
    kvp_free_aligned(scratch);
    kvp_free_aligned(xg);
    free(Y);
    free(Y0);
    free(xq);
    free(xf);
    free(X);
    free(wf);
    free(w);
    return worst;
}

static void test_against_oracle(void **state)
{
    (void)state;
    if (!have_kernel())
        kvp_test_skip_unsupported("no integer prefill GEMM on this CPU (or KVP_PREFILL=sgemm)");
    rng_state = 12345;
    const int types[] = {KVP_TYPE_Q8_0, KVP_TYPE_Q4_0, KVP_TYPE_Q5_0};
    /* rows, K, n, r0, r1, slices, tile rows, accumulate */
    const int cases[][8] = {
        {1, 32, 2, 0, 1, 1, 64, 0},      /* one block, one row, two tokens */
        {5, 96, 17, 0, 5, 2, 64, 0},     /* a one-token group after a full one */
        {9, 64, 16, 2, 9, 1, 4, 1},      /* exactly one group; tiles of 4: a 3-row tail */
        {67, 2080, 50, 3, 66, 2, 64, 1}, /* odd group count, partial last group, 65 blocks */
        {130, 160, 33, 0, 130, 3, 64, 0}, /* two full tiles and a 2-row one */
    };
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
            const int *c = cases[ci];
            double e = check(types[ti], c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7] != 0);
            print_message("type %d rows %d K %d n %d: max error %.3g of Σ|w·x|\n", types[ti],
                          c[0], c[1], c[2], e);
        }
}

/* The kernel's result is the decode path's: the scalar Q8_0 dot of the row with the token's
 * Q8_0 blocks, up to float summation order. */
static void test_matches_decode_dot(void **state)
{
    (void)state;
    if (!have_kernel())
        kvp_test_skip_unsupported("no integer prefill GEMM on this CPU (or KVP_PREFILL=sgemm)");
    rng_state = 777;
    enum { R = 13, K = 544, N = 21 };
    size_t rb = (size_t)K / 32 * sizeof(struct kvp_block_q8_0);
    uint8_t *w = malloc(R * rb);
    float *X = malloc((size_t)N * K * sizeof(float)), row[K];
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < K; i++)
            row[i] = rng_uniform();
        kvp_quantize_row_q8_0_ref(row, w + r * rb, K);
    }
    for (int i = 0; i < N * K; i++)
        X[i] = rng_uniform();
    void *xg = kvp_alloc_aligned(kvp_gemm_xq_bytes(N, K));
    struct kvp_block_q8_0 xq[K / 32];
    kvp_gemm_quantize(KVP_TYPE_Q8_0, X, K, K, N, 0, N, xg, xq);
    size_t sb = kvp_gemm_scratch_bytes(K) * 4;
    void *scratch = kvp_alloc_aligned(sb);
    float Y[N * R];
    struct kvp_mat W = {KVP_TYPE_Q8_0, K, R, rb, w};
    kvp_gemm_rows(&W, xg, N, Y, R, false, 0, R, scratch, sb);
    const struct kvp_simd_ops *scalar = kvp_simd_scalar();
    for (int t = 0; t < N; t++) {
        kvp_quantize_row_q8_0_ref(X + (size_t)t * K, xq, K);
        float xr[K], wr[K];
        kvp_type_traits(KVP_TYPE_Q8_0)->to_f32(xq, xr, K);
        for (int r = 0; r < R; r++) {
            float d = scalar->dot_q8_0(w + r * rb, xq, K);
            kvp_type_traits(KVP_TYPE_Q8_0)->to_f32(w + r * rb, wr, K);
            double mag = 0;
            for (int k = 0; k < K; k++)
                mag += fabs((double)wr[k] * xr[k]);
            /* two f32 evaluations of the same block sums (the decode dot: gamma(K) at most) */
            assert_true(fabsf(Y[t * R + r] - d) <= (TOL(K) + kvp_test_gamma(K)) * mag);
        }
    }
    kvp_free_aligned(scratch);
    kvp_free_aligned(xg);
    free(X);
    free(w);
}

/* ---- K-quant tiles (Q4_K, Q6_K): gemm_tile_k ------------------------------------------------
 *
 * The oracle decodes the weights itself, in double, from the block layouts
 * (docs/formats.md §4.4): Q4_K w = d·sc·q - dmin·m per sub-block of 32, Q6_K
 * w = d·sc·(q - 32) per sub-block of 16; and the activations as the Q8_K blocks the reference
 * quantizer makes of each token, x = d·q in double. The kernel sums each sub-block's products
 * exactly in int32 and then adds, per block of 32, two terms into one f32 accumulator (Q4_K: the
 * scale term and the min term; Q6_K: two scale terms), each with at most two roundings (the
 * product of the two scales, or of the activations' scale and block sum, then the fused add):
 * K/16 terms, so the error is at most gamma(K/16 + 3) (one more with accumulate) times the sum of
 * the terms' magnitudes, Σ|d·sc·q·x| + Σ|dmin·m·x| (the min part cancels against the scale part
 * in w, so Σ|w·x| alone is not a bound). Against the unquantized activations the Q8_K rounding
 * adds at most Σ|w|·|d_x| per super-block (nearest rounding is |d_x|/2; the clip of +128 to 127
 * at the largest magnitude is |d_x|). */
#define TOL_K(K) kvp_test_gamma((double)(K) / 16 + 4)

/* Row r of a K-quant matrix in double: w[i], and the part of |w[i]| bound above (|d·sc·q| +
 * |dmin·m|) in mag[i]. */
static void decode_k(int type, const uint8_t *row, int K, double *w, double *mag)
{
    for (int s = 0; s < K / 256; s++) {
        double *ws = w + 256 * s, *ms = mag + 256 * s;
        if (type == KVP_TYPE_Q4_K) {
            struct kvp_block_q4_k q;
            memcpy(&q, row + s * sizeof(q), sizeof(q));
            uint8_t sc[8], m[8];
            kvp_k_scales_unpack(q.scales, sc, m);
            double d = kvp_f16_to_f32(q.d), dmin = kvp_f16_to_f32(q.dmin);
            for (int c = 0; c < 4; c++)
                for (int l = 0; l < 32; l++)
                    for (int hi = 0; hi < 2; hi++) {
                        int j = 2 * c + hi, e = 64 * c + 32 * hi + l;
                        int code = (q.qs[32 * c + l] >> (4 * hi)) & 0xF;
                        ws[e] = d * sc[j] * code - dmin * m[j];
                        ms[e] = fabs(d * sc[j] * code) + fabs(dmin * m[j]);
                    }
        } else {
            struct kvp_block_q6_k q;
            memcpy(&q, row + s * sizeof(q), sizeof(q));
            double d = kvp_f16_to_f32(q.d);
            for (int h = 0; h < 2; h++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t *L = q.ql + 64 * h, *Q = q.qh + 32 * h;
                    int code[4] = {(L[l] & 0xF) | (Q[l] & 3) << 4,
                                   (L[l + 32] & 0xF) | (Q[l] >> 2 & 3) << 4,
                                   (L[l] >> 4) | (Q[l] >> 4 & 3) << 4,
                                   (L[l + 32] >> 4) | (Q[l] >> 6 & 3) << 4};
                    for (int i = 0; i < 4; i++) {
                        int e = 128 * h + 32 * i + l;
                        ws[e] = d * q.scales[e / 16] * (code[i] - 32);
                        ms[e] = fabs(ws[e]);
                    }
                }
        }
    }
}

/* W (rows × K of a K-quant type) times n tokens through every table that has gemm_tile_k: each
 * against the oracle (quantized and unquantized activations) and all bit-equal to the scalar
 * table's. Returns the largest error relative to the bound's magnitude. */
static double check_k(int type, int rows, int K, int n, int r0, int r1, int nslice,
                      int scratch_rows, bool accumulate)
{
    const struct kvp_type_traits *tt = kvp_type_traits(type);
    size_t rb = 0;
    assert_true(kvp_type_row_bytes(type, K, &rb));
    uint8_t *w = malloc((size_t)rows * rb);
    float *wf = malloc((size_t)K * sizeof(float));
    double *wd = malloc((size_t)rows * K * sizeof(double)), *wm = malloc((size_t)rows * K * sizeof(double));
    float *X = malloc((size_t)n * K * sizeof(float));
    double *xd = malloc((size_t)n * K * sizeof(double)), *dxs = malloc((size_t)n * K / 256 * sizeof(double));
    struct kvp_block_q8_k *xq = malloc((size_t)K / 256 * sizeof(*xq));
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < K; i++) /* a per-row offset, so that the mins matter */
            wf[i] = rng_uniform() * (1.0f + (float)(r % 3)) + 0.5f * (float)(r % 2);
        tt->from_f32(wf, w + (size_t)r * rb, K);
        decode_k(type, w + (size_t)r * rb, K, wd + (size_t)r * K, wm + (size_t)r * K);
    }
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < K; i++)
            X[(size_t)t * K + i] = rng_uniform() * (t % 4 == 1 ? 10.0f : 1.0f) + 0.3f;
        kvp_quantize_row_q8_k_ref(X + (size_t)t * K, xq, K);
        for (int i = 0; i < K; i++)
            xd[(size_t)t * K + i] = (double)xq[i / 256].d * xq[i / 256].qs[i % 256];
        for (int s = 0; s < K / 256; s++)
            dxs[(size_t)t * (K / 256) + s] = fabs((double)xq[s].d);
    }
    int ldy = rows + 3;
    size_t ny = (size_t)(n + 1) * ldy;
    float *Y = malloc(ny * sizeof(float)), *Y0 = malloc(ny * sizeof(float));
    float *Ys = malloc(ny * sizeof(float));
    for (size_t i = 0; i < ny; i++)
        Y0[i] = rng_uniform();
    void *xg = kvp_alloc_aligned(kvp_gemm_xq_bytes(n, K));
    memset(xg, 0xA5, kvp_gemm_xq_bytes(n, K));
    for (int s = 0; s < nslice; s++) {
        long t0 = (long)n * s / nslice, t1 = (long)n * (s + 1) / nslice;
        kvp_gemm_quantize(type, X, K, K, n, t0, t1, xg, xq);
    }
    size_t sb = kvp_gemm_scratch_bytes(K) / 4 * (size_t)scratch_rows;
    void *scratch = kvp_alloc_aligned(sb);
    struct kvp_mat W = {type, K, rows, rb, w};
    const struct kvp_simd_ops *tabs[8];
    int ntab = kvp_simd_runnable(tabs, 8), ran = 0;
    double worst = 0;
    for (int ti = 0; ti < ntab; ti++) {
        if (!kvp_gemm_has(tabs[ti], type))
            continue;
        memcpy(Y, Y0, ny * sizeof(float));
        kvp_gemm_rows_ops(tabs[ti], &W, xg, n, Y, ldy, accumulate, r0, r1, scratch, sb);
        if (ran++ == 0)
            memcpy(Ys, Y, ny * sizeof(float));
        else if (memcmp(Ys, Y, ny * sizeof(float)) != 0) {
            print_message("table %s differs from %s\n", tabs[ti]->name, tabs[0]->name);
            fail();
        }
        for (int t = 0; t <= n; t++)
            for (int r = 0; r < ldy; r++) {
                size_t i = (size_t)t * ldy + r;
                if (t == n || r < r0 || r >= r1) {
                    assert_true(Y[i] == Y0[i]);
                    continue;
                }
                double dot = 0, mag = 0, dot_x = 0, round = 0;
                for (int k = 0; k < K; k++) {
                    size_t wi = (size_t)r * K + k, xi = (size_t)t * K + k;
                    dot += wd[wi] * xd[xi];
                    mag += wm[wi] * fabs(xd[xi]);
                    dot_x += wd[wi] * X[xi];
                    round += fabs(wd[wi]) * dxs[(size_t)t * (K / 256) + k / 256];
                }
                double old = accumulate ? Y0[i] : 0.0, tol = TOL_K(K) * (mag + fabs(old));
                double err = fabs(Y[i] - (dot + old));
                if (err > tol)
                    print_message("%s type %d rows %d K %d n %d: y[%d][%d] = %.9g, want %.9g\n",
                                  tabs[ti]->name, type, rows, K, n, t, r, Y[i], dot + old);
                assert_true(err <= tol);
                assert_true(fabs(Y[i] - (dot_x + old)) <= tol + round);
                worst = fmax(worst, err / (mag + fabs(old) + 1e-30));
            }
    }
    assert_true(ran >= 1); /* the scalar table always has the kernel */
    kvp_free_aligned(scratch);
    kvp_free_aligned(xg);
    free(Ys);
    free(Y);
    free(Y0);
    free(xq);
    free(dxs);
    free(xd);
    free(X);
    free(wm);
    free(wd);
    free(wf);
    free(w);
    return worst;
}

static void test_k_quants(void **state)
{
    (void)state;
    rng_state = 4242;
    const int types[] = {KVP_TYPE_Q4_K, KVP_TYPE_Q6_K};
    /* rows, K, n, r0, r1, slices, tile rows, accumulate */
    const int cases[][8] = {
        {1, 256, 2, 0, 1, 1, 64, 0},     /* one super-block, one row */
        {5, 512, 17, 0, 5, 2, 64, 0},    /* a one-token group after a full one */
        {9, 256, 16, 2, 9, 1, 4, 1},     /* one group; tiles of 4: a 3-row tail */
        {67, 768, 50, 3, 66, 2, 64, 1},  /* odd group count, partial group, partial tile */
        {13, 1536, 9, 0, 13, 3, 8, 0},   /* fewer tokens than one group (decode-sized) */
    };
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
            const int *c = cases[ci];
            double e = check_k(types[ti], c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7] != 0);
            print_message("type %d rows %d K %d n %d: max error %.3g of the bound's magnitude "
                          "(tolerance %.3g)\n",
                          types[ti], c[0], c[1], c[2], e, TOL_K(c[1]));
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_oracle),
        cmocka_unit_test(test_matches_decode_dot),
        cmocka_unit_test(test_k_quants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
