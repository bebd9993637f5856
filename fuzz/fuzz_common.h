/*
 * Helpers shared by the fuzz targets (header only).
 */
#ifndef KVP_FUZZ_COMMON_H
#define KVP_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* FNV-1a 64, the checksum of the predictor and trace files. */
static inline uint64_t fz_fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* Overwrite the last 8 bytes of buf with the checksum of the bytes before them, so mutated files
 * get past the checksum to the checks behind it. */
static inline void fz_fix_checksum(uint8_t *buf, size_t n)
{
    if (n < 8)
        return;
    uint64_t h = fz_fnv1a(buf, n - 8);
    memcpy(buf + n - 8, &h, 8);
}

#endif
