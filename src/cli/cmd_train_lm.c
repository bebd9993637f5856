/*
 * `kvpred train-lm`: train kvpred's own small long-context Llama model from scratch on the CPU
 * (src/train), write checkpoints along the way and a GGUF at the end.
 *
 * The library reports progress through a callback; this file turns it into a one-line progress
 * bar on a terminal (redrawn in place) or into plain log lines when stderr is a file, so a
 * `nohup ... 2>train.log` run leaves a readable log. Every bad flag is one error line and exit 1.
 *
 * OpenBLAS picks its kernels when the process starts, from OPENBLAS_CORETYPE or its own CPU
 * detection, and the detection of Debian's OpenBLAS files AMD Zen 5 under Haswell (AVX2). On an
 * AVX-512 CPU with the variable unset, the command therefore re-executes itself once with
 * OPENBLAS_CORETYPE=SKYLAKEX, which made training about 30 % faster on the project machine. Set
 * the variable (to anything) to keep OpenBLAS's own choice.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "core/platform.h"
#include "train/train.h"

#define MAX_DATA 64

static void train_usage(FILE *f)
{
    fprintf(f,
            "usage: kvpred train-lm --data DIR_OR_FILE... -o OUT.gguf [options]\n\n"
            "  --data PATH...          training text files or directories (never pg_essays or\n"
            "                          heldout_stories.txt: evaluation text)\n"
            "  --hay PATH...           extra haystack texts for retrieval samples, each path its\n"
            "                          own kind (files or directories; never pg_essays or\n"
            "                          heldout_stories.txt)\n"
            "  --hay-frac F            share of retrieval samples whose haystack is drawn\n"
            "                          uniformly among noise lines, --data and each --hay path\n"
            "                          (default 0: every task keeps its own)\n"
            "  --init-from GGUF        start from the weights and vocabulary of a GGUF this\n"
            "                          trainer exported (fresh optimiser; --ctx and --rope-base\n"
            "                          replace the file's; the shape flags are ignored)\n"
            "  -o, --output OUT.gguf   GGUF written at the end\n"
            "  --ckpt PATH             checkpoint file (written every --ckpt-every steps and at "
            "the end)\n"
            "  --resume PATH           continue a run from its checkpoint (same --data; the\n"
            "                          model and schedule come from the checkpoint, --steps N\n"
            "                          extends it; --lr, --lr-min, --answer-weight, --mix,\n"
            "                          --edge-frac, --fill-min and --hay-frac given with it\n"
            "                          replace the checkpoint's; --ctx, --rope-base,\n"
            "                          --curriculum, --batch or --micro start a new stage at\n"
            "                          its step, with its own warm-up, cosine and curriculum\n"
            "                          up to --steps N, which must go beyond it)\n"
            "  --export-only           with --resume or --init-from: write the GGUF and exit\n"
            "  --steps N               optimiser steps (default 1000)\n"
            "  --ctx T                 model context length (default 2048)\n"
            "  --batch B               sequences of --ctx tokens per step (default 8)\n"
            "  --micro N               tokens per forward/backward; gradients accumulate "
            "(default max(4096, ctx))\n"
            "  --curriculum SPEC       ctx:fraction,... of the steps (default T/4:0.3,T/2:0.3,"
            "T:0.4)\n"
            "  --lr X                  peak learning rate (default 2e-3); --lr-min X (lr/10)\n"
            "  --warmup F              warm-up fraction of the steps (default 0.03)\n"
            "  --wd X                  AdamW weight decay (default 0.1); --clip X (1.0)\n"
            "  --answer-weight X       loss weight of answer tokens (default 4)\n"
            "  --mix TASK:W,...        task mixture (default lm 0.10, passkey 0.14, niah_single_1\n"
            "                          0.10, _2 0.12, _3 0.06, multikey_1 0.12, _2 0.08, _3 0.05,\n"
            "                          multivalue 0.08, multiquery 0.08, vt 0.07, copy 0.08)\n"
            "  --edge-frac F           share of needles placed exactly at a haystack edge\n"
            "                          (default 0.125; the rest at uniform depths)\n"
            "  --fill-min F            a retrieval sample takes [F*ctx, ctx] tokens (default\n"
            "                          0.5; near 1 trains the longest distances)\n"
            "  --dim D --layers L --heads H --kv-heads K --ff F --vocab V\n"
            "                          model shape (default 256, 6, 8, 4, 704, 1024)\n"
            "  --rope-base X           RoPE base (default 10000); --untied: separate output "
            "head\n"
            "  --seed S                run seed (default 1)\n"
            "  --threads N             threads (default 2)\n"
            "  --precision P           bf16 (default: bf16 products with f32 accumulation,\n"
            "                          f32 weights and optimiser) or f32 (the OpenBLAS\n"
            "                          reference); not stored in the checkpoint\n"
            "  --eval-every N          retrieval evaluation every N steps (default 0: at the "
            "end)\n"
            "  --eval-samples N        samples per task (default 8)\n"
            "  --ckpt-every N          checkpoint every N steps (default 100)\n"
            "  --stop-after N          stop this invocation after N steps (checkpoint kept)\n"
            "  --bench                 measure tokens/s instead of training (no --data): whole\n"
            "                          steps on random tokens at each --bench-ctx, f32 and bf16\n"
            "                          alternating (or only --precision), one JSON object\n"
            "  --bench-ctx LIST        contexts (default 2048,8192,16384); a step is\n"
            "                          max(8192, ctx) tokens in micro-batches of max(4096, ctx)\n"
            "  --bench-steps N         timed steps per measurement (default 2)\n"
            "  --bench-reps N          measurements per (ctx, precision) (default 3; medians)\n"
            "  -h, --help              show this help\n");
}

struct ui {
    bool tty;
    long log_every;
    long last_step;
};

static void fmt_time(double s, char *buf, size_t cap)
{
    long t = s > 0 && isfinite(s) ? (long)s : 0;
    snprintf(buf, cap, "%ldh%02ldm%02lds", t / 3600, t / 60 % 60, t % 60);
}

static void on_progress(void *user, const struct kvp_train_progress *p)
{
    struct ui *u = user;
    char eta[32], el[32];
    switch (p->event) {
    case KVP_TRAIN_EV_INFO:
        fprintf(stderr, "%s%s\n", u->tty ? "\r\033[K" : "", p->msg);
        break;
    case KVP_TRAIN_EV_CKPT:
        if (!u->tty)
            fprintf(stderr, "step %ld: checkpoint %s\n", p->step, p->msg);
        break;
    case KVP_TRAIN_EV_STEP:
        fmt_time(p->eta_s, eta, sizeof(eta));
        fmt_time(p->elapsed_s, el, sizeof(el));
        if (u->tty) {
            int width = 24, done = (int)((double)width * (double)p->step / (double)p->steps);
            char bar[32];
            for (int i = 0; i < width; i++)
                bar[i] = i < done ? '=' : i == done ? '>' : ' ';
            bar[width] = 0;
            fprintf(stderr,
                    "\r\033[K[%s] %ld/%ld loss %.4f ans %.3f ctx %d %.0f tok/s lr %.2e ETA %s",
                    bar, p->step, p->steps, p->loss, p->answer_loss, p->ctx, p->tokens_per_s,
                    (double)p->lr, eta);
            if (p->step == p->steps)
                fputc('\n', stderr);
        } else if (p->step % u->log_every == 0 || p->step == p->steps) {
            fprintf(stderr,
                    "step %ld/%ld loss %.4f ans %.4f gnorm %.3f lr %.3e ctx %d tok/s %.0f "
                    "tokens %.0f elapsed %s eta %s\n",
                    p->step, p->steps, p->loss, p->answer_loss, p->grad_norm, (double)p->lr,
                    p->ctx, p->tokens_per_s, p->tokens_seen, el, eta);
        }
        break;
    case KVP_TRAIN_EV_EVAL:
        fprintf(stderr, "%seval step %ld ctx %d: val_loss %.4f", u->tty ? "\r\033[K" : "",
                p->step, p->eval_ctx, p->val_loss);
        for (int t = 1; t < KVP_TASK_COUNT; t++)
            if (!isnan(p->acc[t]))
                fprintf(stderr, " %s %.0f%%", kvp_task_name(t), 100.0 * p->acc[t]);
        fputc('\n', stderr);
        break;
    }
    fflush(stderr);
}

/* "512:0.3,1024:0.3,2048:0.4" */
static bool parse_curriculum(const char *s, struct kvp_train_hparams *hp)
{
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long ctx = strtol(p, &end, 10);
        if (end == p || *end != ':' || ctx < 16 || ctx > 65536 || n >= KVP_TRAIN_MAX_PHASES)
            return false;
        p = end + 1;
        double f = strtod(p, &end);
        if (end == p || !(f >= 0.0) || f > 1e6)
            return false;
        hp->phase_ctx[n] = (int)ctx;
        hp->phase_frac[n] = (float)f;
        n++;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return false;
    }
    hp->n_phases = n;
    return n > 0;
}

