/*
 * Tests for the llama2.c checkpoint reader and the tokenizer.bin loader: the three real
 * checkpoints under ../shared, synthetic checkpoints written here with known contents (every
 * float holds its own index in the body, so each pointer can be checked by value), and hostile
 * headers, sizes and tokenizer files that must produce clean errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "model/llama2c.h"
#include "tokenizer/vocab.h"

/* ============================== Synthetic checkpoints ========================================= */

struct cfg {
    int32_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
};

/* Float counts of the arrays, by the formula of docs/formats.md §6.1 written out
 * independently. */
static size_t n_body_floats(const struct cfg *c, int version, bool shared)
{
    size_t d = (size_t)c->dim, L = (size_t)c->layers, h = (size_t)c->hidden;
    size_t v = (size_t)(c->vocab < 0 ? -c->vocab : c->vocab);
    size_t hs = d / (size_t)c->heads, kv = hs * (size_t)c->kv_heads;
    size_t n = v * d + 2 * L * d + 2 * L * d * d + 2 * L * kv * d + 3 * L * h * d + d;
    if (version == 0)
        n += (size_t)c->seq_len * hs; /* two tables of seq_len * hs/2 */
    if (!shared)
        n += v * d;
    return n;
}

/* Build a checkpoint in a malloc'd (hence aligned) buffer; body float i holds the value i. */
static uint8_t *build(const struct cfg *c, int version, bool shared, size_t *size)
{
    size_t hdr = version == 0 ? 28 : 256;
    size_t nf = n_body_floats(c, version, shared);
    *size = hdr + 4 * nf;
    uint8_t *buf = calloc(1, *size + 8);
    assert_non_null(buf);
    int32_t f[7] = {c->dim, c->hidden, c->layers, c->heads, c->kv_heads,
                    c->vocab, c->seq_len};
    if (version == 0) {
        memcpy(buf, f, 28);
    } else {
        uint32_t magic = 0x616b3432;
        int32_t ver = version;
        memcpy(buf, &magic, 4);
        memcpy(buf + 4, &ver, 4);
        memcpy(buf + 8, f, 28);
        buf[36] = shared ? 1 : 0;
    }
    for (size_t i = 0; i < nf; i++) {
        float x = (float)i;
        memcpy(buf + hdr + 4 * i, &x, 4);
    }
    return buf;
}

static const struct cfg tiny = {8, 12, 2, 4, 2, 10, 6}; /* head 2, kv_dim 4 */

/* Offset (in floats) of ptr from the start of the body. */
static long body_index(const struct kvp_llama2c *m, const uint8_t *buf, const float *ptr)
{
    size_t hdr = m->version == 0 ? 28 : 256;
    return (long)(((const uint8_t *)ptr - (buf + hdr)) / 4);
}

