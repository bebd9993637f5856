/*
 * Pre-tokenizer scanners (docs/formats.md §5.5).
 *
 * The text is decoded once into code points with their class bits (letter, number, white space)
 * and byte offsets; each scanner then looks at position i and returns the length, in code
 * points, of the word starting there, taking the first alternative of the reference regex that
 * matches. The regexes are ordered alternations without nested backtracking except for the
 * `\s+(?!\S)` look-ahead, whose effect is written out by hand: a white-space run followed by a
 * non-space gives up its last character, which then prefixes the next word ("  hello" → " ",
 * " hello").
 *
 * Reference regexes (PCRE; \p{L} letters, \p{N} numbers, \s White_Space):
 *   Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2:   the same with \p{N} instead of \p{N}{1,3}
 *   GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   SmolLM:  \p{N} first, then GPT-2 on the pieces in between
 *
 * Prompts are at most a few hundred kilobytes, so one decoded copy (9 bytes per code point)
 * is cheap; every scanner is linear in the text.
 */
#include "tokenizer/pretok.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "tokenizer/unicode.h"

/* ============================== Names ========================================================= */

struct pretok_name {
    const char *name;
    int kind;
    bool ignore_merges;
    bool add_bos;
};

/* llama.cpp maps llama3 / llama-v3 / llama-bpe / falcon3 to its LLAMA3 type, which sets
 * ignore_merges and a BOS default; dbrx and smaug-bpe share the regex but neither flag. */
static const struct pretok_name pretok_names[] = {
    {"llama-bpe", KVP_PRETOK_LLAMA3, true, true},
    {"llama3", KVP_PRETOK_LLAMA3, true, true},
    {"llama-v3", KVP_PRETOK_LLAMA3, true, true},
    {"falcon3", KVP_PRETOK_LLAMA3, true, true},
    {"dbrx", KVP_PRETOK_LLAMA3, false, false},
    {"smaug-bpe", KVP_PRETOK_LLAMA3, false, false},
    {"qwen2", KVP_PRETOK_QWEN2, false, false},
    {"deepseek-r1-qwen", KVP_PRETOK_QWEN2, false, false},
    {"megrez", KVP_PRETOK_QWEN2, false, false},
    {"stablelm2", KVP_PRETOK_QWEN2, false, false},
    {"gpt-2", KVP_PRETOK_GPT2, false, false},
    {"phi-2", KVP_PRETOK_GPT2, false, false},
    {"roberta-bpe", KVP_PRETOK_GPT2, false, false},
    {"mpt", KVP_PRETOK_GPT2, false, false},
    {"olmo", KVP_PRETOK_GPT2, false, false},
    {"smollm", KVP_PRETOK_SMOLLM, false, false},
    {"starcoder", KVP_PRETOK_SMOLLM, false, false},
    {"refact", KVP_PRETOK_SMOLLM, false, false},
    {"command-r", KVP_PRETOK_SMOLLM, false, false},
};

struct kvp_pretok_info kvp_pretok_lookup(const char *name, size_t len)
{
    struct kvp_pretok_info info = {KVP_PRETOK_NONE, false, false};
    if (!name)
        return info;
    for (size_t i = 0; i < sizeof(pretok_names) / sizeof(pretok_names[0]); i++) {
        const struct pretok_name *p = &pretok_names[i];
        if (strlen(p->name) == len && memcmp(p->name, name, len) == 0) {
            info.kind = p->kind;
            info.ignore_merges = p->ignore_merges;
            info.add_bos = p->add_bos;
            break;
        }
    }
    return info;
}

const char *kvp_pretok_known_names(void)
{
    return "llama-bpe, llama3, llama-v3, falcon3, dbrx, smaug-bpe, qwen2, deepseek-r1-qwen, "
           "megrez, stablelm2, gpt-2, phi-2, roberta-bpe, mpt, olmo, smollm, starcoder, refact, "
           "command-r";
}

/* ============================== Decoded text ================================================== */

