/*
 * What the files of the tiered store share and nothing outside it sees: struct kvp_store itself
 * (its fields grouped by job: geometry, cold tier, hot tier and residency, the acquire in
 * progress, held-back prefetches, transfers, errors and trust, test hooks, accounting), slot
 * and cold-unit addressing, residency (residency.c), the transfer records (store.c) and the
 * accounting (stats.c). See store.h for the design. Tests include it to look inside.
 */
#ifndef KVP_STORE_STORE_INTERNAL_H
#define KVP_STORE_STORE_INTERNAL_H

#include "store/cold.h"
#include "store/store.h"
#include "kvpred_lab.h"

struct kvp_store_xfer {
    int s0, n;        /* hot slots [s0, s0+n) */
    int layer, b0;    /* cold units (layer, [b0, b0+n)) */
    bool write;       /* hot -> cold */
    bool busy;        /* record in use */
    int attempt;      /* 0, or how many times it was issued again after a failure */
    int res;          /* bytes moved or -errno (set on completion) */
    double t_submit, t_done;
};

/* A prefetch read planned but not started: hot slots [s0, s0+n) <- units (layer, [b0, b0+n)). */
struct kvp_store_run {
    int layer, b0, s0, n;
};

enum kvp_slot_state { KVP_SLOT_EMPTY = 0, KVP_SLOT_LOADING = 1, KVP_SLOT_READY = 2 };

/* What the acquire in progress still waits for, per block (struct kvp_store.pending). */
enum kvp_block_wait {
    KVP_BLOCK_HOT = 0,        /* nothing: hot, or not needed */
    KVP_BLOCK_IN_FLIGHT = 1,  /* needed and still being read */
    KVP_BLOCK_EARLY_MISS = 2, /* read started by acquire_head, not yet visible to the cache:
                                 acquire_begin counts it as a miss and maps it */
};

struct kvp_cold_ops;

struct kvp_store {
    /* geometry */
    int n_layer, n_kv, head_dim, bs, max_blocks;
    size_t k_bytes, v_bytes; /* one K (V) block of one head, in the cache's types */
    int ppu;               /* physical block ids per unit: the power of two >= n_kv */
    size_t unit_bytes;     /* n_kv * (k_bytes + v_bytes) rounded up to KVP_STORE_ALIGN */
    int mode;              /* enum kvp_prefetch, never DEFAULT */

    /* cold tier: a backend (cold.h) and its state */
    const struct kvp_cold_ops *io;
    void *io_state;        /* owned by the backend */
    uint8_t *cold;         /* in-memory backends: [n_stored][max_blocks][unit_bytes] inside the
                              hot allocation, right after the slots (cold unit (l, b) is "slot"
                              n_slot + cold_layer[l]*max_blocks + b) */
    size_t cold_bytes;

    /* hot tier: layers' slots back to back, then the staging area (residency.c) */
    uint8_t *hot;          /* owned [n_slot][unit_bytes], 4 KiB aligned, zeroed */
    int n_slot;            /* slots in total, staging included */
    int stage0;            /* first staging slot (max_blocks of them), or -1 without staging */
    int *slot0;            /* [n_layer] first slot of the layer */
    int *n_slots;          /* [n_layer] slots of the layer */
    bool *tiered;          /* [n_layer] the layer moves through the cold tier */
    bool *windowed;        /* [n_layer] a sliding-window layer: the cache keeps its ring in RAM
                              (kvcache.h), so the store never holds, maps, moves nor counts it */
    int *cold_layer;       /* [n_layer] the layer's place in the cold tier (-1: windowed) */
    int n_stored;          /* layers the store holds (n_layer - the windowed ones) */
    int32_t *res;          /* [n_layer][max_blocks] slot holding the block, or -1 */
    int32_t *slot_blk;     /* [n_slot] block held (-1: none) */
    uint8_t *slot_state;   /* [n_slot] enum kvp_slot_state */
    uint8_t *slot_writing; /* [n_slot] a write-through of the slot is in flight */
    int32_t *lru_prev, *lru_next; /* [n_slot] replacement order within a layer */
    int32_t *lru_head, *lru_tail; /* [n_layer] most and least recently used slot */
    int n_tokens;          /* tokens in the cache as the store last saw it */
    struct kvp_kvcache *kv;/* borrowed: the cache whose table points into hot */

    /* the acquire in progress (residency.c): what a layer's selection still waits for */
    uint32_t *mark;        /* [max_blocks] per-call set membership (== mark_id) */
    uint8_t *pending;      /* [max_blocks] enum kvp_block_wait of the acquire in progress */
    int acq_layer;         /* layer of the acquire in progress that must wait, or -1 */
    int acq_last;          /* its last block */
    bool acq_overflow;     /* it read blocks into the staging area */
    double acq_t0, acq_begin_s; /* when it began, and how long acquire_begin took */
    uint32_t mark_id;
    int32_t *list;         /* [max_blocks] scratch: blocks to fetch */

    /* prefetch reads held back, and blocks read past a full hot tier */
    struct kvp_store_run *deferred; /* [n_slot] prefetch reads queued until the next layer's
                              misses are submitted (or the step ends), so that a miss, which
                              the decode thread waits for, is never queued behind them */
    int n_deferred;
    int32_t *ovf;          /* [max_blocks] blocks of ovf_layer read into the staging area
                              because the layer's hot slots were all needed */
    int n_ovf;
    int ovf_layer;         /* -1: none */

