/*
 * The AttentionPredictor CNN: weights, the predictor file, from-scratch and incremental inference
 * (see cnn.h for the architecture, the file layout and the incremental scheme).
 *
 * Conventions: a history slice is [n_rows][W] with row 0 the oldest, as upstream; columns are
 * local to the slice (column x = history column col0 + x). Padded buffers hold column x at index
 * x + p (p = k/2) with zeros around, so the kernels never branch on the edges. A conv2 output
 * value is a pure function of its 3×3 (k×k) neighbourhood computed in a fixed order, so the same
 * row computed by the from-scratch and the incremental path is bit-identical; only the running
 * column sums differ by rounding.
 */
#include "predictor/cnn.h"
#include "core/settings.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytebuf.h"
#include "core/cursor.h"
#include "core/fnv.h"
#include "core/platform.h"

/* ---- weights ------------------------------------------------------------------------------- */

static size_t n_params_of(int cin, int c1, int c2, int k)
{
    return (size_t)c1 * cin * k * k + c1 + (size_t)c2 * c1 * k * k + c2 + c2 + 1;
}

size_t kvp_cnn_n_params(const struct kvp_cnn *n)
{
    return n_params_of(n->cin, n->c1, n->c2, n->k);
}

static int round16(int x)
{
    return (x + 15) & ~15;
}

int kvp_cnn_init(struct kvp_cnn *n, int c1, int c2, int k, int H, int block_size,
                 struct kvp_err *err)
{
    return kvp_cnn_init_ch(n, 1, c1, c2, k, H, block_size, err);
}

int kvp_cnn_init_ch(struct kvp_cnn *n, int cin, int c1, int c2, int k, int H, int block_size,
                    struct kvp_err *err)
{
    memset(n, 0, sizeof(*n));
    if (cin < 1 || cin > KVP_CNN_MAX_CIN || c1 < 1 || c1 > KVP_CNN_MAX_CH || c2 < 1 ||
        c2 > KVP_CNN_MAX_CH || k < 1 || k > KVP_CNN_MAX_K || k % 2 == 0 || H < 1 ||
        H > KVP_CNN_MAX_H || block_size < 1 || block_size > 64)
        return kvp_err_set(err, KVP_EINVAL,
                           "predictor: implausible shape: %d channels, c1 %d, c2 %d, kernel %d, "
                           "H %d, block %d",
                           cin, c1, c2, k, H, block_size);
    size_t np = n_params_of(cin, c1, c2, k);
    size_t nw2 = (size_t)c2 * c1 * k * k;
    const int cp1 = round16(c1), cp2 = round16(c2);
    size_t nder = nw2 + (size_t)cin * k * k * cp1 + cp1 + (size_t)c1 * k * k * cp2 + cp2;
    n->params = calloc(np + nder, sizeof(float));
    if (!n->params)
        return kvp_err_set(err, KVP_ENOMEM, "predictor: out of memory");
    n->cin = cin;
    n->cp1 = cp1;
    n->cp2 = cp2;
    n->c1 = c1;
    n->c2 = c2;
    n->k = k;
    n->H = H;
    n->block_size = block_size;
    n->w1 = n->params;
    n->b1 = n->w1 + (size_t)c1 * cin * k * k;
    n->w2 = n->b1 + c1;
    n->b2 = n->w2 + nw2;
    n->w3 = n->b2 + c2;
    n->b3 = n->w3 + c2;
    n->w2t = n->b3 + 1;
    n->w1p = n->w2t + nw2;
    n->b1p = n->w1p + (size_t)cin * k * k * cp1;
    n->w2p = n->b1p + cp1;
    n->b2p = n->w2p + (size_t)c1 * k * k * cp2;
    return 0;
}

void kvp_cnn_free(struct kvp_cnn *n)
{
    if (!n)
        return;
    free(n->params);
    n->params = NULL;
}

void kvp_cnn_prepare(struct kvp_cnn *n)
{
    const int c1 = n->c1, c2 = n->c2, k = n->k;
    for (int co = 0; co < c2; co++)
        for (int ci = 0; ci < c1; ci++)
            for (int t = 0; t < k * k; t++)
                n->w2t[((size_t)ci * k * k + t) * c2 + co] =
                    n->w2[((size_t)co * c1 + ci) * k * k + t];
    /* the per-column kernels: [in][k][k][out], outputs padded with zero weights and biases */
    const int kk = k * k, cin = n->cin, cp1 = n->cp1, cp2 = n->cp2;
    memset(n->w1p, 0, ((size_t)cin * kk * cp1 + cp1 + (size_t)c1 * kk * cp2 + cp2) * 4);
    for (int co = 0; co < c1; co++) {
        n->b1p[co] = n->b1[co];
        for (int ci = 0; ci < cin; ci++)
            for (int t = 0; t < kk; t++)
                n->w1p[((size_t)ci * kk + t) * cp1 + co] = n->w1[((size_t)co * cin + ci) * kk + t];
    }
    for (int co = 0; co < c2; co++) {
        n->b2p[co] = n->b2[co];
        for (int ci = 0; ci < c1; ci++)
            for (int dy = 0; dy < k; dy++)
                for (int dx = 0; dx < k; dx++)
                    n->w2p[(((size_t)dx * k + dy) * c1 + ci) * cp2 + co] =
                        n->w2[((size_t)co * c1 + ci) * kk + dy * k + dx];
    }
}

/* ---- the predictor file -------------------------------------------------------------------- */

static const char file_magic[8] = {'K', 'V', 'P', 'C', 'N', 'N', '0', '1'};
#define FILE_VERSION 2u /* the newest this build reads and writes; 1 = one input channel */

