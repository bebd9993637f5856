/*
 * The measuring harness (see measure.h for the protocol and every metric's definition).
 *
 * One harness holds two contexts: the dense reference, decoded once at init with its per-step
 * logits kept, and the policy context, which every run re-arms with kvp_ctx_set_policy (that
 * clears the cache) in measuring mode. Measuring mode computes each compressed layer's dense
 * attention next to the sparse one and keeps evicted data in place (kvcache.h, `release` off)
 * without changing what is read or what the memory accounting reports.
 *
 * What a step read is reconstructed from the context's selection (ctx->pol.sel) minus the tokens
 * evicted *before* the step: a snapshot of the eviction masks is taken before every decode step,
 * because policies such as H2O evict in on_step, after attention has read the token. Everything
 * here is single-threaded and allocation-free per step; it costs O(layers × heads × Lk) per step,
 * small next to the dense attention measuring mode already computes.
 */
#include "eval/measure.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "eval/metrics.h"
#include "forward/context.h"
#include "policy/policy.h"
#include "kvpred_lab.h"

struct kvp_measure {
    const kvp_model *model; /* borrowed */
    int n_vocab;
    int n_prefill, n_decode, k_ret;
    int32_t *tokens;   /* owned [n_prefill + n_decode + 1] */
    kvp_ctx *ref;      /* owned: dense reference */
    kvp_ctx *pol;      /* owned: policy context, measuring on */
    float *ref_logits; /* owned [n_decode][n_vocab] reference next-token logits */
    float *logits;     /* owned [n_vocab] policy logits of the current step */
    double ppl_full;
    size_t ref_resident, ref_kept;
    int max_blocks;
    size_t n_lh;         /* n_layer * n_head_kv */
    uint64_t *ev_before; /* owned [n_lh][max_blocks] eviction masks before the step */
    uint64_t *read;      /* owned [n_lh][max_blocks] tokens the last step read */
    uint64_t *omask;     /* owned [max_blocks] oracle selection */
    float *gsum;         /* owned [n_ctx] group-summed dense row */
    void *oscratch;      /* owned kvp_oracle_scratch(n_ctx) bytes */
    int *rscratch;       /* owned [2 * n_ctx] retention scratch */
    bool running;        /* a run is in progress (read masks are valid) */
};

/* Per-run accumulators. */
struct acc {
    double rec, ob, ot, ret, n_qh;            /* sums over (step, layer, query head) */
    double read, read_n, kept, budget, n_kvh; /* sums over (step, layer, KV head) */
    double kl, kl_max, top1, nll;             /* sums over steps */
    double *l_rec, *l_ob, *l_n;               /* [n_layer] per-layer sums and counts */
};

void kvp_measure_free(struct kvp_measure *ms)
{
    if (!ms)
        return;
    kvp_ctx_free(ms->ref);
    kvp_ctx_free(ms->pol);
    free(ms->tokens);
    free(ms->ref_logits);
    free(ms->logits);
    free(ms->ev_before);
    free(ms->read);
    free(ms->omask);
    free(ms->gsum);
    free(ms->oscratch);
    free(ms->rscratch);
    free(ms);
}

/* Decode the dense reference once: its logits per step, perplexity and KV bytes. */
static int run_reference(struct kvp_measure *ms, struct kvp_err *err)
{
    const int n = ms->n_prefill, v = ms->n_vocab;
    int rc = kvp_eval(ms->ref, ms->tokens, n, NULL, false, err);
    double nll = 0.0;
    for (int i = 0; rc == 0 && i < ms->n_decode; i++) {
        float *lg = ms->ref_logits + (size_t)i * v;
        rc = kvp_eval(ms->ref, ms->tokens + n + i, 1, lg, false, err);
        if (rc == 0)
            nll += kvp_metric_nll(lg, v, ms->tokens[n + i + 1]);
    }
    if (rc < 0)
        return rc;
    ms->ppl_full = exp(nll / ms->n_decode);
    kvp_ctx_kv_bytes(ms->ref, &ms->ref_resident, &ms->ref_kept);
    return 0;
}

