/*
 * Many sequences over one model (kvpred.h, "many sequences"): the engine, its sequences, the
 * batched step and copying a sequence's KV.
 *
 * An engine is the shared part of a context (struct kvp_shared: thread pool, the rows of one
 * forward pass, per-thread scratch); a sequence is a kvp_ctx that borrows it. A step checks its
 * items, opens a job for each sequence that starts one (a prompt may span steps: the job ends
 * where the caller said the prompt ends), and runs one forward pass over all of them
 * (kvp_forward_pass): each weight matrix is read once per step, multi-token pieces go through
 * the batch kernels as they would alone, single tokens through the mat-vec kernel row group by
 * row group, and attention runs per sequence against its own cache, policy and tier. So a
 * sequence's logits do not depend on what else shares its step.
 */
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "forward/context_internal.h"
#include "forward/kv_step.h"
#include "forward/local_attention.h"
#include "forward/sparse_prefill.h"
#include "policy/host.h"
#include "policy/policy.h"
#include "store/store.h"
#include "kvpred_lab.h"

struct kvp_engine {
    struct kvp_shared *sh;       /* owned */
    struct kvp_pass_item *items; /* [n_batch] the step's plan */
};

int kvp_engine_init(const kvp_model *model, const struct kvp_engine_params *params,
                    kvp_engine **out, struct kvp_err *err)
{
    struct kvp_engine_params p = params ? *params : (struct kvp_engine_params){0};
    if (!model || !out)
        return kvp_err_set(err, KVP_EINVAL, "no model or output pointer");
    if (p.n_threads <= 0)
        p.n_threads = 1;
    if (p.n_batch <= 0)
        p.n_batch = 512;
    if (p.n_ctx <= 0)
        p.n_ctx = model->hp.n_ctx_train;
    if (p.n_ctx > (1 << 24))
        return kvp_err_set(err, KVP_EINVAL, "context %d too large", p.n_ctx);
    if (p.n_batch > (1 << 20))
        return kvp_err_set(err, KVP_EINVAL, "batch %d too large", p.n_batch);
    struct kvp_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    e->items = calloc((size_t)p.n_batch, sizeof(*e->items));
    if (!e->items) {
        free(e);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    int rc = kvp_shared_init(model, p.n_threads, p.n_batch, p.n_ctx, &e->sh, err);
    if (rc < 0) {
        free(e->items);
        free(e);
        return rc;
    }
    e->sh->exact = p.exact;
    e->sh->pack = !p.no_pack;
    *out = e;
    return 0;
}

void kvp_engine_free(kvp_engine *e)
{
    if (!e)
        return;
    kvp_shared_free(e->sh);
    free(e->items);
    free(e);
}

size_t kvp_engine_packed_bytes(const kvp_engine *e)
{
    return e && e->sh->lanes ? e->sh->lanes_bytes : 0;
}

size_t kvp_engine_pack_weights(kvp_engine *e)
{
    return e ? kvp_shared_pack(e->sh) : 0;
}

int kvp_seq_init(kvp_engine *e, const struct kvp_ctx_params *params, kvp_seq **out,
                 struct kvp_err *err)
{
    if (!e || !out)
        return kvp_err_set(err, KVP_EINVAL, "no engine or output pointer");
    struct kvp_ctx_params p = params ? *params : (struct kvp_ctx_params){0};
    return kvp_seq_setup(e->sh, &p, out, err);
}

/* ---- the step -------------------------------------------------------------------------------- */

static int check_item(const struct kvp_engine *e, const struct kvp_batch_item *it, int i,
                      struct kvp_err *err)
{
    struct kvp_ctx *c = it->seq;
    if (!c || c->sh != e->sh)
        return kvp_err_set(err, KVP_EINVAL, "item %d: not a sequence of this engine", i);
    if (it->n <= 0 || !it->tokens)
        return kvp_err_set(err, KVP_EINVAL, "item %d: no tokens", i);
    if (it->prompt_rest < 0)
        return kvp_err_set(err, KVP_EINVAL, "item %d: negative prompt_rest %d", i,
                           it->prompt_rest);
    if ((long)it->n + it->prompt_rest > (long)c->n_ctx - c->n_tokens)
        return kvp_err_set(err, KVP_ERANGE,
                           "item %d: %d tokens (and %d to come) do not fit: %d of the "
                           "sequence's %d are already used",
                           i, it->n, it->prompt_rest, c->n_tokens, c->n_ctx);
    for (int j = 0; j < it->n; j++)
        if (it->tokens[j] < 0 || it->tokens[j] >= c->hp.n_vocab)
            return kvp_err_set(err, KVP_EINVAL, "item %d: token id %d out of range 0..%d", i,
                               it->tokens[j], c->hp.n_vocab - 1);
    if (c->job_end > 0) {
        if (c->n_tokens + it->n + it->prompt_rest != c->job_end)
            return kvp_err_set(err, KVP_EINVAL,
                               "item %d: the sequence's prompt ends at %d, this piece says %d", i,
                               c->job_end, c->n_tokens + it->n + it->prompt_rest);
    } else if (it->n + it->prompt_rest > 1 && kvp_policy_evicting(&c->pol) && c->n_tokens > 0) {
        /* prefill attention reads every cached token; after evicting, one token at a time */
        return kvp_err_set(err, KVP_EINVAL,
                           "item %d: the sequence's policy evicts tokens: after its first "
                           "prompt it takes one token per item",
                           i);
    }
    /* a tiered sequence that lost KV refuses until it is truncated (store.h, Faults) */
    return kvp_kv_check(c, err);
}

int kvp_batch_eval(kvp_engine *e, const struct kvp_batch_item *items, int n_items,
                   struct kvp_err *err)
{
    if (!e || (!items && n_items > 0))
        return kvp_err_set(err, KVP_EINVAL, "no engine or items");
    if (n_items <= 0)
        return kvp_err_set(err, KVP_EINVAL, "no items");
    long rows = 0;
    for (int i = 0; i < n_items; i++) {
        int rc = check_item(e, &items[i], i, err);
        if (rc < 0)
            return rc;
        rows += items[i].n;
        if (rows > e->sh->n_batch)
            return kvp_err_set(err, KVP_ERANGE,
                               "the step's tokens exceed the engine's batch of %d (at item %d)",
                               e->sh->n_batch, i);
    }
    /* distinct sequences: mark each, then clear the marks */
    int rc = 0;
    for (int i = 0; i < n_items && rc == 0; i++) {
        for (int j = 0; j < i; j++)
            if (items[j].seq == items[i].seq) {
                rc = kvp_err_set(err, KVP_EINVAL, "items %d and %d are the same sequence", j, i);
                break;
            }
    }
    if (rc < 0)
        return rc;
    for (int i = 0; i < n_items; i++)
        if ((rc = kvp_kv_reserve(items[i].seq, items[i].n, err)) < 0)
            return rc;
    for (int i = 0; i < n_items; i++) {
        const struct kvp_batch_item *it = &items[i];
        if (it->seq->job_end == 0)
            kvp_job_open(it->seq, it->n + it->prompt_rest);
        e->items[i] = (struct kvp_pass_item){.c = it->seq, .tokens = it->tokens, .n = it->n,
                                             .logits = it->logits,
                                             .all_logits = it->all_logits,
                                             .last = it->prompt_rest == 0};
    }
    return kvp_forward_pass(e->sh, e->items, n_items, err);
}

/* ---- copying a sequence's KV ------------------------------------------------------------------ */

/* Whether a cache with this policy holds nothing but its keys and values that a prompt leaves
 * behind: no evictions, no observation rows or column sums, no per-step history. Such a
 * policy's state after a prompt is its reset state plus what it derives from the keys when it
 * next reads them (quest's block bounds), so copying the keys and values copies the sequence. */
static int check_copyable(const struct kvp_ctx *c, const char *who, struct kvp_err *err)
{
    const struct kvp_policy *p = c->pol.p;
    if (p && (p->ops->evicting || p->ops->wants_obs || p->ops->wants_colsum || p->ops->on_step))
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "%s: policy '%s' keeps state from the prompt beyond the keys and "
                           "values, which a copy would not carry",
                           who, p->ops->name);
    return 0;
}

