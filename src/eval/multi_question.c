/* Several questions on one document (`kvpred eval --task T --questions N`): see multi_question.h. */
#include "eval/multi_question.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "core/rng.h"
#include "eval/ruler.h"
#include "eval/task_eval.h"
#include "forward/context.h"
#include "policy/policy.h"
#include "tasks/corpus.h"

const char *kvp_mq_follow_up_name(int follow_up)
{
    return follow_up == KVP_MQ_RECOMPUTE ? "recompute" : follow_up == KVP_MQ_KEEP ? "keep" : "?";
}

int kvp_mq_follow_up_by_name(const char *name)
{
    if (name && !strcmp(name, "keep"))
        return KVP_MQ_KEEP;
    if (name && !strcmp(name, "recompute"))
        return KVP_MQ_RECOMPUTE;
    return -1;
}

/* Tokens of text (BOS first) into a new array. */
static int tokenize_new(const kvp_model *m, const char *text, int32_t **ids, int *n,
                        struct kvp_err *err)
{
    size_t len = strlen(text), cap = len + 8, got = 0; /* a token is at least a byte, plus BOS */
    *ids = malloc(cap * sizeof(int32_t));
    if (!*ids)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    int rc = kvp_tokenize(m, text, len, true, *ids, cap, &got, err);
    if (rc < 0 || got > (size_t)0x7fffffff) {
        free(*ids);
        *ids = NULL;
        return rc < 0 ? rc : kvp_err_set(err, KVP_ERANGE, "text too long");
    }
    *n = (int)got;
    return 0;
}

int kvp_mq_doc_make(const struct kvp_corpus *c, const kvp_model *m, int ti, uint64_t seed, long i,
                    long length, int n_questions, struct kvp_mq_doc *d, struct kvp_err *err)
{
    memset(d, 0, sizeof(*d));
    const struct kvp_task_eval_kind *kind = kvp_task_eval_kind(ti);
    if (!kind)
        return kvp_err_set(err, KVP_EINVAL, "no evaluation task %d", ti);
    /* the seed `eval --task` gives sample i (task_eval.c) */
    uint64_t base = kvp_rng_mix(seed, (uint64_t)kind->task);
    struct kvp_task_req req = {
        .task = kind->task,
        .seed = kvp_task_eval_seed(kvp_task_seed(base, (uint64_t)i)),
        .target_tokens = length > 0x7fffffff ? 0x7fffffff : (int)length,
        .depth = -1.0f,
        .prose = !c->noise_only,
        .count = kvp_task_eval_count_tokens,
        .ud = (void *)m,
    };
    int rc = kvp_task_render_multi(c, &req, n_questions, &d->text, err);
    if (rc < 0)
        return rc;
    d->n_questions = d->text.n_questions;
    if ((rc = tokenize_new(m, d->text.document, &d->doc, &d->n_doc, err)) < 0)
        goto fail;
    size_t dl = strlen(d->text.document);
    for (int q = 0; q < d->n_questions; q++) {
        size_t ql = strlen(d->text.question[q]);
        char *whole = malloc(dl + ql + 1);
        int32_t *all = NULL;
        int n_all = 0;
        if (!whole) {
            rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
            goto fail;
        }
        memcpy(whole, d->text.document, dl);
        memcpy(whole + dl, d->text.question[q], ql + 1);
        rc = tokenize_new(m, whole, &all, &n_all, err);
        free(whole);
        if (rc < 0)
            goto fail;
        /* the server keeps the tokens the whole prompt shares with the cached document: they
         * must be the document's own, and the question must add at least one */
        if (n_all <= d->n_doc || memcmp(all, d->doc, (size_t)d->n_doc * sizeof(int32_t)) != 0) {
            free(all);
            rc = kvp_err_set(err, KVP_EFORMAT, "document %ld, question %d: the document and "
                             "the question do not split at a token boundary", i, q + 1);
            goto fail;
        }
        d->n_q[q] = n_all - d->n_doc;
        d->q[q] = malloc((size_t)d->n_q[q] * sizeof(int32_t));
        if (!d->q[q]) {
            free(all);
            rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
            goto fail;
        }
        memcpy(d->q[q], all + d->n_doc, (size_t)d->n_q[q] * sizeof(int32_t));
        free(all);
    }
    return 0;
fail:
    kvp_mq_doc_free(d);
    return rc;
}

