/*
 * Token sampling: repetition penalty, then greedy or temperature → top-k → top-p → a draw from
 * the renormalised distribution. The random generator is xoshiro256** seeded through splitmix64,
 * so a seed reproduces a run exactly. All buffers are allocated at init; sampling allocates
 * nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/rng.h"
#include "kvpred.h"

struct kvp_sampler {
    struct kvp_sampler_params p;
    int n_vocab;
    struct kvp_rng rng;
    int32_t *recent;     /* ring of the last repeat_last_n tokens */
    int n_recent, head;
    int32_t *idx;        /* [n_vocab] candidate ids */
    float *prob;         /* [n_vocab] */
};

int kvp_sampler_init(const struct kvp_sampler_params *params, int n_vocab, kvp_sampler **out,
                     struct kvp_err *err)
{
    if (n_vocab < 1)
        return kvp_err_set(err, KVP_EINVAL, "sampler: empty vocabulary");
    struct kvp_sampler *s = calloc(1, sizeof(*s));
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "sampler: out of memory");
    s->p = *params;
    if (s->p.repeat_last_n < 0)
        s->p.repeat_last_n = 0;
    s->n_vocab = n_vocab;
    kvp_rng_seed(&s->rng, params->seed);
    s->recent = calloc((size_t)s->p.repeat_last_n + 1, sizeof(int32_t));
    s->idx = malloc((size_t)n_vocab * sizeof(int32_t));
    s->prob = malloc((size_t)n_vocab * sizeof(float));
    if (!s->recent || !s->idx || !s->prob) {
        kvp_sampler_free(s);
        return kvp_err_set(err, KVP_ENOMEM, "sampler: out of memory");
    }
    *out = s;
    return 0;
}

void kvp_sampler_free(kvp_sampler *s)
{
    if (!s)
        return;
    free(s->recent);
    free(s->idx);
    free(s->prob);
    free(s);
}

void kvp_sampler_accept(kvp_sampler *s, int token)
{
    if (s->p.repeat_last_n == 0)
        return;
    s->recent[s->head] = token;
    s->head = (s->head + 1) % s->p.repeat_last_n;
    if (s->n_recent < s->p.repeat_last_n)
        s->n_recent++;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i; /* ties keep the lower id */
    return best;
}

/* sort candidates by descending probability, ties by lower id */
static int cmp_desc(const void *a, const void *b, void *arg)
{
    const float *prob = arg;
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    float pa = prob[ia], pb = prob[ib];
    if (pa != pb)
        return pa > pb ? -1 : 1;
    return ia < ib ? -1 : 1;
}

int kvp_sampler_sample(kvp_sampler *s, float *logits)
{
    const int n = s->n_vocab;
    /* repetition penalty as in llama.cpp: divide positive logits, multiply negative ones */
    if (s->p.repeat_penalty != 1.0f && s->p.repeat_penalty > 0.0f) {
        for (int i = 0; i < s->n_recent; i++) {
            int t = s->recent[i];
            if (t < 0 || t >= n)
                continue;
            /* a token repeated several times is penalised once */
            bool seen = false;
            for (int j = 0; j < i; j++)
                seen |= s->recent[j] == t;
            if (seen)
                continue;
            logits[t] = logits[t] > 0 ? logits[t] / s->p.repeat_penalty
                                      : logits[t] * s->p.repeat_penalty;
        }
    }
    if (s->p.temperature <= 0.0f)
        return argmax(logits, n);

    float mx = logits[argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = expf((logits[i] - mx) / s->p.temperature);
        sum += s->prob[i];
        s->idx[i] = i;
    }
    for (int i = 0; i < n; i++)
        s->prob[i] = (float)(s->prob[i] / sum);
    int n_cand = n;
    bool truncate = (s->p.top_k > 0 && s->p.top_k < n) || s->p.top_p < 1.0f;
    if (truncate) {
        qsort_r(s->idx, (size_t)n, sizeof(int32_t), cmp_desc, s->prob);
        if (s->p.top_k > 0 && s->p.top_k < n_cand)
            n_cand = s->p.top_k;
        if (s->p.top_p < 1.0f) {
            double cum = 0.0;
            for (int i = 0; i < n_cand; i++) {
                cum += s->prob[s->idx[i]];
                if (cum >= s->p.top_p) {
                    n_cand = i + 1;
                    break;
                }
            }
        }
    }
    double total = 0.0;
    for (int i = 0; i < n_cand; i++)
        total += s->prob[s->idx[i]];
    double r = kvp_rng_double(&s->rng) * total;
    double cum = 0.0;
    for (int i = 0; i < n_cand; i++) {
        cum += s->prob[s->idx[i]];
        if (r < cum)
            return s->idx[i];
    }
    return s->idx[n_cand - 1];
}