    /* transfers */
    struct kvp_store_xfer xfer[KVP_STORE_MAX_XFER];
    int n_inflight;
    double busy_since;     /* first submit while idle */

    /* errors, lost data and trust (see store.h's Faults) */
    int err_code;          /* a backend's note on its latest failure (kvp_store_set_note,
                              cold_redis.c): the reason the next failed record gives; 0 if none */
    char err_msg[256];
    int fail_code;         /* KVP_EKVLOST when the current call lost data, else 0 */
    char fail_msg[512];    /* what failed first in it */
    int trust_from;        /* tokens [0, trust_from) are trusted; INT_MAX: all */
    char trust_msg[384];   /* why the rest is not */
    int call_pos0;         /* first token position the current call writes */
    uint8_t *unit_state;   /* [n_layer][max_blocks] enum kvp_unit_state */
    uint64_t *unit_sum;    /* [n_layer][max_blocks] checksum of each unit's bytes (backends
                              outside memory) */
    struct kvp_store_xfer *retry; /* [KVP_STORE_MAX_XFER] failed records to issue again */
    int n_retry;
    bool retrying;         /* submit_retries is running (no recursion through a wait) */

    /* test hooks and the disk tier's submission */
    int fault_kind;        /* enum kvp_store_fault */
    int fault_after;       /* requests left before the fault fires */
    int fault_count;       /* faults left to fire from then on, one per request (< 0: all) */
    int sq_bypass;         /* enum kvp_sq_bypass (disk tier with a polling thread) */
    /* From a layer's first acquire_head to its acquire_begin's prefetches: a backend may hold
     * requests whose submission costs a system call until then, so that the layer's early
     * misses, misses and prefetches go in one (cold_disk.c's direct ring). Waits never hold. */
    bool hold_submit;

    /* accounting (stats.c) */
    struct kvp_store_stats st;
    double step_t0;
    double st_predict0, st_wait0; /* predict_s and wait_s when the step began */
    struct kvp_store_event *ev; /* owned [ev_cap] */
    int ev_cap, n_ev;
    bool ev_on;
};

#define MAX_RUN 256 /* units per transfer record (1 MiB for 4 KiB units) */
/* Times a failed record is issued again by default (cold.h, retries): a transient EIO or a
 * dropped connection passes within one or two tries; more only delays the error. */
#define KVP_STORE_RETRIES 2

static inline uint8_t *slot_ptr(const struct kvp_store *s, int slot)
{
    return s->hot + (size_t)slot * s->unit_bytes;
}

/* Byte offset of cold unit (layer, b) in the cold tier. */
static inline size_t cold_off(const struct kvp_store *s, int layer, int b)
{
    return ((size_t)s->cold_layer[layer] * s->max_blocks + (size_t)b) * s->unit_bytes;
}

static inline int32_t *res_of(struct kvp_store *s, int layer, int b)
{
    return &s->res[(size_t)layer * s->max_blocks + b];
}

/* A layer whose every block has its own slot (dense layers, dense mode, no policy). */
static inline bool identity_layer(const struct kvp_store *s, int layer)
{
    return s->n_slots[layer] == s->max_blocks;
}

/* The newest block (being written) of the current step. */
static inline int newest_block(const struct kvp_store *s)
{
    return s->n_tokens / s->bs;
}

/* ---- residency.c: slots, the slot map and LRU ---- */

/* Point the cache's table entries of (layer, b), every KV head, at slot (or nowhere: -1). */
void kvp_res_set_table(struct kvp_store *s, int layer, int b, int slot);
/* Forget what slot holds (its table entries too) and put it at the LRU tail. */
void kvp_res_unmap_slot(struct kvp_store *s, int layer, int slot);
void kvp_res_touch(struct kvp_store *s, int layer, int slot);
/* How a newly mapped block shows in the cache's table. */
enum kvp_res_visibility {
    KVP_RES_VISIBLE = 0, /* the table points at the slot */
    KVP_RES_HIDDEN = 1,  /* left as it was, so a policy still selecting keeps seeing the block
                            as absent instead of reading a slot being filled (acquire_head) */
};
/* A slot for (layer, b), evicting the LRU block; with may_wait, waits for transfers in flight
 * when every candidate is busy. -1 when the layer has no slot to give. */
int kvp_res_alloc_slot(struct kvp_store *s, int layer, int b, bool may_wait, int visibility);
/* Mark the blocks sels[0..n_kv) read up to block last (NULL: all of [0, last]). */
void kvp_res_mark_selection(struct kvp_store *s, const struct kvp_sel *sels, int last);
/* Map every block of identity layers and nothing else; slots empty, LRU lists rebuilt. */
void kvp_res_remap_all(struct kvp_store *s);

/* ---- store.c: transfer records ---- */

/* Collect finished transfers (wait: block for at least one when any is in flight). */
int kvp_store_reap(struct kvp_store *s, bool wait);
/* Called by a backend for each finished record: res bytes moved or -errno. */
void kvp_store_complete(struct kvp_store *s, int id, int res, double t_done);

/* ---- stats.c: errors and faults ---- */

/* A backend's note on its latest failure (one line, printf-style): the reason the next record
 * that fails gives in its error. Taken (and cleared) by that record. */
void kvp_store_set_note(struct kvp_store *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Units (layer, [b0, b0+n)) are lost for the reason why: marked, the KV untrusted from the
 * first token of b0 and of the current call, and the call's failure (fail_msg) set if it is
 * the first. */
void kvp_store_lose(struct kvp_store *s, int layer, int b0, int n, const char *why);

#endif
