/*
 * The RAM cold tier (cold.h): the cold units are plain memory behind the hot slots, and a
 * transfer thread copies queued records in order, so the decode thread never copies a read
 * itself. An optional link model (kvp_ctx_params.link_gbps, link_latency_us) holds each
 * completion back as a serial link of that bandwidth and latency would.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/platform.h"
#include "store/store_internal.h"
#include "store/xfer_queue.h"

struct ram_io {
    pthread_t thread;
    bool thread_on;
    struct kvp_xfer_queue q;
    double link_bps;  /* bytes per second of the modelled link (0: off) */
    double link_lat;  /* seconds of latency per transfer */
    double link_free; /* the modelled link is busy until then */
    struct kvp_store *s;
};

/* Sleep (then spin for the last stretch) until the monotonic time t. */
static void sleep_until(double t)
{
    for (;;) {
        double left = t - kvp_time_now();
        if (left <= 0)
            return;
        if (left > 200e-6) {
            double d = left - 100e-6;
            struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - (time_t)d) * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
}

/* The thread copies queued records in order. With a link model, a record occupies the link for
 * bytes/bandwidth from max(submit, link free) and completes one latency later; transfers are
 * pipelined, so latency is paid once per transfer but not serialised. */
static void *ram_thread(void *arg)
{
    struct ram_io *r = arg;
    struct kvp_store *s = r->s;
    int id;
    while ((id = kvp_xq_pop(&r->q)) >= 0) {
        struct kvp_store_xfer *x = &s->xfer[id];
        size_t bytes = (size_t)x->n * s->unit_bytes;
        uint8_t *hot = slot_ptr(s, x->s0), *cold = s->cold + cold_off(s, x->layer, x->b0);
        if (x->write)
            memcpy(cold, hot, bytes);
        else
            memcpy(hot, cold, bytes);
        if (r->link_bps > 0) {
            double start = x->t_submit > r->link_free ? x->t_submit : r->link_free;
            r->link_free = start + (double)bytes / r->link_bps;
            sleep_until(r->link_free + r->link_lat);
        }
        kvp_xq_finish(&r->q, s, id, (int)bytes, kvp_time_now());
    }
    return NULL;
}

static int ram_open(struct kvp_store *s, const struct kvp_ctx_params *p, struct kvp_err *err)
{
    struct ram_io *r = calloc(1, sizeof(*r));
    if (!r)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    r->s = s;
    r->link_bps = p->link_gbps * 1e9;
    r->link_lat = p->link_latency_us * 1e-6;
    kvp_xq_init(&r->q);
    s->io_state = r;
    /* the cold units live behind the hot slots, in the same allocation (configure) */
    if (pthread_create(&r->thread, NULL, ram_thread, r) != 0)
        return kvp_err_set(err, KVP_ENOMEM, "cannot start the KV transfer thread");
    r->thread_on = true;
    return 0;
}

static void ram_close(struct kvp_store *s)
{
    struct ram_io *r = s->io_state;
    if (!r)
        return;
    if (r->thread_on) {
        kvp_xq_stop(&r->q);
        pthread_join(r->thread, NULL);
    }
    kvp_xq_destroy(&r->q);
    free(r);
    s->io_state = NULL;
}

static void ram_submit(struct kvp_store *s, int id)
{
    kvp_xq_push(&((struct ram_io *)s->io_state)->q, id);
}

static void ram_flush(struct kvp_store *s)
{
    (void)s; /* the thread picks every record up as it is queued */
}

static int ram_reap(struct kvp_store *s)
{
    return kvp_xq_collect(&((struct ram_io *)s->io_state)->q, s, false);
}

static int ram_wait(struct kvp_store *s)
{
    return kvp_xq_collect(&((struct ram_io *)s->io_state)->q, s, true);
}

const struct kvp_cold_ops kvp_cold_ram = {
    .name = "ram",
    .in_memory = true,
    .slow_requests = false,
    .open = ram_open,
    .close = ram_close,
    .submit = ram_submit,
    .flush = ram_flush,
    .reap = ram_reap,
    .wait = ram_wait,
};
