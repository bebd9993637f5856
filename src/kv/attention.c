/* Attention kernels over the block-paged KV cache (see attention.h). */
#include "kv/attention.h"

#include <math.h>
#include <string.h>

#include "kernels/simd.h"

/* Scores of the g heads of a group against key block kt (scores[j*ss + t]): the per-head kernel
 * for a single head, else the group kernel over chunks of KVP_KV_GROUP_MAX heads, which loads and
 * widens each key row once per chunk instead of once per head. */
static void group_scores(const struct kvp_kv_kernels *kk, const float *q, int g, const void *kt,
                         int hd, int bs, float scale, float *s, size_t ss)
{
    if (g == 1) {
        kk->scores(q, kt, hd, bs, scale, s);
        return;
    }
    for (int j = 0; j < g; j += KVP_KV_GROUP_MAX)
        kk->scores_g(q + (size_t)j * hd, g - j < KVP_KV_GROUP_MAX ? g - j : KVP_KV_GROUP_MAX, kt,
                     hd, bs, scale, s + (size_t)j * ss, ss);
}

/* The value sums of the g heads from value block vb (out[j*os + d] += Σ_t p[j*ps + t]·v[t][d]),
 * chunked like group_scores. */
static void group_accum(const struct kvp_kv_kernels *vk, const float *p, size_t ps, int g,
                        const void *vb, int hd, int bs, int n, float *out, size_t os)
{
    if (g == 1) {
        vk->accum(p, vb, hd, bs, n, out);
        return;
    }
    for (int j = 0; j < g; j += KVP_KV_GROUP_MAX)
        vk->accum_g(p + (size_t)j * ps, ps, g - j < KVP_KV_GROUP_MAX ? g - j : KVP_KV_GROUP_MAX, vb,
                    hd, bs, n, out + (size_t)j * os, os);
}

/* Ask for the keys and values of a selected block ahead of the one being reduced: selected
 * blocks are scattered (in a tiered store's hot tier, one 4 KiB unit each), so the hardware
 * prefetchers, which stay within a page and follow strides, cannot run ahead across them, and a
 * block reduced straight from DRAM spends most of its time waiting. PF_AHEAD blocks ahead and
 * whole (up to PF_MAX bytes of each): one block's reduction (~0.3-0.5 us for 16 f16 tokens of 3
 * query heads) is shorter than a DRAM round trip with the lines of a whole block in flight.
 * Into the L2 only (PF_LOCALITY 1: prefetcht2 on x86): a prefetch into the L1 holds one of its
 * few fill buffers until the line arrives, so the reads in flight were capped there and the
 * prefetch instructions themselves stalled (a profile of 8 sequences' dense attention at 512
 * tokens put a third of its samples on them); the L2 takes more at once and is one short hop
 * from the L1 when the kernel reads the line. On the Intel Xeon VM, alternating against the L1
 * hint 2 blocks ahead: dense decode at 16384 tokens 31.5 -> 34.2 tok/s, batched-bench Q4_K
 * -npl 8 -npp 512 745 -> 800 (8 ahead; 2 and 4 ahead in between); quest's sparse decode at
 * 131072 tokens unchanged.
 * Forced inline: as plain static functions GCC 12 compiled them to nothing (its modref pass saw
 * no side effect in a function that only prefetches and dropped the calls), and the sparse
 * attention ran 15-20% slower at 131072 tokens (tests/prefetch_emitted.sh keeps watch). */
#define PF_AHEAD    8
#define PF_LOCALITY 1
#define PF_MAX   4096
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *p, size_t n)
{
    if (!p)
        return;
    size_t bytes = n < PF_MAX ? n : PF_MAX;
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch((const char *)p + o, 0, PF_LOCALITY);
}

/* Both the keys and the values of block b (prefetch_block). */
static inline __attribute__((always_inline)) void prefetch_kv(const struct kvp_kvcache *kv, int l,
                                                              int kvh, int b)
{
    prefetch_block(kvp_kvcache_kblock(kv, l, kvh, b), kv->k_bytes);
    prefetch_block(kvp_kvcache_vblock(kv, l, kvh, b), kv->v_bytes);
}

