/*
 * GGUF v2/v3 reader and writer (docs/formats.md §1).
 *
 * The reader maps the file (or takes a caller's buffer), decodes the header, every metadata
 * record and every tensor record through a bounds-checked cursor, and checks every size, offset
 * and count for overflow before anything points into the data. Tensor data is never copied.
 * Unknown keys are kept and skippable; values are read through typed getters that accept any
 * integer width (range-checked) or either float width.
 */
#ifndef KVP_GGUF_GGUF_H
#define KVP_GGUF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/platform.h"

enum kvp_gguf_vtype {
    KVP_GGUF_UINT8 = 0,
    KVP_GGUF_INT8 = 1,
    KVP_GGUF_UINT16 = 2,
    KVP_GGUF_INT16 = 3,
    KVP_GGUF_UINT32 = 4,
    KVP_GGUF_INT32 = 5,
    KVP_GGUF_FLOAT32 = 6,
    KVP_GGUF_BOOL = 7,
    KVP_GGUF_STRING = 8,
    KVP_GGUF_ARRAY = 9,
    KVP_GGUF_UINT64 = 10,
    KVP_GGUF_INT64 = 11,
    KVP_GGUF_FLOAT64 = 12,
    KVP_GGUF_VTYPE_COUNT
};

#define KVP_GGUF_MAX_DIMS 4
#define KVP_GGUF_NAME_MAX 64 /* tensor names are < 64 bytes */

struct kvp_gguf_kv {
    char *key;               /* owned, NUL-terminated */
    uint32_t type;           /* enum kvp_gguf_vtype */
    uint32_t arr_type;       /* element type when type == ARRAY */
    uint64_t count;          /* array element count; 1 for scalars; byte length for STRING */
    const uint8_t *data;     /* into the file: scalar bytes, string bytes, or first element */
    const uint8_t **strs;    /* ARRAY of STRING: owned table of pointers to each element's
                                u64 length prefix (so element i is O(1) to reach) */
};

struct kvp_gguf_tensor {
    char name[KVP_GGUF_NAME_MAX];
    uint32_t n_dims;
    int64_t ne[KVP_GGUF_MAX_DIMS]; /* missing dims are 1; ne[0] innermost */
    uint32_t type;                 /* enum kvp_type id */
    uint64_t offset;               /* relative to data_off */
    size_t nbytes;
    const void *data;              /* into the file */
};

struct kvp_gguf {
    struct kvp_file_map map; /* owned unless opened from memory */
    const uint8_t *base;
    size_t size;
    uint32_t version;
    uint64_t n_kv;
    struct kvp_gguf_kv *kv;           /* owned [n_kv] */
    uint64_t n_tensors;
    struct kvp_gguf_tensor *tensors;  /* owned [n_tensors] */
    size_t alignment;
    size_t data_off;
};

/* Open and validate a GGUF file. Every failure names the field and the problem. */
int kvp_gguf_open(const char *path, struct kvp_gguf **out, struct kvp_err *err);
/* As kvp_gguf_open; copy: read the file into memory instead of mapping it (kvp_file_load). */
int kvp_gguf_load(const char *path, bool copy, struct kvp_gguf **out, struct kvp_err *err);
/* Same, over a caller's buffer (borrowed: must outlive the handle). Used by tests and fuzzing. */
int kvp_gguf_open_memory(const void *buf, size_t size, struct kvp_gguf **out, struct kvp_err *err);
void kvp_gguf_close(struct kvp_gguf *g);

/* Index of key, or -1. */
int64_t kvp_gguf_find_key(const struct kvp_gguf *g, const char *key);
const struct kvp_gguf_tensor *kvp_gguf_find_tensor(const struct kvp_gguf *g, const char *name);

/* Typed getters. Return 0, KVP_ENOTFOUND when the key is absent (err untouched), or
 * KVP_EFORMAT when it has an incompatible type or an out-of-range value (err filled). */
