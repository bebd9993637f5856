/*
 * Byte-level BPE tests (docs/formats.md §5.3–5.5). Golden ids come from independent
 * sources only: llama.cpp's GPT-2 vocab test vectors (ggml-vocab-gpt-2.gguf.inp/.out, read from
 * ../shared at run time), and, for the scanners, the byte map and the hand-made vocabularies below,
 * words and ids worked out by hand from the reference regexes and rules of §5.3 and §5.5.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "vocab_expect.h"

#include "gguf/gguf.h"
#include "tokenizer/pretok.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

#define G "\xc4\xa0" /* U+0120, the byte-mapped space */
#define C "\xc4\x8a" /* U+010A, the byte-mapped LF */

/* ============================== Helpers ======================================================= */

/* Concatenated pieces of ids; heap string with its length in *len. */
static char *decode(const struct kvp_vocab *v, const int32_t *ids, size_t n, size_t *len)
{
    size_t cap = 64 * n + 1, o = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++)
        o += kvp_vocab_piece(v, i ? ids[i - 1] : -1, ids[i], s + o, cap - 1 - o);
    s[o] = 0;
    *len = o;
    return s;
}

/* Description of a hand-made gpt2 vocabulary written to GGUF with the writer. NULL pre or
 * merges leave the key out; n_types < 0 leaves token_type out. */
struct tiny {
    const char *pre;
    const char *const *toks;
    int n_toks;
    const int32_t *types;
    int n_types;
    const char *const *merges;
    int n_merges;
    int add_bos; /* -1: key absent */
    bool merges_as_ints;
};

