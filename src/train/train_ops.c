/*
 * Trainer ops: forward and hand-written backward passes of every layer of the Llama block, on
 * plain row-major float arrays (train.h describes the shapes).
 *
 * Conventions follow the engine exactly (docs/formats.md §3.3–3.4): RMSNorm y = x/√(mean
 * x² + ε)·w, RoPE on adjacent pairs (x[2i], x[2i+1]) with θ_i = pos·base^(−2i/hd), attention scale
 * 1/√hd with query head h reading KV head h/(H/Hkv), SwiGLU down(silu(gate)·up). Matrix products
 * are OpenBLAS sgemm calls; everything else is simple loops over contiguous rows.
 *
 * Attention is the one op whose memory grows with T². It runs per (sequence, KV head) in blocks
 * of KVP_ATTN_BQ queries: a block reads only keys [0, block end), so the causal half is never
 * computed, and the scratch is [BQ][T] scores plus as much for the backward's dP. The forward
 * saves each row's log-sum-exp so the backward can rebuild the probabilities exactly without
 * storing them (the FlashAttention recomputation). The exponentials go through the engine's SIMD
 * table (kernels/simd.h, exp_sum), the same for the forward pass and its recomputation.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/simd.h"
#include "train/train.h"

#define KVP_ATTN_BQ 128 /* query rows per block: [128][2048] scores = 1 MB per thread */

/* ======================================= RMSNorm ============================================== */

void kvp_op_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long n, int dim,
                        float eps)
{
    for (long i = 0; i < n; i++) {
        const float *xr = x + i * dim;
        float *yr = y + i * dim;
        double ss = 0.0;
        for (int j = 0; j < dim; j++)
            ss += (double)xr[j] * xr[j];
        float r = (float)(1.0 / sqrt(ss / dim + eps));
        rstd[i] = r;
        for (int j = 0; j < dim; j++)
            yr[j] = xr[j] * r * w[j];
    }
}

void kvp_op_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, long n, int dim)
{
    for (long i = 0; i < n; i++) {
        const float *xr = x + i * dim;
        const float *dyr = dy + i * dim;
        float *dxr = dx + i * dim;
        float r = rstd[i];
        /* xhat = x·r; dxhat = dy·w; dx = r·(dxhat − xhat·mean(dxhat·xhat)) */
        double dot = 0.0;
        for (int j = 0; j < dim; j++) {
            float xh = xr[j] * r;
            dot += (double)dyr[j] * w[j] * xh;
            dw[j] += dyr[j] * xh;
        }
        float mean = (float)(dot / dim);
        for (int j = 0; j < dim; j++) {
            float xh = xr[j] * r;
            dxr[j] += r * (dyr[j] * w[j] - xh * mean);
        }
    }
}

/* ======================================= linear =============================================== */

void kvp_op_linear_fwd(float *y, const float *x, const float *w, long n, int in, int out,
                       float beta)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, out, in, 1.0f, x, in, w, in, beta,
                y, out);
}

void kvp_op_linear_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                       long n, int in, int out, float beta_dx)
{
    /* dW first, so dx may overwrite x (the caller's scratch reuse relies on it) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, (int)n, 1.0f, dy, out, x, in,
                1.0f, dw, in);
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, in, out, 1.0f, dy, out, w,
                    in, beta_dx, dx, in);
}

/* ======================================== RoPE ================================================ */

void kvp_op_rope_table(float *cosv, float *sinv, int T, int hd, float base)
{
    int half = hd / 2;
    for (int p = 0; p < T; p++)
        for (int i = 0; i < half; i++) {
            double theta = (double)p * pow((double)base, -2.0 * i / hd);
            cosv[(size_t)p * half + i] = (float)cos(theta);
            sinv[(size_t)p * half + i] = (float)sin(theta);
        }
}

void kvp_op_rope(float *x, const float *cosv, const float *sinv, int n_seq, int T, int n_head,
                 int hd, bool inverse)
{
    kvp_op_rope_rows(x, cosv, sinv, 0, (long)n_seq * T, T, n_head, hd, inverse);
}

void kvp_op_rope_rows(float *x, const float *cosv, const float *sinv, long r0, long r1, int T,
                      int n_head, int hd, bool inverse)
{
    int half = hd / 2;
    float sgn = inverse ? -1.0f : 1.0f;
    for (long r = r0; r < r1; r++) {
        int pos = (int)(r % T);
        const float *c = cosv + (size_t)pos * half;
        const float *s = sinv + (size_t)pos * half;
        float *row = x + r * (long)n_head * hd;
        for (int h = 0; h < n_head; h++) {
            float *v = row + h * hd;
            for (int i = 0; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1];
                float si = sgn * s[i];
                v[2 * i] = a * c[i] - b * si;
                v[2 * i + 1] = a * si + b * c[i];
            }
        }
    }
}

