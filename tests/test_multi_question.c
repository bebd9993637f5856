/*
 * Several questions on one document (src/eval/multi_question.h, `kvpred eval --questions`): the
 * generator puts N distinct needles and N matching questions in one document; on the shipped
 * model, keeping the document's cache between questions gives exactly what N separate prompts
 * of document + question give for the policies that keep the whole cache, and what a question
 * gets from a kept cache does not depend on the questions asked before it for the policies that
 * evict only at the end of the prompt; the CLI prints a row per question.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/multi_question.h"
#include "eval/task_eval.h"
#include "kvpred.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"
#include "testutil.h"

static kvp_model *open_shipped(void)
{
    char path[4096];
    const char *src = getenv("KVP_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/models/kvpred-default.gguf", src ? src : ".");
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    /* the model is part of the repository: missing is a failure, not a skip */
    if (kvp_model_open(path, NULL, &m, &err) < 0)
        fail_msg("%s: %s", path, err.msg);
    return m;
}

/* A small prose corpus of our own, so the niah documents need nothing from ../shared. */
static struct kvp_corpus *prose_corpus(void)
{
    static const char text[] =
        "The harbour was quiet before the boats came back. Gulls circled above the market "
        "while traders counted their coins. A young painter sketched the lighthouse every "
        "morning. Her brother repaired nets beside the old warehouse. Nobody remembered when "
        "the clock tower had last rung on time. Travellers arrived with stories of distant "
        "mountains and frozen rivers. The baker opened his shop long before sunrise. Children "
        "raced along the pier chasing paper kites. In winter the fog rolled over the hills and "
        "stayed for days. The librarian kept a ledger of every borrowed atlas. Fishermen argued "
        "about the weather and the price of salt. A cartographer visited once and drew the "
        "coastline with great care.\n";
    struct kvp_corpus *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_corpus_init(&c, text, sizeof(text) - 1, NULL, 0.0, &err), 0);
    return c;
}

static size_t count_of(const char *hay, const char *needle)
{
    size_t n = 0, len = strlen(needle);
    for (const char *p = strstr(hay, needle); p; p = strstr(p + len, needle))
        n++;
    return n;
}

/* Every document of every task and N: N distinct keys and values, each question names a key that
 * exactly one needle holds, with its value; the asked needles' depths one per N-th of the
 * haystack; the document and its longest question within the length; the same seed, the same
 * document. */
