/*
 * Tests for the GGUF reader and writer (src/gguf/gguf.c, gguf_write.c).
 *
 * Fixtures are built here: valid files come from the writer, hostile ones from a small byte
 * builder that writes each field by hand, so every malformed field is exactly the one under test.
 * Every buffer handed to the reader is a heap block of exactly the file's size, so under the
 * sanitizer build a read one byte past the end is caught. Real files under ../shared are used
 * when present and skipped with a message otherwise.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#include "kernels/types.h"
#include "gguf/gguf.h"

/* ====================================================================== byte builder ===== */

struct bb {
    uint8_t *p;
    size_t n, cap;
};

static void bb_bytes(struct bb *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        assert_non_null(b->p);
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void bb_u32(struct bb *b, uint32_t v) { bb_bytes(b, &v, 4); }
static void bb_u64(struct bb *b, uint64_t v) { bb_bytes(b, &v, 8); }
static void bb_str(struct bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_bytes(b, s, strlen(s));
}
static void bb_zeros(struct bb *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        bb_bytes(b, "", 1);
}
static void bb_header(struct bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    bb_bytes(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(struct bb *b, const char *key, uint32_t v)
{
    bb_str(b, key);
    bb_u32(b, KVP_GGUF_UINT32);
    bb_u32(b, v);
}

/* One tensor record as written by hand. */
struct tspec {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
};

static void bb_tensor(struct bb *b, const struct tspec *t)
{
    bb_str(b, t->name);
    bb_u32(b, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims && d < 8; d++)
        bb_u64(b, d < 4 ? t->ne[d] : 1);
    bb_u32(b, t->type);
    bb_u64(b, t->offset);
}

/* A file with one u32 key ("general.alignment" when align != 0, else "a.b"), the given tensor
 * records, padding to 32 (or align) and data_len zero bytes of data. */
static struct bb file_with_tensors(const struct tspec *ts, int nt, uint32_t align, size_t data_len)
{
    struct bb b = {0};
    bb_header(&b, 3, (uint64_t)nt, 1);
    bb_kv_u32(&b, align ? "general.alignment" : "a.b", align);
    for (int i = 0; i < nt; i++)
        bb_tensor(&b, &ts[i]);
    size_t a = align && (align & (align - 1)) == 0 ? align : 32;
    bb_zeros(&b, (a - b.n % a) % a);
    bb_zeros(&b, data_len);
    return b;
}

/* ================================================================== open helpers ===== */

/* Open a private, exactly sized copy of buf[0..n) so ASan sees any overread. */
static int open_copy(const void *buf, size_t n, struct kvp_gguf **g, uint8_t **copy,
                     struct kvp_err *err)
{
    *copy = malloc(n ? n : 1);
    assert_non_null(*copy);
    if (n)
        memcpy(*copy, buf, n);
    return kvp_gguf_open_memory(*copy, n, g, err);
}

/* Expect buf to be rejected as KVP_EFORMAT with a one-line message containing want (if any). */
static void expect_reject(const void *buf, size_t n, const char *want)
{
    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    uint8_t *copy;
    int rc = open_copy(buf, n, &g, &copy, &err);
    if (rc != KVP_EFORMAT || (want && !strstr(err.msg, want)))
        print_error("expected rejection containing '%s', got rc %d msg '%s'\n",
                    want ? want : "", rc, err.msg);
    assert_int_equal(rc, KVP_EFORMAT);
    assert_null(g);
    assert_true(err.msg[0] != 0);
    assert_null(strchr(err.msg, '\n'));
    if (want)
        assert_non_null(strstr(err.msg, want));
    free(copy);
}

static void expect_reject_bb(struct bb *b, const char *want)
{
    expect_reject(b->p, b->n, want);
    free(b->p);
    *b = (struct bb){0};
}

/* Read every key through every getter and every tensor record; must not crash. */
static void touch_all(const struct kvp_gguf *g)
{
    struct kvp_err err;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const struct kvp_gguf_kv *kv = &g->kv[i];
        const char *key = kv->key;
        int64_t iv;
        double fv;
        bool bv;
        const char *s;
        size_t len;
        uint32_t et;
        uint64_t cnt;
        assert_int_equal(kvp_gguf_find_key(g, key), (int64_t)i);
        kvp_gguf_get_int(g, key, &iv, &err);
        kvp_gguf_get_float(g, key, &fv, &err);
        kvp_gguf_get_bool(g, key, &bv, &err);
        kvp_gguf_get_str(g, key, &s, &len, &err);
        if (kvp_gguf_get_arr(g, key, &et, &cnt, &err) == 0) {
            for (uint64_t e = 0; e < cnt && e < 64; e++) {
                kvp_gguf_arr_str(kv, e, &s, &len);
                kvp_gguf_arr_int(kv, e, &iv);
                kvp_gguf_arr_float(kv, e, &fv);
            }
            if (cnt) {
                kvp_gguf_arr_str(kv, cnt - 1, &s, &len);
                kvp_gguf_arr_int(kv, cnt - 1, &iv);
                kvp_gguf_arr_float(kv, cnt - 1, &fv);
            }
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct kvp_gguf_tensor *t = &g->tensors[i];
        assert_ptr_equal(kvp_gguf_find_tensor(g, t->name), t);
        assert_true((const uint8_t *)t->data >= g->base);
        assert_true((const uint8_t *)t->data + t->nbytes <= g->base + g->size);
        if (t->nbytes) {
            volatile uint8_t x = ((const uint8_t *)t->data)[0];
            x ^= ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)x;
        }
    }
}

/* ===================================================================== valid fixtures ===== */

static float f32_data[5] = {1.5f, -2.0f, 0.25f, 1e-3f, 42.0f};
static uint16_t f16_data[12];
static uint8_t q8_data[2 * 3 * 34];
static float f32_4d[2 * 3 * 1 * 2];

static void init_data(void)
{
    for (int i = 0; i < 12; i++)
        f16_data[i] = kvp_f32_to_f16((float)i * 0.5f - 2.0f);
    float x[64 * 3];
    for (int i = 0; i < 64 * 3; i++)
        x[i] = sinf((float)i * 0.37f);
    kvp_quantize_row_q8_0_ref(x, q8_data, 64 * 3);
    for (int i = 0; i < 12; i++)
        f32_4d[i] = (float)i;
}

/* A writer holding every value type, arrays of every element type, and four tensors. */
static struct kvp_gguf_writer *make_full_writer(void)
{
    struct kvp_gguf_writer *w;
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_init(&w, &err), 0);
    uint8_t u8 = 250;
    int8_t i8 = -100;
    uint16_t u16 = 65000;
    int16_t i16 = -32000;
    int64_t i64 = -5000000000LL;
    double f64 = 3.141592653589793;
    assert_int_equal(kvp_gguf_writer_set_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(kvp_gguf_writer_set_scalar(w, "t.u8", KVP_GGUF_UINT8, &u8), 0);
    assert_int_equal(kvp_gguf_writer_set_scalar(w, "t.i8", KVP_GGUF_INT8, &i8), 0);
    assert_int_equal(kvp_gguf_writer_set_scalar(w, "t.u16", KVP_GGUF_UINT16, &u16), 0);
    assert_int_equal(kvp_gguf_writer_set_scalar(w, "t.i16", KVP_GGUF_INT16, &i16), 0);
    assert_int_equal(kvp_gguf_writer_set_u32(w, "t.u32", 4000000000u), 0);
    assert_int_equal(kvp_gguf_writer_set_i32(w, "t.i32", -2000000000), 0);
    assert_int_equal(kvp_gguf_writer_set_f32(w, "t.f32", 1e-5f), 0);
    assert_int_equal(kvp_gguf_writer_set_bool(w, "t.bool_t", true), 0);
    assert_int_equal(kvp_gguf_writer_set_bool(w, "t.bool_f", false), 0);
    assert_int_equal(kvp_gguf_writer_set_str(w, "t.str_empty", ""), 0);
    assert_int_equal(kvp_gguf_writer_set_strn(w, "t.str_nul", "a\0b", 3), 0);
    assert_int_equal(kvp_gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull), 0);
    assert_int_equal(kvp_gguf_writer_set_u64(w, "t.u64_small", 77), 0);
    assert_int_equal(kvp_gguf_writer_set_scalar(w, "t.i64", KVP_GGUF_INT64, &i64), 0);
    assert_int_equal(kvp_gguf_writer_set_scalar(w, "t.f64", KVP_GGUF_FLOAT64, &f64), 0);

    uint8_t au8[] = {0, 1, 255};
    int8_t ai8[] = {-128, 0, 127};
    uint16_t au16[] = {0, 65535};
    int16_t ai16[] = {-32768, 32767};
    uint32_t au32[] = {0, 4294967295u};
    int32_t ai32[] = {2, 3, 3, -1};
    float af32[] = {0.0f, -1.5f, 1e30f};
    bool abool[] = {true, false, true};
    uint64_t au64[] = {1, 18446744073709551615ull};
    int64_t ai64[] = {INT64_MIN, INT64_MAX};
    double af64[] = {-0.5, 1e300};
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.u8", KVP_GGUF_UINT8, au8, 3), 0);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.i8", KVP_GGUF_INT8, ai8, 3), 0);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.u16", KVP_GGUF_UINT16, au16, 2), 0);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.i16", KVP_GGUF_INT16, ai16, 2), 0);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.u32", KVP_GGUF_UINT32, au32, 2), 0);
    assert_int_equal(kvp_gguf_writer_set_arr_i32(w, "a.i32", ai32, 4), 0);
    assert_int_equal(kvp_gguf_writer_set_arr_f32(w, "a.f32", af32, 3), 0);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.bool", KVP_GGUF_BOOL, abool, 3), 0);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.u64", KVP_GGUF_UINT64, au64, 2), 0);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.i64", KVP_GGUF_INT64, ai64, 2), 0);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.f64", KVP_GGUF_FLOAT64, af64, 2), 0);
    const char *strs[] = {"<unk>", "<s>", "", "\xe2\x96\x81the"};
    assert_int_equal(kvp_gguf_writer_set_arr_str(w, "a.str", strs, NULL, 4), 0);
    assert_int_equal(kvp_gguf_writer_set_arr_str(w, "a.str_empty", NULL, NULL, 0), 0);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "a.u32_empty", KVP_GGUF_UINT32, NULL, 0), 0);

    int64_t ne_f32[] = {5};
    int64_t ne_f16[] = {3, 2, 2};
    int64_t ne_q8[] = {64, 3};
    int64_t ne_4d[] = {2, 3, 1, 2};
    int64_t ne_empty[] = {0, 4};
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "t.f32", KVP_TYPE_F32, 1, ne_f32, f32_data), 0);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "t.f16", KVP_TYPE_F16, 3, ne_f16, f16_data), 0);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "t.empty", KVP_TYPE_F32, 2, ne_empty, NULL), 0);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "t.q8", KVP_TYPE_Q8_0, 2, ne_q8, q8_data), 0);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "t.4d", KVP_TYPE_F32, 4, ne_4d, f32_4d), 0);
    return w;
}

