/* Block-sparse prefill attention: which keys a query block reads (see sparse_prefill.h). */
#include "forward/sparse_prefill.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "core/err.h"
#include "core/platform.h"
#include "core/threadpool.h"
#include "forward/context_internal.h"
#include "kernels/simd.h"
#include "kv/attention.h"
#include "predictor/prefill_gate.h"
#include "store/store.h"

#define SPF_STRIDE 16 /* the strided estimate scores every 16th query of a block */

static const char *const policy_names[KVP_PREFILL_COUNT] = {"dense", "pooled", "bound",
                                                            "strided", "learned"};

/* The public face of a learned gate (kvpred.h): the predictor's weights. */
struct kvp_prefill_gate {
    struct kvp_pgate g;
};

const char *kvp_prefill_policy_name(int policy)
{
    return policy >= 0 && policy < KVP_PREFILL_COUNT ? policy_names[policy] : NULL;
}

int kvp_prefill_policy_parse(const char *name)
{
    if (!name)
        return -1;
    if (strcmp(name, "sparse") == 0)
        return KVP_PREFILL_SPARSE;
    for (int i = 0; i < KVP_PREFILL_COUNT; i++)
        if (strcmp(name, policy_names[i]) == 0)
            return i;
    return -1;
}

/* One thread's scratch and counters (a thread of the pool touches only its own). */
struct spf_thread {
    float *qbar;            /* [g][hd] the block's mean query of each head of the group */
    float *qpos, *qneg;     /* [g][hd] its positive and negative parts (bound) */
    float *qgate;           /* [g][3 hd] the learned gate's query vectors (kvp_pgate_query) */
    float *mass;            /* [g][max_units] each head's estimated share per key block */
    float *imp;             /* [max_units] the group's importance of each key block */
    int32_t *order;         /* [max_units] candidate blocks, most important first */
    uint8_t *pick;          /* [max_units] read the block */
    float *kbuf;            /* [hd][block] one block's keys as f32 (fold) */
    struct kvp_key_run *runs; /* [max_units] */
    double est_s, attn_s, tokens;
    double *read, *seen;    /* [n_layer] */
    double *rec, *rec_rand, *rec_n; /* [n_layer] measuring: recovered mass, a random choice's */
    char pad[64];
};

struct kvp_spf {
    struct kvp_prefill_params p; /* defaults resolved */
    int n_layer, n_kv, hd, g, block, max_units, n_threads;
    int sdim;        /* floats of statistics per block: hd (mean), 2 hd (max, min) or 3 hd
                        (mean, max, min: the learned gate) */
    struct kvp_pgate gate; /* learned: a copy of the gate */
    kvp_spf_collector collector; /* kvp_spf_set_collector */
    void *collector_user;
    float *stats;    /* [n_layer][n_kv][max_units][sdim]; NULL when the estimate needs none */
    int *done;       /* [n_layer] tokens whose blocks are folded */
    struct spf_thread *thr; /* [n_threads] */
    /* a tiered store's prefill (kvp_spf_stage_first): the blocks loaded, and each item's
     * choice made before its attention, so that only the blocks chosen are read */
    bool staged;            /* this layer's blocks were staged in part */
    uint8_t *need, *loaded; /* [max_blocks] */
    int plan_items;         /* n_kv * chunks of a piece of n_batch tokens */
    struct kvp_key_run *plan_runs; /* [plan_items][max_units] */
    int *plan_n, *plan_cols;       /* [plan_items] */
    double *plan_est;              /* [plan_items] */
    bool measure;           /* kvp_spf_measure */
    kvp_spf_observer observer;
    void *observer_user;
};

static void free_thread(struct spf_thread *t)
{
    free(t->qbar);
    free(t->qpos);
    free(t->qneg);
    free(t->qgate);
    free(t->mass);
    free(t->imp);
    free(t->order);
    free(t->pick);
    free(t->kbuf);
    free(t->runs);
    free(t->read);
    free(t->seen);
    free(t->rec);
    free(t->rec_rand);
    free(t->rec_n);
}

void kvp_spf_free(struct kvp_spf *s)
{
    if (!s)
        return;
    for (int i = 0; s->thr && i < s->n_threads; i++)
        free_thread(&s->thr[i]);
    free(s->thr);
    free(s->stats);
    free(s->done);
    free(s->need);
    free(s->loaded);
    free(s->plan_runs);
    free(s->plan_n);
    free(s->plan_cols);
    free(s->plan_est);
    kvp_pgate_free(&s->gate);
    free(s);
}

