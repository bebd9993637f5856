/*
 * GGUF reader (docs/formats.md §1): header, metadata records, tensor records, and every
 * safety check the container needs before anything points into the tensor data.
 *
 * The file is untrusted. All bytes are decoded through a struct kvp_cursor, every length and
 * count is capped before it is used, and every size is computed with overflow-checked arithmetic.
 * Nothing is allocated from a count the file merely claims: the kv and tensor tables grow by
 * doubling as records are verified, and the only up-front allocation (the table of pointers to
 * the elements of a string array) is bounded by the bytes left in the file, since each element
 * needs at least its 8-byte length. Values and tensor data are never copied; records point into
 * the mapping (or the caller's buffer). Keys are copied once so they can be NUL-terminated.
 *
 * The workload is one open per model: a few dozen keys, a few hundred to a few thousand tensors,
 * and one or two string arrays of up to a few hundred thousand entries (vocabulary, merges). Key
 * lookup is linear, which is plenty for that; duplicate detection sorts the names once so that a
 * hostile file with a million records cannot make it quadratic.
 *
 * Conventions from the reference reader (ggml's gguf.cpp) that kvpred keeps: versions 2 and 3
 * only, a byte-swapped file is spotted by an LE version with zero low 16 bits, tensor names are
 * < 64 bytes, nested arrays are rejected, and `general.alignment` must be a nonzero power of two.
 * The spec also asks for a multiple of 8; like the reference, kvpred accepts 1, 2 and 4 too,
 * since nothing in the reader depends on it. The alignment key may have any integer type.
 *
 * Messages name what failed: "gguf: ..." for the header and metadata, "tensor NAME: ..." for a
 * tensor record. Names taken from the file are shown with non-printable bytes replaced by '?'
 * and long names shortened, so a message is always one line.
 */
#include "gguf/gguf.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/cursor.h"
#include "kernels/types.h"

#define GGUF_MAX_KEY_LEN 65535u
#define GGUF_MAX_STR_LEN (1ull << 30)   /* 1 GiB */
#define GGUF_MAX_ARR_LEN (1ull << 30)   /* elements */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MIN_KV_BYTES 13u           /* key length (8) + type (4) + smallest value (1) */
#define GGUF_MIN_TENSOR_BYTES 32u       /* name length, n_dims, one ne, type, offset */
#define SHOW_MAX 48                     /* bytes of a file-supplied name shown in a message */

/* Encoded size of each scalar value type; 0 for STRING and ARRAY (variable). */
static const uint8_t vtype_size[KVP_GGUF_VTYPE_COUNT] = {
    [KVP_GGUF_UINT8] = 1,   [KVP_GGUF_INT8] = 1,    [KVP_GGUF_UINT16] = 2,
    [KVP_GGUF_INT16] = 2,   [KVP_GGUF_UINT32] = 4,  [KVP_GGUF_INT32] = 4,
    [KVP_GGUF_FLOAT32] = 4, [KVP_GGUF_BOOL] = 1,    [KVP_GGUF_STRING] = 0,
    [KVP_GGUF_ARRAY] = 0,   [KVP_GGUF_UINT64] = 8,  [KVP_GGUF_INT64] = 8,
    [KVP_GGUF_FLOAT64] = 8,
};

static const char *const vtype_names[KVP_GGUF_VTYPE_COUNT] = {
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
    "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
};

/* ======================================================================= small helpers ===== */

static const char *vtype_name(uint32_t t)
{
    return t < KVP_GGUF_VTYPE_COUNT ? vtype_names[t] : "unknown";
}

static bool vtype_is_int(uint32_t t)
{
    return t <= KVP_GGUF_INT32 || t == KVP_GGUF_UINT64 || t == KVP_GGUF_INT64;
}

static bool vtype_is_float(uint32_t t)
{
    return t == KVP_GGUF_FLOAT32 || t == KVP_GGUF_FLOAT64;
}

