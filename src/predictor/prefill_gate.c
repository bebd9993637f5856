/* The learned gate of block-sparse prefill: its file, its logits and its training (see
 * prefill_gate.h). */
#include "predictor/prefill_gate.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytebuf.h"
#include "core/cursor.h"
#include "core/fnv.h"
#include "core/platform.h"

static const char file_magic[8] = {'K', 'V', 'P', 'G', 'A', 'T', 'E', '1'};
#define FILE_VERSION 1u

int kvp_pgate_init(struct kvp_pgate *g, int n_layer, int n_kv, int hd, int block,
                   struct kvp_err *err)
{
    memset(g, 0, sizeof(*g));
    if (n_layer < 1 || n_layer > KVP_PGATE_MAX_LAYER || n_kv < 1 || n_kv > KVP_PGATE_MAX_KV ||
        hd < 1 || hd > KVP_PGATE_MAX_HD || block < 1 || block > (1 << 16))
        return kvp_err_set(err, KVP_EINVAL,
                           "prefill gate: implausible shape (%d layers, %d KV heads, head_dim "
                           "%d, block %d)",
                           n_layer, n_kv, hd, block);
    g->n_layer = n_layer;
    g->n_kv = n_kv;
    g->hd = hd;
    g->block = block;
    g->nw = 3 * hd + KVP_PGATE_NPOS;
    g->w = calloc((size_t)n_layer * n_kv * g->nw, sizeof(float));
    g->rec = malloc((size_t)n_layer * 2 * sizeof(float));
    if (!g->w || !g->rec) {
        kvp_pgate_free(g);
        return kvp_err_set(err, KVP_ENOMEM, "prefill gate: out of memory");
    }
    const float a = 1.0f / sqrtf((float)hd);
    for (int l = 0; l < n_layer; l++) {
        g->rec[2 * l] = g->rec[2 * l + 1] = -1;
        for (int h = 0; h < n_kv; h++)
            for (int d = 0; d < hd; d++)
                kvp_pgate_w(g, l, h)[d] = a;
    }
    return 0;
}

void kvp_pgate_free(struct kvp_pgate *g)
{
    free(g->w);
    free(g->rec);
    memset(g, 0, sizeof(*g));
}

int kvp_pgate_copy(struct kvp_pgate *dst, const struct kvp_pgate *src, struct kvp_err *err)
{
    int rc = kvp_pgate_init(dst, src->n_layer, src->n_kv, src->hd, src->block, err);
    if (rc < 0)
        return rc;
    float *w = dst->w, *rec = dst->rec;
    *dst = *src;
    dst->w = w;
    dst->rec = rec;
    memcpy(w, src->w, (size_t)src->n_layer * src->n_kv * src->nw * sizeof(float));
    memcpy(rec, src->rec, (size_t)src->n_layer * 2 * sizeof(float));
    return 0;
}

/* ---- the file ------------------------------------------------------------------------------ */

int kvp_pgate_save(const struct kvp_pgate *g, const char *path, struct kvp_err *err)
{
    struct kvp_bytebuf b = {0};
    kvp_bytebuf_put(&b, file_magic, 8);
    kvp_bytebuf_u32(&b, FILE_VERSION);
    const uint32_t hdr[5] = {(uint32_t)g->n_layer, (uint32_t)g->n_kv, (uint32_t)g->hd,
                             (uint32_t)g->block, KVP_PGATE_NPOS};
    for (int i = 0; i < 5; i++)
        kvp_bytebuf_u32(&b, hdr[i]);
    kvp_bytebuf_u64(&b, g->seed);
    kvp_bytebuf_u64(&b, g->n_train);
    kvp_bytebuf_u64(&b, g->n_val);
    char name[64] = {0};
    memcpy(name, g->model, strnlen(g->model, sizeof(name) - 1));
    kvp_bytebuf_put(&b, name, sizeof(name));
    kvp_bytebuf_put(&b, &g->budget, 4);
    kvp_bytebuf_put(&b, g->rec, (size_t)g->n_layer * 2 * sizeof(float));
    const size_t np = (size_t)g->n_layer * g->n_kv * g->nw;
    kvp_bytebuf_u32(&b, (uint32_t)np);
    kvp_bytebuf_put(&b, g->w, np * sizeof(float));
    return kvp_bytebuf_save(&b, path, err);
}