/* The defaults of kvp_prefill_params (kvpred.h) filled in, or -1 with err for a bad value. */
static int resolve(struct kvp_prefill_params *p, int cache_bs, struct kvp_err *err)
{
    if (p->policy < 0 || p->policy >= KVP_PREFILL_COUNT)
        return kvp_err_set(err, KVP_EINVAL, "prefill policy %d unknown", p->policy);
    if (p->budget < 0)
        return kvp_err_set(err, KVP_EINVAL, "prefill budget %d is negative", p->budget);
    if (!(p->budget_ratio >= 0 && p->budget_ratio <= 1))
        return kvp_err_set(err, KVP_EINVAL, "prefill budget ratio %g is not in [0, 1]",
                           p->budget_ratio);
    if (!(p->threshold >= 0 && p->threshold <= 1))
        return kvp_err_set(err, KVP_EINVAL, "prefill threshold %g is not in [0, 1]",
                           p->threshold);
    if (p->budget == 0 && p->budget_ratio == 0)
        p->budget_ratio = 1.0 / 16;
    if (p->policy == KVP_PREFILL_LEARNED && !p->gate)
        return kvp_err_set(err, KVP_EINVAL, "prefill policy learned needs a gate "
                                            "(kvp_prefill_gate_load, --prefill-predictor)");
    if (p->policy == KVP_PREFILL_LEARNED && p->block == 0)
        p->block = p->gate->g.block;
    if (p->block == 0) /* the smallest multiple of the cache's blocks from 64 keys on */
        p->block = (64 + cache_bs - 1) / cache_bs * cache_bs;
    if (p->block < 0 || p->block > (1 << 16) || p->block % cache_bs != 0)
        return kvp_err_set(err, KVP_EINVAL,
                           "prefill block %d is not a multiple of the cache's block size %d",
                           p->block, cache_bs);
    /* zero: the default; negative: none */
    p->sink = p->sink == 0 ? 64 : p->sink < 0 ? 0 : p->sink;
    p->window = p->window == 0 ? 256 : p->window < 0 ? 0 : p->window;
    p->dense_tail = p->dense_tail == 0 ? 256 : p->dense_tail < 0 ? 0 : p->dense_tail;
    p->min_keys = p->min_keys == 0 ? 2048 : p->min_keys < 0 ? 0 : p->min_keys;
    return 0;
}

int kvp_spf_set(struct kvp_ctx *c, struct kvp_spf **out, const struct kvp_prefill_params *params,
                struct kvp_err *err)
{
    if (!params) {
        kvp_spf_free(*out);
        *out = NULL;
        return 0;
    }
    struct kvp_prefill_params p = *params;
    int rc = resolve(&p, c->kv.block_size, err);
    if (rc < 0)
        return rc;
    if (p.policy == KVP_PREFILL_LEARNED) {
        const struct kvp_pgate *g = &p.gate->g;
        if (g->n_layer != c->hp.n_layer || g->n_kv != c->hp.n_head_kv ||
            g->hd != c->hp.head_dim || g->block != p.block)
            return kvp_err_set(err, KVP_EINVAL,
                               "prefill gate is for %d layers, %d KV heads, head_dim %d, blocks "
                               "of %d; the model has %d, %d, %d and the prefill blocks of %d",
                               g->n_layer, g->n_kv, g->hd, g->block, c->hp.n_layer,
                               c->hp.n_head_kv, c->hp.head_dim, p.block);
    }
    struct kvp_spf *s = calloc(1, sizeof(*s));
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    if (p.policy == KVP_PREFILL_LEARNED && (rc = kvp_pgate_copy(&s->gate, &p.gate->g, err)) < 0) {
        free(s);
        return rc;
    }
    p.gate = NULL; /* the copy serves; the caller's may go */
    s->p = p;
    s->n_layer = c->hp.n_layer;
    s->n_kv = c->hp.n_head_kv;
    s->hd = c->hp.head_dim;
    s->g = c->hp.n_head / c->hp.n_head_kv;
    s->block = p.block;
    s->max_units = (c->n_ctx + p.block - 1) / p.block;
    s->n_threads = c->sh->n_threads;
    s->sdim = p.policy == KVP_PREFILL_POOLED    ? s->hd
              : p.policy == KVP_PREFILL_BOUND   ? 2 * s->hd
              : p.policy == KVP_PREFILL_LEARNED ? 3 * s->hd
                                                : 0;
    const size_t U = (size_t)s->max_units, hd = (size_t)s->hd, g = (size_t)s->g;
    bool ok = (s->done = calloc((size_t)s->n_layer, sizeof(int))) &&
              (s->thr = calloc((size_t)s->n_threads, sizeof(*s->thr)));
    if (ok && s->sdim)
        ok = (s->stats = malloc((size_t)s->n_layer * s->n_kv * U * s->sdim * sizeof(float)));
    if (ok && s->sdim && c->store) { /* the estimate reads no keys: plan the tiered reads */
        const size_t mb = (size_t)c->kv.max_blocks;
        /* a piece's chunks are windows of positions: one more than its rows fill */
        s->plan_items = s->n_kv * ((c->sh->n_batch + KVP_QCHUNK - 1) / KVP_QCHUNK + 1);
        const size_t it = (size_t)s->plan_items;
        ok = (s->need = malloc(mb)) && (s->loaded = malloc(mb)) &&
             (s->plan_runs = malloc(it * U * sizeof(*s->plan_runs))) &&
             (s->plan_n = malloc(it * sizeof(int))) && (s->plan_cols = malloc(it * sizeof(int))) &&
             (s->plan_est = malloc(it * sizeof(double)));
    }
    for (int i = 0; ok && i < s->n_threads; i++) {
        struct spf_thread *t = &s->thr[i];
        ok = (t->qbar = malloc(g * hd * sizeof(float))) &&
             (t->qpos = malloc(g * hd * sizeof(float))) &&
             (t->qneg = malloc(g * hd * sizeof(float))) &&
             (t->qgate = malloc(g * 3 * hd * sizeof(float))) &&
             (t->mass = malloc(g * U * sizeof(float))) && (t->imp = malloc(U * sizeof(float))) &&
             (t->order = malloc(U * sizeof(int32_t))) && (t->pick = malloc(U)) &&
             (t->kbuf = malloc(hd * (size_t)p.block * sizeof(float))) &&
             (t->runs = malloc(U * sizeof(*t->runs))) &&
             (t->read = calloc((size_t)s->n_layer, sizeof(double))) &&
             (t->seen = calloc((size_t)s->n_layer, sizeof(double))) &&
             (t->rec = calloc((size_t)s->n_layer, sizeof(double))) &&
             (t->rec_rand = calloc((size_t)s->n_layer, sizeof(double))) &&
             (t->rec_n = calloc((size_t)s->n_layer, sizeof(double)));
    }
    if (!ok) {
        kvp_spf_free(s);
        return kvp_err_set(err, KVP_ENOMEM, "cannot allocate the sparse prefill's statistics");
    }
    kvp_spf_free(*out);
    *out = s;
    return 0;
}

