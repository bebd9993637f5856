/*
 * `kvpred eval --task T`: RULER-style retrieval accuracy (docs/tasks.md §1, the needle
 * grid of §2.3) for every policy × budget. The prompts come from the task generators (src/tasks)
 * with the Paul Graham essays as filler, sized in tokens of the model under test; every policy sees
 * the very same prompts. The pass key hides in its own noise line unless --filler names a text,
 * then in that text (prose the model never trained on tests that retrieval does not hinge on the
 * filler).
 *
 * The protocol (prompts, seeds, greedy decoding, scoring, per-cell means) is the library's
 * (src/eval/task_eval.h); this file parses the flags, opens the filler, model and context and
 * prints the table, the JSON lines and the figures. The runs whose policy neither evicts nor
 * decides at prompt time (full, oracle, quest, qpredictor, predictor) share one prefill of each
 * prompt and evaluate only its last 32 to 32 + batch tokens each, with answers bit for bit those
 * of their own whole prefill (task_eval.h); --no-shared-fill gives every run its own, for
 * checking.
 *
 * Figures (--heatmap DIR, drawn by eval/heatmap.h): DIR/TASK_POLICY_BUDGET.png per policy ×
 * budget and DIR/TASK_all.png with all of them side by side, a row per policy.
 *
 * JSON (--json: one object per line per (task, policy, budget, length, depth) on stdout; the
 * table goes to stderr):
 *   task            string  passkey, niah_single, niah_multikey, niah_multivalue,
 *                           niah_multiquery or vt
 *   generator       string  the trainer's task it uses (niah_single_2, niah_multikey_1, ...)
 *   model           string  model name
 *   filler          string  the filler path
 *   policy, budget  string  as given ("all" for full)
 *   budget_ratio    number  the ratio when the budget was given as one, else 0
 *   budget_tokens   number  the mean budget in tokens per (layer, KV head) at the prompts'
 *                           lengths (the library's one rule, kvp_budget_tokens); 0 for full
 *   read_tokens     number  the mean tokens a decode step read per compressed (layer, KV head)
 *                           through the policy's selections (full attention: the cached tokens)
 *   length          int     the target length L in tokens
 *   depth           int     needle depth in percent
 *   samples         int     prompts in the cell
 *   seed            int     S
 *   max_new_tokens  int     the task's answer length
 *   prompt_tokens   number  mean prompt tokens (BOS included)
 *   accuracy        number  mean string_match_all in [0, 1]
 *   exact           number  fraction of samples with every reference found
 *   seconds         number  wall time of the cell; a run with a shared fill: without the
 *                           shared part (fill_seconds)
 *   shared_fill     bool    the run decoded from a fill of each prompt shared with other runs
 *   fill_seconds    number  shared_fill: wall time of the cell's shared fills (the prompts
 *                           up to a pass boundary 32 tokens or more before their end; the same
 *                           for every run sharing them, so seconds + fill_seconds is about the
 *                           cost of the run alone); else 0
 *   answer_fnv      string  FNV-1a 64 (hex) over every sample's answer and its last logits:
 *                           equal in two cells when their answers are bit for bit equal
 *   kv_resident_bytes number mean KV bytes (K and V, all layers) in the physical blocks the
 *                           cache held after the answer (kvp_ctx_kv_bytes)
 *   kv_kept_bytes   number  mean bytes of the live tokens themselves
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/eval_opts.h"
#include "eval/heatmap.h"
#include "eval/task_eval.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"

#define MAX_DEPTHS 64

static void help(void)
{
    printf("usage: kvpred eval -m MODEL --task T [--lengths L,...] [--depths D,...]\n"
           "                   [--samples N] [--seed S] [--policy P,...] [--budget B,...]\n"
           "                   [--json] [--heatmap DIR] [--filler PATH] [options]\n\n"
           "Retrieval accuracy of every policy x budget on RULER-style prompts (Paul Graham\n"
           "essays as filler), sized in the model's tokens, with the needle at each depth.\n\n%s"
           "  --task T           passkey, niah_single, niah_multikey, niah_multivalue,\n"
           "                     niah_multiquery or vt\n"
           "  --lengths LIST     prompt lengths in tokens (default 512,1024,2048)\n"
           "  --depths LIST      needle depths in percent (default 0,25,50,75,100)\n"
           "  --samples N        prompts per (length, depth) (default 4)\n"
           "  --seed S           generation seed (default 42); policies use --policy-seed\n"
           "  --policy LIST      comma-separated policies (default full); known: %s\n"
           "  --budget LIST      tokens per layer and KV head or ratios of the prompt (1/16)\n"
           "                     (default 1/8)\n"
           "  --json             one JSON object per (policy, budget, length, depth) on stdout\n"
           "  --heatmap DIR      figures in DIR (created if missing): TASK_POLICY_BUDGET.png\n"
           "                     per policy x budget ('/' and '.' of the budget as '_'), the\n"
           "                     accuracy in %% of each depth row x length column, titled,\n"
           "                     labelled and with a colour legend; TASK_all.png with every\n"
           "                     policy x budget side by side (a row per policy)\n"
           "  --filler PATH      filler text file or directory (default\n"
           "                     $KVP_SHARED_DIR/data/pg_essays; passkey: its noise line,\n"
           "                     or this text, the needle on a line of its own, when given)\n"
           "  --no-shared-fill   every run prefills every prompt itself; by default the runs\n"
           "                     whose policy neither evicts nor decides at prompt time (full,\n"
           "                     oracle, quest, qpredictor, predictor) share one prefill of\n"
           "                     each prompt up to a pass boundary (-b) 32 or more tokens\n"
           "                     before its end and each evaluate the rest, with the very\n"
           "                     same answers\n"
           "  --questions N      several questions on one document instead (see\n"
           "                     kvpred eval --task passkey --questions 4 --help)\n"
           "%s%s",
           cli_model_flags_help, cli_policy_names(), cli_prefill_flags_help,
           cli_policy_flags_help());
}

struct task_opts {
    struct cli_eval_opts e;
    long depths[MAX_DEPTHS];
    int n_depth;
    long samples;
    const char *heatmap;
    bool no_shared_fill;
};

static int parse_args(struct task_opts *o, int argc, char **argv)
{
    const char *depths = NULL;
    const struct cli_flag flags[] = {
        CLI_EVAL_FLAGS(&o->e),
        CLI_STR("--depths", &depths),
        CLI_INT("--samples", 1, 1 << 20, &o->samples, "a positive count"),
        CLI_STR("--heatmap", &o->heatmap),
        CLI_BOOL("--no-shared-fill", &o->no_shared_fill),
        {0},
    };
    int rc = cli_eval_parse(&o->e, flags, help, argc, argv);
    if (rc)
        return rc;
    if (depths && (o->n_depth = cli_parse_int_list(depths, 0, 100, o->depths, MAX_DEPTHS)) < 0)
        return cli_fail("--depths: '%s' is not a list of percentages in 0..100", depths);
    if (o->e.ti < 0)
        return cli_fail("eval: --task '%s' is not one of passkey, niah_single, niah_multikey, "
                        "niah_multivalue, niah_multiquery, vt",
                        o->e.task ? o->e.task : "");
    if (cli_prefill_check(&o->e.pf))
        return 1;
    return cli_eval_grid(&o->e);
}

/* ---- output -------------------------------------------------------------------------------- */