/* "passkey:2,niah_single_1:1,lm:0.5": weights by task name; tasks not named get 0. */
static bool parse_mix(const char *s, struct kvp_task_mix *mix)
{
    memset(mix, 0, sizeof(*mix));
    const char *p = s;
    bool any = false;
    while (*p) {
        const char *colon = strchr(p, ':');
        if (!colon)
            return false;
        int task = kvp_task_by_name(p, (size_t)(colon - p));
        char *end;
        double w = strtod(colon + 1, &end);
        if (task < 0 || end == colon + 1 || !(w >= 0.0) || w > 1e6)
            return false;
        mix->w[task] = (float)w;
        any |= w > 0.0;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return false;
    }
    return any;
}

static void default_curriculum(struct kvp_train_hparams *hp, int T)
{
    if (T / 4 >= 128) {
        hp->n_phases = 3;
        hp->phase_ctx[0] = T / 4;
        hp->phase_ctx[1] = T / 2;
        hp->phase_ctx[2] = T;
        hp->phase_frac[0] = 0.3f;
        hp->phase_frac[1] = 0.3f;
        hp->phase_frac[2] = 0.4f;
    } else {
        hp->n_phases = 1;
        hp->phase_ctx[0] = T;
        hp->phase_frac[0] = 1.0f;
    }
}

