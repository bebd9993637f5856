/*
 * Fixtures the fuzz targets and the seed generator build for themselves, from data the repo
 * generates (nothing is read from ../shared):
 *
 *   fz_tvocab      the trainer's own BPE (src/train/train_bpe.c) learned on a generated text of
 *                  English words, accented, Cyrillic, CJK and emoji words: 3 specials, 256 byte
 *                  tokens, U+2581, the frequent multi-byte characters, then merges
 *   fz_spm_vocab   that vocabulary written as GGUF tokenizer metadata exactly as the trainer's
 *                  export does (train_gguf.c) and read back through kvp_vocab_load_gguf
 *   fz_bpe_vocab   a byte-level BPE ("gpt2") vocabulary derived from it: the 256 byte-mapped
 *                  characters, every learned token byte-mapped, one merge rule per token (its
 *                  first split into two earlier tokens), a control <|endoftext|> (BOS/EOS) and a
 *                  user-defined <|tool|>; loaded through GGUF with the given tokenizer.ggml.pre
 *   fz_tiny_model  a 3-layer random F32 llama model (GQA 2:1) in a temporary GGUF file
 *   fz_write_predictor  a tiny random predictor file (.kvpp) for a cache block size
 *
 * All are deterministic. Failures print one line to stderr and return NULL / -1.
 */
#ifndef KVP_FUZZ_FIXTURES_H
#define KVP_FUZZ_FIXTURES_H

#include <stddef.h>

#include "kvpred.h"

struct kvp_tvocab;
struct kvp_vocab;

struct kvp_tvocab *fz_tvocab(void);
struct kvp_vocab *fz_spm_vocab(const struct kvp_tvocab *tv);
struct kvp_vocab *fz_bpe_vocab(const struct kvp_tvocab *tv, const char *pre);

/* The BPE fixture's user-defined token (printed verbatim, always split out). */
#define FZ_BPE_USER_TOKEN "<|tool|>"

kvp_model *fz_tiny_model(void);
int fz_write_predictor(const char *path, int block_size);
/* The same with cin input channels (2: a query-aware, version 2 file). */
int fz_write_predictor_ch(const char *path, int cin, int block_size);

/* Write n bytes to dir/name; 0 or -1. */
int fz_write_file(const char *dir, const char *name, const void *p, size_t n);

#endif
