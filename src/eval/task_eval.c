/* The evaluation protocol of `kvpred eval --task`: see task_eval.h. */
#include "eval/task_eval.h"

#include <stdlib.h>
#include <string.h>

#include "core/fnv.h"
#include "core/platform.h"
#include "core/rng.h"
#include "eval/metrics.h"
#include "eval/ruler.h"
#include "forward/context.h"
#include "policy/policy.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"

static const struct kvp_task_eval_kind kinds[] = {
    {"passkey", KVP_TASK_PASSKEY, 16},
    {"niah_single", KVP_TASK_NIAH_SINGLE_2, 128},
    {"niah_multikey", KVP_TASK_NIAH_MULTIKEY_1, 128},
    {"niah_multivalue", KVP_TASK_NIAH_MULTIVALUE, 128},
    {"niah_multiquery", KVP_TASK_NIAH_MULTIQUERY, 128},
    {"vt", KVP_TASK_VT, 30},
};
#define N_KINDS ((int)(sizeof(kinds) / sizeof(kinds[0])))

const struct kvp_task_eval_kind *kvp_task_eval_kind(int ti)
{
    return ti >= 0 && ti < N_KINDS ? &kinds[ti] : NULL;
}

int kvp_task_eval_index(const char *name)
{
    for (int t = 0; name && t < N_KINDS; t++)
        if (!strcmp(name, kinds[t].name))
            return t;
    return -1;
}

int kvp_task_eval_filler(const char *path, int ti, struct kvp_corpus **out, struct kvp_err *err)
{
    *out = NULL;
    if (!path) {
        /* the pass key's haystack is its own noise line: no filler needed, so it runs on a
         * fresh clone (the corpus only seeds a draw the passkey prompt never reads) */
        if (kinds[ti].task != KVP_TASK_PASSKEY)
            return kvp_err_set(err, KVP_EINVAL, "%s needs a filler text", kinds[ti].name);
        return kvp_corpus_passkey_only(out, err);
    }
    char *raw = NULL;
    size_t len = 0;
    int rc = kvp_corpus_read_filler(&path, 1, &raw, &len, err);
    if (rc == 0)
        rc = kvp_corpus_init(out, raw, len, NULL, 0.0, err);
    free(raw);
    return rc;
}

/* Tokens of text in the model under test, BOS included: the prompts' length unit. */
int kvp_task_eval_count_tokens(void *ud, const char *text, size_t len, size_t *n_tok)
{
    int rc = kvp_tokenize(ud, text, len, true, NULL, 0, n_tok, NULL);
    return rc == KVP_ERANGE ? 0 : rc;
}

int kvp_task_eval_prompt(const struct kvp_corpus *c, const kvp_model *m, int ti, uint64_t seed,
                         long i, long length, long depth, struct kvp_task_text *tt,
                         struct kvp_err *err)
{
    uint64_t base = kvp_rng_mix(seed, (uint64_t)kinds[ti].task);
    struct kvp_task_req req = {
        .task = kinds[ti].task,
        .seed = kvp_task_eval_seed(kvp_task_seed(base, (uint64_t)i)),
        .target_tokens = (int)length,
        .depth = (float)depth / 100.0f,
        .prose = !c->noise_only, /* a pass key in the filler text when one was given */
        .count = kvp_task_eval_count_tokens,
        .ud = (void *)m,
    };
    return kvp_task_render_eval(c, &req, tt, err);
}

long kvp_task_eval_ctx_tokens(const struct kvp_task_eval_grid *g)
{
    long max_len = 0;
    for (int i = 0; i < g->n_len; i++)
        max_len = g->lengths[i] > max_len ? g->lengths[i] : max_len;
    return max_len + kinds[g->ti].max_new + 1;
}

