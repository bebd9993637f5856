/*
 * `kvpred quantize` as a library function (see quantize.h).
 *
 * The input GGUF stays mapped; metadata records are re-encoded one by one through the writer's
 * typed setters (so the output is a clean v3 file even when the input is v2), tensors that keep
 * their type are borrowed straight from the mapping, and each converted matrix is decoded one row
 * at a time to f32 (the type table's to_f32) and re-encoded with the target's reference
 * quantizer (from_f32). Which 2-D tensors change type follows llama.cpp's `quantize` tool: all of
 * them, token_embd and output included, unless keep_output is set; when a row length is not a
 * multiple of the target's block size the matrix falls back as docs/formats.md §4.5
 * describes, which is how Q4_K_M files of models such as Qwen2-0.5B end up holding Q5_0 and Q8_0
 * tensors.
 */
#include "model/quantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/err.h"
#include "core/threadpool.h"
#include "kernels/types.h"
#include "gguf/gguf.h"

/* ---- target types ------------------------------------------------------------------------- */

struct target {
    const char *name;
    int type;
    int fallback;   /* -1: F16 directly */
    uint32_t ftype; /* general.file_type */
};

static const struct target targets[] = {
    {"F32", KVP_TYPE_F32, -1, 0},
    {"F16", KVP_TYPE_F16, -1, 1},
    {"BF16", KVP_TYPE_BF16, -1, 32},
    {"Q8_0", KVP_TYPE_Q8_0, -1, 7},
    {"Q4_0", KVP_TYPE_Q4_0, -1, 2},
    {"Q4_1", KVP_TYPE_Q4_1, -1, 3},
    {"Q5_0", KVP_TYPE_Q5_0, -1, 8},
    {"Q5_1", KVP_TYPE_Q5_1, -1, 9},
    {"IQ4_NL", KVP_TYPE_IQ4_NL, -1, 25},
    {"Q2_K", KVP_TYPE_Q2_K, KVP_TYPE_IQ4_NL, 10},
    {"Q3_K", KVP_TYPE_Q3_K, KVP_TYPE_IQ4_NL, 11},
    {"Q4_K", KVP_TYPE_Q4_K, KVP_TYPE_Q5_0, 14},
    {"Q5_K", KVP_TYPE_Q5_K, KVP_TYPE_Q5_1, 16},
    {"Q6_K", KVP_TYPE_Q6_K, KVP_TYPE_Q8_0, 18},
};
#define N_TARGETS (sizeof(targets) / sizeof(targets[0]))

static const struct target *find_target(int type)
{
    for (size_t i = 0; i < N_TARGETS; i++)
        if (targets[i].type == type)
            return &targets[i];
    return NULL;
}

int kvp_quantize_type_from_name(const char *name)
{
    for (size_t i = 0; name && i < N_TARGETS; i++)
        if (strcasecmp(name, targets[i].name) == 0)
            return targets[i].type;
    return -1;
}

uint32_t kvp_quantize_ftype(int type)
{
    const struct target *t = find_target(type);
    return t ? t->ftype : 0;
}

static bool divides(int type, int64_t ne0)
{
    const struct kvp_type_traits *tt = kvp_type_traits(type);
    return tt && ne0 % tt->blck_size == 0;
}

int kvp_quantize_pick_type(int type, int64_t ne0)
{
    const struct target *t = find_target(type);
    if (!t)
        return -1;
    if (divides(type, ne0))
        return type;
    if (t->fallback >= 0 && divides(t->fallback, ne0))
        return t->fallback;
    return KVP_TYPE_F16;
}

/* ---- metadata ----------------------------------------------------------------------------- */

/* Copy an array record through the writer. */
static int copy_array(struct kvp_gguf_writer *w, const struct kvp_gguf_kv *kv)
{
    size_t n = (size_t)kv->count;
    int rc;
    if (kv->arr_type == KVP_GGUF_STRING) {
        const char **strs = calloc(n ? n : 1, sizeof(*strs));
        size_t *lens = calloc(n ? n : 1, sizeof(*lens));
        if (!strs || !lens) {
            free(strs);
            free(lens);
            return KVP_ENOMEM;
        }
        for (size_t i = 0; i < n; i++)
            kvp_gguf_arr_str(kv, i, &strs[i], &lens[i]);
        rc = kvp_gguf_writer_set_arr_str(w, kv->key, strs, lens, n);
        free(strs);
        free(lens);
        return rc;
    }
    if (kv->arr_type == KVP_GGUF_BOOL) { /* the writer takes bool[]; the file holds bytes */
        bool *b = malloc(n ? n : 1);
        if (!b)
            return KVP_ENOMEM;
        for (size_t i = 0; i < n; i++)
            b[i] = kv->data[i] != 0;
        rc = kvp_gguf_writer_set_arr(w, kv->key, KVP_GGUF_BOOL, b, n);
        free(b);
        return rc;
    }
    /* packed little-endian elements: the host's layout on every platform kvpred builds for */
    return kvp_gguf_writer_set_arr(w, kv->key, kv->arr_type, kv->data, n);
}