int kvp_seq_copy(kvp_seq *dst, kvp_seq *src, int n, struct kvp_err *err)
{
    if (!dst || !src || dst == src)
        return kvp_err_set(err, KVP_EINVAL, "copy needs two different sequences");
    if (n < 0 || n > src->n_tokens)
        return kvp_err_set(err, KVP_ERANGE, "copy of %d tokens from a sequence of %d", n,
                           src->n_tokens);
    if (n > dst->n_ctx)
        return kvp_err_set(err, KVP_ERANGE, "copy of %d tokens into a context of %d", n,
                           dst->n_ctx);
    const struct kvp_kvcache *sk = &src->kv, *dk = &dst->kv;
    if (src->model != dst->model || sk->type_k != dk->type_k || sk->type_v != dk->type_v ||
        sk->block_size != dk->block_size)
        return kvp_err_set(err, KVP_EINVAL,
                           "copy between caches of different models, KV types or block sizes");
    int rc;
    if ((rc = check_copyable(src, "source", err)) < 0 ||
        (rc = check_copyable(dst, "destination", err)) < 0)
        return rc;
    if (kvp_kvcache_has_evicted(sk))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "copy from a cache with evicted tokens");
    if ((rc = kvp_kv_check(src, err)) < 0) /* nothing untrusted is copied */
        return rc;
    kvp_ctx_reset(dst);
    if (n == 0)
        return 0;
    if ((!dst->store && (rc = kvp_kvcache_reserve(&dst->kv, n, err)) < 0) ||
        (rc = kvp_kvcache_ring_advance(&dst->kv, n, err)) < 0) /* rings: also under a store */
        return rc;
    const int bs = sk->block_size, nb = (n + bs - 1) / bs;
    for (int l = 0; l < sk->n_layer; l++) {
        /* a tiered layer is read and written through the store's staging area, as a prompt's */
        if (src->store)
            kvp_store_prefill_begin(src->store, l, src->n_tokens, src->n_tokens);
        if (dst->store)
            kvp_store_prefill_begin(dst->store, l, 0, n);
        for (int h = 0; h < sk->n_head_kv; h++)
            for (int b = 0; b < nb; b++) {
                if (!kvp_kvcache_kblock(dk, l, h, b))
                    continue; /* older than a sliding-window layer's ring: never read again */
                memcpy(kvp_kvcache_kblock(dk, l, h, b), kvp_kvcache_kblock(sk, l, h, b),
                       sk->k_bytes);
                memcpy(kvp_kvcache_vblock(dk, l, h, b), kvp_kvcache_vblock(sk, l, h, b),
                       sk->v_bytes);
            }
        /* what a prompt's end shows the policy (quest folds its block bounds from the keys
         * while the whole layer is visible; a tiered layer is only now) */
        struct kvp_prefill_obs ob = {.n_prompt = n};
        if (dst->pol.p && dst->pol.p->ops->on_prefill && !kvp_local_attn_wants(&dst->hp, l))
            kvp_policy_on_prefill(&dst->pol, l, &ob);
        if (dst->store)
            kvp_store_prefill_end(dst->store, l, 0, n, NULL, 0);
        if (src->store)
            kvp_store_prefill_end(src->store, l, src->n_tokens, src->n_tokens, NULL, 0);
    }
    kvp_ctx_tokens_set(dst, n);
    kvp_spf_forget(dst->spf, 0);
    if (dst->pol.p && dst->pol.p->ops->on_prefill)
        dst->pol_seen = n; /* every layer's on_prefill saw the copy */
    if (src->store && (rc = kvp_store_take_error(src->store, err)) < 0)
        return rc;
    if (dst->store && (rc = kvp_store_take_error(dst->store, err)) < 0)
        return rc;
    return 0;
}

