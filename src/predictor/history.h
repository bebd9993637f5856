/*
 * Attention history for AttentionPredictor (docs/methods.md §1.2, §1.5): for every series
 * (one per compressed layer and query head, or per KV head when pooled) the last H rows of
 * block-max-pooled attention probabilities, oldest row first and newest row last, as upstream
 * (MIRALab-USTC/LLM-AttentionPredictor) feeds its CNN.
 *
 * A row covers the keys present when it was written, pooled over blocks of b tokens (the cache
 * block size): column j = max of the probabilities of keys [b·j, b·j + b). When the key count
 * crosses a block boundary the history grows by one column; older rows read 0 there (zero
 * extension). Rows never change after they are appended.
 *
 * Memory layout (one allocation):
 *   rows   [n_series][H][max_cols]  ring of rows per series; slot (head + i) % H is row i
 *                                   (row 0 the oldest)
 *   slot_w [n_series][H]            columns written in each slot (the rest of it is zero)
 *   head, n_rows, n_cols, gen       [n_series]
 * max_cols = ceil(n_ctx / b): 64 rows × 1,024 columns × 4 bytes = 256 KiB per series at 16K.
 *
 * Update rules (one decode step, per series):
 *   step s = 1, 2, ... counts decode steps since the prefill;
 *   calibration step (M > 0 and s % M == 0): the appended row is the dense row, pooled;
 *   otherwise: the row of that step's sparse attention (zeros on unselected blocks), pooled.
 * Different series may be updated concurrently from different threads; one series never is.
 */
#ifndef KVP_PREDICTOR_HISTORY_H
#define KVP_PREDICTOR_HISTORY_H

#include <stdbool.h>
#include <stdint.h>

#include "core/err.h"

struct kvp_hist {
    int n_series;
    int H;         /* rows kept per series */
    int max_cols;  /* columns at the full context */
    float *rows;   /* [n_series][H][max_cols], see above (owned) */
    int *slot_w;   /* [n_series][H] (owned) */
    int *head;     /* [n_series] slot of the oldest row */
    int *n_rows;   /* [n_series] rows present, <= H */
    int *n_cols;   /* [n_series] width: columns of the widest (newest) row */
    uint64_t *gen; /* [n_series] rows ever appended (the CNN's incremental state keys on it) */
};

int kvp_hist_init(struct kvp_hist *h, int n_series, int H, int max_cols, struct kvp_err *err);
void kvp_hist_free(struct kvp_hist *h); /* accepts a zeroed struct */
/* Forget every row of every series. */
void kvp_hist_reset(struct kvp_hist *h);
/* Forget the rows of series s (its generation keeps counting, so incremental state keyed on it
 * cannot be mistaken for the new rows'). */
void kvp_hist_clear(struct kvp_hist *h, int s);

/* Append a row of n_cols values (n_cols <= max_cols) to series s, dropping the oldest row when H
 * rows are present. Rows narrower than the history are zero-extended. */
void kvp_hist_append(struct kvp_hist *h, int s, const float *row, int n_cols);

/* The same as kvp_hist_append of a row that is zero except vals[i] at column cols[i] (i < n;
 * columns outside [0, n_cols) are left out), written into the ring slot directly instead of
 * through a full-width copy. */
void kvp_hist_append_sparse(struct kvp_hist *h, int s, const int32_t *cols, const float *vals,
                            int n, int n_cols);

/* Oldest-first pointers to the rows of series s (ptrs holds H entries); returns the row count.
 * Each row has h->n_cols[s] valid columns. */
int kvp_hist_rows(const struct kvp_hist *h, int s, const float **ptrs);

/* True when decode step `step` (1-based, counted from the prefill) appends a dense row. */
static inline bool kvp_hist_is_calibration(int step, int M)
{
    return M > 0 && step > 0 && step % M == 0;
}

/* The largest of p[0..n), or 0 when all are below it (a block's pooled value).
 * In eight lanes, each the running maximum of every eighth value, then the lanes' maximum: one
 * chain of compares was a latency chain (qpredictor pools 3 heads x every selected block per
 * step). The same bits as the one chain m = p[t] > m ? p[t] : m from m = +0: that takes only
 * values above +0 (never a NaN, a -0 or a negative), so both give the largest positive value, or
 * +0 when there is none (tests/test_predictor.c, test_block_max_lanes). */
static inline float kvp_hist_block_max(const float *p, int n)
{
    float lane[8] = {0};
    int t = 0;
    for (; t + 8 <= n; t += 8)
        for (int i = 0; i < 8; i++)
            lane[i] = p[t + i] > lane[i] ? p[t + i] : lane[i];
    float m = 0.0f;
    for (; t < n; t++)
        m = p[t] > m ? p[t] : m;
    for (int i = 0; i < 8; i++)
        m = lane[i] > m ? lane[i] : m;
    return m;
}

/* Block-max-pool a dense probability row of n_keys keys: out[j] for j < ceil(n_keys / bs).
 * Returns the column count. */
int kvp_hist_pool_dense(const float *probs, int n_keys, int bs, float *out);

/* A sparse step's block-max-pooled row: bmax[i], the largest probability of the i-th of n_sel
 * selected blocks blocks[i] (what the attention hands a policy with step_block_max, equal to
 * kvp_hist_block_max over the block's probabilities; negative and NaN count as 0, as there), zero
 * on every other block; n_keys keys in all. Returns the column count. */
int kvp_hist_scatter_sparse(const float *bmax, const int32_t *blocks, int n_sel, int n_keys, int bs,
                            float *out);

/* One decode step of series s: append dense_row on calibration steps, else sparse_row (both
 * pooled, n_cols columns). Returns true when the dense row was used. */
bool kvp_hist_step(struct kvp_hist *h, int s, int step, int M, const float *sparse_row,
                   const float *dense_row, int n_cols);

#endif
