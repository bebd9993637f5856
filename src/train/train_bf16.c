/*
 * The trainer's bf16 fast path: the kernel table (portable C here, AVX512-BF16 in
 * train_bf16_avx512.c), the fused attention built on it, and the SIMD cross-entropy.
 *
 * Every product takes bf16 operands and accumulates in f32 (the rounding of mixed-precision
 * training); inputs are rounded to nearest even when converted. Operand B of the GEMM is
 * "pair-interleaved" ([k/2][n][2]: the two inner-dimension neighbours of a column side by side),
 * the layout AVX512-BF16's dot instruction reads, so every caller packs into that form once and
 * the kernel never transposes.
 *
 * Fused attention (FlashAttention-2 on a CPU): per (sequence, KV head) and query head, queries
 * and keys go in tiles of KVP_FA_TILE. The forward pass keeps one [tile][tile] score block, a
 * running max and sum per row and the output tile in f32, rescaling as later key tiles raise the
 * max; the backward pass walks key tiles in the outer loop, recomputes each probability block
 * from the saved log-sum-exp, and accumulates dK and dV of the key tile (transposed: dKᵀ =
 * Qᵀ·dS, so P and dS are only pair-interleaved by rows, never transposed) while dQ collects in
 * an f32 buffer. Memory per thread is O(T·hd), none of it O(T²).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/simd.h"
#include "core/settings.h"
#include "kernels/types.h"
#include "train/train.h"

/* ===================================== precision ============================================== */

const char *kvp_train_precision_name(int prec)
{
    return prec == KVP_PREC_BF16 ? "bf16" : "f32";
}

int kvp_train_precision_by_name(const char *s)
{
    if (!strcmp(s, "f32"))
        return KVP_PREC_F32;
    if (!strcmp(s, "bf16"))
        return KVP_PREC_BF16;
    return -1;
}

/* ================================= portable kernels =========================================== */

static void gemm_scalar(int M, int N, int kp, const uint16_t *A, size_t lda, size_t ldp,
                        const uint16_t *B, size_t ldb, float *C, size_t ldc, bool acc)
{
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        if (!acc)
            memset(c, 0, sizeof(float) * (size_t)N);
        const uint16_t *a = A + (size_t)i * lda;
        for (int p = 0; p < kp; p++) {
            const uint16_t *ap = a + (size_t)p * ldp;
            float a0 = kvp_bf16_to_f32(ap[0]), a1 = kvp_bf16_to_f32(ap[1]);
            const uint16_t *b = B + (size_t)p * ldb;
            for (int j = 0; j < N; j++)
                c[j] += a0 * kvp_bf16_to_f32(b[2 * j]) + a1 * kvp_bf16_to_f32(b[2 * j + 1]);
        }
    }
}

static void cvt_scalar(uint16_t *dst, const float *src, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kvp_f32_to_bf16(src[i] * scale);
}

static void cvt_pair_scalar(uint16_t *dst, const float *a, const float *b, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        dst[2 * i] = kvp_f32_to_bf16(a[i] * scale);
        dst[2 * i + 1] = b ? kvp_f32_to_bf16(b[i] * scale) : 0;
    }
}

static void fa_fwd_tile_scalar(const float *s, int rows, int cols, bool diag, float *m, float *l,
                               float *alpha, uint16_t *pb)
{
    for (int r = 0; r < rows; r++) {
        const float *x = s + (size_t)r * cols;
        int lim = diag ? r + 1 : cols;
        float mx = m[r];
        for (int c = 0; c < lim; c++)
            mx = x[c] > mx ? x[c] : mx;
        float sum = 0.0f;
        for (int c = 0; c < cols; c++) {
            float e = c < lim ? expf(x[c] - mx) : 0.0f;
            sum += e;
            pb[(size_t)r * cols + c] = kvp_f32_to_bf16(e);
        }
        alpha[r] = expf(m[r] - mx);
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mx;
    }
}

static void fa_bwd_tile_scalar(const float *s, const float *dp, int rows, int cols, bool diag,
                               const float *lse, const float *drow, uint16_t *pq, uint16_t *dsq,
                               uint16_t *dsr)
{
    for (int r = 0; r < rows; r++) {
        int lim = diag ? r + 1 : cols;
        uint16_t *q2 = pq + (size_t)(r / 2) * 2 * cols + r % 2;
        uint16_t *d2 = dsq + (size_t)(r / 2) * 2 * cols + r % 2;
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            float p = c < lim ? expf(s[i] - lse[r]) : 0.0f;
            float ds = p * (dp[i] - drow[r]);
            q2[2 * c] = kvp_f32_to_bf16(p);
            d2[2 * c] = kvp_f32_to_bf16(ds);
            dsr[i] = kvp_f32_to_bf16(ds);
        }
    }
}