/* Scores of blocks [b0, b1) for the g heads into probs (their columns), keys prefetched
 * PF_AHEAD blocks ahead within the range; a block without storage (a tiered store's cold block
 * seen from a policy) reads as absent. Blocks outer, so each key block is loaded once for the
 * whole group. */
static void range_scores(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                         int b0, int b1, float scale, float *probs, int probs_stride)
{
    const int hd = kv->head_dim, bs = kv->block_size;
    for (int b = b0; b < b0 + PF_AHEAD && b < b1; b++)
        prefetch_block(kvp_kvcache_kblock(kv, l, kvh, b), kv->k_bytes);
    for (int b = b0; b < b1; b++) {
        const uint8_t *kt = kvp_kvcache_kblock(kv, l, kvh, b);
        if (b + PF_AHEAD < b1) /* a layer's KV heads interleave: blocks are pages apart */
            prefetch_block(kvp_kvcache_kblock(kv, l, kvh, b + PF_AHEAD), kv->k_bytes);
        if (kt) {
            group_scores(kv->kk, q, g, kt, hd, bs, scale, probs + (size_t)b * bs,
                         (size_t)probs_stride);
            for (int j = 0; kv->score_cap > 0 && j < g; j++)
                kvp_attn_softcap(probs + (size_t)j * probs_stride + (size_t)b * bs, bs,
                                 kv->score_cap);
            continue;
        }
        for (int j = 0; j < g; j++)
            for (int t = 0; t < bs; t++)
                probs[(size_t)j * probs_stride + (size_t)b * bs + t] = -INFINITY;
    }
}

/* out [g][hd] += the value blocks [b0, b1) weighted by probs (keys past n_keys not read),
 * prefetched as range_scores does. */
static void range_values(const struct kvp_kvcache *kv, int l, int kvh, const float *probs,
                         int probs_stride, int g, int b0, int b1, int n_keys, float *out)
{
    const int hd = kv->head_dim, bs = kv->block_size;
    for (int b = b0; b < b0 + PF_AHEAD && b < b1; b++)
        prefetch_block(kvp_kvcache_vblock(kv, l, kvh, b), kv->v_bytes);
    for (int b = b0; b < b1; b++) {
        const uint8_t *vb = kvp_kvcache_vblock(kv, l, kvh, b);
        if (b + PF_AHEAD < b1)
            prefetch_block(kvp_kvcache_vblock(kv, l, kvh, b + PF_AHEAD), kv->v_bytes);
        if (!vb)
            continue;
        int nt = n_keys - b * bs < bs ? n_keys - b * bs : bs;
        group_accum(kv->vk, probs + (size_t)b * bs, (size_t)probs_stride, g, vb, hd, bs, nt, out,
                    (size_t)hd);
    }
}

/* The keys [*k0, *k1) of chunk `chunk` of n_keys in blocks of bs. */
static void chunk_keys(int n_keys, int bs, int chunk, int *k0, int *k1)
{
    const int span = KVP_ATTN_CHUNK_BLOCKS * bs;
    *k0 = chunk * span;
    *k1 = *k0 + span < n_keys ? *k0 + span : n_keys;
}

void kvp_attn_dense_chunk(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                          int n_keys, int chunk, float *probs, int probs_stride, float *st)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = kv->head_dim, bs = kv->block_size;
    int k0, k1;
    chunk_keys(n_keys, bs, chunk, &k0, &k1);
    const int b0 = k0 / bs, b1 = (k1 + bs - 1) / bs, nk = k1 - k0;
    const float scale = 1.0f / sqrtf((float)hd);
    float *m = st, *sum = st + g, *o = st + 2 * g;

    range_scores(kv, l, kvh, q, g, b0, b1, scale, probs, probs_stride);
    /* the chunk's softmax state: unnormalised exp(score - m) in probs, their sum */
    for (int j = 0; j < g; j++) {
        float *p = probs + (size_t)j * probs_stride + k0;
        m[j] = kvp_simd_max(ops, p, nk);
        if (m[j] == -INFINITY) { /* every key of the chunk absent: it weighs nothing */
            memset(p, 0, (size_t)nk * sizeof(float));
            sum[j] = 0.0f;
            continue;
        }
        sum[j] = ops->exp_sum(p, nk, m[j]);
    }
    memset(o, 0, (size_t)g * hd * sizeof(float));
    range_values(kv, l, kvh, probs, probs_stride, g, b0, b1, n_keys, o);
}

