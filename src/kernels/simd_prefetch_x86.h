/*
 * Software prefetch for the multi-row mat-vec kernels of the two AVX-512 files (simd_avx512.c,
 * simd_vnni_avx512.c). A kernel reads a pass of nr consecutive rows side by side, one step at a
 * time (each step reads `step` bytes of every row at offset o), and prefetches what a later pass
 * will read. Without it the hardware prefetcher keeps too few lines in flight for nr streams
 * (decode on SmolLM2-135M's shape, Q8_0, one thread: 5 GB/s without, 12-14 GB/s with). Past the
 * last row the prefetches touch addresses the caller may not own, which a prefetch never faults
 * on. Ranges of at most KVP_PF_MIN_BYTES skip it: a tiny model's matrices live in the caches.
 *
 * Two schemes, chosen by the row length:
 *   - row-wise (rows over KVP_PF_SEQ_MAX_ROW bytes): as a step reads offset o, it prefetches
 *     `lines` lines from offset o_row of each row `ahead` rows further on (a later pass);
 *   - address order (shorter rows): each step prefetches as many bytes as it reads, of the
 *     region one pass plus KVP_PF_SEQ_EXTRA further on, in address order. Rows of a few hundred
 *     bytes make row-wise streams ten lines long, too short to keep in flight.
 * Measured on the VNNI kernels (mat-vec speed over plain read speed of a 128 MiB matrix, one
 * thread, 21 repetitions, old and new process alternating, 3 rounds, ranges of the medians),
 * row-wise -> address order: Q8_0 576 columns (612-byte rows) 0.64-0.77 -> 0.79-0.80, Q5_0 576
 * 0.51-0.56 -> 0.59-0.72, Q4_K 1536 0.64-0.67 -> 0.83-0.92, Q4_K 2048 0.64-0.70 -> 0.79-0.85,
 * Q8_0 1536 (1632-byte rows) a tie; but Q8_0 2048 0.93-0.97 -> 0.80-0.82, Q8_0 8192 0.85-0.98 ->
 * 0.73-0.82, Q4_K 8192 0.93-1.01 -> 0.77-0.79: long rows stay row-wise.
 */
#ifndef KVP_KERNELS_SIMD_PREFETCH_X86_H
#define KVP_KERNELS_SIMD_PREFETCH_X86_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    KVP_PF_MIN_BYTES = 128 * 1024, /* smaller ranges: no prefetch */
    KVP_PF_SEQ_MAX_ROW = 1664,     /* rows up to this many bytes prefetch in address order */
    KVP_PF_SEQ_EXTRA = 2048,       /* address order: how far past the next pass */
};

struct kvp_pf_plan {
    bool on, seq;
    int64_t ahead; /* row-wise: rows between a row and the one it prefetches */
};

static inline struct kvp_pf_plan kvp_pf_plan(int64_t nrows, size_t row_bytes, int64_t ahead)
{
    struct kvp_pf_plan p = {(size_t)nrows * row_bytes > KVP_PF_MIN_BYTES,
                            row_bytes <= KVP_PF_SEQ_MAX_ROW, ahead};
    return p;
}

/* The prefetches of one step of a pass over nr rows from w0, rb bytes apart, that reads `step`
 * bytes per row at offset o; row-wise, `lines` lines per row from offset o_row. */
static inline __attribute__((always_inline)) void
kvp_pf_step(const struct kvp_pf_plan *p, const void *w0, size_t rb, int nr, size_t o, size_t step,
            size_t o_row, int lines)
{
    if (!p->on)
        return;
    if (p->seq) {
        const char *a = (const char *)w0 + (size_t)nr * (rb + o) + KVP_PF_SEQ_EXTRA;
        for (size_t k = 0; k < (size_t)nr * step; k += 64)
            _mm_prefetch(a + k, _MM_HINT_T0);
        return;
    }
    const char *pf = (const char *)w0 + (size_t)p->ahead * rb + o_row;
    for (int l = 0; l < lines; l++)
        for (int i = 0; i < nr; i++)
            _mm_prefetch(pf + (size_t)i * rb + 64 * (size_t)l, _MM_HINT_T0);
}

#endif
