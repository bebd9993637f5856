/*
 * CateKV classification arithmetic (see catekv_classify.h for the rules and
 * docs/methods.md §2).
 *
 * The workload: per (layer, KV head) one observation matrix of w × |M| probabilities (64 × 130K
 * at 128K context), two exact quantiles over all of its entries, one pass for chunk hits and one
 * for chunk scores. Quantiles use an in-place quickselect with a median-of-three pivot and a
 * Hoare partition that stops on equal keys, so the many near-zero entries of long-context
 * attention do not make it quadratic; the pivot choice is deterministic, so results never depend
 * on a seed. Everything that is summed is summed in double in index order.
 */
#include "policy/catekv_classify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- geometry ----------------------------------------------------------------------------- */

int kvp_catekv_geometry(int n, int chunk, int sink, int recent, int tail, int budget,
                        struct kvp_catekv_geom *g, struct kvp_err *err)
{
    memset(g, 0, sizeof(*g));
    if (n < 1)
        return kvp_err_set(err, KVP_EINVAL, "catekv: empty prompt");
    if (chunk < 1)
        return kvp_err_set(err, KVP_EINVAL, "catekv: chunk size %d must be >= 1", chunk);
    if (sink < 0 || recent < 0 || tail < 0 || sink % chunk || recent % chunk || tail % chunk)
        return kvp_err_set(err, KVP_EINVAL,
                           "catekv: sink %d, recent %d and tail %d must be multiples of the chunk "
                           "size %d",
                           sink, recent, tail, chunk);
    if (budget < sink + recent || (budget - sink - recent) % chunk)
        return kvp_err_set(err, KVP_EINVAL,
                           "catekv: budget %d must be sink %d + recent %d + a multiple of the "
                           "chunk size %d",
                           budget, sink, recent, chunk);
    g->n = n;
    g->chunk = chunk;
    g->sink = sink;
    g->recent = recent;
    g->tail = tail;
    g->budget = budget;
    g->chunks = n / chunk - tail / chunk;
    if (g->chunks < 0)
        g->chunks = 0;
    g->chunk_end = g->chunks * chunk;
    g->mid_begin = sink;
    g->mid_end = g->chunk_end - recent;
    g->middle_chunks = (g->mid_end - g->mid_begin) / chunk;
    if (g->middle_chunks < 0) {
        g->middle_chunks = 0;
        g->mid_end = g->mid_begin;
    }
    g->select_sets = (budget - sink - recent) / chunk;
    g->keep_all = budget >= n || g->select_sets >= g->middle_chunks || g->middle_chunks == 0;
    if (g->select_sets > g->middle_chunks)
        g->select_sets = g->middle_chunks;
    return 0;
}

/* ---- exact quantiles ---------------------------------------------------------------------- */

/* Quickselect: after kth_T(x, n, k), x[k] is the k-th smallest (0-based), every x[i < k] <= x[k]
 * and every x[i > k] >= x[k]. Median-of-three pivot, Hoare partition stopping on equal keys. */
#define KVP_DEFINE_SELECT(name, T)                                                                 \
    static void name(T *x, size_t n, size_t k)                                                     \
    {                                                                                              \
        size_t lo = 0, hi = n - 1;                                                                 \
        while (hi > lo) {                                                                          \
            size_t mid = lo + (hi - lo) / 2;                                                       \
            T t;                                                                                   \
            if (x[mid] < x[lo]) {                                                                  \
                t = x[mid];                                                                        \
                x[mid] = x[lo];                                                                    \
                x[lo] = t;                                                                         \
            }                                                                                      \
            if (x[hi] < x[lo]) {                                                                   \
                t = x[hi];                                                                         \
                x[hi] = x[lo];                                                                     \
                x[lo] = t;                                                                         \
            }                                                                                      \
            if (x[hi] < x[mid]) {                                                                  \
                t = x[hi];                                                                         \
                x[hi] = x[mid];                                                                    \
                x[mid] = t;                                                                        \
            }                                                                                      \
            T pivot = x[mid];                                                                      \
            size_t i = lo, j = hi;                                                                 \
            for (;;) {                                                                             \
                while (x[i] < pivot)                                                               \
                    i++;                                                                           \
                while (x[j] > pivot)                                                               \
                    j--;                                                                           \
                if (i >= j)                                                                        \
                    break;                                                                         \
                t = x[i];                                                                          \
                x[i] = x[j];                                                                       \
                x[j] = t;                                                                          \
                i++;                                                                               \
                j--;                                                                               \
            }                                                                                      \
            /* now x[lo..j] <= pivot <= x[j+1..hi] (Hoare; j < hi) */                              \
            if (k <= j)                                                                            \
                hi = j;                                                                            \
            else                                                                                   \
                lo = j + 1;                                                                        \
        }                                                                                          \
    }

