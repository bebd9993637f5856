/*
 * The AttentionPredictor CNN (docs/methods.md §1.3): a tiny fully convolutional network
 * that reads the recent history of block-max-pooled attention rows of one head as an image (time ×
 * blocks) and scores every block for the next decode step.
 *
 *   input  [H][W]            history rows, row 0 the oldest, row H-1 the newest (upstream order)
 *   conv1  1 -> c1, k×k, zero padding k/2 on both axes, ReLU        [c1][H][W]
 *   conv2  c1 -> c2, k×k, zero padding k/2, ReLU                     [c2][H][W]
 *   mean over the H rows                                             [c2][W]
 *   conv3  c2 -> 1, pointwise, no activation                         [W] one score per block
 *
 * PyTorch semantics throughout: cross-correlation (no kernel flip), weights [out][in][kh][kw],
 * one bias per output channel. Defaults c1 = 16, c2 = 32, k = 3: 4,833 parameters. Since time is
 * mean-pooled, the network can tell recent rows from old ones only through the zero padding at the
 * bottom edge; a wrong row order or padding silently degrades it, so the tests pin both.
 *
 * Two ways to run it:
 *   kvp_cnn_forward      from scratch: conv1 rows are streamed through a ring of k rows, each conv2
 *                        row is rectified and added into per-(channel, column) sums; nothing of
 *                        size H×W is kept;
 *   kvp_cnn_forward_inc  incremental (§1.7): when the history has moved by exactly one row
 *                        since the last call (and grown by at most one column), only the conv2
 *                        rows whose neighbourhood changed are recomputed (rows [0, 2p] and
 *                        [H-1-2p, H) with p = k/2: 6 of 64 for k = 3); running column sums
 *                        absorb the difference; the last 2p+1 columns are recomputed over all
 *                        rows when the slice grows.
 * Both give the same scores up to float rounding of the running sums (tested).
 *
 * The hot loop is one conv2 output row (97 % of the work). It is written once (cnn_kernel.inc) with
 * GCC vector extensions over 16/8/4 columns and register-blocked over output channels, and compiled
 * three times: baseline x86-64, AVX2+FMA and AVX-512 (cnn_scalar.c, cnn_avx2.c,
 * cnn_avx512.c); the fastest one the CPU runs is picked at first use, like src/kernels/simd.c.
 */
#ifndef KVP_PREDICTOR_CNN_H
#define KVP_PREDICTOR_CNN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#define KVP_CNN_MAX_CH  256  /* channel limit accepted from a file */
#define KVP_CNN_MAX_K   7    /* largest (odd) kernel accepted from a file */
#define KVP_CNN_MAX_H   1024 /* largest history length accepted from a file */
#define KVP_CNN_MAX_REC 8    /* validation recovery entries kept in the metadata */
#define KVP_CNN_MAX_CIN 2    /* input channels: the history, and the query's block bound */

enum kvp_cnn_loss {
    KVP_LOSS_MSE = 0, /* squared error against the next block-max-pooled row (the paper) */
    KVP_LOSS_CE = 1,  /* softmax cross-entropy against the next block-attention distribution */
};

/* Training metadata stored with the weights (informational; the policy checks only block size). */
struct kvp_cnn_meta {
    char model[64];   /* general.name of the LLM the predictor was trained on */
    uint64_t n_train; /* training samples */
    uint64_t n_val;   /* validation samples */
    uint64_t seed;
    uint32_t loss;        /* enum kvp_cnn_loss */
    uint32_t sink, local; /* forced tokens the training slices excluded */
    uint32_t flags;       /* bit 0: trained on per-KV-head pooled histories */
    uint32_t epochs;
    uint32_t n_rec;                       /* entries in rec_budget / rec_rel */
    uint32_t rec_budget[KVP_CNN_MAX_REC]; /* token budgets */
    float rec_rel[KVP_CNN_MAX_REC];       /* validation recovery / oracle recovery */
};

