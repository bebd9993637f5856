/* Reading a whole stream (stream.c): a file or a pipe, to its end. */
#ifndef KVP_CORE_STREAM_H
#define KVP_CORE_STREAM_H

#include <stddef.h>
#include <stdio.h>

/* The rest of stream f in a malloc'd buffer with a NUL after its *len bytes (binary data may hold
 * NULs of its own; len may be NULL). NULL after a read error or when out of memory. */
char *kvp_read_stream(FILE *f, size_t *len);

#endif
