/* Statistics, timeline events and the errors and trust of the tiered store (see store.h; the
 * picture is drawn by timeline.c). */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_internal.h"
#include "kvpred_lab.h"

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

void kvp_store_get_layout(const struct kvp_store *s, struct kvp_store_layout *out)
{
    *out = (struct kvp_store_layout){.unit_bytes = s->unit_bytes,
                                     .ppu = s->ppu,
                                     .max_blocks = s->max_blocks,
                                     .hot = s->hot};
}

void kvp_store_reset_stats(struct kvp_store *s)
{
    struct kvp_store_stats keep = s->st;
    memset(&s->st, 0, sizeof(s->st));
    s->st.hot_bytes = keep.hot_bytes;
    s->st.cold_bytes = keep.cold_bytes;
    s->st.unit_bytes = keep.unit_bytes;
    s->st.stored_layers = keep.stored_layers;
    s->st.windowed_layers = keep.windowed_layers;
    s->st.sq_poll = keep.sq_poll;
    s->st.disk_io = keep.disk_io;
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

int kvp_store_events(const struct kvp_store *s, const struct kvp_store_event **ev)
{
    *ev = s->ev;
    return s->ev ? s->n_ev : 0;
}

void kvp_store_set_note(struct kvp_store *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err_msg, sizeof(s->err_msg), fmt, ap);
    va_end(ap);
    s->err_code = KVP_EIO;
}

void kvp_store_lose(struct kvp_store *s, int layer, int b0, int n, const char *why)
{
    for (int b = b0; b < b0 + n; b++) {
        uint8_t *st = &s->unit_state[(size_t)layer * s->max_blocks + b];
        s->st.lost_units += *st != KVP_UNIT_LOST;
        *st = KVP_UNIT_LOST;
    }
    int from = b0 * s->bs;
    if (s->call_pos0 >= 0 && s->call_pos0 < from)
        from = s->call_pos0;
    if (from < s->trust_from) {
        s->trust_from = from;
        snprintf(s->trust_msg, sizeof(s->trust_msg), "%s", why);
    }
    if (!s->fail_code) {
        s->fail_code = KVP_EKVLOST;
        snprintf(s->fail_msg, sizeof(s->fail_msg), "%s", why);
    }
}

void kvp_store_unit_lost(struct kvp_store *s, int layer, int b, const char *why)
{
    char line[384];
    snprintf(line, sizeof(line), "KV store: unit of layer %d block %d lost: %s", layer, b, why);
    kvp_store_lose(s, layer, b, 1, line);
}

int kvp_store_trusted_tokens(const struct kvp_store *s, int n)
{
    return s->trust_from < n ? s->trust_from : n;
}

int kvp_store_check(const struct kvp_store *s, struct kvp_err *err)
{
    if (s->trust_from == INT_MAX)
        return 0;
    return kvp_err_set(err, KVP_EKVLOST,
                       "the KV cache is not trusted from token %d on (%s); reset the context "
                       "or truncate it to %d tokens",
                       s->trust_from, s->trust_msg, s->trust_from);
}

int kvp_store_take_error(struct kvp_store *s, struct kvp_err *err)
{
    int code = 0;
    if (s->fail_code)
        code = kvp_err_set(err, s->fail_code, "%s; the KV cache is not trusted from token %d on "
                           "(reset the context or truncate it to %d tokens)", s->fail_msg,
                           s->trust_from, s->trust_from);
    else if (s->trust_from != INT_MAX)
        code = kvp_store_check(s, err);
    else if (s->err_code && s->call_pos0 < 0)
        code = kvp_err_set(err, s->err_code, "%s", s->err_msg);
    s->fail_code = 0;
    s->err_code = 0;
    return code;
}
