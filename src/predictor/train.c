/*
 * Training the predictor CNN (see train.h). Every layer has a forward and a hand-written backward
 * pass; the convolutions go through im2col and sgemm, which makes a 64 × 32 sample cost about a
 * millisecond forward and backward on one core. Sampling, initialisation and the split are driven
 * by one seeded generator, so a run is reproducible for a given trace, seed and thread count
 * (OpenBLAS is kept single-threaded by the caller).
 */
#include "predictor/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "core/rng.h"
#include "kernels/topk.h"

/* ---- layers -------------------------------------------------------------------------------- */

static void im2col(const float *in, int c, int H, int W, int k, float *col)
{
    const int p = k / 2;
    const size_t HW = (size_t)H * W;
    for (int ci = 0; ci < c; ci++)
        for (int dy = 0; dy < k; dy++)
            for (int dx = 0; dx < k; dx++) {
                float *dst = col + (size_t)((ci * k + dy) * k + dx) * HW;
                for (int r = 0; r < H; r++) {
                    int rr = r + dy - p;
                    float *d = dst + (size_t)r * W;
                    if (rr < 0 || rr >= H) {
                        memset(d, 0, (size_t)W * sizeof(float));
                        continue;
                    }
                    const float *s = in + ((size_t)ci * H + rr) * W;
                    for (int x = 0; x < W; x++) {
                        int xx = x + dx - p;
                        d[x] = (xx >= 0 && xx < W) ? s[xx] : 0.0f;
                    }
                }
            }
}

static void col2im(const float *col, int c, int H, int W, int k, float *out)
{
    const int p = k / 2;
    const size_t HW = (size_t)H * W;
    memset(out, 0, (size_t)c * HW * sizeof(float));
    for (int ci = 0; ci < c; ci++)
        for (int dy = 0; dy < k; dy++)
            for (int dx = 0; dx < k; dx++) {
                const float *src = col + (size_t)((ci * k + dy) * k + dx) * HW;
                for (int r = 0; r < H; r++) {
                    int rr = r + dy - p;
                    if (rr < 0 || rr >= H)
                        continue;
                    float *o = out + ((size_t)ci * H + rr) * W;
                    const float *s = src + (size_t)r * W;
                    for (int x = 0; x < W; x++) {
                        int xx = x + dx - p;
                        if (xx >= 0 && xx < W)
                            o[xx] += s[x];
                    }
                }
            }
}

void kvp_tr_conv_fwd(const float *in, int ci, int H, int W, const float *w, const float *b, int co,
                     int k, float *col, float *out)
{
    const int HW = H * W, K = ci * k * k;
    im2col(in, ci, H, W, k, col);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, co, HW, K, 1.0f, w, K, col, HW, 0.0f,
                out, HW);
    for (int o = 0; o < co; o++) {
        float *r = out + (size_t)o * HW;
        for (int i = 0; i < HW; i++)
            r[i] += b[o];
    }
}

void kvp_tr_conv_bwd(const float *col, const float *dout, int ci, int H, int W, const float *w,
                     int co, int k, float *gw, float *gb, float *dcol, float *din)
{
    const int HW = H * W, K = ci * k * k;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, co, K, HW, 1.0f, dout, HW, col, HW, 1.0f,
                gw, K);
    for (int o = 0; o < co; o++) {
        const float *r = dout + (size_t)o * HW;
        double s = 0;
        for (int i = 0; i < HW; i++)
            s += r[i];
        gb[o] += (float)s;
    }
    if (!din)
        return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, HW, co, 1.0f, w, K, dout, HW, 0.0f,
                dcol, HW);
    col2im(dcol, ci, H, W, k, din);
}

void kvp_tr_relu_fwd(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void kvp_tr_relu_bwd(const float *y, float *dy, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(y[i] > 0.0f))
            dy[i] = 0.0f;
}

void kvp_tr_mean_fwd(const float *a, int c, int H, int W, float *p)
{
    for (int ch = 0; ch < c; ch++) {
        float *o = p + (size_t)ch * W;
        memset(o, 0, (size_t)W * sizeof(float));
        for (int r = 0; r < H; r++) {
            const float *row = a + ((size_t)ch * H + r) * W;
            for (int x = 0; x < W; x++)
                o[x] += row[x];
        }
        for (int x = 0; x < W; x++)
            o[x] /= (float)H;
    }
}

void kvp_tr_mean_bwd(const float *dp, int c, int H, int W, float *da)
{
    for (int ch = 0; ch < c; ch++)
        for (int r = 0; r < H; r++) {
            float *row = da + ((size_t)ch * H + r) * W;
            for (int x = 0; x < W; x++)
                row[x] = dp[(size_t)ch * W + x] / (float)H;
        }
}

