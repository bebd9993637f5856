/*
 * A binary heap of fixed-size elements in one growable array, ordered by the caller's `before`
 * (x comes out before y). The tokenizers' merge queues use it (tokenizer/bpe.c, tokenizer/spm.c
 * and the trainer's SentencePiece encoder in train/train_bpe.c): pairs of adjacent symbols,
 * popped best first with lazy deletion of stale ones.
 */
#ifndef KVP_CORE_HEAP_H
#define KVP_CORE_HEAP_H

#include <stdbool.h>
#include <stddef.h>

struct kvp_heap {
    unsigned char *a; /* owned [cap * size] */
    size_t n, cap, size;
    bool (*before)(const void *x, const void *y);
};

/* An empty heap of elements of size bytes (no allocation yet). */
void kvp_heap_init(struct kvp_heap *h, size_t size, bool (*before)(const void *, const void *));
/* Room for cap elements; 0 or KVP_ENOMEM (the heap unchanged). */
int kvp_heap_reserve(struct kvp_heap *h, size_t cap);
/* Add a copy of *e, growing the array when full (never, after a large enough reserve); 0 or
 * KVP_ENOMEM. */
int kvp_heap_push(struct kvp_heap *h, const void *e);
/* Remove the first element into *top (h->n must be > 0). */
void kvp_heap_pop(struct kvp_heap *h, void *top);
void kvp_heap_free(struct kvp_heap *h);

#endif
