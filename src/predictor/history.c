/*
 * Attention history: a ring of H pooled rows per series (see history.h). The ring avoids moving
 * H × W floats per step; kvp_hist_rows hands the CNN row pointers in age order instead.
 */
#include "predictor/history.h"

#include <stdlib.h>
#include <string.h>

int kvp_hist_init(struct kvp_hist *h, int n_series, int H, int max_cols, struct kvp_err *err)
{
    memset(h, 0, sizeof(*h));
    if (n_series < 0 || H < 1 || max_cols < 1)
        return kvp_err_set(err, KVP_EINVAL, "history: bad shape %d × %d × %d", n_series, H,
                           max_cols);
    size_t ns = n_series > 0 ? (size_t)n_series : 1;
    h->n_series = n_series;
    h->H = H;
    h->max_cols = max_cols;
    h->rows = calloc(ns * H * (size_t)max_cols, sizeof(float));
    h->slot_w = calloc(ns * H, sizeof(int));
    h->head = calloc(ns, sizeof(int));
    h->n_rows = calloc(ns, sizeof(int));
    h->n_cols = calloc(ns, sizeof(int));
    h->gen = calloc(ns, sizeof(uint64_t));
    if (!h->rows || !h->slot_w || !h->head || !h->n_rows || !h->n_cols || !h->gen) {
        kvp_hist_free(h);
        return kvp_err_set(err, KVP_ENOMEM, "history: out of memory (%d × %d × %d floats)",
                           n_series, H, max_cols);
    }
    return 0;
}

void kvp_hist_free(struct kvp_hist *h)
{
    if (!h)
        return;
    free(h->rows);
    free(h->slot_w);
    free(h->head);
    free(h->n_rows);
    free(h->n_cols);
    free(h->gen);
    memset(h, 0, sizeof(*h));
}

void kvp_hist_clear(struct kvp_hist *h, int s)
{
    for (int i = 0; i < h->H; i++) {
        int *w = &h->slot_w[(size_t)s * h->H + i];
        memset(h->rows + ((size_t)s * h->H + i) * h->max_cols, 0, (size_t)*w * sizeof(float));
        *w = 0;
    }
    h->head[s] = h->n_rows[s] = h->n_cols[s] = 0;
}

void kvp_hist_reset(struct kvp_hist *h)
{
    for (int s = 0; s < h->n_series; s++) {
        kvp_hist_clear(h, s);
        h->gen[s] = 0;
    }
}

/* The slot the next row of series s goes to (the oldest when H rows are present), with the
 * ring's bookkeeping done; *old_w gets the width of the row the slot held. */
static float *next_slot(struct kvp_hist *h, int s, int n_cols, int *old_w)
{
    int slot;
    if (h->n_rows[s] < h->H) {
        slot = (h->head[s] + h->n_rows[s]) % h->H;
        h->n_rows[s]++;
    } else { /* full: the oldest slot becomes the newest row */
        slot = h->head[s];
        h->head[s] = (h->head[s] + 1) % h->H;
    }
    int *w = &h->slot_w[(size_t)s * h->H + slot];
    *old_w = *w;
    *w = n_cols;
    if (n_cols > h->n_cols[s])
        h->n_cols[s] = n_cols;
    h->gen[s]++;
    return h->rows + ((size_t)s * h->H + slot) * h->max_cols;
}

void kvp_hist_append(struct kvp_hist *h, int s, const float *row, int n_cols)
{
    if (n_cols > h->max_cols)
        n_cols = h->max_cols;
    int old_w;
    float *dst = next_slot(h, s, n_cols, &old_w);
    memcpy(dst, row, (size_t)n_cols * sizeof(float));
    if (old_w > n_cols) /* leftovers of the row this slot held before (after a truncation) */
        memset(dst + n_cols, 0, (size_t)(old_w - n_cols) * sizeof(float));
}

void kvp_hist_append_sparse(struct kvp_hist *h, int s, const int32_t *cols, const float *vals,
                            int n, int n_cols)
{
    if (n_cols > h->max_cols)
        n_cols = h->max_cols;
    int old_w;
    float *dst = next_slot(h, s, n_cols, &old_w);
    memset(dst, 0, (size_t)(old_w > n_cols ? old_w : n_cols) * sizeof(float));
    for (int i = 0; i < n; i++)
        if (cols[i] >= 0 && cols[i] < n_cols)
            dst[cols[i]] = vals[i];
}

int kvp_hist_rows(const struct kvp_hist *h, int s, const float **ptrs)
{
    for (int i = 0; i < h->n_rows[s]; i++)
        ptrs[i] = h->rows + ((size_t)s * h->H + (h->head[s] + i) % h->H) * h->max_cols;
    return h->n_rows[s];
}

int kvp_hist_pool_dense(const float *probs, int n_keys, int bs, float *out)
{
    int nb = (n_keys + bs - 1) / bs;
    for (int j = 0; j < nb; j++) {
        int e = (j + 1) * bs < n_keys ? (j + 1) * bs : n_keys;
        out[j] = kvp_hist_block_max(probs + (size_t)j * bs, e - j * bs);
    }
    return nb;
}

int kvp_hist_scatter_sparse(const float *bmax, const int32_t *blocks, int n_sel, int n_keys, int bs,
                            float *out)
{
    int nb = (n_keys + bs - 1) / bs;
    memset(out, 0, (size_t)nb * sizeof(float));
    for (int i = 0; i < n_sel; i++) {
        int b = blocks[i];
        if (b < 0 || b >= nb)
            continue;
        out[b] = bmax[i] > 0.0f ? bmax[i] : 0.0f; /* kvp_hist_block_max starts at 0 */
    }
    return nb;
}

bool kvp_hist_step(struct kvp_hist *h, int s, int step, int M, const float *sparse_row,
                   const float *dense_row, int n_cols)
{
    bool calib = kvp_hist_is_calibration(step, M) && dense_row;
    kvp_hist_append(h, s, calib ? dense_row : sparse_row, n_cols);
    return calib;
}
