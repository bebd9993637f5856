/* The KV step: one call per layer for the forward pass (see kv_step.h). */
#include "forward/kv_step.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "forward/context_internal.h"
#include "forward/local_attention.h"
#include "forward/prefill_attention.h"
#include "forward/sparse_prefill.h"
#include "kv/attention.h"
#include "store/store.h"
#include "kvpred_lab.h"

/* ---- lifetime ------------------------------------------------------------------------------ */

/* The cache of a model with sliding-window layers: each of them a ring of its window
 * (kvcache.h), in RAM also under a tiered store, which holds the global layers alone. */
static int kvp_kv_init_windowed(struct kvp_ctx *c, const struct kvp_ctx_params *p,
                                struct kvp_err *err)
{
    const struct kvp_hparams *hp = &c->hp;
    const bool tiered = p->kv_tier != KVP_TIER_NONE;
    for (int l = 0; tiered && l < hp->n_layer; l++)
        if (kvp_local_attn_wants(hp, l) && !kvp_layer_is_local(hp, l))
            /* such a layer attends outside the KV step, so nothing would make its blocks hot
             * (local_attention.h) */
            return kvp_err_set(err, KVP_EUNSUPPORTED,
                               "%s: a tiered KV cache needs global layers that scale their "
                               "scores by 1/sqrt(head_dim); this model scales them by %g",
                               c->model->arch, (double)hp->attn_scale);
    int *window = calloc((size_t)hp->n_layer, sizeof(int));
    if (!window)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    for (int l = 0; l < hp->n_layer; l++)
        window[l] = kvp_layer_is_local(hp, l) ? hp->n_swa : 0;
    int rc = kvp_kvcache_init_windowed(&c->kv, hp->n_layer, hp->n_head_kv, hp->head_dim,
                                       p->block_size, p->n_ctx, p->type_k, p->type_v, window,
                                       c->sh->n_batch, tiered, err);
    free(window);
    if (rc < 0 || !tiered)
        return rc;
    /* the store takes the layers without a ring (kv.ring tells it which) */
    rc = kvp_store_init(p, &c->kv, hp->n_layer, hp->n_head_kv, hp->head_dim, p->block_size,
                        c->kv.max_blocks, &c->store, err);
    c->hot_budget = p->hot_budget;
    return rc;
}

static int kv_init(struct kvp_ctx *c, const struct kvp_ctx_params *p, struct kvp_err *err)
{
    const struct kvp_hparams *hp = &c->hp;
    if (hp->n_swa > 0) /* sliding-window layers keep a ring of their window */
        return kvp_kv_init_windowed(c, p, err);
    if (p->kv_tier == KVP_TIER_NONE)
        return kvp_kvcache_init(&c->kv, hp->n_layer, hp->n_head_kv, hp->head_dim, p->block_size,
                                p->n_ctx, p->type_k, p->type_v, err);
    int rc = kvp_kvcache_init_external(&c->kv, hp->n_layer, hp->n_head_kv, hp->head_dim,
                                       p->block_size, p->n_ctx, p->type_k, p->type_v, err);
    if (rc < 0)
        return rc;
    rc = kvp_store_init(p, &c->kv, hp->n_layer, hp->n_head_kv, hp->head_dim, p->block_size,
                        c->kv.max_blocks, &c->store, err);
    c->hot_budget = p->hot_budget;
    return rc;
}

int kvp_kv_init(struct kvp_ctx *c, const struct kvp_ctx_params *p, struct kvp_err *err)
{
    int rc = kv_init(c, p, err);
    /* Gemma 2's global layers cap their scores in every kernel of the step (kvcache.h) */
    if (rc >= 0)
        c->kv.score_cap = c->hp.attn_softcap;
    return rc;
}

int kvp_ctx_kv_type_k(const kvp_ctx *c)
{
    return c->kv.type_k;
}

int kvp_ctx_kv_type_v(const kvp_ctx *c)
{
    return c->kv.type_v;
}

size_t kvp_kv_bytes_per_token(const kvp_model *m, int type_k, int type_v, int block_size)
{
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    int bs = block_size > 0 ? block_size : 16;
    size_t block = kvp_kv_block_bytes(kvp_kv_type_resolve(type_k), in.head_dim, bs) +
                   kvp_kv_block_bytes(kvp_kv_type_resolve(type_v), in.head_dim, bs);
    return (size_t)in.n_layer * in.n_head_kv * block / (size_t)bs;
}

void kvp_kv_free(struct kvp_ctx *c)
{
    kvp_kv_release(c);
    kvp_store_free(c->store);
    c->store = NULL;
    kvp_kvcache_free(&c->kv);
}

/* Under a store the cache's own part is the sliding-window layers' rings (kvcache.h), if any. */
void kvp_kv_clear(struct kvp_ctx *c)
{
    if (c->store)
        kvp_store_truncate(c->store, 0);
    kvp_kvcache_clear(&c->kv);
}

void kvp_kv_truncate(struct kvp_ctx *c, int n)
{
    if (c->store)
        kvp_store_truncate(c->store, n);
    kvp_kvcache_truncate(&c->kv, n);
}

int kvp_kv_reserve(struct kvp_ctx *c, int n, struct kvp_err *err)
{
    /* a tiered store holds the whole context from the start */
    return c->store ? 0 : kvp_kvcache_reserve(&c->kv, c->n_tokens + n, err);
}

/* ---- policy-dependent set-up ----------------------------------------------------------------- */