static uint8_t *make_full_file(size_t *size)
{
    struct kvp_gguf_writer *w = make_full_writer();
    uint8_t *buf;
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_to_memory(w, &buf, size, &err), 0);
    kvp_gguf_writer_free(w);
    return buf;
}

/* A small file with two tensors (the truncation and mutation subject). */
static uint8_t *make_small_file(size_t *size)
{
    struct kvp_gguf_writer *w;
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_init(&w, &err), 0);
    kvp_gguf_writer_set_str(w, "general.architecture", "llama");
    kvp_gguf_writer_set_u32(w, "llama.block_count", 2);
    kvp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    const char *toks[] = {"<unk>", "<s>", "</s>"};
    kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3);
    float sc[] = {0, 0, -1};
    kvp_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", sc, 3);
    int64_t ne_a[] = {5};
    int64_t ne_q[] = {32, 1};
    kvp_gguf_writer_add_tensor(w, "a", KVP_TYPE_F32, 1, ne_a, f32_data);
    kvp_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", KVP_TYPE_Q8_0, 2, ne_q, q8_data);
    uint8_t *buf;
    assert_int_equal(kvp_gguf_writer_to_memory(w, &buf, size, &err), 0);
    kvp_gguf_writer_free(w);
    return buf;
}

/* A vocab-only file: metadata and no tensors. */
static uint8_t *make_vocab_file(size_t *size)
{
    struct kvp_gguf_writer *w;
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_init(&w, &err), 0);
    kvp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    const char *toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81\x61"};
    kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 4);
    int32_t ty[] = {2, 3, 3, 1};
    kvp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", ty, 4);
    kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    kvp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    uint8_t *buf;
    assert_int_equal(kvp_gguf_writer_to_memory(w, &buf, size, &err), 0);
    kvp_gguf_writer_free(w);
    return buf;
}

