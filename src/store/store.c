/* Tiered KV store: the per-step protocol and the transfer records (see store.h; residency in
 * residency.c, the cold-tier backends in cold_ram.c, cold_disk.c and cold_redis.c, accounting
 * in stats.c). */
#include "store/store.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/cursor.h"
#include "core/platform.h"
#include "kv/kvcache.h"
#include "kv/sel.h"
#include "store/store_internal.h"

/* The cold-tier backends, by enum kvp_kv_tier (cold.h): one row per backend. */
static const struct kvp_cold_ops *const kvp_cold_backends[] = {
    [KVP_TIER_RAM] = &kvp_cold_ram,
    [KVP_TIER_DISK] = &kvp_cold_disk,
#ifdef KVP_HAVE_HIREDIS
    [KVP_TIER_REDIS] = &kvp_cold_redis,
#endif
};
#define N_BACKENDS (int)(sizeof(kvp_cold_backends) / sizeof(kvp_cold_backends[0]))

/* ======================================= transfers ======================================== */

bool kvp_store_retryable(int neg_errno)
{
    switch (-neg_errno) {
    case EIO:
    case EINTR:
    case EAGAIN:
    case EBUSY:
    case ETIMEDOUT:
    case ECANCELED:
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case ENOTCONN:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
        return true;
    default:
        return false;
    }
}

static uint8_t *unit_state_of(struct kvp_store *s, int layer, int b)
{
    return &s->unit_state[(size_t)layer * s->max_blocks + b];
}

/* Backends outside memory: units' bytes are checksummed on the way out and checked on the way
 * back (the RAM tier is this process's memory, with nothing below the store to corrupt it). */
static bool checksummed(const struct kvp_store *s)
{
    return !s->io->in_memory;
}

/* A write of slots [s0, s0+n) to units (layer, [b0, b0+n)) starts: the units are unreadable
 * until it completes, and their checksums are those of the slots' bytes (which no one changes
 * while a write is in flight: slot_writing). */
static void begin_write(struct kvp_store *s, int layer, int b0, int s0, int n)
{
    double t0 = checksummed(s) ? kvp_time_now() : 0;
    for (int i = 0; i < n; i++) {
        *unit_state_of(s, layer, b0 + i) = KVP_UNIT_NONE;
        if (checksummed(s))
            s->unit_sum[(size_t)layer * s->max_blocks + b0 + i] =
                kvp_checksum(slot_ptr(s, s0 + i), s->unit_bytes);
    }
    if (checksummed(s))
        s->st.checksum_s += kvp_time_now() - t0;
}

/* A read of x came back whole: 0 when every unit is readable and its bytes match its checksum;
 * 1 (a bad checksum: may pass when read again) or -1 (the unit has no good copy) with why. */
static int verify_read(struct kvp_store *s, const struct kvp_store_xfer *x, char *why, size_t cap)
{
    for (int i = 0; i < x->n; i++) {
        int st = *unit_state_of(s, x->layer, x->b0 + i);
        if (st != KVP_UNIT_OK) {
            snprintf(why, cap, "block %d %s", x->b0 + i,
                     st == KVP_UNIT_LOST ? "was lost before" : "has no complete write");
            return -1;
        }
    }
    if (!checksummed(s))
        return 0;
    double t0 = kvp_time_now();
    int bad = -1;
    for (int i = 0; i < x->n && bad < 0; i++)
        if (kvp_checksum(slot_ptr(s, x->s0 + i), s->unit_bytes) !=
            s->unit_sum[(size_t)x->layer * s->max_blocks + x->b0 + i])
            bad = x->b0 + i;
    s->st.checksum_s += kvp_time_now() - t0;
    if (bad < 0)
        return 0;
    s->st.bad_checksums++;
    snprintf(why, cap, "checksum mismatch in block %d (corrupted below the store)", bad);
    return 1;
}

/* A read into slot gave up: the slot holds no block's bytes. It is unmapped, unless it must
 * stay where it is: the newest block (the step writes its token there), a layer whose slots
 * are its blocks, the staging area; those stay mapped but not ready, and the KV is no longer
 * trusted, so nothing reads them before a truncation or reset remaps them. */
static void fail_slot(struct kvp_store *s, int layer, int b, int slot)
{
    s->slot_state[slot] = KVP_SLOT_EMPTY;
    bool own = slot >= s->slot0[layer] && slot < s->slot0[layer] + s->n_slots[layer];
    if (own && !identity_layer(s, layer) && s->slot_blk[slot] == b && b != newest_block(s))
        kvp_res_unmap_slot(s, layer, slot);
}

