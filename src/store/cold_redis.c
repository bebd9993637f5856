/*
 * The Redis cold tier (cold.h): every fetch unit (layer, block) is one binary value, the key
 * "kvp:<id>:<layer>:<block>", on one Redis server or a Redis Cluster
 * (kvp_ctx_params.kv_url = redis://HOST:PORT[,HOST:PORT...][?timeout_ms=N&ttl_ms=N]). The
 * id (pid, a per-process counter and 32 random bits) is unique per context.
 *
 * I/O. One connection per node, non-blocking, driven from the table's own points rather than
 * through hiredis's async API: submit formats one GET or SET per unit (RESP, a few lines) into
 * the owning node's output buffer and notes in a ring what the reply will be for (a connection
 * answers in order); flush sends what the sockets take (MSG_NOSIGNAL: a node that died cannot
 * raise SIGPIPE in the caller's process); reap reads what has arrived without blocking and
 * parses it with hiredis's reader; wait sleeps in poll() on every busy socket until a reply or
 * a deadline. The async API would need an event loop whose only callers are these same points
 * (the decode thread is the loop already), or a second thread and locks around the hot slots.
 * This way one step's misses and the next step's prefetches are pipelined together on the same
 * connections.
 *
 * Cluster. CLUSTER SLOTS on the first seed that answers gives the slot map (an error there means
 * a single server, which then holds every slot); a key goes to the master of its CRC16 slot
 * (redis_slot.c). MOVED updates the slot, resends the command to the node named and refreshes the
 * whole map with one CLUSTER SLOTS in the background; ASK resends it once, after ASKING, without
 * touching the map; at most MAX_REDIRECTS hops per command.
 *
 * Faults are bounded: a node that closes or resets its connection fails the requests waiting on
 * it at once; one that stops answering fails them timeout_ms after its last reply; a refused
 * command (OOM under maxmemory, CLUSTERDOWN, ...) fails its request with the server's words.
 * A failed request is one clear error from the next kvp_eval (the store's sticky error); a lost
 * node is tried again no more often than once per timeout.
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

#define MAX_NODES          64 /* masters of a cluster (slot_node holds an index byte) */
#define NO_NODE            0xff
#define MAX_REDIRECTS      8 /* MOVED/ASK hops per command before it fails */
#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_TTL_MS     600000
#define KEY_CAP            96
#define RECV_CHUNK         (256 * 1024)

enum pend_kind {
    PEND_UNIT,   /* GET or SET of one unit of a transfer record */
    PEND_IGNORE, /* ASKING, PEXPIRE, UNLINK: the reply only shows the node is alive */
    PEND_SLOTS,  /* CLUSTER SLOTS refreshing the map */
    PEND_CALL,   /* a synchronous call (node_call): the reply is handed back */
};

struct pend {
    int32_t rec;       /* transfer record (PEND_UNIT) */
    int32_t unit;      /* unit within the record */
    uint8_t kind;      /* enum pend_kind */
    uint8_t redirects; /* hops so far */
};

struct node {
    char host[128];
    int port;
    redisContext *c; /* NULL: not connected */
    double retry_at; /* after a failure: no reconnect before then */
    struct pend *q;  /* ring of the replies expected, in order */
    int q_head, q_len, q_cap;
    double progress_at; /* last reply, or when the ring last became non-empty */
    char *out;          /* commands not yet written: out[out_off, out_len) */
    size_t out_off, out_len, out_cap;
};

struct redis_io {
    struct kvp_store *s;
    struct node nodes[MAX_NODES];
    int n_nodes;
    bool cluster;
    bool slots_refreshing;              /* a CLUSTER SLOTS is in flight */
    uint8_t slot_node[KVP_REDIS_SLOTS]; /* master of each slot (NO_NODE: none known) */
    char sid[48];                       /* the context's id, the keys' prefix */
    uint8_t *stored;                    /* [n_layer * max_blocks] a SET of the unit was sent */
    int rec_left[KVP_STORE_MAX_XFER];   /* units of a record not answered yet */
    int rec_err[KVP_STORE_MAX_XFER];    /* first errno among its units, or 0 */
    int n_completed;                    /* records completed since reap/wait began */
    redisReply *call_reply;             /* the reply of a PEND_CALL */
    int timeout_ms, ttl_ms;
    char ttl_str[16];
    double refresh_at; /* when the expiries are renewed next */
    char *rbuf;        /* [RECV_CHUNK] socket reads */
};

