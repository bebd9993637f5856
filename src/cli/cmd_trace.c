/*
 * `kvpred trace`: record the attention traces the predictor is trained on (format: see
 * src/predictor/trace.h). Each corpus (or the byte range --start..--end of it, cut at line
 * boundaries so a split never shares a line) is tokenized, cut into sequences of --seq-len tokens
 * each starting with BOS, and decoded densely token by token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "predictor/trace.h"

static void help(void)
{
    printf("usage: kvpred trace [-m MODEL] -f CORPUS [-f CORPUS ...] -o DATASET [options]\n\n"
           "Decode text densely and record, per compressed layer and query head, the\n"
           "block-pooled attention row of every position (training data for train-predictor).\n\n"
           "  -f, --file PATH      corpus text (repeatable)\n"
           "  -o, --output PATH    dataset file to write\n"
           "  --seq-len N          tokens per sequence, BOS included (default 512)\n"
           "  --max-seq N          sequences at most, over all corpora (default 32)\n"
           "  --start F, --end F   use bytes [F, E) of each corpus as fractions of its size,\n"
           "                       moved to line starts (default 0 and 1)\n"
           "  --dense-layers N     leading layers that run dense and are not recorded (default 2)\n"
           "%s",
           cli_model_flags_help);
}

/* Byte offset of the first line start at or after frac of the text. */
static size_t line_start(const char *text, size_t len, double frac)
{
    size_t at = (size_t)(frac * (double)len);
    if (at == 0 || at >= len)
        return at >= len ? len : 0;
    while (at < len && text[at - 1] != '\n')
        at++;
    return at;
}

int cmd_trace(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    const char *files[64];
    int n_files = 0;
    const char *out_path = NULL;
    long seq_len = 512, max_seq = 32, dense_layers = 2;
    double start = 0.0, end = 1.0;
    static const char *const value_flags[] = {"-f", "--file", "-o", "--output", "--seq-len",
                                              "--max-seq", "--start", "--end", "--dense-layers",
                                              NULL};
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
        } else if (!cli_flag_in(a, value_flags)) {
            return cli_fail("trace: unknown flag '%s' (see kvpred trace --help)", a);
        } else if (!(v = cli_flag_value(argc, argv, &i))) {
            return 1;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (n_files == 64)
                return cli_fail("trace: at most 64 corpora");
            files[n_files++] = v;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            out_path = v;
        } else if (!strcmp(a, "--seq-len")) {
            if (!cli_parse_int(v, 2, 1 << 20, &seq_len))
                return cli_fail("--seq-len: '%s' is not in 2..1048576", v);
        } else if (!strcmp(a, "--max-seq")) {
            if (!cli_parse_int(v, 1, 1 << 20, &max_seq))
                return cli_fail("--max-seq: '%s' is not a positive count", v);
        } else if (!strcmp(a, "--dense-layers")) {
            if (!cli_parse_int(v, 0, 1024, &dense_layers))
                return cli_fail("--dense-layers: '%s' is not a layer count", v);
        } else if (!strcmp(a, "--start")) {
            if (!cli_parse_float(v, 0.0, 1.0, &start))
                return cli_fail("--start: '%s' is not a fraction in 0..1", v);
        } else if (!strcmp(a, "--end")) {
            if (!cli_parse_float(v, 0.0, 1.0, &end))
                return cli_fail("--end: '%s' is not a fraction in 0..1", v);
        }
    }
    if (!n_files || !out_path)
        return cli_fail("trace: give at least one corpus (-f) and the output (-o)");
    if (end <= start)
        return cli_fail("trace: --end must be larger than --start");

    int status = 1;
    kvp_ctx *ctx = NULL;
    int32_t *all = NULL;
    size_t n_all = 0;
    struct kvp_trace_writer w = {0};
    struct kvp_err err = {0};
    kvp_model *m = cli_open_model(&mo);
    if (!m)
        return 1;
    int bos = kvp_token_bos(m);
    /* tokens of every corpus, one after the other, each cut into sequences below */
    size_t *corpus_end = calloc((size_t)n_files, sizeof(size_t));
    if (!corpus_end) {
        cli_fail("out of memory");
        goto out;
    }
    for (int f = 0; f < n_files; f++) {
        size_t len;
        char *text = cli_read_file(files[f], &len);
        if (!text)
            goto out;
        size_t a = line_start(text, len, start), b = line_start(text, len, end);
        size_t n = 0;
        int32_t *ids = cli_tokenize(m, text + a, b - a, false, &n);
        free(text);
        if (!ids)
            goto out;
        int32_t *grown = realloc(all, (n_all + n + 1) * sizeof(int32_t));
        if (!grown) {
            free(ids);
            cli_fail("out of memory");
            goto out;
        }
        all = grown;
        memcpy(all + n_all, ids, n * sizeof(int32_t));
        n_all += n;
        corpus_end[f] = n_all;
        free(ids);
    }
    /* sequences: BOS + seq_len - 1 corpus tokens, never crossing a corpus boundary */
    long n_seq = 0;
    size_t from = 0;
    for (int f = 0; f < n_files; f++) {
        for (size_t p = from; p + (size_t)seq_len - 1 <= corpus_end[f] && n_seq < max_seq;
             p += (size_t)seq_len - 1)
            n_seq++;
        from = corpus_end[f];
    }
    if (n_seq == 0) {
        cli_fail("trace: the corpora hold fewer than %ld tokens: nothing to record", seq_len - 1);
        goto out;
    }
    if (!(ctx = cli_open_ctx(m, &mo, seq_len)))
        goto out;
    if (kvp_trace_open(&w, out_path, m, (int)dense_layers, 16, (int)seq_len, (int)n_seq, &err) <
        0) {
        cli_fail_err(&err);
        goto out;
    }
    int32_t *seq = malloc((size_t)seq_len * sizeof(int32_t));
    if (!seq) {
        cli_fail("out of memory");
        goto out;
    }
    bool tty = isatty(2);
    long done = 0;
    from = 0;
    for (int f = 0; f < n_files && done < n_seq; f++) {
        for (size_t p = from; p + (size_t)seq_len - 1 <= corpus_end[f] && done < n_seq;
             p += (size_t)seq_len - 1) {
            seq[0] = bos;
            memcpy(seq + 1, all + p, (size_t)(seq_len - 1) * sizeof(int32_t));
            if (kvp_trace_record(&w, ctx, seq, (int)seq_len, &err) < 0) {
                free(seq);
                cli_fail_err(&err);
                goto out;
            }
            done++;
            if (tty)
                fprintf(stderr, "\rtrace: %ld/%ld sequences", done, n_seq);
        }
        from = corpus_end[f];
    }
    free(seq);
    if (tty)
        fputc('\n', stderr);
    if (kvp_trace_close(&w, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    printf("wrote %s: %ld sequences of %ld tokens (%zu corpus tokens), layers %ld..%d\n",
           out_path, n_seq, seq_len, n_all, dense_layers, w.first_layer + w.n_layers - 1);
    status = 0;
out:
    if (w.f) {
        kvp_trace_close(&w, NULL);
        remove(out_path);
    }
    free(corpus_end);
    free(all);
    kvp_ctx_free(ctx);
    kvp_model_close(m);
    return status;
}
