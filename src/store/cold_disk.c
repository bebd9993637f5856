/*
 * The disk cold tier (cold.h): an unnamed O_DIRECT scratch file under kv_dir (cold_file.c), read
 * and written through io_uring; where io_uring is refused or not wanted, it hands the store over
 * to the pread path (cold_pread.c). Where the kernel allows it, a kernel thread polls the
 * submission queue, so the decode thread does not pay the submission syscalls
 * (kvp_ctx_params.kv_ring, struct kvp_disk_ring_params in kvpred_lab.h, chooses). On a host with
 * no core to spare for that thread, requests bypass it through a second ring the decode thread
 * submits and completes itself (see below).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <liburing.h>

#include "core/platform.h"
#include "core/settings.h"
#include "store/store_internal.h"

/* A wait polls the completion queue this long before it sleeps in the kernel: a few reads take
 * tens to hundreds of microseconds, and the decode thread has nothing else to do meanwhile, so
 * the sleep would only add a wake-up to each wait. */
#define SPIN_SECONDS 1e-3

/* A busy host. The polling thread spins while requests keep coming, and it also posts their
 * completions (io_uring runs a request's completion work on the task that submitted it): it
 * needs a core of its own. When the decode thread spends more than BUSY_FRACTION of a
 * LOAD_WINDOW_S window runnable but not running (its schedstat), the host has no core to spare:
 * requests then go through a second ring without a polling thread, submitted and completed by
 * the decode thread itself, and the polling thread falls asleep (sq_thread_idle). The bypass
 * lasts at least BYPASS_SECONDS; then the polling ring is tried again only if the machine had
 * SPARE_CORES of idle CPU time over the bypass (/proc/stat): in the bypass the decode thread is
 * no longer starved, so its own run-queue delay cannot tell that a competitor is still there,
 * and each needless try woke the polling thread, which then spun SQ_IDLE_MS on a core the decode
 * thread and the competitor were using. */
#define LOAD_WINDOW_S 4e-3
#define BUSY_FRACTION 0.15
#define BYPASS_SECONDS 0.25
#define SPARE_CORES 0.5
#define SQ_IDLE_MS 20
#define GAP_SECONDS 0.05

enum { RING_POLLED = KVP_SQ_ROUTE_POLLED, /* the polling thread's ring where granted, else
                                            syscall submissions */
       RING_DIRECT = KVP_SQ_ROUTE_DIRECT  /* beside a polling ring: syscall submissions for a
                                            busy host */ };

struct disk_io {
    int fd; /* the unnamed scratch file, or -1 */
    struct io_uring ring[2];
    bool ring_on[2];
    int n_unsubmitted[2]; /* prepared SQEs not yet submitted */
    int n_inflight[2];
    uint8_t ring_of[KVP_STORE_MAX_XFER]; /* the ring each record went to */
    int route;                           /* the ring new requests go to (AUTO) */
    double bypass_until;
    int stat_fd;                  /* /proc/stat, for the machine's idle time; -1 unreadable */
    char *stat_buf;               /* its per-CPU lines (allocated once, sized by CPU count) */
    size_t stat_cap;
    double idle0, idle_t0;        /* idle CPU seconds at idle_t0 (bypass start, last try) */
    /* run-queue sampling: schedstat of the decode thread (reopened when another thread
     * drives the store) and of the polling thread, -1 where unreadable */
    int self_fd, sq_fd;
    pid_t self_tid;
    double win_t0, self_wait0, sq_run0, sq_wait0, sq_retry_t;
};

/* Seconds on a CPU and waiting for one, from a /proc/.../schedstat file. */
static bool read_schedstat(int fd, double *run, double *wait)
{
    char buf[128];
    ssize_t n = fd >= 0 ? pread(fd, buf, sizeof(buf) - 1, 0) : -1;
    if (n <= 0)
        return false;
    buf[n] = 0;
    char *mid, *end;
    unsigned long long r = strtoull(buf, &mid, 10), w = strtoull(mid, &end, 10);
    if (mid == buf || end == mid)
        return false;
    *run = (double)r * 1e-9;
    *wait = (double)w * 1e-9;
    return true;
}

