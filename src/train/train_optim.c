/*
 * Optimiser side of the trainer: AdamW with decoupled weight decay, the learning-rate schedule and
 * global-norm gradient clipping. (Every random choice goes through src/core/rng.h, so a run is a
 * pure function of its seed and its state is four words a checkpoint can store.) AdamW follows
 * Loshchilov and Hutter: the decay term wd·p is added to the Adam update, not to the gradient,
 * and applies only to tensors marked `decay` (the matrices; never norms or the embedding).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "train/train.h"

/* ======================================== AdamW =============================================== */

int kvp_adamw_init(struct kvp_adamw *a, size_t n, float beta1, float beta2, float eps,
                   float weight_decay, struct kvp_err *err)
{
    memset(a, 0, sizeof(*a));
    a->m = calloc(n ? n : 1, sizeof(float));
    a->v = calloc(n ? n : 1, sizeof(float));
    if (!a->m || !a->v) {
        kvp_adamw_free(a);
        return kvp_err_set(err, KVP_ENOMEM, "adamw: %zu moments", n);
    }
    a->n = n;
    a->beta1 = beta1;
    a->beta2 = beta2;
    a->eps = eps;
    a->weight_decay = weight_decay;
    return 0;
}

void kvp_adamw_free(struct kvp_adamw *a)
{
    if (!a)
        return;
    free(a->m);
    free(a->v);
    a->m = a->v = NULL;
    a->n = 0;
}

/* Update p[0..n) whose moments start at m, v; bias corrections c1 = 1−β1^t, c2 = 1−β2^t. */
static void adamw_update(const struct kvp_adamw *a, float *p, const float *g, float *m, float *v,
                         size_t n, float lr, float wd, float c1, float c2)
{
    float b1 = a->beta1, b2 = a->beta2;
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        float mh = m[i] / c1;
        float vh = v[i] / c2;
        p[i] -= lr * (mh / (sqrtf(vh) + a->eps) + wd * p[i]);
    }
}

struct adamw_ctx {
    const struct kvp_adamw *a;
    struct kvp_train_model *m;
    float lr, c1, c2;
};

/* This thread's share of every tensor (elementwise: the same result on any number of threads). */
static void adamw_worker(void *p, int ith, int nth)
{
    struct adamw_ctx *c = p;
    const struct kvp_adamw *a = c->a;
    struct kvp_train_model *m = c->m;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct kvp_train_tensor *t = &m->tensors[i];
        if (m->cfg.tied && !strcmp(t->name, "output.weight"))
            continue; /* shares token_embd's storage */
        long b, e;
        kvp_split_range((long)t->ne[0] * (t->n_dims > 1 ? t->ne[1] : 1), ith, nth, &b, &e);
        size_t o = t->off + (size_t)b;
        adamw_update(a, m->params + o, m->grads + o, a->m + o, a->v + o, (size_t)(e - b), c->lr,
                     t->decay ? a->weight_decay : 0.0f, c->c1, c->c2);
    }
}

void kvp_adamw_step(struct kvp_adamw *a, struct kvp_train_model *m, float lr)
{
    a->t++;
    struct adamw_ctx c = {a, m, lr, (float)(1.0 - pow(a->beta1, (double)a->t)),
                          (float)(1.0 - pow(a->beta2, (double)a->t))};
    if (m->pool && m->precision == KVP_PREC_BF16)
        kvp_pool_run(m->pool, adamw_worker, &c);
    else
        adamw_worker(&c, 0, 1);
}

void kvp_adamw_step_raw(struct kvp_adamw *a, float *p, const float *g, size_t n, float lr,
                        bool decay)
{
    a->t++;
    float c1 = (float)(1.0 - pow(a->beta1, (double)a->t));
    float c2 = (float)(1.0 - pow(a->beta2, (double)a->t));
    adamw_update(a, p, g, a->m, a->v, n, lr, decay ? a->weight_decay : 0.0f, c1, c2);
}

/* ================================ schedule and clipping ======================================= */

float kvp_lr_schedule(long step, long warmup, long total, float lr_max, float lr_min)
{
    if (warmup > 0 && step < warmup)
        return lr_max * (float)(step + 1) / (float)warmup;
    if (total <= warmup)
        return lr_max;
    double frac = (double)(step - warmup) / (double)(total - warmup);
    if (frac > 1.0)
        frac = 1.0;
    return lr_min + (lr_max - lr_min) * (float)(0.5 * (1.0 + cos(3.141592653589793 * frac)));
}

double kvp_clip_grad(float *g, size_t n, double max_norm)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)g[i] * g[i];
    double norm = sqrt(ss);
    if (max_norm > 0.0 && norm > max_norm) {
        float s = (float)(max_norm / norm);
        for (size_t i = 0; i < n; i++)
            g[i] *= s;
    }
    return norm;
}
