/*
 * The Redis cold tier (cold.h): every fetch unit (layer, block) is one binary value, the key
 * "kvp:<id>:<layer>:<block>", on one Redis server or a Redis Cluster
 * (kvp_ctx_params.kv_url = redis://HOST:PORT[,HOST:PORT...][?OPTION=N&...], the options below
 * and in docs/store.md). The id (pid, a per-process counter and 32 random bits) is unique per
 * context.
 *
 * I/O. One connection per node, non-blocking, driven from the table's own points rather than
 * through hiredis's async API: submit formats one GET or SET per unit (RESP, a few lines) into
 * the owning node's output buffer and notes in a ring what the reply will be for (a connection
 * answers in order); flush sends what the sockets take (MSG_NOSIGNAL: a node that died cannot
 * raise SIGPIPE in the caller's process); reap reads what has arrived without blocking and
 * parses it with hiredis's reader; wait sleeps in poll() on every busy socket until a reply or
 * a deadline. The async API would need an event loop whose only callers are these same points
 * (the decode thread is the loop already), or a second thread and locks around the hot slots.
 * So every request is pipelined: a prompt's fill sends a layer's units to each node in one
 * burst and reads the replies as they come, and one step's misses and the next step's
 * prefetches share the same connections. `pipeline=N` caps the commands in flight per node
 * (default PIPELINE_DEPTH; 1 sends one request per round trip, kept to measure what pipelining
 * gives).
 *
 * Cluster. CLUSTER SLOTS on the first seed that answers gives the slot map and each master's
 * replicas (an error there means a single server, which then holds every slot); a key goes to
 * the master of its CRC16 slot (redis_slot.c). MOVED updates the slot, resends the command to
 * the node named and refreshes the whole map with one CLUSTER SLOTS in the background; ASK
 * resends it once, after ASKING, without touching the map; at most MAX_REDIRECTS hops.
 *
 * Replicas and failover. On a master with replicas a write counts as done only once WAIT says
 * `wait_replicas` of them (default 1) have it, or WAIT's timeout passed: a master killed after
 * its OK but before the copy would otherwise take the unit with it. When a connection fails
 * (closed, reset, refused, or no reply within timeout_ms) its requests are not failed at once:
 * they are parked, the slot map is asked again from any node that answers, and they are resent
 * to whoever then owns their slots, with a backoff from RETRY_MIN_MS to RETRY_MAX_MS, until
 * failover_ms after their first failure (CLUSTERDOWN and TRYAGAIN replies are parked the same
 * way). So a killed master is survived once a replica is promoted: the units it held are read
 * from the promoted replica, bytes as written. Without replicas (failover_ms 0 by default there)
 * or past the bound, the units fail: the store then treats them as lost (store.h), never as
 * read. A write acknowledged with fewer replicas than asked is still the master's; were that
 * master to die before copying it, the read of the promoted replica finds no key or an older
 * value, which the store's checks refuse.
 *
 * Bounds. Connecting waits at most timeout_ms; a node that owes replies and gives none for
 * timeout_ms has its connection dropped; a parked request fails failover_ms after its first
 * failure; a node that failed is reconnected no more often than once per timeout. A refused
 * command (OOM under maxmemory, ...) fails its request with the server's words, as does a
 * missing key (expired, evicted, lost with a master that had no replica).
 *
 * Lifetime. Values are written with an expiry (ttl_ms, default 10 minutes, renewed for every
 * stored unit every ttl/3 while the context is used), so a crashed process leaves nothing behind
 * for long; close deletes (UNLINK) every key the context wrote. hiredis allocates its reply
 * objects; the backend's own buffers are allocated once and grow only when a larger burst than
 * ever before is in flight.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "core/platform.h"
#include "store/redis_slot.h"
#include "store/store_internal.h"

#define MAX_NODES          64 /* masters and replicas of a cluster (slot_node holds a byte) */
#define NO_NODE            0xff
#define MAX_REDIRECTS      8 /* MOVED/ASK hops per command before it fails */
#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_TTL_MS     600000
/* How long parked requests wait for a failover by default when every master has a replica:
 * Redis promotes a replica cluster-node-timeout (15 s by default) after its master stopped
 * answering, plus an election of a second or less. */
#define DEFAULT_FAILOVER_MS 20000
/* Commands in flight per node by default: enough for a fill to stream (a 32K-token prompt is
 * about 2000 units per layer) while the server's reply buffer for us stays a few MiB. */
#define PIPELINE_DEPTH 1024
#define RETRY_MIN_MS   20  /* first resend of parked requests after a failure */
#define RETRY_MAX_MS   500 /* backoff doubles up to this */
#define KEY_CAP        96
#define RECV_CHUNK     (256 * 1024)
#define OPT_MAX        86400000L /* any option, in its unit */

enum pend_kind {
    PEND_UNIT,   /* GET or SET of one unit of a transfer record */
    PEND_IGNORE, /* ASKING, PEXPIRE, UNLINK: the reply only shows the node is alive */
    PEND_SLOTS,  /* CLUSTER SLOTS refreshing the map */
    PEND_CALL,   /* a synchronous call (node_call): the reply is handed back */
    PEND_WAIT,   /* WAIT: the SETs answered before it (node.acked) are on the replicas */
};

struct pend {
    uint64_t end;      /* where its command ends in the node's output (struct node, out_base) */
    double since;      /* PEND_UNIT: when it first failed (0: never), for the failover bound */
    int32_t rec;       /* transfer record (PEND_UNIT) */
    int32_t unit;      /* unit within the record */
    uint8_t kind;      /* enum pend_kind */
    uint8_t redirects; /* hops so far */
    bool waits;        /* a SET whose master has replicas: done at the WAIT after it */
};

