/*
 * Tensor element types: one table row per GGUF type id (block size, bytes per block, name,
 * converters). The table knows the sizes of every type a GGUF file may contain, so the reader can
 * validate any file; `supported` says whether kvpred can compute with it yet.
 */
#ifndef KVP_KERNELS_TYPES_H
#define KVP_KERNELS_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpred.h"

#define KVP_QK8_0 32

/* Type ids the public enum kvp_type does not list (docs/formats.md §4.1). */
enum { KVP_TYPE_IQ4_NL = 20 };

/* Q8_0: 32 int8 quants and one f16 scale (docs/formats.md §4.3). */
struct kvp_block_q8_0 {
    uint16_t d;      /* f16 scale */
    int8_t qs[KVP_QK8_0];
};
_Static_assert(sizeof(struct kvp_block_q8_0) == 34, "q8_0 block is 34 bytes");

struct kvp_type_traits {
    const char *name;   /* "F32", "Q8_0", ...; NULL for ids that do not exist */
    int blck_size;      /* elements per block */
    size_t type_size;   /* bytes per block */
    bool supported;     /* kvpred has kernels for it */
    /* Convert n elements (a multiple of blck_size). NULL when unsupported. */
    void (*to_f32)(const void *src, float *dst, int64_t n);
    void (*from_f32)(const float *src, void *dst, int64_t n);
};

/* Row for a type id, or NULL if the id is not a known GGUF type. */
const struct kvp_type_traits *kvp_type_traits(int type);

/* Name for messages ("type 77" style text for unknown ids is the caller's job). */
const char *kvp_type_name(int type);

/* Bytes of n elements of type; false if n is not a multiple of the block size, the type is
 * unknown, or the size overflows. */
bool kvp_type_row_bytes(int type, int64_t n, size_t *out);

/* The activation format dots against weights of this type consume: KVP_TYPE_Q8_0 for the
 * 32-element quantized types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), KVP_TYPE_Q8_K for the
 * K-quants, KVP_TYPE_F32 for float types (x used as is). -1 for types without kernels. */
int kvp_type_vec_dot_type(int type);

/* Reference (scalar) Q8_0 quantization of n floats, n a multiple of 32: d = max|x|/127,
 * q = round(x/d), as ggml's quantize_row_q8_0_ref. */
void kvp_quantize_row_q8_0_ref(const float *x, void *dst, int64_t n);

/* Scalar IEEE half and bfloat16 conversions (round to nearest even). */
float kvp_f16_to_f32(uint16_t h);
uint16_t kvp_f32_to_f16(float f);
float kvp_bf16_to_f32(uint16_t h);
uint16_t kvp_f32_to_bf16(float f);

/* The SIMD kernels' small helpers (kernels/simd_*.c, kv/kv_types_*.c): forced inline, since a
 * call per vector of work would cost more than the work. */
#define KVP_INLINE static inline __attribute__((always_inline))

#endif