int kvp_measure_init(const kvp_model *model, const int32_t *tokens, const struct kvp_ctx_params *cp,
                     const struct kvp_measure_params *mp, struct kvp_measure **out,
                     struct kvp_err *err)
{
    if (!model || !tokens || !mp || mp->n_prefill < 1 || mp->n_decode < 1)
        return kvp_err_set(err, KVP_EINVAL, "measure: need a model, tokens, N >= 1 and M >= 1");
    struct kvp_model_info info;
    kvp_model_get_info(model, &info);
    const int total = mp->n_prefill + mp->n_decode + 1;
    for (int i = 0; i < total; i++)
        if (tokens[i] < 0 || tokens[i] >= info.n_vocab)
            return kvp_err_set(err, KVP_EINVAL, "measure: token %d at %d is outside the vocabulary",
                               tokens[i], i);
    struct kvp_measure *ms = calloc(1, sizeof(*ms));
    if (!ms)
        return kvp_err_set(err, KVP_ENOMEM, "measure: out of memory");
    ms->model = model;
    ms->n_vocab = info.n_vocab;
    ms->n_prefill = mp->n_prefill;
    ms->n_decode = mp->n_decode;
    ms->k_ret = mp->retention_k > 0 ? mp->retention_k : 32;
    struct kvp_ctx_params p = cp ? *cp : (struct kvp_ctx_params){0};
    if (p.n_ctx < mp->n_prefill + mp->n_decode)
        p.n_ctx = mp->n_prefill + mp->n_decode;
    int rc = kvp_ctx_init(model, &p, &ms->ref, err);
    if (rc == 0)
        rc = kvp_ctx_init(model, &p, &ms->pol, err);
    if (rc < 0)
        goto fail;
    kvp_ctx_set_measure(ms->pol, true);
    if (!kvp_ctx_measuring(ms->pol)) {
        rc = kvp_err_set(err, KVP_ENOMEM, "measure: out of memory for dense attention rows");
        goto fail;
    }
    const int n_ctx = kvp_ctx_n_ctx(ms->pol);
    ms->max_blocks = kvp_ctx_kvcache(ms->pol)->max_blocks;
    ms->n_lh = (size_t)info.n_layer * info.n_head_kv;
    ms->tokens = malloc((size_t)total * sizeof(int32_t));
    ms->ref_logits = malloc((size_t)mp->n_decode * info.n_vocab * sizeof(float));
    ms->logits = malloc((size_t)info.n_vocab * sizeof(float));
    ms->ev_before = calloc(ms->n_lh * ms->max_blocks, sizeof(uint64_t));
    ms->read = calloc(ms->n_lh * ms->max_blocks, sizeof(uint64_t));
    ms->omask = calloc((size_t)ms->max_blocks, sizeof(uint64_t));
    ms->gsum = malloc((size_t)n_ctx * sizeof(float));
    ms->oscratch = malloc(kvp_oracle_scratch(n_ctx));
    ms->rscratch = malloc(2 * (size_t)n_ctx * sizeof(int));
    if (!ms->tokens || !ms->ref_logits || !ms->logits || !ms->ev_before || !ms->read ||
        !ms->omask || !ms->gsum || !ms->oscratch || !ms->rscratch) {
        rc = kvp_err_set(err, KVP_ENOMEM, "measure: out of memory");
        goto fail;
    }
    memcpy(ms->tokens, tokens, (size_t)total * sizeof(int32_t));
    rc = run_reference(ms, err);
    if (rc < 0)
        goto fail;
    *out = ms;
    return 0;

fail:
    kvp_measure_free(ms);
    return rc;
}

/* Rebuild what (layer, kvh) read this step: the selection minus tokens evicted before the step
 * and tokens past the end. */