/* A FIFO of pends that grows by doubling. */
struct ring {
    struct pend *v;
    int head, len, cap;
};

struct node {
    char host[128];
    int port;
    int n_replicas;     /* as a master in the latest slot map */
    redisContext *c;    /* NULL: not connected */
    double retry_at;    /* after a failure: no reconnect before then */
    char down_why[96];  /* and what the failure was */
    struct ring q;      /* the replies expected, in order */
    struct ring acked;  /* SETs answered OK, waiting for the WAIT after them */
    bool need_wait;     /* a SET that waits was appended since the last WAIT */
    double progress_at; /* last reply, or when the ring last became non-empty */
    char *out;          /* commands not yet written: out[out_off, out_len) */
    size_t out_off, out_len, out_cap;
    uint64_t out_base; /* bytes dropped from the front of out so far (pend.end counts from 0) */
};

struct redis_io {
    struct kvp_store *s;
    struct node nodes[MAX_NODES];
    int n_nodes;
    bool cluster;
    bool slots_refreshing;                 /* a CLUSTER SLOTS is in flight */
    uint8_t slot_node[KVP_REDIS_SLOTS];    /* master of each slot (NO_NODE: none known) */
    char sid[48];                          /* the context's id, the keys' prefix */
    uint8_t *stored;                       /* [n_layer * max_blocks] a SET of the unit was sent */
    int rec_left[KVP_STORE_MAX_XFER];      /* units of a record not answered yet */
    int rec_err[KVP_STORE_MAX_XFER];       /* first errno among its units, or 0 */
    char rec_why[KVP_STORE_MAX_XFER][256]; /* and the note on it */
    int n_completed;                       /* records completed since reap/wait began */
    redisReply *call_reply;                /* the reply of a PEND_CALL */
    struct ring parked;                    /* units waiting for their node or a failover */
    double resend_at;                      /* when the parked units are resent next */
    int backoff_ms;                        /* the interval after that */
    bool resending;                        /* resend_parked is running */
    int refresh_next;                      /* the node asked for the map next (round robin) */
    /* options (parse_url; -1: not given, decided at open) */
    int timeout_ms, ttl_ms, failover_ms, pipeline, wait_replicas;
    char ttl_str[16];
    double refresh_at; /* when the expiries are renewed next */
    char why[256];     /* the latest failure, for the store's error if a unit fails for good */
    char *rbuf;        /* [RECV_CHUNK] socket reads */
};

/* The latest failure, naming the node: the reason a unit that fails for good gives. */
static void note(struct redis_io *r, const struct node *nd, const char *fmt, ...)
{
    int n = snprintf(r->why, sizeof(r->why), "KV store: redis %s:%d: ", nd->host, nd->port);
    if (n < 0 || (size_t)n >= sizeof(r->why))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why + n, sizeof(r->why) - (size_t)n, fmt, ap);
    va_end(ap);
}

static int unit_key(const struct redis_io *r, int layer, int b, char *key)
{
    return snprintf(key, KEY_CAP, "%s:%d:%d", r->sid, layer, b);
}

/* ========================================== rings ========================================= */

static bool ring_push(struct ring *g, struct pend p)
{
    if (g->len == g->cap) {
        int cap = g->cap ? g->cap * 2 : 1024;
        struct pend *v = malloc((size_t)cap * sizeof(*v));
        if (!v)
            return false;
        for (int i = 0; i < g->len; i++)
            v[i] = g->v[(g->head + i) % g->cap];
        free(g->v);
        g->v = v;
        g->cap = cap;
        g->head = 0;
    }
    g->v[(g->head + g->len) % g->cap] = p;
    g->len++;
    return true;
}

static struct pend ring_pop(struct ring *g)
{
    struct pend p = g->v[g->head];
    g->head = (g->head + 1) % g->cap;
    g->len--;
    return p;
}

static const struct pend *ring_at(const struct ring *g, int i)
{
    return &g->v[(g->head + i) % g->cap];
}

/* ========================================== records ======================================= */

/* One unit of record rec answered (err 0) or failed for good (an errno). */
static void unit_done(struct redis_io *r, int rec, int err)
{
    if (err && !r->rec_err[rec]) {
        r->rec_err[rec] = err;
        memcpy(r->rec_why[rec], r->why, sizeof(r->why));
    }
    if (--r->rec_left[rec] > 0)
        return;
    struct kvp_store *s = r->s;
    int res = r->rec_err[rec] ? -r->rec_err[rec] : (int)((size_t)s->xfer[rec].n * s->unit_bytes);
    if (res < 0) /* the reason the store's error gives */
        kvp_store_set_note(s, "%s", r->rec_why[rec]);
    kvp_store_complete(s, rec, res, kvp_time_now());
    r->n_completed++;
}

/* A unit whose request met an error that may pass (its node down or unreachable, the cluster
 * failing over): parked for a resend while failover_ms has not passed since its first failure,
 * failed otherwise. A reply saying the cluster is between states (err EAGAIN) waits at least
 * timeout_ms, replicas or not: a slot moving or a node briefly taken for failed passes. Past the
 * bound the error is EHOSTDOWN, which the store does not issue again: the bound was the
 * waiting. */