int kvp_kv_accepts(const struct kvp_ctx *c, const struct kvp_policy_ops *ops,
                   struct kvp_err *err)
{
    if (c->store && ops->evicting)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "policy '%s' evicts tokens; the tiered KV store needs a policy that "
                           "keeps the whole cache (it selects per step)",
                           ops->name);
    return 0;
}

bool kvp_kv_wants_predictions(const struct kvp_ctx *c)
{
    return c->store != NULL;
}

/* Hot slots per tiered layer: hot_budget tokens, or by default twice what one step's selection
 * needs. One step needs, per KV head, the budget's blocks plus two partial ones at the window
 * edges, times the KV heads whose union a unit carries, plus the newest block; a policy whose
 * predictions read ahead of its budget (prefetch_margin) gets room for that too in the modes
 * that predict, so a prefetch does not run out of slots. The factor 2 is reuse room: blocks
 * that drop out of a selection come back a few steps later (scores oscillate around the top-k
 * threshold), and with only one step's room LRU has already replaced them (docs/store.md:
 * at 32K the shipped model's hit rate goes from 87 % to 98 % and reads per token fall 6x). */
static int hot_blocks_for(const struct kvp_ctx *c)
{
    const int bs = c->kv.block_size;
    if (c->hot_budget > 0)
        return (c->hot_budget + bs - 1) / bs;
    if (!c->pol.p)
        return 0;
    const long b = kvp_policy_budget(c->pol.p, c->n_ctx);
    int mode = c->store ? kvp_store_mode(c->store) : KVP_PREFETCH_NONE;
    bool predicts = mode == KVP_PREFETCH_TOKEN || mode == KVP_PREFETCH_LAYER;
    long per_head = (b + bs - 1) / bs + 2 + (predicts ? c->pol.p->prefetch_margin : 0);
    long n = 2 * ((long)c->hp.n_head_kv * per_head + 1);
    return n > c->kv.max_blocks ? c->kv.max_blocks : (int)n;
}

/* Blocks one KV head's selection may hold for sparse attention's parts pass (kv/attention.h:
 * every selected block of a layer spread over the pool): the budget's blocks, two partial ones
 * at the window edges and the policy's prefetch margin, twice over for the policies whose
 * selections run past the budget (sinks, windows, extra candidates); a selection beyond it is
 * reduced by its group's own thread instead (same bits, slower). */
static int part_blocks_for(const struct kvp_ctx *c)
{
    const int bs = c->kv.block_size;
    if (!c->pol.p || kvp_pool_size(c->pool) < 2)
        return 0;
    const long b = kvp_policy_budget(c->pol.p, c->n_ctx);
    long n = 2 * ((b + bs - 1) / bs + 2 + c->pol.p->prefetch_margin) + 16;
    return n > c->kv.max_blocks ? c->kv.max_blocks : (int)n;
}

/* Sparse attention's per-block state (kv/attention.h) for each KV head. With a tiered store the
 * early pass keeps up to one tiered layer's hot slots of reduced blocks per KV head (no more
 * blocks of a selection can be hot at once); without one it keeps none. The parts pass keeps
 * part_blocks_for blocks by selection index. */
static int alloc_attn_blocks(struct kvp_ctx *c)
{
    const int n_kv = c->hp.n_head_kv, g = c->hp.n_head / n_kv, hd = c->hp.head_dim;
    const int mb = c->kv.max_blocks;
    int cap = c->store ? hot_blocks_for(c) + 1 : 0;
    if (cap > mb)
        cap = mb;
    const int pcap = part_blocks_for(c);
    size_t per = (size_t)g * mb + (size_t)g * hd + g + (size_t)g * cap * hd + (size_t)cap * g +
                 (size_t)pcap * g * hd + (size_t)pcap * g;
    c->ab = calloc((size_t)n_kv, sizeof(*c->ab));
    c->ab_floats = kvp_alloc_aligned((size_t)n_kv * per * sizeof(float));
    c->ab_idx = calloc((size_t)n_kv * (cap ? cap : 1), sizeof(int32_t));
    if (pcap > 0 && !c->store && !(c->claim = kvp_alloc_aligned((size_t)n_kv * sizeof(*c->claim))))
        return -1;
    for (int h = 0; c->claim && h < n_kv; h++) {
        atomic_init(&c->claim[h].ready, 0);
        atomic_init(&c->claim[h].next, 0);
    }
    if (!c->ab || !c->ab_floats || !c->ab_idx)
        return -1;
    for (int h = 0; h < n_kv; h++) {
        float *f = c->ab_floats + (size_t)h * per;
        struct kvp_attn_blocks *ab = &c->ab[h];
        ab->bmax = f;
        ab->bmax_stride = mb;
        ab->tmp = f += (size_t)g * mb;
        ab->tmp_l = f += (size_t)g * hd;
        ab->o = f += g;
        ab->lsum = f += (size_t)g * cap * hd;
        ab->po = f += (size_t)cap * g;
        ab->pl = f + (size_t)pcap * g * hd;
        ab->idx = c->ab_idx + (size_t)h * cap;
        ab->cap = cap;
        ab->pcap = pcap;
    }
    return 0;
}

void kvp_kv_release(struct kvp_ctx *c)
{
    kvp_free_aligned(c->sparse_probs);
    free(c->ab);
    kvp_free_aligned(c->ab_floats);
    free(c->ab_idx);
    kvp_free_aligned(c->claim);
    c->claim = NULL;
    c->sparse_probs = NULL;
    c->ab = NULL;
    c->ab_floats = NULL;
    c->ab_idx = NULL;
}

