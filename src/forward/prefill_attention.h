/*
 * Prefill attention: per KV head and chunk of 64 queries, the head's keys and values are
 * gathered into contiguous rows and two sgemm calls per query head compute scores and outputs
 * with the causal mask. When a policy asked for it, the last rows are copied out as its
 * observation window and every row is added into per-key column sums. With a sparse prefill
 * (sparse_prefill.h) a chunk gathers only the runs of keys chosen for it.
 */
#ifndef KVP_FORWARD_PREFILL_ATTENTION_H
#define KVP_FORWARD_PREFILL_ATTENTION_H

struct kvp_ctx;

/* Causal attention of the job's batch (ctx->q rows) for layer l into ctx->att. Every thread of
 * the pool calls it (ith: its scratch) and takes work items from the shared queue
 * c->sh->prefill_next, which the caller resets to 0 before a barrier that precedes the call. */
void kvp_attn_prefill_layer(struct kvp_ctx *c, int l, int ith);

#endif
