/*
 * Random-weight GGUF models with the tensor shapes of real ones (`kvpred synth`), so that speed
 * can be measured at the sizes people run without downloading anything. Every matrix has the
 * named model's exact shape; only the vocabulary is small by default (the embedding and the
 * classifier shrink with it), and the tokenizer is a byte-fallback SentencePiece vocabulary that
 * kvpred and llama.cpp both load. The weights are scaled so that activations stay finite at any
 * depth; the text they generate is noise.
 */
#ifndef KVP_MODEL_SYNTH_H
#define KVP_MODEL_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "kvpred.h"

/* A real model's shape (its config.json, as llama.cpp's converter writes it to GGUF). */
struct kvp_synth_shape {
    const char *name; /* "SmolLM2-135M" */
    const char *arch; /* "llama", "qwen2" (q/k/v biases), "qwen3" (q/k norms), "phi3" (fused),
                         "gemma2", "gemma3" (post-norms, sliding windows) */
    int n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int n_vocab;   /* the real vocabulary (kvp_synth_params.n_vocab may ask for it) */
    int n_ctx;     /* context_length */
    float rope_base, norm_eps;
    bool tied;     /* no output.weight: the embedding is the classifier */
    /* RoPE scaling as the model's config.json declares it: NULL (none), "linear", "yarn" or
     * "longrope" (factor tensors), with its factor and the original context length */
    const char *rope_scaling;
    float rope_factor;
    int n_ctx_orig;
    int sliding_window; /* attention.sliding_window, 0: none written */
    float attn_softcap, final_softcap; /* Gemma 2's soft-capping (0: none written) */
};

/* The shape called name (case-insensitive), or NULL. */
const struct kvp_synth_shape *kvp_synth_find_shape(const char *name);

/* Shape i for i < count, else NULL (for --help and tests). */
const struct kvp_synth_shape *kvp_synth_shape_at(int i);

#define KVP_SYNTH_MIN_VOCAB 320 /* 3 specials + 256 byte tokens + some letters */

struct kvp_synth_params {
    int type;        /* weight-matrix type, as kvpred quantize --type (fallbacks alike) */
    int n_layer;     /* layers to write; <= 0: the shape's */
    int n_vocab;     /* vocabulary size (>= KVP_SYNTH_MIN_VOCAB) */
    uint64_t seed;   /* the weights depend on it only, not on n_threads */
    int n_threads;   /* rows are generated and quantized on this many threads (<= 0: 1) */
};

/* Write the model to path (atomically, through the GGUF writer; all tensors are held in memory
 * until then). Returns 0 or a negative KVP_E* code with err filled in. */
int kvp_synth_write(const struct kvp_synth_shape *s, const struct kvp_synth_params *p,
                    const char *path, uint64_t *bytes_out, struct kvp_err *err);

#endif