int kvp_kv_configure(struct kvp_ctx *c, struct kvp_err *err)
{
    kvp_kv_release(c);
    if (c->pol.p) {
        c->sparse_probs = kvp_alloc_aligned((size_t)c->hp.n_head * c->probs_stride *
                                            sizeof(float));
        if (!c->sparse_probs || alloc_attn_blocks(c) < 0) {
            kvp_kv_release(c);
            return kvp_err_set(err, KVP_ENOMEM, "out of memory for policy buffers");
        }
    }
    if (!c->store)
        return 0;
    return kvp_store_configure(c->store, c->pol.dense_layers, hot_blocks_for(c), err);
}

/* ---- around a micro-batch -------------------------------------------------------------------- */

int kvp_kv_check(const struct kvp_ctx *c, struct kvp_err *err)
{
    return c->store ? kvp_store_check(c->store, err) : 0;
}

int kvp_ctx_trusted_tokens(const kvp_ctx *c)
{
    return c->store ? kvp_store_trusted_tokens(c->store, c->n_tokens) : c->n_tokens;
}

void kvp_kv_batch_begin(struct kvp_ctx *c)
{
    if (!c->store)
        return;
    kvp_store_call_begin(c->store, c->n_tokens);
    if (c->job_n == 1)
        kvp_store_step_begin(c->store, c->n_tokens);
}

int kvp_kv_batch_end(struct kvp_ctx *c, struct kvp_err *err)
{
    if (!c->store)
        return 0;
    if (c->job_n == 1)
        kvp_store_step_end(c->store);
    return kvp_store_take_error(c->store, err);
}

void kvp_kv_layer_done(struct kvp_ctx *c, int l, double t0, int ith)
{
    if (ith == 0) { /* the piece's tokens through layer l, for kvp_ctx_progress_tokens */
        long long tl = (long long)c->job_pos0 * c->hp.n_layer + (long long)c->job_n * (l + 1);
        atomic_store_explicit(&c->progress_tl, tl, memory_order_relaxed);
    }
    if (c->store && c->job_n == 1 && ith == 0)
        kvp_store_note(c->store, KVP_EV_LAYER, l, t0, kvp_time_now());
}

/* ---- decode ---------------------------------------------------------------------------------- */

/* Dense attention mass on the tokens a selection read, for one query head. */
static double recovery_of(const float *dense, const struct kvp_sel *sel, const float *sparse,
                          int bs)
{
    double r = 0;
    for (int i = 0; i < sel->n; i++)
        for (int t = 0; t < bs; t++)
            if (sparse[(size_t)i * bs + t] > 0.0f)
                r += dense[(size_t)sel->blocks[i] * bs + t];
    return r;
}

/* Measuring: the dense attention of KV head kvh's group over every key, and the recovery of
 * its selection. */
static void measure_group(struct kvp_ctx *c, int l, int kvh, const struct kvp_sel *sel)
{
    const int g = c->hp.n_head / c->hp.n_head_kv, n_keys = c->job_pos0 + 1;
    size_t first = (size_t)kvh * g;
    float *dp = c->dense_probs + ((size_t)l * c->hp.n_head + first) * c->probs_stride;
    const float *sp = c->sparse_probs + first * c->probs_stride;
    kvp_attn_dense_group(&c->kv, l, kvh, c->q + first * c->hp.head_dim, g, n_keys, dp,
                         c->probs_stride, NULL);
    memcpy(c->dense_q + ((size_t)l * c->hp.n_head + first) * c->hp.head_dim,
           c->q + first * c->hp.head_dim, (size_t)g * c->hp.head_dim * sizeof(float));
    for (int j = 0; j < g; j++)
        c->recovery[(size_t)l * c->hp.n_head + first + j] =
            recovery_of(dp + (size_t)j * c->probs_stride, sel, sp + (size_t)j * c->probs_stride,
                        c->kv.block_size);
}

/* Whether nothing reads a step's sparse probabilities token by token: no measurement, and no
 * policy step hook or one that reads the blocks' largest only. */
static bool probs_unread(const struct kvp_ctx *c)
{
    return !c->measure &&
           (!kvp_policy_has_on_step(&c->pol) || kvp_policy_step_block_max(&c->pol));
}

/* What the attention of KV head kvh leaves for the sparse fold to skip or keep (above). */
static void fold_needs(struct kvp_ctx *c, int kvh)
{
    c->ab[kvh].skip_probs = probs_unread(c);
    c->ab[kvh].block_max = kvp_policy_step_block_max(&c->pol);
}

/* on_step of (l, kvh) after its sparse attention: the token probabilities sp, or the blocks'
 * largest that the fold left in the KV head's block state. */
static void step_hook(struct kvp_ctx *c, int l, int kvh, const float *sp)
{
    const struct kvp_attn_blocks *ab = &c->ab[kvh];
    if (ab->block_max)
        kvp_policy_on_step(&c->pol, l, kvh, ab->bmax, ab->bmax_stride, c->job_pos0 + 1);
    else
        kvp_policy_on_step(&c->pol, l, kvh, sp, c->probs_stride, c->job_pos0 + 1);
}

/* Attention of KV head kvh: dense on a dense layer; on a sparse one the selection (made here
 * unless `selected`: a tiered layer selected before fetching), sparse attention, the measurement
 * when measuring on an untiered cache (the tiered one measures after, once the cold tier is
 * visible) and on_step. */
