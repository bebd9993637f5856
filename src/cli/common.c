/* Shared CLI plumbing (see common.h). */
#include "cli/common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/measure_opts.h"
#include "core/stream.h"
#include "eval/task_eval.h"
#include "server/server.h"
#include "tasks/tasks.h"

/* ---- errors and numbers ---- */

/* One line on stderr: "kvpred: KIND: message". */
static void say(const char *kind, const char *fmt, va_list ap)
{
    fprintf(stderr, "kvpred: %s: ", kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say("error", fmt, ap);
    va_end(ap);
    return 1;
}

int cli_fail_err(const struct kvp_err *err)
{
    return cli_fail("%s", err->msg[0] ? err->msg : kvp_strerror(err->code));
}

void cli_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say("warning", fmt, ap);
    va_end(ap);
}

bool cli_parse_int(const char *s, long min, long max, long *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, double min, double max, double *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < min || v > max)
        return false;
    *out = v;
    return true;
}

/* ---- model and context flags ---- */

#define MODEL_FLAGS_HEAD                                                                           \
    "  -m, --model PATH     model file: GGUF, or a llama2.c checkpoint (default: the shipped\n"    \
    "                       model, else ../shared/models/stories260K.gguf)\n"                      \
    "  --tokenizer PATH     llama2.c tokenizer.bin (needed for llama2.c checkpoints)\n"
#define MODEL_FLAGS_CTX "  -c, --ctx N          context length in tokens (default: the model's)\n"
#define MODEL_FLAGS_TAIL                                                                           \
    "  -t, --threads N      threads (default 1)\n"                                                 \
    "  --block N            KV block size in tokens (default 16)\n"                                \
    "  -b, --batch N        prefill micro-batch (default 512)\n"                                   \
    "  -ctk, --cache-type-k T  KV cache key type: f32, f16, bf16, q8_0 (default f16)\n"            \
    "  -ctv, --cache-type-v T  KV cache value type: f32, f16, bf16, q8_0 (default f16)\n"          \
    "  --no-pack            decode from the weights as the file has them; by default, on\n"        \
    "                       AVX-512 VNNI, the first decode token packs Q8_0/Q4_0/Q5_0/Q4_K\n"      \
    "                       weights once into a copy for the SIMD lanes (as large as they\n"       \
    "                       are in the file), which decode reads 1.3-1.4x faster\n"                \
    "  --no-mmap            GGUF: read the model into memory on huge pages instead of\n"           \
    "                       mapping it; decode from weights that are not packed runs ~5%\n"        \
    "                       faster, at the cost of private memory as large as the file\n"

const char *cli_model_flags_help = MODEL_FLAGS_HEAD MODEL_FLAGS_CTX MODEL_FLAGS_TAIL;
const char *cli_model_flags_help_sans_ctx = MODEL_FLAGS_HEAD MODEL_FLAGS_TAIL;

/* enum kvp_kv_type names from index 1 (0 is the default) */
static const char *const kv_type_choices[] = {"", "f32", "f16", "bf16", "q8_0", NULL};

/* Candidates for the default model, in order. */
static const char *default_models[] = {
    "models/kvpred-default.gguf",
    "../shared/models/stories260K.gguf",
};

