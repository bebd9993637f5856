/*
 * `kvpred prompt`: print one evaluation prompt, exactly the one `kvpred eval --task` decodes for
 * the same task, seed, length, depth and sample index, so a failure in a table can be looked at
 * (or fed to another engine), and scripts need no prompt generator of their own (the demo's pass
 * key comes from here). --answer prints the reference strings instead, one per line.
 * --questions N prints document I of `eval --task T --questions N` as one JSON object instead:
 * {"document": text, "questions": [...], "references": [...], "depths": [...]}, questions in
 * the order they are asked.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "eval/multi_question.h"
#include "eval/task_eval.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"

static void help(void)
{
    printf("usage: kvpred prompt --task T [-m MODEL] [--length N] [--depth D] [--seed S]\n"
           "                     [--sample I] [--filler PATH] [--answer]\n\n"
           "Print the prompt `kvpred eval --task T --lengths N --depths D --seed S` decodes as\n"
           "sample I (the same text, sized in the model's tokens), or its answers.\n\n"
           "  --task T        passkey, niah_single, niah_multikey, niah_multivalue,\n"
           "                  niah_multiquery or vt\n"
           "  --length N      prompt length in tokens, BOS included (default: the model's\n"
           "                  context less room for the answer)\n"
           "  --depth D       needle depth in percent of the haystack (default 50)\n"
           "  --seed S        evaluation seed (default 42, as eval)\n"
           "  --sample I      sample index within the (length, depth) cell (default 0)\n"
           "  --filler PATH   filler text file or directory (default ../shared/data/pg_essays;\n"
           "                  passkey: its noise line, or this text when given)\n"
           "  --answer        print the reference answers, one per line, instead\n"
           "  --questions N   print document I of `eval --task T --questions N` (passkey,\n"
           "                  niah_single, niah_multikey) as one JSON object instead: its\n"
           "                  document, questions (in the order asked), references and depths\n"
           "%s",
           cli_model_flags_help);
}

/* Document `sample` of `eval --task --questions n` as one JSON object on stdout. */
static int print_multi(const struct kvp_corpus *c, const kvp_model *m, int ti, uint64_t seed,
                       long sample, long length, int n)
{
    struct kvp_mq_doc d;
    struct kvp_err err = {0};
    if (kvp_mq_doc_make(c, m, ti, seed, sample, length, n, &d, &err) < 0)
        return cli_fail("prompt: length %ld: %s", length, err.msg);
    cJSON *j = cJSON_CreateObject();
    cJSON *q = j ? cJSON_AddArrayToObject(j, "questions") : NULL;
    cJSON *r = j ? cJSON_AddArrayToObject(j, "references") : NULL;
    cJSON *dp = j ? cJSON_AddArrayToObject(j, "depths") : NULL;
    char *s = NULL;
    if (q && r && dp && cJSON_AddStringToObject(j, "document", d.text.document)) {
        for (int i = 0; i < d.n_questions; i++) {
            cJSON_AddItemToArray(q, cJSON_CreateString(d.text.question[i]));
            cJSON_AddItemToArray(r, cJSON_CreateString(d.text.ref[i]));
            cJSON_AddItemToArray(dp, cJSON_CreateNumber(d.text.depth[i]));
        }
        s = cJSON_PrintUnformatted(j);
    }
    if (s)
        printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
    kvp_mq_doc_free(&d);
    return s ? 0 : cli_fail("prompt: out of memory");
}

int cmd_prompt(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    const char *task = NULL, *filler = NULL;
    long length = 0, depth = 50, seed = 42, sample = 0, questions = 0;
    bool answer = false;
    const struct cli_flag flags[] = {
        CLI_STR("--task", &task),
        CLI_INT("--length", 16, 1 << 24, &length, "a token count (>= 16)"),
        CLI_INT("--depth", 0, 100, &depth, "a percentage in 0..100"),
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &seed, "a non-negative integer"),
        CLI_INT("--sample", 0, 1L << 40, &sample, "a sample index"),
        CLI_STR("--filler", &filler),
        CLI_BOOL("--answer", &answer),
        CLI_INT("--questions", 1, KVP_TASK_MAX_QUESTIONS, &questions, "a count in 1..8"),
        {0},
    };
    const struct cli_command cmd = {.name = "prompt", .mo = &mo, .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    int ti = kvp_task_eval_index(task);
    if (ti < 0)
        return cli_fail("prompt: --task '%s' is not one of passkey, niah_single, niah_multikey, "
                        "niah_multivalue, niah_multiquery, vt", task ? task : "");
    struct kvp_corpus *c = cli_open_filler(&filler, ti);
    if (!c)
        return 1;
    kvp_model *m = cli_open_model(&mo);
    if (!m) {
        kvp_corpus_free(c);
        return 1;
    }
    if (length == 0) {
        struct kvp_model_info info;
        kvp_model_get_info(m, &info);
        length = info.n_ctx_train > 160 ? info.n_ctx_train - 128 : info.n_ctx_train;
    }
    struct kvp_task_text tt;
    struct kvp_err err = {0};
    int status = 0;
    if (questions > 0)
        status = print_multi(c, m, ti, (uint64_t)seed, sample, length, (int)questions);
    else if (kvp_task_eval_prompt(c, m, ti, (uint64_t)seed, sample, length, depth, &tt, &err) < 0) {
        status = cli_fail("prompt: length %ld: %s", length, err.msg);
    } else {
        fputs(answer ? tt.refs : tt.prompt, stdout);
        kvp_task_text_free(&tt);
    }
    kvp_model_close(m);
    kvp_corpus_free(c);
    return status;
}
