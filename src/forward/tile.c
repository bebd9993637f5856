/*
 * Long caches without a long prefill (kvp_ctx_fill_tile, kvpred.h).
 *
 * Measuring decode at 128K tokens needs a cache of 128K tokens, and a real prefill of that many
 * costs minutes to hours on a CPU (attention is quadratic). Random keys would make the selection
 * policies' job meaningless: real keys have per-dimension scales, outlier channels, a rotation
 * that depends on the position, and blocks whose bounds differ. So the cache is filled from a
 * prompt that was prefilled for real: positions m.. copy the keys and values of the prompt's
 * positions [bs, m) over and over (the first block, which holds BOS and the attention sink, is
 * not repeated), and each copied key is turned from its source position s to its new position p.
 *
 * Keys are cached after RoPE: k_s = R(s) k with R(x) the rotation of every pair (NORM: (2i,
 * 2i+1); NEOX: (i, i + hd/2)) by x * inv_freq[i]. Angles are linear in the position (linear
 * scaling and rope_freqs factors are folded into inv_freq), so R(p) R(s)^-1 = R(p - s) and
 * R(p - s) k_s = R(p) k: the key the same head would cache for the same content at p. With a
 * tile of L = m - bs tokens, p - s is the same L * (tile index + 1) for every position of a tile,
 * so each tile needs one set of angles. The rotation runs in double from the cached (rounded)
 * source key, then the result is rounded to the cache's type once more: a tiled key is RoPE(p)
 * of the source's stored key within one rounding of the cache type (tests/test_tile.c).
 * Values carry no position and are copied bit for bit.
 *
 * The policy sees the filled cache as the end of a prompt of n tokens (on_prefill per layer, no
 * observation window, no new last query), the way kvp_seq_copy shows it a copied cache: quest
 * and the predictors rebuild their block metadata over all n tokens there. A policy that wants
 * attention rows of the prompt sees none; a caller that wants them (qpredictor's history, a real
 * last query) evaluates a few real tokens after the fill. Evicting policies and those that need
 * the prompt's attention column sums are refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "forward/context_internal.h"
#include "forward/kv_step.h"
#include "forward/sparse_prefill.h"
#include "policy/host.h"
#include "policy/policy.h"
#include "store/store.h"

/* cs[2i], cs[2i+1]: cos and sin of the angle of pair i for a rotation by `delta` positions. */
static void tile_angles(const double *inv_freq, int hd, long delta, double *cs)
{
    for (int i = 0; i < hd / 2; i++) {
        double th = (double)delta * inv_freq[i];
        cs[2 * i] = cos(th);
        cs[2 * i + 1] = sin(th);
    }
}

/* Rotate column t of the f32 key block kb ([hd][bs]) by cs into out[hd]. */
static void tile_rotate(const float *kb, int bs, int t, int hd, int style, const double *cs,
                        float *out)
{
    const int stride = style == KVP_ROPE_NEOX ? 1 : 2; /* distance between pair starts */
    const int other = style == KVP_ROPE_NEOX ? hd / 2 : 1; /* offset of the pair's second */
    for (int i = 0; i < hd / 2; i++) {
        int a = i * stride, b = a + other;
        double x0 = kb[(size_t)a * bs + t], x1 = kb[(size_t)b * bs + t];
        out[a] = (float)(x0 * cs[2 * i] - x1 * cs[2 * i + 1]);
        out[b] = (float)(x0 * cs[2 * i + 1] + x1 * cs[2 * i]);
    }
}

