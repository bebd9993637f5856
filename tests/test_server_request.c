/* The server's request parser (src/server/request.c) on its own: what it accepts and fills in,
 * and one refusal (status, parameter) per kind of bad field. The HTTP side is test_server.py. */
#include <string.h>

#include "kvpred.h"
#include "server/request.h"
#include "testutil.h"

static const struct srv_limits lim = {.max_body = 4096, .max_tokens = 100, .max_messages = 4};
static const struct srv_defaults def = {.temperature = 0, .top_p = 0.95, .top_k = 40, .seed = 42};

static int parse(const char *body, int kind, struct srv_request *r, struct srv_error *e)
{
    return srv_request_parse(body, strlen(body), kind, &lim, &def, r, e);
}

static void test_completion_fields(void **state)
{
    (void)state;
    struct srv_request r;
    struct srv_error e;
    assert_int_equal(parse("{\"prompt\": [\"Once\"], \"max_tokens\": 7, \"temperature\": 0.5, "
                           "\"top_p\": 0.9, \"top_k\": 3, \"seed\": 9, \"stop\": [\"a\", \"bc\"], "
                           "\"stream\": true, \"stream_options\": {\"include_usage\": true}, "
                           "\"n\": 1, \"logprobs\": null, \"user\": \"x\", "
                           "\"kvpred\": {\"policy\": \"quest\", \"budget\": \"1/16\"}}",
                           SRV_COMPLETION, &r, &e),
                     0);
    assert_string_equal(r.prompt, "Once");
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.temperature == 0.5 && r.top_p == 0.9 && r.top_k == 3 && r.seed == 9);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "bc");
    assert_true(r.stream && r.include_usage && r.has_budget);
    assert_string_equal(r.policy, "quest");
    assert_true(r.budget == 0 && r.budget_ratio == 1.0f / 16);
    srv_request_free(&r);
    /* defaults when absent */
    assert_int_equal(parse("{\"prompt\": \"x\"}", SRV_COMPLETION, &r, &e), 0);
    assert_true(r.max_tokens == -1 && r.temperature == 0 && r.top_k == 40 && r.seed == 42 &&
                !r.stream && !r.policy && !r.has_budget);
    srv_request_free(&r);
    /* budgets as numbers: a count above 1, a ratio at most 1 */
    assert_int_equal(parse("{\"prompt\": \"x\", \"kvpred\": {\"budget\": 256}}", SRV_COMPLETION,
                           &r, &e), 0);
    assert_int_equal(r.budget, 256);
    srv_request_free(&r);
    assert_int_equal(parse("{\"prompt\": \"x\", \"kvpred\": {\"budget\": 0.25}}", SRV_COMPLETION,
                           &r, &e), 0);
    assert_true(r.budget == 0 && r.budget_ratio == 0.25f);
    srv_request_free(&r);
    /* prefill attention: a policy by name ("sparse": the recommended one) and its budget */
    assert_int_equal(parse("{\"prompt\": \"x\", \"kvpred\": {\"prefill_policy\": \"sparse\", "
                           "\"prefill_budget\": \"1/16\"}}", SRV_COMPLETION, &r, &e), 0);
    assert_true(r.prefill_policy == KVP_PREFILL_SPARSE && r.has_prefill_budget &&
                r.prefill_budget == 0 && r.prefill_budget_ratio == 1.0f / 16);
    srv_request_free(&r);
    assert_int_equal(parse("{\"prompt\": \"x\", \"kvpred\": {\"prefill_budget\": 2048}}",
                           SRV_COMPLETION, &r, &e), 0);
    assert_true(r.prefill_policy == -1 && r.prefill_budget == 2048);
    srv_request_free(&r);
}

static void test_chat_messages(void **state)
{
    (void)state;
    struct srv_request r;
    struct srv_error e;
    assert_int_equal(parse("{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, "
                           "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                           "\"Hi \"}, {\"type\": \"text\", \"text\": \"there\"}]}], "
                           "\"max_completion_tokens\": 5}",
                           SRV_CHAT, &r, &e),
                     0);
    assert_int_equal(r.n_msgs, 2);
    assert_string_equal(r.msgs[0].role, "system"); /* developer is system's newer name */
    assert_string_equal(r.msgs[1].content, "Hi there");
    assert_int_equal(r.max_tokens, 5);
    srv_request_free(&r);
}

/* Each bad body: refused with this status and parameter. */
static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        int kind;
        const char *body;
        int status;
        const char *param;
    } bad[] = {
        {SRV_COMPLETION, "", 400, ""},
        {SRV_COMPLETION, "{\"prompt\": ", 400, ""},
        {SRV_COMPLETION, "{\"prompt\": \"a\"} {}", 400, ""},
        {SRV_COMPLETION, "[]", 400, ""},
        {SRV_COMPLETION, "{}", 400, "prompt"},
        {SRV_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", 400, "prompt"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"model\": 3}", 400, "model"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 101}", 400, "max_tokens"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": -1}", 400, "max_tokens"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"temperature\": \"hot\"}", 400, "temperature"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"top_p\": 1.5}", 400, "top_p"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"top_k\": 2.5}", 400, "top_k"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"seed\": -3}", 400, "seed"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"n\": 2}", 400, "n"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"stop\": [\"\"]}", 400, "stop"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\"]}", 400,
         "stop"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"stream\": 1}", 400, "stream"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": []}", 400, "kvpred"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": {\"polcy\": \"quest\"}}", 400,
         "kvpred"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": {\"budget\": \"0\"}}", 400,
         "kvpred.budget"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": {\"budget\": \"2/1\"}}", 400,
         "kvpred.budget"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": {\"budget\": -1}}", 400,
         "kvpred.budget"},
        /* ratios that are 0 once stored as a float (a fuzzer's find) */
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": {\"budget\": \"1e-68\"}}", 400,
         "kvpred.budget"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": {\"budget\": 1e-68}}", 400,
         "kvpred.budget"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": {\"prefill_policy\": \"sparsest\"}}",
         400, "kvpred.prefill_policy"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": {\"prefill_policy\": \"dense\", "
                         "\"prefill_budget\": 0.5}}", 400, "kvpred.prefill_budget"},
        {SRV_COMPLETION, "{\"prompt\": \"a\", \"kvpred\": {\"prefill_budget\": 0}}", 400,
         "kvpred.prefill_budget"},
        {SRV_CHAT, "{\"messages\": []}", 400, "messages"},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", 400, "messages"},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", 400, "messages"},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         400, "messages"},
        {SRV_CHAT, "{\"messages\": [{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                   "\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                   "\"content\":\"a\"},{\"role\":\"user\",\"content\":\"a\"}]}",
         400, "messages"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct srv_request r;
        struct srv_error e;
        int rc = parse(bad[i].body, bad[i].kind, &r, &e);
        if (rc == 0 || e.status != bad[i].status || strcmp(e.param, bad[i].param) || !e.msg[0])
            fail_msg("body %zu (%s): rc %d status %d param '%s' msg '%s'", i, bad[i].body, rc,
                     e.status, e.param, e.msg);
        srv_request_free(&r);
    }
    /* larger than the limit: 413 before parsing */
    struct srv_request r;
    struct srv_error e;
    char big[5000];
    memset(big, ' ', sizeof(big));
    assert_int_equal(srv_request_parse(big, sizeof(big), SRV_COMPLETION, &lim, &def, &r, &e), -1);
    assert_int_equal(e.status, 413);
    srv_request_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_fields),
        cmocka_unit_test(test_chat_messages),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