/* The first error of the store, naming the node (sticky until kvp_store_take_error). */
static void node_error(struct redis_io *r, const struct node *nd, const char *fmt, ...)
{
    struct kvp_store *s = r->s;
    if (s->err_code)
        return;
    s->err_code = KVP_EIO;
    int n = snprintf(s->err_msg, sizeof(s->err_msg), "KV store: redis %s:%d: ", nd->host, nd->port);
    if (n < 0 || (size_t)n >= sizeof(s->err_msg))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err_msg + n, sizeof(s->err_msg) - (size_t)n, fmt, ap);
    va_end(ap);
}

static int unit_key(const struct redis_io *r, int layer, int b, char *key)
{
    return snprintf(key, KEY_CAP, "%s:%d:%d", r->sid, layer, b);
}

/* ========================================== rings ========================================= */

static bool q_push(struct node *nd, struct pend p)
{
    if (nd->q_len == nd->q_cap) {
        int cap = nd->q_cap ? nd->q_cap * 2 : 1024;
        struct pend *q = malloc((size_t)cap * sizeof(*q));
        if (!q)
            return false;
        for (int i = 0; i < nd->q_len; i++)
            q[i] = nd->q[(nd->q_head + i) % nd->q_cap];
        free(nd->q);
        nd->q = q;
        nd->q_cap = cap;
        nd->q_head = 0;
    }
    if (nd->q_len == 0)
        nd->progress_at = kvp_time_now();
    nd->q[(nd->q_head + nd->q_len) % nd->q_cap] = p;
    nd->q_len++;
    return true;
}

static struct pend q_pop(struct node *nd)
{
    struct pend p = nd->q[nd->q_head];
    nd->q_head = (nd->q_head + 1) % nd->q_cap;
    nd->q_len--;
    return p;
}

/* ========================================== records ======================================= */

