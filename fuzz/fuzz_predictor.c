/*
 * libFuzzer target for the predictor file (.kvpp, src/predictor/cnn.c): parse the input, and
 * again with its checksum fixed up (so mutations reach the checks behind the checksum). A file
 * the parser accepts must be safe to run: its network scores a small history from scratch and
 * incrementally through two steps (small networks only: c1·c2·k² <= 1024, the seed's is 36).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "predictor/cnn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void run_network(const struct kvp_cnn *n)
{
    /* c1·c2·k² multiply-adds per column and row: only small networks run, so an input stays
     * well under a millisecond (shapes, not sizes, are what can break) */
    if ((size_t)n->c1 * n->c2 * n->k * n->k > 1024)
        return;
    enum { W = 6, ROWS = 8 };
    static float hist[ROWS + 1][W + 1];
    const float *rows[ROWS + 1];
    for (int r = 0; r <= ROWS; r++) {
        for (int x = 0; x <= W; x++)
            hist[r][x] = (float)((r * 7 + x * 3) % 5) * 0.25f;
        rows[r] = hist[r];
    }
    int nr = n->H < ROWS ? n->H : ROWS;
    struct kvp_cnn_scratch s;
    struct kvp_cnn_inc st;
    struct kvp_err err;
    if (kvp_cnn_scratch_init(&s, n, W + 1, &err) < 0)
        return;
    if (kvp_cnn_inc_init(&st, n, W + 1, &err) < 0) {
        kvp_cnn_scratch_free(&s);
        return;
    }
    float scores[W + 1];
    struct kvp_cnn_input in = {.rows = rows, .n_rows = nr, .col0 = 0, .W = W};
    kvp_cnn_forward(n, &in, &s, scores);
    kvp_cnn_forward_inc(n, &in, 1, false, &st, &s, scores);
    /* moved by a row, one column more */
    struct kvp_cnn_input next = {.rows = rows + 1, .n_rows = nr, .col0 = 0, .W = W + 1};
    kvp_cnn_forward_inc(n, &next, 2, false, &st, &s, scores);
    kvp_cnn_inc_free(&st);
    kvp_cnn_scratch_free(&s);
}

static void parse_one(const uint8_t *buf, size_t size)
{
    struct kvp_cnn n;
    struct kvp_err err;
    if (kvp_cnn_parse(buf, size, &n, &err) < 0)
        return;
    if (n.c1 < 1 || n.c2 < 1 || n.k < 1 || n.k % 2 == 0 || n.H < 1 || n.block_size < 1 ||
        n.meta.n_rec > KVP_CNN_MAX_REC || n.meta.model[sizeof(n.meta.model) - 1] != 0)
        abort(); /* the parser promised a plausible network */
    run_network(&n);
    kvp_cnn_free(&n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_parse_with_checksum(data, size, parse_one);
    return 0;
}
