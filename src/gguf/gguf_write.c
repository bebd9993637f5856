/*
 * GGUF v3 writer (docs/formats.md §1): the inverse of gguf.c, used by `kvpred convert`,
 * the trainer and the tests to build files whose every byte is known.
 *
 * Each metadata value is encoded into its own small buffer when it is set (type id plus value
 * bytes, exactly as on disk), so serializing is a matter of concatenation. Setting a key that
 * already exists replaces its value in place, keeping its position, as ggml's gguf_set_* does;
 * keys and tensors otherwise keep their insertion order. Tensor data is borrowed until the file
 * is serialized.
 *
 * Layout: header, metadata records, tensor-info records, zero padding up to the alignment (only
 * when there are tensors), then the tensor data, each tensor starting at a multiple of the
 * alignment with zero padding between tensors. Nothing follows the last tensor, so the file ends
 * where its data ends (docs/formats.md: padding appears only before and inside the data
 * section). The alignment is 32 unless the caller sets `general.alignment` (any integer setter, or
 * kvp_gguf_writer_set_alignment), which then is written into the file and obeyed.
 *
 * Setters return 0 or a negative KVP_E* code; the first failure is also remembered, so a caller
 * that sets twenty keys and checks only the final kvp_gguf_writer_to_memory still gets a message
 * naming the key that failed.
 */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/bytebuf.h"
#include "core/cursor.h"
#include "kernels/types.h"

#define WRITER_DEFAULT_ALIGNMENT 32u
#define WRITER_MAX_KEY_LEN 65535u
#define WRITER_MAX_ARR_LEN (1ull << 30)

/* Encoded size of each scalar value type (same table as the reader's); 0 for STRING, ARRAY. */
static const uint8_t wr_vtype_size[KVP_GGUF_VTYPE_COUNT] = {
    [KVP_GGUF_UINT8] = 1,   [KVP_GGUF_INT8] = 1,    [KVP_GGUF_UINT16] = 2,
    [KVP_GGUF_INT16] = 2,   [KVP_GGUF_UINT32] = 4,  [KVP_GGUF_INT32] = 4,
    [KVP_GGUF_FLOAT32] = 4, [KVP_GGUF_BOOL] = 1,    [KVP_GGUF_STRING] = 0,
    [KVP_GGUF_ARRAY] = 0,   [KVP_GGUF_UINT64] = 8,  [KVP_GGUF_INT64] = 8,
    [KVP_GGUF_FLOAT64] = 8,
};

struct wkv {
    char *key;    /* owned */
    uint8_t *val; /* owned: value type (u32) then the value, as on disk */
    size_t val_len;
};

struct wtensor {
    char name[KVP_GGUF_NAME_MAX];
    uint32_t n_dims;
    int64_t ne[KVP_GGUF_MAX_DIMS];
    uint32_t type;
    size_t nbytes;
    const void *data; /* borrowed until serialized */
};

struct kvp_gguf_writer {
    struct wkv *kv;         /* owned [n_kv] */
    size_t n_kv, cap_kv;
    struct wtensor *t;      /* owned [n_t] */
    size_t n_t, cap_t;
    size_t alignment;       /* power of two; 32 unless general.alignment was set */
    struct kvp_err first;   /* first setter failure (code 0: none) */
};

/* ======================================================================== byte buffers ===== */

/* A GGUF string: its length, then its bytes. */
static void wb_str(struct kvp_bytebuf *b, const char *s, size_t n)
{
    kvp_bytebuf_u64(b, n);
    kvp_bytebuf_put(b, s, n);
}

/* ============================================================================= setters ===== */

/* Remember the first failure and return its code. */
static int fail(struct kvp_gguf_writer *w, int code, const char *what, const char *key)
{
    if (w && w->first.code == 0)
        kvp_err_set(&w->first, code, "gguf writer: %s: %s", key ? key : "(null)", what);
    return code;
}

/* Store an encoded value (ownership of b->p moves to the writer) under key: replaces the value
 * of an existing key in place, or appends. */
static int put_value(struct kvp_gguf_writer *w, const char *key, struct kvp_bytebuf *b)
{
    if (b->fail) {
        free(b->p);
        return fail(w, KVP_ENOMEM, "out of memory", key);
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].val = b->p;
            w->kv[i].val_len = b->n;
            return 0;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        struct wkv *kv = realloc(w->kv, cap * sizeof(*kv));
        if (!kv)
            goto fail_free_value;
        w->kv = kv;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k)
        goto fail_free_value;
    w->kv[w->n_kv++] = (struct wkv){.key = k, .val = b->p, .val_len = b->n};
    return 0;