static const struct kvp_tk_ops tk_scalar = {.name = "scalar",
                                            .gemm = gemm_scalar,
                                            .cvt = cvt_scalar,
                                            .cvt_pair = cvt_pair_scalar,
                                            .fa_fwd_tile = fa_fwd_tile_scalar,
                                            .fa_bwd_tile = fa_bwd_tile_scalar,
                                            .swiglu_fwd = kvp_op_swiglu_fwd,
                                            .swiglu_bwd = kvp_op_swiglu_bwd};

const struct kvp_tk_ops *kvp_tk_scalar(void)
{
    return &tk_scalar;
}

#if !defined(__x86_64__)
/* train_bf16_avx512.c is built for x86-64 only; elsewhere the portable kernels run. */
const struct kvp_tk_ops *kvp_tk_avx512bf16(void)
{
    return NULL;
}
#endif

const struct kvp_tk_ops *kvp_tk(void)
{
    static const struct kvp_tk_ops *chosen;
    const struct kvp_tk_ops *t = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    t = kvp_setting_is(KVP_SETTING_TRAIN_KERNELS, "scalar") ? NULL : kvp_tk_avx512bf16();
    if (!t)
        t = &tk_scalar;
    __atomic_store_n(&chosen, t, __ATOMIC_RELEASE);
    return t;
}

/* ================================== fused attention =========================================== */

#define TL KVP_FA_TILE

static int pad_tile(int T)
{
    return (T + TL - 1) / TL * TL;
}

/* Scratch carving: every piece 64-byte aligned inside the caller's float buffer. */
struct bump {
    float *p;
};

static void *take(struct bump *b, size_t bytes)
{
    void *r = b->p;
    b->p += (bytes + 63) / 64 * 16;
    return r;
}

size_t kvp_fa_scratch(int T, int hd)
{
    /* the backward pass's pieces (the forward needs fewer): bf16 operands and tiles, then f32 */
    size_t tp = (size_t)pad_tile(T), h = (size_t)hd;
    size_t n16 = 8 * tp * h + 3 * TL * TL;
    size_t n32 = tp * h + 2 * tp + 2 * TL * TL + 2 * h * TL + 3 * TL;
    return (n16 + 1) / 2 + n32 + 16 * 24; /* + 64-byte alignment of up to 24 pieces */
}

/* rows[t][0..hd) = bf16(src[t·ld ..]·scale) for t < T, zero rows to tp. */
static void pack_rows(const struct kvp_tk_ops *tk, uint16_t *dst, const float *src, int T, int tp,
                      int hd, int ld, float scale)
{
    for (int t = 0; t < T; t++)
        tk->cvt(dst + (size_t)t * hd, src + (size_t)t * ld, (size_t)hd, scale);
    memset(dst + (size_t)T * hd, 0, sizeof(uint16_t) * (size_t)(tp - T) * hd);
}

/* Pair-interleave along tokens: dst[p][d][2] = (src[2p][d], src[2p+1][d]), zero past T. The
 * B operand whose inner dimension is the token. */
static void pack_tok_pairs(const struct kvp_tk_ops *tk, uint16_t *dst, const float *src, int T,
                           int tp, int hd, int ld, float scale)
{
    for (int p = 0; 2 * p < T; p++)
        tk->cvt_pair(dst + (size_t)p * 2 * hd, src + (size_t)2 * p * ld,
                     2 * p + 1 < T ? src + (size_t)(2 * p + 1) * ld : NULL, (size_t)hd, scale);
    int done = (T + 1) / 2;
    memset(dst + (size_t)done * 2 * hd, 0, sizeof(uint16_t) * (size_t)(tp / 2 - done) * 2 * hd);
}

/* Pair-interleave along the head dimension: dst[d/2][t][2] = (rows[t][d], rows[t][d+1]), a
 * 32-bit transpose of bf16 rows [tp][hd]. The B operand whose inner dimension is hd. */
static void pack_dim_pairs(uint32_t *dst, const uint16_t *rows, int tp, int hd)
{
    int hp = hd / 2;
    for (int t0 = 0; t0 < tp; t0 += 16)
        for (int p = 0; p < hp; p++)
            for (int t = t0; t < t0 + 16; t++) {
                uint32_t w;
                memcpy(&w, rows + (size_t)t * hd + 2 * p, sizeof(w));
                dst[(size_t)p * tp + t] = w;
            }
}

