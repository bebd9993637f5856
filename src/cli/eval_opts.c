/* The flags and setup `eval --task` and `eval --task --questions` share (see eval_opts.h). */
#include "cli/eval_opts.h"

#include <stdio.h>

#include <cjson/cJSON.h>

#include "eval/task_eval.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"

int cli_eval_parse(struct cli_eval_opts *e, const struct cli_flag *flags, void (*help)(void),
                   int argc, char **argv)
{
    const struct cli_command cmd = {
        .name = "eval",
        .mo = &e->mo,
        .pp = &e->pp,
        .flags = flags,
        .help = help,
    };
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc;
    if (e->lengths_list && (e->n_len = cli_parse_int_list(e->lengths_list, 16, 1 << 24, e->lengths,
                                                          CLI_EVAL_MAX_LENGTHS)) < 0)
        return cli_fail("--lengths: '%s' is not a list of token counts (>= 16)", e->lengths_list);
    e->ti = kvp_task_eval_index(e->task);
    return 0;
}

int cli_eval_grid(struct cli_eval_opts *e)
{
    return cli_grid_parse(&e->grid, e->policy_list, e->budget_list, NULL, NULL);
}

int cli_eval_open(struct cli_eval_opts *e, struct cli_eval_setup *s)
{
    if (!(s->c = cli_open_filler(&e->filler, e->ti)) || !(s->m = cli_open_model(&e->mo)))
        return 1;
    kvp_model_get_info(s->m, &s->info);
    return 0;
}

int cli_eval_open_ctx(const struct cli_eval_opts *e, struct cli_eval_setup *s, long n_tokens)
{
    if (!(s->ctx = cli_open_ctx(s->m, &e->mo, n_tokens)) || cli_prefill_apply(&e->pf, s->ctx))
        return 1;
    return 0;
}

int cli_eval_finish_run(struct cli_eval_opts *e, const struct cli_eval_setup *s, bool tty, int rc,
                        const struct kvp_err *err)
{
    if (tty)
        fprintf(stderr, "\r\033[K");
    if (rc < 0) {
        cli_fail("eval: %s", err->msg);
        return 1;
    }
    cli_prefill_take(s->ctx, s->info.n_layer, &e->pf_report);
    return 0;
}

void cli_eval_close(struct cli_eval_opts *e, struct cli_eval_setup *s)
{
    kvp_ctx_free(s->ctx);
    kvp_model_close(s->m);
    kvp_corpus_free(s->c);
    cli_grid_free(&e->grid);
}

cJSON *cli_eval_json_cell(const struct cli_eval_opts *e, const char *model_name,
                          const struct kvp_policy_params *pp, const char *label,
                          double budget_tokens)
{
    const struct kvp_task_eval_kind *kind = kvp_task_eval_kind(e->ti);
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "task", kind->name);
    cJSON_AddStringToObject(j, "generator", kvp_task_name(kind->task));
    cJSON_AddStringToObject(j, "model", model_name);
    cJSON_AddStringToObject(j, "filler", e->filler);
    cJSON_AddStringToObject(j, "policy", pp->name);
    cJSON_AddStringToObject(j, "budget", label);
    cJSON_AddNumberToObject(j, "budget_ratio", pp->budget > 0 ? 0.0 : pp->budget_ratio);
    cJSON_AddNumberToObject(j, "budget_tokens", budget_tokens);
    return j;
}

void cli_eval_json_print(cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    if (s)
        printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}
