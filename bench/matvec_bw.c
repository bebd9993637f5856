/*
 * matvec_bw: how close the decode mat-vec kernels come to the machine's read bandwidth.
 *
 *   build/matvec_bw [--threads N] [--mib M] [--reps R] [--lanes NV] TYPE:COLS ...
 *                                                                      (one JSON line each)
 *
 * For each TYPE:COLS (TYPE a GGUF weight type name such as Q8_0, Q4_K, F16) it fills a matrix of
 * about M MiB (default 128, well past the last-level cache) with random codes and f16 scales,
 * then alternates R times (default 21) a plain read of those bytes (64-byte loads, the floor)
 * with one kvp_matvec_rows over all rows, N threads splitting the rows as the forward pass does.
 * It prints the median GB/s of each and the median of the per-repetition ratio mat-vec / read;
 * pairing each mat-vec with the read right before it keeps the ratio meaningful on a host whose
 * speed drifts. Ratios near 1 mean the kernel runs at the bandwidth; the README's kernel section
 * quotes this tool's output.
 *
 * --lanes NV measures a batched step's kernel instead: the matrix packed with its rows in the lanes
 * (kvp_lanes_pack, where the CPU's table has it for the type), NV vectors at once through
 * kvp_lanes_rows, paired with a plain read of the packed bytes. It adds the packed size and
 * file_gb_s, the file's bytes over the kernel's time (what the packed layout makes of the model's
 * weights; against read_gb_s it says how far a layout is from streaming the file once).
 */
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "core/threadpool.h"
#include "kernels/matvec.h"
#include "kernels/types.h"
#include "model/quantize.h"
#include "kvpred.h"

enum { MAX_REPS = 101 };

struct job {
    const struct kvp_mat *W;
    const float *x;
    const void *xq;
    float *y;
    const uint8_t *buf;
    size_t bytes;
    uint64_t sink[64];
    int read; /* 1: plain read, 0: mat-vec */
    const struct kvp_lanes *P; /* --lanes: the packed matrix and NV vectors */
    const void *const *xqs;
    float *const *ys;
    int nv;
};

