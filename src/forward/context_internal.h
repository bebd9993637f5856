/*
 * The inference context's insides, for src/forward only: one sequence (KV cache, policy, tier)
 * and, through struct kvp_shared, the scratch buffers and thread pool it runs with, which a lone
 * context owns and the sequences of an engine (kvp_engine) share. Everything the per-token loop
 * touches is allocated once, at kvp_ctx_init / kvp_engine_init / kvp_seq_init. Other parts use
 * forward/context.h.
 */
#ifndef KVP_FORWARD_CONTEXT_INTERNAL_H
#define KVP_FORWARD_CONTEXT_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "forward/context.h"
#include "kvpred_lab.h"

struct kvp_lanes;
struct kvp_spf;

#define KVP_QCHUNK 64      /* prefill attention: query rows per work item, a window of positions */

/* Where prefill attention's first chunk of a piece from position pos0 starts: at the window of
 * KVP_QCHUNK positions pos0 falls in, so that a query's chunk (the block sparse prefill chooses
 * keys for, and the shape of its products) is a function of its position, not of how its prompt
 * was cut into pieces (prefill_attention.c, prefill_head). */
static inline int kvp_prefill_base(int pos0)
{
    return pos0 - pos0 % KVP_QCHUNK;
}
/* The number of those chunks for a piece of n tokens: the windows it touches. */
static inline int kvp_prefill_chunks(int pos0, int n)
{
    return (pos0 + n - 1) / KVP_QCHUNK - pos0 / KVP_QCHUNK + 1;
}
/* A step that need not be exact (kvp_engine_params.exact false) sends its single tokens through
 * the batch kernels together from this many on (twice as many for Q8_0 weights with the
 * multi-vector mat-vec kernel, never for the other types with one; forward.c,
 * singles_together_from). */
#define KVP_SINGLES_GEMM 4
/* From this many single tokens a step packs the layer weights once with their rows in the SIMD
 * lanes (kvp_shared.lanes; unless no_pack) and runs its single tokens on them (forward.c,
 * pack_weights), where the CPU has the kernel for the type: from the first decode token, in a
 * lone context and in an engine, exact or not (a vector's results in the lanes kernel do not
 * depend on the other vectors). Until the lanes kernel prefetched its tiles and read the 4- and
 * 5-bit types at their own size, the mat-vec (one sequence) and the multi-vector kernels (each
 * weight row read once for up to four vectors) won up to 7 sequences. Now, SmolLM2-135M shape,
 * -npp 512, Xeon, tok/s mat-vec or multi -> lanes: 2 threads, Q8_0 at 1 / 2 / 3 / 4 / 6
 * sequences 184-202 / 305-351 / 346-394 / 464-478 / 451-457 -> 255-264 / 353-377 / 403-435 /
 * 530-560 / 567-596, the "Q4_K" file (Q5_0 and Q4_K matrices) 287-294 / 343-364 / 397-402 /
 * 460-464 / 425-441 -> 402-417 / 599-622 / 687-720 / 781 / 711-838; 1 thread at 2 and 4, Q8_0
 * 159 / 222 -> 172 / 230, the "Q4_K" file 192 / 231 -> 323 / 385. Why: the row-major mat-vec
 * kernels are bound by their arithmetic (a Q5_0 matrix in the L2, one thread: 16 GB/s, the lanes
 * kernel for one vector 44; build/matvec_bw). */
#define KVP_SINGLES_LANES 1
#define KVP_PACK_PER_LAYER 7 /* wq, wk, wv, wo, w_gate, w_up, w_down */
#define KVP_TILE_ROWS 256  /* prefill: weight rows dequantized per sgemm call (fewer repacks of
                              the activations than 64: +10-20 % prefill on real shapes) */
/* prefill of an exact engine: tokens per sgemm call. Every call of a sequence's product has this
 * many rows, the tokens of positions [k·64, (k+1)·64) in slots 0..63, so a token's products never
 * depend on how its prompt was cut into pieces (forward.c, sgemm_tokens); a lone context and an
 * engine that need not be exact make one call per piece (prefill attention's windows are the
 * same for all: kvp_prefill_base). A divisor of n_batch's default (512),
 * so that a prompt's full pieces fill whole calls. Each call packs its weight tile again: on the
 * SmolLM2-135M shape (6 layers, Q8_0, avx2 table, Haswell kernel, one thread, a loaded host)
 * 512-token prefills took 7-13 % more CPU than one call per piece, 128 rows 5-7 %; but a piece
 * of a few tokens (a follow-up) computes up to two whole windows, so fewer rows waste less. */
