/*
 * Redis Cluster key slots: CRC16-XMODEM of the key (or of its hash tag, the part between the
 * first '{' and the next '}' when that part is not empty) modulo 16384. Kept apart from
 * cold_redis.c so it is built and tested without hiredis.
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

#endif
