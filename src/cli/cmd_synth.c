/*
 * `kvpred synth`: write a random-weight GGUF with the tensor shapes of a named real model
 * (kvp_synth_write in src/model/synth.c does the work; this file only parses flags).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "kernels/types.h"
#include "model/quantize.h"
#include "model/synth.h"

static void synth_usage(FILE *f)
{
    fprintf(f, "usage: kvpred synth --shape NAME -o OUT.gguf [--type T] [--layers N] [--vocab N]\n"
               "                    [--seed S] [-t N]\n\n"
               "Write a GGUF model with random weights and the exact tensor shapes of a real\n"
               "model, for measuring speed at real sizes without a download. The text it\n"
               "generates is noise. The vocabulary is SMALL by default (%d tokens: byte\n"
               "fallback plus letters; kvpred and llama.cpp both load it), so the embedding and\n"
               "the classifier are smaller than the real model's; --vocab gives the real size.\n\n"
               "  --shape NAME      ",
            512);
    for (int i = 0; kvp_synth_shape_at(i); i++) {
        const struct kvp_synth_shape *s = kvp_synth_shape_at(i);
        fprintf(f, "%s%s (%d layers, dim %d, %d/%d heads, ffn %d, vocab %d%s)\n",
                i ? "                    " : "",
                s->name, s->n_layer, s->n_embd, s->n_head, s->n_head_kv, s->n_ff, s->n_vocab,
                s->tied ? ", tied" : "");
    }
    fprintf(f, "  -o, --output F    the file to write (required)\n"
               "  --type T          weight matrices' type, as for kvpred quantize (default Q8_0):\n"
               "                    F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K..Q6_K\n"
               "  --layers N        write only the first N layers (big shapes in less time)\n"
               "  --vocab N         vocabulary size (default 512, at least %d; 'real' = the\n"
               "                    model's own)\n"
               "  --seed S          weight seed (default 1)\n"
               "  --threads, -t N   threads (default 1; the file does not depend on it)\n"
               "  -h, --help        show this help\n",
            KVP_SYNTH_MIN_VOCAB);
}

static void help(void)
{
    synth_usage(stdout);
}

int cmd_synth(int argc, char **argv)
{
    const char *shape = NULL, *out = NULL, *type_name = "Q8_0", *vocab = "512";
    struct kvp_synth_params p = {.seed = 1, .n_threads = 1};
    const struct cli_flag flags[] = {
        CLI_STR("--shape", &shape),
        CLI_STR("-o|--output", &out),
        CLI_STR("--type", &type_name),
        CLI_STR("--vocab", &vocab),
        CLI_INT("--layers", 1, 4096, &p.n_layer, "a layer count 1..4096"),
        CLI_INT("--seed", 0, 1L << 62, &p.seed, "a non-negative integer"),
        CLI_INT("-t|--threads", 1, 256, &p.n_threads, "a thread count 1..256"),
        {0},
    };
    const struct cli_command cmd = {.name = "synth", .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (!shape || !out)
        return cli_fail("synth: %s is required", !shape ? "--shape" : "-o");
    const struct kvp_synth_shape *s = kvp_synth_find_shape(shape);
    if (!s)
        return cli_fail("synth: unknown shape '%s' (try kvpred synth --help)", shape);
    p.type = kvp_quantize_type_from_name(type_name);
    if (p.type < 0)
        return cli_fail("synth: unknown type '%s' (try kvpred synth --help)", type_name);
    long nv;
    if (!strcmp(vocab, "real"))
        p.n_vocab = s->n_vocab;
    else if (cli_parse_int(vocab, KVP_SYNTH_MIN_VOCAB, 1L << 20, &nv))
        p.n_vocab = (int)nv;
    else
        return cli_fail("synth: --vocab needs 'real' or a size %d..%d", KVP_SYNTH_MIN_VOCAB,
                        1 << 20);
    struct kvp_err err = {0};
    uint64_t bytes = 0;
    if (kvp_synth_write(s, &p, out, &bytes, &err) < 0)
        return cli_fail_err(&err);
    printf("wrote %s: %s shape, %d layers, vocab %d, %s, %.2f MiB of tensors\n", out, s->name,
           p.n_layer > 0 ? p.n_layer : s->n_layer, p.n_vocab, kvp_type_name(p.type),
           (double)bytes / 1048576.0);
    return 0;
}
