/* Reading a whole stream (see stream.h). */
#include "core/stream.h"

#include <stdlib.h>

char *kvp_read_stream(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 2) { /* room for one more byte and the NUL: grow */
            char *nb = cap < ((size_t)1 << 40) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf || ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}
