/*
 * Byte-level BPE (docs/formats.md §5.3), the tokenizer of GPT-2, Llama 3, Qwen2 and
 * SmolLM (tokenizer.ggml.model = "gpt2").
 *
 * Token texts are stored byte-mapped: every byte of the original text stands as one code point
 * (space → U+0120 "Ġ", LF → U+010A "Ċ", see unicode.c), so a word of k bytes starts as k
 * symbols. Encoding one raw fragment: pre-tokenize into words (pretok.c); byte-map each word;
 * for llama3-style vocabularies emit the whole word when it is a token (ignore_merges); else
 * repeatedly merge the adjacent pair with the lowest merge rank, ties to the leftmost, and emit
 * each final symbol's id.
 *
 * Merge rules are kept by token ids rather than text: "A B" → (id A, id B) → (rank, id AB) in
 * an open-addressing table, so a candidate pair costs one integer hash probe and a merged symbol
 * simply takes the id of AB. Every rule must name tokens (A, B and AB), as Hugging Face's BPE
 * loader also demands; then symbols are always tokens and ids agree with llama.cpp's text-keyed
 * lookup. The merge loop uses a min-heap with lazy deletion (a popped pair is stale if either
 * side changed), so even a pathological 100 kB word costs O(n log n), not O(n²).
 *
 * Decoding maps each code point of a normal token back to its byte; code points outside the map
 * (hand-written added tokens) are copied as UTF-8. Control and unused tokens print nothing,
 * user-defined tokens print their text verbatim.
 */
#include "tokenizer/vocab_impl.h"

#include <stdlib.h>
#include <string.h>

#include "core/heap.h"
#include "tokenizer/pretok.h"
#include "tokenizer/unicode.h"

/* ============================== Merge table =================================================== */

static size_t merge_hash(int32_t left, int32_t right)
{
    uint64_t k = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    k ^= k >> 33; /* murmur3 finalizer */
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return (size_t)k;
}

/* See vocab_impl.h. */
int kvp_bpe_merges_init(struct kvp_vocab *v, size_t n, struct kvp_err *err)
{
    if (n > (size_t)INT32_MAX / 4)
        return kvp_err_set(err, KVP_EFORMAT, "tokenizer.ggml.merges: %zu merges is absurd", n);
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    struct kvp_bpe_merge *m = malloc(cap * sizeof(*m));
    if (!m)
        return kvp_err_set(err, KVP_ENOMEM, "tokenizer.ggml.merges: out of memory");
    for (size_t i = 0; i < cap; i++)
        m[i].rank = -1;
    free(v->merge);
    v->merge = m;
    v->merge_cap = cap;
    v->n_merges = 0;
    return 0;
}

/* See vocab_impl.h. */
int kvp_bpe_rank(const struct kvp_vocab *v, int left, int right, int *result)
{
    if (v->merge_cap == 0 || left < 0 || right < 0)
        return -1;
    size_t i = merge_hash(left, right) & (v->merge_cap - 1);
    for (; v->merge[i].rank >= 0; i = (i + 1) & (v->merge_cap - 1)) {
        if (v->merge[i].left == left && v->merge[i].right == right) {
            if (result)
                *result = v->merge[i].result;
            return v->merge[i].rank;
        }
    }
    return -1;
}

/* Printable excerpt of a merge for messages. */
#define EXCERPT(len) ((int)((len) > 40 ? 40 : (len)))

/* See vocab_impl.h. */
int kvp_bpe_merge_add(struct kvp_vocab *v, int rank, const char *s, size_t len, struct kvp_err *err)
{
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (!sp)
        return kvp_err_set(err, KVP_EFORMAT, "tokenizer.ggml.merges[%d]: '%.*s' has no space", rank,
                           EXCERPT(len), s);
    size_t ln = (size_t)(sp - s), rn = len - ln - 1;
    int left = kvp_vocab_find(v, s, ln), right = kvp_vocab_find(v, sp + 1, rn);
    char stack[256];
    char *cat = len <= sizeof(stack) ? stack : malloc(len);
    if (!cat)
        return kvp_err_set(err, KVP_ENOMEM, "tokenizer.ggml.merges: out of memory");
    memcpy(cat, s, ln);
    memcpy(cat + ln, sp + 1, rn);
    int result = kvp_vocab_find(v, cat, ln + rn);
    if (cat != stack)
        free(cat);
    if (left < 0 || right < 0 || result < 0)
        return kvp_err_set(err, KVP_EFORMAT,
                           "tokenizer.ggml.merges[%d]: '%.*s' names a %s that is not a token", rank,
                           EXCERPT(len), s,
                           left < 0    ? "left half"
                           : right < 0 ? "right half"
                                       : "result");
    if ((size_t)v->n_merges * 2 >= v->merge_cap)
        return kvp_err_set(err, KVP_EINVAL, "kvp_bpe_merge_add: table full");
    size_t i = merge_hash(left, right) & (v->merge_cap - 1);
    for (; v->merge[i].rank >= 0; i = (i + 1) & (v->merge_cap - 1))
        if (v->merge[i].left == left && v->merge[i].right == right)
            return 0; /* repeated rule: the first (lower) rank stays, as in llama.cpp */
    v->merge[i] = (struct kvp_bpe_merge){left, right, result, rank};
    v->n_merges++;
    return 0;
}

/* ============================== Merge heap ==================================================== */

struct symbol {
    int prev, next; /* neighbours in the word, -1 at the ends */
    int id;         /* token id, or -1 for a byte whose code point is not a token */
    bool alive;     /* false once merged into its left neighbour */
};

struct pair {
    int left, right; /* symbol indices */
    int lid, rid;    /* their ids when pushed (stale check) */
    int rank, result;
};

