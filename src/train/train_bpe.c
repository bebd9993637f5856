/*
 * The trainer's tokenizer: a byte-fallback BPE vocabulary learned from the training text, stored
 * in SentencePiece form, and the SentencePiece encoder that the engine runs on it.
 *
 * Learning. The text is written the SentencePiece way (a space becomes U+2581 "▁") and split
 * into words that start at a "▁" or after a newline; newlines are never merged, and neither is
 * any symbol that holds a digit, so numbers always tokenize digit by digit (the passkey and
 * needle values are copied digit by digit, which a small model learns far more easily than a
 * vocabulary of arbitrary digit chunks). Each round merges the most frequent adjacent pair
 * (ties to the smaller pair of symbol ids, so learning is deterministic) into a new symbol; the
 * n-th merge becomes a token with score −n, so the engine's "highest score first" encoder
 * replays the merges in learning order. Because words never contain "▁" after their first
 * character, no token spans a word boundary.
 *
 * Vocabulary layout (docs/formats.md §5.2, as in Llama 2): 0 <unk> (type 2), 1 <s>, 2
 * </s> (type 3), 3..258 the byte tokens <0x00>..<0xFF> (type 6), then the multi-byte characters
 * frequent enough to deserve a token ("▁" first, otherwise every space would cost three byte
 * tokens), then the merges. Single ASCII characters need no token of their own: a symbol that is
 * not a token falls back to its byte token, and pair merging looks only at the concatenated text.
 *
 * Encoding follows docs/formats.md §5.2 exactly (space prefix, escape, one symbol per
 * UTF-8 character, a max-heap of mergeable adjacent pairs by score with ties to the left,
 * stale-entry checks, byte fallback), so the token ids the trainer learns from are the ids the
 * engine will produce for the same text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/heap.h"
#include "train/train.h"

#define SPACE_UTF8 "\xE2\x96\x81" /* U+2581 */
#define SPACE_LEN 3
#define MAX_PIECE_BYTES 16
#define MIN_CHAR_COUNT 64

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int utf8_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0)
        return 2;
    if ((c & 0xF0) == 0xE0)
        return 3;
    if ((c & 0xF8) == 0xF0)
        return 4;
    return 1; /* stray continuation or invalid byte: one symbol */
}

/* ====================================== vocabulary ============================================ */

void kvp_tvocab_free(struct kvp_tvocab *v)
{
    if (!v)
        return;
    if (v->text)
        for (int i = 0; i < v->n; i++)
            free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->score);
    free(v->type);
    free(v->hash);
    free(v);
}

int kvp_tvocab_find(const struct kvp_tvocab *v, const char *s, size_t len)
{
    size_t mask = v->hcap - 1;
    for (size_t i = fnv1a(s, len) & mask;; i = (i + 1) & mask) {
        int32_t id = v->hash[i];
        if (id < 0)
            return -1;
        if (v->len[id] == len && !memcmp(v->text[id], s, len))
            return id;
    }
}

static int build_hash(struct kvp_tvocab *v, struct kvp_err *err)
{
    size_t cap = 16;
    while (cap < (size_t)v->n * 2)
        cap *= 2;
    v->hash = malloc(cap * sizeof(int32_t));
    if (!v->hash)
        return kvp_err_set(err, KVP_ENOMEM, "vocab hash");
    memset(v->hash, 0xff, cap * sizeof(int32_t));
    v->hcap = cap;
    for (int id = 0; id < v->n; id++) {
        if (kvp_tvocab_find(v, v->text[id], v->len[id]) >= 0)
            return kvp_err_set(err, KVP_EFORMAT, "vocab: duplicate token %d '%s'", id, v->text[id]);
        size_t i = fnv1a(v->text[id], v->len[id]) & (cap - 1);
        while (v->hash[i] >= 0)
            i = (i + 1) & (cap - 1);
        v->hash[i] = id;
    }
    return 0;
}