void kvp_mq_doc_free(struct kvp_mq_doc *d)
{
    if (!d)
        return;
    kvp_task_multi_free(&d->text);
    free(d->doc);
    for (int q = 0; q < KVP_TASK_MAX_QUESTIONS; q++)
        free(d->q[q]);
    memset(d, 0, sizeof(*d));
}

bool kvp_mq_server_keeps(const kvp_ctx *ctx)
{
    const struct kvp_policy *p = kvp_ctx_policy_host_const(ctx)->p;
    return !p || (!p->ops->evicting && !p->ops->wants_obs && !p->ops->wants_colsum);
}

int kvp_mq_answer_doc(kvp_ctx *ctx, const kvp_model *m, const struct kvp_policy_params *pp,
                      const struct kvp_mq_doc *d, int follow_up, int max_new,
                      struct kvp_mq_result *res, float *logits_q, struct kvp_err *err)
{
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    if (follow_up != KVP_MQ_KEEP && follow_up != KVP_MQ_RECOMPUTE)
        return kvp_err_set(err, KVP_EINVAL, "follow-up %d is neither keep nor recompute",
                           follow_up);
    size_t nv = (size_t)info.n_vocab;
    int longest = 0;
    for (int q = 0; q < d->n_questions; q++)
        longest = d->n_q[q] > longest ? d->n_q[q] : longest;
    float *logits = malloc(nv * sizeof(float));
    /* recompute: document and question in one buffer, as one prompt */
    int32_t *prompt = malloc(((size_t)d->n_doc + (size_t)longest) * sizeof(int32_t));
    int rc = 0;
    if (!logits || !prompt) {
        rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
        goto out;
    }
    memcpy(prompt, d->doc, (size_t)d->n_doc * sizeof(int32_t));
    double t0 = kvp_time_now();
    if (follow_up == KVP_MQ_KEEP) {
        if ((rc = kvp_ctx_set_policy(ctx, pp && pp->name ? pp : NULL, err)) < 0 ||
            (rc = kvp_eval(ctx, d->doc, d->n_doc, NULL, false, err)) < 0)
            goto out;
    }
    for (int q = 0; q < d->n_questions; q++) {
        struct kvp_mq_result *r = &res[q];
        memset(r, 0, sizeof(*r));
        if (follow_up == KVP_MQ_KEEP) {
            /* back to the document: the previous question and its answer go, what the policy
             * evicted meanwhile stays evicted */
            kvp_ctx_truncate(ctx, d->n_doc);
            rc = kvp_eval(ctx, d->q[q], d->n_q[q], logits, false, err);
            r->prefill_tokens = d->n_q[q];
        } else {
            memcpy(prompt + d->n_doc, d->q[q], (size_t)d->n_q[q] * sizeof(int32_t));
            rc = kvp_ctx_set_policy(ctx, pp && pp->name ? pp : NULL, err);
            if (rc == 0)
                rc = kvp_eval(ctx, prompt, d->n_doc + d->n_q[q], logits, false, err);
            r->prefill_tokens = d->n_doc + d->n_q[q];
        }
        if (rc < 0)
            goto out;
        if (logits_q)
            memcpy(logits_q + (size_t)q * nv, logits, nv * sizeof(float));
        /* the answer's own reads: the question's tokens of an evicting policy went through
         * decode steps too */
        kvp_ctx_policy_reset_seconds(ctx);
        int n0 = kvp_ctx_n_tokens(ctx);
        if ((rc = kvp_task_eval_decode(m, ctx, d->q[q][d->n_q[q] - 1], max_new, logits,
                                       info.n_vocab, r->pred, sizeof(r->pred), err)) < 0)
            goto out;
        double tok = 0.0, sel = 0.0;
        kvp_ctx_policy_reads(ctx, &tok, &sel);
        /* full attention reads every cached token: n0 at the first answer step, one more at each
         * later one */
        int steps = kvp_ctx_n_tokens(ctx) - n0 + 1;
        r->read_tokens = sel > 0 ? tok / sel : (double)n0 + (double)(steps - 1) / 2.0;
        char ref[64];
        snprintf(ref, sizeof(ref), "%s\n", d->text.ref[q]);
        r->score = kvp_ruler_match_all(r->pred, ref, 1);
        kvp_ctx_kv_bytes(ctx, &r->kv_resident, &r->kv_kept);
        double t1 = kvp_time_now();
        r->seconds = t1 - t0;
        t0 = t1;
    }
out:
    free(prompt);
    free(logits);
    return rc < 0 ? rc : 0;
}