#define TRUNC(what) kvp_err_set(err, KVP_EFORMAT, "prefill gate file truncated (%s)", what)

int kvp_pgate_parse(const void *data, size_t size, struct kvp_pgate *g, struct kvp_err *err)
{
    struct kvp_cursor c;
    kvp_cursor_init(&c, data, size);
    memset(g, 0, sizeof(*g));
    const uint8_t *magic, *name, *rec, *w;
    if (kvp_rd_bytes(&c, 8, &magic) < 0)
        return TRUNC("magic");
    if (memcmp(magic, file_magic, 8) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "not a kvpred prefill gate file (bad magic)");
    uint32_t h[6];
    for (int i = 0; i < 6; i++)
        if (kvp_rd_u32(&c, &h[i]) < 0)
            return TRUNC("header");
    if (h[0] != FILE_VERSION)
        return kvp_err_set(err, KVP_EFORMAT, "prefill gate file version %u (this build reads %u)",
                           h[0], FILE_VERSION);
    if (h[1] < 1 || h[1] > KVP_PGATE_MAX_LAYER || h[2] < 1 || h[2] > KVP_PGATE_MAX_KV ||
        h[3] < 1 || h[3] > KVP_PGATE_MAX_HD || h[4] < 1 || h[4] > (1u << 16) ||
        h[5] != KVP_PGATE_NPOS)
        return kvp_err_set(err, KVP_EFORMAT,
                           "prefill gate file: implausible shape (%u layers, %u KV heads, "
                           "head_dim %u, block %u, %u distance features)",
                           h[1], h[2], h[3], h[4], h[5]);
    uint64_t seed, n_train, n_val;
    float budget;
    if (kvp_rd_u64(&c, &seed) < 0 || kvp_rd_u64(&c, &n_train) < 0 ||
        kvp_rd_u64(&c, &n_val) < 0 || kvp_rd_bytes(&c, 64, &name) < 0 ||
        kvp_rd_f32(&c, &budget) < 0 || kvp_rd_bytes(&c, (size_t)h[1] * 8, &rec) < 0)
        return TRUNC("training metadata");
    uint32_t np;
    if (kvp_rd_u32(&c, &np) < 0)
        return TRUNC("weights");
    const size_t want = (size_t)h[1] * h[2] * (3 * (size_t)h[3] + KVP_PGATE_NPOS);
    if (np != want)
        return kvp_err_set(err, KVP_EFORMAT,
                           "prefill gate file: %u weights, the shape needs %zu", np, want);
    if (kvp_rd_bytes(&c, (size_t)np * 4, &w) < 0)
        return TRUNC("weights");
    const size_t body = c.pos;
    uint64_t sum;
    if (kvp_rd_u64(&c, &sum) < 0)
        return TRUNC("checksum");
    if (kvp_cursor_left(&c) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "prefill gate file: %zu unexpected bytes at the end",
                           kvp_cursor_left(&c));
    if (sum != kvp_fnv64(KVP_FNV64_INIT, c.base, body))
        return kvp_err_set(err, KVP_EFORMAT, "prefill gate file corrupted (checksum mismatch)");
    int rc = kvp_pgate_init(g, (int)h[1], (int)h[2], (int)h[3], (int)h[4], err);
    if (rc < 0)
        return rc;
    memcpy(g->w, w, (size_t)np * 4);
    memcpy(g->rec, rec, (size_t)h[1] * 8);
    for (uint32_t i = 0; i < np; i++)
        if (!isfinite(g->w[i])) {
            kvp_pgate_free(g);
            return kvp_err_set(err, KVP_EFORMAT, "prefill gate file: weight %u is not finite", i);
        }
    memcpy(g->model, name, 63);
    g->model[63] = 0;
    g->seed = seed;
    g->n_train = n_train;
    g->n_val = n_val;
    g->budget = budget;
    return 0;
}

