/* Statistics, timeline events and the sticky error of the tiered store (see store.h; the
 * picture is drawn by timeline.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"

#define TIMELINE_EVENTS (1 << 16) /* about 2 MiB; a few tokens of a deep model fit easily */

void kvp_store_note(struct kvp_store *s, int kind, int layer, double t0, double t1)
{
    if (kind == KVP_EV_PREDICT)
        s->st.predict_s += t1 - t0;
    if (!s->ev_on || s->n_ev >= s->ev_cap)
        return;
    s->ev[s->n_ev++] = (struct kvp_store_event){.kind = kind, .layer = layer, .t0 = t0, .t1 = t1};
}

void kvp_store_get_stats(const struct kvp_store *s, struct kvp_store_stats *out)
{
    *out = s->st;
}

void kvp_store_reset_stats(struct kvp_store *s)
{
    struct kvp_store_stats keep = s->st;
    memset(&s->st, 0, sizeof(s->st));
    s->st.hot_bytes = keep.hot_bytes;
    s->st.cold_bytes = keep.cold_bytes;
    s->st.unit_bytes = keep.unit_bytes;
    s->st.sq_poll = keep.sq_poll;
}

void kvp_store_record_timeline(struct kvp_store *s, bool on)
{
    if (on && !s->ev) {
        s->ev = malloc(TIMELINE_EVENTS * sizeof(*s->ev));
        s->ev_cap = s->ev ? TIMELINE_EVENTS : 0;
    }
    if (on)
        s->n_ev = 0;
    s->ev_on = on && s->ev;
}

void kvp_store_set_error(struct kvp_store *s, int code, const char *fmt, const char *what,
                         int layer, int b0, int n, const char *why)
{
    if (s->err_code)
        return;
    s->err_code = code;
    snprintf(s->err_msg, sizeof(s->err_msg), fmt, what, layer, b0, b0 + n - 1, why);
}

int kvp_store_take_error(struct kvp_store *s, struct kvp_err *err)
{
    if (!s->err_code)
        return 0;
    int code = kvp_err_set(err, s->err_code, "%s", s->err_msg);
    s->err_code = 0;
    return code;
}