/* Copy n bytes of a file-supplied name into out (SHOW_MAX + 4 bytes at least) for a message:
 * non-printable bytes become '?', and a long name is cut with "...". Returns out. */
static const char *show_name(const char *s, size_t n, char *out)
{
    size_t m = n < SHOW_MAX ? n : SHOW_MAX;
    for (size_t i = 0; i < m; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (m < n) {
        memcpy(out + m, "...", 3);
        m += 3;
    }
    out[m] = 0;
    return out;
}

/* Decode the integer value at p of integer type t into *out. Returns false when it does not fit
 * an int64_t (a UINT64 above INT64_MAX). */
static bool decode_int(uint32_t t, const uint8_t *p, int64_t *out)
{
    switch (t) {
    case KVP_GGUF_UINT8: *out = p[0]; return true;
    case KVP_GGUF_INT8: *out = (int8_t)p[0]; return true;
    case KVP_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case KVP_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case KVP_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case KVP_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case KVP_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); *out = v; return true; }
    case KVP_GGUF_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)v;
        return true;
    }
    default: return false;
    }
}

/* Decode the float value at p of float type t. */
static double decode_float(uint32_t t, const uint8_t *p)
{
    if (t == KVP_GGUF_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    double d;
    memcpy(&d, p, 8);
    return d;
}

/* ===================================================================== metadata records ===== */

/* Parse state shared by the record readers. */
struct parse {
    struct kvp_gguf *g;
    struct kvp_cursor cur;
    size_t cap_kv;      /* allocated entries in g->kv */
    size_t cap_tensors; /* allocated entries in g->tensors */
    struct kvp_err *err;
};

/* Make room for one more entry in a table of elem-sized entries holding n, with capacity *cap.
 * Returns 0 or KVP_ENOMEM. */
static int grow_table(void **table, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t new_cap = *cap ? *cap * 2 : 16;
    size_t bytes;
    if (!kvp_mul_ok(new_cap, elem, &bytes))
        return KVP_ENOMEM;
    void *p = realloc(*table, bytes);
    if (!p)
        return KVP_ENOMEM;
    memset((uint8_t *)p + n * elem, 0, bytes - n * elem);
    *table = p;
    *cap = new_cap;
    return 0;
}

/* Read the name of key record i into kv->key (owned, NUL-terminated). */
static int read_key_name(struct parse *ps, uint64_t i, struct kvp_gguf_kv *kv)
{
    uint64_t len;
    const uint8_t *bytes;
    if (kvp_rd_u64(&ps->cur, &len) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in key %" PRIu64 " name length",
                           i);
    if (len > GGUF_MAX_KEY_LEN)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: key %" PRIu64 ": name length %" PRIu64 " exceeds %u", i, len,
                           GGUF_MAX_KEY_LEN);
    if (kvp_rd_bytes(&ps->cur, (size_t)len, &bytes) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in key %" PRIu64 " name", i);
    if (memchr(bytes, 0, (size_t)len))
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: key %" PRIu64 ": name contains a NUL byte",
                           i);
    kv->key = malloc((size_t)len + 1);
    if (!kv->key)
        return kvp_err_set(ps->err, KVP_ENOMEM, "gguf: key %" PRIu64 ": out of memory", i);
    memcpy(kv->key, bytes, (size_t)len);
    kv->key[len] = 0;
    return 0;
}

/* Read one length-prefixed string (u64 length, bytes) capped at 1 GiB; *p gets the bytes. */
static int read_string(struct kvp_cursor *cur, uint64_t *len, const uint8_t **p, bool *too_long)
{
    *too_long = false;
    if (kvp_rd_u64(cur, len) < 0)
        return -1;
    if (*len > GGUF_MAX_STR_LEN) {
        *too_long = true;
        return -1;
    }
    return kvp_rd_bytes(cur, (size_t)*len, p);
}