void kvp_spf_forget(struct kvp_spf *s, int n)
{
    if (!s)
        return;
    for (int l = 0; l < s->n_layer; l++)
        if (s->done[l] > n)
            s->done[l] = n;
}

/* ---- the per-block key statistics ------------------------------------------------------------ */

bool kvp_spf_needs_fold(const struct kvp_spf *s, const struct kvp_ctx *c)
{
    (void)c;
    return s && s->stats;
}

static float *unit_stats(const struct kvp_spf *s, int l, int kvh, int u)
{
    return s->stats + (((size_t)l * s->n_kv + kvh) * s->max_units + u) * s->sdim;
}

/* Statistics of key block u of (l, kvh) over its tokens below end: the mean key, or the
 * element-wise max and min. */
static void fold_unit(struct kvp_spf *s, const struct kvp_ctx *c, int l, int kvh, int u, int end,
                      float *kbuf)
{
    const struct kvp_kvcache *kv = &c->kv;
    const int hd = s->hd, B = s->block, bs = kv->block_size;
    const int t0 = u * B, t1 = end < t0 + B ? end : t0 + B, n = t1 - t0;
    for (int t = t0; t < t1; t += bs) {
        const int nt = t1 - t < bs ? t1 - t : bs;
        kv->kk->k_rows(kvp_kvcache_kblock(kv, l, kvh, t / bs), hd, bs, nt, kbuf + (t - t0),
                       (size_t)B);
    }
    float *st = unit_stats(s, l, kvh, u);
    for (int d = 0; d < hd; d++) {
        const float *row = kbuf + (size_t)d * B;
        float sum = row[0], mx = row[0], mn = row[0];
        for (int t = 1; t < n; t++) {
            sum += row[t];
            mx = row[t] > mx ? row[t] : mx;
            mn = row[t] < mn ? row[t] : mn;
        }
        if (s->p.policy == KVP_PREFILL_POOLED) {
            st[d] = sum / (float)n;
        } else if (s->p.policy == KVP_PREFILL_BOUND) {
            st[d] = mx;
            st[hd + d] = mn;
        } else { /* learned: [mean, max, min], the layout kvp_pgate_query's vector multiplies */
            st[d] = sum / (float)n;
            st[hd + d] = mx;
            st[2 * hd + d] = mn;
        }
    }
}

/* Blocks from the one holding the first token not folded (or the piece's first) to the piece's
 * end, for every KV head, split evenly over the threads. */
void kvp_spf_fold(struct kvp_spf *s, struct kvp_ctx *c, int l, int ith, int nth)
{
    const double t0 = kvp_time_now();
    const int end = c->job_pos0 + c->job_n;
    const int from = s->done[l] < c->job_pos0 ? s->done[l] : c->job_pos0;
    const int u0 = from / s->block, u1 = (end + s->block - 1) / s->block;
    const long items = (long)(u1 - u0) * s->n_kv;
    long i0, i1;
    kvp_split_range(items, ith, nth, &i0, &i1);
    for (long i = i0; i < i1; i++)
        fold_unit(s, c, l, (int)(i % s->n_kv), u0 + (int)(i / s->n_kv), end, s->thr[ith].kbuf);
    s->thr[ith].est_s += kvp_time_now() - t0;
}

void kvp_spf_folded(struct kvp_spf *s, const struct kvp_ctx *c, int l)
{
    s->done[l] = c->job_pos0 + c->job_n;
}

/* ---- the estimates --------------------------------------------------------------------------- */

/* Mean of the nq queries from row qs of each head of group kvh into t->qbar (and its positive
 * and negative parts for the bound). */