int kvp_cnn_save(const struct kvp_cnn *n, const char *path, struct kvp_err *err)
{
    struct kvp_bytebuf b = {0};
    const struct kvp_cnn_meta *m = &n->meta;
    kvp_bytebuf_put(&b, file_magic, 8);
    kvp_bytebuf_u32(&b, n->cin == 1 ? 1u : FILE_VERSION);
    if (n->cin != 1)
        kvp_bytebuf_u32(&b, (uint32_t)n->cin);
    kvp_bytebuf_u32(&b, (uint32_t)n->c1);
    kvp_bytebuf_u32(&b, (uint32_t)n->c2);
    kvp_bytebuf_u32(&b, (uint32_t)n->k);
    kvp_bytebuf_u32(&b, (uint32_t)n->H);
    kvp_bytebuf_u32(&b, (uint32_t)n->block_size);
    kvp_bytebuf_u32(&b, m->loss);
    kvp_bytebuf_u32(&b, m->sink);
    kvp_bytebuf_u32(&b, m->local);
    kvp_bytebuf_u32(&b, m->flags);
    kvp_bytebuf_u32(&b, m->epochs);
    kvp_bytebuf_u64(&b, m->seed);
    kvp_bytebuf_u64(&b, m->n_train);
    kvp_bytebuf_u64(&b, m->n_val);
    char name[64] = {0};
    memcpy(name, m->model, strnlen(m->model, sizeof(name) - 1));
    kvp_bytebuf_put(&b, name, sizeof(name));
    uint32_t n_rec = m->n_rec > KVP_CNN_MAX_REC ? KVP_CNN_MAX_REC : m->n_rec;
    kvp_bytebuf_u32(&b, n_rec);
    for (uint32_t i = 0; i < n_rec; i++) {
        kvp_bytebuf_u32(&b, m->rec_budget[i]);
        kvp_bytebuf_put(&b, &m->rec_rel[i], 4);
    }
    size_t np = kvp_cnn_n_params(n);
    kvp_bytebuf_u32(&b, (uint32_t)np);
    kvp_bytebuf_put(&b, n->params, np * sizeof(float));
    return kvp_bytebuf_save(&b, path, err);
}

#define TRUNC(what) kvp_err_set(err, KVP_EFORMAT, "predictor file truncated (in the %s)", what)

int kvp_cnn_parse(const void *data, size_t size, struct kvp_cnn *n, struct kvp_err *err)
{
    struct kvp_cursor c;
    kvp_cursor_init(&c, data, size);
    const uint8_t *magic;
    memset(n, 0, sizeof(*n));
    if (kvp_rd_bytes(&c, 8, &magic) < 0)
        return TRUNC("magic");
    if (memcmp(magic, file_magic, 8) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "not a kvpred predictor file (bad magic)");
    uint32_t h[11], cin = 1;
    if (kvp_rd_u32(&c, &h[0]) < 0)
        return TRUNC("header");
    if (h[0] < 1 || h[0] > FILE_VERSION)
        return kvp_err_set(err, KVP_EFORMAT,
                           "predictor file version %u (this build reads 1 to %u)", h[0],
                           FILE_VERSION);
    if (h[0] >= 2 && kvp_rd_u32(&c, &cin) < 0)
        return TRUNC("header");
    if (cin < 1 || cin > KVP_CNN_MAX_CIN)
        return kvp_err_set(err, KVP_EFORMAT,
                           "predictor file: %u input channels (this build reads 1 to %d)", cin,
                           KVP_CNN_MAX_CIN);
    for (int i = 1; i < 11; i++)
        if (kvp_rd_u32(&c, &h[i]) < 0)
            return TRUNC("header");
    if (h[1] < 1 || h[1] > KVP_CNN_MAX_CH || h[2] < 1 || h[2] > KVP_CNN_MAX_CH || h[3] < 1 ||
        h[3] > KVP_CNN_MAX_K || h[3] % 2 == 0 || h[4] < 1 || h[4] > KVP_CNN_MAX_H || h[5] < 1 ||
        h[5] > 64 || h[6] > KVP_LOSS_CE)
        return kvp_err_set(err, KVP_EFORMAT,
                           "predictor file: implausible architecture (c1 %u, c2 %u, kernel %u, "
                           "H %u, block %u, loss %u)",
                           h[1], h[2], h[3], h[4], h[5], h[6]);
    struct kvp_cnn_meta m = {
        .loss = h[6], .sink = h[7], .local = h[8], .flags = h[9], .epochs = h[10]};
    const uint8_t *name;
    if (kvp_rd_u64(&c, &m.seed) < 0 || kvp_rd_u64(&c, &m.n_train) < 0 ||
        kvp_rd_u64(&c, &m.n_val) < 0 || kvp_rd_bytes(&c, 64, &name) < 0 ||
        kvp_rd_u32(&c, &m.n_rec) < 0)
        return TRUNC("training metadata");
    memcpy(m.model, name, 63);
    m.model[63] = 0;
    if (m.n_rec > KVP_CNN_MAX_REC)
        return kvp_err_set(err, KVP_EFORMAT, "predictor file: %u recovery entries (at most %d)",
                           m.n_rec, KVP_CNN_MAX_REC);
    for (uint32_t i = 0; i < m.n_rec; i++)
        if (kvp_rd_u32(&c, &m.rec_budget[i]) < 0 || kvp_rd_f32(&c, &m.rec_rel[i]) < 0)
            return TRUNC("training metadata");
    uint32_t np;
    if (kvp_rd_u32(&c, &np) < 0)
        return TRUNC("weights");
    size_t want = n_params_of((int)cin, (int)h[1], (int)h[2], (int)h[3]);
    if (np != want)
        return kvp_err_set(err, KVP_EFORMAT,
                           "predictor file: %u weights, the architecture needs %zu", np, want);
    const uint8_t *w;
    if (kvp_rd_bytes(&c, (size_t)np * 4, &w) < 0)
        return TRUNC("weights");
    size_t body = c.pos;
    uint64_t sum;
    if (kvp_rd_u64(&c, &sum) < 0)
        return TRUNC("checksum");
    if (kvp_cursor_left(&c) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "predictor file: %zu unexpected bytes at the end",
                           kvp_cursor_left(&c));
    if (sum != kvp_fnv64(KVP_FNV64_INIT, c.base, body))
        return kvp_err_set(err, KVP_EFORMAT, "predictor file corrupted (checksum mismatch)");
    int rc = kvp_cnn_init_ch(n, (int)cin, (int)h[1], (int)h[2], (int)h[3], (int)h[4], (int)h[5],
                             err);
    if (rc < 0)
        return rc;
    memcpy(n->params, w, (size_t)np * 4);
    for (uint32_t i = 0; i < np; i++)
        if (!isfinite(n->params[i])) {
            kvp_cnn_free(n);
            return kvp_err_set(err, KVP_EFORMAT, "predictor file: weight %u is not finite", i);
        }
    n->meta = m;
    kvp_cnn_prepare(n);
    return 0;
}