/* Read the elements of a string array: builds kv->strs, one pointer per element to its u64
 * length prefix. The table is capped by the bytes left (8 per element at least). */
static int read_string_array(struct parse *ps, uint64_t i, struct kvp_gguf_kv *kv, const char *nm)
{
    if (kv->count > kvp_cursor_left(&ps->cur) / 8)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: truncated in key %" PRIu64 " ('%s') value: %" PRIu64
                           " strings cannot fit in the file",
                           i, nm, kv->count);
    kv->data = ps->cur.base + ps->cur.pos;
    if (kv->count == 0)
        return 0;
    kv->strs = malloc((size_t)kv->count * sizeof(*kv->strs));
    if (!kv->strs)
        return kvp_err_set(ps->err, KVP_ENOMEM, "gguf: key '%s': out of memory", nm);
    for (uint64_t e = 0; e < kv->count; e++) {
        uint64_t len;
        const uint8_t *p;
        bool too_long;
        kv->strs[e] = ps->cur.base + ps->cur.pos;
        if (read_string(&ps->cur, &len, &p, &too_long) < 0)
            return kvp_err_set(ps->err, KVP_EFORMAT,
                               too_long ? "gguf: key %" PRIu64 " ('%s'): element %" PRIu64
                                          " string length exceeds 1 GiB"
                                        : "gguf: truncated in key %" PRIu64 " ('%s') element %" PRIu64,
                               i, nm, e);
    }
    return 0;
}

/* Read the value of an ARRAY record: element type, count, then the packed elements. */
static int read_array(struct parse *ps, uint64_t i, struct kvp_gguf_kv *kv, const char *nm)
{
    if (kvp_rd_u32(&ps->cur, &kv->arr_type) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: truncated in key %" PRIu64 " ('%s') array type", i, nm);
    if (kv->arr_type == KVP_GGUF_ARRAY)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: key %" PRIu64 " ('%s'): nested arrays are not supported", i, nm);
    if (kv->arr_type >= KVP_GGUF_VTYPE_COUNT)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: key %" PRIu64 " ('%s'): unknown array element type %u", i, nm,
                           kv->arr_type);
    if (kvp_rd_u64(&ps->cur, &kv->count) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: truncated in key %" PRIu64 " ('%s') array count", i, nm);
    if (kv->count > GGUF_MAX_ARR_LEN)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: key %" PRIu64 " ('%s'): array count %" PRIu64 " exceeds 2^30",
                           i, nm, kv->count);
    if (kv->arr_type == KVP_GGUF_STRING)
        return read_string_array(ps, i, kv, nm);
    size_t bytes;
    if (!kvp_mul_ok((size_t)kv->count, vtype_size[kv->arr_type], &bytes) ||
        kvp_rd_bytes(&ps->cur, bytes, &kv->data) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in key %" PRIu64 " ('%s') value",
                           i, nm);
    return 0;
}

/* Read metadata record i: key, value type, value. */
static int read_kv(struct parse *ps, uint64_t i)
{
    struct kvp_gguf *g = ps->g;
    if (grow_table((void **)&g->kv, (size_t)g->n_kv, &ps->cap_kv, sizeof(*g->kv)) < 0)
        return kvp_err_set(ps->err, KVP_ENOMEM, "gguf: out of memory for key %" PRIu64, i);
    struct kvp_gguf_kv *kv = &g->kv[g->n_kv];
    int rc = read_key_name(ps, i, kv);
    if (rc < 0)
        return rc;
    g->n_kv++; /* from here on, close() frees the key */

    char nm[SHOW_MAX + 4];
    show_name(kv->key, strlen(kv->key), nm);
    if (kvp_rd_u32(&ps->cur, &kv->type) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in key %" PRIu64 " ('%s') type",
                           i, nm);
    if (kv->type >= KVP_GGUF_VTYPE_COUNT)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: key %" PRIu64 " ('%s'): unknown value type %u", i, nm, kv->type);
    if (kv->type == KVP_GGUF_ARRAY)
        return read_array(ps, i, kv, nm);
    if (kv->type == KVP_GGUF_STRING) {
        bool too_long;
        if (read_string(&ps->cur, &kv->count, &kv->data, &too_long) < 0)
            return kvp_err_set(ps->err, KVP_EFORMAT,
                               too_long ? "gguf: key %" PRIu64 " ('%s'): string length exceeds 1 GiB"
                                        : "gguf: truncated in key %" PRIu64 " ('%s') value",
                               i, nm);
        return 0;
    }
    kv->count = 1;
    if (kvp_rd_bytes(&ps->cur, vtype_size[kv->type], &kv->data) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in key %" PRIu64 " ('%s') value",
                           i, nm);
    return 0;
}

