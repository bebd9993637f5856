/*
 * `kvpred eval --task T --questions N`: several questions on one document, accuracy per question
 * index for every policy x budget (the protocol is the library's, src/eval/multi_question.h; this
 * file parses the flags, opens the filler, model and context, and prints the table and the JSON
 * lines).
 *
 * JSON (--json: one object per line per (task, policy, budget, length, question index) on stdout;
 * the table goes to stderr):
 *   task, generator, model, filler, policy, budget, budget_ratio, budget_tokens, seed,
 *   max_new_tokens     as in `eval --task` (cmd_eval_tasks.c)
 *   length             int     L: the document and its longest question fit in L tokens
 *   questions          int     N, questions per document
 *   question           int     the question's index, 1..N (the order they were asked in)
 *   documents          int     documents in the cell
 *   follow_up          string  "keep" (the document prefilled once, the cache truncated back to
 *                              it before each question) or "recompute" (document and question
 *                              prefilled anew for every question)
 *   server_follow_up   string  what `kvpred serve` does between requests for this policy:
 *                              "keep" (it reuses the cached document) or "recompute"
 *   document_tokens    number  mean document tokens (BOS included)
 *   prefill_tokens     number  mean tokens prefilled for the question (keep: the question alone,
 *                              the document's prefill is counted once, in question 1's seconds)
 *   depth              number  mean depth of the asked needle (fraction of the haystack)
 *   read_tokens        number  mean tokens a decode step of the answer read per compressed
 *                              (layer, KV head); full attention: the cached tokens
 *   accuracy, exact    number  mean string_match_all, share of exact answers
 *   kv_resident_bytes, kv_kept_bytes  number  KV bytes after the answer (means)
 *   seconds            number  wall time of the cell
 *   answers            array   each document's decoded answer (strings, document order)
 *   references         array   each document's reference (the asked needle's value)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/eval_opts.h"
#include "eval/multi_question.h"
#include "eval/task_eval.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"

static void help(void)
{
    printf("usage: kvpred eval -m MODEL --task T --questions N [--lengths L,...] [--samples D]\n"
           "                   [--follow-up keep|recompute] [--seed S] [--policy P,...]\n"
           "                   [--budget B,...] [--json] [--filler PATH] [options]\n\n"
           "Several questions on one document: each document holds N needles with different\n"
           "keys at spread depths and is asked N questions in turn, each about another needle;\n"
           "accuracy per question index for every policy x budget.\n\n%s"
           "  --task T           passkey, niah_single or niah_multikey (N pass keys named by\n"
           "                     colour; N niah_single needles; the same plus 3 distractors)\n"
           "  --questions N      questions per document, 1..%d\n"
           "  --lengths LIST     document + longest question in tokens (default 2048)\n"
           "  --samples D        documents per length (default 4)\n"
           "  --follow-up MODE   keep: prefill the document once and truncate the cache back to\n"
           "                     it before each question (an evicting policy's evictions stay);\n"
           "                     recompute: prefill document + question for every question, as\n"
           "                     `kvpred serve` does for the policies it keeps no prefix for\n"
           "                     (default keep)\n"
           "  --seed S           generation seed (default 42); policies use --policy-seed\n"
           "  --policy LIST      comma-separated policies (default full); known: %s\n"
           "  --budget LIST      tokens per layer and KV head or ratios of the prompt (1/16)\n"
           "                     (default 1/8)\n"
           "  --json             one JSON object per (policy, budget, length, question) on\n"
           "                     stdout, with every document's answer\n"
           "  --filler PATH      filler text file or directory (default\n"
           "                     $KVP_SHARED_DIR/data/pg_essays; passkey: its noise line, or\n"
           "                     this text when given)\n%s%s",
           cli_model_flags_help, KVP_TASK_MAX_QUESTIONS, cli_policy_names(),
           cli_prefill_flags_help, cli_policy_flags_help());
}

struct multi_opts {
    struct cli_eval_opts e;
    long docs, questions;
    int follow_up;
};

static int parse_args(struct multi_opts *o, int argc, char **argv)
{
    const char *follow = "keep";
    const struct cli_flag flags[] = {
        CLI_EVAL_FLAGS(&o->e),
        CLI_INT("--questions", 1, KVP_TASK_MAX_QUESTIONS, &o->questions, "a count in 1..8"),
        CLI_INT("--samples", 1, 1 << 20, &o->docs, "a positive count"),
        CLI_STR("--follow-up", &follow),
        {0},
    };
    int rc = cli_eval_parse(&o->e, flags, help, argc, argv);
    if (rc)
        return rc;
    if (cli_prefill_check(&o->e.pf))
        return 1;
    if ((o->follow_up = kvp_mq_follow_up_by_name(follow)) < 0)
        return cli_fail("--follow-up: '%s' is neither keep nor recompute", follow);
    const char *task = o->e.task;
    if (!task || (strcmp(task, "passkey") && strcmp(task, "niah_single") &&
                  strcmp(task, "niah_multikey")))
        return cli_fail("eval --questions: --task '%s' is not one of passkey, niah_single, "
                        "niah_multikey", task ? task : "");
    return cli_eval_grid(&o->e);
}

static void print_table(const struct multi_opts *o, const struct kvp_mq_run *runs, int n_runs,
                        const char *model_name)
{
    FILE *f = o->e.json ? stderr : stdout;
    int nq = (int)o->questions;
    fprintf(f, "# %s: %s, %ld documents x %d questions, follow-up %s, seed %ld\n", model_name,
            kvp_task_eval_kind(o->e.ti)->name, o->docs, nq, kvp_mq_follow_up_name(o->follow_up),
            o->e.seed);
    fprintf(f, "%-14s %-11s %6s %6s %6s", "task", "policy", "budget", "length", "server");
    for (int q = 0; q < nq; q++)
        fprintf(f, "     q%d", q + 1);
    fprintf(f, " %9s\n", "read");
    for (int k = 0; k < n_runs; k++)
        for (int li = 0; li < o->e.n_len; li++) {
            const struct kvp_mq_cell *cells = &runs[k].cells[li * nq];
            fprintf(f, "%-14s %-11s %6s %6ld %6s", kvp_task_eval_kind(o->e.ti)->name,
                    runs[k].pp.name, runs[k].label, o->e.lengths[li],
                    runs[k].server_keeps ? "keep" : "recomp");
            double read = 0.0;
            for (int q = 0; q < nq; q++) {
                fprintf(f, " %5.0f%%", 100.0 * cells[q].accuracy);
                read += cells[q].read_tokens / nq;
            }
            fprintf(f, " %9.0f\n", read);
        }
    fflush(f);
}

static void json_cell(const struct multi_opts *o, const char *model_name,
                      const struct kvp_mq_run *r, int li, int q, char (*refs)[48])
{
    const struct kvp_task_eval_kind *kind = kvp_task_eval_kind(o->e.ti);
    int nq = (int)o->questions;
    const struct kvp_mq_cell *cell = &r->cells[li * nq + q];
    cJSON *j = cli_eval_json_cell(&o->e, model_name, &r->pp, r->label, cell->budget_tokens);
    if (!j)
        return;
    cJSON_AddNumberToObject(j, "length", (double)o->e.lengths[li]);
    cJSON_AddNumberToObject(j, "questions", nq);
    cJSON_AddNumberToObject(j, "question", q + 1);
    cJSON_AddNumberToObject(j, "documents", (double)o->docs);
    cJSON_AddNumberToObject(j, "seed", (double)o->e.seed);
    cJSON_AddStringToObject(j, "follow_up", kvp_mq_follow_up_name(o->follow_up));
    cJSON_AddStringToObject(j, "server_follow_up", r->server_keeps ? "keep" : "recompute");
    cJSON_AddNumberToObject(j, "max_new_tokens", kind->max_new);
    cJSON_AddNumberToObject(j, "document_tokens", cell->document_tokens);
    cJSON_AddNumberToObject(j, "prefill_tokens", cell->prefill_tokens);
    cJSON_AddNumberToObject(j, "depth", cell->depth);
    cJSON_AddNumberToObject(j, "read_tokens", cell->read_tokens);
    cJSON_AddNumberToObject(j, "accuracy", cell->accuracy);
    cJSON_AddNumberToObject(j, "exact", cell->exact);
    cJSON_AddNumberToObject(j, "kv_resident_bytes", cell->kv_resident_bytes);
    cJSON_AddNumberToObject(j, "kv_kept_bytes", cell->kv_kept_bytes);
    cJSON_AddNumberToObject(j, "seconds", cell->seconds);
    cli_prefill_json(j, &o->e.pf, &o->e.pf_report);
    cJSON *ans = cJSON_AddArrayToObject(j, "answers");
    cJSON *ref = cJSON_AddArrayToObject(j, "references");
    for (long i = 0; ans && ref && i < o->docs; i++) {
        const char *p = r->preds + (((size_t)li * (size_t)o->docs + (size_t)i) * (size_t)nq +
                                    (size_t)q) * KVP_MQ_PRED_CAP;
        cJSON_AddItemToArray(ans, cJSON_CreateString(p));
        cJSON_AddItemToArray(ref, cJSON_CreateString(refs[((size_t)li * (size_t)o->docs +
                                                           (size_t)i) * (size_t)nq + (size_t)q]));
    }
    cli_eval_json_print(j);
}

static void progress(void *ud, long done, long total, long length)
{
    fprintf(stderr, "\r\033[Keval %s [%ld/%ld documents] length %ld", (const char *)ud, done,
            total, length);
}

/* The references of every (length, document, question), for the JSON lines: the documents are
 * made again (cheap next to decoding them). */