/* clang-format off */
KVP_DEFINE_SELECT(kth_f, float)
KVP_DEFINE_SELECT(kth_d, double)
/* clang-format on */

#define KVP_DEFINE_QUANTILE(name, T, kth)                                                          \
    double name(T *x, size_t n, double p)                                                          \
    {                                                                                              \
        if (n == 0)                                                                                \
            return 0.0;                                                                            \
        if (!(p > 0.0))                                                                            \
            p = 0.0;                                                                               \
        if (p > 1.0)                                                                               \
            p = 1.0;                                                                               \
        double pos = p * (double)(n - 1);                                                          \
        size_t k = (size_t)floor(pos);                                                             \
        if (k >= n - 1)                                                                            \
            k = n - 1;                                                                             \
        double frac = pos - (double)k;                                                             \
        kth(x, n, k);                                                                              \
        double lo = (double)x[k];                                                                  \
        if (k + 1 >= n || frac == 0.0)                                                             \
            return lo;                                                                             \
        /* the next order statistic is the smallest element right of k */                          \
        T nx = x[k + 1];                                                                           \
        for (size_t i = k + 2; i < n; i++)                                                         \
            nx = x[i] < nx ? x[i] : nx;                                                            \
        return lo + ((double)nx - lo) * frac;                                                      \
    }

/* clang-format off */
KVP_DEFINE_QUANTILE(kvp_catekv_quantile_f, float, kth_f)
KVP_DEFINE_QUANTILE(kvp_catekv_quantile_d, double, kth_d)
/* clang-format on */

double kvp_catekv_threshold(float *a, size_t n, double k, double alpha)
{
    double vmin = kvp_catekv_quantile_f(a, n, 1.0 - k);
    double vmax = kvp_catekv_quantile_f(a, n, k);
    double tau = vmin + (vmax - vmin) * alpha;
    return tau > KVP_CATEKV_TAU_FLOOR ? tau : KVP_CATEKV_TAU_FLOOR;
}

/* ---- observation matrix, hits, CV, scores -------------------------------------------------- */

void kvp_catekv_obs_matrix(const struct kvp_prefill_obs *obs, int kvh, int g,
                           const struct kvp_catekv_geom *geo, float *A)
{
    const int w = obs->n_obs, n_mid = geo->mid_end - geo->mid_begin;
    memset(A, 0, (size_t)w * n_mid * sizeof(float));
    for (int i = 0; i < w; i++) {
        float *a = A + (size_t)i * n_mid;
        for (int j = 0; j < g; j++) {
            int h = kvh * g + j;
            const float *row = obs->obs + ((size_t)h * w + i) * obs->n_prompt + geo->mid_begin;
            double mass = 0;
            for (int t = 0; t < n_mid; t++)
                mass += row[t];
            if (mass <= 0)
                continue;
            double scale = 1.0 / (mass * g);
            for (int t = 0; t < n_mid; t++)
                a[t] += (float)(row[t] * scale);
        }
    }
}

double kvp_catekv_cv(const float *A, int w, int n_chunks, int chunk, double tau, int *counts)
{
    const size_t n_mid = (size_t)n_chunks * chunk;
    double sum = 0, sum_sq = 0;
    for (int m = 0; m < n_chunks; m++) {
        int hits = 0;
        for (int i = 0; i < w; i++) {
            const float *a = A + (size_t)i * n_mid + (size_t)m * chunk;
            for (int t = 0; t < chunk; t++)
                if ((double)a[t] > tau) {
                    hits++;
                    break;
                }
        }
        if (counts)
            counts[m] = hits;
        sum += hits;
        sum_sq += (double)hits * hits;
    }
    if (n_chunks < 2)
        return 0.0;
    double mean = sum / n_chunks;
    double var = (sum_sq - sum * mean) / (n_chunks - 1);
    double sd = var > 0 ? sqrt(var) : 0.0;
    return sd / (mean > KVP_CATEKV_MEAN_FLOOR ? mean : KVP_CATEKV_MEAN_FLOOR);
}

