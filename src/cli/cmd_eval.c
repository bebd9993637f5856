/*
 * `kvpred eval`: every policy × budget on identical forced tokens, measured against the dense
 * reference (src/eval/measure.h has the protocol and the metric definitions,
 * docs/methods.md §6).
 *
 * Output: a table (stdout; stderr with --json) and, with --json, one JSON object per line per
 * (policy, budget) on stdout. `full` ignores budgets, so it runs once with budget "all".
 *
 * JSON fields (one object per line):
 *   model                  string  model name (general.name or the file name)
 *   text                   string  the text file, or null with --tokens-from-seed
 *   offset                 int     byte offset into the text where tokenizing started
 *   token_seed             int     seed of --tokens-from-seed, or null
 *   n_prefill              int     N: prompt tokens (BOS included), prefilled densely
 *   n_decode               int     M: teacher-forced decode steps (step i feeds token N+i and
 *                                  is scored on token N+i+1)
 *   policy                 string  policy name
 *   budget                 string  the budget as given ("64", "1/16", "0.0625"; "all" for full)
 *   budget_tokens          number  mean per-step token budget per (layer, KV head), sink and
 *                                  local included (what the oracles were given)
 *   budget_ratio           number  the ratio when the budget was given as one, else 0
 *   sink, local, window, pool, pool_max, dense_layers, seed, block_size
 *                          int     resolved policy parameters
 *   gqa_agg                string  "mean", "max" or "sum"
 *   aux, policy_opts       string  --aux file and --policy-opts, when given
 *   adaptive, adaptive_ratio, eta, chunk, tail_tokens, percentile, head_profile
 *                                  catekv rows only: its parameters as given (0 = default)
 *   retention_k            int     K of token retention
 *   recovery               number  mean attention recovery over steps, compressed layers and
 *                                  query heads
 *   recovery_layers        array   [n_layer] mean recovery per layer; null for dense layers
 *   oracle_block_recovery  number  the same for the block oracle at the same budget (forced sink
 *                                  and local, top blocks by the group-summed attention)
 *   oracle_block_recovery_layers  array  [n_layer], like recovery_layers
 *   oracle_token_recovery  number  the same for the token oracle (bound for every policy)
 *   oracle_relative        number  recovery / oracle_block_recovery (AttentionPredictor's
 *                                  R_pred / R_target; may exceed 1 for token-granular policies)
 *   oracle_token_relative  number  recovery / oracle_token_recovery
 *   retention              number  mean |Top-K(a_t) ∩ S| / K, S = the tokens a step read
 *   kl                     number  mean KL(p_full ‖ p_policy) of the next-token distributions,
 *                                  nats, double precision
 *   kl_max                 number  largest per-step KL
 *   top1                   number  fraction of steps whose argmax agrees with full attention
 *   ppl                    number  perplexity of the forced continuation, policy
 *   ppl_full               number  the same with full attention
 *   ppl_ratio              number  ppl / ppl_full
 *   read_fraction          number  mean |S| / Lk per step, compressed layer and KV head
 *   read_tokens            number  mean |S| (tokens read) per step, compressed layer and KV
 *                                  head; above budget_tokens for policies whose budget leaves
 *                                  out generated tokens (snapkv, pyramidkv:
 *                                  docs/methods.md §4) or whose block-aligned local
 *                                  window overshoots it by < bs
 *   compression            number  achieved compression 1 - kept/Lk (kept: tokens not evicted),
 *                                  mean over steps, compressed layers and KV heads
 *                                  (docs/methods.md §4)
 *   kv_resident_bytes      int     KV bytes in physical blocks holding live tokens, after the
 *                                  last step (all layers); the run keeps evicted data in place,
 *                                  so token-evicting policies are counted as compacted, exactly
 *                                  what a real run holds (kvp_kvcache_compact)
 *   kv_kept_bytes          int     bytes of the live tokens themselves
 *   kv_resident_bytes_full int     kv_resident_bytes of full attention
 *   kv_kept_bytes_full     int     kv_kept_bytes of full attention
 *   seconds                number  wall time of the run
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/measure_opts.h"
#include "cli/prefill_opts.h"
#include "cli/tier_opts.h"
#include "eval/measure.h"
#include "policy/policy.h"

static void help(void)
{
    printf("usage: kvpred eval [-m MODEL] (-f TEXT | --tokens-from-seed S) [--policy P,...]\n"
           "                   [--budget B,...] [--prefill N] [--decode N] [--json] [options]\n\n"
           "Run every policy x budget on the same forced tokens: prefill N tokens of the text,\n"
           "then decode the next M with teacher forcing next to full attention, and report\n"
           "attention recovery, recovery relative to the block oracle, token retention, KL and\n"
           "top-1 agreement with full attention, perplexity, and KV memory.\n\n%s"
           "  -f, --file PATH      text to read the tokens from\n"
           "  --offset BYTES       start tokenizing at this byte of the text (default 0)\n"
           "  --tokens-from-seed S random token ids from seed S (models without a tokenizer)\n"
           "  --policy LIST        comma-separated policies, or 'all' (default all); known: %s\n"
           "  --budget LIST        comma-separated budgets: tokens per layer and KV head (64),\n"
           "                       or ratios of the context (1/16, 0.0625) (default 32,64,128)\n"
           "  --prefill N          prompt tokens, BOS included (default 256)\n"
           "  --decode N           teacher-forced decode steps (default 256)\n"
           "  --retention-k K      K of token retention (default 32)\n"
           "  --json               one JSON object per line per (policy, budget) on stdout; the\n"
           "                       table goes to stderr\n"
           "%s"
           "                       (measured on tiered stores, the numbers equal the untiered\n"
           "                       ones; evicting policies are refused, and left out of 'all')\n"
           "%s"
           "                       (the measured context's prompt; the reference is dense)\n"
           "  --seed S             seed of random policies (default 0)\n"
           "  --task T             retrieval accuracy on RULER-style prompts instead (see\n"
           "                       kvpred eval --task passkey --help)\n%s",
           cli_model_flags_help, cli_policy_names(), cli_tier_flags_help,
           cli_prefill_flags_help, cli_policy_flags_help());
}

struct eval_opts {
    struct cli_model_opts mo;
    struct cli_token_source src;
    struct kvp_policy_params pp; /* option flags shared by every run */
    struct cli_grid grid; /* --policy x --budget */
    long n_prefill, n_decode, retention_k;
    bool json;
    struct cli_tier_opts to; /* the measured contexts' cache */
    struct cli_prefill_opts pf; /* the measured context's prefill attention */
};

