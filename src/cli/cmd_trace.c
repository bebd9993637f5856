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

/* The command line. */
struct trace_opts {
    struct cli_model_opts mo;
    const char *files[64];
    int n_files;
    const char *out_path;
    long seq_len, max_seq, dense_layers, seed;
    double start, end;
    int tasks[64], n_tasks;
};

/* Parse argv into o. Returns 0, 1 after printing an error, or 2 after printing the help. */
static int parse_args(struct trace_opts *o, int argc, char **argv)
{
    const char *task_list = NULL;
    const struct cli_flag flags[] = {
        CLI_LIST("-f|--file", o->files, &o->n_files, 64),
        CLI_STR("-o|--output", &o->out_path),
        CLI_INT("--seq-len", 2, 1 << 20, &o->seq_len, NULL),
        CLI_INT("--max-seq", 1, 1 << 20, &o->max_seq, "a positive count"),
        CLI_INT("--dense-layers", 0, 1024, &o->dense_layers, "a layer count"),
        CLI_FLOAT("--start", 0.0, 1.0, &o->start, "a fraction in 0..1"),
        CLI_FLOAT("--end", 0.0, 1.0, &o->end, "a fraction in 0..1"),
        CLI_STR("--tasks", &task_list),
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &o->seed, "a non-negative integer"),
        {0},
    };
    const struct cli_command cmd = {.name = "trace", .mo = &o->mo, .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc;
    if (task_list && !(o->n_tasks = parse_tasks(task_list, o->tasks, 64)))
        return cli_fail("--tasks: '%s' is not a list of passkey, niah_single_1..3, "
                        "niah_multikey_1..3, niah_multivalue, niah_multiquery, vt",
                        task_list);
    if (!o->n_files || !o->out_path)
        return cli_fail("trace: give at least one corpus (-f) and the output (-o)");
    if (o->end <= o->start)
        return cli_fail("trace: --end must be larger than --start");
    if (o->n_tasks > 0 && o->seq_len < 256)
        return cli_fail("trace: --tasks needs --seq-len of at least 256");
    return 0;
}

/* A context of --seq-len tokens and the trace file of n_seq sequences open on it. Returns 0, or
 * 1 after printing the error. */
static int open_trace(kvp_model *m, const struct trace_opts *o, long n_seq, kvp_ctx **ctx,
                      struct kvp_trace_writer *w)
{
    struct kvp_err err = {0};
    if (!(*ctx = cli_open_ctx(m, &o->mo, o->seq_len)))
        return 1;
    if (kvp_trace_open(w, o->out_path, m, (int)o->dense_layers, 16, (int)o->seq_len, (int)n_seq,
                       &err) < 0)
        return cli_fail_err(&err);
    return 0;
}

/* End the progress line and close the trace file. Returns 0, or 1 after printing the error. */
static int close_trace(struct kvp_trace_writer *w, bool tty)
{
    struct kvp_err err = {0};
    if (tty)
        fputc('\n', stderr);
    if (kvp_trace_close(w, &err) < 0)
        return cli_fail_err(&err);
    return 0;
}

/* After a failure: the trace file, if still open, is closed and removed. */
static void discard_trace(struct kvp_trace_writer *w, const char *path)
{
    if (w->f) {
        kvp_trace_close(w, NULL);
        remove(path);
    }
}

/* Prompt i of --tasks and its answer into seq (at most --seq-len tokens; the answer cut to fit).
 * Returns the token count, or 0 after printing the error. */