static void check_tiny(const struct kvp_llama2c *m, const uint8_t *buf, int version, bool shared)
{
    const long d = 8, L = 2, h = 12, v = 10, kv = 4, seq = 6, hs = 2;
    assert_int_equal(m->version, version);
    assert_int_equal(m->dim, 8);
    assert_int_equal(m->hidden_dim, 12);
    assert_int_equal(m->n_layers, 2);
    assert_int_equal(m->n_heads, 4);
    assert_int_equal(m->n_kv_heads, 2);
    assert_int_equal(m->vocab_size, 10);
    assert_int_equal(m->seq_len, 6);
    assert_int_equal(m->shared_classifier, shared);
    long o = 0;
    if (version == 0) {
        assert_int_equal(body_index(m, buf, m->tok_embd), o); o += v * d;
        assert_int_equal(body_index(m, buf, m->rms_att), o); o += L * d;
        assert_int_equal(body_index(m, buf, m->wq), o); o += L * d * d;
        assert_int_equal(body_index(m, buf, m->wk), o); o += L * kv * d;
        assert_int_equal(body_index(m, buf, m->wv), o); o += L * kv * d;
        assert_int_equal(body_index(m, buf, m->wo), o); o += L * d * d;
        assert_int_equal(body_index(m, buf, m->rms_ffn), o); o += L * d;
        assert_int_equal(body_index(m, buf, m->w1), o); o += L * h * d;
        assert_int_equal(body_index(m, buf, m->w2), o); o += L * h * d;
        assert_int_equal(body_index(m, buf, m->w3), o); o += L * h * d;
        assert_int_equal(body_index(m, buf, m->rms_final), o); o += d;
        o += seq * hs;
    } else {
        assert_int_equal(body_index(m, buf, m->rms_att), o); o += L * d;
        assert_int_equal(body_index(m, buf, m->rms_ffn), o); o += L * d;
        assert_int_equal(body_index(m, buf, m->rms_final), o); o += d;
        assert_int_equal(body_index(m, buf, m->tok_embd), o); o += v * d;
        assert_int_equal(body_index(m, buf, m->wq), o); o += L * d * d;
        assert_int_equal(body_index(m, buf, m->wk), o); o += L * kv * d;
        assert_int_equal(body_index(m, buf, m->wv), o); o += L * kv * d;
        assert_int_equal(body_index(m, buf, m->wo), o); o += L * d * d;
        assert_int_equal(body_index(m, buf, m->w1), o); o += L * h * d;
        assert_int_equal(body_index(m, buf, m->w2), o); o += L * h * d;
        assert_int_equal(body_index(m, buf, m->w3), o); o += L * h * d;
    }
    if (shared) {
        assert_ptr_equal(m->wcls, m->tok_embd);
    } else {
        assert_int_equal(body_index(m, buf, m->wcls), o);
    }
    /* values, not just addresses: float i holds i */
    assert_true(m->wq[3] == (float)(body_index(m, buf, m->wq) + 3));
    assert_true(m->rms_final[d - 1] == (float)(body_index(m, buf, m->rms_final) + d - 1));
}

static void test_synthetic_v0_shared(void **state)
{
    (void)state;
    size_t size;
    uint8_t *buf = build(&tiny, 0, true, &size);
    struct kvp_llama2c *m = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_llama2c_open_memory(buf, size, &m, &err), 0);
    check_tiny(m, buf, 0, true);
    kvp_llama2c_close(m);
    free(buf);
}

static void test_synthetic_v0_unshared(void **state)
{
    (void)state;
    struct cfg c = tiny;
    c.vocab = -10;
    size_t size;
    uint8_t *buf = build(&c, 0, false, &size);
    struct kvp_llama2c *m = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_llama2c_open_memory(buf, size, &m, &err), 0);
    check_tiny(m, buf, 0, false);
    kvp_llama2c_close(m);
    free(buf);
}

static void test_synthetic_v1(void **state)
{
    (void)state;
    for (int shared = 0; shared <= 1; shared++) {
        size_t size;
        uint8_t *buf = build(&tiny, 1, shared, &size);
        struct kvp_llama2c *m = NULL;
        struct kvp_err err = {0};
        assert_int_equal(kvp_llama2c_open_memory(buf, size, &m, &err), 0);
        check_tiny(m, buf, 1, shared);
        kvp_llama2c_close(m);
        free(buf);
    }
}

static void test_synthetic_from_file(void **state)
{
    (void)state;
    size_t size;
    uint8_t *buf = build(&tiny, 0, true, &size);
    char *path = kvp_test_tmpfile(".bin");
    assert_non_null(path);
    assert_int_equal(kvp_test_write_file(path, buf, size), 0);
    struct kvp_llama2c *m = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_llama2c_open(path, &m, &err), 0);
    assert_int_equal(m->vocab_size, 10);
    assert_true(m->tok_embd[5] == 5.0f);
    kvp_llama2c_close(m);
    kvp_llama2c_close(NULL);
    remove(path);
    free(path);
    free(buf);
}

/* ============================== Real checkpoints ============================================== */