int kvp_pgate_load(const char *path, struct kvp_pgate *g, struct kvp_err *err)
{
    memset(g, 0, sizeof(*g));
    if (!path || !*path)
        return kvp_err_set(err, KVP_EINVAL, "prefill gate: no file given");
    struct kvp_file_map fm;
    if (kvp_file_map(path, &fm, err) < 0)
        return kvp_err_prefix(err, "prefill gate file");
    int rc = kvp_pgate_parse(fm.data, fm.size, g, err);
    kvp_file_unmap(&fm);
    return rc < 0 ? kvp_err_prefix(err, "%s", path) : 0;
}

/* ---- the logits ---------------------------------------------------------------------------- */

void kvp_pgate_query(const struct kvp_pgate *g, int l, int kvh, const float *qbar, float *out)
{
    const float *w = kvp_pgate_w(g, l, kvh);
    const int hd = g->hd;
    for (int d = 0; d < hd; d++) {
        const float q = qbar[d];
        out[d] = w[d] * q;
        out[hd + d] = q > 0 ? w[hd + d] * q : 0;
        out[2 * hd + d] = q < 0 ? w[2 * hd + d] * q : 0;
    }
}

/* d < 0: a key block inside the query block (a query block longer than a key block); those are
 * the window's, read anyway, and are given the nearest distance rather than a pole. */
static void pos_features(int d, float f[KVP_PGATE_NPOS])
{
    d = d < 0 ? 0 : d;
    f[0] = logf(1.0f + (float)d);
    f[1] = 1.0f / (1.0f + (float)d);
}

float kvp_pgate_prior(const struct kvp_pgate *g, int l, int kvh, int d)
{
    const float *w = kvp_pgate_w(g, l, kvh) + 3 * g->hd;
    float f[KVP_PGATE_NPOS];
    pos_features(d, f);
    float z = 0;
    for (int i = 0; i < KVP_PGATE_NPOS; i++)
        z += w[i] * f[i];
    return z;
}

/* ---- training ------------------------------------------------------------------------------ */

static void item_free(struct kvp_pgate_item *it)
{
    free(it->qbar);
    free(it->st);
    free(it->d);
    free(it->lncnt);
    free(it->target);
}

void kvp_pgate_set_free(struct kvp_pgate_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        item_free(&s->it[i]);
    free(s->it);
    memset(s, 0, sizeof(*s));
}

int kvp_pgate_set_add(struct kvp_pgate_set *s, int l, int kvh, int qu, int U, int n_keys,
                      int block, const uint8_t *forced, int n_pick, const float *qbar,
                      const float *stats, const float *mass, struct kvp_err *err)
{
    const int g = s->g, hd = s->hd;
    int n_cand = 0;
    for (int u = 0; u < U; u++)
        n_cand += !forced[u];
    if (n_cand == 0 || n_pick <= 0)
        return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        struct kvp_pgate_item *p = realloc(s->it, cap * sizeof(*p));
        if (!p)
            return kvp_err_set(err, KVP_ENOMEM, "prefill gate: out of memory");
        s->it = p;
        s->cap = cap;
    }
    struct kvp_pgate_item it = {.l = l, .kvh = kvh, .n_cand = n_cand,
                                .n_pick = n_pick < n_cand ? n_pick : n_cand};
    it.qbar = malloc((size_t)g * hd * sizeof(float));
    it.st = malloc((size_t)n_cand * 3 * hd * sizeof(float));
    it.d = malloc((size_t)n_cand * sizeof(int32_t));
    it.lncnt = malloc((size_t)n_cand * sizeof(float));
    it.target = malloc((size_t)g * n_cand * sizeof(float));
    if (!it.qbar || !it.st || !it.d || !it.lncnt || !it.target) {
        item_free(&it);
        return kvp_err_set(err, KVP_ENOMEM, "prefill gate: out of memory");
    }
    memcpy(it.qbar, qbar, (size_t)g * hd * sizeof(float));
    for (int u = 0, i = 0; u < U; u++) {
        if (forced[u])
            continue;
        memcpy(it.st + (size_t)i * 3 * hd, stats + (size_t)u * 3 * hd, 3 * hd * sizeof(float));
        it.d[i] = qu - u;
        const int cnt = n_keys - u * block < block ? n_keys - u * block : block;
        it.lncnt[i] = logf((float)cnt);
        for (int j = 0; j < g; j++)
            it.target[(size_t)j * n_cand + i] = mass[(size_t)j * U + u];
        i++;
    }
    s->it[s->n++] = it;
    return 0;
}

