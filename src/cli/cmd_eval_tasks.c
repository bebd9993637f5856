/*
 * `kvpred eval --task T`: RULER-style retrieval accuracy (tasks.md §1, the needle grid of §2.3)
 * for every policy × budget. The prompts come from the trainer's generators (train_data.c) with
 * the Paul Graham essays as filler, sized in tokens of the model under test; every policy sees
 * the very same prompts. The pass key hides in its own noise line unless --filler names a text,
 * then in that text (prose the model never trained on tests that retrieval does not hinge on
 * the filler).
 *
 * Protocol per cell (length L, depth d) and sample i: the prompt (instruction, haystack with the
 * answer needle(s) at fraction d of it, question, answer prefix) is the largest one whose
 * tokens, BOS included, fit in L; it is prefilled with the policy attached, then decoded
 * greedily for at most the task's answer length (passkey 16, niah 128, vt 30 tokens, RULER's
 * tokens_to_generate), stopping at EOS or at the first newline. The prediction is scored by
 * string_match_all (tasks.md §1.1; for passkey that is the exact-number match of §2.3). The
 * context holds L + answer length tokens. A budget ratio such as 1/16 resolves against the
 * prompt length.
 *
 * Seeds: sample i of a task uses seed mix(mix(S, task), i) with bits 62 and 63 cleared and bit
 * 62 then set (KVP_EVAL_SEED_BIT): training seeds keep bits 62 and 63 clear, so the two ranges
 * never overlap. The same seed serves every length and depth, so within a sample index only the
 * haystack size and the needle position change.
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
 *   budget_tokens   number  the budget in tokens per (layer, KV head): the count as given, or
 *                           the ratio times the mean prompt length; 0 for full
 *   length          int     the target length L in tokens
 *   depth           int     needle depth in percent
 *   samples         int     prompts in the cell
 *   seed            int     S
 *   max_new_tokens  int     the task's answer length
 *   prompt_tokens   number  mean prompt tokens (BOS included)
 *   accuracy        number  mean string_match_all in [0, 1]
 *   exact           number  fraction of samples with every reference found
 *   seconds         number  wall time of the cell
 *   kv_resident_bytes number mean KV bytes (K and V, all layers) in the physical blocks the
 *                           cache held after the answer (kvp_ctx_kv_bytes)
 *   kv_kept_bytes   number  mean bytes of the live tokens themselves
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/measure_opts.h"
#include "eval/heatmap.h"
#include "eval/ruler.h"
#include "train/train.h"

#define MAX_ITEMS 64

/* The evaluation task names and the generator each one uses. */
static const struct {
    const char *name;
    int task;
    int max_new; /* tokens_to_generate */
} eval_tasks[] = {
    {"passkey", KVP_TASK_PASSKEY, 16},
    {"niah_single", KVP_TASK_NIAH_SINGLE_2, 128},
    {"niah_multikey", KVP_TASK_NIAH_MULTIKEY_1, 128},
    {"niah_multivalue", KVP_TASK_NIAH_MULTIVALUE, 128},
    {"niah_multiquery", KVP_TASK_NIAH_MULTIQUERY, 128},
    {"vt", KVP_TASK_VT, 30},
};
#define N_EVAL_TASKS ((int)(sizeof(eval_tasks) / sizeof(eval_tasks[0])))

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
           "                     or this text, the needle on a line of its own, when given)\n%s",
           cli_model_flags_help, cli_policy_names(), cli_policy_flags_help());
}

struct task_opts {
    struct cli_model_opts mo;
    struct kvp_policy_params pp;
    int ti;                      /* index into eval_tasks */
    long lengths[MAX_ITEMS], depths[MAX_ITEMS];
    int n_len, n_depth;
    long samples, seed;
    char *policies[MAX_ITEMS], *budgets[MAX_ITEMS];
    int n_policies, n_budgets;
    bool json;
    const char *heatmap, *filler;
    char *lists;                 /* owned copy the policy and budget items point into */
};

