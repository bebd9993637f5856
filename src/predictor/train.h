/*
 * Training the AttentionPredictor CNN in C (docs/methods.md §1.8): layer-wise forward and
 * backward passes written by hand (conv via im2col and OpenBLAS sgemm), two losses, Adam, and the
 * training loop over an attention trace (trace.h) with a validation split by sequence.
 *
 * Losses, per sample with the CNN slice's W columns, scores y:
 *   MSE (the paper):  L = 1/W · Σ_x (y_x − m_x)²        m = next row, block max (history units)
 *   CE (ranking):     L = −Σ_x p_x · log softmax(y)_x    p = next row's block sums over the slice,
 *                                                       normalised: the attention distribution
 *                                                       the selection has to cover
 * CE only cares about the ranking-relevant part (a shift of all scores changes nothing) and
 * weights blocks by the mass they would recover, which is what the policy is judged on.
 *
 * Validation measures what the policy is for: for each token budget B, the recovery of the top-k
 * predicted blocks (k from B after sink and the block-aligned local window,
 * docs/methods.md §1.4) plus the forced sink and local mass, relative to the oracle that
 * takes the top-k blocks by true mass (mean R_pred / mean R_oracle). Histories in training and
 * validation are dense rows.
 */
#ifndef KVP_PREDICTOR_TRAIN_H
#define KVP_PREDICTOR_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "predictor/cnn.h"
#include "predictor/trace.h"

/* ---- layers (row-major, [channels][H][W]) -------------------------------------------------- */

/* k×k convolution, stride 1, zero padding k/2, PyTorch cross-correlation: in [ci][H][W] ->
 * out [co][H][W]; w [co][ci][k][k], b [co]. col receives im2col(in) ([ci·k·k][H·W]). */
void kvp_tr_conv_fwd(const float *in, int ci, int H, int W, const float *w, const float *b, int co,
                     int k, float *col, float *out);
/* Backward of kvp_tr_conv_fwd given its col and dout [co][H][W]: gw += dout·colᵀ, gb += Σ dout,
 * and din = dL/din ([ci][H][W], overwritten) when din is not NULL (dcol: [ci·k·k][H·W] scratch). */
void kvp_tr_conv_bwd(const float *col, const float *dout, int ci, int H, int W, const float *w,
                     int co, int k, float *gw, float *gb, float *dcol, float *din);
void kvp_tr_relu_fwd(float *x, size_t n);                  /* in place */
void kvp_tr_relu_bwd(const float *y, float *dy, size_t n); /* dy *= (y > 0) */
/* Mean over the H rows: a [c][H][W] -> p [c][W]; backward spreads dp/H over the rows. */
void kvp_tr_mean_fwd(const float *a, int c, int H, int W, float *p);
void kvp_tr_mean_bwd(const float *dp, int c, int H, int W, float *da);
/* Pointwise conv c -> 1: y[x] = b + Σ_c w[c]·p[c][x]; backward accumulates gw, gb, writes dp. */
void kvp_tr_point_fwd(const float *p, int c, int W, const float *w, float b, float *y);
void kvp_tr_point_bwd(const float *p, const float *dy, int c, int W, const float *w, float *gw,
                      float *gb, float *dp);
/* Loss of scores y against the target row (max m and sums s over the slice); dy receives dL/dy.
 * CE returns 0 with dy = 0 when the slice holds no attention. */
float kvp_tr_loss(int loss, const float *y, const float *m, const float *s, int W, float *dy);

/* Work space for one sample of up to H × max_w (n->cin input channels). */
struct kvp_tr_ws {
    int H, max_w;
    float *col1, *a1, *col2, *a2, *p, *y, *dy, *dp, *da2, *dcol2, *da1;
};
int kvp_tr_ws_init(struct kvp_tr_ws *ws, const struct kvp_cnn *n, int H, int max_w,
                   struct kvp_err *err);
void kvp_tr_ws_free(struct kvp_tr_ws *ws);

/* Forward (and backward when grad is not NULL, accumulating into grad, laid out like
 * n->params) of one sample x [n->cin][H][W]; scores in ws->y. Returns the loss. This is the full
 * network the per-column inference is tested against. */
float kvp_tr_sample(const struct kvp_cnn *n, struct kvp_tr_ws *ws, const float *x, int H, int W,
                    const float *m, const float *s, int loss, float *grad);