/* ===================================== attention ============================================== */

size_t kvp_op_attn_scratch(int T)
{
    return (size_t)2 * KVP_ATTN_BQ * (size_t)T;
}

/* Scores of query rows [i0, i0+bq) against keys [0, i0+bq), scaled, into s [bq][nk]. */
static void attn_scores(float *s, const float *qh, const float *k, int i0, int bq, int hd,
                        int ldq, int ldkv, float scale)
{
    int nk = i0 + bq;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nk, hd, scale, qh + (size_t)i0 * ldq,
                ldq, k, ldkv, 0.0f, s, nk);
}

void kvp_op_attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                     int T, int hd, int n_rep, int ldq, int ldkv, float *scratch)
{
    const struct kvp_simd_ops *simd = kvp_simd();
    float scale = 1.0f / sqrtf((float)hd);
    for (int r = 0; r < n_rep; r++) {
        const float *qh = q + r * hd;
        float *oh = out + r * hd;
        float *lh = lse + (size_t)r * T;
        for (int i0 = 0; i0 < T; i0 += KVP_ATTN_BQ) {
            int bq = T - i0 < KVP_ATTN_BQ ? T - i0 : KVP_ATTN_BQ;
            int nk = i0 + bq;
            attn_scores(scratch, qh, k, i0, bq, hd, ldq, ldkv, scale);
            for (int i = 0; i < bq; i++) {
                float *row = scratch + (size_t)i * nk;
                int lim = i0 + i + 1; /* keys 0..lim-1 are visible */
                float mx = row[0];
                for (int j = 1; j < lim; j++)
                    mx = row[j] > mx ? row[j] : mx;
                float sum = simd->exp_sum(row, lim, mx);
                float inv = 1.0f / sum;
                for (int j = 0; j < lim; j++)
                    row[j] *= inv;
                for (int j = lim; j < nk; j++)
                    row[j] = 0.0f;
                lh[i0 + i] = mx + logf(sum);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, hd, nk, 1.0f, scratch, nk, v,
                        ldkv, 0.0f, oh + (size_t)i0 * ldq, ldq);
        }
    }
}

