/* Platform shims for Linux on x86-64 and aarch64 (see platform.h). */
#include "core/platform.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int kvp_file_map(const char *path, struct kvp_file_map *m, struct kvp_err *err)
{
    return kvp_file_load(path, false, m, err);
}

/* Read the size bytes of fd into m (on huge pages). */
static int copy_file(int fd, size_t size, const char *path, struct kvp_file_map *m,
                     struct kvp_err *err)
{
    uint8_t *h = kvp_alloc_huge(size, KVP_HUGE_PAGE);
    if (!h)
        return kvp_err_set(err, KVP_ENOMEM, "%s: cannot allocate %zu MiB to read it into", path,
                           size >> 20);
    for (size_t got = 0; got < size;) {
        ssize_t r = pread(fd, h + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = errno;
            free(h);
            return r < 0 ? kvp_err_set(err, KVP_EIO, "%s: cannot read: %s", path, strerror(e))
                         : kvp_err_set(err, KVP_EIO, "%s: shorter than its size", path);
        }
        got += (size_t)r;
    }
    m->heap = h;
    m->data = h;
    m->size = size;
    return 0;
}

int kvp_file_load(const char *path, bool copy, struct kvp_file_map *m, struct kvp_err *err)
{
    memset(m, 0, sizeof(*m));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvp_err_set(err, KVP_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kvp_err_set(err, KVP_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kvp_err_set(err, KVP_EIO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return 0;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return kvp_err_set(err, KVP_EIO, "%s: too large for this address space", path);
    }
    if (copy) {
        int rc = copy_file(fd, (size_t)st.st_size, path, m, err);
        close(fd);
        return rc;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return kvp_err_set(err, KVP_EIO, "%s: cannot map: %s", path, strerror(e));
    m->data = p;
    m->size = (size_t)st.st_size;
    return 0;
}

void kvp_file_unmap(struct kvp_file_map *m)
{
    if (!m)
        return;
    if (m->heap)
        free(m->heap);
    else if (m->data)
        munmap((void *)m->data, m->size);
    memset(m, 0, sizeof(*m));
}

double kvp_time_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double kvp_cpu_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double kvp_thread_cpu_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *kvp_alloc_aligned(size_t size)
{
    if (size == 0)
        return NULL;
    /* round up so aligned_alloc's size-multiple rule holds */
    size_t rounded = (size + 63) & ~(size_t)63;
    if (rounded < size)
        return NULL;
    return aligned_alloc(64, rounded);
}

void kvp_free_aligned(void *p)
{
    free(p);
}

void *kvp_alloc_huge(size_t size, size_t align)
{
    if (size == 0 || size > SIZE_MAX - align)
        return NULL;
    size_t rounded = (size + align - 1) & ~(align - 1);
    void *p = aligned_alloc(align, rounded);
    /* advice on the page-aligned span; where THP is off or refused, plain pages (why it
     * matters, measured on the tiered store: docs/store.md) */
    const uintptr_t page = 4096, huge = KVP_HUGE_PAGE;
    if (p && rounded >= huge) {
        uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
        uintptr_t e = ((uintptr_t)p + rounded) & ~(page - 1);
        if (e > a)
            madvise((void *)a, e - a, MADV_HUGEPAGE);
    }
    return p;
}

#if defined(__SANITIZE_ADDRESS__)
#define KVP_HUGE_BY_MMAP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVP_HUGE_BY_MMAP 0
#endif
#endif
#ifndef KVP_HUGE_BY_MMAP
#define KVP_HUGE_BY_MMAP 1
#endif

/* What kvp_free_huge needs, kept in the 64 bytes before the aligned pointer (inside the mapping's
 * alignment slack, which is at least 2 MiB). */
struct huge_head {
    void *base;
    size_t len;
};

void *kvp_calloc_huge(size_t size)
{
    if (size == 0)
        return NULL;
#if KVP_HUGE_BY_MMAP
    /* below one huge page: plain pages after a page for the head (a huge page would commit
     * 2 MiB for a few KB of a small model's tables) */
    const size_t huge = KVP_HUGE_PAGE, page = 4096;
    if (size > SIZE_MAX - 2 * huge)
        return NULL;
    const bool big = size >= huge;
    size_t span = big ? (size + huge - 1) & ~(huge - 1) : size, len = span + (big ? huge : page);
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    uintptr_t p = big ? ((uintptr_t)base + 64 + huge - 1) & ~(uintptr_t)(huge - 1)
                      : (uintptr_t)base + page;
    struct huge_head head = {base, len};
    memcpy((void *)(p - 64), &head, sizeof(head));
    if (big)
        madvise((void *)p, span, MADV_HUGEPAGE); /* advice only: plain pages where THP is off */
    return (void *)p;
#else
    const size_t align = size >= KVP_HUGE_PAGE ? KVP_HUGE_PAGE : 64;
    if (size > SIZE_MAX - align)
        return NULL;
    void *p = aligned_alloc(align, (size + align - 1) & ~(align - 1));
    if (p)
        memset(p, 0, size);
    return p;
#endif
}

void kvp_free_huge(void *p)
{
    if (!p)
        return;
#if KVP_HUGE_BY_MMAP
    struct huge_head head;
    memcpy(&head, (const uint8_t *)p - 64, sizeof(head));
    munmap(head.base, head.len);
#else
    free(p);
#endif
}

int kvp_cpu_features(void)
{
    static int cached = -1;
    if (cached >= 0)
        return cached;
    int f = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        f |= KVP_CPU_AVX2;
    if ((f & KVP_CPU_AVX2) && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        f |= KVP_CPU_AVX512;
    if ((f & KVP_CPU_AVX512) && __builtin_cpu_supports("avx512vnni"))
        f |= KVP_CPU_AVX512VNNI;
#elif defined(__aarch64__)
    /* Advanced SIMD (NEON) with half-precision conversions is part of the ARMv8-A base ISA, so
     * every aarch64 Linux CPU has it; nothing to probe. */
    f |= KVP_CPU_NEON;
#endif
    cached = f;
    return f;
}
