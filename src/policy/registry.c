/* The policy registry: one line per policy. */
#include <string.h>

#include "policy/policy.h"

extern const struct kvp_policy_ops kvp_policy_full;
extern const struct kvp_policy_ops kvp_policy_streaming;
extern const struct kvp_policy_ops kvp_policy_catekv;

const struct kvp_policy_ops *const kvp_policy_registry[] = {
    &kvp_policy_full,
    &kvp_policy_streaming,
    &kvp_policy_catekv,
    NULL,
};

const struct kvp_policy_ops *kvp_policy_find(const char *name)
{
    for (int i = 0; kvp_policy_registry[i]; i++)
        if (!strcmp(kvp_policy_registry[i]->name, name))
            return kvp_policy_registry[i];
    return NULL;
}
