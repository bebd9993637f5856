/* CateKV on a running context (the policy's own calls are in policy/catekv_profile.h). */
#ifndef KVP_FORWARD_CATEKV_CTX_H
#define KVP_FORWARD_CATEKV_CTX_H

#include <stdint.h>

#include "core/err.h"
#include "kvpred.h"

/* Evaluate one reference sample on a context whose policy is a dynamic catekv (set with
 * kvp_ctx_set_policy): reset the context, prefill tokens[0..n), copy the CVs into cv. */
int kvp_catekv_sample_cv(kvp_ctx *ctx, const int32_t *tokens, int n, double *cv,
                         struct kvp_err *err);

/* Classes of the context's catekv policy after a prompt (see kvp_catekv_policy_classes). */
int kvp_catekv_ctx_classes(const kvp_ctx *ctx, uint8_t *adaptive);

#endif
