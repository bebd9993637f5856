/*
 * SentencePiece-style encoder (formats.md §5.1–5.2), as llama.cpp runs it on
 * tokenizer.ggml.model = "llama" vocabularies and as llama2.c's run.c runs it on tokenizer.bin.
 *
 * The text is first cut into fragments at the literal texts of special tokens (longest first;
 * user-defined tokens always, control and unknown ones only when the caller asks). Each raw
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

/* Output sink: counts every id, stores the first cap. */
struct id_sink {
    int32_t *ids;
    size_t cap;
    size_t n;
};

static void emit(struct id_sink *out, int id)
{
    if (out->n < out->cap)
        out->ids[out->n] = id;
    out->n++;
}

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

struct heap {
    struct bigram *a; /* owned [cap] */
    size_t n, cap;
};

/* True when x should be popped before y: higher score, then lower left index. */
static bool before(const struct bigram *x, const struct bigram *y)
{
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static int heap_push(struct heap *h, struct bigram b)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        struct bigram *a;
        if (cap < h->cap || cap > SIZE_MAX / sizeof(*a))
            return KVP_ENOMEM;
        a = realloc(h->a, cap * sizeof(*a));
        if (!a)
            return KVP_ENOMEM;
        h->a = a;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&b, &h->a[parent]))
            break;
        h->a[i] = h->a[parent];
        i = parent;
    }
    h->a[i] = b;
    return 0;
}

static struct bigram heap_pop(struct heap *h)
{
    struct bigram top = h->a[0];
    struct bigram last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && before(&h->a[c + 1], &h->a[c]))
            c++;
        if (!before(&h->a[c], &last))
            break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n > 0)
        h->a[i] = last;
    return top;
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
                    struct heap *h)
{
    if (left < 0 || right < 0)
        return 0;
    size_t n = sym[left].n + sym[right].n;
    int id = kvp_vocab_find(v, sym[left].text, n); /* right's bytes follow left's */
    if (id < 0)
        return 0;
    return heap_push(h, (struct bigram){left, right, v->score[id], n});
}

/* Emit one final symbol: its id, or byte fallback. */
static void emit_symbol(const struct kvp_vocab *v, const struct symbol *s, struct id_sink *out)
{
    int id = kvp_vocab_find(v, s->text, s->n);
    if (id >= 0) {
        emit(out, id);
        return;
    }
    for (size_t i = 0; i < s->n; i++) {
        int b = v->byte_id[(uint8_t)s->text[i]];
        if (b >= 0)
            emit(out, b);
    }
}

/* Tokenize escaped text t[0..n) (spaces already U+2581). */
static int encode_escaped(const struct kvp_vocab *v, const char *t, size_t n,
                          struct id_sink *out)
{
    if (n == 0)
        return 0;
    if (n > INT32_MAX)
        return KVP_ERANGE;
    struct symbol *sym = malloc(n * sizeof(*sym));
    struct heap h = {0};
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
        struct bigram b = heap_pop(&h);
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
    free(h.a);
    free(sym);
    return rc;
}

/* Escape one raw fragment (with an optional leading space) and tokenize it. */
static int encode_fragment(const struct kvp_vocab *v, const char *text, size_t len, bool prefix,
                           struct id_sink *out)
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

/* ============================== Special-token partitioning ==================================== */

struct fragment {
    int token;  /* special token id, or -1 for raw text */
    size_t off; /* raw text: byte range in the input */
    size_t len;
};

struct frag_list {
    struct fragment *a; /* owned */
    size_t n, cap;
};

static int frag_push(struct frag_list *l, struct fragment f)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        if (cap > SIZE_MAX / sizeof(*l->a))
            return KVP_ENOMEM;
        struct fragment *a = realloc(l->a, cap * sizeof(*a));
        if (!a)
            return KVP_ENOMEM;
        l->a = a;
        l->cap = cap;
    }
    l->a[l->n++] = f;
    return 0;
}

/* Split the raw fragments of *cur at every occurrence of special token id, into *next. */
static int split_on(const struct kvp_vocab *v, int id, const char *text, struct frag_list *cur,
                    struct frag_list *next)
{
    const char *s = v->text[id];
    size_t sn = v->len[id];
    next->n = 0;
    for (size_t i = 0; i < cur->n; i++) {
        struct fragment f = cur->a[i];
        if (f.token >= 0) {
            if (frag_push(next, f) < 0)
                return KVP_ENOMEM;
            continue;
        }
        size_t pos = f.off, end = f.off + f.len;
        while (pos < end) {
            const char *hit = memmem(text + pos, end - pos, s, sn);
            size_t at = hit ? (size_t)(hit - text) : end;
            if (at > pos && frag_push(next, (struct fragment){-1, pos, at - pos}) < 0)
                return KVP_ENOMEM;
            if (!hit)
                break;
            if (frag_push(next, (struct fragment){id, 0, 0}) < 0)
                return KVP_ENOMEM;
            pos = at + sn;
        }
    }
    return 0;
}

/* ============================== Public entry point ============================================ */

/* See vocab.h. Errors: KVP_EINVAL for bad arguments, KVP_EUNSUPPORTED for a BPE vocabulary,
 * KVP_ENOMEM, and KVP_ERANGE when cap is too small (*n_out still holds the full count). */
int kvp_vocab_encode(const struct kvp_vocab *v, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *ids, size_t cap, size_t *n_out,
                     struct kvp_err *err)
{
    if (!v || (!text && len) || (!ids && cap) || !n_out)
        return kvp_err_set(err, KVP_EINVAL, "kvp_vocab_encode: NULL argument");
    if (v->kind != KVP_VOCAB_SPM)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "BPE tokenizer not supported yet");

    struct id_sink out = {ids, cap, 0};
    struct frag_list a = {0}, b = {0};
    int rc = 0;
    if (len > 0 && (rc = frag_push(&a, (struct fragment){-1, 0, len})) < 0)
        goto out_free;
    for (int i = 0; i < v->n_special && a.n > 0; i++) {
        int id = v->special[i];
        int t = v->type[id];
        if (!parse_special && (t == KVP_TOKEN_CONTROL || t == KVP_TOKEN_UNKNOWN))
            continue;
        if ((rc = split_on(v, id, text, &a, &b)) < 0)
            goto out_free;
        struct frag_list tmp = a;
        a = b;
        b = tmp;
    }

    if (add_special && v->add_bos && v->bos >= 0)
        emit(&out, v->bos);
    bool prev_special = true; /* the first fragment gets the space prefix too */
    for (size_t i = 0; i < a.n; i++) {
        if (a.a[i].token >= 0) {
            emit(&out, a.a[i].token);
            prev_special = true;
            continue;
        }
        rc = encode_fragment(v, text + a.a[i].off, a.a[i].len,
                             v->add_space_prefix && prev_special, &out);
        if (rc < 0)
            goto out_free;
        prev_special = false;
    }
    if (add_special && v->add_eos && v->eos >= 0)
        emit(&out, v->eos);

out_free:
    free(a.a);
    free(b.a);
    *n_out = out.n;
    if (rc < 0)
        return kvp_err_set(err, rc, "tokenizer: %s", rc == KVP_ENOMEM ? "out of memory"
                                                                      : "text too long");
    if (out.n > cap)
        return kvp_err_set(err, KVP_ERANGE, "tokenizer: %zu tokens do not fit in %zu", out.n,
                           cap);
    return 0;
}
