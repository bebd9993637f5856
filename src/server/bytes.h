/* Little-endian integers in the server's own byte records (prefix.c's files, prefix_store.c's
 * Redis values): fixed-width stores and loads through memcpy, so unaligned places are fine.
 * Records read from outside are length-checked by their readers before these are called. */
#ifndef KVP_SERVER_BYTES_H
#define KVP_SERVER_BYTES_H

#include <stdint.h>
#include <string.h>

static inline void srv_put_u32(uint8_t *b, uint32_t v)
{
    memcpy(b, &v, 4);
}
static inline void srv_put_u64(uint8_t *b, uint64_t v)
{
    memcpy(b, &v, 8);
}
static inline uint32_t srv_get_u32(const uint8_t *b)
{
    uint32_t v;
    memcpy(&v, b, 4);
    return v;
}
static inline uint64_t srv_get_u64(const uint8_t *b)
{
    uint64_t v;
    memcpy(&v, b, 8);
    return v;
}

#endif
