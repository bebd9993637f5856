/*
 * libFuzzer target for the byte-level BPE tokenizer (src/tokenizer/bpe.c, pretok.c, encode.c) on
 * arbitrary bytes, invalid UTF-8 included.
 *
 * The vocabularies are derived from the trainer's own BPE (fixtures.h): all 256 byte-mapped
 * characters, the learned tokens with one merge rule each, a control <|endoftext|> (BOS/EOS) and a
 * user-defined <|tool|>; one per pre-tokenizer family (llama3 with its whole-word shortcut and
 * BOS, qwen2, gpt-2, smollm).
 * Input: byte 0 holds flags (bits 0-1 the pre-tokenizer, bit 2 add_special, bit 3
 * parse_special), the rest is the text x.
 *
 * Checks, besides no crash, leak or out-of-bounds access: every id is a valid token; a too-small
 * output array gets the same count and no write past it; and without parse_special
 * decode(encode(x)) == x exactly, for every x: every byte has a token, merges only join tokens,
 * the pre-tokenizer's words must cover the text, the user-defined token prints its own text and
 * BOS prints nothing. (With parse_special, the spelling <|endoftext|> becomes the control token,
 * which prints nothing, so only the crash checks apply.)
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "fuzz_common.h"
#include "tokenizer/vocab.h"
#include "train/train.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const pres[4] = {"llama3", "qwen2", "gpt-2", "smollm"};
static struct kvp_vocab *voc[4];
static size_t max_piece;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct kvp_tvocab *tv = fz_tvocab();
    for (int i = 0; i < 4; i++) {
        voc[i] = fz_bpe_vocab(tv, pres[i]);
        if (!voc[i])
            abort();
    }
    kvp_tvocab_free(tv);
    max_piece = fz_max_piece(voc[0]); /* the four differ only in their pre-tokenizer */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const struct kvp_vocab *v = voc[data[0] & 3];
    const bool add_special = data[0] & 4, parse_special = data[0] & 8;
    const size_t len = size - 1;
    char *x = malloc(len ? len : 1); /* exactly sized: no NUL terminator to lean on */
    if (!x)
        return 0;
    memcpy(x, data + 1, len);

    size_t cap = len + 2, n = 0; /* at most one token per byte, plus BOS */
    int32_t *ids = fz_encode_checked(v, x, len, add_special, parse_special, cap, &n);
    if (!parse_special) {
        char *dec = malloc(n * max_piece + 1);
        if (!dec)
            abort();
        size_t d = fz_decode(v, ids, n, max_piece, dec);
        if (d != len || memcmp(dec, x, len) != 0) {
            fprintf(stderr, "fuzz_bpe (%s): decode(encode(x)) != x (%zu vs %zu bytes)\n",
                    pres[data[0] & 3], d, len);
            abort();
        }
        free(dec);
    }
    free(ids);
    free(x);
    return 0;
}
