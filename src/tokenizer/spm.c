/*
 * SentencePiece-style encoder (docs/formats.md §5.1–5.2), as llama.cpp runs it on
 * tokenizer.ggml.model = "llama" vocabularies and as llama2.c's run.c runs it on tokenizer.bin.
 *
 * encode.c first cuts the text into fragments at the literal texts of special tokens (longest
 * first; user-defined tokens always, control and unknown ones only when the caller asks). Each raw
 * fragment gets one ASCII space in front when it starts the text or follows a special token,
 * every space becomes U+2581, and the result is split into one symbol per UTF-8 character
 * (a malformed byte is a symbol of its own). Symbols sit in a doubly linked list over an array.
 *
 * Merging is greedy by score: a max-heap holds every adjacent pair whose concatenation is a
 * token, keyed by that token's score, ties to the lower left index (llama.cpp's comparator, so
 * ids match it exactly). A popped pair is stale when either side has been merged away or its
 * combined length no longer equals the recorded one; stale pairs are skipped rather than
 * removed, which keeps every step O(log n). After a merge the two new neighbour pairs are
 * pushed. Finally each symbol emits its token id, or its bytes as "<0xXX>" byte tokens.
 *
 * Prompts are at most a few hundred kilobytes; all scratch is allocated once per fragment.
 */
#include "tokenizer/vocab_impl.h"

#include <stdlib.h>
#include <string.h>

#include "core/cursor.h"
#include "core/heap.h"

/* ============================== Merge heap ==================================================== */

struct symbol {
    int prev, next;   /* neighbours in the list, -1 at the ends */
    const char *text; /* into the escaped fragment */
    size_t n;         /* bytes; 0 once merged into its left neighbour */
};

struct bigram {
    int left, right; /* symbol indices */
    float score;     /* score of the token the pair would become */
    size_t size;     /* combined byte length when pushed (stale check) */
};

/* True when x should be popped before y: higher score, then lower left index. */
static bool before(const void *xp, const void *yp)
{
    const struct bigram *x = xp, *y = yp;
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

/* ============================== One raw fragment ============================================== */

/* Byte length of the UTF-8 character starting with c, llama.cpp's rule: lead bytes give 2..4,
 * anything else (ASCII, a stray continuation byte, 0xF8..0xFF) is one byte. */
static size_t utf8_len(uint8_t c)
{
    if (c >= 0xf0 && c < 0xf8)
        return 4;
    if (c >= 0xe0 && c < 0xf0)
        return 3;
    if (c >= 0xc0 && c < 0xe0)
        return 2;
    return 1;
}

/* Push the pair (left, right) if its concatenation is a token. */
static int try_pair(const struct kvp_vocab *v, const struct symbol *sym, int left, int right,
                    struct kvp_heap *h)
{
    if (left < 0 || right < 0)
        return 0;
    size_t n = sym[left].n + sym[right].n;
    int id = kvp_vocab_find(v, sym[left].text, n); /* right's bytes follow left's */
    if (id < 0)
        return 0;
    return kvp_heap_push(h, &(struct bigram){left, right, v->score[id], n});
}

/* Emit one final symbol: its id, or byte fallback. */
static void emit_symbol(const struct kvp_vocab *v, const struct symbol *s,
                        struct kvp_id_sink *out)
{
    int id = kvp_vocab_find(v, s->text, s->n);
    if (id >= 0) {
        kvp_sink_emit(out, id);
        return;
    }
    for (size_t i = 0; i < s->n; i++) {
        int b = v->byte_id[(uint8_t)s->text[i]];
        if (b >= 0)
            kvp_sink_emit(out, b);
    }
}

/* Tokenize escaped text t[0..n) (spaces already U+2581). */
static int encode_escaped(const struct kvp_vocab *v, const char *t, size_t n,
                          struct kvp_id_sink *out)
{
    if (n == 0)
        return 0;
    if (n > INT32_MAX)
        return KVP_ERANGE;
    struct symbol *sym = malloc(n * sizeof(*sym));
    struct kvp_heap h;
    kvp_heap_init(&h, sizeof(struct bigram), before);
    int rc = 0;
    if (!sym)
        return KVP_ENOMEM;
    int count = 0;
    for (size_t off = 0; off < n; count++) {
        size_t len = utf8_len((uint8_t)t[off]);
        if (len > n - off)
            len = n - off; /* truncated character at the end */
        sym[count] = (struct symbol){count - 1, -1, t + off, len};
        if (count > 0)
            sym[count - 1].next = count;
        off += len;
    }
    for (int i = 1; i < count; i++)
        if ((rc = try_pair(v, sym, i - 1, i, &h)) < 0)
            goto out_free;

    while (h.n > 0) {
        struct bigram b;
        kvp_heap_pop(&h, &b);
        struct symbol *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue; /* stale: a side was merged since this pair was pushed */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = b.left;
        if ((rc = try_pair(v, sym, l->prev, b.left, &h)) < 0 ||
            (rc = try_pair(v, sym, b.left, l->next, &h)) < 0)
            goto out_free;
    }
    for (int i = 0; i >= 0 && count > 0; i = sym[i].next)
        emit_symbol(v, &sym[i], out);

out_free:
    kvp_heap_free(&h);
    free(sym);
    return rc;
}

/* Escape one raw fragment (with an optional leading space) and tokenize it (vocab_impl.h). */
int kvp_spm_encode_fragment(const struct kvp_vocab *v, const char *text, size_t len, bool prefix,
                            struct kvp_id_sink *out)
{
    size_t cap;
    if (!kvp_add_ok(len, 1, &cap) || !kvp_mul_ok(cap, 3, &cap))
        return KVP_ENOMEM;
    char *esc = malloc(cap);
    if (!esc)
        return KVP_ENOMEM;
    size_t n = 0;
    if (prefix) {
        memcpy(esc, "\xe2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + n, "\xe2\x96\x81", 3);
            n += 3;
        } else {
            esc[n++] = text[i];
        }
    }
    int rc = encode_escaped(v, esc, n, out);
    free(esc);
    return rc;
}