void kvp_fa_fwd(const struct kvp_tk_ops *tk, float *out, float *lse, const float *q,
                const float *k, const float *v, int T, int hd, int n_rep, int ldq, int ldkv,
                float *scratch)
{
    int tp = pad_tile(T), nt = tp / TL, hp = hd / 2;
    float scale = 1.0f / sqrtf((float)hd);
    struct bump b = {scratch};
    uint16_t *krow = take(&b, sizeof(uint16_t) * (size_t)tp * hd);
    uint32_t *kdp = take(&b, sizeof(uint32_t) * (size_t)tp * hp);
    uint16_t *vkp = take(&b, sizeof(uint16_t) * (size_t)tp * hd);
    uint16_t *qrow = take(&b, sizeof(uint16_t) * (size_t)tp * hd);
    uint16_t *pb = take(&b, sizeof(uint16_t) * TL * TL);
    float *s = take(&b, sizeof(float) * TL * TL);
    float *o = take(&b, sizeof(float) * TL * (size_t)hd);
    float *mrow = take(&b, sizeof(float) * TL);
    float *lrow = take(&b, sizeof(float) * TL);
    float *alpha = take(&b, sizeof(float) * TL);

    pack_rows(tk, krow, k, T, tp, hd, ldkv, 1.0f);
    pack_dim_pairs(kdp, krow, tp, hd);
    pack_tok_pairs(tk, vkp, v, T, tp, hd, ldkv, 1.0f);
    for (int r = 0; r < n_rep; r++) {
        pack_rows(tk, qrow, q + r * hd, T, tp, hd, ldq, scale);
        for (int i = 0; i < nt; i++) {
            for (int a = 0; a < TL; a++) {
                mrow[a] = -INFINITY;
                lrow[a] = 0.0f;
            }
            for (int j = 0; j <= i; j++) {
                tk->gemm(TL, TL, hp, qrow + (size_t)i * TL * hd, (size_t)hd, 2,
                         (const uint16_t *)(kdp + (size_t)j * TL), (size_t)2 * tp, s, TL, false);
                tk->fa_fwd_tile(s, TL, TL, j == i, mrow, lrow, alpha, pb);
                for (int a = 0; a < TL; a++) {
                    float *orow = o + (size_t)a * hd;
                    if (j == 0)
                        memset(orow, 0, sizeof(float) * (size_t)hd);
                    else if (alpha[a] != 1.0f)
                        for (int d = 0; d < hd; d++)
                            orow[d] *= alpha[a];
                }
                tk->gemm(TL, hd, TL / 2, pb, TL, 2, vkp + (size_t)j * (TL / 2) * 2 * hd,
                         (size_t)2 * hd, o, (size_t)hd, true);
            }
            for (int a = 0; a < TL && i * TL + a < T; a++) {
                int t = i * TL + a;
                float inv = 1.0f / lrow[a];
                float *dst = out + (size_t)t * ldq + r * hd;
                for (int d = 0; d < hd; d++)
                    dst[d] = o[(size_t)a * hd + d] * inv;
                lse[(size_t)r * T + t] = mrow[a] + logf(lrow[a]);
            }
        }
    }
}

