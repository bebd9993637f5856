/*
 * kvpred_lab.h: measuring and tuning libkvpred, beside the text-generation API of kvpred.h
 * (which this header includes). What `kvpred eval`, `bench` and the tests read: the dense
 * attention a sparse step did not compute, the recovery of a policy's selection, what
 * block-sparse prefill read, and the tiered KV store's counters and timeline. docs/api.md
 * ("Measuring and tuning") describes each call.
 */
#ifndef KVPRED_LAB_H
#define KVPRED_LAB_H

#include "kvpred.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- measuring selection ------------------------------------------------------------------ */

/* Measuring: when on, every decode step also computes the dense attention of every compressed
 * layer (for measuring only; it never changes what the policy selects or attention reads). */
void kvp_ctx_set_measure(kvp_ctx *ctx, bool on);

/* Dense attention of the last decode step for (layer, query head) over its n_keys keys, or NULL
 * when measuring was off or the layer is not compressed. */
const float *kvp_ctx_dense_probs(const kvp_ctx *ctx, int layer, int head, int *n_keys);
/* The query (after RoPE, head_dim floats) behind that row, or NULL as for kvp_ctx_dense_probs. */
const float *kvp_ctx_dense_query(const kvp_ctx *ctx, int layer, int head);

/* Attention recovery of the last decode step for (layer, query head): the dense attention mass
 * on the tokens the step read. -1 when not measured. */
double kvp_ctx_recovery(const kvp_ctx *ctx, int layer, int head);

/* ---- prefill attention's statistics ------------------------------------------------------- */

/* What the prompts since the last reset did, summed over prompt pieces. keys_read / keys_seen
 * is the density: the keys gathered over the keys the query blocks could see (1 for dense). */
struct kvp_prefill_stats {
    double estimate_s;   /* thread-seconds spent estimating and on the block statistics */
    double attention_s;  /* thread-seconds in prefill attention (estimate excluded) */
    double keys_read, keys_seen; /* summed over layers, KV heads and query blocks */
    uint64_t tokens;     /* prompt tokens through prefill attention (pieces of > 1 token) */
};
void kvp_ctx_prefill_stats(const kvp_ctx *ctx, struct kvp_prefill_stats *stats);
/* The density of layer l since the reset (keys read / keys seen), -1 when no prompt ran. */
double kvp_ctx_prefill_density(const kvp_ctx *ctx, int layer);
void kvp_ctx_prefill_reset_stats(kvp_ctx *ctx);

/* ---- tuning the disk tier's io_uring ---------------------------------------------------------- */

/* kvp_ctx_params.kv_ring: how the disk tier submits its reads (docs/store.md). Zero: a kernel
 * thread polls the submission ring where the kernel allows it, on a CPU of the kernel's choice. */
struct kvp_disk_ring_params {
    bool syscall_submit; /* submit reads by syscall, not through a polling kernel thread */
    bool sq_pin;         /* polling: run the polling thread on CPU sq_cpu (keep it off the decode
                            thread's CPU); a CPU the kernel refuses is an error */
    int sq_cpu;
};

/* ---- the tiered KV store's statistics ------------------------------------------------------ */

/* Counters of the tiered store since the last kvp_ctx_store_reset_stats. A unit is one
 * (layer, block) with the K and V of every KV head (the transfer granularity). Times are
 * seconds summed over decode steps; divide by `steps` for per-token means. */
struct kvp_store_stats {
    uint64_t steps;         /* decode steps (single-token evals) counted */
    double step_s;          /* wall time of those steps */
    double compute_s;       /* step_s - predict_s - wait_s: the forward pass itself */
    double predict_s;       /* next-step prediction on the critical path (layer/token modes) */
    double transfer_s;      /* time with at least one cold-tier read or write in flight */
    double wait_s;          /* stalls: waiting for prefetches and on-demand fetches */
    uint64_t hits;          /* selected units already hot or in flight when attention asked */
    uint64_t late;          /* of the hits, units whose prefetch was still in flight */
    uint64_t misses;        /* selected units fetched on demand */
    uint64_t prefetched;    /* units read ahead of need */
    uint64_t overflow;      /* of the misses, units read past a full hot tier into the staging
                               area (raise hot_budget if this is not 0) */
    uint64_t bytes_read;    /* from the cold tier */
    uint64_t bytes_written; /* write-through to the cold tier */
    uint64_t reads, writes; /* I/O requests (a request may cover several adjacent units) */
    uint64_t misaligned;    /* disk requests not 4 KiB aligned in offset, length or buffer */
    size_t hot_bytes;       /* hot tier (including the prefill staging area) */
    size_t cold_bytes;      /* cold tier: the whole cache */
    size_t unit_bytes;      /* bytes of one unit */
    int stored_layers;      /* layers the store holds: every layer but the sliding-window ones */
    int windowed_layers;    /* sliding-window layers (Gemma 2 and 3): their rings stay in RAM in
                               the cache and never reach a tier, so hot_bytes, cold_bytes and
                               every count here leave them out */
    bool sq_poll;           /* disk reads are picked up by a polling kernel thread */
    /* Disk tier on a busy host (cold_disk.c): where the decode thread's time went and who
     * moved the reads. */
    double runq_s;          /* the decode thread runnable but not running (from schedstat) */
    double sq_runq_s;       /* the polling thread runnable but not running */
    double sq_cpu_s;        /* the polling thread on a CPU */
    double wait_sleep_s;    /* of wait_s, asleep in the kernel for a completion */
    uint64_t wait_sleeps;   /* waits that slept */
    uint64_t sq_unpicked;   /* waits that found requests the polling thread had not taken yet */
    uint64_t direct_requests; /* requests submitted by the decode thread itself, bypassing the
                               polling thread because the host had no core to spare for it */
    uint64_t bypasses;      /* times the store switched to bypassing the polling thread */
    uint64_t direct_submits; /* system calls that submitted those requests */
    /* Faults and integrity (docs/store.md) */
    int disk_io;            /* enum kvp_disk_io the disk tier runs on (URING or PREAD; 0 other
                               tiers) */
    uint64_t retries;       /* failed, short or corrupt requests issued again */
    uint64_t bad_checksums; /* units read whose checksum did not match */
    uint64_t lost_units;    /* units whose cold copy was given up (KVP_EKVLOST) */
    double checksum_s;      /* decode-thread time computing and checking unit checksums */
};

/* 0 and stats filled, or KVP_EINVAL when the context is not tiered. */
int kvp_ctx_store_stats(const kvp_ctx *ctx, struct kvp_store_stats *stats);
void kvp_ctx_store_reset_stats(kvp_ctx *ctx);

/* Timeline recording for the next decode steps: on clears the recorded events and records up to
 * a fixed number of them (preallocated; recording stops when full); off stops recording. */
void kvp_ctx_store_timeline(kvp_ctx *ctx, bool on);

/* Draw the recorded timeline as a PNG (lanes: compute per layer, prediction, stalls, transfers;
 * one vertical line per token). KVP_EINVAL when nothing was recorded, KVP_EIO when the file
 * cannot be written. */
int kvp_ctx_store_timeline_png(const kvp_ctx *ctx, const char *path, struct kvp_err *err);

#ifdef __cplusplus
}
#endif
#endif
