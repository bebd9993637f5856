/* Policy option flags, budgets and forced tokens for eval, viz and run (see measure_opts.h). */
#include "cli/measure_opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common.h"
#include "core/rng.h"
#include "policy/budget.h"
#include "policy/policy.h"

static const char *const shared_flags_help =
    "  --sink N             leading tokens always kept (default 16)\n"
    "  --local N            most recent tokens always kept (default 16)\n"
    "  --window N           observation window of prompt-time policies (default 32)\n"
    "  --pool N             SnapKV pooling kernel, odd (default 5)\n"
    "  --pool-max           SnapKV: max pooling instead of average\n"
    "  --dense-layers N     leading layers that always run dense (default 2)\n"
    "  --gqa-agg A          combine a GQA group's scores by max, mean or sum (default mean)\n"
    "  --normalize          h2o: divide accumulated attention by the queries that saw the key\n"
    "  --aux PATH           a file the policy needs (predictor weights, head profile)\n"
    "  --policy-opts S      policy-specific key=value,... options, by policy:\n";

/* The shared flags, then every registered policy's option table: its --policy-opts keys and
 * the flags of the options that have one. */
const char *cli_policy_flags_help(void)
{
    static char help[8192];
    if (help[0])
        return help;
    size_t n = (size_t)snprintf(help, sizeof(help), "%s", shared_flags_help);
    for (int k = 0; kvp_policy_registry[k] && n < sizeof(help); k++) {
        const struct kvp_policy_ops *ops = kvp_policy_registry[k];
        char keys[1024];
        kvp_policy_opts_keys(ops->opts, keys, sizeof(keys));
        if (keys[0])
            n += (size_t)snprintf(help + n, sizeof(help) - n, "                         %s: %s\n",
                                  ops->name, keys);
    }
    for (int k = 0; kvp_policy_registry[k] && n < sizeof(help); k++) {
        const struct kvp_policy_opt *o = kvp_policy_registry[k]->opts;
        for (; o && o->type != KVP_OPT_END && n < sizeof(help); o++)
            if (o->flag)
                n += (size_t)snprintf(help + n, sizeof(help) - n, "  %-20s %s: %s\n", o->flag,
                                      kvp_policy_registry[k]->name, o->help);
    }
    return help;
}

/* A flag of some registered policy's option table (catekv's --adaptive, --eta, ...): 1 stored,
 * 0 not one, -1 error printed. */
static int table_flag(struct kvp_policy_params *p, int argc, char **argv, int *i)
{
    const struct kvp_policy_opt *o = NULL;
    for (int k = 0; kvp_policy_registry[k] && !o; k++)
        o = kvp_policy_opt_by_flag(kvp_policy_registry[k]->opts, argv[*i]);
    if (!o || o->home != KVP_OPT_PARAMS)
        return 0;
    const char *flag = argv[*i], *v = cli_flag_value(argc, argv, i);
    if (!v)
        return -1;
    struct kvp_err err = {0};
    if (kvp_policy_opt_set(o, v, p, NULL, &err) < 0)
        return cli_fail("%s: %s", flag, err.msg), -1;
    return 1;
}

/* indexed by enum kvp_gqa_agg */
static const char *const agg_names[] = {"mean", "max", "sum", NULL};

const char *cli_gqa_agg_name(int agg)
{
    return agg >= 0 && agg <= 2 ? agg_names[agg] : "?";
}

const char *cli_policy_names(void)
{
    static char names[1024];
    names[0] = 0;
    for (int i = 0; kvp_policy_name(i); i++) {
        strncat(names, i ? ", " : "", sizeof(names) - strlen(names) - 1);
        strncat(names, kvp_policy_name(i), sizeof(names) - strlen(names) - 1);
    }
    return names;
}

bool cli_policy_known(const char *name)
{
    for (int i = 0; kvp_policy_name(i); i++)
        if (!strcmp(kvp_policy_name(i), name))
            return true;
    return false;
}

int cli_policy_flag(struct kvp_policy_params *p, bool with_seed, int argc, char **argv, int *i)
{
    const struct cli_flag flags[] = {
        CLI_INT0("--sink", 0, 1 << 24, &p->sink, NULL),
        CLI_INT0("--local", 0, 1 << 24, &p->local, NULL),
        CLI_INT0("--dense-layers", 0, 4096, &p->dense_layers, NULL),
        CLI_BOOL("--pool-max", &p->pool_max),
        CLI_BOOL("--normalize", &p->normalize),
        CLI_INT("--window", 1, 1 << 24, &p->window, "a positive token count"),
        CLI_INT("--pool", 1, 1023, &p->pool, "an odd kernel size in 1..1023"),
        CLI_CHOICE("--gqa-agg", agg_names, 0, &p->gqa_agg, "one of max, mean, sum"),
        CLI_STR("--aux", &p->aux_path),
        CLI_STR("--policy-opts", &p->opts),
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &p->seed, "a non-negative integer"),
        {0},
    };
    if (!with_seed && !strcmp(argv[*i], "--seed"))
        return 0; /* the command's own --seed */
    int r = table_flag(p, argc, argv, i);
    if (r == 0)
        r = cli_parse_flags(flags, argc, argv, i);
    /* the table checks the range; the kernel must also be odd */
    if (r > 0 && p->pool % 2 == 0 && p->pool != 0)
        return cli_fail("--pool: '%s' is not an odd kernel size in 1..1023", argv[*i]), -1;
    return r;
}

