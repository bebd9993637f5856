/*
 * Tiered KV store: the whole KV cache in a slow (cold) tier, only the blocks a step needs in a
 * small fast (hot) tier, and cross-token prefetching to hide the transfers
 * (docs/methods.md §1.9).
 *
 * Units. The transfer unit is one (layer, logical block) with the keys and values of every KV
 * head: [kv_head][K block][V block], the same per-head block layouts as kvcache.h and
 * kv_types.h (keys transposed; the cache's element types, so an f16 cache moves half the bytes
 * of f32), padded at the end to a multiple of 4 KiB so every disk request is O_DIRECT-aligned
 * in offset, length and buffer. For stories260K (4 KV heads, head_dim 8, bs 16) a head is
 * 512 bytes of f16 K+V (1 KiB in f32) and a unit is 4 KiB with half (none) of it padding; a
 * model with head_dim 64 has 4 KiB of f16 per head and never pads. A unit holds every KV head
 * because a per-head unit of a tiny model would be under the 4 KiB minimum; the price is that a
 * step moves the union of its KV heads' selections.
 *
 * Cold tier. [layer][block][unit], the whole context, in RAM (4 KiB aligned, huge-page advised)
 * or in a file opened with O_TMPFILE | O_DIRECT under kv_dir (falling back to mkstemp + unlink),
 * so the file has no name while it is used and disappears with the process, Ctrl-C included. The
 * file is reserved with fallocate up front: a full disk is one clear error at context creation,
 * not a failed write in the middle of decoding.
 *
 * Hot tier. Per layer a pool of unit-sized slots, and the kvcache's block table points into it
 * (kvp_kvcache_attach: K of head h of slot s at hot + s*unit_bytes + h*head_bytes, V k_bytes
 * later; physical block s*ppu + h, ppu the power of two >= n_kv), so the attention kernels
 * read hot copies through kvp_kvcache_kblock unchanged and see
 * NULL for a block that is not resident. Layers that are not tiered (dense layers of a sparse
 * policy; everything without a policy) get one slot per block, mapped once, and are never
 * transferred; their slots hold the untiered layout instead (all K of head 0, head 1, ...,
 * then all V), so dense attention streams them as fast as without a store. Tiered layers get
 * `hot_budget` slots with a slot map (slot -> block, block -> slot), a state per slot (empty,
 * loading, ready, plus a write-in-flight flag) and LRU replacement (a linked list per layer);
 * the block being written (the newest) is pinned. Prefill needs the whole layer: it runs in a staging
 * area of one layer (max_blocks slots), loaded from the cold tier before the layer and written
 * back after it.
 *
 * Transfers. Reads and writes are records (hot slots [s0, s0+n) <-> cold units of one layer
 * [b0, b0+n)); adjacent units that land in adjacent slots share one record. A backend
 * (cold.h: an operations table, one file each) moves them: the disk tier (cold_disk.c) submits
 * them to io_uring; the RAM tier (cold_ram.c) queues them to a transfer thread that copies and,
 * with a link model, holds each completion back until start + latency + bytes/bandwidth on a
 * serial link. Only the thread that drives the forward pass (worker 0, or the caller between
 * passes) calls the store; a backend's thread only touches its queue and the bytes.
 *
 * Files: store.c the protocol below (prefill, step, acquire, prefetch) and the transfer
 * records; residency.c slots, the slot map and LRU; cold_ram.c, cold_disk.c and cold_redis.c
 * (with redis_slot.c) the backends; stats.c counters and timeline events; timeline.c the
 * picture.
 *
 * Modes (enum kvp_prefetch): dense refetches every unit of every layer at the start of each
 * step (the offloading baseline; layer l's copies overlap the layers before it); none fetches
 * what attention selected, on demand; layer prefetches layer l+1's predicted blocks when layer
 * l starts; token prefetches layer l's predicted blocks for the next token right after layer l
 * of this token. A needed unit that is not hot nor in flight is a miss, fetched synchronously.
 * Prefetch reads are planned (slots taken, marked loading) when predicted but started only at
 * the next acquire, right after its misses, or at the end of the step: the device serves
 * requests about in order, and a miss stalls the decode thread while a prefetch does not. A
 * wait for a unit still queued starts the queue first.
 * In layer and token mode the end of a prompt copies the first decode step's predicted blocks
 * into the hot tier from the staging area, so decoding does not start cold. Write-through: the
 * newest block of each tiered layer goes to the cold tier at the end of the step that fills it
 * (async; a slot with a write in flight is never evicted nor rewritten before the write
 * completes). A partial newest block is pinned hot, so its cold copy is not needed before then;
 * prefill writes every unit it touched, partial ones included. *
 * Faults (docs/store.md, "Faults and integrity"). Every cold unit a backend outside memory holds
 * carries a checksum (core/checksum.h) kept here, computed when its write is submitted and
 * checked when a read of it completes; a unit is readable only once its last write completed
 * (unit_state). A failed, short or corrupt request is issued again up to the backend's retries
 * when the error can pass (kvp_store_retryable); a read that still fails leaves its slot not
 * ready (empty, unmapped unless it holds the newest block), a write that still fails leaves its
 * unit unreadable, and either way the unit is lost: the store no longer trusts the KV from the
 * unit's first token (and from the first token of the call that met the fault, whose forward
 * pass may have read the bad bytes). The call fails with KVP_EKVLOST, and so does every later
 * call (kvp_store_check) until the context is reset or truncated to kvp_store_trusted_tokens().
 */
