/*
 * Tokenizer tests. Golden ids come from independent sources only: llama.cpp's tokenization of
 * the reference text (stories260K_logits.json), llama.cpp's SPM vocab test vectors
 * (ggml-vocab-llama-spm.gguf.inp/.out), the greedy outputs in golden_greedy.jsonl, and, for the
 * hand-made vocabularies below, ids worked out by hand from the rules of docs/formats.md
 * §5.2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"
#include "vocab_expect.h"

#include "gguf/gguf.h"
#include "tokenizer/vocab.h"

#define TOK_HAVE_GGUF 1

/* ============================== Helpers ======================================================= */

/* Decode ids as a streaming client would (prev = previous id, -1 first). Heap string. */
static char *decode(const struct kvp_vocab *v, const int32_t *ids, size_t n, int first_prev)
{
    size_t cap = 64 * n + 1, o = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    int prev = first_prev;
    for (size_t i = 0; i < n; i++) {
        o += kvp_vocab_piece(v, prev, ids[i], s + o, cap - 1 - o);
        prev = ids[i];
    }
    s[o] = 0;
    return s;
}

static struct kvp_vocab *load_tokbin(const char *rel, int n_vocab)
{
    const char *p = kvp_test_shared(rel);
    if (!p)
        return NULL;
    struct kvp_vocab *v = NULL;
    struct kvp_err err = {0};
    if (kvp_vocab_load_llama2c(p, n_vocab, &v, &err))
        fail_msg("%s: %s", rel, err.msg);
    return v;
}

/* The reference tokens of stories260K_logits.json (BOS first). */
static int32_t *reference_tokens(size_t *n)
{
    const char *p = kvp_test_shared("reference/stories260K_logits.json");
    if (!p)
        return NULL;
    char *json = kvp_test_read_file(p, NULL);
    assert_non_null(json);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    assert_true(cJSON_IsArray(toks));
    *n = (size_t)cJSON_GetArraySize(toks);
    int32_t *ids = malloc(*n * sizeof(*ids));
    assert_non_null(ids);
    for (size_t i = 0; i < *n; i++)
        ids[i] = (int32_t)cJSON_GetArrayItem(toks, (int)i)->valueint;
    cJSON_Delete(root);
    free(json);
    return ids;
}

/* Check that v encodes the reference text to the reference tokens. llama.cpp's list holds the
 * first 256 tokens of the text (the model was evaluated in one batch of 256), so the encoding
 * must start with exactly those. */
static void check_reference(const struct kvp_vocab *v)
{
    KVP_REQUIRE_SHARED(tp, "reference/stories260K_logits.input.txt");
    size_t len;
    char *text = kvp_test_read_file(tp, &len);
    assert_non_null(text);
    size_t n_ref;
    int32_t *ref = reference_tokens(&n_ref);
    assert_non_null(ref);
    assert_int_equal(n_ref, 256);
    size_t n;
    int32_t *ids = kvp_test_encode(v, text, len, true, false, &n);
    assert_true(n >= n_ref);
    for (size_t i = 0; i < n_ref; i++)
        if (ids[i] != ref[i])
            fail_msg("token %zu: got %d, llama.cpp has %d", i, ids[i], ref[i]);
    /* and the full encoding decodes back to the text */
    char *back = decode(v, ids, n, -1);
    assert_string_equal(back, text);
    free(back);
    free(ids);
    free(ref);
    free(text);
}

/* ============================== tok512 / tok105 =============================================== */

static void test_tok512_reference(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(p, "models/llama2c/tok512.bin");
    (void)p;
    struct kvp_vocab *v = load_tokbin("models/llama2c/tok512.bin", 512);
    check_reference(v);
    kvp_vocab_free(v);
}