static void open_real(const char *rel, const struct cfg *want, size_t file_size)
{
    KVP_REQUIRE_SHARED(path, rel);
    struct kvp_llama2c *m = NULL;
    struct kvp_err err = {0};
    int rc = kvp_llama2c_open(path, &m, &err);
    if (rc)
        fail_msg("%s: %s", rel, err.msg);
    assert_int_equal(m->version, 0);
    assert_int_equal(m->dim, want->dim);
    assert_int_equal(m->hidden_dim, want->hidden);
    assert_int_equal(m->n_layers, want->layers);
    assert_int_equal(m->n_heads, want->heads);
    assert_int_equal(m->n_kv_heads, want->kv_heads);
    assert_int_equal(m->vocab_size, want->vocab);
    assert_int_equal(m->seq_len, want->seq_len);
    assert_true(m->shared_classifier);
    assert_ptr_equal(m->wcls, m->tok_embd);
    assert_int_equal(m->map.size, file_size);
    /* rms_final is followed by the two RoPE tables, which end at the end of the file */
    size_t rope = (size_t)want->seq_len * (size_t)(want->dim / want->heads);
    assert_ptr_equal((const uint8_t *)(m->rms_final + want->dim + rope), m->map.data + m->map.size);
    kvp_llama2c_close(m);
}

static void test_real_stories260k(void **state)
{
    (void)state;
    /* docs/formats.md §6.1: 1,056,540 bytes */
    struct cfg c = {64, 172, 5, 8, 4, 512, 512};
    open_real("models/llama2c/stories260K.bin", &c, 1056540);
}

static void test_real_llama2xs(void **state)
{
    (void)state;
    struct cfg c = {64, 192, 5, 8, 4, 512, 256};
    open_real("models/llama2c/llama2xs/model.bin", &c, 1125148);
}

static void test_real_babyllama(void **state)
{
    (void)state;
    struct cfg c = {128, 352, 5, 8, 4, 105, 256};
    open_real("models/llama2c/babyllama/model5000.bin", &c, 3762204);
}

/* ============================== Hostile checkpoints =========================================== */

static int open_buf(const uint8_t *buf, size_t size, struct kvp_err *err)
{
    struct kvp_llama2c *m = NULL;
    memset(err, 0, sizeof(*err));
    int rc = kvp_llama2c_open_memory(buf, size, &m, err);
    if (rc == 0) {
        kvp_llama2c_close(m);
        return 0;
    }
    assert_null(m);
    assert_int_equal(err->code, rc);
    assert_true(err->msg[0] != 0);
    assert_null(strchr(err->msg, '\n'));
    return rc;
}

static void test_truncated(void **state)
{
    (void)state;
    struct kvp_err err;
    for (int version = 0; version <= 1; version++) {
        size_t size;
        uint8_t *buf = build(&tiny, version, true, &size);
        size_t hdr = version == 0 ? 28 : 256;
        for (size_t n = 0; n < hdr; n += 4)
            assert_int_equal(open_buf(buf, n, &err), KVP_EFORMAT);
        size_t cuts[] = {hdr, hdr + 4, hdr + 1, size / 2, size - 4, size - 1};
        for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++)
            assert_int_equal(open_buf(buf, cuts[i], &err), KVP_EFORMAT);
        /* one byte too long, four bytes too long */
        assert_int_equal(open_buf(buf, size + 1, &err), KVP_EFORMAT);
        assert_int_equal(open_buf(buf, size + 4, &err), KVP_EFORMAT);
        assert_int_equal(open_buf(buf, size, &err), 0);
        free(buf);
    }
}

/* Set header field i (0..6) of a v0 buffer. */
static void set_field(uint8_t *buf, int i, int32_t v)
{
    memcpy(buf + 4 * i, &v, 4);
}