/* ====================================================================== duplicate names ===== */

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sort the n names (borrowed pointers) and return the first duplicated one, or NULL. */
static const char *find_duplicate(const char **names, size_t n)
{
    qsort(names, n, sizeof(*names), cmp_str_ptr);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

static int check_duplicate_keys(struct parse *ps)
{
    struct kvp_gguf *g = ps->g;
    if (g->n_kv < 2)
        return 0;
    const char **names = malloc((size_t)g->n_kv * sizeof(*names));
    if (!names)
        return kvp_err_set(ps->err, KVP_ENOMEM, "gguf: out of memory checking keys");
    for (size_t i = 0; i < g->n_kv; i++)
        names[i] = g->kv[i].key;
    const char *dup = find_duplicate(names, (size_t)g->n_kv);
    int rc = 0;
    if (dup) {
        char nm[SHOW_MAX + 4];
        rc = kvp_err_set(ps->err, KVP_EFORMAT, "gguf: duplicate key '%s'",
                         show_name(dup, strlen(dup), nm));
    }
    free(names);
    return rc;
}

static int check_duplicate_tensors(struct parse *ps)
{
    struct kvp_gguf *g = ps->g;
    if (g->n_tensors < 2)
        return 0;
    const char **names = malloc((size_t)g->n_tensors * sizeof(*names));
    if (!names)
        return kvp_err_set(ps->err, KVP_ENOMEM, "gguf: out of memory checking tensor names");
    for (size_t i = 0; i < g->n_tensors; i++)
        names[i] = g->tensors[i].name;
    const char *dup = find_duplicate(names, (size_t)g->n_tensors);
    int rc = 0;
    if (dup) {
        char nm[SHOW_MAX + 4];
        rc = kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: duplicate tensor name",
                         show_name(dup, strlen(dup), nm));
    }
    free(names);
    return rc;
}

/* ============================================================================ alignment ===== */

/* Set g->alignment from general.alignment (any integer type; nonzero power of two), or 32. */
static int read_alignment(struct parse *ps)
{
    struct kvp_gguf *g = ps->g;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t idx = kvp_gguf_find_key(g, "general.alignment");
    if (idx < 0)
        return 0;
    const struct kvp_gguf_kv *kv = &g->kv[idx];
    int64_t a;
    if (!vtype_is_int(kv->type))
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: key 'general.alignment': expected an integer, found %s",
                           vtype_name(kv->type));
    if (!decode_int(kv->type, kv->data, &a))
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: key 'general.alignment': out of range");
    if (a <= 0 || (a & (a - 1)) != 0 || (uint64_t)a > SIZE_MAX / 2)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: key 'general.alignment': %" PRId64
                           " is not a nonzero power of two",
                           a);
    g->alignment = (size_t)a;
    return 0;
}

/* ======================================================================= tensor records ===== */

