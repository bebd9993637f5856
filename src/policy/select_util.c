/* Helpers shared by the policy files: budgets, masks, top-k and GQA aggregation (policy.h). */
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "kv/kvcache.h"
#include "kernels/simd.h"
#include "policy/policy.h"

int kvp_budget_tokens(const struct kvp_policy_params *pp, int n_tokens)
{
    long b;
    if (pp->budget > 0)
        b = pp->budget;
    else if (pp->budget_ratio > 0)
        b = (long)((double)pp->budget_ratio * n_tokens); /* rounded down */
    else
        b = n_tokens;
    const long floor = (long)(pp->sink > 0 ? pp->sink : 0) + (pp->local > 0 ? pp->local : 0);
    b = b < floor ? floor : b;
    return b > INT_MAX ? INT_MAX : (int)b;
}

int kvp_policy_budget(const struct kvp_policy *p, int n_tokens)
{
    return kvp_budget_tokens(&p->p, n_tokens);
}

void kvp_sel_all(struct kvp_sel *sel, int n_tokens, int block_size)
{
    int nb = (n_tokens + block_size - 1) / block_size;
    for (int b = 0; b < nb; b++) {
        sel->blocks[b] = b;
        sel->mask[b] = ~0ULL;
    }
    sel->n = nb;
}

/* The bits of tokens [o, o + n) of a block (n <= 64 - o). */
static uint64_t token_bits(int o, int n)
{
    return (n == 64 ? ~0ULL : (1ULL << n) - 1) << o;
}

void kvp_mask_add_range(uint64_t *masks, int begin, int end, int block_size)
{
    if (begin < 0)
        begin = 0;
    while (begin < end) { /* one word per block, not one bit per token */
        const int o = begin % block_size;
        const int n = end - begin < block_size - o ? end - begin : block_size - o;
        masks[begin / block_size] |= token_bits(o, n);
        begin += n;
    }
}

void kvp_sel_from_masks(struct kvp_sel *sel, const uint64_t *masks, int n_blocks)
{
    /* without a branch on the mask: a sparse selection's blocks are scattered, and the branch
     * mispredicted on most of them (every write lands at n, kept or not, within n_blocks) */
    int n = 0;
    for (int b = 0; b < n_blocks; b++) {
        sel->blocks[n] = b;
        sel->mask[n] = masks[b];
        n += masks[b] != 0;
    }
    sel->n = n;
}

/* 16 floats of GCC's vector extension: the SIMD clones below compile it to one AVX-512 register,
 * two AVX2 ones or four SSE ones (GCC's -O2 cost model leaves the plain loops scalar). */
typedef float gqa_vec __attribute__((vector_size(64)));
typedef int32_t gqa_mask __attribute__((vector_size(64)));
#define GQA_W 16

/* Each element is the scalar loop's: the same additions in the same order, the same comparison
 * (a NaN row value keeps out), the same division. Static: clang links the clones of a static
 * function only (an exported one left its symbol undefined in the fuzzing build). */
KVP_X86_CLONES static void gqa_combine(const float *rows, int g, int stride, int n, int agg,
                                       float *out)
{
    memcpy(out, rows, (size_t)n * sizeof(float));
    const int nv = n / GQA_W * GQA_W;
    for (int j = 1; j < g; j++) {
        const float *r = rows + (size_t)j * stride;
        for (int i = 0; i < nv; i += GQA_W) {
            gqa_vec a, o;
            memcpy(&a, r + i, sizeof(a));
            memcpy(&o, out + i, sizeof(o));
            if (agg == KVP_AGG_MAX) {
                const gqa_mask gt = a > o;
                o = (gqa_vec)((gt & (gqa_mask)a) | (~gt & (gqa_mask)o));
            } else {
                o += a;
            }
            memcpy(out + i, &o, sizeof(o));
        }
        for (int i = nv; i < n; i++)
            out[i] = agg == KVP_AGG_MAX ? (r[i] > out[i] ? r[i] : out[i]) : out[i] + r[i];
    }
    if (agg == KVP_AGG_MEAN && g > 1) {
        const float fg = (float)g;
        for (int i = 0; i < nv; i += GQA_W) {
            gqa_vec o;
            memcpy(&o, out + i, sizeof(o));
            o /= fg;
            memcpy(out + i, &o, sizeof(o));
        }
        for (int i = nv; i < n; i++)
            out[i] /= fg;
    }
}