static void attend_head(struct kvp_ctx *c, int l, int kvh, bool selected)
{
    const int hd = c->hp.head_dim, g = c->hp.n_head / c->hp.n_head_kv;
    const int n_keys = c->job_pos0 + 1;
    size_t first = (size_t)kvh * g; /* first query head of the group */
    const float *qg = c->q + first * hd;
    float *out = c->att + first * hd;
    if (!kvp_policy_sparse(&c->pol, l)) {
        kvp_attn_dense_group(&c->kv, l, kvh, qg, g, n_keys, c->probs + first * c->probs_stride,
                             c->probs_stride, out);
        return;
    }
    struct kvp_sel *sel = selected ? kvp_policy_sel(&c->pol, l, kvh)
                                   : kvp_policy_select(&c->pol, l, kvh, qg, n_keys);
    float *sp = c->sparse_probs + first * c->probs_stride;
    fold_needs(c, kvh);
    kvp_attn_sparse_group(&c->kv, l, kvh, qg, g, n_keys, sel, sp, c->probs_stride, &c->ab[kvh],
                          out);
    if (c->measure && !c->store)
        measure_group(c, l, kvh, sel);
    step_hook(c, l, kvh, sp);
}

/* attend_head for this thread's KV heads. */
static void attend(struct kvp_ctx *c, int l, bool selected, int ith, int nth)
{
    long h0, h1;
    kvp_split_range(c->hp.n_head_kv, ith, nth, &h0, &h1);
    for (long kvh = h0; kvh < h1; kvh++)
        attend_head(c, l, (int)kvh, selected);
}

/* The end of KV head kvh's sparse attention after a parts pass (parts: its blocks were reduced
 * there; else its own thread reduces them now): the fold in selection order, the measurement on
 * an untiered cache and on_step, as attend. */
static void fold_group(struct kvp_ctx *c, int l, int kvh, bool parts)
{
    const int hd = c->hp.head_dim, g = c->hp.n_head / c->hp.n_head_kv;
    size_t first = (size_t)kvh * g;
    struct kvp_sel *sel = kvp_policy_sel(&c->pol, l, kvh);
    float *sp = c->sparse_probs + first * c->probs_stride;
    c->ab[kvh].parts = parts;
    fold_needs(c, kvh);
    kvp_attn_sparse_group(&c->kv, l, kvh, c->q + first * hd, g, c->job_pos0 + 1, sel, sp,
                          c->probs_stride, &c->ab[kvh], c->att + first * hd);
    if (c->measure && !c->store)
        measure_group(c, l, kvh, sel);
    step_hook(c, l, kvh, sp);
}

/* Sparse attention of layer l, whose selections are made, with the selected blocks of every KV
 * head spread evenly over the pool (a KV head per thread leaves threads idle whenever the KV
 * heads do not divide among them: 3 on 2 threads wait a third of the time), then each group
 * folded in selection order by its own thread (the bits of one thread: kv/attention.h), with
 * the measurement and on_step as attend. False, with nothing done, when a selection does not
 * fit the parts pass; every thread decides alike from the same selections. */
static bool attend_parts(struct kvp_ctx *c, int l, int ith, int nth)
{
    const int hd = c->hp.head_dim, n_kv = c->hp.n_head_kv, g = c->hp.n_head / n_kv;
    const int n_keys = c->job_pos0 + 1;
    if (nth < 2 || !c->ab || c->ab[0].pcap == 0)
        return false;
    long total = 0;
    for (int h = 0; h < n_kv; h++) {
        const struct kvp_sel *sel = kvp_policy_sel(&c->pol, l, h);
        if (!kvp_attn_sparse_parts_fit(&c->kv, l, h, n_keys, sel, &c->ab[h]))
            return false;
        total += sel->n;
    }
    long a, b;
    kvp_split_range(total, ith, nth, &a, &b);
    for (long h = 0, base = 0; h < n_kv && base < b; h++) {
        const struct kvp_sel *sel = kvp_policy_sel(&c->pol, l, (int)h);
        long lo = a > base ? a - base : 0, hi = b - base < sel->n ? b - base : sel->n;
        if (lo < hi)
            kvp_attn_sparse_part(&c->kv, l, (int)h, c->q + (size_t)h * g * hd, g, n_keys, sel,
                                 (int)lo, (int)hi, c->sparse_probs + (size_t)h * g * c->probs_stride,
                                 c->probs_stride, &c->ab[h]);
        base += sel->n;
    }
    kvp_pool_barrier(c->pool);
    long h0, h1;
    kvp_split_range(n_kv, ith, nth, &h0, &h1);
    for (long kvh = h0; kvh < h1; kvh++)
        fold_group(c, l, (int)kvh, true);
    return true;
}

/* Blocks per claim of the parts pass: a few microseconds of work, so the claims' atomics cost
 * nothing beside it and the last claims even out the threads' ends. */
#define CLAIM_CHUNK 8

/* Spin politely while another thread selects: PAUSE, then yield the core on an oversubscribed
 * host (a selector that is not running cannot be waited for by spinning). */
static void claim_relax(int spins)
{
#if defined(__x86_64__) || defined(__i386__)
    if (spins < 2000) {
        __builtin_ia32_pause();
        return;
    }
#endif
    if (spins >= 64)
        sched_yield();
}

/* Whether a single untiered token of c takes layer l's parts pass: a sparse layer with the
 * claims' queue (two threads or more: part_blocks_for). Every thread decides alike. */
static bool claims(const struct kvp_ctx *c, int l)
{
    return c->claim && kvp_policy_sparse(&c->pol, l);
}