/* --policy all: without --aux, not the policies that need a file; tiered, not the evicting ones
 * (a tiered store keeps the whole cache) */
static bool all_keep(const struct kvp_policy_ops *ops, const void *ud)
{
    const struct eval_opts *o = ud;
    return (o->pp.aux_path || !ops->needs_aux) && (!o->to.tier || !ops->evicting);
}

/* Parse argv into o. Returns 0, 1 after printing an error, or 2 after printing the help. */
static int parse_args(struct eval_opts *o, int argc, char **argv)
{
    const char *policy_list = "all", *budget_list = "32,64,128";
    const struct cli_flag flags[] = {
        CLI_TOKEN_SOURCE_FLAGS(&o->src),
        CLI_STR("--policy", &policy_list),
        CLI_STR("--budget", &budget_list),
        CLI_INT("--prefill", 1, 1 << 24, &o->n_prefill, "a positive token count"),
        CLI_INT("--decode", 1, 1 << 24, &o->n_decode, "a positive token count"),
        CLI_INT("--retention-k", 1, 1 << 20, &o->retention_k, "a positive count"),
        CLI_BOOL("--json", &o->json),
        CLI_TIER_FLAGS(&o->to),
        CLI_PREFILL_FLAGS(&o->pf),
        {0},
    };
    int rc = cli_parse_measure_command("eval", &o->mo, &o->pp, &o->src, flags, help, argc, argv);
    if (rc)
        return rc;
    if (cli_tier_check(&o->to, true) || cli_prefill_check(&o->pf))
        return 1;
    return cli_grid_parse(&o->grid, policy_list, budget_list, all_keep, o);
}