static void unit_retry(struct redis_io *r, struct pend p, int err)
{
    double now = kvp_time_now();
    int bound = err == EAGAIN && r->failover_ms < r->timeout_ms ? r->timeout_ms : r->failover_ms;
    if (p.since == 0)
        p.since = now;
    if (bound > 0 && (now - p.since) * 1e3 >= bound) {
        size_t n = strlen(r->why);
        snprintf(r->why + n, sizeof(r->why) - n, "; no failover within %d ms", bound);
        err = EHOSTDOWN;
    }
    if (bound > 0 && err != EHOSTDOWN) {
        p.kind = PEND_UNIT;
        p.redirects = 0; /* a map in flux may bounce it more often; the time bound holds */
        if (r->parked.len == 0 && !r->resending) {
            r->backoff_ms = RETRY_MIN_MS;
            r->resend_at = now + RETRY_MIN_MS * 1e-3;
        }
        if (ring_push(&r->parked, p))
            return;
        err = ENOMEM;
    }
    unit_done(r, p.rec, err);
}

/* ========================================= nodes ========================================== */

static int node_find_or_add(struct redis_io *r, const char *host, int port)
{
    for (int i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].port == port && !strcmp(r->nodes[i].host, host))
            return i;
    if (r->n_nodes == MAX_NODES || strlen(host) >= sizeof(r->nodes[0].host))
        return -1;
    struct node *nd = &r->nodes[r->n_nodes];
    snprintf(nd->host, sizeof(nd->host), "%s", host);
    nd->port = port;
    return r->n_nodes++;
}

/* The connection to nd is dropped: every request waiting on it is parked or failed (err). */
static void node_fail(struct redis_io *r, struct node *nd, int err)
{
    const char *why = strstr(r->why, ": "); /* the note on it: "KV store: redis HOST:PORT: ..." */
    why = why ? strstr(why + 2, ": ") : NULL;
    snprintf(nd->down_why, sizeof(nd->down_why), "%s", why ? why + 2 : "connection lost");
    if (nd->c)
        redisFree(nd->c);
    nd->c = NULL;
    nd->out_base += nd->out_len;
    nd->out_off = nd->out_len = 0;
    nd->need_wait = false;
    nd->retry_at = kvp_time_now() + r->timeout_ms * 1e-3;
    while (nd->acked.len > 0) /* answered, but maybe not copied to a replica */
        unit_retry(r, ring_pop(&nd->acked), err);
    while (nd->q.len > 0) {
        struct pend p = ring_pop(&nd->q);
        if (p.kind == PEND_UNIT)
            unit_retry(r, p, err);
        else if (p.kind == PEND_SLOTS)
            r->slots_refreshing = false;
    }
}

/* Connect to nd (non-blocking, at most timeout_ms). false with the reason noted. */
static bool node_connect(struct redis_io *r, struct node *nd)
{
    redisContext *c = redisConnectNonBlock(nd->host, nd->port);
    if (!c || c->err) {
        note(r, nd, "cannot connect: %s", c ? c->errstr : "out of memory");
        redisFree(c);
        return false;
    }
    struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
    int rc;
    while ((rc = poll(&pfd, 1, r->timeout_ms)) < 0 && errno == EINTR)
        ;
    int so = 0;
    socklen_t len = sizeof(so);
    if (rc == 0)
        note(r, nd, "cannot connect: no answer within %d ms", r->timeout_ms);
    else if (rc < 0 || getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so, &len) < 0 || so)
        note(r, nd, "cannot connect: %s", strerror(rc < 0 ? errno : so ? so : EIO));
    if (rc <= 0 || so) {
        redisFree(c);
        return false;
    }
    c->reader->maxbuf = 0; /* keep the reader's buffer instead of freeing it after each burst */
    nd->c = c;
    return true;
}

/* nd connected, reconnecting when its last failure is older than the timeout; false (noted)
 * when it cannot be reached now. */
static bool node_ready(struct redis_io *r, struct node *nd)
{
    if (nd->c)
        return true;
    if (kvp_time_now() < nd->retry_at) {
        note(r, nd, "unreachable (%s)", nd->down_why);
        return false;
    }
    if (node_connect(r, nd))
        return true;
    nd->retry_at = kvp_time_now() + r->timeout_ms * 1e-3;
    return false;
}

static bool out_put(struct node *nd, const void *p, size_t n)
{
    if (nd->out_len + n > nd->out_cap) {
        if (nd->out_off > 0) { /* drop what was sent first */
            memmove(nd->out, nd->out + nd->out_off, nd->out_len - nd->out_off);
            nd->out_len -= nd->out_off;
            nd->out_base += nd->out_off;
            nd->out_off = 0;
        }
        size_t cap = nd->out_cap ? nd->out_cap : 1 << 16;
        while (cap < nd->out_len + n)
            cap *= 2;
        if (cap != nd->out_cap) {
            char *o = realloc(nd->out, cap);
            if (!o)
                return false;
            nd->out = o;
            nd->out_cap = cap;
        }
    }
    memcpy(nd->out + nd->out_len, p, n);
    nd->out_len += n;
    return true;
}

/* One command in RESP: *argc, then $len and the bytes of each argument. */
static bool out_command(struct node *nd, int argc, const char **argv, const size_t *lens)
{
    char h[32];
    bool ok = out_put(nd, h, (size_t)snprintf(h, sizeof(h), "*%d\r\n", argc));
    for (int i = 0; i < argc && ok; i++)
        ok = out_put(nd, h, (size_t)snprintf(h, sizeof(h), "$%zu\r\n", lens[i])) &&
             out_put(nd, argv[i], lens[i]) && out_put(nd, "\r\n", 2);
    return ok;
}

/* Append one command to nd's output and expect its reply as p. false (noted) when nd cannot be
 * reached now or memory ran out (then the connection is dropped). */