void kvp_tr_point_fwd(const float *p, int c, int W, const float *w, float b, float *y)
{
    for (int x = 0; x < W; x++)
        y[x] = b;
    for (int ch = 0; ch < c; ch++)
        for (int x = 0; x < W; x++)
            y[x] += w[ch] * p[(size_t)ch * W + x];
}

void kvp_tr_point_bwd(const float *p, const float *dy, int c, int W, const float *w, float *gw,
                      float *gb, float *dp)
{
    for (int x = 0; x < W; x++)
        *gb += dy[x];
    for (int ch = 0; ch < c; ch++) {
        float g = 0;
        for (int x = 0; x < W; x++) {
            g += dy[x] * p[(size_t)ch * W + x];
            dp[(size_t)ch * W + x] = w[ch] * dy[x];
        }
        gw[ch] += g;
    }
}

float kvp_tr_loss(int loss, const float *y, const float *m, const float *s, int W, float *dy)
{
    if (loss == KVP_LOSS_MSE) {
        double l = 0;
        for (int x = 0; x < W; x++) {
            float d = y[x] - m[x];
            l += (double)d * d;
            dy[x] = 2.0f * d / (float)W;
        }
        return (float)(l / W);
    }
    double tot = 0;
    for (int x = 0; x < W; x++)
        tot += s[x];
    if (!(tot > 0)) {
        memset(dy, 0, (size_t)W * sizeof(float));
        return 0.0f;
    }
    float mx = y[0];
    for (int x = 1; x < W; x++)
        mx = y[x] > mx ? y[x] : mx;
    double z = 0;
    for (int x = 0; x < W; x++)
        z += exp((double)(y[x] - mx));
    double lz = log(z) + mx, l = 0;
    for (int x = 0; x < W; x++) {
        double px = s[x] / tot;
        l -= px * ((double)y[x] - lz);
        dy[x] = (float)(exp((double)y[x] - lz) - px);
    }
    return (float)l;
}

/* ---- one sample ---------------------------------------------------------------------------- */

int kvp_tr_ws_init(struct kvp_tr_ws *ws, const struct kvp_cnn *n, int H, int max_w,
                   struct kvp_err *err)
{
    memset(ws, 0, sizeof(*ws));
    ws->H = H;
    ws->max_w = max_w;
    size_t HW = (size_t)H * max_w, kk = (size_t)n->k * n->k;
    ws->col1 = malloc(n->cin * kk * HW * sizeof(float));
    ws->a1 = malloc((size_t)n->c1 * HW * sizeof(float));
    ws->col2 = malloc(n->c1 * kk * HW * sizeof(float));
    ws->a2 = malloc((size_t)n->c2 * HW * sizeof(float));
    ws->p = malloc((size_t)n->c2 * max_w * sizeof(float));
    ws->y = malloc((size_t)max_w * sizeof(float));
    ws->dy = malloc((size_t)max_w * sizeof(float));
    ws->dp = malloc((size_t)n->c2 * max_w * sizeof(float));
    ws->da2 = malloc((size_t)n->c2 * HW * sizeof(float));
    ws->dcol2 = malloc(n->c1 * kk * HW * sizeof(float));
    ws->da1 = malloc((size_t)n->c1 * HW * sizeof(float));
    if (!ws->col1 || !ws->a1 || !ws->col2 || !ws->a2 || !ws->p || !ws->y || !ws->dy || !ws->dp ||
        !ws->da2 || !ws->dcol2 || !ws->da1) {
        kvp_tr_ws_free(ws);
        return kvp_err_set(err, KVP_ENOMEM, "train: out of memory");
    }
    return 0;
}

void kvp_tr_ws_free(struct kvp_tr_ws *ws)
{
    if (!ws)
        return;
    float *b[] = {ws->col1, ws->a1, ws->col2, ws->a2,    ws->p,  ws->y,
                  ws->dy,   ws->dp, ws->da2,  ws->dcol2, ws->da1};
    for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++)
        free(b[i]);
    memset(ws, 0, sizeof(*ws));
}