/* ---- progress bar ---------------------------------------------------------------------------- */

struct progress {
    bool on;          /* stderr is a terminal */
    long done, total; /* decode steps */
    const char *policy, *budget;
};

static void progress_step(void *ud, const struct kvp_measure *ms, int step)
{
    (void)ms;
    (void)step;
    struct progress *pg = ud;
    pg->done++;
    if (!pg->on || (pg->done % 8 && pg->done != pg->total))
        return;
    const int width = 30;
    int fill = (int)(width * pg->done / (pg->total > 0 ? pg->total : 1));
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r\033[Keval [%s] %3ld%%  %s @ %s", bar, 100 * pg->done / pg->total,
            pg->policy, pg->budget);
    fflush(stderr);
}

/* ---- output ---------------------------------------------------------------------------------- */

static void table_header(FILE *f)
{
    fprintf(f, "%-12s %7s %8s %8s %8s %9s %10s %6s %8s %11s %6s %6s\n", "policy", "budget",
            "recovery", "orc_rel", "orc_tok", "retention", "KL", "top-1", "ppl", "KV resident",
            "compr", "read");
}

static void table_row(FILE *f, const char *policy, const char *budget,
                      const struct kvp_measure_result *r)
{
    fprintf(f, "%-12s %7s %8.4f %8.4f %8.4f %9.4f %10.3e %6.3f %8.4f %11zu %6.3f %6.3f\n", policy,
            budget, r->recovery, r->oracle_block > 0 ? r->recovery / r->oracle_block : 0.0,
            r->oracle_token, r->retention, r->kl, r->top1, r->ppl, r->kv_resident, r->compression,
            r->read_fraction);
}

static cJSON *layer_array(const double *v, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int l = 0; a && l < n; l++)
        cJSON_AddItemToArray(a, v[l] < 0 ? cJSON_CreateNull() : cJSON_CreateNumber(v[l]));
    return a;
}