/* Whether c's part of the running pass is one token on an untiered cache: such sequences'
 * layers run together (kvp_kv_step); the others one after another (ungrouped_layers). */
static bool grouped(const struct kvp_ctx *c)
{
    return c->job_n == 1 && !c->store;
}

/* The work items of each KV head of sequence c in layer l's queue: one, or for a grouped
 * sequence on a dense layer past one chunk of keys, one per chunk (kv/attention.h: their states
 * are folded after the queue, with the bits of kvp_attn_dense_group). Every thread decides
 * alike. */
static int head_items(const struct kvp_ctx *c, int l)
{
    if (!grouped(c) || !c->dchunk || kvp_policy_sparse(&c->pol, l))
        return 1;
    return kvp_attn_dense_chunks(c->job_pos0 + 1, c->kv.block_size);
}

/* Chunk `chunk` of (grouped sequence c, KV head h)'s dense attention into its state. */
static void dense_chunk_item(struct kvp_ctx *c, int l, int h, int chunk)
{
    const int hd = c->hp.head_dim, g = c->hp.n_head / c->hp.n_head_kv;
    float *st = c->dchunk + ((size_t)h * c->dchunk_max + chunk) * kvp_attn_state_floats(g, hd);
    kvp_attn_dense_chunk(&c->kv, l, h, c->q + (size_t)h * g * hd, g, c->job_pos0 + 1, chunk,
                         c->probs + (size_t)h * g * c->probs_stride, c->probs_stride, st);
}

/* Reduce chunks of the published selections' blocks of every grouped sequence of seqs[0..n)
 * that takes the parts pass, until none is left unclaimed, waiting for the KV heads other
 * threads are still selecting. */
static void claim_parts(struct kvp_ctx *const *seqs, int n, int l)
{
    for (int spins = 0;; spins++) {
        bool waiting = false;
        for (int s = 0; s < n; s++) {
            struct kvp_ctx *c = seqs[s];
            if (!grouped(c) || !claims(c, l))
                continue;
            const int hd = c->hp.head_dim, n_kv = c->hp.n_head_kv, g = c->hp.n_head / n_kv;
            const int n_keys = c->job_pos0 + 1;
            for (int h = 0; h < n_kv; h++) {
                struct kvp_attn_claim *cl = &c->claim[h];
                int r = atomic_load_explicit(&cl->ready, memory_order_acquire);
                waiting |= r == 0;
                if (r <= 0)
                    continue;
                const struct kvp_sel *sel = kvp_policy_sel(&c->pol, l, h);
                while (atomic_load_explicit(&cl->next, memory_order_relaxed) < r - 1) {
                    int i = atomic_fetch_add_explicit(&cl->next, CLAIM_CHUNK,
                                                      memory_order_relaxed);
                    if (i >= r - 1)
                        break;
                    kvp_attn_sparse_part(&c->kv, l, h, c->q + (size_t)h * g * hd, g, n_keys, sel,
                                         i, i + CLAIM_CHUNK,
                                         c->sparse_probs + (size_t)h * g * c->probs_stride,
                                         c->probs_stride, &c->ab[h]);
                    spins = 0;
                }
            }
        }
        if (!waiting)
            return;
        claim_relax(spins);
    }
}

/* The start of (grouped sequence c, KV head h): dense attention on a dense layer; on a sparse
 * one the selection, published at once for the parts pass, or (no parts pass) the whole of
 * attend_head. */
static void pair_start(struct kvp_ctx *c, int l, int h)
{
    if (!claims(c, l)) {
        attend_head(c, l, h, false);
        return;
    }
    const int hd = c->hp.head_dim, g = c->hp.n_head / c->hp.n_head_kv;
    const int n_keys = c->job_pos0 + 1;
    struct kvp_sel *sel = kvp_policy_select(&c->pol, l, h, c->q + (size_t)h * g * hd, n_keys);
    bool fit = kvp_attn_sparse_parts_fit(&c->kv, l, h, n_keys, sel, &c->ab[h]);
    atomic_store_explicit(&c->claim[h].next, 0, memory_order_relaxed);
    atomic_store_explicit(&c->claim[h].ready, fit ? 1 + sel->n : -1, memory_order_release);
}

/* The early part of this thread's KV heads' sparse attention, over the selected blocks that are
 * already hot (pending: the store's per-block wait state). */
static void attend_hot(struct kvp_ctx *c, int l, const uint8_t *pending, int ith, int nth)
{
    const int hd = c->hp.head_dim, g = c->hp.n_head / c->hp.n_head_kv;
    long h0, h1;
    kvp_split_range(c->hp.n_head_kv, ith, nth, &h0, &h1);
    for (long kvh = h0; kvh < h1; kvh++)
        kvp_attn_sparse_early(&c->kv, l, (int)kvh, c->q + (size_t)kvh * g * hd, g,
                              c->job_pos0 + 1, kvp_policy_sel(&c->pol, l, (int)kvh), pending,
                              c->sparse_probs + (size_t)kvh * g * c->probs_stride,
                              c->probs_stride, &c->ab[kvh]);
}

/* The predicted selections of layer l for a step with n_next tokens (this thread's KV heads),
 * timed on worker 0 as prediction; join: wait for every thread's heads before the note. */
