/* The tiered store's public entry points on a context (kvpred.h, "tiered KV store"). */
#include <stdlib.h>
#include <string.h>

#include "forward/context.h"
#include "store/store.h"

#define TIMELINE_EVENTS (1 << 16) /* about 2 MiB; a few tokens of a deep model fit easily */

int kvp_ctx_store_stats(const kvp_ctx *c, struct kvp_store_stats *stats)
{
    if (!c->store)
        return KVP_EINVAL;
    *stats = c->store->st;
    return 0;
}

void kvp_ctx_store_reset_stats(kvp_ctx *c)
{
    struct kvp_store *s = c->store;
    if (!s)
        return;
    struct kvp_store_stats keep = s->st;
    memset(&s->st, 0, sizeof(s->st));
    s->st.hot_bytes = keep.hot_bytes;
    s->st.cold_bytes = keep.cold_bytes;
    s->st.unit_bytes = keep.unit_bytes;
    s->st.sq_poll = keep.sq_poll;
}

void kvp_ctx_store_timeline(kvp_ctx *c, bool on)
{
    struct kvp_store *s = c->store;
    if (!s)
        return;
    if (on && !s->ev) {
        s->ev = malloc(TIMELINE_EVENTS * sizeof(*s->ev));
        s->ev_cap = s->ev ? TIMELINE_EVENTS : 0;
    }
    if (on)
        s->n_ev = 0;
    s->ev_on = on && s->ev;
}

int kvp_ctx_store_timeline_png(const kvp_ctx *c, const char *path, struct kvp_err *err)
{
    if (!c->store)
        return kvp_err_set(err, KVP_EINVAL, "the context has no tiered KV store");
    return kvp_store_timeline_png(c->store, path, err);
}
