/*
 * kvpred: a long-context LLM inference engine built around sparse KV-cache attention.
 *
 * This is the public API of libkvpred. It loads a model (GGUF, or a llama2.c checkpoint with its
 * tokenizer.bin), tokenizes text, runs batched prefill and single-token decode over a block-paged
 * KV cache, and samples. Every function that can fail returns 0 or a negative KVP_E* code and
 * fills a caller-owned struct kvp_err with one line that names the problem. The library never
 * prints (its few notices go to the caller's kvp_set_log function), never calls exit(), and never
 * trusts a file.
 *
 * Ownership: objects returned through `**out` are owned by the caller and released with the
 * matching *_close / *_free function, which accepts NULL.
 *
 * This header holds what a program that generates text needs. Measuring and tuning (the dense
 * attention behind a sparse step, recovery, the tiered store's statistics and timeline) are in
 * kvpred_lab.h, which includes this one.
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
    KVP_EKVLOST = -8,      /* a tiered KV cache lost data (a cold read or write failed for good,
                              a checksum did not match, a unit was lost): every later call on the
                              context fails the same way until it is reset or truncated to
                              kvp_ctx_trusted_tokens() */
};

struct kvp_err {
    int code;       /* last KVP_E* code */
    char msg[512];  /* one line, no trailing newline */
};

const char *kvp_strerror(int code);

/* Notices that are not errors (one line each, no trailing newline): e.g. which IO path the disk
 * KV tier took, said once per process. The library calls fn(user, line) from whatever thread
 * noticed it; fn must be thread-safe. NULL (the default) drops them. Set it before other calls. */
typedef void (*kvp_log_fn)(void *user, const char *line);
void kvp_set_log(kvp_log_fn fn, void *user);

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
    bool no_mmap;               /* GGUF: read the file into memory on huge pages instead of
                                   mapping it (decode from unpacked weights ~5% faster; private
                                   memory as large as the file) */
};

/* Open a model file. GGUF is recognised by its magic; anything else is read as a llama2.c
 * checkpoint. Weights stay in the read-only mapping (or, no_mmap, the copy). */
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

/* As kvp_tokenize, with control-token texts (chat markers such as <|im_start|>) split out as
 * their ids when parse_special is true. */
int kvp_tokenize_special(const kvp_model *model, const char *text, size_t len, bool add_bos,
                         bool parse_special, int32_t *ids, size_t cap, size_t *n_out,
                         struct kvp_err *err);

/* Wrap a user message (and an optional system message) in the model's chat template, detected
 * from tokenizer.chat_template (ChatML, Llama 3, Llama 2/Mistral, Zephyr, Phi-3, Gemma; plain
 * text otherwise), ending with the assistant prompt. format_name forces a format ("chatml",
 * "llama3", ...; NULL: detect). *text is malloc'd; tokenize it with parse_special. */
int kvp_chat_prompt(const kvp_model *model, const char *format_name, const char *system,
                    const char *user, char **text, size_t *len, struct kvp_err *err);

/* Text of one token for streaming output. Byte tokens yield their raw byte, so a multi-byte
 * character may arrive in pieces; `prev` is the previous token (or -1) so the SentencePiece
 * leading space after BOS is dropped as llama2.c does. Returns the number of bytes written
 * (truncated to cap, not NUL-terminated). */
size_t kvp_token_to_piece(const kvp_model *model, int prev, int token, char *buf, size_t cap);

/* ---- inference context -------------------------------------------------------------------- */

typedef struct kvp_ctx kvp_ctx;

struct kvp_prefill_params;    /* below: prefill attention */
struct kvp_disk_ring_params; /* kvpred_lab.h: tuning the disk tier's io_uring */