static struct kvp_tvocab *vocab_alloc(int n)
{
    struct kvp_tvocab *v = calloc(1, sizeof(*v));
    if (!v)
        return NULL;
    v->n = n;
    v->text = calloc((size_t)n, sizeof(char *));
    v->len = calloc((size_t)n, sizeof(size_t));
    v->score = calloc((size_t)n, sizeof(float));
    v->type = calloc((size_t)n, sizeof(int32_t));
    if (!v->text || !v->len || !v->score || !v->type) {
        kvp_tvocab_free(v);
        return NULL;
    }
    return v;
}

static int set_token(struct kvp_tvocab *v, int id, const char *s, size_t len, float score,
                     int type)
{
    v->text[id] = malloc(len + 1);
    if (!v->text[id])
        return -1;
    memcpy(v->text[id], s, len);
    v->text[id][len] = 0;
    v->len[id] = len;
    v->score[id] = score;
    v->type[id] = type;
    return 0;
}

int kvp_tvocab_create(int n, const char *const *text, const size_t *len, const float *score,
                      const int32_t *type, struct kvp_tvocab **out, struct kvp_err *err)
{
    if (n < 1)
        return kvp_err_set(err, KVP_EINVAL, "vocab: %d tokens", n);
    struct kvp_tvocab *v = vocab_alloc(n);
    if (!v)
        return kvp_err_set(err, KVP_ENOMEM, "vocab of %d tokens", n);
    for (int i = 0; i < n; i++)
        if (set_token(v, i, text[i], len[i], score[i], type[i]) < 0) {
            kvp_tvocab_free(v);
            return kvp_err_set(err, KVP_ENOMEM, "vocab token %d", i);
        }
    int rc = build_hash(v, err);
    if (rc < 0) {
        kvp_tvocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

/* ==================================== BPE learning ============================================ */

/* A growable table of distinct strings with counts (words, then symbols). */
struct strtab {
    char **s;
    size_t *len;
    long *count;
    int n, cap;
    int32_t *hash;
    size_t hcap;
};

static void strtab_free(struct strtab *t)
{
    for (int i = 0; i < t->n; i++)
        free(t->s[i]);
    free(t->s);
    free(t->len);
    free(t->count);
    free(t->hash);
    memset(t, 0, sizeof(*t));
}

static int strtab_rehash(struct strtab *t, size_t hcap)
{
    int32_t *h = malloc(hcap * sizeof(int32_t));
    if (!h)
        return -1;
    memset(h, 0xff, hcap * sizeof(int32_t));
    for (int id = 0; id < t->n; id++) {
        size_t i = fnv1a(t->s[id], t->len[id]) & (hcap - 1);
        while (h[i] >= 0)
            i = (i + 1) & (hcap - 1);
        h[i] = id;
    }
    free(t->hash);
    t->hash = h;
    t->hcap = hcap;
    return 0;
}

/* Id of s (added with count 0 if new), or -1 on allocation failure. */
static int strtab_intern(struct strtab *t, const char *s, size_t len)
{
    if (t->hcap == 0 && strtab_rehash(t, 1024) < 0)
        return -1;
    size_t mask = t->hcap - 1, i;
    for (i = fnv1a(s, len) & mask; t->hash[i] >= 0; i = (i + 1) & mask) {
        int id = t->hash[i];
        if (t->len[id] == len && !memcmp(t->s[id], s, len))
            return id;
    }
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 1024;
        char **ns = realloc(t->s, (size_t)cap * sizeof(*ns));
        if (ns)
            t->s = ns;
        size_t *nl = realloc(t->len, (size_t)cap * sizeof(*nl));
        if (nl)
            t->len = nl;
        long *nc = realloc(t->count, (size_t)cap * sizeof(*nc));
        if (nc)
            t->count = nc;
        if (!ns || !nl || !nc)
            return -1;
        t->cap = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return -1;
    memcpy(copy, s, len);
    copy[len] = 0;
    int id = t->n++;
    t->s[id] = copy;
    t->len[id] = len;
    t->count[id] = 0;
    t->hash[i] = id;
    if ((size_t)t->n * 2 > t->hcap && strtab_rehash(t, t->hcap * 2) < 0)
        return -1;
    return id;
}

/* Split text (escaped on the fly) into words and count them. */
static int count_words(const char *text, size_t len, struct strtab *words)
{
    char buf[256];
    size_t n = 0;
    /* the engine adds a space prefix at the start of the text */
    memcpy(buf, SPACE_UTF8, SPACE_LEN);
    n = SPACE_LEN;
    for (size_t i = 0; i <= len; i++) {
        char ch = i < len ? text[i] : '\n';
        bool boundary = ch == ' ' || ch == '\n' || n + SPACE_LEN >= sizeof(buf);
        if (boundary && n > 0) {
            int id = strtab_intern(words, buf, n);
            if (id < 0)
                return -1;
            words->count[id]++;
            n = 0;
        }
        if (ch == '\n')
            continue; /* newlines stay single byte tokens */
        if (ch == ' ') {
            memcpy(buf + n, SPACE_UTF8, SPACE_LEN);
            n += SPACE_LEN;
        } else {
            buf[n++] = ch;
        }
    }
    return 0;
}

static bool has_digit(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] >= '0' && s[i] <= '9')
            return true;
    return false;
}

