/*
 * Helpers shared by the fuzz targets (header only).
 */
#ifndef KVP_FUZZ_COMMON_H
#define KVP_FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/vocab.h"

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

/* Run parse on an exactly sized copy of the input (so ASan sees any overread), then, when the
 * input's last 8 bytes are not already the checksum of the rest, again with them fixed up. */
static inline void fz_parse_with_checksum(const uint8_t *data, size_t size,
                                          void (*parse)(const uint8_t *buf, size_t size))
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return;
    memcpy(buf, data, size);
    parse(buf, size);
    if (size >= 8) {
        uint64_t before;
        memcpy(&before, buf + size - 8, 8);
        fz_fix_checksum(buf, size);
        if (memcmp(&before, buf + size - 8, 8) != 0)
            parse(buf, size);
    }
    free(buf);
}

/* Tokenizer targets: encode x into an array of cap ids (exactly sized), check every id is a
 * token and that an array of half the count gets KVP_ERANGE, the same count and the same leading
 * ids (and no write past it). Returns the ids (caller frees) and their count in *n. */
static inline int32_t *fz_encode_checked(const struct kvp_vocab *v, const char *x, size_t len,
                                         bool add_special, bool parse_special, size_t cap,
                                         size_t *n)
{
    struct kvp_err err;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    if (!ids || kvp_vocab_encode(v, x, len, add_special, parse_special, ids, cap, n, &err) < 0)
        abort();
    const int nt = kvp_vocab_n_tokens(v);
    for (size_t i = 0; i < *n; i++)
        if (ids[i] < 0 || ids[i] >= nt)
            abort();
    if (*n > 1) {
        size_t small_cap = *n / 2, n2 = 0;
        int32_t *small = malloc(small_cap * sizeof(int32_t));
        if (!small ||
            kvp_vocab_encode(v, x, len, add_special, parse_special, small, small_cap, &n2,
                             &err) != KVP_ERANGE ||
            n2 != *n || memcmp(small, ids, small_cap * sizeof(int32_t)) != 0)
            abort();
        free(small);
    }
    return ids;
}

/* Decode ids as kvp_token_to_piece streams them (each with the previous id); out needs room for
 * n * max_piece bytes. Returns the length. */
static inline size_t fz_decode(const struct kvp_vocab *v, const int32_t *ids, size_t n,
                               size_t max_piece, char *out)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += kvp_vocab_piece(v, i ? ids[i - 1] : -1, ids[i], out + d, max_piece);
    return d;
}

/* The longest token text of v (an upper bound of one piece's bytes). */
static inline size_t fz_max_piece(const struct kvp_vocab *v)
{
    size_t m = 0;
    for (int i = 0; i < kvp_vocab_n_tokens(v); i++) {
        size_t len = 0;
        kvp_vocab_text(v, i, &len);
        m = len > m ? len : m;
    }
    return m;
}

#endif