static size_t task_sequence(kvp_model *m, const struct trace_opts *o, const struct kvp_corpus *c,
                            long i, int32_t *seq)
{
    /* answers are a few tokens; 64 leaves room for the longest (multi-value lists) */
    struct kvp_task_req req = {
        .task = o->tasks[i % o->n_tasks],
        .seed = kvp_task_seed((uint64_t)o->seed, (uint64_t)i), /* training range */
        .target_tokens = (int)o->seq_len - 64,
        .depth = -1.0f,
        .count = kvp_task_eval_count_tokens,
        .ud = m,
    };
    struct kvp_task_text tt;
    struct kvp_err err = {0};
    if (kvp_task_render_eval(c, &req, &tt, &err) < 0) {
        cli_fail("trace: %s: %s", kvp_task_name(req.task), err.msg);
        return 0;
    }
    size_t np = 0, na = 0;
    int32_t *p = cli_tokenize(m, tt.prompt, strlen(tt.prompt), true, &np);
    int32_t *an = p ? cli_tokenize(m, tt.answer, strlen(tt.answer), false, &na) : NULL;
    kvp_task_text_free(&tt);
    if (!p || !an) {
        free(p);
        return 0;
    }
    if (np + na > (size_t)o->seq_len)
        na = (size_t)o->seq_len - np; /* np fits by construction (target_tokens) */
    memcpy(seq, p, np * sizeof(int32_t));
    memcpy(seq + np, an, na * sizeof(int32_t));
    free(p);
    free(an);
    return np + na;
}

/* --tasks: one retrieval prompt and its answer per sequence, the corpora as filler. */
static int record_tasks(kvp_model *m, const struct trace_opts *o)
{
    int status = 1;
    char *raw = NULL;
    size_t len = 0;
    struct kvp_corpus *c = NULL;
    kvp_ctx *ctx = NULL;
    int32_t *seq = NULL;
    struct kvp_trace_writer w = {0};
    struct kvp_err err = {0};
    if (kvp_corpus_read(o->files, o->n_files, &raw, &len, &err) < 0) {
        cli_fail("trace: %s", err.msg);
        return 1;
    }
    size_t a = line_start(raw, len, o->start), b = line_start(raw, len, o->end);
    if (kvp_corpus_init(&c, raw + a, b - a, NULL, 0.0, &err) < 0) {
        cli_fail("trace: filler: %s", err.msg);
        goto out;
    }
    seq = malloc((size_t)o->seq_len * sizeof(int32_t));
    if (!seq) {
        cli_fail("out of memory");
        goto out;
    }
    if (open_trace(m, o, o->max_seq, &ctx, &w))
        goto out;
    bool tty = isatty(2);
    long n_tok = 0;
    for (long i = 0; i < o->max_seq; i++) {
        size_t n = task_sequence(m, o, c, i, seq);
        if (n == 0)
            goto out;
        if (kvp_trace_record(&w, ctx, seq, (int)n, &err) < 0) {
            cli_fail_err(&err);
            goto out;
        }
        n_tok += (long)n;
        if (tty)
            fprintf(stderr, "\rtrace: %ld/%ld prompts", i + 1, o->max_seq);
    }
    if (close_trace(&w, tty))
        goto out;
    printf("wrote %s: %ld retrieval prompts with answers (%ld tokens), layers %ld..%d\n",
           o->out_path, o->max_seq, n_tok, o->dense_layers, w.first_layer + w.n_layers - 1);
    status = 0;
out:
    discard_trace(&w, o->out_path);
    free(seq);
    kvp_ctx_free(ctx);
    kvp_corpus_free(c);
    free(raw);
    return status;
}

/* The tokens of every corpus (its --start..--end range), one after the other. */
struct corpus_tokens {
    int32_t *all;
    size_t n_all;
    size_t *end; /* per corpus: where its tokens end in all */
};

/* Tokenize the corpora of o into t. Returns 0, or 1 after printing the error (t is freed by
 * the caller either way). */
static int tokenize_corpora(const kvp_model *m, const struct trace_opts *o, struct corpus_tokens *t)
{
    t->end = calloc((size_t)o->n_files, sizeof(size_t));
    if (!t->end)
        return cli_fail("out of memory");
    for (int f = 0; f < o->n_files; f++) {
        size_t len;
        char *text = cli_read_file(o->files[f], &len);
        if (!text)
            return 1;
        size_t a = line_start(text, len, o->start), b = line_start(text, len, o->end);
        size_t n = 0;
        int32_t *ids = cli_tokenize(m, text + a, b - a, false, &n);
        free(text);
        if (!ids)
            return 1;
        int32_t *grown = realloc(t->all, (t->n_all + n + 1) * sizeof(int32_t));
        if (!grown) {
            free(ids);
            return cli_fail("out of memory");
        }
        t->all = grown;
        memcpy(t->all + t->n_all, ids, n * sizeof(int32_t));
        t->n_all += n;
        t->end[f] = t->n_all;
        free(ids);
    }
    return 0;
}

