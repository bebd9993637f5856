/*
 * `kvpred train-prefill-gate`: train the learned estimate of block-sparse prefill (docs/prefill.md,
 * src/predictor/prefill_gate.h) by self-distillation. Retrieval prompts from the task generators
 * with training seeds (kvp_task_seed: never an evaluation prompt) are prefilled sparsely with the
 * gate at pooled's weights (so the model's later layers see what a sparse prefill gives them);
 * every choice that ranks key blocks is kept with each head's dense attention share per block.
 * The weights are then fitted on the first --prompts prompts, and the gate's recovery (the dense
 * attention its picks hold) is compared with pooled's on the --val prompts after them, per layer.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/measure_opts.h"
#include "eval/task_eval.h"
#include "forward/sparse_prefill.h"
#include "predictor/prefill_gate.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"

static void help(void)
{
    printf("usage: kvpred train-prefill-gate [-m MODEL] -o GATE.kvpg [options]\n\n"
           "Train the learned estimate of block-sparse prefill (--prefill-policy learned) on\n"
           "the model's own block-pooled prefill attention over generated retrieval prompts\n"
           "(training seeds only), and compare its recovery with pooled's on held-out ones.\n\n"
           "  -o, --output PATH    gate file to write (.kvpg)\n"
           "  -f, --file PATH      filler text for the haystacks (repeatable; without: passkey\n"
           "                       prompts with noise haystacks only)\n"
           "  --tasks T1,T2,...    tasks to cycle over (default passkey; with -f passkey,\n"
           "                       niah_single_2,niah_multikey_1)\n"
           "  --prompts N          training prompts (default 16)\n"
           "  --val N              validation prompts after them (default 4)\n"
           "  --length N           tokens per prompt (default 4096)\n"
           "  --seed S             prompt seed (default 1)\n"
           "  --budget B           the budget the choices are made at (default 1/8)\n"
           "  --window N           the local window while collecting (default 64)\n"
           "  --min-keys N         query blocks seeing fewer keys are not collected (1024)\n"
           "  --iters N            Adam steps (default 300)\n"
           "  --lr X               Adam step size (default 0.01)\n"
           "  --l2 X               pull toward pooled's weights (default 0.001)\n"
           "  --json               one JSON line with the per-layer recovery\n"
           "%s",
           cli_model_flags_help);
}

struct gate_opts {
    struct cli_model_opts mo;
    const char *files[64];
    int n_files;
    const char *out_path, *budget_s;
    long prompts, val, length, seed, window, min_keys, iters;
    double lr, l2;
    bool json;
    int tasks[64], n_tasks;
    int budget;
    float ratio;
};

static int parse_tasks(const char *list, int *out, int cap)
{
    int n = 0;
    for (const char *p = list; *p && n < cap;) {
        size_t len = strcspn(p, ",");
        int task = kvp_task_by_name(p, len);
        if (task < KVP_TASK_PASSKEY || task > KVP_TASK_VT)
            return 0;
        out[n++] = task;
        p += len + (p[len] == ',');
    }
    return n;
}

static int parse_args(struct gate_opts *o, int argc, char **argv)
{
    const char *task_list = NULL;
    const struct cli_flag flags[] = {
        CLI_LIST("-f|--file", o->files, &o->n_files, 64),
        CLI_STR("-o|--output", &o->out_path),
        CLI_STR("--tasks", &task_list),
        CLI_INT("--prompts", 1, 1 << 16, &o->prompts, "a positive count"),
        CLI_INT("--val", 1, 1 << 16, &o->val, "a positive count"),
        CLI_INT("--length", 512, 1 << 20, &o->length, "a token count of at least 512"),
        CLI_INT("--seed", 0, 0x3fffffffffffffffL, &o->seed, "a non-negative integer"),
        CLI_STR("--budget", &o->budget_s),
        CLI_INT("--window", 0, 1 << 20, &o->window, "a token count"),
        CLI_INT("--min-keys", 1, 1 << 20, &o->min_keys, "a positive token count"),
        CLI_INT("--iters", 1, 1 << 20, &o->iters, "a positive count"),
        CLI_FLOAT("--lr", 1e-6, 10, &o->lr, "a step size in (0, 10]"),
        CLI_FLOAT("--l2", 0, 100, &o->l2, "a non-negative weight"),
        CLI_BOOL("--json", &o->json),
        {0},
    };
    const struct cli_command cmd = {
        .name = "train-prefill-gate", .mo = &o->mo, .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc;
    if (!task_list)
        task_list = o->n_files ? "passkey,niah_single_2,niah_multikey_1" : "passkey";
    if (!(o->n_tasks = parse_tasks(task_list, o->tasks, 64)))
        return cli_fail("--tasks: '%s' is not a list of passkey, niah_single_1..3, "
                        "niah_multikey_1..3, niah_multivalue, niah_multiquery, vt",
                        task_list);
    if (!o->out_path)
        return cli_fail("train-prefill-gate: give the output (-o)");
    if (!cli_parse_budget(o->budget_s ? o->budget_s : "1/8", &o->budget, &o->ratio))
        return cli_fail("--budget: '%s' is not a token count or a ratio in (0, 1]", o->budget_s);
    return 0;
}

/* Where the collector puts the items: the training or the validation set, by prompt. */
struct collecting {
    pthread_mutex_t mu;
    struct kvp_pgate_set *to;
    int failed;
};

