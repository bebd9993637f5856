/*
 * `pyramidkv` (PyramidKV, Cai et al. 2024; docs/methods.md §3.4): SnapKV's scores and
 * eviction (kvp_snap_compress) with a budget per layer that shrinks with depth, since lower layers
 * attend broadly and upper layers attend to few tokens. With the average budget C (window
 * included), window w, β = 20 and L compressed layers (l = layer - dense_layers):
 *
 *     c = C - w;  min = c // β;  max = 2c - min;
 *     if max >= n - w:  max = n - w,  min = 2c - max;
 *     steps = (max - min) // (L - 1);   layer l keeps max - l·steps positions plus the window.
 *
 * This is KVCache-Factory's formula, over the compressed layers only (upstream compresses every
 * layer; kvpred keeps the first dense_layers dense for every policy), with w read as "the
 * tokens every layer keeps": the window and, in kvpred, the sink (w = sink + max(window,
 * local)), so that the positions the pyramid distributes are exactly the selectable ones and no
 * layer's budget falls below its forced set (which would push the average above C).
 *
 * What kvpred does differently, and why:
 *  - the fallbacks are reported, not hidden (docs/methods.md §8.3 item 3: kvpress silently falls back
 *    to SnapKV budgets): kvp_pyramid_budgets returns KVP_PYRAMID_NONE (n <= C: no
 *    compression), KVP_PYRAMID_FLAT with a reason (n < 2c as upstream, c <= 0, or fewer than two
 *    compressed layers) or KVP_PYRAMID_PYRAMID, and the eval can print it;
 *  - the floor in `steps` makes upstream's average exceed c by up to (L - 2) / 2 tokens; kvpred
 *    trims that excess (evenly, the odd token from the deepest layers) so that the per-layer
 *    budgets average to exactly C and budgets stay comparable across methods (§4);
 *  - the sink is forced inside every layer's budget, as in snapkv; sink = -1 and local = -1
 *    give upstream's rule exactly (w = window).
 */
#include <stdlib.h>

#include "policy/policy.h"

#define PYRAMID_BETA 20

int kvp_pyramid_forced(const struct kvp_policy *p, int n_prompt)
{
    int w = p->p.window < n_prompt ? p->p.window : n_prompt;
    int recent = w > kvp_policy_recent(p) ? w : kvp_policy_recent(p);
    int f = p->p.sink + recent;
    return f < n_prompt ? f : n_prompt;
}

int kvp_pyramid_budgets(int n_prompt, int budget, int forced, int n_layer, int dense_layers,
                        int *caps, const char **reason)
{
    const int lc = n_layer - dense_layers;
    const int w = forced < n_prompt ? forced : n_prompt;
    const int c = budget - w;
    const char *why = NULL;
    int mode = KVP_PYRAMID_FLAT;
    for (int l = 0; l < n_layer; l++)
        caps[l] = l < dense_layers ? n_prompt : budget;
    if (budget >= n_prompt) {
        mode = KVP_PYRAMID_NONE;
        why = "the prompt fits the budget: nothing is compressed";
        for (int l = 0; l < n_layer; l++)
            caps[l] = n_prompt;
    } else if (c <= 0) {
        why = "the budget does not exceed the forced sink and window: flat budgets (SnapKV)";
    } else if (lc < 2) {
        why = "fewer than two compressed layers: flat budgets (SnapKV)";
    } else if (n_prompt < 2 * c) {
        why = "prompt shorter than 2 x (budget - window): flat budgets (SnapKV), as upstream";
    } else {
        int mn = c / PYRAMID_BETA, mx = 2 * c - mn;
        if (mx >= n_prompt - w) {
            mx = n_prompt - w;
            mn = 2 * c - mx;
        }
        int steps = (mx - mn) / (lc - 1);
        long excess = -(long)lc * c;
        for (int i = 0; i < lc; i++)
            excess += mx - i * steps;
        /* trim the floor's excess: excess / lc from every layer, one more from the deepest
         * excess % lc layers, which keeps the budgets non-increasing with depth */
        int q = (int)(excess / lc), r = (int)(excess % lc);
        for (int i = 0; i < lc; i++) {
            int keep = mx - i * steps - q - (i >= lc - r ? 1 : 0);
            caps[dense_layers + i] = (keep > 0 ? keep : 0) + w;
        }
        mode = KVP_PYRAMID_PYRAMID;
    }
    if (reason)
        *reason = why;
    return mode;
}

struct pyramid_state {
    struct kvp_scratch scr;
    int *caps; /* [n_layer] budgets of the current prompt */
};

static int pyramid_init(struct kvp_policy *p, struct kvp_err *err)
{
    struct pyramid_state *s = calloc(1, sizeof(*s));
    if (s)
        s->caps = calloc((size_t)p->env.n_layer, sizeof(int));
    if (!s || !s->caps || kvp_snap_init_scratch(p, &s->scr) < 0) {
        if (s)
            free(s->caps);
        free(s);
        return kvp_err_set(err, KVP_ENOMEM, "pyramidkv: out of memory");
    }
    p->state = s;
    return 0;
}

static void pyramid_free(struct kvp_policy *p)
{
    struct pyramid_state *s = p->state;
    if (!s)
        return;
    kvp_scratch_free(&s->scr);
    free(s->caps);
    free(s);
}

static void pyramid_prefill(struct kvp_policy *p, int layer, const struct kvp_prefill_obs *obs)
{
    struct pyramid_state *s = p->state;
    if (layer < p->p.dense_layers)
        return;
    kvp_pyramid_budgets(obs->n_prompt, kvp_policy_budget(p, obs->n_prompt),
                        kvp_pyramid_forced(p, obs->n_prompt), p->env.n_layer, p->p.dense_layers,
                        s->caps, NULL);
    kvp_snap_compress(p, &s->scr, layer, obs, s->caps[layer]);
}

static void pyramid_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                           struct kvp_sel *sel)
{
    (void)q;
    struct pyramid_state *s = p->state;
    kvp_sel_resident(sel, p->env.kv, layer, kvh, n_tokens, kvp_scratch_m(&s->scr, kvh));
}

const struct kvp_policy_ops kvp_policy_pyramidkv = {
    .name = "pyramidkv",
    .help = "PyramidKV: SnapKV with per-layer budgets shrinking with depth (beta 20)",
    .evicting = true,
    .wants_obs = true,
    .init = pyramid_init,
    .free = pyramid_free,
    .on_prefill = pyramid_prefill,
    .select = pyramid_select,
};