struct kvp_cnn {
    int cin;        /* input channels: 1 = the history (the paper); 2 = history and the current
                       query's per-block bound feature in the newest row (qpredictor) */
    int c1, c2, k;  /* conv1 and conv2 output channels, kernel size (odd) */
    int H;          /* history rows the network was trained with */
    int block_size; /* tokens per history column */
    float *w1;      /* [c1][cin][k][k] */
    float *b1;      /* [c1] */
    float *w2;      /* [c2][c1][k][k] */
    float *b2;      /* [c2] */
    float *w3;      /* [c2]: conv3 weight [1][c2][1] */
    float *b3;      /* [1] */
    float *w2t;     /* [c1][k][k][c2] conv2 weights transposed for the kernel (kvp_cnn_prepare) */
    /* per-column inference (kvp_cnn_forward_cols): weights [in][k][k][out] with the output
     * channels padded to cp1 / cp2 (multiples of 16), biases padded alike */
    int cp1, cp2;
    float *w1p, *b1p; /* [cin][k][k][cp1], [cp1] */
    float *w2p, *b2p; /* [k (dx)][k (dy)][c1][cp2], [cp2] */
    float *params;  /* owned: w1 .. b3 in that order (the file order), then the derived ones */
    struct kvp_cnn_meta meta;
};

/* Allocate a network with zero weights and one input channel (kvp_cnn_init) or cin. Returns 0 or
 * KVP_EINVAL / KVP_ENOMEM. */
int kvp_cnn_init(struct kvp_cnn *n, int c1, int c2, int k, int H, int block_size,
                 struct kvp_err *err);
int kvp_cnn_init_ch(struct kvp_cnn *n, int cin, int c1, int c2, int k, int H, int block_size,
                    struct kvp_err *err);
void kvp_cnn_free(struct kvp_cnn *n);             /* accepts a zeroed struct */
size_t kvp_cnn_n_params(const struct kvp_cnn *n); /* w1 .. b3 */
/* Recompute derived weights (w2t, w1p, w2p) after the parameters changed. */
void kvp_cnn_prepare(struct kvp_cnn *n);

/* ---- the predictor file ----------------------------------------------------------------------
 * Little-endian, version 1 (one input channel) or 2:
 *   char[8]  magic "KVPCNN01"
 *   u32      version (1 or 2)
 *   u32      cin, input channels (version 2 only; 1 or 2; version 1 files have one)
 *   u32      c1, c2, k, H, block_size
 *   u32      loss, sink, local, flags, epochs
 *   u64      seed, n_train, n_val
 *   char[64] model name (NUL padded)
 *   u32      n_rec, then n_rec × (u32 budget, f32 recovery relative to the oracle)   (n_rec <= 8)
 *   u32      n_params, then n_params × f32: w1, b1, w2, b2, w3, b3 (PyTorch order and layout)
 *   u64      FNV-1a 64 checksum of every byte before it
 * Anything else (short, long, bad magic, bad version, implausible shape, checksum mismatch, a
 * non-finite weight) is refused with KVP_EFORMAT and one line naming the problem. A network with
 * one channel is written as version 1 (older builds read it), one with two as version 2. */
int kvp_cnn_save(const struct kvp_cnn *n, const char *path, struct kvp_err *err);
int kvp_cnn_load(const char *path, struct kvp_cnn *n, struct kvp_err *err);
/* Parse a predictor file held in memory (the loader's core; used by the tests). */
int kvp_cnn_parse(const void *data, size_t size, struct kvp_cnn *n, struct kvp_err *err);

/* ---- inference --------------------------------------------------------------------------------
 */

/* The CNN's view of one history: n_rows row pointers, oldest first; column x of the input is
 * rows[i][col0 + x] for x < W. Columns outside [col0, col0 + W) are never read (zero padding). */
struct kvp_cnn_input {
    const float *const *rows;
    int n_rows;
    int col0;
    int W;
    /* second channel (cin = 2): its newest row, qrow[x] for x < W (slice columns, not offset by
     * col0); every older row of that channel is zero. NULL: all zero. */
    const float *qrow;
};