int kvp_task_eval_decode(const kvp_model *m, kvp_ctx *ctx, int32_t prev, int max_new, float *logits,
                         int n_vocab, char *pred, size_t cap, struct kvp_err *err)
{
    size_t k = 0;
    pred[0] = 0;
    for (int step = 0; step < max_new; step++) {
        int32_t tok = kvp_metric_argmax(logits, n_vocab); /* ties go to the lower id */
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

/* Evaluate ids[from, n) with the context's policy (the whole prompt, or the tail after a shared
 * head), then decode greedily up to max_new tokens into pred (cap bytes), stopping at an
 * end-of-generation token or a newline. */
static int decode_greedy(const kvp_model *m, kvp_ctx *ctx, const int32_t *ids, int from, int n,
                         int max_new, float *logits, int n_vocab, char *pred, size_t cap,
                         struct kvp_err *err)
{
    pred[0] = 0;
    if (kvp_eval(ctx, ids + from, n - from, logits, false, err) < 0)
        return err->code;
    return kvp_task_eval_decode(m, ctx, ids[n - 1], max_new, logits, n_vocab, pred, cap, err);
}

/* Whether run r can decode from a fill shared with other runs (see task_eval.h): a policy that
 * evicts (or one the registry does not know: its own prefill then names the error) cannot, nor
 * can any run on a tiered cache or a cache with sliding-window rings, which cannot go back to
 * the fill. */
static bool shares_fill(kvp_ctx *ctx, const struct kvp_task_eval_grid *g,
                        const struct kvp_task_eval_run *r)
{
    if (g->own_prefill || kvp_ctx_has_store(ctx) || kvp_ctx_hparams(ctx)->n_swa > 0)
        return false;
    if (!r->pp.name)
        return true;
    struct kvp_err ignored = {0};
    const struct kvp_policy_ops *ops = kvp_policy_lookup(r->pp.name, &ignored);
    return ops && !ops->evicting;
}

/* Where the shared fill of a prompt of n tokens ends: at least tail tokens before the end, on
 * a boundary of kvp_eval's passes, so that the fill and each run's rest go through the very
 * passes of the prompt evaluated whole (a pass's rows go through the projections together; cut
 * elsewhere, the rows would round otherwise): a run's answers are then bit for bit those of its
 * own whole prefill with its policy set from the start. */
static int shared_head(const kvp_ctx *ctx, int n, int tail)
{
    const int nb = kvp_ctx_n_batch(ctx);
    return n > tail ? (n - tail) / nb * nb : 0;
}

/* One run on one prompt (ids[0, n)): the prefill (the shared head's tail from head on, or the
 * whole prompt), the answer and the cell's sums. */
static int run_prompt(const kvp_model *m, kvp_ctx *ctx, const struct kvp_task_text *tt,
                      const int32_t *ids, int head, int n, int max_new, float *logits, int n_vocab,
                      long sample, struct kvp_task_eval_run *run, struct kvp_task_eval_cell *cell,
                      struct kvp_err *err)
{
    char pred[2048];
    double t0 = kvp_time_now();
    int rc = run->shared_fill ? kvp_ctx_set_policy_keep(ctx, &run->pp, err)
                              : kvp_ctx_set_policy(ctx, &run->pp, err);
    if (rc < 0 || (rc = decode_greedy(m, ctx, ids, run->shared_fill ? head : 0, n, max_new, logits,
                                      n_vocab, pred, sizeof(pred), err)) < 0)
        return rc;
    double s = kvp_ruler_match_all(pred, tt->refs, tt->n_refs);
    cell->accuracy += s;
    cell->exact += s >= 1.0;
    cell->prompt_tokens += (double)n;
    const struct kvp_policy *pol = kvp_ctx_policy_host(ctx)->p;
    if (pol && strcmp(pol->ops->name, "full"))
        cell->budget_tokens += kvp_policy_budget(pol, n);
    cell->seconds += kvp_time_now() - t0;
    double rtok = 0.0, rsel = 0.0;
    kvp_ctx_policy_reads(ctx, &rtok, &rsel);
    int steps = kvp_ctx_n_tokens(ctx) - n + 1;
    cell->read_tokens += rsel > 0 ? rtok / rsel : (double)n + (double)(steps - 1) / 2.0;
    size_t resident, kept;
    kvp_ctx_kv_bytes(ctx, &resident, &kept);
    cell->kv_resident_bytes += (double)resident;
    cell->kv_kept_bytes += (double)kept;
    uint64_t h = sample == 0 ? KVP_FNV64_INIT : cell->answer_fnv;
    h = kvp_fnv64(h, pred, strlen(pred) + 1);
    cell->answer_fnv = kvp_fnv64(h, logits, (size_t)n_vocab * sizeof(float));
    return 0;
}

int kvp_task_eval_run_grid(kvp_ctx *ctx, const kvp_model *m, const struct kvp_corpus *c,
                           const struct kvp_task_eval_grid *g, struct kvp_task_eval_run *runs,
                           int n_runs, kvp_task_eval_progress_fn progress, void *ud,
                           struct kvp_err *err)
{
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    int max_new = kinds[g->ti].max_new;
    float *logits = malloc((size_t)info.n_vocab * sizeof(float));
    int32_t *ids = NULL;
    int rc = 0;
    long done = 0, total = (long)g->n_len * g->n_depth * g->samples;
    if (!logits)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    /* the tail the sharing runs evaluate each: long enough for every one's observation window */
    int tail = KVP_TASK_EVAL_TAIL;
    for (int k = 0; k < n_runs; k++) {
        runs[k].shared_fill = shares_fill(ctx, g, &runs[k]);
        if (runs[k].shared_fill && runs[k].pp.window > tail)
            tail = runs[k].pp.window;
    }
    for (int li = 0; li < g->n_len; li++)
        for (int di = 0; di < g->n_depth; di++)
            for (long i = 0; i < g->samples; i++) {
                struct kvp_task_text tt;
                if ((rc = kvp_task_eval_prompt(c, m, g->ti, g->seed, i, g->lengths[li],
                                               g->depths[di], &tt, err)) < 0) {
                    kvp_err_prefix(err, "length %ld", g->lengths[li]);
                    goto out;
                }
                size_t n = 0, cap = strlen(tt.prompt) + 8;
                int32_t *grown = realloc(ids, cap * sizeof(int32_t));
                if (!grown) {
                    kvp_task_text_free(&tt);
                    rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
                    goto out;
                }
                ids = grown;
                if ((rc = kvp_tokenize(m, tt.prompt, cap - 8, true, ids, cap, &n, err)) < 0) {
                    kvp_task_text_free(&tt);
                    goto out;
                }
                int cidx = li * g->n_depth + di, head = shared_head(ctx, (int)n, tail);
                bool filled = false;
                double fill_s = 0.0;
                /* the sharing runs first, from one fill; then the others, each its own */
                for (int pass = 0; pass < 2; pass++)
                    for (int k = 0; k < n_runs; k++) {
                        if (runs[k].shared_fill != (pass == 0))
                            continue;
                        if (runs[k].shared_fill && !filled) {
                            double t0 = kvp_time_now();
                            if ((rc = kvp_ctx_set_policy(ctx, NULL, err)) >= 0 && head > 0)
                                rc = kvp_eval_prompt_head(ctx, ids, head, (int)n - head, err);
                            fill_s = kvp_time_now() - t0;
                            filled = true;
                        } else if (runs[k].shared_fill) {
                            kvp_ctx_truncate(ctx, head); /* back to the shared head */
                        }
                        struct kvp_task_eval_cell *cell = &runs[k].cells[cidx];
                        if (runs[k].shared_fill)
                            cell->fill_seconds += fill_s;
                        if (rc < 0 ||
                            (rc = run_prompt(m, ctx, &tt, ids, head, (int)n, max_new, logits,
                                             info.n_vocab, i, &runs[k], cell, err)) < 0) {
                            kvp_task_text_free(&tt);
                            kvp_err_prefix(err, "%s @ %s", runs[k].pp.name,
                                           runs[k].label ? runs[k].label : "?");
                            goto out;
                        }
                    }
                kvp_task_text_free(&tt);
                done++;
                if (progress)
                    progress(ud, done, total, g->lengths[li], g->depths[di]);
            }
    /* sums to means (seconds and fill_seconds stay the cell's totals) */
    double ns = (double)g->samples;
    for (int k = 0; k < n_runs; k++)
        for (int cidx = 0; cidx < g->n_len * g->n_depth; cidx++) {
            struct kvp_task_eval_cell *cell = &runs[k].cells[cidx];
            cell->accuracy /= ns;
            cell->exact /= ns;
            cell->prompt_tokens /= ns;
            cell->budget_tokens /= ns;
            cell->read_tokens /= ns;
            cell->kv_resident_bytes /= ns;
            cell->kv_kept_bytes /= ns;
        }
out:
    free(ids);
    free(logits);
    return rc < 0 ? rc : 0;
}
