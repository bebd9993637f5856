/*
 * The inference context: KV cache, scratch buffers and the thread pool for one sequence.
 * Everything the per-token loop touches is allocated here, once, at kvp_ctx_init.
 */
#ifndef KVP_FORWARD_CONTEXT_H
#define KVP_FORWARD_CONTEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "forward/kvcache.h"
#include "model/model.h"

#define KVP_QCHUNK 64      /* prefill attention: query rows per work item */
#define KVP_TILE_ROWS 64   /* prefill: weight rows dequantized per sgemm call */

struct kvp_thread_scratch {
    float *kc;    /* [n_ctx][head_dim] keys gathered contiguous for prefill attention */
    float *vc;    /* [n_ctx][head_dim] values gathered */
    float *s;     /* [KVP_QCHUNK][n_ctx] prefill scores */
    float *tile;  /* [KVP_TILE_ROWS][max_cols] dequantized weight rows */
    void *xq;     /* activation quantized for integer dot products [max_cols] */
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

    /* the job of the running eval */
    const int32_t *job_tokens;
    int job_n;
    int job_pos0;
    float *job_logits;
    bool job_all_logits;
};

#endif