float kvp_tr_sample(const struct kvp_cnn *n, struct kvp_tr_ws *ws, const float *x, int H, int W,
                    const float *m, const float *s, int loss, float *grad)
{
    const int c1 = n->c1, c2 = n->c2, k = n->k;
    const size_t HW = (size_t)H * W;
    kvp_tr_conv_fwd(x, n->cin, H, W, n->w1, n->b1, c1, k, ws->col1, ws->a1);
    kvp_tr_relu_fwd(ws->a1, c1 * HW);
    kvp_tr_conv_fwd(ws->a1, c1, H, W, n->w2, n->b2, c2, k, ws->col2, ws->a2);
    kvp_tr_relu_fwd(ws->a2, c2 * HW);
    kvp_tr_mean_fwd(ws->a2, c2, H, W, ws->p);
    kvp_tr_point_fwd(ws->p, c2, W, n->w3, n->b3[0], ws->y);
    float l = kvp_tr_loss(loss, ws->y, m, s, W, ws->dy);
    if (!grad)
        return l;
    float *gw1 = grad, *gb1 = gw1 + (size_t)c1 * n->cin * k * k, *gw2 = gb1 + c1;
    float *gb2 = gw2 + (size_t)c2 * c1 * k * k, *gw3 = gb2 + c2, *gb3 = gw3 + c2;
    kvp_tr_point_bwd(ws->p, ws->dy, c2, W, n->w3, gw3, gb3, ws->dp);
    kvp_tr_mean_bwd(ws->dp, c2, H, W, ws->da2);
    kvp_tr_relu_bwd(ws->a2, ws->da2, c2 * HW);
    kvp_tr_conv_bwd(ws->col2, ws->da2, c1, H, W, n->w2, c2, k, gw2, gb2, ws->dcol2, ws->da1);
    kvp_tr_relu_bwd(ws->a1, ws->da1, c1 * HW);
    kvp_tr_conv_bwd(ws->col1, ws->da1, n->cin, H, W, n->w1, c1, k, gw1, gb1, NULL, NULL);
    return l;
}

/* ---- samples from a trace ------------------------------------------------------------------ */

static float uniform(uint64_t *s)
{
    return (float)((kvp_splitmix64(s) >> 40) * (1.0 / 16777216.0));
}

void kvp_predtrain_opts_default(struct kvp_predtrain_opts *o)
{
    if (!o->c1)
        o->c1 = 16;
    if (!o->c2)
        o->c2 = 32;
    if (!o->k)
        o->k = 3;
    if (!o->H)
        o->H = 64;
    if (!o->cin)
        o->cin = 1;
    if (!o->epochs)
        o->epochs = 4;
    if (!o->extra)
        o->extra = 16;
    if (!(o->tail_frac > 0))
        o->tail_frac = 0.5f;
    if (!o->batch)
        o->batch = 32;
    if (!o->samples)
        o->samples = 20000;
    if (!o->val_samples)
        o->val_samples = 4000;
    if (!(o->lr > 0))
        o->lr = 1e-3f;
    if (!(o->val_frac > 0))
        o->val_frac = 0.1f;
    if (!o->seed)
        o->seed = 1;
    if (!o->sink)
        o->sink = 16;
    if (!o->local)
        o->local = 16;
    if (!o->n_budgets) {
        o->n_budgets = 3;
        o->budgets[0] = 32;
        o->budgets[1] = 64;
        o->budgets[2] = 128;
    }
}

/* One sample: history rows t-H .. t-1 of series ser (a (layer, query head), or a (layer, KV head)
 * with o->group) over the CNN slice the policy would use at Lk = t + 1 keys, and the target row
 * t; with o->cin = 2 the query channel (target step's bounds as features) in the newest row. */
struct sample {
    int W;
    float forced; /* attention mass on the sink and local tokens (always kept) */
    int local_n;  /* tokens in the local window */
};

/* Scratch of build_sample: [max_w] floats and ints. */
struct sample_tmp {
    float *f;
    int *top, *heap;
};

static int n_series(const struct kvp_trace *tr, const struct kvp_predtrain_opts *o)
{
    return tr->n_layers * (o->group ? tr->n_head_kv : tr->n_head);
}

