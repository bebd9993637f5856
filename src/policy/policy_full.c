/*
 * `full`: every cached token, every step. The reference every other policy is measured against;
 * it runs through the same sparse path as the others (selecting every block), which must
 * reproduce the dense kernel's result.
 */
#include "policy/policy.h"

static void full_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                        struct kvp_sel *sel)
{
    (void)layer, (void)kvh, (void)q;
    kvp_sel_all(sel, n_tokens, p->env.block_size);
}

const struct kvp_policy_ops kvp_policy_full = {
    .name = "full",
    .help = "the whole cache at every step (the reference)",
    .select = full_select,
};
