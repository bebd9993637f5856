/* The k largest of n floats by index (the selection of every top-k policy: quest's blocks, snapkv's
 * tokens, the predictor's candidates). topk.c is portable C with vector extensions compiled per
 * instruction set; topk_avx512.c holds the AVX-512 compaction step. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "kernels/simd.h"
#include "kernels/topk.h"

/* heap of indices ordered so the root is the weakest kept element: smallest value, and among
 * equal values the highest index (ties go to the lower index) */
static int weaker(const float *x, int a, int b)
{
    return x[a] < x[b] || (x[a] == x[b] && a > b);
}

/* the heap of topk_heap: the weakest kept at the root */
#define IHEAP_NAME tk_heap
#define IHEAP_CTX const float *
#define IHEAP_ABOVE(x, a, b) weaker(x, a, b)
#include "kernels/index_heap.inc"

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/* The heap version: O(n log k), exact whatever the values (NaN included). */
static void topk_heap(const float *x, int n, int k, int *out, int *h)
{
    for (int i = 0; i < k; i++)
        h[i] = i;
    tk_heap_build(x, h, k);
    for (int i = k; i < n; i++)
        if (weaker(x, h[0], i)) {
            h[0] = i;
            tk_heap_sift(x, h, k, 0);
        }
    memcpy(out, h, (size_t)k * sizeof(int));
    qsort(out, (size_t)k, sizeof(int), cmp_int);
}

static void swap_int(int *a, int *b)
{
    int t = *a;
    *a = *b;
    *b = t;
}

/* idx[k] after reordering idx[0..n) by quickselect so that it is the k-th (0-based) strongest
 * of the x[idx[i]] in the order "larger value, then lower index" (a strict total order
 * without NaN); -1 after suspiciously many rounds (a pathological input: the caller falls
 * back to the heap). */
static int kth_strongest(const float *x, int *idx, int n, int k)
{
    int lo = 0, hi = n - 1, rounds = 16; /* expected ~2.4 log2(n) */
    for (int m = n; m; m >>= 1)
        rounds += 4;
    while (lo < hi) {
        if (rounds-- == 0)
            return -1;
        /* median of three as the pivot, kept by index so the comparisons never move */
        int mid = lo + (hi - lo) / 2;
        if (weaker(x, idx[lo], idx[mid]))
            swap_int(&idx[lo], &idx[mid]);
        if (weaker(x, idx[mid], idx[hi]))
            swap_int(&idx[mid], &idx[hi]);
        if (weaker(x, idx[lo], idx[mid]))
            swap_int(&idx[lo], &idx[mid]);
        int pv = idx[mid], i = lo, j = hi;
        /* Hoare partition: each scan stops at the pivot or at an element a previous scan
         * stopped at and swapped, so it stays in [lo, hi] for any comparison results */
        do {
            while (weaker(x, pv, idx[i]))
                i++;
            while (weaker(x, idx[j], pv))
                j--;
            if (i <= j)
                swap_int(&idx[i++], &idx[j--]);
        } while (i <= j);
        if (j < k)
            lo = i;
        if (k < i)
            hi = j;
    }
    return idx[k];
}

/* The selection order as unsigned keys: a < b as floats iff key(a) < key(b) (both zeros one
 * key, since the order treats them as equal; NaN is handled by the caller). */
static inline uint32_t order_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u << 1) == 0)
        u = 0;
    return u >> 31 ? ~u : u | 0x80000000u;
}

/* Vectors of 16 keys for topk_bisect; compiled per instruction set (target_clones). */
typedef uint32_t tk_u16 __attribute__((vector_size(64)));
typedef int32_t tk_i16 __attribute__((vector_size(64)));
typedef float tk_f16 __attribute__((vector_size(64)));

/* order_key on 16 floats at once (a macro: a function returning a vector is an ABI question
 * under target_clones) */