fail_free_value:
    free(b->p);
    return fail(w, KVP_ENOMEM, "out of memory", key);
}

/* Common argument checks for every setter. */
static int check_key(struct kvp_gguf_writer *w, const char *key)
{
    if (!w)
        return KVP_EINVAL;
    if (!key)
        return fail(w, KVP_EINVAL, "NULL key", key);
    if (strlen(key) > WRITER_MAX_KEY_LEN)
        return fail(w, KVP_EINVAL, "key longer than 65535 bytes", key);
    return 0;
}

/* general.alignment set through any integer setter: validate and adopt it. v points to the value
 * of scalar type t. */
static int adopt_alignment(struct kvp_gguf_writer *w, uint32_t t, const void *v)
{
    uint64_t a = 0;
    switch (t) {
    case KVP_GGUF_UINT8: a = *(const uint8_t *)v; break;
    case KVP_GGUF_UINT16: a = *(const uint16_t *)v; break;
    case KVP_GGUF_UINT32: a = *(const uint32_t *)v; break;
    case KVP_GGUF_UINT64: a = *(const uint64_t *)v; break;
    case KVP_GGUF_INT8: a = (uint64_t)(*(const int8_t *)v < 0 ? 0 : *(const int8_t *)v); break;
    case KVP_GGUF_INT16: a = (uint64_t)(*(const int16_t *)v < 0 ? 0 : *(const int16_t *)v); break;
    case KVP_GGUF_INT32: a = (uint64_t)(*(const int32_t *)v < 0 ? 0 : *(const int32_t *)v); break;
    case KVP_GGUF_INT64: a = (uint64_t)(*(const int64_t *)v < 0 ? 0 : *(const int64_t *)v); break;
    default: return fail(w, KVP_EINVAL, "must be an integer", "general.alignment");
    }
    if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
        return fail(w, KVP_EINVAL, "must be a power of two between 1 and 2^30",
                    "general.alignment");
    w->alignment = (size_t)a;
    return 0;
}

/* Set key to a scalar of type vtype (any type but STRING and ARRAY); v points to a native value
 * of that type (bool for BOOL). Returns 0, KVP_EINVAL or KVP_ENOMEM. */
int kvp_gguf_writer_set_scalar(struct kvp_gguf_writer *w, const char *key, uint32_t vtype,
                               const void *v)
{
    int rc = check_key(w, key);
    if (rc < 0)
        return rc;
    if (vtype >= KVP_GGUF_VTYPE_COUNT || wr_vtype_size[vtype] == 0 || !v)
        return fail(w, KVP_EINVAL, "not a scalar value type", key);
    if (strcmp(key, "general.alignment") == 0 && (rc = adopt_alignment(w, vtype, v)) < 0)
        return rc;
    struct kvp_bytebuf b = {0};
    kvp_bytebuf_u32(&b, vtype);
    if (vtype == KVP_GGUF_BOOL) {
        uint8_t byte = *(const bool *)v ? 1 : 0;
        kvp_bytebuf_put(&b, &byte, 1);
    } else {
        kvp_bytebuf_put(&b, v, wr_vtype_size[vtype]);
    }
    return put_value(w, key, &b);
}

/* Set key to an array of n packed native elements of type elem (not STRING or ARRAY). */
int kvp_gguf_writer_set_arr(struct kvp_gguf_writer *w, const char *key, uint32_t elem,
                            const void *v, size_t n)
{
    int rc = check_key(w, key);
    if (rc < 0)
        return rc;
    if (elem >= KVP_GGUF_VTYPE_COUNT || wr_vtype_size[elem] == 0 || (!v && n))
        return fail(w, KVP_EINVAL, "not a scalar element type", key);
    if (n > WRITER_MAX_ARR_LEN)
        return fail(w, KVP_EINVAL, "array longer than 2^30 elements", key);
    struct kvp_bytebuf b = {0};
    kvp_bytebuf_u32(&b, KVP_GGUF_ARRAY);
    kvp_bytebuf_u32(&b, elem);
    kvp_bytebuf_u64(&b, n);
    if (elem == KVP_GGUF_BOOL) {
        for (size_t i = 0; i < n; i++) {
            uint8_t byte = ((const bool *)v)[i] ? 1 : 0;
            kvp_bytebuf_put(&b, &byte, 1);
        }
    } else {
        kvp_bytebuf_put(&b, v, n * wr_vtype_size[elem]);
    }
    return put_value(w, key, &b);
}