/* Idle CPU seconds (idle + iowait in /proc/stat) of the CPUs this thread may run on (a
 * taskset or cpuset makes the rest of the machine irrelevant), or -1. */
static double read_idle_seconds(struct disk_io *io)
{
    cpu_set_t allowed;
    ssize_t n = io->stat_fd >= 0 ? pread(io->stat_fd, io->stat_buf, io->stat_cap - 1, 0) : -1;
    if (n <= 0 || sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return -1;
    io->stat_buf[n] = 0;
    static long hz;
    if (hz <= 0)
        hz = sysconf(_SC_CLK_TCK);
    unsigned long long ticks = 0;
    int seen = 0;
    char *line = io->stat_buf;
    while (strncmp(line, "cpu", 3) == 0) {
        char *next = strchr(line, '\n'), *p = line + 3, *end;
        if (!next)
            return -1; /* cut short: the buffer ends inside the CPU lines */
        long cpu = strtol(p, &end, 10);
        line = next + 1;
        if (end == p || cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET((int)cpu, &allowed))
            continue; /* the all-CPU line, or a CPU not ours */
        unsigned long long v[5];
        for (int i = 0; i < 5; i++) { /* user nice system idle iowait */
            p = end;
            v[i] = strtoull(p, &end, 10);
            if (end == p)
                return -1;
        }
        ticks += v[3] + v[4];
        seen++;
    }
    return seen > 0 && hz > 0 ? (double)ticks / (double)hz : -1;
}

/* Idle cores of the machine on average since the last call (or the bypass start), -1 when
 * unknown; restarts the interval. */
static double spare_cores(struct disk_io *io, double now)
{
    double idle = read_idle_seconds(io), spare = -1;
    if (idle >= 0 && io->idle0 >= 0 && now > io->idle_t0)
        spare = (idle - io->idle0) / (now - io->idle_t0);
    io->idle0 = idle;
    io->idle_t0 = now;
    return spare;
}

int kvp_sq_route(int route, double busy, bool expired, double spare)
{
    if (busy > BUSY_FRACTION)
        return KVP_SQ_ROUTE_DIRECT;
    if (route == KVP_SQ_ROUTE_DIRECT && expired && (spare < 0 || spare >= SPARE_CORES))
        return KVP_SQ_ROUTE_POLLED;
    return route;
}

/* The schedstat file of this process's newest io_uring polling thread ("iou-sqp-PID"), or -1. */
static int open_sq_schedstat(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[288], comm[32] = {0};
        long tid = strtol(e->d_name, NULL, 10);
        if (tid <= best)
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%ld/comm", tid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(comm, sizeof(comm), f) && strncmp(comm, "iou-sqp-", 8) == 0)
            best = tid;
        fclose(f);
    }
    closedir(d);
    if (best < 0)
        return -1;
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%ld/schedstat", best);
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* Once per window: account the run-queue delays and choose the ring of the next requests. */
static void sample_load(struct kvp_store *s, struct disk_io *io)
{
    double now = kvp_time_now(), run, wait;
    if (now - io->win_t0 < LOAD_WINDOW_S)
        return;
    static _Thread_local pid_t my_tid; /* gettid() is a system call */
    if (!my_tid)
        my_tid = gettid();
    pid_t tid = my_tid;
    if (tid != io->self_tid) {
        if (io->self_fd >= 0)
            close(io->self_fd);
        io->self_fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        io->self_tid = tid;
        if (read_schedstat(io->self_fd, &run, &wait))
            io->self_wait0 = wait;
        io->win_t0 = now;
        return;
    }
    if (!read_schedstat(io->self_fd, &run, &wait)) {
        io->win_t0 = now;
        return;
    }
    /* a window this long spans time outside the decode loop (prompt, another context's
     * turn): a new start, not a sample */
    bool gap = now - io->win_t0 > GAP_SECONDS;
    double delay = wait - io->self_wait0, busy = delay / (now - io->win_t0);
    io->self_wait0 = wait;
    io->win_t0 = now;
    if (io->sq_fd < 0 && s->st.sq_poll && now >= io->sq_retry_t) {
        /* the polling thread names itself when it first runs, maybe after ring set-up */
        io->sq_fd = open_sq_schedstat();
        io->sq_retry_t = now + GAP_SECONDS;
        read_schedstat(io->sq_fd, &io->sq_run0, &io->sq_wait0);
    }
    double sq_run = 0, sq_wait = 0;
    bool sq = read_schedstat(io->sq_fd, &sq_run, &sq_wait);
    if (sq && !gap) {
        s->st.sq_cpu_s += sq_run - io->sq_run0;
        s->st.sq_runq_s += sq_wait - io->sq_wait0;
    }
    if (sq) {
        io->sq_run0 = sq_run;
        io->sq_wait0 = sq_wait;
    }
    if (gap)
        return;
    s->st.runq_s += delay;
    bool expired = io->route == RING_DIRECT && busy <= BUSY_FRACTION && now >= io->bypass_until;
    int next = kvp_sq_route(io->route, busy, expired, expired ? spare_cores(io, now) : -1);
    if (next == RING_DIRECT) {
        if (io->route == RING_POLLED) {
            s->st.bypasses += io->ring_on[RING_DIRECT];
            spare_cores(io, now); /* the idle time from here on */
        }
        if (busy > BUSY_FRACTION || expired)
            io->bypass_until = now + BYPASS_SECONDS;
    }
    io->route = next;
}

/* The ring of the next request. */
static int pick_ring(const struct kvp_store *s, const struct disk_io *io)
{
    if (!io->ring_on[RING_DIRECT])
        return RING_POLLED;
    switch (s->sq_bypass) {
    case KVP_SQ_BYPASS_ALWAYS:
        return RING_DIRECT;
    case KVP_SQ_BYPASS_NEVER:
        return RING_POLLED;
    case KVP_SQ_BYPASS_ALTERNATE:
        return (int)((s->st.reads + s->st.writes) & 1);
    default:
        return io->route;
    }
}

static void disk_close(struct kvp_store *s)
{
    struct disk_io *io = s->io_state;
    if (!io)
        return;
    for (int r = 0; r < 2; r++)
        if (io->ring_on[r])
            io_uring_queue_exit(&io->ring[r]);
    if (io->fd >= 0)
        close(io->fd);
    if (io->self_fd >= 0)
        close(io->self_fd);
    if (io->sq_fd >= 0)
        close(io->sq_fd);
    if (io->stat_fd >= 0)
        close(io->stat_fd);
    free(io->stat_buf);
    free(io);
    s->io_state = NULL;
}

/* io_uring refused as such (a seccomp filter: EPERM; a kernel without it: ENOSYS; a policy:
 * EACCES), not a bad request: what the pread path is for. */
static bool refused(int e)
{
    return e == -EPERM || e == -ENOSYS || e == -EACCES;
}

/* The disk tier through pread/pwrite threads instead (cold_pread.c), saying why once. */
static int use_pread(struct kvp_store *s, const struct kvp_ctx_params *p, const char *why,
                     struct kvp_err *err)
{
    char line[160];
    snprintf(line, sizeof(line), "pread/pwrite threads (%s)", why);
    kvp_disk_io_announce(KVP_DISK_IO_PREAD, line);
    s->io = &kvp_cold_pread;
    return s->io->open(s, p, err);
}

static int disk_open(struct kvp_store *s, const struct kvp_ctx_params *p, struct kvp_err *err)
{
    int want = kvp_disk_io_choice(p);
    if (want == KVP_DISK_IO_PREAD)
        return use_pread(s, p, "asked for", err);
    if (want != KVP_DISK_IO_AUTO && want != KVP_DISK_IO_URING)
        return kvp_err_set(err, KVP_EINVAL, "unknown disk IO path %d", want);
    struct disk_io *io = calloc(1, sizeof(*io));
    if (!io)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    io->fd = io->self_fd = io->sq_fd = -1;
    io->stat_fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
    long n_cpu = sysconf(_SC_NPROCESSORS_CONF);
    io->stat_cap = 512 + 256 * (size_t)(n_cpu > 0 ? n_cpu : 1);
    io->stat_buf = malloc(io->stat_cap);
    if (!io->stat_buf && io->stat_fd >= 0) {
        close(io->stat_fd);
        io->stat_fd = -1;
    }
    io->idle0 = -1;
    s->io_state = io;
    int rc = kvp_cold_file_open(p, s->cold_bytes, &io->fd, err);
    if (rc < 0)
        return rc;
    /* a kernel thread that polls the submission queue does the O_DIRECT submission work
     * (page pinning, bio set-up, the doorbell) on another core instead of the decode
     * thread; where it is refused (old kernel, no privilege), submissions are syscalls */
    const struct kvp_disk_ring_params rp = p->kv_ring ? *p->kv_ring
                                                      : (struct kvp_disk_ring_params){0};
    struct io_uring_params up = {.flags = IORING_SETUP_SQPOLL, .sq_thread_idle = SQ_IDLE_MS};
    if (rp.sq_pin) {
        up.flags |= IORING_SETUP_SQ_AFF;
        up.sq_thread_cpu = (unsigned)rp.sq_cpu;
    }
    struct io_uring *polled = &io->ring[RING_POLLED];
    int e = rp.syscall_submit ? -1 : io_uring_queue_init_params(KVP_STORE_MAX_XFER, polled, &up);
    if (e < 0 && rp.sq_pin && !rp.syscall_submit && !refused(e))
        return kvp_err_set(err, KVP_EINVAL, "io_uring: no polling thread on CPU %d: %s",
                           rp.sq_cpu, strerror(-e));
    s->st.sq_poll = e >= 0;
    if (e < 0)
        e = io_uring_queue_init(KVP_STORE_MAX_XFER, polled, 0);
    if (e < 0 && want == KVP_DISK_IO_URING)
        return kvp_err_set(err, KVP_EIO, "io_uring: %s (and the disk IO path io_uring was asked "
                           "for; pread works without it)", strerror(-e));
    if (e < 0) {
        /* any refusal of a plain ring (a locked memory limit on older kernels says ENOMEM): the
         * pread path moves the same bytes */
        char why[96];
        snprintf(why, sizeof(why), "io_uring %s: %s", refused(e) ? "refused" : "failed",
                 strerror(-e));
        disk_close(s);
        return use_pread(s, p, why, err);
    }
    io->ring_on[RING_POLLED] = true;
    s->st.disk_io = KVP_DISK_IO_URING;
    kvp_disk_io_announce(KVP_DISK_IO_URING, s->st.sq_poll ? "io_uring (polling thread)"
                                                          : "io_uring (syscall submissions)");
    if (s->st.sq_poll) { /* the busy-host bypass; without it the polling ring serves alone */
        io->ring_on[RING_DIRECT] =
            io_uring_queue_init(KVP_STORE_MAX_XFER, &io->ring[RING_DIRECT], 0) == 0;
        /* experiments: KVP_SQ_BYPASS=never|always (enum kvp_sq_bypass), else automatic */
        if (kvp_setting_is(KVP_SETTING_SQ_BYPASS, "never"))
            s->sq_bypass = KVP_SQ_BYPASS_NEVER;
        else if (kvp_setting_is(KVP_SETTING_SQ_BYPASS, "always"))
            s->sq_bypass = KVP_SQ_BYPASS_ALWAYS;
    }
    return 0;
}

/* Submit what was prepared. A submission to the direct ring is a system call and, with fewer
 * than three requests, one device doorbell per request (the kernel batches larger
 * submissions): there, unless urgent, requests wait while the store holds (hold_submit). The
 * polling ring's submissions cost nothing and never wait. */
static void submit_rings(struct kvp_store *s, bool urgent)
{
    struct disk_io *io = s->io_state;
    for (int r = 0; r < 2; r++) {
        if (io->n_unsubmitted[r] == 0 || (r == RING_DIRECT && s->hold_submit && !urgent))
            continue;
        io_uring_submit(&io->ring[r]);
        io->n_unsubmitted[r] = 0;
        s->st.direct_submits += r == RING_DIRECT;
    }
    sample_load(s, io);
}

static void disk_flush(struct kvp_store *s)
{
    submit_rings(s, false);
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
    int r = pick_ring(s, io);
    struct io_uring *ring = &io->ring[r];
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe) {
        submit_rings(s, true);
        sqe = io_uring_get_sqe(ring);
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
    io->ring_of[id] = (uint8_t)r;
    io->n_unsubmitted[r]++;
    io->n_inflight[r]++;
    s->st.direct_requests += r == RING_DIRECT;
}

static int disk_reap(struct kvp_store *s)
{
    struct disk_io *io = s->io_state;
    struct io_uring_cqe *cqe;
    int got = 0;
    disk_flush(s);
    for (int r = 0; r < 2; r++)
        while (io->n_inflight[r] > 0 && io_uring_peek_cqe(&io->ring[r], &cqe) == 0) {
            int id = (int)io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&io->ring[r], cqe);
            io->n_inflight[io->ring_of[id]]--;
            kvp_store_complete(s, id, res, kvp_time_now());
            got++;
        }
    return got;
}

