/* The policy host (see host.h). */
#include "policy/host.h"

#include <stdlib.h>
#include <string.h>

#include "core/platform.h"

#define HOOK_STRIDE 8 /* doubles per KV head's clock: one cache line, no false sharing */

static float *falloc(size_t n)
{
    return kvp_alloc_aligned(n * sizeof(float));
}

int kvp_policy_start(struct kvp_policy *p, struct kvp_err *err)
{
    const struct kvp_policy_ops *ops = p->ops;
    p->opt = NULL;
    if (ops->opts_size && !(p->opt = calloc(1, ops->opts_size)))
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    if (p->opt)
        kvp_policy_opts_defaults(ops->opts, p->opt);
    int rc = 0;
    if (ops->opts)
        rc = kvp_policy_opts_parse(ops->opts, ops->name, p->p.opts, &p->p, p->opt, err);
    if (rc == 0 && ops->init)
        rc = ops->init(p, err);
    if (rc < 0) {
        free(p->opt);
        p->opt = NULL;
    }
    return rc;
}

void kvp_policy_stop(struct kvp_policy *p)
{
    if (p->ops->free)
        p->ops->free(p);
    free(p->opt);
    p->opt = NULL;
}

void kvp_policy_host_clear(struct kvp_policy_host *h)
{
    if (h->p) {
        kvp_policy_stop(h->p);
        free(h->p);
    }
    free(h->sel);
    free(h->next);
    free(h->blocks);
    free(h->masks);
    kvp_free_aligned(h->obs);
    kvp_free_aligned(h->colsum);
    kvp_free_aligned(h->hook_s);
    struct kvp_policy_env env = h->env;
    *h = (struct kvp_policy_host){.env = env, .dense_layers = env.n_layer};
}

const struct kvp_policy_ops *kvp_policy_lookup(const char *name, struct kvp_err *err)
{
    const struct kvp_policy_ops *ops = kvp_policy_find(name);
    if (ops)
        return ops;
    char names[512] = "";
    for (int k = 0; kvp_policy_registry[k]; k++) {
        strncat(names, k ? ", " : "", sizeof(names) - strlen(names) - 1);
        strncat(names, kvp_policy_registry[k]->name, sizeof(names) - strlen(names) - 1);
    }
    kvp_err_set(err, KVP_EINVAL, "unknown policy '%s' (known: %s)", name, names);
    return NULL;
}

/* The shared parameters' defaults and checks (kvpred.h documents them). */
static int fill_defaults(struct kvp_policy_params *q, int n_layer, struct kvp_err *err)
{
    if (q->sink <= 0)
        q->sink = q->sink < 0 ? 0 : 16;
    if (q->local <= 0)
        q->local = q->local < 0 ? 0 : 16;
    if (q->window <= 0)
        q->window = 32;
    if (q->pool <= 0)
        q->pool = 5;
    if (q->dense_layers == 0)
        q->dense_layers = 2;
    else if (q->dense_layers < 0)
        q->dense_layers = 0;
    if (q->dense_layers > n_layer)
        q->dense_layers = n_layer;
    if (q->gqa_agg < 0 || q->gqa_agg > KVP_AGG_SUM)
        return kvp_err_set(err, KVP_EINVAL, "unknown GQA aggregation %d", q->gqa_agg);
    if (q->budget < 0 || q->budget_ratio < 0 || q->budget_ratio > 1)
        return kvp_err_set(err, KVP_EINVAL, "budget must be >= 0 and ratio in (0, 1]");
    return 0;
}

/* Selections of every (layer, KV head) backed by rows [first, first + n_lh) of the host's
 * block and mask arrays. */
static struct kvp_sel *sel_array(struct kvp_policy_host *h, size_t n_lh, size_t first)
{
    struct kvp_sel *s = calloc(n_lh, sizeof(*s));
    if (!s)
        return NULL;
    size_t mb = (size_t)h->max_blocks;
    for (size_t i = 0; i < n_lh; i++) {
        s[i].blocks = h->blocks + (first + i) * mb;
        s[i].mask = h->masks + (first + i) * mb;
    }
    return s;
}