/* Set key to the len bytes at s (need not be NUL-terminated). */
int kvp_gguf_writer_set_strn(struct kvp_gguf_writer *w, const char *key, const char *s,
                             size_t len)
{
    int rc = check_key(w, key);
    if (rc < 0)
        return rc;
    if (!s && len)
        return fail(w, KVP_EINVAL, "NULL string", key);
    struct kvp_bytebuf b = {0};
    kvp_bytebuf_u32(&b, KVP_GGUF_STRING);
    wb_str(&b, s, len);
    return put_value(w, key, &b);
}

int kvp_gguf_writer_set_str(struct kvp_gguf_writer *w, const char *key, const char *v)
{
    if (w && !v)
        return fail(w, KVP_EINVAL, "NULL string", key);
    return kvp_gguf_writer_set_strn(w, key, v, v ? strlen(v) : 0);
}

int kvp_gguf_writer_set_arr_str(struct kvp_gguf_writer *w, const char *key,
                                const char *const *strs, const size_t *lens, size_t n)
{
    int rc = check_key(w, key);
    if (rc < 0)
        return rc;
    if (!strs && n)
        return fail(w, KVP_EINVAL, "NULL string array", key);
    if (n > WRITER_MAX_ARR_LEN)
        return fail(w, KVP_EINVAL, "array longer than 2^30 elements", key);
    struct kvp_bytebuf b = {0};
    kvp_bytebuf_u32(&b, KVP_GGUF_ARRAY);
    kvp_bytebuf_u32(&b, KVP_GGUF_STRING);
    kvp_bytebuf_u64(&b, n);
    for (size_t i = 0; i < n; i++) {
        if (!strs[i] && (!lens || lens[i])) {
            free(b.p);
            return fail(w, KVP_EINVAL, "NULL string in array", key);
        }
        wb_str(&b, strs[i], lens ? lens[i] : strlen(strs[i]));
    }
    return put_value(w, key, &b);
}

int kvp_gguf_writer_set_u32(struct kvp_gguf_writer *w, const char *key, uint32_t v)
{
    return kvp_gguf_writer_set_scalar(w, key, KVP_GGUF_UINT32, &v);
}

int kvp_gguf_writer_set_i32(struct kvp_gguf_writer *w, const char *key, int32_t v)
{
    return kvp_gguf_writer_set_scalar(w, key, KVP_GGUF_INT32, &v);
}

int kvp_gguf_writer_set_u64(struct kvp_gguf_writer *w, const char *key, uint64_t v)
{
    return kvp_gguf_writer_set_scalar(w, key, KVP_GGUF_UINT64, &v);
}

int kvp_gguf_writer_set_f32(struct kvp_gguf_writer *w, const char *key, float v)
{
    return kvp_gguf_writer_set_scalar(w, key, KVP_GGUF_FLOAT32, &v);
}

int kvp_gguf_writer_set_bool(struct kvp_gguf_writer *w, const char *key, bool v)
{
    return kvp_gguf_writer_set_scalar(w, key, KVP_GGUF_BOOL, &v);
}

int kvp_gguf_writer_set_arr_f32(struct kvp_gguf_writer *w, const char *key, const float *v,
                                size_t n)
{
    return kvp_gguf_writer_set_arr(w, key, KVP_GGUF_FLOAT32, v, n);
}

int kvp_gguf_writer_set_arr_i32(struct kvp_gguf_writer *w, const char *key, const int32_t *v,
                                size_t n)
{
    return kvp_gguf_writer_set_arr(w, key, KVP_GGUF_INT32, v, n);
}

int kvp_gguf_writer_set_alignment(struct kvp_gguf_writer *w, uint32_t alignment)
{
    return kvp_gguf_writer_set_u32(w, "general.alignment", alignment);
}

/* ============================================================================= tensors ===== */