static void mean_queries(const struct kvp_spf *s, const struct kvp_ctx *c, int kvh, int qs,
                         int nq, struct spf_thread *t)
{
    const int hd = s->hd, q_dim = c->hp.n_head * hd;
    for (int j = 0; j < s->g; j++) {
        float *m = t->qbar + (size_t)j * hd;
        memset(m, 0, (size_t)hd * sizeof(float));
        const float *q = c->q + (size_t)qs * q_dim + (size_t)(kvh * s->g + j) * hd;
        for (int i = 0; i < nq; i++)
            kvp_simd()->axpy(1.0f, q + (size_t)i * q_dim, m, hd);
        for (int d = 0; d < hd; d++) {
            m[d] /= (float)nq;
            t->qpos[(size_t)j * hd + d] = m[d] > 0 ? m[d] : 0;
            t->qneg[(size_t)j * hd + d] = m[d] < 0 ? m[d] : 0;
        }
    }
}

/* Each head's estimated share of the block's attention on each of the U key blocks, from one
 * logit per block (the mean query against the block's statistics, standing for each of its cnt
 * keys): mass[j][u] = cnt_u e^{s_ju} / Σ_v cnt_v e^{s_jv}. */
static void mass_from_logits(const struct kvp_spf *s, struct spf_thread *t, int U, int n_keys)
{
    for (int j = 0; j < s->g; j++) {
        float *m = t->mass + (size_t)j * s->max_units;
        float mx = -INFINITY;
        for (int u = 0; u < U; u++)
            mx = m[u] > mx ? m[u] : mx;
        double z = 0;
        for (int u = 0; u < U; u++) {
            const int cnt = n_keys - u * s->block < s->block ? n_keys - u * s->block : s->block;
            m[u] = (float)cnt * expf(m[u] - mx);
            z += m[u];
        }
        for (int u = 0; u < U; u++)
            m[u] = (float)(m[u] / z);
    }
}

/* The logits of every key block for each head of the group: one product of the g mean queries
 * with the blocks' mean keys (pooled), or two with the blocks' maxima and minima (bound:
 * Σ_d max(q_d M_d, q_d m_d) takes the max where q_d > 0 and the min where q_d < 0). */
static void estimate_pooled(const struct kvp_spf *s, const struct kvp_ctx *c, int l, int kvh,
                            int U, int n_keys, struct spf_thread *t)
{
    (void)c;
    const int hd = s->hd, g = s->g, ld = s->sdim;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *st = unit_stats(s, l, kvh, 0);
    if (s->p.policy == KVP_PREFILL_POOLED) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g, U, hd, scale, t->qbar, hd, st,
                    ld, 0.0f, t->mass, s->max_units);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g, U, hd, scale, t->qpos, hd, st,
                    ld, 0.0f, t->mass, s->max_units);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g, U, hd, scale, t->qneg, hd,
                    st + hd, ld, 1.0f, t->mass, s->max_units);
    }
    mass_from_logits(s, t, U, n_keys);
}

/* The learned gate's logits (predictor/prefill_gate.h): per head of the group its query vector
 * [a∘q̄, b∘q̄⁺, c∘q̄⁻] against every block's [mean, max, min] in one product, plus the distance
 * prior of each block before the query block qu (in key blocks). */
static void estimate_learned(const struct kvp_spf *s, int l, int kvh, int qu, int U, int n_keys,
                             struct spf_thread *t)
{
    const int hd = s->hd, g = s->g, ld = s->sdim;
    for (int j = 0; j < g; j++)
        kvp_pgate_query(&s->gate, l, kvh, t->qbar + (size_t)j * hd, t->qgate + (size_t)j * ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g, U, ld, 1.0f, t->qgate, ld,
                unit_stats(s, l, kvh, 0), ld, 0.0f, t->mass, s->max_units);
    for (int u = 0; u < U; u++) {
        const float prior = kvp_pgate_prior(&s->gate, l, kvh, qu - u);
        for (int j = 0; j < g; j++)
            t->mass[(size_t)j * s->max_units + u] += prior;
    }
    mass_from_logits(s, t, U, n_keys);
}

/* Every SPF_STRIDE-th query of the block against every key it sees (gathered as f32 into
 * ts->vc, [hd][n_keys], which attention overwrites afterwards), softmax per sampled row, the
 * probabilities summed per key block and averaged over the rows. */