static void collect_item(void *user, const struct kvp_spf_sample *smp)
{
    struct collecting *cl = user;
    struct kvp_err err = {0};
    pthread_mutex_lock(&cl->mu);
    if (kvp_pgate_set_add(cl->to, smp->l, smp->kvh, smp->qu, smp->U, smp->n_keys, smp->block,
                          smp->forced, smp->n_pick, smp->qbar, smp->stats, smp->mass, &err) < 0)
        cl->failed = 1;
    pthread_mutex_unlock(&cl->mu);
}

/* Prompt i's tokens (a training seed), or NULL after printing the error. */
static int32_t *gate_prompt(const kvp_model *m, const struct gate_opts *o,
                            const struct kvp_corpus *c, long i, size_t *n)
{
    struct kvp_task_req req = {
        .task = o->tasks[i % o->n_tasks],
        .seed = kvp_task_seed((uint64_t)o->seed, (uint64_t)i), /* training range */
        .target_tokens = (int)o->length,
        .depth = -1.0f,
        .count = kvp_task_eval_count_tokens,
        .ud = (void *)m,
    };
    struct kvp_task_text tt;
    struct kvp_err err = {0};
    if (kvp_task_render_eval(c, &req, &tt, &err) < 0) {
        cli_fail("train-prefill-gate: %s: %s", kvp_task_name(req.task), err.msg);
        return NULL;
    }
    int32_t *ids = cli_tokenize(m, tt.prompt, strlen(tt.prompt), true, n);
    kvp_task_text_free(&tt);
    return ids;
}

/* The filler corpus (-f), or the passkey task's own noise. 0, or 1 after printing the error. */
static int open_filler(const struct gate_opts *o, struct kvp_corpus **c)
{
    struct kvp_err err = {0};
    if (!o->n_files) {
        for (int i = 0; i < o->n_tasks; i++)
            if (o->tasks[i] != KVP_TASK_PASSKEY)
                return cli_fail("train-prefill-gate: tasks other than passkey need filler (-f)");
        return kvp_corpus_passkey_only(c, &err) < 0 ? cli_fail_err(&err) : 0;
    }
    char *raw = NULL;
    size_t len = 0;
    if (kvp_corpus_read(o->files, o->n_files, &raw, &len, &err) < 0)
        return cli_fail("train-prefill-gate: %s", err.msg);
    int rc = kvp_corpus_init(c, raw, len, NULL, 0.0, &err);
    free(raw);
    return rc < 0 ? cli_fail("train-prefill-gate: filler: %s", err.msg) : 0;
}

/* Prefill every prompt with the collector on: the first --prompts into train, the rest into
 * val. 0, or 1 after printing the error. */
static int collect_all(const kvp_model *m, const struct gate_opts *o, kvp_ctx *ctx,
                       struct collecting *cl, struct kvp_pgate_set *train,
                       struct kvp_pgate_set *val)
{
    struct kvp_corpus *c = NULL;
    if (open_filler(o, &c))
        return 1;
    struct kvp_err err = {0};
    const bool tty = isatty(2);
    int status = 0;
    for (long i = 0; i < o->prompts + o->val && !status; i++) {
        size_t n = 0;
        int32_t *ids = gate_prompt(m, o, c, i, &n);
        if (!ids) {
            status = 1;
            break;
        }
        cl->to = i < o->prompts ? train : val;
        kvp_ctx_reset(ctx);
        if (kvp_eval(ctx, ids, (int)n, NULL, false, &err) < 0)
            status = cli_fail_err(&err);
        else if (cl->failed)
            status = cli_fail("train-prefill-gate: out of memory");
        free(ids);
        if (tty)
            fprintf(stderr, "\rtrain-prefill-gate: %ld/%ld prompts, %zu + %zu items", i + 1,
                    o->prompts + o->val, train->n, val->n);
    }
    if (tty)
        fputc('\n', stderr);
    kvp_corpus_free(c);
    return status;
}