static bool node_append(struct redis_io *r, struct node *nd, int argc, const char **argv,
                        const size_t *lens, struct pend p)
{
    if (!node_ready(r, nd))
        return false;
    if (!out_command(nd, argc, argv, lens)) {
        note(r, nd, "out of memory for a request");
        node_fail(r, nd, ENOMEM);
        return false;
    }
    p.end = nd->out_base + nd->out_len;
    if (nd->q.len == 0)
        nd->progress_at = kvp_time_now();
    if (!ring_push(&nd->q, p)) {
        note(r, nd, "out of memory for a request");
        node_fail(r, nd, ENOMEM);
        return false;
    }
    return true;
}

/* Where the bytes that may go on the wire now end in nd->out: all of them, or up to the end of
 * the pipeline-th command still unanswered. */
static size_t send_end(const struct redis_io *r, const struct node *nd)
{
    if (r->pipeline <= 0 || nd->q.len <= r->pipeline)
        return nd->out_len;
    uint64_t end = ring_at(&nd->q, r->pipeline - 1)->end - nd->out_base;
    return end < nd->out_len ? (size_t)end : nd->out_len;
}

static bool out_sendable(const struct redis_io *r, const struct node *nd)
{
    return nd->out_off < send_end(r, nd);
}

static bool out_pending(const struct node *nd)
{
    return nd->out_off < nd->out_len;
}

static void node_write(struct redis_io *r, struct node *nd)
{
    size_t end;
    while (nd->c && nd->out_off < (end = send_end(r, nd))) {
        ssize_t n =
            send(nd->c->fd, nd->out + nd->out_off, end - nd->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            nd->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        note(r, nd, "connection lost: %s", n < 0 ? strerror(errno) : "closed");
        node_fail(r, nd, ECONNRESET);
        return;
    }
    if (nd->c && !out_pending(nd)) {
        nd->out_base += nd->out_len;
        nd->out_off = nd->out_len = 0;
    }
}

/* Replicas a write to nd waits for (WAIT numreplicas), 0 for none. */
static int wait_count(const struct redis_io *r, const struct node *nd)
{
    int want = r->wait_replicas < 0 ? 1 : r->wait_replicas;
    return want < nd->n_replicas ? want : nd->n_replicas;
}

/* After the SETs appended to nd, a WAIT for their copies. */
static void node_seal(struct redis_io *r, struct node *nd)
{
    if (!nd->need_wait || !nd->c)
        return;
    nd->need_wait = false;
    char n[16], ms[16];
    int ln = snprintf(n, sizeof(n), "%d", wait_count(r, nd));
    /* below our own timeout, so the server answers before we give up on it */
    int lm = snprintf(ms, sizeof(ms), "%d", r->timeout_ms > 1 ? r->timeout_ms / 2 : 1);
    const char *argv[] = {"WAIT", n, ms};
    const size_t lens[] = {4, (size_t)ln, (size_t)lm};
    node_append(r, nd, 3, argv, lens, (struct pend){.kind = PEND_WAIT});
}

/* ======================================== routing ========================================= */

static void send_unit(struct redis_io *r, struct pend p, int ni, bool asking);

/* Ask node ni for the slot map (once at a time). */
static void refresh_slots(struct redis_io *r, int ni)
{
    if (!r->cluster || r->slots_refreshing)
        return;
    const char *argv[] = {"CLUSTER", "SLOTS"};
    const size_t lens[] = {7, 5};
    r->slots_refreshing =
        node_append(r, &r->nodes[ni], 2, argv, lens, (struct pend){.kind = PEND_SLOTS});
}

/* Take the masters of a CLUSTER SLOTS reply (from node `from`) and their replica counts into the
 * slot map, and the replicas into the node table (they answer CLUSTER SLOTS too once their
 * master is gone). Returns the slots covered, or -1 for a malformed reply or too many masters. */
static int apply_slots(struct redis_io *r, const redisReply *rep, int from)
{
    if (rep->type != REDIS_REPLY_ARRAY)
        return -1;
    int covered = 0;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER)
            return -1;
        int ni[8], n_addr = 0; /* the master, then replicas */
        for (size_t k = 2; k < e->elements && n_addr < 8; k++) {
            const redisReply *m = e->element[k];
            if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
                m->element[0]->type != REDIS_REPLY_STRING ||
                m->element[1]->type != REDIS_REPLY_INTEGER)
                return -1;
            long long port = m->element[1]->integer;
            if (port <= 0 || port > 65535)
                return -1;
            /* an empty address: the node we asked does not know its own; use ours for it */
            const char *host = m->element[0]->len ? m->element[0]->str : r->nodes[from].host;
            ni[n_addr] = node_find_or_add(r, host, (int)port);
            if (ni[n_addr] < 0 && k == 2)
                return -1;
            n_addr += ni[n_addr] >= 0; /* a replica past the table is only not asked */
        }
        long long a = e->element[0]->integer, b = e->element[1]->integer;
        if (a < 0 || b >= KVP_REDIS_SLOTS || a > b)
            return -1;
        for (long long sl = a; sl <= b; sl++)
            r->slot_node[sl] = (uint8_t)ni[0];
        r->nodes[ni[0]].n_replicas = (int)e->elements - 3;
        covered += (int)(b - a + 1);
    }
    return covered;
}

