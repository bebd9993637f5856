/*
 * The disk tier's scratch file, shared by its two IO paths (cold_disk.c through io_uring,
 * cold_pread.c through a pool of pread/pwrite threads): an unnamed O_DIRECT file under kv_dir,
 * reserved up front; and which of the paths a context takes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store_internal.h"
#include "core/log.h"
#include "core/settings.h"

int kvp_cold_file_open(const struct kvp_ctx_params *p, size_t bytes, int *out,
                       struct kvp_err *err)
{
    const char *dir = p->kv_dir;
    if (!dir || !*dir)
        dir = kvp_setting(KVP_SETTING_TMPDIR);
    if (!dir || !*dir)
        dir = "/tmp";
    int fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        /* no O_TMPFILE here: a named file, unlinked at once so nothing is left behind */
        char path[4096];
        snprintf(path, sizeof(path), "%s/kvpred-kv-XXXXXX", dir);
        fd = mkostemp(path, O_CLOEXEC);
        if (fd >= 0) {
            unlink(path);
            if (fcntl(fd, F_SETFL, O_DIRECT) < 0) {
                int e = errno;
                close(fd);
                return kvp_err_set(err, KVP_EIO, "kv-dir %s: O_DIRECT not supported: %s", dir,
                                   strerror(e));
            }
        }
    }
    if (fd < 0)
        return kvp_err_set(err, KVP_EIO, "kv-dir %s: cannot create the KV scratch file: %s", dir,
                           strerror(errno));
    int rc = fallocate(fd, 0, 0, (off_t)bytes);
    if (rc < 0 && errno == EOPNOTSUPP)
        rc = ftruncate(fd, (off_t)bytes);
    if (rc < 0) {
        int e = errno;
        close(fd);
        return kvp_err_set(err, KVP_EIO, "kv-dir %s: cannot reserve %zu MiB for the KV cache: %s",
                           dir, bytes >> 20, strerror(e));
    }
    *out = fd;
    return 0;
}

int kvp_disk_io_choice(const struct kvp_ctx_params *p)
{
    if (p->kv_disk_io != KVP_DISK_IO_AUTO)
        return p->kv_disk_io;
    if (kvp_setting_is(KVP_SETTING_DISK_IO, "pread"))
        return KVP_DISK_IO_PREAD;
    if (kvp_setting_is(KVP_SETTING_DISK_IO, "io_uring"))
        return KVP_DISK_IO_URING;
    return KVP_DISK_IO_AUTO;
}

void kvp_disk_io_announce(int path, const char *detail)
{
    /* once per process and path: a context per request must not fill the log */
    static int said[3];
    if (path < 0 || path > 2 || __atomic_exchange_n(&said[path], 1, __ATOMIC_RELAXED))
        return;
    kvp_log("disk KV tier: %s", detail);
}
