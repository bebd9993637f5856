/*
 * The inference context as the library's other parts see it: kvp_ctx stays opaque (its fields
 * are forward/context_internal.h's, which only src/forward includes); what measurement, the
 * server and tests need of it comes through these accessors.
 */
#ifndef KVP_FORWARD_CONTEXT_H
#define KVP_FORWARD_CONTEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "kv/kvcache.h"
#include "model/model.h"
#include "policy/host.h"
#include "kvpred_lab.h"

struct kvp_store;

/* Parts of a context for measurement, tracing and tests, which read them between passes (never
 * while kvp_eval runs): the model's shape, the KV cache (block table, eviction marks), the
 * policy host (the policy, its selections and dense layers), the row stride of the attention
 * probabilities, and the tiered store (NULL when every block is hot). */
const struct kvp_hparams *kvp_ctx_hparams(const kvp_ctx *c);
struct kvp_kvcache *kvp_ctx_kvcache(kvp_ctx *c);
const struct kvp_kvcache *kvp_ctx_kvcache_const(const kvp_ctx *c);
struct kvp_policy_host *kvp_ctx_policy_host(kvp_ctx *c);
const struct kvp_policy_host *kvp_ctx_policy_host_const(const kvp_ctx *c);
int kvp_ctx_probs_stride(const kvp_ctx *c);
/* Most tokens of one forward pass: kvp_eval splits a prompt into passes of this many. */
int kvp_ctx_n_batch(const kvp_ctx *c);
struct kvp_store *kvp_ctx_store(kvp_ctx *c);
bool kvp_ctx_has_store(const kvp_ctx *c);
/* Whether kvp_ctx_set_measure(c, true) took: false when its rows could not be allocated. */
bool kvp_ctx_measuring(const kvp_ctx *c);

/* The caller wrote the KV of tokens [0, n) into the cache itself (room reserved with
 * kvp_kv_reserve; a context without store nor evicting policy, as a restored prefix): the
 * context now holds n tokens. */
void kvp_ctx_set_n_tokens(kvp_ctx *c, int n);

/* A prompt's KV out of or into a sequence, one layer at a time, for a cache of prompts (the
 * server's prefix cache): fn(arg, layer, kv) is called for every layer with blocks
 * [0, ceil(n / block size)) of each KV head addressable through kvp_kvcache_kblock/vblock (a
 * tiered layer staged through its store, as a prompt's prefill), except, when writing, the
 * blocks older than a sliding-window layer's ring (NULL there: no query reads them again; fn
 * skips them). kvp_seq_read_kv reads the
 * first n tokens (n <= the sequence's; the conditions of kvp_seq_copy's source: no evicted
 * tokens, a policy that keeps nothing beyond the keys and values, the KV trusted).
 * kvp_seq_write_kv resets the sequence and has fn write n tokens, which it then holds; the
 * policy is shown the prompt's end as after a prefill. 0 or an error (KVP_EKVLOST: a tiered
 * store lost data meanwhile; after a failed write the sequence must be reset). */
typedef void (*kvp_kv_layer_fn)(void *arg, int layer, struct kvp_kvcache *kv);
int kvp_seq_read_kv(kvp_seq *src, int n, kvp_kv_layer_fn fn, void *arg, struct kvp_err *err);
int kvp_seq_write_kv(kvp_seq *dst, int n, kvp_kv_layer_fn fn, void *arg, struct kvp_err *err);

/* kvp_ctx_set_policy with an ops table of the caller's instead of a registry entry (the seam for
 * test doubles; params->name may then be anything). */
int kvp_ctx_set_policy_ops(kvp_ctx *c, const struct kvp_policy_ops *ops,
                           const struct kvp_policy_params *params, struct kvp_err *err);

/* The first n tokens of a prompt whose last rest tokens come later, evaluated as kvp_eval
 * evaluates them (no logits) on a context without a policy, inside a job that ends where the
 * whole prompt ends: what prefill attention decides by the prompt's end (a sparse prefill's
 * dense tail, docs/prefill.md) is decided as for the whole prompt at once. Then the rest (or,
 * after kvp_ctx_truncate back to here and kvp_ctx_set_policy_keep, the rest with a policy:
 * several policies after one fill, eval/task_eval.c) goes through kvp_eval. */
int kvp_eval_prompt_head(kvp_ctx *c, const int32_t *tokens, int n, int rest, struct kvp_err *err);

#endif
