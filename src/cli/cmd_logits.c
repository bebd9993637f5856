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
    if (!file)
        return cli_fail("logits: -f FILE is required");
    int status = 1;
    char *text = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    kvp_ctx *ctx = NULL;
    kvp_model *m = cli_open_model(&mo);
    if (!m)
        return 1;
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    size_t len, n;
    if (!(text = cli_read_file(file, &len)) || !(ids = cli_tokenize(m, text, len, true, &n)))
        goto out;
    if (npos > 0 && (size_t)npos < n)
        n = (size_t)npos;
    ctx = cli_open_ctx(m, &mo, mo.n_ctx > 0 ? mo.n_ctx : (long)n);
    if (!ctx)
        goto out;
    if ((long)n > kvp_ctx_n_ctx(ctx)) {
        cli_fail("logits: %zu tokens do not fit in context %d", n, kvp_ctx_n_ctx(ctx));
        goto out;
    }
    logits = malloc(n * (size_t)in.n_vocab * sizeof(float));
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
        for (int j = 0; j < in.n_vocab; j++)
            printf("%s%.6g", j ? ", " : "", logits[i * in.n_vocab + j]);
        printf("]");
    }
    printf("]}\n");
    status = 0;
out:
    free(logits);
    kvp_ctx_free(ctx);
    free(ids);
    free(text);
    kvp_model_close(m);
    return status;
}
