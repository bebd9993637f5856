/*
 * The disk cold tier (cold.h): an unnamed O_DIRECT scratch file under kv_dir, read and written
 * through io_uring. Where the kernel allows it, a kernel thread polls the submission queue, so
 * the decode thread does not pay the submission syscalls (kvp_ctx_params.kv_syscall_submit,
 * kv_sq_pin, kv_sq_cpu choose).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <liburing.h>

#include "core/platform.h"
#include "store/store_internal.h"

/* A wait polls the completion queue this long before it sleeps in the kernel: a few reads take
 * tens to hundreds of microseconds, and the decode thread has nothing else to do meanwhile, so
 * the sleep would only add a wake-up to each wait. */
#define SPIN_SECONDS 1e-3

struct disk_io {
    int fd;            /* the unnamed scratch file, or -1 */
    struct io_uring ring;
    bool ring_on;
    int n_unsubmitted; /* prepared SQEs not yet submitted */
};

/* Open the unnamed O_DIRECT scratch file in dir and reserve bytes. */
static int open_cold_file(struct disk_io *io, size_t cold_bytes, const char *dir,
                          struct kvp_err *err)
{
    io->fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (io->fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        /* no O_TMPFILE here: a named file, unlinked at once so nothing is left behind */
        char path[4096];
        snprintf(path, sizeof(path), "%s/kvpred-kv-XXXXXX", dir);
        io->fd = mkostemp(path, O_CLOEXEC);
        if (io->fd >= 0) {
            unlink(path);
            if (fcntl(io->fd, F_SETFL, O_DIRECT) < 0) {
                int e = errno;
                close(io->fd);
                io->fd = -1;
                return kvp_err_set(err, KVP_EIO, "kv-dir %s: O_DIRECT not supported: %s", dir,
                                   strerror(e));
            }
        }
    }
    if (io->fd < 0)
        return kvp_err_set(err, KVP_EIO, "kv-dir %s: cannot create the KV scratch file: %s", dir,
                           strerror(errno));
    int rc = fallocate(io->fd, 0, 0, (off_t)cold_bytes);
    if (rc < 0 && errno == EOPNOTSUPP)
        rc = ftruncate(io->fd, (off_t)cold_bytes);
    if (rc < 0)
        return kvp_err_set(err, KVP_EIO, "kv-dir %s: cannot reserve %zu MiB for the KV cache: %s",
                           dir, cold_bytes >> 20, strerror(errno));
    return 0;
}

static void disk_close(struct kvp_store *s)
{
    struct disk_io *io = s->io_state;
    if (!io)
        return;
    if (io->ring_on)
        io_uring_queue_exit(&io->ring);
    if (io->fd >= 0)
        close(io->fd);
    free(io);
    s->io_state = NULL;
}

static int disk_open(struct kvp_store *s, const struct kvp_ctx_params *p, struct kvp_err *err)
{
    struct disk_io *io = calloc(1, sizeof(*io));
    if (!io)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    io->fd = -1;
    s->io_state = io;
    const char *dir = p->kv_dir;
    if (!dir || !*dir)
        dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    int rc = open_cold_file(io, s->cold_bytes, dir, err);
    if (rc < 0)
        return rc;
    /* a kernel thread that polls the submission queue does the O_DIRECT submission work
     * (page pinning, bio set-up, the doorbell) on another core instead of the decode
     * thread; where it is refused (old kernel, no privilege), submissions are syscalls */
    struct io_uring_params up = {.flags = IORING_SETUP_SQPOLL, .sq_thread_idle = 20};
    if (p->kv_sq_pin) {
        up.flags |= IORING_SETUP_SQ_AFF;
        up.sq_thread_cpu = (unsigned)p->kv_sq_cpu;
    }
    int e = p->kv_syscall_submit ? -1
                                 : io_uring_queue_init_params(KVP_STORE_MAX_XFER, &io->ring, &up);
    if (e < 0 && p->kv_sq_pin && !p->kv_syscall_submit)
        return kvp_err_set(err, KVP_EINVAL, "io_uring: no polling thread on CPU %d: %s",
                           p->kv_sq_cpu, strerror(-e));
    s->st.sq_poll = e >= 0;
    if (e < 0)
        e = io_uring_queue_init(KVP_STORE_MAX_XFER, &io->ring, 0);
    if (e < 0)
        return kvp_err_set(err, KVP_EIO, "io_uring: %s", strerror(-e));
    io->ring_on = true;
    return 0;
}

static void disk_flush(struct kvp_store *s)
{
    struct disk_io *io = s->io_state;
    if (io->n_unsubmitted > 0) {
        io_uring_submit(&io->ring);
        io->n_unsubmitted = 0;
    }
}

static void disk_submit(struct kvp_store *s, int id)
{
    struct disk_io *io = s->io_state;
    struct kvp_store_xfer *x = &s->xfer[id];
    size_t bytes = (size_t)x->n * s->unit_bytes, off = cold_off(s, x->layer, x->b0);
    uint8_t *buf = slot_ptr(s, x->s0);
    /* O_DIRECT: offset, length and buffer on 4 KiB boundaries (the unit size guarantees it) */
    if (off % KVP_STORE_ALIGN || bytes % KVP_STORE_ALIGN || (uintptr_t)buf % KVP_STORE_ALIGN)
        s->st.misaligned++;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    if (!sqe) {
        disk_flush(s);
        sqe = io_uring_get_sqe(&io->ring);
    }
    if (!sqe) { /* cannot happen: records in flight never exceed the ring depth */
        kvp_store_complete(s, id, -EBUSY, x->t_submit);
        return;
    }
    if (x->write)
        io_uring_prep_write(sqe, io->fd, buf, (unsigned)bytes, (__u64)off);
    else
        io_uring_prep_read(sqe, io->fd, buf, (unsigned)bytes, (__u64)off);
    io_uring_sqe_set_data64(sqe, (__u64)id);
    io->n_unsubmitted++;
}

static int disk_reap(struct kvp_store *s)
{
    struct disk_io *io = s->io_state;
    struct io_uring_cqe *cqe;
    int got = 0;
    disk_flush(s);
    while (io_uring_peek_cqe(&io->ring, &cqe) == 0) {
        int id = (int)io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&io->ring, cqe);
        kvp_store_complete(s, id, res, kvp_time_now());
        got++;
    }
    return got;
}

static int disk_wait(struct kvp_store *s)
{
    struct disk_io *io = s->io_state;
    struct io_uring_cqe *cqe;
    int rc, got = 0;
    disk_flush(s);
    double give_up = kvp_time_now() + SPIN_SECONDS;
    while ((rc = io_uring_peek_cqe(&io->ring, &cqe)) == -EAGAIN && kvp_time_now() < give_up)
        ;
    if (rc != 0)
        while ((rc = io_uring_wait_cqe(&io->ring, &cqe)) == -EINTR)
            ;
    if (rc < 0) { /* the ring itself failed: fail every request still in flight */
        for (int i = 0; i < KVP_STORE_MAX_XFER; i++)
            if (s->xfer[i].busy) {
                kvp_store_complete(s, i, rc, kvp_time_now());
                got++;
            }
        return got;
    }
    return disk_reap(s);
}

const struct kvp_cold_ops kvp_cold_disk = {
    .name = "disk",
    .in_memory = false,
    .slow_requests = true,
    .open = disk_open,
    .close = disk_close,
    .submit = disk_submit,
    .flush = disk_flush,
    .reap = disk_reap,
    .wait = disk_wait,
};