void kvp_store_complete(struct kvp_store *s, int id, int res, double t_done)
{
    struct kvp_store_xfer *x = &s->xfer[id];
    int want = (int)((size_t)x->n * s->unit_bytes);
    if (s->fault_kind && (s->fault_kind != KVP_FAULT_WRITE_EIO || x->write) &&
        s->fault_after > 0 && --s->fault_after == 0) {
        res = s->fault_kind == KVP_FAULT_SHORT ? want / 2 : -EIO;
        if (s->fault_count > 0)
            s->fault_count--;
        if (s->fault_count != 0)
            s->fault_after = 1; /* the next request fails too */
        else
            s->fault_kind = KVP_FAULT_NONE;
    }
    const char *what = x->write ? "write" : "read";
    char why[320];
    int fail = 0; /* 1: may pass when issued again; -1: will not */
    bool corrupt = false; /* whole, but some unit's checksum did not match */
    if (res < 0) {
        const char *note = s->err_code ? s->err_msg : strerror(-res);
        if (!strncmp(note, "KV store: ", 10))
            note += 10;
        snprintf(why, sizeof(why), "%s", note);
        fail = kvp_store_retryable(res) ? 1 : -1;
    } else if (res != want) {
        snprintf(why, sizeof(why), "short: %d of %d bytes (disk full or file truncated?)", res,
                 want);
        fail = 1;
    } else if (!x->write) {
        fail = verify_read(s, x, why, sizeof(why));
        corrupt = fail > 0;
    }
    int retries = s->io->retries > 0 ? s->io->retries : KVP_STORE_RETRIES;
    if (fail > 0 && x->attempt < retries) {
        /* slots stay loading (writing): the record goes again from the next reap on */
        s->st.retries++;
        s->retry[s->n_retry++] = *x;
    } else if (fail) {
        char line[512];
        snprintf(line, sizeof(line), "KV store: %s of layer %d blocks %d..%d failed: %s%s", what,
                 x->layer, x->b0, x->b0 + x->n - 1, why,
                 fail > 0 ? " (issued again, in vain)" : "");
        if (!corrupt)
            kvp_store_lose(s, x->layer, x->b0, x->n, line);
        for (int i = 0; i < x->n; i++) {
            uint8_t *slot = slot_ptr(s, x->s0 + i);
            if (x->write) {
                s->slot_writing[x->s0 + i] = 0;
            } else if (corrupt && kvp_checksum(slot, s->unit_bytes) ==
                                      s->unit_sum[(size_t)x->layer * s->max_blocks + x->b0 + i]) {
                s->slot_state[x->s0 + i] = KVP_SLOT_READY; /* this one came back right */
                continue;
            } else {
                fail_slot(s, x->layer, x->b0 + i, x->s0 + i);
            }
            if (corrupt) /* only the units that do not match are lost */
                kvp_store_lose(s, x->layer, x->b0 + i, 1, line);
        }
    } else {
        for (int i = 0; i < x->n; i++) {
            if (x->write) {
                s->slot_writing[x->s0 + i] = 0;
                *unit_state_of(s, x->layer, x->b0 + i) = KVP_UNIT_OK;
            } else if (s->slot_state[x->s0 + i] == KVP_SLOT_LOADING) {
                s->slot_state[x->s0 + i] = KVP_SLOT_READY;
            }
        }
    }
    if (--s->n_inflight == 0)
        s->st.transfer_s += t_done - s->busy_since;
    kvp_store_note(s, x->write ? KVP_EV_WRITE : KVP_EV_READ, x->layer, x->t_submit, t_done);
    x->busy = false;
}

static void flush(struct kvp_store *s)
{
    s->io->flush(s);
}

static void submit_retries(struct kvp_store *s);

int kvp_store_reap(struct kvp_store *s, bool wait)
{
    submit_retries(s);
    if (s->n_inflight == 0)
        return 0;
    int got = wait ? s->io->wait(s) : s->io->reap(s);
    submit_retries(s);
    return got;
}

static void submit_deferred(struct kvp_store *s);

void kvp_store_drain(struct kvp_store *s)
{
    s->hold_submit = false;
    submit_deferred(s);
    while (s->n_inflight > 0 || s->n_retry > 0)
        kvp_store_reap(s, true);
}

/* Start one transfer between slots [s0, s0+n) and cold units (layer, [b0, b0+n)), issued
 * `attempt` times before. */
static void submit_again(struct kvp_store *s, int layer, int b0, int s0, int n, bool write,
                         int attempt)
{
    int id = -1;
    for (;;) {
        for (int i = 0; i < KVP_STORE_MAX_XFER && id < 0; i++)
            if (!s->xfer[i].busy)
                id = i;
        if (id >= 0)
            break;
        kvp_store_reap(s, true);
    }
    struct kvp_store_xfer *x = &s->xfer[id];
    double now = kvp_time_now();
    *x = (struct kvp_store_xfer){.s0 = s0, .n = n, .layer = layer, .b0 = b0, .write = write,
                                 .busy = true, .attempt = attempt, .t_submit = now};
    if (write && attempt == 0)
        begin_write(s, layer, b0, s0, n);
    size_t bytes = (size_t)n * s->unit_bytes;
    if (s->n_inflight++ == 0)
        s->busy_since = now;
    if (write) {
        s->st.writes++;
        s->st.bytes_written += bytes;
    } else {
        s->st.reads++;
        s->st.bytes_read += bytes;
    }
    for (int i = 0; i < n; i++) {
        if (write)
            s->slot_writing[s0 + i] = 1;
        else
            s->slot_state[s0 + i] = KVP_SLOT_LOADING;
    }
    s->io->submit(s, id);
}

static void submit(struct kvp_store *s, int layer, int b0, int s0, int n, bool write)
{
    submit_again(s, layer, b0, s0, n, write, 0);
}

/* Issue the failed records kvp_store_complete queued again (a wait inside may queue more). */
static void submit_retries(struct kvp_store *s)
{
    if (s->retrying || s->n_retry == 0)
        return;
    s->retrying = true;
    while (s->n_retry > 0) {
        struct kvp_store_xfer r = s->retry[--s->n_retry];
        submit_again(s, r.layer, r.b0, r.s0, r.n, r.write, r.attempt + 1);
    }
    s->io->flush(s);
    s->retrying = false;
}

/* A prefetch read of slots [s0, s0+n) <- units (layer, [b0, b0+n)), planned now (slots marked
 * loading) but started only at the next acquire, after its misses, or at the end of the step
 * (struct kvp_store, deferred). */
static void defer_read(struct kvp_store *s, int layer, int b0, int s0, int n)
{
    for (int i = 0; i < n; i++)
        s->slot_state[s0 + i] = KVP_SLOT_LOADING;
    s->deferred[s->n_deferred++] =
        (struct kvp_store_run){.layer = layer, .b0 = b0, .s0 = s0, .n = n};
}