/* The context and the collecting sparse prefill (the gate at pooled's weights). */
static kvp_ctx *open_collecting(const kvp_model *m, const struct gate_opts *o,
                                const struct kvp_pgate *init, struct collecting *cl)
{
    kvp_ctx *ctx = cli_open_ctx(m, &o->mo, o->length + 64);
    struct kvp_prefill_gate *pg = NULL;
    struct kvp_err err = {0};
    if (!ctx || kvp_spf_gate_from(init, &pg, &err) < 0) {
        if (ctx)
            cli_fail_err(&err);
        kvp_ctx_free(ctx);
        return NULL;
    }
    struct kvp_prefill_params pp = {
        .policy = KVP_PREFILL_LEARNED, .budget = o->budget, .budget_ratio = o->ratio,
        .window = o->window ? (int)o->window : -1, .min_keys = (int)o->min_keys,
        .dense_tail = -1, .block = init->block, .gate = pg};
    int rc = kvp_ctx_set_prefill(ctx, &pp, &err);
    kvp_prefill_gate_free(pg);
    if (rc < 0) {
        cli_fail_err(&err);
        kvp_ctx_free(ctx);
        return NULL;
    }
    kvp_spf_set_collector(kvp_ctx_spf(ctx), collect_item, cl);
    return ctx;
}

static void report(const struct gate_opts *o, const struct kvp_pgate *g, double loss)
{
    if (o->json) {
        printf("{\"gate\":\"%s\",\"model\":\"%s\",\"n_train\":%llu,\"n_val\":%llu,"
               "\"budget\":%.6g,\"window\":%ld,\"loss\":%.6g,\"recovery_learned\":[",
               o->out_path, g->model, (unsigned long long)g->n_train,
               (unsigned long long)g->n_val, g->budget, o->window, loss);
        for (int l = 0; l < g->n_layer; l++)
            printf("%s%.4f", l ? "," : "", g->rec[2 * l]);
        printf("],\"recovery_pooled\":[");
        for (int l = 0; l < g->n_layer; l++)
            printf("%s%.4f", l ? "," : "", g->rec[2 * l + 1]);
        printf("]}\n");
        return;
    }
    printf("wrote %s: %llu training items, %llu validation items, loss %.4f\n"
           "validation recovery at budget %.4g (window %ld):\n  layer  learned  pooled\n",
           o->out_path, (unsigned long long)g->n_train, (unsigned long long)g->n_val, loss,
           g->budget, o->window);
    for (int l = 0; l < g->n_layer; l++)
        printf("  %5d  %7.4f  %6.4f\n", l, g->rec[2 * l], g->rec[2 * l + 1]);
}

/* Fit, measure both gates on the validation items, save. 0, or 1 after printing the error. */
static int fit_and_save(const struct gate_opts *o, struct kvp_pgate *g,
                        const struct kvp_pgate_set *train, const struct kvp_pgate_set *val)
{
    struct kvp_err err = {0};
    double *rec = malloc((size_t)g->n_layer * sizeof(double));
    if (!rec)
        return cli_fail("out of memory");
    kvp_pgate_recovery(g, val, rec); /* still pooled's weights */
    for (int l = 0; l < g->n_layer; l++)
        g->rec[2 * l + 1] = (float)rec[l];
    const struct kvp_pgate_fit_opts fo = {.iters = (int)o->iters, .lr = (float)o->lr,
                                          .l2 = (float)o->l2};
    double loss = 0;
    int rc = kvp_pgate_fit(g, train, &fo, &loss, &err);
    if (rc == 0) {
        kvp_pgate_recovery(g, val, rec);
        for (int l = 0; l < g->n_layer; l++)
            g->rec[2 * l] = (float)rec[l];
        g->n_train = train->n;
        g->n_val = val->n;
        rc = kvp_pgate_save(g, o->out_path, &err);
    }
    free(rec);
    if (rc < 0)
        return cli_fail_err(&err);
    report(o, g, loss);
    return 0;
}

int cmd_train_prefill_gate(int argc, char **argv)
{
    struct gate_opts o = {.prompts = 16, .val = 4, .length = 4096, .seed = 1, .window = 64,
                          .min_keys = 1024, .iters = 300, .lr = 0.01, .l2 = 1e-3};
    int rc = parse_args(&o, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    kvp_model *m = cli_open_model(&o.mo);
    if (!m)
        return 1;
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    struct kvp_pgate g = {0};
    struct kvp_pgate_set train = {.g = info.n_head / info.n_head_kv, .hd = info.head_dim};
    struct kvp_pgate_set val = train;
    struct collecting cl = {.mu = PTHREAD_MUTEX_INITIALIZER};
    struct kvp_err err = {0};
    kvp_ctx *ctx = NULL;
    int status = 1;
    if (kvp_pgate_init(&g, info.n_layer, info.n_head_kv, info.head_dim, 64, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    snprintf(g.model, sizeof(g.model), "%s", info.name);
    g.seed = (uint64_t)o.seed;
    g.budget = o.budget ? (float)o.budget / (float)o.length : o.ratio;
    if (!(ctx = open_collecting(m, &o, &g, &cl)) || collect_all(m, &o, ctx, &cl, &train, &val))
        goto out;
    status = fit_and_save(&o, &g, &train, &val);
out:
    kvp_ctx_free(ctx);
    kvp_pgate_set_free(&train);
    kvp_pgate_set_free(&val);
    kvp_pgate_free(&g);
    kvp_model_close(m);
    return status;
}
