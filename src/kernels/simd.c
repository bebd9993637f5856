/*
 * Run-time choice of the SIMD kernel table.
 *
 * On x86-64 four tables are built (simd_scalar.c, simd_avx2.c, simd_avx512.c and its VNNI
 * variant); the AVX ones may only run when kvp_cpu_features() reports the instructions. On
 * aarch64 two are built: scalar and NEON (simd_neon.c; NEON is in every aarch64 CPU). Elsewhere
 * only the scalar one. The choice is made once, on the
 * first call from any thread: pthread_once runs the CPU probe and reads KVP_SIMD, and the result
 * is published through an atomic pointer, so every later call is one acquire load (a plain load
 * on x86). kvp_simd() sits on the per-mat-vec path, which at short context runs ~30 times per
 * token on tiny matrices, so that cost matters.
 *
 * KVP_SIMD=scalar|avx2|avx512|avx512vnni|neon forces a table; a request the CPU cannot honour
 * falls back to the best table it can run rather than crashing on an illegal instruction.
 */
#include "kernels/simd.h"
#include "core/settings.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "kernels/simd_internal.h"

static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static int simd_features;                              /* kvp_cpu_features(), set once */
static _Atomic(const struct kvp_simd_ops *) simd_best; /* NULL until simd_init has run */

const struct kvp_simd_ops *kvp_simd_pick(const char *want, int features)
{
#if defined(__aarch64__)
    if (want && strcmp(want, "scalar") == 0)
        return &kvp_simd_ops_scalar;
    /* "neon", an x86 name, empty, unknown or absent: the best this CPU runs */
    return (features & KVP_CPU_NEON) ? &kvp_simd_ops_neon : &kvp_simd_ops_scalar;
#elif !defined(__x86_64__)
    (void)want, (void)features;
    return &kvp_simd_ops_scalar;
#else
    bool has_avx2 = (features & KVP_CPU_AVX2) != 0;
    bool has_avx512 = has_avx2 && (features & KVP_CPU_AVX512) != 0;
    bool has_vnni = has_avx512 && (features & KVP_CPU_AVX512VNNI) != 0;
    if (want && strcmp(want, "scalar") == 0)
        return &kvp_simd_ops_scalar;
    if (want && strcmp(want, "avx2") == 0)
        return has_avx2 ? &kvp_simd_ops_avx2 : &kvp_simd_ops_scalar;
    if (want && strcmp(want, "avx512") == 0 && has_avx512)
        return &kvp_simd_ops_avx512;
    /* "avx512vnni", empty, unknown or absent: the best this CPU runs */
    if (has_vnni)
        return &kvp_simd_ops_avx512vnni;
    if (has_avx512)
        return &kvp_simd_ops_avx512;
    if (has_avx2)
        return &kvp_simd_ops_avx2;
    return &kvp_simd_ops_scalar;
#endif
}

static void simd_init(void)
{
    simd_features = kvp_cpu_features();
    atomic_store_explicit(&simd_best, kvp_simd_pick(kvp_setting(KVP_SETTING_SIMD), simd_features),
                          memory_order_release);
}

static int simd_cpu(void)
{
    pthread_once(&simd_once, simd_init);
    return simd_features;
}

const struct kvp_simd_ops *kvp_simd(void)
{
    const struct kvp_simd_ops *ops = atomic_load_explicit(&simd_best, memory_order_acquire);
    if (__builtin_expect(ops != NULL, 1))
        return ops;
    pthread_once(&simd_once, simd_init);
    return atomic_load_explicit(&simd_best, memory_order_acquire);
}

const struct kvp_simd_ops *kvp_simd_scalar(void)
{
    return &kvp_simd_ops_scalar;
}

#if defined(__x86_64__)
const struct kvp_simd_ops *kvp_simd_avx2(void)
{
    return (simd_cpu() & KVP_CPU_AVX2) ? &kvp_simd_ops_avx2 : NULL;
}

const struct kvp_simd_ops *kvp_simd_avx512(void)
{
    int f = simd_cpu();
    return ((f & KVP_CPU_AVX2) && (f & KVP_CPU_AVX512)) ? &kvp_simd_ops_avx512 : NULL;
}

const struct kvp_simd_ops *kvp_simd_avx512vnni(void)
{
    int f = simd_cpu();
    return ((f & KVP_CPU_AVX2) && (f & KVP_CPU_AVX512) && (f & KVP_CPU_AVX512VNNI))
               ? &kvp_simd_ops_avx512vnni
               : NULL;
}

const struct kvp_simd_ops *kvp_simd_neon(void)
{
    return NULL;
}
#else
/* No x86 tables are built here. */
const struct kvp_simd_ops *kvp_simd_avx2(void)
{
    return NULL;
}

const struct kvp_simd_ops *kvp_simd_avx512(void)
{
    return NULL;
}

const struct kvp_simd_ops *kvp_simd_avx512vnni(void)
{
    return NULL;
}

const struct kvp_simd_ops *kvp_simd_neon(void)
{
#if defined(__aarch64__)
    return (simd_cpu() & KVP_CPU_NEON) ? &kvp_simd_ops_neon : NULL;
#else
    (void)simd_cpu;
    return NULL;
#endif
}
#endif

int kvp_simd_runnable(const struct kvp_simd_ops **out, int cap)
{
    const struct kvp_simd_ops *all[] = {kvp_simd_scalar(), kvp_simd_avx2(), kvp_simd_avx512(),
                                        kvp_simd_avx512vnni(), kvp_simd_neon()};
    int n = 0;
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i] && n < cap)
            out[n++] = all[i];
    return n;
}

/* The fast path lives in the SIMD tables (this file is built without -m flags); each table's
 * quantizer is bit-identical to kvp_quantize_row_q8_0_ref, see simd_avx2.c and simd_neon.c. */
void kvp_quantize_row_q8_0(const float *x, void *dst, int64_t n)
{
    kvp_simd()->quantize_q8_0(x, dst, n);
}

void kvp_quantize_row_q8_k(const float *x, void *dst, int64_t n)
{
    kvp_simd()->quantize_q8_k(x, dst, n);
}

float kvp_simd_max(const struct kvp_simd_ops *ops, const float *x, int64_t n)
{
    if (ops->max)
        return ops->max(x, n);
    float m = x[0];
    for (int64_t i = 1; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}
