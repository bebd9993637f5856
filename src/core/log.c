/*
 * Notices to the caller's log function (log.h): the function and its argument are set once,
 * before the threads that may log start, and read atomically so a late set is still safe.
 */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static kvp_log_fn log_fn;
static void *log_user;

void kvp_set_log(kvp_log_fn fn, void *user)
{
    __atomic_store_n(&log_user, user, __ATOMIC_RELAXED);
    __atomic_store_n(&log_fn, fn, __ATOMIC_RELEASE);
}

void kvp_log(const char *fmt, ...)
{
    kvp_log_fn fn = __atomic_load_n(&log_fn, __ATOMIC_ACQUIRE);
    if (!fn)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fn(__atomic_load_n(&log_user, __ATOMIC_RELAXED), line);
}
