/*
 * Platform shims: file mapping, whole-file reads, monotonic time, aligned allocation and CPU
 * feature detection. Everything OS-specific lives here so the rest of the library has no #ifdef.
 */
#ifndef KVP_CORE_PLATFORM_H
#define KVP_CORE_PLATFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* A read-only view of a file: mapped when possible, or a heap copy (owned). */
struct kvp_file_map {
    const uint8_t *data; /* points into the mapping; valid until kvp_file_unmap */
    size_t size;
    void *heap;          /* non-NULL when the bytes were copied instead of mapped */
};

/* Map path read-only. Empty files map to data = NULL, size = 0. */
int kvp_file_map(const char *path, struct kvp_file_map *m, struct kvp_err *err);

/* As kvp_file_map, or with copy, read the whole file into memory on huge pages (kvp_alloc_huge)
 * instead: a decode step streams the weights, and a file mapping is on 4 KiB pages, each a TLB
 * miss (docs/performance.md). The copy is private memory as large as the file. */
int kvp_file_load(const char *path, bool copy, struct kvp_file_map *m, struct kvp_err *err);
void kvp_file_unmap(struct kvp_file_map *m);

/* Monotonic wall-clock seconds. */
double kvp_time_now(void);
/* CPU time of the whole process (every thread) in seconds. */
double kvp_cpu_time(void);
/* CPU time of the calling thread in seconds. */
double kvp_thread_cpu_time(void);

/* 64-byte aligned allocation (cache line and AVX-512 friendly); size 0 returns NULL. */
void *kvp_alloc_aligned(size_t size);
void kvp_free_aligned(void *p);

/* The transparent huge page size the allocations below align to and advise (x86-64 and
 * aarch64 with 4 KiB base pages). */
#define KVP_HUGE_PAGE ((size_t)2 << 20)

/* align-byte aligned allocation (align a power of two >= 64, size rounded up to a multiple of
 * it) for large buffers read in scattered blocks, the KV cache and the tiered store's tiers:
 * the kernel is asked to back them with transparent huge pages, so that the hundreds of
 * blocks a decode step reads do not each miss the TLB. Freed with kvp_free_aligned. */
void *kvp_alloc_huge(size_t size, size_t align);

/* Zeroed, and from 2 MiB up 2 MiB aligned and huge-page advised, for large tables that a step
 * reads in scattered pieces (Quest's block metadata): pages are committed when first written,
 * as calloc's are, but a huge page at a time. Measured: with the metadata on 4 KiB pages,
 * quest's hooks at 131072 tokens took 4.1-4.2 ms a token against 3.8 on huge pages
 * (docs/performance.md). Under AddressSanitizer it is a zeroed heap block of the same
 * alignment, so overruns are still caught. Freed with kvp_free_huge (NULL is fine). */
void *kvp_calloc_huge(size_t size);
void kvp_free_huge(void *p);

enum kvp_cpu_feature {
    KVP_CPU_AVX2 = 1 << 0,       /* AVX2 + FMA + F16C */
    KVP_CPU_AVX512 = 1 << 1,     /* AVX-512 F, BW, VL, DQ */
    KVP_CPU_AVX512VNNI = 1 << 2, /* AVX-512 VNNI (with KVP_CPU_AVX512) */
    KVP_CPU_NEON = 1 << 3,       /* aarch64 Advanced SIMD (always there on aarch64) */
};
/* Bitmask of enum kvp_cpu_feature supported by this CPU and OS. */
int kvp_cpu_features(void);

/* Plain C loops written for the compiler's vectorizer, compiled once per x86 instruction set and
 * picked by the loader (GCC/clang function multi-versioning). On other processors one copy,
 * compiled for the base instruction set (which on aarch64 includes NEON). */
#if defined(__x86_64__)
#define KVP_X86_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KVP_X86_CLONES
#endif

#endif