struct kvp_ctx_params {
    int n_ctx;        /* KV capacity in tokens (0: the model's training context) */
    int n_threads;    /* worker threads including the caller (0: 1) */
    int block_size;   /* KV block size in tokens (0: 16) */
    int n_batch;      /* prefill micro-batch in tokens (0: 512) */
    /* tiered KV store (all off by default: kv_tier 0 keeps the whole cache in RAM, untiered) */
    int kv_tier;          /* enum kvp_kv_tier [KVP_TIER_NONE] */
    const char *kv_dir;   /* disk tier: directory of the scratch file [$TMPDIR or /tmp] */
    const char *kv_url;   /* redis tier: redis://HOST:PORT[,HOST:PORT...][?OPTION=N&...]
                             (one server, or seed nodes of a Redis Cluster; options timeout_ms,
                             ttl_ms, failover_ms, pipeline, wait_replicas: docs/store.md) */
    int hot_budget;       /* hot-tier tokens per compressed layer, rounded up to blocks
                             [0: sized from the policy budget so a step always fits] */
    int prefetch;         /* enum kvp_prefetch [KVP_PREFETCH_TOKEN] */
    double link_gbps;     /* RAM tier: model a link of this bandwidth in GB/s [0: off] */
    double link_latency_us; /* RAM tier: and this latency per transfer in µs [0] */
    /* disk tier: how io_uring submits reads (kvpred_lab.h; copied at creation) [NULL: a
       polling kernel thread where the kernel allows, on the CPU the kernel chooses] */
    const struct kvp_disk_ring_params *kv_ring;
    int kv_disk_io;         /* disk tier: enum kvp_disk_io [AUTO: io_uring, else a pool of pread
                               threads; the environment variable KVP_DISK_IO=io_uring|pread
                               chooses when this is AUTO] */
    /* element types of the cached keys and values (enum kvp_kv_type) [KVP_KV_F16, as llama.cpp] */
    int type_k;
    int type_v;
    /* true: decode reads the weights as the file has them. false (the default): where the CPU
       has the kernel (AVX-512 VNNI; Q8_0, Q4_0, Q5_0 and Q4_K matrices), the first decode step
       packs them once into a copy laid out for the SIMD lanes, as many bytes as they take in the
       file, which decode reads 1.3-1.4x faster (docs/batched.md); prefill keeps reading the
       file's. A sequence of an engine follows kvp_engine_params.no_pack instead. */
    bool no_pack;
    /* how prompts attend (kvp_ctx_set_prefill at creation; copied) [NULL: dense] */
    const struct kvp_prefill_params *prefill;
};

/* Element type of the KV cache (kvp_ctx_params.type_k / type_v). Keys and values are stored in
 * this type and read back by every attention kernel and policy; all arithmetic stays f32. */
enum kvp_kv_type {
    KVP_KV_DEFAULT = 0, /* f16 */
    KVP_KV_F32 = 1,
    KVP_KV_F16 = 2,  /* IEEE half */
    KVP_KV_BF16 = 3, /* bfloat16 */
    KVP_KV_Q8_0 = 4, /* int8 with one f16 scale per 32 elements of a token's head vector */
    KVP_KV_COUNT
};

/* "f32", "f16", "bf16", "q8_0" (the default resolved to f16); "?" for an unknown value. */
const char *kvp_kv_type_name(int type);
/* The type named (the names above, any case), or -1. */
int kvp_kv_type_parse(const char *name);
/* Bytes the KV cache holds per token for a model (keys and values of every layer and KV head,
 * block padding included) with these types and block size (0: the defaults). */
size_t kvp_kv_bytes_per_token(const kvp_model *model, int type_k, int type_v, int block_size);
/* The types a context stores its keys and values in. */
int kvp_ctx_kv_type_k(const kvp_ctx *ctx);
int kvp_ctx_kv_type_v(const kvp_ctx *ctx);

/* Where the whole KV cache lives when it is tiered (kvp_ctx_params.kv_tier). */
enum kvp_kv_tier {
    KVP_TIER_NONE = 0, /* no tiering: the whole cache is fast memory (the default) */
    KVP_TIER_RAM = 1,  /* cold tier in RAM, copied by a transfer thread */
    KVP_TIER_DISK = 2, /* cold tier in an unnamed O_DIRECT file read through io_uring */
    KVP_TIER_REDIS = 3, /* cold tier on a Redis server or Redis Cluster (kv_url), through
                           pipelined hiredis requests; only when built with hiredis */
};