void kvp_fa_bwd(const struct kvp_tk_ops *tk, float *dq, float *dk, float *dv, const float *dout,
                const float *out, const float *lse, const float *q, const float *k,
                const float *v, int T, int hd, int n_rep, int ldq, int ldkv, float *scratch)
{
    int tp = pad_tile(T), nt = tp / TL, hp = hd / 2;
    float scale = 1.0f / sqrtf((float)hd);
    struct bump b = {scratch};
    uint16_t *rows = take(&b, sizeof(uint16_t) * (size_t)tp * hd); /* staging for dim pairs */
    uint32_t *kdp = take(&b, sizeof(uint32_t) * (size_t)tp * hp);
    uint16_t *kkp = take(&b, sizeof(uint16_t) * (size_t)tp * hd);
    uint32_t *vdp = take(&b, sizeof(uint32_t) * (size_t)tp * hp);
    uint16_t *qrow = take(&b, sizeof(uint16_t) * (size_t)tp * hd);
    uint16_t *qkp = take(&b, sizeof(uint16_t) * (size_t)tp * hd);
    uint16_t *dorow = take(&b, sizeof(uint16_t) * (size_t)tp * hd);
    uint16_t *dokp = take(&b, sizeof(uint16_t) * (size_t)tp * hd);
    uint16_t *pq = take(&b, sizeof(uint16_t) * TL * TL);
    uint16_t *dsq = take(&b, sizeof(uint16_t) * TL * TL);
    uint16_t *dsr = take(&b, sizeof(uint16_t) * TL * TL);
    float *dqacc = take(&b, sizeof(float) * (size_t)tp * hd);
    float *drow = take(&b, sizeof(float) * (size_t)tp);
    float *lrow = take(&b, sizeof(float) * (size_t)tp);
    float *s = take(&b, sizeof(float) * TL * TL);
    float *dp = take(&b, sizeof(float) * TL * TL);
    float *dkt = take(&b, sizeof(float) * (size_t)hd * TL);
    float *dvt = take(&b, sizeof(float) * (size_t)hd * TL);

    pack_rows(tk, rows, k, T, tp, hd, ldkv, 1.0f);
    pack_dim_pairs(kdp, rows, tp, hd);
    pack_tok_pairs(tk, kkp, k, T, tp, hd, ldkv, 1.0f);
    pack_rows(tk, rows, v, T, tp, hd, ldkv, 1.0f);
    pack_dim_pairs(vdp, rows, tp, hd);
    for (int r = 0; r < n_rep; r++) {
        pack_rows(tk, qrow, q + r * hd, T, tp, hd, ldq, scale);
        pack_tok_pairs(tk, qkp, q + r * hd, T, tp, hd, ldq, scale);
        pack_rows(tk, dorow, dout + r * hd, T, tp, hd, ldq, 1.0f);
        pack_tok_pairs(tk, dokp, dout + r * hd, T, tp, hd, ldq, 1.0f);
        for (int t = 0; t < tp; t++) {
            float d = 0.0f;
            if (t < T) {
                const float *x = dout + (size_t)t * ldq + r * hd;
                const float *y = out + (size_t)t * ldq + r * hd;
                for (int e = 0; e < hd; e++)
                    d += x[e] * y[e];
            }
            drow[t] = d;
            lrow[t] = t < T ? lse[(size_t)r * T + t] : 0.0f; /* padded rows: dO = 0, no effect */
        }
        memset(dqacc, 0, sizeof(float) * (size_t)tp * hd);
        for (int j = 0; j < nt; j++) {
            bool first = true;
            for (int i = j; i < nt; i++) {
                tk->gemm(TL, TL, hp, qrow + (size_t)i * TL * hd, (size_t)hd, 2,
                         (const uint16_t *)(kdp + (size_t)j * TL), (size_t)2 * tp, s, TL, false);
                tk->gemm(TL, TL, hp, dorow + (size_t)i * TL * hd, (size_t)hd, 2,
                         (const uint16_t *)(vdp + (size_t)j * TL), (size_t)2 * tp, dp, TL, false);
                tk->fa_bwd_tile(s, dp, TL, TL, j == i, lrow + i * TL, drow + i * TL, pq, dsq, dsr);
                /* dVᵀ += dOᵀ·P, dKᵀ += (scale·Q)ᵀ·dS, dQ += dS·K (scale applied at the end) */
                tk->gemm(hd, TL, TL / 2, dokp + (size_t)i * TL * hd, 2, (size_t)2 * hd, pq, 2 * TL,
                         dvt, TL, !first);
                tk->gemm(hd, TL, TL / 2, qkp + (size_t)i * TL * hd, 2, (size_t)2 * hd, dsq, 2 * TL,
                         dkt, TL, !first);
                tk->gemm(TL, hd, TL / 2, dsr, TL, 2, kkp + (size_t)j * (TL / 2) * 2 * hd,
                         (size_t)2 * hd, dqacc + (size_t)i * TL * hd, (size_t)hd, true);
                first = false;
            }
            for (int c = 0; c < TL && j * TL + c < T; c++) {
                float *dkr = dk + (size_t)(j * TL + c) * ldkv, *dvr = dv + (size_t)(j * TL + c) * ldkv;
                for (int d = 0; d < hd; d++) {
                    dkr[d] += dkt[(size_t)d * TL + c];
                    dvr[d] += dvt[(size_t)d * TL + c];
                }
            }
        }
        for (int t = 0; t < T; t++) {
            float *dst = dq + (size_t)t * ldq + r * hd;
            for (int d = 0; d < hd; d++)
                dst[d] = dqacc[(size_t)t * hd + d] * scale;
        }
    }
}

/* =================================== cross-entropy ============================================ */

double kvp_op_xent_fast(float *logits, const int32_t *targets, const float *w, long n, int V,
                        float scale, float *nll)
{
    const struct kvp_simd_ops *simd = kvp_simd();
    double total = 0.0;
    for (long i = 0; i < n; i++) {
        float *row = logits + i * V;
        float wi = w ? w[i] : 1.0f;
        float mx = kvp_simd_max(simd, row, V);
        float zt = row[targets[i]];
        float sum = simd->exp_sum(row, V, mx);
        double li = (double)mx + log((double)sum) - zt;
        if (nll)
            nll[i] = (float)li;
        total += wi * li;
        float g = wi * scale;
        float f = g / sum;
        for (int j = 0; j < V; j++)
            row[j] *= f;
        row[targets[i]] -= g;
    }
    return total;
}
