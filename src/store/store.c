/* Tiered KV store: cold tier, hot slots, transfers and the per-step protocol (see store.h). */
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <liburing.h>

#include "core/cursor.h"
#include "core/platform.h"
#include "forward/kvcache.h"
#include "policy/policy.h"

#define MAX_RUN 256 /* units per transfer record (1 MiB for 4 KiB units) */
/* A wait polls the completion queue this long before it sleeps in the kernel: a few reads take
 * tens to hundreds of microseconds, and the decode thread has nothing else to do meanwhile, so
 * the sleep would only add a wake-up to each wait. */
#define SPIN_SECONDS 1e-3

/* ==================================== small helpers ======================================= */

static uint8_t *slot_ptr(const struct kvp_store *s, int slot)
{
    return s->hot + (size_t)slot * s->unit_bytes;
}

static size_t cold_off(const struct kvp_store *s, int layer, int b)
{
    return ((size_t)layer * s->max_blocks + (size_t)b) * s->unit_bytes;
}

/* Point the cache's table entries of (layer, b), every KV head, at slot (or nowhere: -1).
 * Tiered layers: head h of a slot is physical block slot*ppu + h of the unit layout. Layers
 * that never move keep the untiered layout, head-major (see configure). */
static void set_table(struct kvp_store *s, int layer, int b, int slot)
{
    struct kvp_kvcache *kv = s->kv;
    bool units = s->tiered[layer];
    for (int h = 0; h < s->n_kv; h++)
        kv->table[(size_t)kvp_kvcache_lh(kv, layer, h) * kv->max_blocks + b] =
            slot < 0 ? -1
            : units  ? slot * s->ppu + h
                     : h * s->max_blocks + (slot - s->slot0[layer]);
}

static int32_t *res_of(struct kvp_store *s, int layer, int b)
{
    return &s->res[(size_t)layer * s->max_blocks + b];
}

/* Make slot hold (layer, b) (state left to the caller). While a layer's selection is still
 * being made (kvp_store_acquire_head), the cache's table is left as it was, so the policy keeps
 * seeing the block as absent instead of reading a slot that is being filled. */
static void map_block(struct kvp_store *s, int layer, int b, int slot)
{
    *res_of(s, layer, b) = slot;
    s->slot_blk[slot] = b;
    if (!s->hiding)
        set_table(s, layer, b, slot);
}

/* Replacement order of a layer's slots: a doubly linked list, the most recently needed or
 * predicted at the head; empty slots go to the tail, so the victim search, which walks from
 * the tail, takes them first and otherwise stops at the first slot it may take (O(1) for
 * each allocation instead of a scan of the layer's slots). */
static void lru_unlink(struct kvp_store *s, int layer, int sl)
{
    int p = s->lru_prev[sl], n = s->lru_next[sl];
    if (p >= 0)
        s->lru_next[p] = n;
    else
        s->lru_head[layer] = n;
    if (n >= 0)
        s->lru_prev[n] = p;
    else
        s->lru_tail[layer] = p;
}

static void lru_touch(struct kvp_store *s, int layer, int sl)
{
    if (s->lru_head[layer] == sl)
        return;
    lru_unlink(s, layer, sl);
    s->lru_prev[sl] = -1;
    s->lru_next[sl] = s->lru_head[layer];
    s->lru_prev[s->lru_head[layer]] = sl;
    s->lru_head[layer] = sl;
}

static void lru_demote(struct kvp_store *s, int layer, int sl)
{
    if (s->lru_tail[layer] == sl)
        return;
    lru_unlink(s, layer, sl);
    s->lru_next[sl] = -1;
    s->lru_prev[sl] = s->lru_tail[layer];
    s->lru_next[s->lru_tail[layer]] = sl;
    s->lru_tail[layer] = sl;
}

static void unmap_slot(struct kvp_store *s, int layer, int slot)
{
    int b = s->slot_blk[slot];
    if (b >= 0) {
        *res_of(s, layer, b) = -1;
        set_table(s, layer, b, -1);
    }
    s->slot_blk[slot] = -1;
    s->slot_state[slot] = KVP_SLOT_EMPTY;
    lru_demote(s, layer, slot);
}

static bool identity_layer(const struct kvp_store *s, int layer)
{
    return s->n_slots[layer] == s->max_blocks;
}