#ifndef KVP_STORE_STORE_H
#define KVP_STORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "kvpred.h"
#include "kvpred_lab.h"

struct kvp_kvcache;
struct kvp_sel;

#define KVP_STORE_ALIGN 4096   /* O_DIRECT alignment and minimum unit size */
#define KVP_STORE_MAX_XFER 256 /* transfer records in flight (and io_uring depth) */

enum kvp_store_event_kind {
    KVP_EV_LAYER = 0,   /* worker 0 computing layer `layer` */
    KVP_EV_PREDICT = 1, /* next-step prediction */
    KVP_EV_WAIT = 2,    /* stalled on transfers */
    KVP_EV_READ = 3,    /* a cold-tier read in flight (submit to completion) */
    KVP_EV_WRITE = 4,   /* a write-through in flight */
    KVP_EV_TOKEN = 5,   /* a decode step (t0 start, t1 end) */
};

struct kvp_store_event {
    int kind;     /* enum kvp_store_event_kind */
    int layer;
    double t0, t1;
};

/* Test hook: make the Nth next cold-tier request (1 = the next one) fail or come back short;
 * WRITE_EIO counts and fails writes only. */
enum kvp_store_fault {
    KVP_FAULT_NONE = 0,
    KVP_FAULT_EIO = 1,
    KVP_FAULT_SHORT = 2,
    KVP_FAULT_WRITE_EIO = 3,
};

/* What the store knows of a cold unit's copy (struct kvp_store.unit_state). */
enum kvp_unit_state {
    KVP_UNIT_NONE = 0,    /* never written, or being written: not readable */
    KVP_UNIT_OK = 1,      /* its last write completed; the checksum (unit_sum) is its bytes' */
    KVP_UNIT_LOST = 2,    /* a write or read failed for good, or the backend reported it lost */
};

/* When the disk tier's requests bypass its polling kernel thread (cold_disk.c): when the host
 * has no core to spare for it (AUTO), or as tests and experiments force it. */
enum kvp_sq_bypass {
    KVP_SQ_BYPASS_AUTO = 0,
    KVP_SQ_BYPASS_ALWAYS = 1,
    KVP_SQ_BYPASS_NEVER = 2,
    KVP_SQ_BYPASS_ALTERNATE = 3, /* every other request: both rings in flight at once */
};

/* The disk tier's two rings (cold_disk.c). */
enum kvp_sq_route { KVP_SQ_ROUTE_POLLED = 0, KVP_SQ_ROUTE_DIRECT = 1 };

/* The ring of the next requests (enum kvp_sq_route) in AUTO, once per load window: route, the
 * current one; busy, the decode thread's run-queue share of the window; expired, the bypass has
 * lasted its minimum and the thread was not starved; spare, the machine's idle cores over the
 * bypass (-1: unknown, as on a host without /proc/stat). Pure, for tests. */
int kvp_sq_route(int route, double busy, bool expired, double spare);

/* The store itself (struct kvp_store) is private to src/store: store_internal.h. */
struct kvp_store;

/* Create a store for a cache of the given shape (cold tier created and reserved; hot tier for a
 * context without policy). Disk: KVP_EIO naming the directory and the reason when the scratch
 * file cannot be created or its space reserved. On failure *out is untouched. */