int kvp_cnn_load(const char *path, struct kvp_cnn *n, struct kvp_err *err)
{
    struct kvp_file_map fm;
    memset(n, 0, sizeof(*n));
    if (!path || !*path)
        return kvp_err_set(err, KVP_EINVAL, "predictor: no predictor file given");
    int rc = kvp_file_map(path, &fm, err);
    if (rc < 0)
        return kvp_err_prefix(err, "predictor file");
    rc = kvp_cnn_parse(fm.data, fm.size, n, err);
    kvp_file_unmap(&fm);
    if (rc < 0)
        return kvp_err_prefix(err, "%s", path);
    return 0;
}

/* ---- kernel choice ------------------------------------------------------------------------- */

static pthread_once_t kern_once = PTHREAD_ONCE_INIT;
static const struct kvp_cnn_kernels *kern_best;

static void kern_init(void)
{
#if defined(__x86_64__)
    int f = kvp_cpu_features();
    const char *want = kvp_setting(KVP_SETTING_SIMD);
    bool avx2 = (f & KVP_CPU_AVX2) != 0, avx512 = avx2 && (f & KVP_CPU_AVX512) != 0;
    if (want && !strcmp(want, "scalar"))
        kern_best = &kvp_cnn_kernels_scalar;
    else if (avx512 && !(want && !strcmp(want, "avx2")))
        kern_best = &kvp_cnn_kernels_avx512;
    else if (avx2)
        kern_best = &kvp_cnn_kernels_avx2;
    else
        kern_best = &kvp_cnn_kernels_scalar;
#else
    /* one table (cnn_scalar.c): elsewhere GCC lowers its 4-wide vectors to the base ISA's
     * (NEON on aarch64) */
    kern_best = &kvp_cnn_kernels_scalar;
#endif
}

const struct kvp_cnn_kernels *kvp_cnn_kernels(void)
{
    pthread_once(&kern_once, kern_init);
    return kern_best;
}

/* ---- scratch and state --------------------------------------------------------------------- */

int kvp_cnn_scratch_init(struct kvp_cnn_scratch *s, const struct kvp_cnn *n, int max_w,
                         struct kvp_err *err)
{
    memset(s, 0, sizeof(*s));
    if (max_w < 1)
        max_w = 1;
    s->max_w = max_w;
    s->stride = round16(max_w + n->k) + 16;
    size_t st = (size_t)s->stride;
    s->xin = kvp_alloc_aligned((size_t)n->k * st * sizeof(float));
    s->a1 = kvp_alloc_aligned((size_t)n->k * n->c1 * st * sizeof(float));
    s->a1_row = malloc((size_t)n->k * sizeof(int));
    s->z2 = kvp_alloc_aligned((size_t)n->c2 * st * sizeof(float));
    s->sums = kvp_alloc_aligned((size_t)n->c2 * st * sizeof(float));
    if (!s->xin || !s->a1 || !s->a1_row || !s->z2 || !s->sums) {
        kvp_cnn_scratch_free(s);
        return kvp_err_set(err, KVP_ENOMEM, "predictor: out of memory for CNN scratch");
    }
    return 0;
}

void kvp_cnn_scratch_free(struct kvp_cnn_scratch *s)
{
    if (!s)
        return;
    kvp_free_aligned(s->xin);
    kvp_free_aligned(s->a1);
    free(s->a1_row);
    kvp_free_aligned(s->z2);
    kvp_free_aligned(s->sums);
    memset(s, 0, sizeof(*s));
}

int kvp_cnn_inc_init(struct kvp_cnn_inc *st, const struct kvp_cnn *n, int max_w,
                     struct kvp_err *err)
{
    memset(st, 0, sizeof(*st));
    if (max_w < 1)
        max_w = 1;
    int p = n->k / 2;
    st->max_w = max_w;
    st->sums = calloc((size_t)n->c2 * max_w, sizeof(float));
    st->keep = calloc((size_t)(4 * p + 1) * n->c2 * max_w, sizeof(float));
    if (!st->sums || !st->keep) {
        kvp_cnn_inc_free(st);
        return kvp_err_set(err, KVP_ENOMEM, "predictor: out of memory for CNN state");
    }
    return 0;
}

void kvp_cnn_inc_free(struct kvp_cnn_inc *st)
{
    if (!st)
        return;
    free(st->sums);
    free(st->keep);
    memset(st, 0, sizeof(*st));
}

/* ---- the network over a column window ------------------------------------------------------ */

/* A window of the CNN slice: local column x is slice column xs + x, x < w. Padding is applied at
 * the window's edges, so columns within 2p of an inner edge are wrong and must not be used. */
struct window {
    const struct kvp_cnn *n;
    const struct kvp_cnn_input *in;
    struct kvp_cnn_scratch *s;
    int xs, w;
};

