/*
 * Vocabulary storage, loading and decoding.
 *
 * One struct kvp_vocab holds every token's text, score and type plus the special ids and flags,
 * whatever the source: GGUF metadata (tokenizer.ggml.*, docs/formats.md §2.3) or
 * llama2.c's tokenizer.bin (§6.3), which is rewritten at load into the SentencePiece form that
 * llama.cpp's GGUF files use: a space becomes U+2581, "\n<s>\n" and "\n</s>\n" become the control
 * tokens "<s>" and "</s>", id 0 is the unknown token and "<0xXX>" texts are byte tokens. That makes
 * one encoder (spm.c) and one decoder serve both, and lets `kvpred convert` write the vocabulary
 * back out as GGUF metadata unchanged.
 *
 * Texts live in one blob; text→id lookup is an open-addressing hash table (FNV-1a, linear
 * probing) because the encoder looks up every candidate pair it sees, so lookups outnumber
 * everything else by far. When two ids share a text the later id wins, as in llama.cpp's
 * token_to_id map.
 */
#include "tokenizer/vocab_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cursor.h"
#include "core/platform.h"

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */
#define SPACE_MARK_LEN 3

/* ============================== Hash table ==================================================== */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static bool text_eq(const struct kvp_vocab *v, int id, const char *s, size_t n)
{
    return v->len[id] == n && (n == 0 || memcmp(v->text[id], s, n) == 0);
}

static int hash_build(struct kvp_vocab *v, struct kvp_err *err)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)v->n)
        cap *= 2;
    v->hash = malloc(cap * sizeof(*v->hash));
    if (!v->hash)
        return kvp_err_set(err, KVP_ENOMEM, "vocabulary: out of memory for the hash table");
    memset(v->hash, 0xff, cap * sizeof(*v->hash)); /* every slot -1 */
    v->hash_cap = cap;
    for (int id = 0; id < v->n; id++) {
        size_t i = (size_t)hash_bytes(v->text[id], v->len[id]) & (cap - 1);
        while (v->hash[i] >= 0 && !text_eq(v, v->hash[i], v->text[id], v->len[id]))
            i = (i + 1) & (cap - 1);
        v->hash[i] = id; /* a duplicate text: the later id replaces the earlier */
    }
    return 0;
}

/* Id of the token whose text is exactly s[0..n), or -1. NULL v gives -1. */
int kvp_vocab_find(const struct kvp_vocab *v, const char *s, size_t n)
{
    if (!v || (!s && n))
        return -1;
    size_t i = (size_t)hash_bytes(s, n) & (v->hash_cap - 1);
    while (v->hash[i] >= 0) {
        if (text_eq(v, v->hash[i], s, n))
            return v->hash[i];
        i = (i + 1) & (v->hash_cap - 1);
    }
    return -1;
}

/* ============================== Construction ================================================== */

