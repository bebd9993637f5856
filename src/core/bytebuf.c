/* Writing a byte buffer out as a checksummed file (see bytebuf.h). */
#include "core/bytebuf.h"

#include <stdio.h>

#include "core/fnv.h"

int kvp_bytebuf_save(struct kvp_bytebuf *b, const char *path, struct kvp_err *err)
{
    if (!b->fail)
        kvp_bytebuf_u64(b, kvp_fnv64(KVP_FNV64_INIT, b->p, b->n));
    int rc = 0;
    if (b->fail) {
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    } else {
        FILE *f = fopen(path, "wb");
        if (!f) {
            rc = kvp_err_set(err, KVP_EIO, "%s: cannot create", path);
        } else {
            bool ok = fwrite(b->p, 1, b->n, f) == b->n;
            ok = (fclose(f) == 0) && ok;
            if (!ok)
                rc = kvp_err_set(err, KVP_EIO, "%s: write failed", path);
        }
    }
    free(b->p);
    *b = (struct kvp_bytebuf){0};
    return rc;
}
