/*
 * `kvpred convert`: turn a llama2.c checkpoint and its tokenizer.bin into one GGUF file
 * (kvp_convert_llama2c in src/model/convert.c does the work; this file only parses flags).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "model/convert.h"

static void convert_usage(FILE *f)
{
    fprintf(f, "usage: kvpred convert IN.bin --tokenizer TOK.bin -o OUT.gguf\n\n"
               "Convert a llama2.c checkpoint (legacy or version 1, f32) and its tokenizer.bin\n"
               "into a GGUF v3 file of architecture \"llama\" with F32 tensors.\n\n"
               "  --tokenizer, -t TOK.bin   the checkpoint's llama2.c tokenizer (required)\n"
               "  -o, --output OUT.gguf     output path (required; written atomically)\n"
               "  -h, --help                show this help\n");
}

static void help(void)
{
    convert_usage(stdout);
}

int cmd_convert(int argc, char **argv)
{
    const char *in = NULL, *tok = NULL, *out = NULL;
    const struct cli_flag flags[] = {
        CLI_STR("-t|--tokenizer", &tok),
        CLI_STR("-o|--output", &out),
        {0},
    };
    const struct cli_command cmd = {
        .name = "convert", .flags = flags, .help = help, .positional = &in};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (!in || !tok || !out) {
        return cli_fail("convert: %s is required",
                        !in ? "an input checkpoint" : !tok ? "--tokenizer" : "-o");
    }
    struct kvp_err err = {0};
    if (kvp_convert_llama2c(in, tok, out, &err) < 0)
        return cli_fail_err(&err);
    printf("wrote %s\n", out);
    return 0;
}