/* Start the queued prefetch reads, in the order they were planned. */
static void submit_deferred(struct kvp_store *s)
{
    int n = s->n_deferred;
    s->n_deferred = 0;
    for (int i = 0; i < n; i++)
        submit(s, s->deferred[i].layer, s->deferred[i].b0, s->deferred[i].s0, s->deferred[i].n,
               false);
    flush(s);
}

static void wait_slot(struct kvp_store *s, int slot)
{
    if (s->slot_state[slot] == KVP_SLOT_LOADING && s->n_deferred > 0)
        submit_deferred(s); /* it may be one of them */
    while (s->slot_state[slot] == KVP_SLOT_LOADING)
        kvp_store_reap(s, true);
}

static void wait_write(struct kvp_store *s, int slot)
{
    while (s->slot_writing[slot])
        kvp_store_reap(s, true);
}

/* ===================================== slot management ==================================== */

/* Mark the predicted selections sels of layer for a step with n_keys keys (up to the newest
 * block, which is hot anyway), renew the LRU stamp of those already resident and list the
 * others in s->list; returns how many are listed. */
static int predicted_missing(struct kvp_store *s, int layer, const struct kvp_sel *sels,
                             int n_keys)
{
    int last = (n_keys - 1) / s->bs, have = newest_block(s);
    if (last > have)
        last = have;
    kvp_res_mark_selection(s, sels, last);
    int n = 0;
    for (int b = 0; b <= last; b++) {
        if (s->mark[b] != s->mark_id)
            continue;
        int sl = *res_of(s, layer, b);
        if (sl >= 0)
            kvp_res_touch(s, layer, sl); /* keep it: it is predicted again */
        else
            s->list[n++] = b;
    }
    return n;
}

/* The three kinds of read the protocol makes. */
enum read_kind {
    READ_MISS,       /* acquire_begin: may wait for a slot, starts now, visible at once */
    READ_EARLY_MISS, /* acquire_head: takes free slots only, starts now, hidden from the cache
                        until acquire_begin */
    READ_PREFETCH,   /* prefetch: takes free slots only, deferred (defer_read) */
};

/* Start one run of a read of kind k. */
static void start_read(struct kvp_store *s, int kind, int layer, int b0, int s0, int n)
{
    if (kind == READ_PREFETCH)
        defer_read(s, layer, b0, s0, n);
    else
        submit(s, layer, b0, s0, n, false);
}

/* Read list[0..n) (ascending blocks) of layer into slots, merging runs that are adjacent both in
 * the cold tier and in the hot tier. Blocks that get no slot (only kinds that do not wait) are
 * compacted to the front of list; returns how many. */
static int read_blocks(struct kvp_store *s, int layer, int32_t *list, int n, int kind)
{
    const bool may_wait = kind == READ_MISS;
    const int visibility = kind == READ_EARLY_MISS ? KVP_RES_HIDDEN : KVP_RES_VISIBLE;
    int run_b = -1, run_s = -1, run_n = 0, left = 0;
    for (int i = 0; i < n; i++) {
        int b = list[i];
        int sl = kvp_res_alloc_slot(s, layer, b, may_wait, visibility);
        if (sl < 0) {
            list[left++] = b;
            continue;
        }
        wait_write(s, sl);
        if (run_n > 0 && b == run_b + run_n && sl == run_s + run_n && run_n < MAX_RUN) {
            run_n++;
            s->slot_state[sl] = KVP_SLOT_LOADING;
            continue;
        }
        if (run_n > 0)
            start_read(s, kind, layer, run_b, run_s, run_n);
        run_b = b;
        run_s = sl;
        run_n = 1;
        s->slot_state[sl] = KVP_SLOT_LOADING;
    }
    if (run_n > 0)
        start_read(s, kind, layer, run_b, run_s, run_n);
    flush(s);
    return left;
}

/* Blocks that overflowed the hot tier are read into the staging area for one layer's
 * attention; forget those mappings before anything else uses the staging area. */
static void clear_overflow(struct kvp_store *s)
{
    if (s->ovf_layer < 0)
        return;
    /* a block may have become resident since (a prefetch): point at its hot slot then */
    for (int i = 0; i < s->n_ovf; i++)
        kvp_res_set_table(s, s->ovf_layer, s->ovf[i], *res_of(s, s->ovf_layer, s->ovf[i]));
    s->n_ovf = 0;
    s->ovf_layer = -1;
}

/* ================================== lifetime and layout =================================== */

/* Cold units from block b on hold nothing any more (the cache ends before them); with no
 * untrusted token left, the KV is trusted again. */
static void forget_units_from(struct kvp_store *s, int b, int n)
{
    if (n > s->trust_from)
        return;
    for (int l = 0; l < s->n_layer; l++)
        memset(s->unit_state + (size_t)l * s->max_blocks + b, KVP_UNIT_NONE,
               (size_t)(s->max_blocks - b));
    s->trust_from = INT_MAX;
    s->trust_msg[0] = 0;
    s->fail_code = 0;
}


int kvp_store_init(const struct kvp_ctx_params *p, struct kvp_kvcache *kv, int n_layer,
                   int n_kv, int head_dim, int bs, int max_blocks, struct kvp_store **out,
                   struct kvp_err *err)
{
#ifndef KVP_HAVE_HIREDIS
    if (p->kv_tier == KVP_TIER_REDIS)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "the Redis KV tier is not built in: this kvpred "
                           "was built without hiredis (install libhiredis-dev and rebuild)");