#define KVP_SGEMM_TOKENS 64

struct kvp_thread_scratch {
    float *kc;    /* [head_dim][n_keys] keys gathered as f32 for prefill attention */
    float *vc;    /* [n_ctx][head_dim] values gathered */
    float *s;     /* [KVP_QCHUNK][n_ctx] prefill scores (n_ctx rounded up to KVP_QCHUNK, as kc
                   * and vc are) */
    float *qwin;  /* [KVP_QCHUNK][head_dim] a chunk's queries at their slots */
    float *owin;  /* [KVP_QCHUNK][head_dim] their outputs */
    float *tile;  /* [KVP_TILE_ROWS][max_cols] dequantized weight rows */
    float *win;   /* [KVP_SGEMM_TOKENS][max_cols] a piece's first or last rows at their slots */
    float *wout;  /* [KVP_SGEMM_TOKENS][KVP_TILE_ROWS] their products */
    void *xq;     /* activation quantized for integer dot products [max_cols] */
    int xq_type;  /* the kvp_type_vec_dot_type xq holds for the current input (-1: none) */
    int xg_ready; /* the previous product left its input quantized in kvp_shared.xg, for weights
                   * with this vec_dot type (-1: it did not) */
    void *xv;     /* [n_batch] decode rows quantized for the mat-vec, xv_stride bytes apart */
    int xv_type;  /* the vec_dot type xv holds for the current vectors (-1: none) */
    const void **xvp; /* [n_batch] pointers into xv, and the outputs, of a multi-vector call */
    float **yvp;
};

/* What every sequence of an engine shares (a lone context owns one): the thread pool, the rows
 * of the batch being evaluated and each thread's scratch. Sized for n_batch rows per step and
 * contexts of up to n_ctx tokens. */
struct kvp_shared {
    const struct kvp_model *model; /* borrowed */
    struct kvp_pool *pool;         /* owned */
    int n_threads;
    int n_batch;                   /* rows (tokens of all sequences) per forward pass */
    int n_ctx;                     /* longest context the per-thread scratch serves */
    bool exact;                    /* kvp_engine_params.exact; also: prefill's weight products in
                                      fixed windows of positions (KVP_SGEMM_TOKENS) */
    double *inv_freq;              /* [head_dim/2] angle per position of each pair (rope.h) */
    double rope_mscale;            /* cos and sin are multiplied by it (YaRN; else 1) */
    double *inv_freq_local;        /* [head_dim/2] the local layers' own (Gemma 3), or NULL */

    /* batch activations, [n_batch][width] row-major */
    float *x;      /* [n_embd] residual stream */
    float *xn;     /* [n_embd] normalised */
    float *q;      /* [n_head*hd] */
    float *k;      /* [n_head_kv*hd] */
    float *v;      /* [n_head_kv*hd] */
    float *att;    /* [n_head*hd] attention output */
    float *gate;   /* [n_ff] */
    float *up;     /* [n_ff] */
    float *rope;   /* [n_batch][hd] cos/sin pairs for the rows' positions */
    float *rope_local; /* the same for the local layers when inv_freq_local, else NULL */
    int32_t *row_tok;  /* [n_batch] token of each row */
    int32_t *row_pos;  /* [n_batch] position of each row in its sequence */

    struct kvp_thread_scratch *ts; /* owned [n_threads] */
    size_t tile_bytes;             /* bytes of each ts[].tile */
    size_t xv_stride;              /* bytes of one prepared vector in ts[].xv */
    void *xg;      /* the integer GEMM's quantized rows (prefill_gemm.h), NULL when the CPU has
                      no such kernel */
    bool pack;     /* may pack the weights (not no_pack) */
    bool pack_tried;               /* pack_weights ran (if it failed: steps run without) */
    struct kvp_lanes *lanes;       /* owned [n_layer * KVP_PACK_PER_LAYER + 1] or NULL: the
                                      layer matrices, then the classifier, packed in lanes
                                      (matvec.h) on the first step with KVP_SINGLES_LANES
                                      single tokens; entries with mem NULL: no kernel for the
                                      type */
    size_t lanes_bytes;            /* their total */
    void *lanes_arena;             /* owned: every entry's mem, one huge-page allocation */

