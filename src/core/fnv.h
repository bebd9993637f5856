/*
 * FNV-1a, 64 and 128 bits: the hash of the server's records (a prefix file's token ids and
 * units, the model fingerprint, the shared store's chain of block keys). Not a checksum for
 * bulk bytes (core/checksum.h is several times faster there); kept because those formats are
 * defined by it. Each call continues a hash: start from KVP_FNV64_INIT / kvp_fnv128_init().
 */
#ifndef KVP_CORE_FNV_H
#define KVP_CORE_FNV_H

#include <stddef.h>
#include <stdint.h>

#define KVP_FNV64_INIT 14695981039346656037ULL

static inline uint64_t kvp_fnv64(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

__extension__ typedef unsigned __int128 kvp_u128;

static inline kvp_u128 kvp_fnv128_init(void)
{
    return ((kvp_u128)0x6c62272e07bb0142ULL << 64) | 0x62b821756295c58dULL;
}

static inline kvp_u128 kvp_fnv128(kvp_u128 h, const void *p, size_t n)
{
    const kvp_u128 prime = ((kvp_u128)1 << 88) | 0x13B;
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= prime;
    }
    return h;
}

#endif