/* A MOVED or ASK error: resend the unit where it points. false when the text is not one. */
static bool redirect(struct redis_io *r, struct node *nd, struct pend p, const char *msg)
{
    bool ask = !strncmp(msg, "ASK ", 4);
    if (!ask && strncmp(msg, "MOVED ", 6))
        return false;
    int slot, port, ni = -1;
    char host[128];
    if (sscanf(msg + (ask ? 4 : 6), "%d %127[^:]:%d", &slot, host, &port) == 3 && slot >= 0 &&
        slot < KVP_REDIS_SLOTS && port > 0 && port <= 65535)
        ni = node_find_or_add(r, host, port);
    if (ni < 0 || p.redirects >= MAX_REDIRECTS) {
        note(r, nd, "%s (%s)", msg, ni < 0 ? "bad redirection" : "too many redirections");
        unit_done(r, p.rec, EIO);
        return true;
    }
    if (!ask) {
        r->slot_node[slot] = (uint8_t)ni;
        refresh_slots(r, ni);
    }
    p.redirects++;
    send_unit(r, p, ni, ask);
    return true;
}

/* Replies that say the cluster is between states (a failover, a resharding step, a replica
 * loading its copy): the request is parked and resent like one whose node failed. */
static bool transient(const char *msg)
{
    return !strncmp(msg, "CLUSTERDOWN", 11) || !strncmp(msg, "TRYAGAIN", 8) ||
           !strncmp(msg, "LOADING", 7) || !strncmp(msg, "MASTERDOWN", 10);
}

/* The reply to p from nd. Returns true when the reply was kept (PEND_CALL). */
static bool handle_reply(struct redis_io *r, struct node *nd, struct pend p, redisReply *rep)
{
    struct kvp_store *s = r->s;
    switch (p.kind) {
    case PEND_CALL:
        r->call_reply = rep;
        return true;
    case PEND_SLOTS:
        r->slots_refreshing = false;
        apply_slots(r, rep, (int)(nd - r->nodes)); /* a bad map keeps the old one */
        if (r->parked.len > 0)                     /* resend with the new map at once */
            r->resend_at = kvp_time_now();
        return false;
    case PEND_WAIT: /* whatever it says: the master has the values (see the header) */
        while (nd->acked.len > 0)
            unit_done(r, ring_pop(&nd->acked).rec, 0);
        return false;
    case PEND_IGNORE:
        return false;
    default:
        break;
    }
    const struct kvp_store_xfer *x = &s->xfer[p.rec];
    int b = x->b0 + p.unit;
    const char *what = x->write ? "write" : "read";
    if (rep->type == REDIS_REPLY_ERROR) {
        if (redirect(r, nd, p, rep->str))
            return false;
        note(r, nd, "%s of layer %d block %d refused: %s", what, x->layer, b, rep->str);
        if (transient(rep->str)) {
            refresh_slots(r, (int)(nd - r->nodes));
            unit_retry(r, p, EAGAIN);
        } else {
            unit_done(r, p.rec, !strncmp(rep->str, "OOM", 3) ? ENOSPC : EIO);
        }
        return false;
    }
    if (x->write) {
        bool ok = rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "OK");
        if (!ok) {
            note(r, nd, "write of layer %d block %d: unexpected reply", x->layer, b);
            unit_done(r, p.rec, EIO);
        } else if (p.waits && ring_push(&nd->acked, p)) {
            return false;
        } else {
            unit_done(r, p.rec, 0);
        }
        return false;
    }
    if (rep->type == REDIS_REPLY_STRING && rep->len == s->unit_bytes) {
        memcpy(slot_ptr(s, x->s0 + p.unit), rep->str, s->unit_bytes);
        unit_done(r, p.rec, 0);
        return false;
    }
    if (rep->type == REDIS_REPLY_NIL)
        note(r, nd,
             "read of layer %d block %d: the key is gone (expired, evicted, or lost with a "
             "node that had no replica)",
             x->layer, b);
    else
        note(r, nd, "read of layer %d block %d: %zu bytes instead of %zu", x->layer, b,
             rep->type == REDIS_REPLY_STRING ? rep->len : (size_t)0, s->unit_bytes);
    unit_done(r, p.rec, rep->type == REDIS_REPLY_NIL ? ENOENT : EIO);
    return false;
}

/* The node of a key: its slot's master, or the one server. */
static int route(const struct redis_io *r, const char *key, int klen)
{
    return r->slot_node[r->cluster ? kvp_redis_key_slot(key, (size_t)klen) : 0];
}

/* Send the GET or SET of unit p (of record p.rec) to node ni (-1: its slot's master), after
 * ASKING when asking. A node that cannot be reached now parks it (unit_retry). */
static void send_unit(struct redis_io *r, struct pend p, int ni, bool asking)
{
    struct kvp_store *s = r->s;
    const struct kvp_store_xfer *x = &s->xfer[p.rec];
    char key[KEY_CAP];
    int klen = unit_key(r, x->layer, x->b0 + p.unit, key);
    if (ni < 0)
        ni = route(r, key, klen);
    if (ni == NO_NODE) {
        snprintf(r->why, sizeof(r->why), "KV store: redis: no node serves the slot of %s", key);
        unit_retry(r, p, EAGAIN);
        return;
    }
    struct node *nd = &r->nodes[ni];
    p.kind = PEND_UNIT;
    if (asking) {
        const char *argv[] = {"ASKING"};
        const size_t lens[] = {6};
        if (!node_append(r, nd, 1, argv, lens, (struct pend){.kind = PEND_IGNORE})) {
            unit_retry(r, p, ECONNRESET);
            return;
        }
    }
    bool ok;
    if (x->write) {
        const char *argv[] = {"SET", key, (const char *)slot_ptr(s, x->s0 + p.unit), "PX",
                              r->ttl_str};
        const size_t lens[] = {3, (size_t)klen, s->unit_bytes, 2, strlen(r->ttl_str)};
        r->stored[(size_t)x->layer * s->max_blocks + (size_t)(x->b0 + p.unit)] = 1;
        p.waits = wait_count(r, nd) > 0;
        ok = node_append(r, nd, 5, argv, lens, p);
        nd->need_wait |= ok && p.waits;
    } else {
        const char *argv[] = {"GET", key};
        const size_t lens[] = {3, (size_t)klen};
        ok = node_append(r, nd, 2, argv, lens, p);
    }
    if (!ok)
        unit_retry(r, p, ECONNRESET);
}

