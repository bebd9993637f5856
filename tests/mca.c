/* Monte Carlo arithmetic shared by the float64 reference forward passes (see mca.h). */
#include "mca.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/matvec.h"
#include "kernels/prefill_gemm.h"
#include "kernels/types.h"

struct mca mca_run(int run)
{
    return (struct mca){.s = 0x9E3779B97F4A7C15ull * (uint64_t)(run + 1)};
}

double mca_xi(struct mca *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (double)((r->s * 0x2545F4914F6CDD1Dull) >> 11) * 0x1p-52 - 1.0;
}

double P(struct mca *r, double x, double k)
{
    return r ? x * (1 + k * U32 * mca_xi(r)) : x;
}

double dot64(struct mca *r, const double *a, const double *b, size_t sb, int n)
{
    double s = 0, v = 0;
    for (int c = 0; c < n; c++) {
        double p = a[c] * b[(size_t)c * sb];
        s += p;
        v += p * p + s * s;
    }
    return r ? s + U32 * sqrt(v) * mca_xi(r) : s;
}

void rms64(double *o, const double *x, const float *w, int n, double eps, struct mca *r)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double sc = P(r, 1.0 / sqrt(ss / n + eps), 1);
    for (int i = 0; i < n; i++)
        o[i] = P(r, P(r, x[i] * sc, 1) * w[i], 1);
}

void addb(double *y, const float *b, int n, struct mca *r)
{
    for (int i = 0; b && i < n; i++)
        y[i] = P(r, y[i] + b[i], 1);
}

/* x as 8-bit quantization (blocks of bs, f16 scale or not) may have moved it: each element by up
 * to half the step d = max|x| / 127, the block by the relative rounding of d to f16 */
static void act_quant(struct mca *r, const double *x, double *xq, int cols, int bs, bool f16)
{
    for (int b = 0; b < cols; b += bs) {
        double a = 0;
        for (int c = b; c < b + bs; c++)
            a = fmax(a, fabs(x[c]));
        double d = a / 127, f = f16 ? 1 + 0x1p-11 * mca_xi(r) : 1;
        for (int c = b; c < b + bs; c++)
            xq[c] = (x[c] + d / 2 * mca_xi(r)) * f;
    }
}

void mv64(const double *W, const double *x, double *y, int rows, int cols, int type,
          const struct mca_quant *q, struct mca *r)
{
    double *xq = NULL;
    int vt = kvp_type_vec_dot_type(type);
    if (r && q && type != KVP_TYPE_F32 && vt != KVP_TYPE_F32 &&
        (!q->prefill || kvp_gemm_wants(type, q->n_rows))) {
        xq = malloc((size_t)cols * sizeof(double));
        act_quant(r, x, xq, cols, vt == KVP_TYPE_Q8_K ? 256 : 32, vt == KVP_TYPE_Q8_0);
        x = xq;
    }
    for (int i = 0; i < rows; i++)
        y[i] = dot64(r, W + (size_t)i * cols, x, 1, cols);
    free(xq);
}

double *mat64(const struct kvp_mat *w)
{
    float *row = malloc((size_t)w->cols * sizeof(float));
    double *o = malloc((size_t)(w->rows * w->cols) * sizeof(double));
    for (int64_t r = 0; r < w->rows; r++) {
        kvp_mat_dequant_rows(w, row, r, r + 1);
        for (int64_t c = 0; c < w->cols; c++)
            o[r * w->cols + c] = row[c];
    }
    free(row);
    return o;
}

void mca_add_run(double *var, const double *run, const double *exact, size_t n)
{
    for (size_t i = 0; i < n; i++)
        var[i] += (run[i] - exact[i]) * (run[i] - exact[i]) / MCA_RUNS;
}

void mca_bounds(double *var, const double *exact, int n_rows, int n_cols)
{
    for (int i = 0; i < n_rows; i++) {
        double *vr = var + (size_t)i * n_cols, pooled = 0;
        for (int j = 0; j < n_cols; j++)
            pooled += vr[j] / n_cols;
        for (int j = 0; j < n_cols; j++)
            vr[j] =
                MCA_LAMBDA * sqrt(fmax(vr[j], pooled)) + U32 * fabs(exact[(size_t)i * n_cols + j]);
    }
}

double mca_bound_ratio(const float *got, const double *want, const double *bound, size_t n)
{
    double q = 0;
    for (size_t i = 0; i < n; i++)
        q = fmax(q, fabs(got[i] - want[i]) / bound[i]);
    return q;
}

double mca_bound_ratio_d(const double *got, const double *want, const double *bound, size_t n)
{
    double q = 0;
    for (size_t i = 0; i < n; i++)
        q = fmax(q, fabs(got[i] - want[i]) / bound[i]);
    return q;
}