static int build_sample(const struct kvp_trace *tr, const struct kvp_predtrain_opts *o, int s, int t,
                        int ser, float *x, float *m, float *sm, struct sample *out, uint64_t *rng,
                        struct sample_tmp *tmp)
{
    const int bs = tr->block_size, Lk = t + 1, H = o->H;
    if (t < H)
        return 0;
    int ls = bs * ((Lk - o->local) / bs);
    int c0 = o->sink / bs, c1 = ls / bs;
    int W = c1 - c0;
    if (W < 3)
        return 0;
    const int gh = o->group ? tr->n_head / tr->n_head_kv : 1;
    const int per_layer = o->group ? tr->n_head_kv : tr->n_head;
    const int li = ser / per_layer, h0 = (ser % per_layer) * gh;
    int K = W;
    if (o->sparse) {
        float u = uniform(rng);
        K = (int)lroundf((float)W * (0.05f + 0.15f * u));
        K = K < 1 ? 1 : K > W ? W : K;
    }
    for (int i = 0; i < H; i++) {
        int tp = t - H + i, nb = (tp + bs) / bs;
        float *xr = x + (size_t)i * W;
        float *mass = tmp->f;
        double tot = 0;
        for (int xx = 0; xx < W; xx++)
            xr[xx] = mass[xx] = 0.0f;
        for (int j = 0; j < gh; j++) {
            const float *row = kvp_trace_row(tr, s, tp, li, h0 + j);
            for (int xx = 0; xx < W && c0 + xx < nb; xx++) {
                xr[xx] = j == 0 || row[c0 + xx] > xr[xx] ? row[c0 + xx] : xr[xx];
                mass[xx] += row[nb + c0 + xx] / (float)gh;
            }
            for (int c = 0; c < nb; c++)
                tot += row[nb + c] / gh;
        }
        if (K >= W)
            continue;
        /* what a policy that read the K best blocks (and the sink and local window) has in its
         * history: zero elsewhere, the kept blocks renormalised over the mass read */
        kvp_topk_indices(mass, W, K, tmp->top, tmp->heap);
        double kept = tot;
        for (int xx = 0, q = 0; xx < W; xx++) {
            if (q < K && tmp->top[q] == xx) {
                q++;
                continue;
            }
            kept -= mass[xx];
            xr[xx] = -1.0f; /* dropped */
        }
        float scale = kept > 1e-12 ? (float)(1.0 / kept) : 1.0f;
        for (int xx = 0; xx < W; xx++)
            xr[xx] = xr[xx] < 0.0f ? 0.0f : xr[xx] * scale;
    }
    int nb = (t + bs) / bs;
    double tot = 0, in = 0;
    for (int xx = 0; xx < W; xx++)
        m[xx] = sm[xx] = 0.0f;
    for (int j = 0; j < gh; j++) {
        const float *row = kvp_trace_row(tr, s, t, li, h0 + j);
        for (int c = 0; c < nb; c++)
            tot += row[nb + c] / gh;
        for (int xx = 0; xx < W; xx++) {
            m[xx] = j == 0 || row[c0 + xx] > m[xx] ? row[c0 + xx] : m[xx];
            sm[xx] += row[nb + c0 + xx] / (float)gh;
        }
    }
    for (int xx = 0; xx < W; xx++)
        in += sm[xx];
    if (o->cin > 1) {
        float *q = x + (size_t)H * W;
        memset(q, 0, (size_t)(H - 1) * W * sizeof(float));
        q += (size_t)(H - 1) * W;
        for (int j = 0; j < gh; j++) {
            const float *row = kvp_trace_row(tr, s, t, li, h0 + j);
            kvp_qfeat_row(row + 2 * nb + c0, W, tmp->f);
            for (int xx = 0; xx < W; xx++)
                q[xx] = j == 0 || tmp->f[xx] > q[xx] ? tmp->f[xx] : q[xx];
        }
    }
    out->W = W;
    out->forced = (float)(tot - in);
    out->local_n = Lk - ls;
    return 1;
}

struct split {
    int *seq, *t; /* [n] (sequence, position) pairs with a valid slice */
    long n;
};

static int make_split(const struct kvp_trace *tr, const struct kvp_predtrain_opts *o, int s0, int s1,
                      struct split *sp)
{
    long cnt = 0;
    for (int s = s0; s < s1; s++)
        cnt += tr->seq[s].T > o->H ? tr->seq[s].T - o->H : 0;
    sp->n = 0;
    sp->seq = malloc((size_t)(cnt ? cnt : 1) * sizeof(int));
    sp->t = malloc((size_t)(cnt ? cnt : 1) * sizeof(int));
    if (!sp->seq || !sp->t)
        return -1;
    const int bs = tr->block_size;
    for (int s = s0; s < s1; s++)
        for (int t = o->H; t < tr->seq[s].T; t++) {
            int ls = bs * ((t + 1 - o->local) / bs);
            if (ls / bs - o->sink / bs < 3)
                continue;
            sp->seq[sp->n] = s;
            sp->t[sp->n] = t;
            sp->n++;
        }
    return 0;
}

static void split_free(struct split *sp)
{
    free(sp->seq);
    free(sp->t);
}

