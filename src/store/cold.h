/*
 * Cold-tier backends: how transfer records (struct kvp_store_xfer) between hot slots and cold
 * units travel. The store decides what moves and when; a backend only moves bytes. Shaped like
 * SQLite's sqlite3_io_methods: a table of operations plus the characteristics the store must
 * know, one file per backend or IO path (cold_ram.c; the disk tier's cold_disk.c, io_uring, and
 * cold_pread.c, threads, sharing cold_file.c; cold_redis.c) and one row per backend in
 * kvp_cold_backends (store.c). A new backend (a remote cache, another device) is one file and
 * one row.
 *
 * The store calls submit for a record it has filled in (slots, cold units, direction); the
 * backend may hold submitted records until flush; reap collects the records that finished
 * without blocking, wait blocks until at least one finishes (when any is in flight) and collects
 * it. Finished records are handed back through kvp_store_complete (store_internal.h) with the
 * bytes moved or -errno; the store checks them and may submit a failed one again (a new record
 * with the same slots and units). Only the thread that drives the forward pass calls these.
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
    /* Faults: how many times the store issues a failed record again when the error can pass
     * (kvp_store_retryable), before it gives the units up as lost (0: KVP_STORE_RETRIES). A
     * backend reports a request's failure as -errno through kvp_store_complete, may leave the
     * reason in the store's note first (kvp_store_set_note, store_internal.h), and reports a unit
     * it knows is gone outside any request with kvp_store_unit_lost (store.h). Units of
     * backends that are not in_memory are checksummed by the store. */
    int retries;
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
extern const struct kvp_cold_ops kvp_cold_disk;  /* io_uring; hands over to kvp_cold_pread */
extern const struct kvp_cold_ops kvp_cold_pread; /* the disk tier through pread threads */

/* cold_file.c: the disk tier's scratch file and IO path. */
/* Create the unnamed O_DIRECT scratch file of bytes under p->kv_dir ($TMPDIR, /tmp) into *fd;
 * KVP_EIO naming the directory and the reason. */
int kvp_cold_file_open(const struct kvp_ctx_params *p, size_t bytes, int *fd,
                       struct kvp_err *err);
/* The path asked for: p->kv_disk_io, or when AUTO the environment's KVP_DISK_IO
 * (io_uring|pread), else AUTO (enum kvp_disk_io). */
int kvp_disk_io_choice(const struct kvp_ctx_params *p);
/* One notice (kvp_set_log), the first time a process takes this path (enum kvp_disk_io). */
void kvp_disk_io_announce(int path, const char *detail);
#ifdef KVP_HAVE_HIREDIS
extern const struct kvp_cold_ops kvp_cold_redis;
#endif

#endif