static void test_generator(void **state)
{
    (void)state;
    kvp_model *m = open_shipped();
    struct kvp_corpus *prose = prose_corpus(), *noise = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_corpus_passkey_only(&noise, &err), 0);
    static const int tasks[] = {KVP_TASK_PASSKEY, KVP_TASK_NIAH_SINGLE_2,
                                KVP_TASK_NIAH_MULTIKEY_1};
    for (int t = 0; t < 3; t++)
        for (int nq = 1; nq <= KVP_TASK_MAX_QUESTIONS; nq++)
            for (uint64_t s = 0; s < 3; s++) {
                const struct kvp_corpus *c = tasks[t] == KVP_TASK_PASSKEY ? noise : prose;
                struct kvp_task_req req = {
                    .task = tasks[t], .seed = kvp_task_eval_seed(kvp_task_seed(77, s)),
                    .target_tokens = 1536, .depth = -1.0f,
                    .count = kvp_task_eval_count_tokens, .ud = m};
                struct kvp_task_multi a, b;
                assert_int_equal(kvp_task_render_multi(c, &req, nq, &a, &err), 0);
                assert_int_equal(kvp_task_render_multi(c, &req, nq, &b, &err), 0);
                assert_string_equal(a.document, b.document);
                assert_int_equal(a.n_questions, nq);
                int distract = tasks[t] == KVP_TASK_NIAH_MULTIKEY_1 ? 3 : 0;
                assert_int_equal(a.n_needles, nq + distract);
                const char *intro = tasks[t] == KVP_TASK_PASSKEY
                                        ? "The pass key of the "
                                        : "One of the special magic numbers for ";
                assert_int_equal(count_of(a.document, intro), (size_t)(nq + distract));
                int below[KVP_TASK_MAX_QUESTIONS] = {0};
                for (int q = 0; q < nq; q++) {
                    assert_string_equal(a.question[q], b.question[q]);
                    assert_true(a.question[q][0] == '\n');
                    assert_non_null(strstr(a.question[q], a.key[q]));
                    /* the needle that answers: the key's one needle, with the value */
                    char needle[160];
                    if (tasks[t] == KVP_TASK_PASSKEY)
                        snprintf(needle, sizeof(needle), "The pass key of the %s box is %s.",
                                 a.key[q], a.ref[q]);
                    else
                        snprintf(needle, sizeof(needle),
                                 "One of the special magic numbers for %s is: %s.", a.key[q],
                                 a.ref[q]);
                    assert_int_equal(count_of(a.document, needle), 1);
                    char key_use[80];
                    snprintf(key_use, sizeof(key_use), tasks[t] == KVP_TASK_PASSKEY
                             ? "of the %s box is" : "numbers for %s is", a.key[q]);
                    assert_int_equal(count_of(a.document, key_use), 1);
                    assert_non_null(strstr(a.answer[q], a.ref[q]));
                    for (int p = 0; p < q; p++) {
                        assert_string_not_equal(a.key[p], a.key[q]);
                        /* no value inside another: each answer scores for one question only */
                        assert_null(strstr(a.ref[p], a.ref[q]));
                        assert_null(strstr(a.ref[q], a.ref[p]));
                    }
                    assert_true(a.depth[q] >= 0.0f && a.depth[q] <= 1.0f);
                    int slice = (int)(a.depth[q] * (float)nq);
                    below[slice < nq ? slice : nq - 1]++;
                    /* the prompt a server sees: within the length */
                    size_t dl = strlen(a.document), ql = strlen(a.question[q]), n = 0;
                    char *whole = malloc(dl + ql + 1);
                    assert_non_null(whole);
                    memcpy(whole, a.document, dl);
                    memcpy(whole + dl, a.question[q], ql + 1);
                    assert_int_equal(kvp_task_eval_count_tokens(m, whole, dl + ql, &n), 0);
                    assert_true(n <= 1536 && n > 1536 - 120);
                    free(whole);
                }
                for (int k = 0; k < nq; k++)
                    assert_int_equal(below[k], 1); /* one asked needle per slice */
                kvp_task_multi_free(&a);
                kvp_task_multi_free(&b);
            }
    /* one clear error per bad request */
    struct kvp_task_req req = {.task = KVP_TASK_PASSKEY, .seed = kvp_task_eval_seed(1),
                               .target_tokens = 1024, .count = kvp_task_eval_count_tokens,
                               .ud = m};
    struct kvp_task_multi x;
    assert_int_equal(kvp_task_render_multi(noise, &req, 0, &x, &err), KVP_EINVAL);
    assert_int_equal(kvp_task_render_multi(noise, &req, KVP_TASK_MAX_QUESTIONS + 1, &x, &err),
                     KVP_EINVAL);
    req.target_tokens = 40;
    assert_int_equal(kvp_task_render_multi(noise, &req, 2, &x, &err), KVP_ERANGE);
    req.target_tokens = 1024;
    req.task = KVP_TASK_VT;
    assert_int_equal(kvp_task_render_multi(noise, &req, 2, &x, &err), KVP_EINVAL);
    req.task = KVP_TASK_PASSKEY;
    req.seed = kvp_task_seed(1, 2); /* a training seed */
    assert_int_equal(kvp_task_render_multi(noise, &req, 2, &x, &err), KVP_EINVAL);
    kvp_corpus_free(noise);
    kvp_corpus_free(prose);
    kvp_model_close(m);
}

/* The next-token logits after a prompt of its own: document + question q, from an empty cache
 * with the policy set anew (the test's own path, not the runner's), in one call or, as a server
 * holding the document evaluates it, the document and then the question. */
static void single_prompt_logits(kvp_ctx *ctx, const struct kvp_policy_params *pp,
                                 const struct kvp_mq_doc *d, int q, bool split, float *out)
{
    struct kvp_err err = {0};
    int32_t *ids = malloc(((size_t)d->n_doc + (size_t)d->n_q[q]) * sizeof(int32_t));
    assert_non_null(ids);
    memcpy(ids, d->doc, (size_t)d->n_doc * sizeof(int32_t));
    memcpy(ids + d->n_doc, d->q[q], (size_t)d->n_q[q] * sizeof(int32_t));
    assert_int_equal(kvp_ctx_set_policy(ctx, pp, &err), 0);
    if (split) {
        assert_int_equal(kvp_eval(ctx, ids, d->n_doc, NULL, false, &err), 0);
        assert_int_equal(kvp_eval(ctx, ids + d->n_doc, d->n_q[q], out, false, &err), 0);
    } else {
        assert_int_equal(kvp_eval(ctx, ids, d->n_doc + d->n_q[q], out, false, &err), 0);
    }
    free(ids);
}

struct docs {
    kvp_model *m;
    struct kvp_corpus *c[2];
    int ti[2];
};