/* Each head's logits over the item's candidates (z: [g][n_cand]), the scratch qv [3 hd]. */
static void item_logits(const struct kvp_pgate *gt, const struct kvp_pgate_set *s,
                        const struct kvp_pgate_item *it, float *qv, float *z)
{
    const int hd = s->hd;
    for (int j = 0; j < s->g; j++) {
        kvp_pgate_query(gt, it->l, it->kvh, it->qbar + (size_t)j * hd, qv);
        for (int i = 0; i < it->n_cand; i++) {
            const float *st = it->st + (size_t)i * 3 * hd;
            float v = 0;
            for (int d = 0; d < 3 * hd; d++)
                v += qv[d] * st[d];
            z[(size_t)j * it->n_cand + i] =
                v + kvp_pgate_prior(gt, it->l, it->kvh, it->d[i]) + it->lncnt[i];
        }
    }
}

/* Softmax of a row in place. */
static void softmax(float *z, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = z[i] > mx ? z[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += (z[i] = expf(z[i] - mx));
    for (int i = 0; i < n; i++)
        z[i] = (float)(z[i] / sum);
}

static size_t max_cand(const struct kvp_pgate_set *s)
{
    size_t m = 1;
    for (size_t k = 0; k < s->n; k++)
        m = (size_t)s->it[k].n_cand > m ? (size_t)s->it[k].n_cand : m;
    return m;
}

static _Thread_local const float *rank_imp;

static int by_imp(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    if (rank_imp[x] != rank_imp[y])
        return rank_imp[x] > rank_imp[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

void kvp_pgate_recovery(const struct kvp_pgate *g, const struct kvp_pgate_set *s, double *rec)
{
    const size_t mc = max_cand(s);
    float *z = malloc((size_t)s->g * mc * sizeof(float)), *imp = malloc(mc * sizeof(float));
    float *qv = malloc((size_t)3 * s->hd * sizeof(float));
    int *order = malloc(mc * sizeof(int));
    double *sum = calloc((size_t)g->n_layer, sizeof(double));
    double *cnt = calloc((size_t)g->n_layer, sizeof(double));
    for (int l = 0; l < g->n_layer; l++)
        rec[l] = -1;
    if (!z || !imp || !qv || !order || !sum || !cnt)
        goto out;
    for (size_t k = 0; k < s->n; k++) {
        const struct kvp_pgate_item *it = &s->it[k];
        const int n = it->n_cand;
        item_logits(g, s, it, qv, z);
        for (int i = 0; i < n; i++) {
            imp[i] = 0;
            order[i] = i;
        }
        /* the group reads one set: a block counts as much as the head that wants it most */
        for (int j = 0; j < s->g; j++) {
            softmax(z + (size_t)j * n, n);
            for (int i = 0; i < n; i++)
                imp[i] = z[(size_t)j * n + i] > imp[i] ? z[(size_t)j * n + i] : imp[i];
        }
        rank_imp = imp;
        qsort(order, (size_t)n, sizeof(int), by_imp);
        for (int j = 0; j < s->g; j++) {
            const float *t = it->target + (size_t)j * n;
            double cand = 0, picked = 0;
            for (int i = 0; i < n; i++)
                cand += t[i];
            for (int i = 0; i < it->n_pick; i++)
                picked += t[order[i]];
            sum[it->l] += 1 - cand + picked;
            cnt[it->l] += 1;
        }
    }
    for (int l = 0; l < g->n_layer; l++)
        rec[l] = cnt[l] > 0 ? sum[l] / cnt[l] : -1;
out:
    free(z);
    free(imp);
    free(qv);
    free(order);
    free(sum);
    free(cnt);
}

/* The loss and gradient of one (layer, KV head) over its items: for each item and head the
 * cross-entropy of the softmax over the candidates against the target renormalised over them,
 * weighted by the target's share on the candidates (an item whose candidates hold little of the
 * attention matters little to the recovery). */
static double loss_grad(const struct kvp_pgate *gt, const struct kvp_pgate_set *s, int l, int kvh,
                        float *z, float *qv, double *grad, double *wsum)
{
    const int hd = s->hd, nw = gt->nw;
    double loss = 0;
    *wsum = 0;
    memset(grad, 0, (size_t)nw * sizeof(double));
    for (size_t k = 0; k < s->n; k++) {
        const struct kvp_pgate_item *it = &s->it[k];
        if (it->l != l || it->kvh != kvh)
            continue;
        const int n = it->n_cand;
        item_logits(gt, s, it, qv, z);
        for (int j = 0; j < s->g; j++) {
            float *p = z + (size_t)j * n;
            const float *t = it->target + (size_t)j * n;
            const float *q = it->qbar + (size_t)j * hd;
            double W = 0;
            for (int i = 0; i < n; i++)
                W += t[i];
            if (!(W > 1e-9))
                continue;
            softmax(p, n);
            for (int i = 0; i < n; i++) {
                const double ti = t[i] / W, r = W * (p[i] - ti);
                loss -= t[i] * log(p[i] > 1e-30f ? p[i] : 1e-30f);
                const float *st = it->st + (size_t)i * 3 * hd;
                for (int d = 0; d < hd; d++) {
                    grad[d] += r * q[d] * st[d];
                    grad[hd + d] += q[d] > 0 ? r * q[d] * st[hd + d] : 0;
                    grad[2 * hd + d] += q[d] < 0 ? r * q[d] * st[2 * hd + d] : 0;
                }
                float f[KVP_PGATE_NPOS];
                pos_features(it->d[i], f);
                for (int e = 0; e < KVP_PGATE_NPOS; e++)
                    grad[3 * hd + e] += r * f[e];
            }
            *wsum += W;
        }
    }
    return loss;
}

int kvp_pgate_fit(struct kvp_pgate *g, const struct kvp_pgate_set *train,
                  const struct kvp_pgate_fit_opts *o, double *loss_out, struct kvp_err *err)
{
    const int iters = o && o->iters > 0 ? o->iters : 300;
    const float lr = o && o->lr > 0 ? o->lr : 0.01f, l2 = o && o->l2 >= 0 ? o->l2 : 1e-3f;
    const int nw = g->nw, hd = g->hd;
    const size_t mc = max_cand(train);
    float *z = malloc((size_t)train->g * mc * sizeof(float));
    float *qv = malloc((size_t)3 * hd * sizeof(float));
    double *grad = malloc((size_t)nw * sizeof(double)), *m1 = malloc((size_t)nw * sizeof(double));
    double *m2 = malloc((size_t)nw * sizeof(double));
    float *w0 = malloc((size_t)nw * sizeof(float));
    if (!z || !qv || !grad || !m1 || !m2 || !w0) {
        free(z), free(qv), free(grad), free(m1), free(m2), free(w0);
        return kvp_err_set(err, KVP_ENOMEM, "prefill gate: out of memory");
    }
    const float a0 = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < nw; i++) /* pooled's weights: what the regulariser pulls toward */
        w0[i] = i < hd ? a0 : 0;
    double total = 0, total_w = 0;
    for (int l = 0; l < g->n_layer; l++)
        for (int kvh = 0; kvh < g->n_kv; kvh++) {
            float *w = kvp_pgate_w(g, l, kvh);
            memset(m1, 0, (size_t)nw * sizeof(double));
            memset(m2, 0, (size_t)nw * sizeof(double));
            double loss = 0, wsum = 0;
            for (int it = 1; it <= iters; it++) {
                loss = loss_grad(g, train, l, kvh, z, qv, grad, &wsum);
                if (!(wsum > 0))
                    break;
                /* Adam on the weighted mean loss plus l2 · |w - w0|² / 2 */
                for (int i = 0; i < nw; i++) {
                    const double gi = grad[i] / wsum + l2 * (w[i] - w0[i]);
                    m1[i] = 0.9 * m1[i] + 0.1 * gi;
                    m2[i] = 0.999 * m2[i] + 0.001 * gi * gi;
                    const double mh = m1[i] / (1 - pow(0.9, it)), vh = m2[i] / (1 - pow(0.999, it));
                    w[i] -= (float)(lr * mh / (sqrt(vh) + 1e-8));
                }
            }
            total += loss;
            total_w += wsum;
        }
    if (loss_out)
        *loss_out = total_w > 0 ? total / total_w : 0;
    free(z), free(qv), free(grad), free(m1), free(m2), free(w0);
    return 0;
}