/* Read the name of tensor record i into t->name; nm gets a printable copy for messages. */
static int read_tensor_name(struct parse *ps, uint64_t i, struct kvp_gguf_tensor *t, char *nm)
{
    uint64_t len;
    const uint8_t *bytes;
    if (kvp_rd_u64(&ps->cur, &len) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: truncated in tensor %" PRIu64 " name length", i);
    if (len >= KVP_GGUF_NAME_MAX)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: tensor %" PRIu64 ": name length %" PRIu64
                           " is not below %d bytes",
                           i, len, KVP_GGUF_NAME_MAX);
    if (kvp_rd_bytes(&ps->cur, (size_t)len, &bytes) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in tensor %" PRIu64 " name", i);
    if (memchr(bytes, 0, (size_t)len))
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: tensor %" PRIu64 ": name contains a NUL byte", i);
    memcpy(t->name, bytes, (size_t)len);
    t->name[len] = 0;
    show_name(t->name, (size_t)len, nm);
    return 0;
}

/* Read n_dims and ne[], checking ranges and the element-count product. */
static int read_tensor_shape(struct parse *ps, struct kvp_gguf_tensor *t, const char *nm)
{
    if (kvp_rd_u32(&ps->cur, &t->n_dims) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: truncated in n_dims", nm);
    if (t->n_dims < 1 || t->n_dims > KVP_GGUF_MAX_DIMS)
        return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: n_dims %u out of range 1..%d", nm,
                           t->n_dims, KVP_GGUF_MAX_DIMS);
    int64_t total = 1;
    for (int d = 0; d < KVP_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if ((uint32_t)d >= t->n_dims)
            continue;
        if (kvp_rd_i64(&ps->cur, &t->ne[d]) < 0)
            return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: truncated in ne[%d]", nm, d);
        if (t->ne[d] < 0)
            return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: ne[%d] = %" PRId64 " is negative",
                               nm, d, t->ne[d]);
        if (__builtin_mul_overflow(total, t->ne[d], &total))
            return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: element count overflows int64",
                               nm);
    }
    return 0;
}

/* Read the type id and compute nbytes = row bytes * ne1 * ne2 * ne3. */
static int read_tensor_type(struct parse *ps, struct kvp_gguf_tensor *t, const char *nm)
{
    if (kvp_rd_u32(&ps->cur, &t->type) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: truncated in type", nm);
    const struct kvp_type_traits *tr = t->type <= INT32_MAX ? kvp_type_traits((int)t->type) : NULL;
    if (!tr)
        return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: unknown type id %u", nm, t->type);
    if (t->ne[0] % tr->blck_size != 0)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "tensor %s: ne[0] = %" PRId64 " is not a multiple of the %s block size %d",
                           nm, t->ne[0], tr->name, tr->blck_size);
    size_t n = 0;
    bool ok = kvp_type_row_bytes((int)t->type, t->ne[0], &n);
    for (int d = 1; ok && d < KVP_GGUF_MAX_DIMS; d++)
        ok = kvp_mul_ok(n, (size_t)t->ne[d], &n);
    if (!ok)
        return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: byte size overflows", nm);
    t->nbytes = n;
    return 0;
}

