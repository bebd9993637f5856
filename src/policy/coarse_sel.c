/* Coarse-to-fine block ranking (see coarse_sel.h). */
#include "policy/coarse_sel.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/topk.h"

/* Group order: larger bound first, ties to the lower group (deterministic in both modes). */
static bool g_before(const float *gs, int a, int b)
{
    return gs[a] > gs[b] || (gs[a] == gs[b] && a < b);
}

#define IHEAP_NAME g_heap
#define IHEAP_CTX const float *
#define IHEAP_ABOVE(gs, a, b) g_before(gs, a, b)
#include "kernels/index_heap.inc"

int kvp_coarse_order_init(const float *gscore, int g0, int g1, int *heap)
{
    int n = 0;
    for (int gi = g0; gi < g1; gi++)
        heap[n++] = gi;
    g_heap_build(gscore, heap, n);
    return n;
}

int kvp_coarse_order_pop(const float *gscore, int *heap, int *n)
{
    return g_heap_pop(gscore, heap, n);
}

/* Block k-heap, root the weakest held: smaller score, and among equal scores the higher block
 * (kvp_topk_indices' order, topk.c, so the same k blocks win). Scores are indexed by block id
 * less the first candidate. */
struct b_scores {
    const float *s;
    int first;
};

static bool b_weaker(struct b_scores c, int a, int b)
{
    const float sa = c.s[a - c.first], sb = c.s[b - c.first];
    return sa < sb || (sa == sb && a > b);
}

#define IHEAP_NAME b_heap
#define IHEAP_CTX struct b_scores
#define IHEAP_ABOVE(c, a, b) b_weaker(c, a, b)
#include "kernels/index_heap.inc"

/* The n block ids of a (non-negative) in ascending order into out, by 8-bit radix passes between
 * a and out (a is overwritten), as many as the largest id needs: a fraction of a comparison
 * sort's cost at the k of long contexts. */
static void sort_ids(int *a, int n, int32_t *out)
{
    int max = 0;
    for (int i = 0; i < n; i++)
        max = a[i] > max ? a[i] : max;
    int *src = a, *dst = out;
    for (int shift = 0; shift == 0 || (shift < 32 && (max >> shift) != 0); shift += 8) {
        int count[257] = {0};
        for (int i = 0; i < n; i++)
            count[((src[i] >> shift) & 255) + 1]++;
        for (int d = 0; d < 256; d++)
            count[d + 1] += count[d];
        for (int i = 0; i < n; i++)
            dst[count[(src[i] >> shift) & 255]++] = src[i];
        int *t = src;
        src = dst;
        dst = t;
    }
    if (src != out)
        memcpy(out, src, (size_t)n * sizeof(int32_t));
}

int kvp_coarse_pick(const float *gscore, int G, int first, int end, int k, int max_groups,
                    int *gids, int *work, int *n_blocks)
{
    const int g0 = first / G, g1 = (end - 1) / G + 1, ng = g1 - g0;
    int m = max_groups < ng ? max_groups : ng, n_vis = 0;
    const int least = (k + G - 1) / G; /* whole groups holding k blocks */
    if (m < least)
        m = least < ng ? least : ng;
    for (;;) {
        kvp_topk_indices(gscore + g0, ng, m, gids, work);
        n_vis = 0;
        for (int i = 0; i < m; i++) {
            const int gi = g0 + gids[i];
            n_vis += kvp_coarse_hi(gi, G, end) - kvp_coarse_lo(gi, G, first);
        }
        if (n_vis >= k || m == ng)
            break;
        m += (k - n_vis + G - 1) / G; /* a partial group at an end fell short */
        m = m < ng ? m : ng;
    }
    for (int i = 0; i < m; i++)
        gids[i] += g0;
    *n_blocks = n_vis;
    return m;
}

void kvp_coarse_fetch_until(const int *gids, int m, int until, int G, int first, int end,
                            kvp_coarse_fetch_fn fetch, void *ctx, int *cursor)
{
    until = until < m ? until : m;
    for (; fetch && *cursor < until; ++*cursor) {
        const int gi = gids[*cursor];
        fetch(ctx, kvp_coarse_lo(gi, G, first), kvp_coarse_hi(gi, G, end));
    }
}

