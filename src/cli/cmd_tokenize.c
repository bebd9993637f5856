/*
 * `kvpred tokenize`: print the token ids of a text, space-separated on one line, using the
 * model's own vocabulary (GGUF metadata, or a llama2.c checkpoint plus --tokenizer).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static void tokenize_usage(FILE *f)
{
    fprintf(f, "usage: kvpred tokenize -m MODEL [--tokenizer TOK.bin] (-p TEXT | -f FILE) "
               "[--no-bos]\n\n"
               "  -m, --model MODEL       GGUF file or llama2.c checkpoint\n"
               "  --tokenizer TOK.bin     llama2.c tokenizer (llama2.c checkpoints only)\n"
               "  -p, --prompt TEXT       text to tokenize\n"
               "  -f, --file FILE         read the text from FILE (bytes as they are)\n"
               "  --no-bos                do not prepend the BOS token\n"
               "  -h, --help              show this help\n");
}

/* Read a whole file; NULL on failure (errno set). */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        char *nb = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* Fill err without the library's internal helpers. */
static int set_err(struct kvp_err *err, int code, const char *msg)
{
    err->code = code;
    snprintf(err->msg, sizeof(err->msg), "%s", msg);
    return code;
}

/* Tokenize, growing the id buffer once if the first guess was too small. */
static int tokenize_text(const kvp_model *model, const char *text, size_t len, bool bos,
                         int32_t **ids_out, size_t *n_out, struct kvp_err *err)
{
    size_t cap = len + 2;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *ids = malloc(cap * sizeof(*ids));
        if (!ids)
            return set_err(err, KVP_ENOMEM, "tokenize: out of memory");
        size_t n = 0;
        int rc = kvp_tokenize(model, text, len, bos, ids, cap, &n, err);
        if (rc == 0) {
            *ids_out = ids;
            *n_out = n;
            return 0;
        }
        free(ids);
        if (rc != KVP_ERANGE)
            return rc;
        cap = n;
    }
    return set_err(err, KVP_ERANGE, "tokenize: token count changed between passes");
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *prompt = NULL, *file = NULL;
    bool bos = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-bos")) {
            bos = false;
            continue;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            dst = &model_path;
        } else if (!strcmp(a, "--tokenizer")) {
            dst = &tok_path;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            dst = &prompt;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            dst = &file;
        } else {
            return cli_fail("tokenize: unknown argument '%s' (try kvpred tokenize --help)", a);
        }
        if (i + 1 >= argc)
            return cli_fail("tokenize: %s needs a value", a);
        *dst = argv[++i];
    }
    if (!model_path) {
        tokenize_usage(stderr);
        return cli_fail("tokenize: -m MODEL is required");
    }
    if (!prompt == !file)
        return cli_fail("tokenize: give exactly one of -p TEXT and -f FILE");

    size_t len;
    char *owned = NULL;
    const char *text = prompt;
    if (file) {
        owned = read_all(file, &len);
        if (!owned)
            return cli_fail("tokenize: cannot read %s", file);
        text = owned;
    } else {
        len = strlen(prompt);
    }

    int status = 1;
    struct kvp_err err = {0};
    struct kvp_model_params params = {.tokenizer_path = tok_path};
    kvp_model *model = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (kvp_model_open(model_path, &params, &model, &err) < 0 ||
        tokenize_text(model, text, len, bos, &ids, &n, &err) < 0) {
        status = cli_fail_err(&err);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        printf(i ? " %d" : "%d", (int)ids[i]);
    printf("\n");
    status = 0;

out:
    free(ids);
    kvp_model_close(model);
    free(owned);
    return status;
}