/* ======================================================================= round trip ===== */

static void check_full(const struct kvp_gguf *g, size_t file_size)
{
    struct kvp_err err = {0};
    int64_t iv;
    double fv;
    bool bv;
    const char *s;
    size_t len;

    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_kv, 30);
    assert_int_equal(g->n_tensors, 5);
    assert_string_equal(g->kv[0].key, "general.architecture"); /* insertion order */
    assert_string_equal(g->kv[29].key, "a.u32_empty");

    assert_int_equal(kvp_gguf_get_str(g, "general.architecture", &s, &len, &err), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    assert_int_equal(kvp_gguf_get_int(g, "t.u8", &iv, &err), 0);
    assert_int_equal(iv, 250);
    assert_int_equal(kvp_gguf_get_int(g, "t.i8", &iv, &err), 0);
    assert_int_equal(iv, -100);
    assert_int_equal(kvp_gguf_get_int(g, "t.u16", &iv, &err), 0);
    assert_int_equal(iv, 65000);
    assert_int_equal(kvp_gguf_get_int(g, "t.i16", &iv, &err), 0);
    assert_int_equal(iv, -32000);
    assert_int_equal(kvp_gguf_get_int(g, "t.u32", &iv, &err), 0);
    assert_int_equal(iv, 4000000000LL);
    assert_int_equal(kvp_gguf_get_int(g, "t.i32", &iv, &err), 0);
    assert_int_equal(iv, -2000000000LL);
    assert_int_equal(kvp_gguf_get_int(g, "t.u64_small", &iv, &err), 0);
    assert_int_equal(iv, 77);
    assert_int_equal(kvp_gguf_get_int(g, "t.i64", &iv, &err), 0);
    assert_true(iv == -5000000000LL);
    assert_int_equal(kvp_gguf_get_float(g, "t.f32", &fv, &err), 0);
    assert_true(fv == (double)1e-5f);
    assert_int_equal(kvp_gguf_get_float(g, "t.f64", &fv, &err), 0);
    assert_true(fv == 3.141592653589793);
    assert_int_equal(kvp_gguf_get_bool(g, "t.bool_t", &bv, &err), 0);
    assert_true(bv);
    assert_int_equal(kvp_gguf_get_bool(g, "t.bool_f", &bv, &err), 0);
    assert_false(bv);
    assert_int_equal(kvp_gguf_get_str(g, "t.str_empty", &s, &len, &err), 0);
    assert_int_equal(len, 0);
    assert_int_equal(kvp_gguf_get_str(g, "t.str_nul", &s, &len, &err), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "a\0b", 3);

    /* type errors and range errors name the key; absent keys leave err untouched */
    memset(&err, 0, sizeof(err));
    assert_int_equal(kvp_gguf_get_int(g, "no.such.key", &iv, &err), KVP_ENOTFOUND);
    assert_int_equal(err.code, 0);
    assert_int_equal(err.msg[0], 0);
    assert_int_equal(kvp_gguf_get_int(g, "t.u64", &iv, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, "t.u64"));
    assert_int_equal(kvp_gguf_get_int(g, "t.str_empty", &iv, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, "t.str_empty"));
    assert_int_equal(kvp_gguf_get_int(g, "t.bool_t", &iv, &err), KVP_EFORMAT);
    assert_int_equal(kvp_gguf_get_float(g, "t.u32", &fv, &err), KVP_EFORMAT);
    assert_int_equal(kvp_gguf_get_bool(g, "t.u8", &bv, &err), KVP_EFORMAT);
    assert_int_equal(kvp_gguf_get_str(g, "a.str", &s, &len, &err), KVP_EFORMAT);

    /* arrays of every element type */
    uint32_t et;
    uint64_t cnt;
    const struct kvp_gguf_kv *kv;
    static const struct {
        const char *key;
        uint32_t type;
        uint64_t n;
        int64_t first, last;
    } ints[] = {
        {"a.u8", KVP_GGUF_UINT8, 3, 0, 255},          {"a.i8", KVP_GGUF_INT8, 3, -128, 127},
        {"a.u16", KVP_GGUF_UINT16, 2, 0, 65535},      {"a.i16", KVP_GGUF_INT16, 2, -32768, 32767},
        {"a.u32", KVP_GGUF_UINT32, 2, 0, 4294967295LL}, {"a.i32", KVP_GGUF_INT32, 4, 2, -1},
        {"a.i64", KVP_GGUF_INT64, 2, INT64_MIN, INT64_MAX},
    };
    for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
        assert_int_equal(kvp_gguf_get_arr(g, ints[k].key, &et, &cnt, &err), 0);
        assert_int_equal(et, ints[k].type);
        assert_int_equal(cnt, ints[k].n);
        kv = &g->kv[kvp_gguf_find_key(g, ints[k].key)];
        assert_int_equal(kvp_gguf_arr_int(kv, 0, &iv), 0);
        assert_true(iv == ints[k].first);
        assert_int_equal(kvp_gguf_arr_int(kv, cnt - 1, &iv), 0);
        assert_true(iv == ints[k].last);
        assert_int_equal(kvp_gguf_arr_int(kv, cnt, &iv), KVP_ERANGE);
        assert_int_equal(kvp_gguf_arr_float(kv, 0, &fv), KVP_EINVAL);
        assert_int_equal(kvp_gguf_arr_str(kv, 0, &s, &len), KVP_EINVAL);
    }
    kv = &g->kv[kvp_gguf_find_key(g, "a.u64")];
    assert_int_equal(kvp_gguf_arr_int(kv, 0, &iv), 0);
    assert_int_equal(iv, 1);
    assert_int_equal(kvp_gguf_arr_int(kv, 1, &iv), KVP_ERANGE); /* above INT64_MAX */
    kv = &g->kv[kvp_gguf_find_key(g, "a.f32")];
    assert_int_equal(kv->arr_type, KVP_GGUF_FLOAT32);
    assert_int_equal(kvp_gguf_arr_float(kv, 1, &fv), 0);
    assert_true(fv == -1.5);
    assert_int_equal(kvp_gguf_arr_float(kv, 2, &fv), 0);
    assert_true(fv == (double)1e30f);
    assert_int_equal(kvp_gguf_arr_float(kv, 3, &fv), KVP_ERANGE);
    kv = &g->kv[kvp_gguf_find_key(g, "a.f64")];
    assert_int_equal(kvp_gguf_arr_float(kv, 1, &fv), 0);
    assert_true(fv == 1e300);
    kv = &g->kv[kvp_gguf_find_key(g, "a.bool")];
    assert_int_equal(kv->arr_type, KVP_GGUF_BOOL);
    assert_int_equal(kv->count, 3);
    assert_memory_equal(kv->data, "\1\0\1", 3);
    kv = &g->kv[kvp_gguf_find_key(g, "a.str")];
    assert_int_equal(kv->count, 4);
    assert_int_equal(kvp_gguf_arr_str(kv, 1, &s, &len), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "<s>", 3);
    assert_int_equal(kvp_gguf_arr_str(kv, 2, &s, &len), 0);
    assert_int_equal(len, 0);
    assert_int_equal(kvp_gguf_arr_str(kv, 3, &s, &len), 0);
    assert_int_equal(len, 6);
    assert_memory_equal(s, "\xe2\x96\x81the", 6);
    assert_int_equal(kvp_gguf_arr_str(kv, 4, &s, &len), KVP_ERANGE);
    assert_int_equal(kvp_gguf_arr_int(kv, 0, &iv), KVP_EINVAL);
    assert_int_equal(kvp_gguf_get_arr(g, "a.str_empty", &et, &cnt, &err), 0);
    assert_int_equal(et, KVP_GGUF_STRING);
    assert_int_equal(cnt, 0);
    assert_int_equal(kvp_gguf_get_arr(g, "a.u32_empty", &et, &cnt, &err), 0);
    assert_int_equal(et, KVP_GGUF_UINT32);
    assert_int_equal(cnt, 0);
    assert_int_equal(kvp_gguf_get_arr(g, "t.u8", &et, &cnt, &err), KVP_EFORMAT);
    assert_int_equal(kvp_gguf_arr_int(NULL, 0, &iv), KVP_EINVAL);

    /* tensors: shapes, sizes, bytes, alignment */
    assert_int_equal(g->alignment, 32);
    assert_int_equal(g->data_off % 32, 0);
    const struct kvp_gguf_tensor *t = kvp_gguf_find_tensor(g, "t.f32");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->ne[0], 5);
    assert_int_equal(t->ne[1], 1);
    assert_int_equal(t->ne[3], 1);
    assert_int_equal(t->type, KVP_TYPE_F32);
    assert_int_equal(t->nbytes, 20);
    assert_memory_equal(t->data, f32_data, 20);
    t = kvp_gguf_find_tensor(g, "t.f16");
    assert_int_equal(t->n_dims, 3);
    assert_int_equal(t->ne[0], 3);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->ne[2], 2);
    assert_int_equal(t->nbytes, 24);
    assert_memory_equal(t->data, f16_data, 24);
    t = kvp_gguf_find_tensor(g, "t.empty");
    assert_int_equal(t->nbytes, 0);
    assert_int_equal(t->ne[0], 0);
    assert_int_equal(t->ne[1], 4);
    t = kvp_gguf_find_tensor(g, "t.q8");
    assert_int_equal(t->type, KVP_TYPE_Q8_0);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 3);
    assert_int_equal(t->nbytes, 2 * 3 * 34);
    assert_memory_equal(t->data, q8_data, 2 * 3 * 34);
    t = kvp_gguf_find_tensor(g, "t.4d");
    assert_int_equal(t->n_dims, 4);
    assert_int_equal(t->ne[3], 2);
    assert_int_equal(t->nbytes, 48);
    assert_memory_equal(t->data, f32_4d, 48);
    assert_null(kvp_gguf_find_tensor(g, "nope"));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        assert_int_equal(g->tensors[i].offset % 32, 0);
        if (i > 0) /* in insertion order, each after the previous one */
            assert_true(g->tensors[i].offset >= g->tensors[i - 1].offset + g->tensors[i - 1].nbytes);
    }
    /* the file ends exactly after the last tensor */
    const struct kvp_gguf_tensor *last = &g->tensors[g->n_tensors - 1];
    assert_int_equal(g->data_off + last->offset + last->nbytes, file_size);
    touch_all(g);
}

