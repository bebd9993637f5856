/* The thread that resumes parked connections (see waiter.h). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/platform.h"
#include "server/waiter.h"

/* how often parked sockets are checked for a client that left: a vanished client's slot is
 * freed within this time */
#define GONE_CHECK_S 0.1

struct srv_waiter {
    pthread_mutex_t mu;
    struct srv_wait *head;   /* parked, under mu */
    size_t n_parked;
    bool stopping;
    int efd;                 /* eventfd: a job changed, or stop */
    pthread_t thread;
    bool started;
    void (*on_gone)(void *cls, struct srv_job *job);
    void *cls;
};

/* True when the client has closed its side (EOF or an error on the socket). Bytes waiting
 * (a pipelined next request) are left for libmicrohttpd. */
static bool client_gone(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void unlink_wait(struct srv_waiter *wt, struct srv_wait *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        wt->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
    wt->n_parked--;
}

static void *run(void *arg)
{
    struct srv_waiter *wt = arg;
    double next_check = 0;
    for (;;) {
        struct pollfd p = {.fd = wt->efd, .events = POLLIN};
        int timeout_ms = (int)(GONE_CHECK_S * 1000);
        if (poll(&p, 1, timeout_ms) > 0 && (p.revents & POLLIN)) {
            uint64_t v;
            ssize_t n = read(wt->efd, &v, sizeof(v));
            (void)n; /* the count does not matter: every parked connection is looked at */
        }
        double now = kvp_time_now();
        bool check = now >= next_check;
        if (check)
            next_check = now + GONE_CHECK_S;
        pthread_mutex_lock(&wt->mu);
        bool stopping = wt->stopping;
        for (struct srv_wait *w = wt->head, *nx; w; w = nx) {
            nx = w->next;
            struct srv_job *j = w->job;
            pthread_mutex_lock(&j->mu);
            bool ready = j->finish != SRV_RUNNING || (w->after != SIZE_MAX && j->visible > w->after);
            pthread_mutex_unlock(&j->mu);
            if (!ready && w->keepalive_at > 0 && now >= w->keepalive_at)
                ready = w->due = true;
            if (!ready && (check || stopping) && client_gone(w->fd)) {
                srv_job_cancel(j);
                w->gone = ready = true;
                if (wt->on_gone)
                    wt->on_gone(wt->cls, j);
            }
            if (ready || stopping) {
                unlink_wait(wt, w);
                MHD_resume_connection(w->conn);
            }
        }
        pthread_mutex_unlock(&wt->mu);
        if (stopping)
            return NULL;
    }
}

int srv_waiter_start(void (*on_gone)(void *cls, struct srv_job *job), void *cls,
                     struct srv_waiter **out)
{
    *out = NULL;
    struct srv_waiter *wt = calloc(1, sizeof(*wt));
    if (!wt)
        return -1;
    wt->on_gone = on_gone;
    wt->cls = cls;
    wt->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wt->efd < 0) {
        free(wt);
        return -1;
    }
    pthread_mutex_init(&wt->mu, NULL);
    if (pthread_create(&wt->thread, NULL, run, wt) != 0) {
        close(wt->efd);
        pthread_mutex_destroy(&wt->mu);
        free(wt);
        return -1;
    }
    wt->started = true;
    *out = wt;
    return 0;
}

bool srv_waiter_park(struct srv_waiter *wt, struct srv_wait *w)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(w->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    w->fd = ci ? ci->connect_fd : -1;
    w->gone = w->due = false;
    w->prev = NULL;
    pthread_mutex_lock(&wt->mu);
    if (wt->stopping || w->fd < 0) {
        pthread_mutex_unlock(&wt->mu);
        return false;
    }
    /* suspended under the lock: the waiter can only resume it once it is in the list */
    MHD_suspend_connection(w->conn);
    w->next = wt->head;
    if (wt->head)
        wt->head->prev = w;
    wt->head = w;
    wt->n_parked++;
    pthread_mutex_unlock(&wt->mu);
    srv_waiter_wake(wt); /* the job may have changed before it was parked */
    return true;
}

void srv_waiter_wake(void *arg)
{
    struct srv_waiter *wt = arg;
    uint64_t one = 1;
    ssize_t n = write(wt->efd, &one, sizeof(one));
    (void)n; /* only fails when the counter is near 2^64: a wake-up is pending anyway */
}

size_t srv_waiter_parked(struct srv_waiter *wt)
{
    pthread_mutex_lock(&wt->mu);
    size_t n = wt->n_parked;
    pthread_mutex_unlock(&wt->mu);
    return n;
}

void srv_waiter_stop(struct srv_waiter *wt)
{
    if (!wt || !wt->started)
        return;
    pthread_mutex_lock(&wt->mu);
    wt->stopping = true;
    pthread_mutex_unlock(&wt->mu);
    srv_waiter_wake(wt);
    pthread_join(wt->thread, NULL);
    wt->started = false;
}

void srv_waiter_free(struct srv_waiter *wt)
{
    if (!wt)
        return;
    srv_waiter_stop(wt);
    close(wt->efd);
    pthread_mutex_destroy(&wt->mu);
    free(wt);
}
