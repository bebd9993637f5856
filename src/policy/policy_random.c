/*
 * `random`: a lower bound for block policies. The forced set and the number of blocks are the
 * block plan every block policy shares (kvp_block_plan: sink, local window from a block
 * boundary, k = floor((budget - forced) / bs) blocks); the k blocks are drawn uniformly at
 * random, without replacement, among the candidate blocks, afresh at every (layer, KV head,
 * step). Nothing is evicted. kvpress's "Random" press is the prompt-time, token-level analogue.
 *
 * Reproducibility: one splitmix64 stream per (layer, KV head), seeded from p.seed, the layer and
 * the KV head, and re-seeded on reset, so a run depends only on the seed and the tokens, never
 * on the thread schedule (select of different KV heads runs on different threads).
 */
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "policy/policy.h"

struct random_state {
    uint64_t *rng; /* [n_layer*n_head_kv] splitmix64 states */
    struct kvp_scratch scr;
};

static void random_reset(struct kvp_policy *p)
{
    struct random_state *s = p->state;
    int n_lh = p->env.n_layer * p->env.n_head_kv;
    for (int i = 0; i < n_lh; i++) {
        uint64_t x = p->p.seed ^ ((uint64_t)(i + 1) * 0xD1B54A32D192ED03ULL);
        s->rng[i] = kvp_splitmix64(&x);
    }
}

static int random_init(struct kvp_policy *p, struct kvp_err *err)
{
    struct random_state *s = calloc(1, sizeof(*s));
    if (s)
        s->rng = calloc((size_t)p->env.n_layer * p->env.n_head_kv, sizeof(uint64_t));
    if (!s || !s->rng || kvp_scratch_init(&s->scr, &p->env, 0) < 0) {
        if (s)
            free(s->rng);
        free(s);
        return kvp_err_set(err, KVP_ENOMEM, "random: out of memory");
    }
    p->state = s;
    random_reset(p);
    return 0;
}

static void random_free(struct kvp_policy *p)
{
    struct random_state *s = p->state;
    if (!s)
        return;
    free(s->rng);
    kvp_scratch_free(&s->scr);
    free(s);
}

static void random_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                          struct kvp_sel *sel)
{
    (void)q;
    struct random_state *s = p->state;
    uint64_t *rng = &s->rng[layer * p->env.n_head_kv + kvh];
    struct kvp_block_plan bp;
    kvp_block_plan(p, n_tokens, &bp);
    float *score = kvp_scratch_f(&s->scr, kvh);
    int *perm = kvp_scratch_i(&s->scr, kvh) + 2 * s->scr.cap; /* past the top-k scratch */
    int n_cand = bp.end - bp.first;
    if (!bp.all && bp.k < n_cand) {
        /* partial Fisher-Yates: the first k entries of perm are a uniform k-subset */
        for (int c = 0; c < n_cand; c++) {
            perm[c] = bp.first + c;
            score[bp.first + c] = 0.0f;
        }
        for (int i = 0; i < bp.k; i++) {
            int j = i + (int)(kvp_splitmix64(rng) % (uint64_t)(n_cand - i));
            int t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
            score[perm[i]] = 1.0f;
        }
    }
    kvp_sel_blocks(&bp, score, n_tokens, p->env.block_size, sel, kvp_scratch_m(&s->scr, kvh),
                   kvp_scratch_i(&s->scr, kvh));
}

const struct kvp_policy_ops kvp_policy_random = {
    .name = "random",
    .block_plan = true,
    .help = "lower bound: sink + local + uniformly random blocks (seeded), nothing evicted",
    .init = random_init,
    .free = random_free,
    .reset = random_reset,
    .select = random_select,
};
