/* CLI plumbing shared by the commands that run KV selection policies (eval, viz, run): policy
 * option flags, budget parsing and the forced token sequence a measurement decodes. */
#ifndef KVP_CLI_MEASURE_OPTS_H
#define KVP_CLI_MEASURE_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpred.h"

/* If argv[*i] is a policy option flag (--sink, --local, --window, --pool, --pool-max,
 * --dense-layers, --gqa-agg, --normalize, --aux, --policy-opts, the flags the policies' option
 * tables declare, and --seed when with_seed), store it in p,
 * consume it (and its value) and return 1; return 0 if it is not one; print an error and return
 * -1 for a bad value. Zero counts given on the command line mean zero (the library reads 0 as
 * "default", so they are stored as -1). */
int cli_policy_flag(struct kvp_policy_params *p, bool with_seed, int argc, char **argv, int *i);

/* Help text for the policy option flags (without --seed), the policies' own options included
 * (read from their option tables). */
const char *cli_policy_flags_help(void);

/* Parse one budget: "64" (tokens per layer and KV head), "1/16" or "0.0625" (ratio of the
 * context, in (0, 1]). Exactly one of *budget and *ratio is set non-zero. */
bool cli_parse_budget(const char *s, int *budget, float *ratio);


/* The policy x budget grid `eval` and `eval --task` run: every policy of --policy LIST at every
 * budget of --budget LIST, "full" once (its budget label "all"). */
#define CLI_GRID_MAX 64
struct cli_grid {
    const char *policies[CLI_GRID_MAX];
    int n_policies;
    const char *budgets[CLI_GRID_MAX];
    int n_budgets;
    char *lists; /* owned copy of both lists, which the items point into */
};
/* Parse the two lists into g: known policies, budgets cli_parse_budget reads. policies "all"
 * means every registered policy all_keep(ops, ud) accepts (all_keep NULL: "all" is not a
 * list). Prints the error and returns 1; 0. */
struct kvp_policy_ops;
int cli_grid_parse(struct cli_grid *g, const char *policies, const char *budgets,
                   bool (*all_keep)(const struct kvp_policy_ops *ops, const void *ud),
                   const void *ud);
void cli_grid_free(struct cli_grid *g);
/* How many budgets policy i runs at (1 for full), and the parameters and budget label of its run
 * k: base with the policy's name and the budget set. */
int cli_grid_budgets(const struct cli_grid *g, int i);
const char *cli_grid_cell(const struct cli_grid *g, int i, int k,
                          const struct kvp_policy_params *base, struct kvp_policy_params *pp);

/* Comma-separated list of the registered policy names (static storage). */
const char *cli_policy_names(void);

/* True when name is a registered policy. */
bool cli_policy_known(const char *name);

/* Name of an enum kvp_gqa_agg value. */
const char *cli_gqa_agg_name(int agg);

/* Where the forced tokens of a measurement come from. */
struct cli_token_source {
    const char *text_path; /* -f: a text file, tokenized with BOS from `offset` */
    long offset;           /* --offset BYTES */
    long seed;             /* --tokens-from-seed S (>= 0; -1: off), for models without a
                              tokenizer: uniform ids from a seeded splitmix64 */
};

/* n tokens for a measurement, malloc'd. Prints the error and returns NULL. */
int32_t *cli_measure_tokens(const kvp_model *m, const struct cli_token_source *src, int n);

/* The flag-table rows of a token source (-f, --offset, --tokens-from-seed). */
#define CLI_TOKEN_SOURCE_FLAGS(src)                                                                \
    CLI_STR("-f|--file", &(src)->text_path),                                                       \
        CLI_INT("--offset", 0, 0x7fffffffffffL, &(src)->offset, "a byte offset"),                  \
        CLI_INT("--tokens-from-seed", 0, 0x7fffffffffffffffL, &(src)->seed,                        \
                "a non-negative integer")
/* The command line of a command that measures policies on those tokens (eval, viz): the model
 * flags, the policy flags (--seed is the policy's) and the command's table, which holds the
 * CLI_TOKEN_SOURCE_FLAGS rows of src; then the check that exactly one of a text and a seed was
 * given. Returns 0, 1 after printing the error, or 2 after printing the help. */
struct cli_model_opts;
struct cli_flag;
int cli_parse_measure_command(const char *name, struct cli_model_opts *mo,
                              struct kvp_policy_params *pp, const struct cli_token_source *src,
                              const struct cli_flag *flags, void (*help)(void), int argc,
                              char **argv);

#endif
