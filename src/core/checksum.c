/* Four interleaved CRC32C streams (see checksum.h). */
#include "core/checksum.h"
#include "core/settings.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define CRC32C_POLY 0x82f63b78u /* Castagnoli, bit-reflected */

static uint32_t crc_table[256];
static bool use_hw;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_once(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[i] = c;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    use_hw = __builtin_cpu_supports("sse4.2") && !kvp_setting_is(KVP_SETTING_SIMD, "scalar");
#endif
}

static inline uint32_t crc_byte(uint32_t c, uint8_t b)
{
    return (c >> 8) ^ crc_table[(c ^ b) & 0xff];
}

/* One 8-byte word, least significant byte first (what the CRC32 instruction does). */
static inline uint32_t crc_word(uint32_t c, uint64_t w)
{
    for (int k = 0; k < 8; k++)
        c = crc_byte(c, (uint8_t)(w >> (8 * k)));
    return c;
}

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static inline uint32_t rotl32(uint32_t x, int r)
{
    return x << r | x >> (32 - r);
}

/* The four streams into 64 bits: each stream lands in its own rotation, so a change in any one
 * of them changes the result. */
static inline uint64_t fold(const uint32_t c[4])
{
    return (uint64_t)(~c[0] ^ rotl32(~c[2], 11)) << 32 | (uint64_t)(~c[1] ^ rotl32(~c[3], 19));
}

uint64_t kvp_checksum_portable(const void *p, size_t n)
{
    pthread_once(&once, init_once);
    const uint8_t *b = p;
    uint32_t c[4] = {~0u, ~0u, ~0u, ~0u};
    size_t words = n / 8, i = 0;
    for (; i < words; i++)
        c[i & 3] = crc_word(c[i & 3], load64(b + 8 * i));
    for (size_t j = 8 * words; j < n; j++)
        c[0] = crc_byte(c[0], b[j]);
    return fold(c);
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint64_t checksum_sse42(const uint8_t *b, size_t n)
{
    uint64_t c0 = ~0u, c1 = ~0u, c2 = ~0u, c3 = ~0u;
    size_t words = n / 8, i = 0;
    for (; i + 4 <= words; i += 4) {
        c0 = _mm_crc32_u64(c0, load64(b + 8 * i));
        c1 = _mm_crc32_u64(c1, load64(b + 8 * i + 8));
        c2 = _mm_crc32_u64(c2, load64(b + 8 * i + 16));
        c3 = _mm_crc32_u64(c3, load64(b + 8 * i + 24));
    }
    uint64_t *c[4] = {&c0, &c1, &c2, &c3};
    for (; i < words; i++)
        *c[i & 3] = _mm_crc32_u64(*c[i & 3], load64(b + 8 * i));
    for (size_t j = 8 * words; j < n; j++)
        c0 = _mm_crc32_u8((uint32_t)c0, b[j]);
    const uint32_t r[4] = {(uint32_t)c0, (uint32_t)c1, (uint32_t)c2, (uint32_t)c3};
    return fold(r);
}
#endif

uint64_t kvp_checksum(const void *p, size_t n)
{
    pthread_once(&once, init_once);
#if defined(__x86_64__)
    if (use_hw)
        return checksum_sse42(p, n);
#endif
    return kvp_checksum_portable(p, n);
}

const char *kvp_checksum_path(void)
{
    pthread_once(&once, init_once);
    return use_hw ? "crc32c-sse4.2" : "crc32c-table";
}
