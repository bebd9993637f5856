/*
 * libFuzzer target for the attention-trace reader (KVPTRC01, src/predictor/trace.c), the input of
 * `kvpred train-predictor`: parse the input, and again with its checksum fixed up. An accepted
 * trace must be safe to index: the first and last float of every row of every position are read
 * (through kvp_trace_row, as training does), and a tiny network is validated on it, which draws
 * history windows and targets from the rows as train-predictor does.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "predictor/cnn.h"
#include "predictor/trace.h"
#include "predictor/train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void use_trace(const struct kvp_trace *tr)
{
    volatile float sink = 0;
    for (int s = 0; s < tr->n_seq; s++) {
        const struct kvp_trace_seq *q = &tr->seq[s];
        for (int t = 0; t < q->T; t++) {
            int nb = (t + tr->block_size) / tr->block_size;
            for (int li = 0; li < tr->n_layers; li++)
                for (int h = 0; h < tr->n_head; h++) {
                    const float *row = kvp_trace_row(tr, s, t, li, h);
                    sink += row[0] + row[2 * nb - 1]; /* max[0] and sum[nb - 1] */
                }
        }
    }
    (void)sink;

    struct kvp_cnn n;
    struct kvp_err err;
    if (kvp_cnn_init(&n, 2, 2, 3, 2, tr->block_size, &err) < 0)
        return;
    for (size_t i = 0; i < kvp_cnn_n_params(&n); i++)
        n.params[i] = (float)(i % 3) * 0.5f - 0.5f;
    kvp_cnn_prepare(&n);
    struct kvp_predtrain_opts o = {.c1 = 2, .c2 = 2, .k = 3, .H = 2, .val_samples = 8,
                                   .val_frac = 1.0f, .sink = tr->block_size, .local = 1,
                                   .n_budgets = 1, .budgets = {4}};
    kvp_predtrain_opts_default(&o);
    struct kvp_predtrain_report rep;
    if (kvp_predictor_validate(tr, &n, &o, &rep, &err) < 0 && tr->n_seq >= 2)
        abort(); /* a trace the reader accepted, with a validation split, must validate */
    kvp_cnn_free(&n);
}

static void parse_one(const uint8_t *buf, size_t size)
{
    struct kvp_trace tr;
    struct kvp_err err;
    if (kvp_trace_parse(buf, size, &tr, &err) < 0)
        return;
    use_trace(&tr);
    kvp_trace_free(&tr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_parse_with_checksum(data, size, parse_one);
    return 0;
}