/* Fold one block's state (max m, exp-sum ls, value sum o) into the running one (M, L, O). The
 * common case, a block below the running max, is one axpy of the table (a plain loop here stays
 * scalar at -O2: O and o may alias and hd is not known; the fold was 7 % of quest's decode
 * samples at 131072 tokens that way). A block above it rescales O first: the first block, and a
 * few more while the maxima of the selection order rise. */
static void merge_block(const struct kvp_simd_ops *ops, float *M, float *L, float *O, float m,
                        float ls, const float *o, int hd)
{
    if (ls == 0.0f)
        return;
    if (m > *M) {
        if (*M == -INFINITY) { /* the first block: nothing to rescale */
            memcpy(O, o, (size_t)hd * sizeof(float));
            *L = ls;
        } else {
            float c = expf(*M - m);
            for (int d = 0; d < hd; d++)
                O[d] = O[d] * c + o[d];
            *L = *L * c + ls;
        }
        *M = m;
        return;
    }
    float c = expf(m - *M);
    ops->axpy(c, o, O, hd);
    *L += c * ls;
}

/* run <- run folded with the next chunk's state cur (both kvp_attn_state_floats(g, hd)), head by
 * head as sparse attention folds its blocks (merge_block): a chunk with no key present changes
 * nothing. */
static void fold_state(float *run, const float *cur, int g, int hd)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    for (int j = 0; j < g; j++)
        merge_block(ops, &run[j], &run[g + j], run + 2 * g + (size_t)j * hd, cur[j], cur[g + j],
                    cur + 2 * g + (size_t)j * hd, hd);
}

/* The output of a folded state: each head's value sum over its sum. */
static void finish_state(const float *st, int g, int hd, float *out)
{
    for (int j = 0; j < g; j++) {
        const float inv = 1.0f / st[g + j];
        for (int d = 0; d < hd; d++)
            out[(size_t)j * hd + d] = st[2 * g + (size_t)j * hd + d] * inv;
    }
}

void kvp_attn_dense_merge(float *st, int n, int g, int hd, float *out)
{
    const size_t sf = kvp_attn_state_floats(g, hd);
    for (int i = 1; i < n; i++)
        fold_state(st, st + (size_t)i * sf, g, hd);
    finish_state(st, g, hd, out);
}

/* kvp_attn_dense_group with an output: its chunks one after another, each folded into the
 * first as kvp_attn_dense_merge folds them. With cmax ([g][cmax_stride], room for a maximum per
 * chunk) the probabilities are left normalised too: each chunk's exp(score - its maximum)
 * scaled by exp(its maximum - the overall one) / the overall sum (up to one chunk: by 1 / sum,
 * as the single softmax did). */
static void dense_chunked(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                          int n_keys, float *probs, int probs_stride, float *out, float *cmax,
                          int cmax_stride)
{
    float run[KVP_ATTN_STATE_MAX], cur[KVP_ATTN_STATE_MAX];
    const int hd = kv->head_dim, bs = kv->block_size;
    const int nc = kvp_attn_dense_chunks(n_keys, bs);
    for (int i = 0; i < nc; i++) {
        float *st = i ? cur : run;
        kvp_attn_dense_chunk(kv, l, kvh, q, g, n_keys, i, probs, probs_stride, st);
        for (int j = 0; cmax && j < g; j++)
            cmax[(size_t)j * cmax_stride + i] = st[j];
        if (i)
            fold_state(run, cur, g, hd);
    }
    finish_state(run, g, hd, out);
    for (int j = 0; cmax && j < g; j++) {
        const float inv = 1.0f / run[g + j];
        for (int i = 0; i < nc; i++) {
            const float mc = cmax[(size_t)j * cmax_stride + i];
            const float f = mc == -INFINITY ? 0.0f : expf(mc - run[j]) * inv;
            int k0, k1;
            chunk_keys(n_keys, bs, i, &k0, &k1);
            float *p = probs + (size_t)j * probs_stride;
            for (int t = k0; t < k1; t++)
                p[t] *= f;
        }
    }
}