/* How the disk tier moves its units (kvp_ctx_params.kv_disk_io). */
enum kvp_disk_io {
    KVP_DISK_IO_AUTO = 0,    /* io_uring; a pool of pread/pwrite threads where it is refused */
    KVP_DISK_IO_URING = 1,   /* io_uring only: a refusal is an error */
    KVP_DISK_IO_PREAD = 2,   /* the pread/pwrite thread pool */
};

/* How the hot tier is filled (kvp_ctx_params.prefetch). */
enum kvp_prefetch {
    KVP_PREFETCH_DEFAULT = 0, /* token */
    KVP_PREFETCH_NONE = 1,    /* fetch missing selected blocks on demand, synchronously */
    KVP_PREFETCH_DENSE = 2,   /* fetch the whole cache every step (offloading baseline) */
    KVP_PREFETCH_LAYER = 3,   /* while layer l computes, fetch layer l+1's predicted blocks */
    KVP_PREFETCH_TOKEN = 4,   /* after layer l of token t, fetch its predicted blocks of t+1 */
};

int kvp_ctx_init(const kvp_model *model, const struct kvp_ctx_params *params, kvp_ctx **out,
                 struct kvp_err *err);
void kvp_ctx_free(kvp_ctx *ctx);

/* Pack the weights for decode now rather than at the first decode token (kvp_ctx_params.no_pack;
 * a sequence of an engine packs the engine's). Returns the bytes of the packed copy, 0 with
 * no_pack or where the CPU has no kernel for the weights' type. */
size_t kvp_ctx_pack_weights(kvp_ctx *ctx);

/* Forget every cached token. */
void kvp_ctx_reset(kvp_ctx *ctx);
/* Drop every cached token at position >= n (n <= the current count). On a model with
 * sliding-window layers, whose rings have already given up the keys a cut that far back would
 * need, it drops every token instead (kvp_ctx_n_tokens() then says 0): evaluating from the cut
 * would read keys that are gone. */
void kvp_ctx_truncate(kvp_ctx *ctx, int n);
/* Whether kvp_ctx_truncate(ctx, n) keeps the tokens before n (false where it would drop them
 * all: sliding-window rings already past the cut). */
bool kvp_ctx_truncate_keeps(const kvp_ctx *ctx, int n);
/* Tokens currently in the cache (the position of the next token). */
int kvp_ctx_n_tokens(const kvp_ctx *ctx);
/* Leading tokens whose KV can be trusted: kvp_ctx_n_tokens() unless a tiered cache lost data
 * (KVP_EKVLOST); truncating to this count (or resetting) makes the context usable again, and
 * evaluating the dropped tokens again rewrites what was lost. */
int kvp_ctx_trusted_tokens(const kvp_ctx *ctx);
int kvp_ctx_n_ctx(const kvp_ctx *ctx);

/* Run n tokens through the model at positions n_tokens .. n_tokens+n-1 and append them to the
 * KV cache. If logits is not NULL it receives n_vocab floats: for every token when all_logits is
 * true ([n][n_vocab]), otherwise only for the last token. KVP_ERANGE if the cache would
 * overflow. */
int kvp_eval(kvp_ctx *ctx, const int32_t *tokens, int n, float *logits, bool all_logits,
             struct kvp_err *err);

/* ---- many sequences: an engine and its sequences ------------------------------------------ */

/* An engine runs many sequences over one model: it owns the thread pool and the buffers of one
 * forward pass, and each step evaluates tokens of several sequences at once, reading every
 * weight matrix once for all of them. A sequence (kvp_seq) is a kvp_ctx that borrows the
 * engine's threads and buffers: it owns only its KV cache, its policy and its tier, so it is
 * cheap to create, and every kvp_ctx_* function applies to it (kvp_ctx_set_policy,
 * kvp_ctx_truncate, kvp_ctx_store_stats, ...; kvp_eval runs it alone). Each sequence has its
 * own context size, KV types, tier (kv_tier, kv_dir, kv_url), hot budget and policy.
 *
 * One engine runs one call at a time: no two calls on an engine or its sequences may overlap.
 * Free the sequences (kvp_ctx_free) before the engine. */