static int tile_check(const struct kvp_ctx *c, int n, struct kvp_err *err)
{
    const int m = c->n_tokens, bs = c->kv.block_size;
    if (m < 2 * bs)
        return kvp_err_set(err, KVP_EINVAL,
                           "tiling needs a prefilled prompt of at least two blocks (%d tokens), "
                           "the cache holds %d",
                           2 * bs, m);
    if (n < m || n > c->n_ctx)
        return kvp_err_set(err, KVP_ERANGE, "tiling %d tokens to %d in a context of %d", m, n,
                           c->n_ctx);
    const struct kvp_policy *p = c->pol.p;
    if (p && (p->ops->evicting || p->ops->wants_colsum))
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "tiling: policy '%s' evicts or needs the prompt's attention, which a "
                           "tiled cache does not have",
                           p->ops->name);
    for (int i = 0; i < c->kv.n_layer * c->kv.n_head_kv; i++)
        if (c->kv.n_evicted[i] > 0 || c->kv.released[i] > 0)
            return kvp_err_set(err, KVP_EUNSUPPORTED, "tiling a cache with evicted tokens");
    return kvp_kv_check(c, err); /* nothing untrusted is repeated */
}

int kvp_ctx_fill_tile(kvp_ctx *c, int n, struct kvp_err *err)
{
    if (!c)
        return kvp_err_set(err, KVP_EINVAL, "no context");
    int rc = tile_check(c, n, err);
    if (rc < 0 || n == c->n_tokens)
        return rc;
    const struct kvp_kvcache *kv = &c->kv;
    const int m = c->n_tokens, bs = kv->block_size, hd = kv->head_dim;
    const int L = m - bs; /* tile length: source positions [bs, m) */
    if ((rc = kvp_kv_reserve(c, n - m, err)) < 0)
        return rc;
    float *kb = malloc((size_t)hd * bs * sizeof(float)); /* one source key block as f32 */
    float *kr = malloc((size_t)hd * sizeof(float));      /* one rotated key */
    double *cs = malloc((size_t)hd * sizeof(double));    /* a tile's angles */
    if (!kb || !kr || !cs) {
        free(kb), free(kr), free(cs);
        return kvp_err_set(err, KVP_ENOMEM, "tiling: out of memory");
    }
    for (int l = 0; l < kv->n_layer; l++) {
        /* a tiered layer is read and written through the store's staging area, as a prompt's */
        if (c->store)
            kvp_store_prefill_begin(c->store, l, m, n);
        for (int h = 0; h < kv->n_head_kv; h++) {
            int src_blk = -1;
            long tile = -1;
            for (int p = m; p < n; p++) {
                long q = (p - m) / L;
                int s = bs + (p - m) % L;
                if (q != tile) {
                    tile = q;
                    tile_angles(c->sh->inv_freq, hd, (long)L * (q + 1), cs);
                }
                const uint8_t *sk = kvp_kvcache_kblock(kv, l, h, s / bs);
                if (s / bs != src_blk) {
                    src_blk = s / bs;
                    int held = m - src_blk * bs; /* source tokens in it (the last may be part) */
                    kv->kk->k_rows(sk, hd, bs, held < bs ? held : bs, kb, (size_t)bs);
                }
                tile_rotate(kb, bs, s % bs, hd, c->hp.rope_style, cs, kr);
                kv->kk->put_k(kr, kvp_kvcache_kblock(kv, l, h, p / bs), hd, bs, p % bs);
                kvp_kv_copy_value(kv->type_v, hd, bs, kvp_kvcache_vblock(kv, l, h, s / bs),
                                  s % bs, kvp_kvcache_vblock(kv, l, h, p / bs), p % bs);
            }
        }
        /* the filled layer is the end of a prompt of n tokens for the policy (its metadata) */
        struct kvp_prefill_obs ob = {.n_prompt = n};
        if (c->pol.p && c->pol.p->ops->on_prefill)
            kvp_policy_on_prefill(&c->pol, l, &ob);
        if (c->store)
            kvp_store_prefill_end(c->store, l, m, n, NULL, 0);
    }
    free(kb), free(kr), free(cs);
    kvp_ctx_tokens_set(c, n);
    kvp_spf_forget(c->spf, 0);
    if (c->store && (rc = kvp_store_take_error(c->store, err)) < 0)
        return rc;
    return 0;
}