int kvp_gguf_get_int(const struct kvp_gguf *g, const char *key, int64_t *out, struct kvp_err *err);
int kvp_gguf_get_float(const struct kvp_gguf *g, const char *key, double *out, struct kvp_err *err);
int kvp_gguf_get_bool(const struct kvp_gguf *g, const char *key, bool *out, struct kvp_err *err);
/* *s points into the file and is not NUL-terminated. */
int kvp_gguf_get_str(const struct kvp_gguf *g, const char *key, const char **s, size_t *len,
                     struct kvp_err *err);
/* Array element type and count. */
int kvp_gguf_get_arr(const struct kvp_gguf *g, const char *key, uint32_t *elem_type,
                     uint64_t *count, struct kvp_err *err);
/* Element i of an array record (kv from g->kv[idx]); index checked. */
int kvp_gguf_arr_str(const struct kvp_gguf_kv *kv, uint64_t i, const char **s, size_t *len);
int kvp_gguf_arr_int(const struct kvp_gguf_kv *kv, uint64_t i, int64_t *out);
int kvp_gguf_arr_float(const struct kvp_gguf_kv *kv, uint64_t i, double *out);

/* ---- writer ------------------------------------------------------------------------------- */

/* Builds a GGUF v3 file in memory: metadata in insertion order, tensors in insertion order, each
 * aligned to 32 bytes. Tensor data is borrowed until write. */
struct kvp_gguf_writer;

int kvp_gguf_writer_init(struct kvp_gguf_writer **out, struct kvp_err *err);
void kvp_gguf_writer_free(struct kvp_gguf_writer *w);
int kvp_gguf_writer_set_u32(struct kvp_gguf_writer *w, const char *key, uint32_t v);
int kvp_gguf_writer_set_i32(struct kvp_gguf_writer *w, const char *key, int32_t v);
int kvp_gguf_writer_set_u64(struct kvp_gguf_writer *w, const char *key, uint64_t v);
int kvp_gguf_writer_set_f32(struct kvp_gguf_writer *w, const char *key, float v);
int kvp_gguf_writer_set_bool(struct kvp_gguf_writer *w, const char *key, bool v);
int kvp_gguf_writer_set_str(struct kvp_gguf_writer *w, const char *key, const char *v);
/* lens may be NULL (then strlen is used). */
int kvp_gguf_writer_set_arr_str(struct kvp_gguf_writer *w, const char *key,
                                const char *const *strs, const size_t *lens, size_t n);
int kvp_gguf_writer_set_arr_f32(struct kvp_gguf_writer *w, const char *key, const float *v,
                                size_t n);
int kvp_gguf_writer_set_arr_i32(struct kvp_gguf_writer *w, const char *key, const int32_t *v,
                                size_t n);
/* Additions to the typed setters above. Any scalar type but STRING/ARRAY; v points to a native
 * value of that type (bool for BOOL). */
int kvp_gguf_writer_set_scalar(struct kvp_gguf_writer *w, const char *key, uint32_t vtype,
                               const void *v);
/* Array of n packed native elements of any scalar element type (bool[] for BOOL). */
int kvp_gguf_writer_set_arr(struct kvp_gguf_writer *w, const char *key, uint32_t elem,
                            const void *v, size_t n);
/* String of len bytes, not necessarily NUL-terminated. */
int kvp_gguf_writer_set_strn(struct kvp_gguf_writer *w, const char *key, const char *s,
                             size_t len);
/* Write general.alignment (u32, a power of two up to 2^30) and lay tensors out with it. */
int kvp_gguf_writer_set_alignment(struct kvp_gguf_writer *w, uint32_t alignment);
int kvp_gguf_writer_add_tensor(struct kvp_gguf_writer *w, const char *name, int type,
                               int n_dims, const int64_t *ne, const void *data);
/* Serialize to a heap buffer (owned by the caller, free()) or to a file. */
int kvp_gguf_writer_to_memory(struct kvp_gguf_writer *w, uint8_t **buf, size_t *size,
                              struct kvp_err *err);
int kvp_gguf_writer_write_file(struct kvp_gguf_writer *w, const char *path, struct kvp_err *err);

#endif
