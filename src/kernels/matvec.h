/*
 * Matrix-vector and matrix-matrix products over weights of any supported type.
 *
 * A weight matrix is `rows` rows of `cols` elements, each row contiguous and quantized along the
 * row (GGUF ne = [cols, rows]). Decode multiplies one activation vector; prefill multiplies a
 * batch, through prefill_gemm.h's integer GEMM where it applies, else OpenBLAS sgemm for F32
 * weights and a dequantized tile for the others.
 */
#ifndef KVP_KERNELS_MATVEC_H
#define KVP_KERNELS_MATVEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_mat {
    int type;           /* enum kvp_type */
    int64_t cols;       /* elements per row (ne[0]) */
    int64_t rows;       /* ne[1] */
    size_t row_bytes;   /* bytes per row */
    const void *data;   /* borrowed (usually points into the model mapping) */
};

/* Bytes of scratch needed to hold x prepared for W's type (0 for float types). */
size_t kvp_matvec_xq_bytes(int type, int64_t cols);

/* Prepare x for dots against rows of W's type: quantize to kvp_type_vec_dot_type(type) (Q8_0
 * for the 32-element quantized types, Q8_K for the K-quants); no-op for float types. xq must hold
 * kvp_matvec_xq_bytes bytes. */
void kvp_matvec_prepare(int type, const float *x, int64_t cols, void *xq);

/* y[r] = dot(row r of W, x) for r in [r0, r1). xq is x prepared by kvp_matvec_prepare, or NULL:
 * then quantized types quantize x themselves on each call (in 4096-column chunks on the stack;
 * same result as the prepared path when cols <= 4096). y is indexed by absolute row. */
void kvp_matvec_rows(const struct kvp_mat *W, const float *x, const void *xq, float *y, int64_t r0,
                     int64_t r1);

/* kvp_matvec_rows with an explicit kernel table (tests compare every table; callers normally
 * use kvp_matvec_rows, which takes kvp_simd()). */
struct kvp_simd_ops;
void kvp_matvec_rows_ops(const struct kvp_simd_ops *ops, const struct kvp_mat *W, const float *x,
                         const void *xq, float *y, int64_t r0, int64_t r1);

/* Whether this CPU has a kernel that reads rows of W's type once for several prepared vectors
 * (kvp_matvec_rows_multi). */
bool kvp_matvec_has_multi(const struct kvp_mat *W);

/* y[j][r - r0] = dot(row r of W, the vector prepared in xq[j]) for j < nv and r in [r0, r1), each
 * bit-identical to kvp_matvec_rows of that vector alone; the rows are read once for all. Only
 * when kvp_matvec_has_multi. */
void kvp_matvec_rows_multi(const struct kvp_mat *W, const void *const *xq, int nv,
                           float *const *y, int64_t r0, int64_t r1);

/* W packed once with its weight rows in the SIMD lanes, for the decode rows of batched steps
 * (simd.h, lanes_pack / lanes_rows; AVX-512 VNNI: Q8_0, Q4_0, Q5_0, Q4_K). Per tile of 16 rows
 * (the last padded with zero rows): the codes of its 32-column blocks laid out for the lanes, then
 * their scales, as many bytes as the rows take in the file (Q4_K: 1/36 more; the layout is at
 * kvp_lanes_tile_bytes, simd_internal.h). Turning 16 rows into such a tile costs about three
 * vectors' products, so it is done once per matrix (kvp_lanes_pack), not per call. */
struct kvp_lanes {
    void *mem;       /* NULL: not packed; owned unless borrowed */
    size_t bytes;
    int type;
    int64_t rows, cols;
    bool borrowed;   /* mem is the caller's (kvp_lanes_init_at) */
};

/* Whether this CPU's table packs and runs the type in lanes. */
bool kvp_lanes_has(int type);

/* Bytes of W packed (0: no kernel for its type, or a shape it cannot take). */
size_t kvp_lanes_bytes(const struct kvp_mat *W);

/* Allocate P for W: 0, or -1 (no kernel, bad shape, out of memory; P zeroed). */
int kvp_lanes_init(struct kvp_lanes *P, const struct kvp_mat *W);

/* As kvp_lanes_init, into mem (kvp_lanes_bytes(W) bytes, 64-byte aligned), which the caller owns
 * and kvp_lanes_free leaves alone: one allocation for a whole model's matrices can sit on huge
 * pages, where a matrix of its own (a few hundred KB to a few MB) mostly cannot. */
int kvp_lanes_init_at(struct kvp_lanes *P, const struct kvp_mat *W, void *mem);

/* Tiles of 16 rows of P; kvp_lanes_pack fills tiles [t0, t1) of W into P (threads may fill
 * disjoint ranges at once). */
int64_t kvp_lanes_tiles(const struct kvp_lanes *P);
void kvp_lanes_pack(struct kvp_lanes *P, const struct kvp_mat *W, int64_t t0, int64_t t1);

void kvp_lanes_free(struct kvp_lanes *P);

/* y[j][r - r0] (+= when accumulate) = dot(row r of the packed W, the vector prepared in xq[j])
 * for j < nv and r in [r0, r1) (any rows: a tile the range cuts is computed and stored in part):
 * kvp_matvec_rows_multi's contract except that a result may differ from kvp_matvec_rows's by
 * float rounding (the blocks are added in another order); it depends neither on the other
 * vectors nor on r0 and r1. */
void kvp_lanes_rows(const struct kvp_lanes *P, const void *const *xq, int nv, float *const *y,
                    int64_t r0, int64_t r1, bool accumulate);

/* Dequantize rows [r0, r1) of W into dst ([r1-r0][cols] floats). */
void kvp_mat_dequant_rows(const struct kvp_mat *W, float *dst, int64_t r0, int64_t r1);

#endif