static void estimate_strided(const struct kvp_spf *s, const struct kvp_ctx *c, int l, int kvh,
                             int qs, int nq, int U, int n_keys, struct spf_thread *t,
                             struct kvp_thread_scratch *ts)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const struct kvp_kvcache *kv = &c->kv;
    const int hd = s->hd, bs = kv->block_size, q_dim = c->hp.n_head * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int b = 0; b * bs < n_keys; b++) {
        const int nt = n_keys - b * bs < bs ? n_keys - b * bs : bs;
        kv->kk->k_rows(kvp_kvcache_kblock(kv, l, kvh, b), hd, bs, nt, ts->vc + (size_t)b * bs,
                       (size_t)n_keys);
    }
    const int rows = (nq + SPF_STRIDE - 1) / SPF_STRIDE;
    memset(t->mass, 0, (size_t)s->g * s->max_units * sizeof(float));
    for (int j = 0; j < s->g; j++) {
        const float *q = c->q + (size_t)qs * q_dim + (size_t)(kvh * s->g + j) * hd;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, n_keys, hd, scale, q,
                    q_dim * SPF_STRIDE, ts->vc, n_keys, 0.0f, ts->s, n_keys);
        float *m = t->mass + (size_t)j * s->max_units;
        for (int r = 0; r < rows; r++) {
            float *row = ts->s + (size_t)r * n_keys;
            const int visible = c->job_pos0 + qs + r * SPF_STRIDE + 1;
            kvp_attn_softcap(row, visible, kv->score_cap);
            const float inv = 1.0f / ops->exp_sum(row, visible, kvp_simd_max(ops, row, visible));
            for (int u = 0; u * s->block < visible; u++) {
                const int e = (u + 1) * s->block < visible ? (u + 1) * s->block : visible;
                float sum = 0;
                for (int k = u * s->block; k < e; k++)
                    sum += row[k];
                m[u] += sum * inv / (float)rows;
            }
        }
    }
    (void)U;
}

/* ---- measuring ------------------------------------------------------------------------------- */

/* Keys 0..n_keys of (layer l, KV head kvh) as f32 rows into ts->vc: how measure and collect read
 * the dense attention (attention overwrites ts->vc afterwards). */
static void gather_keys(const struct kvp_kvcache *kv, int l, int kvh, int hd, int n_keys,
                        struct kvp_thread_scratch *ts)
{
    const int bs = kv->block_size;
    for (int b = 0; b * bs < n_keys; b++) {
        const int nt = n_keys - b * bs < bs ? n_keys - b * bs : bs;
        kv->kk->k_rows(kvp_kvcache_kblock(kv, l, kvh, b), hd, bs, nt, ts->vc + (size_t)b * bs,
                       (size_t)n_keys);
    }
}

/* Query head j of the group against the gathered keys: the block's nq (<= KVP_QCHUNK) score
 * rows in ts->s, n_keys apart, each capped as attention caps it and left by ops->exp_sum as
 * exp(score - max); inv[i] is 1 / the sum over the keys query i sees, so row[k] * inv[i] is
 * query i's dense probability of key k. */
static void dense_rows(const struct kvp_spf *s, const struct kvp_ctx *c, int kvh, int j, int qs,
                       int nq, int n_keys, struct kvp_thread_scratch *ts, double *inv)
{
    const struct kvp_simd_ops *ops = kvp_simd();
    const int hd = s->hd, q_dim = c->hp.n_head * hd;
    const float *q = c->q + (size_t)qs * q_dim + (size_t)(kvh * s->g + j) * hd;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, n_keys, hd,
                1.0f / sqrtf((float)hd), q, q_dim, ts->vc, n_keys, 0.0f, ts->s, n_keys);
    for (int i = 0; i < nq; i++) {
        float *row = ts->s + (size_t)i * n_keys;
        const int visible = c->job_pos0 + qs + i + 1;
        kvp_attn_softcap(row, visible, c->kv.score_cap);
        inv[i] = 1.0 / ops->exp_sum(row, visible, kvp_simd_max(ops, row, visible));
    }
}

/* The dense attention of the block's queries (each head of the group, keys gathered as f32 into
 * ts->vc and scores into ts->s, which attention overwrites afterwards): the mean share of it on
 * the picked blocks, and the mean share a random pick of as many candidate blocks would get in
 * expectation (the forced blocks' share plus picked/candidates of the rest's). */
static void measure(struct kvp_spf *s, const struct kvp_ctx *c, int l, int kvh, int qs, int nq,
                    int n_keys, int n_cand, int n_extra, struct spf_thread *t,
                    struct kvp_thread_scratch *ts)
{
    const int B = s->block;
    const int sink_u = (s->p.sink + B - 1) / B;
    const int win_u = (c->job_pos0 + qs - s->p.window > 0 ? c->job_pos0 + qs - s->p.window : 0) / B;
    double inv[KVP_QCHUNK];
    gather_keys(&c->kv, l, kvh, s->hd, n_keys, ts);
    for (int j = 0; j < s->g; j++) {
        dense_rows(s, c, kvh, j, qs, nq, n_keys, ts, inv);
        for (int i = 0; i < nq; i++) {
            const float *row = ts->s + (size_t)i * n_keys;
            const int visible = c->job_pos0 + qs + i + 1;
            double picked = 0, forced = 0;
            for (int k = 0; k < visible; k++) {
                const int u = k / B;
                picked += t->pick[u] ? row[k] * inv[i] : 0;
                forced += u < sink_u || u >= win_u ? row[k] * inv[i] : 0;
            }
            t->rec[l] += picked;
            t->rec_rand[l] += forced + (n_cand > 0 ? (1 - forced) * n_extra / n_cand : 0);
            t->rec_n[l] += 1;
        }
    }
}

/* The collector's sample (kvp_spf_set_collector): each head's dense attention share on every key
 * block, the mean over the block's queries (keys gathered into ts->vc, scores in ts->s, as
 * measure does), handed over with the block's mean queries and the blocks' statistics. */