static void set_error(struct kvp_store *s, int code, const char *fmt, const char *what, int layer,
                      int b0, int n, const char *why)
{
    if (s->err_code)
        return;
    s->err_code = code;
    snprintf(s->err_msg, sizeof(s->err_msg), fmt, what, layer, b0, b0 + n - 1, why);
}

void kvp_store_note(struct kvp_store *s, int kind, int layer, double t0, double t1)
{
    if (kind == KVP_EV_PREDICT)
        s->st.predict_s += t1 - t0;
    if (!s->ev_on || s->n_ev >= s->ev_cap)
        return;
    s->ev[s->n_ev++] = (struct kvp_store_event){.kind = kind, .layer = layer, .t0 = t0, .t1 = t1};
}

/* ===================================== RAM transfer thread ================================ */

/* Sleep (then spin for the last stretch) until the monotonic time t. */
static void sleep_until(double t)
{
    for (;;) {
        double left = t - kvp_time_now();
        if (left <= 0)
            return;
        if (left > 200e-6) {
            double d = left - 100e-6;
            struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - (time_t)d) * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
}

/* The thread copies queued records in order. With a link model, a record occupies the link for
 * bytes/bandwidth from max(submit, link free) and completes one latency later; transfers are
 * pipelined, so latency is paid once per transfer but not serialised. */
static void *ram_thread(void *arg)
{
    struct kvp_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->q_len == 0 && !s->stop)
            pthread_cond_wait(&s->cv_work, &s->mu);
        if (s->q_len == 0)
            break;
        int id = s->q_todo[s->q_head];
        s->q_head = (s->q_head + 1) % KVP_STORE_MAX_XFER;
        s->q_len--;
        struct kvp_store_xfer *x = &s->xfer[id];
        pthread_mutex_unlock(&s->mu);

        size_t bytes = (size_t)x->n * s->unit_bytes;
        uint8_t *hot = slot_ptr(s, x->s0), *cold = s->cold + cold_off(s, x->layer, x->b0);
        if (x->write)
            memcpy(cold, hot, bytes);
        else
            memcpy(hot, cold, bytes);
        if (s->link_bps > 0) {
            double start = x->t_submit > s->link_free ? x->t_submit : s->link_free;
            s->link_free = start + (double)bytes / s->link_bps;
            sleep_until(s->link_free + s->link_lat);
        }
        double done = kvp_time_now();

        pthread_mutex_lock(&s->mu);
        x->res = (int)bytes;
        x->t_done = done;
        s->q_done[s->n_done++] = id;
        pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ======================================= transfers ======================================== */

static void complete(struct kvp_store *s, int id, int res, double t_done)
{
    struct kvp_store_xfer *x = &s->xfer[id];
    int want = (int)((size_t)x->n * s->unit_bytes);
    if (s->fault_kind && s->fault_after > 0 && --s->fault_after == 0) {
        res = s->fault_kind == KVP_FAULT_EIO ? -EIO : want / 2;
        s->fault_kind = KVP_FAULT_NONE;
    }
    const char *what = x->write ? "write" : "read";
    if (res < 0)
        set_error(s, KVP_EIO, "KV store: %s of layer %d blocks %d..%d failed: %s", what,
                  x->layer, x->b0, x->n, strerror(-res));
    else if (res != want)
        set_error(s, KVP_EIO, "KV store: short %s of layer %d blocks %d..%d%s", what, x->layer,
                  x->b0, x->n, " (disk full or file truncated?)");
    for (int i = 0; i < x->n; i++) {
        if (x->write)
            s->slot_writing[x->s0 + i] = 0;
        else if (s->slot_state[x->s0 + i] == KVP_SLOT_LOADING)
            s->slot_state[x->s0 + i] = KVP_SLOT_READY;
    }
    if (--s->n_inflight == 0)
        s->st.transfer_s += t_done - s->busy_since;
    kvp_store_note(s, x->write ? KVP_EV_WRITE : KVP_EV_READ, x->layer, x->t_submit, t_done);
    x->busy = false;
}

static void flush(struct kvp_store *s)
{
    if (s->n_unsubmitted > 0) {
        io_uring_submit(s->ring);
        s->n_unsubmitted = 0;
    }
}

/* Collect finished transfers; with wait, block until at least one finishes (if any is in
 * flight). Returns the number collected. */
static int reap(struct kvp_store *s, bool wait)
{
    int got = 0;
    if (s->n_inflight == 0)
        return 0;
    if (s->tier == KVP_TIER_DISK) {
        flush(s);
        struct io_uring_cqe *cqe;
        if (wait) {
            int rc;
            double give_up = kvp_time_now() + SPIN_SECONDS;
            while ((rc = io_uring_peek_cqe(s->ring, &cqe)) == -EAGAIN && kvp_time_now() < give_up)
                ;
            if (rc != 0)
                while ((rc = io_uring_wait_cqe(s->ring, &cqe)) == -EINTR)
                    ;
            if (rc < 0) /* the ring itself failed: fail every request still in flight */
                for (int i = 0; i < KVP_STORE_MAX_XFER; i++)
                    if (s->xfer[i].busy) {
                        complete(s, i, rc, kvp_time_now());
                        got++;
                    }
            if (rc < 0)
                return got;
        }
        while (io_uring_peek_cqe(s->ring, &cqe) == 0) {
            int id = (int)io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(s->ring, cqe);
            complete(s, id, res, kvp_time_now());
            got++;
        }
        return got;
    }
    int ids[KVP_STORE_MAX_XFER], n;
    pthread_mutex_lock(&s->mu);
    while (wait && s->n_done == 0)
        pthread_cond_wait(&s->cv_done, &s->mu);
    n = s->n_done;
    memcpy(ids, s->q_done, (size_t)n * sizeof(int));
    s->n_done = 0;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++)
        complete(s, ids[i], s->xfer[ids[i]].res, s->xfer[ids[i]].t_done);
    return n;
}

