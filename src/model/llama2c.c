/*
 * llama2.c checkpoint reader (docs/formats.md §6.1, §6.2).
 *
 * A llama2.c checkpoint is a small header followed by raw f32 arrays. The legacy layout
 * ("version 0", written by the original export and by most forks) has no magic at all: seven
 * int32 fields and then the arrays, so the only integrity check available is that the file size
 * computed from the header equals the real size, to the byte. Version 1 (`export.py --version 1`)
 * adds the "ak42" magic and a 256-byte header, stores the norms first and drops the RoPE tables.
 * Version 2 stores int8 groups and is refused.
 *
 * The header is untrusted: every dimension must be positive and below a generous cap, the
 * head/kv-head divisibility rules must hold, and every size is computed with overflow-checked
 * arithmetic before any pointer is formed. On success each weight pointer points into the file
 * bytes; nothing is copied. Both layouts keep every array at a multiple of 4 bytes from the start,
 * so the f32 pointers are aligned whenever the base is (mmap gives page alignment; the memory
 * entry point demands 4-byte alignment).
 */
#include "model/llama2c.h"

#include <stdlib.h>
#include <string.h>

#include "core/cursor.h"

#define LLAMA2C_MAGIC 0x616b3432u /* "ak42" as a little-endian u32 */
#define LLAMA2C_V0_HEADER 28      /* seven int32 */
#define LLAMA2C_V1_HEADER 256     /* zero-padded */

/* Caps that no real llama2.c model comes near; they keep hostile headers from describing
 * multi-terabyte files whose sizes would still fit in 64 bits. */
#define LLAMA2C_MAX_DIM (1 << 16)
#define LLAMA2C_MAX_HIDDEN (1 << 18)
#define LLAMA2C_MAX_LAYERS 1024
#define LLAMA2C_MAX_VOCAB (1 << 22)
#define LLAMA2C_MAX_SEQ (1 << 22)

