/*
 * What the files of the tiered store share and nothing outside it sees: slot and cold-unit
 * addressing, residency (residency.c), the transfer records (store.c) and the accounting
 * (stats.c). See store.h for the design.
 */
#ifndef KVP_STORE_STORE_INTERNAL_H
#define KVP_STORE_STORE_INTERNAL_H

#include "store/cold.h"
#include "store/store.h"

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
    return ((size_t)layer * s->max_blocks + (size_t)b) * s->unit_bytes;
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