int kvp_policy_host_set(struct kvp_policy_host *h, const struct kvp_policy_ops *ops,
                        const struct kvp_policy_params *params,
                        const struct kvp_policy_env *env, bool with_next, struct kvp_err *err)
{
    h->env = *env;
    kvp_policy_host_clear(h);
    if (!ops && !(ops = kvp_policy_lookup(params->name, err)))
        return KVP_EINVAL;
    if (env->n_head / env->n_head_kv > 64)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "GQA groups larger than 64 heads");
    struct kvp_policy *p = calloc(1, sizeof(*p));
    if (!p)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    p->ops = ops;
    p->p = *params;
    p->env = *env;
    int rc = fill_defaults(&p->p, env->n_layer, err);
    if (rc == 0)
        rc = kvp_policy_start(p, err);
    if (rc < 0) {
        free(p);
        return rc;
    }
    h->p = p;
    h->dense_layers = p->p.dense_layers;
    size_t n_lh = (size_t)env->n_layer * env->n_head_kv;
    size_t rows = with_next ? 2 * n_lh : n_lh;
    h->max_blocks = (env->n_ctx + env->block_size - 1) / env->block_size;
    h->blocks = calloc(rows * h->max_blocks, sizeof(int32_t));
    h->masks = calloc(rows * h->max_blocks, sizeof(uint64_t));
    h->hook_s = kvp_alloc_aligned((size_t)env->n_head_kv * HOOK_STRIDE * sizeof(double));
    h->obs_window = ops->wants_obs ? p->p.window : 0;
    if (h->obs_window)
        h->obs = falloc((size_t)env->n_head * h->obs_window * env->n_ctx);
    size_t n_colsum = (size_t)env->n_layer * env->n_head * env->n_ctx;
    if (ops->wants_colsum && (h->colsum = falloc(n_colsum)))
        memset(h->colsum, 0, n_colsum * sizeof(float));
    if (h->blocks && h->masks) {
        h->sel = sel_array(h, n_lh, 0);
        if (with_next)
            h->next = sel_array(h, n_lh, n_lh);
    }
    if (!h->sel || (with_next && !h->next) || !h->hook_s || (h->obs_window && !h->obs) ||
        (ops->wants_colsum && !h->colsum)) {
        kvp_policy_host_clear(h);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for policy buffers");
    }
    kvp_policy_reset_hook_time(h);
    return 0;
}

/* ---- dispatch ---- */

struct kvp_sel *kvp_policy_select(struct kvp_policy_host *h, int layer, int kvh, const float *q,
                                  int n_tokens)
{
    struct kvp_sel *sel = kvp_policy_sel(h, layer, kvh);
    /* the thread CPU clock is a system call (about 1 µs in a VM): read outside the wall
     * interval, so the wall time is the hook's alone (the decode step still pays for it) */
    double c0 = kvp_thread_cpu_time(), t0 = kvp_time_now();
    h->p->ops->select(h->p, layer, kvh, q, n_tokens, sel);
    double t1 = kvp_time_now();
    double *clk = h->hook_s + (size_t)kvh * HOOK_STRIDE;
    clk[1] += kvp_thread_cpu_time() - c0;
    clk[0] += t1 - t0;
    /* tokens this selection lets attention read, and the selections counted (what `run`
     * reports as the KV read per token): a popcount per selected block, outside the clock */
    int bs = h->env.block_size;
    uint64_t n_read = 0;
    for (int i = 0; i < sel->n; i++) {
        int in_block = n_tokens - sel->blocks[i] * bs; /* keys of the block that exist */
        in_block = in_block < bs ? in_block : bs;
        uint64_t live = in_block >= 64 ? ~0ull : in_block > 0 ? (1ull << in_block) - 1 : 0;
        n_read += (uint64_t)__builtin_popcountll(sel->mask[i] & live);
    }
    clk[2] += (double)n_read;
    clk[3] += 1;
    return sel;
}

