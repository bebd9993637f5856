/* `kvpred run`: generate text from a prompt, streaming tokens as they are sampled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "core/platform.h"

static void help(void)
{
    printf("usage: kvpred run [-m MODEL] [-p TEXT | -f FILE] [-n N] [options]\n\n"
           "Generate text. Sampling is greedy unless --temp > 0.\n\n%s"
           "  -p, --prompt TEXT    prompt text (default: empty, generation starts from BOS)\n"
           "  -f, --file PATH      read the prompt from a file\n"
           "  -n, --n-predict N    tokens to generate (default 128)\n"
           "  --temp T             temperature (default 0: greedy)\n"
           "  --top-k K            keep the K most likely tokens (default 40; 0 = off)\n"
           "  --top-p P            nucleus sampling threshold (default 0.95; 1 = off)\n"
           "  --repeat-penalty R   penalty for recent tokens (default 1.0 = off)\n"
           "  --repeat-last-n N    tokens the penalty looks back over (default 64)\n"
           "  --seed S             random seed (default 42)\n"
           "  --no-bos             do not prepend BOS\n"
           "  --ignore-eos         keep generating after an end-of-generation token\n",
           cli_model_flags_help);
}

int cmd_run(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    const char *prompt = NULL, *prompt_file = NULL;
    long n_predict = 128, top_k = 40, repeat_last_n = 64, seed = 42;
    double temp = 0.0, top_p = 0.95, repeat_penalty = 1.0;
    bool add_bos = true, ignore_eos = false;
    static const char *const value_flags[] = {"-p", "--prompt", "-f", "--file", "-n", "--n-predict", "--temp", "--top-k", "--top-p", "--repeat-penalty", "--repeat-last-n", "--seed", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_model_flag(&mo, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        const char *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help();
            return 0;
        } else if (!strcmp(a, "--no-bos")) {
            add_bos = false;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else if (!cli_flag_in(a, value_flags)) {
            return cli_fail("run: unknown flag '%s' (see kvpred run --help)", a);
        } else if (!(v = cli_flag_value(argc, argv, &i))) {
            return 1;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            prompt = v;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            prompt_file = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!cli_parse_int(v, 0, 1 << 24, &n_predict))
                return cli_fail("%s: '%s' is not a token count", a, v);
        } else if (!strcmp(a, "--temp")) {
            if (!cli_parse_float(v, 0.0, 100.0, &temp))
                return cli_fail("--temp: '%s' is not a temperature in 0..100", v);
        } else if (!strcmp(a, "--top-k")) {
            if (!cli_parse_int(v, 0, 1 << 24, &top_k))
                return cli_fail("--top-k: '%s' is not a count", v);
        } else if (!strcmp(a, "--top-p")) {
            if (!cli_parse_float(v, 0.0, 1.0, &top_p))
                return cli_fail("--top-p: '%s' is not in 0..1", v);
        } else if (!strcmp(a, "--repeat-penalty")) {
            if (!cli_parse_float(v, 0.01, 100.0, &repeat_penalty))
                return cli_fail("--repeat-penalty: '%s' is not in 0.01..100", v);
        } else if (!strcmp(a, "--repeat-last-n")) {
            if (!cli_parse_int(v, 0, 1 << 20, &repeat_last_n))
                return cli_fail("--repeat-last-n: '%s' is not a count", v);
        } else if (!strcmp(a, "--seed")) {
            if (!cli_parse_int(v, 0, 0x7fffffffffffffffL, &seed))
                return cli_fail("--seed: '%s' is not a non-negative integer", v);
        } else {
            return cli_fail("run: unknown flag '%s' (see kvpred run --help)", a);
        }
    }
    if (prompt && prompt_file)
        return cli_fail("run: give either -p or -f, not both");

    int status = 1;
    char *file_text = NULL;
    int32_t *ids = NULL;
    kvp_ctx *ctx = NULL;
    kvp_sampler *smp = NULL;
    float *logits = NULL;
    kvp_model *model = cli_open_model(&mo);
    if (!model)
        return 1;
    struct kvp_model_info info;
    kvp_model_get_info(model, &info);

    size_t len = 0;
    const char *text = prompt ? prompt : "";
    if (prompt_file) {
        file_text = cli_read_file(prompt_file, &len);
        if (!file_text)
            goto out;
        text = file_text;
    } else {
        len = strlen(text);
    }
    size_t n_prompt = 0;
    ids = cli_tokenize(model, text, len, add_bos, &n_prompt);
    if (!ids)
        goto out;
    if (n_prompt == 0) {
        cli_fail("run: the prompt is empty and --no-bos was given: nothing to start from");
        goto out;
    }
    long n_ctx = mo.n_ctx > 0 ? mo.n_ctx : info.n_ctx_train;
    if ((long)n_prompt > n_ctx) {
        cli_fail("run: the prompt has %zu tokens, longer than the context (%ld); raise -c",
                 n_prompt, n_ctx);
        goto out;
    }
    if ((long)n_prompt + n_predict > n_ctx) {
        cli_warn("prompt (%zu) + %ld new tokens exceed the context (%ld): generation stops at "
                 "the context length", n_prompt, n_predict, n_ctx);
        n_predict = n_ctx - (long)n_prompt;
    }
    ctx = cli_open_ctx(model, &mo, n_ctx);
    if (!ctx)
        goto out;
    struct kvp_sampler_params sp = {.temperature = (float)temp, .top_k = (int)top_k,
                                    .top_p = (float)top_p, .repeat_penalty = (float)repeat_penalty,
                                    .repeat_last_n = (int)repeat_last_n, .seed = (uint64_t)seed};
    struct kvp_err err = {0};
    if (kvp_sampler_init(&sp, info.n_vocab, &smp, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    logits = malloc((size_t)info.n_vocab * sizeof(float));
    if (!logits) {
        cli_fail("out of memory");
        goto out;
    }
    /* echo the prompt, then stream */
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    double t0 = kvp_time_now();
    if (kvp_eval(ctx, ids, (int)n_prompt, logits, false, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    for (size_t i = 0; i < n_prompt; i++)
        kvp_sampler_accept(smp, ids[i]);
    double t1 = kvp_time_now();
    int prev = ids[n_prompt - 1];
    long generated = 0;
    char piece[256];
    while (generated < n_predict) {
        int tok = kvp_sampler_sample(smp, logits);
        generated++;
        if (!ignore_eos && kvp_token_is_eog(model, tok))
            break;
        size_t pn = kvp_token_to_piece(model, prev, tok, piece, sizeof(piece));
        fwrite(piece, 1, pn, stdout);
        fflush(stdout);
        kvp_sampler_accept(smp, tok);
        prev = tok;
        if (generated == n_predict)
            break;
        int32_t t = tok;
        if (kvp_eval(ctx, &t, 1, logits, false, &err) < 0) {
            cli_fail_err(&err);
            goto out;
        }
    }
    double t2 = kvp_time_now();
    printf("\n");
    fprintf(stderr, "\nkvpred: prompt %zu tokens in %.1f ms (%.0f tok/s), generated %ld tokens in "
                    "%.1f ms (%.0f tok/s)\n",
            n_prompt, (t1 - t0) * 1e3, n_prompt / (t1 - t0), generated, (t2 - t1) * 1e3,
            generated / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
    status = 0;
out:
    free(logits);
    kvp_sampler_free(smp);
    kvp_ctx_free(ctx);
    free(ids);
    free(file_text);
    kvp_model_close(model);
    return status;
}