static void test_tok512_basics(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(p, "models/llama2c/tok512.bin");
    (void)p;
    struct kvp_vocab *v = load_tokbin("models/llama2c/tok512.bin", 512);
    size_t n;
    int32_t *ids = kvp_test_encode(v, "", 0, true, false, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    free(ids);
    ids = kvp_test_encode(v, "", 0, false, false, &n);
    assert_int_equal(n, 0);
    free(ids);
    /* a newline is the byte token <0x0A> = 3 + 10 (docs/formats.md §5.2, tok512 layout
     * §6.3) */
    ids = kvp_test_encode(v, "a\nb", 3, false, false, &n);
    bool found = false;
    for (size_t i = 0; i < n; i++)
        found |= ids[i] == 13;
    assert_true(found);
    free(ids);
    /* BOS text is not special unless asked */
    ids = kvp_test_encode(v, "<s>", 3, false, true, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    free(ids);
    ids = kvp_test_encode(v, "<s>", 3, false, false, &n);
    assert_true(n > 1);
    free(ids);
    /* decoding: BOS and EOS print nothing, byte tokens their byte */
    char buf[16];
    assert_int_equal(kvp_vocab_piece(v, -1, 1, buf, sizeof(buf)), 0);
    assert_int_equal(kvp_vocab_piece(v, 1, 2, buf, sizeof(buf)), 0);
    assert_int_equal(kvp_vocab_piece(v, 5, 13, buf, sizeof(buf)), 1);
    assert_int_equal(buf[0], '\n');
    /* token 261 is " a": the leading space goes after BOS only */
    assert_int_equal(kvp_vocab_piece(v, 1, 261, buf, sizeof(buf)), 1);
    assert_memory_equal(buf, "a", 1);
    assert_int_equal(kvp_vocab_piece(v, 300, 261, buf, sizeof(buf)), 2);
    assert_memory_equal(buf, " a", 2);
    /* truncation to cap */
    assert_int_equal(kvp_vocab_piece(v, 300, 261, buf, 1), 1);
    assert_int_equal(kvp_vocab_piece(v, 300, 9999, buf, sizeof(buf)), 0);
    /* cap too small: ERANGE with the full count */
    int32_t small[2];
    struct kvp_err err = {0};
    assert_int_equal(kvp_vocab_encode(v, "Once upon a time", 16, true, false, small, 2, &n, &err),
                     KVP_ERANGE);
    assert_true(n > 2);
    assert_int_equal(small[0], 1);
    kvp_vocab_free(v);
}

/* decode(golden ids) == golden text, and decode(encode(text)) == text. */
static void test_golden_roundtrip(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(gp, "models/golden_greedy.jsonl");
    char *all = kvp_test_read_file(gp, NULL);
    assert_non_null(all);
    int lines = 0;
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        const char *tok = cJSON_GetObjectItemCaseSensitive(o, "tokenizer")->valuestring;
        const char *text = cJSON_GetObjectItemCaseSensitive(o, "text")->valuestring;
        cJSON *jids = cJSON_GetObjectItemCaseSensitive(o, "ids");
        char rel[256];
        snprintf(rel, sizeof(rel), "models/%s", tok);
        int n_vocab = strstr(tok, "105") ? 105 : 512;
        struct kvp_vocab *v = load_tokbin(rel, n_vocab);
        assert_non_null(v);
        size_t n = (size_t)cJSON_GetArraySize(jids);
        int32_t *ids = malloc(n * sizeof(*ids));
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)cJSON_GetArrayItem(jids, (int)i)->valueint;
        char *s = decode(v, ids, n, 1); /* generation started from BOS */
        assert_string_equal(s, text);
        free(s);
        free(ids);
        size_t m;
        ids = kvp_test_encode(v, text, strlen(text), true, false, &m);
        assert_int_equal(ids[0], 1);
        s = decode(v, ids, m, -1);
        assert_string_equal(s, text);
        free(s);
        free(ids);
        kvp_vocab_free(v);
        cJSON_Delete(o);
        lines++;
    }
    assert_int_equal(lines, 3);
    free(all);
}

/* ============================== Hand-made vocabularies ======================================== */

#define MARK "\xe2\x96\x81"