static void collect(struct kvp_spf *s, const struct kvp_ctx *c, int l, int kvh, int qs, int nq,
                    int n_keys, int U, int n_pick, struct spf_thread *t,
                    struct kvp_thread_scratch *ts)
{
    const int B = s->block;
    double inv[KVP_QCHUNK];
    gather_keys(&c->kv, l, kvh, s->hd, n_keys, ts);
    /* collecting for training only (never in a plain prefill): an allocation per item is fine */
    float *mass = malloc((size_t)s->g * U * sizeof(float));
    if (!mass)
        return;
    memset(mass, 0, (size_t)s->g * U * sizeof(float));
    for (int j = 0; j < s->g; j++) {
        dense_rows(s, c, kvh, j, qs, nq, n_keys, ts, inv);
        for (int i = 0; i < nq; i++) {
            const float *row = ts->s + (size_t)i * n_keys;
            const int visible = c->job_pos0 + qs + i + 1;
            for (int k = 0; k < visible; k++)
                mass[(size_t)j * U + k / B] += (float)(row[k] * inv[i] / nq);
        }
    }
    const struct kvp_spf_sample smp = {
        .l = l, .kvh = kvh, .qu = (c->job_pos0 + qs) / B, .U = U, .n_keys = n_keys, .block = B,
        .g = s->g, .hd = s->hd, .n_pick = n_pick, .forced = t->pick, .qbar = t->qbar,
        .stats = unit_stats(s, l, kvh, 0), .mass = mass};
    s->collector(s->collector_user, &smp);
    free(mass);
}

/* ---- the choice ------------------------------------------------------------------------------ */

/* qsort has no argument for the comparison, so each thread points this at its importances. */
static _Thread_local const float *sort_imp;