static int tmp_init(struct sample_tmp *t, int max_w)
{
    t->f = malloc((size_t)max_w * sizeof(float));
    t->top = malloc((size_t)max_w * sizeof(int));
    t->heap = malloc((size_t)max_w * sizeof(int));
    return t->f && t->top && t->heap ? 0 : -1;
}

static void tmp_free(struct sample_tmp *t)
{
    free(t->f);
    free(t->top);
    free(t->heap);
}

/* Indices of the k largest of y[0..W) (ties to the lower index) summed over w. */
static double topk_mass(const float *y, const float *w, int W, int k, char *taken)
{
    memset(taken, 0, (size_t)W);
    double r = 0;
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int x = 0; x < W; x++)
            if (!taken[x] && (best < 0 || y[x] > y[best]))
                best = x;
        taken[best] = 1;
        r += w[best];
    }
    return r;
}

static int max_blocks(const struct kvp_trace *tr)
{
    int T = 1;
    for (int s = 0; s < tr->n_seq; s++)
        T = tr->seq[s].T > T ? tr->seq[s].T : T;
    return (T + tr->block_size - 1) / tr->block_size;
}

/* A step of one of sequence sq's last `tail` positions (a retrieval trace's answer), or -1. */
static int tail_position(const struct kvp_trace *tr, const struct kvp_predtrain_opts *o, int sq,
                         uint64_t *rng)
{
    int T = tr->seq[sq].T;
    int span = T - o->H < o->tail ? T - o->H : o->tail;
    return span > 0 ? T - 1 - (int)(kvp_splitmix64(rng) % (uint64_t)span) : -1;
}

/* Recovery sums of one validation set (the report's arrays, or its tail set). */
struct rec_acc {
    double *pred, *oracle, *last, *recent, *query, *pruned;
};

/* Score the validated sample in x/sm (ws->y holds the network's scores) at every budget. The
 * pruned selection is the policy's: the network's best kb among the kb + o->extra blocks with the
 * best query feature. */
static void score_sample(const struct kvp_predtrain_opts *o, int bs, const struct sample *smp,
                         const float *x, const float *sm, struct kvp_tr_ws *ws, char *taken,
                         float *cand, const struct rec_acc *a)
{
    const int W = smp->W;
    const float *last = x + (size_t)(o->H - 1) * W;
    const float *qrow = o->cin > 1 ? x + (size_t)(2 * o->H - 1) * W : NULL;
    for (int b = 0; b < o->n_budgets; b++) {
        int kb = (o->budgets[b] - o->sink - smp->local_n) / bs;
        if (kb < 0)
            kb = 0;
        double rp, ro, rl, rr, rq = 0, rc;
        if (kb >= W) {
            rp = smp->forced;
            for (int xx = 0; xx < W; xx++)
                rp += sm[xx];
            ro = rl = rr = rq = rc = rp;
        } else {
            rp = smp->forced + topk_mass(ws->y, sm, W, kb, taken);
            ro = smp->forced + topk_mass(sm, sm, W, kb, taken);
            rl = smp->forced + topk_mass(last, sm, W, kb, taken);
            for (int xx = 0; xx < W; xx++)
                ws->dp[xx] = (float)xx; /* recency: the newest blocks first */
            rr = smp->forced + topk_mass(ws->dp, sm, W, kb, taken);
            rc = rp;
            if (qrow) { /* Quest's ranking: the query channel alone */
                rq = smp->forced + topk_mass(qrow, sm, W, kb, taken);
                int nc = kb + o->extra;
                if (nc < W) {
                    topk_mass(qrow, sm, W, nc, taken); /* marks the candidates */
                    for (int xx = 0; xx < W; xx++)
                        cand[xx] = taken[xx] ? ws->y[xx] : -INFINITY;
                    rc = smp->forced + topk_mass(cand, sm, W, kb, taken);
                }
            }
        }
        a->pred[b] += rp;
        a->oracle[b] += ro;
        a->last[b] += rl;
        a->recent[b] += rr;
        a->query[b] += rq;
        a->pruned[b] += rc;
    }
}

static void rec_mean(const struct rec_acc *a, int n_budgets, long cnt, double *rel)
{
    for (int b = 0; b < n_budgets; b++) {
        if (cnt) {
            a->pred[b] /= cnt;
            a->oracle[b] /= cnt;
            a->last[b] /= cnt;
            a->recent[b] /= cnt;
            a->query[b] /= cnt;
            a->pruned[b] /= cnt;
        }
        rel[b] = a->oracle[b] > 0 ? a->pred[b] / a->oracle[b] : 1.0;
    }
}

