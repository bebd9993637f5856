/*
 * Tests for llama2.c → GGUF conversion. Each converted file is reopened with the GGUF reader and
 * checked against the raw .bin bytes at offsets computed here from docs/formats.md §6.1
 * (not through the llama2.c reader), against the metadata the format implies, and for stories260K
 * against the independently produced stories260K.gguf. Hostile inputs and unwritable outputs must
 * fail cleanly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#include "model/convert.h"
#include "gguf/gguf.h"
#include "tokenizer/vocab.h"

/* ============================== Checking a converted file ===================================== */

struct hdr {
    int32_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
};

static int64_t get_int(const struct kvp_gguf *g, const char *key)
{
    int64_t x = -1;
    struct kvp_err err = {0};
    if (kvp_gguf_get_int(g, key, &x, &err))
        fail_msg("key %s missing or not an integer", key);
    return x;
}

static double get_float(const struct kvp_gguf *g, const char *key)
{
    double x = -1;
    struct kvp_err err = {0};
    if (kvp_gguf_get_float(g, key, &x, &err))
        fail_msg("key %s missing or not a float", key);
    return x;
}

static void expect_str(const struct kvp_gguf *g, const char *key, const char *want)
{
    const char *s;
    size_t n;
    struct kvp_err err = {0};
    if (kvp_gguf_get_str(g, key, &s, &n, &err))
        fail_msg("key %s missing or not a string", key);
    if (n != strlen(want) || memcmp(s, want, n) != 0)
        fail_msg("%s = '%.*s', expected '%s'", key, (int)n, s, want);
}

/* Check that tensor name has shape [ne0, ne1] (ne1 = 0: 1-D), type F32, and the bytes of the
 * .bin body starting at float index *off; advances *off. */
static void expect_tensor(const struct kvp_gguf *g, const char *name, int64_t ne0, int64_t ne1,
                          const uint8_t *body, size_t *off)
{
    const struct kvp_gguf_tensor *t = kvp_gguf_find_tensor(g, name);
    if (!t)
        fail_msg("tensor %s missing", name);
    assert_int_equal(t->type, KVP_TYPE_F32);
    assert_int_equal(t->n_dims, ne1 ? 2 : 1);
    assert_int_equal(t->ne[0], ne0);
    assert_int_equal(t->ne[1], ne1 ? ne1 : 1);
    size_t n = (size_t)ne0 * (size_t)(ne1 ? ne1 : 1);
    assert_int_equal(t->nbytes, 4 * n);
    if (memcmp(t->data, body + 4 * *off, 4 * n) != 0)
        fail_msg("tensor %s: bytes differ from the checkpoint", name);
    *off += n;
}

/* Per-layer tensors of one stacked llama2.c array [L][out][in]. */
static void expect_stack(const struct kvp_gguf *g, int L, const char *what, int64_t in,
                         int64_t out, const uint8_t *body, size_t *off)
{
    for (int l = 0; l < L; l++) {
        char name[64];
        snprintf(name, sizeof(name), "blk.%d.%s.weight", l, what);
        expect_tensor(g, name, in, out, body, off);
    }
}