/* ---- the training loop ---------------------------------------------------------------------- */

struct kvp_predtrain_opts {
    int c1, c2, k, H; /* architecture [16, 32, 3, 64] */
    int cin;          /* input channels [1]; 2 adds the query's bound feature (needs a version 2
                         trace), see kvp_qfeat_row */
    int group;        /* 1: one sample per (layer, KV head), the group's rows pooled as the
                         qpredictor policy pools them (history and target max, bounds as
                         features max, masses mean) [0] */
    int sparse;       /* 1: history rows as a policy reads them: each keeps only its best
                         K blocks by mass (K a random 1/20 .. 1/5 of the slice), renormalised
                         over what is kept with the sink and local window [0] */
    int tail;         /* > 0: a fraction tail_frac of the training samples are steps of a
                         sequence's last `tail` positions (a retrieval trace's answers), with
                         dense histories, and validation reports those steps apart too [0] */
    float tail_frac;  /* [0.5] */
    int extra;        /* validation: candidates beyond k by the query channel, as qpredictor's
                         option extra [16] */
    int loss;         /* enum kvp_cnn_loss */
    int epochs;       /* [4] */
    int batch;        /* samples per Adam step [32] */
    int samples;      /* training samples drawn per epoch [20000] */
    int val_samples;  /* validation samples [4000] */
    float lr;         /* Adam learning rate, decayed linearly to lr/10 [1e-3] */
    float val_frac;   /* fraction of the sequences held out (the last ones) [0.1] */
    uint64_t seed;    /* [1] */
    int sink, local;  /* the slice the policy gives the CNN [16, 16] */
    int n_budgets;    /* validation budgets [3: 32, 64, 128] */
    int budgets[KVP_CNN_MAX_REC];
    /* called after every Adam step (may be NULL) */
    void (*progress)(void *user, int epoch, long step, long steps, double loss);
    void *user;
};

struct kvp_predtrain_report {
    long n_train_samples, n_val_samples; /* available samples in the two splits */
    double train_loss, val_loss;         /* last epoch's mean, validation mean */
    int n_budgets;
    int budgets[KVP_CNN_MAX_REC];
    double rec_pred[KVP_CNN_MAX_REC];   /* mean recovery of the predicted selection */
    double rec_oracle[KVP_CNN_MAX_REC]; /* mean recovery of the block oracle */
    double rec_last[KVP_CNN_MAX_REC];   /* mean recovery when ranking by the newest row */
    double rec_recent[KVP_CNN_MAX_REC]; /* mean recovery when taking the newest blocks */
    double rec_query[KVP_CNN_MAX_REC];  /* mean recovery ranking by the query channel (Quest's
                                           bound; 0 without that channel) */
    double rec_pruned[KVP_CNN_MAX_REC]; /* the policy's pruned selection: the predicted best
                                           among the k + extra best by the query channel */
    double rel[KVP_CNN_MAX_REC];        /* rec_pred / rec_oracle */
    struct {                            /* the same at answer steps (o->tail > 0: one step of a
                                           sequence's last `tail` positions per validation
                                           sample, dense history), what retrieval is judged on */
        long n;
        double rec_pred[KVP_CNN_MAX_REC], rec_oracle[KVP_CNN_MAX_REC], rec_last[KVP_CNN_MAX_REC];
        double rec_recent[KVP_CNN_MAX_REC], rec_query[KVP_CNN_MAX_REC];
        double rec_pruned[KVP_CNN_MAX_REC], rel[KVP_CNN_MAX_REC];
    } tail;
};

/* Fill unset fields of o with the defaults above. */
void kvp_predtrain_opts_default(struct kvp_predtrain_opts *o);

/* Train a new network on tr (o as filled by kvp_predtrain_opts_default, then adjusted). out receives
 * the network with its metadata; rep the final numbers. */
int kvp_predictor_train(const struct kvp_trace *tr, const struct kvp_predtrain_opts *o,
                        struct kvp_cnn *out, struct kvp_predtrain_report *rep, struct kvp_err *err);

/* Validation only: recovery of n on the held-out split of tr. */
int kvp_predictor_validate(const struct kvp_trace *tr, const struct kvp_cnn *n,
                           const struct kvp_predtrain_opts *o, struct kvp_predtrain_report *rep,
                           struct kvp_err *err);

#endif