static void submit_deferred(struct kvp_store *s);

void kvp_store_drain(struct kvp_store *s)
{
    submit_deferred(s);
    while (s->n_inflight > 0)
        reap(s, true);
}

/* Start one transfer between slots [s0, s0+n) and cold units (layer, [b0, b0+n)); a prefetch
 * read is only queued (struct kvp_store, deferred). */
static void submit(struct kvp_store *s, int layer, int b0, int s0, int n, bool write)
{
    if (s->deferring && !write) {
        for (int i = 0; i < n; i++)
            s->slot_state[s0 + i] = KVP_SLOT_LOADING;
        s->deferred[s->n_deferred++] =
            (struct kvp_store_run){.layer = layer, .b0 = b0, .s0 = s0, .n = n};
        return;
    }
    int id = -1;
    for (;;) {
        for (int i = 0; i < KVP_STORE_MAX_XFER && id < 0; i++)
            if (!s->xfer[i].busy)
                id = i;
        if (id >= 0)
            break;
        reap(s, true);
    }
    struct kvp_store_xfer *x = &s->xfer[id];
    double now = kvp_time_now();
    *x = (struct kvp_store_xfer){.s0 = s0, .n = n, .layer = layer, .b0 = b0, .write = write,
                                 .busy = true, .t_submit = now};
    size_t bytes = (size_t)n * s->unit_bytes, off = cold_off(s, layer, b0);
    uint8_t *buf = slot_ptr(s, s0);
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
    if (s->tier == KVP_TIER_RAM) {
        pthread_mutex_lock(&s->mu);
        s->q_todo[(s->q_head + s->q_len) % KVP_STORE_MAX_XFER] = id;
        s->q_len++;
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    /* O_DIRECT: offset, length and buffer on 4 KiB boundaries (the unit size guarantees it) */
    if (off % KVP_STORE_ALIGN || bytes % KVP_STORE_ALIGN || (uintptr_t)buf % KVP_STORE_ALIGN)
        s->st.misaligned++;
    struct io_uring_sqe *sqe = io_uring_get_sqe(s->ring);
    if (!sqe) {
        flush(s);
        sqe = io_uring_get_sqe(s->ring);
    }
    if (!sqe) { /* cannot happen: records in flight never exceed the ring depth */
        complete(s, id, -EBUSY, now);
        return;
    }
    if (write)
        io_uring_prep_write(sqe, s->fd, buf, (unsigned)bytes, (__u64)off);
    else
        io_uring_prep_read(sqe, s->fd, buf, (unsigned)bytes, (__u64)off);
    io_uring_sqe_set_data64(sqe, (__u64)id);
    s->n_unsubmitted++;
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
        reap(s, true);
}

static void wait_write(struct kvp_store *s, int slot)
{
    while (s->slot_writing[slot])
        reap(s, true);
}

/* ===================================== slot management ==================================== */

/* The newest block (being written) of the current step. */
static int newest_block(const struct kvp_store *s)
{
    return s->n_tokens / s->bs;
}

/* An empty slot of a tiered layer, or else the least recently used one that holds nothing
 * marked (needed or predicted by the current call), is not the newest block and has no
 * transfer in flight; -1 if none. */
static int find_victim(const struct kvp_store *s, int layer)
{
    int newest = newest_block(s);
    for (int sl = s->lru_tail[layer]; sl >= 0; sl = s->lru_prev[sl]) {
        int b = s->slot_blk[sl];
        if (b < 0)
            return sl;
        if (s->slot_state[sl] == KVP_SLOT_LOADING || s->slot_writing[sl] || b == newest ||
            s->mark[b] == s->mark_id)
            continue;
        return sl;
    }
    return -1;
}

/* A slot for (layer, b), evicting the LRU block; with may_wait, waits for transfers in flight
 * when every candidate is busy. -1 when the layer has no slot to give. */
static int alloc_slot(struct kvp_store *s, int layer, int b, bool may_wait)
{
    int sl;
    while ((sl = find_victim(s, layer)) < 0 && may_wait && s->n_inflight > 0)
        reap(s, true);
    if (sl < 0)
        return -1;
    unmap_slot(s, layer, sl);
    map_block(s, layer, b, sl);
    lru_touch(s, layer, sl);
    return sl;
}

/* Mark the units a set of selections reads, up to block last; NULL sels: all of [0, last]. */
static void mark_selection(struct kvp_store *s, const struct kvp_sel *sels, int last)
{
    s->mark_id++;
    if (!sels) {
        for (int b = 0; b <= last; b++)
            s->mark[b] = s->mark_id;
        return;
    }
    for (int h = 0; h < s->n_kv; h++)
        for (int i = 0; i < sels[h].n; i++)
            if (sels[h].blocks[i] <= last)
                s->mark[sels[h].blocks[i]] = s->mark_id;
}

/* Mark the predicted selections sels of layer for a step with n_keys keys (up to the newest
 * block, which is hot anyway), renew the LRU stamp of those already resident and list the
 * others in s->list; returns how many are listed. */
static int predicted_missing(struct kvp_store *s, int layer, const struct kvp_sel *sels,
                             int n_keys)
{
    int last = (n_keys - 1) / s->bs, have = newest_block(s);
    if (last > have)
        last = have;
    mark_selection(s, sels, last);
    int n = 0;
    for (int b = 0; b <= last; b++) {
        if (s->mark[b] != s->mark_id)
            continue;
        int sl = *res_of(s, layer, b);
        if (sl >= 0)
            lru_touch(s, layer, sl); /* keep it: it is predicted again */
        else
            s->list[n++] = b;
    }
    return n;
}

/* Read list[0..n) (ascending blocks) of layer into slots, merging runs that are adjacent both in
 * the cold tier and in the hot tier. Blocks that get no slot are returned through *n_left
 * (compacted to the front of list) when prefetching; acquire passes may_wait. */
static int read_blocks(struct kvp_store *s, int layer, int32_t *list, int n, bool may_wait)
{
    int run_b = -1, run_s = -1, run_n = 0, left = 0;
    for (int i = 0; i < n; i++) {
        int b = list[i];
        int sl = alloc_slot(s, layer, b, may_wait);
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
            submit(s, layer, run_b, run_s, run_n, false);
        run_b = b;
        run_s = sl;
        run_n = 1;
        s->slot_state[sl] = KVP_SLOT_LOADING;
    }
    if (run_n > 0)
        submit(s, layer, run_b, run_s, run_n, false);
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
        set_table(s, s->ovf_layer, s->ovf[i], *res_of(s, s->ovf_layer, s->ovf[i]));
    s->n_ovf = 0;
    s->ovf_layer = -1;
}

/* ================================== lifetime and layout =================================== */

/* Open the unnamed O_DIRECT scratch file in dir and reserve bytes. */
static int open_cold_file(struct kvp_store *s, const char *dir, struct kvp_err *err)
{
    s->fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (s->fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        /* no O_TMPFILE here: a named file, unlinked at once so nothing is left behind */
        char path[4096];
        snprintf(path, sizeof(path), "%s/kvpred-kv-XXXXXX", dir);
        s->fd = mkostemp(path, O_CLOEXEC);
        if (s->fd >= 0) {
            unlink(path);
            if (fcntl(s->fd, F_SETFL, O_DIRECT) < 0) {
                int e = errno;
                close(s->fd);
                s->fd = -1;
                return kvp_err_set(err, KVP_EIO, "kv-dir %s: O_DIRECT not supported: %s", dir,
                                   strerror(e));
            }
        }
    }
    if (s->fd < 0)
        return kvp_err_set(err, KVP_EIO, "kv-dir %s: cannot create the KV scratch file: %s", dir,
                           strerror(errno));
    int rc = fallocate(s->fd, 0, 0, (off_t)s->cold_bytes);
    if (rc < 0 && errno == EOPNOTSUPP)
        rc = ftruncate(s->fd, (off_t)s->cold_bytes);
    if (rc < 0)
        return kvp_err_set(err, KVP_EIO, "kv-dir %s: cannot reserve %zu MiB for the KV cache: %s",
                           dir, s->cold_bytes >> 20, strerror(errno));
    return 0;
}

int kvp_store_init(const struct kvp_ctx_params *p, struct kvp_kvcache *kv, int n_layer,
                   int n_kv, int head_dim, int bs, int max_blocks, struct kvp_store **out,
                   struct kvp_err *err)
{
    if (p->kv_tier != KVP_TIER_RAM && p->kv_tier != KVP_TIER_DISK)
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
    s->fd = -1;
    s->ovf_layer = -1;
    s->n_layer = n_layer;
    s->n_kv = n_kv;
    s->head_dim = head_dim;
    s->bs = bs;
    s->max_blocks = max_blocks;
    s->bf = (size_t)head_dim * bs;
    s->tier = p->kv_tier;
    s->mode = p->prefetch ? p->prefetch : KVP_PREFETCH_TOKEN;
    s->link_bps = p->link_gbps * 1e9;
    s->link_lat = p->link_latency_us * 1e-6;
    s->kv = kv;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    int rc;
    /* pad the unit with empty head slots up to a multiple of 4 KiB */
    size_t head_bytes = 2 * s->bf * sizeof(float);
    s->ppu = n_kv;
    while (((size_t)s->ppu * head_bytes) % KVP_STORE_ALIGN && s->ppu <= 4 * n_kv + 64)
        s->ppu++;
    if (((size_t)s->ppu * head_bytes) % KVP_STORE_ALIGN) {
        rc = kvp_err_set(err, KVP_EUNSUPPORTED,
                         "KV store: %zu bytes per head and block cannot be padded to 4 KiB units",
                         head_bytes);
        goto fail;
    }
    s->unit_bytes = (size_t)s->ppu * head_bytes;
    size_t n_units;
    if (!kvp_mul_ok((size_t)n_layer, (size_t)max_blocks, &n_units) ||
        !kvp_mul_ok(n_units, s->unit_bytes, &s->cold_bytes)) {
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
    if (!s->list || !s->ovf || !s->mark || !s->pending || !s->res || !s->slot0 || !s->n_slots ||
        !s->tiered || !s->lru_head || !s->lru_tail) {
        rc = kvp_err_set(err, KVP_ENOMEM, "out of memory for the KV store");
        goto fail;
    }
    if (s->tier == KVP_TIER_RAM) {
        /* the cold units live behind the hot slots, in the same allocation (configure) */
        if (pthread_create(&s->thread, NULL, ram_thread, s) != 0) {
            rc = kvp_err_set(err, KVP_ENOMEM, "cannot start the KV transfer thread");
            goto fail;
        }
        s->thread_on = true;
    } else {
        const char *dir = p->kv_dir;
        if (!dir || !*dir)
            dir = getenv("TMPDIR");
        if (!dir || !*dir)
            dir = "/tmp";
        if ((rc = open_cold_file(s, dir, err)) < 0)
            goto fail;
        s->ring = calloc(1, sizeof(struct io_uring));
        if (!s->ring) {
            rc = kvp_err_set(err, KVP_ENOMEM, "out of memory");
            goto fail;
        }
        /* a kernel thread that polls the submission queue does the O_DIRECT submission work
         * (page pinning, bio set-up, the doorbell) on another core instead of the decode
         * thread; where it is refused (old kernel, no privilege), submissions are syscalls */
        struct io_uring_params up = {.flags = IORING_SETUP_SQPOLL, .sq_thread_idle = 20};
        if (p->kv_sq_pin) {
            up.flags |= IORING_SETUP_SQ_AFF;
            up.sq_thread_cpu = (unsigned)p->kv_sq_cpu;
        }
        int e = p->kv_syscall_submit
                    ? -1
                    : io_uring_queue_init_params(KVP_STORE_MAX_XFER, s->ring, &up);
        if (e < 0 && p->kv_sq_pin && !p->kv_syscall_submit) {
            free(s->ring);
            s->ring = NULL;
            rc = kvp_err_set(err, KVP_EINVAL, "io_uring: no polling thread on CPU %d: %s",
                             p->kv_sq_cpu, strerror(-e));
            goto fail;
        }
        s->st.sq_poll = e >= 0;
        if (e < 0)
            e = io_uring_queue_init(KVP_STORE_MAX_XFER, s->ring, 0);
        if (e < 0) {
            free(s->ring);
            s->ring = NULL;
            rc = kvp_err_set(err, KVP_EIO, "io_uring: %s", strerror(-e));
            goto fail;
        }
    }
    s->st.cold_bytes = s->cold_bytes;
    s->st.unit_bytes = s->unit_bytes;
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
    if (s->thread_on) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->ring) {
        io_uring_queue_exit(s->ring);
        free(s->ring);
    }
    if (s->fd >= 0)
        close(s->fd);
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
    free(s->ev);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Map every block of identity layers (slot = slot0 + block, ready) and nothing else. */
static void remap_all(struct kvp_store *s)
{
    struct kvp_kvcache *kv = s->kv;
    size_t n_tab = (size_t)s->n_layer * s->n_kv * s->max_blocks;
    for (size_t i = 0; i < n_tab; i++)
        kv->table[i] = -1;
    for (size_t i = 0; i < (size_t)s->n_layer * s->max_blocks; i++)
        s->res[i] = -1;
    for (int sl = 0; sl < s->n_slot; sl++) {
        s->slot_blk[sl] = -1;
        s->slot_state[sl] = KVP_SLOT_EMPTY;
    }
    /* each layer's slots in one list, the lowest index at the tail (taken first) */
    for (int l = 0; l < s->n_layer; l++) {
        int a = s->slot0[l], e = a + s->n_slots[l];
        for (int sl = a; sl < e; sl++) {
            s->lru_prev[sl] = sl + 1 < e ? sl + 1 : -1;
            s->lru_next[sl] = sl > a ? sl - 1 : -1;
        }
        s->lru_head[l] = e - 1;
        s->lru_tail[l] = a;
    }
    for (int l = 0; l < s->n_layer; l++) {
        if (!identity_layer(s, l))
            continue;
        for (int b = 0; b < s->max_blocks; b++) {
            map_block(s, l, b, s->slot0[l] + b);
            s->slot_state[s->slot0[l] + b] = KVP_SLOT_READY;
        }
    }
    s->n_ovf = 0;
    s->ovf_layer = -1;
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
    s->dense_layers_only = dense_layers >= s->n_layer;
    int n = 0;
    bool staging = false;
    for (int l = 0; l < s->n_layer; l++) {
        bool dense_mode = s->mode == KVP_PREFETCH_DENSE;
        s->slot0[l] = n;
        s->n_slots[l] = dense_mode || l < dense_layers ? s->max_blocks : hot_blocks;
        s->tiered[l] = dense_mode || s->n_slots[l] < s->max_blocks;
        staging |= s->n_slots[l] < s->max_blocks;
        n += s->n_slots[l];
    }
    s->stage0 = staging ? n : -1;
    if (staging)
        n += s->max_blocks;
    s->n_slot = n;
    /* RAM tier: the cold units follow the slots, so a table entry can point at a cold copy
     * (kvp_store_map_cold) */
    size_t hot_bytes = (size_t)n * s->unit_bytes;
    size_t bytes = hot_bytes + (s->tier == KVP_TIER_RAM ? s->cold_bytes : 0);
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
    s->cold = s->tier == KVP_TIER_RAM ? s->hot + hot_bytes : NULL;
    s->st.hot_bytes = hot_bytes;
    /* Tiered layers (and the staging area and RAM cold units after the slots) use the unit
     * layout, K and V of a head interleaved. A layer that is never transferred has the
     * untiered layout inside its max_blocks slots, [K: head][block] then [V: head][block]:
     * dense attention then streams each head's keys instead of taking 1 KiB from every 4 KiB
     * page (2 dense layers of stories260K at 32K: 2.4 ms more per token). */
    for (int l = 0; l < s->n_layer; l++) {
        float *k = (float *)s->hot, *v = k + s->bf;
        size_t stride = 2 * s->bf;
        if (!s->tiered[l]) {
            k = (float *)slot_ptr(s, s->slot0[l]);
            v = k + (size_t)s->n_kv * s->max_blocks * s->bf;
            stride = s->bf;
        }
        kvp_kvcache_attach(s->kv, l, k, v, stride);
    }
    remap_all(s);
    s->n_tokens = 0;
    return 0;
}

void kvp_store_truncate(struct kvp_store *s, int n)
{
    kvp_store_drain(s);
    if (n == 0) {
        remap_all(s);
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
                unmap_slot(s, l, sl);
    }
    s->n_tokens = n;
}

void kvp_store_inject_fault(struct kvp_store *s, int kind, int after)
{
    s->fault_kind = kind;
    s->fault_after = after;
}

int kvp_store_take_error(struct kvp_store *s, struct kvp_err *err)
{
    if (!s->err_code)
        return 0;
    int code = kvp_err_set(err, s->err_code, "%s", s->err_msg);
    s->err_code = 0;
    return code;
}

/* ======================================== prefill ========================================= */

/* Start reading every block of layer below nb that is not hot from the cold tier into its
 * staging slot, in runs (staging slots are consecutive like the cold units, so a run of cold
 * blocks travels as one request of at most MAX_RUN units). */
static void read_cold_to_staging(struct kvp_store *s, int layer, int nb)
{
    int run0 = -1;
    for (int b = 0; b <= nb; b++) {
        bool cold = b < nb && *res_of(s, layer, b) < 0;
        if (cold && run0 < 0)
            run0 = b;
        if (run0 >= 0 && (!cold || b - run0 == MAX_RUN)) {
            submit(s, layer, run0, s->stage0 + run0, b - run0, false);
            run0 = cold ? b : -1;
        }
    }
}

void kvp_store_prefill_begin(struct kvp_store *s, int layer, int pos0, int end)
{
    if (identity_layer(s, layer))
        return;
    kvp_store_drain(s);
    clear_overflow(s);
    int nb_old = (pos0 + s->bs - 1) / s->bs, nb_end = (end + s->bs - 1) / s->bs;
    for (int b = 0; b < nb_end; b++)
        set_table(s, layer, b, s->stage0 + b);
    /* what the layer holds already: hot copies as they are, the rest from the cold tier */
    read_cold_to_staging(s, layer, nb_old);
    for (int b = 0; b < nb_old; b++) {
        int sl = *res_of(s, layer, b);
        if (sl >= 0)
            memcpy(slot_ptr(s, s->stage0 + b), slot_ptr(s, sl), s->unit_bytes);
    }
    kvp_store_drain(s);
}

void kvp_store_prefill_end(struct kvp_store *s, int layer, int pos0, int end,
                           const struct kvp_sel *next, int n_keys_next)
{
    s->n_tokens = end;
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
        set_table(s, layer, b, sl);
    }
    /* the block the next token is written into stays hot */
    int nb = end / s->bs;
    if (end % s->bs && *res_of(s, layer, nb) < 0) {
        s->mark_id++;
        int sl = alloc_slot(s, layer, nb, true);
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
        int b = s->list[i], sl = alloc_slot(s, layer, b, false);
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
    s->st_predict0 = s->st.predict_s;
    s->st_wait0 = s->st.wait_s;
    s->n_tokens = n_tokens;
    reap(s, false);
    int nb = newest_block(s);
    bool stalled = false;
    for (int l = 0; l < s->n_layer; l++) {
        if (!s->tiered[l])
            continue;
        int sl = *res_of(s, l, nb);
        if (sl < 0) {
            s->mark_id++;
            sl = alloc_slot(s, l, nb, true);
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
        if (s->tier == KVP_TIER_RAM) {
            /* a 4 KiB copy per layer: synchronous, so the next token's store never races it */
            memcpy(s->cold + cold_off(s, l, nb), slot_ptr(s, sl), s->unit_bytes);
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
    if (!s->tiered[layer] || s->mode == KVP_PREFETCH_DENSE || s->tier != KVP_TIER_DISK ||
        identity_layer(s, layer))
        return;
    reap(s, false);
    int last = (n_keys - 1) / s->bs, n = 0;
    mark_selection(s, sel, last); /* this head's blocks are not evicted for each other */
    for (int i = 0; i < sel->n && sel->blocks[i] <= last; i++) {
        int b = sel->blocks[i];
        if (*res_of(s, layer, b) < 0) /* the newest block is always hot (step_begin) */
            s->list[n++] = b;
    }
    for (int i = 0; i < n; i++)
        s->pending[s->list[i]] = 2; /* acquire_begin counts it as a miss and maps it */
    s->hiding = true;
    int left = read_blocks(s, layer, s->list, n, false);
    s->hiding = false;
    for (int i = 0; i < left; i++) /* no slot for them now: acquire_begin reads them */
        s->pending[s->list[i]] = 0;
    s->st.misses += (uint64_t)(n - left);
}

bool kvp_store_acquire_begin(struct kvp_store *s, int layer, const struct kvp_sel *sels,
                             int n_keys)
{
    if (!s->tiered[layer])
        return false;
    double t0 = kvp_time_now();
    clear_overflow(s);
    reap(s, false); /* reads that finished since: hits, not late ones */
    int last = (n_keys - 1) / s->bs;
    mark_selection(s, s->mode == KVP_PREFETCH_DENSE ? NULL : sels, last);
    s->mark[last] = s->mark_id;
    int n_miss = 0;
    bool stalled = false;
    for (int b = 0; b <= last; b++) {
        if (s->mark[b] != s->mark_id)
            continue;
        int sl = *res_of(s, layer, b);
        if (sl < 0) {
            s->list[n_miss++] = b;
            s->pending[b] = 1;
            continue;
        }
        lru_touch(s, layer, sl);
        if (s->pending[b] == 2) { /* a miss that acquire_head started */
            set_table(s, layer, b, sl);
            s->pending[b] = s->slot_state[sl] == KVP_SLOT_LOADING;
            stalled |= s->pending[b];
            continue;
        }
        s->st.hits++;
        if (s->slot_state[sl] == KVP_SLOT_LOADING) {
            s->st.late++;
            s->pending[b] = 1;
            stalled = true;
        }
    }
    s->st.misses += (uint64_t)n_miss;
    stalled |= n_miss > 0;
    int left = read_blocks(s, layer, s->list, n_miss, true);
    /* more blocks than hot slots: read the rest into the staging area for this layer only */
    if (left > 0 && s->stage0 >= 0) {
        s->ovf_layer = layer;
        for (int i = 0; i < left; i++) {
            int b = s->list[i];
            s->ovf[s->n_ovf++] = b;
            set_table(s, layer, b, s->stage0 + b);
            submit(s, layer, b, s->stage0 + b, 1, false);
        }
        s->st.overflow += (uint64_t)left;
        flush(s);
    }
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
        s->pending[b] = 0;
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
    s->deferring = true;
    int left = read_blocks(s, layer, s->list, n, false);
    s->deferring = false;
    s->st.prefetched += (uint64_t)(n - left);
}

void kvp_store_load_cold(struct kvp_store *s, int layer, int n_keys)
{
    if (s->tier != KVP_TIER_DISK || !s->tiered[layer] || identity_layer(s, layer) ||
        s->stage0 < 0)
        return;
    double t0 = kvp_time_now();
    clear_overflow(s);
    s->ovf_layer = layer;
    int nb = (n_keys + s->bs - 1) / s->bs;
    /* every block that is not hot, from the cold tier into its staging slot, and the table
     * points there; the next acquire_begin points it back (clear_overflow) */
    read_cold_to_staging(s, layer, nb);
    for (int b = 0; b < nb; b++)
        if (*res_of(s, layer, b) < 0) {
            s->ovf[s->n_ovf++] = b;
            set_table(s, layer, b, s->stage0 + b);
        }
    kvp_store_drain(s);
    double t1 = kvp_time_now();
    s->st.wait_s += t1 - t0;
    kvp_store_note(s, KVP_EV_WAIT, layer, t0, t1);
}

void kvp_store_map_cold(struct kvp_store *s, int layer, int n_keys, bool on)
{
    if (s->tier != KVP_TIER_RAM || !s->tiered[layer] || identity_layer(s, layer))
        return;
    int nb = (n_keys + s->bs - 1) / s->bs;
    int base = s->n_slot + layer * s->max_blocks;
    /* a prefetch of this layer may still be copying into a hot slot that the table already
     * points at (layer mode starts it one layer early): select must not read half a block */
    if (on)
        for (int sl = s->slot0[layer]; sl < s->slot0[layer] + s->n_slots[layer]; sl++)
            wait_slot(s, sl);
    for (int b = 0; b < nb; b++)
        if (*res_of(s, layer, b) < 0)
            set_table(s, layer, b, on ? base + b : -1);
}