/* The floor: every byte read once, 256 bytes a step (AVX-512 loads where the CPU has them). */
static uint64_t read_bytes_scalar(const uint8_t *p, size_t n)
{
    uint64_t a = 0, b = 0, c = 0, d = 0, v[4];
    for (size_t i = 0; i + 256 <= n; i += 256)
        for (size_t o = 0; o < 256; o += 32) {
            memcpy(v, p + i + o, 32);
            a ^= v[0], b ^= v[1], c ^= v[2], d ^= v[3];
        }
    return a ^ b ^ c ^ d;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t read_bytes_avx512(const uint8_t *p, size_t n)
{
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    size_t i = 0;
    for (; i + 256 <= n; i += 256) {
        a = _mm512_xor_si512(a, _mm512_loadu_si512(p + i));
        b = _mm512_xor_si512(b, _mm512_loadu_si512(p + i + 64));
        c = _mm512_xor_si512(c, _mm512_loadu_si512(p + i + 128));
        d = _mm512_xor_si512(d, _mm512_loadu_si512(p + i + 192));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    uint64_t lanes[8], x = 0; /* folded with xor: a signed lane sum could overflow */
    _mm512_storeu_si512(lanes, a);
    for (int l = 0; l < 8; l++)
        x ^= lanes[l];
    return x;
}

static uint64_t read_bytes(const uint8_t *p, size_t n)
{
    return __builtin_cpu_supports("avx512f") ? read_bytes_avx512(p, n) : read_bytes_scalar(p, n);
}
#else
/* elsewhere the plain loop (the compiler vectorizes it for the base ISA, NEON on aarch64) */
static uint64_t read_bytes(const uint8_t *p, size_t n)
{
    return read_bytes_scalar(p, n);
}
#endif

static void worker(void *arg, int ith, int nth)
{
    struct job *j = arg;
    long b, e;
    if (j->read) {
        kvp_split_range((long)(j->bytes / 256), ith, nth, &b, &e);
        j->sink[ith * 8] += read_bytes(j->buf + (size_t)b * 256, (size_t)(e - b) * 256);
        return;
    }
    if (j->P) { /* whole tiles per thread, as the forward pass splits them */
        kvp_split_range((long)kvp_lanes_tiles(j->P), ith, nth, &b, &e);
        int64_t r1 = e * 16 < j->W->rows ? e * 16 : j->W->rows;
        kvp_lanes_rows(j->P, j->xqs, j->nv, j->ys, b * 16, r1, false);
        return;
    }
    kvp_split_range((long)j->W->rows, ith, nth, &b, &e);
    kvp_matvec_rows(j->W, j->x, j->xq, j->y, b, e);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

static int run_one(struct kvp_pool *pool, int n_threads, const char *spec, size_t mib, int reps,
                   int nv)
{
    char name[32];
    const char *colon = strchr(spec, ':');
    if (!colon || colon - spec >= (long)sizeof(name)) {
        fprintf(stderr, "matvec_bw: expected TYPE:COLS, got '%s'\n", spec);
        return -1;
    }
    memcpy(name, spec, (size_t)(colon - spec));
    name[colon - spec] = 0;
    /* the weight types `kvpred quantize` writes, less F32 (no quantized mat-vec) */
    const int type = kvp_quantize_type_from_name(name);
    char *end = NULL;
    long cols = strtol(colon + 1, &end, 10);
    size_t rb = 0;
    if (type < 0 || type == KVP_TYPE_F32 || end == colon + 1 || *end || cols <= 0 ||
        cols > (1L << 20) || !kvp_type_row_bytes(type, cols, &rb)) {
        fprintf(stderr,
                "matvec_bw: bad TYPE:COLS '%s' (a weight type with kernels; COLS a multiple of "
                "its block)\n",
                spec);
        return -1;
    }
    int64_t rows = (int64_t)((mib << 20) / rb);
    if (rows < 1) {
        fprintf(stderr, "matvec_bw: one row of '%s' is larger than --mib %zu\n", spec, mib);
        return -1;
    }
    size_t bytes = rb * (size_t)rows;
    uint8_t *w = kvp_alloc_aligned(bytes + 256);
    float *x = malloc((size_t)cols * sizeof(float)), *y = malloc((size_t)rows * sizeof(float));
    void *xq = malloc(kvp_matvec_xq_bytes(type, cols) + 1);
    if (!w || !x || !y || !xq) {
        fprintf(stderr, "matvec_bw: out of memory for %zu bytes\n", bytes);
        kvp_free_aligned(w);
        free(x), free(y), free(xq);
        return -1;
    }
    /* random codes; every 16-bit word set to a small f16 so that block scales are finite */
    uint32_t s = 12345;
    for (size_t i = 0; i < bytes; i += 2) {
        s = s * 1664525u + 1013904223u;
        uint16_t h = (uint16_t)(0x2c00 | (s >> 22 & 0x3ff));
        memcpy(w + i, &h, 2);
        w[i + 1] ^= (uint8_t)(s >> 8 & 0x80);
    }
    for (long i = 0; i < cols; i++)
        x[i] = (float)((i * 7) % 13) - 6.0f;
    kvp_matvec_prepare(type, x, cols, xq);
    struct kvp_mat W = {.type = type, .cols = cols, .rows = rows, .row_bytes = rb, .data = w};
    struct job j = {.W = &W, .x = x, .xq = xq, .y = y, .buf = w, .bytes = bytes / 256 * 256};
    struct kvp_lanes P = {0};
    const void *xqs[64];
    float *ys[64] = {0};
    size_t timed = bytes; /* the bytes the kernel reads */
    int rc = -1;
    if (nv > 0) {
        if (kvp_lanes_init(&P, &W) < 0) {
            fprintf(stderr, "matvec_bw: no lanes kernel for %s:%ld on this CPU\n", name, cols);
            goto out;
        }
        kvp_lanes_pack(&P, &W, 0, kvp_lanes_tiles(&P));
        for (int v = 0; v < nv; v++) {
            xqs[v] = xq;
            if (!(ys[v] = malloc((size_t)rows * sizeof(float)))) {
                fprintf(stderr, "matvec_bw: out of memory for %d outputs\n", nv);
                goto out;
            }
        }
        j.P = &P, j.xqs = xqs, j.ys = ys, j.nv = nv;
        j.buf = P.mem, j.bytes = P.bytes / 256 * 256;
        timed = P.bytes;
    }
    double rd[MAX_REPS], mv[MAX_REPS], ratio[MAX_REPS], file[MAX_REPS];
    for (int r = -1; r < reps; r++) { /* r = -1 warms up */
        j.read = 1;
        double t0 = kvp_time_now();
        kvp_pool_run(pool, worker, &j);
        double t1 = kvp_time_now();
        j.read = 0;
        kvp_pool_run(pool, worker, &j);
        double t2 = kvp_time_now();
        if (r < 0)
            continue;
        rd[r] = (double)j.bytes / (t1 - t0) / 1e9;
        mv[r] = (double)timed / (t2 - t1) / 1e9;
        ratio[r] = mv[r] / rd[r];
        file[r] = (double)bytes / (t2 - t1) / 1e9;
    }
    printf("{\"type\":\"%s\",\"cols\":%ld,\"rows\":%lld,\"row_bytes\":%zu,\"threads\":%d,"
           "\"reps\":%d,",
           kvp_type_name(type), cols, (long long)rows, rb, n_threads, reps);
    if (nv > 0)
        printf("\"lanes_vectors\":%d,\"packed_bytes\":%zu,\"file_bytes\":%zu,\"lanes_gb_s\":%.2f,"
               "\"file_gb_s\":%.2f,",
               nv, P.bytes, bytes, median(mv, reps), median(file, reps));
    else
        printf("\"matvec_gb_s\":%.2f,", median(mv, reps));
    printf("\"read_gb_s\":%.2f,\"ratio\":%.3f}\n", median(rd, reps), median(ratio, reps));
    fflush(stdout);
    rc = 0;
out:
    for (int v = 0; v < nv; v++)
        free(ys[v]);
    kvp_lanes_free(&P);
    kvp_free_aligned(w);
    free(x), free(y), free(xq);
    return rc;
}

int main(int argc, char **argv)
{
    int n_threads = 1, reps = 21, first = 1, nv = 0;
    size_t mib = 128;
    for (; first + 1 < argc && argv[first][0] == '-'; first += 2) {
        char *end = NULL;
        long v = strtol(argv[first + 1], &end, 10);
        if (end == argv[first + 1] || *end)
            v = 0; /* not a number: out of every range below */
        if (strcmp(argv[first], "--threads") == 0 && v >= 1 && v <= 64)
            n_threads = (int)v;
        else if (strcmp(argv[first], "--mib") == 0 && v >= 1 && v <= 4096)
            mib = (size_t)v;
        else if (strcmp(argv[first], "--reps") == 0 && v >= 1 && v <= MAX_REPS)
            reps = (int)v;
        else if (strcmp(argv[first], "--lanes") == 0 && v >= 1 && v <= 64)
            nv = (int)v;
        else {
            fprintf(stderr, "matvec_bw: bad option %s %s\n", argv[first], argv[first + 1]);
            return 2;
        }
    }
    if (first >= argc) {
        fprintf(stderr,
                "usage: matvec_bw [--threads N] [--mib M] [--reps R] [--lanes NV] TYPE:COLS ...\n");
        return 2;
    }
    struct kvp_pool *pool = NULL;
    if (kvp_pool_init(n_threads, &pool, NULL) < 0) {
        fprintf(stderr, "matvec_bw: cannot start %d threads\n", n_threads);
        return 1;
    }
    int rc = 0;
    for (int i = first; i < argc; i++)
        if (run_one(pool, n_threads, argv[i], mib, reps, nv) < 0)
            rc = 1;
    kvp_pool_free(pool);
    return rc;
}
