/*
 * llama2.c → GGUF conversion (`kvpred convert`, docs/formats.md §6.4).
 *
 * A llama2.c checkpoint plus its tokenizer.bin become one self-describing GGUF v3 file of
 * architecture "llama": the hyperparameters and llama2.c's implied constants (ε = 1e-5, RoPE
 * base 10000) as metadata, the vocabulary as tokenizer.ggml.* keys in SentencePiece form, and every
 * weight as an F32 tensor under the names of docs/formats.md §3.2. llama2.c and GGUF
 * "llama" both rotate adjacent pairs, so the Q/K rows are copied as they are.
 */
#ifndef KVP_MODEL_CONVERT_H
#define KVP_MODEL_CONVERT_H

#include "core/err.h"

/* Convert bin_path (+ tok_path, required) into out_path. The output is written completely or
 * not at all. Returns 0, or a negative KVP_E* code with err naming the file and the problem. */
int kvp_convert_llama2c(const char *bin_path, const char *tok_path, const char *out_path,
                        struct kvp_err *err);

#endif