static int validate(const struct kvp_trace *tr, const struct kvp_cnn *n,
                    const struct kvp_predtrain_opts *o, const struct split *val, struct kvp_tr_ws *ws,
                    float *x, float *m, float *sm, struct kvp_predtrain_report *rep)
{
    const int n_ser = n_series(tr, o), bs = tr->block_size;
    uint64_t rng = o->seed ^ 0x5eed5eed5eedULL;
    char *taken = malloc((size_t)ws->max_w);
    float *cand = malloc((size_t)ws->max_w * sizeof(float));
    struct sample_tmp tmp = {0};
    if (!taken || !cand || tmp_init(&tmp, ws->max_w) < 0) {
        free(taken);
        free(cand);
        tmp_free(&tmp);
        return -1;
    }
    const struct rec_acc all = {rep->rec_pred, rep->rec_oracle, rep->rec_last, rep->rec_recent,
                                rep->rec_query, rep->rec_pruned};
    const struct rec_acc tail = {rep->tail.rec_pred, rep->tail.rec_oracle, rep->tail.rec_last,
                                 rep->tail.rec_recent, rep->tail.rec_query, rep->tail.rec_pruned};
    double loss = 0;
    long cnt = 0, cnt_tail = 0;
    rep->n_budgets = o->n_budgets;
    for (int b = 0; b < o->n_budgets; b++) {
        rep->budgets[b] = o->budgets[b];
        rep->rec_pred[b] = rep->rec_oracle[b] = rep->rec_last[b] = rep->rec_recent[b] = 0;
        rep->rec_query[b] = rep->rec_pruned[b] = 0;
        rep->tail.rec_pred[b] = rep->tail.rec_oracle[b] = rep->tail.rec_last[b] = 0;
        rep->tail.rec_recent[b] = rep->tail.rec_query[b] = rep->tail.rec_pruned[b] = 0;
    }
    long draws = val->n ? o->val_samples : 0;
    for (long i = 0; i < draws; i++) {
        long pick = (long)(kvp_splitmix64(&rng) % ((uint64_t)val->n * n_ser));
        long pair = pick / n_ser;
        int ser = (int)(pick % n_ser);
        struct sample smp;
        if (!build_sample(tr, o, val->seq[pair], val->t[pair], ser, x, m, sm, &smp, &rng, &tmp))
            continue;
        loss += kvp_tr_sample(n, ws, x, o->H, smp.W, m, sm, o->loss, NULL);
        cnt++;
        score_sample(o, bs, &smp, x, sm, ws, taken, cand, &all);
        if (o->tail <= 0)
            continue;
        /* the same series at an answer step of the sequence, its history dense (as training's) */
        struct kvp_predtrain_opts od = *o;
        od.sparse = 0;
        int sq = val->seq[pair], t = tail_position(tr, o, sq, &rng);
        if (t < 0 || !build_sample(tr, &od, sq, t, ser, x, m, sm, &smp, &rng, &tmp))
            continue;
        kvp_tr_sample(n, ws, x, o->H, smp.W, m, sm, o->loss, NULL);
        cnt_tail++;
        score_sample(o, bs, &smp, x, sm, ws, taken, cand, &tail);
    }
    free(taken);
    free(cand);
    tmp_free(&tmp);
    rep->val_loss = cnt ? loss / cnt : 0;
    rep->tail.n = cnt_tail;
    rec_mean(&all, o->n_budgets, cnt, rep->rel);
    rec_mean(&tail, o->n_budgets, cnt_tail, rep->tail.rel);
    return 0;
}

static int check_opts(const struct kvp_trace *tr, const struct kvp_predtrain_opts *o,
                      struct kvp_err *err)
{
    if (tr->n_seq < 2)
        return kvp_err_set(err, KVP_EINVAL,
                           "train: the trace needs at least 2 sequences "
                           "(one for validation)");
    if (o->sink < 0 || o->local < 1 || o->sink % tr->block_size)
        return kvp_err_set(err, KVP_EINVAL,
                           "train: sink %d must be a multiple of the block "
                           "size %d and local >= 1",
                           o->sink, tr->block_size);
    if (o->n_budgets < 0 || o->n_budgets > KVP_CNN_MAX_REC || o->batch < 1 || o->epochs < 0)
        return kvp_err_set(err, KVP_EINVAL, "train: bad options");
    if (o->cin > 1 && tr->n_arr < 3)
        return kvp_err_set(err, KVP_EINVAL,
                           "train: the query channel needs a version 2 trace (this one is "
                           "version %d: record it again with this build's `kvpred trace`)",
                           tr->version);
    return 0;
}