/* Verify out_path against the legacy (v0) checkpoint bytes bin[0..size). */
static void check_converted(const char *out_path, const uint8_t *bin, size_t size,
                            const char *want_name, const struct kvp_vocab *want_vocab)
{
    struct hdr h;
    memcpy(&h, bin, 28);
    bool shared = h.vocab > 0;
    int64_t vocab = shared ? h.vocab : -h.vocab;
    int64_t d = h.dim, hid = h.hidden, hs = h.dim / h.heads, kv = hs * h.kv_heads;
    int L = h.layers;

    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    if (kvp_gguf_open(out_path, &g, &err))
        fail_msg("reopen: %s", err.msg);
    assert_int_equal(g->version, 3);
    expect_str(g, "general.architecture", "llama");
    expect_str(g, "general.name", want_name);
    expect_str(g, "tokenizer.ggml.model", "llama");
    expect_str(g, "tokenizer.ggml.pre", "default");
    assert_int_equal(get_int(g, "llama.context_length"), h.seq_len);
    assert_int_equal(get_int(g, "llama.embedding_length"), h.dim);
    assert_int_equal(get_int(g, "llama.block_count"), h.layers);
    assert_int_equal(get_int(g, "llama.feed_forward_length"), h.hidden);
    assert_int_equal(get_int(g, "llama.attention.head_count"), h.heads);
    assert_int_equal(get_int(g, "llama.attention.head_count_kv"), h.kv_heads);
    assert_int_equal(get_int(g, "llama.rope.dimension_count"), hs);
    assert_int_equal(get_int(g, "general.file_type"), 0);
    assert_true(get_float(g, "llama.attention.layer_norm_rms_epsilon") == (double)1e-5f);
    assert_true(get_float(g, "llama.rope.freq_base") == 10000.0);
    assert_int_equal(get_int(g, "tokenizer.ggml.bos_token_id"), 1);
    assert_int_equal(get_int(g, "tokenizer.ggml.eos_token_id"), 2);
    assert_int_equal(get_int(g, "tokenizer.ggml.unknown_token_id"), 0);
    bool b;
    assert_int_equal(kvp_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, &err), 0);
    assert_true(b);
    assert_int_equal(kvp_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b, &err), 0);
    assert_false(b);
    assert_int_equal(kvp_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b, &err), 0);
    assert_true(b);

    /* every tensor, in llama2.c body order (docs/formats.md §6.1) */
    assert_int_equal(g->n_tensors, 2 + 9 * (uint64_t)L + (shared ? 0 : 1));
    const uint8_t *body = bin + 28;
    size_t off = 0;
    expect_tensor(g, "token_embd.weight", d, vocab, body, &off);
    expect_stack(g, L, "attn_norm", d, 0, body, &off);
    expect_stack(g, L, "attn_q", d, d, body, &off);
    expect_stack(g, L, "attn_k", d, kv, body, &off);
    expect_stack(g, L, "attn_v", d, kv, body, &off);
    expect_stack(g, L, "attn_output", d, d, body, &off);
    expect_stack(g, L, "ffn_norm", d, 0, body, &off);
    expect_stack(g, L, "ffn_gate", d, hid, body, &off); /* w1 */
    expect_stack(g, L, "ffn_down", hid, d, body, &off); /* w2 */
    expect_stack(g, L, "ffn_up", d, hid, body, &off);   /* w3 */
    expect_tensor(g, "output_norm.weight", d, 0, body, &off);
    off += (size_t)h.seq_len * (size_t)hs; /* RoPE tables, not converted */
    if (shared)
        assert_null(kvp_gguf_find_tensor(g, "output.weight"));
    else
        expect_tensor(g, "output.weight", d, vocab, body, &off);
    assert_int_equal(28 + 4 * off, size);

    /* the vocabulary survives the trip */
    struct kvp_vocab *v = NULL;
    if (kvp_vocab_load_gguf(g, &v, &err))
        fail_msg("vocab: %s", err.msg);
    assert_int_equal(kvp_vocab_n_tokens(v), vocab);
    for (int i = 0; i < vocab; i++) {
        size_t l1, l2;
        const char *t1 = kvp_vocab_text(v, i, &l1), *t2 = kvp_vocab_text(want_vocab, i, &l2);
        assert_int_equal(l1, l2);
        assert_memory_equal(t1, t2, l1);
        assert_int_equal(kvp_vocab_type(v, i), kvp_vocab_type(want_vocab, i));
        assert_true(kvp_vocab_score(v, i) == kvp_vocab_score(want_vocab, i));
    }
    kvp_vocab_free(v);
    kvp_gguf_close(g);
}