static void test_round_trip_memory(void **state)
{
    (void)state;
    size_t size;
    uint8_t *buf = make_full_file(&size);
    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    uint8_t *copy;
    assert_int_equal(open_copy(buf, size, &g, &copy, &err), 0);
    check_full(g, size);
    kvp_gguf_close(g);
    free(copy);
    free(buf);
}

static void test_round_trip_file(void **state)
{
    (void)state;
    struct kvp_gguf_writer *w = make_full_writer();
    char *path = kvp_test_tmpfile(".gguf");
    assert_non_null(path);
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_write_file(w, path, &err), 0);
    kvp_gguf_writer_free(w);
    size_t size;
    char *bytes = kvp_test_read_file(path, &size);
    assert_non_null(bytes);
    struct kvp_gguf *g = NULL;
    assert_int_equal(kvp_gguf_open(path, &g, &err), 0);
    check_full(g, size);
    kvp_gguf_close(g);
    free(bytes);
    unlink(path);
    free(path);
    kvp_gguf_close(NULL); /* destructors accept NULL */
    kvp_gguf_writer_free(NULL);
}

static void test_custom_alignment_and_replace(void **state)
{
    (void)state;
    struct kvp_gguf_writer *w;
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_init(&w, &err), 0);
    assert_int_equal(kvp_gguf_writer_set_u32(w, "x.first", 1), 0);
    assert_int_equal(kvp_gguf_writer_set_alignment(w, 64), 0);
    assert_int_equal(kvp_gguf_writer_set_u32(w, "x.last", 3), 0);
    assert_int_equal(kvp_gguf_writer_set_str(w, "x.first", "replaced"), 0); /* keeps position */
    assert_int_equal(kvp_gguf_writer_set_alignment(w, 3), KVP_EINVAL);
    int64_t ne[] = {3};
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "a", KVP_TYPE_F32, 1, ne, f32_data), 0);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "b", KVP_TYPE_F32, 1, ne, f32_data), 0);
    uint8_t *buf;
    size_t size;
    /* the failed set_alignment(3) is remembered and reported at serialization */
    assert_int_equal(kvp_gguf_writer_to_memory(w, &buf, &size, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "general.alignment"));
    kvp_gguf_writer_free(w);

    assert_int_equal(kvp_gguf_writer_init(&w, &err), 0);
    kvp_gguf_writer_set_u32(w, "x.first", 1);
    kvp_gguf_writer_set_alignment(w, 64);
    kvp_gguf_writer_set_u32(w, "x.last", 3);
    kvp_gguf_writer_set_str(w, "x.first", "replaced");
    kvp_gguf_writer_add_tensor(w, "a", KVP_TYPE_F32, 1, ne, f32_data);
    kvp_gguf_writer_add_tensor(w, "b", KVP_TYPE_F32, 1, ne, f32_data);
    assert_int_equal(kvp_gguf_writer_to_memory(w, &buf, &size, &err), 0);
    kvp_gguf_writer_free(w);
    struct kvp_gguf *g;
    uint8_t *copy;
    assert_int_equal(open_copy(buf, size, &g, &copy, &err), 0);
    assert_int_equal(g->alignment, 64);
    assert_int_equal(g->data_off % 64, 0);
    assert_int_equal(g->n_kv, 3);
    assert_string_equal(g->kv[0].key, "x.first");
    assert_int_equal(g->kv[0].type, KVP_GGUF_STRING);
    assert_int_equal(g->tensors[1].offset, 64);
    assert_memory_equal(g->tensors[1].data, f32_data, 12);
    kvp_gguf_close(g);
    free(copy);
    free(buf);
}