void kvp_gqa_combine(const float *rows, int g, int stride, int n, int agg, float *out)
{
    gqa_combine(rows, g, stride, n, agg, out);
}

/* ---- forced windows, block plans, token keep sets ------------------------------------------ */

int kvp_policy_recent(const struct kvp_policy *p)
{
    return p->p.local > 1 ? p->p.local : 1;
}

static uint64_t block_full_mask(int bs)
{
    return bs >= 64 ? ~0ULL : (1ULL << bs) - 1;
}

void kvp_block_plan(const struct kvp_policy *p, int n_tokens, struct kvp_block_plan *bp)
{
    const int bs = p->env.block_size;
    const int budget = kvp_policy_budget(p, n_tokens);
    int sink = p->p.sink < n_tokens ? p->p.sink : n_tokens;
    int from = n_tokens - kvp_policy_recent(p); /* exact local window start */
    if (from < 0)
        from = 0;
    /* the local window moves down to a block boundary when the budget can pay for it */
    int ls = from / bs * bs;
    int forced = sink + (n_tokens - ls) - (sink > ls ? sink - ls : 0);
    if (forced > budget) {
        ls = from;
        forced = sink + (n_tokens - ls) - (sink > ls ? sink - ls : 0);
    }
    bp->n_blocks = (n_tokens + bs - 1) / bs;
    bp->sink = sink;
    bp->local_start = ls;
    bp->forced = forced;
    bp->first = (sink + bs - 1) / bs;
    bp->end = ls / bs > bp->first ? ls / bs : bp->first;
    int k = budget > forced ? (budget - forced) / bs : 0;
    bp->k = k < bp->end - bp->first ? k : bp->end - bp->first;
    bp->left = budget - forced - bp->k * bs > 0 ? budget - forced - bp->k * bs : 0;
    bp->all = budget >= n_tokens;
}

/* The budget the whole blocks leave (left tokens: bs - 1 at most when k blocks are chosen) on
 * the tokens right below the local window that no chosen block holds, as a token-granular local
 * window would read them: from the top of the highest block not chosen, downwards. The walk is
 * the rule; where the selection is kept is the caller's: is_full(ctx, b) says block b is taken
 * whole already (chosen), take(ctx, lo, hi) adds tokens [lo, hi) (false: no room, the walk
 * stops and returns false). */
static bool fill_walk(const struct kvp_block_plan *bp, int left, int bs,
                      bool (*is_full)(void *ctx, int b), bool (*take)(void *ctx, int lo, int hi),
                      void *ctx)
{
    for (int b = (bp->local_start - 1) / bs; b >= 0 && left > 0 && bp->local_start > 0; b--) {
        if (is_full(ctx, b))
            continue;
        const int hi = bp->local_start < (b + 1) * bs ? bp->local_start : (b + 1) * bs;
        const int lo = bp->sink > b * bs ? bp->sink : b * bs;
        const int n = hi - lo < left ? hi - lo : left;
        if (n <= 0)
            continue;
        if (!take(ctx, hi - n, hi))
            return false;
        left -= n;
    }
    return true;
}

/* The fill over a mask per block of the context. */
struct fill_masks {
    uint64_t *masks;
    int bs;
};

static bool masks_full(void *ctx, int b)
{
    const struct fill_masks *f = ctx;
    return f->masks[b] == block_full_mask(f->bs);
}

static bool masks_take(void *ctx, int lo, int hi)
{
    const struct fill_masks *f = ctx;
    kvp_mask_add_range(f->masks, lo, hi, f->bs);
    return true;
}

static void fill_left(const struct kvp_block_plan *bp, int n_chosen, int bs, uint64_t *masks)
{
    struct fill_masks f = {masks, bs};
    fill_walk(bp, bp->left + (n_chosen < bp->k ? (bp->k - n_chosen) * bs : 0), bs, masks_full,
              masks_take, &f);
}