static void convert_real(const char *bin_rel, const char *tok_rel, int n_vocab, const char *name)
{
    KVP_REQUIRE_SHARED(bp, bin_rel);
    char *bin_path = strdup(bp);
    KVP_REQUIRE_SHARED(tp, tok_rel);
    char *tok_path = strdup(tp);
    char *out = kvp_test_tmpfile(".gguf");
    assert_non_null(out);
    struct kvp_err err = {0};
    if (kvp_convert_llama2c(bin_path, tok_path, out, &err))
        fail_msg("convert %s: %s", bin_rel, err.msg);
    size_t size;
    uint8_t *bin = (uint8_t *)kvp_test_read_file(bin_path, &size);
    assert_non_null(bin);
    struct kvp_vocab *v = NULL;
    assert_int_equal(kvp_vocab_load_llama2c(tok_path, n_vocab, &v, &err), 0);
    check_converted(out, bin, size, name, v);
    kvp_vocab_free(v);
    free(bin);
    remove(out);
    free(out);
    free(tok_path);
    free(bin_path);
}

static void test_convert_stories260k(void **state)
{
    (void)state;
    convert_real("models/llama2c/stories260K.bin", "models/llama2c/tok512.bin", 512,
                 "stories260K");
}

static void test_convert_llama2xs(void **state)
{
    (void)state;
    convert_real("models/llama2c/llama2xs/model.bin", "models/llama2c/tok512.bin", 512, "model");
}

static void test_convert_babyllama(void **state)
{
    (void)state;
    convert_real("models/llama2c/babyllama/model5000.bin", "models/llama2c/babyllama/tok105.bin",
                 105, "model5000");
}

/* The converted stories260K carries the same weights and vocabulary as the independently
 * produced stories260K.gguf. */
static void test_matches_distributed_gguf(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(rp, "models/stories260K.gguf");
    char *ref_path = strdup(rp);
    KVP_REQUIRE_SHARED(bp, "models/llama2c/stories260K.bin");
    char *bin_path = strdup(bp);
    KVP_REQUIRE_SHARED(tp, "models/llama2c/tok512.bin");
    char *out = kvp_test_tmpfile(".gguf");
    struct kvp_err err = {0};
    assert_int_equal(kvp_convert_llama2c(bin_path, tp, out, &err), 0);
    struct kvp_gguf *a = NULL, *b = NULL;
    assert_int_equal(kvp_gguf_open(out, &a, &err), 0);
    assert_int_equal(kvp_gguf_open(ref_path, &b, &err), 0);
    int compared = 0;
    for (uint64_t i = 0; i < b->n_tensors; i++) {
        const struct kvp_gguf_tensor *tb = &b->tensors[i];
        const struct kvp_gguf_tensor *ta = kvp_gguf_find_tensor(a, tb->name);
        /* that file repeats the shared classifier as output.weight; ours leaves it tied */
        if (!ta && strcmp(tb->name, "output.weight") == 0) {
            ta = kvp_gguf_find_tensor(a, "token_embd.weight");
            compared--;
        }
        if (!ta)
            fail_msg("tensor %s of stories260K.gguf missing", tb->name);
        assert_int_equal(ta->type, tb->type);
        assert_memory_equal(ta->ne, tb->ne, sizeof(ta->ne));
        if (memcmp(ta->data, tb->data, ta->nbytes) != 0)
            fail_msg("tensor %s differs from stories260K.gguf", tb->name);
        compared++;
    }
    assert_int_equal((uint64_t)compared, a->n_tensors);
    struct kvp_vocab *va = NULL, *vb = NULL;
    assert_int_equal(kvp_vocab_load_gguf(a, &va, &err), 0);
    assert_int_equal(kvp_vocab_load_gguf(b, &vb, &err), 0);
    assert_int_equal(kvp_vocab_n_tokens(va), kvp_vocab_n_tokens(vb));
    for (int i = 0; i < kvp_vocab_n_tokens(va); i++) {
        size_t l1, l2;
        const char *t1 = kvp_vocab_text(va, i, &l1), *t2 = kvp_vocab_text(vb, i, &l2);
        assert_int_equal(l1, l2);
        assert_memory_equal(t1, t2, l1);
        assert_int_equal(kvp_vocab_type(va, i), kvp_vocab_type(vb, i));
    }
    kvp_vocab_free(va);
    kvp_vocab_free(vb);
    kvp_gguf_close(a);
    kvp_gguf_close(b);
    remove(out);
    free(out);
    free(bin_path);
    free(ref_path);
}