/* kvp_attn_dense_group; norm_probs: also leave the probabilities normalised when out is given. */
static void dense_group(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                        int n_keys, float *probs, int probs_stride, float *out, bool norm_probs)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = kv->head_dim, bs = kv->block_size;
    const int n_blocks = (n_keys + bs - 1) / bs;
    const float scale = 1.0f / sqrtf((float)hd);

    range_scores(kv, l, kvh, q, g, 0, n_blocks, scale, probs, probs_stride);
    /* softmax; when an output is wanted the probabilities stay unnormalised and the output is
     * scaled once instead (one pass over n_keys fewer: this loop is the long-context hot spot) */
    float inv[64];
    for (int j = 0; j < g; j++) {
        float *p = probs + (size_t)j * probs_stride;
        float mx = kvp_simd_max(ops, p, n_keys);
        inv[j] = 1.0f / ops->exp_sum(p, n_keys, mx);
        if (!out)
            for (int t = 0; t < n_keys; t++)
                p[t] *= inv[j];
    }
    if (!out)
        return;
    memset(out, 0, (size_t)g * hd * sizeof(float));
    range_values(kv, l, kvh, probs, probs_stride, g, 0, n_blocks, n_keys, out);
    for (int j = 0; j < g; j++)
        for (int d = 0; d < hd; d++)
            out[(size_t)j * hd + d] *= inv[j];
    for (int j = 0; norm_probs && j < g; j++)
        for (int t = 0; t < n_keys; t++)
            probs[(size_t)j * probs_stride + t] *= inv[j];
}

void kvp_attn_dense_group(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                          int n_keys, float *probs, int probs_stride, float *out)
{
    if (out && kvp_attn_chunked(g, kv->head_dim))
        dense_chunked(kv, l, kvh, q, g, n_keys, probs, probs_stride, out, NULL, 0);
    else
        dense_group(kv, l, kvh, q, g, n_keys, probs, probs_stride, out, false);
}

void kvp_attn_window_group(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                           int k0, int k1, float scale, float *probs, int probs_stride, float *out)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = kv->head_dim, bs = kv->block_size;
    const int b0 = k0 / bs, b1 = (k1 + bs - 1) / bs, lead = k0 - b0 * bs, n = k1 - k0;
    /* scores of the whole blocks, column (b - b0)·bs + t: the window's keys from column lead */
    for (int b = b0; b < b0 + PF_AHEAD && b < b1; b++)
        prefetch_kv(kv, l, kvh, b);
    for (int b = b0; b < b1; b++) {
        const uint8_t *kt = kvp_kvcache_kblock(kv, l, kvh, b);
        if (b + PF_AHEAD < b1) /* the ring's blocks are scattered over the pool */
            prefetch_kv(kv, l, kvh, b + PF_AHEAD);
        float *s = probs + (size_t)(b - b0) * bs;
        if (kt) {
            group_scores(kv->kk, q, g, kt, hd, bs, scale, s, (size_t)probs_stride);
            for (int j = 0; kv->score_cap > 0 && j < g; j++) /* absent keys stay -inf */
                kvp_attn_softcap(s + (size_t)j * probs_stride, bs, kv->score_cap);
            continue;
        }
        for (int j = 0; j < g; j++)
            for (int t = 0; t < bs; t++)
                s[(size_t)j * probs_stride + t] = -INFINITY;
    }
    float inv[64]; /* g <= 64: the callers' query heads per KV head */
    for (int j = 0; j < g; j++) {
        float *p = probs + (size_t)j * probs_stride, *w = p + lead;
        const float mx = kvp_simd_max(ops, w, n);
        /* the first block's keys below k0 are outside the window: weight 0 in the value sums */
        memset(p, 0, (size_t)lead * sizeof(float));
        if (mx == -INFINITY) { /* nothing readable: output 0 */
            memset(w, 0, (size_t)n * sizeof(float));
            inv[j] = 0.0f;
            continue;
        }
        inv[j] = 1.0f / ops->exp_sum(w, n, mx);
    }
    memset(out, 0, (size_t)g * hd * sizeof(float));
    for (int b = b0; b < b1; b++) {
        const uint8_t *vb = kvp_kvcache_vblock(kv, l, kvh, b);
        if (!vb)
            continue;
        const int nt = k1 - b * bs < bs ? k1 - b * bs : bs;
        group_accum(kv->vk, probs + (size_t)(b - b0) * bs, (size_t)probs_stride, g, vb, hd, bs,
                    nt, out, (size_t)hd);
    }
    for (int j = 0; j < g; j++)
        for (int d = 0; d < hd; d++)
            out[(size_t)j * hd + d] *= inv[j];
}

