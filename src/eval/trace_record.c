/*
 * Recording AttentionPredictor traces from a running context: dense decode of a sequence with
 * measuring on, one row per (position, recorded layer, query head) handed to the trace writer
 * (predictor/trace.h). It lives here, above the forward pass, because it drives a context and
 * reads its KV cache for the key bounds; the file format stays in predictor/trace.c.
 */
#include "eval/trace_record.h"

#include <math.h>

#include "forward/context.h"
#include "kv/quest_meta.h"
#include "kvpred_lab.h"

int kvp_trace_record(struct kvp_trace_writer *w, kvp_ctx *ctx, const int32_t *tokens, int n,
                     struct kvp_err *err)
{
    int rc = kvp_trace_begin_seq(w, n, err);
    if (rc < 0)
        return rc;
    struct kvp_policy_params pp = {.name = "full",
                                   .dense_layers = w->first_layer ? w->first_layer : -1};
    rc = kvp_ctx_set_policy(ctx, &pp, err);
    if (rc < 0)
        return rc;
    kvp_ctx_set_measure(ctx, true);
    const int bs = w->block_size, g = w->n_head / w->n_head_kv;
    const float scale = 1.0f / sqrtf((float)w->head_dim);
    for (int t = 0; t < n; t++) {
        rc = kvp_eval(ctx, tokens + t, 1, NULL, false, err);
        if (rc < 0)
            return rc;
        int nb = (t + bs) / bs;
        for (int li = 0; li < w->n_layers; li++)
            for (int h = 0; h < w->n_head; h++) {
                int n_keys = 0, layer = w->first_layer + li;
                const float *p = kvp_ctx_dense_probs(ctx, layer, h, &n_keys);
                const float *q = kvp_ctx_dense_query(ctx, layer, h);
                if (!p || !q || n_keys != t + 1)
                    return kvp_err_set(err, KVP_EINVAL, "trace: no dense row for layer %d",
                                       w->first_layer + li);
                float *mx = w->row, *sm = w->row + nb, *ub = w->row + 2 * nb;
                if (h % g == 0)
                    kvp_qmeta_fold(w->meta, kvp_ctx_kvcache(ctx), layer, h / g, n_keys);
                kvp_qmeta_bounds(w->meta, layer * w->n_head_kv + h / g, q, 1, scale, 0, nb, ub,
                                 nb);
                for (int j = 0; j < nb; j++) {
                    int e = (j + 1) * bs < n_keys ? (j + 1) * bs : n_keys;
                    float m = 0, s = 0;
                    for (int k = j * bs; k < e; k++) {
                        m = p[k] > m ? p[k] : m;
                        s += p[k];
                    }
                    mx[j] = m;
                    sm[j] = s;
                }
                kvp_trace_put_row(w, nb);
            }
    }
    return kvp_trace_end_seq(w, err);
}

