/* Redis Cluster key slots (see redis_slot.h). */
#include "store/redis_slot.h"

#include <string.h>

uint16_t kvp_redis_crc16(const void *data, size_t len)
{
    const uint8_t *p = data;
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int bit = 0; bit < 8; bit++) /* one bit of long division by x^16+x^12+x^5+1 */
            crc = crc & 0x8000 ? (uint16_t)(crc << 1) ^ 0x1021 : (uint16_t)(crc << 1);
    }
    return crc;
}

int kvp_redis_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t start = (size_t)(open - key) + 1;
        const char *close = memchr(key + start, '}', len - start);
        if (close && close > key + start) /* a non-empty tag: only it is hashed */
            return kvp_redis_crc16(key + start, (size_t)(close - key) - start) % KVP_REDIS_SLOTS;
    }
    return kvp_redis_crc16(key, len) % KVP_REDIS_SLOTS;
}
