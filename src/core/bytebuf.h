/*
 * A growing byte buffer for writing binary files in one piece: the writer appends fields and
 * checks the sticky `fail` once at the end. The predictor's .kvpp and the prefill gate's .kvpg
 * end with kvp_bytebuf_save (the FNV-1a checksum, then the file), so a file on disk is never
 * half written by an allocation failure; the GGUF writer encodes its values and header with it.
 */
#ifndef KVP_CORE_BYTEBUF_H
#define KVP_CORE_BYTEBUF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

struct kvp_bytebuf {
    uint8_t *p; /* owned: free(p) when done */
    size_t n, cap;
    bool fail; /* an append ran out of memory: the content is incomplete */
};

static inline void kvp_bytebuf_put(struct kvp_bytebuf *b, const void *src, size_t n)
{
    if (b->fail || n == 0) /* n 0: src may be NULL (an empty array), which memcpy may not get */
        return;
    if (n > b->cap - b->n) {
        const size_t grow = b->cap ? b->cap : 1024;
        if (n > SIZE_MAX / 2 - b->cap - grow) {
            b->fail = true;
            return;
        }
        const size_t cap = b->cap + grow + n;
        uint8_t *q = realloc(b->p, cap);
        if (!q) {
            b->fail = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

/* Integers as the host stores them (little-endian on every target kvpred builds for). */
static inline void kvp_bytebuf_u32(struct kvp_bytebuf *b, uint32_t v)
{
    kvp_bytebuf_put(b, &v, 4);
}

static inline void kvp_bytebuf_u64(struct kvp_bytebuf *b, uint64_t v)
{
    kvp_bytebuf_put(b, &v, 8);
}

/* Append the 64-bit FNV-1a of the content, write it all to path and free the buffer (always):
 * 0, or KVP_ENOMEM (an append failed), or KVP_EIO. */
int kvp_bytebuf_save(struct kvp_bytebuf *b, const char *path, struct kvp_err *err);

#endif