/* Read tensor record i: name, shape, type, offset. Data is checked later, once data_off is known. */
static int read_tensor(struct parse *ps, uint64_t i)
{
    struct kvp_gguf *g = ps->g;
    if (grow_table((void **)&g->tensors, (size_t)g->n_tensors, &ps->cap_tensors,
                   sizeof(*g->tensors)) < 0)
        return kvp_err_set(ps->err, KVP_ENOMEM, "gguf: out of memory for tensor %" PRIu64, i);
    struct kvp_gguf_tensor *t = &g->tensors[g->n_tensors];
    char nm[SHOW_MAX + 4];
    int rc = read_tensor_name(ps, i, t, nm);
    if (rc == 0)
        rc = read_tensor_shape(ps, t, nm);
    if (rc == 0)
        rc = read_tensor_type(ps, t, nm);
    if (rc < 0)
        return rc;
    if (kvp_rd_u64(&ps->cur, &t->offset) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: truncated in offset", nm);
    g->n_tensors++;
    return 0;
}

/* Check one tensor's offset against the alignment and the file size, and point it at its data. */
static int place_tensor(struct parse *ps, struct kvp_gguf_tensor *t)
{
    struct kvp_gguf *g = ps->g;
    char nm[SHOW_MAX + 4];
    show_name(t->name, strlen(t->name), nm);
    if (t->offset % g->alignment != 0)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "tensor %s: offset %" PRIu64 " is not a multiple of the alignment %zu",
                           nm, t->offset, g->alignment);
    size_t start, end;
    if (t->offset > SIZE_MAX || !kvp_add_ok(g->data_off, (size_t)t->offset, &start) ||
        start > g->size)
        return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: offset beyond end of file", nm);
    if (!kvp_add_ok(start, t->nbytes, &end))
        return kvp_err_set(ps->err, KVP_EFORMAT, "tensor %s: offset + size overflows", nm);
    if (end > g->size)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "tensor %s: data (%zu bytes at offset %" PRIu64
                           ") extends beyond end of file",
                           nm, t->nbytes, t->offset);
    t->data = g->base + start;
    return 0;
}

/* ============================================================================== header ===== */

/* Read magic, version and the two counts; the counts are capped by the bytes left, since every
 * record needs a minimum number of bytes. */
static int read_header(struct parse *ps, uint64_t *n_tensors, uint64_t *n_kv)
{
    struct kvp_gguf *g = ps->g;
    const uint8_t *magic;
    if (kvp_rd_bytes(&ps->cur, 4, &magic) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in magic (file has %zu bytes)",
                           g->size);
    if (memcmp(magic, "GGUF", 4) != 0)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: bad magic %02x %02x %02x %02x (expected \"GGUF\")", magic[0],
                           magic[1], magic[2], magic[3]);
    if (kvp_rd_u32(&ps->cur, &g->version) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in version");
    if (g->version != 0 && (g->version & 0xffffu) == 0)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: version field 0x%08x looks byte-swapped: big-endian files are "
                           "not supported",
                           g->version);
    if (g->version == 1)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: version 1 (32-bit counts) is obsolete; only 2 and 3 are supported");
    if (g->version != 2 && g->version != 3)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: unsupported version %u (expected 2 or 3)", g->version);
    if (kvp_rd_u64(&ps->cur, n_tensors) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in tensor count");
    if (kvp_rd_u64(&ps->cur, n_kv) < 0)
        return kvp_err_set(ps->err, KVP_EFORMAT, "gguf: truncated in kv count");
    size_t left = kvp_cursor_left(&ps->cur);
    if (*n_kv > left / GGUF_MIN_KV_BYTES)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: kv count %" PRIu64 " exceeds what %zu remaining bytes can hold",
                           *n_kv, left);
    left -= (size_t)*n_kv * GGUF_MIN_KV_BYTES;
    if (*n_tensors > left / GGUF_MIN_TENSOR_BYTES)
        return kvp_err_set(ps->err, KVP_EFORMAT,
                           "gguf: tensor count %" PRIu64 " exceeds what the remaining bytes can hold",
                           *n_tensors);
    return 0;
}

/* Decode and validate everything; g->base and g->size are set. */
static int parse(struct kvp_gguf *g, struct kvp_err *err)
{
    struct parse ps = {.g = g, .err = err};
    kvp_cursor_init(&ps.cur, g->base, g->size);
    uint64_t n_tensors = 0, n_kv = 0;
    int rc = read_header(&ps, &n_tensors, &n_kv);
    if (rc < 0)
        return rc;

    for (uint64_t i = 0; i < n_kv; i++)
        if ((rc = read_kv(&ps, i)) < 0)
            return rc;
    if ((rc = check_duplicate_keys(&ps)) < 0)
        return rc;
    if ((rc = read_alignment(&ps)) < 0)
        return rc;
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((rc = read_tensor(&ps, i)) < 0)
            return rc;
    if ((rc = check_duplicate_tensors(&ps)) < 0)
        return rc;

    g->data_off = ps.cur.pos;
    if (g->n_tensors == 0)
        return 0; /* vocab-only: the file ends after the last record, no padding */
    if (!kvp_align_up(ps.cur.pos, g->alignment, &g->data_off) || g->data_off > g->size)
        return kvp_err_set(err, KVP_EFORMAT,
                           "gguf: truncated in padding before tensor data (data offset beyond "
                           "end of file)");
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = place_tensor(&ps, &g->tensors[i])) < 0)
            return rc;
    return 0;
}

