/*
 * Tests for prefill's integer GEMM (kernels/prefill_gemm.h) on random Q8_0, Q4_0 and Q5_0 rows.
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
    if (kvp_gemm_wants(KVP_TYPE_Q8_0, 16))
        return true;
    print_message("[  SKIP    ] no integer prefill GEMM on this CPU (or KVP_PREFILL=sgemm)\n");
    return false;
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
        kvp_gemm_quantize(X, K, K, n, t0, t1, xg, xq);
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
        skip();
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
        skip();
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
    kvp_gemm_quantize(X, K, K, N, 0, N, xg, xq);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_oracle),
        cmocka_unit_test(test_matches_decode_dot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