static void predict(struct kvp_ctx *c, int l, int n_next, int ith, int nth, bool join)
{
    double tp = ith == 0 ? kvp_time_now() : 0;
    long h0, h1;
    kvp_split_range(c->hp.n_head_kv, ith, nth, &h0, &h1);
    for (long kvh = h0; kvh < h1; kvh++)
        kvp_policy_predict(&c->pol, l, (int)kvh, n_next);
    if (join)
        kvp_pool_barrier(c->pool);
    if (ith == 0)
        kvp_store_note(c->store, KVP_EV_PREDICT, l, tp, kvp_time_now());
}

/* Measuring a tiered layer: the cold tier made visible for the dense pass, then hidden again
 * before anything else reads the cache, so what the step does is what it does unmeasured. */
static void measure_tiered(struct kvp_ctx *c, int l, int ith, int nth)
{
    const int n_keys = c->job_pos0 + 1;
    kvp_pool_barrier(c->pool);
    if (ith == 0)
        kvp_store_expose_cold(c->store, l, n_keys);
    kvp_pool_barrier(c->pool);
    long h0, h1;
    kvp_split_range(c->hp.n_head_kv, ith, nth, &h0, &h1);
    for (long kvh = h0; kvh < h1; kvh++)
        measure_group(c, l, (int)kvh, kvp_policy_sel(&c->pol, l, (int)kvh));
    kvp_pool_barrier(c->pool);
    if (ith == 0)
        kvp_store_hide_cold(c->store, l, n_keys);
}

/* Decode attention of layer l on a tiered cache, first half: select -> start the reads of the
 * misses (the store's acquire_begin). Nothing waits for a read here, so a step of several
 * sequences starts every sequence's reads of the layer before it waits for any
 * (ungrouped_layers). */
static void decode_start(struct kvp_ctx *c, int l, int ith, int nth)
{
    struct kvp_store *st = c->store;
    const int n_keys = c->job_pos0 + 1, n_layer = c->hp.n_layer;
    const bool sparse = kvp_policy_sparse(&c->pol, l);
    const int mode = kvp_store_mode(st);
    /* layer mode: layer l+1's predicted blocks start reading while this layer computes */
    if (mode == KVP_PREFETCH_LAYER && l + 1 < n_layer && kvp_policy_sparse(&c->pol, l + 1)) {
        predict(c, l + 1, n_keys, ith, nth, true);
        if (ith == 0)
            kvp_store_prefetch(st, l + 1, kvp_policy_next(&c->pol, l + 1, 0), n_keys);
    }
    /* select every KV head before fetching (the store moves their union); a select that reads
     * keys sees the cold tier where the store can show it (store.h, expose_cold), and the
     * first KV heads' misses start while the policy selects for the others */
    const bool expose =
        sparse && kvp_store_shows_cold(st, kvp_policy_reads_all_keys(&c->pol, l));
    if (expose) {
        if (ith == 0)
            kvp_store_expose_cold(st, l, n_keys);
        kvp_pool_barrier(c->pool);
    }
    if (sparse) {
        const int hd = c->hp.head_dim, g = c->hp.n_head / c->hp.n_head_kv;
        long h0, h1;
        kvp_split_range(c->hp.n_head_kv, ith, nth, &h0, &h1);
        for (long h = h0; h < h1; h++) {
            kvp_policy_select(&c->pol, l, (int)h, c->q + (size_t)h * g * hd, n_keys);
            if (ith == 0 && h + 1 < c->hp.n_head_kv && !expose)
                kvp_store_acquire_head(st, l, kvp_policy_sel(&c->pol, l, (int)h), n_keys);
        }
    }
    kvp_pool_barrier(c->pool);
    if (ith == 0) {
        if (expose)
            kvp_store_hide_cold(st, l, n_keys);
        c->store_waits =
            kvp_store_acquire_begin(st, l, sparse ? kvp_policy_sel(&c->pol, l, 0) : NULL, n_keys);
    }
    kvp_pool_barrier(c->pool);
}

/* Second half: attend -> on_step -> predict/prefetch, attending to the blocks already hot while
 * the misses decode_start began are read. */
static void decode_finish(struct kvp_ctx *c, int l, int ith, int nth)
{
    struct kvp_store *st = c->store;
    const int n_keys = c->job_pos0 + 1;
    const bool sparse = kvp_policy_sparse(&c->pol, l);
    const int mode = kvp_store_mode(st);
    /* token mode predicts after the step (none follows the context's last position, and its
     * plan would not fit the buffers) */
    const bool predicts = mode == KVP_PREFETCH_TOKEN && sparse && n_keys < c->n_ctx;
    bool predicted = false;
    if (c->store_waits) {
        /* attend to the hot blocks while the rest is read (same bits: kv/attention.h); a
         * policy without on_step predicts from what its select left, so that runs here too */
        if (sparse)
            attend_hot(c, l, kvp_store_pending(st), ith, nth);
        if (predicts && !kvp_policy_has_on_step(&c->pol)) {
            predict(c, l, n_keys + 1, ith, nth, false);
            predicted = true;
        }
        kvp_pool_barrier(c->pool);
        if (ith == 0)
            kvp_store_acquire_wait(st);
        kvp_pool_barrier(c->pool);
    }
    if (!sparse || !attend_parts(c, l, ith, nth))
        attend(c, l, sparse, ith, nth);
    if (sparse && c->measure)
        measure_tiered(c, l, ith, nth);
    if (!predicts)
        return;
    kvp_pool_barrier(c->pool);
    if (!predicted)
        predict(c, l, n_keys + 1, ith, nth, true);
    if (ith == 0)
        kvp_store_prefetch(st, l, kvp_policy_next(&c->pol, l, 0), n_keys + 1);
}