/* A ring with a completion to collect, or -1. */
static int ring_ready(struct disk_io *io)
{
    struct io_uring_cqe *cqe;
    for (int r = 0; r < 2; r++)
        if (io->n_inflight[r] > 0 && io_uring_peek_cqe(&io->ring[r], &cqe) == 0)
            return r;
    return -1;
}

static int disk_wait(struct kvp_store *s)
{
    struct disk_io *io = s->io_state;
    struct io_uring_cqe *cqe;
    int rc = 0, got = 0;
    submit_rings(s, true); /* nothing waits on a request not submitted */
    /* submitted, and the polling thread has not even taken them yet */
    if (s->st.sq_poll && io->n_inflight[RING_POLLED] > 0 &&
        io_uring_sq_ready(&io->ring[RING_POLLED]) > 0)
        s->st.sq_unpicked++;
    double t0 = kvp_time_now(), give_up = t0 + SPIN_SECONDS;
    while (ring_ready(io) < 0 && kvp_time_now() < give_up)
        ;
    if (ring_ready(io) < 0) {
        /* sleep on the ring that has requests in flight; on both (around a change of route),
         * on each in turn for a moment */
        bool both = io->n_inflight[0] > 0 && io->n_inflight[1] > 0;
        int r = io->n_inflight[RING_POLLED] > 0 ? RING_POLLED : RING_DIRECT;
        s->st.wait_sleeps++;
        for (;;) {
            if (both) {
                struct __kernel_timespec ts = {.tv_nsec = 50000};
                rc = io_uring_wait_cqe_timeout(&io->ring[r], &cqe, &ts);
                r ^= 1;
            } else {
                rc = io_uring_wait_cqe(&io->ring[r], &cqe);
            }
            if (rc == 0 || (rc != -EINTR && rc != -ETIME))
                break;
            if (both && ring_ready(io) >= 0) {
                rc = 0;
                break;
            }
        }
        s->st.wait_sleep_s += kvp_time_now() - t0 - SPIN_SECONDS;
    }
    if (rc < 0) { /* the ring itself failed: fail every request still in flight */
        for (int i = 0; i < KVP_STORE_MAX_XFER; i++)
            if (s->xfer[i].busy) {
                io->n_inflight[io->ring_of[i]]--;
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
