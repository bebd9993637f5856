/*
 * Cold-tier backends: how transfer records (struct kvp_store_xfer) between hot slots and cold
 * units travel. The store decides what moves and when; a backend only moves bytes. Shaped like
 * SQLite's sqlite3_io_methods: a table of operations plus the characteristics the store must
 * know, one file per backend (cold_ram.c, cold_disk.c, cold_redis.c) and one row per backend in
 * kvp_cold_backends (store.c). A new backend (a remote cache, another device) is one file and
 * one row.
 *
 * The store calls submit for a record it has filled in (slots, cold units, direction); the
 * backend may hold submitted records until flush; reap collects the records that finished
 * without blocking, wait blocks until at least one finishes (when any is in flight) and collects
 * it. Finished records are handed back through kvp_store_complete (store_internal.h) with the
 * bytes moved or -errno. Only the thread that drives the forward pass calls these.
 */
#ifndef KVP_STORE_COLD_H
#define KVP_STORE_COLD_H

#include <stdbool.h>

#include "core/err.h"
#include "kvpred.h"

struct kvp_store;

struct kvp_cold_ops {
    const char *name;
    /* Characteristics. in_memory: the cold units are plain memory right behind the hot slots
     * (struct kvp_store.cold), so the cache's table can point at a cold copy (a policy's select
     * then reads the whole cache where it lives) and a write-through can be a synchronous copy.
     * slow_requests: a request has latency worth hiding, so the misses of a KV head's selection
     * start while the policy still selects for the others. */
    bool in_memory;
    bool slow_requests;
    /* Open the cold tier of s->cold_bytes (file, thread, ring) into s->io; KVP_EIO/KVP_ENOMEM
     * with one clear line. close undoes it (after every transfer was collected). */
    int (*open)(struct kvp_store *s, const struct kvp_ctx_params *p, struct kvp_err *err);
    void (*close)(struct kvp_store *s);
    void (*submit)(struct kvp_store *s, int id);
    void (*flush)(struct kvp_store *s);
    int (*reap)(struct kvp_store *s);
    int (*wait)(struct kvp_store *s);
};

extern const struct kvp_cold_ops kvp_cold_ram;
extern const struct kvp_cold_ops kvp_cold_disk;
#ifdef KVP_HAVE_HIREDIS
extern const struct kvp_cold_ops kvp_cold_redis;
#endif

#endif