typedef struct kvp_engine kvp_engine;
typedef struct kvp_ctx kvp_seq;
struct kvp_policy_params; /* below */

struct kvp_engine_params {
    int n_threads; /* worker threads including the caller (0: 1) */
    int n_batch;   /* most tokens of all sequences in one step (0: 512) */
    int n_ctx;     /* largest context of any of its sequences (0: the model's training context) */
    bool exact;    /* true: each sequence's logits are bit for bit those of a step of its own;
                      false (faster): the decode tokens of a step go through the batch kernels
                      together once there are a few of them, and then differ from a lone step's
                      by float summation order only, as prefill differs from decode */
    bool no_pack;  /* kvp_ctx_params.no_pack, for all of the engine's sequences */
};

int kvp_engine_init(const kvp_model *model, const struct kvp_engine_params *params,
                    kvp_engine **out, struct kvp_err *err);
void kvp_engine_free(kvp_engine *engine);

/* Bytes of the weights the engine has packed for decode (docs/batched.md): 0 until its first
 * step with a decode token, which packs them once (so an engine that only prefills never pays
 * that memory), and 0 with no_pack or where the CPU has no kernel for the weights' type. */
size_t kvp_engine_packed_bytes(const kvp_engine *engine);
/* Pack them now rather than at the first decode token (a server before its first request, a
 * benchmark before its timed steps); nothing with no_pack or where already packed. Returns the
 * bytes packed (kvp_engine_packed_bytes). */
size_t kvp_engine_pack_weights(kvp_engine *engine);

/* A new, empty sequence of the engine with these cache parameters (n_threads and n_batch are
 * the engine's and ignored here; n_ctx 0: the engine's n_ctx, larger: KVP_EINVAL). Attach a
 * policy with kvp_ctx_set_policy; free with kvp_ctx_free. */
int kvp_seq_init(kvp_engine *engine, const struct kvp_ctx_params *params, kvp_seq **out,
                 struct kvp_err *err);

/* One sequence's tokens in a step. A decode step is one token; a prompt may come in pieces
 * over several steps (next to other sequences' decoding): each piece says how many prompt
 * tokens are still to come after it (prompt_rest), so that policies which look at the whole
 * prompt (snapkv, h2o, ...) see it when the last piece has run. logits, when not NULL,
 * receives n_vocab floats for the item's last token, or for each of its tokens with
 * all_logits ([n][n_vocab]). */
struct kvp_batch_item {
    kvp_seq *seq;
    const int32_t *tokens;
    int n;
    int prompt_rest;
    float *logits;
    bool all_logits;
};

/* One step: the tokens of items[0..n_items) (distinct sequences of this engine, n >= 1 each,
 * at most n_batch tokens in all) go through the model at once, each sequence at its own
 * positions, against its own cache, with its own policy and tier; each sequence's logits are
 * what it would get in a step of its own (bit for bit with kvp_engine_params.exact,
 * tests/test_batch.c; else up to float summation order). A sequence whose
 * policy has evicted tokens takes one token per item (KVP_EINVAL otherwise). Errors name the
 * item; on a validation error nothing ran. */
int kvp_batch_eval(kvp_engine *engine, const struct kvp_batch_item *items, int n_items,
                   struct kvp_err *err);

/* Make dst hold the first n tokens of src's cache (n <= kvp_ctx_n_tokens(src)), as if dst had
 * evaluated them: dst is reset first, then the keys and values are copied (whatever the tiers
 * of the two). Both must be sequences (or contexts) of the same model with the same KV types
 * and block size, and their policies must not keep per-token state from the prompt
 * (KVP_EUNSUPPORTED names the policy: full, streaming, quest, oracle and random qualify), nor
 * may src have evicted tokens. Two questions about one document: prefill it once, copy it into
 * a second sequence, then append each question. */
int kvp_seq_copy(kvp_seq *dst, kvp_seq *src, int n, struct kvp_err *err);

