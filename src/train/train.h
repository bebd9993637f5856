/*
 * kvpred's trainer: internal API shared by the src/train files, the train-lm subcommand and the tests.
 *
 * The trainer builds a small Llama-architecture model from scratch on a CPU, exactly in the form
 * the engine runs (docs/formats.md §3.3): token embedding, per layer RMSNorm → Q/K/V
 * (GQA) → RoPE on adjacent pairs → causal softmax attention → output projection, RMSNorm → SwiGLU
 * FFN, final RMSNorm and an output head that is either tied to the embedding or separate. Every op
 * has a hand-written backward pass (train_ops.c), checked against finite differences in
 * tests/test_train.c. Two precisions: f32, the reference, where matrix products go through OpenBLAS
 * and attention runs head by head in query blocks so nothing larger than [block][T] is
 * materialised, the backward pass recomputing the probabilities from a saved log-sum-exp per row;
 * and bf16 (the default of train-lm), where the products take bf16 operands with f32 accumulation
 * and attention is fused and tiled over keys as well (train_bf16.c). Weights, gradients and the
 * optimiser are f32 in both.
 *
 * Modules, one concern per file:
 *   train_ops.c    op forward/backward kernels on plain arrays
 *   train_bf16.c   the bf16 path: kernel table, fused attention, SIMD loss (+ _avx512.c)
 *   train_model.c  parameter layout, init, whole-model forward/backward, threads
 *   train_optim.c  AdamW, learning-rate schedule, gradient clipping
 *   train_bpe.c    BPE training of the vocabulary and the SPM encoder the engine also runs
 *   (the corpora, the tasks and the samples drawn from them: src/tasks)
 *   train_ckpt.c   checkpoint save/load (bit-exact resume)
 *   train_gguf.c   GGUF export
 *   train_loop.c   the training driver (progress through a callback; never prints)
 *   train_bench.c  throughput measurement (train-lm --bench)
 *
 * Shapes: tensors are row-major. A weight W of a linear map in→out is [out][in] (GGUF ne =
 * [in, out]); activations are [N][dim] with N = n_seq·T tokens, token t of sequence b at row
 * b·T + t.
 */
#ifndef KVP_TRAIN_TRAIN_H
#define KVP_TRAIN_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/rng.h" /* struct kvp_rng: the trainer's random stream */
#include "tasks/corpus.h" /* the corpora training samples are drawn from */
#include "tasks/tasks.h"

/* ==================================== ops (train_ops.c) ======================================= */

/* y[n][dim] = x·rstd·w with rstd[n] = 1/sqrt(mean(x²)+eps) saved for the backward pass. */
void kvp_op_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, long n, int dim,
                        float eps);
/* dx (accumulated: +=), dw (+=) from dy. x is the forward input, rstd the saved value. */
void kvp_op_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, long n, int dim);

/* y[n][out] = x[n][in]·Wᵀ (W is [out][in]); beta 0 overwrites y, 1 accumulates. */
void kvp_op_linear_fwd(float *y, const float *x, const float *w, long n, int in, int out,
                       float beta);
/* dx[n][in] = dy·W (overwritten when beta_dx == 0, accumulated when 1; skipped if dx NULL);
 * dW[out][in] += dyᵀ·x, computed first so dx may alias x. */
void kvp_op_linear_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                       long n, int in, int out, float beta_dx);

/* RoPE tables: cos/sin [T][hd/2] for θ_i = pos·base^(−2i/hd). */
void kvp_op_rope_table(float *cosv, float *sinv, int T, int hd, float base);
/* Rotate adjacent pairs (x[2i], x[2i+1]) of every head in place. x is [n_seq·T][n_head·hd];
 * token row r has position r mod T. inverse = true rotates by −θ (the backward pass). */
void kvp_op_rope(float *x, const float *cosv, const float *sinv, int n_seq, int T, int n_head,
                 int hd, bool inverse);
/* The same on token rows [r0, r1) only (a thread's share). */
void kvp_op_rope_rows(float *x, const float *cosv, const float *sinv, long r0, long r1, int T,
                      int n_head, int hd, bool inverse);