/* Conv1 row i (ReLU, zero margins) in the ring, or NULL for a padding row. */
static const float *conv1_row(const struct window *v, int i)
{
    const struct kvp_cnn *n = v->n;
    struct kvp_cnn_scratch *s = v->s;
    if (i < 0 || i >= v->in->n_rows)
        return NULL;
    const int k = n->k, p = k / 2, st = s->stride, w = v->w;
    float *out = s->a1 + (size_t)(i % k) * n->c1 * st;
    if (s->a1_row[i % k] == i)
        return out;
    /* the k input rows around i, padded */
    for (int dy = 0; dy < k; dy++) {
        float *x = s->xin + (size_t)dy * st;
        int r = i - p + dy;
        memset(x, 0, (size_t)st * sizeof(float));
        if (r >= 0 && r < v->in->n_rows)
            memcpy(x + p, v->in->rows[r] + v->in->col0 + v->xs, (size_t)w * sizeof(float));
    }
    for (int c = 0; c < n->c1; c++) {
        float *o = out + (size_t)c * st;
        memset(o, 0, (size_t)st * sizeof(float));
        for (int x = 0; x < w; x++)
            o[x + p] = n->b1[c];
        for (int dy = 0; dy < k; dy++) {
            const float *x = s->xin + (size_t)dy * st;
            for (int dx = 0; dx < k; dx++) {
                float wt = n->w1[((size_t)c * k + dy) * k + dx];
                for (int xx = 0; xx < w; xx++)
                    o[xx + p] += wt * x[xx + dx];
            }
        }
        for (int x = 0; x < w; x++)
            o[x + p] = o[x + p] > 0.0f ? o[x + p] : 0.0f;
    }
    s->a1_row[i % k] = i;
    return out;
}

/* ReLU(conv2) of row r into s->z2 ([c2][stride], local columns from 0). */
static void conv2_row(const struct window *v, int r)
{
    const struct kvp_cnn *n = v->n;
    const int k = n->k, p = k / 2;
    const float *in[KVP_CNN_MAX_K];
    for (int dy = 0; dy < k; dy++)
        in[dy] = conv1_row(v, r - p + dy);
    int wt = round16(v->w);
    kvp_cnn_kernels()->conv2_row(n->w2t, n->b2, n->c1, n->c2, k, in, v->s->stride, wt, v->s->z2,
                                 v->s->stride);
    for (int c = 0; c < n->c2; c++) {
        float *z = v->s->z2 + (size_t)c * v->s->stride;
        for (int x = 0; x < v->w; x++)
            z[x] = z[x] > 0.0f ? z[x] : 0.0f;
    }
}

static void window_begin(struct window *v, const struct kvp_cnn *n, const struct kvp_cnn_input *in,
                         struct kvp_cnn_scratch *s, int xs, int w)
{
    *v = (struct window){.n = n, .in = in, .s = s, .xs = xs, .w = w};
    for (int i = 0; i < n->k; i++)
        s->a1_row[i] = -1;
}

/* Index into keep[] of row r of an n_rows-row state, or -1 when row r is not kept. */
static int keep_slot(int r, int n_rows, int p)
{
    if (r <= 2 * p)
        return r;
    if (r >= n_rows - 2 * p)
        return 2 * p + 1 + (r - (n_rows - 2 * p));
    return -1;
}

/* All rows over window [xs, xs + w): column sums into s->sums (local columns); kept rows (for
 * local columns >= from) copied into st->keep at slice column xs + x when st is not NULL. */
static void full_pass(const struct kvp_cnn *n, const struct kvp_cnn_input *in,
                      struct kvp_cnn_scratch *s, int xs, int w, struct kvp_cnn_inc *st, int from)
{
    struct window v;
    window_begin(&v, n, in, s, xs, w);
    const int p = n->k / 2, so = s->stride;
    for (int c = 0; c < n->c2; c++)
        memset(s->sums + (size_t)c * so, 0, (size_t)w * sizeof(float));
    for (int r = 0; r < in->n_rows; r++) {
        conv2_row(&v, r);
        for (int c = 0; c < n->c2; c++) {
            float *sm = s->sums + (size_t)c * so;
            const float *z = s->z2 + (size_t)c * so;
            for (int x = 0; x < w; x++)
                sm[x] += z[x];
        }
        int slot = st ? keep_slot(r, in->n_rows, p) : -1;
        if (slot >= 0)
            for (int c = 0; c < n->c2; c++)
                memcpy(st->keep + ((size_t)slot * n->c2 + c) * st->max_w + xs + from,
                       s->z2 + (size_t)c * so + from, (size_t)(w - from) * sizeof(float));
    }
}

static void scores_from_sums(const struct kvp_cnn *n, const float *sums, size_t stride, int W,
                             int n_rows, float *scores)
{
    float inv = 1.0f / (float)n_rows;
    for (int x = 0; x < W; x++)
        scores[x] = n->b3[0];
    for (int c = 0; c < n->c2; c++) {
        float wc = n->w3[c];
        const float *sm = sums + (size_t)c * stride;
        for (int x = 0; x < W; x++)
            scores[x] += wc * (sm[x] * inv);
    }
}

void kvp_cnn_forward(const struct kvp_cnn *n, const struct kvp_cnn_input *in,
                     struct kvp_cnn_scratch *s, float *scores)
{
    if (in->W <= 0)
        return;
    if (in->n_rows <= 0) {
        for (int x = 0; x < in->W; x++)
            scores[x] = n->b3[0];
        return;
    }
    full_pass(n, in, s, 0, in->W, NULL, 0);
    scores_from_sums(n, s->sums, (size_t)s->stride, in->W, in->n_rows, scores);
}

/* From scratch, leaving the state of generation gen in st. */
static void inc_full(const struct kvp_cnn *n, const struct kvp_cnn_input *in, uint64_t gen,
                     struct kvp_cnn_inc *st, struct kvp_cnn_scratch *s, float *scores)
{
    full_pass(n, in, s, 0, in->W, st, 0);
    for (int c = 0; c < n->c2; c++)
        memcpy(st->sums + (size_t)c * st->max_w, s->sums + (size_t)c * s->stride,
               (size_t)in->W * sizeof(float));
    st->valid = true;
    st->gen = gen;
    st->n_rows = in->n_rows;
    st->col0 = in->col0;
    st->W = in->W;
    scores_from_sums(n, st->sums, (size_t)st->max_w, in->W, in->n_rows, scores);
}

