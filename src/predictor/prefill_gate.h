/*
 * The learned gate of block-sparse prefill (docs/prefill.md, `--prefill-policy learned`): for a
 * block of queries and one query head, one logit per earlier key block, linear in its weights
 * (so training is convex) and computed from statistics the prefill already keeps:
 *
 *   z_u = Σ_d a_d q̄_d k̄_ud + Σ_d b_d q̄⁺_d M_ud + Σ_d c_d q̄⁻_d m_ud + w_0 ln(1 + d_u) + w_1/(1 + d_u)
 *
 * q̄ the block's mean query (q̄⁺, q̄⁻ its positive and negative parts), k̄_u, M_u, m_u key block u's
 * mean key and element-wise max and min, d_u the distance in key blocks from u to the query
 * block. a = 1/√head_dim and the rest 0 is the `pooled` estimate, b = c = 1/√head_dim quest's bound:
 * the gate learns a per-dimension mix of both and a distance prior, per (layer, KV head). Like
 * SeerAttention's gate it is trained by self-distillation on the model's own block-pooled prefill
 * attention (here each key block's share of the query block's dense attention, the quantity the
 * recovery counts), with a softmax cross-entropy over the blocks the estimate chooses among.
 *
 * At run time the three sums are one product of [a∘q̄, b∘q̄⁺, c∘q̄⁻] with the block's [k̄, M, m]:
 * three times `pooled`'s product and statistics.
 *
 * The file (.kvpg, little-endian, docs/formats.md):
 *   char[8]  magic "KVPGATE1"
 *   u32      version (1)
 *   u32      n_layer, n_head_kv, head_dim, block (tokens per key block), n_pos (2)
 *   u64      seed, n_train (training items), n_val (validation items)
 *   char[64] model name (NUL padded)
 *   f32      budget (the fraction the validation recovery was measured at)
 *   n_layer × (f32 recovery of the gate, f32 recovery of pooled) on the validation items
 *   u32      n_params = n_layer · n_head_kv · (3 head_dim + n_pos), then n_params × f32:
 *            per (layer, KV head) a[head_dim], b[head_dim], c[head_dim], w[n_pos]
 *   u64      FNV-1a 64 of every byte before it
 * Anything else is refused with KVP_EFORMAT and one line naming the problem.
 */
#ifndef KVP_PREDICTOR_PREFILL_GATE_H
#define KVP_PREDICTOR_PREFILL_GATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

#define KVP_PGATE_NPOS 2       /* distance features: ln(1 + d), 1/(1 + d) */
#define KVP_PGATE_MAX_LAYER 1024
#define KVP_PGATE_MAX_KV 256
#define KVP_PGATE_MAX_HD 1024

struct kvp_pgate {
    int n_layer, n_kv, hd, block;
    int nw;         /* weights per (layer, KV head): 3 hd + KVP_PGATE_NPOS */
    float *w;       /* [n_layer][n_kv][nw] (owned) */
    float *rec;     /* [n_layer][2]: validation recovery of the gate and of pooled (owned) */
    char model[64];
    uint64_t seed, n_train, n_val;
    float budget;
};

/* A gate with pooled's weights (a = 1/√hd, the rest 0) and no recovery recorded. */
int kvp_pgate_init(struct kvp_pgate *g, int n_layer, int n_kv, int hd, int block,
                   struct kvp_err *err);
void kvp_pgate_free(struct kvp_pgate *g); /* accepts a zeroed struct */
int kvp_pgate_copy(struct kvp_pgate *dst, const struct kvp_pgate *src, struct kvp_err *err);
static inline float *kvp_pgate_w(const struct kvp_pgate *g, int l, int kvh)
{
    return g->w + ((size_t)l * g->n_kv + kvh) * g->nw;
}

int kvp_pgate_save(const struct kvp_pgate *g, const char *path, struct kvp_err *err);
int kvp_pgate_load(const char *path, struct kvp_pgate *g, struct kvp_err *err);
int kvp_pgate_parse(const void *data, size_t size, struct kvp_pgate *g, struct kvp_err *err);

/* The gate's query vector of one head: out[3 hd] = [a∘q̄, b∘q̄⁺, c∘q̄⁻], to be multiplied with a
 * key block's statistics [k̄, M, m]. */
void kvp_pgate_query(const struct kvp_pgate *g, int l, int kvh, const float *qbar, float *out);
/* The distance prior of key block u, d blocks before the query block. */
float kvp_pgate_prior(const struct kvp_pgate *g, int l, int kvh, int d);

/* ---- training ------------------------------------------------------------------------------
 * One item: a (layer, KV head, query block) whose candidate blocks (neither sink nor window) the
 * estimate ranks, with each head's dense attention share on each candidate (the target), the
 * block statistics of the candidates, and how many of them the budget picks. */
struct kvp_pgate_item {
    int l, kvh, n_cand, n_pick;
    float *qbar;   /* [g][hd] */
    float *st;     /* [n_cand][3 hd] */
    int32_t *d;    /* [n_cand] distance in blocks */
    float *lncnt;  /* [n_cand] ln(keys in the block) */
    float *target; /* [g][n_cand] the head's dense attention share of the candidate */
};

struct kvp_pgate_set {
    int g, hd;
    size_t n, cap;
    struct kvp_pgate_item *it;
};

void kvp_pgate_set_free(struct kvp_pgate_set *s);
/* Add an item from a prefill's choice (copies): U key blocks, forced[u] marks the sink's and the
 * window's, stats [U][3 hd], mass [g][U] each head's dense share per block, cnt the keys of each
 * block: all but the last hold `block`, the last n_keys - (U-1)·block; qu the query block's
 * index in key blocks. Items with no candidate are skipped. */
int kvp_pgate_set_add(struct kvp_pgate_set *s, int l, int kvh, int qu, int U, int n_keys,
                      int block, const uint8_t *forced, int n_pick, const float *qbar,
                      const float *stats, const float *mass, struct kvp_err *err);

struct kvp_pgate_fit_opts {
    int iters;    /* full-batch Adam steps [300] */
    float lr;     /* [0.01] */
    float l2;     /* pull toward pooled's weights [1e-3] */
};

/* Recovery of the choice g makes on the items (the mean over items and heads of the target
 * share of the picked candidates plus the forced blocks' share), per layer into rec[l] (NULL
 * entries for layers without items: -1). */
void kvp_pgate_recovery(const struct kvp_pgate *g, const struct kvp_pgate_set *s, double *rec);

/* Fit every (layer, KV head)'s weights to the training items, from g's current weights.
 * Returns the final mean loss in *loss (may be NULL). */
int kvp_pgate_fit(struct kvp_pgate *g, const struct kvp_pgate_set *train,
                  const struct kvp_pgate_fit_opts *o, double *loss, struct kvp_err *err);

#endif