/* Grow ctx's cache from the n_tokens it holds (a prompt prefilled for real, at least two
 * blocks) to n tokens without a forward pass, for measuring long contexts quickly: positions
 * n_tokens.. repeat the keys and values of positions [block_size, n_tokens), each key turned by
 * RoPE from its source position to its new one (values copied), so the cache has the structure
 * real keys have. The policy sees the result as the end of a prompt of n tokens (its block
 * metadata covers all of them) without attention rows; evaluate a few real tokens after it for
 * a policy that learns from those. Works on every KV type and tier. KVP_EUNSUPPORTED for
 * evicting policies or evicted tokens, KVP_ERANGE past the context (src/forward/tile.c). */
int kvp_ctx_fill_tile(kvp_ctx *ctx, int n, struct kvp_err *err);

/* A new sequence of the engine with src's cache parameters and policy (policy, when not NULL:
 * the parameters src's policy was set with; NULL: no policy) holding a copy of src's tokens
 * (kvp_seq_copy's conditions). */
int kvp_seq_fork(kvp_engine *engine, kvp_seq *src, const struct kvp_policy_params *policy,
                 kvp_seq **out, struct kvp_err *err);

/* KV memory of a sequence: bytes held in RAM for its cache (physical blocks of an untiered cache;
 * the hot tier and staging area of a tiered one) and bytes in its cold tier (0 untiered). */
void kvp_seq_kv_bytes(const kvp_seq *seq, size_t *resident, size_t *cold);

/* ---- KV selection policies ------------------------------------------------------------- */

enum kvp_gqa_agg {
    KVP_AGG_MEAN = 0, /* the default: average the query heads' probabilities */
    KVP_AGG_MAX = 1,  /* combine the query heads of a GQA group by the max */
    KVP_AGG_SUM = 2,
};

/* Parameters of a selection policy; zero fields take the defaults in brackets. */
struct kvp_policy_params {
    const char *name;    /* "full", "streaming", "h2o", "snapkv", "pyramidkv", "quest",
                            "oracle", "oracle_token", "random", ... [full] */
    int budget;          /* tokens per (layer, KV head), sink and local included [0: all] */
    float budget_ratio;  /* when budget is 0 and this is in (0, 1]: ratio of the context */
    int sink;            /* leading tokens always kept [16] */
    int local;           /* most recent tokens always kept [16] */
    int window;          /* observation window of prompt-time policies [32] */
    int pool;            /* SnapKV pooling kernel, odd [5] */
    int pool_max;        /* 1: max pooling, 0: average [0] */
    int dense_layers;    /* leading layers that always run dense [2]; -1 means 0 */
    int gqa_agg;         /* enum kvp_gqa_agg [KVP_AGG_MEAN] */
    int normalize;       /* h2o: 1 divides accumulated attention by the queries that saw the
                            key (kvpress ObservedAttention) [0] */
    uint64_t seed;       /* random policies [0] */
    const char *aux_path;/* a file the policy needs (predictor weights, head profile) */
    const char *opts;    /* policy-specific "key=value,..." options: the keys of the policy's
                            option table (kvpred run --help lists them) */
    /* ---- catekv (docs/methods.md §2): sink = S, local = R, budget = B per consistent KV
       head, window = w; dense_layers is ignored (every layer alike) ---- */
    float adaptive_ratio;/* r, fraction of adaptive KV heads [0.4]; < 0 means 0, >= 1 all */
    int adaptive_mode;   /* enum kvp_adaptive_mode [KVP_ADAPTIVE_FULL] */
    float eta;           /* η, fraction of middle chunks an adaptive head keeps
                            [1 for full/quest, 0.5 for fraction] */
    int chunk;           /* c, chunk size in tokens [8] */
    int tail_tokens;     /* unchunked prompt tail (upstream's hidden 32) [32]; < 0 means 0 */
    float percentile;    /* k, binarization quantile in (0.5, 1) [0.995] */
    float alpha;         /* α, binarization interpolation in [0, 1] [1.0]; < 0 means 0 */
    const char *head_profile; /* static classification file (kvpred profile-heads); NULL:
                                 classify every prompt (dynamic) */
};