/* Write t to GGUF in memory and load it; returns the load status, *out set on success. */
static int tiny_load(const struct tiny *t, struct kvp_vocab **out, struct kvp_err *err)
{
    struct kvp_gguf_writer *w = NULL;
    assert_int_equal(kvp_gguf_writer_init(&w, err), 0);
    assert_int_equal(kvp_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"), 0);
    if (t->pre)
        assert_int_equal(kvp_gguf_writer_set_str(w, "tokenizer.ggml.pre", t->pre), 0);
    assert_int_equal(
        kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", t->toks, NULL, (size_t)t->n_toks),
        0);
    if (t->n_types >= 0)
        assert_int_equal(kvp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", t->types,
                                                     (size_t)t->n_types),
                         0);
    if (t->merges_as_ints) {
        const int32_t bogus[2] = {1, 2};
        assert_int_equal(kvp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.merges", bogus, 2), 0);
    } else if (t->merges) {
        assert_int_equal(kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", t->merges, NULL,
                                                     (size_t)t->n_merges),
                         0);
    }
    if (t->add_bos >= 0)
        assert_int_equal(
            kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", t->add_bos != 0), 0);
    uint8_t *buf = NULL;
    size_t size = 0;
    assert_int_equal(kvp_gguf_writer_to_memory(w, &buf, &size, err), 0);
    kvp_gguf_writer_free(w);
    struct kvp_gguf *g = NULL;
    assert_int_equal(kvp_gguf_open_memory(buf, size, &g, err), 0);
    *out = NULL;
    int rc = kvp_vocab_load_gguf(g, out, err);
    kvp_gguf_close(g);
    free(buf);
    return rc;
}

/* Load or fail the test. */
static struct kvp_vocab *tiny_vocab(const struct tiny *t)
{
    struct kvp_err err = {0};
    struct kvp_vocab *v = NULL;
    if (tiny_load(t, &v, &err))
        fail_msg("tiny vocabulary: %s", err.msg);
    return v;
}

/* ============================== Byte map and classes ========================================== */

static void test_byte_map(void **state)
{
    (void)state;
    assert_int_equal(kvp_byte_to_cp(' '), 0x120);
    assert_int_equal(kvp_byte_to_cp('\n'), 0x10a);
    assert_int_equal(kvp_byte_to_cp('\t'), 0x109);
    assert_int_equal(kvp_byte_to_cp(0x00), 0x100);
    assert_int_equal(kvp_byte_to_cp(0x7f), 0x121);
    assert_int_equal(kvp_byte_to_cp(0xa0), 0x142);
    assert_int_equal(kvp_byte_to_cp(0xad), 0x143);
    assert_int_equal(kvp_byte_to_cp('A'), 'A');
    assert_int_equal(kvp_byte_to_cp(0xe9), 0xe9);
    /* §5.3: the 68 remapped bytes take U+0100.. in increasing byte order; a bijection */
    uint32_t next = 0x100;
    bool seen[0x144] = {false};
    for (int b = 0; b < 256; b++) {
        bool direct = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        uint32_t cp = kvp_byte_to_cp((uint8_t)b);
        if (direct)
            assert_int_equal(cp, (uint32_t)b);
        else
            assert_int_equal(cp, next++);
        assert_false(seen[cp]);
        seen[cp] = true;
        assert_int_equal(kvp_cp_to_byte(cp), b);
    }
    assert_int_equal(next, 0x144);
    assert_int_equal(kvp_cp_to_byte(0x20), -1);
    assert_int_equal(kvp_cp_to_byte(0x144), -1);
    assert_int_equal(kvp_cp_to_byte(0x2581), -1);
}

static void test_classes(void **state)
{
    (void)state;
    const struct {
        uint32_t cp;
        unsigned flags;
    } cases[] = {
        {'a', KVP_CP_LETTER},
        {'Z', KVP_CP_LETTER},
        {'5', KVP_CP_NUMBER},
        {' ', KVP_CP_SPACE},
        {'\r', KVP_CP_SPACE},
        {'_', 0},
        {0xe9, KVP_CP_LETTER},   /* é */
        {0x4e2d, KVP_CP_LETTER}, /* 中 */
        {0x0663, KVP_CP_NUMBER}, /* Arabic-Indic three, Nd */
        {0x00bd, KVP_CP_NUMBER}, /* ½, No */
        {0x2160, KVP_CP_NUMBER}, /* Roman numeral one, Nl */
        {0x0301, 0},             /* combining acute, Mn: not a letter */
        {0x00a0, KVP_CP_SPACE},
        {0x3000, KVP_CP_SPACE},
        {0x0085, KVP_CP_SPACE},
        {0x200b, 0},              /* zero-width space is not White_Space */
        {0x20ac, 0},              /* € */
        {0x1f600, 0},             /* emoji */
        {0x10400, KVP_CP_LETTER}, /* Deseret */
        {KVP_CP_INVALID, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (kvp_cp_flags(cases[i].cp) != cases[i].flags)
            fail_msg("U+%04X: flags %u, expected %u", cases[i].cp, kvp_cp_flags(cases[i].cp),
                     cases[i].flags);

    uint32_t cp;
    assert_int_equal(kvp_utf8_decode("\xc3\xa9", 2, &cp), 2);
    assert_int_equal(cp, 0xe9);
    assert_int_equal(kvp_utf8_decode("\xf0\x9f\x98\x81", 4, &cp), 4);
    assert_int_equal(cp, 0x1f601);
    assert_int_equal(kvp_utf8_decode("\xe2\x96", 2, &cp), 1); /* truncated */
    assert_int_equal(cp, KVP_CP_INVALID);
    assert_int_equal(kvp_utf8_decode("\x80", 1, &cp), 1);
    assert_int_equal(cp, KVP_CP_INVALID);
    assert_int_equal(kvp_utf8_decode("\xc3"
                                     "a",
                                     2, &cp),
                     1);
    assert_int_equal(cp, KVP_CP_INVALID);
}

/* ============================== Pre-tokenizer scanners ======================================== */

/* Split text with kind and compare with the NULL-terminated word list want. */
static void expect_words(int kind, const char *text, const char *const *want)
{
    struct kvp_words w = {0};
    size_t len = strlen(text);
    assert_int_equal(kvp_pretok_split(kind, text, len, &w), 0);
    size_t n_want = 0;
    while (want[n_want])
        n_want++;
    size_t start = 0;
    for (size_t i = 0; i < w.n || i < n_want; i++) {
        if (i >= w.n || i >= n_want)
            fail_msg("'%s' (kind %d): %zu words, expected %zu", text, kind, w.n, n_want);
        size_t n = w.end[i] - start;
        if (n != strlen(want[i]) || memcmp(text + start, want[i], n) != 0)
            fail_msg("'%s' (kind %d): word %zu is '%.*s', expected '%s'", text, kind, i, (int)n,
                     text + start, want[i]);
        start = w.end[i];
    }
    assert_int_equal(start, len);
    kvp_words_free(&w);
}

#define WORDS(kind, text, ...)                                                                     \
    do {                                                                                           \
        const char *const w_[] = {__VA_ARGS__, NULL};                                              \
        expect_words(kind, text, w_);                                                              \
    } while (0)

static void test_scan_llama3(void **state)
{
    (void)state;
    const int L = KVP_PRETOK_LLAMA3;
    /* contractions in any case */
    WORDS(L, "I'm here's THEY'RE we'Ve", "I", "'m", " here", "'s", " THEY", "'RE", " we", "'Ve");
    WORDS(L, "'ll 'x", "'ll", " '", "x");
    /* digits in groups of at most 3; a space before digits stands alone */
    WORDS(L, "12345 1234567", "123", "45", " ", "123", "456", "7");
    WORDS(L, "a1b", "a", "1", "b");
    /* a single non-letter, non-digit, non-newline character prefixes a letter run */
    WORDS(L, " hello\thello.hello", " hello", "\thello", ".hello");
    WORDS(L, " .hello", " .", "hello");
    /* white-space runs: the last space before a word moves to that word */
    WORDS(L, "  hello", " ", " hello");
    WORDS(L, "a    b", "a", "   ", " b");
    WORDS(L, "hi   ", "hi", "   ");
    WORDS(L, "a \t", "a", " \t");
    /* CR/LF: a run ends after its last CR/LF; punctuation absorbs following CR/LF */
    WORDS(L, "hello\r\n\r\nworld", "hello", "\r\n\r\n", "world");
    WORDS(L, "a  \n  b", "a", "  \n", " ", " b");
    WORDS(L, "hello!!\n\nworld", "hello", "!!\n\n", "world");
    WORDS(L, "x\n", "x", "\n");
    WORDS(L, "\nx", "\n", "x");
    /* non-ASCII letters, numbers and marks */
    WORDS(L, "x\xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87", "x\xc3\xa9t\xc3\xa9",
          " \xe4\xb8\xad\xe6\x96\x87");
    WORDS(L, "x\xd9\xa3\xd9\xa3\xd9\xa3\xd9\xa3", "x", "\xd9\xa3\xd9\xa3\xd9\xa3", "\xd9\xa3");
    WORDS(L, "e\xcc\x81x", "e", "\xcc\x81x");
    /* U+3000 ideographic space is white space */
    WORDS(L,
          "a\xe3\x80\x80\xe3\x80\x80"
          "b",
          "a", "\xe3\x80\x80",
          "\xe3\x80\x80"
          "b");
    /* malformed bytes are symbols and never lost */
    WORDS(L, "a\xff\x80 b", "a", "\xff\x80", " b");
    WORDS(L, " ", " ");
}

static void test_scan_qwen2(void **state)
{
    (void)state;
    const int Q = KVP_PRETOK_QWEN2;
    WORDS(Q, "12345", "1", "2", "3", "4", "5");
    WORDS(Q, "x 42!", "x", " ", "4", "2", "!");
    WORDS(Q, "I'M  ok\n", "I", "'M", " ", " ok", "\n");
    WORDS(Q, "  hello", " ", " hello");
}

static void test_scan_gpt2(void **state)
{
    (void)state;
    const int P = KVP_PRETOK_GPT2;
    /* contractions are case-sensitive */
    WORDS(P, "I'm THEY'RE", "I", "'m", " THEY", "'", "RE");
    WORDS(P, "12345 678", "12345", " 678");
    WORDS(P, "  hello", " ", " hello");
    WORDS(P, "hello\n\nworld", "hello", "\n", "\n", "world");
    WORDS(P, "a  \n  b", "a", "  \n ", " b");
    WORDS(P, " !!x", " !!", "x");
    WORDS(P, "\thello", "\t", "hello");
    WORDS(P, "end  ", "end", "  ");
}

static void test_scan_smollm(void **state)
{
    (void)state;
    const int S = KVP_PRETOK_SMOLLM;
    WORDS(S, "abc123 x45", "abc", "1", "2", "3", " x", "4", "5");
    WORDS(S, "a 1", "a", " ", "1");
    WORDS(S, "  hi 2  ", " ", " hi", " ", "2", "  ");
}

static void test_pretok_names(void **state)
{
    (void)state;
    const struct {
        const char *name;
        int kind;
        bool ignore_merges, add_bos;
    } cases[] = {
        {"llama-bpe", KVP_PRETOK_LLAMA3, true, true},
        {"llama3", KVP_PRETOK_LLAMA3, true, true},
        {"llama-v3", KVP_PRETOK_LLAMA3, true, true},
        {"falcon3", KVP_PRETOK_LLAMA3, true, true},
        {"dbrx", KVP_PRETOK_LLAMA3, false, false},
        {"smaug-bpe", KVP_PRETOK_LLAMA3, false, false},
        {"qwen2", KVP_PRETOK_QWEN2, false, false},
        {"stablelm2", KVP_PRETOK_QWEN2, false, false},
        {"gpt-2", KVP_PRETOK_GPT2, false, false},
        {"olmo", KVP_PRETOK_GPT2, false, false},
        {"smollm", KVP_PRETOK_SMOLLM, false, false},
        {"command-r", KVP_PRETOK_SMOLLM, false, false},
        {"default", KVP_PRETOK_NONE, false, false},
        {"", KVP_PRETOK_NONE, false, false},
        {"qwen", KVP_PRETOK_NONE, false, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct kvp_pretok_info info = kvp_pretok_lookup(cases[i].name, strlen(cases[i].name));
        assert_int_equal(info.kind, cases[i].kind);
        assert_int_equal(info.ignore_merges, cases[i].ignore_merges);
        assert_int_equal(info.add_bos, cases[i].add_bos);
    }
    struct kvp_words w = {0};
    assert_int_equal(kvp_pretok_split(KVP_PRETOK_NONE, "x", 1, &w), KVP_EINVAL);
    assert_int_equal(kvp_pretok_split(KVP_PRETOK_GPT2, "", 0, &w), 0);
    assert_int_equal(w.n, 0);
    kvp_words_free(&w);
    kvp_words_free(NULL);
}

/* ============================== Hand-made vocabularies ======================================== */

/* ids: 0 a, 1 b, 2 c, 3 d, 4 Ġ, 5 ab, 6 bc, 7 abc, 8 Ġab, 9 abd, 10 aa, 11 aaaa,
 *      12 <|eot|> (control), 13 <x> (user-defined), 14 Ċ */
static const char *const tiny_toks[] = {"a",    "b",   "c",  "d",    G,         "ab",  "bc", "abc",
                                        G "ab", "abd", "aa", "aaaa", "<|eot|>", "<x>", C};
static const int32_t tiny_types[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 4, 1};
#define TINY_N 15

static void test_merge_rank(void **state)
{
    (void)state;
    /* "b c" ranks before "a b": abc → a + bc → abc */
    const char *const m1[] = {"b c", "a b", "a bc", G " ab"};
    struct tiny t = {"gpt-2", tiny_toks, TINY_N, tiny_types, TINY_N, m1, 4, -1, false};
    struct kvp_vocab *v = tiny_vocab(&t);
    assert_int_equal(kvp_vocab_kind(v), KVP_VOCAB_BPE);
    EXPECT(v, "abc", false, 7);
    EXPECT(v, "ab", false, 5);
    EXPECT(v, "abd", false, 5, 3); /* no rule makes abd */
    EXPECT(v, "cab", false, 2, 5);
    /* " ab": Ġ a b → Ġ ab; "Ġ ab" is rank 3 → Ġab */
    EXPECT(v, " ab", false, 8);
    EXPECT(v, "a b", false, 0, 4, 1); /* " b" is a word: Ġ b, no rule */
    kvp_vocab_free(v);

    /* "a b" first: abc → ab + c, and "ab c" does not exist */
    const char *const m2[] = {"a b", "b c", "a bc"};
    t.merges = m2;
    t.n_merges = 3;
    v = tiny_vocab(&t);
    EXPECT(v, "abc", false, 5, 2);
    EXPECT(v, "bc", false, 6);
    EXPECT(v, " ab", false, 4, 5); /* no Ġ ab rule now */
    kvp_vocab_free(v);

    /* ties go left: aaa → aa a; aaaa → aa aa → aaaa; aaaaa → aaaa a */
    const char *const m3[] = {"a a", "aa aa"};
    t.merges = m3;
    t.n_merges = 2;
    v = tiny_vocab(&t);
    EXPECT(v, "aaa", false, 10, 0);
    EXPECT(v, "aaaa", false, 11);
    EXPECT(v, "aaaaa", false, 11, 0);
    EXPECT(v, "aaaaaa", false, 11, 10);
    kvp_vocab_free(v);
}

static void test_whole_word(void **state)
{
    (void)state;
    const char *const m[] = {"a b"};
    /* llama-bpe ignores merges for a word that is a token: abd stays whole */
    struct tiny t = {"llama-bpe", tiny_toks, TINY_N, tiny_types, TINY_N, m, 1, -1, false};
    struct kvp_vocab *v = tiny_vocab(&t);
    EXPECT(v, "abd", false, 9);
    EXPECT(v, "abc", false, 7); /* abc is a token too */
    EXPECT(v, "abca", false, 5, 2, 0);
    kvp_vocab_free(v);
    /* qwen2 splits the same way but always merges */
    t.pre = "qwen2";
    v = tiny_vocab(&t);
    EXPECT(v, "abd", false, 5, 3);
    EXPECT(v, "abc", false, 5, 2);
    kvp_vocab_free(v);
}

static void test_special_and_defaults(void **state)
{
    (void)state;
    const char *const m[] = {"a b"};
    struct tiny t = {"gpt-2", tiny_toks, TINY_N, tiny_types, TINY_N, m, 1, -1, false};
    struct kvp_vocab *v = tiny_vocab(&t);
    /* user-defined always, control only with parse_special; no space prefix after either */
    EXPECT(v, "ab<x>ab", false, 5, 13, 5);
    EXPECT(v, "ab<|eot|>", true, 5, 12);
    size_t n;
    int32_t *ids = kvp_test_encode(v, "a<|eot|>", 8, false, false, &n);
    for (size_t i = 0; i < n; i++) /* raw text: its bytes, which this vocabulary mostly lacks */
        assert_int_not_equal(ids[i], 12);
    free(ids);
    /* gpt-2 defaults: bos = eos = 11, no BOS added; <|eot|> is not a known EOT spelling */
    assert_int_equal(kvp_vocab_bos(v), 11);
    assert_int_equal(kvp_vocab_eos(v), 11);
    assert_false(kvp_vocab_add_bos(v));
    ids = kvp_test_encode(v, "ab", 2, true, false, &n);
    assert_int_equal(n, 1);
    free(ids);
    /* decoding: byte-mapped back, control silent, user-defined verbatim */
    char buf[32];
    assert_int_equal(kvp_vocab_piece(v, -1, 8, buf, sizeof(buf)), 3);
    assert_memory_equal(buf, " ab", 3);
    assert_int_equal(kvp_vocab_piece(v, -1, 14, buf, sizeof(buf)), 1);
    assert_int_equal(buf[0], '\n');
    assert_int_equal(kvp_vocab_piece(v, -1, 12, buf, sizeof(buf)), 0);
    assert_int_equal(kvp_vocab_piece(v, -1, 13, buf, sizeof(buf)), 3);
    assert_memory_equal(buf, "<x>", 3);
    assert_int_equal(kvp_vocab_piece(v, -1, 8, buf, 2), 2); /* truncated to cap */
    kvp_vocab_free(v);

    /* llama-bpe: BOS by default (id 11 = aaaa here, any valid id will do); the key overrides */
    t.pre = "llama-bpe";
    v = tiny_vocab(&t);
    assert_true(kvp_vocab_add_bos(v));
    ids = kvp_test_encode(v, "ab", 2, true, false, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 11);
    free(ids);
    kvp_vocab_free(v);
    t.add_bos = 0;
    v = tiny_vocab(&t);
    assert_false(kvp_vocab_add_bos(v));
    kvp_vocab_free(v);
}

static void test_eog_by_text(void **state)
{
    (void)state;
    /* 0 a, 1 <|end_of_text|>, 2 <|eot_id|>, 3 <|eom_id|> */
    const char *const toks[] = {"a", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"};
    const int32_t types[] = {1, 3, 3, 3};
    const char *const m[] = {"a a"};
    const char *const toks2[] = {"a", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "aa"};
    const int32_t types2[] = {1, 3, 3, 3, 1};
    (void)toks;
    (void)types;
    struct tiny t = {"llama3", toks2, 5, types2, 5, m, 1, -1, false};
    struct kvp_vocab *v = tiny_vocab(&t);
    assert_true(kvp_vocab_is_eog(v, 1));
    assert_true(kvp_vocab_is_eog(v, 2));
    assert_true(kvp_vocab_is_eog(v, 3));
    assert_false(kvp_vocab_is_eog(v, 0));
    assert_false(kvp_vocab_is_eog(v, 4));
    assert_false(kvp_vocab_is_eog(v, -1));
    EXPECT(v, "a<|eot_id|>", true, 0, 2);
    kvp_vocab_free(v);
}

/* A vocabulary with every byte as a token plus a few merges, for round trips. */
static struct kvp_vocab *full_byte_vocab(const char *pre)
{
    static char texts[256][4];
    const char *toks[256 + 8];
    for (int b = 0; b < 256; b++) {
        size_t k = kvp_utf8_encode(kvp_byte_to_cp((uint8_t)b), texts[b]);
        texts[b][k] = 0;
        toks[b] = texts[b];
    }
    const char *extra[] = {G "t", "he", G "the", "in", G G, C C, "12", "<|eot|>"};
    for (int i = 0; i < 8; i++)
        toks[256 + i] = extra[i];
    int32_t types[264];
    for (int i = 0; i < 264; i++)
        types[i] = i == 263 ? KVP_TOKEN_CONTROL : KVP_TOKEN_NORMAL;
    const char *const m[] = {G " t", "h e", G "t he", "i n", G " " G, C " " C, "1 2"};
    struct tiny t = {pre, toks, 264, types, 264, m, 7, -1, false};
    return tiny_vocab(&t);
}

static void roundtrip(const struct kvp_vocab *v, const char *text, size_t len)
{
    size_t n, dn;
    int32_t *ids = kvp_test_encode(v, text, len, false, false, &n);
    char *back = decode(v, ids, n, &dn);
    if (dn != len || memcmp(back, text, len) != 0)
        fail_msg("round trip of %zu bytes gave %zu bytes", len, dn);
    free(back);
    free(ids);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random strings: raw bytes, or pieces drawn from an alphabet of ASCII, UTF-8 and junk. */
static void roundtrip_many(const struct kvp_vocab *v, int count, uint64_t seed)
{
    static const char *const alpha[] = {"a",
                                        "Z",
                                        " ",
                                        "  ",
                                        "\n",
                                        "\r\n",
                                        "\t",
                                        "'s",
                                        "'RE",
                                        "1",
                                        "123",
                                        ".",
                                        "!!",
                                        "\xc3\xa9",
                                        "\xe4\xb8\xad",
                                        "\xf0\x9f\x98\x81",
                                        "\xd9\xa3",
                                        "\xcc\x81",
                                        "\xe3\x80\x80",
                                        "\xff",
                                        "\x80",
                                        "\xe2\x96",
                                        "<|eot|>",
                                        "\x00"};
    const size_t n_alpha = sizeof(alpha) / sizeof(alpha[0]);
    char buf[512];
    for (int i = 0; i < count; i++) {
        size_t len = 0;
        size_t want = rng_next(&seed) % 200;
        if (i % 2 == 0) {
            for (; len < want; len++)
                buf[len] = (char)(rng_next(&seed) & 0xff);
        } else {
            while (len < want) {
                size_t k = rng_next(&seed) % n_alpha;
                size_t kl = k == n_alpha - 1 ? 1 : strlen(alpha[k]);
                memcpy(buf + len, alpha[k], kl);
                len += kl;
            }
        }
        roundtrip(v, buf, len);
    }
}

static void test_roundtrip_tiny(void **state)
{
    (void)state;
    const char *pres[] = {"llama-bpe", "qwen2", "gpt-2", "smollm"};
    const char *fixed[] = {"",
                           "the theme",
                           "  hello\n\n\nworld  ",
                           "12 123 1212",
                           "\xff\xfe",
                           "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x81",
                           "\xe2\x96\x81x\xe2\x96"};
    for (size_t p = 0; p < sizeof(pres) / sizeof(pres[0]); p++) {
        struct kvp_vocab *v = full_byte_vocab(pres[p]);
        for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
            roundtrip(v, fixed[i], strlen(fixed[i]));
        roundtrip_many(v, 400, 0x9e3779b97f4a7c15ull + p);
        kvp_vocab_free(v);
    }
    /* merges do happen: " the" is one token */
    struct kvp_vocab *v = full_byte_vocab("gpt-2");
    EXPECT(v, " the", false, 258);
    EXPECT(v, "    ", false, 260, 260);
    kvp_vocab_free(v);
}

/* Long words stay fast: one 100 kB word of letters and one of spaces. */
static void test_long_word(void **state)
{
    (void)state;
    struct kvp_vocab *v = full_byte_vocab("llama-bpe");
    size_t len = 100000;
    char *s = malloc(len);
    assert_non_null(s);
    for (size_t i = 0; i < len; i++)
        s[i] = "the"[i % 3];
    roundtrip(v, s, len);
    memset(s, ' ', len);
    roundtrip(v, s, len);
    free(s);
    kvp_vocab_free(v);
}

/* ============================== Hostile metadata ============================================== */

static void test_hostile(void **state)
{
    (void)state;
    const char *const ok[] = {"a b"};
    const char *const no_space[] = {"ab"};
    const char *const lead_space[] = {" ab"};
    const char *const unknown_left[] = {"q b"};
    const char *const unknown_right[] = {"a q"};
    const char *const unknown_result[] = {"b a"};
    const struct {
        const char *pre;
        const char *const *merges;
        int n_merges;
        int n_types;
        bool merges_as_ints;
        int want;
        const char *msg; /* expected in the message */
    } cases[] = {
        {"gpt-2", no_space, 1, TINY_N, false, KVP_EFORMAT, "no space"},
        {"gpt-2", lead_space, 1, TINY_N, false, KVP_EFORMAT, "no space"},
        {"gpt-2", unknown_left, 1, TINY_N, false, KVP_EFORMAT, "left half"},
        {"gpt-2", unknown_right, 1, TINY_N, false, KVP_EFORMAT, "right half"},
        {"gpt-2", unknown_result, 1, TINY_N, false, KVP_EFORMAT, "result"},
        {"gpt-2", NULL, 0, TINY_N, false, KVP_EFORMAT, "merges missing"},
        {"gpt-2", ok, 1, TINY_N, true, KVP_EFORMAT, "merges"},
        {"gpt-2", ok, 1, TINY_N - 1, false, KVP_EFORMAT, "token_type"},
        {"bogus-pre", ok, 1, TINY_N, false, KVP_EUNSUPPORTED, "bogus-pre"},
        {"default", ok, 1, TINY_N, false, KVP_EUNSUPPORTED, "default"},
        {"", ok, 1, TINY_N, false, KVP_EUNSUPPORTED, "tokenizer.ggml.pre"},
        {NULL, ok, 1, TINY_N, false, KVP_EUNSUPPORTED, "tokenizer.ggml.pre"},
        {"gpt-2", ok, 1, -1, false, 0, NULL},     /* token_type absent: all normal */
        {"gpt-2", ok, 0, TINY_N, false, 0, NULL}, /* an empty merge list is legal */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct tiny t = {cases[c].pre,
                         tiny_toks,
                         TINY_N,
                         tiny_types,
                         cases[c].n_types,
                         cases[c].merges,
                         cases[c].n_merges,
                         -1,
                         cases[c].merges_as_ints};
        if (!cases[c].merges && !cases[c].merges_as_ints && cases[c].want == 0)
            t.merges = ok;
        struct kvp_err err = {0};
        struct kvp_vocab *v = NULL;
        int rc = tiny_load(&t, &v, &err);
        if (rc != cases[c].want)
            fail_msg("case %zu: rc %d, expected %d (%s)", c, rc, cases[c].want, err.msg);
        if (rc == 0) {
            assert_non_null(v);
            kvp_vocab_free(v);
            continue;
        }
        assert_null(v);
        if (!strstr(err.msg, cases[c].msg))
            fail_msg("case %zu: message '%s' lacks '%s'", c, err.msg, cases[c].msg);
    }
}

/* ============================== llama.cpp test vectors ======================================== */

/* The ids of a test-vector case decode back to its text. */
static int check_round_trip(const struct kvp_vocab *v, int index, const char *text,
                            const int32_t *ids, size_t n)
{
    size_t dn;
    char *back = decode(v, ids, n, &dn);
    int bad = dn != strlen(text) || memcmp(back, text, dn) != 0;
    if (bad)
        print_message("case %d does not round-trip\n", index);
    free(back);
    return bad;
}

/* The cases of llama.cpp's GPT-2 vocab test (add_special = false, parse_special = false). */
static void test_gpt2_vectors(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(gp, "models/tokenizer-tests/ggml-vocab-gpt-2.gguf");
    struct kvp_vocab *v = kvp_test_load_gguf_vocab(gp);
    assert_int_equal(kvp_vocab_n_tokens(v), 50257);
    assert_int_equal(kvp_vocab_kind(v), KVP_VOCAB_BPE);
    assert_int_equal(kvp_vocab_bos(v), 50256);
    assert_int_equal(kvp_vocab_eos(v), 50256);
    assert_false(kvp_vocab_add_bos(v)); /* pre = gpt-2, no add_bos key */
    assert_true(kvp_vocab_is_eog(v, 50256));
    int failed;
    int cases = kvp_test_llama_vectors(v, "gpt-2", check_round_trip, &failed);
    print_message("gpt-2 vocab: %d cases, %d failed\n", cases, failed);
    assert_int_equal(cases, 47);
    assert_int_equal(failed, 0);

    /* special tokens: <|endoftext|> is control, so only parse_special matches it */
    EXPECT(v, "Hello<|endoftext|>", true, 15496, 50256);
    size_t n;
    int32_t *ids = kvp_test_encode(v, "<|endoftext|>", 13, false, false, &n);
    assert_true(n > 1);
    free(ids);
    kvp_vocab_free(v);
}

/* decode(encode(x)) == x on the real GPT-2 vocabulary, for random and malformed input. */
static void test_gpt2_roundtrip(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(gp, "models/tokenizer-tests/ggml-vocab-gpt-2.gguf");
    struct kvp_vocab *v = kvp_test_load_gguf_vocab(gp);
    roundtrip_many(v, 300, 12345);
    const char *odd = "\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xf8\x88\x80\x80\x80 \xef\xbb\xbf";
    roundtrip(v, odd, strlen(odd));
    kvp_vocab_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_map),     cmocka_unit_test(test_classes),
        cmocka_unit_test(test_scan_llama3),  cmocka_unit_test(test_scan_qwen2),
        cmocka_unit_test(test_scan_gpt2),    cmocka_unit_test(test_scan_smollm),
        cmocka_unit_test(test_pretok_names), cmocka_unit_test(test_merge_rank),
        cmocka_unit_test(test_whole_word),   cmocka_unit_test(test_special_and_defaults),
        cmocka_unit_test(test_eog_by_text),  cmocka_unit_test(test_roundtrip_tiny),
        cmocka_unit_test(test_long_word),    cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_gpt2_vectors), cmocka_unit_test(test_gpt2_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
