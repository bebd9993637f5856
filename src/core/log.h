/*
 * The library's notices (kvp_set_log in kvpred.h): the library never prints; a line that a user
 * may want to see goes to the function the caller set, or nowhere.
 */
#ifndef KVP_CORE_LOG_H
#define KVP_CORE_LOG_H

#include "kvpred.h"

/* Format one line (printf-style, truncated to 512 bytes) and hand it to the caller's function. */
void kvp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