/* Split s in place at commas into at most MAX_ITEMS non-empty items; -1 on a bad list. */
static int split_items(char *s, char **items)
{
    int n = 0;
    for (char *tok = s;; n++) {
        char *comma = strchr(tok, ',');
        if (comma)
            *comma = 0;
        if (!*tok || n == MAX_ITEMS)
            return -1;
        items[n] = tok;
        if (!comma)
            return n + 1;
        tok = comma + 1;
    }
}

/* Parse a comma-separated list of integers in [lo, hi]; -1 on a bad list. */
static int parse_longs(const char *s, long lo, long hi, long *out)
{
    char buf[1024], *items[MAX_ITEMS];
    if (strlen(s) >= sizeof(buf))
        return -1;
    strcpy(buf, s);
    int n = split_items(buf, items);
    for (int i = 0; i < n; i++)
        if (!cli_parse_int(items[i], lo, hi, &out[i]))
            return -1;
    return n;
}

static int parse_args(struct task_opts *o, int argc, char **argv)
{
    const char *policy_list = "full", *budget_list = "1/8", *task = NULL;
    const char *lengths = NULL, *depths = NULL;
    const struct cli_flag flags[] = {
        CLI_STR("--task", &task),
        CLI_STR("--lengths", &lengths),
        CLI_STR("--depths", &depths),
        CLI_INT("--samples", 1, 1 << 20, &o->samples, "a positive count"),
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &o->seed, "a non-negative integer"),
        CLI_INT("--policy-seed", 0, 0x7fffffffffffffffL, &o->pp.seed, "a non-negative integer"),
        CLI_STR("--policy", &policy_list),
        CLI_STR("--budget", &budget_list),
        CLI_STR("--heatmap", &o->heatmap),
        CLI_STR("--filler", &o->filler),
        CLI_BOOL("--json", &o->json),
        {0},
    };
    const struct cli_command cmd = {
        .name = "eval",
        .mo = &o->mo,
        .pp = &o->pp,
        .flags = flags,
        .help = help,
    };
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc;
    if (lengths && (o->n_len = parse_longs(lengths, 16, 1 << 24, o->lengths)) < 0)
        return cli_fail("--lengths: '%s' is not a list of token counts (>= 16)", lengths);
    if (depths && (o->n_depth = parse_longs(depths, 0, 100, o->depths)) < 0)
        return cli_fail("--depths: '%s' is not a list of percentages in 0..100", depths);
    if ((o->ti = cli_eval_task_index(task)) < 0)
        return cli_fail("eval: --task '%s' is not one of passkey, niah_single, niah_multikey, "
                        "niah_multivalue, niah_multiquery, vt", task ? task : "");
    size_t pl = strlen(policy_list), bl = strlen(budget_list);
    if (!(o->lists = malloc(pl + bl + 2)))
        return cli_fail("out of memory");
    memcpy(o->lists, policy_list, pl + 1);
    memcpy(o->lists + pl + 1, budget_list, bl + 1);
    if ((o->n_policies = split_items(o->lists, o->policies)) < 0)
        return cli_fail("--policy: '%s' is not a comma-separated list of policies", policy_list);
    for (int i = 0; i < o->n_policies; i++)
        if (!cli_policy_known(o->policies[i]))
            return cli_fail("--policy: unknown policy '%s' (known: %s)", o->policies[i],
                            cli_policy_names());
    if ((o->n_budgets = split_items(o->lists + pl + 1, o->budgets)) < 0)
        return cli_fail("--budget: '%s' is not a comma-separated list of budgets", budget_list);
    for (int i = 0; i < o->n_budgets; i++) {
        int b;
        float r;
        if (!cli_parse_budget(o->budgets[i], &b, &r))
            return cli_fail("--budget: '%s' is not a token count or a ratio in (0, 1] such as "
                            "1/16",
                            o->budgets[i]);
    }
    return 0;
}

/* ---- one run ------------------------------------------------------------------------------- */

/* A (policy, budget) pair; full runs once with budget "all". */
struct run {
    struct kvp_policy_params pp;
    const char *label;
    double *score, *exact, *ptok, *secs; /* [n_len][n_depth] sums */
    double *resident, *kept;             /* the same: KV bytes held after the answer */
};

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) /* ties go to the lower id */
            best = i;
    return best;
}