/* Causal GQA attention for one sequence and one KV head, all the query heads of its group.
 * q [T][ldq] (this group's first query head at column 0, n_rep heads of hd each), k and v
 * [T][ldkv] (this KV head at column 0), out [T][ldq]; lse [n_rep][T] saved log-sum-exp of the
 * scaled scores. scratch holds at least kvp_op_attn_scratch(T) floats. */
size_t kvp_op_attn_scratch(int T);
void kvp_op_attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                     int T, int hd, int n_rep, int ldq, int ldkv, float *scratch);
/* Backward: dq [T][ldq] overwritten; dk, dv [T][ldkv] accumulated (+=). out and lse from the
 * forward pass, dout the upstream gradient. */
void kvp_op_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                     const float *lse, const float *q, const float *k, const float *v, int T,
                     int hd, int n_rep, int ldq, int ldkv, float *scratch);

/* a[n][f] = silu(g)·u. */
void kvp_op_swiglu_fwd(float *a, const float *g, const float *u, long n);
/* dg, du overwritten from da. */
void kvp_op_swiglu_bwd(float *dg, float *du, const float *da, const float *g, const float *u,
                       long n);

/* Cross-entropy over logits [n][V] against targets, token weights w (NULL: all 1). Returns the
 * weighted sum of −log p(target) and, in place, turns logits into d(loss·scale)/dlogits where
 * scale multiplies every row's gradient. Rows with weight 0 get zero gradient. nll (optional)
 * receives each row's −log p. */
double kvp_op_xent(float *logits, const int32_t *targets, const float *w, long n, int V,
                   float scale, float *nll);

/* y[n][dim] = E[tok[i]]. */
void kvp_op_embed_fwd(float *y, const float *emb, const int32_t *tok, long n, int dim);
/* dE[tok[i]] += dy[i]. */
void kvp_op_embed_bwd(float *demb, const float *dy, const int32_t *tok, long n, int dim);

/* ============================ bf16 fast path (train_bf16*.c) ================================= */

/* The fast path keeps f32 master weights, gradients and optimiser state, and runs the matrix
 * products (the linear layers and a fused, key-tiled attention) on bf16 operands with f32
 * accumulation. bf16 values are stored as uint16_t (the top half of an IEEE f32). */
enum kvp_train_precision {
    KVP_PREC_F32 = 0, /* OpenBLAS sgemm and the per-block attention above: the reference */
    KVP_PREC_BF16 = 1,
};
const char *kvp_train_precision_name(int prec);
/* "f32" or "bf16" → the enum; -1 when neither. */
int kvp_train_precision_by_name(const char *s);

/* Kernel table of the fast path; the best for this CPU is chosen once (AVX512-BF16 when the CPU
 * has it, else portable C); KVP_TRAIN_KERNELS=scalar forces the portable one. */
struct kvp_tk_ops {
    const char *name; /* "scalar", "avx512bf16" */
    /* C[M][N] = (acc ? C : 0) + A·B over kp pairs of the inner dimension. A's pair p of row i
     * (two adjacent bf16) is at A + i·lda + p·ldp: ldp = 2 for row-major A [M][2·kp], lda = 2
     * and ldp = 2·M for A pair-interleaved like B. B bf16 pair-interleaved [kp][N][2] (stride
     * ldb elements between pair rows), C f32 with stride ldc. Any M, N ≥ 1. */
    void (*gemm)(int M, int N, int kp, const uint16_t *A, size_t lda, size_t ldp,
                 const uint16_t *B, size_t ldb, float *C, size_t ldc, bool acc);
    /* dst[i] = bf16(src[i]·scale), round to nearest even, for n elements. */
    void (*cvt)(uint16_t *dst, const float *src, size_t n, float scale);
    /* Pair-interleave two f32 rows: dst[2i] = bf16(a[i]·scale), dst[2i+1] = bf16(b[i]·scale)
     * (b NULL: 0). */
    void (*cvt_pair)(uint16_t *dst, const float *a, const float *b, size_t n, float scale);
    /* Fused attention, the elementwise work of one [rows][cols] tile of scaled scores s (rows
     * even and at most KVP_FA_TILE, cols a multiple of 32); diag: a diagonal tile, where
     * column c > row r is masked.
     * Forward (online softmax): per row, m' = max(m, max s), alpha = e^(m − m'), P = e^(s − m')
     * into pb (bf16 rows), l = l·alpha + Σ P, m = m'. Backward: P = e^(s − lse), dS = P·(dp −
     * D) (D = dO·O of the row); P and dS pair-interleaved by rows into pq, dsq ([rows/2][cols]
     * [2]) and dS as bf16 rows into dsr. */
    void (*fa_fwd_tile)(const float *s, int rows, int cols, bool diag, float *m, float *l,
                        float *alpha, uint16_t *pb);
    void (*fa_bwd_tile)(const float *s, const float *dp, int rows, int cols, bool diag,
                        const float *lse, const float *drow, uint16_t *pq, uint16_t *dsq,
                        uint16_t *dsr);
    /* kvp_op_swiglu_fwd / kvp_op_swiglu_bwd (the portable table uses those). */
    void (*swiglu_fwd)(float *a, const float *g, const float *u, long n);
    void (*swiglu_bwd)(float *dg, float *du, const float *da, const float *g, const float *u,
                       long n);
};
const struct kvp_tk_ops *kvp_tk(void);
const struct kvp_tk_ops *kvp_tk_scalar(void);
/* NULL when the CPU lacks AVX512-BF16. */
const struct kvp_tk_ops *kvp_tk_avx512bf16(void);