static char (*collect_refs(const struct multi_opts *o, const struct kvp_corpus *c,
                           const kvp_model *m))[48]
{
    int nq = (int)o->questions;
    char(*refs)[48] = calloc((size_t)o->e.n_len * (size_t)o->docs * (size_t)nq, sizeof(*refs));
    for (int li = 0; refs && li < o->e.n_len; li++)
        for (long i = 0; i < o->docs; i++) {
            struct kvp_mq_doc d;
            struct kvp_err err = {0};
            if (kvp_mq_doc_make(c, m, o->e.ti, (uint64_t)o->e.seed, i, o->e.lengths[li], nq, &d,
                                &err) < 0)
                continue;
            for (int q = 0; q < nq; q++)
                memcpy(refs[((size_t)li * (size_t)o->docs + (size_t)i) * (size_t)nq + (size_t)q],
                       d.text.ref[q], 48);
            kvp_mq_doc_free(&d);
        }
    return refs;
}

int cmd_eval_multi(int argc, char **argv)
{
    struct multi_opts o = {.e = CLI_EVAL_OPTS_INIT, .docs = 4};
    o.e.n_len = 1;
    o.e.lengths[0] = 2048;
    int rc = parse_args(&o, argc, argv);
    if (rc) {
        cli_grid_free(&o.e.grid);
        return rc == 2 ? 0 : 1;
    }
    int status = 1, n_runs = 0, nq = (int)o.questions;
    struct kvp_mq_run *runs = NULL;
    struct cli_eval_setup su = {0};
    char(*refs)[48] = NULL;
    if (o.questions < 1) {
        cli_fail("eval: --questions N is needed (1..%d)", KVP_TASK_MAX_QUESTIONS);
        goto out;
    }
    if (cli_eval_open(&o.e, &su))
        goto out;
    const struct cli_grid *gr = &o.e.grid;
    runs = calloc((size_t)gr->n_policies * (size_t)gr->n_budgets, sizeof(*runs));
    if (!runs) {
        cli_fail("out of memory");
        goto out;
    }
    size_t n_preds = (size_t)o.e.n_len * (size_t)o.docs * (size_t)nq;
    for (int i = 0; i < gr->n_policies; i++)
        for (int k = 0; k < cli_grid_budgets(gr, i); k++) {
            struct kvp_mq_run *r = &runs[n_runs++];
            r->label = cli_grid_cell(gr, i, k, &o.e.pp, &r->pp);
            r->cells = calloc((size_t)o.e.n_len * (size_t)nq, sizeof(*r->cells));
            r->preds = o.e.json ? calloc(n_preds, KVP_MQ_PRED_CAP) : NULL;
            if (!r->cells || (o.e.json && !r->preds)) {
                cli_fail("out of memory");
                goto out;
            }
        }
    const struct kvp_mq_grid g = {.ti = o.e.ti,
                                  .lengths = o.e.lengths,
                                  .n_len = o.e.n_len,
                                  .docs = o.docs,
                                  .n_questions = nq,
                                  .seed = (uint64_t)o.e.seed,
                                  .follow_up = o.follow_up};
    if (cli_eval_open_ctx(&o.e, &su, kvp_mq_ctx_tokens(&g)))
        goto out;
    struct kvp_err err = {0};
    bool tty = isatty(STDERR_FILENO) != 0;
    rc = kvp_mq_run_grid(su.ctx, su.m, su.c, &g, runs, n_runs, tty ? progress : NULL,
                         (void *)kvp_task_eval_kind(o.e.ti)->name, &err);
    if (cli_eval_finish_run(&o.e, &su, tty, rc, &err))
        goto out;
    print_table(&o, runs, n_runs, su.info.name);
    if (o.e.json) {
        if (!(refs = collect_refs(&o, su.c, su.m))) {
            cli_fail("out of memory");
            goto out;
        }
        for (int k = 0; k < n_runs; k++)
            for (int li = 0; li < o.e.n_len; li++)
                for (int q = 0; q < nq; q++)
                    json_cell(&o, su.info.name, &runs[k], li, q, refs);
    }
    fflush(stdout);
    status = 0;
out:
    for (int k = 0; runs && k < n_runs; k++) {
        free(runs[k].cells);
        free(runs[k].preds);
    }
    free(refs);
    free(runs);
    cli_eval_close(&o.e, &su);
    return status;
}