/* ids: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then the extra tokens given. */
static struct kvp_vocab *tiny_vocab(int n_extra, const char *const *extra, const float *escore,
                                    const int32_t *etype)
{
    int n = 259 + n_extra;
    const char **texts = calloc((size_t)n, sizeof(*texts));
    size_t *lens = calloc((size_t)n, sizeof(*lens));
    float *scores = calloc((size_t)n, sizeof(*scores));
    int32_t *types = calloc((size_t)n, sizeof(*types));
    char(*hex)[8] = calloc(256, sizeof(*hex));
    assert_true(texts && lens && scores && types && hex);
    texts[0] = "<unk>";
    types[0] = KVP_TOKEN_UNKNOWN;
    texts[1] = "<s>";
    types[1] = KVP_TOKEN_CONTROL;
    texts[2] = "</s>";
    types[2] = KVP_TOKEN_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(hex[b], 8, "<0x%02X>", b);
        texts[3 + b] = hex[b];
        types[3 + b] = KVP_TOKEN_BYTE;
    }
    for (int i = 0; i < n_extra; i++) {
        texts[259 + i] = extra[i];
        scores[259 + i] = escore[i];
        types[259 + i] = etype ? etype[i] : KVP_TOKEN_NORMAL;
    }
    for (int i = 0; i < n; i++)
        lens[i] = strlen(texts[i]);
    struct kvp_vocab *v = NULL;
    struct kvp_err err = {0};
    if (kvp_vocab_create_spm(n, texts, lens, scores, types, 1, 2, 0, &v, &err))
        fail_msg("create_spm: %s", err.msg);
    free(hex); /* texts were copied */
    free(types);
    free(scores);
    free(lens);
    free(texts);
    return v;
}

static void test_merge_priority(void **state)
{
    (void)state;
    /* 259 ▁, 260 a, 261 b, 262 c, 263 ab (-5), 264 bc (-1) */
    const char *ex[] = {MARK, "a", "b", "c", "ab", "bc"};
    const float sc[] = {0, 0, 0, 0, -5, -1};
    struct kvp_vocab *v = tiny_vocab(6, ex, sc, NULL);
    /* "bc" scores higher than "ab", so it merges first and "ab" never forms */
    EXPECT(v, "abc", false, 259, 260, 264);
    EXPECT(v, "ab", false, 259, 263);
    kvp_vocab_free(v);

    /* add "abc" (-0.5): a + bc -> abc after the first merge */
    const char *ex2[] = {MARK, "a", "b", "c", "ab", "bc", "abc"};
    const float sc2[] = {0, 0, 0, 0, -5, -1, -0.5f};
    v = tiny_vocab(7, ex2, sc2, NULL);
    EXPECT(v, "abc", false, 259, 265);
    /* with "ab" preferred instead, "abc" is reached via ab + c? No: "abc" needs a pair; ab+c
       concatenates to "abc" too, so the result is the same token */
    kvp_vocab_free(v);

    /* a merged pair can join the prefix: "▁a" beats "ab" */
    const char *ex3[] = {MARK, "a", "b", MARK "a", "ab"};
    const float sc3[] = {0, 0, 0, -1, -2};
    v = tiny_vocab(5, ex3, sc3, NULL);
    EXPECT(v, "ab", false, 262, 261);
    EXPECT(v, "b a", false, 259, 261, 262);
    kvp_vocab_free(v);
}

static void test_merge_ties(void **state)
{
    (void)state;
    /* equal scores: the pair with the lower left index merges first */
    const char *ex[] = {MARK, "a", "b", "c", "ab", "bc"};
    const float sc[] = {0, 0, 0, 0, -1, -1};
    struct kvp_vocab *v = tiny_vocab(6, ex, sc, NULL);
    EXPECT(v, "abc", false, 259, 263, 262);
    EXPECT(v, "bcab", false, 259, 264, 263);
    /* "aaa": pairs (0,1) and (1,2) tie; the left one wins, leaving "aa" + "a" */
    kvp_vocab_free(v);
    const char *ex2[] = {MARK, "a", "aa"};
    const float sc2[] = {0, 0, -1};
    v = tiny_vocab(3, ex2, sc2, NULL);
    EXPECT(v, "aaa", false, 259, 261, 260);
    EXPECT(v, "aaaa", false, 259, 261, 261);
    kvp_vocab_free(v);
}

