/* Error helpers: see err.h. Messages are truncated to fit struct kvp_err, never overflowed. */
#include "core/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int kvp_err_set(struct kvp_err *err, int code, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    return code;
}

int kvp_err_prefix(struct kvp_err *err, const char *fmt, ...)
{
    if (!err)
        return KVP_EINVAL;
    char prefix[128];
    char old[sizeof(err->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof(old));
    size_t n = strlen(prefix);
    if (n > sizeof(err->msg) - 3)
        n = sizeof(err->msg) - 3;
    memcpy(err->msg, prefix, n);
    err->msg[n] = ':';
    err->msg[n + 1] = ' ';
    size_t room = sizeof(err->msg) - n - 3;
    size_t m = strnlen(old, room);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = 0;
    return err->code;
}

const char *kvp_strerror(int code)
{
    switch (code) {
    case KVP_OK: return "ok";
    case KVP_EIO: return "i/o error";
    case KVP_EFORMAT: return "malformed file";
    case KVP_ENOMEM: return "out of memory";
    case KVP_EUNSUPPORTED: return "unsupported";
    case KVP_EINVAL: return "invalid argument";
    case KVP_ERANGE: return "out of range";
    case KVP_ENOTFOUND: return "not found";
    case KVP_EKVLOST: return "KV cache lost data";
    default: return "unknown error";
    }
}