    /* the running pass's plan (kvp_forward_pass), read-only inside the pool */
    struct kvp_ctx **seqs;         /* [n_batch] the pass's sequences */
    int n_seqs, n_rows;
    struct kvp_row_seg *multi;     /* [n_batch + 1] rows that go through a product as one unit:
                                      [0] every single row (they come first), for steps that
                                      need not be exact; [1..] the multi-token pieces */
    struct kvp_row_seg *single;    /* [n_batch] single rows, each a mat-vec of its own */
    struct kvp_row_seg *out_multi; /* [n_batch] rows whose logits go out as one product */
    struct kvp_row_seg *out_single;/* [n_batch] rows whose logits go out alone: first the
                                      n_out_decode decode tokens', then the last rows of
                                      prompt pieces, which always go through the mat-vec, not
                                      the packed weights, so that their logits do not depend
                                      on whether another sequence's token packed them */
    int n_multi, n_single, n_out_multi, n_out_single, n_out_decode;
    /* the next (sequence, KV head) pair of a layer's grouped decode (kv_step.c, kvp_kv_step),
     * on a cache line of its own: every thread takes pairs from it */
    char pad_[64];
    atomic_int pair_next;
    char pad2_[64];
    /* the next work item of a prompt piece's prefill attention (prefill_attention.c), reset by
     * worker 0 before the barrier that precedes each layer's attention */
    atomic_int prefill_next;
    char pad3_[64];
};

/* One KV head's share of an untiered sparse layer's parts pass (kv_step.c): its selector
 * publishes the selection's size (ready: n blocks, or -1 when the parts pass cannot take it),
 * every thread then claims chunks of its blocks with next. */
struct kvp_attn_claim {
    atomic_int ready; /* 0: not selected yet; 1 + sel->n; -1: reduced by its own thread */
    atomic_int next;  /* the first block index not claimed yet */
    char pad[56];     /* one cache line each: the claims of different KV heads do not collide */
};

struct kvp_ctx {
    /* ---- configuration: fixed at creation ---- */
    const struct kvp_model *model; /* borrowed */
    struct kvp_hparams hp;
    struct kvp_ctx_params params;  /* as created (strings borrowed): what a fork copies */
    struct kvp_disk_ring_params ring; /* *params.kv_ring's copy (params.kv_ring points here) */
    int n_ctx;
    int hot_budget;                /* kvp_ctx_params.hot_budget (tokens per layer, 0: auto) */

    /* ---- what it runs with: threads and scratch (struct kvp_shared) ---- */
    struct kvp_shared *sh;         /* owned by a lone context, the engine's for a sequence */
    bool own_sh;
    struct kvp_pool *pool;         /* sh->pool: where the threads of a pass meet */

    /* ---- the sequence's cache ---- */
    struct kvp_kvcache kv;         /* owned */
    int n_tokens;                  /* tokens in the cache */
    float *probs;  /* [n_head][probs_stride] decode attention probabilities of the last layer */
    int probs_stride; /* n_ctx rounded up to whole blocks: score kernels write whole blocks */
    /* [n_head_kv][dchunk_max] states of dense attention's chunks (kv/attention.h), which a
     * decode step spreads over the pool (kv_step.c); NULL when the context is one chunk */
    float *dchunk;
    int dchunk_max;

    /* ---- selection: the policy and its buffers (policy/host.h); pol.p NULL: dense ---- */
    struct kvp_policy_host pol;

    /* ---- the KV step's state (kv_step.c is its only reader) ---- */
    float *sparse_probs;           /* [n_head][probs_stride] probabilities over the selection */
    struct kvp_attn_blocks *ab;    /* [n_head_kv] sparse attention's per-block state */
    float *ab_floats;              /* backing store of ab's float arrays */
    int32_t *ab_idx;               /* backing store of ab's idx arrays */
    struct kvp_attn_claim *claim;  /* [n_head_kv] untiered decode: the parts pass's work queue */
    int obs_n;                     /* rows captured in this job: min(pol.obs_window, job_end) */