static void test_writer_rejects(void **state)
{
    (void)state;
    struct kvp_gguf_writer *w;
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_init(&w, &err), 0);
    int64_t ne[] = {32};
    int64_t ne_bad[] = {33};
    char name64[65];
    memset(name64, 'n', 64);
    name64[64] = 0;
    assert_int_equal(kvp_gguf_writer_add_tensor(w, name64, KVP_TYPE_F32, 1, ne, f32_4d),
                     KVP_EINVAL);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "q", KVP_TYPE_Q8_0, 1, ne_bad, q8_data),
                     KVP_EINVAL);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "q", 77, 1, ne, q8_data), KVP_EINVAL);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "q", KVP_TYPE_Q8_0, 5, ne, q8_data),
                     KVP_EINVAL);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "q", KVP_TYPE_Q8_0, 1, ne, q8_data), 0);
    assert_int_equal(kvp_gguf_writer_add_tensor(w, "q", KVP_TYPE_Q8_0, 1, ne, q8_data),
                     KVP_EINVAL);
    assert_int_equal(kvp_gguf_writer_set_scalar(w, "k", KVP_GGUF_STRING, "x"), KVP_EINVAL);
    assert_int_equal(kvp_gguf_writer_set_arr(w, "k", KVP_GGUF_ARRAY, "x", 1), KVP_EINVAL);
    uint8_t *buf;
    size_t size;
    assert_int_equal(kvp_gguf_writer_to_memory(w, &buf, &size, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, name64)); /* the first failure is the one reported */
    kvp_gguf_writer_free(w);
}

static void test_write_file_errors(void **state)
{
    (void)state;
    struct kvp_gguf_writer *w = make_full_writer();
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_write_file(w, "/nonexistent-dir-kvp/x.gguf", &err), KVP_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir-kvp/x.gguf"));

    /* A full disk, simulated by a file-size limit in a child process: write() fails with EFBIG
     * once SIGXFSZ is ignored. The error must be reported and no file (or temporary) left. */
    char *path = kvp_test_tmpfile(".gguf");
    assert_non_null(path);
    unlink(path);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl;
        getrlimit(RLIMIT_FSIZE, &rl);
        rl.rlim_cur = 100;
        setrlimit(RLIMIT_FSIZE, &rl);
        struct kvp_err e = {0};
        int rc = kvp_gguf_writer_write_file(w, path, &e);
        _exit(rc == KVP_EIO && strstr(e.msg, "write failed") ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_not_equal(access(path, F_OK), 0);
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "ls %s.tmp* 2>/dev/null | wc -l", path);
    char *out = NULL;
    kvp_test_run(cmd, &out, 0);
    assert_non_null(out);
    assert_int_equal(atoi(out), 0);
    free(out);
    free(path);
    kvp_gguf_writer_free(w);
}