#endif
    if (p->kv_tier <= KVP_TIER_NONE || p->kv_tier >= N_BACKENDS || !kvp_cold_backends[p->kv_tier])
        return kvp_err_set(err, KVP_EINVAL, "unknown KV tier %d", p->kv_tier);
    if (p->prefetch < KVP_PREFETCH_DEFAULT || p->prefetch > KVP_PREFETCH_TOKEN)
        return kvp_err_set(err, KVP_EINVAL, "unknown prefetch mode %d", p->prefetch);
    if (p->link_gbps < 0 || p->link_latency_us < 0)
        return kvp_err_set(err, KVP_EINVAL, "link bandwidth and latency must be >= 0");
    if ((p->link_gbps > 0 || p->link_latency_us > 0) && p->kv_tier != KVP_TIER_RAM)
        return kvp_err_set(err, KVP_EINVAL, "the link model applies to the RAM tier only");
    if (p->hot_budget < 0)
        return kvp_err_set(err, KVP_EINVAL, "hot budget must be >= 0");
    struct kvp_store *s = calloc(1, sizeof(*s));
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    s->ovf_layer = -1;
    s->n_layer = n_layer;
    s->n_kv = n_kv;
    s->head_dim = head_dim;
    s->bs = bs;
    s->max_blocks = max_blocks;
    s->k_bytes = kv->k_bytes;
    s->v_bytes = kv->v_bytes;
    s->mode = p->prefetch ? p->prefetch : KVP_PREFETCH_TOKEN;
    s->kv = kv;
    int rc;
    /* the unit: every head's K and V block, padded at the end up to a multiple of 4 KiB; block
     * ids count 2^shift per unit so the cache finds a block with a shift and a mask */
    s->ppu = 1;
    while (s->ppu < n_kv)
        s->ppu *= 2;
    s->unit_bytes = ((size_t)n_kv * (s->k_bytes + s->v_bytes) + KVP_STORE_ALIGN - 1) /
                    KVP_STORE_ALIGN * KVP_STORE_ALIGN;
    /* a sliding-window layer's ring stays in the cache (kvcache.h): no cold unit, no slot */
    s->windowed = calloc((size_t)n_layer, sizeof(bool));
    s->cold_layer = calloc((size_t)n_layer, sizeof(int));
    if (!s->windowed || !s->cold_layer) {
        rc = kvp_err_set(err, KVP_ENOMEM, "out of memory for the KV store");
        goto fail;
    }
    for (int l = 0; l < n_layer; l++) {
        s->windowed[l] = kv->ring && kv->ring[l] > 0;
        s->cold_layer[l] = s->windowed[l] ? -1 : s->n_stored++;
    }
    size_t n_units, n_cold;
    if (!kvp_mul_ok((size_t)n_layer, (size_t)max_blocks, &n_units) ||
        !kvp_mul_ok((size_t)s->n_stored, (size_t)max_blocks, &n_cold) ||
        !kvp_mul_ok(n_cold, s->unit_bytes, &s->cold_bytes)) {
        rc = kvp_err_set(err, KVP_ENOMEM, "KV store size overflows");
        goto fail;
    }
    s->list = malloc((size_t)max_blocks * sizeof(int32_t));
    s->ovf = malloc((size_t)max_blocks * sizeof(int32_t));
    s->mark = calloc((size_t)max_blocks, sizeof(uint32_t));
    s->pending = calloc((size_t)max_blocks, 1);
    s->acq_layer = -1;
    s->res = malloc(n_units * sizeof(int32_t));
    s->slot0 = calloc((size_t)n_layer, sizeof(int));
    s->n_slots = calloc((size_t)n_layer, sizeof(int));
    s->tiered = calloc((size_t)n_layer, sizeof(bool));
    s->lru_head = calloc((size_t)n_layer, sizeof(int32_t));
    s->lru_tail = calloc((size_t)n_layer, sizeof(int32_t));
    s->unit_state = calloc(n_units, 1);
    s->unit_sum = calloc(n_units, sizeof(uint64_t));
    s->retry = calloc(KVP_STORE_MAX_XFER, sizeof(*s->retry));
    s->trust_from = INT_MAX;
    s->call_pos0 = -1;
    if (!s->list || !s->ovf || !s->mark || !s->pending || !s->res || !s->slot0 || !s->n_slots ||
        !s->tiered || !s->lru_head || !s->lru_tail || !s->unit_state || !s->unit_sum ||
        !s->retry) {
        rc = kvp_err_set(err, KVP_ENOMEM, "out of memory for the KV store");
        goto fail;
    }
    s->io = kvp_cold_backends[p->kv_tier];
    if ((rc = s->io->open(s, p, err)) < 0)
        goto fail;
    s->st.cold_bytes = s->cold_bytes;
    s->st.unit_bytes = s->unit_bytes;
    s->st.stored_layers = s->n_stored;
    s->st.windowed_layers = n_layer - s->n_stored;
    if ((rc = kvp_store_configure(s, n_layer, 0, err)) < 0)
        goto fail;
    *out = s;
    return 0;

fail:
    kvp_store_free(s);
    return rc;
}

static void free_hot(struct kvp_store *s)
{
    kvp_free_aligned(s->hot);
    s->cold = NULL;
    free(s->slot_blk);
    free(s->slot_state);
    free(s->slot_writing);
    free(s->lru_prev);
    free(s->lru_next);
    free(s->deferred);
    s->deferred = NULL;
    s->n_deferred = 0;
    s->hot = NULL;
    s->slot_blk = NULL;
    s->slot_state = s->slot_writing = NULL;
    s->lru_prev = s->lru_next = NULL;
}