static void test_byte_fallback(void **state)
{
    (void)state;
    const char *ex[] = {MARK, "a"};
    const float sc[] = {0, 0};
    struct kvp_vocab *v = tiny_vocab(2, ex, sc, NULL);
    /* unknown characters become one byte token per UTF-8 byte: id = 3 + byte */
    EXPECT(v, "a\n", false, 259, 260, 3 + 0x0A);
    EXPECT(v, "\xc3\xa9", false, 259, 3 + 0xC3, 3 + 0xA9); /* é */
    EXPECT(v, "\t", false, 259, 3 + 0x09);
    /* decoding the bytes gives back the character */
    size_t n;
    int32_t *ids = kvp_test_encode(v, "a\xc3\xa9\n", 4, true, false, &n);
    char *s = decode(v, ids, n, -1);
    assert_string_equal(s, "a\xc3\xa9\n");
    free(s);
    free(ids);
    kvp_vocab_free(v);

    /* without "▁" in the vocabulary the space prefix itself falls back to bytes E2 96 81 */
    const char *ex2[] = {"a"};
    const float sc2[] = {0};
    v = tiny_vocab(1, ex2, sc2, NULL);
    EXPECT(v, "a", false, 3 + 0xE2, 3 + 0x96, 3 + 0x81, 259);
    kvp_vocab_free(v);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    const char *ex[] = {MARK, "a"};
    const float sc[] = {0, 0};
    struct kvp_vocab *v = tiny_vocab(2, ex, sc, NULL);
    /* a stray continuation byte, a lone 0xFF, and a character cut short at the end */
    EXPECT(v, "a\x80", false, 259, 260, 3 + 0x80);
    EXPECT(v, "\xff" "a", false, 259, 3 + 0xFF, 260);
    EXPECT(v, "a\xe2\x96", false, 259, 260, 3 + 0xE2, 3 + 0x96);
    /* a lead byte swallows the next bytes as one symbol even when they are not continuations */
    EXPECT(v, "\xe2" "aa", false, 259, 3 + 0xE2, 3 + 'a', 3 + 'a');
    kvp_vocab_free(v);
}

static void test_special_partition(void **state)
{
    (void)state;
    /* 259 ▁, 260 a, 261 b, 262 <t (user), 263 <tag> (user), 264 <ctl> (control) */
    const char *ex[] = {MARK, "a", "b", "<t", "<tag>", "<ctl>"};
    const float sc[] = {0, 0, 0, 0, 0, 0};
    const int32_t ty[] = {KVP_TOKEN_NORMAL,       KVP_TOKEN_NORMAL,       KVP_TOKEN_NORMAL,
                          KVP_TOKEN_USER_DEFINED, KVP_TOKEN_USER_DEFINED, KVP_TOKEN_CONTROL};
    struct kvp_vocab *v = tiny_vocab(6, ex, sc, ty);
    /* user-defined always match, longest first; text after a special gets the space prefix */
    EXPECT(v, "a<tag>b", false, 259, 260, 263, 259, 261);
    EXPECT(v, "a<tb", false, 259, 260, 262, 259, 261);
    EXPECT(v, "<tag><t", false, 263, 262);
    /* control tokens only with parse_special */
    EXPECT(v, "a<ctl>", true, 259, 260, 264);
    EXPECT(v, "<s>a", true, 1, 259, 260);
    EXPECT(v, "a<s>", false, 259, 260, 3 + '<', 3 + 's', 3 + '>');
    /* add_special puts BOS first */
    size_t n;
    int32_t *ids = kvp_test_encode(v, "<s>", 3, true, true, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 1);
    free(ids);
    /* decoding: control prints nothing, user-defined its text */
    char buf[16];
    assert_int_equal(kvp_vocab_piece(v, 260, 264, buf, sizeof(buf)), 0);
    assert_int_equal(kvp_vocab_piece(v, 260, 263, buf, sizeof(buf)), 5);
    assert_memory_equal(buf, "<tag>", 5);
    assert_int_equal(kvp_vocab_find(v, "<tag>", 5), 263);
    assert_int_equal(kvp_vocab_find(v, "<ta", 3), -1);
    kvp_vocab_free(v);
}

