/*
 * RoPE's angle per dimension pair and the factor on cos and sin, from a model's hyperparameters
 * and the context length: plain RoPE, linear scaling, YaRN, and the per-pair frequency factors a
 * file may carry (Llama 3.1's rope_freqs). The forward pass turns them into cos/sin per row;
 * the angle of pair i at position p is p · inv_freq[i].
 */
#ifndef KVP_MODEL_ROPE_H
#define KVP_MODEL_ROPE_H

#include "model/model.h"

/* inv_freq[head_dim / 2] and *mscale (cos and sin are multiplied by it) for contexts of n_ctx
 * tokens; local: the sliding-window layers' own (Gemma 3: rope_base_local, no scaling). */
void kvp_rope_freqs(const struct kvp_model *m, int n_ctx, bool local, double *inv_freq,
                    double *mscale);

#endif