/* ---- prefill --------------------------------------------------------------------------------- */

/* At the end of a prompt (its last micro-batch, after on_prefill of layer l): the first decode
 * step's predicted selection of layer l, which the store copies into its hot tier while the
 * layer is staged; NULL when the store does not predict or no decode step can follow. */
static const struct kvp_sel *first_step_prediction(struct kvp_ctx *c, int l)
{
    const int mode = kvp_store_mode(c->store);
    if (!c->job_last || !kvp_policy_has_predict(&c->pol) || !kvp_policy_sparse(&c->pol, l) ||
        c->job_end >= c->n_ctx || (mode != KVP_PREFETCH_TOKEN && mode != KVP_PREFETCH_LAYER))
        return NULL;
    for (int kvh = 0; kvh < c->hp.n_head_kv; kvh++)
        kvp_policy_predict(&c->pol, l, kvh, c->job_end + 1);
    return kvp_policy_next(&c->pol, l, 0);
}

/* The last layer this step runs (sliding-window layers attend in local_attention.c). */
static int last_kv_step_layer(const struct kvp_hparams *hp)
{
    int l = hp->n_layer - 1;
    while (l > 0 && kvp_local_attn_wants(hp, l))
        l--;
    return l;
}

static void prefill(struct kvp_ctx *c, int l, int ith)
{
    const struct kvp_hparams *hp = &c->hp;
    const int n = c->job_n, pos0 = c->job_pos0;
    kvp_attn_prefill_layer(c, l, ith);
    kvp_pool_barrier(c->pool);
    if (ith != 0)
        return;
    if (c->job_prefill && c->job_last) {
        /* the prompt is complete for this layer: let the policy look at it (and evict) */
        struct kvp_prefill_obs ob = {
            .n_prompt = c->job_end,
            .first = c->pol_seen,
            .n_obs = c->obs_n,
            .obs = c->pol.obs,
            .colsum = c->pol.colsum ? c->pol.colsum + (size_t)l * hp->n_head * c->n_ctx : NULL,
            .q_last = c->q + (size_t)(n - 1) * hp->n_head * hp->head_dim,
        };
        kvp_policy_on_prefill(&c->pol, l, &ob);
        if (l == last_kv_step_layer(&c->hp)) /* every layer has seen the prompt */
            c->pol_seen = c->job_end;
    }
    if (c->store)
        kvp_store_prefill_end(c->store, l, pos0, pos0 + n, first_step_prediction(c, l),
                              c->job_end + 1);
}

/* ---- the layer ------------------------------------------------------------------------------- */

/* K and V of the batch's tokens into the cache (this thread's tokens, as RoPE split them). */
static void write_kv(struct kvp_ctx *c, int l, int ith, int nth)
{
    const int hd = c->hp.head_dim, kv_dim = c->hp.n_head_kv * hd;
    long t0, t1;
    kvp_split_range(c->job_n, ith, nth, &t0, &t1);
    for (long i = t0; i < t1; i++)
        for (int h = 0; h < c->hp.n_head_kv; h++)
            kvp_kvcache_store(&c->kv, l, h, c->job_pos0 + (int)i, c->k + i * kv_dim + h * hd,
                              c->v + i * kv_dim + h * hd);
}

/* Layer l of a prompt piece (c->job_n tokens, not one: single tokens are decode steps, run by
 * kvp_kv_step together or by ungrouped_layers' two halves). */
static void prefill_layer(struct kvp_ctx *c, int l, int ith, int nth)
{
    const int n = c->job_n, pos0 = c->job_pos0;
    if (n > 1 && c->store) { /* stage the layer's KV for prefill attention (a sparse prefill's
                                * in part: sparse_prefill.h) */
        if (ith == 0)
            kvp_store_prefill_begin_some(c->store, l, pos0, pos0 + n,
                                         kvp_spf_stage_first(c->spf, c, l));
        kvp_pool_barrier(c->pool);
    }
    if (ith == 0) /* every thread is past the previous attention's queue (its barrier) */
        atomic_store_explicit(&c->sh->prefill_next, 0, memory_order_relaxed);
    write_kv(c, l, ith, nth);
    kvp_pool_barrier(c->pool);
    prefill(c, l, ith);
}

/* A decode step of a tiered cache: its reads are split from its waits (ungrouped_layers). */
static bool tiered_decode(const struct kvp_ctx *c)
{
    return c->job_n == 1 && c->store;
}

/* Layer l for each sequence of cs[0..n_cs) that kvp_kv_step does not group: the decoding ones
 * with a tiered store first write their token and start their misses' reads, all of them, and
 * only then attend (and wait) one after another, so the reads of every sequence are in flight
 * together; prompt pieces run prefill_layer. Each sequence's results are those it gets alone. */
static void ungrouped_layers(struct kvp_ctx *const *cs, int n_cs, int l, int ith, int nth)
{
    /* Every tiered decoding sequence writes its token and starts its misses' reads first, so the
     * device holds all of them at once; one sequence's reads in flight at a time would leave
     * the step waiting for each sequence's misses in turn. Each sequence's attention still reads
     * only its own cache and buffers, so the order changes no bit of it. */
    for (int s = 0; s < n_cs; s++) {
        struct kvp_ctx *c = cs[s];
        if (!tiered_decode(c))
            continue;
        write_kv(c, l, ith, nth);
        kvp_pool_barrier(c->pool);
        decode_start(c, l, ith, nth);
    }
    for (int s = 0; s < n_cs; s++) {
        if (tiered_decode(cs[s]))
            decode_finish(cs[s], l, ith, nth);
        else if (!grouped(cs[s]))
            prefill_layer(cs[s], l, ith, nth);
    }
}