static void test_bad_dims(void **state)
{
    (void)state;
    struct kvp_err err;
    size_t size;
    uint8_t *buf = build(&tiny, 0, true, &size);
    int32_t bad[] = {0, -1, -8, INT32_MIN};
    for (int f = 0; f < 7; f++) {
        for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
            if (f == 5 && bad[b] != 0 && bad[b] != INT32_MIN)
                continue; /* negative vocab is legal (unshared classifier) */
            int32_t old;
            memcpy(&old, buf + 4 * f, 4);
            set_field(buf, f, bad[b]);
            assert_int_equal(open_buf(buf, size, &err), KVP_EFORMAT);
            set_field(buf, f, old);
        }
    }
    /* n_heads not dividing dim */
    set_field(buf, 3, 3);
    assert_int_equal(open_buf(buf, size, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, "n_heads"));
    /* kv heads not dividing heads */
    set_field(buf, 3, 4);
    set_field(buf, 4, 3);
    assert_int_equal(open_buf(buf, size, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, "n_kv_heads"));
    /* more kv heads than heads */
    set_field(buf, 4, 8);
    assert_int_equal(open_buf(buf, size, &err), KVP_EFORMAT);
    set_field(buf, 4, 2);
    /* huge dims whose product overflows or is absurd */
    int32_t huge[7][7] = {
        {INT32_MAX, 12, 2, 1, 1, 10, 6},
        {8, INT32_MAX, 2, 4, 2, 10, 6},
        {8, 12, INT32_MAX, 4, 2, 10, 6},
        {8, 12, 2, 4, 2, INT32_MAX, 6},
        {8, 12, 2, 4, 2, -INT32_MAX, 6},
        {8, 12, 2, 4, 2, 10, INT32_MAX},
        {65536, 262144, 1024, 2, 2, 4194304, 4194304},
    };
    for (int i = 0; i < 7; i++) {
        uint8_t hdr[64] = {0};
        memcpy(hdr, huge[i], 28);
        assert_int_equal(open_buf(hdr, sizeof(hdr), &err), KVP_EFORMAT);
    }
    /* sanity: restored buffer is valid again */
    assert_int_equal(open_buf(buf, size, &err), 0);
    free(buf);
}

static void test_v1_bad_header(void **state)
{
    (void)state;
    struct kvp_err err;
    size_t size;
    uint8_t *buf = build(&tiny, 1, true, &size);
    /* unknown versions */
    int32_t versions[] = {0, 3, -1, 1000};
    for (size_t i = 0; i < 4; i++) {
        memcpy(buf + 4, &versions[i], 4);
        assert_int_equal(open_buf(buf, size, &err), KVP_EFORMAT);
    }
    int32_t one = 1;
    memcpy(buf + 4, &one, 4);
    /* shared flag not 0/1 */
    buf[36] = 7;
    assert_int_equal(open_buf(buf, size, &err), KVP_EFORMAT);
    buf[36] = 1;
    /* negative vocab is not allowed in v1 */
    int32_t nv = -10;
    memcpy(buf + 8 + 20, &nv, 4);
    assert_int_equal(open_buf(buf, size, &err), KVP_EFORMAT);
    int32_t pv = 10;
    memcpy(buf + 8 + 20, &pv, 4);
    /* wrong shared flag changes the implied size */
    buf[36] = 0;
    assert_int_equal(open_buf(buf, size, &err), KVP_EFORMAT);
    buf[36] = 1;
    assert_int_equal(open_buf(buf, size, &err), 0);
    /* v2 refused as unsupported, with a message that says so */
    int32_t two = 2;
    memcpy(buf + 4, &two, 4);
    assert_int_equal(open_buf(buf, size, &err), KVP_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "version 2"));
    free(buf);
}

static void test_open_errors(void **state)
{
    (void)state;
    struct kvp_err err = {0};
    struct kvp_llama2c *m = NULL;
    assert_int_equal(kvp_llama2c_open("/nonexistent/kvpred/model.bin", &m, &err), KVP_EIO);
    assert_null(m);
    char *path = kvp_test_tmpfile(".bin"); /* empty file */
    assert_int_equal(kvp_llama2c_open(path, &m, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, path));
    remove(path);
    free(path);
    /* misaligned memory */
    size_t size;
    uint8_t *buf = build(&tiny, 0, true, &size);
    assert_int_equal(kvp_llama2c_open_memory(buf + 1, size, &m, &err), KVP_EINVAL);
    /* NULL err is allowed */
    assert_int_equal(kvp_llama2c_open_memory(buf, size - 4, &m, NULL), KVP_EFORMAT);
    free(buf);
}

