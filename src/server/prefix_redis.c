/* The prefix store's Redis Cluster client (see prefix_redis.h). */
#include "server/prefix_redis.h"

#ifdef KVP_HAVE_HIREDIS

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/platform.h"
#include "store/redis_slot.h"

#define MAX_NODES   64   /* masters and replicas (slot_master holds a byte) */
#define NO_NODE     0xff
#define MAX_HOPS    8    /* MOVED/ASK redirects of one command */
#define DOWN_S      1.0  /* a node that failed is not reconnected before this */
#define BACKOFF_MIN 0.01 /* seconds between rounds that made no progress, doubling */
#define BACKOFF_MAX 0.2

struct node {
    char host[128];
    int port;
    int master;       /* -1: a master (or not known); else the master it replicates */
    redisContext *ctx;
    bool readonly;    /* READONLY was sent on ctx (reads from a replica) */
    double down_until;
    int sent;         /* commands sent this round */
};

struct pfx_redis {
    struct node nodes[MAX_NODES];
    int n_nodes;
    uint8_t slot_master[KVP_REDIS_SLOTS];
    bool mapped;
    int refresh_next;
    int timeout_ms;
    int *hops; /* [cap] redirects per command of the running batch */
    int cap;
    char why[256];
};

static void sleep_s(double s)
{
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int node_add(struct pfx_redis *c, const char *host, size_t host_len, int port)
{
    for (int i = 0; i < c->n_nodes; i++)
        if (c->nodes[i].port == port && strlen(c->nodes[i].host) == host_len &&
            !memcmp(c->nodes[i].host, host, host_len))
            return i;
    if (c->n_nodes == MAX_NODES || host_len == 0 || host_len >= sizeof(c->nodes[0].host) ||
        port <= 0 || port > 65535)
        return -1;
    struct node *nd = &c->nodes[c->n_nodes];
    memset(nd, 0, sizeof(*nd));
    memcpy(nd->host, host, host_len);
    nd->port = port;
    nd->master = -1;
    return c->n_nodes++;
}

static int add_seed(void *arg, const char *host, size_t host_len, int port)
{
    return node_add(arg, host, host_len, port) < 0 ? -1 : 0;
}

struct pfx_redis *pfx_redis_new(const char *seeds, int timeout_ms, char *why, size_t why_cap)
{
    struct pfx_redis *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(why, why_cap, "out of memory");
        return NULL;
    }
    c->timeout_ms = timeout_ms;
    memset(c->slot_master, NO_NODE, sizeof(c->slot_master));
    if (kvp_redis_seed_list(seeds, strlen(seeds), add_seed, c) < 0) {
        snprintf(why, why_cap, "'%s' is not HOST:PORT[,HOST:PORT...] of at most %d nodes", seeds,
                 MAX_NODES);
        free(c);
        return NULL;
    }
    return c;
}

static void node_drop(struct pfx_redis *c, int i, const char *what)
{
    struct node *nd = &c->nodes[i];
    snprintf(c->why, sizeof(c->why), "%.127s:%d: %.100s", nd->host, nd->port, what);
    if (nd->ctx)
        redisFree(nd->ctx);
    nd->ctx = NULL;
    nd->readonly = false;
    nd->down_until = kvp_time_now() + DOWN_S;
    c->mapped = false; /* who owns what may have changed: ask again */
}

static bool node_connect(struct pfx_redis *c, int i)
{
    struct node *nd = &c->nodes[i];
    if (nd->ctx)
        return true;
    if (kvp_time_now() < nd->down_until)
        return false;
    struct timeval tv = {.tv_sec = c->timeout_ms / 1000, .tv_usec = (c->timeout_ms % 1000) * 1000};
    redisContext *ctx = redisConnectWithTimeout(nd->host, nd->port, tv);
    if (!ctx || ctx->err) {
        snprintf(c->why, sizeof(c->why), "%.127s:%d: %.100s", nd->host, nd->port,
                 ctx ? ctx->errstr : "out of memory");
        if (ctx)
            redisFree(ctx);
        nd->down_until = kvp_time_now() + DOWN_S;
        return false;
    }
    redisSetTimeout(ctx, tv);
    nd->ctx = ctx;
    nd->readonly = false;
    return true;
}

/* A node's synchronous command (the slot map, READONLY): its reply, or NULL (node dropped). */
static redisReply *node_call(struct pfx_redis *c, int i, const char *cmd)
{
    if (!node_connect(c, i))
        return NULL;
    redisReply *r = redisCommand(c->nodes[i].ctx, cmd);
    if (!r)
        node_drop(c, i, c->nodes[i].ctx->errstr);
    return r;
}