/* True when x should be popped before y: lower rank, then leftmost. */
static bool before(const void *xp, const void *yp)
{
    const struct pair *x = xp, *y = yp;
    return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

/* ============================== One word ====================================================== */

/* Scratch for a fragment, sized by its byte length so that every word fits. */
struct scratch {
    char *mapped;       /* [2 len]: byte-mapped word (each byte becomes 1 or 2 UTF-8 bytes) */
    struct symbol *sym; /* [len] */
    struct kvp_heap heap; /* of struct pair, reserved 3 len: never more than 3 pairs per symbol
                             (initial n - 1, plus 2 per merge), so a push never grows it */
};

static void try_pair(const struct kvp_vocab *v, const struct symbol *sym, int left, int right,
                     struct kvp_heap *h)
{
    if (left < 0 || right < 0)
        return;
    int result;
    int rank = kvp_bpe_rank(v, sym[left].id, sym[right].id, &result);
    if (rank >= 0)
        (void)kvp_heap_push(h, &(struct pair){left, right, sym[left].id, sym[right].id, rank,
                                              result}); /* cannot fail: reserved */
}

/* Encode one pre-tokenized word w[0..n) (n >= 1, raw bytes). */
static void encode_word(const struct kvp_vocab *v, const char *w, size_t n, struct scratch *s,
                        struct kvp_id_sink *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        char cp[4];
        size_t k = kvp_utf8_encode(kvp_byte_to_cp((uint8_t)w[i]), cp);
        memcpy(s->mapped + m, cp, k);
        s->sym[i] = (struct symbol){(int)i - 1, i + 1 < n ? (int)i + 1 : -1,
                                    kvp_vocab_find(v, cp, k), true};
        m += k;
    }
    if (v->ignore_merges) { /* §5.3 step 3: a word that is a token is taken whole */
        int id = kvp_vocab_find(v, s->mapped, m);
        if (id >= 0) {
            kvp_sink_emit(out, id);
            return;
        }
    }
    struct symbol *sym = s->sym;
    struct kvp_heap *h = &s->heap;
    h->n = 0;
    for (size_t i = 1; i < n; i++)
        try_pair(v, sym, (int)i - 1, (int)i, h);
    while (h->n > 0) {
        struct pair p;
        kvp_heap_pop(h, &p);
        struct symbol *l = &sym[p.left], *r = &sym[p.right];
        if (!l->alive || !r->alive || l->next != p.right || l->id != p.lid || r->id != p.rid)
            continue; /* stale: a side was merged since this pair was pushed */
        l->id = p.result;
        l->next = r->next;
        r->alive = false;
        if (r->next >= 0)
            sym[r->next].prev = p.left;
        try_pair(v, sym, l->prev, p.left, h);
        try_pair(v, sym, p.left, l->next, h);
    }
    for (int i = 0; i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0)
            kvp_sink_emit(out, sym[i].id);
        else if (v->unk >= 0)
            kvp_sink_emit(out, v->unk); /* byte missing from an inconsistent vocabulary */
    }
}

/* See vocab_impl.h. */
int kvp_bpe_encode_fragment(const struct kvp_vocab *v, const char *text, size_t len,
                            struct kvp_id_sink *out)
{
    if (len == 0)
        return 0;
    if (len > INT32_MAX / 4)
        return KVP_ERANGE;
    struct kvp_words words = {0};
    struct scratch s = {0};
    kvp_heap_init(&s.heap, sizeof(struct pair), before);
    int rc = kvp_pretok_split(v->pretok, text, len, &words);
    if (rc < 0)
        goto out_free;
    s.mapped = malloc(2 * len);
    s.sym = malloc(len * sizeof(*s.sym));
    if (!s.mapped || !s.sym || kvp_heap_reserve(&s.heap, 3 * len) < 0) {
        rc = KVP_ENOMEM;
        goto out_free;
    }
    size_t start = 0;
    for (size_t i = 0; i < words.n; i++) {
        if (words.end[i] > start)
            encode_word(v, text + start, words.end[i] - start, &s, out);
        start = words.end[i];
    }

out_free:
    kvp_heap_free(&s.heap);
    free(s.sym);
    free(s.mapped);
    kvp_words_free(&words);
    return rc;
}

/* ============================== Decoding ====================================================== */

/* See vocab_impl.h. */
size_t kvp_bpe_piece(const struct kvp_vocab *v, int token, char *buf, size_t cap)
{
    const char *t = v->text[token];
    size_t n = v->len[token];
    switch (v->type[token]) {
    case KVP_TOKEN_CONTROL:
    case KVP_TOKEN_UNUSED:
    case KVP_TOKEN_UNKNOWN:
        return 0;
    case KVP_TOKEN_USER_DEFINED:
        return kvp_piece_put(buf, cap, 0, t, n);
    case KVP_TOKEN_BYTE:
        if (n == 6 && t[0] == '<' && t[1] == '0' && t[2] == 'x' && t[5] == '>' &&
            kvp_hex_byte(t[3], t[4]) >= 0) {
            char c = (char)kvp_hex_byte(t[3], t[4]);
            return kvp_piece_put(buf, cap, 0, &c, 1);
        }
        break;
    default:
        break;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = kvp_utf8_decode(t + i, n - i, &cp);
        int b = cp == KVP_CP_INVALID ? -1 : kvp_cp_to_byte(cp);
        if (b >= 0) {
            char c = (char)b;
            o = kvp_piece_put(buf, cap, o, &c, 1);
        } else {
            o = kvp_piece_put(buf, cap, o, t + i, k); /* not a mapped byte: copy as written */
        }
        i += k;
    }
    return o;
}
