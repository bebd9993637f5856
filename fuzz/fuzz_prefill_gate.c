/*
 * libFuzzer target for the learned prefill gate file (.kvpg, src/predictor/prefill_gate.c): parse
 * the input, and again with its checksum fixed up (so mutations reach the checks behind it). A
 * gate the parser accepts must be safe to use: its query vector and distance prior are computed
 * for one head of its first and last (layer, KV head).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "predictor/prefill_gate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void parse_one(const uint8_t *buf, size_t size)
{
    struct kvp_pgate g;
    struct kvp_err err;
    if (kvp_pgate_parse(buf, size, &g, &err) < 0)
        return;
    if (g.n_layer < 1 || g.n_kv < 1 || g.hd < 1 || g.block < 1 || g.nw != 3 * g.hd + 2 ||
        g.model[sizeof(g.model) - 1] != 0)
        abort(); /* the parser promised a plausible gate */
    float *q = calloc((size_t)g.hd, sizeof(float)), *out = malloc((size_t)3 * g.hd * sizeof(float));
    if (q && out) {
        for (int d = 0; d < g.hd; d++)
            q[d] = (float)(d % 3) - 1.0f;
        kvp_pgate_query(&g, 0, 0, q, out);
        kvp_pgate_query(&g, g.n_layer - 1, g.n_kv - 1, q, out);
        (void)kvp_pgate_prior(&g, g.n_layer - 1, g.n_kv - 1, 7);
    }
    free(q);
    free(out);
    kvp_pgate_free(&g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_parse_with_checksum(data, size, parse_one);
    return 0;
}