/* Tile of the fused attention, in queries and in keys. */
#define KVP_FA_TILE 64
/* Floats of per-thread scratch kvp_fa_fwd/kvp_fa_bwd need for sequences up to T tokens. */
size_t kvp_fa_scratch(int T, int hd);
/* Fused causal GQA attention on bf16 operands, same contract as kvp_op_attn_fwd/bwd (dq
 * overwritten, dk/dv accumulated): key tiles of KVP_FA_TILE with an online softmax, so neither
 * the scores of a row nor a [block][T] matrix is ever stored; the backward pass recomputes the
 * probabilities from lse tile by tile (FlashAttention-2 order: key tiles outer). hd even. */
void kvp_fa_fwd(const struct kvp_tk_ops *tk, float *out, float *lse, const float *q,
                const float *k, const float *v, int T, int hd, int n_rep, int ldq, int ldkv,
                float *scratch);
void kvp_fa_bwd(const struct kvp_tk_ops *tk, float *dq, float *dk, float *dv, const float *dout,
                const float *out, const float *lse, const float *q, const float *k,
                const float *v, int T, int hd, int n_rep, int ldq, int ldkv, float *scratch);

/* Cross-entropy as kvp_op_xent, with float SIMD exponentials (the fast path's loss). */
double kvp_op_xent_fast(float *logits, const int32_t *targets, const float *w, long n, int V,
                        float scale, float *nll);

/* ================================== model (train_model.c) ===================================== */

struct kvp_train_config {
    int n_vocab;    /* tokens, including 3 specials and 256 bytes */
    int n_embd;     /* model width D */
    int n_layer;
    int n_head;     /* query heads */
    int n_head_kv;  /* KV heads; divides n_head */
    int n_ff;       /* SwiGLU hidden width */
    int n_ctx;      /* the longest training context (llama.context_length) */
    float rope_base;
    float norm_eps; /* 1e-5 */
    int tied;       /* 1: output head is token_embd */
};

/* Offsets (in floats) of one layer's tensors inside the flat parameter array. */
struct kvp_train_layer {
    size_t attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
};

/* One parameter tensor, for export, weight decay and reporting. */
struct kvp_train_tensor {
    char name[48];     /* GGUF name */
    size_t off;        /* in floats */
    int64_t ne[2];     /* GGUF ne: [in, out] or [n] */
    int n_dims;
    bool decay;        /* AdamW weight decay applies (matrices other than the embedding) */
};

/* Saved activations of one layer for a micro-batch of up to cap_tokens tokens. */
struct kvp_train_acts {
    float *x;     /* [N][D] residual stream entering the layer */
    float *xn1;   /* [N][D] attn_norm output */
    float *rstd1; /* [N] */
    float *q;     /* [N][H·hd] after RoPE */
    float *k;     /* [N][Hkv·hd] after RoPE */
    float *v;     /* [N][Hkv·hd] */
    float *lse;   /* [n_seq][H][T] */
    float *att;   /* [N][H·hd] attention output before Wo */
    float *xmid;  /* [N][D] residual after attention */
    float *xn2;   /* [N][D] ffn_norm output */
    float *rstd2; /* [N] */
    float *gate;  /* [N][F] */
    float *up;    /* [N][F] */
};

