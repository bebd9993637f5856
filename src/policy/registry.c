/* The policy registry: one line per policy. */
#include <string.h>

#include "policy/policy.h"

extern const struct kvp_policy_ops kvp_policy_full;
extern const struct kvp_policy_ops kvp_policy_streaming;
extern const struct kvp_policy_ops kvp_policy_h2o;
extern const struct kvp_policy_ops kvp_policy_snapkv;
extern const struct kvp_policy_ops kvp_policy_pyramidkv;
extern const struct kvp_policy_ops kvp_policy_quest;
extern const struct kvp_policy_ops kvp_policy_oracle;
extern const struct kvp_policy_ops kvp_policy_oracle_token;
extern const struct kvp_policy_ops kvp_policy_random;
extern const struct kvp_policy_ops kvp_policy_catekv;
extern const struct kvp_policy_ops kvp_policy_predictor;
extern const struct kvp_policy_ops kvp_policy_qpredictor;

const struct kvp_policy_ops *const kvp_policy_registry[] = {
    &kvp_policy_full,
    &kvp_policy_streaming,
    &kvp_policy_h2o,
    &kvp_policy_snapkv,
    &kvp_policy_pyramidkv,
    &kvp_policy_quest,
    &kvp_policy_oracle,
    &kvp_policy_oracle_token,
    &kvp_policy_random,
    &kvp_policy_catekv,
    &kvp_policy_predictor,
    &kvp_policy_qpredictor,
    NULL,
};

const struct kvp_policy_ops *kvp_policy_find(const char *name)
{
    for (int i = 0; kvp_policy_registry[i]; i++)
        if (!strcmp(kvp_policy_registry[i]->name, name))
            return kvp_policy_registry[i];
    return NULL;
}

const char *kvp_policy_name(int i)
{
    for (int k = 0; kvp_policy_registry[k]; k++)
        if (k == i)
            return kvp_policy_registry[k]->name;
    return NULL;
}