/* The documents the equality tests ask about: pass keys (noise) and niah_single (our prose). */
static void open_docs(struct docs *ds)
{
    struct kvp_err err = {0};
    ds->m = open_shipped();
    ds->ti[0] = kvp_task_eval_index("passkey");
    ds->ti[1] = kvp_task_eval_index("niah_single");
    assert_int_equal(kvp_corpus_passkey_only(&ds->c[0], &err), 0);
    ds->c[1] = prose_corpus();
}

static void close_docs(struct docs *ds)
{
    kvp_corpus_free(ds->c[0]);
    kvp_corpus_free(ds->c[1]);
    kvp_model_close(ds->m);
}

#define DOC_LEN 1024
#define N_Q 4

/* full and quest keep the whole cache, and `kvpred serve` reuses the document for them. The
 * keep mode (one prefill, the cache truncated back to the document before each question) must
 * give, bit for bit, the logits of a fresh cache that evaluates the document and then question q
 * (the same calls on the same cache contents: anything left of an earlier question or answer, or
 * a document token lost, changes them), and the recompute mode those of document + question in
 * one call. The two modes split the prefill differently, which moves the logits by float
 * rounding only, so their answers are the same: N separate prompts of the document answer as
 * the kept cache does. */
static void test_keep_equals_separate_prompts(void **state)
{
    (void)state;
    struct docs ds;
    open_docs(&ds);
    struct kvp_model_info info;
    kvp_model_get_info(ds.m, &info);
    size_t nv = (size_t)info.n_vocab;
    float *keep = malloc(N_Q * nv * sizeof(float)), *rec = malloc(N_Q * nv * sizeof(float));
    float *one = malloc(nv * sizeof(float));
    assert_true(keep && rec && one);
    const struct kvp_policy_params pols[] = {
        {.name = "full", .gqa_agg = KVP_AGG_MEAN},
        {.name = "quest", .budget_ratio = 0.25f, .gqa_agg = KVP_AGG_MEAN},
    };
    struct kvp_err err = {0};
    kvp_ctx *ctx = NULL;
    struct kvp_ctx_params cp = {.n_ctx = DOC_LEN + 160, .n_threads = 2};
    assert_int_equal(kvp_ctx_init(ds.m, &cp, &ctx, &err), 0);
    int right = 0, asked = 0;
    for (int t = 0; t < 2; t++)
        for (long i = 0; i < 2; i++) {
            struct kvp_mq_doc d;
            assert_int_equal(kvp_mq_doc_make(ds.c[t], ds.m, ds.ti[t], 42, i, DOC_LEN, N_Q, &d,
                                             &err), 0);
            int max_new = kvp_task_eval_kind(ds.ti[t])->max_new;
            for (int p = 0; p < 2; p++) {
                struct kvp_mq_result rk[N_Q], rr[N_Q];
                assert_int_equal(kvp_mq_answer_doc(ctx, ds.m, &pols[p], &d, KVP_MQ_KEEP,
                                                   max_new, rk, keep, &err), 0);
                assert_true(kvp_mq_server_keeps(ctx));
                assert_int_equal(kvp_mq_answer_doc(ctx, ds.m, &pols[p], &d, KVP_MQ_RECOMPUTE,
                                                   max_new, rr, rec, &err), 0);
                for (int q = 0; q < N_Q; q++) {
                    single_prompt_logits(ctx, &pols[p], &d, q, true, one);
                    assert_memory_equal(keep + q * nv, one, nv * sizeof(float));
                    single_prompt_logits(ctx, &pols[p], &d, q, false, one);
                    assert_memory_equal(rec + q * nv, one, nv * sizeof(float));
                    assert_string_equal(rk[q].pred, rr[q].pred);
                    assert_int_equal(rk[q].prefill_tokens, d.n_q[q]);
                    assert_int_equal(rr[q].prefill_tokens, d.n_doc + d.n_q[q]);
                    if (p == 0) {
                        right += rk[q].score >= 1.0;
                        asked++;
                    }
                }
            }
            kvp_mq_doc_free(&d);
        }
    /* what the model truly does with the full cache, for the record (not asserted: accuracy is
     * the evaluation's to measure, the equalities above are what must hold) */
    print_message("full cache, %d-token documents: %d of %d questions answered\n", DOC_LEN,
                  right, asked);
    kvp_ctx_free(ctx);
    free(one);
    free(rec);
    free(keep);
    close_docs(&ds);
}

/* snapkv and pyramidkv evict at the end of the prompt only (decode tokens are appended, never
 * evicted), so with the cache kept, a question's logits and answer must not depend on which
 * questions came before: asked in order and in reverse, every question gets the same logits,
 * bit for bit. This is what a truncation that leaves a previous question (or its answer) in the
 * cache breaks. They are policies `kvpred serve` recomputes the document for. */