/* How CateKV's adaptive heads decode (docs/methods.md §2.6). */
enum kvp_adaptive_mode {
    KVP_ADAPTIVE_FULL = 0,     /* the whole cache */
    KVP_ADAPTIVE_FRACTION = 1, /* sink + the top η of the middle chunks + tail, fixed */
    KVP_ADAPTIVE_QUEST = 2,    /* the η-cache, read through Quest page selection each step */
    KVP_ADAPTIVE_PREDICTOR = 3,/* AttentionPredictor on the adaptive heads only */
};

/* Attach a policy to the context (replacing any previous one; NULL: full attention) and clear
 * the cache. Unknown names give KVP_EINVAL with the list of policies. */
int kvp_ctx_set_policy(kvp_ctx *ctx, const struct kvp_policy_params *params,
                       struct kvp_err *err);

/* Attach a policy as kvp_ctx_set_policy does, but keep the cached tokens: the policy sees them
 * as a prompt that has just ended, as a copy shows them (kvp_seq_copy), without the prompt's
 * attention rows or last query; a policy that learns from those (qpredictor, predictor; quest
 * keeps the last query) gets them by evaluating the prompt's last tokens again: truncate them
 * away first, attach, then kvp_eval them. Decoding from there is decoding after a prompt that
 * ended in that piece with the policy set from the start. So several policies decode from one
 * fill of a long cache, each after truncating back to the fill. KVP_EUNSUPPORTED for evicting
 * policies, tiered caches and caches that gave up keys (evicted tokens, sliding-window rings);
 * NULL params: no policy, dense attention. */
int kvp_ctx_set_policy_keep(kvp_ctx *ctx, const struct kvp_policy_params *params,
                            struct kvp_err *err);

/* Name of the policy registered at index i, or NULL past the end. */
const char *kvp_policy_name(int i);

/* Seconds spent inside the policy's per-step hooks (select, on_step) since the policy was set
 * or the last kvp_ctx_policy_reset_seconds, summed over KV heads (thread time: wall time with
 * one thread); 0 without a policy. */
double kvp_ctx_policy_seconds(const kvp_ctx *ctx);
/* The same in CPU time of the threads that ran the hooks (steadier on a shared host). */
double kvp_ctx_policy_cpu_seconds(const kvp_ctx *ctx);
void kvp_ctx_policy_reset_seconds(kvp_ctx *ctx);
/* Since the same reset: the tokens the policy's selections let attention read and the number of
 * selections (one per decode step, compressed layer and KV head; dense layers read every key
 * without one). Both 0 without a policy. */
void kvp_ctx_policy_reads(const kvp_ctx *ctx, double *tokens, double *selects);

/* Measuring dense attention and recovery: kvpred_lab.h. */

/* KV memory now: bytes of physical blocks holding live tokens (resident) and bytes of the live
 * tokens themselves (kept). */
void kvp_ctx_kv_bytes(const kvp_ctx *ctx, size_t *resident, size_t *kept);

/* Models with sliding-window layers (Gemma 2 and 3): kvp_ctx_kv_bytes' resident bytes split
 * into those of the sliding-window layers (their rings) and those of the other layers. */
void kvp_ctx_kv_bytes_by_kind(const kvp_ctx *ctx, size_t *windowed, size_t *global);
/* Wall seconds of the attention phase of the sliding-window layers and of the other layers
 * (writing K and V, the policy's selection and hooks, attention, up to the threads' meeting
 * after it), summed over the forward passes the context took part in since it was created or
 * the last kvp_ctx_reset_attention_seconds. A model without sliding-window layers has all of
 * it in global. */
void kvp_ctx_attention_seconds(const kvp_ctx *ctx, double *windowed, double *global);
void kvp_ctx_reset_attention_seconds(kvp_ctx *ctx);

/* ---- prefill attention -------------------------------------------------------------------- */

/* How a prompt's queries attend to the keys before them (docs/prefill.md). Dense reads every
 * earlier key; the block-sparse policies read, for each KV head and block of 64 queries, the
 * sink, a local window and the key blocks an estimate ranks highest, up to a budget. They differ
 * only in the estimate. */
