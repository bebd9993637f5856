/*
 * Encoding checks shared by the tokenizer tests (test_bpe.c, test_tokenizer.c): encode a text
 * with a vocabulary, failing the test on an error, compare its ids with the expected ones, and
 * run llama.cpp's test vectors of a vocabulary.
 */
#ifndef KVP_TESTS_VOCAB_EXPECT_H
#define KVP_TESTS_VOCAB_EXPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "testutil.h"

struct kvp_vocab;

/* The ids of text[0..len) (malloc'd, *n of them); fails the current test on an error. */
int32_t *kvp_test_encode(const struct kvp_vocab *v, const char *text, size_t len, bool add_special,
                         bool parse_special, size_t *n);

/* Fails the current test unless text encodes (no BOS) to exactly want[0..n_want). */
void kvp_test_expect_ids(const struct kvp_vocab *v, const char *text, bool parse_special,
                         const int32_t *want, size_t n_want);

/* EXPECT(v, text, parse_special, id, id, ...): kvp_test_expect_ids with the ids listed. */
#define EXPECT(v, text, ps, ...)                                                                   \
    do {                                                                                           \
        const int32_t w_[] = {__VA_ARGS__};                                                        \
        kvp_test_expect_ids(v, text, ps, w_, sizeof(w_) / sizeof(w_[0]));                          \
    } while (0)

/* The vocabulary of the GGUF file at path; fails the current test on an error. */
struct kvp_vocab *kvp_test_load_gguf_vocab(const char *path);

/* Run llama.cpp's test vectors of the vocabulary called name (models/tokenizer-tests/
 * ggml-vocab-NAME.gguf.inp and .out under ../shared; the test is skipped without them) through
 * kvp_test_vocab_vectors with extra; returns the case count, *failed the failures. */
int kvp_test_llama_vectors(const struct kvp_vocab *v, const char *name, kvp_test_vector_check extra,
                           int *failed);

#endif
