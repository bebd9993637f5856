/* The conv2 row kernel for baseline x86-64 (SSE2 vectors of 4 columns, 8 channels) or any
 * other target GCC vector extensions lower to scalar code. */
#define KVP_CNN_VW 4
#define KVP_CNN_CB 8
#define KVP_CNN_TABLE kvp_cnn_kernels_scalar
#define KVP_CNN_NAME "scalar"
#include "predictor/cnn_kernel.inc"
