/*
 * The measuring harness: runs a KV selection policy on forced tokens next to the dense reference
 * and reduces docs/methods.md §6's metrics to one row per (policy, budget).
 *
 * Protocol (the same forced tokens for every policy): prefill tokens[0, N) densely, then decode
 * M steps with teacher forcing; step i feeds tokens[N + i] and its next-token distribution is
 * scored against tokens[N + i + 1], so a measurement needs N + M + 1 tokens. Each step measures,
 * for every compressed layer (>= the policy's dense_layers) and query head h of KV head kvh:
 *   recovery        kvp_ctx_recovery: dense attention mass on the tokens the step read;
 *   oracle_block    the same mass for the block oracle at the step's budget (forced sink and
 *                   local, top blocks by the group-summed dense attention; metrics.h);
 *   oracle_token    the same for the token oracle (the bound for every policy);
 *   retention       |Top32(a_t) ∩ S| / 32, S = the tokens the step read;
 *   read            |S| / Lk per KV head, and kept = tokens not evicted / Lk per KV head;
 * and per step, against the reference's distribution: KL(p_full ‖ p_policy) in double precision,
 * top-1 agreement, and the log-likelihood of the forced token (for perplexity).
 *
 * The dense truth a_t is the policy context's own dense attention of the step (measuring mode):
 * recovery and the oracles share it, so oracle_relative = recovery / oracle_block compares two
 * selections of the same row. The reference (no policy: dense everywhere) is decoded once when
 * the harness is created and its logits are kept ([M][n_vocab] floats); decoding is
 * deterministic for a fixed thread count, so this gives exactly the numbers of running the two
 * contexts in lock-step, without decoding the reference again for every policy.
 */
#ifndef KVP_EVAL_MEASURE_H
#define KVP_EVAL_MEASURE_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "kvpred.h"
#include "kvpred_lab.h"

struct kvp_measure;

struct kvp_measure_params {
    int n_prefill;   /* N: prompt tokens, >= 1 */
    int n_decode;    /* M: teacher-forced decode steps, >= 1 */
    int retention_k; /* K of token retention [32] */
};

/* Means of one run, over decode steps and the compressed layers' heads. */
struct kvp_measure_result {
    struct kvp_policy_params p; /* resolved parameters (name points to static storage) */
    int block_size;
    int n_layer;
    int n_steps;
    double recovery;      /* mean recovery, query heads */
    double oracle_block;  /* mean recovery of the block oracle at the same budget */
    double oracle_token;  /* mean recovery of the token oracle at the same budget */
    double retention;     /* mean token retention */
    double budget_tokens; /* mean per-step token budget the oracles used */
    double read_fraction; /* mean |S| / Lk, KV heads */
    double read_tokens;   /* mean |S|, KV heads */
    double compression;   /* mean 1 - kept / Lk, KV heads (kept: tokens not evicted) */
    double kl;            /* mean KL(p_full ‖ p_policy), nats */
    double kl_max;        /* largest per-step KL */
    double top1;          /* fraction of steps whose argmax matches the reference's */
    double ppl;           /* exp(mean NLL) of the forced tokens, policy */
    double ppl_full;      /* the same for the dense reference */
    size_t kv_resident;   /* kvp_ctx_kv_bytes after the last step, policy */
    size_t kv_kept;
    size_t kv_resident_full; /* the same for the reference */
    size_t kv_kept_full;
    double *layer_recovery;     /* owned [n_layer]: mean recovery per layer, -1 for dense ones */
    double *layer_oracle_block; /* owned [n_layer]: the same for the block oracle */
    double seconds;             /* wall time of the run */
};

/* Called after each decode step (step counts from 0) once its metrics are in; the context and
 * the read masks of that step may be inspected (kvp_measure_ctx, kvp_measure_read_mask). */
typedef void (*kvp_measure_step_fn)(void *ud, const struct kvp_measure *ms, int step);

/* Set up a measurement over tokens[0, N + M] (copied) and decode the dense reference. cp sets
 * threads and block size; its n_ctx is raised to N + M when smaller. Returns 0, or a negative
 * KVP_E* code with err filled and *out untouched. */
int kvp_measure_init(const kvp_model *model, const int32_t *tokens, const struct kvp_ctx_params *cp,
                     const struct kvp_measure_params *mp, struct kvp_measure **out,
                     struct kvp_err *err);
void kvp_measure_free(struct kvp_measure *ms);

/* Run one policy (pp; NULL or "full"-like names all work) on the harness's tokens and fill *res
 * (free with kvp_measure_result_free). step_fn may be NULL. Returns 0 or a negative KVP_E* code;
 * on failure *res holds nothing to free. */
int kvp_measure_run(struct kvp_measure *ms, const struct kvp_policy_params *pp,
                    kvp_measure_step_fn step_fn, void *ud, struct kvp_measure_result *res,
                    struct kvp_err *err);
void kvp_measure_result_free(struct kvp_measure_result *res);

/* The policy context of the run in progress (borrowed; for step callbacks). */
const kvp_ctx *kvp_measure_ctx(const struct kvp_measure *ms);
/* The same context, to configure (its prefill attention: kvp_ctx_set_prefill) between runs. */
kvp_ctx *kvp_measure_policy_ctx(struct kvp_measure *ms);

/* Tokens the last decode step read for (layer, KV head), as per-block masks over
 * ceil(n_keys / block_size) blocks, or NULL for a dense layer or outside a run. */
const uint64_t *kvp_measure_read_mask(const struct kvp_measure *ms, int layer, int kvh);

/* Tokens of (layer, KV head) evicted before the last decode step, per-block masks like
 * kvp_measure_read_mask, or NULL where that gives NULL. */
const uint64_t *kvp_measure_evicted_mask(const struct kvp_measure *ms, int layer, int kvh);

/* Number of query heads, KV heads, layers and the first compressed layer of the run. */
void kvp_measure_shape(const struct kvp_measure *ms, int *n_layer, int *n_head, int *n_head_kv,
                       int *dense_layers, int *block_size);

#endif
