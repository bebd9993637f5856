/* Hot-tier residency of the tiered store: which slot holds which block, the cache's table that
 * points at them, and the replacement order (see store.h). */
#include <string.h>

#include "kv/kvcache.h"
#include "kv/sel.h"
#include "store/store_internal.h"

/* Point the cache's table entries of (layer, b), every KV head, at slot (or nowhere: -1).
 * Tiered layers: head h of a slot is physical block slot*ppu + h of the unit layout. Layers
 * that never move keep the untiered layout, head-major (see configure). */
void kvp_res_set_table(struct kvp_store *s, int layer, int b, int slot)
{
    struct kvp_kvcache *kv = s->kv;
    bool units = s->tiered[layer];
    for (int h = 0; h < s->n_kv; h++)
        kv->table[(size_t)kvp_kvcache_lh(kv, layer, h) * kv->max_blocks + b] =
            slot < 0 ? -1
            : units  ? slot * s->ppu + h
                     : h * s->max_blocks + (slot - s->slot0[layer]);
}

/* Make slot hold (layer, b) (state left to the caller). */
static void map_block(struct kvp_store *s, int layer, int b, int slot, int visibility)
{
    *res_of(s, layer, b) = slot;
    s->slot_blk[slot] = b;
    if (visibility == KVP_RES_VISIBLE)
        kvp_res_set_table(s, layer, b, slot);
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

void kvp_res_touch(struct kvp_store *s, int layer, int sl)
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

void kvp_res_unmap_slot(struct kvp_store *s, int layer, int slot)
{
    int b = s->slot_blk[slot];
    if (b >= 0) {
        *res_of(s, layer, b) = -1;
        kvp_res_set_table(s, layer, b, -1);
    }
    s->slot_blk[slot] = -1;
    s->slot_state[slot] = KVP_SLOT_EMPTY;
    lru_demote(s, layer, slot);
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

int kvp_res_alloc_slot(struct kvp_store *s, int layer, int b, bool may_wait, int visibility)
{
    int sl;
    while ((sl = find_victim(s, layer)) < 0 && may_wait && s->n_inflight > 0)
        kvp_store_reap(s, true);
    if (sl < 0)
        return -1;
    kvp_res_unmap_slot(s, layer, sl);
    map_block(s, layer, b, sl, visibility);
    kvp_res_touch(s, layer, sl);
    return sl;
}

/* Mark the units a set of selections reads, up to block last; NULL sels: all of [0, last]. */
void kvp_res_mark_selection(struct kvp_store *s, const struct kvp_sel *sels, int last)
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

/* Map every block of identity layers (slot = slot0 + block, ready) and nothing else. */
void kvp_res_remap_all(struct kvp_store *s)
{
    struct kvp_kvcache *kv = s->kv;
    for (int l = 0; l < s->n_layer; l++) /* a windowed layer's ring is the cache's */
        for (int h = 0; h < s->n_kv && !s->windowed[l]; h++)
            for (int b = 0; b < s->max_blocks; b++)
                kv->table[(size_t)kvp_kvcache_lh(kv, l, h) * kv->max_blocks + b] = -1;
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
        s->lru_head[l] = e > a ? e - 1 : -1; /* a windowed layer has no slot */
        s->lru_tail[l] = e > a ? a : -1;
    }
    for (int l = 0; l < s->n_layer; l++) {
        if (!identity_layer(s, l))
            continue;
        for (int b = 0; b < s->max_blocks; b++) {
            map_block(s, l, b, s->slot0[l] + b, KVP_RES_VISIBLE);
            s->slot_state[s->slot0[l] + b] = KVP_SLOT_READY;
        }
    }
    s->n_ovf = 0;
    s->ovf_layer = -1;
}