#define ORDER_KEY16(out, f)                                                                        \
    do {                                                                                           \
        tk_u16 u_ = (tk_u16)(f);                                                                   \
        u_ = (tk_u16)((tk_i16)u_ & ~(tk_i16)((u_ << 1) == 0)); /* both zeros: one key */           \
        tk_u16 neg_ = (tk_u16)((tk_i16)u_ < 0);                                                    \
        (out) = (~u_ & neg_) | ((u_ | 0x80000000u) & ~neg_);                                       \
    } while (0)

/* The keys of x[i .. i + 16) into kv; past n the lanes are 0, below every key a float has
 * (-inf's is 0x007fffff), so they never count. */
#define LOAD_KEYS16(kv, x, i, n)                                                                   \
    do {                                                                                           \
        tk_f16 v_ = {0};                                                                           \
        const int nl_ = (n) - (i);                                                                 \
        if (nl_ >= 16)                                                                             \
            memcpy(&v_, (x) + (i), sizeof(v_));                                                   \
        else if ((n) >= 16) /* the last 16, lanes before i zeroed below */                         \
            memcpy(&v_, (x) + (n) - 16, sizeof(v_));                                               \
        else                                                                                       \
            for (int l_ = 0; l_ < nl_; l_++)                                                       \
                v_[l_] = (x)[(i) + l_];                                                            \
        ORDER_KEY16(kv, v_);                                                                       \
        if (nl_ < 16)                                                                              \
            kv &= (n) >= 16 ? (tk_u16)(tk_lane >= 16 - nl_) : (tk_u16)(tk_lane < nl_);             \
    } while (0)

static const tk_i16 tk_lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* The sum of the 16 lanes, halving the vector three times (the lanes' order does not matter:
 * integer counts); a macro, as a vector argument is an ABI question under target_clones. */
#if defined(__clang__) /* the fuzzing build */
#define TK_SHUFFLE(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define TK_SHUFFLE(v, ...) __builtin_shuffle(v, (tk_i16){__VA_ARGS__})
#endif
#define HSUM16(out, c)                                                                             \
    do {                                                                                           \
        tk_i16 h_ = (c);                                                                           \
        h_ += TK_SHUFFLE(h_, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);                \
        h_ += TK_SHUFFLE(h_, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);                      \
        h_ += TK_SHUFFLE(h_, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);                      \
        (out) = h_[0] + h_[1];                                                                     \
    } while (0)

/* How many of the first n values have key >= t (from the floats, or from stored keys). */
__attribute__((always_inline)) static inline int count_ge_x(const float *x, int n, uint32_t t)
{
    tk_i16 c = {0};
    for (int i = 0; i < n; i += 16) {
        tk_u16 kv;
        LOAD_KEYS16(kv, x, i, n);
        c -= (tk_i16)(kv >= t);
    }
    int sum;
    HSUM16(sum, c);
    return sum;
}

__attribute__((always_inline)) static inline int count_ge_keys(const uint32_t *key, int n,
                                                               uint32_t t)
{
    tk_i16 c = {0};
    const int n16 = n / 16 * 16;
    for (int i = 0; i < n16; i += 16) {
        tk_u16 v;
        memcpy(&v, key + i, sizeof(v));
        c -= (tk_i16)(v >= t);
    }
    if (n16 < n && n >= 16) { /* the last 16, less the lanes counted already */
        tk_u16 v;
        memcpy(&v, key + n - 16, sizeof(v));
        c -= (tk_i16)(v >= t) & (tk_i16)(tk_lane >= n16 + 16 - n);
    } else if (n16 < n) {
        tk_u16 v = {0};
        for (int l = 0; l < n - n16; l++)
            v[l] = key[n16 + l];
        c -= (tk_i16)(v >= t) & (tk_i16)(tk_lane < n - n16);
    }
    int sum;
    HSUM16(sum, c);
    return sum;
}

/* Whether the compaction takes the AVX-512 compress stores: the kernel table in use is an
 * AVX-512 one (so KVP_SIMD=scalar|avx2 runs the portable loop, which the tests rely on). */