static void test_create_errors(void **state)
{
    (void)state;
    const char *texts[] = {"<unk>", "a"};
    size_t lens[] = {5, 1};
    int32_t bad_type[] = {2, 9};
    struct kvp_vocab *v = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_vocab_create_spm(0, texts, lens, NULL, NULL, -1, -1, 0, &v, &err),
                     KVP_EINVAL);
    assert_int_equal(kvp_vocab_create_spm(2, texts, lens, NULL, NULL, 5, -1, 0, &v, &err),
                     KVP_EINVAL);
    assert_int_equal(kvp_vocab_create_spm(2, texts, lens, NULL, bad_type, -1, -1, 0, &v, &err),
                     KVP_EFORMAT);
    assert_null(v);
    /* no BOS: add_special adds nothing */
    assert_int_equal(kvp_vocab_create_spm(2, texts, lens, NULL, NULL, -1, -1, 0, &v, &err), 0);
    size_t n;
    int32_t ids[4];
    assert_int_equal(kvp_vocab_encode(v, "", 0, true, false, ids, 4, &n, &err), 0);
    assert_int_equal(n, 0);
    /* no byte tokens and no "▁": unknown characters become <unk> */
    assert_int_equal(kvp_vocab_encode(v, "a", 1, false, false, ids, 4, &n, &err), 0);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[3], 1);
    kvp_vocab_free(v);
}

/* ============================== GGUF vocabularies ============================================= */

#if TOK_HAVE_GGUF

static void test_gguf_stories_reference(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(p, "models/stories260K.gguf");
    struct kvp_vocab *v = kvp_test_load_gguf_vocab(p);
    assert_int_equal(kvp_vocab_n_tokens(v), 512);
    assert_int_equal(kvp_vocab_bos(v), 1);
    assert_int_equal(kvp_vocab_eos(v), 2);
    check_reference(v);
    kvp_vocab_free(v);
}

/* The 47 cases of llama.cpp's SPM vocab test (add_special = false, parse_special = false). */
static void test_llama_spm_vectors(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(gp, "models/tokenizer-tests/ggml-vocab-llama-spm.gguf");
    struct kvp_vocab *v = kvp_test_load_gguf_vocab(gp);
    assert_int_equal(kvp_vocab_n_tokens(v), 32000);
    int failed;
    int cases = kvp_test_llama_vectors(v, "llama-spm", NULL, &failed);
    assert_int_equal(cases, 47);
    assert_int_equal(failed, 0);
    kvp_vocab_free(v);
}

