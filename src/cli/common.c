/* Shared CLI plumbing (see common.h). */
#include "cli/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

const char *cli_model_flags_help =
    "  -m, --model PATH     model file: GGUF, or a llama2.c checkpoint (default: the shipped\n"
    "                       model, else ../shared/models/stories260K.gguf)\n"
    "  --tokenizer PATH     llama2.c tokenizer.bin (needed for llama2.c checkpoints)\n"
    "  -c, --ctx N          context length in tokens (default: the model's)\n"
    "  -t, --threads N      threads (default 1)\n"
    "  --block N            KV block size in tokens (default 16)\n"
    "  -b, --batch N        prefill micro-batch (default 512)\n";

/* Candidates for the default model, in order. */
static const char *default_models[] = {
    "models/kvpred-default.gguf",
    "../shared/models/stories260K.gguf",
};

bool cli_flag_in(const char *a, const char *const *names)
{
    for (; *names; names++)
        if (!strcmp(a, *names))
            return true;
    return false;
}

const char *cli_flag_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        cli_fail("flag %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static int int_flag(int argc, char **argv, int *i, long min, long max, long *out)
{
    const char *flag = argv[*i];
    const char *v = cli_flag_value(argc, argv, i);
    if (!v)
        return -1;
    if (!cli_parse_int(v, min, max, out)) {
        cli_fail("%s: '%s' is not an integer in %ld..%ld", flag, v, min, max);
        return -1;
    }
    return 1;
}

int cli_model_flag(struct cli_model_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        o->model_path = cli_flag_value(argc, argv, i);
        return o->model_path ? 1 : -1;
    }
    if (!strcmp(a, "--tokenizer")) {
        o->tokenizer_path = cli_flag_value(argc, argv, i);
        return o->tokenizer_path ? 1 : -1;
    }
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx") || !strcmp(a, "--ctx-size"))
        return int_flag(argc, argv, i, 1, 1 << 24, &o->n_ctx);
    if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
        return int_flag(argc, argv, i, 1, 256, &o->n_threads);
    if (!strcmp(a, "--block"))
        return int_flag(argc, argv, i, 1, 4096, &o->block_size);
    if (!strcmp(a, "-b") || !strcmp(a, "--batch"))
        return int_flag(argc, argv, i, 1, 1 << 20, &o->n_batch);
    return 0;
}

kvp_model *cli_open_model(const struct cli_model_opts *o)
{
    const char *path = o->model_path;
    if (!path) {
        struct stat st;
        for (size_t i = 0; i < sizeof(default_models) / sizeof(default_models[0]); i++)
            if (stat(default_models[i], &st) == 0) {
                path = default_models[i];
                break;
            }
        if (!path) {
            cli_fail("no model given (-m) and no default model found (looked for %s and %s); "
                     "pass -m MODEL",
                     default_models[0], default_models[1]);
            return NULL;
        }
    }
    struct kvp_model_params mp = {.tokenizer_path = o->tokenizer_path};
    struct kvp_err err = {0};
    kvp_model *m = NULL;
    if (kvp_model_open(path, &mp, &m, &err) < 0) {
        cli_fail_err(&err);
        return NULL;
    }
    return m;
}

kvp_ctx *cli_open_ctx(const kvp_model *m, const struct cli_model_opts *o, long n_ctx)
{
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    struct kvp_ctx_params cp = {
        .n_ctx = (int)(n_ctx > 0 ? n_ctx : o->n_ctx),
        .n_threads = (int)o->n_threads,
        .block_size = (int)o->block_size,
        .n_batch = (int)o->n_batch,
    };
    if (cp.n_ctx > info.n_ctx_train)
        cli_warn("context %d is longer than the model's training context %d: quality beyond it "
                 "is not meaningful",
                 cp.n_ctx, info.n_ctx_train);
    struct kvp_err err = {0};
    kvp_ctx *c = NULL;
    if (kvp_ctx_init(m, &cp, &c, &err) < 0) {
        cli_fail_err(&err);
        return NULL;
    }
    return c;
}

char *cli_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_fail("%s: cannot open", path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *nb = cap < ((size_t)1 << 40) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        cli_fail("%s: cannot read", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int32_t *cli_tokenize(const kvp_model *m, const char *text, size_t len, bool add_bos, size_t *n)
{
    size_t cap = len + 8;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    struct kvp_err err = {0};
    if (!ids) {
        cli_fail("out of memory");
        return NULL;
    }
    if (kvp_tokenize(m, text, len, add_bos, ids, cap, n, &err) < 0) {
        free(ids);
        cli_fail_err(&err);
        return NULL;
    }
    return ids;
}