struct pair_count {
    uint64_t key; /* a << 32 | b */
    long count;
};

/* Open-addressing counter of symbol pairs, cleared each round. */
struct pairtab {
    struct pair_count *e;
    size_t cap, n;
};

static int pair_add(struct pairtab *p, uint64_t key, long c)
{
    if ((p->n + 1) * 2 > p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 1 << 16;
        struct pair_count *ne = calloc(ncap, sizeof(*ne));
        if (!ne)
            return -1;
        for (size_t i = 0; i < p->cap; i++)
            if (p->e[i].count) {
                size_t j = (p->e[i].key * 0x9E3779B97F4A7C15ULL >> 20) & (ncap - 1);
                while (ne[j].count)
                    j = (j + 1) & (ncap - 1);
                ne[j] = p->e[i];
            }
        free(p->e);
        p->e = ne;
        p->cap = ncap;
    }
    size_t j = (key * 0x9E3779B97F4A7C15ULL >> 20) & (p->cap - 1);
    while (p->e[j].count && p->e[j].key != key)
        j = (j + 1) & (p->cap - 1);
    if (!p->e[j].count) {
        p->e[j].key = key;
        p->n++;
    }
    p->e[j].count += c;
    return 0;
}

struct bpe_state {
    struct strtab words; /* distinct words with counts */
    struct strtab syms;  /* symbols: characters, then merges */
    int32_t **wsym;      /* [n_words] symbol ids of each word */
    int *wlen;           /* [n_words] current symbol count */
    bool *frozen;        /* [n_syms cap] symbol may not merge (digit or newline) */
    int frozen_cap;
};

static void bpe_state_free(struct bpe_state *b)
{
    if (b->wsym)
        for (int i = 0; i < b->words.n; i++)
            free(b->wsym[i]);
    free(b->wsym);
    free(b->wlen);
    free(b->frozen);
    strtab_free(&b->words);
    strtab_free(&b->syms);
}

static int bpe_mark(struct bpe_state *b, int sym)
{
    if (sym >= b->frozen_cap) {
        int cap = b->frozen_cap ? b->frozen_cap * 2 : 4096;
        while (cap <= sym)
            cap *= 2;
        bool *nf = realloc(b->frozen, (size_t)cap);
        if (!nf)
            return -1;
        memset(nf + b->frozen_cap, 0, (size_t)(cap - b->frozen_cap));
        b->frozen = nf;
        b->frozen_cap = cap;
    }
    b->frozen[sym] = has_digit(b->syms.s[sym], b->syms.len[sym]);
    return 0;
}