int kvp_vocab_build(int n, const char *const *texts, const size_t *lens, const float *scores,
                    const int32_t *types, struct kvp_vocab **out, struct kvp_err *err)
{
    if (n <= 0 || n > KVP_VOCAB_MAX_TOKENS)
        return kvp_err_set(err, KVP_EFORMAT, "vocabulary: %d tokens (must be 1 .. %d)", n,
                           KVP_VOCAB_MAX_TOKENS);
    if (!texts || !lens)
        return kvp_err_set(err, KVP_EINVAL, "vocabulary: NULL token array");
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (lens[i] > KVP_VOCAB_MAX_TEXT || (!texts[i] && lens[i]))
            return kvp_err_set(err, KVP_EFORMAT, "vocabulary: token %d has a bad text (%zu bytes)",
                               i, lens[i]);
        if (!kvp_add_ok(total, lens[i] + 1, &total))
            return kvp_err_set(err, KVP_ENOMEM, "vocabulary: texts too large");
        if (types && (types[i] < 0 || types[i] > KVP_TOKEN_BYTE))
            return kvp_err_set(err, KVP_EFORMAT, "vocabulary: token %d has unknown type %d", i,
                               (int)types[i]);
    }

    struct kvp_vocab *v = calloc(1, sizeof(*v));
    if (!v)
        return kvp_err_set(err, KVP_ENOMEM, "vocabulary: out of memory");
    v->n = n;
    v->kind = KVP_VOCAB_SPM;
    v->blob = malloc(total);
    v->text = calloc((size_t)n, sizeof(*v->text));
    v->len = calloc((size_t)n, sizeof(*v->len));
    v->score = calloc((size_t)n, sizeof(*v->score));
    v->type = calloc((size_t)n, sizeof(*v->type));
    if (!v->blob || !v->text || !v->len || !v->score || !v->type) {
        kvp_err_set(err, KVP_ENOMEM, "vocabulary: out of memory for %d tokens", n);
        goto fail_free_vocab;
    }
    char *p = v->blob;
    for (int i = 0; i < n; i++) {
        if (lens[i])
            memcpy(p, texts[i], lens[i]);
        p[lens[i]] = 0;
        v->text[i] = p;
        v->len[i] = lens[i];
        p += lens[i] + 1;
        v->score[i] = scores ? scores[i] : 0.0f;
        /* type 0 ("undefined" in llama.cpp) is treated as normal */
        v->type[i] = types && types[i] ? types[i] : KVP_TOKEN_NORMAL;
    }
    if (hash_build(v, err) < 0)
        goto fail_free_vocab;
    v->bos = n > 1 ? 1 : -1; /* SPM defaults (docs/formats.md §2.3) */
    v->eos = n > 2 ? 2 : -1;
    v->unk = 0;
    v->eot = -1;
    v->eom = -1;
    v->add_bos = true;
    v->add_eos = false;
    v->add_space_prefix = true;
    *out = v;
    return 0;

fail_free_vocab:
    kvp_vocab_free(v);
    return err ? err->code : KVP_ENOMEM;
}

/* Special tokens sorted longest first; qsort has no context argument, so sort (len, id) pairs. */
struct special_key {
    size_t len;
    int32_t id;
};

static int cmp_special_key(const void *a, const void *b)
{
    const struct special_key *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int kvp_vocab_finish(struct kvp_vocab *v, struct kvp_err *err)
{
    int count = 0;
    for (int i = 0; i < v->n; i++) {
        int t = v->type[i];
        if ((t == KVP_TOKEN_CONTROL || t == KVP_TOKEN_USER_DEFINED || t == KVP_TOKEN_UNKNOWN) &&
            v->len[i] > 0)
            count++;
    }
    free(v->special);
    v->special = NULL;
    v->n_special = 0;
    if (count > 0) {
        struct special_key *keys = malloc((size_t)count * sizeof(*keys));
        v->special = malloc((size_t)count * sizeof(*v->special));
        if (!keys || !v->special) {
            free(keys);
            return kvp_err_set(err, KVP_ENOMEM, "vocabulary: out of memory");
        }
        int k = 0;
        for (int i = 0; i < v->n; i++) {
            int t = v->type[i];
            if ((t == KVP_TOKEN_CONTROL || t == KVP_TOKEN_USER_DEFINED ||
                 t == KVP_TOKEN_UNKNOWN) && v->len[i] > 0)
                keys[k++] = (struct special_key){v->len[i], i};
        }
        qsort(keys, (size_t)count, sizeof(*keys), cmp_special_key);
        for (int i = 0; i < count; i++)
            v->special[i] = keys[i].id;
        v->n_special = count;
        free(keys);
    }
    /* byte fallback, as llama.cpp's byte_to_token: "<0xXX>", else the raw one-byte text */
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof(hex), "<0x%02X>", b);
        int id = kvp_vocab_find(v, hex, 6);
        if (id < 0) {
            char c = (char)b;
            id = kvp_vocab_find(v, &c, 1);
        }
        if (id < 0)
            id = v->unk;
        v->byte_id[b] = id;
    }
    return 0;
}

/* Release everything; NULL is a no-op. */
void kvp_vocab_free(struct kvp_vocab *v)
{
    if (!v)
        return;
    free(v->blob);
    free(v->text);
    free(v->len);
    free(v->score);
    free(v->type);
    free(v->hash);
    free(v->special);
    free(v->merge);
    free(v);
}

