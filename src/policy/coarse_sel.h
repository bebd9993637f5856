/*
 * Coarse-to-fine block ranking (coarse_sel.c): the k best candidate blocks by a score that a
 * per-group upper bound caps, without scoring every block. Groups are visited best bound first;
 * each visit scores the group's candidate blocks (through the caller's function, which writes
 * score[b]) into a k-heap; the pass stops when the next group's bound is below the k-th best score
 * so far (branch and bound): every block not scored then has a score <= that bound < the k-th, so
 * the k chosen are the flat top-k's, under its order (larger score, ties to the lower block).
 * A group whose bound equals the k-th best is visited (one of its blocks could tie and be lower).
 * The approximate mode also stops after max_groups visits, once k blocks are held.
 */
#ifndef KVP_POLICY_COARSE_SEL_H
#define KVP_POLICY_COARSE_SEL_H

#include <stdbool.h>
#include <stdint.h>

/* Fill the scores of the blocks b in [b0, b1) (score_first[b - first], the caller's array the
 * ranking reads). */
typedef void (*kvp_coarse_score_fn)(void *ctx, int b0, int b1);
/* Ask for what scoring blocks [b0, b1) will read (the approximate mode calls it a few groups
 * ahead of their scoring: the groups it visits are scattered, and their metadata is not in the
 * caches at long context). */
typedef void (*kvp_coarse_fetch_fn)(void *ctx, int b0, int b1);

struct kvp_coarse_stats {
    int groups; /* groups visited */
    int blocks; /* blocks scored */
};

/* The k best blocks of [first, end) (k <= end - first) by score_first[b - first], groups of G
 * blocks (group i: blocks [i·G, (i + 1)·G)) bounded by gscore[i] (valid for the groups meeting
 * [first, end)), visiting at most max_groups groups beyond what holding k blocks needs (max_groups
 * <= 0: no limit, the exact mode). Writes the chosen block ids in ascending order to out[k]. gheap:
 * 2 x (groups meeting [first, end)) ints; bheap: k ints, or in the approximate mode
 * KVP_COARSE_APPROX_INTS(end - first) ints and val end - first floats (the exact mode reads no
 * val: NULL is fine). The approximate mode calls fn once per run of adjacent groups it visits,
 * and fetch (when not NULL) for each group KVP_COARSE_FETCH_AHEAD groups before its run.
 * Returns k, or -1 when a bound or a score is NaN (the order is then not one the bound can cut:
 * the caller ranks flat). */
#define KVP_COARSE_APPROX_INTS(n_cand) (3 * (n_cand))
int kvp_coarse_topk(const float *gscore, const float *score_first, int G, int first, int end, int k,
                    int max_groups, kvp_coarse_score_fn fn, kvp_coarse_fetch_fn fetch, void *ctx,
                    int *gheap, int *bheap, float *val, int32_t *out,
                    struct kvp_coarse_stats *stats);

/* Groups fetched ahead of the one being scored (kvp_coarse_fetch_fn): at head_dim 64 a group of
 * 16 blocks is one 2112-byte tile of the 8-bit metadata (quest_meta8.h; the callers fetch only
 * those: with the 4 KB f16 tiles fetching gained nothing), so two are ~66 lines in flight while
 * one group's bounds take about a memory round trip. */
#define KVP_COARSE_FETCH_AHEAD 2

/* Fetch groups gids[*cursor ..] up to (not including) index `until` of the m ids (ascending),
 * each clipped to [first, end), and move *cursor on: the approximate visits' prefetch. */
void kvp_coarse_fetch_until(const int *gids, int m, int until, int G, int first, int end,
                            kvp_coarse_fetch_fn fetch, void *ctx, int *cursor);

/* The approximate mode's groups: the m best of the groups meeting [first, end) by gscore[i]
 * (indexed by group id; one vector top-k, ties to the lower group), m = max_groups or, when those
 * hold fewer than k candidate blocks, as many more as the shortfall needs (at most all of them).
 * Their ids, ascending, into gids; work: as many ints as groups meet [first, end). Returns m and
 * in *n_blocks the candidate blocks they hold (>= k unless every group is taken). */
int kvp_coarse_pick(const float *gscore, int G, int first, int end, int k, int max_groups,
                    int *gids, int *work, int *n_blocks);

/* The approximate mode's max_groups for a top of k in groups of G blocks: ceil(visit · ceil(k /
 * G)) groups, and at least the ceil(floor / G) that bound floor blocks. Up to floor candidates
 * that is every group, and the callers rank flat (the same blocks: the approximate pass visiting
 * every group is the flat pass, tested; and no cost saved by the groups' bounds). */
static inline int kvp_coarse_limit(float visit, int floor, int G, int k)
{
    const int v = (int)(visit * (float)((k + G - 1) / G) + 0.999f);
    const int f = (int)(((long long)floor + G - 1) / G);
    return v > f ? v : f;
}

/* The `floor` option's default, in blocks (16384 tokens at bs = 16): at the contexts a model is
 * trained on the flat pass costs little next to the step, and group bounds lose needles there
 * (docs/policies.md). */
#define KVP_COARSE_FLOOR_DEFAULT 1024

/* The first block of group gi (blocks [gi·G, (gi + 1)·G)) within [first, ..), and the end of
 * group gi within [.., end): a group's (or a run of groups') blocks clipped to the candidates. */
static inline int kvp_coarse_lo(int gi, int G, int first)
{
    return gi * G > first ? gi * G : first;
}
static inline int kvp_coarse_hi(int gi, int G, int end)
{
    return (gi + 1) * G < end ? (gi + 1) * G : end;
}

/* Whether n_cand candidates rank through the groups: always in the exact mode (visit <= 0);
 * in the approximate one only past `floor` candidates, below which it would visit every group
 * and the callers rank flat. */
static inline bool kvp_coarse_pays(float visit, int floor, int n_cand)
{
    return visit <= 0.0f || n_cand > floor;
}

/* Groups [g0, g1) in the order of their bound gscore[i] (indexed by group id), best first, ties
 * to the lower group: kvp_coarse_order_init builds the heap (g1 - g0 ints) and returns its size;
 * each kvp_coarse_order_pop returns the next group and shrinks it (*n > 0). */
int kvp_coarse_order_init(const float *gscore, int g0, int g1, int *heap);
int kvp_coarse_order_pop(const float *gscore, int *heap, int *n);

#endif
