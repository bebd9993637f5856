/* Connection limits and accounting of `kvpred serve` (see conns.h). */
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/platform.h"
#include "server/conns.h"

#define N_BUCKETS 1024

/* The kernel's buffer of bytes sent but not yet taken by a client. Its autotuning may grow it
 * to megabytes per connection, which a thousand clients that stop reading would pin; an SSE
 * stream never needs much (the answer waits in its job, not in the socket). */
#define SEND_BUFFER (128 * 1024)

/* Open connections from one address. */
struct client {
    unsigned char addr[16];
    int alen;
    unsigned open;
    struct client *next;
};

/* One connection (libmicrohttpd's socket context). */
struct sock {
    double t_progress;   /* opened, or a request began or ended */
    bool in_request;     /* the access handler has seen the current request's headers */
    bool over_limit;
    unsigned char addr[16];
    int alen;
};

enum { REFUSED_LIMIT, REFUSED_PER_CLIENT, N_REFUSED };

struct srv_conns {
    struct srv_conn_limits lim;
    pthread_mutex_t mu;
    unsigned open;
    struct client *buckets[N_BUCKETS];
    unsigned long long opened, refused[N_REFUSED], timeouts[SRV_N_TIMEOUT];
};

/* The address part of a socket address (port left out: a client is an address). */
static int addr_key(const struct sockaddr *a, socklen_t len, unsigned char key[16])
{
    if (a && a->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        memcpy(key, &((const struct sockaddr_in *)(const void *)a)->sin_addr, 4);
        return 4;
    }
    if (a && a->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const unsigned char *b = ((const struct sockaddr_in6 *)(const void *)a)->sin6_addr.s6_addr;
        static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!memcmp(b, v4mapped, 12)) { /* the same client over IPv4 and IPv6 */
            memcpy(key, b + 12, 4);
            return 4;
        }
        memcpy(key, b, 16);
        return 16;
    }
    return 0; /* no address (a socket pair): all such connections are one client */
}

static struct client **find(struct srv_conns *cs, const unsigned char *key, int alen)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (int i = 0; i < alen; i++)
        h = (h ^ key[i]) * 16777619u;
    struct client **p = &cs->buckets[h % N_BUCKETS];
    while (*p && ((*p)->alen != alen || memcmp((*p)->addr, key, (size_t)alen)))
        p = &(*p)->next;
    return p;
}

struct srv_conns *srv_conns_new(const struct srv_conn_limits *lim)
{
    struct srv_conns *cs = calloc(1, sizeof(*cs));
    if (!cs)
        return NULL;
    cs->lim = *lim;
    pthread_mutex_init(&cs->mu, NULL);
    return cs;
}

void srv_conns_free(struct srv_conns *cs)
{
    if (!cs)
        return;
    for (int b = 0; b < N_BUCKETS; b++)
        for (struct client *c = cs->buckets[b], *nx; c; c = nx) {
            nx = c->next;
            free(c);
        }
    pthread_mutex_destroy(&cs->mu);
    free(cs);
}

/* The counts are raised when libmicrohttpd reports the connection started, not here: a
 * connection it fails to set up after this yes is never reported, and would stay counted. The
 * price is that the accepting threads may each let one connection past a limit at once. */
enum MHD_Result srv_conns_accept(void *cls, const struct sockaddr *addr, socklen_t len)
{
    struct srv_conns *cs = cls;
    unsigned char key[16];
    int alen = addr_key(addr, len, key);
    pthread_mutex_lock(&cs->mu);
    int refuse = -1;
    if (cs->open >= cs->lim.max_conn + cs->lim.reserve) {
        refuse = REFUSED_LIMIT;
    } else if (cs->lim.per_client) {
        struct client *c = *find(cs, key, alen);
        if (c && c->open >= cs->lim.per_client)
            refuse = REFUSED_PER_CLIENT;
    }
    if (refuse >= 0)
        cs->refused[refuse]++;
    pthread_mutex_unlock(&cs->mu);
    return refuse >= 0 ? MHD_NO : MHD_YES;
}

