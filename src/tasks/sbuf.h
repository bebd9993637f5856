/* A growing NUL-terminated string for the task generator and the corpus reader: appends never
 * fail, an allocation failure sets oom and later appends do nothing, so callers check once. */
#ifndef KVP_TASKS_SBUF_H
#define KVP_TASKS_SBUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

static inline void sb_add(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static inline void sb_str(struct sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static inline void sb_fmt(struct sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void sb_fmt(struct sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_add(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

#endif
