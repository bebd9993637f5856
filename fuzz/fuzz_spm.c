/*
 * libFuzzer target for the SentencePiece tokenizer (src/tokenizer/spm.c, encode.c, vocab.c) on
 * arbitrary bytes, invalid UTF-8 included.
 *
 * The vocabulary is the trainer's own BPE learned on a generated text and read back through GGUF
 * (fixtures.h): byte fallback for all 256 bytes, U+2581 a token, add_space_prefix and add_bos on.
 * Input: byte 0 holds flags (bit 0 add_special, bit 1 parse_special), the rest is the text x.
 *
 * Checks, besides no crash, leak or out-of-bounds access:
 *   - every id is a valid token; a too-small output array gets the same count and no write past
 *     it;
 *   - without parse_special the ids equal the trainer's own encoder's (kvp_tvocab_encode), which
 *     promises to encode exactly as the engine does;
 *   - without parse_special, decode(encode(x)) (kvp_vocab_piece over the ids, prev threaded
 *     through) equals spm_expected(x): the text the SentencePiece rules give back. It is x itself
 *     whenever x is valid UTF-8 without U+2581; see spm_expected for the two exceptions.
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

static struct kvp_tvocab *tv;
static struct kvp_vocab *voc;
static size_t max_piece;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    tv = fz_tvocab();
    voc = fz_spm_vocab(tv);
    if (!voc)
        abort();
    max_piece = fz_max_piece(voc);
    return 0;
}

/* Byte length the encoder gives the character starting with c (spm.c's rule: a lead byte claims
 * its continuation bytes whatever they are; anything else is one byte). */
static size_t char_len(uint8_t c)
{
    return c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc0 && c < 0xe0 ? 2 : 1;
}

/*
 * What decode(encode(x)) must give. The encoder sees e = U+2581 + x with every space replaced by
 * U+2581, cut into characters by char_len (a character cut short by the end keeps what there
 * is). Every character comes back as its bytes (as a token, or byte by byte through byte
 * fallback), except that a character that is exactly U+2581 comes back as a space, and the
 * leading one (the space prefix) is dropped. Hence decode(encode(x)) == x unless
 *   (1) x holds a U+2581 character of its own: it prints as a space (SentencePiece reserves it);
 *   (2) a space falls inside a malformed character, i.e. within the continuation bytes a lead
 *       byte claims: its U+2581 is cut apart and prints as raw bytes (E2 96 81, possibly split
 *       across the claim).
 * Returns the expected length in out (room for 3 len + 3).
 */
static size_t spm_expected(const uint8_t *x, size_t len, uint8_t *out)
{
    uint8_t *e = malloc(3 * len + 3);
    if (!e)
        abort();
    size_t n = 0, o = 0;
    memcpy(e, "\xe2\x96\x81", 3);
    n = 3;
    for (size_t i = 0; i < len; i++) {
        if (x[i] == ' ') {
            memcpy(e + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            e[n++] = x[i];
        }
    }
    for (size_t i = 0; i < n;) {
        size_t k = char_len(e[i]);
        if (k > n - i)
            k = n - i;
        if (k == 3 && !memcmp(e + i, "\xe2\x96\x81", 3)) {
            if (i > 0)
                out[o++] = ' ';
        } else {
            memcpy(out + o, e + i, k);
            o += k;
        }
        i += k;
    }
    free(e);
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const bool add_special = data[0] & 1, parse_special = data[0] & 2;
    const size_t len = size - 1;
    char *x = malloc(len ? len : 1); /* exactly sized: no NUL terminator to lean on */
    if (!x)
        return 0;
    memcpy(x, data + 1, len);

    /* at most one id per byte of the escaped text (a space prefix per fragment), BOS, EOS */
    size_t cap = 3 * len + 8, n = 0;
    int32_t *ids = fz_encode_checked(voc, x, len, add_special, parse_special, cap, &n);
    if (!parse_special) {
        /* the trainer's encoder: same ids (after the engine's BOS) */
        struct kvp_err err;
        size_t off = add_special && kvp_vocab_add_bos(voc) ? 1 : 0, tn = 0;
        int32_t *tids = malloc(cap * sizeof(int32_t));
        if (!tids || kvp_tvocab_encode(tv, x, len, true, tids, cap, &tn, &err) < 0)
            abort();
        if (tn != n - off || memcmp(tids, ids + off, tn * sizeof(int32_t)) != 0) {
            fprintf(stderr, "fuzz_spm: trainer and engine encoders differ (%zu vs %zu ids)\n", tn,
                    n - off);
            abort();
        }
        free(tids);

        /* the round trip */
        uint8_t *dec = malloc(n * max_piece + 1), *want = malloc(3 * len + 3);
        if (!dec || !want)
            abort();
        size_t d = fz_decode(voc, ids, n, max_piece, (char *)dec);
        size_t w = spm_expected((const uint8_t *)x, len, want);
        if (d != w || memcmp(dec, want, d) != 0) {
            fprintf(stderr, "fuzz_spm: decode(encode(x)) differs from the expected text "
                            "(%zu vs %zu bytes)\n", d, w);
            abort();
        }
        free(dec);
        free(want);
    }
    free(ids);
    free(x);
    return 0;
}