/* ============================== tokenizer.bin ================================================= */

/* Append one tokenizer.bin entry. */
static size_t put_tok(uint8_t *b, size_t o, float score, const char *s, int32_t len)
{
    memcpy(b + o, &score, 4);
    memcpy(b + o + 4, &len, 4);
    if (len > 0)
        memcpy(b + o + 8, s, (size_t)len);
    return o + 8 + (size_t)(len > 0 ? len : 0);
}

/* A 264-token tokenizer.bin shaped like tok512.bin: <unk>, BOS, EOS, 256 bytes, 5 merges. */
static uint8_t *build_tokbin(size_t *size, int *n_vocab)
{
    uint8_t *b = calloc(1, 8192);
    assert_non_null(b);
    uint32_t maxlen = 7;
    memcpy(b, &maxlen, 4);
    size_t o = 4;
    o = put_tok(b, o, 0, "<unk>", 5);
    o = put_tok(b, o, 0, "\n<s>\n", 5);
    o = put_tok(b, o, 0, "\n</s>\n", 6);
    for (int i = 0; i < 256; i++) {
        char t[8];
        snprintf(t, sizeof(t), "<0x%02X>", i);
        o = put_tok(b, o, 0, t, 6);
    }
    const char *m[] = {" t", "he", " the", "ab", "  "};
    for (int i = 0; i < 5; i++)
        o = put_tok(b, o, (float)-i, m[i], (int32_t)strlen(m[i]));
    *size = o;
    *n_vocab = 264;
    return b;
}

static int load_tok(const uint8_t *buf, size_t size, int n, struct kvp_err *err)
{
    struct kvp_vocab *v = NULL;
    memset(err, 0, sizeof(*err));
    int rc = kvp_vocab_load_llama2c_memory(buf, size, n, &v, err);
    if (rc == 0) {
        kvp_vocab_free(v);
        return 0;
    }
    assert_null(v);
    assert_int_equal(err->code, rc);
    assert_true(err->msg[0] != 0);
    return rc;
}

