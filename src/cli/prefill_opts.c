/* Prefill attention's flags (see prefill_opts.h). */
#include "cli/prefill_opts.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/measure_opts.h"
#include "core/platform.h"

const char *const cli_prefill_names[] = {"dense",   "pooled", "bound", "strided",
                                         "learned", "sparse", NULL};

const char *cli_prefill_flags_help =
    "  --prefill-policy P   how a prompt attends to itself (docs/prefill.md): dense (default)\n"
    "                       or block-sparse, its key blocks ranked by an estimate: sparse\n"
    "                       (recommended: pooled), pooled (mean query . mean key of each block),\n"
    "                       bound (quest's bound over each block's key max/min), strided\n"
    "                       (exact scores of every 16th query; reads every key), learned\n"
    "                       (a trained gate over each block's mean/max/min key and its\n"
    "                       distance; needs --prefill-predictor)\n"
    "  --prefill-predictor F the learned policy's gate, a .kvpg file (kvpred\n"
    "                       train-prefill-gate; models/kvpred-default.kvpg for the default model)\n"
    "  --prefill-budget B   keys a block of 64 queries reads, sink and window included: a\n"
    "                       count or a ratio of the keys it sees (1/16, 0.0625; default 1/16)\n"
    "  --prefill-threshold X stop adding key blocks once they hold this share of the\n"
    "                       estimated attention (0 < X <= 1; default off: the whole budget)\n"
    "  --prefill-min-keys N query blocks that see fewer keys read them all (default 2048,\n"
    "                       where sparse starts to pay)\n"
    "  --prefill-tail N     the prompt's last N tokens (the question) attend densely (256)\n"
    "  --prefill-window N   keys before a query block it always reads (256)\n"
    "  --prefill-sink N     leading keys every query reads (64)\n";

/* The learned policy's gate, loaded once and freed at exit. */
static struct kvp_prefill_gate *loaded_gate;

static void free_gate(void)
{
    kvp_prefill_gate_free(loaded_gate);
    loaded_gate = NULL;
}

int cli_prefill_check(struct cli_prefill_opts *o)
{
    const int pol = o->policy == KVP_PREFILL_COUNT ? KVP_PREFILL_SPARSE : o->policy;
    const bool tuned = o->budget || o->threshold > 0 || o->min_keys || o->tail >= 0 ||
                       o->window >= 0 || o->sink >= 0;
    if (pol == KVP_PREFILL_DENSE && tuned)
        return cli_fail("--prefill-budget, --prefill-threshold, --prefill-min-keys, "
                        "--prefill-tail, --prefill-window and --prefill-sink need a sparse "
                        "--prefill-policy");
    if (o->gate_path && pol != KVP_PREFILL_LEARNED)
        return cli_fail("--prefill-predictor needs --prefill-policy learned");
    if (pol == KVP_PREFILL_LEARNED && !o->gate_path)
        return cli_fail("--prefill-policy learned needs --prefill-predictor FILE (a .kvpg gate)");
    o->p = (struct kvp_prefill_params){.policy = pol, .threshold = o->threshold,
                                       .min_keys = (int)o->min_keys};
    if (pol == KVP_PREFILL_LEARNED) {
        struct kvp_err err = {0};
        if (!loaded_gate) {
            if (kvp_prefill_gate_load(o->gate_path, &loaded_gate, &err) < 0)
                return cli_fail_err(&err);
            atexit(free_gate);
        }
        o->p.gate = loaded_gate;
    }
    if (o->budget) {
        float ratio = 0;
        if (!cli_parse_budget(o->budget, &o->p.budget, &ratio))
            return cli_fail("--prefill-budget: '%s' is not a token count or a ratio in (0, 1]",
                            o->budget);
        o->p.budget_ratio = ratio;
    }
    /* the library reads 0 as its default and a negative value as none */
    o->p.dense_tail = o->tail < 0 ? 0 : o->tail == 0 ? -1 : (int)o->tail;
    o->p.window = o->window < 0 ? 0 : o->window == 0 ? -1 : (int)o->window;
    o->p.sink = o->sink < 0 ? 0 : o->sink == 0 ? -1 : (int)o->sink;
    return 0;
}

/* The progress line: from the first piece on, the rate since then and the time left; shown once
 * a prompt has run 2 seconds, redrawn at most 4 times a second, erased at its end. */
struct progress {
    int total, first_done;
    double t_first, t_drawn;
    bool shown;
};

static void show_progress(void *user, int done, int total)
{
    struct progress *pg = user;
    const double now = kvp_time_now();
    if (total != pg->total || done <= pg->first_done) { /* a new prompt */
        *pg = (struct progress){.total = total, .first_done = done, .t_first = now};
        return;
    }
    if (done >= total) {
        if (pg->shown)
            fputs("\r\033[K", stderr);
        pg->shown = false;
        pg->total = 0;
        return;
    }
    const double el = now - pg->t_first;
    if (el < 2 || now - pg->t_drawn < 0.25)
        return;
    const double rate = (done - pg->first_done) / el;
    const double left = (total - done) / rate;
    fprintf(stderr, "\r\033[Kprefill: %d/%d tokens, %.0f tok/s, %.0f s left", done, total, rate,
            left);
    fflush(stderr);
    pg->t_drawn = now;
    pg->shown = true;
}

int cli_prefill_apply(const struct cli_prefill_opts *o, kvp_ctx *ctx)
{
    static struct progress pg;
    struct kvp_err err = {0};
    if (kvp_ctx_set_prefill(ctx, &o->p, &err) < 0)
        return cli_fail_err(&err);
    if (isatty(STDERR_FILENO))
        kvp_ctx_set_progress(ctx, show_progress, &pg);
    return 0;
}

void cli_prefill_take(const kvp_ctx *ctx, int n_layer, struct cli_prefill_report *r)
{
    kvp_ctx_prefill_stats(ctx, &r->st);
    r->n_layer = n_layer < 256 ? n_layer : 256;
    for (int l = 0; l < r->n_layer; l++)
        r->density[l] = kvp_ctx_prefill_density(ctx, l);
}

void cli_prefill_json(struct cJSON *j, const struct cli_prefill_opts *o,
                      const struct cli_prefill_report *r)
{
    cJSON_AddStringToObject(j, "prefill_policy", kvp_prefill_policy_name(o->p.policy));
    if (o->budget)
        cJSON_AddStringToObject(j, "prefill_budget", o->budget);
    else
        cJSON_AddNullToObject(j, "prefill_budget");
    if (r->st.keys_seen > 0)
        cJSON_AddNumberToObject(j, "prefill_density", r->st.keys_read / r->st.keys_seen);
    else
        cJSON_AddNullToObject(j, "prefill_density");
    cJSON *a = cJSON_AddArrayToObject(j, "prefill_density_layers");
    for (int l = 0; l < r->n_layer; l++)
        cJSON_AddItemToArray(a, r->density[l] < 0 ? cJSON_CreateNull()
                                                  : cJSON_CreateNumber(r->density[l]));
    cJSON_AddNumberToObject(j, "prefill_estimate_s", r->st.estimate_s);
    cJSON_AddNumberToObject(j, "prefill_attention_s", r->st.attention_s);
}
