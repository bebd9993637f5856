/* Encoding checks shared by the tokenizer tests (see vocab_expect.h). */
#include "vocab_expect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "testutil.h"
#include "tokenizer/vocab.h"

int32_t *kvp_test_encode(const struct kvp_vocab *v, const char *text, size_t len, bool add_special,
                         bool parse_special, size_t *n)
{
    struct kvp_err err = {0};
    size_t cap = 3 * len + 16; /* byte fallback: up to 3 ids per byte of a character */
    int32_t *ids = malloc(cap * sizeof(*ids));
    assert_non_null(ids);
    int rc = kvp_vocab_encode(v, text, len, add_special, parse_special, ids, cap, n, &err);
    if (rc)
        fail_msg("encode: %s", err.msg);
    return ids;
}

void kvp_test_expect_ids(const struct kvp_vocab *v, const char *text, bool parse_special,
                         const int32_t *want, size_t n_want)
{
    size_t n;
    int32_t *ids = kvp_test_encode(v, text, strlen(text), false, parse_special, &n);
    if (n != n_want)
        fail_msg("'%s': %zu ids, expected %zu", text, n, n_want);
    for (size_t i = 0; i < n; i++)
        if (ids[i] != want[i])
            fail_msg("'%s': id %zu is %d, expected %d", text, i, ids[i], want[i]);
    free(ids);
}

int kvp_test_llama_vectors(const struct kvp_vocab *v, const char *name, kvp_test_vector_check extra,
                           int *failed)
{
    char inp_rel[256], out_rel[256];
    snprintf(inp_rel, sizeof(inp_rel), "models/tokenizer-tests/ggml-vocab-%s.gguf.inp", name);
    snprintf(out_rel, sizeof(out_rel), "models/tokenizer-tests/ggml-vocab-%s.gguf.out", name);
    KVP_REQUIRE_SHARED(ip, inp_rel);
    char *inp = kvp_test_read_file(ip, NULL);
    KVP_REQUIRE_SHARED(op, out_rel);
    char *out = kvp_test_read_file(op, NULL);
    assert_true(inp && out);
    int cases = kvp_test_vocab_vectors(v, inp, out, extra, failed);
    free(inp);
    free(out);
    return cases;
}

struct kvp_vocab *kvp_test_load_gguf_vocab(const char *path)
{
    struct kvp_gguf *g = NULL;
    struct kvp_err err = {0};
    if (kvp_gguf_open(path, &g, &err))
        fail_msg("%s: %s", path, err.msg);
    struct kvp_vocab *v = NULL;
    if (kvp_vocab_load_gguf(g, &v, &err))
        fail_msg("%s: %s", path, err.msg);
    kvp_gguf_close(g);
    return v;
}
