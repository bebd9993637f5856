/*
 * The kvpred command-line tool: one file per subcommand, each exporting
 * `int cmd_NAME(int argc, char **argv)` (argv[0] is the subcommand name) that returns the process
 * exit status. main.c holds the table and only dispatches; what the commands share (errors,
 * number parsing, flags, opening models) is in common.h. Errors are printed by the CLI, never by
 * the library: one line on stderr starting with "kvpred: error: ".
 */
#ifndef KVP_CLI_CLI_H
#define KVP_CLI_CLI_H

int cmd_run(int argc, char **argv);
/* `kvpred serve` (cmd_serve.c, on src/server/). */
int cmd_serve(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_batched_bench(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_train_lm(int argc, char **argv);
int cmd_eval(int argc, char **argv);
/* `kvpred eval --task T`: RULER-style retrieval accuracy (cmd_eval_tasks.c). */
int cmd_eval_tasks(int argc, char **argv);
/* `kvpred eval --task T --questions N`: several questions on one document (cmd_eval_multi.c). */
int cmd_eval_multi(int argc, char **argv);
int cmd_prompt(int argc, char **argv);
int cmd_viz(int argc, char **argv);
int cmd_profile_heads(int argc, char **argv);
int cmd_viz_heads(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_train_predictor(int argc, char **argv);
int cmd_train_prefill_gate(int argc, char **argv);
/* `kvpred --version` (cmd_version.c). */
int cmd_version(int argc, char **argv);

#endif