static void json_cell(const struct task_opts *o, const char *model_name,
                      const struct kvp_task_eval_run *r, int li, int di)
{
    const struct kvp_task_eval_kind *kind = kvp_task_eval_kind(o->e.ti);
    const struct kvp_task_eval_cell *cell = &r->cells[li * o->n_depth + di];
    cJSON *j = cli_eval_json_cell(&o->e, model_name, &r->pp, r->label, cell->budget_tokens);
    if (!j)
        return;
    cJSON_AddNumberToObject(j, "read_tokens", cell->read_tokens);
    cJSON_AddNumberToObject(j, "length", (double)o->e.lengths[li]);
    cJSON_AddNumberToObject(j, "depth", (double)o->depths[di]);
    cJSON_AddNumberToObject(j, "samples", (double)o->samples);
    cJSON_AddNumberToObject(j, "seed", (double)o->e.seed);
    cJSON_AddNumberToObject(j, "max_new_tokens", kind->max_new);
    cJSON_AddNumberToObject(j, "prompt_tokens", cell->prompt_tokens);
    cJSON_AddNumberToObject(j, "accuracy", cell->accuracy);
    cJSON_AddNumberToObject(j, "exact", cell->exact);
    cJSON_AddNumberToObject(j, "seconds", cell->seconds);
    cJSON_AddBoolToObject(j, "shared_fill", r->shared_fill);
    cJSON_AddNumberToObject(j, "fill_seconds", cell->fill_seconds);
    char fnv[17];
    snprintf(fnv, sizeof(fnv), "%016llx", (unsigned long long)cell->answer_fnv);
    cJSON_AddStringToObject(j, "answer_fnv", fnv);
    /* KV memory the policy really held once the answer was decoded (means over the samples):
     * bytes of the physical blocks with live tokens, and of the live tokens themselves. A policy
     * that only reads a subset (quest, or CateKV's adaptive heads) holds the whole cache. */
    cJSON_AddNumberToObject(j, "kv_resident_bytes", cell->kv_resident_bytes);
    cJSON_AddNumberToObject(j, "kv_kept_bytes", cell->kv_kept_bytes);
    /* the prompts' attention: the settings, and density and times over the whole grid */
    cli_prefill_json(j, &o->e.pf, &o->e.pf_report);
    cli_eval_json_print(j);
}

