/*
 * Pre-tokenizers for byte-level BPE (docs/formats.md §5.5): cut raw text into the words
 * that BPE merges within. Each family is a hand-written scanner equivalent to the reference regex
 * of llama.cpp / Hugging Face; no regex engine is involved.
 *
 *   KVP_PRETOK_LLAMA3  llama-bpe, llama3, llama-v3, falcon3, dbrx, smaug-bpe
 *   KVP_PRETOK_QWEN2   qwen2, deepseek-r1-qwen, megrez, stablelm2 (digits one by one)
 *   KVP_PRETOK_GPT2    gpt-2, phi-2, roberta-bpe, mpt, olmo
 *   KVP_PRETOK_SMOLLM  smollm, starcoder, refact, command-r (digits isolated, then GPT-2)
 *
 * Words are reported as ascending byte offsets where each word ends; together they cover the
 * text exactly, so no byte is ever lost (malformed UTF-8 bytes are one-byte symbols).
 */
#ifndef KVP_TOKENIZER_PRETOK_H
#define KVP_TOKENIZER_PRETOK_H

#include <stdbool.h>
#include <stddef.h>

enum kvp_pretok {
    KVP_PRETOK_NONE = 0,
    KVP_PRETOK_LLAMA3 = 1,
    KVP_PRETOK_QWEN2 = 2,
    KVP_PRETOK_GPT2 = 3,
    KVP_PRETOK_SMOLLM = 4,
};

/* Growable list of word end offsets. Start zeroed; release with kvp_words_free. */
struct kvp_words {
    size_t *end; /* owned [cap]: end offset (bytes, exclusive) of word i; ascending */
    size_t n, cap;
};

/* Properties of a tokenizer.ggml.pre value (name[0..len), not NUL-terminated). */
struct kvp_pretok_info {
    int kind;           /* enum kvp_pretok; KVP_PRETOK_NONE for an unknown name */
    bool ignore_merges; /* whole-word shortcut (§5.3 step 3): llama3-style names only */
    bool add_bos;       /* default of tokenizer.ggml.add_bos_token (§5.4) */
};
struct kvp_pretok_info kvp_pretok_lookup(const char *name, size_t len);

/* Comma-separated list of the accepted names, for error messages. */
const char *kvp_pretok_known_names(void);

/* Split text[0..len) with the rules of kind into w (previous content discarded).
 * Returns 0, KVP_EINVAL for an unknown kind, or KVP_ENOMEM. */
int kvp_pretok_split(int kind, const char *text, size_t len, struct kvp_words *w);

void kvp_words_free(struct kvp_words *w);

#endif