int kvp_predictor_validate(const struct kvp_trace *tr, const struct kvp_cnn *n,
                           const struct kvp_predtrain_opts *o, struct kvp_predtrain_report *rep,
                           struct kvp_err *err)
{
    int rc = check_opts(tr, o, err);
    if (rc < 0)
        return rc;
    if (n->block_size != tr->block_size)
        return kvp_err_set(err, KVP_EINVAL, "predictor block size %d, trace block size %d",
                           n->block_size, tr->block_size);
    struct kvp_predtrain_opts oo = *o;
    oo.H = n->H;
    oo.cin = n->cin;
    oo.group = (n->meta.flags & 1) != 0;
    if (oo.cin > 1 && tr->n_arr < 3)
        return kvp_err_set(err, KVP_EINVAL, "validate: the query channel needs a version 2 trace");
    int n_val_seq = (int)ceilf(oo.val_frac * tr->n_seq);
    n_val_seq = n_val_seq < 1 ? 1 : n_val_seq >= tr->n_seq ? tr->n_seq - 1 : n_val_seq;
    struct split val = {0};
    struct kvp_tr_ws ws = {0};
    int mw = max_blocks(tr);
    float *x = malloc((size_t)oo.cin * oo.H * mw * sizeof(float)), *m = malloc((size_t)mw * 4),
          *sm = malloc((size_t)mw * 4);
    rc = KVP_ENOMEM;
    if (x && m && sm && make_split(tr, &oo, tr->n_seq - n_val_seq, tr->n_seq, &val) == 0 &&
        kvp_tr_ws_init(&ws, n, oo.H, mw, err) == 0) {
        rep->n_val_samples = val.n * n_series(tr, &oo);
        rc = validate(tr, n, &oo, &val, &ws, x, m, sm, rep) < 0 ? KVP_ENOMEM : 0;
    }
    split_free(&val);
    kvp_tr_ws_free(&ws);
    free(x);
    free(m);
    free(sm);
    return rc < 0 ? kvp_err_set(err, rc, "validate: out of memory") : 0;
}

int kvp_predictor_train(const struct kvp_trace *tr, const struct kvp_predtrain_opts *o,
                        struct kvp_cnn *out, struct kvp_predtrain_report *rep, struct kvp_err *err)
{
    int rc = check_opts(tr, o, err);
    if (rc < 0)
        return rc;
    rc = kvp_cnn_init_ch(out, o->cin, o->c1, o->c2, o->k, o->H, tr->block_size, err);
    if (rc < 0)
        return rc;
    openblas_set_num_threads(1); /* the summation order, so the run, is the same on any machine */
    memset(rep, 0, sizeof(*rep));
    const int n_ser = n_series(tr, o);
    const size_t np = kvp_cnn_n_params(out);
    uint64_t rng = o->seed;
    /* He-uniform initialisation for the ReLU layers, fan-in scaled for conv3; zero biases */
    const int kk = o->k * o->k;
    float a1 = sqrtf(6.0f / (o->cin * kk)), a2 = sqrtf(6.0f / (o->c1 * kk)), a3 = sqrtf(3.0f / o->c2);
    for (int i = 0; i < o->c1 * o->cin * kk; i++)
        out->w1[i] = a1 * (2 * uniform(&rng) - 1);
    for (int i = 0; i < o->c2 * o->c1 * kk; i++)
        out->w2[i] = a2 * (2 * uniform(&rng) - 1);
    for (int i = 0; i < o->c2; i++)
        out->w3[i] = a3 * (2 * uniform(&rng) - 1);

    int n_val_seq = (int)ceilf(o->val_frac * tr->n_seq);
    n_val_seq = n_val_seq < 1 ? 1 : n_val_seq >= tr->n_seq ? tr->n_seq - 1 : n_val_seq;
    struct split trn = {0}, val = {0};
    struct kvp_tr_ws ws = {0};
    int mw = max_blocks(tr);
    float *grad = calloc(np, sizeof(float)), *am = calloc(np, sizeof(float)),
          *av = calloc(np, sizeof(float));
    float *x = malloc((size_t)o->cin * o->H * mw * sizeof(float)), *m = malloc((size_t)mw * 4),
          *sm = malloc((size_t)mw * 4);
    struct sample_tmp tmp = {0};
    if (!grad || !am || !av || !x || !m || !sm || tmp_init(&tmp, mw) < 0 ||
        make_split(tr, o, 0, tr->n_seq - n_val_seq, &trn) < 0 ||
        make_split(tr, o, tr->n_seq - n_val_seq, tr->n_seq, &val) < 0) {
        rc = kvp_err_set(err, KVP_ENOMEM, "train: out of memory");
        goto out;
    }
    if (trn.n == 0 || val.n == 0) {
        rc = kvp_err_set(err, KVP_EINVAL,
                         "train: no samples (sequences must be longer than "
                         "H = %d tokens plus the sink and local windows)",
                         o->H);
        goto out;
    }
    rc = kvp_tr_ws_init(&ws, out, o->H, mw, err);
    if (rc < 0)
        goto out;
    rep->n_train_samples = trn.n * n_ser;
    rep->n_val_samples = val.n * n_ser;