/* One command about every stored unit (PEXPIRE to renew, UNLINK to delete), pipelined. */
static void for_each_stored(struct redis_io *r, const char *cmd, bool with_ttl)
{
    struct kvp_store *s = r->s;
    for (int l = 0; l < s->n_layer; l++)
        for (int b = 0; b < s->max_blocks; b++) {
            if (!r->stored[(size_t)l * s->max_blocks + b])
                continue;
            char key[KEY_CAP];
            int klen = unit_key(r, l, b, key), ni = route(r, key, klen);
            if (ni == NO_NODE)
                continue;
            const char *argv[] = {cmd, key, r->ttl_str};
            const size_t lens[] = {strlen(cmd), (size_t)klen, strlen(r->ttl_str)};
            node_append(r, &r->nodes[ni], with_ttl ? 3 : 2, argv, lens,
                        (struct pend){.kind = PEND_IGNORE});
        }
}

/* The parked units, resent when their time has come: first the map is asked again from a node
 * that answers (the one that owned their slots may be gone), then each goes to whoever owns its
 * slot now; those that still find no node are parked again, with a longer backoff. */
static void resend_parked(struct redis_io *r)
{
    double now = kvp_time_now();
    if (r->parked.len == 0 || now < r->resend_at)
        return;
    if (r->cluster && !r->slots_refreshing)
        for (int k = 0; k < r->n_nodes && !r->slots_refreshing; k++) {
            int i = (r->refresh_next + k) % r->n_nodes;
            if (r->nodes[i].c || now >= r->nodes[i].retry_at) {
                refresh_slots(r, i);
                r->refresh_next = i + 1; /* a node that failed to answer is not asked first */
            }
        }
    int n = r->parked.len;
    r->resending = true; /* units parked again keep the backoff growing */
    for (int i = 0; i < n; i++)
        send_unit(r, ring_pop(&r->parked), -1, false);
    r->resending = false;
    r->backoff_ms = r->backoff_ms * 2 < RETRY_MAX_MS ? r->backoff_ms * 2 : RETRY_MAX_MS;
    r->resend_at = kvp_time_now() + r->backoff_ms * 1e-3;
}

/* ======================================= the event loop =================================== */

static void node_read(struct redis_io *r, struct node *nd)
{
    while (nd->c) {
        ssize_t n = recv(nd->c->fd, r->rbuf, RECV_CHUNK, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            note(r, nd, "connection lost: %s", n == 0 ? "closed by the server" : strerror(errno));
            node_fail(r, nd, ECONNRESET);
            return;
        }
        if (redisReaderFeed(nd->c->reader, r->rbuf, (size_t)n) != REDIS_OK) {
            note(r, nd, "out of memory for a reply");
            node_fail(r, nd, ENOMEM);
            return;
        }
        while (nd->c && nd->q.len > 0) {
            void *rep = NULL;
            if (redisReaderGetReply(nd->c->reader, &rep) != REDIS_OK) {
                note(r, nd, "protocol error: %s", nd->c->reader->errstr);
                node_fail(r, nd, EPROTO);
                return;
            }
            if (!rep)
                break;
            struct pend p = ring_pop(&nd->q);
            nd->progress_at = kvp_time_now();
            if (!handle_reply(r, nd, p, rep))
                freeReplyObject(rep);
        }
    }
}

/* A node that owes replies and has given none for timeout_ms: its connection is dropped (its
 * requests parked or failed). */
static void check_timeouts(struct redis_io *r)
{
    double now = kvp_time_now();
    for (int i = 0; i < r->n_nodes; i++) {
        struct node *nd = &r->nodes[i];
        if (nd->c && nd->q.len > 0 && now - nd->progress_at > r->timeout_ms * 1e-3) {
            note(r, nd, "no reply within %d ms", r->timeout_ms);
            node_fail(r, nd, ETIMEDOUT);
        }
    }
}

/* Write and read what the sockets allow; with block, first sleep in poll() until a socket is
 * ready, the earliest node deadline or the parked units' resend. Returns false when nothing is
 * owed (no node owes a reply, nothing is parked). */
static bool io_round(struct redis_io *r, bool block)
{
    resend_parked(r);
    struct pollfd pfd[MAX_NODES];
    int idx[MAX_NODES], n = 0;
    double deadline = r->parked.len > 0 ? r->resend_at : 0;
    for (int i = 0; i < r->n_nodes; i++) {
        struct node *nd = &r->nodes[i];
        node_seal(r, nd);
        if (nd->c && out_sendable(r, nd))
            node_write(r, nd);
        if (!nd->c || (!nd->q.len && !out_pending(nd)))
            continue;
        double d = nd->progress_at + r->timeout_ms * 1e-3;
        if (deadline == 0 || d < deadline)
            deadline = d;
        pfd[n] = (struct pollfd){.fd = nd->c->fd,
                                 .events = (short)(POLLIN | (out_sendable(r, nd) ? POLLOUT : 0))};
        idx[n++] = i;
    }
    if (n == 0 && r->parked.len == 0)
        return false;
    if (block) {
        double left_ms = (deadline - kvp_time_now()) * 1e3;
        int ms = left_ms < 1 ? 1 : left_ms > r->timeout_ms ? r->timeout_ms : (int)left_ms + 1;
        if (poll(pfd, (nfds_t)n, ms) < 0 && errno != EINTR)
            return true;
    }
    for (int k = 0; k < n; k++) {
        struct node *nd = &r->nodes[idx[k]];
        if (block && !pfd[k].revents)
            continue;
        if (block && nd->c && (pfd[k].revents & POLLOUT))
            node_write(r, nd);
        if (nd->c)
            node_read(r, nd);
        if (nd->c && out_sendable(r, nd)) /* the replies made room in the pipeline */
            node_write(r, nd);
    }
    check_timeouts(r);
    return true;
}

