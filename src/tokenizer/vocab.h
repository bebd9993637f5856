/*
 * Vocabulary and tokenizer.
 *
 * One in-memory vocabulary serves both sources: GGUF metadata (tokenizer.ggml.*) and llama2.c's
 * tokenizer.bin, which is converted at load into the same SentencePiece form (a space written as
 * U+2581, token types, BOS/EOS ids) so one encoder and one decoder serve both, and `kvpred convert`
 * can write it back out as GGUF metadata. Encoding follows docs/formats.md §5.1–5.2
 * (special-token partitioning, space prefix, best-score pair merging with a heap, byte fallback).
 * GGUF files with tokenizer.ggml.model = "gpt2" load as byte-level BPE (§5.3–5.5: pre-tokenizer
 * chosen by tokenizer.ggml.pre, lowest-rank merging, byte-mapped texts); the same calls encode and
 * decode both kinds.
 */
#ifndef KVP_TOKENIZER_VOCAB_H
#define KVP_TOKENIZER_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

struct kvp_gguf;
struct kvp_gguf_writer;

enum kvp_vocab_kind {
    KVP_VOCAB_SPM = 1, /* tokenizer.ggml.model = "llama" */
    KVP_VOCAB_BPE = 2, /* tokenizer.ggml.model = "gpt2" (byte-level BPE) */
};

enum kvp_token_type {
    KVP_TOKEN_NORMAL = 1,
    KVP_TOKEN_UNKNOWN = 2,
    KVP_TOKEN_CONTROL = 3,
    KVP_TOKEN_USER_DEFINED = 4,
    KVP_TOKEN_UNUSED = 5,
    KVP_TOKEN_BYTE = 6,
};

struct kvp_vocab;

/* Read tokenizer.ggml.* from an open GGUF. KVP_EUNSUPPORTED for tokenizer models kvpred does
 * not implement and for gpt2 vocabularies whose tokenizer.ggml.pre is missing or unknown (the
 * message names it); KVP_EFORMAT for malformed arrays or merges. */
int kvp_vocab_load_gguf(const struct kvp_gguf *g, struct kvp_vocab **out, struct kvp_err *err);

/* Read a llama2.c tokenizer.bin holding n_vocab entries (the count is not stored in the file). */
int kvp_vocab_load_llama2c(const char *path, int n_vocab, struct kvp_vocab **out,
                           struct kvp_err *err);
int kvp_vocab_load_llama2c_memory(const void *buf, size_t size, int n_vocab,
                                  struct kvp_vocab **out, struct kvp_err *err);

/* Build an SPM vocabulary from explicit arrays (used by the trainer for its own vocabulary).
 * texts use U+2581 for space; all arrays are copied. */
int kvp_vocab_create_spm(int n_vocab, const char *const *texts, const size_t *lens,
                         const float *scores, const int32_t *types, int bos, int eos, int unk,
                         struct kvp_vocab **out, struct kvp_err *err);

void kvp_vocab_free(struct kvp_vocab *v);

int kvp_vocab_n_tokens(const struct kvp_vocab *v);
int kvp_vocab_kind(const struct kvp_vocab *v);
int kvp_vocab_bos(const struct kvp_vocab *v);
int kvp_vocab_eos(const struct kvp_vocab *v);
bool kvp_vocab_add_bos(const struct kvp_vocab *v);
/* True for eos, eot, eom and, for GGUF vocabularies, any token spelled <|eot_id|>, <|im_end|>,
 * <|end|>, <end_of_turn>, <|endoftext|>, <|eom_id|> or <|end_of_text|>. */
bool kvp_vocab_is_eog(const struct kvp_vocab *v, int token);
/* Token text as stored (SPM form, or byte-mapped for BPE), not NUL-terminated; NULL for an
 * invalid id. */
const char *kvp_vocab_text(const struct kvp_vocab *v, int token, size_t *len);
float kvp_vocab_score(const struct kvp_vocab *v, int token);
int kvp_vocab_type(const struct kvp_vocab *v, int token);
/* Id of a token with exactly this text, or -1. */
int kvp_vocab_find(const struct kvp_vocab *v, const char *text, size_t len);

/* Encode len bytes of text. add_special: prepend BOS when the vocabulary asks for it (and, SPM
 * only, EOS when add_eos). parse_special: split on control-token texts too (user-defined ones always).
 * Writes at most cap ids, the full count into *n_out; KVP_ERANGE when cap is too small. */
int kvp_vocab_encode(const struct kvp_vocab *v, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *ids, size_t cap, size_t *n_out,
                     struct kvp_err *err);

/* Bytes of one token for output: U+2581 becomes a space, <0xXX> its raw byte, control tokens
 * nothing; the leading space of the first piece after BOS (prev == bos or prev < 0) is dropped
 * when the vocabulary adds a space prefix. BPE: each code point maps back to its byte (pieces
 * may end inside a UTF-8 character; buffer before printing), user-defined tokens print their
 * text, control / unknown / unused tokens nothing. Returns bytes written (truncated to cap). */
size_t kvp_vocab_piece(const struct kvp_vocab *v, int prev, int token, char *buf, size_t cap);

/* Add the tokenizer.ggml.* keys describing v to a GGUF being written. Strings are borrowed
 * from v until the writer is serialized. */
int kvp_vocab_write_gguf(const struct kvp_vocab *v, struct kvp_gguf_writer *w,
                         struct kvp_err *err);

#endif