/* Split every word into character symbols; count characters. */
static int bpe_split_words(struct bpe_state *b)
{
    b->wsym = calloc((size_t)b->words.n, sizeof(*b->wsym));
    b->wlen = calloc((size_t)b->words.n, sizeof(int));
    if (!b->wsym || !b->wlen)
        return -1;
    for (int w = 0; w < b->words.n; w++) {
        const char *s = b->words.s[w];
        size_t n = b->words.len[w];
        b->wsym[w] = malloc(n * sizeof(int32_t));
        if (!b->wsym[w])
            return -1;
        int k = 0;
        for (size_t i = 0; i < n;) {
            size_t cl = (size_t)utf8_len((unsigned char)s[i]);
            if (i + cl > n)
                cl = n - i;
            int id = strtab_intern(&b->syms, s + i, cl);
            if (id < 0 || bpe_mark(b, id) < 0)
                return -1;
            b->syms.count[id] += b->words.count[w];
            b->wsym[w][k++] = id;
            i += cl;
        }
        b->wlen[w] = k;
    }
    return 0;
}

/* One round: find the best pair; returns its count (0: none). */
static long bpe_best_pair(struct bpe_state *b, struct pairtab *pt, int *ba, int *bb)
{
    if (pt->e)
        memset(pt->e, 0, pt->cap * sizeof(*pt->e));
    pt->n = 0;
    for (int w = 0; w < b->words.n; w++) {
        const int32_t *s = b->wsym[w];
        for (int i = 0; i + 1 < b->wlen[w]; i++) {
            if (b->frozen[s[i]] || b->frozen[s[i + 1]])
                continue;
            if (b->syms.len[s[i]] + b->syms.len[s[i + 1]] > MAX_PIECE_BYTES)
                continue;
            if (pair_add(pt, (uint64_t)s[i] << 32 | (uint32_t)s[i + 1], b->words.count[w]) < 0)
                return -1;
        }
    }
    long best = 0;
    uint64_t bkey = 0;
    for (size_t i = 0; i < pt->cap; i++) {
        const struct pair_count *e = &pt->e[i];
        if (e->count > best || (e->count == best && best > 0 && e->key < bkey)) {
            best = e->count;
            bkey = e->key;
        }
    }
    *ba = (int)(bkey >> 32);
    *bb = (int)(bkey & 0xffffffffu);
    return best;
}

static void bpe_apply(struct bpe_state *b, int a, int c, int merged)
{
    for (int w = 0; w < b->words.n; w++) {
        int32_t *s = b->wsym[w];
        int n = b->wlen[w], k = 0;
        for (int i = 0; i < n; i++) {
            if (i + 1 < n && s[i] == a && s[i + 1] == c) {
                s[k++] = merged;
                i++;
            } else {
                s[k++] = s[i];
            }
        }
        b->wlen[w] = k;
    }
}