void kvp_store_free(struct kvp_store *s)
{
    if (!s)
        return;
    if (s->n_inflight > 0)
        kvp_store_drain(s);
    if (s->io)
        s->io->close(s);
    free_hot(s);
    free(s->list);
    free(s->ovf);
    free(s->mark);
    free(s->pending);
    free(s->res);
    free(s->slot0);
    free(s->n_slots);
    free(s->lru_head);
    free(s->lru_tail);
    free(s->tiered);
    free(s->windowed);
    free(s->cold_layer);
    free(s->unit_state);
    free(s->unit_sum);
    free(s->retry);
    free(s->ev);
    free(s);
}

int kvp_store_configure(struct kvp_store *s, int dense_layers, int hot_blocks,
                        struct kvp_err *err)
{
    kvp_store_drain(s);
    free_hot(s);
    if (hot_blocks < 2)
        hot_blocks = 2; /* the newest block and one more */
    if (hot_blocks > s->max_blocks)
        hot_blocks = s->max_blocks;
    int n = 0;
    bool staging = false;
    for (int l = 0; l < s->n_layer; l++) {
        bool dense_mode = s->mode == KVP_PREFETCH_DENSE;
        s->slot0[l] = n;
        s->n_slots[l] = s->windowed[l]                   ? 0
                        : dense_mode || l < dense_layers ? s->max_blocks
                                                         : hot_blocks;
        s->tiered[l] = !s->windowed[l] && (dense_mode || s->n_slots[l] < s->max_blocks);
        staging |= !s->windowed[l] && s->n_slots[l] < s->max_blocks;
        n += s->n_slots[l];
    }
    s->stage0 = staging ? n : -1;
    if (staging)
        n += s->max_blocks;
    s->n_slot = n;
    /* an in-memory cold tier follows the slots, so a table entry can point at a cold copy
     * (kvp_store_expose_cold) */
    size_t hot_bytes = (size_t)n * s->unit_bytes;
    size_t bytes = hot_bytes + (s->io->in_memory ? s->cold_bytes : 0);
    s->hot = kvp_alloc_huge(bytes, KVP_STORE_ALIGN);
    s->slot_blk = malloc((size_t)n * sizeof(int32_t));
    s->slot_state = malloc((size_t)n);
    s->slot_writing = calloc((size_t)n, 1);
    s->lru_prev = malloc((size_t)n * sizeof(int32_t));
    s->lru_next = malloc((size_t)n * sizeof(int32_t));
    s->deferred = malloc((size_t)n * sizeof(*s->deferred)); /* a slot is in one run at most */
    if (!s->hot || !s->slot_blk || !s->slot_state || !s->slot_writing || !s->lru_prev ||
        !s->lru_next || !s->deferred) {
        free_hot(s);
        return kvp_err_set(err, KVP_ENOMEM, "cannot allocate the hot KV tier (%zu MiB)",
                           (size_t)n * s->unit_bytes >> 20);
    }
    memset(s->hot, 0, bytes); /* touches every page now, not while timing */
    s->cold = s->io->in_memory ? s->hot + hot_bytes : NULL;
    s->st.hot_bytes = hot_bytes;
    /* Tiered layers (and the staging area and RAM cold units after the slots) use the unit
     * layout, K and V of a head interleaved. A layer that is never transferred has the
     * untiered layout inside its max_blocks slots, [K: head][block] then [V: head][block]:
     * dense attention then streams each head's keys instead of taking 1 KiB from every 4 KiB
     * page (2 dense layers of stories260K at 32K: 2.4 ms more per token). */
    for (int l = 0; l < s->n_layer; l++) {
        if (s->windowed[l])
            continue; /* its ring's memory is the cache's own */
        int shift = __builtin_ctz((unsigned)s->ppu);
        struct kvp_kvpool pool = {.k = s->hot, .v = s->hot + s->k_bytes,
                                  .k_unit = s->unit_bytes, .v_unit = s->unit_bytes,
                                  .stride = s->k_bytes + s->v_bytes, .shift = shift,
                                  .mask = (uint32_t)s->ppu - 1};
        if (!s->tiered[l]) {
            uint8_t *k = slot_ptr(s, s->slot0[l]);
            pool = (struct kvp_kvpool){.k = k,
                                       .v = k + (size_t)s->n_kv * s->max_blocks * s->k_bytes,
                                       .k_unit = s->k_bytes, .v_unit = s->v_bytes};
        }
        kvp_kvcache_attach(s->kv, l, pool);
    }
    kvp_res_remap_all(s);
    s->n_tokens = 0;
    forget_units_from(s, 0, 0);
    return 0;
}

void kvp_store_truncate(struct kvp_store *s, int n)
{
    kvp_store_drain(s);
    forget_units_from(s, (n + s->bs - 1) / s->bs, n);
    if (n == 0) {
        kvp_res_remap_all(s);
        s->n_tokens = 0;
        s->err_code = 0;
        return;
    }
    clear_overflow(s);
    int keep = (n + s->bs - 1) / s->bs;
    for (int l = 0; l < s->n_layer; l++) {
        if (identity_layer(s, l))
            continue;
        for (int sl = s->slot0[l]; sl < s->slot0[l] + s->n_slots[l]; sl++)
            if (s->slot_blk[sl] >= keep)
                kvp_res_unmap_slot(s, l, sl);
    }
    s->n_tokens = n;
}

void kvp_store_inject_faults(struct kvp_store *s, int kind, int after, int count)
{
    s->fault_kind = count != 0 ? kind : KVP_FAULT_NONE;
    s->fault_after = after;
    s->fault_count = count;
}

void kvp_store_inject_fault(struct kvp_store *s, int kind, int after)
{
    kvp_store_inject_faults(s, kind, after, 1);
}