    const long steps_per_epoch = (o->samples + o->batch - 1) / o->batch;
    const long steps = steps_per_epoch * o->epochs;
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    long step = 0;
    for (int ep = 0; ep < o->epochs; ep++) {
        double ep_loss = 0;
        long ep_n = 0;
        for (long st = 0; st < steps_per_epoch; st++, step++) {
            memset(grad, 0, np * sizeof(float));
            double bl = 0;
            int got = 0;
            for (int b = 0; b < o->batch; b++) {
                long pick = (long)(kvp_splitmix64(&rng) % ((uint64_t)trn.n * n_ser));
                long pair = pick / n_ser;
                int ser = (int)(pick % n_ser);
                struct sample smp;
                int ok;
                if (o->tail > 0 && uniform(&rng) < o->tail_frac) {
                    /* a step of a sequence's last `tail` positions (a retrieval trace's answer),
                     * its history dense as a decode step's first rows are (the prompt's) */
                    struct kvp_predtrain_opts od = *o;
                    od.sparse = 0;
                    int sq = trn.seq[pair], t = tail_position(tr, o, sq, &rng);
                    ok = t >= 0 && build_sample(tr, &od, sq, t, ser, x, m, sm, &smp, &rng, &tmp);
                } else {
                    ok = build_sample(tr, o, trn.seq[pair], trn.t[pair], ser, x, m, sm, &smp, &rng,
                                      &tmp);
                }
                if (!ok)
                    continue;
                bl += kvp_tr_sample(out, &ws, x, o->H, smp.W, m, sm, o->loss, grad);
                got++;
            }
            if (!got)
                continue;
            /* Adam with bias correction; the rate decays linearly to a tenth */
            float lr = o->lr * (1.0f - 0.9f * (float)step / (float)(steps > 1 ? steps - 1 : 1));
            float c1 = 1.0f - powf(b1, (float)(step + 1)), c2 = 1.0f - powf(b2, (float)(step + 1));
            for (size_t i = 0; i < np; i++) {
                float g = grad[i] / (float)got;
                am[i] = b1 * am[i] + (1 - b1) * g;
                av[i] = b2 * av[i] + (1 - b2) * g * g;
                out->params[i] -= lr * (am[i] / c1) / (sqrtf(av[i] / c2) + eps);
            }
            ep_loss += bl;
            ep_n += got;
            if (o->progress)
                o->progress(o->user, ep, step + 1, steps, ep_n ? ep_loss / ep_n : 0);
        }
        rep->train_loss = ep_n ? ep_loss / ep_n : 0;
    }
    kvp_cnn_prepare(out);
    if (validate(tr, out, o, &val, &ws, x, m, sm, rep) < 0) {
        rc = kvp_err_set(err, KVP_ENOMEM, "train: out of memory");
        goto out;
    }
    struct kvp_cnn_meta *me = &out->meta;
    memcpy(me->model, tr->model, strnlen(tr->model, sizeof(me->model) - 1));
    me->n_train = (uint64_t)rep->n_train_samples;
    me->n_val = (uint64_t)rep->n_val_samples;
    me->seed = o->seed;
    me->loss = (uint32_t)o->loss;
    me->sink = (uint32_t)o->sink;
    me->local = (uint32_t)o->local;
    me->epochs = (uint32_t)o->epochs;
    me->flags = o->group ? 1u : 0u;
    me->n_rec = (uint32_t)o->n_budgets;
    for (int b = 0; b < o->n_budgets; b++) {
        me->rec_budget[b] = (uint32_t)o->budgets[b];
        me->rec_rel[b] = (float)rep->rel[b];
    }
    rc = 0;
out:
    if (rc < 0)
        kvp_cnn_free(out);
    split_free(&trn);
    split_free(&val);
    kvp_tr_ws_free(&ws);
    free(grad);
    free(am);
    free(av);
    free(x);
    free(m);
    free(sm);
    tmp_free(&tmp);
    return rc;
}