/* Most important first; ties by position, so the choice does not depend on the sort. */
static int by_importance(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (sort_imp[x] != sort_imp[y])
        return sort_imp[x] > sort_imp[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

int kvp_spf_select(struct kvp_spf *s, struct kvp_ctx *c, int l, int kvh, int qs, int nq,
                   int n_keys, int ith, struct kvp_thread_scratch *ts,
                   const struct kvp_key_run **runs, int *n_cols, double *est_s)
{
    struct spf_thread *t = &s->thr[ith];
    const struct kvp_prefill_params *p = &s->p;
    const int B = s->block, U = (n_keys + B - 1) / B;
    const int p0 = c->job_pos0 + qs, last = p0 + nq - 1;
    const long want = p->budget > 0 ? p->budget : (long)ceil(p->budget_ratio * n_keys);
    const int bu = (int)((want + B - 1) / B); /* blocks the budget buys */
    t->runs[0] = (struct kvp_key_run){0, n_keys};
    *runs = t->runs;
    *n_cols = n_keys;
    *est_s = 0;
    /* a budget that covers every block still goes through the estimate and the choice (which
     * then picks everything): that is the path the density-1 test holds to the dense bits */
    if (p->policy == KVP_PREFILL_DENSE || n_keys < p->min_keys ||
        last >= c->job_end - p->dense_tail)
        return 1;
    /* forced: the sink's blocks and the window's (which hold the block's own keys) */
    const int sink_u = (p->sink + B - 1) / B;
    const int win_u = (p0 - p->window > 0 ? p0 - p->window : 0) / B;
    int forced = 0;
    for (int u = 0; u < U; u++) {
        t->pick[u] = u < sink_u || u >= win_u;
        forced += t->pick[u];
    }
    if (forced >= U)
        return 1;
    if (forced < bu || p->threshold > 0) {
        double te = kvp_time_now();
        if (p->policy == KVP_PREFILL_STRIDED) {
            estimate_strided(s, c, l, kvh, qs, nq, U, n_keys, t, ts);
        } else if (p->policy == KVP_PREFILL_LEARNED) {
            mean_queries(s, c, kvh, qs, nq, t);
            estimate_learned(s, l, kvh, p0 / B, U, n_keys, t);
        } else {
            mean_queries(s, c, kvh, qs, nq, t);
            estimate_pooled(s, c, l, kvh, U, n_keys, t);
        }
        if (s->collector && p->policy == KVP_PREFILL_LEARNED) {
            const double tc = kvp_time_now(); /* not the estimate's cost */
            collect(s, c, l, kvh, qs, nq, n_keys, U, bu - forced, t, ts);
            te += kvp_time_now() - tc;
        }
        /* the group reads one set: a block counts as much as the head that wants it most */
        int n_cand = 0;
        double covered = 0; /* mean over the heads of the mass of what is picked */
        for (int u = 0; u < U; u++) {
            float mx = 0, sum = 0;
            for (int j = 0; j < s->g; j++) {
                const float m = t->mass[(size_t)j * s->max_units + u];
                mx = m > mx ? m : mx;
                sum += m;
            }
            t->imp[u] = mx;
            if (t->pick[u])
                covered += sum / s->g;
            else
                t->order[n_cand++] = u;
        }
        sort_imp = t->imp;
        qsort(t->order, (size_t)n_cand, sizeof(int32_t), by_importance);
        for (int i = 0, picked = forced; i < n_cand && picked < bu; i++) {
            if (p->threshold > 0 && covered >= p->threshold)
                break;
            const int u = t->order[i];
            t->pick[u] = 1;
            picked++;
            float sum = 0;
            for (int j = 0; j < s->g; j++)
                sum += t->mass[(size_t)j * s->max_units + u];
            covered += sum / s->g;
        }
        *est_s = kvp_time_now() - te;
    }
    int n = 0, cols = 0, n_picked = 0;
    for (int u = 0; u < U; u++) {
        if (!t->pick[u])
            continue;
        n_picked++;
        const int start = u * B, len = n_keys - start < B ? n_keys - start : B;
        if (n > 0 && t->runs[n - 1].start + t->runs[n - 1].n == start)
            t->runs[n - 1].n += len;
        else
            t->runs[n++] = (struct kvp_key_run){start, len};
        cols += len;
    }
    *n_cols = cols;
    if (s->measure)
        measure(s, c, l, kvh, qs, nq, n_keys, U - forced, n_picked - forced, t, ts);
    if (s->observer)
        s->observer(s->observer_user, l, kvh, p0, nq, n_keys, t->runs, n);
    return n;
}

/* ---- a tiered store's prefill ------------------------------------------------------------------ */

const uint8_t *kvp_spf_stage_first(struct kvp_spf *s, const struct kvp_ctx *c, int l)
{
    if (!s || !s->need || s->measure) { /* measuring reads every key */
        if (s)
            s->staged = false;
        return NULL;
    }
    const int bs = c->kv.block_size, pos0 = c->job_pos0;
    const int nb_old = (pos0 + bs - 1) / bs;
    /* the fold reads from the first token not folded, rounded down to its key block; the
     * piece writes into the block at pos0: both are loaded now */
    const int from = s->done[l] < pos0 ? s->done[l] : pos0;
    const int b0 = from / s->block * s->block / bs;
    for (int b = 0; b < nb_old; b++)
        s->need[b] = s->loaded[b] = b >= b0;
    s->staged = true;
    return s->need;
}

bool kvp_spf_staged(const struct kvp_spf *s)
{
    return s && s->staged;
}

void kvp_spf_plan(struct kvp_spf *s, struct kvp_ctx *c, int l, int ith, int nth,
                  struct kvp_thread_scratch *ts)
{
    const int n = c->job_n, pos0 = c->job_pos0, base = kvp_prefill_base(pos0);
    const int n_chunks = kvp_prefill_chunks(pos0, n);
    const long items = (long)s->n_kv * n_chunks;
    long i0, i1;
    kvp_split_range(items, ith, nth, &i0, &i1);
    for (long i = i0; i < i1; i++) {
        const int kvh = (int)(i / n_chunks), chunk = (int)(i % n_chunks);
        /* the positions prefill attention's chunk covers (prefill_attention.c) */
        const int w0 = base + chunk * KVP_QCHUNK, a = w0 > pos0 ? w0 : pos0;
        const int b = w0 + KVP_QCHUNK < pos0 + n ? w0 + KVP_QCHUNK : pos0 + n;
        const struct kvp_key_run *runs;
        int cols;
        double est;
        const int nr = kvp_spf_select(s, c, l, kvh, a - pos0, b - a, b, ith, ts, &runs, &cols,
                                      &est);
        memcpy(s->plan_runs + (size_t)i * s->max_units, runs, (size_t)nr * sizeof(*runs));
        s->plan_n[i] = nr;
        s->plan_cols[i] = cols;
        s->plan_est[i] = est;
    }
}

void kvp_spf_plan_load(struct kvp_spf *s, struct kvp_ctx *c, int l)
{
    const int bs = c->kv.block_size, nb_old = (c->job_pos0 + bs - 1) / bs;
    const int items = s->n_kv * kvp_prefill_chunks(c->job_pos0, c->job_n);
    memset(s->need, 0, (size_t)nb_old);
    for (int i = 0; i < items; i++)
        for (int r = 0; r < s->plan_n[i]; r++) {
            const struct kvp_key_run *run = s->plan_runs + (size_t)i * s->max_units + r;
            const int e = (run->start + run->n + bs - 1) / bs;
            for (int b = run->start / bs; b < e && b < nb_old; b++)
                s->need[b] = !s->loaded[b];
        }
    kvp_store_prefill_load(c->store, l, nb_old, s->need);
}

int kvp_spf_planned(const struct kvp_spf *s, int kvh, int chunk, int n_chunks,
                    const struct kvp_key_run **runs, int *n_cols, double *est_s)
{
    const size_t i = (size_t)kvh * n_chunks + chunk;
    *runs = s->plan_runs + i * s->max_units;
    *n_cols = s->plan_cols[i];
    *est_s = s->plan_est[i];
    return s->plan_n[i];
}

/* ---- counters -------------------------------------------------------------------------------- */

void kvp_spf_count(struct kvp_spf *s, int ith, int l, double est_s, double attn_s, double read,
                   double seen)
{
    struct spf_thread *t = &s->thr[ith];
    t->est_s += est_s;
    t->attn_s += attn_s;
    t->read[l] += read;
    t->seen[l] += seen;
}

void kvp_spf_count_tokens(struct kvp_spf *s, int n)
{
    s->thr[0].tokens += n;
}

void kvp_spf_stats(const struct kvp_spf *s, struct kvp_prefill_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!s)
        return;
    for (int i = 0; i < s->n_threads; i++) {
        const struct spf_thread *t = &s->thr[i];
        st->estimate_s += t->est_s;
        st->attention_s += t->attn_s;
        st->tokens += (uint64_t)t->tokens;
        for (int l = 0; l < s->n_layer; l++) {
            st->keys_read += t->read[l];
            st->keys_seen += t->seen[l];
        }
    }
}

double kvp_spf_density(const struct kvp_spf *s, int layer)
{
    if (!s || layer < 0 || layer >= s->n_layer)
        return -1;
    double read = 0, seen = 0;
    for (int i = 0; i < s->n_threads; i++) {
        read += s->thr[i].read[layer];
        seen += s->thr[i].seen[layer];
    }
    return seen > 0 ? read / seen : -1;
}

void kvp_spf_reset_stats(struct kvp_spf *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_threads; i++) {
        struct spf_thread *t = &s->thr[i];
        t->est_s = t->attn_s = t->tokens = 0;
        memset(t->read, 0, (size_t)s->n_layer * sizeof(double));
        memset(t->seen, 0, (size_t)s->n_layer * sizeof(double));
        memset(t->rec, 0, (size_t)s->n_layer * sizeof(double));
        memset(t->rec_rand, 0, (size_t)s->n_layer * sizeof(double));
        memset(t->rec_n, 0, (size_t)s->n_layer * sizeof(double));
    }
}