static void read_set(struct kvp_measure *ms, int l, int kvh, int n_keys)
{
    const struct kvp_ctx *c = ms->pol;
    const struct kvp_hparams *hp = kvp_ctx_hparams(c);
    const struct kvp_kvcache *kv = kvp_ctx_kvcache_const(c);
    const struct kvp_policy_host *pol = kvp_ctx_policy_host_const(c);
    const int bs = kv->block_size, nb = (n_keys + bs - 1) / bs;
    const size_t lh = (size_t)l * hp->n_head_kv + kvh;
    uint64_t *r = ms->read + lh * ms->max_blocks;
    const uint64_t *ev = ms->ev_before + lh * ms->max_blocks;
    const struct kvp_sel *sel = &pol->sel[lh];
    memset(r, 0, (size_t)nb * sizeof(uint64_t));
    for (int i = 0; i < sel->n; i++) {
        int b = sel->blocks[i];
        if (b < 0 || b >= nb)
            continue;
        r[b] |= sel->mask[i] & ~ev[b];
    }
    if (n_keys % bs)
        r[nb - 1] &= (1ULL << (n_keys % bs)) - 1;
}

/* Measure one compressed layer of the step just decoded. */
static void measure_layer(struct kvp_measure *ms, struct acc *a, int l, int n_keys)
{
    const struct kvp_ctx *c = ms->pol;
    const struct kvp_hparams *hp = kvp_ctx_hparams(c);
    const struct kvp_kvcache *kv = kvp_ctx_kvcache_const(c);
    const struct kvp_policy_host *pol = kvp_ctx_policy_host_const(c);
    const int stride = kvp_ctx_probs_stride(c);
    const int bs = kv->block_size, n_kvh = hp->n_head_kv, g = hp->n_head / n_kvh;
    const struct kvp_policy *p = pol->p;
    const int budget = kvp_policy_budget(p, n_keys);
    for (int kvh = 0; kvh < n_kvh; kvh++) {
        read_set(ms, l, kvh, n_keys);
        const uint64_t *r = ms->read + ((size_t)l * n_kvh + kvh) * ms->max_blocks;
        int n_read = kvp_metric_set_size(r, n_keys, bs);
        a->read += (double)n_read / n_keys;
        a->read_n += n_read;
        a->kept += (double)kvp_kvcache_kept(kv, l, kvh, n_keys) / n_keys;
        a->budget += budget < n_keys ? budget : n_keys;
        a->n_kvh += 1;
        const float *rows = kvp_ctx_dense_probs(c, l, kvh * g, NULL);
        /* oracles rank by the group's summed attention (the ranking of the mean) */
        kvp_gqa_combine(rows, g, stride, n_keys, KVP_AGG_SUM, ms->gsum);
        double ob[64], ot[64];
        kvp_oracle_block(p, ms->gsum, n_keys, ms->omask, ms->oscratch);
        for (int j = 0; j < g; j++)
            ob[j] = kvp_metric_recovery(rows + (size_t)j * stride, n_keys, ms->omask, bs);
        kvp_oracle_token(p, ms->gsum, n_keys, ms->omask, ms->oscratch);
        for (int j = 0; j < g; j++)
            ot[j] = kvp_metric_recovery(rows + (size_t)j * stride, n_keys, ms->omask, bs);
        for (int j = 0; j < g; j++) {
            const float *row = rows + (size_t)j * stride;
            double rec = kvp_ctx_recovery(c, l, kvh * g + j);
            a->rec += rec;
            a->ob += ob[j];
            a->ot += ot[j];
            a->ret += kvp_metric_retention(row, n_keys, r, bs, ms->k_ret, ms->rscratch);
            a->n_qh += 1;
            a->l_rec[l] += rec;
            a->l_ob[l] += ob[j];
            a->l_n[l] += 1;
        }
    }
}