/* write_gguf then reload: same tokens, ids, flags and encodings. */
static void test_write_reload(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(p, "models/llama2c/tok512.bin");
    (void)p;
    struct kvp_vocab *v = load_tokbin("models/llama2c/tok512.bin", 512);
    struct kvp_gguf_writer *w = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_init(&w, &err), 0);
    assert_int_equal(kvp_vocab_write_gguf(v, w, &err), 0);
    uint8_t *buf = NULL;
    size_t size = 0;
    if (kvp_gguf_writer_to_memory(w, &buf, &size, &err))
        fail_msg("%s", err.msg);
    kvp_gguf_writer_free(w);
    struct kvp_gguf *g = NULL;
    if (kvp_gguf_open_memory(buf, size, &g, &err))
        fail_msg("%s", err.msg);
    const char *s;
    size_t len;
    assert_int_equal(kvp_gguf_get_str(g, "tokenizer.ggml.pre", &s, &len, &err), 0);
    assert_int_equal(len, 7);
    assert_memory_equal(s, "default", 7);
    struct kvp_vocab *r = NULL;
    if (kvp_vocab_load_gguf(g, &r, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(kvp_vocab_n_tokens(r), 512);
    for (int i = 0; i < 512; i++) {
        size_t l1, l2;
        const char *t1 = kvp_vocab_text(v, i, &l1), *t2 = kvp_vocab_text(r, i, &l2);
        assert_int_equal(l1, l2);
        assert_memory_equal(t1, t2, l1);
        assert_true(kvp_vocab_score(v, i) == kvp_vocab_score(r, i));
        assert_int_equal(kvp_vocab_type(v, i), kvp_vocab_type(r, i));
    }
    assert_int_equal(kvp_vocab_bos(r), 1);
    assert_int_equal(kvp_vocab_eos(r), 2);
    assert_true(kvp_vocab_add_bos(r));
    const char *text = "Once upon a time, there was a little girl.\nShe said \"hi\" \xc3\xa9!";
    size_t n1, n2;
    int32_t *a = kvp_test_encode(v, text, strlen(text), true, false, &n1);
    int32_t *b = kvp_test_encode(r, text, strlen(text), true, false, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * sizeof(*a));
    free(a);
    free(b);
    kvp_vocab_free(r);
    kvp_gguf_close(g);
    free(buf);
    kvp_vocab_free(v);
}

static void test_gguf_refusals(void **state)
{
    (void)state;
    struct kvp_err err = {0};
    struct kvp_vocab *v = NULL;
    struct kvp_gguf *g = NULL;
    /* hand-written files: no model key, unknown model, mismatched arrays, bad ids */
    struct {
        const char *model;
        int n_scores;
        int bos;
        int want;
    } cases[] = {
        {NULL, 3, 1, KVP_ENOTFOUND},
        {"bert", 3, 1, KVP_EUNSUPPORTED},
        {"llama", 2, 1, KVP_EFORMAT},
        {"llama", 3, 99, 0}, /* out-of-range id ignored: default 1 kept */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct kvp_gguf_writer *w = NULL;
        assert_int_equal(kvp_gguf_writer_init(&w, &err), 0);
        const char *toks[] = {"<unk>", "<s>", "</s>"};
        const float sc[] = {0, 0, 0};
        if (cases[c].model)
            kvp_gguf_writer_set_str(w, "tokenizer.ggml.model", cases[c].model);
        kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3);
        kvp_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", sc, (size_t)cases[c].n_scores);
        kvp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)cases[c].bos);
        uint8_t *buf = NULL;
        size_t size = 0;
        assert_int_equal(kvp_gguf_writer_to_memory(w, &buf, &size, &err), 0);
        kvp_gguf_writer_free(w);
        assert_int_equal(kvp_gguf_open_memory(buf, size, &g, &err), 0);
        v = NULL;
        int rc = kvp_vocab_load_gguf(g, &v, &err);
        assert_int_equal(rc, cases[c].want);
        if (rc == 0) {
            assert_int_equal(kvp_vocab_bos(v), 1);
            kvp_vocab_free(v);
        } else {
            assert_null(v);
            assert_true(err.msg[0] != 0);
        }
        kvp_gguf_close(g);
        free(buf);
    }

    /* byte-level BPE now loads (its behaviour is tested in test_bpe.c) */
    KVP_REQUIRE_SHARED(p, "models/tokenizer-tests/ggml-vocab-gpt-2.gguf");
    v = NULL;
    assert_int_equal(kvp_gguf_open(p, &g, &err), 0);
    assert_int_equal(kvp_vocab_load_gguf(g, &v, &err), 0);
    assert_int_equal(kvp_vocab_kind(v), KVP_VOCAB_BPE);
    kvp_vocab_free(v);
    kvp_gguf_close(g);
}

#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tok512_reference),
        cmocka_unit_test(test_tok512_basics),
        cmocka_unit_test(test_golden_roundtrip),
        cmocka_unit_test(test_merge_priority),
        cmocka_unit_test(test_merge_ties),
        cmocka_unit_test(test_byte_fallback),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_special_partition),
        cmocka_unit_test(test_create_errors),
#if TOK_HAVE_GGUF
        cmocka_unit_test(test_gguf_stories_reference),
        cmocka_unit_test(test_llama_spm_vectors),
        cmocka_unit_test(test_write_reload),
        cmocka_unit_test(test_gguf_refusals),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