/* Re-execute with OPENBLAS_CORETYPE=SKYLAKEX on AVX-512 CPUs (see the top of the file). Returns
 * only when that is not wanted or not possible. */
static void maybe_reexec(int argc, char **argv)
{
    if (getenv("OPENBLAS_CORETYPE") || !(kvp_cpu_features() & KVP_CPU_AVX512))
        return;
    if (setenv("OPENBLAS_CORETYPE", "SKYLAKEX", 1) != 0)
        return;
    char **args = calloc((size_t)argc + 2, sizeof(char *));
    if (!args)
        return;
    args[0] = "kvpred";
    for (int i = 0; i < argc; i++)
        args[i + 1] = argv[i];
    execv("/proc/self/exe", args);
    free(args); /* exec failed: carry on with the kernels already loaded */
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define BENCH_MAX_CTX 8
#define BENCH_MAX_REPS 32

/* A bench step: the shipped run's 8192 tokens, or one sequence when longer. */
static long bench_step_tokens(int ctx)
{
    return ctx > 8192 ? ctx : 8192;
}

/* --bench: every (ctx, precision) measured reps times, the precisions alternating inside each
 * round so both see the same load on a busy host; medians in the JSON. */
static int run_bench(const struct kvp_train_config *cfg, const char *ctx_list, int precision,
                     long steps, long reps, int threads)
{
    long ctx_l[BENCH_MAX_CTX];
    int ctx[BENCH_MAX_CTX];
    int n_ctx = cli_parse_int_list(ctx_list, 16, 65536, ctx_l, BENCH_MAX_CTX);
    if (n_ctx < 0)
        return cli_fail("--bench-ctx: '%s' is not a list of up to %d contexts 16..65536",
                        ctx_list, BENCH_MAX_CTX);
    for (int c = 0; c < n_ctx; c++)
        ctx[c] = (int)ctx_l[c];
    int precs[2] = {KVP_PREC_F32, KVP_PREC_BF16}, n_prec = 2;
    if (precision >= 0) {
        precs[0] = precision;
        n_prec = 1;
    }
    static double tps[BENCH_MAX_CTX][2][BENCH_MAX_REPS], cpu[BENCH_MAX_CTX][2][BENCH_MAX_REPS];
    const char *kernels[2] = {"", ""};
    struct kvp_err err = {0};
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < n_ctx; c++)
            for (int k = 0; k < n_prec; k++) {
                int pi = (k + r) % n_prec; /* alternate which precision goes first */
                struct kvp_train_bench_req req = {
                    .cfg = *cfg, .T = ctx[c], .tokens_per_step = bench_step_tokens(ctx[c]),
                    .micro_tokens = ctx[c] > 4096 ? ctx[c] : 4096, .precision = precs[pi],
                    .n_threads = threads, .steps = (int)steps, .seed = 1};
                struct kvp_train_bench_result res;
                if (kvp_train_bench(&req, &res, &err) < 0)
                    return cli_fail_err(&err);
                tps[c][pi][r] = res.tokens_per_s;
                cpu[c][pi][r] = res.cpu_s_per_mtok;
                kernels[pi] = res.kernels;
                fprintf(stderr, "bench: ctx %d %s %.0f tok/s (%.1f CPU s per Mtok), loss %.3f\n",
                        ctx[c], kvp_train_precision_name(precs[pi]), res.tokens_per_s,
                        res.cpu_s_per_mtok, res.loss);
            }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "bench", "train-lm");
    cJSON *mj = cJSON_AddObjectToObject(o, "model");
    cJSON_AddNumberToObject(mj, "dim", cfg->n_embd);
    cJSON_AddNumberToObject(mj, "layers", cfg->n_layer);
    cJSON_AddNumberToObject(mj, "heads", cfg->n_head);
    cJSON_AddNumberToObject(mj, "kv_heads", cfg->n_head_kv);
    cJSON_AddNumberToObject(mj, "ff", cfg->n_ff);
    cJSON_AddNumberToObject(mj, "vocab", cfg->n_vocab);
    cJSON_AddNumberToObject(o, "threads", threads);
    cJSON_AddNumberToObject(o, "steps", (double)steps);
    cJSON_AddNumberToObject(o, "reps", (double)reps);
    cJSON *rj = cJSON_AddArrayToObject(o, "results");
    cJSON *sj = n_prec == 2 ? cJSON_AddArrayToObject(o, "speedup") : NULL;
    for (int c = 0; c < n_ctx; c++) {
        double med[2] = {0, 0}, cmed[2] = {0, 0};
        for (int k = 0; k < n_prec; k++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "ctx", ctx[c]);
            cJSON_AddStringToObject(e, "precision", kvp_train_precision_name(precs[k]));
            cJSON_AddStringToObject(e, "kernels", kernels[k]);
            cJSON_AddNumberToObject(e, "tokens_per_step", (double)bench_step_tokens(ctx[c]));
            cJSON *all = cJSON_AddArrayToObject(e, "tokens_per_s");
            for (int r = 0; r < reps; r++)
                cJSON_AddItemToArray(all, cJSON_CreateNumber((double)(long)tps[c][k][r]));
            med[k] = median(tps[c][k], (int)reps);
            cmed[k] = median(cpu[c][k], (int)reps);
            cJSON_AddNumberToObject(e, "tokens_per_s_median", (double)(long)med[k]);
            cJSON_AddNumberToObject(e, "cpu_s_per_mtok_median", (double)(long)(10 * cmed[k]) / 10);
            cJSON_AddItemToArray(rj, e);
        }
        if (sj && med[0] > 0 && cmed[1] > 0) { /* bf16 over f32, by wall clock and by CPU time */
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "ctx", ctx[c]);
            cJSON_AddNumberToObject(e, "tokens_per_s", (double)(long)(100 * med[1] / med[0]) / 100);
            cJSON_AddNumberToObject(e, "cpu_time", (double)(long)(100 * cmed[0] / cmed[1]) / 100);
            cJSON_AddItemToArray(sj, e);
        }
    }
    char *txt = cJSON_Print(o);
    if (txt)
        puts(txt);
    free(txt);
    cJSON_Delete(o);
    return 0;
}