int kvp_store_init(const struct kvp_ctx_params *p, struct kvp_kvcache *kv, int n_layer,
                   int n_kv, int head_dim, int bs, int max_blocks, struct kvp_store **out,
                   struct kvp_err *err);
void kvp_store_free(struct kvp_store *s);

/* (Re)build the hot tier for a policy: layers [0, dense_layers) stay whole, the others get
 * hot_blocks slots (tiered). dense_layers = n_layer means no policy. Drains every transfer,
 * forgets residency and remaps the cache's table. KVP_ENOMEM. */
int kvp_store_configure(struct kvp_store *s, int dense_layers, int hot_blocks,
                        struct kvp_err *err);

/* The cache was cleared (n = 0) or truncated to n tokens: drop blocks past the end. */
void kvp_store_truncate(struct kvp_store *s, int n);

/* Prefill of tokens [pos0, end) for one layer: begin maps the layer to the staging area and
 * loads what the layer already holds; end writes the new tokens' units to the cold tier and
 * maps the layer back to its hot slots. With next (NULL: none), the predicted selections
 * next[0..n_kv) of the first decode step (n_keys_next keys), end also copies those blocks
 * into free hot slots from the staging area, so that step does not start cold. */
void kvp_store_prefill_begin(struct kvp_store *s, int layer, int pos0, int end);
/* The same for a sparse prefill, which reads only some of the blocks the layer holds: begin_some
 * loads only the blocks b < ceil(pos0 / block size) with need[b] set (the rest of the staging
 * area stays as it was: the piece must not read it), prefill_load loads more of them later
 * (blocks b < nb with need[b], none loaded before: a block the piece has written into must not
 * be loaded again). */
void kvp_store_prefill_begin_some(struct kvp_store *s, int layer, int pos0, int end,
                                  const uint8_t *need);
void kvp_store_prefill_load(struct kvp_store *s, int layer, int nb, const uint8_t *need);
void kvp_store_prefill_end(struct kvp_store *s, int layer, int pos0, int end,
                           const struct kvp_sel *next, int n_keys_next);

/* Every micro-batch of an eval (prefill or decode) begins with this: pos0 is its first token's
 * position, from which the KV is no longer trusted if the call loses data (its forward pass
 * may have read the lost bytes). kvp_store_take_error ends it. */
void kvp_store_call_begin(struct kvp_store *s, int pos0);

/* Decode step with n_tokens cached before it: begin makes every layer's newest block hot
 * (and, in dense mode, starts refetching everything); end writes the newest blocks through
 * when the step filled them and closes the step's accounting (predict_s and wait_s of the
 * step come from the calls in between). */
void kvp_store_step_begin(struct kvp_store *s, int n_tokens);
void kvp_store_step_end(struct kvp_store *s);

/* Before layer's attention with n_keys keys: make every block of sels[0..n_kv) hot (sels NULL:
 * every block), waiting for prefetches and fetching misses on demand. */
void kvp_store_acquire(struct kvp_store *s, int layer, const struct kvp_sel *sels, int n_keys);

/* kvp_store_acquire in two halves, so attention can work on the hot blocks while the misses
 * are read: begin starts the reads of the missing blocks and returns true when some needed
 * block is not hot yet; those are marked (kvp_store_pending, by block) until wait, which waits
 * for them. Nothing else may call the store in between. */
bool kvp_store_acquire_begin(struct kvp_store *s, int layer, const struct kvp_sel *sels,
                             int n_keys);
/* Optional, before acquire_begin, while the policy still selects for the layer's other KV
 * heads (disk tier): start reading the missing blocks of one KV head's selection now. They
 * stay invisible to the cache until acquire_begin, which counts them as misses. */
void kvp_store_acquire_head(struct kvp_store *s, int layer, const struct kvp_sel *sel,
                            int n_keys);
void kvp_store_acquire_wait(struct kvp_store *s);

/* Start reading the units of the predicted selections sels[0..n_kv) of layer for a step with
 * n_keys keys, into slots that hold nothing predicted (LRU); stops when no slot is free. */
void kvp_store_prefetch(struct kvp_store *s, int layer, const struct kvp_sel *sels, int n_keys);