/* Sequences the corpora hold (at most --max-seq): BOS + seq_len - 1 corpus tokens each, never
 * crossing a corpus boundary. */
static long count_sequences(const struct trace_opts *o, const struct corpus_tokens *t)
{
    long n_seq = 0;
    size_t from = 0;
    for (int f = 0; f < o->n_files; f++) {
        for (size_t p = from; p + (size_t)o->seq_len - 1 <= t->end[f] && n_seq < o->max_seq;
             p += (size_t)o->seq_len - 1)
            n_seq++;
        from = t->end[f];
    }
    return n_seq;
}

/* Decode and record the n_seq sequences of the corpora (count_sequences' order). Returns 0, or
 * 1 after printing the error. */
static int record_sequences(kvp_model *m, kvp_ctx *ctx, struct kvp_trace_writer *w,
                            const struct trace_opts *o, const struct corpus_tokens *t, long n_seq)
{
    int32_t *seq = malloc((size_t)o->seq_len * sizeof(int32_t));
    if (!seq)
        return cli_fail("out of memory");
    struct kvp_err err = {0};
    int bos = kvp_token_bos(m);
    bool tty = isatty(2);
    long done = 0;
    size_t from = 0;
    for (int f = 0; f < o->n_files && done < n_seq; f++) {
        for (size_t p = from; p + (size_t)o->seq_len - 1 <= t->end[f] && done < n_seq;
             p += (size_t)o->seq_len - 1) {
            seq[0] = bos;
            memcpy(seq + 1, t->all + p, (size_t)(o->seq_len - 1) * sizeof(int32_t));
            if (kvp_trace_record(w, ctx, seq, (int)o->seq_len, &err) < 0) {
                free(seq);
                return cli_fail_err(&err);
            }
            done++;
            if (tty)
                fprintf(stderr, "\rtrace: %ld/%ld sequences", done, n_seq);
        }
        from = t->end[f];
    }
    free(seq);
    return close_trace(w, tty);
}

/* The corpora as text: sequences of --seq-len tokens. */
static int record_corpora(kvp_model *m, const struct trace_opts *o)
{
    int status = 1;
    kvp_ctx *ctx = NULL;
    struct kvp_trace_writer w = {0};
    struct corpus_tokens t = {0};
    if (tokenize_corpora(m, o, &t))
        goto out;
    long n_seq = count_sequences(o, &t);
    if (n_seq == 0) {
        cli_fail("trace: the corpora hold fewer than %ld tokens: nothing to record",
                 o->seq_len - 1);
        goto out;
    }
    if (open_trace(m, o, n_seq, &ctx, &w) || record_sequences(m, ctx, &w, o, &t, n_seq))
        goto out;
    printf("wrote %s: %ld sequences of %ld tokens (%zu corpus tokens), layers %ld..%d\n",
           o->out_path, n_seq, o->seq_len, t.n_all, o->dense_layers,
           w.first_layer + w.n_layers - 1);
    status = 0;
out:
    discard_trace(&w, o->out_path);
    free(t.end);
    free(t.all);
    kvp_ctx_free(ctx);
    return status;
}

int cmd_trace(int argc, char **argv)
{
    struct trace_opts o = {
        .seq_len = 512, .max_seq = 32, .dense_layers = 2, .seed = 1, .start = 0.0, .end = 1.0};
    int rc = parse_args(&o, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    kvp_model *m = cli_open_model(&o.mo);
    int status = !m ? 1 : o.n_tasks > 0 ? record_tasks(m, &o) : record_corpora(m, &o);
    kvp_model_close(m);
    return status;
}