/* Decode step i of a run and accumulate its metrics. */
static int run_step(struct kvp_measure *ms, struct acc *a, int i, struct kvp_err *err)
{
    struct kvp_ctx *c = ms->pol;
    const struct kvp_hparams *hp = kvp_ctx_hparams(c);
    const struct kvp_kvcache *kv = kvp_ctx_kvcache_const(c);
    const struct kvp_policy_host *pol = kvp_ctx_policy_host_const(c);
    const int n = ms->n_prefill, v = ms->n_vocab;
    memcpy(ms->ev_before, kv->evicted, ms->n_lh * ms->max_blocks * sizeof(uint64_t));
    int rc = kvp_eval(c, ms->tokens + n + i, 1, ms->logits, false, err);
    if (rc < 0)
        return rc;
    const float *ref = ms->ref_logits + (size_t)i * v;
    double kl = kvp_metric_kl(ref, ms->logits, v);
    a->kl += kl;
    a->kl_max = kl > a->kl_max ? kl : a->kl_max;
    a->top1 += kvp_metric_argmax(ref, v) == kvp_metric_argmax(ms->logits, v);
    a->nll += kvp_metric_nll(ms->logits, v, ms->tokens[n + i + 1]);
    const int n_keys = kvp_ctx_n_tokens(c);
    for (int l = pol->dense_layers; l < hp->n_layer; l++)
        measure_layer(ms, a, l, n_keys);
    return 0;
}

static void fill_result(const struct kvp_measure *ms, const struct acc *a,
                        struct kvp_measure_result *res)
{
    const struct kvp_ctx *c = ms->pol;
    const struct kvp_hparams *hp = kvp_ctx_hparams(c);
    const struct kvp_kvcache *kv = kvp_ctx_kvcache_const(c);
    const struct kvp_policy_host *pol = kvp_ctx_policy_host_const(c);
    const double steps = ms->n_decode;
    const double nq = a->n_qh > 0 ? a->n_qh : 1, nk = a->n_kvh > 0 ? a->n_kvh : 1;
    res->p = pol->p->p;
    res->p.name = pol->p->ops->name;
    res->block_size = kv->block_size;
    res->n_layer = hp->n_layer;
    res->n_steps = ms->n_decode;
    /* no compressed layer (dense_layers = n_layer): everything is read, recovery is 1 */
    res->recovery = a->n_qh > 0 ? a->rec / nq : 1.0;
    res->oracle_block = a->n_qh > 0 ? a->ob / nq : 1.0;
    res->oracle_token = a->n_qh > 0 ? a->ot / nq : 1.0;
    res->retention = a->n_qh > 0 ? a->ret / nq : 1.0;
    res->read_fraction = a->n_kvh > 0 ? a->read / nk : 1.0;
    res->read_tokens = a->read_n / nk;
    res->compression = a->n_kvh > 0 ? 1.0 - a->kept / nk : 0.0;
    res->budget_tokens = a->budget / nk;
    res->kl = a->kl / steps;
    res->kl_max = a->kl_max;
    res->top1 = a->top1 / steps;
    res->ppl = exp(a->nll / steps);
    res->ppl_full = ms->ppl_full;
    kvp_ctx_kv_bytes(c, &res->kv_resident, &res->kv_kept);
    res->kv_resident_full = ms->ref_resident;
    res->kv_kept_full = ms->ref_kept;
    for (int l = 0; l < hp->n_layer; l++) {
        res->layer_recovery[l] = a->l_n[l] > 0 ? a->l_rec[l] / a->l_n[l] : -1.0;
        res->layer_oracle_block[l] = a->l_n[l] > 0 ? a->l_ob[l] / a->l_n[l] : -1.0;
    }
}