int kvp_seq_read_kv(kvp_seq *src, int n, kvp_kv_layer_fn fn, void *arg, struct kvp_err *err)
{
    if (!src || !fn || n < 0 || n > src->n_tokens)
        return kvp_err_set(err, KVP_ERANGE, "read of %d tokens from a sequence of %d", n,
                           src ? src->n_tokens : 0);
    int rc;
    if ((rc = check_copyable(src, "source", err)) < 0)
        return rc;
    if (kvp_kvcache_has_evicted(&src->kv))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "read from a cache with evicted tokens");
    if ((rc = kvp_kv_check(src, err)) < 0) /* nothing untrusted is read */
        return rc;
    for (int l = 0; l < src->kv.n_layer; l++) {
        if (src->store)
            kvp_store_prefill_begin(src->store, l, src->n_tokens, src->n_tokens);
        fn(arg, l, &src->kv);
        if (src->store)
            kvp_store_prefill_end(src->store, l, src->n_tokens, src->n_tokens, NULL, 0);
    }
    return src->store ? kvp_store_take_error(src->store, err) : 0;
}

int kvp_seq_write_kv(kvp_seq *dst, int n, kvp_kv_layer_fn fn, void *arg, struct kvp_err *err)
{
    if (!dst || !fn || n < 0 || n > dst->n_ctx)
        return kvp_err_set(err, KVP_ERANGE, "write of %d tokens into a context of %d", n,
                           dst ? dst->n_ctx : 0);
    int rc;
    if ((rc = check_copyable(dst, "destination", err)) < 0)
        return rc;
    kvp_ctx_reset(dst);
    if (n == 0)
        return 0;
    if ((!dst->store && (rc = kvp_kvcache_reserve(&dst->kv, n, err)) < 0) ||
        (rc = kvp_kvcache_ring_advance(&dst->kv, n, err)) < 0) /* rings: also under a store */
        return rc;
    for (int l = 0; l < dst->kv.n_layer; l++) {
        if (dst->store)
            kvp_store_prefill_begin(dst->store, l, 0, n);
        fn(arg, l, &dst->kv);
        /* as kvp_seq_copy: the policy sees the prompt's end while the whole layer is visible */
        struct kvp_prefill_obs ob = {.n_prompt = n};
        if (dst->pol.p && dst->pol.p->ops->on_prefill && !kvp_local_attn_wants(&dst->hp, l))
            kvp_policy_on_prefill(&dst->pol, l, &ob);
        if (dst->store)
            kvp_store_prefill_end(dst->store, l, 0, n, NULL, 0);
    }
    kvp_ctx_tokens_set(dst, n);
    kvp_spf_forget(dst->spf, 0);
    if (dst->pol.p && dst->pol.p->ops->on_prefill)
        dst->pol_seen = n;
    if (dst->store && (rc = kvp_store_take_error(dst->store, err)) < 0)
        return rc;
    return 0;
}