const char *cli_flag_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        cli_fail("flag %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* True if a is one of the '|'-separated names. */
static bool names_match(const char *names, const char *a)
{
    size_t n = strlen(a);
    for (const char *p = names; *p;) {
        size_t len = strcspn(p, "|");
        if (len == n && !strncmp(p, a, n))
            return true;
        p += len + (p[len] == '|');
    }
    return false;
}

/* Parse v as the row's value and store it; false when it is not one. */
static bool store_value(const struct cli_flag *f, const char *v)
{
    long n;
    double d;
    switch (f->kind) {
    case CLI_FLAG_INT:
    case CLI_FLAG_LONG:
    case CLI_FLAG_U64:
        if (!cli_parse_int(v, f->min, f->max, &n))
            return false;
        n = n == 0 && f->zero_unset ? -1 : n;
        if (f->kind == CLI_FLAG_INT)
            *(int *)f->dst = (int)n;
        else if (f->kind == CLI_FLAG_LONG)
            *(long *)f->dst = n;
        else
            *(uint64_t *)f->dst = (uint64_t)n;
        return true;
    case CLI_FLAG_FLOAT:
    case CLI_FLAG_DOUBLE:
        if (!cli_parse_float(v, f->fmin, f->fmax, &d))
            return false;
        d = d == 0.0 && f->zero_unset ? -1.0 : d;
        if (f->kind == CLI_FLAG_FLOAT)
            *(float *)f->dst = (float)d;
        else
            *(double *)f->dst = d;
        return true;
    case CLI_FLAG_LIST:
        if (*f->count >= f->max)
            return false;
        ((const char **)f->dst)[(*f->count)++] = v;
        return true;
    case CLI_FLAG_CHOICE:
        for (long k = f->min; f->choices[k]; k++)
            if (!strcmp(v, f->choices[k])) {
                *(int *)f->dst = (int)k;
                return true;
            }
        return false;
    default:
        *(const char **)f->dst = v;
        return true;
    }
}

int cli_parse_flags(const struct cli_flag *table, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    const struct cli_flag *f = table;
    while (f->names && !names_match(f->names, a))
        f++;
    if (!f->names)
        return 0;
    if (f->kind == CLI_FLAG_BOOL || f->kind == CLI_FLAG_SET) {
        if (f->kind == CLI_FLAG_BOOL)
            *(bool *)f->dst = true;
        else
            *(int *)f->dst = 1;
        return 1;
    }
    const char *v = cli_flag_value(argc, argv, i);
    if (!v)
        return -1;
    if (store_value(f, v))
        return 1;
    if (f->kind == CLI_FLAG_LIST)
        cli_fail("%s: at most %ld of them", a, f->max);
    else if (f->what)
        cli_fail("%s: '%s' is not %s", a, v, f->what);
    else if (f->kind <= CLI_FLAG_U64)
        cli_fail("%s: '%s' is not an integer in %ld..%ld", a, v, f->min, f->max);
    else
        cli_fail("%s: '%s' is not a number in %g..%g", a, v, f->fmin, f->fmax);
    return -1;
}

int cli_model_flag(struct cli_model_opts *o, int argc, char **argv, int *i)
{
    const struct cli_flag flags[] = {
        CLI_STR("-m|--model", &o->model_path),
        CLI_STR("--tokenizer", &o->tokenizer_path),
        CLI_INT("-c|--ctx|--ctx-size", 1, 1 << 24, &o->n_ctx, NULL),
        CLI_INT("-t|--threads", 1, 256, &o->n_threads, NULL),
        CLI_INT("--block", 1, 4096, &o->block_size, NULL),
        CLI_INT("-b|--batch", 1, 1 << 20, &o->n_batch, NULL),
        CLI_CHOICE("-ctk|--cache-type-k", kv_type_choices, KVP_KV_F32, &o->type_k,
                   "f32, f16, bf16 or q8_0"),
        CLI_CHOICE("-ctv|--cache-type-v", kv_type_choices, KVP_KV_F32, &o->type_v,
                   "f32, f16, bf16 or q8_0"),
        CLI_BOOL("--no-pack", &o->no_pack),
        CLI_BOOL("--no-mmap", &o->no_mmap),
        {0},
    };
    return cli_parse_flags(flags, argc, argv, i);
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
    struct kvp_model_params mp = {.tokenizer_path = o->tokenizer_path, .no_mmap = o->no_mmap};
    struct kvp_err err = {0};
    kvp_model *m = NULL;
    if (kvp_model_open(path, &mp, &m, &err) < 0) {
        cli_fail_err(&err);
        return NULL;
    }
    return m;
}

int cli_split_list(char *s, char **items, int max)
{
    int n = 0;
    for (char *tok = s;; n++) {
        char *comma = strchr(tok, ',');
        if (comma)
            *comma = 0;
        if (!*tok || n == max)
            return -1;
        items[n] = tok;
        if (!comma)
            return n + 1;
        tok = comma + 1;
    }
}

int cli_parse_int_list(const char *s, long lo, long hi, long *out, int max)
{
    size_t len = strlen(s);
    char *buf = malloc(len + 1), **items = malloc((size_t)max * sizeof(char *));
    int n = buf && items ? cli_split_list(memcpy(buf, s, len + 1), items, max) : -1;
    for (int i = 0; i < n; i++)
        if (!cli_parse_int(items[i], lo, hi, &out[i]))
            n = -1;
    free(items);
    free(buf);
    return n;
}

struct kvp_ctx_params cli_ctx_params(const struct cli_model_opts *o, long n_ctx)
{
    return (struct kvp_ctx_params){
        .n_ctx = (int)(n_ctx > 0 ? n_ctx : o->n_ctx),
        .n_threads = (int)o->n_threads,
        .block_size = (int)o->block_size,
        .n_batch = (int)o->n_batch,
        .type_k = o->type_k,
        .type_v = o->type_v,
        .no_pack = o->no_pack,
    };
}

kvp_ctx *cli_open_ctx(const kvp_model *m, const struct cli_model_opts *o, long n_ctx)
{
    struct kvp_ctx_params cp = cli_ctx_params(o, n_ctx);
    return cli_open_ctx_params(m, &cp);
}

kvp_ctx *cli_open_ctx_params(const kvp_model *m, const struct kvp_ctx_params *p)
{
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    struct kvp_ctx_params cp = *p;
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
    char *buf = kvp_read_stream(f, len);
    fclose(f);
    if (!buf)
        cli_fail("%s: cannot read", path);
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

int cli_scored_text_open(struct cli_scored_text *t, const struct cli_model_opts *o,
                         const char *cmd, const char *path, size_t max_bytes)
{
    *t = (struct cli_scored_text){0};
    if (!path)
        return cli_fail("%s: -f FILE is required", cmd);
    if (!(t->m = cli_open_model(o)))
        return 1;
    kvp_model_get_info(t->m, &t->in);
    size_t len;
    char *text = cli_read_file(path, &len);
    if (text && max_bytes > 0 && max_bytes < len)
        len = max_bytes;
    if (text)
        t->ids = cli_tokenize(t->m, text, len, true, &t->n);
    free(text);
    if (!t->ids) {
        cli_scored_text_close(t);
        return 1;
    }
    return 0;
}

void cli_scored_text_close(struct cli_scored_text *t)
{
    free(t->ids);
    kvp_model_close(t->m);
    *t = (struct cli_scored_text){0};
}

int cli_parse_command(const struct cli_command *cmd, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cmd->mo ? cli_model_flag(cmd->mo, argc, argv, &i) : 0;
        if (r == 0 && cmd->pp)
            r = cli_policy_flag(cmd->pp, cmd->policy_seed, argc, argv, &i);
        if (r == 0 && cmd->flags)
            r = cli_parse_flags(cmd->flags, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cmd->help();
            return 2;
        }
        if (a[0] == '-' && a[1])
            return cli_fail("%s: unknown flag '%s' (see kvpred %s --help)", cmd->name, a,
                            cmd->name);
        if (!cmd->positional)
            return cli_fail("%s: unexpected argument '%s' (see kvpred %s --help)", cmd->name, a,
                            cmd->name);
        const char **slot = !*cmd->positional ? cmd->positional : cmd->positional2;
        if (slot && !*slot)
            *slot = a;
        else if (cmd->positional2)
            return cli_fail("%s: two arguments only ('%s', '%s' and '%s')", cmd->name,
                            *cmd->positional, *cmd->positional2, a);
        else
            return cli_fail("%s: one argument only ('%s' and '%s')", cmd->name,
                            *cmd->positional, a);
    }
    struct kvp_policy_params *pp = cmd->pp;
    if (pp && cmd->budget && pp->name && !cli_policy_known(pp->name))
        return cli_fail("--policy: unknown policy '%s' (known: %s)", pp->name, cli_policy_names());
    if (pp && cmd->budget && *cmd->budget &&
        !cli_parse_budget(*cmd->budget, &pp->budget, &pp->budget_ratio))
        return cli_fail("--budget: '%s' is not a token count or a ratio in (0, 1]", *cmd->budget);
    return 0;
}

struct kvp_corpus *cli_open_filler(const char **pathp, int ti)
{
    static char def[4096];
    if (!*pathp && kvp_task_eval_kind(ti)->task != KVP_TASK_PASSKEY) {
        const char *sd = getenv("KVP_SHARED_DIR");
        snprintf(def, sizeof(def), "%s/data/pg_essays", sd ? sd : "../shared");
        *pathp = def;
    }
    struct kvp_corpus *c = NULL;
    struct kvp_err err = {0};
    if (kvp_task_eval_filler(*pathp, ti, &c, &err) < 0) {
        cli_fail("filler: %s", err.msg);
        return NULL;
    }
    if (!*pathp)
        *pathp = "none (the pass key's noise line)";
    return c;
}

int cli_parse_policy_command(const char *name, struct cli_model_opts *mo,
                             struct kvp_policy_params *pp, const char **budget,
                             const struct cli_flag *flags, void (*help)(void), int argc,
                             char **argv)
{
    const struct cli_command cmd = {
        .name = name, .mo = mo, .pp = pp, .flags = flags, .help = help, .budget = budget};
    return cli_parse_command(&cmd, argc, argv);
}

void cli_policy_default_file(const struct cli_model_opts *mo, struct kvp_policy_params *pp,
                             char *buf, size_t cap, const char *who)
{
    if (srv_policy_default_file(mo->model_path ? mo->model_path : "models/kvpred-default.gguf", pp,
                                buf, cap))
        fprintf(stderr, "%s: %s uses %s\n", who, pp->name,
                pp->aux_path == buf ? pp->aux_path : pp->head_profile);
}