long kvp_mq_ctx_tokens(const struct kvp_mq_grid *g)
{
    long max_len = 0;
    for (int i = 0; i < g->n_len; i++)
        max_len = g->lengths[i] > max_len ? g->lengths[i] : max_len;
    const struct kvp_task_eval_kind *kind = kvp_task_eval_kind(g->ti);
    return max_len + (kind ? kind->max_new : 0) + 1;
}

int kvp_mq_run_grid(kvp_ctx *ctx, const kvp_model *m, const struct kvp_corpus *c,
                    const struct kvp_mq_grid *g, struct kvp_mq_run *runs, int n_runs,
                    kvp_mq_progress_fn progress, void *ud, struct kvp_err *err)
{
    const struct kvp_task_eval_kind *kind = kvp_task_eval_kind(g->ti);
    if (!kind)
        return kvp_err_set(err, KVP_EINVAL, "no evaluation task %d", g->ti);
    const int nq = g->n_questions;
    struct kvp_mq_result res[KVP_TASK_MAX_QUESTIONS];
    long done = 0, total = (long)g->n_len * g->docs;
    int rc = 0;
    for (int li = 0; li < g->n_len; li++)
        for (long i = 0; i < g->docs; i++) {
            struct kvp_mq_doc d;
            if ((rc = kvp_mq_doc_make(c, m, g->ti, g->seed, i, g->lengths[li], nq, &d, err)) < 0) {
                kvp_err_prefix(err, "length %ld", g->lengths[li]);
                return rc;
            }
            for (int k = 0; k < n_runs; k++) {
                struct kvp_mq_run *run = &runs[k];
                rc = kvp_mq_answer_doc(ctx, m, &run->pp, &d, g->follow_up, kind->max_new, res,
                                       NULL, err);
                if (rc < 0) {
                    kvp_mq_doc_free(&d);
                    kvp_err_prefix(err, "%s @ %s", run->pp.name ? run->pp.name : "full",
                                   run->label ? run->label : "?");
                    return rc;
                }
                run->server_keeps = kvp_mq_server_keeps(ctx);
                const struct kvp_policy *pol = kvp_ctx_policy_host(ctx)->p;
                for (int q = 0; q < nq; q++) {
                    struct kvp_mq_cell *cell = &run->cells[li * nq + q];
                    cell->accuracy += res[q].score;
                    cell->exact += res[q].score >= 1.0;
                    cell->prefill_tokens += res[q].prefill_tokens;
                    cell->read_tokens += res[q].read_tokens;
                    cell->document_tokens += d.n_doc;
                    cell->depth += d.text.depth[q];
                    if (pol && strcmp(pol->ops->name, "full"))
                        cell->budget_tokens += kvp_policy_budget(pol, d.n_doc + d.n_q[q]);
                    cell->kv_resident_bytes += (double)res[q].kv_resident;
                    cell->kv_kept_bytes += (double)res[q].kv_kept;
                    cell->seconds += res[q].seconds;
                    if (run->preds)
                        memcpy(run->preds + (((size_t)li * (size_t)g->docs + (size_t)i) *
                                                 (size_t)nq + (size_t)q) * KVP_MQ_PRED_CAP,
                               res[q].pred, KVP_MQ_PRED_CAP);
                }
            }
            kvp_mq_doc_free(&d);
            done++;
            if (progress)
                progress(ud, done, total, g->lengths[li]);
        }
    double nd = (double)g->docs;
    for (int k = 0; k < n_runs; k++)
        for (int cidx = 0; cidx < g->n_len * nq; cidx++) {
            struct kvp_mq_cell *cell = &runs[k].cells[cidx];
            cell->accuracy /= nd;
            cell->exact /= nd;
            cell->prefill_tokens /= nd;
            cell->read_tokens /= nd;
            cell->budget_tokens /= nd;
            cell->document_tokens /= nd;
            cell->depth /= nd;
            cell->kv_resident_bytes /= nd;
            cell->kv_kept_bytes /= nd;
        }
    return 0;
}
