/*
 * llama2.c checkpoint reader (docs/formats.md §6.1, §6.2). Legacy ("version 0") files
 * have a 28-byte header of seven int32 and no magic, so the file size computed from the header must
 * match exactly; version 1 files start with the "ak42" magic and a 256-byte header. Both are
 * all-f32. Version 2 (int8 groups) is refused as unsupported. Arrays point into the mapping.
 */
#ifndef KVP_MODEL_LLAMA2C_H
#define KVP_MODEL_LLAMA2C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/platform.h"

struct kvp_llama2c {
    struct kvp_file_map map; /* owned unless opened from memory */
    int version;             /* 0 legacy, 1 "ak42" v1 */
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    bool shared_classifier;
    /* All point into the file bytes (4-byte aligned in both versions). */
    const float *tok_embd;  /* [vocab][dim] */
    const float *rms_att;   /* [L][dim] */
    const float *wq;        /* [L][dim][dim] */
    const float *wk;        /* [L][kv_dim][dim] */
    const float *wv;        /* [L][kv_dim][dim] */
    const float *wo;        /* [L][dim][dim] */
    const float *rms_ffn;   /* [L][dim] */
    const float *w1;        /* [L][hidden][dim] gate */
    const float *w2;        /* [L][dim][hidden] down */
    const float *w3;        /* [L][hidden][dim] up */
    const float *rms_final; /* [dim] */
    const float *wcls;      /* [vocab][dim]; equals tok_embd when shared */
};

int kvp_llama2c_open(const char *path, struct kvp_llama2c **out, struct kvp_err *err);
/* buf is borrowed and must be 4-byte aligned and outlive the handle. */
int kvp_llama2c_open_memory(const void *buf, size_t size, struct kvp_llama2c **out,
                            struct kvp_err *err);
void kvp_llama2c_close(struct kvp_llama2c *m);

#endif
