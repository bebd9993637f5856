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

int cmd_convert(int argc, char **argv)
{
    const char *in = NULL, *tok = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            convert_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--tokenizer") || !strcmp(a, "-t") || !strcmp(a, "-o") ||
            !strcmp(a, "--output")) {
            if (i + 1 >= argc)
                return cli_fail("convert: %s needs a value", a);
            const char **dst = (a[1] == 'o' || !strcmp(a, "--output")) ? &out : &tok;
            *dst = argv[++i];
            continue;
        }
        if (a[0] == '-' && a[1])
            return cli_fail("convert: unknown option '%s' (try kvpred convert --help)", a);
        if (in)
            return cli_fail("convert: more than one input file ('%s' and '%s')", in, a);
        in = a;
    }
    if (!in || !tok || !out) {
        convert_usage(stderr);
        return cli_fail("convert: %s is required",
                        !in ? "an input checkpoint" : !tok ? "--tokenizer" : "-o");
    }
    struct kvp_err err = {0};
    if (kvp_convert_llama2c(in, tok, out, &err) < 0)
        return cli_fail_err(&err);
    printf("wrote %s\n", out);
    return 0;
}