double kvp_catekv_head_cv(const float *A, int w, int n_chunks, int chunk, double k, double alpha,
                          float *scratch)
{
    size_t n = (size_t)w * n_chunks * chunk;
    memcpy(scratch, A, n * sizeof(float));
    double tau = kvp_catekv_threshold(scratch, n, k, alpha);
    return kvp_catekv_cv(A, w, n_chunks, chunk, tau, NULL);
}

void kvp_catekv_chunk_scores(const float *A, int w, int n_chunks, int chunk, float *score)
{
    const size_t n_mid = (size_t)n_chunks * chunk;
    for (int m = 0; m < n_chunks; m++) {
        double s = 0;
        for (int i = 0; i < w; i++) {
            const float *a = A + (size_t)i * n_mid + (size_t)m * chunk;
            float mx = a[0];
            for (int t = 1; t < chunk; t++)
                mx = a[t] > mx ? a[t] : mx;
            s += mx;
        }
        score[m] = (float)s;
    }
}

/* ---- adaptive / consistent split ----------------------------------------------------------- */

int kvp_catekv_split(const double *cv, int n, double r, uint8_t *adaptive, double *scratch)
{
    int count = 0;
    if (r >= 1.0 || r <= 0.0) {
        memset(adaptive, r >= 1.0, (size_t)n);
        return r >= 1.0 ? n : 0;
    }
    memcpy(scratch, cv, (size_t)n * sizeof(double));
    double thr = kvp_catekv_quantile_d(scratch, (size_t)n, r);
    for (int i = 0; i < n; i++) {
        adaptive[i] = cv[i] < thr;
        count += adaptive[i];
    }
    return count;
}

static int cmp_int_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

int kvp_catekv_vote(const double *cvs, int n_samples, int n_heads, double r, int *votes,
                    uint8_t *adaptive, struct kvp_err *err)
{
    if (n_samples < 1 || n_heads < 1)
        return kvp_err_set(err, KVP_EINVAL, "catekv vote: no samples or no heads");
    if (!(r >= 0.0 && r <= 1.0))
        return kvp_err_set(err, KVP_EINVAL, "catekv vote: ratio %g outside [0, 1]", r);
    double *tmp = malloc((size_t)n_heads * sizeof(double));
    int *sorted = malloc((size_t)n_heads * sizeof(int));
    if (!tmp || !sorted) {
        free(tmp);
        free(sorted);
        return kvp_err_set(err, KVP_ENOMEM, "catekv vote: out of memory");
    }
    /* per-r reset (docs/methods.md §8.2 item 2) */
    memset(votes, 0, (size_t)n_heads * sizeof(int));
    for (int s = 0; s < n_samples; s++) {
        const double *cv = cvs + (size_t)s * n_heads;
        memcpy(tmp, cv, (size_t)n_heads * sizeof(double));
        double thr = kvp_catekv_quantile_d(tmp, (size_t)n_heads, r);
        for (int h = 0; h < n_heads; h++)
            votes[h] += cv[h] <= thr;
    }
    int num_top = (int)ceil(r * n_heads - 1e-9); /* guard 0.4·20 = 8.000000001 */
    int count = 0;
    memset(adaptive, 0, (size_t)n_heads);
    if (num_top > 0) {
        memcpy(sorted, votes, (size_t)n_heads * sizeof(int));
        qsort(sorted, (size_t)n_heads, sizeof(int), cmp_int_desc);
        int thr = sorted[(num_top < n_heads ? num_top : n_heads) - 1];
        if (thr < 1)
            thr = 1;
        for (int h = 0; h < n_heads; h++) {
            adaptive[h] = votes[h] >= thr;
            count += adaptive[h];
        }
    }
    free(tmp);
    free(sorted);
    return count;
}
