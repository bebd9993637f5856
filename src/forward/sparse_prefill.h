/*
 * Block-sparse prefill attention's choice of keys (docs/prefill.md): for one KV head and block of
 * up to 64 queries of a prompt piece, which runs of keys attention reads: the sink, the local
 * window, and the key blocks an estimate ranks highest, up to a budget or a mass threshold. The
 * prompt's last tokens and blocks that see fewer than min_keys keys read every key. Also the
 * per-block key statistics the cheap estimates rank with (folded as prompt pieces arrive), the
 * counters behind kvp_ctx_prefill_stats and the progress callback's state.
 *
 * prefill_attention.c runs the work queue and the attention itself; this file only decides what
 * it reads. At a budget that covers every key the choice is one run [0, n_keys), so the sparse
 * path computes exactly what the dense one does (same gathers, same products).
 */
#ifndef KVP_FORWARD_SPARSE_PREFILL_H
#define KVP_FORWARD_SPARSE_PREFILL_H

#include <stdbool.h>
#include <stdint.h>

#include "kvpred_lab.h"

struct kvp_ctx;
struct kvp_thread_scratch;
struct kvp_spf;

/* A run of keys [start, start + n) of one (layer, KV head). */
struct kvp_key_run {
    int start, n;
};

/* The context's sparse prefill state for params (resolved defaults), replacing *out; NULL params
 * free it. 0 or KVP_EINVAL / KVP_ENOMEM. */
int kvp_spf_set(struct kvp_ctx *c, struct kvp_spf **out, const struct kvp_prefill_params *params,
                struct kvp_err *err);
void kvp_spf_free(struct kvp_spf *s);

/* Tokens at positions >= n changed or went away (a reset, truncation or a copied cache): their
 * blocks' statistics are folded again by the next prompt piece. */
void kvp_spf_forget(struct kvp_spf *s, int n);

/* Whether layer l of the running piece needs the statistics folded (kvp_spf_fold, by every
 * thread of the pool, then a barrier, then kvp_spf_folded by one thread). */
bool kvp_spf_needs_fold(const struct kvp_spf *s, const struct kvp_ctx *c);
void kvp_spf_fold(struct kvp_spf *s, struct kvp_ctx *c, int l, int ith, int nth);
void kvp_spf_folded(struct kvp_spf *s, const struct kvp_ctx *c, int l);

/* The keys query rows [qs, qs + nq) of the piece read for KV head kvh of layer l (n_keys: the
 * keys the last of them sees): *runs (the thread's buffer, ascending, disjoint, the last one
 * ending at n_keys) and their total *n_cols; returns the number of runs. Thread ith's scratch
 * may be used (the strided estimate scores into ts->s and gathers keys into ts->vc); *est_s:
 * the seconds the estimate took. */
int kvp_spf_select(struct kvp_spf *s, struct kvp_ctx *c, int l, int kvh, int qs, int nq,
                   int n_keys, int ith, struct kvp_thread_scratch *ts,
                   const struct kvp_key_run **runs, int *n_cols, double *est_s);

/* A tiered store's prefill, where the estimate reads no keys (pooled, bound): the layer's blocks
 * are staged in two steps. kvp_spf_stage_first (one thread, before kvp_store_prefill_begin_some)
 * gives the blocks to load first (those the fold and the piece's writes touch), or NULL to load
 * everything (no store plan: dense, strided). After the fold, kvp_spf_plan (every thread, then a
 * barrier) makes every item's choice, kvp_spf_plan_load (one thread, then a barrier) loads the
 * blocks they chose, and each item takes its choice from kvp_spf_planned. kvp_spf_staged: this
 * layer was staged so. */
const uint8_t *kvp_spf_stage_first(struct kvp_spf *s, const struct kvp_ctx *c, int l);
bool kvp_spf_staged(const struct kvp_spf *s);
void kvp_spf_plan(struct kvp_spf *s, struct kvp_ctx *c, int l, int ith, int nth,
                  struct kvp_thread_scratch *ts);
void kvp_spf_plan_load(struct kvp_spf *s, struct kvp_ctx *c, int l);
int kvp_spf_planned(const struct kvp_spf *s, int kvh, int chunk, int n_chunks,
                    const struct kvp_key_run **runs, int *n_cols, double *est_s);

/* Counters of thread ith: seconds estimating and attending, keys read and seen in layer l. */
void kvp_spf_count(struct kvp_spf *s, int ith, int l, double est_s, double attn_s, double read,
                   double seen);
void kvp_spf_count_tokens(struct kvp_spf *s, int n);

/* For tests and measurements, between passes: */
/* Measuring (off by default): every sparse choice also computes the block's dense attention and
 * counts the mean share of it the picked keys hold (the recovery) and the share a random pick of
 * as many blocks would hold in expectation. kvp_spf_recovery: layer l's means since the stats'
 * reset, or -1 when nothing was measured. */
void kvp_spf_measure(struct kvp_spf *s, bool on);
int kvp_spf_recovery(const struct kvp_spf *s, int layer, double *rec, double *rec_random);
/* Called with every sparse choice (from the pool's threads; p0: the block's first position). */
typedef void (*kvp_spf_observer)(void *user, int l, int kvh, int p0, int nq, int n_keys,
                                 const struct kvp_key_run *runs, int n_runs);
void kvp_spf_set_observer(struct kvp_spf *s, kvp_spf_observer fn, void *user);
/* Collecting the learned gate's training items (policy learned only; off by default): every
 * choice that ranks blocks also computes each head's dense attention share per key block and
 * hands it over with what the gate reads. Called from the pool's threads at once: the collector
 * locks what it shares. The pointers hold for the call only. */
struct kvp_spf_sample {
    int l, kvh, qu;        /* layer, KV head, the query block's first position / block */
    int U, n_keys, block;  /* key blocks, keys the last query sees, keys per block */
    int g, hd, n_pick;     /* heads of the group, head_dim, blocks the budget adds */
    const uint8_t *forced; /* [U] the sink's and the window's blocks */
    const float *qbar;     /* [g][hd] the block's mean query per head */
    const float *stats;    /* [U][3 hd] each key block's mean, max and min key */
    const float *mass;     /* [g][U] each head's dense attention share (mean over the queries) */
};
typedef void (*kvp_spf_collector)(void *user, const struct kvp_spf_sample *smp);
void kvp_spf_set_collector(struct kvp_spf *s, kvp_spf_collector fn, void *user);
/* A public gate holding a copy of g (tests and the trainer, which make gates in memory). */
struct kvp_pgate;
int kvp_spf_gate_from(const struct kvp_pgate *g, struct kvp_prefill_gate **out,
                      struct kvp_err *err);
/* The context's state (NULL before kvp_ctx_set_prefill). */
struct kvp_spf *kvp_ctx_spf(kvp_ctx *c);

void kvp_spf_stats(const struct kvp_spf *s, struct kvp_prefill_stats *st);
double kvp_spf_density(const struct kvp_spf *s, int layer);
void kvp_spf_reset_stats(struct kvp_spf *s);

#endif
