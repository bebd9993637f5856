/*
 * UTF-8 decoding, code-point classification and the GPT-2 byte map (see unicode.h).
 *
 * Classification is on the hot path of every pre-tokenizer: ASCII answers from a switch-free
 * test, everything else binary-searches the generated range tables in unicode_tables.h
 * (about 650 letter ranges and 130 number ranges, so at most 10 probes). White_Space has only
 * 25 members and is written out here.
 *
 * The byte map needs no table either: the 68 bytes that are not printable stand-ins for
 * themselves (0x00-0x20, 0x7F-0xA0, 0xAD) take U+0100 + their rank among those bytes, which is
 * a closed form per interval.
 */
#include "tokenizer/unicode.h"

#include "tokenizer/unicode_tables.h"

/* ============================== UTF-8 ========================================================= */

size_t kvp_utf8_decode(const char *s, size_t n, uint32_t *cp)
{
    const uint8_t *u = (const uint8_t *)s;
    uint8_t c = u[0];
    size_t len;
    uint32_t x;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if ((c & 0xe0) == 0xc0) {
        len = 2;
        x = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
        len = 3;
        x = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
        len = 4;
        x = c & 0x07;
    } else {
        *cp = KVP_CP_INVALID; /* stray continuation byte or 0xF8..0xFF */
        return 1;
    }
    if (len > n) {
        *cp = KVP_CP_INVALID;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xc0) != 0x80) {
            *cp = KVP_CP_INVALID;
            return 1;
        }
        x = (x << 6) | (u[i] & 0x3f);
    }
    *cp = x;
    return len;
}

size_t kvp_utf8_encode(uint32_t cp, char *buf)
{
    if (cp < 0x80) {
        buf[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        buf[0] = (char)(0xc0 | (cp >> 6));
        buf[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        buf[0] = (char)(0xe0 | (cp >> 12));
        buf[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        buf[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    buf[0] = (char)(0xf0 | ((cp >> 18) & 0x07));
    buf[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    buf[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    buf[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ============================== Classification ================================================ */

static bool in_ranges(const struct kvp_cp_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n; /* search [lo, hi) for the range holding cp */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

static bool is_white_space(uint32_t cp)
{
    /* Unicode White_Space property (PropList.txt) */
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

unsigned kvp_cp_flags(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            return KVP_CP_LETTER;
        if (cp >= '0' && cp <= '9')
            return KVP_CP_NUMBER;
        return is_white_space(cp) ? KVP_CP_SPACE : 0;
    }
    if (cp > 0x10ffff)
        return 0; /* includes KVP_CP_INVALID */
    unsigned f = 0;
    if (in_ranges(kvp_letter_ranges, sizeof(kvp_letter_ranges) / sizeof(kvp_letter_ranges[0]), cp))
        f |= KVP_CP_LETTER;
    else if (in_ranges(kvp_number_ranges, sizeof(kvp_number_ranges) / sizeof(kvp_number_ranges[0]),
                       cp))
        f |= KVP_CP_NUMBER;
    if (is_white_space(cp))
        f |= KVP_CP_SPACE;
    return f;
}

/* ============================== GPT-2 byte map ================================================ */

/* Bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF stand for themselves. */
static bool byte_is_direct(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

uint32_t kvp_byte_to_cp(uint8_t b)
{
    if (byte_is_direct(b))
        return b;
    if (b <= 0x20)
        return 0x100u + b; /* ranks 0..32 */
    if (b <= 0xa0)
        return 0x100u + 33 + (b - 0x7fu); /* 0x7F..0xA0: ranks 33..66 */
    return 0x100u + 67;                   /* 0xAD */
}

int kvp_cp_to_byte(uint32_t cp)
{
    if (cp <= 0xff)
        return byte_is_direct(cp) ? (int)cp : -1;
    if (cp < 0x100 || cp > 0x143)
        return -1;
    unsigned k = cp - 0x100;
    if (k <= 32)
        return (int)k;
    if (k <= 66)
        return (int)(0x7f + k - 33);
    return 0xad;
}
