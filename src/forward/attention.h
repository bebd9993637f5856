/*
 * Attention over the block-paged KV cache.
 *
 * Decode: for each KV head, the query heads of its GQA group are scored against every cached
 * block (keys transposed in the block, SIMD over the block's tokens), a softmax turns the scores
 * into probabilities (kept in ctx->probs for the policies of later issues), and the value rows
 * are accumulated (SIMD over the head dimension). Threads split the KV heads. At long context this
 * kernel dominates decode time: it streams K and V once and touches nothing else.
 *
 * Prefill: per query head and chunk of 64 queries, the head's keys and values are gathered into
 * contiguous rows and two sgemm calls compute scores and outputs with the causal mask.
 */
#ifndef KVP_FORWARD_ATTENTION_H
#define KVP_FORWARD_ATTENTION_H

struct kvp_ctx;

/* Attention of one new token (position ctx->job_pos0) for layer l: q is [n_head*hd] after RoPE,
 * out receives [n_head*hd]. The token's K/V are already in the cache. */
void kvp_attn_decode_layer(struct kvp_ctx *c, int l, const float *q, float *out, int ith, int nth);

/* Causal attention of the job's batch (ctx->q rows) for layer l into ctx->att. */
void kvp_attn_prefill_layer(struct kvp_ctx *c, int l, int ith, int nth);

/* Dense decode attention of one KV head group over blocks [0, n_blocks) holding n_keys tokens:
 * q is g heads × hd, probs g × n_keys (output probabilities), out g × hd. */
void kvp_attn_decode_group(const struct kvp_ctx *c, int l, int kvh, const float *q, int g,
                           int n_keys, float *probs, int probs_stride, float *out);

#endif
