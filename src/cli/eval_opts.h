/* What `eval --task` (cmd_eval_tasks.c) and `eval --task --questions` (cmd_eval_multi.c) share
 * (eval_opts.c): their common flags and defaults, parsing them with the command's own, and
 * opening the filler and the model the prompts are made for. */
#ifndef KVP_CLI_EVAL_OPTS_H
#define KVP_CLI_EVAL_OPTS_H

#include <stdbool.h>

#include "cli/common.h"
#include "cli/measure_opts.h"
#include "cli/prefill_opts.h"
#include "kvpred.h"

#define CLI_EVAL_MAX_LENGTHS 64

struct kvp_corpus;

/* The shared settings. The *_list fields are the flags as given. */
struct cli_eval_opts {
    struct cli_model_opts mo;
    struct kvp_policy_params pp; /* the base of every run: --policy-seed, the policy flags */
    const char *task;            /* --task */
    int ti;                      /* its evaluation task (kvp_task_eval_kind; -1: unknown) */
    const char *lengths_list;    /* --lengths; parsed into lengths (kept when not given) */
    long lengths[CLI_EVAL_MAX_LENGTHS];
    int n_len;
    long seed; /* prompt seed */
    const char *policy_list, *budget_list;
    struct cli_grid grid; /* --policy x --budget, parsed by cli_eval_grid */
    bool json;
    const char *filler;
    struct cli_prefill_opts pf;
    struct cli_prefill_report pf_report; /* what the prefills of the whole grid did */
};

#define CLI_EVAL_OPTS_INIT                                                                         \
    {                                                                                              \
        .pp = {.gqa_agg = KVP_AGG_MEAN}, .ti = -1, .seed = 42, .policy_list = "full",              \
        .budget_list = "1/8", .pf = CLI_PREFILL_OPTS_INIT                                          \
    }

/* The shared rows of a command's flag table (struct cli_flag). */
#define CLI_EVAL_FLAGS(e)                                                                          \
    CLI_STR("--task", &(e)->task), CLI_STR("--lengths", &(e)->lengths_list),                       \
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &(e)->seed, "a non-negative integer"),           \
        CLI_INT("--policy-seed", 0, 0x7fffffffffffffffL, &(e)->pp.seed, "a non-negative integer"), \
        CLI_STR("--policy", &(e)->policy_list), CLI_STR("--budget", &(e)->budget_list),            \
        CLI_STR("--filler", &(e)->filler), CLI_BOOL("--json", &(e)->json),                         \
        CLI_PREFILL_FLAGS(&(e)->pf)

/* Parse argv with flags (CLI_EVAL_FLAGS(e) and the command's own rows), then --lengths; ti is
 * --task's index, -1 for an unknown task, which the command refuses in its own words. Returns
 * 0, 1 after printing an error, or 2 after printing the help. */
int cli_eval_parse(struct cli_eval_opts *e, const struct cli_flag *flags, void (*help)(void),
                   int argc, char **argv);

/* The policy x budget grid of --policy and --budget. 0, or 1 after printing the error. */
int cli_eval_grid(struct cli_eval_opts *e);

/* What a run of the grid has open: the filler, the model and its info, the context. */
struct cli_eval_setup {
    struct kvp_corpus *c;
    kvp_model *m;
    struct kvp_model_info info;
    kvp_ctx *ctx;
};

/* The filler of the task (cli_open_filler) and the model. 0, or 1 after printing the error. */
int cli_eval_open(struct cli_eval_opts *e, struct cli_eval_setup *s);

/* The context of n_tokens with the prefill policy. 0, or 1 after printing the error. */
int cli_eval_open_ctx(const struct cli_eval_opts *e, struct cli_eval_setup *s, long n_tokens);

/* After the run of the grid (rc: its result): clear the progress line on a terminal (tty), print
 * the run's error if rc < 0, else take the prefill report. Returns 1 when rc < 0, else 0. */
int cli_eval_finish_run(struct cli_eval_opts *e, const struct cli_eval_setup *s, bool tty, int rc,
                        const struct kvp_err *err);

/* Free what s holds and e's grid. */
void cli_eval_close(struct cli_eval_opts *e, struct cli_eval_setup *s);

struct cJSON;

/* A JSON line of a run's cell, with the leading fields both commands write: task, generator,
 * model, filler, policy, budget (label), budget_ratio and budget_tokens. NULL out of memory. */
struct cJSON *cli_eval_json_cell(const struct cli_eval_opts *e, const char *model_name,
                                 const struct kvp_policy_params *pp, const char *label,
                                 double budget_tokens);

/* Print j on one line on stdout and free it. */
void cli_eval_json_print(struct cJSON *j);

#endif
