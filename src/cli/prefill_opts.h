/* Prefill attention's flags, shared by the commands that prefill prompts (prefill_opts.c):
 * --prefill-policy and its options, their checks and help text, putting them on a context, the
 * JSON fields that say what a prefill did, and a progress line on a terminal. */
#ifndef KVP_CLI_PREFILL_OPTS_H
#define KVP_CLI_PREFILL_OPTS_H

#include <stdbool.h>
#include <stdio.h>

#include "cli/common.h"
#include "kvpred_lab.h"

struct cli_prefill_opts {
    int policy;          /* index in cli_prefill_names (0: dense) */
    const char *budget;  /* --prefill-budget as given */
    double threshold;    /* --prefill-threshold (0: off) */
    long min_keys;       /* --prefill-min-keys (0: the library's default) */
    long tail;           /* --prefill-tail (-1: unset) */
    long window, sink;   /* --prefill-window, --prefill-sink (-1: unset) */
    const char *gate_path; /* --prefill-predictor: the learned policy's gate (.kvpg) */
    struct kvp_prefill_params p; /* resolved by cli_prefill_check */
};

#define CLI_PREFILL_OPTS_INIT {.tail = -1, .window = -1, .sink = -1}

/* "dense", the estimates, then "sparse" (the recommended one) */
extern const char *const cli_prefill_names[];

#define CLI_PREFILL_FLAGS(o)                                                                       \
    CLI_CHOICE("--prefill-policy", cli_prefill_names, 0, &(o)->policy,                            \
               "dense, sparse, pooled, bound, strided or learned"),                                \
        CLI_STR("--prefill-budget", &(o)->budget),                                                 \
        CLI_FLOAT("--prefill-threshold", 0, 1, &(o)->threshold, "a mass in [0, 1]"),               \
        CLI_INT("--prefill-min-keys", 1, 1 << 24, &(o)->min_keys, "a positive token count"),       \
        CLI_INT("--prefill-tail", 0, 1 << 24, &(o)->tail, "a token count"),                        \
        CLI_INT("--prefill-window", 0, 1 << 24, &(o)->window, "a token count"),                    \
        CLI_INT("--prefill-sink", 0, 1 << 24, &(o)->sink, "a token count"),                        \
        CLI_STR("--prefill-predictor", &(o)->gate_path)

/* Help lines for those flags. */
extern const char *cli_prefill_flags_help;

/* The flags' combinations into o->p (loading the learned policy's gate, kept until the process
 * exits): 0, or 1 after printing the error. */
int cli_prefill_check(struct cli_prefill_opts *o);

/* Put o on a context (every command calls it, dense included, so the counters run), and the
 * progress line when stderr is a terminal. 0, or 1 after printing the error. */
int cli_prefill_apply(const struct cli_prefill_opts *o, kvp_ctx *ctx);

/* What a context's prompts did since the counters' reset (kvp_ctx_prefill_stats), kept past the
 * context: the totals and the density of each layer. */
struct cli_prefill_report {
    struct kvp_prefill_stats st;
    double density[256]; /* per layer, -1: no prompt (layers past 256 are left out) */
    int n_layer;
};
void cli_prefill_take(const kvp_ctx *ctx, int n_layer, struct cli_prefill_report *r);

/* Its JSON fields into object j: "prefill_policy", "prefill_budget" (as given, null: the
 * default), "prefill_density" (keys read / keys seen, all layers; null: no prompt),
 * "prefill_density_layers", "prefill_estimate_s" and "prefill_attention_s" (thread-seconds). */
struct cJSON;
void cli_prefill_json(struct cJSON *j, const struct cli_prefill_opts *o,
                      const struct cli_prefill_report *r);

#endif
