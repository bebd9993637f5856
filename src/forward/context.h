/*
 * The inference context: KV cache, scratch buffers and the thread pool for one sequence.
 * Everything the per-token loop touches is allocated here, once, at kvp_ctx_init.
 */
#ifndef KVP_FORWARD_CONTEXT_H
#define KVP_FORWARD_CONTEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "kv/kvcache.h"
#include "model/model.h"
#include "policy/host.h"

struct kvp_store;

#define KVP_QCHUNK 64      /* prefill attention: query rows per work item */
#define KVP_TILE_ROWS 256  /* prefill: weight rows dequantized per sgemm call (fewer repacks of
                              the activations than 64: +10-20 % prefill on real shapes) */

struct kvp_thread_scratch {
    float *kc;    /* [head_dim][n_keys] keys gathered as f32 for prefill attention */
    float *vc;    /* [n_ctx][head_dim] values gathered */
    float *s;     /* [KVP_QCHUNK][n_ctx] prefill scores */
    float *tile;  /* [KVP_TILE_ROWS][max_cols] dequantized weight rows */
    void *xq;     /* activation quantized for integer dot products [max_cols] */
    int xq_type;  /* the kvp_type_vec_dot_type xq holds for the current input (-1: none) */
    bool xg_ready; /* the previous product left its input quantized in kvp_ctx.xg */
};

struct kvp_ctx {
    const struct kvp_model *model; /* borrowed */
    struct kvp_hparams hp;
    int n_ctx;
    int n_batch;
    int n_threads;
    struct kvp_pool *pool;         /* owned */
    struct kvp_kvcache kv;         /* owned */
    int n_tokens;                  /* tokens in the cache */
    double *inv_freq;              /* [head_dim/2] base^(-2i/hd) */

    /* batch activations, [n_batch][width] row-major */
    float *x;      /* [n_embd] residual stream */
    float *xn;     /* [n_embd] normalised */
    float *q;      /* [n_head*hd] */
    float *k;      /* [n_head_kv*hd] */
    float *v;      /* [n_head_kv*hd] */
    float *att;    /* [n_head*hd] attention output */
    float *gate;   /* [n_ff] */
    float *up;     /* [n_ff] */
    float *rope;   /* [n_batch][hd] cos/sin pairs for the batch positions */
    float *probs;  /* [n_head][probs_stride] decode attention probabilities of the last layer */
    int probs_stride; /* n_ctx rounded up to whole blocks: score kernels write whole blocks */

    struct kvp_thread_scratch *ts; /* owned [n_threads] */
    size_t tile_bytes;             /* bytes of each ts[].tile */
    void *xg;      /* prefill's integer GEMM: the batch's activations quantized (prefill_gemm.h),
                      NULL when the CPU has no such kernel */

    /* the selection policy and its buffers (policy/host.h); pol.p NULL: dense everywhere */
    struct kvp_policy_host pol;

    /* the KV step's state (kv_step.c is the only reader of what follows up to measuring) */
    float *sparse_probs;           /* [n_head][probs_stride] probabilities over the selection */
    struct kvp_attn_blocks *ab;    /* [n_head_kv] sparse attention's per-block state */
    float *ab_floats;              /* backing store of ab's float arrays */
    int32_t *ab_idx;               /* backing store of ab's idx arrays */
    int obs_n;                     /* rows captured in this eval: min(pol.obs_window, job_end) */

    /* tiered KV store (src/store/store.h), NULL when every block is hot */
    struct kvp_store *store;       /* owned */
    bool store_waits;              /* this layer's acquire has blocks in flight */
    int hot_budget;                /* kvp_ctx_params.hot_budget (tokens per layer, 0: auto) */

    /* measuring */
    bool measure;
    float *dense_probs;            /* [n_layer][n_head][probs_stride] */
    float *dense_q;                /* [n_layer][n_head][head_dim] the queries of those rows */
    double *recovery;              /* [n_layer][n_head]; -1 when not measured */

    /* the job of the running eval */
    const int32_t *job_tokens;
    int job_n;
    int job_pos0;
    float *job_logits;
    bool job_all_logits;
    int job_end;        /* n_tokens after the whole eval (last micro-batch ends here) */
    bool job_prefill;   /* multi-token eval: call the policy's on_prefill after each layer of
                           the last micro-batch */
    bool job_last;      /* this micro-batch is the last of the eval */
};

/* kvp_ctx_set_policy with an ops table of the caller's instead of a registry entry (the seam for
 * test doubles; params->name may then be anything). */
int kvp_ctx_set_policy_ops(kvp_ctx *c, const struct kvp_policy_ops *ops,
                           const struct kvp_policy_params *params, struct kvp_err *err);

#endif