/* Add a tensor record. name < 64 bytes and unique; type a known id; n_dims 1..4; ne[] >= 0 with
 * ne[0] a multiple of the block size; data holds the tensor's bytes (borrowed until serialized;
 * may be NULL only for an empty tensor). Returns 0, KVP_EINVAL or KVP_ENOMEM. */
int kvp_gguf_writer_add_tensor(struct kvp_gguf_writer *w, const char *name, int type,
                               int n_dims, const int64_t *ne, const void *data)
{
    if (!w)
        return KVP_EINVAL;
    if (!name || strlen(name) >= KVP_GGUF_NAME_MAX)
        return fail(w, KVP_EINVAL, "tensor name missing or not below 64 bytes", name);
    if (!kvp_type_traits(type))
        return fail(w, KVP_EINVAL, "unknown tensor type", name);
    if (n_dims < 1 || n_dims > KVP_GGUF_MAX_DIMS || !ne)
        return fail(w, KVP_EINVAL, "n_dims out of range 1..4", name);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return fail(w, KVP_EINVAL, "duplicate tensor name", name);

    struct wtensor t = {.n_dims = (uint32_t)n_dims, .type = (uint32_t)type, .data = data};
    strcpy(t.name, name);
    for (int d = 0; d < KVP_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0)
            return fail(w, KVP_EINVAL, "negative dimension", name);
    }
    bool ok = kvp_type_row_bytes(type, t.ne[0], &t.nbytes);
    for (int d = 1; ok && d < KVP_GGUF_MAX_DIMS; d++)
        ok = kvp_mul_ok(t.nbytes, (size_t)t.ne[d], &t.nbytes);
    if (!ok)
        return fail(w, KVP_EINVAL, "ne[0] not a multiple of the block size, or size overflows",
                    name);
    if (!data && t.nbytes)
        return fail(w, KVP_EINVAL, "NULL data", name);

    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 16;
        struct wtensor *nt = realloc(w->t, cap * sizeof(*nt));
        if (!nt)
            return fail(w, KVP_ENOMEM, "out of memory", name);
        w->t = nt;
        w->cap_t = cap;
    }
    w->t[w->n_t++] = t;
    return 0;
}

/* ====================================================================== serialization ===== */

int kvp_gguf_writer_init(struct kvp_gguf_writer **out, struct kvp_err *err)
{
    if (!out)
        return kvp_err_set(err, KVP_EINVAL, "gguf writer: NULL out");
    struct kvp_gguf_writer *w = calloc(1, sizeof(*w));
    if (!w)
        return kvp_err_set(err, KVP_ENOMEM, "gguf writer: out of memory");
    w->alignment = WRITER_DEFAULT_ALIGNMENT;
    *out = w;
    return 0;
}

void kvp_gguf_writer_free(struct kvp_gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    free(w->kv);
    free(w->t);
    free(w);
}

/* Bytes of everything before the data section (unpadded), or false on overflow. */
static bool records_size(const struct kvp_gguf_writer *w, size_t *out)
{
    size_t n = 24; /* magic, version, two counts */
    for (size_t i = 0; i < w->n_kv; i++) {
        size_t rec = 8 + strlen(w->kv[i].key);
        if (!kvp_add_ok(rec, w->kv[i].val_len, &rec) || !kvp_add_ok(n, rec, &n))
            return false;
    }
    for (size_t i = 0; i < w->n_t; i++) {
        size_t rec = 8 + strlen(w->t[i].name) + 4 + 8 * (size_t)w->t[i].n_dims + 4 + 8;
        if (!kvp_add_ok(n, rec, &n))
            return false;
    }
    *out = n;
    return true;
}

/* Offsets of every tensor relative to the data section (offs[n_t]) and the total file size. */
static bool layout(const struct kvp_gguf_writer *w, size_t *offs, size_t *data_off, size_t *total)
{
    size_t pos;
    if (!records_size(w, &pos))
        return false;
    *data_off = pos;
    *total = pos;
    if (w->n_t == 0)
        return true;
    if (!kvp_align_up(pos, w->alignment, data_off))
        return false;
    size_t end = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        if (!kvp_align_up(end, w->alignment, &offs[i]) ||
            !kvp_add_ok(offs[i], w->t[i].nbytes, &end))
            return false;
    }
    return kvp_add_ok(*data_off, end, total);
}

