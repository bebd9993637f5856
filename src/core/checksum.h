/*
 * A fast checksum of stored bytes (the tiered KV store's cold units): four CRC32C streams over
 * interleaved 8-byte words (word i feeds stream i mod 4), folded into 64 bits. Each stream is a
 * CRC32C, so any error confined to one stream's words that CRC32C detects (every burst up to
 * 32 bits, every odd number of flipped bits, in particular one flipped bit) changes the result;
 * errors spread over several streams go undetected with probability about 2^-64. Four streams
 * keep the CPU's CRC32 unit busy (one instruction per cycle at a latency of three), where one
 * stream would wait on each result.
 *
 * x86-64 with SSE4.2 uses the CRC32 instruction; everything else (and KVP_SIMD=scalar) a table
 * per byte. Both give the same value (tested).
 */
#ifndef KVP_CORE_CHECKSUM_H
#define KVP_CORE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* The checksum of n bytes at p (any alignment, any length). */
uint64_t kvp_checksum(const void *p, size_t n);
/* The same value computed without CPU-specific instructions. */
uint64_t kvp_checksum_portable(const void *p, size_t n);
/* "crc32c-sse4.2" or "crc32c-table": the path kvp_checksum takes on this machine. */
const char *kvp_checksum_path(void);

#endif