static void test_tokbin_synthetic(void **state)
{
    (void)state;
    size_t size;
    int n;
    uint8_t *b = build_tokbin(&size, &n);
    struct kvp_vocab *v = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_vocab_load_llama2c_memory(b, size, n, &v, &err), 0);
    assert_int_equal(kvp_vocab_n_tokens(v), 264);
    assert_int_equal(kvp_vocab_bos(v), 1);
    assert_int_equal(kvp_vocab_eos(v), 2);
    assert_int_equal(kvp_vocab_type(v, 0), KVP_TOKEN_UNKNOWN);
    assert_int_equal(kvp_vocab_type(v, 1), KVP_TOKEN_CONTROL);
    assert_int_equal(kvp_vocab_type(v, 2), KVP_TOKEN_CONTROL);
    assert_int_equal(kvp_vocab_type(v, 3), KVP_TOKEN_BYTE);
    assert_int_equal(kvp_vocab_type(v, 258), KVP_TOKEN_BYTE);
    assert_int_equal(kvp_vocab_type(v, 259), KVP_TOKEN_NORMAL);
    size_t len;
    const char *t = kvp_vocab_text(v, 1, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(t, "<s>", 3);
    t = kvp_vocab_text(v, 2, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(t, "</s>", 4);
    t = kvp_vocab_text(v, 259, &len); /* " t" -> "\u2581t" */
    assert_int_equal(len, 4);
    assert_memory_equal(t, "\xe2\x96\x81t", 4);
    t = kvp_vocab_text(v, 263, &len); /* two spaces */
    assert_int_equal(len, 6);
    assert_memory_equal(t, "\xe2\x96\x81\xe2\x96\x81", 6);
    assert_int_equal(kvp_vocab_find(v, "\xe2\x96\x81the", 6), 261);
    assert_true(kvp_vocab_score(v, 262) == -3.0f);
    assert_true(kvp_vocab_add_bos(v));
    assert_true(kvp_vocab_is_eog(v, 2));
    assert_false(kvp_vocab_is_eog(v, 1));
    assert_null(kvp_vocab_text(v, 264, &len));
    assert_null(kvp_vocab_text(v, -1, &len));
    kvp_vocab_free(v);
    kvp_vocab_free(NULL);
    free(b);
}

static void test_tokbin_hostile(void **state)
{
    (void)state;
    size_t size;
    int n;
    uint8_t *b = build_tokbin(&size, &n);
    struct kvp_err err;
    /* truncated anywhere */
    for (size_t cut = 0; cut < size; cut += (cut < 64 ? 1 : 37))
        assert_int_equal(load_tok(b, cut, n, &err), KVP_EFORMAT);
    assert_int_equal(load_tok(b, size - 1, n, &err), KVP_EFORMAT);
    /* n_vocab mismatch both ways */
    assert_int_equal(load_tok(b, size, n + 1, &err), KVP_EFORMAT);
    assert_int_equal(load_tok(b, size, n - 1, &err), KVP_EFORMAT);
    assert_int_equal(load_tok(b, size, 0, &err), KVP_EINVAL);
    assert_int_equal(load_tok(b, size, -5, &err), KVP_EINVAL);
    assert_int_equal(load_tok(b, size, n, &err), 0);
    /* negative and huge lengths in the first entry (offset 4: score, 8: len) */
    int32_t lens[] = {-1, INT32_MIN, INT32_MAX, 8, 1 << 20};
    int32_t good;
    memcpy(&good, b + 8, 4);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        memcpy(b + 8, &lens[i], 4);
        assert_int_equal(load_tok(b, size, n, &err), KVP_EFORMAT);
    }
    memcpy(b + 8, &good, 4);
    /* absurd max_token_length */
    uint32_t huge = 0xffffffffu;
    memcpy(b, &huge, 4);
    assert_int_equal(load_tok(b, size, n, &err), KVP_EFORMAT);
    uint32_t zero = 0;
    memcpy(b, &zero, 4);
    assert_int_equal(load_tok(b, size, n, &err), KVP_EFORMAT);
    free(b);
    /* real files: the right vocab size loads, a wrong one fails */
    const char *p = kvp_test_shared("models/llama2c/tok512.bin");
    if (p) {
        struct kvp_vocab *v = NULL;
        assert_int_equal(kvp_vocab_load_llama2c(p, 512, &v, &err), 0);
        assert_int_equal(kvp_vocab_n_tokens(v), 512);
        kvp_vocab_free(v);
        v = NULL;
        assert_int_equal(kvp_vocab_load_llama2c(p, 105, &v, &err), KVP_EFORMAT);
        assert_null(v);
    }
    p = kvp_test_shared("models/llama2c/babyllama/tok105.bin");
    if (p) {
        struct kvp_vocab *v = NULL;
        assert_int_equal(kvp_vocab_load_llama2c(p, 105, &v, &err), 0);
        kvp_vocab_free(v);
        v = NULL;
        assert_int_equal(kvp_vocab_load_llama2c(p, 512, &v, &err), KVP_EFORMAT);
        assert_null(v);
    }
    struct kvp_vocab *v = NULL;
    assert_int_equal(kvp_vocab_load_llama2c("/nonexistent/tok.bin", 512, &v, &err), KVP_EIO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic_v0_shared),
        cmocka_unit_test(test_synthetic_v0_unshared),
        cmocka_unit_test(test_synthetic_v1),
        cmocka_unit_test(test_synthetic_from_file),
        cmocka_unit_test(test_real_stories260k),
        cmocka_unit_test(test_real_llama2xs),
        cmocka_unit_test(test_real_babyllama),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_dims),
        cmocka_unit_test(test_v1_bad_header),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_tokbin_synthetic),
        cmocka_unit_test(test_tokbin_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