/* The pass's layer l (kv_step.h). The grouped sequences (one untiered token each) write the K
 * and V rows their threads rotated (no barrier before), meet once, and then every (sequence,
 * KV head) pair is taken from one queue by whichever thread is free: dense attention, or a
 * selection published for the parts pass; every thread then reduces chunks of every published
 * selection (claim_parts), and after one barrier the pairs are folded in selection order, each
 * by one thread. Per layer that is two barriers however many sequences share the step, where
 * one sequence after another took two per sequence and left a thread idle whenever the KV heads
 * did not divide among the threads. Each pair's arithmetic is the lone sequence's (a pair's
 * attention does not depend on the thread that runs it, the parts are folded in selection
 * order: kv/attention.h), so the bits do not depend on what shares the step. */
void kvp_kv_step(struct kvp_shared *sh, int l, int ith, int nth)
{
    struct kvp_ctx *const *seqs = sh->seqs;
    const int n = sh->n_seqs;
    long t0, t1;
    kvp_split_range(sh->n_rows, ith, nth, &t0, &t1); /* the rows this thread rotated */
    bool others = false, any = false, parts = false;
    for (int s = 0; s < n; s++) {
        struct kvp_ctx *c = seqs[s];
        if (!grouped(c)) {
            others = true;
            continue;
        }
        any = true;
        parts |= claims(c, l);
        if (c->job_row0 < t0 || c->job_row0 >= t1)
            continue;
        const int hd = c->hp.head_dim;
        for (int h = 0; h < c->hp.n_head_kv; h++)
            kvp_kvcache_store(&c->kv, l, h, c->job_pos0, c->k + h * hd, c->v + h * hd);
    }
    if (others) {
        /* a lone sequence's threads store the tokens they rotated, several need them all */
        if (n > 1)
            kvp_pool_barrier(sh->pool);
        ungrouped_layers(seqs, n, l, ith, nth);
    }
    if (!any)
        return;
    /* every thread is past the previous layer's queue (the pass's barriers since) */
    if (ith == 0)
        atomic_store_explicit(&sh->pair_next, 0, memory_order_relaxed);
    kvp_pool_barrier(sh->pool);
    const int n_kv = sh->model->hp.n_head_kv;
    const int pairs = n * n_kv;
    /* the queue: each pair, or each chunk of a long dense pair, taken by whichever thread is
     * free (sequence s's items start at the sum of the items before it) */
    int items = 0;
    bool chunked = false;
    for (int s = 0; s < n; s++) {
        const int k = head_items(seqs[s], l);
        items += n_kv * k;
        chunked |= k > 1;
    }
    for (;;) {
        int i = atomic_fetch_add_explicit(&sh->pair_next, 1, memory_order_relaxed);
        if (i >= items)
            break;
        int s = 0, k = head_items(seqs[0], l);
        while (i >= n_kv * k) {
            i -= n_kv * k;
            k = head_items(seqs[++s], l);
        }
        if (!grouped(seqs[s]))
            continue;
        if (k > 1)
            dense_chunk_item(seqs[s], l, i / k, i % k);
        else
            pair_start(seqs[s], l, i);
    }
    if (!parts && !chunked)
        return;
    if (parts)
        claim_parts(seqs, n, l);
    kvp_pool_barrier(sh->pool);
    long p0, p1;
    kvp_split_range(pairs, ith, nth, &p0, &p1);
    for (long i = p0; i < p1; i++) {
        struct kvp_ctx *c = seqs[i / n_kv];
        const int h = (int)(i % n_kv);
        const int k = head_items(c, l);
        if (k > 1) { /* fold the chunks' states in chunk order */
            const int hd = c->hp.head_dim, g = c->hp.n_head / n_kv;
            kvp_attn_dense_merge(c->dchunk + (size_t)h * c->dchunk_max *
                                                 kvp_attn_state_floats(g, hd),
                                 k, g, hd, c->att + (size_t)h * g * hd);
            continue;
        }
        if (!grouped(c) || !claims(c, l))
            continue;
        bool reduced = atomic_load_explicit(&c->claim[h].ready, memory_order_relaxed) > 0;
        /* every thread is past its claims (the barrier): the next layer starts from nothing */
        atomic_store_explicit(&c->claim[h].ready, 0, memory_order_relaxed);
        fold_group(c, l, h, reduced);
    }
}

/* ---- the tiered store's statistics and timeline (kvpred.h) ---------------------------------- */

int kvp_ctx_store_stats(const kvp_ctx *c, struct kvp_store_stats *stats)
{
    if (!c->store)
        return KVP_EINVAL;
    kvp_store_get_stats(c->store, stats);
    return 0;
}

void kvp_ctx_store_reset_stats(kvp_ctx *c)
{
    if (c->store)
        kvp_store_reset_stats(c->store);
}

void kvp_ctx_store_timeline(kvp_ctx *c, bool on)
{
    if (c->store)
        kvp_store_record_timeline(c->store, on);
}

int kvp_ctx_store_timeline_png(const kvp_ctx *c, const char *path, struct kvp_err *err)
{
    if (!c->store)
        return kvp_err_set(err, KVP_EINVAL, "the context has no tiered KV store");
    return kvp_store_timeline_png(c->store, path, err);
}