/* ============================== Synthetic inputs ============================================== */

/* A legacy checkpoint with body float i = i * 0.5, and a matching tokenizer.bin. */
static uint8_t *synth_bin(const struct hdr *h, size_t *size)
{
    int64_t v = h->vocab < 0 ? -h->vocab : h->vocab;
    int64_t d = h->dim, L = h->layers, hs = d / h->heads, kv = hs * h->kv_heads;
    size_t nf = (size_t)(v * d + 2 * L * d + 2 * L * d * d + 2 * L * kv * d +
                         3 * L * h->hidden * d + d + h->seq_len * hs + (h->vocab < 0 ? v * d : 0));
    *size = 28 + 4 * nf;
    uint8_t *b = malloc(*size);
    assert_non_null(b);
    memcpy(b, h, 28);
    for (size_t i = 0; i < nf; i++) {
        float x = (float)i * 0.5f;
        memcpy(b + 28 + 4 * i, &x, 4);
    }
    return b;
}

static uint8_t *synth_tok(int n, size_t *size)
{
    uint8_t *b = calloc(1, 4 + (size_t)n * 16);
    uint32_t maxlen = 8;
    memcpy(b, &maxlen, 4);
    size_t o = 4;
    for (int i = 0; i < n; i++) {
        char t[16];
        int len = i == 0 ? snprintf(t, sizeof(t), "<unk>")
                 : i == 1 ? snprintf(t, sizeof(t), "\n<s>\n")
                 : i == 2 ? snprintf(t, sizeof(t), "\n</s>\n")
                          : snprintf(t, sizeof(t), " t%d", i);
        float s = (float)-i;
        int32_t l = len;
        memcpy(b + o, &s, 4);
        memcpy(b + o + 4, &l, 4);
        memcpy(b + o + 8, t, (size_t)len);
        o += 8 + (size_t)len;
    }
    *size = o;
    return b;
}

struct synth {
    char *bin, *tok, *out;
};

static void synth_files(struct synth *s, const struct hdr *h, int n_tok)
{
    size_t bs, ts;
    uint8_t *b = synth_bin(h, &bs);
    uint8_t *t = synth_tok(n_tok, &ts);
    s->bin = kvp_test_tmpfile(".bin");
    s->tok = kvp_test_tmpfile(".tok");
    s->out = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_file(s->bin, b, bs), 0);
    assert_int_equal(kvp_test_write_file(s->tok, t, ts), 0);
    free(b);
    free(t);
}

static void synth_free(struct synth *s)
{
    remove(s->bin);
    remove(s->tok);
    remove(s->out);
    free(s->bin);
    free(s->tok);
    free(s->out);
}

static void test_convert_unshared(void **state)
{
    (void)state;
    struct hdr h = {8, 12, 2, 4, 2, -10, 6};
    struct synth s;
    synth_files(&s, &h, 10);
    struct kvp_err err = {0};
    if (kvp_convert_llama2c(s.bin, s.tok, s.out, &err))
        fail_msg("%s", err.msg);
    size_t size;
    uint8_t *bin = (uint8_t *)kvp_test_read_file(s.bin, &size);
    struct kvp_vocab *v = NULL;
    assert_int_equal(kvp_vocab_load_llama2c(s.tok, 10, &v, &err), 0);
    const char *base = strrchr(s.bin, '/') + 1;
    char name[64];
    snprintf(name, sizeof(name), "%.*s", (int)(strlen(base) - 4), base);
    check_converted(s.out, bin, size, name, v);
    kvp_vocab_free(v);
    free(bin);
    synth_free(&s);
}