/* Whether selected block i of sel may be read for keys [0, n_keys), and which of its tokens
 * (bit t), after eviction and the end of the cache; 0 when nothing in it is readable. */
static uint64_t readable_tokens(const struct kvp_kvcache *kv, int l, int kvh, int n_keys,
                                const struct kvp_sel *sel, int i)
{
    const int bs = kv->block_size, last = (n_keys - 1) / bs, b = sel->blocks[i];
    if (b > last)
        return 0;
    uint64_t m = sel->mask[i] & ~kvp_kvcache_evicted(kv, l, kvh, b);
    if (b == last && n_keys % bs)
        m &= (1ULL << (n_keys % bs)) - 1;
    return m;
}

/* Reduce selected block i on its own, for the g query heads: the scores go to probs[j][i*bs..]
 * and are replaced by e_t = exp(s_t - bmax_j), bmax[j * ab->bmax_stride + i] = bmax_j (-inf when
 * nothing is readable, and then e = 0), o[j][hd] = Σ_t e_t·v_t, and l[j] = Σ_t e_t. */
static void reduce_block(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                         int n_keys, const struct kvp_sel *sel, int i, float *probs,
                         int probs_stride, struct kvp_attn_blocks *ab, float *o, int o_stride,
                         float *lsum)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = kv->head_dim, bs = kv->block_size, b = sel->blocks[i];
    const float scale = 1.0f / sqrtf((float)hd);
    const uint8_t *kt = kvp_kvcache_kblock(kv, l, kvh, b);
    const uint8_t *vb = kvp_kvcache_vblock(kv, l, kvh, b);
    uint64_t m = kt && vb ? readable_tokens(kv, l, kvh, n_keys, sel, i) : 0;
    int nt = b == (n_keys - 1) / bs ? n_keys - b * bs : bs;
    float *s0 = probs + (size_t)i * bs;
    if (m)
        group_scores(kv->kk, q, g, kt, hd, bs, scale, s0, (size_t)probs_stride);
    for (int j = 0; m && kv->score_cap > 0 && j < g; j++)
        kvp_attn_softcap(s0 + (size_t)j * probs_stride, bs, kv->score_cap);
    for (int j = 0; j < g; j++) {
        float *s = s0 + (size_t)j * probs_stride;
        float *bm = &ab->bmax[(size_t)j * ab->bmax_stride + i];
        memset(o + (size_t)j * o_stride, 0, (size_t)hd * sizeof(float));
        if (!m) {
            memset(s, 0, (size_t)bs * sizeof(float));
            *bm = -INFINITY;
            lsum[j] = 0.0f;
            continue;
        }
        float mx = -INFINITY;
        for (int t = 0; t < bs; t++) {
            if (!((m >> t) & 1))
                s[t] = -INFINITY;
            else if (s[t] > mx)
                mx = s[t];
        }
        *bm = mx;
        lsum[j] = ops->exp_sum(s, bs, mx);
    }
    if (m)
        group_accum(kv->vk, s0, (size_t)probs_stride, g, vb, hd, bs, nt, o, (size_t)o_stride);
}

/* Whether sel reads every token of [0, n_keys): blocks 0.. in order, each with every token up to
 * n_keys readable (none evicted, none released). Such a selection is dense attention, and is
 * computed by the dense kernel: the per-block reduction sums the same terms in another order
 * (exp(s - block max) * exp(block max - max) against exp(s - max), the value sums per block),
 * a few f32 ulps apart, and behind an f16 or q8_0 cache those ulps can decide how the next
 * token's key and value round, one f16 ulp that later steps amplify (2e-4 on the logits of a
 * 4-layer test model under the AVX2 table). With one road, the full policy, and any policy whose
 * selection covers the cache, has the bits of no policy at all. */