/* Scratch for one thread, sized for inputs up to max_w columns. */
struct kvp_cnn_scratch {
    int max_w;
    int stride;  /* floats per channel row: columns padded to whole vectors plus margins */
    float *xin;  /* [k][stride] padded input rows */
    float *a1;   /* [k][c1][stride] ring of conv1 rows (slot = row mod k) */
    int *a1_row; /* [k] which row each ring slot holds (-1: none) */
    float *z2;   /* [c2][stride] one conv2 row */
    float *sums; /* [c2][stride] column sums of a from-scratch run */
};
int kvp_cnn_scratch_init(struct kvp_cnn_scratch *s, const struct kvp_cnn *n, int max_w,
                         struct kvp_err *err);
void kvp_cnn_scratch_free(struct kvp_cnn_scratch *s);

/* Scores of every input column: scores[x], x < in->W. From scratch. Needs in->W <= s->max_w and
 * one input channel (the from-scratch and incremental paths below read the history only). */
void kvp_cnn_forward(const struct kvp_cnn *n, const struct kvp_cnn_input *in,
                     struct kvp_cnn_scratch *s, float *scores);

/* Incremental state of one history (one series): the running column sums and the rectified conv2
 * rows that leave or get recomputed at the next step. */
struct kvp_cnn_inc {
    int max_w;
    bool valid;
    uint64_t gen; /* history generation (rows appended so far) the sums belong to */
    int n_rows, col0, W;
    float *sums; /* [c2][max_w] sum over rows of ReLU(conv2) */
    float *keep; /* [4p+1][c2][max_w] ReLU(conv2) rows 0..2p and H-2p..H-1 of that state */
};
int kvp_cnn_inc_init(struct kvp_cnn_inc *st, const struct kvp_cnn *n, int max_w,
                     struct kvp_err *err);
void kvp_cnn_inc_free(struct kvp_cnn_inc *st);

/* Scores for a history whose generation (count of rows ever appended) is gen. Incremental when
 * st holds the state of generation gen - 1 with the same row count and first column and a width
 * that is equal or one smaller; from scratch otherwise (and when full is true). Either way st then
 * holds generation gen. Returns true when the incremental path ran. */
bool kvp_cnn_forward_inc(const struct kvp_cnn *n, const struct kvp_cnn_input *in, uint64_t gen,
                         bool full, struct kvp_cnn_inc *st, struct kvp_cnn_scratch *s,
                         float *scores);

/* The query channel's feature over a slice of W block bounds in logit units (Quest's bound
 * scaled by 1/√head_dim; traces and qpredictor): out[x] = exp(ub[x] - max ub), in (0, 1], the
 * largest attention weight the bound allows the block relative to the most promising one. A
 * group of query heads combines its rows by max. out may be ub. */
void kvp_qfeat_row(const float *ub, int W, float *out);

/* ---- per-column inference (qpredictor) -------------------------------------------------------
 * The score of column x depends only on the input columns x-2p .. x+2p (receptive field 4p+1
 * = 5 blocks for k = 3), so a prediction needs the CNN only at the columns it ranks. Per column
 * the conv1 values around it and its conv2 column are computed for each row; rows whose input
 * neighbourhood is all zero (no history in the 4p+1 columns, and older than the query row) give
 * one constant conv2 value per edge case, so they cost nothing (docs/methods.md §1.7
 * lever "skip zero history"). Any cin, any k. Equal to kvp_tr_sample's full network on the columns
 * it scores up to float summation order (tested). */
struct kvp_cnn_cols_scratch {
    float *a1;    /* [max_w + 1][H + 2p][c1] conv1 columns in use (rows -p .. H+p-1, the outer
                     ones zero), the last slot all zero (padding columns) */
    int *slot;    /* [max_w] the a1 slot of a slice column, -1: not computed in this call */
    int *used;    /* [max_w] slice columns with a slot */
    float *x;     /* [cp1 · H + max(cin, c1) · k · k] conv1 outputs of a column, one input */
    float *z;     /* [cp2] one conv2 output */
    float *sum;   /* [cp2] */
    float *rb1;   /* [c1] ReLU(b1), conv1 of an all-zero neighbourhood (set at init) */
    float *patch; /* [cin][H + 2p][k] the input columns around one column */
    /* the fast path (kvp_cnn_forward_cols) */
    float *csum;  /* [16][cp2] column sums of a group of candidates */
    float *v2;    /* [16][8][cp2] their conv2 rows */
    int H, max_w;
};
int kvp_cnn_cols_scratch_init(struct kvp_cnn_cols_scratch *s, const struct kvp_cnn *n, int H,
                              int max_w, struct kvp_err *err);