static int copy_kv(struct kvp_gguf_writer *w, const struct kvp_gguf_kv *kv)
{
    if (kv->type == KVP_GGUF_STRING)
        return kvp_gguf_writer_set_strn(w, kv->key, (const char *)kv->data, (size_t)kv->count);
    if (kv->type == KVP_GGUF_ARRAY)
        return copy_array(w, kv);
    if (kv->type == KVP_GGUF_BOOL) {
        bool b = kv->data[0] != 0;
        return kvp_gguf_writer_set_scalar(w, kv->key, KVP_GGUF_BOOL, &b);
    }
    uint8_t v[8]; /* the widest scalar; data may be unaligned */
    static const uint8_t size[KVP_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (kv->type >= KVP_GGUF_VTYPE_COUNT || size[kv->type] == 0)
        return KVP_EFORMAT;
    memcpy(v, kv->data, size[kv->type]);
    return kvp_gguf_writer_set_scalar(w, kv->key, kv->type, v);
}

/* ---- tensors ------------------------------------------------------------------------------ */

/* One tensor's conversion, split by rows over the pool's threads. */
struct conv_job {
    const struct kvp_type_traits *src, *dst;
    const uint8_t *in; /* borrowed: the tensor in the mapping */
    uint8_t *out;      /* [rows][dst_row] */
    size_t src_row, dst_row;
    int64_t ne0, rows;
    float *scratch;   /* [nth][ne0] */
    int64_t *bad_row; /* [nth]: first row with a non-finite weight, or -1 */
};

static void conv_rows(void *ctx, int ith, int nth)
{
    struct conv_job *j = ctx;
    long r0, r1;
    kvp_split_range((long)j->rows, ith, nth, &r0, &r1);
    float *row = j->scratch + (size_t)ith * (size_t)j->ne0;
    j->bad_row[ith] = -1;
    for (long r = r0; r < r1; r++) {
        j->src->to_f32(j->in + (size_t)r * j->src_row, row, j->ne0);
        for (int64_t i = 0; i < j->ne0; i++)
            if (!isfinite(row[i])) {
                j->bad_row[ith] = r;
                return;
            }
        j->dst->from_f32(row, j->out + (size_t)r * j->dst_row, j->ne0);
    }
}

/* Decode every row of t to f32 and encode it as type `to` into a new buffer (*out, owned by the
 * caller), rows split over pool. Returns 0 or a negative code with err filled in. */
static int convert_tensor(const struct kvp_gguf_tensor *t, int to, struct kvp_pool *pool,
                          void **out, size_t *out_bytes, struct kvp_err *err)
{
    const struct kvp_type_traits *src = kvp_type_traits((int)t->type);
    const struct kvp_type_traits *dst = kvp_type_traits(to);
    if (!src || !src->supported || !src->to_f32)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor %s: cannot decode type %s", t->name,
                           kvp_type_name((int)t->type));
    int nth = kvp_pool_size(pool);
    struct conv_job j = {.src = src,
                         .dst = dst,
                         .in = t->data,
                         .ne0 = t->ne[0],
                         .rows = t->ne[1] * t->ne[2] * t->ne[3]};
    size_t total;
    if (!kvp_type_row_bytes((int)t->type, j.ne0, &j.src_row) ||
        !kvp_type_row_bytes(to, j.ne0, &j.dst_row) ||
        __builtin_mul_overflow(j.dst_row, (size_t)j.rows, &total))
        return kvp_err_set(err, KVP_EFORMAT, "tensor %s: bad row size for %s", t->name, dst->name);
    j.out = malloc(total ? total : 1);
    j.scratch = malloc((size_t)nth * (size_t)j.ne0 * sizeof(float));
    j.bad_row = malloc((size_t)nth * sizeof(int64_t));
    if (!j.out || !j.scratch || !j.bad_row) {
        kvp_err_set(err, KVP_ENOMEM, "tensor %s: out of memory (%zu bytes)", t->name, total);
        goto fail_free;
    }
    kvp_pool_run(pool, conv_rows, &j);
    for (int i = 0; i < nth; i++)
        if (j.bad_row[i] >= 0) {
            kvp_err_set(err, KVP_ERANGE, "tensor %s: non-finite weight in row %lld", t->name,
                        (long long)j.bad_row[i]);
            goto fail_free;
        }
    free(j.scratch);
    free(j.bad_row);
    *out = j.out;
    *out_bytes = total;
    return 0;

fail_free:
    free(j.out);
    free(j.scratch);
    free(j.bad_row);
    return err->code;
}

/* True for the tensor --keep-output protects: output.weight, or token_embd.weight when the file
 * has no output.weight (the embedding doubles as the classifier). */
static bool is_output(const struct kvp_gguf *g, const char *name)
{
    if (strcmp(name, "output.weight") == 0)
        return true;
    return strcmp(name, "token_embd.weight") == 0 && !kvp_gguf_find_tensor(g, "output.weight");
}