/* One unit of record rec answered (err 0) or failed (an errno). */
static void unit_done(struct redis_io *r, int rec, int err)
{
    if (err && !r->rec_err[rec])
        r->rec_err[rec] = err;
    if (--r->rec_left[rec] > 0)
        return;
    struct kvp_store *s = r->s;
    int res = r->rec_err[rec] ? -r->rec_err[rec] : (int)((size_t)s->xfer[rec].n * s->unit_bytes);
    kvp_store_complete(s, rec, res, kvp_time_now());
    r->n_completed++;
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

/* Every reply still expected from nd fails with err, and the connection is dropped. */
static void node_fail(struct redis_io *r, struct node *nd, int err)
{
    if (nd->c)
        redisFree(nd->c);
    nd->c = NULL;
    nd->out_off = nd->out_len = 0;
    nd->retry_at = kvp_time_now() + r->timeout_ms * 1e-3;
    while (nd->q_len > 0) {
        struct pend p = q_pop(nd);
        if (p.kind == PEND_UNIT)
            unit_done(r, p.rec, err);
        else if (p.kind == PEND_SLOTS)
            r->slots_refreshing = false;
    }
}

/* Connect to nd (non-blocking, at most timeout_ms). false with the reason in why. */
static bool node_connect(struct redis_io *r, struct node *nd, char *why, size_t cap)
{
    redisContext *c = redisConnectNonBlock(nd->host, nd->port);
    if (!c || c->err) {
        snprintf(why, cap, "cannot connect: %s", c ? c->errstr : "out of memory");
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
        snprintf(why, cap, "cannot connect: no answer within %d ms", r->timeout_ms);
    else if (rc < 0 || getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so, &len) < 0 || so)
        snprintf(why, cap, "cannot connect: %s", strerror(rc < 0 ? errno : so ? so : EIO));
    if (rc <= 0 || so) {
        redisFree(c);
        return false;
    }
    c->reader->maxbuf = 0; /* keep the reader's buffer instead of freeing it after each burst */
    nd->c = c;
    return true;
}

/* nd connected, reconnecting when its last failure is older than the timeout; false (with the
 * store's error set) when it cannot be reached. */
static bool node_ready(struct redis_io *r, struct node *nd)
{
    if (nd->c)
        return true;
    char why[160];
    if (kvp_time_now() < nd->retry_at) {
        node_error(r, nd, "unreachable (connection lost)");
        return false;
    }
    if (node_connect(r, nd, why, sizeof(why)))
        return true;
    nd->retry_at = kvp_time_now() + r->timeout_ms * 1e-3;
    node_error(r, nd, "%s", why);
    return false;
}

static bool out_put(struct node *nd, const void *p, size_t n)
{
    if (nd->out_len + n > nd->out_cap) {
        if (nd->out_off > 0) { /* drop what was sent first */
            memmove(nd->out, nd->out + nd->out_off, nd->out_len - nd->out_off);
            nd->out_len -= nd->out_off;
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

/* Append one command to nd's output and expect its reply as p. */
static bool node_append(struct redis_io *r, struct node *nd, int argc, const char **argv,
                        const size_t *lens, struct pend p)
{
    if (!node_ready(r, nd))
        return false;
    if (!out_command(nd, argc, argv, lens) || !q_push(nd, p)) {
        node_error(r, nd, "out of memory for a request");
        node_fail(r, nd, ENOMEM);
        return false;
    }
    return true;
}

static bool out_pending(const struct node *nd)
{
    return nd->out_off < nd->out_len;
}

static void node_write(struct redis_io *r, struct node *nd)
{
    while (out_pending(nd)) {
        ssize_t n = send(nd->c->fd, nd->out + nd->out_off, nd->out_len - nd->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            nd->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        node_error(r, nd, "connection lost: %s", n < 0 ? strerror(errno) : "closed");
        node_fail(r, nd, ECONNRESET);
        return;
    }
    nd->out_off = nd->out_len = 0;
}

/* ======================================== routing ========================================= */

static void send_unit(struct redis_io *r, int rec, int unit, int redirects, int ni, bool asking);

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

/* Take the masters of a CLUSTER SLOTS reply (from node `from`) into the slot map. Returns the
 * slots covered, or -1 for a malformed reply or too many nodes. */
static int apply_slots(struct redis_io *r, const redisReply *rep, int from)
{
    if (rep->type != REDIS_REPLY_ARRAY)
        return -1;
    int covered = 0;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2 ||
            e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            return -1;
        long long a = e->element[0]->integer, b = e->element[1]->integer;
        const redisReply *m = e->element[2];
        long long port = m->element[1]->integer;
        if (a < 0 || b >= KVP_REDIS_SLOTS || a > b || port <= 0 || port > 65535)
            return -1;
        /* an empty address: the node we asked does not know its own; use ours for it */
        const char *host = m->element[0]->len ? m->element[0]->str : r->nodes[from].host;
        int ni = node_find_or_add(r, host, (int)port);
        if (ni < 0)
            return -1;
        for (long long sl = a; sl <= b; sl++)
            r->slot_node[sl] = (uint8_t)ni;
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
        node_error(r, nd, "%s (%s)", msg, ni < 0 ? "bad redirection" : "too many redirections");
        unit_done(r, p.rec, EIO);
        return true;
    }
    if (!ask) {
        r->slot_node[slot] = (uint8_t)ni;
        refresh_slots(r, ni);
    }
    send_unit(r, p.rec, p.unit, p.redirects + 1, ni, ask);
    return true;
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
        node_error(r, nd, "%s of layer %d block %d refused: %s", what, x->layer, b, rep->str);
        unit_done(r, p.rec, !strncmp(rep->str, "OOM", 3) ? ENOSPC : EIO);
        return false;
    }
    if (x->write) {
        bool ok = rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "OK");
        if (!ok)
            node_error(r, nd, "write of layer %d block %d: unexpected reply", x->layer, b);
        unit_done(r, p.rec, ok ? 0 : EIO);
        return false;
    }
    if (rep->type == REDIS_REPLY_STRING && rep->len == s->unit_bytes) {
        memcpy(slot_ptr(s, x->s0 + p.unit), rep->str, s->unit_bytes);
        unit_done(r, p.rec, 0);
        return false;
    }
    if (rep->type == REDIS_REPLY_NIL)
        node_error(r, nd,
                   "read of layer %d block %d: the key is gone (expired, evicted, or "
                   "the node lost it)",
                   x->layer, b);
    else
        node_error(r, nd, "read of layer %d block %d: %zu bytes instead of %zu", x->layer, b,
                   rep->type == REDIS_REPLY_STRING ? rep->len : (size_t)0, s->unit_bytes);
    unit_done(r, p.rec, rep->type == REDIS_REPLY_NIL ? ENOENT : EIO);
    return false;
}

/* The node of a key: its slot's master, or the one server. */
static int route(const struct redis_io *r, const char *key, int klen)
{
    return r->slot_node[r->cluster ? kvp_redis_key_slot(key, (size_t)klen) : 0];
}

/* Send the GET or SET of one unit of record rec to node ni (-1: its slot's master), after
 * ASKING when asking. */
static void send_unit(struct redis_io *r, int rec, int unit, int redirects, int ni, bool asking)
{
    struct kvp_store *s = r->s;
    const struct kvp_store_xfer *x = &s->xfer[rec];
    char key[KEY_CAP];
    int klen = unit_key(r, x->layer, x->b0 + unit, key);
    if (ni < 0)
        ni = route(r, key, klen);
    if (ni == NO_NODE) {
        node_error(r, &r->nodes[0], "no node serves the slot of %s", key);
        unit_done(r, rec, EIO);
        return;
    }
    struct node *nd = &r->nodes[ni];
    struct pend p = {.rec = rec, .unit = unit, .kind = PEND_UNIT, .redirects = (uint8_t)redirects};
    if (asking) {
        const char *argv[] = {"ASKING"};
        const size_t lens[] = {6};
        if (!node_append(r, nd, 1, argv, lens, (struct pend){.kind = PEND_IGNORE})) {
            unit_done(r, rec, EIO);
            return;
        }
    }
    bool ok;
    if (x->write) {
        const char *argv[] = {"SET", key, (const char *)slot_ptr(s, x->s0 + unit), "PX",
                              r->ttl_str};
        const size_t lens[] = {3, (size_t)klen, s->unit_bytes, 2, strlen(r->ttl_str)};
        r->stored[(size_t)x->layer * s->max_blocks + (size_t)(x->b0 + unit)] = 1;
        ok = node_append(r, nd, 5, argv, lens, p);
    } else {
        const char *argv[] = {"GET", key};
        const size_t lens[] = {3, (size_t)klen};
        ok = node_append(r, nd, 2, argv, lens, p);
    }
    if (!ok)
        unit_done(r, rec, EIO);
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
            node_error(r, nd, "connection lost: %s",
                       n == 0 ? "closed by the server" : strerror(errno));
            node_fail(r, nd, ECONNRESET);
            return;
        }
        if (redisReaderFeed(nd->c->reader, r->rbuf, (size_t)n) != REDIS_OK) {
            node_error(r, nd, "out of memory for a reply");
            node_fail(r, nd, ENOMEM);
            return;
        }
        while (nd->c && nd->q_len > 0) {
            void *rep = NULL;
            if (redisReaderGetReply(nd->c->reader, &rep) != REDIS_OK) {
                node_error(r, nd, "protocol error: %s", nd->c->reader->errstr);
                node_fail(r, nd, EPROTO);
                return;
            }
            if (!rep)
                break;
            struct pend p = q_pop(nd);
            nd->progress_at = kvp_time_now();
            if (!handle_reply(r, nd, p, rep))
                freeReplyObject(rep);
        }
    }
}

