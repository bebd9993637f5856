/*
 * The connections of `kvpred serve`: their limits and what happened to them. libmicrohttpd
 * accepts; conns.c decides which connections it keeps (its accept policy), follows each one
 * from open to close (its connection notices) and counts, for /metrics, the open connections,
 * the refused ones and the ones closed for a timeout.
 *
 * Limits: at most max_conn connections in all and per_client from one address; a further
 * `reserve` connections beyond max_conn are kept for monitoring only (http.c answers /health and
 * /metrics on them and refuses the rest), so a server full of clients can still be watched.
 * Connections over the limits are closed as soon as they are accepted.
 */
#ifndef KVP_SERVER_CONNS_H
#define KVP_SERVER_CONNS_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

struct srv_conn_limits {
    unsigned max_conn;     /* open connections */
    unsigned per_client;   /* open connections from one address (0: no limit) */
    unsigned reserve;      /* beyond max_conn, for /health and /metrics */
    double recv_timeout_s; /* libmicrohttpd's idle timeout while a request arrives or between
                            * requests (used to tell a timeout from a client's close) */
};

/* Where a timeout struck, for kvpred_http_timeouts_total{stage}. */
enum srv_timeout_stage { SRV_TIMEOUT_RECEIVE, SRV_TIMEOUT_SEND, SRV_N_TIMEOUT };

struct srv_conns;

struct srv_conns *srv_conns_new(const struct srv_conn_limits *lim);
void srv_conns_free(struct srv_conns *cs);

/* libmicrohttpd's MHD_OPTION_ACCEPT_POLICY and MHD_OPTION_NOTIFY_CONNECTION (cls: the conns). */
enum MHD_Result srv_conns_accept(void *cls, const struct sockaddr *addr, socklen_t len);
void srv_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                      enum MHD_ConnectionNotificationCode code);

/* A connection beyond max_conn (kept for monitoring only). */
bool srv_conns_over_limit(struct MHD_Connection *c);
/* The access handler saw a request's headers (call once per request). */
void srv_conns_request_begin(struct MHD_Connection *c);
/* A request ended (MHD_OPTION_NOTIFY_COMPLETED): timed out at `stage`, or stage < 0. */
void srv_conns_request_end(struct srv_conns *cs, struct MHD_Connection *c, int stage);

/* Append the Prometheus lines (snprintf-style: returns the length it needed). */
size_t srv_conns_metrics(struct srv_conns *cs, char *buf, size_t cap);

#endif
