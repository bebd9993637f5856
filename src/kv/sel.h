/*
 * A selection: which blocks of one (layer, KV head) a decode step reads, and which tokens of
 * each. Policies write it, attention and the tiered store read it.
 */
#ifndef KVP_KV_SEL_H
#define KVP_KV_SEL_H

#include <stdint.h>

/* One (layer, KV head) selection: logical blocks in ascending order, each with the mask of its
 * tokens to read (bit t = token blk*bs + t). Evicted tokens and tokens past the end are removed
 * by the attention kernel whatever the mask says. */
struct kvp_sel {
    int n;             /* selected blocks */
    int32_t *blocks;   /* [max_blocks] ascending logical block ids (owned by the caller) */
    uint64_t *mask;    /* [max_blocks] token masks, parallel to blocks */
};

#endif