/* The command line: the library's options (o) and the flags the command turns into them. */
struct train_args {
    struct kvp_train_opts o;
    const char *data[MAX_DATA], *hay[MAX_DATA];
    int n_data, n_hay;
    const char *curriculum, *mix, *precision, *bench_ctx;
    bool export_only, untied, bench;
    long bench_steps, bench_reps;
    long steps, ctx, batch, micro, dim, layers, heads, kv_heads, ff, vocab, seed, threads,
        eval_every, eval_samples, ckpt_every, stop_after;
    double lr, lr_min, warmup, wd, clip, answer_weight, rope_base, edge_frac, fill_min, hay_frac;
    int prec; /* --precision's enum kvp_train_precision (-1: the library's choice) */
};

/* The defaults: the library's, and the command's own where it has one. */
static void default_args(struct train_args *a)
{
    memset(a, 0, sizeof(*a));
    kvp_train_opts_default(&a->o);
    const struct kvp_train_opts *o = &a->o;
    a->bench_ctx = "2048,8192,16384";
    a->bench_steps = 2;
    a->bench_reps = 3;
    a->steps = o->hp.steps;
    a->ctx = o->model.n_ctx;
    a->batch = 8;
    a->dim = o->model.n_embd;
    a->layers = o->model.n_layer;
    a->heads = o->model.n_head;
    a->kv_heads = o->model.n_head_kv;
    a->ff = o->model.n_ff;
    a->vocab = o->model.n_vocab;
    a->seed = 1;
    a->threads = o->n_threads;
    a->eval_samples = o->eval_samples;
    a->ckpt_every = 100;
    a->lr = o->hp.lr;
    a->lr_min = -1.0;
    a->warmup = o->hp.warmup_frac;
    a->wd = o->hp.weight_decay;
    a->clip = o->hp.clip;
    a->answer_weight = o->hp.answer_weight;
    a->rope_base = o->model.rope_base;
    a->edge_frac = KVP_EDGE_FRAC_DEFAULT;
    a->fill_min = KVP_FILL_MIN_DEFAULT;
    a->prec = -1;
}