    /* ---- prefill attention: sparse_prefill.h (NULL: dense, uncounted), the progress callback */
    struct kvp_spf *spf;
    kvp_progress_fn progress;
    void *progress_user;
    /* token-layers in the cache: n_tokens * n_layer between passes, and during a pass the
     * piece's tokens times the layers it has done on top, so another thread can poll how far a
     * long piece has come (kvp_ctx_progress_tokens) without touching n_tokens */
    atomic_llong progress_tl;

    /* ---- tiered KV store (src/store/store.h), NULL when every block is hot ---- */
    struct kvp_store *store;       /* owned */
    bool store_waits;              /* this layer's acquire has blocks in flight */

    /* ---- measuring (kvp_ctx_set_measure) ---- */
    bool measure;
    double attn_s[2];      /* attention phases of sliding-window [0] and other [1] layers
                              (kvp_ctx_attention_seconds) */
    float *dense_probs;            /* [n_layer][n_head][probs_stride] */
    float *dense_q;                /* [n_layer][n_head][head_dim] the queries of those rows */
    double *recovery;              /* [n_layer][n_head]; -1 when not measured */

    /* ---- the job: the tokens of this sequence in the running pass ---- */
    /* this sequence's rows of the shared batch (sh->q + row0 * q_dim, ...) */
    float *q, *k, *v, *att;
    int job_row0;       /* first row of the shared batch */
    int job_n;          /* rows in this pass */
    int job_pos0;       /* position of the first */
    float *job_logits;
    bool job_all_logits;
    int job_end;        /* n_tokens after the whole job (its last pass ends here); 0: no job open
                           between passes */
    bool job_prefill;   /* multi-token job: call the policy's on_prefill after each layer of
                           the last pass */
    bool job_last;      /* this pass is the job's last */
    int pol_seen;       /* leading cache tokens the policy has seen as they are now
                           (kvp_prefill_obs.first): 0 after a reset, lowered by a truncation,
                           the prompt's end after its on_prefill */
};

/* Set the tokens in the cache, and the progress counter with them. */
static inline void kvp_ctx_tokens_set(struct kvp_ctx *c, int n)
{
    c->n_tokens = n;
    atomic_store_explicit(&c->progress_tl, (long long)n * c->hp.n_layer, memory_order_relaxed);
}

/* Rows of the shared batch that go through a product as one unit: the multi-token part of a
 * sequence (rows [row0, row0+n)), or a single row (n = 1); y: where its first output row goes
 * (NULL: the product's own output at the same row). */
struct kvp_row_seg {
    int row0, n;
    float *y;
};

/* One sequence's part of a forward pass: n tokens at positions n_tokens.., logits as kvp_eval
 * (all rows or the last); last: the pass ends the sequence's job (kvp_job_open). */
struct kvp_pass_item {
    struct kvp_ctx *c;
    const int32_t *tokens;
    int n;
    float *logits;
    bool all_logits;
    bool last;
};

/* Shared state for n_threads threads, n_batch rows and contexts of up to n_ctx tokens. */
int kvp_shared_init(const struct kvp_model *model, int n_threads, int n_batch, int n_ctx,
                    struct kvp_shared **out, struct kvp_err *err);
void kvp_shared_free(struct kvp_shared *sh);
/* Pack the weights now if sh may and has not yet (forward.c, pack_weights): the bytes packed. */
size_t kvp_shared_pack(struct kvp_shared *sh);

/* A sequence on shared state sh (p->n_ctx <= sh->n_ctx; p->n_threads and n_batch unused). */
int kvp_seq_setup(struct kvp_shared *sh, const struct kvp_ctx_params *p, struct kvp_ctx **out,
                  struct kvp_err *err);

/* Start a job of n tokens on c (one kvp_eval, or a prompt fed in pieces over several passes):
 * what prompt-time policies and the store need to know about its end. */
void kvp_job_open(struct kvp_ctx *c, int n);

/* One forward pass over the items (distinct sequences of sh, reserved, jobs open, n_items >= 1,
 * at most sh->n_batch tokens in all): weights read once for every row, attention per sequence.
 * Advances each sequence's n_tokens; the first store error, if any. */
int kvp_forward_pass(struct kvp_shared *sh, const struct kvp_pass_item *items, int n_items,
                     struct kvp_err *err);

#endif