bool cli_parse_budget(const char *s, int *budget, float *ratio)
{
    return kvp_budget_parse(s, budget, ratio);
}

int cli_grid_parse(struct cli_grid *g, const char *policies, const char *budgets,
                   bool (*all_keep)(const struct kvp_policy_ops *ops, const void *ud),
                   const void *ud)
{
    size_t pl = strlen(policies), bl = strlen(budgets);
    if (!(g->lists = malloc(pl + bl + 2)))
        return cli_fail("out of memory");
    memcpy(g->lists, policies, pl + 1);
    memcpy(g->lists + pl + 1, budgets, bl + 1);
    char *items[CLI_GRID_MAX];
    if (all_keep && !strcmp(policies, "all")) {
        g->n_policies = 0;
        for (int i = 0; kvp_policy_registry[i] && g->n_policies < CLI_GRID_MAX; i++)
            if (all_keep(kvp_policy_registry[i], ud))
                g->policies[g->n_policies++] = kvp_policy_registry[i]->name;
    } else if ((g->n_policies = cli_split_list(g->lists, items, CLI_GRID_MAX)) < 0) {
        return cli_fail("--policy: '%s' is not a comma-separated list of policies", policies);
    } else {
        for (int i = 0; i < g->n_policies; i++)
            g->policies[i] = items[i];
    }
    for (int i = 0; i < g->n_policies; i++)
        if (!cli_policy_known(g->policies[i]))
            return cli_fail("--policy: unknown policy '%s' (known: %s)", g->policies[i],
                            cli_policy_names());
    if ((g->n_budgets = cli_split_list(g->lists + pl + 1, items, CLI_GRID_MAX)) < 0)
        return cli_fail("--budget: '%s' is not a comma-separated list of budgets", budgets);
    for (int i = 0; i < g->n_budgets; i++) {
        int b;
        float r;
        if (!cli_parse_budget(items[i], &b, &r))
            return cli_fail("--budget: '%s' is not a token count or a ratio in (0, 1] such as "
                            "1/16 or 0.0625",
                            items[i]);
        g->budgets[i] = items[i];
    }
    return 0;
}

void cli_grid_free(struct cli_grid *g)
{
    free(g->lists);
    g->lists = NULL;
}

int cli_grid_budgets(const struct cli_grid *g, int i)
{
    return strcmp(g->policies[i], "full") ? g->n_budgets : 1;
}

const char *cli_grid_cell(const struct cli_grid *g, int i, int k,
                          const struct kvp_policy_params *base, struct kvp_policy_params *pp)
{
    *pp = *base;
    pp->name = g->policies[i];
    if (!strcmp(g->policies[i], "full"))
        return "all";
    cli_parse_budget(g->budgets[k], &pp->budget, &pp->budget_ratio);
    return g->budgets[k];
}

/* Tokenize a growing prefix of text until it yields n tokens with a margin (so the cut at the
 * end of the prefix cannot change them) or the text runs out. */
static int32_t *tokens_from_text(const kvp_model *m, const char *text, size_t len, int n)
{
    size_t chunk = (size_t)n * 8 + 256;
    for (;;) {
        size_t use = chunk < len ? chunk : len;
        size_t got = 0;
        int32_t *ids = cli_tokenize(m, text, use, true, &got);
        if (!ids)
            return NULL;
        if (got >= (size_t)n + 16 || (use == len && got >= (size_t)n))
            return ids;
        free(ids);
        if (use == len) {
            cli_fail("the text has %zu tokens from the offset on; %d are needed (prefill + "
                     "decode + 1)",
                     got, n);
            return NULL;
        }
        chunk *= 2;
    }
}

int32_t *cli_measure_tokens(const kvp_model *m, const struct cli_token_source *src, int n)
{
    if (src->seed >= 0) {
        struct kvp_model_info info;
        kvp_model_get_info(m, &info);
        int32_t *ids = malloc((size_t)n * sizeof(int32_t));
        if (!ids) {
            cli_fail("out of memory");
            return NULL;
        }
        uint64_t s = (uint64_t)src->seed;
        for (int i = 0; i < n; i++)
            ids[i] = (int32_t)(kvp_splitmix64(&s) % (uint64_t)info.n_vocab);
        return ids;
    }
    size_t len = 0;
    char *text = cli_read_file(src->text_path, &len);
    if (!text)
        return NULL;
    int32_t *ids = NULL;
    if ((size_t)src->offset >= len)
        cli_fail("--offset %ld is past the end of %s (%zu bytes)", src->offset, src->text_path,
                 len);
    else
        ids = tokens_from_text(m, text + src->offset, len - (size_t)src->offset, n);
    free(text);
    return ids;
}

int cli_parse_measure_command(const char *name, struct cli_model_opts *mo,
                              struct kvp_policy_params *pp, const struct cli_token_source *src,
                              const struct cli_flag *flags, void (*help)(void), int argc,
                              char **argv)
{
    const struct cli_command cmd = {
        .name = name, .mo = mo, .pp = pp, .policy_seed = true, .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc;
    if (!src->text_path && src->seed < 0)
        return cli_fail("%s: give a text with -f FILE (or --tokens-from-seed S)", name);
    if (src->text_path && src->seed >= 0)
        return cli_fail("%s: give either -f or --tokens-from-seed, not both", name);
    return 0;
}