/* Public constructor from explicit arrays (texts in SPM form, all copied); SPM defaults for the
 * flags, the given special ids (each must be -1 or a valid id).
 * Returns 0 or a negative KVP_E* code; *out untouched on error. */
int kvp_vocab_create_spm(int n_vocab, const char *const *texts, const size_t *lens,
                         const float *scores, const int32_t *types, int bos, int eos, int unk,
                         struct kvp_vocab **out, struct kvp_err *err)
{
    if (!out)
        return kvp_err_set(err, KVP_EINVAL, "kvp_vocab_create_spm: NULL out");
    if (n_vocab <= 0 || n_vocab > KVP_VOCAB_MAX_TOKENS)
        return kvp_err_set(err, KVP_EINVAL, "vocabulary: %d tokens (must be 1 .. %d)", n_vocab,
                           KVP_VOCAB_MAX_TOKENS);
    int ids[3] = {bos, eos, unk};
    for (int i = 0; i < 3; i++)
        if (ids[i] < -1 || ids[i] >= n_vocab)
            return kvp_err_set(err, KVP_EINVAL, "vocabulary: special id %d out of range", ids[i]);
    struct kvp_vocab *v = NULL;
    int rc = kvp_vocab_build(n_vocab, texts, lens, scores, types, &v, err);
    if (rc < 0)
        return rc;
    v->bos = bos;
    v->eos = eos;
    v->unk = unk;
    v->add_bos = bos >= 0;
    if ((rc = kvp_vocab_finish(v, err)) < 0) {
        kvp_vocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

/* ============================== llama2.c tokenizer.bin ======================================== */

/* Convert one tokenizer.bin text to SPM form into dst (room for 3 * n bytes); returns its
 * length and sets *type. */
static size_t convert_l2c_text(int id, const uint8_t *s, size_t n, char *dst, int32_t *type)
{
    *type = KVP_TOKEN_NORMAL;
    if (n == 5 && memcmp(s, "\n<s>\n", 5) == 0) {
        *type = KVP_TOKEN_CONTROL;
        memcpy(dst, "<s>", 3);
        return 3;
    }
    if (n == 6 && memcmp(s, "\n</s>\n", 6) == 0) {
        *type = KVP_TOKEN_CONTROL;
        memcpy(dst, "</s>", 4);
        return 4;
    }
    if (id == 0)
        *type = KVP_TOKEN_UNKNOWN;
    else if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' &&
             strchr("0123456789ABCDEF", s[3]) && strchr("0123456789ABCDEF", s[4]) && s[3] && s[4])
        *type = KVP_TOKEN_BYTE;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(dst + o, SPACE_MARK, SPACE_MARK_LEN);
            o += SPACE_MARK_LEN;
        } else {
            dst[o++] = (char)s[i];
        }
    }
    return o;
}

#define L2C_MAX_TOKEN_LENGTH (1u << 16)

/* Parse tokenizer.bin bytes: u32 max_token_length, then n_vocab × (f32 score, i32 len, bytes).
 * The file must end exactly after the last entry: the count is not stored, so trailing or
 * missing bytes are the only sign of a vocabulary-size mismatch.
 * Returns 0 or a negative KVP_E* code; *out untouched on error. */
int kvp_vocab_load_llama2c_memory(const void *buf, size_t size, int n_vocab,
                                  struct kvp_vocab **out, struct kvp_err *err)
{
    struct kvp_err scratch;
    if (!err)
        err = &scratch;
    if (!out || (!buf && size))
        return kvp_err_set(err, KVP_EINVAL, "kvp_vocab_load_llama2c: NULL argument");
    if (n_vocab <= 0 || n_vocab > KVP_VOCAB_MAX_TOKENS)
        return kvp_err_set(err, KVP_EINVAL, "tokenizer.bin: vocabulary size %d out of range",
                           n_vocab);