static void json_row(const struct eval_opts *o, const char *model_name, const char *budget,
                     const struct kvp_measure_result *r, const struct cli_prefill_report *pf)
{
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return;
    const struct kvp_policy_params *p = &r->p;
    cJSON_AddStringToObject(j, "model", model_name);
    if (o->src.text_path)
        cJSON_AddStringToObject(j, "text", o->src.text_path);
    else
        cJSON_AddNullToObject(j, "text");
    cJSON_AddNumberToObject(j, "offset", (double)o->src.offset);
    if (o->src.seed >= 0)
        cJSON_AddNumberToObject(j, "token_seed", (double)o->src.seed);
    else
        cJSON_AddNullToObject(j, "token_seed");
    cJSON_AddNumberToObject(j, "n_prefill", (double)o->n_prefill);
    cJSON_AddNumberToObject(j, "n_decode", (double)o->n_decode);
    cJSON_AddStringToObject(j, "policy", p->name);
    cJSON_AddStringToObject(j, "budget", budget);
    cJSON_AddNumberToObject(j, "budget_tokens", r->budget_tokens);
    cJSON_AddNumberToObject(j, "budget_ratio", p->budget > 0 ? 0.0 : p->budget_ratio);
    cJSON_AddNumberToObject(j, "sink", p->sink);
    cJSON_AddNumberToObject(j, "local", p->local);
    cJSON_AddNumberToObject(j, "window", p->window);
    cJSON_AddNumberToObject(j, "pool", p->pool);
    cJSON_AddNumberToObject(j, "pool_max", p->pool_max);
    cJSON_AddNumberToObject(j, "dense_layers", p->dense_layers);
    cJSON_AddStringToObject(j, "gqa_agg", cli_gqa_agg_name(p->gqa_agg));
    cJSON_AddNumberToObject(j, "seed", (double)p->seed);
    if (p->aux_path)
        cJSON_AddStringToObject(j, "aux", p->aux_path);
    if (p->opts)
        cJSON_AddStringToObject(j, "policy_opts", p->opts);
    if (!strcmp(p->name, "catekv")) {
        /* catekv's own parameters as given (0: the library default) */
        static const char *const modes[] = {"full", "fraction", "quest", "predictor"};
        cJSON_AddStringToObject(j, "adaptive",
                                p->adaptive_mode >= 0 && p->adaptive_mode < 4
                                    ? modes[p->adaptive_mode] : "?");
        cJSON_AddNumberToObject(j, "adaptive_ratio", p->adaptive_ratio);
        cJSON_AddNumberToObject(j, "eta", p->eta);
        cJSON_AddNumberToObject(j, "chunk", p->chunk);
        cJSON_AddNumberToObject(j, "tail_tokens", p->tail_tokens);
        cJSON_AddNumberToObject(j, "percentile", p->percentile);
        if (p->head_profile)
            cJSON_AddStringToObject(j, "head_profile", p->head_profile);
    }
    cJSON_AddNumberToObject(j, "block_size", r->block_size);
    cJSON_AddNumberToObject(j, "retention_k", (double)o->retention_k);
    cJSON_AddNumberToObject(j, "recovery", r->recovery);
    cJSON_AddItemToObject(j, "recovery_layers", layer_array(r->layer_recovery, r->n_layer));
    cJSON_AddNumberToObject(j, "oracle_block_recovery", r->oracle_block);
    cJSON_AddItemToObject(j, "oracle_block_recovery_layers",
                          layer_array(r->layer_oracle_block, r->n_layer));
    cJSON_AddNumberToObject(j, "oracle_token_recovery", r->oracle_token);
    cJSON_AddNumberToObject(j, "oracle_relative",
                            r->oracle_block > 0 ? r->recovery / r->oracle_block : 0.0);
    cJSON_AddNumberToObject(j, "oracle_token_relative",
                            r->oracle_token > 0 ? r->recovery / r->oracle_token : 0.0);
    cJSON_AddNumberToObject(j, "retention", r->retention);
    cJSON_AddNumberToObject(j, "kl", r->kl);
    cJSON_AddNumberToObject(j, "kl_max", r->kl_max);
    cJSON_AddNumberToObject(j, "top1", r->top1);
    cJSON_AddNumberToObject(j, "ppl", r->ppl);
    cJSON_AddNumberToObject(j, "ppl_full", r->ppl_full);
    cJSON_AddNumberToObject(j, "ppl_ratio", r->ppl / r->ppl_full);
    cJSON_AddNumberToObject(j, "read_fraction", r->read_fraction);
    cJSON_AddNumberToObject(j, "read_tokens", r->read_tokens);
    cJSON_AddNumberToObject(j, "compression", r->compression);
    cJSON_AddNumberToObject(j, "kv_resident_bytes", (double)r->kv_resident);
    cJSON_AddNumberToObject(j, "kv_kept_bytes", (double)r->kv_kept);
    cJSON_AddNumberToObject(j, "kv_resident_bytes_full", (double)r->kv_resident_full);
    cJSON_AddNumberToObject(j, "kv_kept_bytes_full", (double)r->kv_kept_full);
    cJSON_AddNumberToObject(j, "seconds", r->seconds);
    /* the measured context's prompt attention (the reference's is dense) */
    cli_prefill_json(j, &o->pf, pf);
    char *s = cJSON_PrintUnformatted(j);
    if (s)
        printf("%s\n", s);
    fflush(stdout);
    cJSON_free(s);
    cJSON_Delete(j);
}

/* ---- the command ----------------------------------------------------------------------------- */