bool kvp_cnn_forward_inc(const struct kvp_cnn *n, const struct kvp_cnn_input *in, uint64_t gen,
                         bool full, struct kvp_cnn_inc *st, struct kvp_cnn_scratch *s,
                         float *scores)
{
    const int p = n->k / 2, H = in->n_rows, W = in->W, c2 = n->c2;
    const size_t mw = (size_t)st->max_w;
    if (W <= 0)
        return false;
    if (H <= 0 || W > st->max_w) {
        st->valid = false;
        kvp_cnn_forward(n, in, s, scores);
        return false;
    }
    bool inc = !full && st->valid && gen == st->gen + 1 && H == st->n_rows &&
               in->col0 == st->col0 && (W == st->W || W == st->W + 1) && H >= 4 * p + 2 &&
               st->W > 4 * p + 1;
    if (!inc) {
        inc_full(n, in, gen, st, s, scores);
        return false;
    }
    /* columns [0, wc) move with the rows; [wc, W) are recomputed over all rows */
    const int wc = W == st->W ? W : st->W - 2 * p;
    for (int slot = 0; slot < 4 * p + 1; slot++)
        for (int c = 0; c < c2; c++) {
            float *sm = st->sums + (size_t)c * mw;
            const float *kp = st->keep + ((size_t)slot * c2 + c) * mw;
            for (int x = 0; x < wc; x++)
                sm[x] -= kp[x];
        }
    struct window v;
    window_begin(&v, n, in, s, 0, W);
    for (int r = 0; r < H; r++) {
        if (r == 2 * p + 1)
            r = H - 1 - 2 * p; /* rows [2p+1, H-1-2p) are carried over */
        conv2_row(&v, r);
        int slot = keep_slot(r, H, p);
        for (int c = 0; c < c2; c++) {
            const float *z = s->z2 + (size_t)c * s->stride;
            if (r != 2 * p) { /* row 2p is carried (old row 2p+1); computed only to be kept */
                float *sm = st->sums + (size_t)c * mw;
                for (int x = 0; x < wc; x++)
                    sm[x] += z[x];
            }
            if (slot >= 0)
                memcpy(st->keep + ((size_t)slot * c2 + c) * mw, z, (size_t)W * sizeof(float));
        }
    }
    if (wc < W) {
        int xs = wc - 2 * p > 0 ? wc - 2 * p : 0;
        full_pass(n, in, s, xs, W - xs, NULL, 0);
        for (int c = 0; c < c2; c++)
            memcpy(st->sums + (size_t)c * mw + wc, s->sums + (size_t)c * s->stride + (wc - xs),
                   (size_t)(W - wc) * sizeof(float));
    }
    st->gen = gen;
    st->W = W;
    scores_from_sums(n, st->sums, mw, W, H, scores);
    return true;
}

/* ---- per-column inference ------------------------------------------------------------------ */

enum { COLS_BATCH = 16 }; /* conv1 columns / conv2 candidates per kernel call (fast path) */

int kvp_cnn_cols_scratch_init(struct kvp_cnn_cols_scratch *s, const struct kvp_cnn *n, int H,
                              int max_w, struct kvp_err *err)
{
    memset(s, 0, sizeof(*s));
    const int k = n->k, p = k / 2;
    s->H = H < 1 ? 1 : H;
    s->max_w = max_w < 1 ? 1 : max_w;
    size_t per = (size_t)(s->H + 2 * p) * n->c1;
    s->a1 = kvp_alloc_aligned(((size_t)s->max_w + 1) * per * sizeof(float));
    s->slot = malloc((size_t)s->max_w * sizeof(int));
    s->used = malloc((size_t)s->max_w * sizeof(int));
    const int widest = n->cin > n->c1 ? n->cin : n->c1;
    s->x = kvp_alloc_aligned(((size_t)n->cp1 * s->H + (size_t)widest * k * k) * sizeof(float));
    s->z = kvp_alloc_aligned((size_t)n->cp2 * sizeof(float));
    s->sum = kvp_alloc_aligned((size_t)n->cp2 * sizeof(float));
    s->rb1 = malloc((size_t)n->c1 * sizeof(float));
    s->patch = malloc((size_t)n->cin * (s->H + 2 * p) * k * sizeof(float));
    s->csum = kvp_alloc_aligned((size_t)COLS_BATCH * n->cp2 * sizeof(float));
    s->v2 = kvp_alloc_aligned((size_t)COLS_BATCH * 8 * n->cp2 * sizeof(float));
    if (!s->a1 || !s->slot || !s->used || !s->x || !s->z || !s->sum || !s->rb1 || !s->patch ||
        !s->csum || !s->v2) {
        kvp_cnn_cols_scratch_free(s);
        return kvp_err_set(err, KVP_ENOMEM, "predictor: out of memory for CNN scratch");
    }
    for (int i = 0; i < s->max_w; i++)
        s->slot[i] = -1;
    memset(s->a1 + (size_t)s->max_w * per, 0, per * sizeof(float)); /* the padding column */
    for (int ci = 0; ci < n->c1; ci++)
        s->rb1[ci] = n->b1[ci] > 0.0f ? n->b1[ci] : 0.0f;
    return 0;
}

void kvp_cnn_cols_scratch_free(struct kvp_cnn_cols_scratch *s)
{
    if (!s)
        return;
    kvp_free_aligned(s->a1);
    free(s->slot);
    free(s->used);
    kvp_free_aligned(s->x);
    kvp_free_aligned(s->z);
    kvp_free_aligned(s->sum);
    free(s->rb1);
    free(s->patch);
    kvp_free_aligned(s->csum);
    kvp_free_aligned(s->v2);
    memset(s, 0, sizeof(*s));
}

