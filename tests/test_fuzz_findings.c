/*
 * Regression tests for what the fuzz targets (fuzz/, scripts/fuzz.sh) found, one test per
 * finding, each built around the reproducer the fuzzer wrote (reduced by hand), plus the hostile
 * inputs of the readers the targets opened up (the trace reader's in-memory entry point).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "predictor/trace.h"
#include "tokenizer/vocab.h"
#include "train/train.h"

/* ---- helpers ------------------------------------------------------------------------------- */

/* A trainer vocabulary learned on a short repeated text, and the engine's copy of it. */
static void small_vocabs(struct kvp_tvocab **tv, struct kvp_vocab **ev)
{
    static const char base[] = "the quiet river runs past the old mill and the village sleeps. ";
    size_t reps = 40, n = (sizeof(base) - 1) * reps;
    char *text = malloc(n);
    assert_non_null(text);
    for (size_t i = 0; i < reps; i++)
        memcpy(text + i * (sizeof(base) - 1), base, sizeof(base) - 1);
    struct kvp_err err;
    assert_int_equal(kvp_tvocab_learn(text, n, 300, tv, &err), 0);
    free(text);
    assert_int_equal(kvp_vocab_create_spm((*tv)->n, (const char *const *)(*tv)->text, (*tv)->len,
                                          (*tv)->score, (*tv)->type, 1, 2, 0, ev, &err),
                     0);
}

/* A valid trace: block 2, 1 layer, 2 heads, sequences of T[0..n_seq) tokens, checksum last.
 * Returns its size; buf must have room. */
static size_t make_trace(uint8_t *buf, const uint32_t *T, uint32_t n_seq)
{
    const uint32_t hdr[6] = {1, 2, 0, 1, 2, n_seq};
    size_t n = 0;
    memcpy(buf, "KVPTRC01", 8);
    n = 8;
    memcpy(buf + n, hdr, sizeof(hdr));
    n += sizeof(hdr);
    memset(buf + n, 0, 64);
    n += 64;
    for (uint32_t s = 0; s < n_seq; s++) {
        memcpy(buf + n, &T[s], 4);
        n += 4;
        for (uint32_t t = 0; t < T[s]; t++)
            for (uint32_t i = 0; i < 2 * 2 * ((t + 2) / 2); i++) {
                float x = 0.5f;
                memcpy(buf + n, &x, 4);
                n += 4;
            }
    }
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= buf[i];
        h *= 1099511628211ULL;
    }
    memcpy(buf + n, &h, 8);
    return n + 8;
}

/* ---- findings ------------------------------------------------------------------------------ */

/* fuzz_spm, reproducer "m" (flags add_special, empty text): the trainer's encoder gave the empty
 * text one token (the space prefix, "▁") while the engine gives none, so the trainer and the
 * engine disagreed on it. Both now give no token. */
static void test_empty_text_trainer_equals_engine(void **state)
{
    (void)state;
    struct kvp_tvocab *tv;
    struct kvp_vocab *ev;
    small_vocabs(&tv, &ev);
    int32_t a[4], b[4];
    size_t na = 99, nb = 99;
    struct kvp_err err;
    assert_int_equal(kvp_tvocab_encode(tv, "", 0, true, a, 4, &na, &err), 0);
    assert_int_equal(kvp_vocab_encode(ev, "", 0, false, false, b, 4, &nb, &err), 0);
    assert_int_equal(na, 0);
    assert_int_equal(nb, 0);
    /* one byte still gets the prefix, in both */
    assert_int_equal(kvp_tvocab_encode(tv, "t", 1, true, a, 4, &na, &err), 0);
    assert_int_equal(kvp_vocab_encode(ev, "t", 1, false, false, b, 4, &nb, &err), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof(int32_t));
    kvp_vocab_free(ev);
    kvp_tvocab_free(tv);
}

/* fuzz_corpus_json, reproducer the empty file (and any text of under 4 sentences): the refusal's
 * message read the sentence count from the corpus it had just freed (ASan: heap-use-after-free);
 * the word-count refusal printed the threshold, 16, as the count found. Both give the count. */
static void test_corpus_refusal_counts(void **state)
{
    (void)state;
    struct kvp_corpus *c = NULL;
    struct kvp_err err;
    assert_int_equal(kvp_corpus_init(&c, "", 0, NULL, 0.0, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "has 0 sentences"));
    static const char two[] = "One short line. Two short lines.";
    assert_int_equal(kvp_corpus_init(&c, two, sizeof(two) - 1, NULL, 0.0, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "has 2 sentences"));
    static const char few[] = "The cat sat. The cat ran. The cat sat. The cat ran. The cat sat.";
    assert_int_equal(kvp_corpus_init(&c, few, sizeof(few) - 1, NULL, 0.0, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "has 3 distinct words"));
    assert_null(c);
}

/* ---- the trace reader's hostile inputs --------------------------------------------------- */

static void test_trace_parse_memory(void **state)
{
    (void)state;
    static uint8_t buf[4096];
    const uint32_t T[2] = {3, 5};
    size_t n = make_trace(buf, T, 2);
    struct kvp_trace tr;
    struct kvp_err err;
    assert_int_equal(kvp_trace_parse(buf, n, &tr, &err), 0);
    assert_int_equal(tr.n_seq, 2);
    assert_int_equal(tr.seq[1].T, 5);
    assert_true(kvp_trace_row(&tr, 1, 4, 0, 1)[0] == 0.5f);
    kvp_trace_free(&tr);
    /* one byte short, one byte long, a flipped bit: refused with one line */
    assert_int_equal(kvp_trace_parse(buf, n - 1, &tr, &err), KVP_EFORMAT);
    assert_int_equal(kvp_trace_parse(buf, n + 1, &tr, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, "unexpected bytes"));
    buf[100] ^= 1;
    assert_int_equal(kvp_trace_parse(buf, n, &tr, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, "checksum"));
    assert_int_equal(kvp_trace_parse(NULL, 0, &tr, &err), KVP_EFORMAT);
}

/* A 100-byte trace announcing 2^24 sequences, or a sequence of 2^20 tokens, is refused as
 * truncated before anything of that size is allocated. */
static void test_trace_counts_bounded_by_size(void **state)
{
    (void)state;
    static uint8_t buf[4096];
    const uint32_t T[1] = {2};
    size_t n = make_trace(buf, T, 1);
    struct kvp_trace tr;
    struct kvp_err err;
    uint32_t many = 1u << 24;
    memcpy(buf + 8 + 5 * 4, &many, 4); /* n_seq */
    assert_int_equal(kvp_trace_parse(buf, n, &tr, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, "truncated"));
    n = make_trace(buf, T, 1);
    uint32_t long_seq = 1u << 20;
    memcpy(buf + 8 + 6 * 4 + 64, &long_seq, 4); /* T of sequence 0 */
    assert_int_equal(kvp_trace_parse(buf, n, &tr, &err), KVP_EFORMAT);
    assert_non_null(strstr(err.msg, "truncated"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_text_trainer_equals_engine),
        cmocka_unit_test(test_corpus_refusal_counts),
        cmocka_unit_test(test_trace_parse_memory),
        cmocka_unit_test(test_trace_counts_bounded_by_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