/* A command on nd alone, waited for (at open, before anything else is in flight there). NULL
 * (noted) when it fails; the caller frees the reply. */
static redisReply *node_call(struct redis_io *r, struct node *nd, int argc, const char **argv,
                             const size_t *lens)
{
    r->call_reply = NULL;
    if (!node_append(r, nd, argc, argv, lens, (struct pend){.kind = PEND_CALL}))
        return NULL;
    while (!r->call_reply && nd->c && nd->q.len > 0)
        io_round(r, true);
    redisReply *rep = r->call_reply;
    r->call_reply = NULL;
    return rep;
}

/* ======================================= the backend ====================================== */

static void redis_close(struct kvp_store *s)
{
    struct redis_io *r = s->io_state;
    if (!r)
        return;
    if (r->stored) { /* delete the context's keys, waiting (bounded by the timeout) for it */
        for (int i = 0; i < r->n_nodes; i++)
            r->nodes[i].retry_at = 0; /* one more try for a node lost earlier */
        for_each_stored(r, "UNLINK", false);
        while (io_round(r, true))
            ;
    }
    for (int i = 0; i < r->n_nodes; i++) {
        if (r->nodes[i].c)
            redisFree(r->nodes[i].c);
        free(r->nodes[i].q.v);
        free(r->nodes[i].acked.v);
        free(r->nodes[i].out);
    }
    free(r->parked.v);
    free(r->stored);
    free(r->rbuf);
    free(r);
    s->io_state = NULL;
}

/* The URL's options: name, where it goes, smallest value. */
struct url_opt {
    const char *name;
    int *dst;
    long min;
};

/* A seed node of the URL (kvp_redis_seed_list): -1 for a host too long, -2 past MAX_NODES. */
static int add_seed(void *arg, const char *host, size_t host_len, int port)
{
    struct redis_io *r = arg;
    char h[sizeof(r->nodes[0].host)];
    if (host_len >= sizeof(h))
        return -1;
    memcpy(h, host, host_len);
    h[host_len] = 0;
    return node_find_or_add(r, h, port) < 0 ? -2 : 0;
}

/* redis://HOST:PORT[,HOST:PORT...][?OPTION=N&...] into r's seed nodes and options. */
static int parse_url(struct redis_io *r, const char *url, struct kvp_err *err)
{
    static const char usage[] = "expected redis://HOST:PORT[,HOST:PORT...][?OPTION=N&...]";
    const struct url_opt opts[] = {
        {"timeout_ms", &r->timeout_ms, 1},       {"ttl_ms", &r->ttl_ms, 1000},
        {"failover_ms", &r->failover_ms, 0},     {"pipeline", &r->pipeline, 1},
        {"wait_replicas", &r->wait_replicas, 0},
    };
    const int n_opts = (int)(sizeof(opts) / sizeof(opts[0]));
    if (!url || strncmp(url, "redis://", 8))
        return kvp_err_set(err, KVP_EINVAL, "--kv-url %s: %s", url ? url : "(none)", usage);
    const char *p = url + 8;
    size_t seeds = strcspn(p, "?");
    int n = kvp_redis_seed_list(p, seeds, add_seed, r);
    if (n == -2)
        return kvp_err_set(err, KVP_EINVAL, "--kv-url %s: too many nodes", url);
    if (n < 0)
        return kvp_err_set(err, KVP_EINVAL, "--kv-url %s: %s", url, usage);
    p += seeds;
    while (*p) { /* ?key=value&key=value */
        p++;
        const struct url_opt *o = NULL;
        for (int i = 0; i < n_opts && !o; i++) {
            size_t nl = strlen(opts[i].name);
            if (!strncmp(p, opts[i].name, nl) && p[nl] == '=')
                o = &opts[i];
        }
        char *end = NULL;
        long v = o ? strtol(p + strlen(o->name) + 1, &end, 10) : 0;
        if (!o || end == p + strlen(o->name) + 1 || (*end && *end != '&') || v < o->min ||
            v > OPT_MAX)
            return kvp_err_set(err, KVP_EINVAL,
                               "--kv-url %s: options are timeout_ms=1.., ttl_ms=1000..,"
                               " failover_ms=0.., pipeline=1.. and wait_replicas=0.. (at most"
                               " %ld)",
                               url, OPT_MAX);
        *o->dst = (int)v;
        p = end;
    }
    return 0;
}

/* The slot map from the first seed that answers; a server without cluster support holds every
 * slot. */