/* First row with a non-zero history value in slice columns [c0, c1] (clipped), or n_rows. */
static int first_busy_row(const struct kvp_cnn_input *in, int c0, int c1)
{
    c0 = c0 < 0 ? 0 : c0;
    c1 = c1 >= in->W ? in->W - 1 : c1;
    for (int r = 0; r < in->n_rows; r++) {
        /* the values' bits or-ed, sign bit dropped: non-zero exactly when some value != 0.0f
         * (NaN included), with no compare or branch per column (most neighbourhoods are zero) */
        const float *row = in->rows[r] + in->col0;
        uint32_t bits = 0;
        for (int c = c0; c <= c1; c++) {
            uint32_t b;
            memcpy(&b, row + c, sizeof(b));
            bits |= b;
        }
        if (bits & 0x7fffffffu)
            return r;
    }
    return in->n_rows;
}

/* ReLU(conv1) of slice column c, every row, into a1 ([H + 2p][c1], rows from -p): rows whose
 * input neighbourhood is all zero are ReLU(b1) without computing. The k input columns around c
 * are first copied into a zero-padded patch per channel, [R + 2p][k], so the k×k neighbourhood of
 * row j is the k·k contiguous values from patch row j, in the weights' [dy][dx] order. */
static void conv1_column(const struct kvp_cnn *n, const struct kvp_cnn_kernels *kern,
                         const struct kvp_cnn_input *in, int c, struct kvp_cnn_cols_scratch *s,
                         float *a1)
{
    const int k = n->k, p = k / 2, R = in->n_rows, c1 = n->c1, W = in->W;
    const bool query = n->cin > 1 && in->qrow;
    float *ph = s->patch, *pq = s->patch + (size_t)(s->H + 2 * p) * k;
    memset(ph, 0, (size_t)(R + 2 * p) * k * sizeof(float));
    int z = R; /* first row with history in the k columns */
    for (int r = 0; r < R; r++) {
        const float *row = in->rows[r] + in->col0;
        for (int dx = 0; dx < k; dx++) {
            int cc = c - p + dx;
            float v = cc >= 0 && cc < W ? row[cc] : 0.0f;
            ph[(size_t)(r + p) * k + dx] = v;
            if (v != 0.0f && z == R)
                z = r;
        }
    }
    if (query) {
        memset(pq, 0, (size_t)(R + 2 * p) * k * sizeof(float));
        for (int dx = 0; dx < k; dx++) {
            int cc = c - p + dx;
            pq[(size_t)(R - 1 + p) * k + dx] = cc >= 0 && cc < W ? in->qrow[cc] : 0.0f;
        }
        z = z > R - 1 ? R - 1 : z;
    }
    memset(a1, 0, (size_t)p * c1 * sizeof(float));
    memset(a1 + (size_t)(R + p) * c1, 0, (size_t)p * c1 * sizeof(float));
    const int jc = z - p > 0 ? z - p : 0; /* rows < jc see zeros only */
    for (int j = 0; j < jc; j++)
        memcpy(a1 + (size_t)(j + p) * c1, s->rb1, (size_t)c1 * sizeof(float));
    /* rows [jc, R) in one call, both channels (channel 0 comes first in w1p): rows that do not
     * reach the query row read zeros from its patch, and x·0 adds ±0, which changes nothing the
     * ReLU keeps (the weights are finite), so this equals computing the history alone there;
     * one call of R - jc positions keeps more independent FMA chains than two short ones */
    if (R > jc) {
        const float *xs[2] = {ph + (size_t)jc * k, pq + (size_t)jc * k};
        kern->conv_rows(n->w1p, n->b1p, xs, query ? 2 : 1, k * k, k, R - jc, n->cp1, s->x, false);
        for (int j = jc; j < R; j++)
            memcpy(a1 + (size_t)(j + p) * c1, s->x + (size_t)(j - jc) * n->cp1,
                   (size_t)c1 * sizeof(float));
    }
}

/* Constant conv2 rows (all-zero neighbourhood) of the candidate at column x, added into sum[c2]:
 * rows below lo2, by the edges they touch: top rows r < p miss p - r conv1 rows above, border
 * columns miss their outside neighbours. The constants are cached per call in cst (by the
 * count missing on each side and the top rows missing), have marking which are set. */
struct const_rows {
    float v[KVP_CNN_MAX_K / 2 + 1][KVP_CNN_MAX_K / 2 + 1][KVP_CNN_MAX_K / 2 + 1][KVP_CNN_COLS_C2];
    bool have[KVP_CNN_MAX_K / 2 + 1][KVP_CNN_MAX_K / 2 + 1][KVP_CNN_MAX_K / 2 + 1];
};

static void const_rows_add(const struct kvp_cnn *n, const struct kvp_cnn_kernels *kern, int W,
                           int x, int lo2, struct kvp_cnn_cols_scratch *s, struct const_rows *cr,
                           float *sum)
{
    const int k = n->k, p = k / 2, c1 = n->c1, c2 = n->c2;
    const int le = x - p < 0 ? p - x : 0, re = x + p >= W ? x + p - W + 1 : 0;
    for (int t = 0; t <= p && lo2 > 0; t++) {
        int count = t == 0 ? lo2 - p : (p - t < lo2); /* interior rows [p, lo2); row p - t */
        if (count <= 0)
            continue;
        float *cv = cr->v[le][re][t];
        if (!cr->have[le][re][t]) {
            float *x3 = s->x + (size_t)n->cp1 * s->H;
            for (int dx = 0; dx < k; dx++)
                for (int dy = 0; dy < k; dy++)
                    for (int ci = 0; ci < c1; ci++) {
                        int cc = x - p + dx;
                        x3[(dx * k + dy) * c1 + ci] =
                            (dy < t || cc < 0 || cc >= W) ? 0 : s->rb1[ci];
                    }
            const float *xs = x3;
            kern->conv_rows(n->w2p, n->b2p, &xs, 1, k * k * c1, 0, 1, n->cp2, s->z, false);
            memcpy(cv, s->z, (size_t)c2 * sizeof(float));
            cr->have[le][re][t] = true;
        }
        for (int co = 0; co < c2; co++)
            sum[co] += (float)count * cv[co];
    }
}

