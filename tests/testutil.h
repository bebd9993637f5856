/*
 * Helpers shared by the cmocka test programs: where ../shared is, skipping cleanly when it is
 * absent, temporary files, and running the CLI.
 */
#ifndef KVP_TESTS_TESTUTIL_H
#define KVP_TESTS_TESTUTIL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Absolute path of a file under ../shared (KVP_SHARED_DIR from CTest), or NULL if shared/ or the
 * file is missing. The returned string is static storage, one of 8 used in turn: the last 8
 * paths asked for stay valid together (a test's model, text and reference). */
const char *kvp_test_shared(const char *relpath);

/* Same, but skips the current cmocka test with a message when the file is missing (under CI,
 * kvp_test_shared has failed it already, and outside it has noted the skip). */
#define KVP_REQUIRE_SHARED(var, relpath)                                                           \
    const char *var = kvp_test_shared(relpath);                                                    \
    do {                                                                                           \
        if (!var) {                                                                                \
            print_message("[  SKIP    ] ../shared/%s not found, test skipped\n", relpath);         \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* Whether the tests run under CI (CI=true): then a missing input is a failure, not a skip. */
bool kvp_test_in_ci(void);

/* Append "program: why" to $KVP_SKIP_LOG (scripts/test.sh counts the lines at the end). */
void kvp_test_note_skip(const char *why);

/* A missing input (a file, a tool, a server): under CI fail the current test naming it, else
 * skip it with a message and a line in the skip log. Does not return. */
void kvp_test_skip_missing(const char *what);

/* Skip the current test because this machine cannot run it (a CPU feature, /proc): a skip under
 * CI too, noted in the skip log. Does not return. */
void kvp_test_skip_unsupported(const char *why);

/* KVP_TEST_FILTER that matches none of tests[0..n): says so and returns 1 (the program then
 * fails instead of running nothing); else 0. cmocka_run_group_tests below calls it. */
int kvp_test_filter_check(const struct CMUnitTest *tests, size_t n);

#undef cmocka_run_group_tests
#define cmocka_run_group_tests(group_tests, group_setup, group_teardown)                           \
    (kvp_test_filter_check(group_tests, sizeof(group_tests) / sizeof((group_tests)[0]))            \
         ? 1                                                                                       \
         : _cmocka_run_group_tests(#group_tests, group_tests,                                      \
                                   sizeof(group_tests) / sizeof((group_tests)[0]), group_setup,    \
                                   group_teardown))

/* gamma(n) = n·u / (1 - n·u), u = 2^-24 (f32's unit roundoff): a sum of n f32 products (or of
 * n - 1 additions and one more rounding) computed in any order, with or without FMA, lies within
 * gamma(n)·Σ|terms| of the exact sum (Higham, Accuracy and Stability of Numerical Algorithms,
 * §3.1). The numeric tests state their bounds in it (docs/testing.md). */
double kvp_test_gamma(double n);

/* max |a[i] - b[i]| over n floats, in double. */
double kvp_test_max_diff(const float *a, const float *b, size_t n);

/* Path of the kvpred CLI built next to the tests (KVP_CLI), or NULL. */
const char *kvp_test_cli(void);

/* The CLI path in var, or skip the current test with a message when KVP_CLI is not set. */
#define KVP_REQUIRE_CLI(var)                                                                       \
    const char *var = kvp_test_cli();                                                              \
    do {                                                                                           \
        if (!var)                                                                                  \
            kvp_test_skip_missing("KVP_CLI not set");                                              \
    } while (0)

/* Run a shell command that must fail the kvpred way: exit status 1 and exactly one output line,
 * starting with "kvpred: error: " and containing needle. */
void kvp_test_expect_error(const char *cmd, const char *needle);

/* A fresh temporary file path (the file is created empty); caller frees with free(). */
char *kvp_test_tmpfile(const char *suffix);

/* A fresh empty temporary directory (mkdtemp under $TMPDIR or /tmp); caller frees with free().
 * Fails the current test when it cannot be made. */
char *kvp_test_tmpdir(void);

/* Read a whole file into a NUL-terminated heap buffer; NULL on failure. */
char *kvp_test_read_file(const char *path, size_t *size);

/* Write bytes to a file; 0 on success. */
int kvp_test_write_file(const char *path, const void *data, size_t size);

/* Run a shell command, capturing stdout (and stderr if merge_stderr) into a heap string.
 * Returns the exit status (or -1). */
int kvp_test_run(const char *cmd, char **output, int merge_stderr);

/* Run cmd (it must exit 0) and parse each line it prints on stdout as one JSON object into
 * js[0..cap) (the caller cJSON_Deletes them); a line that is not JSON fails the test, printed.
 * Returns how many. */
struct cJSON;
int kvp_test_run_json_lines(const char *cmd, struct cJSON **js, int cap);

/* ---- llama.cpp tokenizer test vectors ---- */
struct kvp_vocab;

/* Per-case extra check: the ids text encoded to; returns the failures it found. */
typedef int (*kvp_test_vector_check)(const struct kvp_vocab *v, int index, const char *text,
                                     const int32_t *ids, size_t n);

/* Run every case of a llama.cpp vocab test pair through kvp_vocab_encode (add_special = false,
 * parse_special = false): inp holds the texts separated by "\n__ggml_vocab_test__\n", out one
 * line of expected ids per case (both split as Python's str.split, so the empty text after the
 * last separator is a case too). Both buffers are modified. Prints each mismatch, calls extra
 * (may be NULL) on every case, asserts there are as many lines as cases, and returns the case
 * count; *failed receives the failures. */
int kvp_test_vocab_vectors(const struct kvp_vocab *v, char *inp, char *out,
                           kvp_test_vector_check extra, int *failed);

/* ---- random-weight model fixtures ---- */
struct kvp_test_model_spec {
    int n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx;
    int type;       /* matrix type (enum kvp_type); norms stay F32 */
    int embd_type;  /* token_embd type */
    int tied;       /* 1: no output.weight */
    float rope_base;
    unsigned seed;
    const char *arch; /* NULL: "llama" */
    int biases;       /* 1: attn_q/k/v biases (always for qwen2) */
    int rope_freqs;   /* 1: a rope_freqs.weight tensor of factors in [1, 8] */
    int head_dim;     /* 0: n_embd / n_head; else written as attention.key_length */
};

/* The small random model most tests run on, as an initializer of struct kvp_test_model_spec: 4
 * layers 64 wide, 4 query heads over 2 KV heads, feed-forward 96, context 512, F32, tied output;
 * the vocabulary size and the seed as given. */
#define KVP_TEST_FIXTURE_SPEC(vocab, sd)                                                           \
    {                                                                                              \
        .n_vocab = (vocab), .n_embd = 64, .n_layer = 4, .n_head = 4, .n_head_kv = 2, .n_ff = 96,   \
        .n_ctx = 512, .tied = 1, .seed = (sd)                                                      \
    }

/* Write a GGUF model with random weights (deterministic in seed). When deq_path is not NULL,
 * also write the F32 model whose weights are exactly the dequantized weights of the first file,
 * so both must give the same logits up to summation order. Returns 0 on success. */
int kvp_test_write_model(const struct kvp_test_model_spec *spec, const char *path,
                         const char *deq_path);

struct kvp_model;
/* kvp_test_write_model into a fresh temporary file, then opened (both asserted): the model, and
 * the file's path in *path. kvp_test_model_free closes the model and removes and frees the file. */
struct kvp_model *kvp_test_model(const struct kvp_test_model_spec *spec, char **path);
void kvp_test_model_free(struct kvp_model *model, char *path);

#endif
