/*
 * The KV step: everything the forward pass does with the KV cache, behind one call per layer.
 *
 * Per decode step and layer, kvp_kv_step owns the whole sequence
 *
 *     write K,V -> select -> fetch -> attend -> on_step -> predict / prefetch
 *
 * for every kind of cache. The untiered cache is the case where every block is hot: select,
 * attend and on_step run per KV head and nothing is fetched. With a tiered store (src/store)
 * the policy selects for every KV head first (a policy that reads keys in select sees the cold
 * tier), the store makes the union of the selections hot (misses of the first heads start while
 * the others are selected), attention reduces the blocks already hot while the misses are read,
 * and the next step's blocks are predicted and prefetched (store.h, modes). Measuring (dense
 * attention and recovery, kvp_ctx_set_measure) works the same on both: on a tiered layer the
 * dense pass reads the cold tier too, so it gives the untiered numbers.
 *
 * Prefill (a batch of tokens) goes through the same call: the store stages the layer's whole KV,
 * prefill attention runs, the policy sees the prompt (on_prefill) and the store writes the new
 * units back and warms the hot tier with the first decode step's predicted blocks.
 *
 * forward.c calls these and never the store or the policy's attention hooks; the store and the
 * policy host are only reached through here.
 */
#ifndef KVP_FORWARD_KV_STEP_H
#define KVP_FORWARD_KV_STEP_H

#include <stdbool.h>

#include "core/err.h"
#include "kvpred.h"
#include "kvpred_lab.h"

struct kvp_ctx;
struct kvp_shared;
struct kvp_policy_ops;

/* The cache (and the tiered store when p->kv_tier asks for one) of a new context. */
int kvp_kv_init(struct kvp_ctx *c, const struct kvp_ctx_params *p, struct kvp_err *err);
void kvp_kv_free(struct kvp_ctx *c);
/* Forget every token / drop the tokens at positions >= n. */
void kvp_kv_clear(struct kvp_ctx *c);
void kvp_kv_truncate(struct kvp_ctx *c, int n);

/* Whether the cache can serve a policy of these ops (a tiered store refuses evicting ones:
 * KVP_EUNSUPPORTED), and whether it wants predicted selections from the host. */
int kvp_kv_accepts(const struct kvp_ctx *c, const struct kvp_policy_ops *ops,
                   struct kvp_err *err);
bool kvp_kv_wants_predictions(const struct kvp_ctx *c);
/* The policy (c->pol) changed: attention's buffers for it and the hot tier sized for it.
 * KVP_ENOMEM; release frees the buffers (without a policy, configure leaves none). */
int kvp_kv_configure(struct kvp_ctx *c, struct kvp_err *err);
void kvp_kv_release(struct kvp_ctx *c);

/* Room for n more tokens (KVP_ENOMEM). */
int kvp_kv_reserve(struct kvp_ctx *c, int n, struct kvp_err *err);
/* Before an eval: 0, or KVP_EKVLOST when a tiered cache lost data (store.h, Faults). */
int kvp_kv_check(const struct kvp_ctx *c, struct kvp_err *err);
/* Around each micro-batch (c->job_*): a single token is a decode step of the store; end
 * returns KVP_EKVLOST when the batch lost data or the KV is untrusted (store.h, Faults). */
void kvp_kv_batch_begin(struct kvp_ctx *c);
int kvp_kv_batch_end(struct kvp_ctx *c, struct kvp_err *err);

/* Layer l of the running pass for all its sequences (sh->seqs), inside the pool (every thread
 * calls it after RoPE of its rows): for each sequence, c->k and c->v go into the cache and
 * c->q's attention over the cache goes to c->att, with the sequences that
 * decode one token on an untiered cache run together (kv_step.c: one queue of (sequence, KV
 * head) pairs for all of them, two barriers a layer), bit for bit as each alone. */
void kvp_kv_step(struct kvp_shared *sh, int l, int ith, int nth);
/* The layer ended (t0: when it started on worker 0): the store's timeline. */
void kvp_kv_layer_done(struct kvp_ctx *c, int l, double t0, int ith);

#endif
