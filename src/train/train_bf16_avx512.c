/*
 * AVX512-BF16 kernels of the trainer's fast path (train_bf16.c has the portable versions and
 * the contracts). Compiled with -mavx512bf16 on top of the AVX-512 flags and used only after
 * the CPU reported the instructions.
 *
 * The GEMM's register tile is 8 rows × 32 columns of C (16 accumulators): per pair of the
 * inner dimension it loads two vectors of B (32 columns × 2 bf16) and broadcasts one 32-bit
 * pair of A per row, so each vdpbf16ps does 32 multiply-adds for one load per 8. Since A is only
 * ever broadcast, its layout is free (row-major or pair-interleaved) at no cost. Rows go in
 * blocks of 64 so an A block stays in L1 while every 32-column panel of B passes over it.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "train/train.h"

#define MR 8
#define MB 64

static inline __m512bh bcast_pair(const uint16_t *a)
{
    int32_t w;
    memcpy(&w, a, sizeof(w));
    return (__m512bh)_mm512_set1_epi32(w);
}

static inline __m512bh load_b(const uint16_t *b)
{
    return (__m512bh)_mm512_loadu_si512(b);
}

static void k8x32(int kp, const uint16_t *A, size_t lda, size_t ldp, const uint16_t *B,
                  size_t ldb, float *C, size_t ldc, bool acc)
{
#define DECL(r) __m512 c##r##0, c##r##1
    DECL(0); DECL(1); DECL(2); DECL(3); DECL(4); DECL(5); DECL(6); DECL(7);
#undef DECL
#define INIT(r)                                                                                    \
    c##r##0 = acc ? _mm512_loadu_ps(C + (r) * ldc) : _mm512_setzero_ps();                         \
    c##r##1 = acc ? _mm512_loadu_ps(C + (r) * ldc + 16) : _mm512_setzero_ps()
    INIT(0); INIT(1); INIT(2); INIT(3); INIT(4); INIT(5); INIT(6); INIT(7);
#undef INIT
    for (int p = 0; p < kp; p++) {
        __m512bh b0 = load_b(B + (size_t)p * ldb), b1 = load_b(B + (size_t)p * ldb + 32);
        const uint16_t *a = A + (size_t)p * ldp;
#define ROW(r)                                                                                     \
    do {                                                                                           \
        __m512bh x = bcast_pair(a + (r) * lda);                                                    \
        c##r##0 = _mm512_dpbf16_ps(c##r##0, x, b0);                                                \
        c##r##1 = _mm512_dpbf16_ps(c##r##1, x, b1);                                                \
    } while (0)
        ROW(0); ROW(1); ROW(2); ROW(3); ROW(4); ROW(5); ROW(6); ROW(7);
#undef ROW
    }
#define STORE(r)                                                                                   \
    _mm512_storeu_ps(C + (r) * ldc, c##r##0);                                                      \
    _mm512_storeu_ps(C + (r) * ldc + 16, c##r##1)
    STORE(0); STORE(1); STORE(2); STORE(3); STORE(4); STORE(5); STORE(6); STORE(7);
#undef STORE
}

/* Any tile up to 8 × 32: rows mr, columns nw (masked). */
static void kgen(int mr, int nw, int kp, const uint16_t *A, size_t lda, size_t ldp,
                 const uint16_t *B, size_t ldb, float *C, size_t ldc, bool acc)
{
    __mmask16 m0 = nw >= 16 ? 0xffff : (__mmask16)((1u << nw) - 1);
    __mmask16 m1 = nw >= 32 ? 0xffff : nw > 16 ? (__mmask16)((1u << (nw - 16)) - 1) : 0;
    __m512 c[MR][2];
    for (int r = 0; r < mr; r++) {
        c[r][0] = acc ? _mm512_maskz_loadu_ps(m0, C + r * ldc) : _mm512_setzero_ps();
        c[r][1] = acc ? _mm512_maskz_loadu_ps(m1, C + r * ldc + 16) : _mm512_setzero_ps();
    }
    for (int p = 0; p < kp; p++) {
        const uint16_t *b = B + (size_t)p * ldb;
        __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(m0, b);
        __m512bh b1 = (__m512bh)_mm512_maskz_loadu_epi32(m1, b + 32);
        for (int r = 0; r < mr; r++) {
            __m512bh x = bcast_pair(A + r * lda + (size_t)p * ldp);
            c[r][0] = _mm512_dpbf16_ps(c[r][0], x, b0);
            c[r][1] = _mm512_dpbf16_ps(c[r][1], x, b1);
        }
    }
    for (int r = 0; r < mr; r++) {
        _mm512_mask_storeu_ps(C + r * ldc, m0, c[r][0]);
        _mm512_mask_storeu_ps(C + r * ldc + 16, m1, c[r][1]);
    }
}