/* --data or --hay at argv[*i] and the paths after it, up to the next flag, into a's lists.
 * Returns 0, or 1 after printing the error. */
static int parse_paths(struct train_args *a, int argc, char **argv, int *i)
{
    const char *flag = argv[*i];
    bool is_hay = !strcmp(flag, "--hay");
    const char **list = is_hay ? a->hay : a->data;
    int *n = is_hay ? &a->n_hay : &a->n_data, n0 = *n;
    while (*i + 1 < argc && argv[*i + 1][0] != '-') {
        if (*n == MAX_DATA)
            return cli_fail("%s: at most %d paths", flag, MAX_DATA);
        list[(*n)++] = argv[++*i];
    }
    if (*n == n0)
        return cli_fail("%s needs at least one path", flag);
    return 0;
}

/* Parse argv into a. Returns 0, 1 after printing an error, or 2 after printing the help. */
static int parse_args(struct train_args *a, int argc, char **argv)
{
    struct kvp_train_opts *o = &a->o;
    const struct cli_flag flags[] = {
        CLI_INT("--steps", 1, 100000000, &a->steps, NULL),
        CLI_INT("--ctx", 16, 65536, &a->ctx, NULL),
        CLI_INT("--batch", 1, 1 << 20, &a->batch, NULL),
        CLI_INT("--micro", 16, 1 << 24, &a->micro, NULL),
        CLI_INT("--dim", 2, 65536, &a->dim, NULL),
        CLI_INT("--layers", 1, 1024, &a->layers, NULL),
        CLI_INT("--heads", 1, 1024, &a->heads, NULL),
        CLI_INT("--kv-heads", 1, 1024, &a->kv_heads, NULL),
        CLI_INT("--ff", 1, 1 << 20, &a->ff, NULL),
        CLI_INT("--vocab", 259, 65536, &a->vocab, NULL),
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &a->seed, NULL),
        CLI_INT("--threads", 1, 64, &a->threads, NULL),
        CLI_INT("--eval-every", 0, 100000000, &a->eval_every, NULL),
        CLI_INT("--eval-samples", 0, 100000, &a->eval_samples, NULL),
        CLI_INT("--ckpt-every", 0, 100000000, &a->ckpt_every, NULL),
        CLI_INT("--stop-after", 0, 100000000, &a->stop_after, NULL),
        CLI_FLOAT("--lr", 1e-8, 10.0, &a->lr, NULL),
        CLI_FLOAT("--lr-min", 0.0, 10.0, &a->lr_min, NULL),
        CLI_FLOAT("--warmup", 0.0, 1.0, &a->warmup, NULL),
        CLI_FLOAT("--wd", 0.0, 10.0, &a->wd, NULL),
        CLI_FLOAT("--clip", 0.0, 1e6, &a->clip, NULL),
        CLI_FLOAT("--answer-weight", 0.0, 1000.0, &a->answer_weight, NULL),
        CLI_FLOAT("--rope-base", 1.0001, 1e9, &a->rope_base, NULL),
        CLI_FLOAT("--edge-frac", 0.0, 1.0, &a->edge_frac, NULL),
        CLI_FLOAT("--fill-min", 0.01, 1.0, &a->fill_min, NULL),
        CLI_FLOAT("--hay-frac", 0.0, 1.0, &a->hay_frac, NULL),
        CLI_STR("--init-from", &o->init_gguf),
        CLI_STR("-o|--output", &o->out_gguf),
        CLI_STR("--ckpt", &o->ckpt_path),
        CLI_STR("--resume", &o->resume_path),
        CLI_STR("--curriculum", &a->curriculum),
        CLI_STR("--mix", &a->mix),
        CLI_BOOL("--export-only", &a->export_only),
        CLI_BOOL("--untied", &a->untied),
        CLI_STR("--precision", &a->precision),
        CLI_BOOL("--bench", &a->bench),
        CLI_STR("--bench-ctx", &a->bench_ctx),
        CLI_INT("--bench-steps", 1, 1000, &a->bench_steps, NULL),
        CLI_INT("--bench-reps", 1, BENCH_MAX_REPS, &a->bench_reps, NULL),
        {0},
    };
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int r = cli_parse_flags(flags, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            train_usage(stdout);
            return 2;
        }
        if (strcmp(arg, "--data") && strcmp(arg, "--hay"))
            return cli_fail("train-lm: unknown flag '%s' (try kvpred train-lm --help)", arg);
        if (parse_paths(a, argc, argv, &i))
            return 1;
    }
    if (a->precision && (a->prec = kvp_train_precision_by_name(a->precision)) < 0)
        return cli_fail("--precision: '%s' is not f32 or bf16", a->precision);
    return 0;
}

