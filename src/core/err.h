/*
 * Error reporting for the whole library.
 *
 * Library functions never print and never exit: they return 0 on success or a negative KVP_E*
 * code, and write one human-readable line into a caller-supplied struct kvp_err. Only the CLI
 * decides what to print and which exit status to use. A NULL err is allowed everywhere: the code
 * is still returned, the message is dropped.
 */
#ifndef KVP_CORE_ERR_H
#define KVP_CORE_ERR_H

#include "kvpred.h"

/* Fill err (if not NULL) with code and a printf-style message; returns code so callers can write
 * `return kvp_err_set(err, KVP_EFORMAT, "...")`. */
int kvp_err_set(struct kvp_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix the message already in err with "context: " (for example a file name). Returns err->code. */
int kvp_err_prefix(struct kvp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