static bool sel_is_everything(const struct kvp_kvcache *kv, int l, int kvh, int n_keys,
                              const struct kvp_sel *sel)
{
    const int bs = kv->block_size, nb = (n_keys + bs - 1) / bs;
    if (sel->n != nb)
        return false;
    const uint64_t whole = bs == 64 ? ~0ULL : (1ULL << bs) - 1;
    for (int i = 0; i < nb; i++) {
        uint64_t want = i == nb - 1 && n_keys % bs ? (1ULL << (n_keys % bs)) - 1 : whole;
        if (sel->blocks[i] != i || !kvp_kvcache_kblock(kv, l, kvh, i) ||
            !kvp_kvcache_vblock(kv, l, kvh, i) ||
            (readable_tokens(kv, l, kvh, n_keys, sel, i) & whole) != want)
            return false;
    }
    return true;
}

void kvp_attn_sparse_early(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                           int n_keys, const struct kvp_sel *sel, const uint8_t *pending,
                           float *probs, int probs_stride, struct kvp_attn_blocks *ab)
{
    const int hd = kv->head_dim;
    ab->n = 0;
    if (sel_is_everything(kv, l, kvh, n_keys, sel))
        return; /* kvp_attn_sparse_group takes the dense road */
    for (int i = 0; i < sel->n && ab->n < ab->cap; i++) {
        if (pending[sel->blocks[i]])
            continue;
        for (int nx = i + 1, seen = 0; nx < sel->n; nx++)
            if (!pending[sel->blocks[nx]] && ++seen == PF_AHEAD) {
                prefetch_kv(kv, l, kvh, sel->blocks[nx]);
                break;
            }
        int k = ab->n++;
        ab->idx[k] = i;
        reduce_block(kv, l, kvh, q, g, n_keys, sel, i, probs, probs_stride, ab,
                     ab->o + (size_t)k * hd, ab->cap * hd, ab->lsum + (size_t)k * g);
    }
}

bool kvp_attn_sparse_parts_fit(const struct kvp_kvcache *kv, int l, int kvh, int n_keys,
                               const struct kvp_sel *sel, const struct kvp_attn_blocks *ab)
{
    return sel->n <= ab->pcap && !sel_is_everything(kv, l, kvh, n_keys, sel);
}

void kvp_attn_sparse_part(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                          int n_keys, const struct kvp_sel *sel, int i0, int i1, float *probs,
                          int probs_stride, struct kvp_attn_blocks *ab)
{
    const int hd = kv->head_dim;
    if (i1 > sel->n)
        i1 = sel->n;
    if (i0 >= i1 || !kvp_attn_sparse_parts_fit(kv, l, kvh, n_keys, sel, ab))
        return;
    /* the early pass's blocks (ascending indices) in [i0, i1) are skipped */
    int k = 0;
    while (k < ab->n && ab->idx[k] < i0)
        k++;
    for (int i = i0; i < i0 + PF_AHEAD && i < i1; i++)
        prefetch_kv(kv, l, kvh, sel->blocks[i]);
    for (int i = i0; i < i1; i++) {
        if (i + PF_AHEAD < i1)
            prefetch_kv(kv, l, kvh, sel->blocks[i + PF_AHEAD]);
        if (k < ab->n && ab->idx[k] == i) {
            k++;
            continue;
        }
        reduce_block(kv, l, kvh, q, g, n_keys, sel, i, probs, probs_stride, ab,
                     ab->po + (size_t)i * g * hd, hd, ab->pl + (size_t)i * g);
    }
}


/* bmax[j·stride + i] = the largest of probs[j][i·bs + t] (probabilities: 0 when all are 0), for
 * the dense road, whose probabilities are normalised as they are computed. */
static void block_max_of_probs(const float *probs, int probs_stride, int g, int n, int bs,
                               float *bmax, int stride)
{
    for (int j = 0; j < g; j++)
        for (int i = 0; i < n; i++) {
            const float *p = probs + (size_t)j * probs_stride + (size_t)i * bs;
            float m = 0.0f;
            for (int t = 0; t < bs; t++)
                m = p[t] > m ? p[t] : m;
            bmax[(size_t)j * stride + i] = m;
        }
}