/* The approximate mode (max_groups > 0) without a heap per block: the groups of kvp_coarse_pick;
 * their blocks scored in runs of adjacent groups (so the bound kernel gets several tiles per
 * call); then one top-k over the scored blocks gathered in ascending block order, so its ties to
 * the lower index are ties to the lower block. The result is the top k of the blocks of the first
 * m groups of the best-first order, which is what the heap walk returns: the walk may stop before
 * m groups, but only when no later group can place a block in the top k. Per block the heap walk
 * cost a push or a sift with unpredictable branches, more than bounding the block. */
static int approx_topk(const float *gscore, const float *score_first, int G, int first, int end,
                       int k, int max_groups, kvp_coarse_score_fn fn, kvp_coarse_fetch_fn fetch,
                       void *ctx, int *gwork, int *bwork, float *val, int32_t *out,
                       struct kvp_coarse_stats *st)
{
    const int ng = (end - 1) / G + 1 - first / G;
    int *gids = gwork, n_vis = 0;
    const int m = kvp_coarse_pick(gscore, G, first, end, k, max_groups, gids, gwork + ng, &n_vis);
    int *idx = bwork, *top = bwork + n_vis, *tscr = top + k, n = 0, fetched = 0;
    for (int i = 0; i < m;) {
        int j = i + 1; /* a run of adjacent groups */
        while (j < m && gids[j] == gids[j - 1] + 1)
            j++;
        kvp_coarse_fetch_until(gids, m, j + KVP_COARSE_FETCH_AHEAD, G, first, end, fetch, ctx,
                               &fetched);
        const int gi = gids[i], gj = gids[j - 1];
        const int b0 = kvp_coarse_lo(gi, G, first), b1 = kvp_coarse_hi(gj, G, end);
        fn(ctx, b0, b1);
        for (int b = b0; b < b1; b++) {
            const float v = score_first[b - first];
            if (v != v)
                return -1;
            idx[n] = b;
            val[n++] = v;
        }
        i = j;
    }
    st->groups = m;
    st->blocks = n;
    const int kk = k < n ? k : n;
    kvp_topk_indices(val, n, kk, top, tscr);
    for (int i = 0; i < kk; i++)
        out[i] = idx[top[i]];
    return kk;
}

/* The heap holds block ids; their scores are score_first[b - first] (the caller's columns). */
#define SCORE_OF(b) score_first[(b)-first]

int kvp_coarse_topk(const float *gscore, const float *score_first, int G, int first, int end, int k,
                    int max_groups, kvp_coarse_score_fn fn, kvp_coarse_fetch_fn fetch, void *ctx,
                    int *gheap, int *bheap, float *val, int32_t *out,
                    struct kvp_coarse_stats *stats)
{
    struct kvp_coarse_stats st = {0, 0};
    if (k <= 0 || end <= first) {
        if (stats)
            *stats = st;
        return 0;
    }
    const int g0 = first / G, g1 = (end - 1) / G + 1;
    const struct b_scores bs = {score_first, first};
    int ng = 0;
    for (int gi = g0; gi < g1; gi++) {
        if (gscore[gi] != gscore[gi])
            return -1;
        gheap[ng++] = gi;
    }
    if (max_groups > 0) {
        const int n = approx_topk(gscore, score_first, G, first, end, k, max_groups, fn, fetch,
                                  ctx, gheap, bheap, val, out, &st);
        if (stats)
            *stats = st;
        return n;
    }
    g_heap_build(gscore, gheap, ng);
    int nb = 0;
    while (ng > 0) {
        const int gi = gheap[0];
        if (nb == k && gscore[gi] < SCORE_OF(bheap[0]))
            break; /* nothing left can enter the top k */
        g_heap_pop(gscore, gheap, &ng);
        const int b0 = kvp_coarse_lo(gi, G, first), b1 = kvp_coarse_hi(gi, G, end);
        fn(ctx, b0, b1);
        st.groups++;
        st.blocks += b1 - b0;
        for (int b = b0; b < b1; b++) {
            if (SCORE_OF(b) != SCORE_OF(b))
                return -1;
            if (nb < k)
                b_heap_push(bs, bheap, &nb, b);
            else if (b_weaker(bs, bheap[0], b)) {
                bheap[0] = b;
                b_heap_sift(bs, bheap, nb, 0);
            }
        }
    }
    sort_ids(bheap, nb, out);
    if (stats)
        *stats = st;
    return nb;
}
#undef SCORE_OF