/* Blocks and masks of the forced ranges and the fill that kvp_sel_chosen's short path collects
 * besides the chosen blocks (a sink and a local window of up to 16 blocks each, the fill's few). */
#define SEL_EXTRA_MAX 48

struct sel_extra {
    int n;
    int32_t block[SEL_EXTRA_MAX];
    uint64_t mask[SEL_EXTRA_MAX];
};

/* Tokens [begin, end) into the list, one entry per block; false when it is full. */
static bool extra_add_range(struct sel_extra *x, int begin, int end, int bs)
{
    if (begin < 0)
        begin = 0;
    while (begin < end) {
        const int o = begin % bs, n = end - begin < bs - o ? end - begin : bs - o;
        if (x->n == SEL_EXTRA_MAX)
            return false;
        x->block[x->n] = begin / bs;
        x->mask[x->n++] = token_bits(o, n);
        begin += n;
    }
    return true;
}

/* The fill over the short path's list: chosen (ascending) walked down from its top as the fill
 * walks the blocks down, the forced entries looked up in the list. */
struct fill_short {
    struct sel_extra *x;
    const int32_t *chosen;
    int ci; /* the highest chosen block not above the block the walk is at */
    int bs;
};

static bool short_full(void *ctx, int b)
{
    struct fill_short *f = ctx;
    while (f->ci >= 0 && f->chosen[f->ci] > b)
        f->ci--;
    if (f->ci >= 0 && f->chosen[f->ci] == b)
        return true;
    uint64_t have = 0; /* what the forced ranges already hold of b */
    for (int i = 0; i < f->x->n; i++)
        have |= f->x->block[i] == b ? f->x->mask[i] : 0;
    return have == block_full_mask(f->bs);
}

static bool short_take(void *ctx, int lo, int hi)
{
    struct fill_short *f = ctx;
    return extra_add_range(f->x, lo, hi, f->bs);
}

/* kvp_sel_chosen without a pass over every block of the context: chosen ascending, all k of
 * the plan, and a fill under one block. The forced ranges and the fill are a few blocks, so the
 * selection is the chosen blocks merged with them; at 131072 tokens the mask pass cleared and
 * scanned 8192 words per (layer, KV head) and step to place a few hundred. False when the case
 * is not one of these (the caller takes the mask pass; the result is the same). */
static bool sel_chosen_short(const struct kvp_block_plan *bp, const int32_t *chosen, int n_chosen,
                             int n_tokens, int bs, struct kvp_sel *sel)
{
    if (n_chosen != bp->k || bp->left >= bs)
        return false;
    for (int i = 1; i < n_chosen; i++)
        if (chosen[i] <= chosen[i - 1])
            return false;
    struct sel_extra x = {.n = 0};
    if (!extra_add_range(&x, 0, bp->sink, bs) ||
        !extra_add_range(&x, bp->local_start, n_tokens, bs))
        return false;
    struct fill_short f = {&x, chosen, n_chosen - 1, bs};
    if (!fill_walk(bp, bp->left, bs, short_full, short_take, &f))
        return false;
    const uint64_t full = block_full_mask(bs);
    /* the few extra entries by block (insertion sort), one per block, then merged with chosen */
    for (int i = 1; i < x.n; i++)
        for (int j = i; j > 0 && x.block[j] < x.block[j - 1]; j--) {
            int32_t tb = x.block[j];
            uint64_t tm = x.mask[j];
            x.block[j] = x.block[j - 1];
            x.mask[j] = x.mask[j - 1];
            x.block[j - 1] = tb;
            x.mask[j - 1] = tm;
        }
    int n = 0, xi = 0, c = 0;
    while (xi < x.n || c < n_chosen) {
        const bool take_x = c == n_chosen || (xi < x.n && x.block[xi] <= chosen[c]);
        const int32_t b = take_x ? x.block[xi] : chosen[c];
        uint64_t m = 0;
        while (xi < x.n && x.block[xi] == b)
            m |= x.mask[xi++];
        if (c < n_chosen && chosen[c] == b) {
            m |= full;
            c++;
        }
        if (m) {
            sel->blocks[n] = b;
            sel->mask[n++] = m;
        }
    }
    sel->n = n;
    return true;
}