struct cps {
    uint32_t *cp; /* owned [n] code points (KVP_CP_INVALID for a malformed byte) */
    uint8_t *fl;  /* owned [n] KVP_CP_* bits */
    size_t *off;  /* owned [n + 1] byte offset of each code point; off[n] = text length */
    size_t n;
};

static void cps_free(struct cps *s)
{
    free(s->cp);
    free(s->fl);
    free(s->off);
}

static int cps_decode(const char *text, size_t len, struct cps *s)
{
    memset(s, 0, sizeof(*s));
    if (len > SIZE_MAX / sizeof(size_t) - 1)
        return KVP_ENOMEM;
    s->cp = malloc((len ? len : 1) * sizeof(*s->cp));
    s->fl = malloc(len ? len : 1);
    s->off = malloc((len + 1) * sizeof(*s->off));
    if (!s->cp || !s->fl || !s->off) {
        cps_free(s);
        return KVP_ENOMEM;
    }
    size_t n = 0;
    for (size_t o = 0; o < len; n++) {
        uint32_t c;
        size_t k = kvp_utf8_decode(text + o, len - o, &c);
        s->cp[n] = c;
        s->fl[n] = (uint8_t)kvp_cp_flags(c);
        s->off[n] = o;
        o += k;
    }
    s->off[n] = len;
    s->n = n;
    return 0;
}

/* ============================== Scanners ====================================================== */

#define IS_L(s, i)   (((s)->fl[i] & KVP_CP_LETTER) != 0)
#define IS_N(s, i)   (((s)->fl[i] & KVP_CP_NUMBER) != 0)
#define IS_WS(s, i)  (((s)->fl[i] & KVP_CP_SPACE) != 0)
#define IS_LNS(s, i) (((s)->fl[i] & (KVP_CP_LETTER | KVP_CP_NUMBER | KVP_CP_SPACE)) != 0)

static bool is_crlf(uint32_t c)
{
    return c == '\r' || c == '\n';
}

