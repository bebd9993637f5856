/*
 * The kvpred command-line tool: one file per subcommand, each exporting
 * `int cmd_NAME(int argc, char **argv)` (argv[0] is the subcommand name) that returns the process
 * exit status. main.c holds the table. Errors are printed here, never in the library: one line on
 * stderr starting with "kvpred: error: ".
 */
#ifndef KVP_CLI_CLI_H
#define KVP_CLI_CLI_H

#include <stdbool.h>

#include "kvpred.h"

int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_train_lm(int argc, char **argv);
int cmd_eval(int argc, char **argv);
/* `kvpred eval --task T`: RULER-style retrieval accuracy (cmd_eval_tasks.c). */
int cmd_eval_tasks(int argc, char **argv);
/* The evaluation tasks (cmd_eval_tasks.c), shared with `kvpred prompt`: the index of a task name
 * (passkey, niah_single, ...), or -1; the filler corpus for task ti (*path NULL: the essays under
 * ../shared, or for passkey without them its own noise line; *path then names what was used;
 * prints the error and returns NULL); and sample i of the grid cell (length, depth %) for a seed,
 * the very prompt `kvpred eval --task` decodes. */
int cmd_prompt(int argc, char **argv);
int cmd_viz(int argc, char **argv);
int cmd_profile_heads(int argc, char **argv);
int cmd_viz_heads(int argc, char **argv);
/* Draw a CateKV head profile as a PNG (for `kvpred viz --head-profile`); prints errors, returns
 * the exit status. */
int cmd_trace(int argc, char **argv);
int cmd_train_predictor(int argc, char **argv);

/* Print "kvpred: error: <msg>" on stderr; returns 1 (the exit status for errors). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print an error from the library. */
int cli_fail_err(const struct kvp_err *err);
/* Print "kvpred: warning: <msg>" on stderr. */
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Strict number parsing for flags: the whole string must be a number in range. */
bool cli_parse_int(const char *s, long min, long max, long *out);
bool cli_parse_float(const char *s, double min, double max, double *out);

#endif