/* Run every (policy, budget) of o on ms and print the rows. Returns 0 or 1 after an error. */
static int run_all(const struct eval_opts *o, struct kvp_measure *ms, const char *model_name)
{
    FILE *tf = o->json ? stderr : stdout;
    struct progress pg = {.on = isatty(STDERR_FILENO) != 0};
    const struct cli_grid *g = &o->grid;
    for (int i = 0; i < g->n_policies; i++)
        pg.total += cli_grid_budgets(g, i) * o->n_decode;
    bool header = false;
    for (int i = 0; i < g->n_policies; i++) {
        for (int k = 0; k < cli_grid_budgets(g, i); k++) {
            struct kvp_policy_params pp;
            const char *label = cli_grid_cell(g, i, k, &o->pp, &pp);
            pg.policy = pp.name;
            pg.budget = label;
            struct kvp_measure_result r;
            struct kvp_err err = {0};
            kvp_ctx_prefill_reset_stats(kvp_measure_policy_ctx(ms));
            if (kvp_measure_run(ms, &pp, progress_step, &pg, &r, &err) < 0) {
                if (pg.on)
                    fprintf(stderr, "\r\033[K");
                return cli_fail("eval: %s @ %s: %s", pp.name, label, err.msg);
            }
            if (pg.on)
                fprintf(stderr, "\r\033[K");
            if (!header) {
                fprintf(tf, "# %s: %ld prefill + %ld decode tokens; full-attention ppl %.4f\n",
                        model_name, o->n_prefill, o->n_decode, r.ppl_full);
                table_header(tf);
                header = true;
            }
            table_row(tf, pp.name, label, &r);
            fflush(tf);
            if (o->json) {
                struct cli_prefill_report pf;
                cli_prefill_take(kvp_measure_ctx(ms), r.n_layer, &pf);
                json_row(o, model_name, label, &r, &pf);
            }
            kvp_measure_result_free(&r);
        }
    }
    return 0;
}

int cmd_eval(int argc, char **argv)
{
    struct eval_opts o = {.src = {.seed = -1},
                          .pp = {.gqa_agg = KVP_AGG_MEAN},
                          .n_prefill = 256,
                          .n_decode = 256,
                          .retention_k = 32,
                          .to = CLI_TIER_OPTS_INIT,
                          .pf = CLI_PREFILL_OPTS_INIT};
    int rc = parse_args(&o, argc, argv);
    if (rc) {
        cli_grid_free(&o.grid);
        return rc == 2 ? 0 : 1;
    }
    int status = 1;
    int32_t *tokens = NULL;
    struct kvp_measure *ms = NULL;
    kvp_model *model = cli_open_model(&o.mo);
    if (!model)
        goto out;
    struct kvp_model_info info;
    kvp_model_get_info(model, &info);
    long need = o.n_prefill + o.n_decode;
    if (o.mo.n_ctx > 0 && o.mo.n_ctx < need) {
        cli_fail("eval: prefill + decode (%ld) exceed the context -c %ld", need, o.mo.n_ctx);
        goto out;
    }
    if (need > info.n_ctx_train)
        cli_warn("prefill + decode (%ld) exceed the model's training context %d", need,
                 info.n_ctx_train);
    tokens = cli_measure_tokens(model, &o.src, (int)need + 1);
    if (!tokens)
        goto out;
    struct kvp_ctx_params cp = cli_ctx_params(&o.mo, 0);
    cli_tier_apply(&o.to, &cp);
    struct kvp_measure_params mp = {.n_prefill = (int)o.n_prefill,
                                    .n_decode = (int)o.n_decode,
                                    .retention_k = (int)o.retention_k};
    struct kvp_err err = {0};
    if (kvp_measure_init(model, tokens, &cp, &mp, &ms, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    if (cli_prefill_apply(&o.pf, kvp_measure_policy_ctx(ms)))
        goto out;
    status = run_all(&o, ms, info.name);
out:
    kvp_measure_free(ms);
    free(tokens);
    kvp_model_close(model);
    cli_grid_free(&o.grid);
    return status;
}
