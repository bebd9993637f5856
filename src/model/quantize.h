/*
 * Model quantization: rewrite a GGUF file with its weight matrices in another tensor type
 * (`kvpred quantize`). Every metadata record is copied unchanged except general.file_type and
 * general.quantization_version; 1-D tensors (norms) are copied as they are.
 */
#ifndef KVP_MODEL_QUANTIZE_H
#define KVP_MODEL_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "kvpred.h"

struct kvp_quantize_params {
    int type;         /* target type id: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
                         Q2_K, Q3_K, Q4_K, Q5_K or Q6_K */
    bool keep_output; /* leave output.weight (token_embd.weight when tied) in its source type */
    int n_threads;    /* rows of each matrix are split over this many threads (<= 0: 1); the
                         output does not depend on it */
};

/* What kvp_quantize_file did; every field counts tensors except the byte sizes. */
struct kvp_quantize_stats {
    int n_tensors;     /* tensors in the file */
    int n_converted;   /* matrices written in the requested type */
    int n_fallback;    /* matrices written in a fallback type (for their row length) */
    int n_kept;        /* tensors copied unchanged (1-D, --keep-output, already that type) */
    uint64_t bytes_in; /* tensor data bytes in and out */
    uint64_t bytes_out;
};

/* Quantize the GGUF at in_path into out_path (written to a temporary file and renamed into
 * place, so out_path may even name the input). The converted tensors are held in memory until
 * the file is written (about the output's size, plus the writer's serialized copy). Every 2-D
 * tensor becomes kvp_quantize_pick_type(p->type, ne[0]) unless kept. stats may be NULL. Returns 0,
 * or a negative KVP_E* code with err filled in: KVP_EINVAL for a bad target type, KVP_EUNSUPPORTED
 * for a source tensor kvpred cannot decode, KVP_ERANGE for a non-finite weight, or the reader's and
 * writer's codes. */
int kvp_quantize_file(const char *in_path, const char *out_path,
                      const struct kvp_quantize_params *p, struct kvp_quantize_stats *stats,
                      struct kvp_err *err);

/* The type a matrix with rows of ne0 elements gets when `type` is asked for: type itself when
 * ne0 is a multiple of its block size, else the docs/formats.md §4.5 fallback (Q4_K →
 * Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K / Q3_K → IQ4_NL), else F16. */
int kvp_quantize_pick_type(int type, int64_t ne0);

/* Target type for a name ("Q4_K", case-insensitive), or -1 if it is not a quantize target. */
int kvp_quantize_type_from_name(const char *name);

/* general.file_type (llama.cpp's LLAMA_FTYPE) for a target type: a file of all-Q4_K matrices is
 * "Q4_K_S" (14), Q5_K is 16, Q3_K is 11 (Q3_K_S), IQ4_NL is 25. */
uint32_t kvp_quantize_ftype(int type);

#endif