/* A node that owes replies and has given none for timeout_ms fails them. */
static void check_timeouts(struct redis_io *r)
{
    double now = kvp_time_now();
    for (int i = 0; i < r->n_nodes; i++) {
        struct node *nd = &r->nodes[i];
        if (nd->c && nd->q_len > 0 && now - nd->progress_at > r->timeout_ms * 1e-3) {
            node_error(r, nd, "no reply within %d ms", r->timeout_ms);
            node_fail(r, nd, ETIMEDOUT);
        }
    }
}

/* Write and read what the sockets allow; with block, first sleep in poll() until a socket is
 * ready or the earliest node deadline. Returns false when no node owes anything. */
static bool io_round(struct redis_io *r, bool block)
{
    struct pollfd pfd[MAX_NODES];
    int idx[MAX_NODES], n = 0;
    double deadline = 0;
    for (int i = 0; i < r->n_nodes; i++) {
        struct node *nd = &r->nodes[i];
        if (nd->c && out_pending(nd))
            node_write(r, nd);
        if (!nd->c || (!nd->q_len && !out_pending(nd)))
            continue;
        double d = nd->progress_at + r->timeout_ms * 1e-3;
        if (n == 0 || d < deadline)
            deadline = d;
        pfd[n] = (struct pollfd){.fd = nd->c->fd,
                                 .events = (short)(POLLIN | (out_pending(nd) ? POLLOUT : 0))};
        idx[n++] = i;
    }
    if (n == 0)
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
        if (block && nd->c && out_pending(nd) && (pfd[k].revents & POLLOUT))
            node_write(r, nd);
        if (nd->c)
            node_read(r, nd);
    }
    check_timeouts(r);
    return true;
}

/* A command on nd alone, waited for (at open, before anything else is in flight there). NULL
 * with the store's error set when it fails; the caller frees the reply. */