static bool str_elem(const redisReply *r, size_t i)
{
    return r->type == REDIS_REPLY_ARRAY && i < r->elements &&
           r->element[i]->type == REDIS_REPLY_STRING;
}
static bool int_elem(const redisReply *r, size_t i)
{
    return r->type == REDIS_REPLY_ARRAY && i < r->elements &&
           r->element[i]->type == REDIS_REPLY_INTEGER;
}

/* A node of CLUSTER SLOTS's [host, port, id, ...] (an empty host: the node asked). */
static int slots_node(struct pfx_redis *c, const redisReply *nr, int asked)
{
    if (!str_elem(nr, 0) || !int_elem(nr, 1))
        return -1;
    const char *host = nr->element[0]->str;
    size_t len = nr->element[0]->len;
    if (len == 0) {
        host = c->nodes[asked].host;
        len = strlen(host);
    }
    return node_add(c, host, len, (int)nr->element[1]->integer);
}

/* The slot map from the first node that answers: true once known. */
static bool refresh(struct pfx_redis *c)
{
    for (int k = 0; k < c->n_nodes; k++) {
        int i = (c->refresh_next + k) % c->n_nodes;
        redisReply *r = node_call(c, i, "CLUSTER SLOTS");
        if (!r)
            continue;
        bool ok = false;
        if (r->type == REDIS_REPLY_ERROR && strstr(r->str, "cluster support disabled")) {
            memset(c->slot_master, i, sizeof(c->slot_master)); /* one server holds every slot */
            c->nodes[i].master = -1;
            ok = true;
        } else if (r->type == REDIS_REPLY_ARRAY) {
            memset(c->slot_master, NO_NODE, sizeof(c->slot_master));
            for (int n = 0; n < c->n_nodes; n++)
                c->nodes[n].master = -1;
            for (size_t e = 0; e < r->elements; e++) {
                const redisReply *range = r->element[e];
                if (!int_elem(range, 0) || !int_elem(range, 1) || range->elements < 3)
                    continue;
                long long lo = range->element[0]->integer, hi = range->element[1]->integer;
                int m = slots_node(c, range->element[2], i);
                if (m < 0 || lo < 0 || hi >= KVP_REDIS_SLOTS || lo > hi)
                    continue;
                for (size_t rep = 3; rep < range->elements; rep++) {
                    int x = slots_node(c, range->element[rep], i);
                    if (x >= 0 && x != m)
                        c->nodes[x].master = m;
                }
                memset(c->slot_master + lo, m, (size_t)(hi - lo + 1));
            }
            ok = true;
        } else {
            snprintf(c->why, sizeof(c->why), "%.127s:%d: CLUSTER SLOTS: %.80s", c->nodes[i].host,
                     c->nodes[i].port, r->type == REDIS_REPLY_ERROR ? r->str : "odd reply");
        }
        freeReplyObject(r);
        if (ok) {
            c->refresh_next = i;
            c->mapped = true;
            return true;
        }
    }
    return false;
}

bool pfx_redis_connect(struct pfx_redis *c)
{
    if (!c->mapped && !refresh(c))
        return false;
    for (int i = 0; i < c->n_nodes; i++)
        if (c->nodes[i].master < 0)
            node_connect(c, i); /* the masters: a replica is connected when it is needed */
    return true;
}

/* Where command i goes this round: its slot's master, or for a read one of its replicas when
 * the master cannot be reached; -1 when none can. */
static int target(struct pfx_redis *c, const struct pfx_cmd *cmd, bool reads)
{
    int m = c->slot_master[kvp_redis_key_slot(cmd->argv[1], cmd->len[1])];
    if (m == NO_NODE)
        return -1;
    if (node_connect(c, m))
        return m;
    if (!reads)
        return -1;
    for (int r = 0; r < c->n_nodes; r++) {
        if (c->nodes[r].master != m || !node_connect(c, r))
            continue;
        if (!c->nodes[r].readonly) {
            redisReply *ro = node_call(c, r, "READONLY");
            bool ok = ro && ro->type == REDIS_REPLY_STATUS;
            if (ro)
                freeReplyObject(ro);
            if (!ok)
                continue;
            c->nodes[r].readonly = true;
        }
        return r;
    }
    return -1;
}

static bool starts(const redisReply *r, const char *what)
{
    return !strncmp(r->str, what, strlen(what));
}