static uint32_t ascii_lower(uint32_t c, bool fold)
{
    return (fold && c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* Length of the contraction 's 't 're 've 'm 'll 'd at i (s->cp[i] == '\''), or 0. With fold,
 * ASCII case is ignored (Llama 3's (?i:...)). */
static size_t scan_contraction(const struct cps *s, size_t i, size_t end, bool fold)
{
    if (i + 1 >= end)
        return 0;
    uint32_t a = ascii_lower(s->cp[i + 1], fold);
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (i + 2 >= end)
        return 0;
    uint32_t b = ascii_lower(s->cp[i + 2], fold);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* Llama 3 / Qwen2 word at i (max_digits 3 or 1); the rules of docs/formats.md §5.5 in
 * order. */
static size_t scan_llama3(const struct cps *s, size_t i, size_t end, size_t max_digits)
{
    uint32_t c = s->cp[i];
    size_t j, k;
    if (c == '\'' && (k = scan_contraction(s, i, end, true)) > 0)
        return k;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (!is_crlf(c) && !IS_N(s, i) && (IS_L(s, i) || (i + 1 < end && IS_L(s, i + 1)))) {
        for (j = i + 1; j < end && IS_L(s, j); j++)
            ;
        return j - i;
    }
    /* \p{N}{1,max} */
    if (IS_N(s, i)) {
        for (j = i + 1; j < end && j - i < max_digits && IS_N(s, j); j++)
            ;
        return j - i;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    j = (c == ' ' && i + 1 < end) ? i + 1 : i;
    if (!IS_LNS(s, j)) {
        for (j++; j < end && !IS_LNS(s, j); j++)
            ;
        for (; j < end && is_crlf(s->cp[j]); j++)
            ;
        return j - i;
    }
    /* c is white space: \s*[\r\n]+ | \s+(?!\S) | \s+ */
    size_t last_nl = i;
    for (k = i; k < end && IS_WS(s, k); k++)
        if (is_crlf(s->cp[k]))
            last_nl = k + 1;
    if (last_nl > i)
        return last_nl - i;
    if (k - i > 1 && k < end)
        return k - i - 1;
    return k - i;
}

/* GPT-2 word at i, within [i, end). */
static size_t scan_gpt2(const struct cps *s, size_t i, size_t end)
{
    uint32_t c = s->cp[i];
    size_t j, k;
    if (c == '\'' && (k = scan_contraction(s, i, end, false)) > 0)
        return k;
    j = (c == ' ' && i + 1 < end) ? i + 1 : i;
    if (IS_L(s, j)) { /* ' ?\p{L}+' */
        for (j++; j < end && IS_L(s, j); j++)
            ;
        return j - i;
    }
    if (IS_N(s, j)) { /* ' ?\p{N}+' */
        for (j++; j < end && IS_N(s, j); j++)
            ;
        return j - i;
    }
    if (!IS_WS(s, j)) { /* ' ?[^\s\p{L}\p{N}]+' */
        for (j++; j < end && !IS_LNS(s, j); j++)
            ;
        return j - i;
    }
    /* \s+(?!\S) | \s+ */
    for (k = i; k < end && IS_WS(s, k); k++)
        ;
    if (k - i > 1 && k < end)
        return k - i - 1;
    return k - i;
}

/* ============================== Driver ======================================================== */

static int words_push(struct kvp_words *w, size_t end)
{
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        if (cap > SIZE_MAX / sizeof(*w->end))
            return KVP_ENOMEM;
        size_t *e = realloc(w->end, cap * sizeof(*e));
        if (!e)
            return KVP_ENOMEM;
        w->end = e;
        w->cap = cap;
    }
    w->end[w->n++] = end;
    return 0;
}

/* GPT-2 rules over the code points [a, b), as one independent piece. */
static int split_gpt2_range(const struct cps *s, size_t a, size_t b, struct kvp_words *w)
{
    for (size_t i = a; i < b;) {
        i += scan_gpt2(s, i, b);
        if (words_push(w, s->off[i]) < 0)
            return KVP_ENOMEM;
    }
    return 0;
}

static int split_cps(int kind, const struct cps *s, struct kvp_words *w)
{
    size_t n = s->n;
    switch (kind) {
    case KVP_PRETOK_LLAMA3:
    case KVP_PRETOK_QWEN2: {
        size_t max_digits = kind == KVP_PRETOK_LLAMA3 ? 3 : 1;
        for (size_t i = 0; i < n;) {
            i += scan_llama3(s, i, n, max_digits);
            if (words_push(w, s->off[i]) < 0)
                return KVP_ENOMEM;
        }
        return 0;
    }
    case KVP_PRETOK_GPT2:
        return split_gpt2_range(s, 0, n, w);
    case KVP_PRETOK_SMOLLM: {
        size_t a = 0;
        for (size_t i = 0; i <= n; i++) {
            if (i < n && !IS_N(s, i))
                continue;
            if (split_gpt2_range(s, a, i, w) < 0)
                return KVP_ENOMEM;
            if (i < n && words_push(w, s->off[i + 1]) < 0) /* the digit alone */
                return KVP_ENOMEM;
            a = i + 1;
        }
        return 0;
    }
    default:
        return KVP_EINVAL;
    }
}

/* See pretok.h. */
int kvp_pretok_split(int kind, const char *text, size_t len, struct kvp_words *w)
{
    if (!w || (!text && len))
        return KVP_EINVAL;
    w->n = 0;
    struct cps s;
    int rc = cps_decode(text, len, &s);
    if (rc < 0)
        return rc;
    rc = split_cps(kind, &s, w);
    cps_free(&s);
    return rc;
}

/* Release the list; NULL is a no-op. The struct itself is the caller's. */
void kvp_words_free(struct kvp_words *w)
{
    if (!w)
        return;
    free(w->end);
    w->end = NULL;
    w->n = w->cap = 0;
}