/* Fill buf (total bytes, zeroed) with the file. */
static void serialize(const struct kvp_gguf_writer *w, const size_t *offs, size_t data_off,
                      uint8_t *buf)
{
    struct kvp_bytebuf b = {.p = buf, .cap = data_off}; /* exactly sized: never reallocates */
    kvp_bytebuf_put(&b, "GGUF", 4);
    kvp_bytebuf_u32(&b, 3);
    kvp_bytebuf_u64(&b, w->n_t);
    kvp_bytebuf_u64(&b, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        wb_str(&b, w->kv[i].key, strlen(w->kv[i].key));
        kvp_bytebuf_put(&b, w->kv[i].val, w->kv[i].val_len);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->t[i];
        wb_str(&b, t->name, strlen(t->name));
        kvp_bytebuf_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            kvp_bytebuf_u64(&b, (uint64_t)t->ne[d]);
        kvp_bytebuf_u32(&b, t->type);
        kvp_bytebuf_u64(&b, offs[i]);
    }
    for (size_t i = 0; i < w->n_t; i++)
        if (w->t[i].nbytes)
            memcpy(buf + data_off + offs[i], w->t[i].data, w->t[i].nbytes);
}

/* Serialize into a new heap buffer (*buf owned by the caller, free()). Returns 0, or the first
 * setter failure, or KVP_ENOMEM; err filled. */
int kvp_gguf_writer_to_memory(struct kvp_gguf_writer *w, uint8_t **buf, size_t *size,
                              struct kvp_err *err)
{
    if (!w || !buf || !size)
        return kvp_err_set(err, KVP_EINVAL, "gguf writer: invalid arguments");
    if (w->first.code != 0)
        return kvp_err_set(err, w->first.code, "%s", w->first.msg);
    size_t *offs = calloc(w->n_t ? w->n_t : 1, sizeof(*offs));
    if (!offs)
        return kvp_err_set(err, KVP_ENOMEM, "gguf writer: out of memory");
    size_t data_off, total;
    uint8_t *p = NULL;
    if (!layout(w, offs, &data_off, &total) || !(p = calloc(1, total))) {
        free(offs);
        return kvp_err_set(err, KVP_ENOMEM, "gguf writer: file too large for memory");
    }
    serialize(w, offs, data_off, p);
    free(offs);
    *buf = p;
    *size = total;
    return 0;
}

/* Write all n bytes to fd, retrying short writes and EINTR. Returns 0 or -1 with errno set. */
static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -1;
        if (k == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Serialize and write to path atomically: the bytes go to "path.tmpXXXXXX" in the same
 * directory, which is flushed, closed and renamed over path. Any failure (including a full disk
 * or a file-size limit) returns KVP_EIO naming path and the reason, and leaves no temporary. */
int kvp_gguf_writer_write_file(struct kvp_gguf_writer *w, const char *path, struct kvp_err *err)
{
    if (!path)
        return kvp_err_set(err, KVP_EINVAL, "gguf writer: NULL path");
    uint8_t *buf;
    size_t size;
    int rc = kvp_gguf_writer_to_memory(w, &buf, &size, err);
    if (rc < 0)
        return rc;
    size_t tlen = strlen(path) + 12;
    char *tmp = malloc(tlen);
    if (!tmp) {
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
        goto out_free_buf;
    }
    snprintf(tmp, tlen, "%s.tmpXXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        rc = kvp_err_set(err, KVP_EIO, "%s: cannot create temporary file: %s", path,
                         strerror(errno));
        goto out_free_tmp;
    }
    (void)fchmod(fd, 0644); /* mkstemp creates 0600; a model file is normally world-readable */
    if (write_all(fd, buf, size) < 0 || fsync(fd) < 0) {
        rc = kvp_err_set(err, KVP_EIO, "%s: write failed: %s", path, strerror(errno));
        close(fd);
        goto out_unlink;
    }
    if (close(fd) < 0) {
        rc = kvp_err_set(err, KVP_EIO, "%s: close failed: %s", path, strerror(errno));
        goto out_unlink;
    }
    if (rename(tmp, path) < 0) {
        rc = kvp_err_set(err, KVP_EIO, "%s: cannot rename temporary file: %s", path,
                         strerror(errno));
        goto out_unlink;
    }
    rc = 0;
    goto out_free_tmp;

out_unlink:
    unlink(tmp);
out_free_tmp:
    free(tmp);
out_free_buf:
    free(buf);
    return rc;
}