void kvp_attn_sparse_group(const struct kvp_kvcache *kv, int l, int kvh, const float *q, int g,
                           int n_keys, const struct kvp_sel *sel, float *probs, int probs_stride,
                           struct kvp_attn_blocks *ab, float *out)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = kv->head_dim, bs = kv->block_size;
    if (sel_is_everything(kv, l, kvh, n_keys, sel)) {
        ab->n = 0;
        ab->parts = false;
        if (kvp_attn_chunked(g, hd) && ab->bmax_stride >= kvp_attn_dense_chunks(n_keys, bs))
            dense_chunked(kv, l, kvh, q, g, n_keys, probs, probs_stride, out, ab->bmax,
                          ab->bmax_stride);
        else
            dense_group(kv, l, kvh, q, g, n_keys, probs, probs_stride, out, true);
        for (int j = 0; j < g; j++) /* the tail of the last block was not read */
            memset(probs + (size_t)j * probs_stride + n_keys, 0,
                   (size_t)(sel->n * bs - n_keys) * sizeof(float));
        if (ab->block_max)
            block_max_of_probs(probs, probs_stride, g, sel->n, bs, ab->bmax, ab->bmax_stride);
        return;
    }
    float M[64], L[64];
    for (int j = 0; j < g; j++) {
        M[j] = -INFINITY;
        L[j] = 0.0f;
    }
    memset(out, 0, (size_t)g * hd * sizeof(float));
    if (!ab->parts) /* the first blocks reduced below */
        for (int i = 0; i < PF_AHEAD && i < sel->n; i++)
            prefetch_kv(kv, l, kvh, sel->blocks[i]);
    /* blocks in selection order: reduced now, or taken from the early pass or the parts */
    for (int i = 0, k = 0; i < sel->n; i++) {
        const float *o = ab->tmp, *ls = ab->tmp_l;
        int o_stride = hd;
        if (k < ab->n && ab->idx[k] == i) {
            o = ab->o + (size_t)k * hd;
            o_stride = ab->cap * hd;
            ls = ab->lsum + (size_t)k * g;
            k++;
        } else if (ab->parts) {
            o = ab->po + (size_t)i * g * hd;
            ls = ab->pl + (size_t)i * g;
        } else {
            if (i + PF_AHEAD < sel->n)
                prefetch_kv(kv, l, kvh, sel->blocks[i + PF_AHEAD]);
            reduce_block(kv, l, kvh, q, g, n_keys, sel, i, probs, probs_stride, ab, ab->tmp, hd,
                         ab->tmp_l);
        }
        for (int j = 0; j < g; j++)
            merge_block(ops, &M[j], &L[j], out + (size_t)j * hd,
                        ab->bmax[(size_t)j * ab->bmax_stride + i], ls[j], o + (size_t)j * o_stride,
                        hd);
    }
    ab->n = 0;
    ab->parts = false;
    /* normalise: out /= L, and e_t of block i becomes e_t * f_i, f_i = exp(bmax_i - M) / L
     * (when read: for quest at 131072 tokens that was a third of the fold, which one thread does
     * per pair). A block's largest e_t is exp(0) = 1 exactly in every table's exp, and the others
     * are below it, so f_i is the block's largest probability to the bit (block_max). */
    for (int j = 0; j < g; j++) {
        float *p = probs + (size_t)j * probs_stride;
        float *c = ab->bmax + (size_t)j * ab->bmax_stride;
        if (L[j] == 0.0f) { /* nothing readable: attention output stays 0 */
            if (!ab->skip_probs)
                memset(p, 0, (size_t)sel->n * bs * sizeof(float));
            if (ab->block_max)
                memset(c, 0, (size_t)sel->n * sizeof(float));
            continue;
        }
        float inv = 1.0f / L[j];
        for (int d = 0; d < hd; d++)
            out[(size_t)j * hd + d] *= inv;
        if (ab->skip_probs && !ab->block_max)
            continue;
        ops->exp_sum(c, sel->n, M[j]);
        for (int i = 0; i < sel->n; i++)
            c[i] *= inv;
        if (ab->skip_probs)
            continue;
        for (int i = 0; i < sel->n; i++) {
            const float f = c[i];
            for (int t = 0; t < bs; t++)
                p[(size_t)i * bs + t] *= f;
        }
    }
}