static redisReply *node_call(struct redis_io *r, struct node *nd, int argc, const char **argv,
                             const size_t *lens)
{
    r->call_reply = NULL;
    if (!node_append(r, nd, argc, argv, lens, (struct pend){.kind = PEND_CALL}))
        return NULL;
    while (!r->call_reply && nd->c && nd->q_len > 0)
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
        free(r->nodes[i].q);
        free(r->nodes[i].out);
    }
    free(r->stored);
    free(r->rbuf);
    free(r);
    s->io_state = NULL;
}

/* redis://HOST:PORT[,HOST:PORT...][?timeout_ms=N&ttl_ms=N] into r's seed nodes and options. */
static int parse_url(struct redis_io *r, const char *url, struct kvp_err *err)
{
    static const char usage[] = "expected redis://HOST:PORT[,HOST:PORT...][?timeout_ms=N&ttl_ms=N]";
    if (!url || strncmp(url, "redis://", 8))
        return kvp_err_set(err, KVP_EINVAL, "--kv-url %s: %s", url ? url : "(none)", usage);
    const char *p = url + 8;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t hl = colon ? (size_t)(colon - p) : 0;
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || hl == 0 || hl >= sizeof(r->nodes[0].host) || memchr(p, ',', hl) ||
            end == colon + 1 || port <= 0 || port > 65535 || (*end && *end != ',' && *end != '?'))
            return kvp_err_set(err, KVP_EINVAL, "--kv-url %s: %s", url, usage);
        char host[128];
        memcpy(host, p, hl);
        host[hl] = 0;
        if (node_find_or_add(r, host, (int)port) < 0)
            return kvp_err_set(err, KVP_EINVAL, "--kv-url %s: too many nodes", url);
        p = end;
        if (*p != ',')
            break;
        p++;
    }
    while (*p) { /* ?key=value&key=value */
        p++;
        long *dst = NULL, v;
        long timeout = r->timeout_ms, ttl = r->ttl_ms;
        if (!strncmp(p, "timeout_ms=", 11))
            dst = &timeout, p += 11;
        else if (!strncmp(p, "ttl_ms=", 7))
            dst = &ttl, p += 7;
        char *end = NULL;
        v = dst ? strtol(p, &end, 10) : 0;
        if (!dst || end == p || (*end && *end != '&') || v < 1 || v > 86400000 ||
            (dst == &ttl && v < 1000))
            return kvp_err_set(err, KVP_EINVAL,
                               "--kv-url %s: options are timeout_ms=1..86400000"
                               " and ttl_ms=1000..86400000",
                               url);
        *dst = v;
        r->timeout_ms = (int)timeout;
        r->ttl_ms = (int)ttl;
        p = end;
    }
    return 0;
}

/* The slot map from the first seed that answers; a server without cluster support holds every
 * slot. */
static int discover(struct redis_io *r, const char *url, struct kvp_err *err)
{
    int n_seeds = r->n_nodes;
    struct kvp_store *s = r->s;
    for (int i = 0; i < n_seeds; i++) {
        const char *argv[] = {"CLUSTER", "SLOTS"};
        const size_t lens[] = {7, 5};
        redisReply *rep = node_call(r, &r->nodes[i], 2, argv, lens);
        if (!rep)
            continue;    /* the error names this seed; try the next one */
        s->err_code = 0; /* an earlier seed's failure is not the outcome */
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
        for (int k = 0; k < r->n_nodes; k++) {
            bool used = false;
            for (int sl = 0; sl < KVP_REDIS_SLOTS && !used; sl++)
                used = r->slot_node[sl] == k;
            const char *ping[] = {"PING"};
            const size_t plen[] = {4};
            redisReply *pong = used ? node_call(r, &r->nodes[k], 1, ping, plen) : NULL;
            if (used && !pong)
                return kvp_store_take_error(s, err);
            if (pong)
                freeReplyObject(pong);
        }
        return 0;
    }
    char why[sizeof(s->err_msg)];
    const char *msg = s->err_msg;
    if (!strncmp(msg, "KV store: ", 10))
        msg += 10;
    snprintf(why, sizeof(why), "%s", msg);
    s->err_code = 0;
    return kvp_err_set(err, KVP_EIO, "--kv-url %s: no server answered (%s)", url, why);
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
        send_unit(r, id, i, 0, -1, false);
}

static void redis_flush(struct kvp_store *s)
{
    struct redis_io *r = s->io_state;
    if (kvp_time_now() >= r->refresh_at) { /* renew the expiry of everything stored */
        for_each_stored(r, "PEXPIRE", true);
        r->refresh_at = kvp_time_now() + r->ttl_ms * 1e-3 / 3;
    }
    for (int i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].c && out_pending(&r->nodes[i]))
            node_write(r, &r->nodes[i]);
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