#if defined(__x86_64__)
static bool compact_avx512(void)
{
    return strncmp(kvp_simd()->name, "avx512", 6) == 0;
}
#endif

/* The largest t in [lo, top) with at least r of the n keys >= t, given that lo has (the
 * answer is a coin toss each step, so neither way is a branch). */
__attribute__((always_inline)) static inline uint32_t bisect_keys(const uint32_t *key, int n,
                                                                  int r, uint32_t lo,
                                                                  uint64_t top)
{
    while (top - lo > 1) {
        const uint32_t mid = (uint32_t)(lo + (top - lo) / 2);
        const bool in = count_ge_keys(key, n, mid) >= r;
        lo = in ? mid : lo;
        top = in ? top : mid;
    }
    return lo;
}

/* The k strongest of m keys whose k-th strongest is t, in index order: the keys above t and
 * the first k - count(key > t) equal to it; key j's index is idx[j] (NULL: j). */
__attribute__((always_inline)) static inline void write_top(const uint32_t *key, const int *idx,
                                                            int m, uint32_t t, int k, int *out)
{
    int ties = k - count_ge_keys(key, m, t + 1), got = 0;
    for (int j = 0; j < m && got < k; j++) {
        const int take = key[j] > t || (key[j] == t && ties > 0);
        ties -= key[j] == t && take;
        out[got] = idx ? idx[j] : j;
        got += take;
    }
}

/* From this many values on, topk_bisect's first probe comes from a sample. */
enum { TOPK_SAMPLE_MIN_N = 256, TOPK_SAMPLE = 64 };

/* kvp_topk_indices by bisection on the keys: the k-th strongest key T is the largest t with
 * count(key >= t) >= k, found by halving [lo, hi) where count(key >= lo) >= k > count(key >=
 * hi). Each step is one vector pass of compare-and-count (no branch on a value, no histogram
 * whose increments wait on each other); whenever a step leaves at most half of the values at
 * or above lo, those are compacted (index order kept) and the next passes read only them. On
 * long inputs the first probe is a sample's key a little below the k-th strongest's expected
 * place, which usually brackets T and compacts to about k + n/16 values at once (a probe is
 * only a guess: the invariant holds whatever it counts). Then one pass in index order writes
 * the keys above T and the first k - count(key > T) equal to it. The radix selection it
 * replaced cost 5 µs per call over 1024 block bounds in the decode (three 8 KB histogram
 * clears, serialised bucket increments on close values). Returns -1 (nothing written) when x
 * holds NaN. scratch holds n ints. */