int kvp_tvocab_learn(const char *text, size_t len, int n_vocab, struct kvp_tvocab **out,
                     struct kvp_err *err)
{
    if (n_vocab < 259 || n_vocab > 65536)
        return kvp_err_set(err, KVP_EINVAL, "vocab size %d: must be 259..65536", n_vocab);
    struct bpe_state b;
    memset(&b, 0, sizeof(b));
    struct pairtab pt = {0};
    struct kvp_tvocab *v = NULL;
    int rc = KVP_ENOMEM;
    if (count_words(text, len, &b.words) < 0 || bpe_split_words(&b) < 0)
        goto fail;
    v = vocab_alloc(n_vocab);
    if (!v)
        goto fail;
    int id = 0;
    if (set_token(v, id++, "<unk>", 5, 0.0f, 2) < 0 || set_token(v, id++, "<s>", 3, 0.0f, 3) < 0 ||
        set_token(v, id++, "</s>", 4, 0.0f, 3) < 0)
        goto fail;
    for (int byte = 0; byte < 256; byte++) {
        char nm[8];
        snprintf(nm, sizeof(nm), "<0x%02X>", byte);
        if (set_token(v, id++, nm, 6, 0.0f, 6) < 0)
            goto fail;
    }
    /* frequent multi-byte characters, "▁" first, then by count (ties by symbol id) */
    int sp = strtab_intern(&b.syms, SPACE_UTF8, SPACE_LEN);
    if (sp < 0 || bpe_mark(&b, sp) < 0)
        goto fail;
    if (id < n_vocab && set_token(v, id++, SPACE_UTF8, SPACE_LEN, 0.0f, 1) < 0)
        goto fail;
    for (;;) {
        int best = -1;
        for (int s = 0; s < b.syms.n; s++) {
            if (b.syms.len[s] < 2 || s == sp || b.syms.count[s] < MIN_CHAR_COUNT)
                continue;
            if (best < 0 || b.syms.count[s] > b.syms.count[best])
                best = s;
        }
        if (best < 0 || id >= n_vocab)
            break;
        if (set_token(v, id++, b.syms.s[best], b.syms.len[best], 0.0f, 1) < 0)
            goto fail;
        b.syms.count[best] = -b.syms.count[best]; /* taken */
    }
    /* merges */
    long rank = 0;
    while (id < n_vocab) {
        int a, c;
        long cnt = bpe_best_pair(&b, &pt, &a, &c);
        if (cnt < 0)
            goto fail;
        if (cnt < 2)
            break;
        char piece[2 * MAX_PIECE_BYTES + 1];
        size_t la = b.syms.len[a], lc = b.syms.len[c];
        memcpy(piece, b.syms.s[a], la);
        memcpy(piece + la, b.syms.s[c], lc);
        int merged = strtab_intern(&b.syms, piece, la + lc);
        if (merged < 0 || bpe_mark(&b, merged) < 0)
            goto fail;
        bpe_apply(&b, a, c, merged);
        bool exists = false;
        for (int t = 0; t < id && !exists; t++)
            exists = v->len[t] == la + lc && !memcmp(v->text[t], piece, la + lc);
        if (!exists) {
            if (set_token(v, id++, piece, la + lc, -(float)rank, 1) < 0)
                goto fail;
            rank++;
        }
    }
    v->n = id; /* a tiny text may run out of merges: the vocabulary is then smaller */
    if ((rc = build_hash(v, err)) < 0)
        goto fail_rc;
    free(pt.e);
    bpe_state_free(&b);
    *out = v;
    return 0;

fail:
    rc = kvp_err_set(err, KVP_ENOMEM, "bpe: out of memory");
fail_rc:
    free(pt.e);
    bpe_state_free(&b);
    kvp_tvocab_free(v);
    return rc;
}

/* ===================================== SPM encoder ============================================ */

struct spm_sym {
    int prev, next;
    size_t off, n; /* bytes in the escaped buffer; n == 0 once merged away */
};

struct spm_pair {
    int left, right;
    float score;
    size_t size;
};

