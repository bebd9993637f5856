/*
 * SIMD kernel table. Every hot inner loop has a scalar version (the test oracle) and, on x86-64,
 * AVX2 and AVX-512 versions compiled with their own target flags (files *_avx2.c, *_avx512.c);
 * on aarch64 a NEON table (simd_neon.c) whose fields without a NEON kernel hold the scalar ones.
 * The best table for this CPU is chosen once at first use; KVP_SIMD=scalar|avx2|avx512|
 * avx512vnni|neon in the environment forces one (the tests use that to compare paths).
 */
#ifndef KVP_KERNELS_SIMD_H
#define KVP_KERNELS_SIMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_gemm_tile;

#define KVP_SIMD_NTYPES 32 /* dot_q[] slots: GGUF type ids below 32 */

struct kvp_simd_ops {
    const char *name; /* "scalar", "avx2", "avx512", "avx512vnni", "neon" */

    /* Dot products of one weight row (n elements, n a multiple of the type's block size) with
     * an activation vector. Float types take x as f32; Q8_0 takes x already quantized to Q8_0
     * blocks (kvp_quantize_row_q8_0). */
    float (*dot_f32)(const float *w, const float *x, int64_t n);
    float (*dot_f16)(const uint16_t *w, const float *x, int64_t n);
    float (*dot_bf16)(const uint16_t *w, const float *x, int64_t n);
    float (*dot_q8_0)(const void *w, const void *xq, int64_t n);

    /* y[i] += a * x[i] */
    void (*axpy)(float a, const float *x, float *y, int64_t n);

    /* x[i] = exp(x[i] - max); returns the sum of the new x. Accurate to ~1e-6 relative. max
     * must be finite and >= every x[i] (up to rounding); x[i] = -inf gives 0, and results below
     * FLT_MIN may flush to 0. */
    float (*exp_sum)(float *x, int64_t n, float max);

    /* Attention over one KV block. kt is the block's keys transposed, [hd][bs] (bs contiguous
     * token values per dimension); scores[t] = scale * Σ_d q[d]·kt[d][t] for t < bs. */
    void (*block_scores)(const float *q, const float *kt, int hd, int bs, float scale,
                         float *scores);
    /* out[d] += Σ_t p[t]·v[t][d] for t < n, v laid out [bs][hd] (n <= bs tokens used). */
    void (*block_accum)(const float *p, const float *v, int hd, int n, float *out);

    /* ---- Added by the kernel layer (fields appended; the ones above are unchanged). ---- */

    /* Row-batched dots for kvp_matvec_rows: y[r] = dot(row r, x) for r < nrows, where row r
     * starts at (const char *)w + r * row_bytes (any alignment). Doing several rows per call
     * shares the x loads and the horizontal sums, which dominate for small matrices. x is f32
     * for the float types and Q8_0 blocks for rows_q8_0. Same rounding contract as the dots. */
    void (*rows_f32)(const void *w, size_t row_bytes, const float *x, int64_t n, int64_t nrows,
                     float *y);
    void (*rows_f16)(const void *w, size_t row_bytes, const float *x, int64_t n, int64_t nrows,
                     float *y);
    void (*rows_bf16)(const void *w, size_t row_bytes, const float *x, int64_t n, int64_t nrows,
                      float *y);
    void (*rows_q8_0)(const void *w, size_t row_bytes, const void *xq, int64_t n, int64_t nrows,
                      float *y);

    /* Q8_0 quantization of n floats (n a multiple of 32), bit-identical to
     * kvp_quantize_row_q8_0_ref for finite inputs. dst may be unaligned. */
    void (*quantize_q8_0)(const float *x, void *dst, int64_t n);

    /* Dequantize n elements (src may be unaligned; Q8_0: n a multiple of 32). */
    void (*dequant_f16)(const void *src, float *dst, int64_t n);
    void (*dequant_q8_0)(const void *src, float *dst, int64_t n);

    /* ---- Added for the quantized weight types (quant.h); appended, the fields above are
     * unchanged. ---- */

    /* Integer dots of one weight row of type t (indexed by the GGUF type id) with activations
     * quantized to kvp_type_vec_dot_type(t): Q8_0 blocks for Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL,
     * Q8_K blocks (kvp_quantize_row_q8_k) for Q2_K..Q6_K. n is a multiple of the block size;
     * w and xq may be unaligned. Each block's products are summed exactly in int32 before the
     * float scales apply, so every table agrees with the scalar one to float rounding. NULL for
     * types without an integer dot (floats, Q8_0, which keep their own fields above). */
    float (*dot_q[KVP_SIMD_NTYPES])(const void *w, const void *xq, int64_t n);

    /* Q8_K quantization of n floats (n a multiple of 256), bit-identical to
     * kvp_quantize_row_q8_k_ref for finite inputs. dst may be unaligned. */
    void (*quantize_q8_k)(const float *x, void *dst, int64_t n);

    /* Largest of x[0..n) (n >= 1; -inf entries allowed). NULL in a table means "use the
     * scalar loop" (kvp_simd_max does the dispatch). */
    float (*max)(const float *x, int64_t n);

    /* Row-batched integer dots for the types in dot_q (same contract as rows_q8_0: several rows
     * per pass share the activation loads). NULL: kvp_matvec_rows calls dot_q once per row. */
    void (*rows_q[KVP_SIMD_NTYPES])(const void *w, size_t row_bytes, const void *xq, int64_t n,
                                    int64_t nrows, float *y);
    /* The rows_* kernels (rows_f32 .. rows_q8_0 and rows_q) prefetch the rows after those they
     * compute; kvp_matvec_rows prefetches for the others. */
    bool rows_prefetch;

