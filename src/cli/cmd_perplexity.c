/*
 * `kvpred perplexity`: the text is tokenized once with BOS and scored by kvp_perplexity
 * (src/eval/perplexity.h: llama.cpp's convention, CTX-token chunks, the second half of each
 * scored); this file only parses, reads and prints.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "core/platform.h"
#include "eval/perplexity.h"

static void help(void)
{
    printf("usage: kvpred perplexity [-m MODEL] -f FILE -c CTX [--bytes N] [--chunks N] [--json]\n\n"
           "  --bytes N            use only the first N bytes of FILE\n"
           "  --chunks N           score at most N chunks\n"
           "  --json               print one JSON object\n\n%s",
           cli_model_flags_help);
}

static void progress(void *ud, long done, long total, double ppl)
{
    fprintf(stderr, "\rchunk %ld/%ld  ppl %.4f", done, total, ppl);
}

int cmd_perplexity(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    const char *file = NULL;
    long max_bytes = 0, max_chunks = 0;
    bool json = false;
    const struct cli_flag flags[] = {
        CLI_STR("-f|--file", &file),
        CLI_INT("--bytes", 1, 0x7fffffffffffL, &max_bytes, "a positive byte count"),
        CLI_INT("--chunks", 1, 1 << 30, &max_chunks, "a positive count"),
        CLI_BOOL("--json", &json),
        {0},
    };
    const struct cli_command cmd = {.name = "perplexity", .mo = &mo, .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    struct cli_scored_text t;
    if (cli_scored_text_open(&t, &mo, "perplexity", file, (size_t)max_bytes))
        return 1;
    int status = 1;
    kvp_ctx *ctx = NULL;
    const size_t n = t.n;
    long n_ctx = mo.n_ctx > 0 ? mo.n_ctx : t.in.n_ctx_train;
    if (n_ctx < 4) {
        cli_fail("perplexity: context %ld is too short (need at least 4)", n_ctx);
        goto out;
    }
    if (kvp_perplexity_chunks(n, n_ctx, max_chunks) < 1) {
        cli_fail("perplexity: the text has %zu tokens, fewer than one context of %ld", n, n_ctx);
        goto out;
    }
    if (!(ctx = cli_open_ctx(t.m, &mo, n_ctx)))
        goto out;
    struct kvp_ppl_result r;
    struct kvp_err err = {0};
    double t0 = kvp_time_now();
    if (kvp_perplexity(ctx, t.m, t.ids, n, n_ctx, max_chunks, json ? NULL : progress, NULL, &r,
                       &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    double secs = kvp_time_now() - t0;
    long n_chunks = r.chunks, count = r.scored;
    double mean = r.nll, ppl = r.ppl, se = r.ppl_stderr;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", t.in.name);
        cJSON_AddNumberToObject(o, "ctx", (double)n_ctx);
        cJSON_AddNumberToObject(o, "chunks", (double)n_chunks);
        cJSON_AddNumberToObject(o, "tokens", (double)n);
        cJSON_AddNumberToObject(o, "scored", (double)count);
        cJSON_AddNumberToObject(o, "nll", mean);
        cJSON_AddNumberToObject(o, "ppl", ppl);
        cJSON_AddNumberToObject(o, "ppl_stderr", se);
        cJSON_AddNumberToObject(o, "seconds", secs);
        cJSON_AddNumberToObject(o, "tokens_per_s", (double)n_chunks * n_ctx / secs);
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(o);
    } else {
        fprintf(stderr, "\n");
        printf("perplexity %.4f ± %.4f over %ld chunks of %ld tokens (%ld scored), %.2f s\n", ppl,
               se, n_chunks, n_ctx, count, secs);
    }
    status = 0;
out:
    kvp_ctx_free(ctx);
    cli_scored_text_close(&t);
    return status;
}
