/*
 * Internal layout of struct kvp_vocab, shared by vocab.c (storage, loading, lookup, decoding,
 * GGUF writing) and spm.c (the SentencePiece-style encoder). Nothing outside src/tokenizer/
 * includes this file.
 */
#ifndef KVP_TOKENIZER_VOCAB_IMPL_H
#define KVP_TOKENIZER_VOCAB_IMPL_H

#include "tokenizer/vocab.h"

#define KVP_VOCAB_MAX_TOKENS (1 << 24)  /* 16 M ids; real vocabularies stop near 256 K */
#define KVP_VOCAB_MAX_TEXT (1 << 20)    /* bytes in one token text */

struct kvp_vocab {
    int kind;               /* enum kvp_vocab_kind */
    int n;                  /* token count, 1 .. KVP_VOCAB_MAX_TOKENS */
    char *blob;             /* owned: every token text back to back, each followed by a NUL */
    const char **text;      /* owned [n]: pointers into blob, SPM form (U+2581 for space) */
    size_t *len;            /* owned [n]: text lengths in bytes, NUL excluded */
    float *score;           /* owned [n]: merge priority, higher merges first */
    int32_t *type;          /* owned [n]: enum kvp_token_type */
    int bos, eos, unk;      /* ids, or -1 when the vocabulary has none */
    int eot, eom;           /* extra end-of-generation ids, or -1 */
    bool add_bos, add_eos, add_space_prefix;
    int32_t *hash;          /* owned [hash_cap]: token id or -1; open addressing, linear probe */
    size_t hash_cap;        /* power of two, at least 2n */
    int32_t *special;       /* owned [n_special]: CONTROL / USER_DEFINED / UNKNOWN ids with a
                               non-empty text, longest text first (ties: lower id first) */
    int n_special;
    int32_t byte_id[256];   /* id emitted for a raw byte in byte fallback: "<0xXX>", else the
                               one-byte text, else unk (-1 if none of these exists) */
};

/* Build a vocabulary from explicit arrays (texts copied). scores and types may be NULL (0 and
 * NORMAL). Special ids, flags and kind get SPM defaults; callers adjust them and then call
 * kvp_vocab_finish. Returns 0 or a negative KVP_E* code; *out untouched on error. */
int kvp_vocab_build(int n, const char *const *texts, const size_t *lens, const float *scores,
                    const int32_t *types, struct kvp_vocab **out, struct kvp_err *err);

/* Compute the derived tables (special list, byte fallback ids) after ids and types are final.
 * Returns 0 or KVP_ENOMEM. */
int kvp_vocab_finish(struct kvp_vocab *v, struct kvp_err *err);

#endif
