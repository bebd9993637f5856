/*
 * `kvpred trace`: record the attention traces the predictor is trained on (format: see
 * src/predictor/trace.h). Each corpus (or the byte range --start..--end of it, cut at line
 * boundaries so a split never shares a line) is tokenized, cut into sequences of --seq-len tokens
 * each starting with BOS, and decoded densely token by token.
 *
 * With --tasks, the corpora are filler instead: each sequence is one retrieval prompt (the
 * training generator's needles at random depths, sized to --seq-len less room for the answer)
 * followed by its answer, so the trace holds the rows a retrieval step produces (the answer
 * attending to a needle far back), which plain text never shows the predictor. The evaluation
 * filler (pg_essays) is refused, and seeds come from the training range (kvp_task_seed), so a
 * predictor trained on such a trace never saw an evaluation prompt.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "eval/task_eval.h"
#include "eval/trace_record.h"
#include "predictor/trace.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"

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
           "  --tasks T1,T2,...    record retrieval prompts with their answers instead, with the\n"
           "                       corpora as filler, cycling over the tasks (passkey,\n"
           "                       niah_single_1..3, niah_multikey_1..3, niah_multivalue,\n"
           "                       niah_multiquery, vt); --max-seq prompts of up to --seq-len\n"
           "  --seed S             prompt seed for --tasks (default 1)\n"
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

/* "passkey,niah_single_2": task ids into out (at most cap); 0 on an unknown name. */
static int parse_tasks(const char *list, int *out, int cap)
{
    int n = 0;
    for (const char *p = list; *p && n < cap;) {
        size_t len = strcspn(p, ",");
        int task = kvp_task_by_name(p, len);
        if (task < KVP_TASK_PASSKEY || task > KVP_TASK_VT) /* lm and copy have no prompt */
            return 0;
        out[n++] = task;
        p += len + (p[len] == ',');
    }
    return n;
}