    /* Prefill's integer GEMM over one tile of weight rows (prefill_gemm.h has the layouts and
     * the contract): y[t][r] (+)= the Q8_0 dot of tile row r with token t, t < n. NULL in the
     * tables without one (prefill then dequantizes for sgemm). */
    void (*gemm_tile)(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y, int ldy,
                      bool accumulate);

    /* The decode rows of a batched step: y[j][r] = dot(row r, xq[j]) for j < nv, r < nrows, each
     * bit-identical to what rows_q8_0 gives for that vector alone, with every weight row loaded
     * once for all vectors. NULL: kvp_matvec_rows_multi runs rows_q8_0 per vector. */
    void (*rows_q8_0_multi)(const void *w, size_t row_bytes, const void *const *xq, int nv,
                            int64_t n, int64_t nrows, float *const *y);
    /* The integer GEMM's weight tile from `rows` Q8_0 rows of nb blocks (codes [rows][nb·32],
     * dw and corr [rows][nb]: prefill_gemm.h), the values of the portable conversion. NULL:
     * prefill_gemm.c converts byte by byte. */
    void (*gemm_convert_q8_0)(const void *w, size_t row_bytes, int64_t rows, int64_t nb,
                              int8_t *codes, float *dw, int32_t *corr);
    /* rows_q8_0_multi's contract for the types in rows_q (bit-identical per vector to that
     * type's rows_q kernel). NULL: kvp_matvec_rows_multi is not offered for the type. */
    void (*rows_q_multi[KVP_SIMD_NTYPES])(const void *w, size_t row_bytes, const void *const *xq,
                                          int nv, int64_t n, int64_t nrows, float *const *y);
    /* Prefill's integer GEMM over a K-quant tile (sub-block scales per 32 or 16, Q4_K's mins;
     * prefill_gemm.h): y[t][r] (+)= Σ over sub-blocks, in column order, of the sub-block's
     * exact int32 sum times dw·dx, then (Q4_K) minus mn times the activations' block sum, each a
     * fused multiply-add into one f32 accumulator per (token, row). The same float operations
     * in the same order in every table, so the tables agree bit for bit. */
    void (*gemm_tile_k)(const struct kvp_gemm_tile *tile, const void *xg, int n, float *y,
                        int ldy, bool accumulate);
    /* Decode rows (one vector or many; results that may differ from rows_q8_0 / rows_q by
     * float rounding but not with the other vectors or rows), on weights packed once with
     * weight rows in the lanes
     * (matvec.h, struct kvp_lanes), indexed by the GGUF type id (Q8_0 included). lanes_pack:
     * tiles [t0, t1) of 16 rows of the nrows × n matrix w into dst, the packed matrix's base
     * (kvp_lanes_bytes' layout). lanes_rows: y[j][r - r0] (+= when accumulate) the dot of row
     * r with the vector prepared in xq[j], for j < nv and r in [r0, r1). Each block's integer
     * sum is exact; the blocks are added in column order per (row, vector), so a result differs
     * from the single-vector kernel's by float rounding only. NULL: the type has none in this
     * table (kvp_lanes_has). */
    void (*lanes_pack[KVP_SIMD_NTYPES])(const void *w, size_t row_bytes, int64_t n, int64_t nrows,
                                        int64_t t0, int64_t t1, void *dst);
    void (*lanes_rows[KVP_SIMD_NTYPES])(const void *packed, int64_t n, const void *const *xq,
                                        int nv, int64_t r0, int64_t r1, float *const *y,
                                        bool accumulate);

    /* From how many single decode rows of a step that need not be exact the batch kernels (the
     * integer GEMM, or sgemm over dequantized tiles) beat the table's row kernels (multi-vector
     * where it has one, else one mat-vec per row), for Q8_0 and for the other quantized types;
     * 0: forward.c's default. Measured per table (docs/batched.md, "Tables without lanes
     * kernels"). */
    int singles_gemm_q8_0, singles_gemm_quant;
};

/* Largest of x[0..n) through the table's max, or a scalar loop when it has none. */
float kvp_simd_max(const struct kvp_simd_ops *ops, const float *x, int64_t n);

/* The table for this CPU (or the one KVP_SIMD forces). Thread-safe after the first call. */
const struct kvp_simd_ops *kvp_simd(void);

/* Tables for explicit use in tests; NULL when the CPU lacks the instructions. */
const struct kvp_simd_ops *kvp_simd_scalar(void);
const struct kvp_simd_ops *kvp_simd_avx2(void);
const struct kvp_simd_ops *kvp_simd_avx512(void);
const struct kvp_simd_ops *kvp_simd_avx512vnni(void); /* avx512 with the VNNI row kernels */
const struct kvp_simd_ops *kvp_simd_neon(void);       /* aarch64 only */

/* The tables this CPU runs, scalar first (each one a KVP_SIMD value): up to cap into out; returns
 * how many. `kvpred --version` lists them, and scripts/test.sh runs the numeric tests under each. */
int kvp_simd_runnable(const struct kvp_simd_ops **out, int cap);

/* Pure selection rule behind kvp_simd(), exposed for tests: want is the KVP_SIMD value (NULL,
 * empty or unknown = best available), features a kvp_cpu_features() mask. A request the CPU
 * cannot honour falls back to the best table it can (avx512vnni -> avx512 -> avx2 -> scalar;
 * on aarch64 neon -> scalar).
 * Never NULL. */
const struct kvp_simd_ops *kvp_simd_pick(const char *want, int features);

/* Quantize n floats (n a multiple of 32) into Q8_0 blocks (round to nearest, as ggml does). */
void kvp_quantize_row_q8_0(const float *x, void *dst, int64_t n);

/* Quantize n floats (n a multiple of 256) into Q8_K blocks with the best table's kernel. */
void kvp_quantize_row_q8_k(const float *x, void *dst, int64_t n);

#endif