void srv_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode code)
{
    struct srv_conns *cs = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct sock *s = calloc(1, sizeof(*s));
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        unsigned char key[16];
        /* the length of a sockaddr behind client_addr is not given: its family tells it */
        int alen = addr_key(ci ? ci->client_addr : NULL,
                            ci && ci->client_addr && ci->client_addr->sa_family == AF_INET6
                                ? sizeof(struct sockaddr_in6)
                                : sizeof(struct sockaddr_in),
                            key);
        const union MHD_ConnectionInfo *fi =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (fi) {
            int sz = SEND_BUFFER;
            setsockopt(fi->connect_fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
        }
        pthread_mutex_lock(&cs->mu);
        cs->open++;
        cs->opened++;
        struct client **p = find(cs, key, alen);
        if (!*p && (*p = calloc(1, sizeof(**p)))) {
            memcpy((*p)->addr, key, (size_t)alen);
            (*p)->alen = alen;
        }
        if (*p)
            (*p)->open++;
        bool over = cs->open > cs->lim.max_conn;
        pthread_mutex_unlock(&cs->mu);
        if (s) {
            s->t_progress = kvp_time_now();
            s->over_limit = over;
            memcpy(s->addr, key, (size_t)alen);
            s->alen = alen;
        }
        *socket_context = s;
        return;
    }
    /* closed */
    struct sock *s = *socket_context;
    pthread_mutex_lock(&cs->mu);
    cs->open--;
    if (s) {
        struct client **p = find(cs, s->addr, s->alen);
        if (*p && --(*p)->open == 0) {
            struct client *gone = *p;
            *p = gone->next;
            free(gone);
        }
        /* libmicrohttpd does not say why it closed: a connection without a request under way
         * that was silent for the whole timeout was closed by it (a client that hangs up
         * itself does so sooner, or the timeout would have struck first) */
        if (!s->in_request && kvp_time_now() - s->t_progress >= cs->lim.recv_timeout_s)
            cs->timeouts[SRV_TIMEOUT_RECEIVE]++;
    }
    pthread_mutex_unlock(&cs->mu);
    free(s);
    *socket_context = NULL;
}

static struct sock *sock_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

bool srv_conns_over_limit(struct MHD_Connection *c)
{
    struct sock *s = sock_of(c);
    return s && s->over_limit;
}

void srv_conns_request_begin(struct MHD_Connection *c)
{
    struct sock *s = sock_of(c);
    if (s) {
        s->in_request = true;
        s->t_progress = kvp_time_now();
    }
}

void srv_conns_request_end(struct srv_conns *cs, struct MHD_Connection *c, int stage)
{
    struct sock *s = sock_of(c);
    if (s) {
        s->in_request = false;
        s->t_progress = kvp_time_now();
    }
    if (stage >= 0 && stage < SRV_N_TIMEOUT) {
        pthread_mutex_lock(&cs->mu);
        cs->timeouts[stage]++;
        pthread_mutex_unlock(&cs->mu);
    }
}

size_t srv_conns_metrics(struct srv_conns *cs, char *buf, size_t cap)
{
    pthread_mutex_lock(&cs->mu);
    unsigned open = cs->open;
    unsigned long long opened = cs->opened, ref[N_REFUSED], to[SRV_N_TIMEOUT];
    memcpy(ref, cs->refused, sizeof(ref));
    memcpy(to, cs->timeouts, sizeof(to));
    pthread_mutex_unlock(&cs->mu);
    int n = snprintf(
        buf, cap,
        "# HELP kvpred_http_connections_open Open HTTP connections.\n"
        "# TYPE kvpred_http_connections_open gauge\n"
        "kvpred_http_connections_open %u\n"
        "# HELP kvpred_http_connections_limit --max-connections (and the monitoring reserve "
        "beyond it).\n"
        "# TYPE kvpred_http_connections_limit gauge\n"
        "kvpred_http_connections_limit{kind=\"max\"} %u\n"
        "kvpred_http_connections_limit{kind=\"reserve\"} %u\n"
        "kvpred_http_connections_limit{kind=\"per_client\"} %u\n"
        "# HELP kvpred_http_connections_total HTTP connections accepted.\n"
        "# TYPE kvpred_http_connections_total counter\n"
        "kvpred_http_connections_total %llu\n"
        "# HELP kvpred_http_connections_refused_total Connections closed at once: over "
        "--max-connections plus the reserve, or over --max-client-connections.\n"
        "# TYPE kvpred_http_connections_refused_total counter\n"
        "kvpred_http_connections_refused_total{reason=\"limit\"} %llu\n"
        "kvpred_http_connections_refused_total{reason=\"per_client\"} %llu\n"
        "# HELP kvpred_http_timeouts_total Connections closed for a timeout: receive (--timeout "
        "while a request arrived, or idle between requests), send (--send-timeout: the client "
        "stopped taking its answer).\n"
        "# TYPE kvpred_http_timeouts_total counter\n"
        "kvpred_http_timeouts_total{stage=\"receive\"} %llu\n"
        "kvpred_http_timeouts_total{stage=\"send\"} %llu\n",
        open, cs->lim.max_conn, cs->lim.reserve, cs->lim.per_client, opened,
        ref[REFUSED_LIMIT], ref[REFUSED_PER_CLIENT], to[SRV_TIMEOUT_RECEIVE],
        to[SRV_TIMEOUT_SEND]);
    return n < 0 ? 0 : (size_t)n;
}