/* kvp_sel_chosen through a mask per block of the context, left in masks (the block oracle of
 * the measurements reads them). */
static void sel_chosen_masks(const struct kvp_block_plan *bp, const int32_t *chosen, int n_chosen,
                             int n_tokens, int bs, struct kvp_sel *sel, uint64_t *masks)
{
    memset(masks, 0, (size_t)bp->n_blocks * sizeof(uint64_t));
    kvp_mask_add_range(masks, 0, bp->sink, bs);
    kvp_mask_add_range(masks, bp->local_start, n_tokens, bs);
    for (int i = 0; i < n_chosen; i++)
        masks[chosen[i]] = block_full_mask(bs);
    fill_left(bp, n_chosen, bs, masks);
    kvp_sel_from_masks(sel, masks, bp->n_blocks);
}

void kvp_sel_chosen(const struct kvp_block_plan *bp, const int32_t *chosen, int n_chosen,
                    int n_tokens, int bs, struct kvp_sel *sel, uint64_t *masks)
{
    if (!sel_chosen_short(bp, chosen, n_chosen, n_tokens, bs, sel))
        sel_chosen_masks(bp, chosen, n_chosen, n_tokens, bs, sel, masks);
}

void kvp_sel_best(const struct kvp_block_plan *bp, const float *score, int n_tokens, int bs,
                  struct kvp_sel *sel, uint64_t *masks, float *bscore, int *iscratch)
{
    const int n_cand = bp->end - bp->first, k = bp->k;
    const int left = bp->left; /* < bs while k < n_cand: the fill stays in one block */
    int32_t *chosen = (int32_t *)iscratch;
    int *out = iscratch + n_cand, *heap = iscratch + 2 * n_cand;
    if (bp->all) {
        kvp_sel_all(sel, n_tokens, bs);
        return;
    }
    for (int b = bp->first; b < bp->end; b++) {
        double sum = 0.0;
        for (int t = b * bs; t < (b + 1) * bs; t++)
            sum += score[t];
        bscore[b] = (float)sum;
    }
    int best_j = 0;
    if (k < n_cand && left > 0 && k > 0) {
        /* j = how many blocks right below the window are chosen; the fill then lands on the top
         * `left` tokens of block u = end - 1 - j, and the other k - j blocks are the best below
         * u. Every selection has one such j, so the best over j is the best selection. */
        double best = -1.0, run = 0.0;
        for (int j = 0; j <= k; j++) {
            const int u = bp->end - 1 - j;
            double v = run;
            for (int t = (u + 1) * bs - left; t < (u + 1) * bs; t++)
                v += score[t];
            const int m = u - bp->first, kk = k - j;
            if (kk > m)
                break; /* not enough blocks below u: no larger j fits either */
            if (kk > 0) {
                kvp_topk_indices(bscore + bp->first, m, kk, out, heap);
                for (int i = 0; i < kk; i++)
                    v += bscore[bp->first + out[i]];
            }
            if (v > best) {
                best = v;
                best_j = j;
            }
            run += bscore[u];
        }
    }
    /* the chosen blocks: the j right below the window and the best k - j below the fill's block
     * (without a fill, the best k of all: u = end) */
    const int u = left > 0 ? bp->end - 1 - best_j : bp->end, kk = k - best_j;
    int n = 0;
    for (int b = u + 1; b < bp->end; b++)
        chosen[n++] = b;
    if (kk >= u - bp->first) {
        for (int b = bp->first; b < u && n < k; b++)
            chosen[n++] = b;
    } else if (kk > 0) {
        kvp_topk_indices(bscore + bp->first, u - bp->first, kk, out, heap);
        for (int i = 0; i < kk; i++)
            chosen[n++] = bp->first + out[i];
    }
    sel_chosen_masks(bp, chosen, n, n_tokens, bs, sel, masks);
}

