/*
 * The small piece of Unicode that byte-level BPE needs (docs/formats.md §5.3, §5.5): a
 * lenient UTF-8 decoder, letter / number / whitespace classification, and GPT-2's byte ↔ code-point
 * map.
 *
 * The decoder never fails. It accepts what llama.cpp's decoder accepts (a lead byte followed by
 * the right number of continuation bytes, no overlong or surrogate checks); any other byte is one
 * "invalid" unit of length 1 that classifies as a symbol, like U+FFFD does in llama.cpp. Unlike
 * llama.cpp we keep the original byte instead of substituting U+FFFD, so encode/decode round-trips
 * arbitrary bytes.
 */
#ifndef KVP_TOKENIZER_UNICODE_H
#define KVP_TOKENIZER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_CP_INVALID 0xFFFFFFFFu /* code point reported for a byte that starts no character */

enum kvp_cp_flag {
    KVP_CP_LETTER = 1 << 0, /* general category L* */
    KVP_CP_NUMBER = 1 << 1, /* general category N* */
    KVP_CP_SPACE = 1 << 2,  /* the White_Space property */
};

/* Decode the character at s[0..n) (n >= 1): returns its byte length (1..4) and stores the code
 * point, or KVP_CP_INVALID with length 1 for a malformed or truncated sequence. */
size_t kvp_utf8_decode(const char *s, size_t n, uint32_t *cp);

/* UTF-8 encoding of cp (at most 0x1FFFFF) into buf[4]; returns the byte count. */
size_t kvp_utf8_encode(uint32_t cp, char *buf);

/* KVP_CP_* bits of cp; 0 for symbols, marks, punctuation, unassigned and invalid code points. */
unsigned kvp_cp_flags(uint32_t cp);

/* GPT-2 byte map: the code point standing for byte b, and the inverse (-1 for a code point
 * that stands for no byte). */
uint32_t kvp_byte_to_cp(uint8_t b);
int kvp_cp_to_byte(uint32_t cp);

#endif
