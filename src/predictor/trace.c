/*
 * Attention traces (see trace.h): recording through the engine's measuring mode, and a checked
 * reader that indexes every row once so training can jump to any (sequence, position).
 */
#include "predictor/trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cursor.h"
#include "kv/quest_meta.h"

static const char trace_magic[8] = {'K', 'V', 'P', 'T', 'R', 'C', '0', '1'};
#define TRACE_MAX_T (1 << 20)

static void hash_bytes(uint64_t *h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        *h ^= b[i];
        *h *= 1099511628211ULL;
    }
}

/* ---- writing ------------------------------------------------------------------------------- */

static void w_put(struct kvp_trace_writer *w, const void *p, size_t n)
{
    if (w->failed)
        return;
    hash_bytes(&w->hash, p, n);
    if (fwrite(p, 1, n, w->f) != n)
        w->failed = 1;
}

static void w_u32(struct kvp_trace_writer *w, uint32_t v)
{
    w_put(w, &v, 4);
}

int kvp_trace_open(struct kvp_trace_writer *w, const char *path, const kvp_model *model,
                   int first_layer, int block_size, int max_tokens, int n_seq, struct kvp_err *err)
{
    struct kvp_model_info in;
    kvp_model_get_info(model, &in);
    memset(w, 0, sizeof(*w));
    if (first_layer < 0 || first_layer >= in.n_layer || block_size < 1 || block_size > 64 ||
        max_tokens < 1 || max_tokens > TRACE_MAX_T || n_seq < 0)
        return kvp_err_set(err, KVP_EINVAL,
                           "trace: bad parameters (first layer %d of %d, block %d, %d tokens)",
                           first_layer, in.n_layer, block_size, max_tokens);
    w->hash = 14695981039346656037ULL;
    w->block_size = block_size;
    w->first_layer = first_layer;
    w->n_layers = in.n_layer - first_layer;
    w->n_head = in.n_head;
    w->n_head_kv = in.n_head_kv;
    w->head_dim = in.head_dim;
    w->n_seq = n_seq;
    w->max_blocks = (max_tokens + block_size - 1) / block_size;
    w->row = malloc((size_t)w->max_blocks * 3 * sizeof(float));
    w->meta = calloc(1, sizeof(*w->meta));
    if (!w->row || !w->meta ||
        kvp_qmeta_init(w->meta, in.n_layer, in.n_head_kv, w->max_blocks, in.head_dim,
                       block_size) < 0) {
        free(w->row);
        free(w->meta);
        w->row = NULL;
        w->meta = NULL;
        return kvp_err_set(err, KVP_ENOMEM, "trace: out of memory");
    }
    w->f = fopen(path, "wb");
    if (!w->f) {
        kvp_qmeta_free(w->meta);
        free(w->meta);
        free(w->row);
        w->row = NULL;
        w->meta = NULL;
        return kvp_err_set(err, KVP_EIO, "%s: cannot create", path);
    }
    w_put(w, trace_magic, 8);
    w_u32(w, 2);
    w_u32(w, (uint32_t)block_size);
    w_u32(w, (uint32_t)first_layer);
    w_u32(w, (uint32_t)w->n_layers);
    w_u32(w, (uint32_t)w->n_head);
    w_u32(w, (uint32_t)n_seq);
    w_u32(w, (uint32_t)w->n_head_kv);
    char name[64] = {0};
    if (in.name)
        memcpy(name, in.name, strnlen(in.name, sizeof(name) - 1));
    w_put(w, name, sizeof(name));
    return 0;
}

int kvp_trace_begin_seq(struct kvp_trace_writer *w, int n, struct kvp_err *err)
{
    if (n < 1 || (n + w->block_size - 1) / w->block_size > w->max_blocks)
        return kvp_err_set(err, KVP_EINVAL, "trace: sequence of %d tokens does not fit", n);
    if (w->n_done >= w->n_seq)
        return kvp_err_set(err, KVP_EINVAL, "trace: more sequences than announced (%d)", w->n_seq);
    kvp_qmeta_reset(w->meta);
    w_u32(w, (uint32_t)n);
    return 0;
}

void kvp_trace_put_row(struct kvp_trace_writer *w, int nb)
{
    w_put(w, w->row, (size_t)nb * 3 * sizeof(float));
}

int kvp_trace_end_seq(struct kvp_trace_writer *w, struct kvp_err *err)
{
    w->n_done++;
    if (w->failed)
        return kvp_err_set(err, KVP_EIO, "trace: write failed");
    return 0;
}

