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
    KVP_ROPE_NEOX = 2, /* split halves (x[i], x[i+d/2]): qwen2, qwen3 */
};

/* The architectures the loader accepts (general.architecture). */
enum kvp_arch {
    KVP_ARCH_LLAMA = 0,
    KVP_ARCH_QWEN2, /* q/k/v biases, NEOX RoPE */
    KVP_ARCH_QWEN3, /* per-head RMS norm of q and k before RoPE, NEOX RoPE */
    KVP_ARCH_PHI3,  /* fused QKV and gate-up weights, LongRoPE factors, NEOX RoPE */
    KVP_ARCH_GEMMA2, /* sliding window on alternate layers, soft-capped scores and logits,
                        post-norms, embedding times sqrt(n_embd), GELU */
    KVP_ARCH_GEMMA3, /* gemma2 without soft-capping, 5 local : 1 global layers, q/k norms,
                        a RoPE base of its own for the local layers */
};

/* How the RoPE angles are stretched for contexts beyond the trained one (rope.scaling.type). */
enum kvp_rope_scaling {
    KVP_ROPE_SCALING_NONE = 0,
    KVP_ROPE_SCALING_LINEAR, /* every angle times rope_freq_scale */
    KVP_ROPE_SCALING_YARN,   /* per-dimension mix of scaled and unscaled angles, and cos/sin
                                scaled by an attention factor (model/rope.h) */
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
    int arch_id;           /* enum kvp_arch */
    int rope_scaling;      /* enum kvp_rope_scaling */
    int n_ctx_orig;        /* rope.scaling.original_context_length (YaRN's ramp; default
                              n_ctx_train) */
    float rope_attn_factor; /* rope.scaling.attn_factor (1 when absent) */
    float yarn_beta_fast, yarn_beta_slow; /* YaRN ramp ends, in rotations over n_ctx_orig */
    /* Gemma (zero / false elsewhere) */
    int n_swa;             /* attention.sliding_window: a local layer's query sees this many
                              positions, its own included */
    int swa_period;        /* layer l is local unless (l + 1) % swa_period == 0 (gemma3: 6);
                              2: layer l is local when l is even (gemma2); 0: no local layers */
    float rope_base_local; /* RoPE base of the local layers (gemma3: 10000; else rope_base) */
    float attn_softcap;    /* scores s -> c·tanh(s / c) before the softmax (0: none) */
    float final_softcap;   /* the same on the logits */
    float attn_scale;      /* scores are q·k times this (1/sqrt(head_dim) unless the model
                              says otherwise) */
    bool embd_scale;       /* embeddings times sqrt(n_embd) */
    bool gelu;             /* the gate goes through GELU (tanh form) instead of SiLU */
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
    const float *q_norm, *k_norm;   /* qwen3: per-head RMS norm weights [head_dim], or NULL */
    const float *attn_post_norm;    /* Gemma: RMS norm of the attention output [n_embd], NULL */
    const float *ffn_post_norm;     /* Gemma: RMS norm of the feed-forward output, or NULL */
};

/* Whether layer l of a model with these hyperparameters attends within a sliding window. */
static inline bool kvp_layer_is_local(const struct kvp_hparams *hp, int l)
{
    if (hp->n_swa <= 0 || hp->swa_period <= 0)
        return false;
    if (hp->swa_period == 2)
        return l % 2 == 0;
    return (l + 1) % hp->swa_period != 0;
}

struct kvp_model {
    char arch[32];
    char name[128];
    struct kvp_hparams hp;
    struct kvp_mat tok_embd;         /* [n_vocab][n_embd] */
    const float *output_norm;        /* [n_embd] */
    struct kvp_mat output;           /* [n_vocab][n_embd]; equals tok_embd when tied */
    bool tied_output;
    const float *rope_freqs;          /* [head_dim/2] Llama 3.1 frequency factors, or NULL */
    const float *rope_factors_short;  /* [head_dim/2] LongRoPE factors for contexts up to */
    const float *rope_factors_long;   /* n_ctx_orig tokens and beyond (phi3), or NULL */
    struct kvp_layer_weights *layers; /* owned [n_layer] */
    struct kvp_vocab *vocab;          /* owned; may be NULL for a checkpoint without tokenizer */
    struct kvp_gguf *gguf;            /* owned when loaded from GGUF */
    struct kvp_llama2c *l2c;          /* owned when loaded from a llama2.c checkpoint */
};

/* Load from an already-open GGUF (takes ownership of g on success and on failure). */
int kvp_model_from_gguf(struct kvp_gguf *g, struct kvp_model **out, struct kvp_err *err);

/* The chat format of m's own template (tokenizer.chat_template), or where the file has none (a
 * converted or synthetic file) its family's; KVP_CHAT_PLAIN for a template kvpred does not know
 * and for files without GGUF metadata. What `kvpred run --chat` and `kvpred serve` both use. */
int kvp_model_chat_format(const struct kvp_model *m);

#endif