static void gemm(int M, int N, int kp, const uint16_t *A, size_t lda, size_t ldp,
                 const uint16_t *B, size_t ldb, float *C, size_t ldc, bool acc)
{
    for (int m0 = 0; m0 < M; m0 += MB) {
        int m1 = M - m0 < MB ? M : m0 + MB;
        for (int n0 = 0; n0 < N; n0 += 32) {
            int nw = N - n0 < 32 ? N - n0 : 32;
            for (int m = m0; m < m1; m += MR) {
                int mr = m1 - m < MR ? m1 - m : MR;
                const uint16_t *a = A + (size_t)m * lda;
                const uint16_t *b = B + 2 * (size_t)n0;
                float *c = C + (size_t)m * ldc + n0;
                if (mr == MR && nw == 32)
                    k8x32(kp, a, lda, ldp, b, ldb, c, ldc, acc);
                else
                    kgen(mr, nw, kp, a, lda, ldp, b, ldb, c, ldc, acc);
            }
        }
    }
}

static void cvt(uint16_t *dst, const float *src, size_t n, float scale)
{
    __m512 s = _mm512_set1_ps(scale);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(src + i), s);
        __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(src + i + 16), s);
        _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    for (; i < n; i += 16) {
        size_t r = n - i < 16 ? n - i : 16;
        __mmask16 m = (__mmask16)((1u << r) - 1);
        __m256bh h = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), s));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)h);
    }
}

static void cvt_pair(uint16_t *dst, const float *a, const float *b, size_t n, float scale)
{
    __m512 s = _mm512_set1_ps(scale);
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    for (size_t i = 0; i < n; i += 16) {
        size_t r = n - i < 16 ? n - i : 16;
        __mmask16 m = (__mmask16)((1u << r) - 1);
        __m512 va = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), s);
        __m512 vb = b ? _mm512_mul_ps(_mm512_maskz_loadu_ps(m, b + i), s) : _mm512_setzero_ps();
        __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(vb, va); /* a in words 0-15, b in 16-31 */
        __m512i il = _mm512_permutexvar_epi16(idx, ab);
        __mmask32 m2 = r == 16 ? 0xffffffffu : (__mmask32)((1u << (2 * r)) - 1);
        _mm512_mask_storeu_epi16(dst + 2 * i, m2, il);
    }
}

/* e^x to ~2 ulp for x in [−87, 88] (clamped outside): e^x = 2^n·e^r with n = round(x/ln 2),
 * r = x − n·ln 2 in two parts, e^r by its degree-6 Taylor polynomial. */
static inline __m512 exp16(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static inline __m512 sigmoid16(__m512 g)
{
    __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

static void swiglu_fwd(float *a, const float *g, const float *u, long n)
{
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 vg = _mm512_maskz_loadu_ps(m, g + i), vu = _mm512_maskz_loadu_ps(m, u + i);
        _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(_mm512_mul_ps(vg, sigmoid16(vg)), vu));
    }
}

static void swiglu_bwd(float *dg, float *du, const float *da, const float *g, const float *u,
                       long n)
{
    __m512 one = _mm512_set1_ps(1.0f);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 vg = _mm512_maskz_loadu_ps(m, g + i), vu = _mm512_maskz_loadu_ps(m, u + i);
        __m512 vd = _mm512_maskz_loadu_ps(m, da + i), sig = sigmoid16(vg);
        _mm512_mask_storeu_ps(du + i, m, _mm512_mul_ps(vd, _mm512_mul_ps(vg, sig)));
        /* da·u·σ·(1 + g·(1 − σ)) */
        __m512 t = _mm512_fmadd_ps(vg, _mm512_sub_ps(one, sig), one);
        _mm512_mask_storeu_ps(dg + i, m, _mm512_mul_ps(_mm512_mul_ps(vd, vu), _mm512_mul_ps(sig, t)));
    }
}

/* Lanes [c, c+16) of a row whose columns below lim are visible. */
static inline __mmask16 visible(int c, int lim)
{
    int k = lim - c;
    return k >= 16 ? 0xffff : k <= 0 ? 0 : (__mmask16)((1u << k) - 1);
}

static inline __m512i interleave(__m512 a, __m512 b)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

