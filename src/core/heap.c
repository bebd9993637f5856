/* The binary heap of heap.h. */
#include "core/heap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

void kvp_heap_init(struct kvp_heap *h, size_t size, bool (*before)(const void *, const void *))
{
    *h = (struct kvp_heap){.size = size, .before = before};
}

int kvp_heap_reserve(struct kvp_heap *h, size_t cap)
{
    if (cap <= h->cap)
        return 0;
    if (cap > SIZE_MAX / h->size)
        return KVP_ENOMEM;
    unsigned char *a = realloc(h->a, cap * h->size);
    if (!a)
        return KVP_ENOMEM;
    h->a = a;
    h->cap = cap;
    return 0;
}

int kvp_heap_push(struct kvp_heap *h, const void *e)
{
    if (h->n == h->cap) {
        int rc = kvp_heap_reserve(h, h->cap > SIZE_MAX / 2 ? SIZE_MAX : (h->cap ? 2 * h->cap : 64));
        if (rc < 0 || h->n == h->cap)
            return KVP_ENOMEM;
    }
    /* sift up: parents that e goes before move down a level; e lands in the hole */
    const size_t sz = h->size;
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!h->before(e, h->a + parent * sz))
            break;
        memcpy(h->a + i * sz, h->a + parent * sz, sz);
        i = parent;
    }
    memcpy(h->a + i * sz, e, sz);
    return 0;
}

void kvp_heap_pop(struct kvp_heap *h, void *top)
{
    const size_t sz = h->size;
    memcpy(top, h->a, sz);
    /* the last element, left where it is (index n after the decrement, which the sift below
     * never writes), sinks from the root: the better child moves up while it goes first */
    const unsigned char *last = h->a + --h->n * sz;
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->before(h->a + (c + 1) * sz, h->a + c * sz))
            c++;
        if (!h->before(h->a + c * sz, last))
            break;
        memcpy(h->a + i * sz, h->a + c * sz, sz);
        i = c;
    }
    if (h->n > 0)
        memcpy(h->a + i * sz, last, sz);
}

void kvp_heap_free(struct kvp_heap *h)
{
    free(h->a);
    h->a = NULL;
    h->n = h->cap = 0;
}
