/*
 * Attention of the layers the KV step (kv_step.h) does not run: sliding-window layers (Gemma's
 * local layers: a query at position p sees positions p - n_swa + 1 .. p; soft-capped on Gemma 2,
 * s -> c·tanh(s / c) before the softmax) and layers whose scores are scaled otherwise than by
 * 1/sqrt(head_dim) (the Gemma 27B models). Dense over the visible keys, prefill and decode
 * alike, for every sequence of the pass; no policy hook is ever called for these layers (a
 * local layer's keys are bounded by its window, so there is nothing to select or evict).
 * Soft-capped global layers (Gemma 2) run in the KV step, whose kernels cap (kvcache.h,
 * score_cap), so policies select on them.
 */
#ifndef KVP_FORWARD_LOCAL_ATTENTION_H
#define KVP_FORWARD_LOCAL_ATTENTION_H

#include <stdbool.h>

#include "model/model.h"

struct kvp_shared;

/* Whether layer l of a model with these hyperparameters runs here rather than in kv_step. */
bool kvp_local_attn_wants(const struct kvp_hparams *hp, int l);

/* Layer l for every sequence of the pass: K and V of the rows into each cache, then attention
 * into each sequence's rows of sh->att. Called by every pool thread; ends without a barrier. */
void kvp_local_attn_layer(struct kvp_shared *sh, int l, int ith, int nth);

#endif
