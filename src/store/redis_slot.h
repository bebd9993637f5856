/*
 * What both Redis Cluster clients (the cold tier's, cold_redis.c, and the server's shared prefix
 * store's) need that does not talk to Redis: key slots, CRC16-XMODEM of the key (or of its hash
 * tag, the part between the first '{' and the next '}' when that part is not empty) modulo
 * 16384; and the seed list of their URLs. Kept apart from cold_redis.c so it is built and
 * tested without hiredis.
 */
#ifndef KVP_STORE_REDIS_SLOT_H
#define KVP_STORE_REDIS_SLOT_H

#include <stddef.h>
#include <stdint.h>

#define KVP_REDIS_SLOTS 16384

/* CRC16-XMODEM: polynomial 0x1021, initial value 0, no reflection, no final xor. */
uint16_t kvp_redis_crc16(const void *data, size_t len);
/* The cluster slot of a key. */
int kvp_redis_key_slot(const char *key, size_t len);

/* The seed list of a redis:// URL, "HOST:PORT[,HOST:PORT...]" in s[0..len): add(arg, host,
 * host_len, port) for each node in order (the host is not NUL-terminated). Returns the count;
 * -1 at the first that is not HOST:PORT (no ':', an empty host, a port that is not a number in
 * 1..65535; an empty list); add's own value when it returns one below 0 (the caller's limit). */
int kvp_redis_seed_list(const char *s, size_t len,
                        int (*add)(void *arg, const char *host, size_t host_len, int port),
                        void *arg);

#endif
