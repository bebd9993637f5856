/*
 * The prefix store's Redis connection (prefix_store.h): a small synchronous Redis Cluster client
 * that runs one batch of single-key commands at a time, pipelined: every command of a batch is
 * written to its slot's node before any reply is read, so a batch costs about one round trip
 * whatever its length, and the nodes work side by side.
 *
 * Each thread of the prefix store owns one client (no locks inside). The slot map comes from
 * CLUSTER SLOTS on any node that answers (a server without cluster support holds every slot);
 * MOVED updates it and resends; CLUSTERDOWN and TRYAGAIN are retried with a backoff; a node
 * that fails (refused, reset, silent for timeout_ms) is dropped, the map is asked again and its
 * commands are resent, until timeout_ms after the batch began. Reads (`reads` set) whose master
 * cannot be reached go to one of its replicas (after READONLY) at once, without waiting for the
 * cluster to promote it: a replica that lags answers "no such key", which the prefix store
 * treats as a miss. Writes go only to masters.
 *
 * Built only with hiredis (KVP_HAVE_HIREDIS); prefix_store.c says so when it is missing.
 */
#ifndef KVP_SERVER_PREFIX_REDIS_H
#define KVP_SERVER_PREFIX_REDIS_H

#include <stdbool.h>
#include <stddef.h>

#ifdef KVP_HAVE_HIREDIS
#include <hiredis/hiredis.h>

struct pfx_redis;

/* One command: argv[1] is its key. */
struct pfx_cmd {
    int argc;
    const char *argv[6];
    size_t len[6];
    int node;     /* internal: where it was sent */
    bool pending; /* internal: not answered yet */
};

/* Called once per command of a batch with its reply, or NULL when it failed for good (no node
 * reachable within the time, or too many redirects). The reply is freed after the call. */
typedef void (*pfx_reply_fn)(void *arg, int i, redisReply *r);

/* seeds: "HOST:PORT[,HOST:PORT...]". NULL with why set when a seed cannot be parsed (nothing is
 * connected yet: an unreachable cluster is found by the first batch). */
struct pfx_redis *pfx_redis_new(const char *seeds, int timeout_ms, char *why, size_t why_cap);
void pfx_redis_free(struct pfx_redis *c);

/* Connect to the nodes and learn the slot map now, so the first batch does not pay for it:
 * whether a node answered. */
bool pfx_redis_connect(struct pfx_redis *c);

/* Run cmds[0..n) and hand each reply to fn. Returns how many failed for good; n when no node
 * could be reached at all (why says the latest failure). */
int pfx_redis_run(struct pfx_redis *c, struct pfx_cmd *cmds, int n, bool reads, pfx_reply_fn fn,
                  void *arg);
const char *pfx_redis_why(const struct pfx_redis *c);
#endif

#endif