    struct kvp_cursor cur;
    kvp_cursor_init(&cur, buf, size);
    uint32_t max_len;
    if (kvp_rd_u32(&cur, &max_len) < 0)
        return kvp_err_set(err, KVP_EFORMAT, "tokenizer.bin: truncated header");
    if (max_len == 0 || max_len > L2C_MAX_TOKEN_LENGTH)
        return kvp_err_set(err, KVP_EFORMAT, "tokenizer.bin: max_token_length %u is absurd",
                           max_len);
    /* every entry takes at least 8 bytes: rules out a huge n_vocab before allocating */
    if ((size_t)n_vocab > kvp_cursor_left(&cur) / 8)
        return kvp_err_set(err, KVP_EFORMAT,
                           "tokenizer.bin: %zu bytes cannot hold %d tokens (truncated, or the "
                           "model's vocabulary size does not match)", size, n_vocab);

    int rc;
    size_t blob_cap; /* spaces expand to 3 bytes; size - 4 >= 8 n_vocab > 0 */
    if (!kvp_mul_ok(size - 4, 3, &blob_cap))
        return kvp_err_set(err, KVP_ENOMEM, "tokenizer.bin: file too large");
    char *blob = malloc(blob_cap);
    const char **texts = malloc((size_t)n_vocab * sizeof(*texts));
    size_t *lens = malloc((size_t)n_vocab * sizeof(*lens));
    float *scores = malloc((size_t)n_vocab * sizeof(*scores));
    int32_t *types = malloc((size_t)n_vocab * sizeof(*types));
    if (!blob || !texts || !lens || !scores || !types) {
        rc = kvp_err_set(err, KVP_ENOMEM, "tokenizer.bin: out of memory");
        goto out_free;
    }
    size_t o = 0;
    for (int i = 0; i < n_vocab; i++) {
        int32_t len;
        const uint8_t *s;
        if (kvp_rd_f32(&cur, &scores[i]) < 0 || kvp_rd_i32(&cur, &len) < 0) {
            rc = kvp_err_set(err, KVP_EFORMAT,
                             "tokenizer.bin: truncated at token %d of %d (does the model's "
                             "vocabulary size match?)", i, n_vocab);
            goto out_free;
        }
        if (len < 0 || (uint32_t)len > max_len) {
            rc = kvp_err_set(err, KVP_EFORMAT,
                             "tokenizer.bin: token %d has length %d (max_token_length %u)", i,
                             (int)len, max_len);
            goto out_free;
        }
        if (kvp_rd_bytes(&cur, (size_t)len, &s) < 0) {
            rc = kvp_err_set(err, KVP_EFORMAT, "tokenizer.bin: token %d runs past the end", i);
            goto out_free;
        }
        texts[i] = blob + o;
        lens[i] = convert_l2c_text(i, s, (size_t)len, blob + o, &types[i]);
        o += lens[i];
    }
    if (kvp_cursor_left(&cur) != 0) {
        rc = kvp_err_set(err, KVP_EFORMAT,
                         "tokenizer.bin: %zu bytes left after %d tokens (the model's vocabulary "
                         "size does not match this tokenizer)", kvp_cursor_left(&cur), n_vocab);
        goto out_free;
    }
    struct kvp_vocab *v = NULL;
    if ((rc = kvp_vocab_build(n_vocab, texts, lens, scores, types, &v, err)) < 0)
        goto out_free;
    /* run.c: BOS is 1, EOS is 2, and id 0 is <unk> */
    v->bos = n_vocab > 1 ? 1 : -1;
    v->eos = n_vocab > 2 ? 2 : -1;
    v->unk = 0;
    if ((rc = kvp_vocab_finish(v, err)) < 0) {
        kvp_vocab_free(v);
        goto out_free;
    }
    *out = v;
    rc = 0;

out_free:
    free(types);
    free(scores);
    free(lens);
    free(texts);
    free(blob);
    return rc;
}

/* Same, from a file (mapped for the duration of the call; errors prefixed with the path). */
int kvp_vocab_load_llama2c(const char *path, int n_vocab, struct kvp_vocab **out,
                           struct kvp_err *err)
{
    struct kvp_err scratch;
    if (!err)
        err = &scratch;
    if (!path)
        return kvp_err_set(err, KVP_EINVAL, "kvp_vocab_load_llama2c: NULL path");
    struct kvp_file_map map;
    int rc = kvp_file_map(path, &map, err);
    if (rc < 0)
        return rc;
    rc = kvp_vocab_load_llama2c_memory(map.data, map.size, n_vocab, out, err);
    if (rc < 0)
        kvp_err_prefix(err, "%s", path);
    kvp_file_unmap(&map);
    return rc;
}