/* a ranks above b: higher score, then smaller left index */
static bool pair_above(const void *ap, const void *bp)
{
    const struct spm_pair *a = ap, *b = bp;
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int try_pair(const struct kvp_tvocab *v, const char *buf, const struct spm_sym *sym,
                    int left, int right, struct kvp_heap *h)
{
    if (left < 0 || right < 0)
        return 0;
    size_t n = sym[left].n + sym[right].n;
    int id = kvp_tvocab_find(v, buf + sym[left].off, n);
    if (id < 0)
        return 0;
    return kvp_heap_push(h, &(struct spm_pair){left, right, v->score[id], n});
}

int kvp_tvocab_encode(const struct kvp_tvocab *v, const char *text, size_t len,
                      bool space_prefix, int32_t *ids, size_t cap, size_t *n_out,
                      struct kvp_err *err)
{
    space_prefix = space_prefix && len > 0; /* an empty text has no tokens, as in the engine */
    /* escape: every space becomes three bytes */
    size_t n_sp = space_prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++)
        n_sp += text[i] == ' ';
    size_t blen = len + n_sp * 2 + (space_prefix ? 1 : 0);
    char *buf = malloc(blen ? blen : 1);
    struct spm_sym *sym = malloc((blen ? blen : 1) * sizeof(*sym));
    struct kvp_heap h;
    kvp_heap_init(&h, sizeof(struct spm_pair), pair_above);
    int rc = 0;
    if (!buf || !sym) {
        rc = kvp_err_set(err, KVP_ENOMEM, "encode: %zu bytes", len);
        goto out;
    }
    size_t k = 0;
    if (space_prefix) {
        memcpy(buf, SPACE_UTF8, SPACE_LEN);
        k = SPACE_LEN;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + k, SPACE_UTF8, SPACE_LEN);
            k += SPACE_LEN;
        } else {
            buf[k++] = text[i];
        }
    }
    int ns = 0;
    for (size_t i = 0; i < k;) {
        size_t cl = (size_t)utf8_len((unsigned char)buf[i]);
        if (i + cl > k)
            cl = k - i;
        sym[ns] = (struct spm_sym){ns - 1, ns + 1, i, cl};
        ns++;
        i += cl;
    }
    if (ns)
        sym[ns - 1].next = -1;
    for (int i = 0; i + 1 < ns; i++)
        if (try_pair(v, buf, sym, i, i + 1, &h) < 0)
            goto oom;
    while (h.n) {
        struct spm_pair p;
        kvp_heap_pop(&h, &p);
        struct spm_sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size)
            continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = p.left;
        if (try_pair(v, buf, sym, l->prev, p.left, &h) < 0 ||
            try_pair(v, buf, sym, p.left, l->next, &h) < 0)
            goto oom;
    }
    size_t n = 0;
    for (int i = ns ? 0 : -1; i >= 0; i = sym[i].next) {
        int id = kvp_tvocab_find(v, buf + sym[i].off, sym[i].n);
        if (id >= 0) {
            if (n < cap)
                ids[n] = id;
            n++;
            continue;
        }
        for (size_t j = 0; j < sym[i].n; j++) {
            if (n < cap)
                ids[n] = KVP_TVOCAB_BYTE0 + (unsigned char)buf[sym[i].off + j];
            n++;
        }
    }
    *n_out = n;
    if (n > cap)
        rc = kvp_err_set(err, KVP_ERANGE, "encode: %zu tokens, room for %zu", n, cap);
    goto out;
oom:
    rc = kvp_err_set(err, KVP_ENOMEM, "encode: heap");
out:
    kvp_heap_free(&h);
    free(sym);
    free(buf);
    return rc;
}

size_t kvp_tvocab_decode(const struct kvp_tvocab *v, const int32_t *ids, size_t n, char *buf,
                         size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int id = ids[i];
        if (id < 0 || id >= v->n || v->type[id] == 2 || v->type[id] == 3)
            continue;
        if (v->type[id] == 6) {
            if (k + 1 < cap)
                buf[k] = (char)(id - KVP_TVOCAB_BYTE0);
            k++;
            continue;
        }
        const char *s = v->text[id];
        for (size_t j = 0; j < v->len[id];) {
            if (j + SPACE_LEN <= v->len[id] && !memcmp(s + j, SPACE_UTF8, SPACE_LEN)) {
                if (k + 1 < cap)
                    buf[k] = ' ';
                k++;
                j += SPACE_LEN;
            } else {
                if (k + 1 < cap)
                    buf[k] = s[j];
                k++;
                j++;
            }
        }
    }
    if (cap > 0)
        buf[k < cap ? k : cap - 1] = 0;
    return k < cap ? k : (cap ? cap - 1 : 0);
}

static int tvocab_task_encode(const void *ud, const char *text, size_t len, bool prefix,
                              int32_t *ids, size_t cap, size_t *n, struct kvp_err *err)
{
    return kvp_tvocab_encode(ud, text, len, prefix, ids, cap, n, err);
}

struct kvp_task_tok kvp_tvocab_task_tok(const struct kvp_tvocab *v)
{
    return (struct kvp_task_tok){.encode = tvocab_task_encode, .ud = v};
}