void kvp_cnn_cols_scratch_free(struct kvp_cnn_cols_scratch *s);
#define KVP_CNN_COLS_C2 64 /* the most conv2 channels kvp_cnn_forward_cols takes */
/* scores[i] = the network's score of column cols[i] (0 <= cols[i] < in->W), i < n_cols;
 * in->n_rows <= s->H, W <= s->max_w. Returns how many conv2 rows were computed (the rest were
 * constant), or -1 when n->c2 > KVP_CNN_COLS_C2 (nothing written). */
long kvp_cnn_forward_cols(const struct kvp_cnn *n, const struct kvp_cnn_input *in,
                          const int *cols, int n_cols, struct kvp_cnn_cols_scratch *s,
                          float *scores);
/* The same scores, to the bit, one column and one candidate at a time (conv_rows over a copied
 * patch): the simple form the batched kvp_cnn_forward_cols is tested against. */
long kvp_cnn_forward_cols_ref(const struct kvp_cnn *n, const struct kvp_cnn_input *in,
                              const int *cols, int n_cols, struct kvp_cnn_cols_scratch *s,
                              float *scores);

/* ---- kernel table (internal; cnn_kernel.inc) ---------------------------------------------------
 */

struct kvp_cnn_kernels {
    const char *name;
    /* Pre-activation conv2 output of one row over local columns [0, wt), wt a multiple of 16:
     *   out[co*so + x] = b2[co] + sum_{ci,dy,dx} w2t[((ci*k + dy)*k + dx)*c2 + co]
     *                                            * in[dy][ci*si + x + dx]
     * in[dy] is the conv1 row r - p + dy ([c1][si], local column x at index x + p, zero margins) or
     * NULL for a padding row. */
    void (*conv2_row)(const float *w2t, const float *b2, int c1, int c2, int k,
                      const float *const *in, int si, int wt, float *out, int so);
    /* nrow output positions of a convolution (rows of one column), channels along the vectors,
     * each position's inputs in nx runs of K contiguous values, the runs of position i at
     * x[j] + i·xstride:
     *   v_i[co] = b[co] + Σ_{j<nx} Σ_{t<K} x[j][i·xstride + t]·wt[(j·K + t)·cp + co]
     * for co < cp (a multiple of 16); then out[i·cp + co] = ReLU(v_i[co]), or with accumulate
     * out[co] += Σ_i ReLU(v_i[co]). The positions share every weight load. */
    void (*conv_rows)(const float *wt, const float *b, const float *const *x, int nx, int K,
                      int xstride, int nrow, int cp, float *out, bool accumulate);
    /* conv1 of n_col columns, rows j < R <= 8: history row r at rowp[r], the query row at q
     * (NULL: none), column i's k×k neighbourhood from input column x0[i]; ReLU of row j to
     * out[i] + (j + p)·c1, zeros to the p padding rows either side. The terms of conv_rows in
     * its order, so the same values. */
    void (*conv1_cols)(const float *w1p, const float *b1p, int cp1, int c1, int k, int R,
                       const float *const *rowp, const float *q, const int *x0, int n_col,
                       float *const *out);
    /* conv2 rows r < R <= 8 of n candidates, candidate i's k conv1 columns at col[i·k + dx]
     * ([R + 2p][c1] from row -p); ReLU of row r to out[i] + r·cp2. conv_rows' terms and order. */
    void (*conv2_cands)(const float *w2p, const float *b2p, int cp2, int c1, int k, int R,
                        const float *const *col, int n, float *const *out);
};
extern const struct kvp_cnn_kernels kvp_cnn_kernels_scalar;
extern const struct kvp_cnn_kernels kvp_cnn_kernels_avx2;   /* x86-64 builds only */
extern const struct kvp_cnn_kernels kvp_cnn_kernels_avx512; /* x86-64 builds only */
/* The table this CPU runs best (KVP_SIMD=scalar|avx2 forces one, as for the other kernels). */
const struct kvp_cnn_kernels *kvp_cnn_kernels(void);

#endif