static float score_of(const struct kvp_cnn *n, const float *sum, int R)
{
    float y = n->b3[0], inv = 1.0f / (float)R;
    for (int co = 0; co < n->c2; co++)
        y += n->w3[co] * (sum[co] * inv);
    return y;
}

long kvp_cnn_forward_cols_ref(const struct kvp_cnn *n, const struct kvp_cnn_input *in,
                              const int *cols, int n_cols, struct kvp_cnn_cols_scratch *s,
                              float *scores)
{
    if (n->c2 > KVP_CNN_COLS_C2)
        return -1;
    const struct kvp_cnn_kernels *kern = kvp_cnn_kernels();
    const int k = n->k, p = k / 2, R = in->n_rows, W = in->W;
    const int c1 = n->c1, cp2 = n->cp2;
    const size_t per = (size_t)(s->H + 2 * p) * c1;
    const float *zero_col = s->a1 + (size_t)s->max_w * per;
    long computed = 0;
    int n_used = 0;
    if (R <= 0 || W <= 0) {
        for (int i = 0; i < n_cols; i++)
            scores[i] = n->b3[0];
        return 0;
    }
    /* conv1 once per column any candidate needs */
    for (int i = 0; i < n_cols; i++)
        for (int c = cols[i] - p; c <= cols[i] + p; c++) {
            if (c < 0 || c >= W || s->slot[c] >= 0)
                continue;
            s->slot[c] = n_used;
            s->used[n_used] = c;
            conv1_column(n, kern, in, c, s, s->a1 + (size_t)n_used * per);
            n_used++;
        }
    struct const_rows cr;
    memset(cr.have, 0, sizeof(cr.have));
    for (int i = 0; i < n_cols; i++) {
        const int x = cols[i];
        int z = first_busy_row(in, x - 2 * p, x + 2 * p);
        if (n->cin > 1 && in->qrow && z > R - 1)
            z = R - 1;
        const int lo2 = z - 2 * p > 0 ? z - 2 * p : 0; /* conv2 rows < lo2 are constants */
        memset(s->sum, 0, (size_t)cp2 * sizeof(float));
        const_rows_add(n, kern, W, x, lo2, s, &cr, s->sum);
        /* conv2 rows [lo2, R): the k conv1 columns, rows r - p .. r + p contiguous in each */
        if (lo2 < R) {
            const float *xs[KVP_CNN_MAX_K];
            for (int dx = 0; dx < k; dx++) {
                int c = x - p + dx;
                xs[dx] = (c < 0 || c >= W ? zero_col : s->a1 + (size_t)s->slot[c] * per) +
                         (size_t)lo2 * c1; /* row lo2 - p sits at index lo2 */
            }
            kern->conv_rows(n->w2p, n->b2p, xs, k, k * c1, c1, R - lo2, cp2, s->sum, true);
            computed += R - lo2;
        }
        scores[i] = score_of(n, s->sum, R);
    }
    for (int i = 0; i < n_used; i++)
        s->slot[s->used[i]] = -1;
    return computed;
}

/* sum[co] += ((v[lo][co] + v[lo + 1][co]) + ...) + v[R - 1][co], rows cp floats apart: one
 * chunk of conv_rows' accumulation (cp a multiple of 4; four lanes at a time, each lane's
 * additions in the same order) */
static void add_rows(const float *v, int lo, int R, int cp, float *sum)
{
    typedef float v4 __attribute__((vector_size(16)));
    for (int co = 0; co < cp; co += 4) {
        v4 chunk, x, acc;
        memcpy(&chunk, v + (size_t)lo * cp + co, sizeof(chunk));
        for (int r = lo + 1; r < R; r++) {
            memcpy(&x, v + (size_t)r * cp + co, sizeof(x));
            chunk += x;
        }
        memcpy(&acc, sum + co, sizeof(acc));
        acc += chunk;
        memcpy(sum + co, &acc, sizeof(acc));
    }
}

/* The fast form of kvp_cnn_forward_cols_ref (equal to it to the bit; histories of up to 8
 * rows, longer ones go the reference way). conv1 runs whole columns (every row) and conv2 whole
 * candidates (every row), several side by side in registers (kernels conv1_cols and
 * conv2_cands): rows the reference takes as constants are computed here as well (the
 * constants are what they come to) and conv2's constant rows are then left out of the sum
 * exactly as the reference leaves them, so the sums add the same values in the same order.
 * Nothing scans the whole slice: the first busy row is looked up around each candidate only. */