void kvp_spf_measure(struct kvp_spf *s, bool on)
{
    if (s)
        s->measure = on;
}

void kvp_spf_set_collector(struct kvp_spf *s, kvp_spf_collector fn, void *user)
{
    if (s) {
        s->collector = fn;
        s->collector_user = user;
    }
}

void kvp_spf_set_observer(struct kvp_spf *s, kvp_spf_observer fn, void *user)
{
    if (s) {
        s->observer = fn;
        s->observer_user = user;
    }
}

int kvp_spf_recovery(const struct kvp_spf *s, int layer, double *rec, double *rec_random)
{
    double r = 0, rr = 0, n = 0;
    for (int i = 0; s && layer >= 0 && layer < s->n_layer && i < s->n_threads; i++) {
        r += s->thr[i].rec[layer];
        rr += s->thr[i].rec_rand[layer];
        n += s->thr[i].rec_n[layer];
    }
    if (n == 0)
        return -1;
    *rec = r / n;
    *rec_random = rr / n;
    return 0;
}

struct kvp_spf *kvp_ctx_spf(kvp_ctx *c)
{
    return c->spf;
}

/* ---- the public face (kvpred.h) -------------------------------------------------------------- */

int kvp_prefill_gate_load(const char *path, struct kvp_prefill_gate **out, struct kvp_err *err)
{
    *out = NULL;
    struct kvp_prefill_gate *g = calloc(1, sizeof(*g));
    if (!g)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    int rc = kvp_pgate_load(path, &g->g, err);
    if (rc < 0) {
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int kvp_spf_gate_from(const struct kvp_pgate *src, struct kvp_prefill_gate **out,
                      struct kvp_err *err)
{
    *out = NULL;
    struct kvp_prefill_gate *g = calloc(1, sizeof(*g));
    if (!g)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    int rc = kvp_pgate_copy(&g->g, src, err);
    if (rc < 0) {
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

void kvp_prefill_gate_free(struct kvp_prefill_gate *g)
{
    if (g) {
        kvp_pgate_free(&g->g);
        free(g);
    }
}

int kvp_ctx_set_prefill(kvp_ctx *c, const struct kvp_prefill_params *params, struct kvp_err *err)
{
    if (!c)
        return kvp_err_set(err, KVP_EINVAL, "no context");
    return kvp_spf_set(c, &c->spf, params, err);
}

void kvp_ctx_prefill_stats(const kvp_ctx *c, struct kvp_prefill_stats *st)
{
    kvp_spf_stats(c->spf, st);
}

double kvp_ctx_prefill_density(const kvp_ctx *c, int layer)
{
    return kvp_spf_density(c->spf, layer);
}

void kvp_ctx_prefill_reset_stats(kvp_ctx *c)
{
    kvp_spf_reset_stats(c->spf);
}

void kvp_ctx_set_progress(kvp_ctx *c, kvp_progress_fn fn, void *user)
{
    c->progress = fn;
    c->progress_user = user;
}

double kvp_ctx_progress_tokens(const kvp_ctx *c)
{
    long long tl = atomic_load_explicit(&c->progress_tl, memory_order_relaxed);
    return c->hp.n_layer > 0 ? (double)tl / c->hp.n_layer : 0;
}