int kvp_trace_close(struct kvp_trace_writer *w, struct kvp_err *err)
{
    if (!w->f)
        return 0;
    uint64_t h = w->hash;
    if (!w->failed && fwrite(&h, 8, 1, w->f) != 1)
        w->failed = 1;
    if (fclose(w->f) != 0)
        w->failed = 1;
    w->f = NULL;
    free(w->row);
    w->row = NULL;
    kvp_qmeta_free(w->meta);
    free(w->meta);
    w->meta = NULL;
    if (w->failed)
        return kvp_err_set(err, KVP_EIO, "trace: write failed");
    if (w->n_done != w->n_seq)
        return kvp_err_set(err, KVP_EINVAL, "trace: %d of %d announced sequences recorded",
                           w->n_done, w->n_seq);
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------- */

void kvp_trace_free(struct kvp_trace *tr)
{
    if (!tr)
        return;
    if (tr->seq)
        for (int s = 0; s < tr->n_seq; s++)
            free(tr->seq[s].row_off);
    free(tr->seq);
    kvp_file_unmap(&tr->map);
    memset(tr, 0, sizeof(*tr));
}

#define BAD(...) (kvp_err_set(err, KVP_EFORMAT, __VA_ARGS__), kvp_trace_free(tr), KVP_EFORMAT)

/* Check and index the bytes in tr->map (path names them in messages). */
static int trace_index(const char *path, struct kvp_trace *tr, struct kvp_err *err)
{
    struct kvp_cursor c;
    kvp_cursor_init(&c, tr->map.data, tr->map.size);
    const uint8_t *magic, *name;
    uint32_t h[7];
    if (kvp_rd_bytes(&c, 8, &magic) < 0)
        return BAD("%s: trace truncated", path);
    if (memcmp(magic, trace_magic, 8) != 0)
        return BAD("%s: not a kvpred trace (bad magic)", path);
    for (int i = 0; i < 6; i++)
        if (kvp_rd_u32(&c, &h[i]) < 0)
            return BAD("%s: trace truncated", path);
    if (h[0] != 1 && h[0] != 2)
        return BAD("%s: trace version %u (this build reads 1 and 2)", path, h[0]);
    h[6] = h[4];
    if (h[0] == 2 && kvp_rd_u32(&c, &h[6]) < 0)
        return BAD("%s: trace truncated", path);
    if (h[1] < 1 || h[1] > 64 || h[3] < 1 || h[3] > 1024 || h[4] < 1 || h[4] > 1024 ||
        h[2] > 1024 || h[5] > (1u << 24) || h[6] < 1 || h[4] % h[6] != 0)
        return BAD("%s: implausible trace header", path);
    tr->version = (int)h[0];
    tr->n_arr = h[0] == 2 ? 3 : 2;
    tr->n_head_kv = (int)h[6];
    if (kvp_rd_bytes(&c, 64, &name) < 0)
        return BAD("%s: trace truncated", path);
    tr->block_size = (int)h[1];
    tr->first_layer = (int)h[2];
    tr->n_layers = (int)h[3];
    tr->n_head = (int)h[4];
    memcpy(tr->model, name, 63);
    tr->model[63] = 0;
    const size_t per_blk = (size_t)h[3] * h[4] * tr->n_arr; /* floats per block column */
    /* a sequence takes at least its count and one block column: no allocation the bytes left
     * cannot back */
    if (h[5] > kvp_cursor_left(&c) / (4 + 4 * per_blk))
        return BAD("%s: trace truncated (%u sequences announced)", path, h[5]);
    tr->seq = calloc(h[5] ? h[5] : 1, sizeof(*tr->seq));
    if (!tr->seq) {
        kvp_trace_free(tr);
        return kvp_err_set(err, KVP_ENOMEM, "trace: out of memory");
    }
    tr->n_seq = (int)h[5];
    for (int s = 0; s < tr->n_seq; s++) {
        uint32_t T;
        if (kvp_rd_u32(&c, &T) < 0)
            return BAD("%s: trace truncated (sequence %d)", path, s);
        if (T < 1 || T > TRACE_MAX_T)
            return BAD("%s: sequence %d has %u tokens", path, s, T);
        if (T > kvp_cursor_left(&c) / (4 * per_blk)) /* every position has a block column */
            return BAD("%s: trace truncated (sequence %d)", path, s);
        struct kvp_trace_seq *q = &tr->seq[s];
        q->T = (int)T;
        q->row_off = malloc((size_t)T * sizeof(size_t));
        if (!q->row_off) {
            kvp_trace_free(tr);
            return kvp_err_set(err, KVP_ENOMEM, "trace: out of memory");
        }
        size_t off = 0;
        for (uint32_t t = 0; t < T; t++) {
            q->row_off[t] = off;
            off += (size_t)((t + h[1]) / h[1]) * per_blk;
        }
        const uint8_t *bytes;
        if (off > SIZE_MAX / 4 || kvp_rd_bytes(&c, off * 4, &bytes) < 0)
            return BAD("%s: trace truncated (sequence %d)", path, s);
        q->data = (const float *)bytes; /* 4-byte aligned: every field before is 4 bytes */
    }
    size_t body = c.pos;
    uint64_t sum, want = 14695981039346656037ULL;
    if (kvp_rd_u64(&c, &sum) < 0)
        return BAD("%s: trace truncated (checksum)", path);
    if (kvp_cursor_left(&c) != 0)
        return BAD("%s: %zu unexpected bytes after the trace", path, kvp_cursor_left(&c));
    hash_bytes(&want, tr->map.data, body);
    if (sum != want)
        return BAD("%s: trace corrupted (checksum mismatch)", path);
    return 0;
}

int kvp_trace_load(const char *path, struct kvp_trace *tr, struct kvp_err *err)
{
    memset(tr, 0, sizeof(*tr));
    int rc = kvp_file_map(path, &tr->map, err);
    if (rc < 0)
        return kvp_err_prefix(err, "trace");
    return trace_index(path, tr, err);
}

int kvp_trace_parse(const void *data, size_t size, struct kvp_trace *tr, struct kvp_err *err)
{
    memset(tr, 0, sizeof(*tr));
    if (!data && size)
        return kvp_err_set(err, KVP_EINVAL, "kvp_trace_parse: NULL data");
    if (size) { /* a heap copy, as kvp_file_map makes when it cannot map: aligned and owned */
        tr->map.heap = malloc(size);
        if (!tr->map.heap)
            return kvp_err_set(err, KVP_ENOMEM, "trace: out of memory");
        memcpy(tr->map.heap, data, size);
        tr->map.data = tr->map.heap;
        tr->map.size = size;
    }
    return trace_index("trace", tr, err);
}