KVP_X86_CLONES static int
topk_bisect(const float *x, int n, int k, int *out, int *scratch)
{
    const int half = n / 2;
    int *idx = scratch;                         /* compacted indices [0, m) */
    uint32_t *key = (uint32_t *)scratch + half; /* and their keys */
    uint32_t lo = UINT32_MAX, hi = 0;
    {
        tk_u16 vmin = {0}, vmax = {0};
        vmin += UINT32_MAX;
        tk_i16 nan = {0};
        for (int i = 0; i < n; i += 16) {
            tk_f16 v = {0};
            const int nl = n - i < 16 ? n - i : 16;
            if (nl == 16)
                memcpy(&v, x + i, sizeof(v));
            else
                for (int l = 0; l < nl; l++)
                    v[l] = x[i + l];
            nan |= (tk_i16)(v != v);
            tk_u16 kv, lt, gt, live = (tk_u16)(tk_lane < nl);
            ORDER_KEY16(kv, v);
            lt = (tk_u16)(kv < vmin) & live;
            gt = (tk_u16)(kv > vmax) & live;
            vmin = (kv & lt) | (vmin & ~lt);
            vmax = (kv & gt) | (vmax & ~gt);
        }
        for (int l = 0; l < 16; l++) {
            if (nan[l])
                return -1;
            lo = vmin[l] < lo ? vmin[l] : lo;
            hi = vmax[l] > hi ? vmax[l] : hi;
        }
    }
    /* NaN excluded, no key is UINT32_MAX (+inf's is 0xff800000): hi + 1 does not wrap */
    uint64_t top = (uint64_t)hi + 1;
    if (k >= half) {
        /* no step could compact (that needs fewer than n/2 values kept, and k are): the keys
         * once, where the indices would go, and every pass over them */
        uint32_t *all = (uint32_t *)scratch;
        for (int i = 0; i < n; i++)
            all[i] = order_key(x[i]);
        write_top(all, NULL, n, bisect_keys(all, n, k, lo, top), k, out);
        return 0;
    }
    int m = -1; /* -1: still the whole of x */
    uint32_t probe = 0;
    if (n >= TOPK_SAMPLE_MIN_N && k < n / 4) {
        /* the sample's r-th strongest key, r a few above k's share of it, by the same
         * bisection over its four vectors */
        uint32_t sk[TOPK_SAMPLE];
        const int stride = n / TOPK_SAMPLE;
        for (int j = 0; j < TOPK_SAMPLE; j++)
            sk[j] = order_key(x[j * stride]);
        probe = bisect_keys(sk, TOPK_SAMPLE, (int)((int64_t)k * TOPK_SAMPLE / n) + 3, lo, top);
    }
    while (top - lo > 1) {
        uint32_t mid = (uint32_t)(lo + (top - lo) / 2);
        if (probe > lo && probe < top) {
            mid = probe;
            probe = 0;
        }
        const int c = m < 0 ? count_ge_x(x, n, mid) : count_ge_keys(key, m, mid);
        if (c < k) {
            top = mid;
            continue;
        }
        lo = mid;
        if (c < (m < 0 ? half : m / 2 + 1)) { /* keep only key >= lo, in index order: the
                                             * writes (one past the last kept) stay in idx's
                                             * and key's halves */
            int w = 0;
#if defined(__x86_64__)
            if (m < 0 && compact_avx512())
                w = kvp_topk_compact_avx512(x, n, lo, idx, key);
            else
#endif
                if (m < 0)
                for (int i = 0; i < n; i++) {
                    const uint32_t kv = order_key(x[i]);
                    idx[w] = i;
                    key[w] = kv;
                    w += kv >= lo;
                }
            else
                for (int j = 0; j < m; j++) {
                    idx[w] = idx[j];
                    key[w] = key[j];
                    w += key[j] >= lo;
                }
            m = w;
        }
    }
    /* T = lo: fewer than k keys above it; the rest of the k are its equals, lower index first */
    if (m >= 0) {
        write_top(key, idx, m, lo, k, out);
        return 0;
    }
    int ties = k - count_ge_x(x, n, lo + 1), got = 0;
    for (int i = 0; i < n && got < k; i++) {
        const uint32_t kv = order_key(x[i]);
        const int take = kv > lo || (kv == lo && ties > 0);
        ties -= kv == lo && take;
        out[got] = i;
        got += take;
    }
    return 0;
}

void kvp_topk_indices(const float *x, int n, int k, int *out, int *scratch)
{
    if (k > n)
        k = n;
    if (k <= 0)
        return;
    if (topk_bisect(x, n, k, out, scratch) == 0)
        return;
    /* With NaN (the only input topk_bisect refuses): quickselect finds the k-th strongest t;
     * the top k are then exactly the indices not weaker than t, and one pass in index order
     * writes them already sorted. With NaN the order is not total and the count can come out
     * wrong: the heap decides then. */
    for (int i = 0; i < n; i++)
        scratch[i] = i;
    int t = kth_strongest(x, scratch, n, k - 1), got = 0;
    if (t >= 0)
        for (int i = 0; i < n; i++)
            if (!weaker(x, i, t)) {
                if (got < k)
                    out[got] = i;
                got++;
            }
    if (got != k)
        topk_heap(x, n, k, out, scratch);
}