struct kvp_train_model {
    struct kvp_train_config cfg;
    int head_dim;
    size_t n_params;
    float *params;      /* owned [n_params] */
    float *grads;       /* owned [n_params], accumulated by kvp_train_model_backward */
    size_t tok_embd;    /* [V][D] */
    size_t output_norm; /* [D] */
    size_t output;      /* [V][D]; == tok_embd when tied */
    struct kvp_train_layer *layers; /* owned [n_layer] */
    int n_tensors;
    struct kvp_train_tensor *tensors; /* owned [n_tensors] */

    /* Run state, sized for cap_tokens tokens at most (n_seq·T ≤ cap_tokens, T ≤ n_ctx). */
    long cap_tokens;
    int n_threads;
    struct kvp_train_acts *acts; /* owned [n_layer] */
    float *xf, *xnf, *rstdf;     /* final residual, final norm output, its rstd */
    float *logits;               /* [N][V], turned into dlogits by the loss */
    float *dx, *dtmp, *dq, *dk, *dv, *datt, *dg, *du, *dff; /* backward scratch */
    float *rope_cos, *rope_sin;  /* [n_ctx][hd/2] */
    float *attn_scratch;         /* per thread kvp_op_attn_scratch(n_ctx) floats */
    int32_t *tok;                /* [N] current inputs */
    int cur_T, cur_seq;          /* shape of the last forward pass */

    /* Fast path (kvp_train_model_set_precision): f32 unless set to bf16. */
    int precision;               /* enum kvp_train_precision */
    const struct kvp_tk_ops *tk; /* kernels of the bf16 path */
    uint16_t *bf_a, *bf_b, *bf_w; /* bf16 operand scratch: activations ×2, one weight */
    float *fa_scratch;           /* per thread kvp_fa_scratch(n_ctx, hd) floats */
    struct kvp_pool *pool;       /* the bf16 path's persistent workers (n_threads); NULL in f32 */
};

/* Check a configuration. Returns 0 or KVP_EINVAL with the reason. */
int kvp_train_config_check(const struct kvp_train_config *c, struct kvp_err *err);

/* Allocate a model for cfg with run state for cap_tokens tokens, n_threads threads (≥ 1), and
 * initialise the weights from seed (normal(0, 0.02); output projections scaled by 1/√(2L);
 * norms 1). */
int kvp_train_model_init(struct kvp_train_model **out, const struct kvp_train_config *cfg,
                         long cap_tokens, int n_threads, uint64_t seed, struct kvp_err *err);
void kvp_train_model_free(struct kvp_train_model *m);
/* Select the arithmetic of the forward and backward passes (allocates the bf16 scratch). A
 * model starts in f32; the weights, gradients and optimiser stay f32 either way. */
int kvp_train_model_set_precision(struct kvp_train_model *m, int precision, struct kvp_err *err);

/* Forward n_seq sequences of T tokens (tok [n_seq·T]) to logits (m->logits [N][V]). */
int kvp_train_model_forward(struct kvp_train_model *m, const int32_t *tok, int n_seq, int T,
                            struct kvp_err *err);
/* Loss for the last forward: weighted mean of −log p(target) over tokens, with weights w (NULL:
 * all 1) normalised by wsum (the batch's total weight, which may span several micro-batches).
 * Returns the weighted NLL sum; m->logits becomes dLoss/dlogits. */
double kvp_train_model_loss(struct kvp_train_model *m, const int32_t *targets, const float *w,
                            double wsum, float *nll);
/* Backward pass of the last forward + loss; adds into m->grads. */
void kvp_train_model_backward(struct kvp_train_model *m);
void kvp_train_model_zero_grad(struct kvp_train_model *m);

/* ================================ optimiser (train_optim.c) =================================== */

struct kvp_adamw {
    float beta1, beta2, eps, weight_decay;
    uint64_t t;   /* steps taken */
    size_t n;
    float *m, *v; /* owned [n] moments */
};

int kvp_adamw_init(struct kvp_adamw *a, size_t n, float beta1, float beta2, float eps,
                   float weight_decay, struct kvp_err *err);
