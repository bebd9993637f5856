/*
 * Top-k selection over floats (topk.c): the ranking step every selection policy ends in, and the
 * predictor's training. Exact: ties go to the lower index, NaN is ordered (by a heap fallback).
 */
#ifndef KVP_KERNELS_TOPK_H
#define KVP_KERNELS_TOPK_H

#include <stdint.h>

/* Indices of the k largest of x[0..n), ties to the lower index, written to out in ascending
 * index order. scratch holds n ints. */
void kvp_topk_indices(const float *x, int n, int k, int *out, int *scratch);
/* Internal (topk_avx512.c): the indices and selection keys of the values of x whose key is
 * >= lo, in index order, into idx and key; returns how many. */
int kvp_topk_compact_avx512(const float *x, int n, uint32_t lo, int *idx, uint32_t *key);

#endif
