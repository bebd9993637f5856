/*
 * disk_qd: the random-read rate of the disk under a directory, as the disk KV tier reads it.
 *
 *   build/disk_qd [--dir DIR] [--mib M] [--kib K] [--reqs N] QD ...   (one JSON line per QD)
 *
 * It writes an unnamed file of M MiB (default 4096) in DIR (default $TMPDIR or /tmp) with
 * O_DIRECT, so every byte is on the device and none in the page cache, then for each queue depth
 * QD reads N (default 20000) requests of K KiB (default 12: one fetch unit of the SmolLM2-135M
 * shape's f16 KV, 3 KV heads x 16 tokens x 64 x 2 x 2 bytes) at random 4 KiB-aligned offsets
 * through io_uring with O_DIRECT, QD of them in flight at all times, and prints the requests
 * and megabytes per second. The disk tier's decode reads such units at random (the selected
 * blocks of each layer), so requests per second at a deep queue bound its bytes per second:
 * a cold read rate measured by `kvpred batched-bench` (cold_reads_per_token times
 * tg_tokens_per_s) near this tool's rate means the device, not the engine, is the limit
 * (docs/batched.md, "What bounds the disk-tier row"). The file disappears with the process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { ALIGN = 4096, MAX_QD = 4096 };

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A whole positive decimal number no larger than max, or -1. */
static long parse_count(const char *s, long max)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v <= 0 || v > max)
        return -1;
    return v;
}

/* xorshift64*: offsets spread over the file without libc's rand() state */
static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

static int open_file(const char *dir, size_t bytes, void *buf, size_t buf_bytes)
{
    int fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT, 0600);
    if (fd < 0) {
        fprintf(stderr, "disk_qd: cannot create a file in %s: %s\n", dir, strerror(errno));
        return -1;
    }
    memset(buf, 0x5a, buf_bytes);
    for (size_t off = 0; off < bytes; off += buf_bytes) {
        size_t n = bytes - off < buf_bytes ? bytes - off : buf_bytes;
        if (pwrite(fd, buf, n, (off_t)off) != (ssize_t)n) {
            fprintf(stderr, "disk_qd: writing %zu MiB in %s failed: %s\n", bytes >> 20, dir,
                    strerror(errno));
            close(fd);
            return -1;
        }
    }
    return fd;
}

/* n requests of req bytes at random aligned offsets of a file of bytes, qd in flight. */
static int run_qd(int fd, size_t bytes, size_t req, long n, int qd, uint8_t *buf, double *secs)
{
    struct io_uring ring;
    int e = io_uring_queue_init((unsigned)qd, &ring, 0);
    if (e < 0) {
        fprintf(stderr, "disk_qd: io_uring at depth %d: %s\n", qd, strerror(-e));
        return -1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)qd;
    const uint64_t slots = (bytes - req) / ALIGN + 1;
    long sent = 0, done = 0;
    int inflight = 0, rc = 0;
    double t0 = now_s();
    while (done < n && rc == 0) {
        while (inflight < qd && sent < n) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe)
                break;
            off_t off = (off_t)(next_rand(&x) % slots * ALIGN);
            io_uring_prep_read(sqe, fd, buf + (size_t)(sent % qd) * req, (unsigned)req, off);
            sent++;
            inflight++;
        }
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        if ((e = io_uring_wait_cqe(&ring, &cqe)) < 0) {
            fprintf(stderr, "disk_qd: wait: %s\n", strerror(-e));
            rc = -1;
            break;
        }
        do {
            if (cqe->res != (int)req) {
                fprintf(stderr, "disk_qd: a read returned %d\n", cqe->res);
                rc = -1;
            }
            io_uring_cqe_seen(&ring, cqe);
            done++;
            inflight--;
        } while (io_uring_peek_cqe(&ring, &cqe) == 0);
    }
    *secs = now_s() - t0;
    io_uring_queue_exit(&ring);
    return rc;
}

int main(int argc, char **argv)
{
    const char *tmp = getenv("TMPDIR");
    const char *dir = tmp && *tmp ? tmp : "/tmp";
    long mib = 4096, kib = 12, reqs = 20000;
    int qds[64], n_qd = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long *opt = !strcmp(a, "--mib") ? &mib : !strcmp(a, "--kib") ? &kib
                                                : !strcmp(a, "--reqs") ? &reqs : NULL;
        if ((opt || !strcmp(a, "--dir")) && i + 1 >= argc) {
            fprintf(stderr, "disk_qd: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--dir")) {
            dir = argv[++i];
        } else if (opt) {
            if ((*opt = parse_count(argv[++i], 1L << 30)) < 0) {
                fprintf(stderr, "disk_qd: bad %s '%s'\n", a, argv[i]);
                return 2;
            }
        } else {
            long q = parse_count(a, MAX_QD);
            if (q < 0 || n_qd == 64) {
                fprintf(stderr, "disk_qd: bad queue depth '%s' (1..%d, at most 64 of them)\n",
                        a, MAX_QD);
                return 2;
            }
            qds[n_qd++] = (int)q;
        }
    }
    if (n_qd == 0) {
        fprintf(stderr, "usage: disk_qd [--dir DIR] [--mib M] [--kib K] [--reqs N] QD ...\n");
        return 2;
    }
    size_t bytes = (size_t)mib << 20, req = (size_t)kib << 10;
    if (req % ALIGN || req > bytes || req > (64u << 20)) {
        fprintf(stderr, "disk_qd: --kib %ld: a multiple of 4 up to the file's size and 64 MiB\n",
                kib);
        return 2;
    }
    int max_qd = 0;
    for (int i = 0; i < n_qd; i++)
        max_qd = qds[i] > max_qd ? qds[i] : max_qd;
    size_t buf_bytes = req * (size_t)max_qd > (4u << 20) ? req * (size_t)max_qd : (4u << 20);
    void *buf = NULL;
    if (posix_memalign(&buf, ALIGN, buf_bytes)) {
        fprintf(stderr, "disk_qd: out of memory\n");
        return 1;
    }
    int fd = open_file(dir, bytes, buf, 4u << 20);
    if (fd < 0) {
        free(buf);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < n_qd && rc == 0; i++) {
        double s;
        if ((rc = run_qd(fd, bytes, req, reqs, qds[i], buf, &s)) == 0)
            printf("{\"file_mib\":%ld,\"kib\":%ld,\"qd\":%d,\"requests\":%ld,"
                   "\"iops\":%.0f,\"mb_per_s\":%.1f}\n",
                   mib, kib, qds[i], reqs, (double)reqs / s, (double)reqs * req / s / 1e6);
    }
    close(fd);
    free(buf);
    return rc ? 1 : 0;
}
