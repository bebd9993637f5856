/*
 * kvpred: a long-context LLM inference engine built around sparse KV-cache attention.
 *
 * This is the public API of libkvpred. It loads a model (GGUF, or a llama2.c checkpoint with its
 * tokenizer.bin), tokenizes text, runs batched prefill and single-token decode over a block-paged
 * KV cache, and samples. Every function that can fail returns 0 or a negative KVP_E* code and
 * fills a caller-owned struct kvp_err with one line that names the problem. The library never
 * prints, never calls exit(), and never trusts a file.
 *
 * Ownership: objects returned through `**out` are owned by the caller and released with the
 * matching *_close / *_free function, which accepts NULL.
 */
#ifndef KVPRED_H
#define KVPRED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_VERSION "0.1.0"

/* ---- errors ------------------------------------------------------------------------------- */

enum kvp_status {
    KVP_OK = 0,
    KVP_EIO = -1,          /* open/read/write/mmap failed */
    KVP_EFORMAT = -2,      /* a file is malformed, truncated or hostile */
    KVP_ENOMEM = -3,       /* allocation failed or a size would overflow */
    KVP_EUNSUPPORTED = -4, /* valid but not supported (architecture, tensor type, ...) */
    KVP_EINVAL = -5,       /* bad argument from the caller */
    KVP_ERANGE = -6,       /* a value is out of its allowed range (prompt longer than context) */
    KVP_ENOTFOUND = -7,    /* a key, tensor or token that was asked for does not exist */
};

struct kvp_err {
    int code;       /* last KVP_E* code */
    char msg[512];  /* one line, no trailing newline */
};

const char *kvp_strerror(int code);

/* ---- tensor types (ids are the GGUF on-disk ids) ------------------------------------------ */

enum kvp_type {
    KVP_TYPE_F32 = 0,
    KVP_TYPE_F16 = 1,
    KVP_TYPE_Q4_0 = 2,
    KVP_TYPE_Q4_1 = 3,
    KVP_TYPE_Q5_0 = 6,
    KVP_TYPE_Q5_1 = 7,
    KVP_TYPE_Q8_0 = 8,
    KVP_TYPE_Q8_1 = 9,
    KVP_TYPE_Q2_K = 10,
    KVP_TYPE_Q3_K = 11,
    KVP_TYPE_Q4_K = 12,
    KVP_TYPE_Q5_K = 13,
    KVP_TYPE_Q6_K = 14,
    KVP_TYPE_Q8_K = 15,
    KVP_TYPE_BF16 = 30,
    KVP_TYPE_COUNT = 43,
};

/* ---- model -------------------------------------------------------------------------------- */

typedef struct kvp_model kvp_model;

struct kvp_model_params {
    const char *tokenizer_path; /* llama2.c checkpoints only: tokenizer.bin (NULL: none) */
};

/* Open a model file. GGUF is recognised by its magic; anything else is read as a llama2.c
 * checkpoint. Weights stay in the read-only mapping. */
int kvp_model_open(const char *path, const struct kvp_model_params *params, kvp_model **out,
                   struct kvp_err *err);
void kvp_model_close(kvp_model *model);

struct kvp_model_info {
    const char *arch;   /* "llama" */
    const char *name;   /* general.name or the file name */
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx_train;
    float norm_eps, rope_base;
    bool tied_output;   /* classifier is token_embd */
    uint64_t n_params;  /* weights, excluding tokenizer */
    uint64_t weight_bytes;
    int weight_type;    /* the most common matrix type (enum kvp_type) */
};
void kvp_model_get_info(const kvp_model *model, struct kvp_model_info *info);

/* ---- tokenizer ---------------------------------------------------------------------------- */

int kvp_token_bos(const kvp_model *model);
int kvp_token_eos(const kvp_model *model);
/* True for tokens that end generation (EOS, EOT, ...). */
bool kvp_token_is_eog(const kvp_model *model, int token);

/* Tokenize text (len bytes, not NUL-terminated). Writes at most cap ids into ids and the true
 * count into *n_out; returns KVP_ERANGE (with *n_out set) if cap is too small. */
int kvp_tokenize(const kvp_model *model, const char *text, size_t len, bool add_bos, int32_t *ids,
                 size_t cap, size_t *n_out, struct kvp_err *err);

/* Text of one token for streaming output. Byte tokens yield their raw byte, so a multi-byte
 * character may arrive in pieces; `prev` is the previous token (or -1) so the SentencePiece
 * leading space after BOS is dropped as llama2.c does. Returns the number of bytes written
 * (truncated to cap, not NUL-terminated). */
size_t kvp_token_to_piece(const kvp_model *model, int prev, int token, char *buf, size_t cap);

/* ---- inference context -------------------------------------------------------------------- */

typedef struct kvp_ctx kvp_ctx;

struct kvp_ctx_params {
    int n_ctx;        /* KV capacity in tokens (0: the model's training context) */
    int n_threads;    /* worker threads including the caller (0: 1) */
    int block_size;   /* KV block size in tokens (0: 16) */
    int n_batch;      /* prefill micro-batch in tokens (0: 512) */
};

int kvp_ctx_init(const kvp_model *model, const struct kvp_ctx_params *params, kvp_ctx **out,
                 struct kvp_err *err);
void kvp_ctx_free(kvp_ctx *ctx);

/* Forget every cached token. */
void kvp_ctx_reset(kvp_ctx *ctx);
/* Drop every cached token at position >= n (n <= the current count). */
void kvp_ctx_truncate(kvp_ctx *ctx, int n);
/* Tokens currently in the cache (the position of the next token). */
int kvp_ctx_n_tokens(const kvp_ctx *ctx);
int kvp_ctx_n_ctx(const kvp_ctx *ctx);

/* Run n tokens through the model at positions n_tokens .. n_tokens+n-1 and append them to the
 * KV cache. If logits is not NULL it receives n_vocab floats: for every token when all_logits is
 * true ([n][n_vocab]), otherwise only for the last token. KVP_ERANGE if the cache would
 * overflow. */
int kvp_eval(kvp_ctx *ctx, const int32_t *tokens, int n, float *logits, bool all_logits,
             struct kvp_err *err);

/* ---- sampling ----------------------------------------------------------------------------- */

typedef struct kvp_sampler kvp_sampler;

struct kvp_sampler_params {
    float temperature;     /* <= 0: greedy */
    int top_k;             /* <= 0: off */
    float top_p;           /* >= 1: off */
    float repeat_penalty;  /* 1: off */
    int repeat_last_n;     /* tokens the penalty looks back over */
    uint64_t seed;
};

int kvp_sampler_init(const struct kvp_sampler_params *params, int n_vocab, kvp_sampler **out,
                     struct kvp_err *err);
void kvp_sampler_free(kvp_sampler *s);
/* Pick the next token from logits (modified in place by the penalty and temperature). */
int kvp_sampler_sample(kvp_sampler *s, float *logits);
/* Record a token for the repetition penalty. */
void kvp_sampler_accept(kvp_sampler *s, int token);

#ifdef __cplusplus
}
#endif
#endif