/* Making the cold tier visible to a reader of every key (a select that reads keys, the dense
 * pass of a measurement), as the host would read the whole cache where it lives
 * (docs/methods.md §1.9). An in-memory cold tier points the table entries of the blocks
 * that are not hot at their cold copies, cheap enough for every select of a sparse layer (it first
 * waits for the layer's reads in flight, so no key is read from a half-copied slot); a device reads
 * every block of the layer that is not hot into the staging area, synchronously (the wait is
 * counted), so only for a select that reads every key (policy reads_all_keys) or a measurement;
 * otherwise such a select sees the hot blocks only (kvp_attn_dense_group skips unmapped blocks).
 * shows_cold says whether expose applies to a select; hide puts the table back (acquire_begin does
 * so too). */
bool kvp_store_shows_cold(const struct kvp_store *s, bool reads_all_keys);
void kvp_store_expose_cold(struct kvp_store *s, int layer, int n_keys);
void kvp_store_hide_cold(struct kvp_store *s, int layer, int n_keys);

/* The prefetch mode (enum kvp_prefetch) and, between acquire_begin and acquire_wait, the wait
 * state of every block ([max_blocks] enum kvp_block_wait). */
int kvp_store_mode(const struct kvp_store *s);
const uint8_t *kvp_store_pending(const struct kvp_store *s);

/* Where the units live, for tests and tools: the unit size (a multiple of KVP_STORE_ALIGN),
 * physical block ids per unit (the cache's table maps KV head h of slot s to s*ppu + h), blocks
 * per layer, and the hot tier's first byte (KVP_STORE_ALIGN aligned). */
struct kvp_store_layout {
    size_t unit_bytes;
    int ppu;
    int max_blocks;
    const uint8_t *hot;
};
void kvp_store_get_layout(const struct kvp_store *s, struct kvp_store_layout *out);

/* Record a span of worker 0 (timeline and prediction accounting). */
void kvp_store_note(struct kvp_store *s, int kind, int layer, double t0, double t1);

/* The outcome of the call that just ended: 0; KVP_EKVLOST when it lost data (the failure named)
 * or the KV was already untrusted; or, outside a call (a backend opening), a backend's note as
 * KVP_EIO. Clears the call's failure and the note, never the distrust. */
int kvp_store_take_error(struct kvp_store *s, struct kvp_err *err);
/* Before a call: 0, or KVP_EKVLOST saying from which token the KV is untrusted and why. */
int kvp_store_check(const struct kvp_store *s, struct kvp_err *err);
/* Tokens whose KV is trusted: n, or fewer after a loss (the count to truncate to). */
int kvp_store_trusted_tokens(const struct kvp_store *s, int n);
/* For backends: cold unit (layer, b) is gone (a node died without a replica, a key expired),
 * found outside any transfer. The unit is lost and the KV untrusted from its first token; why
 * (one line) goes into the error every later call returns. */
void kvp_store_unit_lost(struct kvp_store *s, int layer, int b, const char *why);
/* Whether a failed request with this -errno may succeed when issued again (EIO, a timeout, a
 * dropped connection, ...); a short transfer and a bad checksum count as passing too. */
bool kvp_store_retryable(int neg_errno);

/* Wait for every transfer in flight. */
void kvp_store_drain(struct kvp_store *s);

/* Test hook: the `after`-th next request fails (KVP_FAULT_EIO) or comes back short. */
void kvp_store_inject_fault(struct kvp_store *s, int kind, int after);
/* Test hook: from the `after`-th next request on, count requests in a row fail (count < 0:
 * every one until another injection), retries included. */
void kvp_store_inject_faults(struct kvp_store *s, int kind, int after, int count);
/* Test hook: enum kvp_sq_bypass. */
void kvp_store_force_sq_bypass(struct kvp_store *s, int mode);

/* Statistics and the timeline (stats.c): a copy of the counters; reset keeps the sizes; on
 * clears the recorded events and records up to a fixed number of them (allocated here, once),
 * off stops recording. */
void kvp_store_get_stats(const struct kvp_store *s, struct kvp_store_stats *out);
void kvp_store_reset_stats(struct kvp_store *s);
void kvp_store_record_timeline(struct kvp_store *s, bool on);
/* The events recorded since the timeline was turned on (*ev; returns how many), for tests. */
int kvp_store_events(const struct kvp_store *s, const struct kvp_store_event **ev);

/* Timeline drawing (timeline.c). */
int kvp_store_timeline_png(const struct kvp_store *s, const char *path, struct kvp_err *err);

#endif