static void test_version2_accepted(void **state)
{
    (void)state;
    size_t size;
    uint8_t *buf = make_full_file(&size);
    buf[4] = 2;
    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    uint8_t *copy;
    assert_int_equal(open_copy(buf, size, &g, &copy, &err), 0);
    assert_int_equal(g->version, 2);
    assert_int_equal(g->n_tensors, 5);
    kvp_gguf_close(g);
    free(copy);
    free(buf);
}

/* ========================================================================== hostile ===== */

static void truncate_every_length(uint8_t *buf, size_t size)
{
    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    uint8_t *copy;
    assert_int_equal(open_copy(buf, size, &g, &copy, &err), 0);
    kvp_gguf_close(g);
    free(copy);
    for (size_t n = 0; n < size; n++)
        expect_reject(buf, n, NULL);
}

static void test_truncation(void **state)
{
    (void)state;
    size_t size;
    uint8_t *buf = make_small_file(&size);
    truncate_every_length(buf, size);
    free(buf);
    buf = make_vocab_file(&size);
    truncate_every_length(buf, size);
    /* a few messages worth pinning down */
    expect_reject(buf, 0, "truncated in magic");
    expect_reject(buf, 6, "truncated in version");
    expect_reject(buf, 30, "kv count 5 exceeds");
    expect_reject(buf, 100, "truncated in key 1 ('tokenizer.ggml.tokens') type");
    expect_reject(buf, size - 1, "truncated in key 4 ('tokenizer.ggml.bos_token_id') value");
    free(buf);
    buf = make_small_file(&size);
    expect_reject(buf, size - 1, "tensor blk.0.attn_q.weight: data");
    free(buf);
}

static void patch_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void patch_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static void test_header_hostile(void **state)
{
    (void)state;
    size_t size;
    uint8_t *buf = make_small_file(&size);
    uint8_t *m = malloc(size);
    struct { uint32_t v; const char *want; } versions[] = {
        {0, "version 0"}, {1, "version 1"}, {4, "version 4"}, {0x03000000u, "byte-swapped"},
        {0x00020000u, "byte-swapped"}, {0xffffffffu, "unsupported version"},
    };
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        memcpy(m, buf, size);
        patch_u32(m + 4, versions[i].v);
        expect_reject(m, size, versions[i].want);
    }
    memcpy(m, buf, size);
    m[0] = 'g';
    expect_reject(m, size, "bad magic");
    memcpy(m, buf, size);
    patch_u64(m + 8, 1ull << 62);
    expect_reject(m, size, "tensor count");
    memcpy(m, buf, size);
    patch_u64(m + 16, 1ull << 62);
    expect_reject(m, size, "kv count");
    memcpy(m, buf, size);
    patch_u64(m + 16, UINT64_MAX);
    expect_reject(m, size, "kv count");
    memcpy(m, buf, size);
    patch_u64(m + 8, UINT64_MAX);
    patch_u64(m + 16, 0);
    expect_reject(m, size, "tensor count");
    free(m);
    free(buf);
}

static void test_kv_hostile(void **state)
{
    (void)state;
    struct bb b = {0};

    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1ull << 40); /* key length */
    bb_zeros(&b, 16);
    expect_reject_bb(&b, "name length");

    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 65536);
    bb_zeros(&b, 65536 + 16);
    expect_reject_bb(&b, "exceeds 65535");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k.huge");
    bb_u32(&b, KVP_GGUF_STRING);
    bb_u64(&b, 1ull << 40);
    bb_zeros(&b, 16);
    expect_reject_bb(&b, "key 0 ('k.huge'): string length exceeds 1 GiB");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k.long");
    bb_u32(&b, KVP_GGUF_STRING);
    bb_u64(&b, 1000); /* under the cap but past the end */
    bb_zeros(&b, 16);
    expect_reject_bb(&b, "truncated in key 0 ('k.long') value");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k.arr");
    bb_u32(&b, KVP_GGUF_ARRAY);
    bb_u32(&b, KVP_GGUF_UINT8);
    bb_u64(&b, 1ull << 40);
    bb_zeros(&b, 16);
    expect_reject_bb(&b, "array count");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k.arr");
    bb_u32(&b, KVP_GGUF_ARRAY);
    bb_u32(&b, KVP_GGUF_UINT64);
    bb_u64(&b, 1ull << 29); /* under the cap but past the end */
    bb_zeros(&b, 16);
    expect_reject_bb(&b, "truncated in key 0 ('k.arr') value");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "tokenizer.ggml.tokens");
    bb_u32(&b, KVP_GGUF_ARRAY);
    bb_u32(&b, KVP_GGUF_STRING);
    bb_u64(&b, 1ull << 30); /* a billion strings claimed in a tiny file */
    bb_zeros(&b, 16);
    expect_reject_bb(&b, "'tokenizer.ggml.tokens'");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k.strs");
    bb_u32(&b, KVP_GGUF_ARRAY);
    bb_u32(&b, KVP_GGUF_STRING);
    bb_u64(&b, 2);
    bb_str(&b, "ok");
    bb_u64(&b, 1ull << 31); /* element 1 longer than 1 GiB */
    bb_zeros(&b, 16);
    expect_reject_bb(&b, "element 1");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k.nested");
    bb_u32(&b, KVP_GGUF_ARRAY);
    bb_u32(&b, KVP_GGUF_ARRAY);
    bb_u64(&b, 1);
    bb_u32(&b, KVP_GGUF_UINT8);
    bb_u64(&b, 1);
    bb_zeros(&b, 1);
    expect_reject_bb(&b, "nested");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k.type");
    bb_u32(&b, 13);
    bb_zeros(&b, 8);
    expect_reject_bb(&b, "unknown value type 13");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "k.etype");
    bb_u32(&b, KVP_GGUF_ARRAY);
    bb_u32(&b, 99);
    bb_u64(&b, 0);
    expect_reject_bb(&b, "unknown array element type 99");

    bb_header(&b, 3, 0, 3);
    bb_kv_u32(&b, "k.a", 1);
    bb_kv_u32(&b, "k.b", 2);
    bb_kv_u32(&b, "k.a", 3);
    expect_reject_bb(&b, "duplicate key 'k.a'");

    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 3);
    bb_bytes(&b, "a\0b", 3);
    bb_u32(&b, KVP_GGUF_UINT8);
    bb_zeros(&b, 1);
    expect_reject_bb(&b, "NUL");

    /* a hostile key is shown on one line, non-printables replaced */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "bad\nkey");
    bb_u32(&b, KVP_GGUF_STRING);
    bb_u64(&b, 50);
    expect_reject_bb(&b, "'bad?key'");

    /* wrong-typed or invalid alignment */
    uint32_t bad_align[] = {0, 3, 7, 48};
    for (size_t i = 0; i < 4; i++) {
        bb_header(&b, 3, 0, 1);
        bb_kv_u32(&b, "general.alignment", bad_align[i]);
        expect_reject_bb(&b, "general.alignment");
    }
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, KVP_GGUF_FLOAT32);
    bb_u32(&b, 0x42000000); /* 32.0f */
    expect_reject_bb(&b, "general.alignment");
    free(b.p);
}