void kvp_adamw_free(struct kvp_adamw *a);
/* One step on every tensor of the model: p -= lr·(m̂/(√v̂+eps) + wd·p), wd only where
 * tensor.decay. */
void kvp_adamw_step(struct kvp_adamw *a, struct kvp_train_model *m, float lr);
/* Same on a raw array (decay applies to all): for tests. */
void kvp_adamw_step_raw(struct kvp_adamw *a, float *p, const float *g, size_t n, float lr,
                        bool decay);

/* Linear warm-up over `warmup` steps to lr_max, then cosine to lr_min at `total`. */
float kvp_lr_schedule(long step, long warmup, long total, float lr_max, float lr_min);
/* Scale g so its global L2 norm is at most max_norm (≤ 0: no clipping); returns the norm before. */
double kvp_clip_grad(float *g, size_t n, double max_norm);

/* ================================= tokenizer (train_bpe.c) ==================================== */

#define KVP_TVOCAB_N_SPECIAL 3
#define KVP_TVOCAB_BYTE0 3 /* <0x00> */

/* The trainer's vocabulary in SentencePiece form (docs/formats.md §5.2). */
struct kvp_tvocab {
    int n;
    char **text;     /* owned [n]; NUL-terminated, U+2581 for space */
    size_t *len;     /* [n] */
    float *score;    /* [n]: merged tokens −rank, others 0 */
    int32_t *type;   /* [n]: 2 unk, 3 control, 6 byte, 1 normal */
    int32_t *hash;   /* open-addressing table of ids, size hcap */
    size_t hcap;
};

/* Learn a vocabulary of n_vocab tokens from text: 3 specials, 256 byte tokens, the multi-byte
 * characters seen at least 64 times (U+2581 first), then BPE merges in rank order. Merges never
 * involve a digit or a newline, and pieces carry U+2581 only at their start. */
int kvp_tvocab_learn(const char *text, size_t len, int n_vocab, struct kvp_tvocab **out,
                     struct kvp_err *err);
/* Build from explicit arrays (all copied); used by checkpoint loading. */
int kvp_tvocab_create(int n, const char *const *text, const size_t *len, const float *score,
                      const int32_t *type, struct kvp_tvocab **out, struct kvp_err *err);
void kvp_tvocab_free(struct kvp_tvocab *v);
int kvp_tvocab_find(const struct kvp_tvocab *v, const char *s, size_t len);
/* SentencePiece encode exactly as the engine does (docs/formats.md §5.2 steps 1–6, no
 * BOS): optional space prefix, spaces → U+2581, per-character symbols, best-score pair merges (ties
 * to the left), byte fallback. Writes at most cap ids; *n_out gets the full count; KVP_ERANGE when
 * cap is too small. */
int kvp_tvocab_encode(const struct kvp_tvocab *v, const char *text, size_t len,
                      bool space_prefix, int32_t *ids, size_t cap, size_t *n_out,
                      struct kvp_err *err);
/* Decode ids to text (U+2581 → space, bytes raw, specials dropped) into buf; returns bytes
 * written (truncated to cap-1 and NUL-terminated when cap > 0). */
size_t kvp_tvocab_decode(const struct kvp_tvocab *v, const int32_t *ids, size_t n, char *buf,
                         size_t cap);

/* The trainer's vocabulary as the task generator's tokenizer (v borrowed). */
struct kvp_task_tok kvp_tvocab_task_tok(const struct kvp_tvocab *v);

/* ============================== checkpoints (train_ckpt.c) ==================================== */

/* Hyper-parameters of a run; stored in checkpoints so a resume continues the same run. */
#define KVP_TRAIN_MAX_PHASES 8
struct kvp_train_hparams {
    uint64_t seed;
    long steps;           /* total optimiser steps */
    long tokens_per_step; /* sequences per step = tokens_per_step / phase ctx */
    long micro_tokens;    /* tokens per forward/backward (gradient accumulation below it) */
    float lr, lr_min, warmup_frac, weight_decay, beta1, beta2, adam_eps, clip, answer_weight;
    int n_phases;
    int phase_ctx[KVP_TRAIN_MAX_PHASES];    /* context length of each curriculum phase */
    float phase_frac[KVP_TRAIN_MAX_PHASES]; /* fraction of the stage's steps spent in it */
    struct kvp_task_mix mix;
    long stage_step;      /* first step of the current stage: the warm-up, the cosine and the
                             curriculum fractions count over [stage_step, steps) (0: the whole
                             run, as every run before stages had) */
};

