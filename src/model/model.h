/*
 * The in-memory model: hyperparameters, weight matrices (pointing into the file mapping) and the
 * vocabulary. Both GGUF files and llama2.c checkpoints load into this one struct, so a single
 * forward pass serves both (docs/formats.md §6.4).
 */
#ifndef KVP_MODEL_MODEL_H
#define KVP_MODEL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/matvec.h"
#include "kvpred.h"

struct kvp_gguf;
struct kvp_llama2c;
struct kvp_vocab;

enum kvp_rope_style {
    KVP_ROPE_NORM = 0, /* adjacent pairs (x[2i], x[2i+1]): GGUF llama, llama2.c */
    KVP_ROPE_NEOX = 2, /* split halves (x[i], x[i+d/2]): qwen2 */
};

struct kvp_hparams {
    int n_vocab;
    int n_embd;
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;
    int n_ff;
    int n_ctx_train;
    float norm_eps;
    float rope_base;
    int rope_style; /* enum kvp_rope_style */
    float rope_freq_scale; /* linear RoPE scaling: angles are multiplied by it (1 = none) */
};

struct kvp_layer_weights {
    const float *attn_norm;  /* [n_embd] */
    struct kvp_mat wq;       /* [n_head*hd rows][n_embd] */
    struct kvp_mat wk;       /* [n_head_kv*hd][n_embd] */
    struct kvp_mat wv;       /* [n_head_kv*hd][n_embd] */
    struct kvp_mat wo;       /* [n_embd][n_head*hd] */
    const float *ffn_norm;   /* [n_embd] */
    struct kvp_mat w_gate;   /* [n_ff][n_embd] */
    struct kvp_mat w_up;     /* [n_ff][n_embd] */
    struct kvp_mat w_down;   /* [n_embd][n_ff] */
    const float *bq, *bk, *bv, *bo; /* optional biases [q_dim], [kv_dim], [kv_dim], [n_embd] */
};

struct kvp_model {
    char arch[32];
    char name[128];
    struct kvp_hparams hp;
    struct kvp_mat tok_embd;         /* [n_vocab][n_embd] */
    const float *output_norm;        /* [n_embd] */
    struct kvp_mat output;           /* [n_vocab][n_embd]; equals tok_embd when tied */
    bool tied_output;
    const float *rope_freqs;          /* [head_dim/2] Llama 3.1 frequency factors, or NULL */
    struct kvp_layer_weights *layers; /* owned [n_layer] */
    struct kvp_vocab *vocab;          /* owned; may be NULL for a checkpoint without tokenizer */
    struct kvp_gguf *gguf;            /* owned when loaded from GGUF */
    struct kvp_llama2c *l2c;          /* owned when loaded from a llama2.c checkpoint */
};

/* Load from an already-open GGUF (takes ownership of g on success and on failure). */
int kvp_model_from_gguf(struct kvp_gguf *g, struct kvp_model **out, struct kvp_err *err);

#endif