/* The model's shape from the flags. */
static struct kvp_train_config model_config(const struct train_args *a)
{
    return (struct kvp_train_config){.n_vocab = (int)a->vocab,
                                     .n_embd = (int)a->dim,
                                     .n_layer = (int)a->layers,
                                     .n_head = (int)a->heads,
                                     .n_head_kv = (int)a->kv_heads,
                                     .n_ff = (int)a->ff,
                                     .n_ctx = (int)a->ctx,
                                     .rope_base = (float)a->rope_base,
                                     .norm_eps = 1e-5f,
                                     .tied = a->untied ? 0 : 1};
}

/* --bench on the model of the flags. Returns the exit status. */
static int bench_model(const struct train_args *a)
{
    struct kvp_train_config bc = model_config(a);
    struct kvp_err err = {0};
    if (kvp_train_config_check(&bc, &err) < 0)
        return cli_fail_err(&err);
    return run_bench(&bc, a->bench_ctx, a->prec, a->bench_steps, a->bench_reps, (int)a->threads);
}

/* What a resumed run takes from the command line instead of the checkpoint: the settings whose
 * flags were given (enum kvp_train_override bits). */
static unsigned resume_overrides(int argc, char **argv)
{
    static const struct {
        const char *flag;
        unsigned bits;
    } given[] = {
        {"--hay-frac", KVP_TRAIN_OVERRIDE_HAY_FRAC},
        {"--ctx", KVP_TRAIN_OVERRIDE_CTX | KVP_TRAIN_OVERRIDE_BATCH},
        {"--rope-base", KVP_TRAIN_OVERRIDE_ROPE},
        {"--curriculum", KVP_TRAIN_OVERRIDE_CURRICULUM},
        {"--batch", KVP_TRAIN_OVERRIDE_BATCH},
        {"--micro", KVP_TRAIN_OVERRIDE_BATCH},
        {"--lr", KVP_TRAIN_OVERRIDE_LR},
        {"--lr-min", KVP_TRAIN_OVERRIDE_LR},
        {"--answer-weight", KVP_TRAIN_OVERRIDE_ANSWER_WEIGHT},
        {"--mix", KVP_TRAIN_OVERRIDE_MIX},
        {"--edge-frac", KVP_TRAIN_OVERRIDE_EDGE_FRAC},
        {"--fill-min", KVP_TRAIN_OVERRIDE_FILL_MIN},
    };
    unsigned bits = 0;
    for (int i = 1; i < argc; i++)
        for (size_t k = 0; k < sizeof(given) / sizeof(given[0]); k++)
            if (!strcmp(argv[i], given[k].flag))
                bits |= given[k].bits;
    return bits;
}

/* Whether the flag appears in argv. */
static bool flag_given(int argc, char **argv, const char *flag)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], flag))
            return true;
    return false;
}