void kvp_op_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                     const float *lse, const float *q, const float *k, const float *v, int T,
                     int hd, int n_rep, int ldq, int ldkv, float *scratch)
{
    const struct kvp_simd_ops *simd = kvp_simd();
    float scale = 1.0f / sqrtf((float)hd);
    float *p = scratch;
    float *dp = scratch + (size_t)KVP_ATTN_BQ * T;
    float drow[KVP_ATTN_BQ];
    for (int r = 0; r < n_rep; r++) {
        const float *qh = q + r * hd;
        const float *oh = out + r * hd;
        const float *doh = dout + r * hd;
        float *dqh = dq + r * hd;
        const float *lh = lse + (size_t)r * T;
        for (int i0 = 0; i0 < T; i0 += KVP_ATTN_BQ) {
            int bq = T - i0 < KVP_ATTN_BQ ? T - i0 : KVP_ATTN_BQ;
            int nk = i0 + bq;
            attn_scores(p, qh, k, i0, bq, hd, ldq, ldkv, scale);
            for (int i = 0; i < bq; i++) {
                float *row = p + (size_t)i * nk;
                int lim = i0 + i + 1;
                float l = lh[i0 + i];
                simd->exp_sum(row, lim, l); /* l ≥ every score: the saved log-sum-exp */
                for (int j = lim; j < nk; j++)
                    row[j] = 0.0f;
                /* D_i = dO_i · O_i = Σ_j P_ij dP_ij, the softmax backward's row term */
                const float *a = doh + (size_t)(i0 + i) * ldq;
                const float *b = oh + (size_t)(i0 + i) * ldq;
                float d = 0.0f;
                for (int e = 0; e < hd; e++)
                    d += a[e] * b[e];
                drow[i] = d;
            }
            const float *dob = doh + (size_t)i0 * ldq;
            /* dV[0:nk] += Pᵀ dO */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, bq, 1.0f, p, nk, dob, ldq,
                        1.0f, dv, ldkv);
            /* dP = dO Vᵀ */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, nk, hd, 1.0f, dob, ldq, v,
                        ldkv, 0.0f, dp, nk);
            for (int i = 0; i < bq; i++) {
                float *pr = p + (size_t)i * nk;
                float *dpr = dp + (size_t)i * nk;
                int lim = i0 + i + 1;
                for (int j = 0; j < lim; j++)
                    dpr[j] = pr[j] * (dpr[j] - drow[i]);
                for (int j = lim; j < nk; j++)
                    dpr[j] = 0.0f;
            }
            /* dQ = scale·dS K;  dK[0:nk] += scale·dSᵀ Q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, hd, nk, scale, dp, nk, k,
                        ldkv, 0.0f, dqh + (size_t)i0 * ldq, ldq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, bq, scale, dp, nk,
                        qh + (size_t)i0 * ldq, ldq, 1.0f, dk, ldkv);
        }
    }
}

/* ======================================= SwiGLU =============================================== */

void kvp_op_swiglu_fwd(float *a, const float *g, const float *u, long n)
{
    for (long i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + expf(-g[i]));
        a[i] = g[i] * sig * u[i];
    }
}

void kvp_op_swiglu_bwd(float *dg, float *du, const float *da, const float *g, const float *u,
                       long n)
{
    for (long i = 0; i < n; i++) {
        float sig = 1.0f / (1.0f + expf(-g[i]));
        float silu = g[i] * sig;
        du[i] = da[i] * silu;
        dg[i] = da[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    }
}

/* =================================== cross-entropy ============================================ */

double kvp_op_xent(float *logits, const int32_t *targets, const float *w, long n, int V,
                   float scale, float *nll)
{
    double total = 0.0;
    for (long i = 0; i < n; i++) {
        float *row = logits + i * V;
        float wi = w ? w[i] : 1.0f;
        float mx = row[0];
        for (int j = 1; j < V; j++)
            mx = row[j] > mx ? row[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < V; j++)
            sum += exp((double)(row[j] - mx));
        double logz = mx + log(sum);
        double li = logz - row[targets[i]];
        if (nll)
            nll[i] = (float)li;
        total += wi * li;
        float g = wi * scale;
        if (g == 0.0f) {
            memset(row, 0, sizeof(float) * (size_t)V);
            continue;
        }
        for (int j = 0; j < V; j++)
            row[j] = (float)exp((double)row[j] - logz) * g;
        row[targets[i]] -= g;
    }
    return total;
}

/* ===================================== embedding ============================================== */

void kvp_op_embed_fwd(float *y, const float *emb, const int32_t *tok, long n, int dim)
{
    for (long i = 0; i < n; i++)
        memcpy(y + i * dim, emb + (size_t)tok[i] * dim, sizeof(float) * (size_t)dim);
}

void kvp_op_embed_bwd(float *demb, const float *dy, const int32_t *tok, long n, int dim)
{
    for (long i = 0; i < n; i++) {
        float *d = demb + (size_t)tok[i] * dim;
        const float *s = dy + i * dim;
        for (int j = 0; j < dim; j++)
            d[j] += s[j];
    }
}