/* Errors: they name the problem, return the right code and leave no output file behind. */
static void expect_fail(const char *bin, const char *tok, const char *out, int code)
{
    struct kvp_err err = {0};
    int rc = kvp_convert_llama2c(bin, tok, out, &err);
    assert_int_equal(rc, code);
    assert_int_equal(err.code, code);
    assert_true(err.msg[0] != 0);
    assert_null(strchr(err.msg, '\n'));
}

static void test_convert_hostile(void **state)
{
    (void)state;
    struct hdr h = {8, 12, 2, 4, 2, 10, 6};
    struct synth s;
    synth_files(&s, &h, 10);
    remove(s.out);
    struct stat st;

    /* tokenizer for another vocabulary size */
    struct synth s2;
    synth_files(&s2, &h, 11);
    expect_fail(s.bin, s2.tok, s.out, KVP_EFORMAT);
    assert_int_not_equal(stat(s.out, &st), 0);
    synth_free(&s2);

    /* truncated checkpoint, at several sizes */
    size_t size;
    uint8_t *bin = (uint8_t *)kvp_test_read_file(s.bin, &size);
    char *cut = kvp_test_tmpfile(".bin");
    size_t cuts[] = {0, 3, 27, 28, 100, size - 1, size + 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        uint8_t *tmp = calloc(1, size + 8);
        memcpy(tmp, bin, size);
        assert_int_equal(kvp_test_write_file(cut, tmp, cuts[i]), 0);
        free(tmp);
        expect_fail(cut, s.tok, s.out, KVP_EFORMAT);
        assert_int_not_equal(stat(s.out, &st), 0);
    }
    /* a bad header */
    int32_t bad = 3; /* n_heads not dividing dim */
    memcpy(bin + 12, &bad, 4);
    assert_int_equal(kvp_test_write_file(cut, bin, size), 0);
    expect_fail(cut, s.tok, s.out, KVP_EFORMAT);
    /* a GGUF is not a llama2.c checkpoint */
    const char *gg = kvp_test_shared("models/stories260K.gguf");
    if (gg)
        expect_fail(gg, s.tok, s.out, KVP_EFORMAT);
    remove(cut);
    free(cut);
    free(bin);

    /* missing inputs, NULL arguments */
    expect_fail("/nonexistent/kvpred.bin", s.tok, s.out, KVP_EIO);
    expect_fail(s.bin, "/nonexistent/tok.bin", s.out, KVP_EIO);
    expect_fail(NULL, s.tok, s.out, KVP_EINVAL);
    expect_fail(s.bin, NULL, s.out, KVP_EINVAL);
    expect_fail(s.bin, s.tok, NULL, KVP_EINVAL);

    /* unwritable output: a missing directory, and a directory itself */
    expect_fail(s.bin, s.tok, "/nonexistent-kvpred-dir/out.gguf", KVP_EIO);
    char dir[4096];
    const char *tmpdir = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/kvpdirXXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    assert_non_null(mkdtemp(dir));
    expect_fail(s.bin, s.tok, dir, KVP_EIO);
    assert_int_equal(rmdir(dir), 0); /* still empty: nothing was left inside */

    /* and the good inputs still convert */
    struct kvp_err err = {0};
    assert_int_equal(kvp_convert_llama2c(s.bin, s.tok, s.out, &err), 0);
    assert_int_equal(stat(s.out, &st), 0);
    synth_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert_stories260k),
        cmocka_unit_test(test_convert_llama2xs),
        cmocka_unit_test(test_convert_babyllama),
        cmocka_unit_test(test_matches_distributed_gguf),
        cmocka_unit_test(test_convert_unshared),
        cmocka_unit_test(test_convert_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
