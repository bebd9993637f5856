/*
 * The shipped long-context model (models/kvpred-default.gguf) retrieves: a pass key hidden at
 * several depths of a prompt that fills its training context is found by greedy decoding with
 * the full cache. Runs without ../shared (the filler is the passkey task's own noise line), so a
 * fresh clone checks its default model. The full 100-prompt tables are scripts/eval_tasks.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpred.h"
#include "testutil.h"

#define NOISE "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "

static int open_shipped(void **state)
{
    static char path[4096];
    const char *src = getenv("KVP_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/models/kvpred-default.gguf", src ? src : ".");
    kvp_model *model = NULL;
    struct kvp_err err = {0};
    /* the model is part of the repository: missing or unreadable is a failure, not a skip */
    if (kvp_model_open(path, NULL, &model, &err) < 0) {
        print_message("%s: %s\n", path, err.msg);
        return -1;
    }
    *state = model;
    return 0;
}

static int close_shipped(void **state)
{
    kvp_model_close(*state);
    return 0;
}

/* The passkey prompt of the trainer's generator: header, n_noise noise lines with the needle on
 * its own line after `before` of them, the question. Caller frees. */
static char *passkey_prompt(long key, int n_noise, int before)
{
    size_t cap = 512 + (size_t)n_noise * sizeof(NOISE);
    char *p = malloc(cap), *w = p;
    assert_non_null(p);
    w += sprintf(w, "There is an important info hidden inside a lot of irrelevant text. Find it "
                    "and memorize them. I will quiz you about the important information there.\n");
    for (int i = 0; i <= n_noise; i++) {
        if (i == before)
            w += sprintf(w, "\nThe pass key is %ld. Remember it. %ld is the pass key.\n", key, key);
        if (i < n_noise)
            w += sprintf(w, "%s", NOISE);
    }
    sprintf(w, "\nWhat is the pass key? The pass key is");
    return p;
}

/* Greedy answer (at most 8 tokens, up to the first newline) to the prompt. */
static void answer(kvp_ctx *ctx, const kvp_model *m, const char *prompt, char *out, size_t cap)
{
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    size_t cap_ids = (size_t)kvp_ctx_n_ctx(ctx), n = 0;
    int32_t *ids = malloc(cap_ids * sizeof(int32_t));
    float *logits = malloc((size_t)info.n_vocab * sizeof(float));
    struct kvp_err err = {0};
    assert_non_null(ids);
    assert_non_null(logits);
    kvp_ctx_reset(ctx);
    assert_int_equal(kvp_tokenize(m, prompt, strlen(prompt), true, ids, cap_ids, &n, &err), 0);
    assert_true(n + 8 <= cap_ids);
    assert_int_equal(kvp_eval(ctx, ids, (int)n, logits, false, &err), 0);
    size_t len = 0;
    int prev = ids[n - 1];
    for (int step = 0; step < 8; step++) {
        int best = 0;
        for (int v = 1; v < info.n_vocab; v++)
            if (logits[v] > logits[best])
                best = v;
        if (kvp_token_is_eog(m, best))
            break;
        char piece[64];
        size_t k = kvp_token_to_piece(m, prev, best, piece, sizeof(piece));
        if (memchr(piece, '\n', k))
            break;
        if (len + k < cap) {
            memcpy(out + len, piece, k);
            len += k;
        }
        int32_t tok = best;
        assert_int_equal(kvp_eval(ctx, &tok, 1, logits, false, &err), 0);
        prev = best;
    }
    out[len] = 0;
    free(ids);
    free(logits);
}

static void test_passkey_at_full_context(void **state)
{
    const kvp_model *model = *state;
    struct kvp_ctx_params cp = {.n_threads = 2};
    kvp_ctx *ctx = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(model, &cp, &ctx, &err), 0);
    /* as many noise lines as fit the context with room for the answer */
    int n_noise = 8;
    for (;; n_noise += 4) {
        char *p = passkey_prompt(12345, n_noise + 4, 0);
        size_t n = 0;
        int rc = kvp_tokenize(model, p, strlen(p), true, NULL, 0, &n, &err);
        free(p);
        assert_true(rc == 0 || rc == KVP_ERANGE);
        if (n + 16 > (size_t)kvp_ctx_n_ctx(ctx))
            break;
    }
    const long keys[] = {70425, 31862, 958204, 4417, 52093};
    const int n_keys = (int)(sizeof(keys) / sizeof(keys[0]));
    int found = 0;
    for (int i = 0; i < n_keys; i++) {
        int before = n_noise * i / (n_keys - 1); /* depth 0, 25, 50, 75, 100 % */
        char *p = passkey_prompt(keys[i], n_noise, before);
        char out[128], want[32];
        answer(ctx, model, p, out, sizeof(out));
        snprintf(want, sizeof(want), "%ld", keys[i]);
        print_message("depth %3d%%, key %s: '%s'\n", 100 * i / (n_keys - 1), want, out);
        found += strstr(out, want) != NULL;
        free(p);
    }
    kvp_ctx_free(ctx);
    assert_int_equal(found, n_keys);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_passkey_at_full_context),
    };
    return cmocka_run_group_tests(tests, open_shipped, close_shipped);
}