/* ========================================================================== public API ===== */

/* Open over buf (borrowed). Returns 0 with *out set, or a negative KVP_E* with err filled. */
int kvp_gguf_open_memory(const void *buf, size_t size, struct kvp_gguf **out, struct kvp_err *err)
{
    if (!out || (!buf && size))
        return kvp_err_set(err, KVP_EINVAL, "gguf: invalid arguments");
    struct kvp_gguf *g = calloc(1, sizeof(*g));
    if (!g)
        return kvp_err_set(err, KVP_ENOMEM, "gguf: out of memory");
    g->base = buf;
    g->size = size;
    int rc = parse(g, err);
    if (rc < 0) {
        kvp_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* Map path and open it; errors are prefixed with the path. */
int kvp_gguf_open(const char *path, struct kvp_gguf **out, struct kvp_err *err)
{
    return kvp_gguf_load(path, false, out, err);
}

int kvp_gguf_load(const char *path, bool copy, struct kvp_gguf **out, struct kvp_err *err)
{
    if (!path || !out)
        return kvp_err_set(err, KVP_EINVAL, "gguf: invalid arguments");
    struct kvp_file_map map;
    int rc = kvp_file_load(path, copy, &map, err);
    if (rc < 0)
        return rc;
    struct kvp_gguf *g = NULL;
    rc = kvp_gguf_open_memory(map.data, map.size, &g, err);
    if (rc < 0) {
        kvp_file_unmap(&map);
        kvp_err_prefix(err, "%s", path);
        return rc;
    }
    g->map = map; /* the handle now owns the mapping */
    *out = g;
    return 0;
}

void kvp_gguf_close(struct kvp_gguf *g)
{
    if (!g)
        return;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].strs);
    }
    free(g->kv);
    free(g->tensors);
    kvp_file_unmap(&g->map);
    free(g);
}

int64_t kvp_gguf_find_key(const struct kvp_gguf *g, const char *key)
{
    if (!g || !key)
        return -1;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0)
            return (int64_t)i;
    return -1;
}