static int discover(struct redis_io *r, const char *url, struct kvp_err *err)
{
    int n_seeds = r->n_nodes;
    for (int i = 0; i < n_seeds; i++) {
        const char *argv[] = {"CLUSTER", "SLOTS"};
        const size_t lens[] = {7, 5};
        redisReply *rep = node_call(r, &r->nodes[i], 2, argv, lens);
        if (!rep)
            continue; /* the note names this seed; try the next one */
        int covered = 0;
        if (rep->type == REDIS_REPLY_ERROR) {
            freeReplyObject(rep);
            if (n_seeds > 1)
                return kvp_err_set(err, KVP_EINVAL,
                                   "--kv-url %s: %s:%d is not a cluster node;"
                                   " give one address for a single server",
                                   url, r->nodes[i].host, r->nodes[i].port);
            memset(r->slot_node, i, sizeof(r->slot_node));
            return 0;
        }
        r->cluster = true;
        covered = apply_slots(r, rep, i);
        freeReplyObject(rep);
        if (covered < 0)
            return kvp_err_set(err, KVP_EIO, "--kv-url %s: bad CLUSTER SLOTS reply from %s:%d", url,
                               r->nodes[i].host, r->nodes[i].port);
        for (int sl = 0; sl < KVP_REDIS_SLOTS; sl++)
            if (r->slot_node[sl] == NO_NODE)
                return kvp_err_set(err, KVP_EIO,
                                   "--kv-url %s: cluster slot %d has no node "
                                   "(cluster not ready?)",
                                   url, sl);
        /* every master answers now, so a dead one is an error here, not in the middle */
        bool replicated = true;
        for (int k = 0; k < r->n_nodes; k++) {
            bool used = false;
            for (int sl = 0; sl < KVP_REDIS_SLOTS && !used; sl++)
                used = r->slot_node[sl] == k;
            if (!used)
                continue;
            replicated &= r->nodes[k].n_replicas > 0;
            const char *ping[] = {"PING"};
            const size_t plen[] = {4};
            redisReply *pong = node_call(r, &r->nodes[k], 1, ping, plen);
            if (!pong)
                return kvp_err_set(err, KVP_EIO, "%s", r->why);
            freeReplyObject(pong);
        }
        /* waiting for a failover only makes sense when there is a replica to promote */
        if (r->failover_ms < 0)
            r->failover_ms = replicated ? DEFAULT_FAILOVER_MS : 0;
        return 0;
    }
    const char *msg = r->why;
    if (!strncmp(msg, "KV store: ", 10))
        msg += 10;
    return kvp_err_set(err, KVP_EIO, "--kv-url %s: no server answered (%s)", url, msg);
}

static int redis_open(struct kvp_store *s, const struct kvp_ctx_params *p, struct kvp_err *err)
{
    struct redis_io *r = calloc(1, sizeof(*r));
    if (!r)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    s->io_state = r;
    r->s = s;
    r->timeout_ms = DEFAULT_TIMEOUT_MS;
    r->ttl_ms = DEFAULT_TTL_MS;
    r->failover_ms = -1;
    r->pipeline = PIPELINE_DEPTH;
    r->wait_replicas = -1;
    memset(r->slot_node, NO_NODE, sizeof(r->slot_node));
    int rc = parse_url(r, p->kv_url, err);
    if (rc < 0)
        return rc;
    snprintf(r->ttl_str, sizeof(r->ttl_str), "%d", r->ttl_ms);
    r->rbuf = malloc(RECV_CHUNK);
    if (!r->rbuf)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    /* unique per context: pid, a counter and 32 random bits */
    static unsigned counter;
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
        rnd = (uint32_t)(kvp_time_now() * 1e9);
    snprintf(r->sid, sizeof(r->sid), "kvp:%d.%u.%08x", (int)getpid(),
             __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED), rnd);
    if ((rc = discover(r, p->kv_url, err)) < 0)
        return rc;
    if (r->failover_ms < 0) /* a single server: nothing to fail over to */
        r->failover_ms = 0;
    r->stored = calloc((size_t)s->n_layer * (size_t)s->max_blocks, 1);
    if (!r->stored)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    r->refresh_at = kvp_time_now() + r->ttl_ms * 1e-3 / 3;
    return 0;
}

static void redis_submit(struct kvp_store *s, int id)
{
    struct redis_io *r = s->io_state;
    r->rec_left[id] = s->xfer[id].n;
    r->rec_err[id] = 0;
    for (int i = 0; i < s->xfer[id].n; i++)
        send_unit(r, (struct pend){.rec = id, .unit = i}, -1, false);
}

static void redis_flush(struct kvp_store *s)
{
    struct redis_io *r = s->io_state;
    if (kvp_time_now() >= r->refresh_at) { /* renew the expiry of everything stored */
        for_each_stored(r, "PEXPIRE", true);
        r->refresh_at = kvp_time_now() + r->ttl_ms * 1e-3 / 3;
    }
    for (int i = 0; i < r->n_nodes; i++) {
        node_seal(r, &r->nodes[i]);
        if (r->nodes[i].c && out_sendable(r, &r->nodes[i]))
            node_write(r, &r->nodes[i]);
    }
}

static int redis_reap(struct kvp_store *s)
{
    struct redis_io *r = s->io_state;
    r->n_completed = 0;
    io_round(r, false);
    return r->n_completed;
}

static int redis_wait(struct kvp_store *s)
{
    struct redis_io *r = s->io_state;
    r->n_completed = 0;
    while (r->n_completed == 0) {
        if (!io_round(r, false)) { /* nothing owed: cannot happen while a record is busy */
            for (int i = 0; i < KVP_STORE_MAX_XFER; i++)
                if (s->xfer[i].busy) {
                    kvp_store_complete(s, i, -EIO, kvp_time_now());
                    r->n_completed++;
                }
            break;
        }
        if (r->n_completed == 0)
            io_round(r, true);
    }
    return r->n_completed;
}

const struct kvp_cold_ops kvp_cold_redis = {
    .name = "redis",
    .in_memory = false,
    .slow_requests = true,
    .open = redis_open,
    .close = redis_close,
    .submit = redis_submit,
    .flush = redis_flush,
    .reap = redis_reap,
    .wait = redis_wait,
};
