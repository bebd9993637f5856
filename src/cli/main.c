/* kvpred CLI entry point: only the dispatch to one file per subcommand (see cli.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

/* `eval` is three commands behind one name: KV measurement (cmd_eval.c), with --task retrieval
 * accuracy (cmd_eval_tasks.c), and with --questions too several questions on one document
 * (cmd_eval_multi.c). */
static int eval_dispatch(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--questions"))
            return cmd_eval_multi(argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--task"))
            return cmd_eval_tasks(argc, argv);
    return cmd_eval(argc, argv);
}

static const struct command commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server with a KV cache kept across requests"},
    {"info", cmd_info, "show a model's architecture, shapes, types and memory needs"},
    {"perplexity", cmd_perplexity, "perplexity of a text (llama.cpp's convention)"},
    {"logits", cmd_logits, "next-token logits at every position of a text, as JSON"},
    {"bench", cmd_bench, "prefill and decode speed"},
    {"batched-bench", cmd_batched_bench, "many sequences decoding together (llama-batched-bench)"},
    {"convert", cmd_convert, "convert a llama2.c checkpoint to GGUF"},
    {"quantize", cmd_quantize, "rewrite a GGUF model's weight matrices in another type"},
    {"synth", cmd_synth, "write a random-weight GGUF with a real model's shapes"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"train-lm", cmd_train_lm, "train a small Llama-architecture model from scratch"},
    {"eval", eval_dispatch, "measure KV selection policies against full attention"},
    {"viz", cmd_viz, "draw one head's attention and a policy's selection as a PNG"},
    {"profile-heads", cmd_profile_heads, "CateKV: classify KV heads over a reference set"},
    {"viz-heads", cmd_viz_heads, "CateKV: draw a head profile as a PNG"},
    {"prompt", cmd_prompt, "print an evaluation prompt (the one `eval --task` decodes)"},
    {"trace", cmd_trace, "record attention traces for training the predictor"},
    {"train-predictor", cmd_train_predictor, "train the AttentionPredictor CNN on a trace"},
    {"train-prefill-gate", cmd_train_prefill_gate,
     "train the learned estimate of block-sparse prefill (.kvpg)"},
};

static void usage(FILE *f)
{
    fprintf(f, "kvpred %s: long-context LLM inference with sparse KV-cache attention\n\n"
               "usage: kvpred COMMAND [options]   (kvpred COMMAND --help for its options)\n\n",
            KVP_VERSION);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].help);
}

/* The library's notices (kvp_set_log) go to stderr, one line each, as the CLI's own do. */
static void log_to_stderr(void *user, const char *line)
{
    (void)user;
    fprintf(stderr, "kvpred: %s\n", line);
}

int main(int argc, char **argv)
{
    kvp_set_log(log_to_stderr, NULL);
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version"))
        return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    return cli_fail("unknown command '%s' (try kvpred --help)", argv[1]);
}
