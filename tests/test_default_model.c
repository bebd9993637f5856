/*
 * The shipped long-context model (models/kvpred-default.gguf) retrieves: a pass key hidden at
 * several depths of a prompt that fills its training context (8192) is found by greedy decoding
 * with the full cache, and so it is at 2048, the context it was extended from. The prompts are the evaluation's own (kvp_task_render_eval), and need no
 * ../shared (the passkey haystack is its own noise line), so a fresh clone checks its default
 * model. The full 100-prompt tables are scripts/eval_tasks.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpred.h"
#include "testutil.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"


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

/* Token count for the prompt generator, as the engine will feed the prompt. */
static int count_tokens(void *ud, const char *text, size_t len, size_t *n_tok)
{
    int rc = kvp_tokenize(ud, text, len, true, NULL, 0, n_tok, NULL);
    return rc == KVP_ERANGE ? 0 : rc;
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

/* The evaluation's passkey prompts (`kvpred eval --task passkey`) in a context of n_ctx tokens
 * (0: the model's), as long as it allows with room for the answer, at n_keys depths evenly
 * spread over 0-100 %; returns how many keys greedy decoding found. */
static int passkeys_found(const kvp_model *model, int n_ctx, int n_keys, uint64_t seed0)
{
    struct kvp_ctx_params cp = {.n_ctx = n_ctx, .n_threads = 2};
    kvp_ctx *ctx = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(model, &cp, &ctx, &err), 0);
    struct kvp_corpus *c = NULL;
    assert_int_equal(kvp_corpus_passkey_only(&c, &err), 0);
    int found = 0;
    for (int i = 0; i < n_keys; i++) {
        struct kvp_task_req req = {.task = KVP_TASK_PASSKEY,
                                   .seed = KVP_EVAL_SEED_BIT | (seed0 + (uint64_t)i),
                                   .target_tokens = kvp_ctx_n_ctx(ctx) - 16,
                                   .depth = (float)i / (float)(n_keys - 1),
                                   .count = count_tokens,
                                   .ud = (void *)model};
        struct kvp_task_text tt;
        assert_int_equal(kvp_task_render_eval(c, &req, &tt, &err), 0);
        char out[128], want[48];
        answer(ctx, model, tt.prompt, out, sizeof(out));
        snprintf(want, sizeof(want), "%.*s", (int)strcspn(tt.refs, "\n"), tt.refs);
        print_message("context %d, depth %3d%%, key %s: '%s'\n", kvp_ctx_n_ctx(ctx),
                      100 * i / (n_keys - 1), want, out);
        assert_true(strlen(want) >= 4);
        found += strstr(out, want) != NULL;
        kvp_task_text_free(&tt);
    }
    kvp_corpus_free(c);
    kvp_ctx_free(ctx);
    return found;
}

/* 5 depths (0, 25, 50, 75, 100 %) at the training context: ~40 CPU-s under ASan at 8192 */
static void test_passkey_at_full_context(void **state)
{
    assert_int_equal(passkeys_found(*state, 0, 5, 1000), 5);
}

/* the extension must not have cost the short context: depths 0, 50 and 100 % at 2048 */
static void test_passkey_at_2048(void **state)
{
    assert_int_equal(passkeys_found(*state, 2048, 3, 2000), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_passkey_at_full_context),
        cmocka_unit_test(test_passkey_at_2048),
    };
    return cmocka_run_group_tests(tests, open_shipped, close_shipped);
}
