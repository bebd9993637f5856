/*
 * CateKV head classification (docs/methods.md §2.2-§2.5): chunk geometry, the observation
 * matrix, binarization, chunk hits, the coefficient of variation (CV) of per-chunk hit counts, the
 * global adaptive/consistent split, the voting recipe of static identification, and the chunk
 * scores consistent heads are selected by.
 *
 * Everything here is plain arithmetic on arrays, without a model, so tests can check every rule
 * on hand-made matrices. Conventions, fixed once here and used by policy_catekv.c and
 * cmd_profile_heads.c alike:
 *   - quantiles are exact (deterministic quickselect over all entries, no sampling) with linear
 *     interpolation at position p·(N−1) between neighbouring order statistics, as torch.quantile;
 *     upstream's 2^24-element limit (docs/methods.md §8.2 item 3) does not exist here;
 *   - the hit test is strict (A > τ), τ = max(vmin + (vmax − vmin)·α, 1e-9);
 *   - CV uses the unbiased (N−1) standard deviation over the middle chunks and a mean floor of
 *     1e-10 (a head without hits gets CV 0); with fewer than 2 middle chunks CV is 0;
 *   - ties in chunk selection go to the lower chunk index (docs/methods.md §8.2 item 4).
 * The dynamic encoding of upstream (1 = consistent) is not used: kvpred writes 1 = adaptive
 * everywhere, as the static masks do.
 */
#ifndef KVP_POLICY_CATEKV_CLASSIFY_H
#define KVP_POLICY_CATEKV_CLASSIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "policy/policy.h"

#define KVP_CATEKV_TAU_FLOOR  1e-9  /* smallest binarization threshold */
#define KVP_CATEKV_MEAN_FLOOR 1e-10 /* CV denominator floor */

/* Chunk geometry of one prompt (docs/methods.md §2.2). All positions are token positions.
 * */
struct kvp_catekv_geom {
    int n;         /* prompt tokens */
    int chunk;     /* c */
    int sink;      /* S, multiple of c */
    int recent;    /* R, multiple of c */
    int tail;      /* tail_tokens (upstream's hidden 32), multiple of c */
    int budget;    /* B: sink + selected chunks + recent of a consistent head */
    int chunks;    /* ⌊n/c⌋ − tail/c (0 when negative) */
    int chunk_end; /* chunks·c; [chunk_end, n) is never chunked */
    int mid_begin; /* middle region M = [mid_begin, mid_end) = [S, chunk_end − R) */
    int mid_end;
    int middle_chunks; /* |M| / c (0 when the prompt is too short) */
    int select_sets;   /* middle chunks a consistent head keeps: (B − R − S)/c, at most
                          middle_chunks */
    bool keep_all;     /* the budget covers the prompt (B >= n, select_sets >= middle_chunks or
                          no middle region): nothing is compressed, see kvp_catekv_geometry */
};

/* Compute the geometry of an n-token prompt. Parameter requirements of §2.2 are errors
 * (KVP_EINVAL with the rule that failed): c >= 1; S, R and tail >= 0 and multiples of c;
 * B >= S + R and (B − R − S) divisible by c. Requirements that depend on the prompt (B < n,
 * select_sets <= middle_chunks, a non-empty middle region) are not errors: a prompt too short for
 * the budget simply has nothing to compress, so keep_all is set and every head keeps the whole
 * prompt (documented clamping; e.g. n = 256 with the paper's S = 64, R = 256). */
int kvp_catekv_geometry(int n, int chunk, int sink, int recent, int tail, int budget,
                        struct kvp_catekv_geom *g, struct kvp_err *err);

/* Exact quantile of x[0..n) at p in [0, 1] with linear interpolation between the order
 * statistics at ⌊p(n−1)⌋ and the next one. Reorders x (selection in place). 0 when n == 0. */
double kvp_catekv_quantile_f(float *x, size_t n, double p);
double kvp_catekv_quantile_d(double *x, size_t n, double p);

/* Binarization threshold of one head's entries (docs/methods.md §2.4):
 * τ = max(q(1−k) + (q(k) − q(1−k))·α, 1e-9). Reorders a. */
double kvp_catekv_threshold(float *a, size_t n, double k, double alpha);

/* Observation matrix of one KV head (docs/methods.md §2.3): A[i][j] for window row i <
 * obs->n_obs and middle key j < mid_end − mid_begin, the probabilities renormalised over the middle
 * keys and averaged over the g query heads kvh·g .. kvh·g + g − 1. The framework's rows are
 * softmaxes over all prompt keys; dividing them by their mass on M gives exactly the softmax over M
 * (same exponentials, different denominator). A row with no mass on M (all middle keys in its
 * causal future) contributes zeros. A is [n_obs][mid_end − mid_begin]. */
void kvp_catekv_obs_matrix(const struct kvp_prefill_obs *obs, int kvh, int g,
                           const struct kvp_catekv_geom *geo, float *A);

/* Chunk hits and CV of one head: C[i][m] = OR over chunk m of (A[i][·] > tau);
 * counts[m] = Σ_i C[i][m] (counts may be NULL); returns std(counts)/max(mean, 1e-10) with the
 * unbiased std, or 0 when n_chunks < 2. A is [w][n_chunks·chunk]. */
double kvp_catekv_cv(const float *A, int w, int n_chunks, int chunk, double tau, int *counts);

/* CV of one head from its observation matrix: threshold (with a scratch copy of A in
 * scratch[w·n_chunks·chunk]), hits, CV. */
double kvp_catekv_head_cv(const float *A, int w, int n_chunks, int chunk, double k, double alpha,
                          float *scratch);

/* Chunk scores for selection (docs/methods.md §2.5): score[m] = Σ_i max over chunk m of
 * A[i][·], summed in double. A is [w][n_chunks·chunk]. */
void kvp_catekv_chunk_scores(const float *A, int w, int n_chunks, int chunk, float *score);

/* Dynamic split over all n = layers × KV heads: thr = quantile(cv, r), adaptive[i] = cv[i] < thr
 * (1 = adaptive). r >= 1 makes every head adaptive and r <= 0 none (the quantile rule alone
 * would keep the maximum consistent at r = 1). scratch holds n doubles. Returns the number of
 * adaptive heads. */
int kvp_catekv_split(const double *cv, int n, double r, uint8_t *adaptive, double *scratch);

/* Static identification by voting (docs/methods.md §2.4): cvs is [n_samples][n_heads].
 * Each sample votes for its heads with CV <= quantile(its CVs, r); num_top = ⌈r·n_heads⌉; a head is
 * adaptive when its votes reach the num_top-th largest vote count (at least 1: a head no sample
 * voted for is never adaptive). votes[n_heads] is zeroed here on every call, so calling this once
 * per r never accumulates votes across ratios (docs/methods.md §8.2 item 2). Returns the number of
 * adaptive heads, or KVP_EINVAL / KVP_ENOMEM. */
int kvp_catekv_vote(const double *cvs, int n_samples, int n_heads, double r, int *votes,
                    uint8_t *adaptive, struct kvp_err *err);

#endif