void kvp_store_call_begin(struct kvp_store *s, int pos0)
{
    s->call_pos0 = pos0;
}

void kvp_store_force_sq_bypass(struct kvp_store *s, int mode)
{
    s->sq_bypass = mode;
}

/* ======================================== prefill ========================================= */

/* Start reading every block of layer below nb that is not hot from the cold tier into its
 * staging slot, in runs (staging slots are consecutive like the cold units, so a run of cold
 * blocks travels as one request of at most MAX_RUN units). */
static void read_cold_to_staging(struct kvp_store *s, int layer, int nb, const uint8_t *need)
{
    int run0 = -1;
    for (int b = 0; b <= nb; b++) {
        bool cold = b < nb && *res_of(s, layer, b) < 0 && (!need || need[b]);
        if (cold && run0 < 0)
            run0 = b;
        if (run0 >= 0 && (!cold || b - run0 == MAX_RUN)) {
            submit(s, layer, run0, s->stage0 + run0, b - run0, false);
            run0 = cold ? b : -1;
        }
    }
}

/* Blocks [0, nb) of the layer that need[b] names (NULL: all) into their staging slots: hot copies
 * as they are, the rest from the cold tier. */
static void stage_old(struct kvp_store *s, int layer, int nb, const uint8_t *need)
{
    read_cold_to_staging(s, layer, nb, need);
    for (int b = 0; b < nb; b++) {
        int sl = *res_of(s, layer, b);
        if (sl >= 0 && (!need || need[b]))
            memcpy(slot_ptr(s, s->stage0 + b), slot_ptr(s, sl), s->unit_bytes);
    }
    kvp_store_drain(s);
}

void kvp_store_prefill_begin_some(struct kvp_store *s, int layer, int pos0, int end,
                                  const uint8_t *need)
{
    if (identity_layer(s, layer) || s->windowed[layer])
        return;
    kvp_store_drain(s);
    clear_overflow(s);
    int nb_old = (pos0 + s->bs - 1) / s->bs, nb_end = (end + s->bs - 1) / s->bs;
    for (int b = 0; b < nb_end; b++)
        kvp_res_set_table(s, layer, b, s->stage0 + b);
    stage_old(s, layer, nb_old, need);
}

void kvp_store_prefill_begin(struct kvp_store *s, int layer, int pos0, int end)
{
    kvp_store_prefill_begin_some(s, layer, pos0, end, NULL);
}

void kvp_store_prefill_load(struct kvp_store *s, int layer, int nb, const uint8_t *need)
{
    if (!identity_layer(s, layer) && !s->windowed[layer])
        stage_old(s, layer, nb, need);
}

void kvp_store_prefill_end(struct kvp_store *s, int layer, int pos0, int end,
                           const struct kvp_sel *next, int n_keys_next)
{
    s->n_tokens = end;
    if (s->windowed[layer])
        return;
    if (identity_layer(s, layer)) {
        if (s->tiered[layer]) /* dense mode: the cold tier holds every layer */
            for (int b = pos0 / s->bs; b < (end + s->bs - 1) / s->bs; b += MAX_RUN) {
                int nb = (end + s->bs - 1) / s->bs - b;
                submit(s, layer, b, s->slot0[layer] + b, nb < MAX_RUN ? nb : MAX_RUN, true);
            }
        kvp_store_drain(s);
        return;
    }
    int first = pos0 / s->bs, nb_end = (end + s->bs - 1) / s->bs;
    for (int b = first; b < nb_end; b += MAX_RUN) {
        int nb = nb_end - b < MAX_RUN ? nb_end - b : MAX_RUN;
        submit(s, layer, b, s->stage0 + b, nb, true);
    }
    kvp_store_drain(s);
    for (int b = 0; b < nb_end; b++) {
        int sl = *res_of(s, layer, b);
        if (sl >= 0 && b >= first)
            memcpy(slot_ptr(s, sl), slot_ptr(s, s->stage0 + b), s->unit_bytes);
        kvp_res_set_table(s, layer, b, sl);
    }
    /* the block the next token is written into stays hot */
    int nb = end / s->bs;
    if (end % s->bs && *res_of(s, layer, nb) < 0) {
        s->mark_id++;
        int sl = kvp_res_alloc_slot(s, layer, nb, true, KVP_RES_VISIBLE);
        if (sl >= 0) { /* always: a layer has at least 2 slots and nothing is in flight */
            memcpy(slot_ptr(s, sl), slot_ptr(s, s->stage0 + nb), s->unit_bytes);
            s->slot_state[sl] = KVP_SLOT_READY;
        }
    }
    if (!next)
        return;
    /* the first decode step's predicted blocks: copies from the staging area, which holds the
     * whole layer now, instead of reads on demand (every selected unit missed otherwise) */
    int n = predicted_missing(s, layer, next, n_keys_next);
    for (int i = 0; i < n; i++) {
        int b = s->list[i], sl = kvp_res_alloc_slot(s, layer, b, false, KVP_RES_VISIBLE);
        if (sl < 0)
            break;
        memcpy(slot_ptr(s, sl), slot_ptr(s, s->stage0 + b), s->unit_bytes);
        s->slot_state[sl] = KVP_SLOT_READY;
        s->st.prefetched++;
    }
}

/* ========================================= decode ========================================= */