/* The panel title of a run: "streaming, budget 1/4", "full, all tokens". */
static void run_title(const struct kvp_task_eval_run *r, char *buf, size_t cap)
{
    if (!strcmp(r->pp.name, "full"))
        snprintf(buf, cap, "full, all tokens");
    else
        snprintf(buf, cap, "%s, budget %s", r->pp.name, r->label);
}

/* Write DIR/NAME.png with the given panels, cols to a row. */
static int write_figure(const struct task_opts *o, const char *name, const char *title,
                        const char *subtitle, const struct kvp_heatmap_panel *panels,
                        int n_panels, int cols)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.png", o->heatmap, name);
    struct kvp_heatmap hm = {.title = title,
                             .subtitle = subtitle,
                             .lengths = o->e.lengths,
                             .depths = o->depths,
                             .n_len = o->e.n_len,
                             .n_depth = o->n_depth,
                             .panels = panels,
                             .n_panels = n_panels,
                             .cols = cols};
    struct kvp_err err = {0};
    return kvp_heatmap_write_png(&hm, path, &err) < 0 ? cli_fail_err(&err) : 0;
}

#define TITLE_CAP 160

/* DIR/TASK_POLICY_BUDGET.png for every run (budget '/' and '.' written as '_'), then
 * DIR/TASK_all.png with every run side by side: a row per policy, a column per budget. */
static int write_heatmaps(const struct task_opts *o, const struct kvp_task_eval_run *runs, int n_runs,
                          const char *model_name)
{
    const char *task = kvp_task_eval_kind(o->e.ti)->name, *file = o->e.mo.model_path;
    int cells = o->e.n_len * o->n_depth, cols = 1, status = 1;
    for (int i = 0; i < o->e.grid.n_policies; i++)
        cols = cli_grid_budgets(&o->e.grid, i) > cols ? cli_grid_budgets(&o->e.grid, i) : cols;
    double *acc = malloc((size_t)n_runs * (size_t)cells * sizeof(double));
    char *titles = malloc((size_t)n_runs * TITLE_CAP);
    struct kvp_heatmap_panel *grid =
        calloc((size_t)o->e.grid.n_policies * (size_t)cols, sizeof(*grid));
    if (!acc || !titles || !grid) {
        cli_fail("heatmap: out of memory");
        goto out;
    }
    char subtitle[1024], title[TITLE_CAP + 64], name[256];
    const char *base = file && strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    snprintf(subtitle, sizeof(subtitle), "model %s%s%s%s, %ld samples per cell, seed %ld",
             model_name, base ? " (" : "", base ? base : "", base ? ")" : "", o->samples,
             o->e.seed);
    for (int k = 0, i = 0; i < o->e.grid.n_policies; i++) {
        for (int j = 0; j < cli_grid_budgets(&o->e.grid, i); j++, k++) {
            double *a = acc + (size_t)k * (size_t)cells;
            for (int c = 0; c < cells; c++)
                a[c] = runs[k].cells[c].accuracy;
            run_title(&runs[k], titles + (size_t)k * TITLE_CAP, TITLE_CAP);
            grid[i * cols + j] = (struct kvp_heatmap_panel){titles + (size_t)k * TITLE_CAP, a};
            struct kvp_heatmap_panel one = {NULL, a};
            char label[64];
            snprintf(label, sizeof(label), "%s", runs[k].label);
            for (char *p = label; *p; p++)
                if (*p == '/' || *p == '.')
                    *p = '_';
            snprintf(name, sizeof(name), "%s_%s_%s", task, runs[k].pp.name, label);
            snprintf(title, sizeof(title), "%s: %s", task, titles + (size_t)k * TITLE_CAP);
            if (write_figure(o, name, title, subtitle, &one, 1, 1))
                goto out;
        }
    }
    snprintf(name, sizeof(name), "%s_all", task);
    snprintf(title, sizeof(title), "%s: every policy and budget", task);
    status = write_figure(o, name, title, subtitle, grid, o->e.grid.n_policies * cols, cols);
out:
    free(grid);
    free(titles);
    free(acc);
    return status;
}