/* Type tensor t is written in. */
static int choose_type(const struct kvp_gguf *g, const struct kvp_gguf_tensor *t,
                       const struct kvp_quantize_params *p)
{
    bool matrix = t->n_dims == 2;
    if (!matrix || (p->keep_output && is_output(g, t->name)))
        return (int)t->type;
    return kvp_quantize_pick_type(p->type, t->ne[0]);
}

/* Add every tensor to w; converted buffers are appended to bufs (n_bufs counts them). */
static int add_tensors(const struct kvp_gguf *g, struct kvp_gguf_writer *w,
                       const struct kvp_quantize_params *p, struct kvp_pool *pool, void **bufs,
                       size_t *n_bufs, struct kvp_quantize_stats *st, struct kvp_err *err)
{
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct kvp_gguf_tensor *t = &g->tensors[i];
        int to = choose_type(g, t, p);
        const void *data = t->data;
        size_t nbytes = t->nbytes;
        int rc;
        if (to != (int)t->type) {
            void *buf = NULL;
            if ((rc = convert_tensor(t, to, pool, &buf, &nbytes, err)) < 0)
                return rc;
            bufs[(*n_bufs)++] = buf;
            data = buf;
            if (to == p->type)
                st->n_converted++;
            else
                st->n_fallback++;
        } else if (t->n_dims == 2 && to == p->type && !(p->keep_output && is_output(g, t->name))) {
            st->n_converted++; /* already in the target type: copied as is */
        } else {
            st->n_kept++;
        }
        st->bytes_in += t->nbytes;
        st->bytes_out += nbytes;
        rc = kvp_gguf_writer_add_tensor(w, t->name, to, (int)t->n_dims, t->ne, data);
        if (rc < 0)
            return kvp_err_set(err, rc, "tensor %s: cannot add to the output (%s)", t->name,
                               kvp_strerror(rc));
    }
    st->n_tensors = (int)g->n_tensors;
    return 0;
}

static int add_metadata(const struct kvp_gguf *g, struct kvp_gguf_writer *w,
                        const struct kvp_quantize_params *p, struct kvp_err *err)
{
    for (uint64_t i = 0; i < g->n_kv; i++) {
        int rc = copy_kv(w, &g->kv[i]);
        if (rc < 0)
            return kvp_err_set(err, rc, "metadata %s: cannot copy (%s)", g->kv[i].key,
                               kvp_strerror(rc));
    }
    /* replaced in place when the input has them, appended otherwise */
    int rc = kvp_gguf_writer_set_u32(w, "general.file_type", kvp_quantize_ftype(p->type));
    const struct kvp_type_traits *tt = kvp_type_traits(p->type);
    if (rc == 0 && tt && tt->blck_size > 1)
        rc = kvp_gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (rc < 0)
        return kvp_err_set(err, rc, "metadata: cannot set general.file_type");
    return 0;
}

int kvp_quantize_file(const char *in_path, const char *out_path,
                      const struct kvp_quantize_params *p, struct kvp_quantize_stats *stats,
                      struct kvp_err *err)
{
    struct kvp_err scratch;
    struct kvp_quantize_stats st = {0};
    struct kvp_gguf *g = NULL;
    struct kvp_gguf_writer *w = NULL;
    struct kvp_pool *pool = NULL;
    void **bufs = NULL;
    size_t n_bufs = 0;
    int rc;
    if (!err)
        err = &scratch;
    if (!in_path || !out_path || !p)
        return kvp_err_set(err, KVP_EINVAL, "quantize: input, output and parameters required");
    const struct kvp_type_traits *tt = kvp_type_traits(p->type);
    if (!find_target(p->type) || !tt || !tt->supported)
        return kvp_err_set(err, KVP_EINVAL, "quantize: %s is not a target type",
                           kvp_type_name(p->type));

    if ((rc = kvp_gguf_open(in_path, &g, err)) < 0)
        return rc;
    bufs = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*bufs));
    if (!bufs) {
        rc = kvp_err_set(err, KVP_ENOMEM, "quantize: out of memory");
        goto out_close;
    }
    if ((rc = kvp_pool_init(p->n_threads > 0 ? p->n_threads : 1, &pool, err)) < 0)
        goto out_free_bufs;
    if ((rc = kvp_gguf_writer_init(&w, err)) < 0)
        goto out_free_pool;
    if ((rc = add_metadata(g, w, p, err)) < 0 ||
        (rc = add_tensors(g, w, p, pool, bufs, &n_bufs, &st, err)) < 0)
        goto out_free_writer;
    rc = kvp_gguf_writer_write_file(w, out_path, err);
    if (rc == 0 && stats)
        *stats = st;

out_free_writer:
    kvp_gguf_writer_free(w);
out_free_pool:
    kvp_pool_free(pool);
out_free_bufs:
    for (size_t i = 0; i < n_bufs; i++)
        free(bufs[i]);
    free(bufs);
out_close:
    kvp_gguf_close(g);
    return rc < 0 ? rc : 0;
}