long kvp_cnn_forward_cols(const struct kvp_cnn *n, const struct kvp_cnn_input *in,
                          const int *cols, int n_cols, struct kvp_cnn_cols_scratch *s,
                          float *scores)
{
    if (n->c2 > KVP_CNN_COLS_C2)
        return -1;
    const int k = n->k, p = k / 2, R = in->n_rows, W = in->W;
    if (R > 8 || R <= 0 || W <= 0 || k > KVP_CNN_MAX_K)
        return kvp_cnn_forward_cols_ref(n, in, cols, n_cols, s, scores);
    const struct kvp_cnn_kernels *kern = kvp_cnn_kernels();
    const int c1 = n->c1, cp2 = n->cp2;
    const size_t per = (size_t)(s->H + 2 * p) * c1;
    const float *zero_col = s->a1 + (size_t)s->max_w * per;
    const bool query = n->cin > 1 && in->qrow;
    const float *rowp[8];
    int x0[COLS_BATCH];
    float *op[COLS_BATCH];
    long computed = 0;
    int n_used = 0, nb = 0;
    /* the conv1 columns the candidates need, in a slot each; candidates in ascending order
     * (the policies') take the columns past the previous neighbourhood's end without looking
     * their slots up (a branch per column that did not predict) */
    bool ascending = true;
    for (int i = 1; i < n_cols && ascending; i++)
        ascending = cols[i] > cols[i - 1];
    for (int i = 0, next = 0; i < n_cols; i++)
        if (ascending) {
            int c = cols[i] - p > next ? cols[i] - p : next;
            c = c < 0 ? 0 : c;
            for (; c <= cols[i] + p && c < W; c++) {
                s->slot[c] = n_used;
                s->used[n_used++] = c;
            }
            next = c > next ? c : next;
        } else {
            for (int c = cols[i] - p; c <= cols[i] + p; c++)
                if (c >= 0 && c < W && s->slot[c] < 0) {
                    s->slot[c] = n_used;
                    s->used[n_used++] = c;
                }
        }
    /* conv1: columns inside the slice read the history rows in place, COLS_BATCH per call; a
     * column at the border reads a zero-padded copy of its neighbourhood */
    for (int r = 0; r < R; r++)
        rowp[r] = in->rows[r] + in->col0;
    for (int u = 0; u < n_used; u++) {
        const int c = s->used[u];
        float *a1 = s->a1 + (size_t)u * per;
        if (c - p < 0 || c + p >= W) {
            float edge[8 + 1][KVP_CNN_MAX_K];
            const float *erow[8];
            for (int r = 0; r <= R; r++) {
                const float *src = r < R ? rowp[r] : in->qrow;
                for (int dx = 0; dx < k; dx++) {
                    const int cc = c - p + dx;
                    edge[r][dx] = cc >= 0 && cc < W && src ? src[cc] : 0.0f;
                }
                if (r < R)
                    erow[r] = edge[r];
            }
            const int zx = 0;
            kern->conv1_cols(n->w1p, n->b1p, n->cp1, c1, k, R, erow, query ? edge[R] : NULL,
                             &zx, 1, &a1);
            continue;
        }
        x0[nb] = c - p;
        op[nb] = a1;
        if (++nb == COLS_BATCH) {
            kern->conv1_cols(n->w1p, n->b1p, n->cp1, c1, k, R, rowp, query ? in->qrow : NULL,
                             x0, nb, op);
            nb = 0;
        }
    }
    if (nb)
        kern->conv1_cols(n->w1p, n->b1p, n->cp1, c1, k, R, rowp, query ? in->qrow : NULL, x0,
                         nb, op);
    /* conv2, COLS_BATCH candidates per call; then each candidate's rows from lo2 on summed and
     * added to its constant rows' sum, as the reference's conv_rows accumulates one chunk */
    struct const_rows cr;
    memset(cr.have, 0, sizeof(cr.have));
    const float *cp[COLS_BATCH * KVP_CNN_MAX_K];
    for (int g0 = 0; g0 < n_cols; g0 += COLS_BATCH) {
        const int ng = n_cols - g0 < COLS_BATCH ? n_cols - g0 : COLS_BATCH;
        for (int i = 0; i < ng; i++) {
            const int x = cols[g0 + i];
            for (int dx = 0; dx < k; dx++) {
                const int c = x - p + dx;
                cp[i * k + dx] = c < 0 || c >= W ? zero_col : s->a1 + (size_t)s->slot[c] * per;
            }
            op[i] = s->v2 + (size_t)i * 8 * cp2;
        }
        kern->conv2_cands(n->w2p, n->b2p, cp2, c1, k, R, cp, ng, op);
        for (int i = 0; i < ng; i++) {
            const int x = cols[g0 + i];
            int z = first_busy_row(in, x - 2 * p, x + 2 * p);
            if (query && z > R - 1)
                z = R - 1;
            const int lo2 = z - 2 * p > 0 ? z - 2 * p : 0; /* conv2 rows < lo2: constants */
            float *sum = s->csum + (size_t)i * cp2;
            memset(sum, 0, (size_t)cp2 * sizeof(float));
            if (lo2 > 0)
                const_rows_add(n, kern, W, x, lo2, s, &cr, sum);
            if (lo2 < R) {
                add_rows(op[i], lo2, R, cp2, sum);
                computed += R - lo2;
            }
        }
        /* score_of's sums, four candidates' chains side by side in registers (one alone is c2
         * dependent adds; an array of them indexed by candidate stayed in memory, a store and
         * a reload per term) */
        const float inv = 1.0f / (float)R;
        int i = 0;
        for (; i + 4 <= ng; i += 4) {
            const float *s0 = s->csum + (size_t)i * cp2, *s1 = s0 + cp2, *s2 = s1 + cp2,
                        *s3 = s2 + cp2;
            float y0 = n->b3[0], y1 = y0, y2 = y0, y3 = y0;
            for (int co = 0; co < n->c2; co++) {
                const float w = n->w3[co];
                y0 += w * (s0[co] * inv);
                y1 += w * (s1[co] * inv);
                y2 += w * (s2[co] * inv);
                y3 += w * (s3[co] * inv);
            }
            scores[g0 + i] = y0;
            scores[g0 + i + 1] = y1;
            scores[g0 + i + 2] = y2;
            scores[g0 + i + 3] = y3;
        }
        for (; i < ng; i++)
            scores[g0 + i] = score_of(n, s->csum + (size_t)i * cp2, R);
    }
    for (int i = 0; i < n_used; i++)
        s->slot[s->used[i]] = -1;
    return computed;
}

void kvp_qfeat_row(const float *ub, int W, float *out)
{
    if (W <= 0)
        return;
    float mx = ub[0];
    for (int x = 1; x < W; x++)
        mx = ub[x] > mx ? ub[x] : mx;
    for (int x = 0; x < W; x++)
        out[x] = expf(ub[x] - mx);
}
