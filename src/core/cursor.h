/*
 * Bounds-checked little-endian reading of untrusted bytes, and overflow-checked size arithmetic.
 *
 * Every file reader in kvpred decodes through a struct kvp_cursor: each read checks that the
 * bytes exist before touching them and returns -1 (leaving the cursor unchanged) when they do not.
 * Nothing is ever cast from file bytes to a struct; unaligned values are loaded with memcpy.
 */
#ifndef KVP_CORE_CURSOR_H
#define KVP_CORE_CURSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct kvp_cursor {
    const uint8_t *base; /* borrowed */
    size_t size;         /* bytes available from base */
    size_t pos;          /* next byte to read; always <= size */
};

static inline void kvp_cursor_init(struct kvp_cursor *c, const void *base, size_t size)
{
    c->base = (const uint8_t *)base;
    c->size = size;
    c->pos = 0;
}

static inline size_t kvp_cursor_left(const struct kvp_cursor *c)
{
    return c->size - c->pos;
}

/* Borrow n bytes at the cursor and advance. */
static inline int kvp_rd_bytes(struct kvp_cursor *c, size_t n, const uint8_t **out)
{
    if (n > c->size - c->pos)
        return -1;
    *out = c->base + c->pos;
    c->pos += n;
    return 0;
}

static inline int kvp_rd_u8(struct kvp_cursor *c, uint8_t *v)
{
    if (c->size - c->pos < 1)
        return -1;
    *v = c->base[c->pos++];
    return 0;
}

#define KVP_DEFINE_RD(name, type)                                                                  \
    static inline int name(struct kvp_cursor *c, type *v)                                          \
    {                                                                                              \
        if (c->size - c->pos < sizeof(type))                                                       \
            return -1;                                                                             \
        memcpy(v, c->base + c->pos, sizeof(type)); /* x86-64 is little-endian like the files */    \
        c->pos += sizeof(type);                                                                    \
        return 0;                                                                                  \
    }
KVP_DEFINE_RD(kvp_rd_u16, uint16_t)
KVP_DEFINE_RD(kvp_rd_u32, uint32_t)
KVP_DEFINE_RD(kvp_rd_i32, int32_t)
KVP_DEFINE_RD(kvp_rd_u64, uint64_t)
KVP_DEFINE_RD(kvp_rd_i64, int64_t)
KVP_DEFINE_RD(kvp_rd_f32, float)
KVP_DEFINE_RD(kvp_rd_f64, double)
#undef KVP_DEFINE_RD

/* *out = a * b; false on overflow. */
static inline bool kvp_mul_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* *out = a + b; false on overflow. */
static inline bool kvp_add_ok(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* Round x up to a multiple of align (a power of two); false on overflow. */
static inline bool kvp_align_up(size_t x, size_t align, size_t *out)
{
    size_t t;
    if (__builtin_add_overflow(x, align - 1, &t))
        return false;
    *out = t & ~(align - 1);
    return true;
}

#endif
