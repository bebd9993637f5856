/*
 * `kvpred perplexity`: llama.cpp's convention (shared/reference/stories260K_ppl.json): the text is
 * tokenized once with BOS, split into consecutive CTX-token chunks, each chunk is evaluated alone
 * with BOS as its first token, and the negative log-likelihood is averaged over the second half
 * of every chunk (positions CTX/2 .. CTX-2 predicting the next token). The standard error is
 * llama.cpp's: sqrt(var(nll) / (N-1)) · ppl.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "core/platform.h"

static void help(void)
{
    printf("usage: kvpred perplexity [-m MODEL] -f FILE -c CTX [--bytes N] [--chunks N] [--json]\n\n"
           "  --bytes N            use only the first N bytes of FILE\n"
           "  --chunks N           score at most N chunks\n"
           "  --json               print one JSON object\n\n%s",
           cli_model_flags_help);
}

/* -log softmax(logits)[target], in double precision */
static double nll_of(const float *logits, int n_vocab, int target)
{
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - mx);
    return log(sum) - ((double)logits[target] - mx);
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
    if (!file)
        return cli_fail("perplexity: -f FILE is required");
    int status = 1;
    char *text = NULL;
    int32_t *ids = NULL, *chunk = NULL;
    float *logits = NULL;
    kvp_ctx *ctx = NULL;
    kvp_model *m = cli_open_model(&mo);
    if (!m)
        return 1;
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    long n_ctx = mo.n_ctx > 0 ? mo.n_ctx : in.n_ctx_train;
    if (n_ctx < 4) {
        cli_fail("perplexity: context %ld is too short (need at least 4)", n_ctx);
        goto out;
    }
    size_t len, n;
    if (!(text = cli_read_file(file, &len)))
        goto out;
    if (max_bytes > 0 && (size_t)max_bytes < len)
        len = (size_t)max_bytes;
    if (!(ids = cli_tokenize(m, text, len, true, &n)))
        goto out;
    long n_chunks = (long)(n / (size_t)n_ctx);
    if (max_chunks > 0 && max_chunks < n_chunks)
        n_chunks = max_chunks;
    if (n_chunks < 1) {
        cli_fail("perplexity: the text has %zu tokens, fewer than one context of %ld", n, n_ctx);
        goto out;
    }
    if (!(ctx = cli_open_ctx(m, &mo, n_ctx)))
        goto out;
    logits = malloc((size_t)n_ctx * in.n_vocab * sizeof(float));
    chunk = malloc((size_t)n_ctx * sizeof(int32_t));
    if (!logits || !chunk) {
        cli_fail("out of memory");
        goto out;
    }
    double nll = 0.0, nll2 = 0.0;
    long count = 0;
    int first = (int)(n_ctx / 2);
    double t0 = kvp_time_now();
    for (long c = 0; c < n_chunks; c++) {
        size_t start = (size_t)c * n_ctx;
        memcpy(chunk, ids + start, (size_t)n_ctx * sizeof(int32_t));
        chunk[0] = kvp_token_bos(m);
        kvp_ctx_reset(ctx);
        struct kvp_err err = {0};
        if (kvp_eval(ctx, chunk, (int)n_ctx, logits, true, &err) < 0) {
            cli_fail_err(&err);
            goto out;
        }
        for (int j = first; j < n_ctx - 1; j++) {
            double v = nll_of(logits + (size_t)j * in.n_vocab, in.n_vocab, ids[start + j + 1]);
            nll += v;
            nll2 += v * v;
            count++;
        }
        if (!json)
            fprintf(stderr, "\rchunk %ld/%ld  ppl %.4f", c + 1, n_chunks, exp(nll / count));
    }
    double secs = kvp_time_now() - t0;
    double mean = nll / count;
    double ppl = exp(mean);
    double var = nll2 / count - mean * mean;
    double se = (var > 0 && count > 1) ? sqrt(var / (count - 1)) * ppl : 0.0;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", in.name);
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
    free(chunk);
    free(logits);
    kvp_ctx_free(ctx);
    free(ids);
    free(text);
    kvp_model_close(m);
    return status;
}