/* The seven config ints as they appear in both header versions. */
struct llama2c_config {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

/* ============================== Header decoding =============================================== */

static int read_config(struct kvp_cursor *cur, struct llama2c_config *c)
{
    int32_t *f[7] = {&c->dim,      &c->hidden_dim, &c->n_layers, &c->n_heads,
                     &c->n_kv_heads, &c->vocab_size, &c->seq_len};
    for (int i = 0; i < 7; i++)
        if (kvp_rd_i32(cur, f[i]) < 0)
            return -1;
    return 0;
}

/* Check one dimension: 1 <= v <= cap. */
static int check_dim(const char *name, int32_t v, int32_t cap, struct kvp_err *err)
{
    if (v <= 0)
        return kvp_err_set(err, KVP_EFORMAT, "llama2.c header: %s = %d must be positive", name,
                           (int)v);
    if (v > cap)
        return kvp_err_set(err, KVP_EFORMAT, "llama2.c header: %s = %d is absurdly large (max %d)",
                           name, (int)v, (int)cap);
    return 0;
}

/* Validate the config (vocab already made positive). */
static int check_config(const struct llama2c_config *c, struct kvp_err *err)
{
    if (check_dim("dim", c->dim, LLAMA2C_MAX_DIM, err) < 0 ||
        check_dim("hidden_dim", c->hidden_dim, LLAMA2C_MAX_HIDDEN, err) < 0 ||
        check_dim("n_layers", c->n_layers, LLAMA2C_MAX_LAYERS, err) < 0 ||
        check_dim("n_heads", c->n_heads, c->dim > 0 ? c->dim : 1, err) < 0 ||
        check_dim("n_kv_heads", c->n_kv_heads, c->n_heads > 0 ? c->n_heads : 1, err) < 0 ||
        check_dim("vocab_size", c->vocab_size, LLAMA2C_MAX_VOCAB, err) < 0 ||
        check_dim("seq_len", c->seq_len, LLAMA2C_MAX_SEQ, err) < 0)
        return err ? err->code : KVP_EFORMAT;
    if (c->dim % c->n_heads != 0)
        return kvp_err_set(err, KVP_EFORMAT, "llama2.c header: dim %d is not a multiple of n_heads %d",
                           (int)c->dim, (int)c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        return kvp_err_set(err, KVP_EFORMAT,
                           "llama2.c header: n_heads %d is not a multiple of n_kv_heads %d",
                           (int)c->n_heads, (int)c->n_kv_heads);
    if ((c->dim / c->n_heads) % 2 != 0)
        return kvp_err_set(err, KVP_EFORMAT, "llama2.c header: head size %d is odd (RoPE rotates pairs)",
                           (int)(c->dim / c->n_heads));
    return 0;
}

/* ============================== Layout ======================================================== */

/* Element counts of every array, computed with overflow checks. */
struct llama2c_sizes {
    size_t emb, norm, wq, wkv, wo, ffn, final, rope, cls;
};

/* n = a * b * c, false on overflow. */
static bool mul3(size_t a, size_t b, size_t c, size_t *n)
{
    size_t t;
    return kvp_mul_ok(a, b, &t) && kvp_mul_ok(t, c, n);
}

static int compute_sizes(const struct llama2c_config *c, bool shared, struct llama2c_sizes *s,
                         struct kvp_err *err)
{
    size_t dim = (size_t)c->dim, L = (size_t)c->n_layers;
    size_t head = dim / (size_t)c->n_heads;
    size_t kv_dim = head * (size_t)c->n_kv_heads;
    memset(s, 0, sizeof(*s));
    bool ok = kvp_mul_ok((size_t)c->vocab_size, dim, &s->emb) && kvp_mul_ok(L, dim, &s->norm) &&
              mul3(L, dim, dim, &s->wq) && mul3(L, kv_dim, dim, &s->wkv) &&
              mul3(L, dim, dim, &s->wo) && mul3(L, (size_t)c->hidden_dim, dim, &s->ffn) &&
              kvp_mul_ok((size_t)c->seq_len, head / 2, &s->rope);
    s->final = dim;
    s->cls = shared ? 0 : s->emb;
    if (!ok)
        return kvp_err_set(err, KVP_EFORMAT, "llama2.c header: model size overflows");
    return 0;
}

/* Total floats in the body; false on overflow. */
static bool body_floats(int version, const struct llama2c_sizes *s, size_t *total)
{
    size_t parts[] = {s->emb, s->norm, s->wq, s->wkv, s->wkv, s->wo, s->norm,
                      s->ffn, s->ffn,  s->ffn, s->final, s->cls, 0, 0};
    if (version == 0) {
        parts[12] = s->rope; /* freq_cis_real */
        parts[13] = s->rope; /* freq_cis_imag */
    }
    size_t t = 0;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        if (!kvp_add_ok(t, parts[i], &t))
            return false;
    *total = t;
    return true;
}

/* Hand out consecutive arrays from the body. */
static const float *take(const float **p, size_t n)
{
    const float *r = *p;
    *p += n;
    return r;
}

static void assign_pointers(struct kvp_llama2c *m, const float *p, const struct llama2c_sizes *s)
{
    if (m->version == 0) {
        /* run.c order: emb, att norms, wq, wk, wv, wo, ffn norms, w1, w2, w3, final, rope, [cls] */
        m->tok_embd = take(&p, s->emb);
        m->rms_att = take(&p, s->norm);
        m->wq = take(&p, s->wq);
        m->wk = take(&p, s->wkv);
        m->wv = take(&p, s->wkv);
        m->wo = take(&p, s->wo);
        m->rms_ffn = take(&p, s->norm);
        m->w1 = take(&p, s->ffn);
        m->w2 = take(&p, s->ffn);
        m->w3 = take(&p, s->ffn);
        m->rms_final = take(&p, s->final);
        take(&p, 2 * s->rope); /* freq_cis_real, freq_cis_imag: recomputed, never read */
    } else {
        /* export.py v1 order: att norms, ffn norms, final, emb, wq, wk, wv, wo, w1, w2, w3, [cls] */
        m->rms_att = take(&p, s->norm);
        m->rms_ffn = take(&p, s->norm);
        m->rms_final = take(&p, s->final);
        m->tok_embd = take(&p, s->emb);
        m->wq = take(&p, s->wq);
        m->wk = take(&p, s->wkv);
        m->wv = take(&p, s->wkv);
        m->wo = take(&p, s->wo);
        m->w1 = take(&p, s->ffn);
        m->w2 = take(&p, s->ffn);
        m->w3 = take(&p, s->ffn);
    }
    m->wcls = m->shared_classifier ? m->tok_embd : take(&p, s->cls);
}

/* ============================== Parsing ======================================================= */

/* Decode the header of either version into m->version, the config and the shared flag, and
 * return the header size in *hdr. */
static int parse_header(struct kvp_llama2c *m, const uint8_t *buf, size_t size,
                        struct llama2c_config *c, size_t *hdr, struct kvp_err *err)
{
    struct kvp_cursor cur;
    kvp_cursor_init(&cur, buf, size);
    uint32_t magic = 0;
    if (size >= 4)
        memcpy(&magic, buf, 4);

    if (magic == LLAMA2C_MAGIC) {
        int32_t version = 0;
        uint8_t shared = 0;
        if (size < LLAMA2C_V1_HEADER)
            return kvp_err_set(err, KVP_EFORMAT,
                               "llama2.c header: file of %zu bytes is shorter than the 256-byte "
                               "\"ak42\" header", size);
        cur.pos = 4;
        kvp_rd_i32(&cur, &version);
        if (version == 2)
            return kvp_err_set(err, KVP_EUNSUPPORTED,
                               "llama2.c version 2 (int8 quantized) checkpoints are not supported; "
                               "export with --version 0 or 1");
        if (version != 1)
            return kvp_err_set(err, KVP_EFORMAT, "llama2.c header: unknown version %d",
                               (int)version);
        read_config(&cur, c);
        kvp_rd_u8(&cur, &shared);
        if (shared > 1)
            return kvp_err_set(err, KVP_EFORMAT,
                               "llama2.c header: shared_classifier flag is %u, not 0 or 1",
                               (unsigned)shared);
        m->version = 1;
        m->shared_classifier = shared == 1;
        *hdr = LLAMA2C_V1_HEADER;
        if (c->vocab_size < 0)
            return kvp_err_set(err, KVP_EFORMAT,
                               "llama2.c header: negative vocab_size %d in a version 1 file",
                               (int)c->vocab_size);
        return 0;
    }

    if (read_config(&cur, c) < 0)
        return kvp_err_set(err, KVP_EFORMAT,
                           "llama2.c header: file of %zu bytes is shorter than the 28-byte header",
                           size);
    m->version = 0;
    /* negative vocab_size: the classifier is stored separately (run.c) */
    m->shared_classifier = c->vocab_size > 0;
    if (c->vocab_size < 0) {
        if (c->vocab_size == INT32_MIN)
            return kvp_err_set(err, KVP_EFORMAT, "llama2.c header: vocab_size %d is absurd",
                               (int)c->vocab_size);
        c->vocab_size = -c->vocab_size;
    }
    *hdr = LLAMA2C_V0_HEADER;
    return 0;
}

/* Parse buf into m (whose map is already set or empty). */
static int parse(struct kvp_llama2c *m, const uint8_t *buf, size_t size, struct kvp_err *err)
{
    struct llama2c_config c = {0};
    struct llama2c_sizes s = {0};
    size_t hdr, floats, bytes, total;
    int rc;

    if ((rc = parse_header(m, buf, size, &c, &hdr, err)) < 0)
        return rc;
    if ((rc = check_config(&c, err)) < 0)
        return rc;
    if ((rc = compute_sizes(&c, m->shared_classifier, &s, err)) < 0)
        return rc;
    if (!body_floats(m->version, &s, &floats) || !kvp_mul_ok(floats, sizeof(float), &bytes) ||
        !kvp_add_ok(bytes, hdr, &total))
        return kvp_err_set(err, KVP_EFORMAT, "llama2.c header: model size overflows");
    if (total != size)
        return kvp_err_set(err, KVP_EFORMAT,
                           "llama2.c checkpoint: file is %zu bytes but the header (dim %d, hidden "
                           "%d, layers %d, heads %d/%d, vocab %d, seq_len %d) implies %zu",
                           size, (int)c.dim, (int)c.hidden_dim, (int)c.n_layers, (int)c.n_heads,
                           (int)c.n_kv_heads, (int)c.vocab_size, (int)c.seq_len, total);

    m->dim = c.dim;
    m->hidden_dim = c.hidden_dim;
    m->n_layers = c.n_layers;
    m->n_heads = c.n_heads;
    m->n_kv_heads = c.n_kv_heads;
    m->vocab_size = c.vocab_size;
    m->seq_len = c.seq_len;
    assign_pointers(m, (const float *)(const void *)(buf + hdr), &s);
    return 0;
}

/* ============================== Public API ==================================================== */

/* Open a checkpoint from disk; the mapping is owned by the handle.
 * Returns 0 or a negative KVP_E* code (message prefixed with the path); *out untouched on error. */
int kvp_llama2c_open(const char *path, struct kvp_llama2c **out, struct kvp_err *err)
{
    struct kvp_err scratch;
    if (!err)
        err = &scratch;
    if (!path || !out)
        return kvp_err_set(err, KVP_EINVAL, "kvp_llama2c_open: NULL argument");
    struct kvp_llama2c *m = calloc(1, sizeof(*m));
    if (!m)
        return kvp_err_set(err, KVP_ENOMEM, "llama2.c checkpoint: out of memory");
    int rc = kvp_file_map(path, &m->map, err);
    if (rc < 0)
        goto fail_free;
    if ((uintptr_t)m->map.data % sizeof(float) != 0) {
        rc = kvp_err_set(err, KVP_EIO, "mapping is not 4-byte aligned");
        goto fail_unmap;
    }
    if ((rc = parse(m, m->map.data, m->map.size, err)) < 0) {
        kvp_err_prefix(err, "%s", path);
        goto fail_unmap;
    }
    *out = m;
    return 0;

fail_unmap:
    kvp_file_unmap(&m->map);
fail_free:
    free(m);
    return rc;
}

/* Open a checkpoint held in a caller's buffer (borrowed, 4-byte aligned, must outlive the
 * handle). Returns 0 or a negative KVP_E* code; *out untouched on error. */
int kvp_llama2c_open_memory(const void *buf, size_t size, struct kvp_llama2c **out,
                            struct kvp_err *err)
{
    if (!out || (!buf && size))
        return kvp_err_set(err, KVP_EINVAL, "kvp_llama2c_open_memory: NULL argument");
    if ((uintptr_t)buf % sizeof(float) != 0)
        return kvp_err_set(err, KVP_EINVAL, "llama2.c checkpoint buffer is not 4-byte aligned");
    struct kvp_llama2c *m = calloc(1, sizeof(*m));
    if (!m)
        return kvp_err_set(err, KVP_ENOMEM, "llama2.c checkpoint: out of memory");
    int rc = parse(m, buf, size, err);
    if (rc < 0) {
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* Release the handle and its mapping (if it owns one). NULL is a no-op. */
void kvp_llama2c_close(struct kvp_llama2c *m)
{
    if (!m)
        return;
    kvp_file_unmap(&m->map);
    free(m);
}