int kvp_sel_blocks_keep(const struct kvp_block_plan *bp, const float *score, int n_tokens, int bs,
                        struct kvp_sel *sel, uint64_t *masks, int *iscratch, int extra,
                        int32_t *keep, float *fscratch)
{
    if (bp->all) {
        kvp_sel_all(sel, n_tokens, bs);
        return -1;
    }
    const int n_cand = bp->end - bp->first;
    int *out = iscratch, *heap = iscratch + n_cand;
    int32_t *chosen = (int32_t *)heap; /* after the last top-k: block ids */
    if (bp->k >= n_cand) {
        for (int i = 0; i < n_cand; i++)
            chosen[i] = bp->first + i;
        kvp_sel_chosen(bp, chosen, n_cand, n_tokens, bs, sel, masks);
        return -1;
    }
    const int wide = bp->k + (extra > 0 ? extra : 0);
    if (!keep || extra <= 0 || wide >= n_cand || bp->k == 0) {
        kvp_topk_indices(score + bp->first, n_cand, bp->k, out, heap);
        for (int i = 0; i < bp->k; i++)
            chosen[i] = bp->first + out[i];
        kvp_sel_chosen(bp, chosen, bp->k, n_tokens, bs, sel, masks);
        return -1;
    }
    /* the wide top first, then the top k among it: the same k blocks (the order is strict and
     * keep is in block order, so ties still go to the lower block) */
    kvp_topk_indices(score + bp->first, n_cand, wide, out, heap);
    for (int i = 0; i < wide; i++) {
        keep[i] = bp->first + out[i];
        fscratch[i] = score[keep[i]];
    }
    kvp_topk_indices(fscratch, wide, bp->k, out, heap);
    for (int i = 0; i < bp->k; i++)
        chosen[i] = keep[out[i]];
    kvp_sel_chosen(bp, chosen, bp->k, n_tokens, bs, sel, masks);
    return wide;
}

void kvp_sel_blocks(const struct kvp_block_plan *bp, const float *score, int n_tokens, int bs,
                    struct kvp_sel *sel, uint64_t *masks, int *iscratch)
{
    kvp_sel_blocks_keep(bp, score, n_tokens, bs, sel, masks, iscratch, 0, NULL, NULL);
}

/* Is token t of (layer, kvh) still in the cache? */
static bool alive(const struct kvp_kvcache *kv, int layer, int kvh, int t)
{
    if (!kv)
        return true;
    int bs = kv->block_size;
    return !((kvp_kvcache_evicted(kv, layer, kvh, t / bs) >> (t % bs)) & 1);
}

void kvp_keep_tokens(const float *score, int n_tokens, int sink, int recent, int budget,
                     const struct kvp_kvcache *kv, int layer, int kvh, int bs, uint64_t *keep,
                     float *fscratch, int *iscratch)
{
    int nb = (n_tokens + bs - 1) / bs;
    if (sink > n_tokens)
        sink = n_tokens;
    int rs = n_tokens - recent > sink ? n_tokens - recent : sink; /* recent window start */
    memset(keep, 0, (size_t)nb * sizeof(uint64_t));
    kvp_mask_add_range(keep, 0, sink, bs);
    kvp_mask_add_range(keep, rs, n_tokens, bs);
    int k = budget - sink - (n_tokens - rs);
    if (k <= 0)
        return;
    /* gather the live candidates [sink, rs) in position order, so ties go to the lower position
     * also where compaction (kvp_kvcache_compact) moved tokens below their positions */
    int *map = iscratch, *out = iscratch + n_tokens, *heap = iscratch + 2 * n_tokens;
    int *slot_of = out; /* [n_tokens] by position, until the top-k needs out */
    for (int q = 0; q < n_tokens; q++)
        slot_of[q] = -1;
    for (int t = sink; t < rs; t++)
        if (alive(kv, layer, kvh, t))
            slot_of[kv ? kvp_kvcache_pos(kv, layer, kvh, t) : t] = t;
    int n = 0;
    for (int q = 0; q < n_tokens; q++)
        if (slot_of[q] >= 0) {
            fscratch[n] = score[slot_of[q]];
            map[n++] = slot_of[q];
        }
    if (k >= n) {
        for (int i = 0; i < n; i++)
            keep[map[i] / bs] |= 1ULL << (map[i] % bs);
        return;
    }
    kvp_topk_indices(fscratch, n, k, out, heap);
    for (int i = 0; i < k; i++)
        keep[map[out[i]] / bs] |= 1ULL << (map[out[i]] % bs);
}

