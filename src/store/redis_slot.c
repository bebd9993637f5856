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

int kvp_redis_seed_list(const char *s, size_t len,
                        int (*add)(void *arg, const char *host, size_t host_len, int port),
                        void *arg)
{
    int n = 0;
    for (size_t at = 0;;) {
        const char *seg = s + at;
        const char *comma = memchr(seg, ',', len - at);
        size_t sl = comma ? (size_t)(comma - seg) : len - at;
        size_t colon = sl;
        for (size_t i = 0; i < sl; i++) /* the last ':' (a host part may hold one) */
            if (seg[i] == ':')
                colon = i;
        long port = 0;
        size_t digits = 0;
        for (size_t i = colon + 1; i < sl && port <= 65535; i++, digits++) {
            if (seg[i] < '0' || seg[i] > '9')
                return -1;
            port = port * 10 + (seg[i] - '0');
        }
        if (colon == sl || colon == 0 || digits == 0 || port < 1 || port > 65535)
            return -1;
        int rc = add(arg, seg, colon, (int)port);
        if (rc < 0)
            return rc;
        n++;
        if (!comma)
            return n;
        at += sl + 1;
    }
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