void kvp_store_step_begin(struct kvp_store *s, int n_tokens)
{
    double t0 = kvp_time_now();
    s->step_t0 = t0;
    s->hold_submit = false;
    s->st_predict0 = s->st.predict_s;
    s->st_wait0 = s->st.wait_s;
    s->n_tokens = n_tokens;
    kvp_store_reap(s, false);
    int nb = newest_block(s);
    bool stalled = false;
    for (int l = 0; l < s->n_layer; l++) {
        if (!s->tiered[l])
            continue;
        int sl = *res_of(s, l, nb);
        if (sl < 0) {
            s->mark_id++;
            sl = kvp_res_alloc_slot(s, l, nb, true, KVP_RES_VISIBLE);
            if (sl < 0) /* cannot happen: nothing is marked and transfers were waited for */
                continue;
            if (n_tokens % s->bs) { /* the block holds tokens: bring it back */
                s->st.misses++;
                submit(s, l, nb, sl, 1, false);
                stalled = true;
            } else {
                s->slot_state[sl] = KVP_SLOT_READY;
            }
        }
        if (s->slot_state[sl] == KVP_SLOT_LOADING) {
            wait_slot(s, sl);
            stalled = true;
        }
        if (s->mode != KVP_PREFETCH_DENSE || nb == 0)
            continue;
        /* dense offload: every other unit of the layer comes from the cold tier again */
        for (int b = 0; b < nb; b++)
            wait_write(s, s->slot0[l] + b);
        for (int b = 0; b < nb; b += MAX_RUN)
            submit(s, l, b, s->slot0[l] + b, nb - b < MAX_RUN ? nb - b : MAX_RUN, false);
    }
    flush(s);
    if (stalled) {
        double t1 = kvp_time_now();
        s->st.wait_s += t1 - t0;
        kvp_store_note(s, KVP_EV_WAIT, -1, t0, t1);
    }
}

void kvp_store_step_end(struct kvp_store *s)
{
    s->hold_submit = false;
    clear_overflow(s);
    submit_deferred(s);
    int nb = newest_block(s);
    /* Write-through once the block is full. Until then it is the newest block, pinned hot, so
     * its cold copy is never read: a truncation either keeps it (and it stays newest and hot)
     * or drops it, and an earlier block that becomes the newest again was written when it
     * filled up (or by prefill_end). */
    bool full = (s->n_tokens + 1) % s->bs == 0;
    for (int l = 0; l < s->n_layer; l++) {
        if (!s->tiered[l] || !full)
            continue;
        int sl = *res_of(s, l, nb);
        if (s->io->in_memory) {
            /* a 4 KiB copy per layer: synchronous, so the next token's store never races it */
            memcpy(s->cold + cold_off(s, l, nb), slot_ptr(s, sl), s->unit_bytes);
            *unit_state_of(s, l, nb) = KVP_UNIT_OK;
            s->st.writes++;
            s->st.bytes_written += s->unit_bytes;
            continue;
        }
        wait_write(s, sl);
        submit(s, l, nb, sl, 1, true);
    }
    flush(s);
    double t1 = kvp_time_now(), dt = t1 - s->step_t0;
    s->st.steps++;
    s->st.step_s += dt;
    s->st.compute_s += dt - (s->st.predict_s - s->st_predict0) - (s->st.wait_s - s->st_wait0);
    s->n_tokens++;
    kvp_store_note(s, KVP_EV_TOKEN, -1, s->step_t0, t1);
}

void kvp_store_acquire_head(struct kvp_store *s, int layer, const struct kvp_sel *sel, int n_keys)
{
    if (!s->tiered[layer] || s->mode == KVP_PREFETCH_DENSE || !s->io->slow_requests ||
        identity_layer(s, layer))
        return;
    kvp_store_reap(s, false);
    s->hold_submit = true; /* until acquire_begin */
    int last = (n_keys - 1) / s->bs, n = 0;
    kvp_res_mark_selection(s, sel, last); /* this head's blocks are not evicted for each other */
    for (int i = 0; i < sel->n && sel->blocks[i] <= last; i++) {
        int b = sel->blocks[i];
        if (*res_of(s, layer, b) < 0) /* the newest block is always hot (step_begin) */
            s->list[n++] = b;
    }
    for (int i = 0; i < n; i++)
        s->pending[s->list[i]] = KVP_BLOCK_EARLY_MISS;
    int left = read_blocks(s, layer, s->list, n, READ_EARLY_MISS);
    for (int i = 0; i < left; i++) /* no slot for them now: acquire_begin reads them */
        s->pending[s->list[i]] = KVP_BLOCK_HOT;
    s->st.misses += (uint64_t)(n - left);
}