void kvp_evict_unkept(struct kvp_kvcache *kv, int layer, int kvh, const uint64_t *keep,
                      int n_tokens)
{
    int bs = kv->block_size;
    for (int t = 0; t < n_tokens; t++)
        if (!((keep[t / bs] >> (t % bs)) & 1) && alive(kv, layer, kvh, t))
            kvp_kvcache_evict(kv, layer, kvh, t, n_tokens);
}

void kvp_sel_resident(struct kvp_sel *sel, const struct kvp_kvcache *kv, int layer, int kvh,
                      int n_tokens, uint64_t *masks)
{
    int bs = kv->block_size, nb = (n_tokens + bs - 1) / bs;
    for (int b = 0; b < nb; b++) {
        int nt = n_tokens - b * bs < bs ? n_tokens - b * bs : bs;
        masks[b] = block_full_mask(nt) & ~kvp_kvcache_evicted(kv, layer, kvh, b);
    }
    kvp_sel_from_masks(sel, masks, nb);
}

/* ---- SnapKV window scores ------------------------------------------------------------------ */

void kvp_snap_scores(const struct kvp_prefill_obs *obs, int first_head, int g, int agg, int pool,
                     bool pool_max, float *out, float *tmp)
{
    const int n = obs->n_prompt, w = obs->n_obs, np = n - w;
    if (np <= 0)
        return;
    /* per query head: column sums of the window rows over the past positions, then combined */
    for (int j = 0; j < g; j++) {
        float *s = tmp + (size_t)j * np;
        memset(s, 0, (size_t)np * sizeof(float));
        for (int i = 0; i < w; i++) {
            const float *row = obs->obs + ((size_t)(first_head + j) * w + i) * n;
            for (int t = 0; t < np; t++)
                s[t] += row[t];
        }
    }
    float *s = tmp + (size_t)g * np;
    kvp_gqa_combine(tmp, g, np, np, agg, s);
    if (pool <= 1) {
        memcpy(out, s, (size_t)np * sizeof(float));
        return;
    }
    /* centred window [t - pool/2, t - pool/2 + pool); outside positions are padding: they add 0
     * to the average, which always divides by pool (PyTorch count_include_pad), and are ignored
     * by the max (PyTorch pads max pooling with -inf) */
    const int half = pool / 2;
    for (int t = 0; t < np; t++) {
        int a = t - half < 0 ? 0 : t - half;
        int b = t - half + pool > np ? np : t - half + pool;
        float acc = pool_max ? s[a] : 0.0f;
        for (int u = a; u < b; u++)
            acc = pool_max ? (s[u] > acc ? s[u] : acc) : acc + s[u];
        out[t] = pool_max ? acc : acc / (float)pool;
    }
}

/* ---- per-KV-head scratch ------------------------------------------------------------------- */

int kvp_scratch_init(struct kvp_scratch *s, const struct kvp_policy_env *env, size_t extra_floats)
{
    int bs = env->block_size;
    s->max_blocks = (env->n_ctx + bs - 1) / bs;
    s->cap = s->max_blocks * bs;
    s->nf = 2 * (size_t)s->cap + extra_floats;
    s->ni = 3 * (size_t)s->cap;
    size_t nkv = (size_t)env->n_head_kv;
    s->f = calloc(nkv * s->nf, sizeof(float));
    s->i = calloc(nkv * s->ni, sizeof(int));
    s->masks = calloc(nkv * (size_t)s->max_blocks, sizeof(uint64_t));
    if (!s->f || !s->i || !s->masks) {
        kvp_scratch_free(s);
        return -1;
    }
    return 0;
}

void kvp_scratch_free(struct kvp_scratch *s)
{
    if (!s)
        return;
    free(s->f);
    free(s->i);
    free(s->masks);
    s->f = NULL;
    s->i = NULL;
    s->masks = NULL;
}