static void fa_fwd_tile(const float *s, int rows, int cols, bool diag, float *m, float *l,
                        float *alpha, uint16_t *pb)
{
    float mnew[KVP_FA_TILE], sum[KVP_FA_TILE];
    for (int r = 0; r < rows; r++) {
        const float *x = s + (size_t)r * cols;
        uint16_t *dst = pb + (size_t)r * cols;
        int lim = diag ? r + 1 : cols;
        __m512 vm = _mm512_set1_ps(m[r]);
        for (int c = 0; c < cols; c += 16)
            vm = _mm512_mask_max_ps(vm, visible(c, lim), vm, _mm512_loadu_ps(x + c));
        float mx = _mm512_reduce_max_ps(vm);
        __m512 vmx = _mm512_set1_ps(mx), vs = _mm512_setzero_ps();
        for (int c = 0; c < cols; c += 32) {
            __m512 e0 = _mm512_maskz_mov_ps(visible(c, lim),
                                            exp16(_mm512_sub_ps(_mm512_loadu_ps(x + c), vmx)));
            __m512 e1 = _mm512_maskz_mov_ps(visible(c + 16, lim),
                                            exp16(_mm512_sub_ps(_mm512_loadu_ps(x + c + 16), vmx)));
            vs = _mm512_add_ps(vs, _mm512_add_ps(e0, e1));
            _mm512_storeu_si512(dst + c, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
        }
        mnew[r] = mx;
        sum[r] = _mm512_reduce_add_ps(vs);
    }
    /* 16 rows at a time: alpha = e^(m − m'), exactly 0 while m is still −inf */
    for (int r = 0; r < rows; r += 16) {
        __mmask16 k = visible(r, rows);
        __m512 mo = _mm512_maskz_loadu_ps(k, m + r), mn = _mm512_maskz_loadu_ps(k, mnew + r);
        __mmask16 live = _mm512_cmp_ps_mask(mo, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        __m512 a = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(mo, mn)));
        __m512 ln = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, l + r), a,
                                    _mm512_maskz_loadu_ps(k, sum + r));
        _mm512_mask_storeu_ps(alpha + r, k, a);
        _mm512_mask_storeu_ps(l + r, k, ln);
        _mm512_mask_storeu_ps(m + r, k, mn);
    }
}

static void fa_bwd_tile(const float *s, const float *dp, int rows, int cols, bool diag,
                        const float *lse, const float *drow, uint16_t *pq, uint16_t *dsq,
                        uint16_t *dsr)
{
    for (int r = 0; r < rows; r += 2) {
        __m512 l0 = _mm512_set1_ps(lse[r]), l1 = _mm512_set1_ps(lse[r + 1]);
        __m512 d0 = _mm512_set1_ps(drow[r]), d1 = _mm512_set1_ps(drow[r + 1]);
        int lim0 = diag ? r + 1 : cols, lim1 = diag ? r + 2 : cols;
        const float *s0 = s + (size_t)r * cols, *s1 = s0 + cols;
        const float *g0 = dp + (size_t)r * cols, *g1 = g0 + cols;
        for (int c = 0; c < cols; c += 16) {
            __m512 p0 = _mm512_maskz_mov_ps(visible(c, lim0),
                                            exp16(_mm512_sub_ps(_mm512_loadu_ps(s0 + c), l0)));
            __m512 p1 = _mm512_maskz_mov_ps(visible(c, lim1),
                                            exp16(_mm512_sub_ps(_mm512_loadu_ps(s1 + c), l1)));
            __m512 ds0 = _mm512_mul_ps(p0, _mm512_sub_ps(_mm512_loadu_ps(g0 + c), d0));
            __m512 ds1 = _mm512_mul_ps(p1, _mm512_sub_ps(_mm512_loadu_ps(g1 + c), d1));
            size_t q = (size_t)(r / 2) * 2 * cols + 2 * (size_t)c;
            _mm512_storeu_si512(pq + q, interleave(p0, p1));
            _mm512_storeu_si512(dsq + q, interleave(ds0, ds1));
            _mm256_storeu_si256((__m256i *)(dsr + (size_t)r * cols + c),
                                (__m256i)_mm512_cvtneps_pbh(ds0));
            _mm256_storeu_si256((__m256i *)(dsr + (size_t)(r + 1) * cols + c),
                                (__m256i)_mm512_cvtneps_pbh(ds1));
        }
    }
}

static const struct kvp_tk_ops tk_avx512bf16 = {.name = "avx512bf16",
                                                .gemm = gemm,
                                                .cvt = cvt,
                                                .cvt_pair = cvt_pair,
                                                .fa_fwd_tile = fa_fwd_tile,
                                                .fa_bwd_tile = fa_bwd_tile,
                                                .swiglu_fwd = swiglu_fwd,
                                                .swiglu_bwd = swiglu_bwd};

const struct kvp_tk_ops *kvp_tk_avx512bf16(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw"))
        return NULL;
    return &tk_avx512bf16;
}