const struct kvp_gguf_tensor *kvp_gguf_find_tensor(const struct kvp_gguf *g, const char *name)
{
    if (!g || !name)
        return NULL;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

/* Look key up; KVP_ENOTFOUND (err untouched) when absent. */
static int lookup(const struct kvp_gguf *g, const char *key, const struct kvp_gguf_kv **kv)
{
    int64_t i = kvp_gguf_find_key(g, key);
    if (i < 0)
        return KVP_ENOTFOUND;
    *kv = &g->kv[i];
    return 0;
}

static int wrong_type(struct kvp_err *err, const char *key, const char *want,
                      const struct kvp_gguf_kv *kv)
{
    return kvp_err_set(err, KVP_EFORMAT, "key '%s': expected %s, found %s", key, want,
                       vtype_name(kv->type));
}

int kvp_gguf_get_int(const struct kvp_gguf *g, const char *key, int64_t *out, struct kvp_err *err)
{
    const struct kvp_gguf_kv *kv;
    if (lookup(g, key, &kv) < 0)
        return KVP_ENOTFOUND;
    if (!vtype_is_int(kv->type))
        return wrong_type(err, key, "an integer", kv);
    if (!decode_int(kv->type, kv->data, out))
        return kvp_err_set(err, KVP_EFORMAT, "key '%s': value does not fit in int64", key);
    return 0;
}

int kvp_gguf_get_float(const struct kvp_gguf *g, const char *key, double *out, struct kvp_err *err)
{
    const struct kvp_gguf_kv *kv;
    if (lookup(g, key, &kv) < 0)
        return KVP_ENOTFOUND;
    if (!vtype_is_float(kv->type))
        return wrong_type(err, key, "a float", kv);
    *out = decode_float(kv->type, kv->data);
    return 0;
}

int kvp_gguf_get_bool(const struct kvp_gguf *g, const char *key, bool *out, struct kvp_err *err)
{
    const struct kvp_gguf_kv *kv;
    if (lookup(g, key, &kv) < 0)
        return KVP_ENOTFOUND;
    if (kv->type != KVP_GGUF_BOOL)
        return wrong_type(err, key, "a bool", kv);
    *out = kv->data[0] != 0; /* as the reference: any non-zero byte is true */
    return 0;
}

int kvp_gguf_get_str(const struct kvp_gguf *g, const char *key, const char **s, size_t *len,
                     struct kvp_err *err)
{
    const struct kvp_gguf_kv *kv;
    if (lookup(g, key, &kv) < 0)
        return KVP_ENOTFOUND;
    if (kv->type != KVP_GGUF_STRING)
        return wrong_type(err, key, "a string", kv);
    *s = (const char *)kv->data;
    *len = (size_t)kv->count;
    return 0;
}

int kvp_gguf_get_arr(const struct kvp_gguf *g, const char *key, uint32_t *elem_type,
                     uint64_t *count, struct kvp_err *err)
{
    const struct kvp_gguf_kv *kv;
    if (lookup(g, key, &kv) < 0)
        return KVP_ENOTFOUND;
    if (kv->type != KVP_GGUF_ARRAY)
        return wrong_type(err, key, "an array", kv);
    *elem_type = kv->arr_type;
    *count = kv->count;
    return 0;
}

/* Element i of an array of strings: KVP_EINVAL for another record kind, KVP_ERANGE for i out of
 * range. *s points into the file and is not NUL-terminated. */
int kvp_gguf_arr_str(const struct kvp_gguf_kv *kv, uint64_t i, const char **s, size_t *len)
{
    if (!kv || kv->type != KVP_GGUF_ARRAY || kv->arr_type != KVP_GGUF_STRING)
        return KVP_EINVAL;
    if (i >= kv->count)
        return KVP_ERANGE;
    uint64_t n;
    memcpy(&n, kv->strs[i], 8); /* verified at open: n bytes follow inside the file */
    *s = (const char *)kv->strs[i] + 8;
    *len = (size_t)n;
    return 0;
}

/* Element i of an array of integers (any width): KVP_EINVAL for another record kind, KVP_ERANGE
 * for i out of range or a UINT64 element above INT64_MAX. */
int kvp_gguf_arr_int(const struct kvp_gguf_kv *kv, uint64_t i, int64_t *out)
{
    if (!kv || kv->type != KVP_GGUF_ARRAY || !vtype_is_int(kv->arr_type))
        return KVP_EINVAL;
    if (i >= kv->count)
        return KVP_ERANGE;
    if (!decode_int(kv->arr_type, kv->data + i * vtype_size[kv->arr_type], out))
        return KVP_ERANGE;
    return 0;
}

/* Element i of an array of FLOAT32 or FLOAT64: KVP_EINVAL / KVP_ERANGE as above. */
int kvp_gguf_arr_float(const struct kvp_gguf_kv *kv, uint64_t i, double *out)
{
    if (!kv || kv->type != KVP_GGUF_ARRAY || !vtype_is_float(kv->arr_type))
        return KVP_EINVAL;
    if (i >= kv->count)
        return KVP_ERANGE;
    *out = decode_float(kv->arr_type, kv->data + i * vtype_size[kv->arr_type]);
    return 0;
}
