/*
 * The shared prefix store (`kvpred serve --prefix-store redis://HOST:PORT[,...]`): prompt
 * prefixes' KV kept in a Redis Cluster (or one Redis server) that several servers share, besides
 * each server's own prefix cache (prefix.h). A document prefilled by one server is copied in by
 * every other one serving the same model file with the same KV types and block size, and by
 * any of them after a restart with nothing in RAM or on disk.
 *
 * Addressed by content. A prompt is cut into KV blocks; block b's key is a 128-bit hash chain:
 * the hash of block b-1's key and block b's token ids, the chain starting from a hash of the
 * model file's fingerprint, the KV types, the block size and the cache's shapes. So a key names
 * every token before it: two documents that begin alike share the blocks they have in common,
 * and a server of another model or layout never finds another's blocks. Block b's value holds
 * a header (its index, its key and its parent's, its token ids, a checksum of all that) and
 * the block's unit in every layer (each KV head's key block then value block, in the cache's
 * element types), each unit followed by its checksum (core/checksum.h). One SET writes a whole
 * block, so a reader finds a block complete or not at all, never torn; a prefix is the run of
 * blocks present from the first one. Everything read is checked (length, header, checksum,
 * its key and parent, its tokens against the prompt's, every unit's checksum): a block that
 * fails is refused (one log line, counted), deleted so that the next writer stores it again,
 * and the prompt is prefilled from there.
 *
 * Lookup: when a request arrives, one of two reader threads asks EXISTS for every block key of
 * its prompt in one pipelined batch (the miss cost: one round trip), then GETs the blocks of
 * the longest present run, pipelined, while the request waits for a slot. Writes (SET NX with
 * an expiry, so two servers writing the same document leave one copy and a crashed server
 * nothing forever) are made by a writer thread of their own; a read renews the expiry of the
 * blocks it used (PEXPIRE, after the request has them).
 *
 * Faults: an unreachable cluster turns the store off with one log line (and the metric
 * kvpred_prefix_store_up 0); it is tried again every few seconds and said once when it is back.
 * A master that dies is read around through its replica (prefix_redis.h). A block missing
 * (evicted, expired, lost with a master) ends the prefix there: the rest is prefilled.
 */
#ifndef KVP_SERVER_PREFIX_STORE_H
#define KVP_SERVER_PREFIX_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpred.h"

struct srv_pstore;

struct srv_pstore_config {
    const char *url;       /* redis://HOST:PORT[,HOST:PORT...][?ttl_s=N&timeout_ms=N] */
    const kvp_ctx *like;   /* a context of the slots' shape and KV types */
    uint64_t fingerprint;  /* the model file's (srv_prefix_fingerprint) */
    int min_tokens;        /* shorter prompts are not stored */
    /* called by a reader thread (no lock of the store held) when a lookup started by
     * srv_pstore_prefetch is done, so that a request held back by srv_pstore_pending can start */
    void (*on_ready)(void *arg);
    void *on_ready_arg;
};

/* 0, or an error for a bad URL, a build without hiredis, or no memory. A cluster that cannot be
 * reached is not an error: the server starts and says so once. */
int srv_pstore_open(const struct srv_pstore_config *cfg, struct srv_pstore **out,
                    struct kvp_err *err);
/* Stop the threads (what is queued for writing is written first) and free everything. */
void srv_pstore_close(struct srv_pstore *ps);

/* A request for ids[0..n) arrived: start looking its prompt up (and reading what is found) in
 * the background; `have` is what this server already holds of it. Any thread; NULL ps: none. */
void srv_pstore_prefetch(struct srv_pstore *ps, const int32_t *ids, int n, int have);

/* True while the lookup and read that srv_pstore_prefetch started for ids[0..n) runs. The
 * scheduler leaves such a request in its queue and starts others meanwhile (a slow store must
 * not stall every slot), then starts it once on_ready said the read is done. Any thread. */
bool srv_pstore_pending(struct srv_pstore *ps, const int32_t *ids, int n);

/* Copy the longest stored prefix of ids[0..n) (at most n - 2 tokens, whole blocks) into ctx when
 * it is longer than `have`, from what the read started by srv_pstore_prefetch found. Never waits
 * for the store: without a finished read it copies nothing. Returns the tokens copied in (ctx
 * then holds exactly them), 0 when none better (ctx untouched), -1 when a copy failed (ctx
 * emptied). */
int srv_pstore_load(struct srv_pstore *ps, kvp_ctx *ctx, const int32_t *ids, int n, int have);

/* The request for ids[0..n) will not load from the store (its slot's policy cannot take a
 * prefix): what was read for it goes. */
void srv_pstore_forget(struct srv_pstore *ps, const int32_t *ids, int n);

/* ctx holds the prompt ids[0..n) prefilled: store its whole blocks not yet known to be stored
 * (copied out now, written by the writer thread). */
void srv_pstore_put(struct srv_pstore *ps, kvp_ctx *ctx, const int32_t *ids, int n);

/* Append the store's Prometheus metrics to buf (snprintf-style); nothing for NULL. */
size_t srv_pstore_metrics(struct srv_pstore *ps, char *buf, size_t cap);

#endif