int pfx_redis_run(struct pfx_redis *c, struct pfx_cmd *cmds, int n, bool reads, pfx_reply_fn fn,
                  void *arg)
{
    if (n <= 0)
        return 0;
    if (n > c->cap) {
        int *h = realloc(c->hops, (size_t)n * sizeof(int));
        if (!h) {
            snprintf(c->why, sizeof(c->why), "out of memory");
            for (int i = 0; i < n; i++)
                fn(arg, i, NULL);
            return n;
        }
        c->hops = h;
        c->cap = n;
    }
    for (int i = 0; i < n; i++) {
        cmds[i].pending = true;
        c->hops[i] = 0;
    }
    int left = n, failed = 0;
    double t_end = kvp_time_now() + c->timeout_ms / 1000.0, backoff = BACKOFF_MIN;
    while (left > 0) {
        if (!c->mapped && !refresh(c)) {
            /* no node answers at all: the cluster is down (or not there), no point waiting */
            break;
        }
        int sent = 0, done_before = n - left;
        for (int k = 0; k < c->n_nodes; k++)
            c->nodes[k].sent = 0;
        for (int i = 0; i < n; i++) {
            if (!cmds[i].pending)
                continue;
            int t = target(c, &cmds[i], reads);
            cmds[i].node = t;
            if (t < 0)
                continue;
            if (redisAppendCommandArgv(c->nodes[t].ctx, cmds[i].argc, cmds[i].argv,
                                       cmds[i].len) != REDIS_OK) {
                node_drop(c, t, "out of memory");
                cmds[i].node = -1;
                continue;
            }
            c->nodes[t].sent++;
            sent++;
        }
        /* every node's commands go out before any reply is read: the nodes work side by side */
        for (int k = 0; k < c->n_nodes; k++) {
            struct node *nd = &c->nodes[k];
            int done = 0;
            while (nd->sent && nd->ctx && !done)
                if (redisBufferWrite(nd->ctx, &done) != REDIS_OK)
                    node_drop(c, k, nd->ctx->errstr);
        }
        bool transient = false;
        for (int i = 0; i < n; i++) {
            if (!cmds[i].pending || cmds[i].node < 0)
                continue;
            struct node *nd = &c->nodes[cmds[i].node];
            if (!nd->ctx)
                continue; /* dropped: resent next round */
            redisReply *r = NULL;
            if (redisGetReply(nd->ctx, (void **)&r) != REDIS_OK || !r) {
                node_drop(c, cmds[i].node, nd->ctx->errstr);
                continue;
            }
            if (r->type == REDIS_REPLY_ERROR &&
                (starts(r, "MOVED ") || starts(r, "ASK ") || starts(r, "CLUSTERDOWN") ||
                 starts(r, "TRYAGAIN") || starts(r, "LOADING"))) {
                /* the slot moved (MOVED updates the map; ASK, a slot being migrated, is resent
                 * to the owner until the move is done) or the cluster is settling: resend */
                int slot = 0;
                char host[128];
                int port = 0;
                if (starts(r, "MOVED ") && sscanf(r->str, "MOVED %d %127[^:]:%d", &slot, host,
                                                  &port) == 3 && slot >= 0 &&
                    slot < KVP_REDIS_SLOTS) {
                    int to = node_add(c, host, strlen(host), port);
                    if (to >= 0)
                        c->slot_master[slot] = (uint8_t)to;
                    c->hops[i]++;
                } else if (starts(r, "ASK ")) {
                    c->hops[i]++;
                } else {
                    transient = true;
                }
                freeReplyObject(r);
                if (c->hops[i] > MAX_HOPS) {
                    snprintf(c->why, sizeof(c->why), "too many redirects");
                    cmds[i].pending = false;
                    left--;
                    failed++;
                    fn(arg, i, NULL);
                }
                continue;
            }
            cmds[i].pending = false;
            left--;
            fn(arg, i, r);
            freeReplyObject(r);
        }
        if (left == 0)
            break;
        if (kvp_time_now() > t_end)
            break;
        if (sent == 0 && c->mapped && !transient) {
            /* the map is known and no command could go anywhere: ask once more, then stop */
            c->mapped = false;
            if (!refresh(c))
                break;
        }
        if (n - left == done_before) {
            sleep_s(backoff);
            backoff = backoff * 2 < BACKOFF_MAX ? backoff * 2 : BACKOFF_MAX;
        }
    }
    for (int i = 0; i < n; i++)
        if (cmds[i].pending) {
            cmds[i].pending = false;
            failed++;
            fn(arg, i, NULL);
        }
    return failed;
}

const char *pfx_redis_why(const struct pfx_redis *c)
{
    return c->why;
}

void pfx_redis_free(struct pfx_redis *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_nodes; i++)
        if (c->nodes[i].ctx)
            redisFree(c->nodes[i].ctx);
    free(c->hops);
    free(c);
}

#endif