static void print_table(const struct task_opts *o, const struct kvp_task_eval_run *runs, int n_runs,
                        const char *model_name)
{
    FILE *f = o->e.json ? stderr : stdout;
    fprintf(f, "# %s: %s, %ld samples per (length, depth) x %d depths, seed %ld\n", model_name,
            kvp_task_eval_kind(o->e.ti)->name, o->samples, o->n_depth, o->e.seed);
    fprintf(f, "%-16s %-12s %7s %7s %9s %12s\n", "task", "policy", "budget", "length",
            "accuracy", "KV resident");
    for (int k = 0; k < n_runs; k++)
        for (int li = 0; li < o->e.n_len; li++) {
            double s = 0.0, res = 0.0;
            for (int di = 0; di < o->n_depth; di++) {
                s += runs[k].cells[li * o->n_depth + di].accuracy;
                res += runs[k].cells[li * o->n_depth + di].kv_resident_bytes;
            }
            double n = (double)o->n_depth;
            fprintf(f, "%-16s %-12s %7s %7ld %8.1f%% %9.0f KiB\n",
                    kvp_task_eval_kind(o->e.ti)->name, runs[k].pp.name, runs[k].label,
                    o->e.lengths[li], 100.0 * s / n, res / n / 1024.0);
        }
    fflush(f);
}

/* ---- the command --------------------------------------------------------------------------- */

static void progress(void *ud, long done, long total, long length, long depth)
{
    fprintf(stderr, "\r\033[Keval %s [%ld/%ld] length %ld depth %ld%%", (const char *)ud, done,
            total, length, depth);
}

/* Expand policies × budgets into runs (full once). Returns the count, or -1 out of memory. */
static int make_runs(const struct task_opts *o, struct kvp_task_eval_run **out)
{
    int n = 0, cells = o->e.n_len * o->n_depth;
    const struct cli_grid *g = &o->e.grid;
    struct kvp_task_eval_run *runs =
        calloc((size_t)g->n_policies * (size_t)g->n_budgets, sizeof(*runs));
    if (!runs)
        return -1;
    for (int i = 0; i < g->n_policies; i++) {
        for (int k = 0; k < cli_grid_budgets(g, i); k++) {
            struct kvp_task_eval_run *r = &runs[n++];
            r->label = cli_grid_cell(g, i, k, &o->e.pp, &r->pp);
            r->cells = calloc((size_t)cells, sizeof(*r->cells));
            if (!r->cells) {
                *out = runs;
                return -(n + 1);
            }
        }
    }
    *out = runs;
    return n;
}

int cmd_eval_tasks(int argc, char **argv)
{
    struct task_opts o = {.e = CLI_EVAL_OPTS_INIT, .samples = 4};
    static const long def_len[] = {512, 1024, 2048}, def_depth[] = {0, 25, 50, 75, 100};
    o.e.n_len = 3;
    memcpy(o.e.lengths, def_len, sizeof(def_len));
    o.n_depth = 5;
    memcpy(o.depths, def_depth, sizeof(def_depth));
    int rc = parse_args(&o, argc, argv);
    if (rc) {
        cli_grid_free(&o.e.grid);
        return rc == 2 ? 0 : 1;
    }
    int status = 1, n_runs = 0;
    struct kvp_task_eval_run *runs = NULL;
    struct cli_eval_setup su = {0};
    if (o.heatmap) {
        struct stat st;
        if (stat(o.heatmap, &st) != 0 && mkdir(o.heatmap, 0777) != 0) {
            cli_fail("--heatmap: cannot create directory '%s'", o.heatmap);
            goto out;
        }
    }
    if (cli_eval_open(&o.e, &su))
        goto out;
    if ((n_runs = make_runs(&o, &runs)) < 0) {
        n_runs = -n_runs - 1;
        cli_fail("out of memory");
        goto out;
    }
    const struct kvp_task_eval_grid g = {.ti = o.e.ti,
                                         .lengths = o.e.lengths,
                                         .depths = o.depths,
                                         .n_len = o.e.n_len,
                                         .n_depth = o.n_depth,
                                         .samples = o.samples,
                                         .seed = (uint64_t)o.e.seed,
                                         .own_prefill = o.no_shared_fill};
    if (cli_eval_open_ctx(&o.e, &su, kvp_task_eval_ctx_tokens(&g)))
        goto out;
    struct kvp_err err = {0};
    bool tty = isatty(STDERR_FILENO) != 0;
    rc = kvp_task_eval_run_grid(su.ctx, su.m, su.c, &g, runs, n_runs, tty ? progress : NULL,
                                (void *)kvp_task_eval_kind(o.e.ti)->name, &err);
    if (cli_eval_finish_run(&o.e, &su, tty, rc, &err))
        goto out;
    print_table(&o, runs, n_runs, su.info.name);
    for (int k = 0; o.e.json && k < n_runs; k++)
        for (int li = 0; li < o.e.n_len; li++)
            for (int di = 0; di < o.n_depth; di++)
                json_cell(&o, su.info.name, &runs[k], li, di);
    if (o.heatmap && write_heatmaps(&o, runs, n_runs, su.info.name))
        goto out;
    fflush(stdout);
    status = 0;
out:
    for (int k = 0; runs && k < n_runs; k++)
        free(runs[k].cells);
    free(runs);
    cli_eval_close(&o.e, &su);
    return status;
}