int kvp_seq_fork(kvp_engine *e, kvp_seq *src, const struct kvp_policy_params *policy,
                 kvp_seq **out, struct kvp_err *err)
{
    if (!e || !src || !out)
        return kvp_err_set(err, KVP_EINVAL, "fork needs an engine, a source and an output");
    kvp_seq *c = NULL;
    int rc = kvp_seq_init(e, &src->params, &c, err);
    if (rc < 0)
        return rc;
    if ((policy && (rc = kvp_ctx_set_policy(c, policy, err)) < 0) ||
        (rc = kvp_seq_copy(c, src, src->n_tokens, err)) < 0) {
        kvp_ctx_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kvp_seq_kv_bytes(const kvp_seq *c, size_t *resident, size_t *cold)
{
    size_t res = 0, cld = 0;
    if (!c->store) {
        res = kvp_kvcache_resident_bytes(&c->kv, c->n_tokens);
    } else {
        struct kvp_store_stats st;
        kvp_store_get_stats(c->store, &st);
        res = st.hot_bytes;
        /* the units of the tokens held, in the layers the store moves (the others stay hot) */
        const int bs = c->kv.block_size, tiered = c->hp.n_layer - c->pol.dense_layers;
        cld = (size_t)(tiered > 0 ? tiered : 0) * (size_t)((c->n_tokens + bs - 1) / bs) *
              st.unit_bytes;
    }
    if (resident)
        *resident = res;
    if (cold)
        *cold = cld;
}
