/* CateKV on a running context (see catekv_ctx.h). */
#include "forward/catekv_ctx.h"

#include "forward/context_internal.h"
#include "policy/catekv_profile.h"

int kvp_catekv_sample_cv(kvp_ctx *ctx, const int32_t *tokens, int n, double *cv,
                         struct kvp_err *err)
{
    if (!ctx->pol.p)
        return kvp_err_set(err, KVP_EINVAL, "catekv CVs: the context has no policy");
    kvp_ctx_reset(ctx);
    int rc = kvp_eval(ctx, tokens, n, NULL, false, err);
    if (rc < 0)
        return rc;
    return kvp_catekv_policy_cvs(ctx->pol.p, cv, err);
}

int kvp_catekv_ctx_classes(const kvp_ctx *ctx, uint8_t *adaptive)
{
    return kvp_catekv_policy_classes(ctx->pol.p, adaptive);
}