int kvp_measure_run(struct kvp_measure *ms, const struct kvp_policy_params *pp,
                    kvp_measure_step_fn step_fn, void *ud, struct kvp_measure_result *res,
                    struct kvp_err *err)
{
    struct kvp_ctx *c = ms->pol;
    const struct kvp_hparams *hp = kvp_ctx_hparams(c);
    const int n_layer = hp->n_layer;
    struct kvp_policy_params full = {.name = "full"};
    memset(res, 0, sizeof(*res));
    int rc = kvp_ctx_set_policy(c, pp && pp->name ? pp : &full, err);
    if (rc < 0)
        return rc;
    struct acc a = {0};
    a.l_rec = calloc(3 * (size_t)n_layer, sizeof(double));
    res->layer_recovery = malloc(2 * (size_t)n_layer * sizeof(double));
    if (!a.l_rec || !res->layer_recovery) {
        free(a.l_rec);
        free(res->layer_recovery);
        res->layer_recovery = NULL;
        return kvp_err_set(err, KVP_ENOMEM, "measure: out of memory");
    }
    a.l_ob = a.l_rec + n_layer;
    a.l_n = a.l_ob + n_layer;
    res->layer_oracle_block = res->layer_recovery + n_layer;
    double t0 = kvp_time_now();
    rc = kvp_eval(c, ms->tokens, ms->n_prefill, NULL, false, err);
    ms->running = true;
    for (int i = 0; rc == 0 && i < ms->n_decode; i++) {
        rc = run_step(ms, &a, i, err);
        if (rc == 0 && step_fn)
            step_fn(ud, ms, i);
    }
    ms->running = false;
    if (rc == 0) {
        fill_result(ms, &a, res);
        res->seconds = kvp_time_now() - t0;
    } else {
        kvp_measure_result_free(res);
    }
    free(a.l_rec);
    return rc;
}

void kvp_measure_result_free(struct kvp_measure_result *res)
{
    if (!res)
        return;
    free(res->layer_recovery); /* layer_oracle_block shares the allocation */
    res->layer_recovery = NULL;
    res->layer_oracle_block = NULL;
}

const kvp_ctx *kvp_measure_ctx(const struct kvp_measure *ms)
{
    return ms->pol;
}

kvp_ctx *kvp_measure_policy_ctx(struct kvp_measure *ms)
{
    return ms->pol;
}

const uint64_t *kvp_measure_read_mask(const struct kvp_measure *ms, int layer, int kvh)
{
    const struct kvp_ctx *c = ms->pol;
    const struct kvp_hparams *hp = kvp_ctx_hparams(c);
    const struct kvp_policy_host *pol = kvp_ctx_policy_host_const(c);
    if (!ms->running || !kvp_policy_sparse(pol, layer) || layer >= hp->n_layer ||
        kvh < 0 || kvh >= hp->n_head_kv)
        return NULL;
    return ms->read + ((size_t)layer * hp->n_head_kv + kvh) * ms->max_blocks;
}

const uint64_t *kvp_measure_evicted_mask(const struct kvp_measure *ms, int layer, int kvh)
{
    const uint64_t *r = kvp_measure_read_mask(ms, layer, kvh);
    return r ? ms->ev_before + (r - ms->read) : NULL;
}

void kvp_measure_shape(const struct kvp_measure *ms, int *n_layer, int *n_head, int *n_head_kv,
                       int *dense_layers, int *block_size)
{
    const struct kvp_ctx *c = ms->pol;
    const struct kvp_hparams *hp = kvp_ctx_hparams(c);
    const struct kvp_kvcache *kv = kvp_ctx_kvcache_const(c);
    const struct kvp_policy_host *pol = kvp_ctx_policy_host_const(c);
    if (n_layer)
        *n_layer = hp->n_layer;
    if (n_head)
        *n_head = hp->n_head;
    if (n_head_kv)
        *n_head_kv = hp->n_head_kv;
    if (dense_layers)
        *dense_layers = pol->p ? pol->dense_layers : 0;
    if (block_size)
        *block_size = kv->block_size;
}