struct kvp_train_state {
    long step;               /* optimiser steps done */
    struct kvp_rng rng;      /* spare generator state (reserved; carried across resumes) */
    uint64_t data_cursor;    /* samples consumed so far */
    double tokens_seen;
    uint64_t hay_hash;       /* FNV-1a of the extra haystack texts (0: none), so that a resume
                                without the same --hay is refused unless it starts a stage */
};

/* Write a checkpoint atomically (path.tmp then rename). */
int kvp_ckpt_save(const char *path, const struct kvp_train_model *m, const struct kvp_adamw *opt,
                  const struct kvp_tvocab *v, const struct kvp_train_hparams *hp,
                  const struct kvp_train_state *st, struct kvp_err *err);
/* Read a checkpoint: allocates the model (run state for cap_tokens tokens and n_threads; when
 * cap_tokens ≤ 0 the stored micro_tokens is used), optimiser moments and vocabulary. Verifies
 * magic, version and checksum. */
int kvp_ckpt_load(const char *path, long cap_tokens, int n_threads, struct kvp_train_model **m,
                  struct kvp_adamw *opt, struct kvp_tvocab **v, struct kvp_train_hparams *hp,
                  struct kvp_train_state *st, struct kvp_err *err);

/* ================================= GGUF export (train_gguf.c) ================================= */

/* Write the model and its vocabulary as a llama-architecture F32 GGUF. */
/* Write the tokenizer keys of an exported model (SPM "llama" vocabulary, BOS 1, EOS 2, UNK 0,
 * space prefix) into a GGUF writer; non-zero if the writer failed. */
struct kvp_gguf_writer;
int kvp_train_gguf_add_vocab(struct kvp_gguf_writer *w, const struct kvp_tvocab *v);
int kvp_train_export_gguf(const char *path, const struct kvp_train_model *m,
                          const struct kvp_tvocab *v, const char *name, struct kvp_err *err);
/* Read back a GGUF the exporter wrote: configuration, vocabulary and weights, into a model with
 * run state for cap_tokens tokens and n_threads threads. n_ctx > 0 and rope_base > 0 replace
 * the file's context length and RoPE base (a context extension). */
int kvp_train_import_gguf(const char *path, int n_ctx, float rope_base, long cap_tokens,
                          int n_threads, struct kvp_train_model **m, struct kvp_tvocab **v,
                          struct kvp_err *err);

/* ================================= driver (train_loop.c) ====================================== */

enum kvp_train_event {
    KVP_TRAIN_EV_INFO = 0, /* msg only */
    KVP_TRAIN_EV_STEP,     /* an optimiser step finished */
    KVP_TRAIN_EV_EVAL,     /* evaluation results */
    KVP_TRAIN_EV_CKPT,     /* a checkpoint was written (msg = path) */
};

struct kvp_train_progress {
    int event;
    long step, steps;
    int ctx;                /* current curriculum context */
    double loss;            /* mean loss of this step (all tokens, weighted) */
    double answer_loss;     /* mean −log p over the answer tokens of this step's retrieval
                               samples (not the copy task's repeats); NaN if none */
    double grad_norm;
    float lr;
    double tokens_per_s;    /* since start (or resume) */
    double elapsed_s, eta_s;
    double tokens_seen;
    /* EV_EVAL */
    double val_loss;
    double acc[KVP_TASK_COUNT]; /* answer exact-match rate per task (NaN: not evaluated) */
    int eval_ctx;
    const char *msg;
};

typedef void (*kvp_train_progress_fn)(void *user, const struct kvp_train_progress *p);