static void test_kept_cache_order_free(void **state)
{
    (void)state;
    struct docs ds;
    open_docs(&ds);
    struct kvp_model_info info;
    kvp_model_get_info(ds.m, &info);
    size_t nv = (size_t)info.n_vocab;
    float *fwd = malloc(N_Q * nv * sizeof(float)), *rev = malloc(N_Q * nv * sizeof(float));
    assert_true(fwd && rev);
    const struct kvp_policy_params pols[] = {
        {.name = "snapkv", .budget_ratio = 0.25f, .gqa_agg = KVP_AGG_MEAN},
        {.name = "pyramidkv", .budget_ratio = 0.25f, .gqa_agg = KVP_AGG_MEAN},
    };
    struct kvp_err err = {0};
    kvp_ctx *ctx = NULL;
    struct kvp_ctx_params cp = {.n_ctx = DOC_LEN + 160, .n_threads = 2};
    assert_int_equal(kvp_ctx_init(ds.m, &cp, &ctx, &err), 0);
    for (int t = 0; t < 2; t++) {
        struct kvp_mq_doc d;
        assert_int_equal(kvp_mq_doc_make(ds.c[t], ds.m, ds.ti[t], 42, 0, DOC_LEN, N_Q, &d, &err),
                         0);
        /* the same document with its questions in reverse order (borrowed pointers) */
        struct kvp_mq_doc r = d;
        for (int q = 0; q < N_Q; q++) {
            r.q[q] = d.q[N_Q - 1 - q];
            r.n_q[q] = d.n_q[N_Q - 1 - q];
            memcpy(r.text.ref[q], d.text.ref[N_Q - 1 - q], sizeof(r.text.ref[q]));
        }
        int max_new = kvp_task_eval_kind(ds.ti[t])->max_new;
        for (int p = 0; p < 2; p++) {
            struct kvp_mq_result a[N_Q], b[N_Q];
            assert_int_equal(kvp_mq_answer_doc(ctx, ds.m, &pols[p], &d, KVP_MQ_KEEP, max_new,
                                               a, fwd, &err), 0);
            assert_false(kvp_mq_server_keeps(ctx));
            assert_int_equal(kvp_mq_answer_doc(ctx, ds.m, &pols[p], &r, KVP_MQ_KEEP, max_new,
                                               b, rev, &err), 0);
            for (int q = 0; q < N_Q; q++) {
                assert_memory_equal(fwd + (size_t)q * nv, rev + (size_t)(N_Q - 1 - q) * nv,
                                    nv * sizeof(float));
                assert_string_equal(a[q].pred, b[N_Q - 1 - q].pred);
            }
        }
        kvp_mq_doc_free(&d);
    }
    kvp_ctx_free(ctx);
    free(rev);
    free(fwd);
    close_docs(&ds);
}

/* The CLI: a row per question index in the table and in the JSON, with the mode, the server's
 * mode and every answer; bad flags fail with one line. */
static void test_cli(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    const char *src = getenv("KVP_SOURCE_DIR");
    char cmd[8192], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "%s eval -m %s/models/kvpred-default.gguf --task passkey --questions 3 "
             "--lengths 512 --samples 2 --policy full,streaming --budget 64 "
             "--follow-up recompute --json 2>/dev/null",
             cli, src ? src : ".");
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    int lines = 0;
    for (const char *p = out; (p = strstr(p, "{\"task\":\"passkey\"")); p++) {
        lines++;
        assert_non_null(strstr(p, "\"follow_up\":\"recompute\""));
        assert_non_null(strstr(p, "\"answers\":["));
    }
    assert_int_equal(lines, 6); /* 2 runs x 3 questions */
    assert_non_null(strstr(out, "\"policy\":\"streaming\""));
    assert_non_null(strstr(out, "\"server_follow_up\":\"recompute\""));
    assert_non_null(strstr(out, "\"question\":3"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s eval --task passkey --questions 9", cli);
    kvp_test_expect_error(cmd, "--questions");
    snprintf(cmd, sizeof(cmd), "%s eval --task vt --questions 2", cli);
    kvp_test_expect_error(cmd, "--task");
    snprintf(cmd, sizeof(cmd), "%s eval --task passkey --questions 2 --follow-up later", cli);
    kvp_test_expect_error(cmd, "--follow-up");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generator),
        cmocka_unit_test(test_keep_equals_separate_prompts),
        cmocka_unit_test(test_kept_cache_order_free),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