/* The optimiser's and the data mix's settings from the flags into a->o.hp. Returns 0, or 1
 * after printing the error. */
static int set_hparams(struct train_args *a, int argc, char **argv)
{
    struct kvp_train_hparams *hp = &a->o.hp;
    hp->seed = (uint64_t)a->seed;
    hp->steps = a->steps;
    if (a->o.resume_path && !flag_given(argc, argv, "--steps"))
        hp->steps = 0; /* keep the checkpoint's length; --steps N extends a run */
    hp->tokens_per_step = a->batch * a->ctx;
    hp->micro_tokens = a->micro > 0 ? a->micro : (a->ctx > 4096 ? a->ctx : 4096);
    hp->lr = (float)a->lr;
    hp->lr_min = (float)(a->lr_min >= 0.0 ? a->lr_min : a->lr / 10.0);
    hp->warmup_frac = (float)a->warmup;
    hp->weight_decay = (float)a->wd;
    hp->clip = (float)a->clip;
    hp->answer_weight = (float)a->answer_weight;
    if (a->curriculum) {
        if (!parse_curriculum(a->curriculum, hp))
            return cli_fail("--curriculum: '%s' is not ctx:fraction,... (ctx 16..65536)",
                            a->curriculum);
    } else {
        default_curriculum(hp, (int)a->ctx);
    }
    if (a->mix && !parse_mix(a->mix, &hp->mix))
        return cli_fail("--mix: '%s' is not task:weight,... over lm, passkey, niah_single_1..3, "
                        "niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, copy",
                        a->mix);
    hp->mix.edge_frac = (float)a->edge_frac;
    hp->mix.fill_min = (float)a->fill_min;
    hp->mix.hay_frac = (float)a->hay_frac;
    return 0;
}

/* The library's options of a training run (or an export) from the flags. Returns 0, or 1 after
 * printing the error. */
static int training_opts(struct train_args *a, int argc, char **argv)
{
    struct kvp_train_opts *o = &a->o;
    if (a->n_data == 0)
        return cli_fail("train-lm: --data is required");
    if (!o->out_gguf && !o->ckpt_path)
        return cli_fail("train-lm: give -o OUT.gguf and/or --ckpt PATH");
    if (a->export_only && (!(o->resume_path || o->init_gguf) || !o->out_gguf))
        return cli_fail("--export-only needs --resume CKPT or --init-from GGUF, and -o OUT.gguf");
    if (o->init_gguf && o->resume_path)
        return cli_fail("train-lm: --init-from starts a run, --resume continues one: not both");
    o->data_paths = a->data;
    o->n_data_paths = a->n_data;
    o->hay_paths = a->hay;
    o->n_hay_paths = a->n_hay;
    o->model = model_config(a);
    struct kvp_err err = {0};
    if (kvp_train_config_check(&o->model, &err) < 0)
        return cli_fail_err(&err);
    o->resume_override |= resume_overrides(argc, argv);
    if (set_hparams(a, argc, argv))
        return 1;
    if (o->init_gguf && !flag_given(argc, argv, "--rope-base"))
        o->model.rope_base = 0.0f; /* keep the file's */
    o->n_threads = (int)a->threads;
    if (a->prec >= 0)
        o->precision = a->prec;
    o->eval_every = a->eval_every;
    o->eval_samples = (int)a->eval_samples;
    o->ckpt_every = o->ckpt_path ? a->ckpt_every : 0;
    o->stop_after = a->stop_after;
    if (a->export_only) {
        o->eval_samples = 0;
        o->stop_after = -1;
        o->ckpt_path = NULL;
    }
    return 0;
}

int cmd_train_lm(int argc, char **argv)
{
    maybe_reexec(argc, argv);
    struct train_args a;
    default_args(&a);
    int rc = parse_args(&a, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (a.bench)
        return bench_model(&a);
    if (training_opts(&a, argc, argv))
        return 1;
    struct kvp_err err = {0};
    struct ui u = {.tty = isatty(STDERR_FILENO) == 1, .log_every = 1};
    fprintf(stderr, "train-lm: seed %ld, %ld steps of %ld tokens, threads %ld, %s\n", a.seed,
            a.steps, a.o.hp.tokens_per_step, a.threads, kvp_train_precision_name(a.o.precision));
    if (kvp_train_run(&a.o, on_progress, &u, &err) < 0)
        return cli_fail_err(&err);
    return 0;
}