static void test_alignment_accepted(void **state)
{
    (void)state;
    /* any integer type, any power of two (the spec's "multiple of 8" is not enforced) */
    uint32_t types[] = {KVP_GGUF_UINT8, KVP_GGUF_UINT16, KVP_GGUF_INT32, KVP_GGUF_UINT64};
    uint8_t sizes[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        struct bb b = {0};
        bb_header(&b, 3, 1, 1);
        bb_str(&b, "general.alignment");
        bb_u32(&b, types[i]);
        uint64_t v = 16;
        bb_bytes(&b, &v, sizes[i]);
        struct tspec t = {"w", 1, {4}, KVP_TYPE_F32, 0};
        bb_tensor(&b, &t);
        bb_zeros(&b, (16 - b.n % 16) % 16);
        bb_zeros(&b, 16);
        struct kvp_gguf *g = NULL;
        struct kvp_err err = {0};
        uint8_t *copy;
        assert_int_equal(open_copy(b.p, b.n, &g, &copy, &err), 0);
        assert_int_equal(g->alignment, 16);
        assert_int_equal(g->data_off % 16, 0);
        kvp_gguf_close(g);
        free(copy);
        free(b.p);
    }
}

static void test_tensor_hostile(void **state)
{
    (void)state;
    struct bb b;
    char name64[65], name63[64];
    memset(name64, 'x', 64);
    name64[64] = 0;
    memset(name63, 'y', 63);
    name63[63] = 0;

    struct tspec ok63 = {name63, 1, {8}, KVP_TYPE_F32, 0};
    b = file_with_tensors(&ok63, 1, 0, 32);
    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    uint8_t *copy;
    assert_int_equal(open_copy(b.p, b.n, &g, &copy, &err), 0);
    assert_string_equal(g->tensors[0].name, name63);
    kvp_gguf_close(g);
    free(copy);
    free(b.p);

    static const struct {
        struct tspec t;
        size_t data_len;
        const char *want;
    } cases[] = {
        {{NULL, 1, {8}, KVP_TYPE_F32, 0}, 32, "name length 64"},
        {{"w", 0, {8}, KVP_TYPE_F32, 0}, 32, "tensor w: n_dims 0"},
        {{"w", 5, {8, 1, 1, 1}, KVP_TYPE_F32, 0}, 32, "tensor w: n_dims 5"},
        {{"w", 2, {8, (uint64_t)-3}, KVP_TYPE_F32, 0}, 32, "tensor w: ne[1] = -3 is negative"},
        {{"w", 2, {1ull << 32, 1ull << 32}, KVP_TYPE_F32, 0}, 32, "element count overflows"},
        {{"w", 3, {1ull << 31, 1ull << 31, 4}, 24 /* I8 */, 0}, 32, "element count overflows"},
        {{"w", 1, {1ull << 62}, KVP_TYPE_F32, 0}, 32, "byte size overflows"},
        {{"w", 1, {48}, KVP_TYPE_Q8_0, 0}, 64, "ne[0] = 48 is not a multiple of the Q8_0 block size 32"},
        {{"w", 1, {8}, 77, 0}, 32, "tensor w: unknown type id 77"},
        {{"w", 1, {8}, 4, 0}, 32, "tensor w: unknown type id 4"},
        {{"w", 1, {8}, 0xffffffffu, 0}, 32, "unknown type id"},
        {{"w", 1, {8}, KVP_TYPE_F32, 8}, 64, "offset 8 is not a multiple of the alignment 32"},
        {{"w", 1, {8}, KVP_TYPE_F32, 1 << 20}, 32, "tensor w: offset beyond end of file"},
        {{"w", 1, {8}, KVP_TYPE_F32, UINT64_MAX - 31}, 32, "tensor w: offset beyond end of file"},
        {{"w", 1, {(1ull << 62) - 1}, KVP_TYPE_F32, 0}, 32, "tensor w: offset + size overflows"},
        {{"w", 1, {9}, KVP_TYPE_F32, 0}, 32, "tensor w: data"},
        {{"w", 1, {8}, KVP_TYPE_F32, 32}, 32, "tensor w: data"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct tspec t = cases[i].t;
        if (!t.name)
            t.name = name64;
        b = file_with_tensors(&t, 1, 0, cases[i].data_len);
        expect_reject_bb(&b, cases[i].want);
    }

    struct tspec dup[2] = {{"w", 1, {8}, KVP_TYPE_F32, 0}, {"w", 1, {8}, KVP_TYPE_F32, 32}};
    b = file_with_tensors(dup, 2, 0, 64);
    expect_reject_bb(&b, "tensor w: duplicate tensor name");

    /* alignment 64 makes offset 32 misaligned */
    struct tspec two[2] = {{"a", 1, {8}, KVP_TYPE_F32, 0}, {"b", 1, {8}, KVP_TYPE_F32, 32}};
    b = file_with_tensors(two, 2, 64, 128);
    expect_reject_bb(&b, "tensor b: offset 32 is not a multiple of the alignment 64");

    /* a hostile tensor name with control bytes stays on one line */
    struct tspec ctl = {"bad\r\nname", 1, {8}, KVP_TYPE_F32, 1 << 20};
    b = file_with_tensors(&ctl, 1, 0, 32);
    expect_reject_bb(&b, "tensor bad??name: offset beyond end of file");
}

/* xorshift64*: deterministic mutations (seed fixed and printed) */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void mutate_loop(const uint8_t *buf, size_t size, int rounds, uint64_t seed)
{
    uint64_t s = seed;
    uint8_t *m = malloc(size);
    int opened = 0;
    static const uint8_t specials[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0x40, 0x20, 0x3f};
    for (int r = 0; r < rounds; r++) {
        memcpy(m, buf, size);
        int n_flips = 1 + (int)(rng_next(&s) % 4);
        for (int k = 0; k < n_flips; k++) {
            uint64_t x = rng_next(&s);
            size_t at = (size_t)(x % size);
            switch ((x >> 32) % 3) {
            case 0: m[at] ^= (uint8_t)(1u << ((x >> 40) % 8)); break;
            case 1: m[at] = specials[(x >> 40) % sizeof(specials)]; break;
            default: m[at] = (uint8_t)(x >> 48); break;
            }
        }
        size_t n = size;
        if (rng_next(&s) % 8 == 0) /* sometimes also truncate */
            n = (size_t)(rng_next(&s) % size);
        struct kvp_gguf *g = NULL;
        struct kvp_err err = {0};
        uint8_t *copy;
        int rc = open_copy(m, n, &g, &copy, &err);
        if (rc == 0) {
            touch_all(g);
            kvp_gguf_close(g);
            opened++;
        } else {
            assert_true(rc == KVP_EFORMAT || rc == KVP_ENOMEM);
            assert_true(err.msg[0] != 0);
            assert_null(strchr(err.msg, '\n'));
            assert_null(g);
        }
        free(copy);
    }
    print_message("[  INFO    ] seed 0x%llx: %d/%d mutants opened\n", (unsigned long long)seed,
                  opened, rounds);
    free(m);
}

static void test_mutations(void **state)
{
    (void)state;
    size_t size;
    uint8_t *buf = make_small_file(&size);
    mutate_loop(buf, size, 3000, 0x6b7670726564ull);
    free(buf);
    buf = make_vocab_file(&size);
    mutate_loop(buf, size, 1000, 0x676775660001ull);
    free(buf);
}

/* ======================================================================== real files ===== */

static void test_stories260k(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(path, "models/stories260K.gguf");
    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    int rc = kvp_gguf_open(path, &g, &err);
    if (rc)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    const char *s;
    size_t len;
    assert_int_equal(kvp_gguf_get_str(g, "general.architecture", &s, &len, &err), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    int64_t v;
    assert_int_equal(kvp_gguf_get_int(g, "llama.block_count", &v, &err), 0);
    assert_int_equal(v, 5);
    assert_int_equal(kvp_gguf_get_int(g, "llama.embedding_length", &v, &err), 0);
    assert_int_equal(v, 64);
    const struct kvp_gguf_tensor *t = kvp_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    assert_int_equal(t->type, KVP_TYPE_F32);
    assert_int_equal(t->nbytes, 64 * 512 * 4);
    touch_all(g);
    kvp_gguf_close(g);
}

static void test_vocab_llama_spm(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(path, "models/tokenizer-tests/ggml-vocab-llama-spm.gguf");
    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    int rc = kvp_gguf_open(path, &g, &err);
    if (rc)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(g->n_tensors, 0);
    assert_int_equal(g->data_off, g->size); /* ends right after the last record */
    uint32_t et;
    uint64_t n;
    assert_int_equal(kvp_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &err), 0);
    assert_int_equal(et, KVP_GGUF_STRING);
    assert_int_equal(n, 32000);
    const struct kvp_gguf_kv *kv = &g->kv[kvp_gguf_find_key(g, "tokenizer.ggml.tokens")];
    const char *s;
    size_t len;
    assert_int_equal(kvp_gguf_arr_str(kv, 1, &s, &len), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "<s>", 3);
    bool b;
    assert_int_equal(kvp_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, &err), 0);
    assert_true(b);
    double eps;
    assert_int_equal(kvp_gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &eps, &err),
                     0);
    assert_true(fabs(eps - 1e-5) < 1e-9);
    touch_all(g);
    kvp_gguf_close(g);
}

static void test_open_errors(void **state)
{
    (void)state;
    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_open("/nonexistent-kvp.gguf", &g, &err), KVP_EIO);
    assert_null(g);
    /* a rejected file's message carries the path */
    char *path = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_file(path, "GGUF\4\0\0\0", 8), 0);
    assert_int_equal(kvp_gguf_open(path, &g, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "version 4"));
    assert_int_equal(kvp_test_write_file(path, "", 0), 0);
    assert_int_equal(kvp_gguf_open(path, &g, &err), KVP_EFORMAT);
    unlink(path);
    free(path);
    assert_int_equal(kvp_gguf_open_memory(NULL, 0, &g, &err), KVP_EFORMAT);
}

int main(void)
{
    init_data();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_memory),
        cmocka_unit_test(test_round_trip_file),
        cmocka_unit_test(test_custom_alignment_and_replace),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_write_file_errors),
        cmocka_unit_test(test_version2_accepted),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_header_hostile),
        cmocka_unit_test(test_kv_hostile),
        cmocka_unit_test(test_alignment_accepted),
        cmocka_unit_test(test_tensor_hostile),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_vocab_llama_spm),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