/* --tasks: one retrieval prompt and its answer per sequence, the corpora as filler. */
static int record_tasks(kvp_model *m, const struct cli_model_opts *mo, const char *const *files,
                        int n_files, double start, double end, const int *tasks, int n_tasks,
                        long seed, long seq_len, long max_seq, long dense_layers,
                        const char *out_path)
{
    int status = 1;
    char *raw = NULL;
    size_t len = 0;
    struct kvp_corpus *c = NULL;
    kvp_ctx *ctx = NULL;
    int32_t *seq = NULL;
    struct kvp_trace_writer w = {0};
    struct kvp_err err = {0};
    if (kvp_corpus_read(files, n_files, &raw, &len, &err) < 0) {
        cli_fail("trace: %s", err.msg);
        return 1;
    }
    size_t a = line_start(raw, len, start), b = line_start(raw, len, end);
    if (kvp_corpus_init(&c, raw + a, b - a, NULL, 0.0, &err) < 0) {
        cli_fail("trace: filler: %s", err.msg);
        goto out;
    }
    seq = malloc((size_t)seq_len * sizeof(int32_t));
    if (!seq) {
        cli_fail("out of memory");
        goto out;
    }
    if (!(ctx = cli_open_ctx(m, mo, seq_len)))
        goto out;
    if (kvp_trace_open(&w, out_path, m, (int)dense_layers, 16, (int)seq_len, (int)max_seq, &err) <
        0) {
        cli_fail_err(&err);
        goto out;
    }
    bool tty = isatty(2);
    long n_tok = 0;
    for (long i = 0; i < max_seq; i++) {
        /* answers are a few tokens; 64 leaves room for the longest (multi-value lists) */
        struct kvp_task_req req = {
            .task = tasks[i % n_tasks],
            .seed = kvp_task_seed((uint64_t)seed, (uint64_t)i), /* training range */
            .target_tokens = (int)seq_len - 64,
            .depth = -1.0f,
            .count = kvp_task_eval_count_tokens,
            .ud = m,
        };
        struct kvp_task_text tt;
        if (kvp_task_render_eval(c, &req, &tt, &err) < 0) {
            cli_fail("trace: %s: %s", kvp_task_name(req.task), err.msg);
            goto out;
        }
        size_t np = 0, na = 0;
        int32_t *p = cli_tokenize(m, tt.prompt, strlen(tt.prompt), true, &np);
        int32_t *an = p ? cli_tokenize(m, tt.answer, strlen(tt.answer), false, &na) : NULL;
        kvp_task_text_free(&tt);
        if (!p || !an) {
            free(p);
            goto out;
        }
        if (np + na > (size_t)seq_len)
            na = (size_t)seq_len - np; /* np fits by construction (target_tokens) */
        memcpy(seq, p, np * sizeof(int32_t));
        memcpy(seq + np, an, na * sizeof(int32_t));
        free(p);
        free(an);
        if (kvp_trace_record(&w, ctx, seq, (int)(np + na), &err) < 0) {
            cli_fail_err(&err);
            goto out;
        }
        n_tok += (long)(np + na);
        if (tty)
            fprintf(stderr, "\rtrace: %ld/%ld prompts", i + 1, max_seq);
    }
    if (tty)
        fputc('\n', stderr);
    if (kvp_trace_close(&w, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    printf("wrote %s: %ld retrieval prompts with answers (%ld tokens), layers %ld..%d\n",
           out_path, max_seq, n_tok, dense_layers, w.first_layer + w.n_layers - 1);
    status = 0;
out:
    if (w.f) {
        kvp_trace_close(&w, NULL);
        remove(out_path);
    }
    free(seq);
    kvp_ctx_free(ctx);
    kvp_corpus_free(c);
    free(raw);
    return status;
}

int cmd_trace(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    const char *files[64];
    int n_files = 0;
    const char *out_path = NULL;
    long seq_len = 512, max_seq = 32, dense_layers = 2, seed = 1;
    double start = 0.0, end = 1.0;
    int tasks[64], n_tasks = 0;
    const char *task_list = NULL;
    const struct cli_flag flags[] = {
        CLI_LIST("-f|--file", files, &n_files, 64),
        CLI_STR("-o|--output", &out_path),
        CLI_INT("--seq-len", 2, 1 << 20, &seq_len, NULL),
        CLI_INT("--max-seq", 1, 1 << 20, &max_seq, "a positive count"),
        CLI_INT("--dense-layers", 0, 1024, &dense_layers, "a layer count"),
        CLI_FLOAT("--start", 0.0, 1.0, &start, "a fraction in 0..1"),
        CLI_FLOAT("--end", 0.0, 1.0, &end, "a fraction in 0..1"),
        CLI_STR("--tasks", &task_list),
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &seed, "a non-negative integer"),
        {0},
    };
    const struct cli_command cmd = {.name = "trace", .mo = &mo, .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (task_list && !(n_tasks = parse_tasks(task_list, tasks, 64)))
        return cli_fail("--tasks: '%s' is not a list of passkey, niah_single_1..3, "
                        "niah_multikey_1..3, niah_multivalue, niah_multiquery, vt", task_list);
    if (!n_files || !out_path)
        return cli_fail("trace: give at least one corpus (-f) and the output (-o)");
    if (end <= start)
        return cli_fail("trace: --end must be larger than --start");
    if (n_tasks > 0 && seq_len < 256)
        return cli_fail("trace: --tasks needs --seq-len of at least 256");

    int status = 1;
    kvp_ctx *ctx = NULL;
    int32_t *all = NULL;
    size_t n_all = 0;
    struct kvp_trace_writer w = {0};
    struct kvp_err err = {0};
    kvp_model *m = cli_open_model(&mo);
    if (!m)
        return 1;
    if (n_tasks > 0) {
        status = record_tasks(m, &mo, files, n_files, start, end, tasks, n_tasks, seed, seq_len,
                              max_seq, dense_layers, out_path);
        kvp_model_close(m);
        return status;
    }
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
    printf("wrote %s: %ld sequences of %ld tokens (%zu corpus tokens), layers %ld..%d\n", out_path,
           n_seq, seq_len, n_all, dense_layers, w.first_layer + w.n_layers - 1);
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