/* ============================== Accessors ===================================================== */

int kvp_vocab_n_tokens(const struct kvp_vocab *v)
{
    return v ? v->n : 0;
}

int kvp_vocab_kind(const struct kvp_vocab *v)
{
    return v ? v->kind : 0;
}

int kvp_vocab_bos(const struct kvp_vocab *v)
{
    return v ? v->bos : -1;
}

int kvp_vocab_eos(const struct kvp_vocab *v)
{
    return v ? v->eos : -1;
}

bool kvp_vocab_add_bos(const struct kvp_vocab *v)
{
    return v && v->add_bos && v->bos >= 0;
}

/* True for EOS, EOT, EOM and the end-of-turn tokens found by text at load (§5.4). */
bool kvp_vocab_is_eog(const struct kvp_vocab *v, int token)
{
    if (!v || token < 0)
        return false;
    if (token == v->eos || token == v->eot || token == v->eom)
        return true;
    for (int i = 0; i < v->n_eog; i++)
        if (token == v->eog[i])
            return true;
    return false;
}

const char *kvp_vocab_text(const struct kvp_vocab *v, int token, size_t *len)
{
    if (!v || token < 0 || token >= v->n)
        return NULL;
    if (len)
        *len = v->len[token];
    return v->text[token];
}

float kvp_vocab_score(const struct kvp_vocab *v, int token)
{
    return (v && token >= 0 && token < v->n) ? v->score[token] : 0.0f;
}

/* Token type, or 0 for an invalid id. */
int kvp_vocab_type(const struct kvp_vocab *v, int token)
{
    return (v && token >= 0 && token < v->n) ? v->type[token] : 0;
}

/* ============================== Decoding ====================================================== */

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* See vocab_impl.h. */
int kvp_hex_byte(char hi, char lo)
{
    const int h = hex_digit(hi), l = hex_digit(lo);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

/* See vocab_impl.h. */
size_t kvp_piece_put(char *buf, size_t cap, size_t o, const char *src, size_t n)
{
    if (o >= cap)
        return o;
    if (n > cap - o)
        n = cap - o;
    memcpy(buf + o, src, n);
    return o + n;
}

/* See vocab.h. Unknown tokens print U+2585 as llama.cpp does; unused tokens print nothing;
 * user-defined tokens print their text verbatim. */
size_t kvp_vocab_piece(const struct kvp_vocab *v, int prev, int token, char *buf, size_t cap)
{
    if (!v || token < 0 || token >= v->n || (!buf && cap))
        return 0;
    if (v->kind == KVP_VOCAB_BPE)
        return kvp_bpe_piece(v, token, buf, cap);
    const char *t = v->text[token];
    size_t n = v->len[token];
    switch (v->type[token]) {
    case KVP_TOKEN_BYTE: {
        const int byte = n == 6 ? kvp_hex_byte(t[3], t[4]) : -1;
        if (byte < 0)
            return kvp_piece_put(buf, cap, 0, t, n);
        char c = (char)byte;
        return kvp_piece_put(buf, cap, 0, &c, 1);
    }
    case KVP_TOKEN_CONTROL:
    case KVP_TOKEN_UNUSED:
        return 0;
    case KVP_TOKEN_UNKNOWN:
        return kvp_piece_put(buf, cap, 0, "\xe2\x96\x85", 3);
    case KVP_TOKEN_USER_DEFINED:
        return kvp_piece_put(buf, cap, 0, t, n);
    default:
        break;
    }
    /* normal token: U+2581 back to a space; the space prefix after BOS is dropped (run.c) */
    bool strip = v->add_space_prefix && (prev < 0 || prev == v->bos);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (n - i >= SPACE_MARK_LEN && memcmp(t + i, SPACE_MARK, SPACE_MARK_LEN) == 0) {
            if (!(strip && i == 0))
                o = kvp_piece_put(buf, cap, o, " ", 1);
            i += SPACE_MARK_LEN;
        } else {
            o = kvp_piece_put(buf, cap, o, t + i, 1);
            i++;
        }
    }
    return o;
}