bool kvp_store_acquire_begin(struct kvp_store *s, int layer, const struct kvp_sel *sels,
                             int n_keys)
{
    if (!s->tiered[layer])
        return false;
    double t0 = kvp_time_now();
    clear_overflow(s);
    s->hold_submit = true; /* the misses go with the prefetches below */
    kvp_store_reap(s, false); /* reads that finished since: hits, not late ones */
    int last = (n_keys - 1) / s->bs;
    kvp_res_mark_selection(s, s->mode == KVP_PREFETCH_DENSE ? NULL : sels, last);
    s->mark[last] = s->mark_id;
    int n_miss = 0;
    bool stalled = false;
    for (int b = 0; b <= last; b++) {
        if (s->mark[b] != s->mark_id)
            continue;
        int sl = *res_of(s, layer, b);
        if (sl < 0) {
            s->list[n_miss++] = b;
            s->pending[b] = KVP_BLOCK_IN_FLIGHT;
            continue;
        }
        kvp_res_touch(s, layer, sl);
        if (s->pending[b] == KVP_BLOCK_EARLY_MISS) { /* acquire_head started it */
            kvp_res_set_table(s, layer, b, sl);
            bool loading = s->slot_state[sl] == KVP_SLOT_LOADING;
            s->pending[b] = loading ? KVP_BLOCK_IN_FLIGHT : KVP_BLOCK_HOT;
            stalled |= loading;
            continue;
        }
        s->st.hits++;
        if (s->slot_state[sl] == KVP_SLOT_LOADING) {
            s->st.late++;
            s->pending[b] = KVP_BLOCK_IN_FLIGHT;
            stalled = true;
        }
    }
    s->st.misses += (uint64_t)n_miss;
    stalled |= n_miss > 0;
    int left = read_blocks(s, layer, s->list, n_miss, READ_MISS);
    /* more blocks than hot slots: read the rest into the staging area for this layer only */
    if (left > 0 && s->stage0 >= 0) {
        s->ovf_layer = layer;
        for (int i = 0; i < left; i++) {
            int b = s->list[i];
            s->ovf[s->n_ovf++] = b;
            kvp_res_set_table(s, layer, b, s->stage0 + b);
            submit(s, layer, b, s->stage0 + b, 1, false);
        }
        s->st.overflow += (uint64_t)left;
        flush(s);
    }
    s->hold_submit = false;
    submit_deferred(s); /* the prefetches planned since the last acquire queue behind the misses */
    s->acq_layer = stalled ? layer : -1;
    s->acq_last = last;
    s->acq_overflow = left > 0;
    s->acq_t0 = t0;
    s->acq_begin_s = kvp_time_now() - t0;
    return stalled;
}

void kvp_store_acquire_wait(struct kvp_store *s)
{
    int layer = s->acq_layer;
    if (layer < 0)
        return;
    double t0 = kvp_time_now();
    for (int b = 0; b <= s->acq_last; b++) {
        if (s->mark[b] != s->mark_id)
            continue;
        int sl = *res_of(s, layer, b);
        if (sl >= 0)
            wait_slot(s, sl);
        s->pending[b] = KVP_BLOCK_HOT;
    }
    if (s->acq_overflow)
        kvp_store_drain(s);
    double t1 = kvp_time_now();
    /* the wait is the time the decode thread could do nothing else: acquire_begin's own work
     * and this call, not what ran in between */
    s->st.wait_s += s->acq_begin_s + (t1 - t0);
    kvp_store_note(s, KVP_EV_WAIT, layer, s->acq_t0, s->acq_t0 + s->acq_begin_s);
    kvp_store_note(s, KVP_EV_WAIT, layer, t0, t1);
    s->acq_layer = -1;
}

void kvp_store_acquire(struct kvp_store *s, int layer, const struct kvp_sel *sels, int n_keys)
{
    if (kvp_store_acquire_begin(s, layer, sels, n_keys))
        kvp_store_acquire_wait(s);
}

void kvp_store_prefetch(struct kvp_store *s, int layer, const struct kvp_sel *sels, int n_keys)
{
    if (!s->tiered[layer] || s->mode == KVP_PREFETCH_DENSE || identity_layer(s, layer))
        return;
    int n = predicted_missing(s, layer, sels, n_keys);
    int left = read_blocks(s, layer, s->list, n, READ_PREFETCH);
    s->st.prefetched += (uint64_t)(n - left);
}

static void load_cold(struct kvp_store *s, int layer, int n_keys)
{
    if (s->io->in_memory || !s->tiered[layer] || identity_layer(s, layer) ||
        s->stage0 < 0)
        return;
    double t0 = kvp_time_now();
    clear_overflow(s);
    s->ovf_layer = layer;
    int nb = (n_keys + s->bs - 1) / s->bs;
    /* every block that is not hot, from the cold tier into its staging slot, and the table
     * points there; the next acquire_begin points it back (clear_overflow) */
    read_cold_to_staging(s, layer, nb, NULL);
    for (int b = 0; b < nb; b++)
        if (*res_of(s, layer, b) < 0) {
            s->ovf[s->n_ovf++] = b;
            kvp_res_set_table(s, layer, b, s->stage0 + b);
        }
    kvp_store_drain(s);
    double t1 = kvp_time_now();
    s->st.wait_s += t1 - t0;
    kvp_store_note(s, KVP_EV_WAIT, layer, t0, t1);
}

static void map_cold(struct kvp_store *s, int layer, int n_keys, bool on)
{
    if (!s->io->in_memory || !s->tiered[layer] || identity_layer(s, layer))
        return;
    int nb = (n_keys + s->bs - 1) / s->bs;
    int base = s->n_slot + s->cold_layer[layer] * s->max_blocks;
    /* a prefetch of this layer may still be copying into a hot slot that the table already
     * points at (layer mode starts it one layer early): select must not read half a block */
    if (on)
        for (int sl = s->slot0[layer]; sl < s->slot0[layer] + s->n_slots[layer]; sl++)
            wait_slot(s, sl);
    for (int b = 0; b < nb; b++)
        if (*res_of(s, layer, b) < 0)
            kvp_res_set_table(s, layer, b, on ? base + b : -1);
}

bool kvp_store_shows_cold(const struct kvp_store *s, bool reads_all_keys)
{
    return s->io->in_memory || reads_all_keys;
}

void kvp_store_expose_cold(struct kvp_store *s, int layer, int n_keys)
{
    if (s->io->in_memory)
        map_cold(s, layer, n_keys, true);
    else
        load_cold(s, layer, n_keys);
}

void kvp_store_hide_cold(struct kvp_store *s, int layer, int n_keys)
{
    if (s->io->in_memory)
        map_cold(s, layer, n_keys, false);
    else
        clear_overflow(s);
}

int kvp_store_mode(const struct kvp_store *s)
{
    return s->mode;
}

const uint8_t *kvp_store_pending(const struct kvp_store *s)
{
    return s->pending;
}
