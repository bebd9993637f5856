/*
 * Monte Carlo arithmetic for the float64 reference forward passes of test_forward.c (llama) and
 * test_arch.c (the other architectures): the operations both references share, each either exact
 * (r == NULL) or perturbed the way kvpred's f32 arithmetic may have moved its result (every
 * rounding an independent uniform relative error in [-u, u], u = 2^-24; Parker 1997), and the
 * bound on kvpred's logits that MCA_RUNS perturbed runs give. test_forward.c's comment on its
 * oracle derives the method and the constants.
 */
#ifndef KVP_TESTS_MCA_H
#define KVP_TESTS_MCA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_mat;

#define MCA_RUNS   10      /* perturbed runs per bound */
#define MCA_LAMBDA 10.0    /* standard deviations a logit may be off */
#define U32        0x1p-24 /* f32's unit roundoff */

/* The perturbation of one run (a NULL one: exact). */
struct mca {
    uint64_t s;
};

/* The perturbation of run `run` (0 .. MCA_RUNS - 1): a fixed seed per run, so a bound is the same
 * every time. */
struct mca mca_run(int run);

/* Uniform in [-1, 1). */
double mca_xi(struct mca *r);

/* x as an f32 operation of relative accuracy k·u may have left it. */
double P(struct mca *r, double x, double k);

/* Σ a[c]·b[c·sb] as an f32 dot may have left it: the products and the running sums each round
 * (relative u, independent), which adds a zero-mean error of variance u²/3 · (Σ products² +
 * Σ partial sums²); one uniform draw of that variance stands for them all. */
double dot64(struct mca *r, const double *a, const double *b, size_t sb, int n);

/* RMS norm: the sum of squares in double, the scale rounded to f32, two products. */
void rms64(double *o, const double *x, const float *w, int n, double eps, struct mca *r);

/* y += b (a NULL b: no bias), each sum rounded. */
void addb(double *y, const float *b, int n, struct mca *r);

/* Which products quantize their input to 8 bits, as kvpred does for a quantized weight type:
 * decode's mat-vec always, a multi-token pass (prefill) where the integer GEMM takes the type
 * (kernels/prefill_gemm.h) for n_rows tokens. */
struct mca_quant {
    bool prefill;
    int n_rows;
};

/* y = W x (W rows x cols, row-major, the weights of a matrix of the given enum kvp_type) as
 * kvpred computes it: where q says the product quantizes x (q NULL: never), x moved within half
 * an 8-bit step and by the f16 rounding of the block's scale, then one perturbed dot per row. */
void mv64(const double *W, const double *x, double *y, int rows, int cols, int type,
          const struct mca_quant *q, struct mca *r);

/* The weights of w, dequantized, as float64 [rows][cols] (malloc'd). */
double *mat64(const struct kvp_mat *w);

/* Adds one run's squared deviation from the exact result, over MCA_RUNS, to var[0..n). */
void mca_add_run(double *var, const double *run, const double *exact, size_t n);

/* Turns the variances var of n_rows rows of n_cols logits into the bounds on them, in place:
 * MCA_LAMBDA standard deviations (at least the row's pooled one) plus u·|exact| for kvpred's own
 * final rounding. */
void mca_bounds(double *var, const double *exact, int n_rows, int n_cols);

/* max |got - want| / bound: at most 1 when got is within its bound everywhere. */
double mca_bound_ratio(const float *got, const double *want, const double *bound, size_t n);
double mca_bound_ratio_d(const double *got, const double *want, const double *bound, size_t n);

#endif
