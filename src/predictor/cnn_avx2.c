/* The conv2 row kernel for AVX2 + FMA: 8 columns per vector, 8 channels in registers. */
#define KVP_CNN_VW 8
#define KVP_CNN_CB 8
#define KVP_CNN_TABLE kvp_cnn_kernels_avx2
#define KVP_CNN_NAME "avx2"
#include "predictor/cnn_kernel.inc"
