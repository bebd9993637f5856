/* The conv2 row kernel for AVX-512: 16 columns per vector, 16 channels in registers. */
#define KVP_CNN_VW 16
#define KVP_CNN_CB 16
#define KVP_CNN_TABLE kvp_cnn_kernels_avx512
#define KVP_CNN_NAME "avx512"
#include "predictor/cnn_kernel.inc"
