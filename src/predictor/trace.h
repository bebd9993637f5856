/*
 * Attention traces: the training data of the predictor (`kvpred trace` writes them,
 * `kvpred train-predictor` reads them).
 *
 * A trace is recorded by decoding real text densely, one token at a time from the first token,
 * and keeping for every position t, every compressed layer (>= first_layer) and every query head
 * the dense attention row of query t over keys 0..t, pooled over blocks of b tokens twice: the
 * block max (what the history holds, docs/methods.md §1.2) and the block sum (the
 * attention mass a block would recover, what the oracle ranks by, §6). A training sample (history
 * window, next row) is then any t >= H: rows t-H .. t-1 form the history (zero-extended to the
 * width of row t-1), row t is the target, exactly the step at which the policy predicts for Lk = t
 * + 1 keys. Storing rows instead of windows keeps the file H times smaller.
 *
 * Version 2 also keeps, per position and (layer, query head), the query's Quest bound of every
 * block over the keys present, scaled by 1/√head_dim (logit units: >= the largest attention
 * logit of the block), the second input channel of the query-aware predictor (qpredictor), and
 * the KV head count, so training can pool a group as the policy does.
 *
 * File layout (little-endian, version 1 or 2):
 *   char[8]  magic "KVPTRC01"
 *   u32      version (1 or 2)
 *   u32      block_size b
 *   u32      first_layer, n_layers   recorded layers first_layer .. first_layer + n_layers - 1
 *   u32      n_head                  query heads per layer
 *   u32      n_seq                   sequences
 *   u32      n_head_kv               (version 2 only)
 *   char[64] model name (NUL padded)
 *   n_seq × sequence:
 *     u32    T                       tokens
 *     for t in 0 .. T-1, with nb_t = ceil((t + 1) / b):
 *       for layer, for head:  f32 max[nb_t], f32 sum[nb_t] (version 2: then f32 bound[nb_t])
 *   u64      FNV-1a 64 checksum of every byte before it
 */
#ifndef KVP_PREDICTOR_TRACE_H
#define KVP_PREDICTOR_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "core/err.h"
#include "core/platform.h"
#include "kvpred.h"

struct kvp_trace_seq {
    int T;
    const float *data; /* rows of this sequence, in file order (points into the trace) */
    size_t *row_off;   /* [T] float offset of position t's first (layer 0, head 0) max row */
};

struct kvp_trace {
    int version;
    int block_size;
    int first_layer, n_layers, n_head;
    int n_head_kv; /* version 1: n_head (no grouping known) */
    int n_arr;     /* arrays per (position, layer, head): 2 (max, sum) or 3 (and bound) */
    int n_seq;
    char model[64];
    struct kvp_trace_seq *seq; /* [n_seq] (owned) */
    struct kvp_file_map map;   /* the file's bytes (owned); seq[].data points into it */
};

/* Position t's rows of (layer index li, head h) in sequence s: max then sum (then the bound in
 * version 2), nb_t floats each. */
static inline const float *kvp_trace_row(const struct kvp_trace *tr, int s, int t, int li, int h)
{
    const struct kvp_trace_seq *q = &tr->seq[s];
    int nb = (t + tr->block_size) / tr->block_size;
    return q->data + q->row_off[t] + (size_t)(li * tr->n_head + h) * tr->n_arr * nb;
}

/* Read and check a whole trace file. KVP_EFORMAT with one line for anything malformed. */
int kvp_trace_load(const char *path, struct kvp_trace *tr, struct kvp_err *err);
/* The same checks on a trace held in memory (copied; messages name it "trace"). */
int kvp_trace_parse(const void *data, size_t size, struct kvp_trace *tr, struct kvp_err *err);
void kvp_trace_free(struct kvp_trace *tr);

/* Writing: open a file announcing n_seq sequences, record them, close (writes the checksum;
 * KVP_EINVAL if fewer were recorded). */
struct kvp_trace_writer {
    FILE *f;
    uint64_t hash;
    int n_seq;  /* sequences announced at open */
    int n_done; /* sequences recorded */
    int block_size, first_layer, n_layers, n_head, n_head_kv, head_dim;
    float *row; /* [max_blocks * 3] scratch */
    struct kvp_qmeta *meta; /* the recorded layers' key bounds (quest_meta.h) */
    int max_blocks;
    int failed;
};
int kvp_trace_open(struct kvp_trace_writer *w, const char *path, const kvp_model *model,
                   int first_layer, int block_size, int max_tokens, int n_seq, struct kvp_err *err);
/* One sequence of n tokens: begin (writes its length, clears the key bounds), then for every
 * position, recorded layer and head fill w->row ([nb] block max, [nb] block sum, [nb] query
 * bound) and put it, then end. The recording loop that drives a context is
 * kvp_trace_record (eval/trace_record.h), which sits above the forward pass. */
int kvp_trace_begin_seq(struct kvp_trace_writer *w, int n, struct kvp_err *err);
void kvp_trace_put_row(struct kvp_trace_writer *w, int nb);
int kvp_trace_end_seq(struct kvp_trace_writer *w, struct kvp_err *err);
int kvp_trace_close(struct kvp_trace_writer *w, struct kvp_err *err);

#endif
