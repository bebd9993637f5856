/* `kvpred logits`: next-token logits at every position of a text, as JSON
 * ({"tokens": [...], "logits": [[n_vocab floats] per position]}), the shape of
 * shared/reference/stories260K_logits.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"

static void help(void)
{
    printf("usage: kvpred logits [-m MODEL] -f FILE [-n NPOS] [--json]\n\n"
           "Tokenize FILE (BOS first), evaluate the first NPOS tokens (default all) and print\n"
           "the logits of every position as JSON. The output is always JSON; --json is accepted\n"
           "for symmetry with the other measuring commands.\n\n%s",
           cli_model_flags_help);
}

int cmd_logits(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    const char *file = NULL;
    long npos = 0;
    bool json = false; /* the output is always JSON; the flag is accepted for symmetry */
    const struct cli_flag flags[] = {
        CLI_STR("-f|--file", &file),
        CLI_INT("-n", 1, 1 << 24, &npos, "a positive position count"),
        CLI_BOOL("--json", &json),
        {0},
    };
    const struct cli_command cmd = {.name = "logits", .mo = &mo, .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    struct cli_scored_text t;
    if (cli_scored_text_open(&t, &mo, "logits", file, 0))
        return 1;
    int status = 1;
    float *logits = NULL;
    size_t n = npos > 0 && (size_t)npos < t.n ? (size_t)npos : t.n;
    const int32_t *ids = t.ids;
    const int n_vocab = t.in.n_vocab;
    kvp_ctx *ctx = cli_open_ctx(t.m, &mo, mo.n_ctx > 0 ? mo.n_ctx : (long)n);
    if (!ctx)
        goto out;
    if ((long)n > kvp_ctx_n_ctx(ctx)) {
        cli_fail("logits: %zu tokens do not fit in context %d", n, kvp_ctx_n_ctx(ctx));
        goto out;
    }
    logits = malloc(n * (size_t)n_vocab * sizeof(float));
    if (!logits) {
        cli_fail("out of memory");
        goto out;
    }
    struct kvp_err err = {0};
    if (kvp_eval(ctx, ids, (int)n, logits, true, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    printf("{\"tokens\": [");
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", ids[i]);
    printf("], \"logits\": [");
    for (size_t i = 0; i < n; i++) {
        printf("%s[", i ? ", " : "");
        for (int j = 0; j < n_vocab; j++)
            printf("%s%.6g", j ? ", " : "", logits[i * n_vocab + j]);
        printf("]");
    }
    printf("]}\n");
    status = 0;
out:
    free(logits);
    kvp_ctx_free(ctx);
    cli_scored_text_close(&t);
    return status;
}
