/*
 * Internal layout of struct kvp_vocab, shared by vocab.c (storage, loading, lookup, decoding),
 * vocab_gguf.c (GGUF metadata), encode.c (special-token partitioning, the public encoder),
 * spm.c (the SentencePiece-style fragment encoder) and bpe.c (byte-level BPE). Nothing outside
 * src/tokenizer/ includes this file.
 */
#ifndef KVP_TOKENIZER_VOCAB_IMPL_H
#define KVP_TOKENIZER_VOCAB_IMPL_H

#include "tokenizer/vocab.h"

#define KVP_VOCAB_MAX_TOKENS (1 << 24)  /* 16 M ids; real vocabularies stop near 256 K */
#define KVP_VOCAB_MAX_TEXT (1 << 20)    /* bytes in one token text */
#define KVP_VOCAB_MAX_EOG 8             /* end-of-generation ids found by text */

struct kvp_bpe_merge;

struct kvp_vocab {
    int kind;               /* enum kvp_vocab_kind */
    int n;                  /* token count, 1 .. KVP_VOCAB_MAX_TOKENS */
    char *blob;             /* owned: every token text back to back, each followed by a NUL */
    const char **text;      /* owned [n]: pointers into blob, as stored: SPM form (U+2581 for
                               space) or, for BPE, byte-mapped (U+0120 for space) */
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
    int32_t eog[KVP_VOCAB_MAX_EOG]; /* extra end-of-generation ids found by text (§5.4) */
    int n_eog;

    /* byte-level BPE only (kind == KVP_VOCAB_BPE) */
    int pretok;                  /* enum kvp_pretok */
    bool ignore_merges;          /* whole-word shortcut before merging (llama3-style pre) */
    char pre[32];                /* tokenizer.ggml.pre, NUL-terminated (truncated), for messages */
    struct kvp_bpe_merge *merge; /* owned [merge_cap]: open addressing on (left, right) ids;
                                    empty slots have rank -1 */
    size_t merge_cap;            /* power of two, at least 2 n_merges; 0 when no table */
    int n_merges;
};

/* One merge rule "A B" → AB, keyed by the ids of A and B. */
struct kvp_bpe_merge {
    int32_t left, right; /* token ids of the two halves */
    int32_t result;      /* token id of the concatenation */
    int32_t rank;        /* index in tokenizer.ggml.merges (lower merges first); -1: empty slot */
};

/* Output sink for encoders: counts every id, stores the first cap. */
struct kvp_id_sink {
    int32_t *ids;
    size_t cap;
    size_t n;
};

static inline void kvp_sink_emit(struct kvp_id_sink *out, int id)
{
    if (out->n < out->cap)
        out->ids[out->n] = id;
    out->n++;
}

/* Build a vocabulary from explicit arrays (texts copied). scores and types may be NULL (0 and
 * NORMAL). Special ids, flags and kind get SPM defaults; callers adjust them and then call
 * kvp_vocab_finish. Returns 0 or a negative KVP_E* code; *out untouched on error. */
int kvp_vocab_build(int n, const char *const *texts, const size_t *lens, const float *scores,
                    const int32_t *types, struct kvp_vocab **out, struct kvp_err *err);

/* SentencePiece encoding of one raw fragment (spm.c); prefix adds the leading space.
 * Returns 0, KVP_ENOMEM or KVP_ERANGE. */
int kvp_spm_encode_fragment(const struct kvp_vocab *v, const char *text, size_t len, bool prefix,
                            struct kvp_id_sink *out);

/* Byte-level BPE encoding of one raw fragment (bpe.c). Returns 0, KVP_ENOMEM or KVP_ERANGE. */
int kvp_bpe_encode_fragment(const struct kvp_vocab *v, const char *text, size_t len,
                            struct kvp_id_sink *out);

/* Decoding helpers shared by both vocabularies' piece functions (vocab.c). kvp_piece_put copies
 * n bytes of src to buf at offset o, cut at cap, and returns the new offset; kvp_hex_byte is the
 * byte two hex digits spell (as in a byte token "<0xAB>"), or -1. */
size_t kvp_piece_put(char *buf, size_t cap, size_t o, const char *src, size_t n);
int kvp_hex_byte(char hi, char lo);

/* Output bytes of one BPE token (bpe.c); see kvp_vocab_piece. */
size_t kvp_bpe_piece(const struct kvp_vocab *v, int token, char *buf, size_t cap);

/* Allocate the merge table for n merges (bpe.c). Returns 0, KVP_EFORMAT or KVP_ENOMEM. */
int kvp_bpe_merges_init(struct kvp_vocab *v, size_t n, struct kvp_err *err);

/* Add merge number rank, the text "A B" of len bytes (split at the first space at index >= 1).
 * KVP_EFORMAT when it has no space or A, B or AB is not a token. A repeated pair keeps its
 * first (lowest) rank. */
int kvp_bpe_merge_add(struct kvp_vocab *v, int rank, const char *s, size_t len,
                      struct kvp_err *err);

/* Rank of merging ids (left, right) and the merged id in *result, or -1 when no rule exists. */
int kvp_bpe_rank(const struct kvp_vocab *v, int left, int right, int *result);

/* Compute the derived tables (special list, byte fallback ids) after ids and types are final.
 * Returns 0 or KVP_ENOMEM. */
int kvp_vocab_finish(struct kvp_vocab *v, struct kvp_err *err);

#endif
