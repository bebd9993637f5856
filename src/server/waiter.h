/*
 * Connections parked while their answer is not ready. libmicrohttpd runs every connection on a
 * few event-driven threads (http.c), so a request may not block one of them while it waits for a
 * slot, its prefill or its next token: it suspends its connection (MHD_suspend_connection) and
 * hands it to the waiter, one thread that resumes it when the job it waits on has something new,
 * when a stream is due a keep-alive comment, or when the client has gone (a suspended connection
 * is not polled by libmicrohttpd, so nothing else would notice; the job is then cancelled and its
 * slot freed).
 */
#ifndef KVP_SERVER_WAITER_H
#define KVP_SERVER_WAITER_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#include "server/engine.h"

/* One parked connection; lives in the request's own state, owned by the waiter while parked. */
struct srv_wait {
    struct MHD_Connection *conn;
    struct srv_job *job;
    size_t after;         /* resume once job->visible > after (SIZE_MAX: only when finished) */
    double keepalive_at;  /* resume at this kvp_time_now() anyway (0: never) */
    /* set by the waiter before it resumes the connection */
    bool gone;            /* the client closed its side: the job was cancelled */
    bool due;             /* keepalive_at passed */
    int fd;
    struct srv_wait *prev, *next;
};

struct srv_waiter;

/* on_gone(cls, job) is called (the waiter's lock held) for each client found gone. */
int srv_waiter_start(void (*on_gone)(void *cls, struct srv_job *job), void *cls,
                     struct srv_waiter **out);
/* Suspend w->conn and watch it. Call only from libmicrohttpd's callbacks of that connection.
 * False when the waiter is stopping (nothing was suspended). */
bool srv_waiter_park(struct srv_waiter *wt, struct srv_wait *w);
/* A job's on_change hook (arg: the waiter): never blocks. */
void srv_waiter_wake(void *wt);
/* Connections parked now. */
size_t srv_waiter_parked(struct srv_waiter *wt);
/* Resume every parked connection, refuse parking from now on, join the thread: libmicrohttpd
 * must not be stopped with a connection suspended. */
void srv_waiter_stop(struct srv_waiter *wt);
void srv_waiter_free(struct srv_waiter *wt);

#endif