struct kvp_train_opts {
    struct kvp_train_config model;   /* n_vocab used for the BPE vocabulary */
    struct kvp_train_hparams hp;
    const char *const *data_paths;
    int n_data_paths;
    const char *const *hay_paths;    /* extra haystack texts, one corpus (kind) per path */
    int n_hay_paths;
    const char *init_gguf;           /* fresh run whose weights and vocabulary come from this
                                        GGUF (fresh optimiser state); NULL: random init */
    const char *out_gguf;            /* NULL: none */
    const char *ckpt_path;           /* NULL: no checkpoints */
    const char *resume_path;         /* NULL: fresh run */
    long ckpt_every;                 /* steps; 0: only at the end */
    long eval_every;                 /* steps; 0: only at the end */
    int eval_samples;                /* per task */
    int n_threads;
    int precision;                   /* enum kvp_train_precision (default bf16) */
    long stop_after;                 /* stop (with a checkpoint) after this many steps of this
                                        invocation; 0: run to the end; < 0: no step at all
                                        (export a checkpoint) */
    unsigned resume_override;        /* KVP_TRAIN_OVERRIDE_* bits: hp fields that replace the
                                        checkpoint's on resume (a fine-tuning stage) */
};

enum {
    KVP_TRAIN_OVERRIDE_LR = 1u << 0,            /* lr and lr_min */
    KVP_TRAIN_OVERRIDE_ANSWER_WEIGHT = 1u << 1,
    KVP_TRAIN_OVERRIDE_MIX = 1u << 2,           /* the task weights */
    KVP_TRAIN_OVERRIDE_EDGE_FRAC = 1u << 3,
    KVP_TRAIN_OVERRIDE_FILL_MIN = 1u << 4,
    KVP_TRAIN_OVERRIDE_HAY_FRAC = 1u << 5,
    /* these start a new stage when they differ from the checkpoint's (stage_step = its step;
     * --steps must go beyond it) */
    KVP_TRAIN_OVERRIDE_CTX = 1u << 6,        /* model.n_ctx */
    KVP_TRAIN_OVERRIDE_ROPE = 1u << 7,       /* model.rope_base */
    KVP_TRAIN_OVERRIDE_CURRICULUM = 1u << 8, /* phases */
    KVP_TRAIN_OVERRIDE_BATCH = 1u << 9,      /* tokens_per_step and micro_tokens */
};

/* Defaults: a small GQA model for ctx 2048 and the schedule for it. */
void kvp_train_opts_default(struct kvp_train_opts *o);

/* Run (or resume) training; progress goes to cb (may be NULL). */
int kvp_train_run(const struct kvp_train_opts *o, kvp_train_progress_fn cb, void *user,
                  struct kvp_err *err);

/* Evaluate retrieval: for every task, n samples at context T built from held-out sentences with
 * evaluation seeds (bit 62 set, derived from seed), teacher-forced: a sample counts as correct
 * when every answer token is the argmax, i.e. exactly what greedy decoding would produce after
 * the prompt. acc[task] is NaN for a task that never fits in T (and for KVP_TASK_LM). val_loss:
 * mean NLL per token of n held-out plain-text sequences. */
int kvp_train_evaluate(struct kvp_train_model *m, const struct kvp_corpus *c,
                       const struct kvp_tvocab *v, int T, int n, uint64_t seed, double *acc,
                       double *val_loss, struct kvp_err *err);

/* Curriculum phase (index) in effect at a step. */
int kvp_train_phase_at(const struct kvp_train_hparams *hp, long step);

/* ================================= benchmark (train_bench.c) ================================== */

struct kvp_train_bench_req {
    struct kvp_train_config cfg; /* n_ctx raised to T when smaller */
    int T;                       /* sequence length */
    long tokens_per_step;        /* sequences per step = tokens_per_step / T (at least 1) */
    long micro_tokens;           /* per forward/backward (at least T) */
    int precision;
    int n_threads;
    int steps;                   /* timed steps, after one untimed */
    uint64_t seed;
};

struct kvp_train_bench_result {
    double tokens_per_s;   /* wall clock, whole optimiser steps */
    double cpu_s_per_mtok; /* process CPU seconds per million tokens (less sensitive to a busy
                              host than the wall clock) */
    double loss;           /* of the last step (sanity: ~log V on random tokens) */
    const char *kernels;   /* "openblas" for f32, else the bf16 kernel table's name */
};

/* Time training steps of a fresh model on random tokens. */
int kvp_train_bench(const struct kvp_train_bench_req *req, struct kvp_train_bench_result *res,
                    struct kvp_err *err);

#endif
