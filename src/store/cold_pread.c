/*
 * The disk tier without io_uring (cold.h): the same unnamed O_DIRECT scratch file (cold_file.c),
 * read and written by a small pool of threads with pread/pwrite. This is the path where io_uring
 * is refused (Docker's default seccomp profile answers EPERM, old kernels ENOSYS, a locked-down
 * host ENOMEM or EACCES), or where it is asked for (kvp_ctx_params.kv_disk_io,
 * KVP_DISK_IO=pread). A read blocks its thread for the device's latency, so the pool keeps
 * THREADS requests in flight, about what a decode step's misses and prefetches need on an SSD;
 * completion order is the threads', the store takes records in any order.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/platform.h"
#include "store/store_internal.h"
#include "store/xfer_queue.h"

#define THREADS 4

struct pread_io {
    int fd;
    pthread_t thread[THREADS];
    int n_threads;
    struct kvp_xfer_queue q;
    struct kvp_store *s;
};

/* Move one record whole: a transfer may come back in pieces (a signal, a device limit); a
 * zero-byte answer (the file ends) or an error ends it. Bytes moved, or -errno. */
static int move_record(struct pread_io *io, const struct kvp_store_xfer *x)
{
    struct kvp_store *s = io->s;
    size_t want = (size_t)x->n * s->unit_bytes, done = 0;
    uint8_t *buf = slot_ptr(s, x->s0);
    off_t off = (off_t)cold_off(s, x->layer, x->b0);
    while (done < want) {
        ssize_t r = x->write ? pwrite(io->fd, buf + done, want - done, off + (off_t)done)
                             : pread(io->fd, buf + done, want - done, off + (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return done > 0 ? (int)done : -errno;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (int)done;
}

static void *pread_thread(void *arg)
{
    struct pread_io *io = arg;
    int id;
    while ((id = kvp_xq_pop(&io->q)) >= 0) {
        int res = move_record(io, &io->s->xfer[id]);
        kvp_xq_finish(&io->q, io->s, id, res, kvp_time_now());
    }
    return NULL;
}

static void pread_close(struct kvp_store *s)
{
    struct pread_io *io = s->io_state;
    if (!io)
        return;
    kvp_xq_stop(&io->q);
    for (int i = 0; i < io->n_threads; i++)
        pthread_join(io->thread[i], NULL);
    kvp_xq_destroy(&io->q);
    if (io->fd >= 0)
        close(io->fd);
    free(io);
    s->io_state = NULL;
}

static int pread_open(struct kvp_store *s, const struct kvp_ctx_params *p, struct kvp_err *err)
{
    struct pread_io *io = calloc(1, sizeof(*io));
    if (!io)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    io->fd = -1;
    io->s = s;
    kvp_xq_init(&io->q);
    s->io_state = io;
    s->st.disk_io = KVP_DISK_IO_PREAD;
    int rc = kvp_cold_file_open(p, s->cold_bytes, &io->fd, err);
    if (rc < 0)
        return rc;
    for (; io->n_threads < THREADS; io->n_threads++)
        if (pthread_create(&io->thread[io->n_threads], NULL, pread_thread, io) != 0)
            break;
    if (io->n_threads == 0)
        return kvp_err_set(err, KVP_ENOMEM, "cannot start the disk tier's IO threads");
    return 0;
}

static void pread_submit(struct kvp_store *s, int id)
{
    kvp_xq_push(&((struct pread_io *)s->io_state)->q, id);
}

static void pread_flush(struct kvp_store *s)
{
    (void)s; /* a thread picks each record up as it is queued */
}

static int pread_reap(struct kvp_store *s)
{
    return kvp_xq_collect(&((struct pread_io *)s->io_state)->q, s, false);
}

static int pread_wait(struct kvp_store *s)
{
    return kvp_xq_collect(&((struct pread_io *)s->io_state)->q, s, true);
}

const struct kvp_cold_ops kvp_cold_pread = {
    .name = "disk (pread)",
    .in_memory = false,
    .slow_requests = true,
    .open = pread_open,
    .close = pread_close,
    .submit = pread_submit,
    .flush = pread_flush,
    .reap = pread_reap,
    .wait = pread_wait,
};
