/*
 * Optimiser side of the trainer: the PRNG every random choice goes through, AdamW with decoupled
 * weight decay, the learning-rate schedule and global-norm gradient clipping.
 *
 * The PRNG is xoshiro256** (Blackman and Vigna) seeded through splitmix64, so a run is a pure
 * function of its seed and its state is four words a checkpoint can store. AdamW follows
 * Loshchilov and Hutter: the decay term wd·p is added to the Adam update, not to the gradient,
 * and applies only to tensors marked `decay` (the matrices; never norms or the embedding).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

/* ========================================= PRNG =============================================== */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void kvp_rng_seed(struct kvp_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t kvp_rng_next(struct kvp_rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

uint64_t kvp_rng_below(struct kvp_rng *r, uint64_t n)
{
    /* rejection sampling: no modulo bias */
    uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = kvp_rng_next(r);
    while (x >= lim);
    return x % n;
}

float kvp_rng_uniform(struct kvp_rng *r)
{
    return (float)(kvp_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

float kvp_rng_normal(struct kvp_rng *r)
{
    double u1 = ((double)(kvp_rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(kvp_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t kvp_rng_mix(uint64_t a, uint64_t b)
{
    uint64_t x = a ^ (b * 0xD1B54A32D192ED03ULL);
    splitmix64(&x);
    return splitmix64(&x);
}

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

void kvp_adamw_step(struct kvp_adamw *a, struct kvp_train_model *m, float lr)
{
    a->t++;
    float c1 = (float)(1.0 - pow(a->beta1, (double)a->t));
    float c2 = (float)(1.0 - pow(a->beta2, (double)a->t));
    for (int i = 0; i < m->n_tensors; i++) {
        const struct kvp_train_tensor *t = &m->tensors[i];
        if (m->cfg.tied && !strcmp(t->name, "output.weight"))
            continue; /* shares token_embd's storage */
        size_t n = (size_t)t->ne[0] * (size_t)(t->n_dims > 1 ? t->ne[1] : 1);
        adamw_update(a, m->params + t->off, m->grads + t->off, a->m + t->off, a->v + t->off, n,
                     lr, t->decay ? a->weight_decay : 0.0f, c1, c2);
    }
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