enum kvp_prefill_policy {
    KVP_PREFILL_DENSE = 0,   /* every earlier key (the default) */
    KVP_PREFILL_POOLED = 1,  /* mean query of the block · mean key of each key block (the
                                recommended sparse estimate: "sparse" names it) */
    KVP_PREFILL_BOUND = 2,   /* mean query's upper bound over each key block's element-wise key
                                max and min (quest's bound) */
    KVP_PREFILL_STRIDED = 3, /* exact scores of every 16th query of the block against every
                                key, summed per key block (dearer: it reads every key) */
    KVP_PREFILL_LEARNED = 4, /* a learned gate per (layer, KV head) over each key block's mean,
                                max and min key and its distance (params.gate) */
    KVP_PREFILL_COUNT
};

struct kvp_prefill_params {
    int policy;          /* enum kvp_prefill_policy */
    int budget;          /* keys one query block may read, sink and window included (0: from
                            budget_ratio) */
    double budget_ratio; /* that budget as a fraction of the keys the block sees [1/16] */
    double threshold;    /* stop adding key blocks once the estimate's attention mass they and
                            the forced ones cover reaches this, in (0, 1] (0: off: the whole
                            budget) */
    int block;           /* tokens per key block the estimate ranks, a multiple of the cache's
                            block size [64] */
    int sink;            /* leading tokens every query reads [64; < 0: none] */
    int window;          /* tokens before a query block that it always reads [256; < 0: none] */
    int dense_tail;      /* the last tokens of a kvp_eval's prompt (the question) attend
                            densely [256; < 0: none] */
    int min_keys;        /* a query block that sees fewer keys reads them all (the crossover
                            below which sparse does not pay) [2048; < 0: 0] */
    const struct kvp_prefill_gate *gate; /* learned: the gate (kvp_prefill_gate_load; copied by
                                            kvp_ctx_set_prefill, so it may be freed after) */
};

/* A learned prefill gate, from a .kvpg file (docs/formats.md; `kvpred train-prefill-gate` writes
 * them). KVP_EFORMAT with one line for a malformed file. */
struct kvp_prefill_gate;
int kvp_prefill_gate_load(const char *path, struct kvp_prefill_gate **out, struct kvp_err *err);
void kvp_prefill_gate_free(struct kvp_prefill_gate *gate);

/* Names of the policies ("dense", "pooled", "bound", "strided", "learned"), NULL past the end; parse gives
 * the policy of a name or of "sparse" (the recommended estimate), -1 for an unknown one. */
const char *kvp_prefill_policy_name(int policy);
int kvp_prefill_policy_parse(const char *name);
/* The policy that "sparse" names. */
#define KVP_PREFILL_SPARSE KVP_PREFILL_POOLED

/* Set how later prompts attend (NULL: dense). Allocates the estimate's per-block statistics
 * (for pooled: one f32 head vector per block of 64 keys and (layer, KV head), 1/64 of an f32
 * cache's keys; bound twice that). KVP_EINVAL for a value out of range. Resets the statistics
 * (kvpred_lab.h). */
int kvp_ctx_set_prefill(kvp_ctx *ctx, const struct kvp_prefill_params *params,
                        struct kvp_err *err);

/* Called by kvp_eval after each piece of a prompt of more than one piece (n_batch tokens): done
 * of total tokens evaluated. NULL turns it off. Runs on the caller's thread, between pieces. */
typedef void (*kvp_progress_fn)(void *user, int done, int total);
void kvp_ctx_set_progress(kvp_ctx *ctx, kvp_progress_fn fn, void *user);
/* The tokens in the cache, counting a piece that kvp_eval or kvp_batch_eval is evaluating now
 * by the layers it has done (a 512-token piece halfway through the layers counts 256): for a
 * progress report polled from ANOTHER thread (it reads one atomic counter, updated once per
 * layer), where the callback above runs only between pieces on the caller's thread. */
double kvp_ctx_progress_tokens(const kvp_ctx *ctx);

/* ---- tiered KV store ---------------------------------------------------------------------- */

/* Its statistics and timeline: kvpred_lab.h. */

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