bool kvp_policy_has_on_step(const struct kvp_policy_host *h)
{
    return h->p && h->p->ops->on_step;
}

bool kvp_policy_step_block_max(const struct kvp_policy_host *h)
{
    return kvp_policy_has_on_step(h) && h->p->ops->step_block_max;
}

void kvp_policy_on_step(struct kvp_policy_host *h, int layer, int kvh, const float *probs,
                        int probs_stride, int n_tokens)
{
    if (!h->p->ops->on_step)
        return;
    double c0 = kvp_thread_cpu_time(), t0 = kvp_time_now(); /* as in kvp_policy_select */
    h->p->ops->on_step(h->p, layer, kvh, kvp_policy_sel(h, layer, kvh), probs, probs_stride,
                       n_tokens);
    double t1 = kvp_time_now();
    h->hook_s[(size_t)kvh * HOOK_STRIDE + 1] += kvp_thread_cpu_time() - c0;
    h->hook_s[(size_t)kvh * HOOK_STRIDE] += t1 - t0;
}

bool kvp_policy_has_predict(const struct kvp_policy_host *h)
{
    return h->p && h->p->ops->predict_next;
}

void kvp_policy_predict(struct kvp_policy_host *h, int layer, int kvh, int n_tokens_next)
{
    struct kvp_sel *next = kvp_policy_next(h, layer, kvh);
    if (h->p->ops->predict_next) {
        h->p->ops->predict_next(h->p, layer, kvh, n_tokens_next, next);
        return;
    }
    const struct kvp_sel *last = kvp_policy_sel(h, layer, kvh); /* re-access */
    next->n = last->n;
    memcpy(next->blocks, last->blocks, (size_t)last->n * sizeof(int32_t));
    memcpy(next->mask, last->mask, (size_t)last->n * sizeof(uint64_t));
}

bool kvp_policy_reads_all_keys(const struct kvp_policy_host *h, int layer)
{
    return h->p && h->p->ops->reads_all_keys && h->p->ops->reads_all_keys(h->p, layer);
}

bool kvp_policy_wants_prefill(const struct kvp_policy_host *h)
{
    return h->p && h->p->ops->on_prefill;
}

void kvp_policy_on_prefill(struct kvp_policy_host *h, int layer,
                           const struct kvp_prefill_obs *obs)
{
    h->p->ops->on_prefill(h->p, layer, obs);
}

bool kvp_policy_evicting(const struct kvp_policy_host *h)
{
    return h->p && h->p->ops->evicting;
}

void kvp_policy_reset(struct kvp_policy_host *h)
{
    if (h->colsum)
        memset(h->colsum, 0,
               (size_t)h->env.n_layer * h->env.n_head * h->env.n_ctx * sizeof(float));
    if (h->p && h->p->ops->reset)
        h->p->ops->reset(h->p);
}

double kvp_policy_hook_time(const struct kvp_policy_host *h, bool cpu)
{
    double s = 0;
    for (int k = 0; h->hook_s && k < h->env.n_head_kv; k++)
        s += h->hook_s[(size_t)k * HOOK_STRIDE + (cpu ? 1 : 0)];
    return s;
}

void kvp_policy_read_counts(const struct kvp_policy_host *h, double *tokens, double *selects)
{
    double t = 0, n = 0;
    for (int k = 0; h->hook_s && k < h->env.n_head_kv; k++) {
        t += h->hook_s[(size_t)k * HOOK_STRIDE + 2];
        n += h->hook_s[(size_t)k * HOOK_STRIDE + 3];
    }
    *tokens = t;
    *selects = n;
}

void kvp_policy_reset_hook_time(struct kvp_policy_host *h)
{
    for (int k = 0; h->hook_s && k < h->env.n_head_kv; k++)
        for (int j = 0; j < 4; j++)
            h->hook_s[(size_t)k * HOOK_STRIDE + j] = 0;
}