/* Prefill ids with the context's policy, then decode greedily up to max_new tokens into pred
 * (cap bytes), stopping at an end-of-generation token or a newline. */
static int decode_greedy(const kvp_model *m, kvp_ctx *ctx, const int32_t *ids, int n, int max_new,
                         float *logits, int n_vocab, char *pred, size_t cap, struct kvp_err *err)
{
    size_t k = 0;
    pred[0] = 0;
    if (kvp_eval(ctx, ids, n, logits, false, err) < 0)
        return err->code;
    int prev = ids[n - 1];
    for (int step = 0; step < max_new; step++) {
        int32_t tok = argmax(logits, n_vocab);
        if (kvp_token_is_eog(m, tok))
            break;
        char piece[256];
        size_t pn = kvp_token_to_piece(m, prev, tok, piece, sizeof(piece));
        if (pn >= sizeof(piece))
            pn = sizeof(piece) - 1;
        piece[pn] = 0;
        char *nl = strchr(piece, '\n');
        if (nl && step > 0)
            *nl = 0;
        for (const char *p = piece; *p && k + 1 < cap; p++)
            pred[k++] = *p;
        pred[k] = 0;
        if (nl && step > 0)
            break;
        if (step + 1 < max_new && kvp_eval(ctx, &tok, 1, logits, false, err) < 0)
            return err->code;
        prev = tok;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- output -------------------------------------------------------------------------------- */

static double run_budget_tokens(const struct run *r, double ptok)
{
    if (!strcmp(r->pp.name, "full"))
        return 0.0;
    return r->pp.budget > 0 ? (double)r->pp.budget : (double)r->pp.budget_ratio * ptok;
}

static void json_cell(const struct task_opts *o, const char *model_name, const struct run *r,
                      int li, int di)
{
    int c = li * o->n_depth + di;
    double ns = (double)o->samples;
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return;
    cJSON_AddStringToObject(j, "task", eval_tasks[o->ti].name);
    cJSON_AddStringToObject(j, "generator", kvp_task_name(eval_tasks[o->ti].task));
    cJSON_AddStringToObject(j, "model", model_name);
    cJSON_AddStringToObject(j, "filler", o->filler);
    cJSON_AddStringToObject(j, "policy", r->pp.name);
    cJSON_AddStringToObject(j, "budget", r->label);
    cJSON_AddNumberToObject(j, "budget_ratio", r->pp.budget > 0 ? 0.0 : r->pp.budget_ratio);
    cJSON_AddNumberToObject(j, "budget_tokens", run_budget_tokens(r, r->ptok[c] / ns));
    cJSON_AddNumberToObject(j, "length", (double)o->lengths[li]);
    cJSON_AddNumberToObject(j, "depth", (double)o->depths[di]);
    cJSON_AddNumberToObject(j, "samples", ns);
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    cJSON_AddNumberToObject(j, "max_new_tokens", eval_tasks[o->ti].max_new);
    cJSON_AddNumberToObject(j, "prompt_tokens", r->ptok[c] / ns);
    cJSON_AddNumberToObject(j, "accuracy", r->score[c] / ns);
    cJSON_AddNumberToObject(j, "exact", r->exact[c] / ns);
    cJSON_AddNumberToObject(j, "seconds", r->secs[c]);
    /* KV memory the policy really held once the answer was decoded (means over the samples):
     * bytes of the physical blocks with live tokens, and of the live tokens themselves. A policy
     * that only reads a subset (quest, or CateKV's adaptive heads) holds the whole cache. */
    cJSON_AddNumberToObject(j, "kv_resident_bytes", r->resident[c] / ns);
    cJSON_AddNumberToObject(j, "kv_kept_bytes", r->kept[c] / ns);
    char *s = cJSON_PrintUnformatted(j);
    if (s)
        printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

/* The panel title of a run: "streaming, budget 1/4", "full, all tokens". */
static void run_title(const struct run *r, char *buf, size_t cap)
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
    struct kvp_heatmap hm = {.title = title, .subtitle = subtitle, .lengths = o->lengths,
                             .depths = o->depths, .n_len = o->n_len, .n_depth = o->n_depth,
                             .panels = panels, .n_panels = n_panels, .cols = cols};
    struct kvp_err err = {0};
    return kvp_heatmap_write_png(&hm, path, &err) < 0 ? cli_fail_err(&err) : 0;
}

#define TITLE_CAP 160

/* DIR/TASK_POLICY_BUDGET.png for every run (budget '/' and '.' written as '_'), then
 * DIR/TASK_all.png with every run side by side: a row per policy, a column per budget. */
static int write_heatmaps(const struct task_opts *o, const struct run *runs, int n_runs,
                          const char *model_name)
{
    const char *task = eval_tasks[o->ti].name, *file = o->mo.model_path;
    int cells = o->n_len * o->n_depth, cols = 1, status = 1;
    for (int i = 0; i < o->n_policies; i++)
        if (strcmp(o->policies[i], "full"))
            cols = o->n_budgets;
    double *acc = malloc((size_t)n_runs * (size_t)cells * sizeof(double));
    char *titles = malloc((size_t)n_runs * TITLE_CAP);
    struct kvp_heatmap_panel *grid = calloc((size_t)o->n_policies * (size_t)cols, sizeof(*grid));
    if (!acc || !titles || !grid) {
        cli_fail("heatmap: out of memory");
        goto out;
    }
    char subtitle[1024], title[TITLE_CAP + 64], name[256];
    const char *base = file && strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    snprintf(subtitle, sizeof(subtitle), "model %s%s%s%s, %ld samples per cell, seed %ld",
             model_name, base ? " (" : "", base ? base : "", base ? ")" : "", o->samples,
             o->seed);
    for (int k = 0, i = 0; i < o->n_policies; i++) {
        int n = strcmp(o->policies[i], "full") ? o->n_budgets : 1;
        for (int j = 0; j < n; j++, k++) {
            double *a = acc + (size_t)k * (size_t)cells;
            for (int c = 0; c < cells; c++)
                a[c] = runs[k].score[c] / (double)o->samples;
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
    status = write_figure(o, name, title, subtitle, grid, o->n_policies * cols, cols);
out:
    free(grid);
    free(titles);
    free(acc);
    return status;
}

static void print_table(const struct task_opts *o, const struct run *runs, int n_runs,
                        const char *model_name)
{
    FILE *f = o->json ? stderr : stdout;
    fprintf(f, "# %s: %s, %ld samples per (length, depth) x %d depths, seed %ld\n", model_name,
            eval_tasks[o->ti].name, o->samples, o->n_depth, o->seed);
    fprintf(f, "%-16s %-12s %7s %7s %9s %12s\n", "task", "policy", "budget", "length",
            "accuracy", "KV resident");
    for (int k = 0; k < n_runs; k++)
        for (int li = 0; li < o->n_len; li++) {
            double s = 0.0, res = 0.0;
            for (int di = 0; di < o->n_depth; di++) {
                s += runs[k].score[li * o->n_depth + di];
                res += runs[k].resident[li * o->n_depth + di];
            }
            double n = (double)(o->samples * o->n_depth);
            fprintf(f, "%-16s %-12s %7s %7ld %8.1f%% %9.0f KiB\n", eval_tasks[o->ti].name,
                    runs[k].pp.name, runs[k].label, o->lengths[li], 100.0 * s / n,
                    res / n / 1024.0);
        }
    fflush(f);
}

/* ---- the command --------------------------------------------------------------------------- */

/* Evaluate every run on every (length, depth, sample). Returns 0 or 1 after an error. */
static int eval_grid(const struct task_opts *o, const kvp_model *m, kvp_ctx *ctx,
                     const struct kvp_corpus *c, struct run *runs, int n_runs)
{
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    int max_new = eval_tasks[o->ti].max_new;
    float *logits = malloc((size_t)info.n_vocab * sizeof(float));
    int32_t *ids = NULL;
    char pred[2048];
    int status = 1;
    bool tty = isatty(STDERR_FILENO) != 0;
    long done = 0, total = (long)o->n_len * o->n_depth * o->samples;
    if (!logits) {
        cli_fail("out of memory");
        return 1;
    }
    for (int li = 0; li < o->n_len; li++)
        for (int di = 0; di < o->n_depth; di++)
            for (long i = 0; i < o->samples; i++) {
                struct kvp_task_text tt;
                struct kvp_err err = {0};
                if (cli_eval_prompt(c, m, o->ti, o->seed, i, o->lengths[li], o->depths[di], &tt,
                                    &err) < 0) {
                    cli_fail("eval: length %ld: %s", o->lengths[li], err.msg);
                    goto out;
                }
                size_t n = 0;
                free(ids);
                ids = cli_tokenize(m, tt.prompt, strlen(tt.prompt), true, &n);
                if (!ids) {
                    kvp_task_text_free(&tt);
                    goto out;
                }
                int cidx = li * o->n_depth + di;
                for (int k = 0; k < n_runs; k++) {
                    double t0 = now_s();
                    if (kvp_ctx_set_policy(ctx, &runs[k].pp, &err) < 0 ||
                        decode_greedy(m, ctx, ids, (int)n, max_new, logits, info.n_vocab, pred,
                                      sizeof(pred), &err) < 0) {
                        kvp_task_text_free(&tt);
                        cli_fail("eval: %s @ %s: %s", runs[k].pp.name, runs[k].label, err.msg);
                        goto out;
                    }
                    double s = kvp_ruler_match_all(pred, tt.refs, tt.n_refs);
                    runs[k].score[cidx] += s;
                    runs[k].exact[cidx] += s >= 1.0;
                    runs[k].ptok[cidx] += (double)n;
                    runs[k].secs[cidx] += now_s() - t0;
                    size_t resident, kept;
                    kvp_ctx_kv_bytes(ctx, &resident, &kept);
                    runs[k].resident[cidx] += (double)resident;
                    runs[k].kept[cidx] += (double)kept;
                }
                kvp_task_text_free(&tt);
                done++;
                if (tty)
                    fprintf(stderr, "\r\033[Keval %s [%ld/%ld] length %ld depth %ld%%",
                            eval_tasks[o->ti].name, done, total, o->lengths[li], o->depths[di]);
            }
    if (tty)
        fprintf(stderr, "\r\033[K");
    status = 0;
out:
    free(ids);
    free(logits);
    return status;
}

/* Expand policies × budgets into runs (full once). Returns the count, or -1 out of memory. */
static int make_runs(const struct task_opts *o, struct run **out)
{
    int n = 0, cells = o->n_len * o->n_depth;
    struct run *runs = calloc((size_t)o->n_policies * (size_t)o->n_budgets, sizeof(*runs));
    if (!runs)
        return -1;
    for (int i = 0; i < o->n_policies; i++) {
        bool full = !strcmp(o->policies[i], "full");
        for (int k = 0; k < (full ? 1 : o->n_budgets); k++) {
            struct run *r = &runs[n++];
            r->pp = o->pp;
            r->pp.name = o->policies[i];
            r->label = full ? "all" : o->budgets[k];
            if (!full)
                cli_parse_budget(o->budgets[k], &r->pp.budget, &r->pp.budget_ratio);
            r->score = calloc((size_t)cells * 6, sizeof(double));
            if (!r->score) {
                *out = runs;
                return -(n + 1);
            }
            r->exact = r->score + cells;
            r->ptok = r->exact + cells;
            r->secs = r->ptok + cells;
            r->resident = r->secs + cells;
            r->kept = r->resident + cells;
        }
    }
    *out = runs;
    return n;
}

int cli_eval_task_index(const char *name)
{
    for (int t = 0; name && t < N_EVAL_TASKS; t++)
        if (!strcmp(name, eval_tasks[t].name))
            return t;
    return -1;
}

int cli_eval_prompt(const struct kvp_corpus *c, const kvp_model *m, int ti, long seed, long i,
                    long length, long depth, struct kvp_task_text *tt, struct kvp_err *err)
{
    /* sample i of a task: a seed of the evaluation range, never one training draws */
    uint64_t base = kvp_rng_mix((uint64_t)seed, (uint64_t)eval_tasks[ti].task);
    struct kvp_task_req req = {
        .task = eval_tasks[ti].task,
        .seed = (kvp_rng_mix(base, (uint64_t)i) & ~(3ULL << 62)) | KVP_EVAL_SEED_BIT,
        .target_tokens = (int)length,
        .depth = (float)depth / 100.0f,
        .prose = !c->noise_only, /* a pass key in the --filler text when one was given */
        .count = cli_count_tokens,
        .ud = (void *)m,
    };
    return kvp_task_render_eval(c, &req, tt, err);
}

struct kvp_corpus *cli_open_filler(const char **pathp, int ti)
{
    char *raw = NULL;
    size_t len = 0;
    struct kvp_corpus *c = NULL;
    struct kvp_err err = {0};
    static char def[4096];
    if (!*pathp) {
        /* without --filler the pass key's haystack is its own noise line: no filler needed, so
         * it runs on a fresh clone (the corpus only seeds a draw the passkey prompt never
         * reads); with --filler it is that text, the needle on a line of its own */
        if (eval_tasks[ti].task == KVP_TASK_PASSKEY) {
            *pathp = "none (the pass key's noise line)";
            if (kvp_corpus_passkey_only(&c, &err) < 0)
                cli_fail("filler: %s", err.msg);
            return c;
        }
        const char *sd = getenv("KVP_SHARED_DIR");
        snprintf(def, sizeof(def), "%s/data/pg_essays", sd ? sd : "../shared");
        *pathp = def;
    }
    const char *path = *pathp;
    if (kvp_corpus_read_filler(&path, 1, &raw, &len, &err) < 0 ||
        kvp_corpus_init(&c, raw, len, NULL, 0.0, &err) < 0) {
        cli_fail("filler: %s", err.msg);
        c = NULL;
    }
    free(raw);
    return c;
}

int cmd_eval_tasks(int argc, char **argv)
{
    struct task_opts o = {.pp = {.gqa_agg = KVP_AGG_MEAN}, .samples = 4, .seed = 42};
    static const long def_len[] = {512, 1024, 2048}, def_depth[] = {0, 25, 50, 75, 100};
    o.n_len = 3;
    memcpy(o.lengths, def_len, sizeof(def_len));
    o.n_depth = 5;
    memcpy(o.depths, def_depth, sizeof(def_depth));
    int rc = parse_args(&o, argc, argv);
    if (rc) {
        free(o.lists);
        return rc == 2 ? 0 : 1;
    }
    int status = 1, n_runs = 0;
    struct run *runs = NULL;
    kvp_ctx *ctx = NULL;
    struct kvp_corpus *c = NULL;
    kvp_model *m = NULL;
    if (o.heatmap) {
        struct stat st;
        if (stat(o.heatmap, &st) != 0 && mkdir(o.heatmap, 0777) != 0) {
            cli_fail("--heatmap: cannot create directory '%s'", o.heatmap);
            goto out;
        }
    }
    if (!(c = cli_open_filler(&o.filler, o.ti)) || !(m = cli_open_model(&o.mo)))
        goto out;
    if ((n_runs = make_runs(&o, &runs)) < 0) {
        n_runs = -n_runs - 1;
        cli_fail("out of memory");
        goto out;
    }
    long max_len = 0;
    for (int i = 0; i < o.n_len; i++)
        max_len = o.lengths[i] > max_len ? o.lengths[i] : max_len;
    if (!(ctx = cli_open_ctx(m, &o.mo, max_len + eval_tasks[o.ti].max_new + 1)))
        goto out;
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    if (eval_grid(&o, m, ctx, c, runs, n_runs))
        goto out;
    print_table(&o, runs, n_runs, info.name);
    for (int k = 0; o.json && k < n_runs; k++)
        for (int li = 0; li < o.n_len; li++)
            for (int di = 0; di < o.n_depth; di++)
                json_cell(&o, info.name, &runs[k], li, di);
    if (o.heatmap && write_heatmaps(&o, runs, n_runs, info.name))
        goto out;
    fflush(stdout);
    status = 0;
out:
    for (int k = 0; runs && k < n_runs; k++)
        free(runs[k].score);
    free(runs);
    kvp_ctx_free(ctx);
    kvp_model_close(m);
    kvp_corpus_free(c);
    free(o.lists);
    return status;
}
