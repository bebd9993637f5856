/*
 * `kvpred quantize`: rewrite a GGUF model with its weight matrices in another tensor type
 * (kvp_quantize_file in src/model/quantize.c does the work; this file only parses flags).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "kernels/types.h"
#include "model/quantize.h"

static void quantize_usage(FILE *f)
{
    fprintf(f, "usage: kvpred quantize IN.gguf OUT.gguf --type TYPE [--keep-output] [-t N]\n\n"
               "Rewrite every 2-D weight matrix of a GGUF model (token_embd and output included)\n"
               "in TYPE; norms and other 1-D tensors are copied, and so is every metadata key\n"
               "(general.file_type is updated). A matrix whose rows are not a multiple of the\n"
               "type's block size falls back: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,\n"
               "Q2_K/Q3_K -> IQ4_NL, then F16.\n\n"
               "  --type TYPE       Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K Q4_K Q5_K Q6_K\n"
               "                    F16 BF16 F32 (required)\n"
               "  --keep-output     leave output.weight (token_embd.weight if tied) as it is\n"
               "  --threads, -t N   threads (default 1; the output does not depend on it)\n"
               "  -h, --help        show this help\n");
}

static void help(void)
{
    quantize_usage(stdout);
}

int cmd_quantize(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *type_name = NULL;
    struct kvp_quantize_params p = {.type = -1};
    const struct cli_flag flags[] = {
        CLI_INT("-t|--threads", 1, 256, &p.n_threads, "a thread count 1..256"),
        CLI_STR("--type", &type_name),
        CLI_BOOL("--keep-output", &p.keep_output),
        {0},
    };
    const struct cli_command cmd = {.name = "quantize",
                                    .flags = flags,
                                    .help = help,
                                    .positional = &in,
                                    .positional2 = &out};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (!in || !out || !type_name) {
        return cli_fail("quantize: %s is required", !in    ? "an input file"
                                                    : !out ? "an output file"
                                                           : "--type");
    }
    p.type = kvp_quantize_type_from_name(type_name);
    if (p.type < 0)
        return cli_fail("quantize: unknown type '%s' (try kvpred quantize --help)", type_name);
    struct kvp_err err = {0};
    struct kvp_quantize_stats st;
    if (kvp_quantize_file(in, out, &p, &st, &err) < 0)
        return cli_fail_err(&err);
    printf("wrote %s: %d tensors, %d in %s, %d fallback, %d kept; %.2f MiB -> %.2f MiB\n", out,
           st.n_tensors, st.n_converted, kvp_type_name(p.type), st.n_fallback, st.n_kept,
           (double)st.bytes_in / 1048576.0, (double)st.bytes_out / 1048576.0);
    return 0;
}
