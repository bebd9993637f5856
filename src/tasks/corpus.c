/*
 * The corpora the retrieval tasks (src/tasks) and the plain-text samples are drawn
 * from.
 *
 * Corpus. The filler text (TinyStories, Tiny Shakespeare; never the Paul Graham essays, which
 * are evaluation filler) is read once, its whitespace collapsed as RULER does for the essay
 * haystack, and split into sentences with a rule splitter (break after . ! ? and an optional
 * closing quote when a space and an uppercase letter or a quote follow). Each sentence's token
 * count as " " + sentence is stored so haystacks can be sized without encoding everything
 * twice. The last `holdout` fraction of sentences is kept for evaluation.
 */
#include <ctype.h>
#include <stdbool.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "tasks/corpus.h"
#include "tasks/sbuf.h"

#define MAX_SENT_BYTES 600
#define MAX_WORDS 20000

/* ====================================== corpus ================================================ */

/* Every string member named "text", at any depth of a parsed JSON value, in document order. */
static void json_text_append(const cJSON *j, struct sbuf *b, int *found)
{
    for (const cJSON *c = j ? j->child : NULL; c; c = c->next) {
        if (cJSON_IsString(c) && c->string && !strcmp(c->string, "text")) {
            sb_add(b, c->valuestring, strlen(c->valuestring));
            sb_add(b, "\n\n", 2);
            (*found)++;
        } else if (cJSON_IsObject(c) || cJSON_IsArray(c)) {
            json_text_append(c, b, found);
        }
    }
}

/* A .json file holds text as JSON strings (RULER's all_essays.json: {"text": "..."}; LongBench
 * style JSON Lines: one such object per line): its "text" members, unescaped, are the text.
 * Read as plain bytes it would put literal \n escapes and a JSON skeleton into every haystack. */
int kvp_corpus_json_append(const char *path, const char *raw, size_t n, struct sbuf *b,
                           struct kvp_err *err)
{
    int found = 0;
    /* one value filling the file, else JSON Lines (cJSON stops after the first value) */
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(raw, n, &end, false);
    while (j && end && end < raw + n && isspace((unsigned char)*end))
        end++;
    if (j && end != raw + n) {
        cJSON_Delete(j);
        j = NULL;
    }
    if (j) {
        json_text_append(j, b, &found);
        cJSON_Delete(j);
    } else {
        for (size_t at = 0; at < n;) { /* JSON Lines */
            const char *nl = memchr(raw + at, '\n', n - at);
            size_t len = nl ? (size_t)(nl - (raw + at)) : n - at;
            cJSON *line = cJSON_ParseWithLength(raw + at, len);
            json_text_append(line, b, &found);
            cJSON_Delete(line);
            at += len + 1;
        }
    }
    if (b->oom)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    if (!found)
        return kvp_err_set(err, KVP_EFORMAT,
                           "%s: a .json text file needs string members named \"text\"", path);
    return found;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int read_file_append(const char *path, struct sbuf *b, struct kvp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    const bool json = has_suffix(path, ".json") || has_suffix(path, ".jsonl");
    struct sbuf raw = {0};
    struct sbuf *dst = json ? &raw : b;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        sb_add(dst, buf, n);
    int bad = ferror(f);
    fclose(f);
    int rc = 0;
    if (bad)
        rc = kvp_err_set(err, KVP_EIO, "%s: read error", path);
    else if (dst->oom)
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    else if (json)
        rc = kvp_corpus_json_append(path, raw.p ? raw.p : "", raw.n, b, err);
    free(raw.p);
    if (rc < 0)
        return rc;
    sb_add(b, "\n\n", 2);
    return b->oom ? kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path) : 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Text kept for evaluation only: the Paul Graham essays (retrieval filler) and the held-out
 * stories (data/heldout_stories.txt, perplexity). Its reason, or NULL for any other path. */
static const char *eval_only(const char *path)
{
    if (strstr(path, "pg_essays"))
        return "the Paul Graham essays are evaluation filler";
    if (strstr(path, "heldout_stories.txt"))
        return "the held-out stories are evaluation text";
    return NULL;
}

/* All regular files of a directory, in name order (so runs do not depend on readdir order).
 * Symbolic links (a second name of a file already read, as in the fortune databases) and files
 * holding a NUL byte (their binary index files) are skipped; evaluation-only files are refused
 * unless allow_eval. */
static int read_dir_append(const char *dir, bool allow_eval, struct sbuf *b, struct kvp_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return kvp_err_set(err, KVP_EIO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        char *p = malloc(len);
        if (!p || (n == cap && !(names = realloc(names, (cap = cap ? cap * 2 : 16) * sizeof(*names))))) {
            free(p);
            rc = kvp_err_set(err, KVP_ENOMEM, "%s: listing", dir);
            goto out;
        }
        snprintf(p, len, "%s/%s", dir, e->d_name);
        names[n++] = p;
    }
    qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct stat st;
        if (lstat(names[i], &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        const char *why = allow_eval ? NULL : eval_only(names[i]);
        if (why) {
            rc = kvp_err_set(err, KVP_EINVAL, "%s: %s, never training data", names[i], why);
            break;
        }
        size_t n0 = b->n;
        rc = read_file_append(names[i], b, err);
        if (rc == 0 && memchr(b->p + n0, 0, b->n - n0))
            b->n = n0; /* binary */
    }
out:
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    closedir(d);
    return rc;
}

static int read_paths(const char *const *paths, int n_paths, bool allow_eval, char **text,
                      size_t *len, struct kvp_err *err)
{
    struct sbuf b = {0};
    for (int i = 0; i < n_paths; i++) {
        const char *why = allow_eval ? NULL : eval_only(paths[i]);
        if (why) {
            free(b.p);
            return kvp_err_set(err, KVP_EINVAL, "%s: %s, never training data", paths[i], why);
        }
        struct stat st;
        if (stat(paths[i], &st) != 0) {
            free(b.p);
            return kvp_err_set(err, KVP_EIO, "%s: %s", paths[i], strerror(errno));
        }
        int rc = S_ISDIR(st.st_mode) ? read_dir_append(paths[i], allow_eval, &b, err)
                                     : read_file_append(paths[i], &b, err);
        if (rc < 0) {
            free(b.p);
            return rc;
        }
    }
    if (b.n == 0) {
        free(b.p);
        return kvp_err_set(err, KVP_EINVAL, "no text in the given files");
    }
    *text = b.p;
    *len = b.n;
    return 0;
}

/* The mojibake of the punctuation in U+2018..U+2026: its UTF-8 bytes E2 80 XX were once read
 * as Windows-1252 ("â", "€", then XX's character) and written back as UTF-8. The prefix "â€"
 * (C3 A2 E2 82 AC) is followed by XX's character; the text has no other use for that prefix. */
static const struct {
    unsigned char tail[3], n, xx;
} mojibake[] = {
    {{0xE2, 0x84, 0xA2}, 3, 0x99}, /* ™ → ’ */
    {{0xCB, 0x9C}, 2, 0x98},       /* ˜ → ‘ */
    {{0xC5, 0x93}, 2, 0x9C},       /* œ → “ */
    {{0xC2, 0x9D}, 2, 0x9D},       /* U+009D → ” */
    {{0xE2, 0x80, 0x9C}, 3, 0x93}, /* “ → – */
    {{0xE2, 0x80, 0x9D}, 3, 0x94}, /* ” → — */
    {{0xC2, 0xA6}, 2, 0xA6},       /* ¦ → … */
    {{0xC2, 0xA2}, 2, 0xA2},       /* ¢ → • */
    {{0xC5, 0xA0}, 2, 0x8A},       /* Š → hair space */
};

size_t kvp_text_fix_mojibake(char *text, size_t len)
{
    static const unsigned char pre[5] = {0xC3, 0xA2, 0xE2, 0x82, 0xAC};
    unsigned char *t = (unsigned char *)text;
    size_t r = 0, w = 0;
    while (r < len) {
        if (t[r] != 0xC3 || len - r < 5 || memcmp(t + r, pre, 5) != 0) {
            t[w++] = t[r++];
            continue;
        }
        r += 5;
        /* Windows-1252 has no character for 9D, so the closing double quote often lost its
         * third byte: a prefix followed by nothing known is that quote */
        unsigned char xx = 0x9D;
        for (size_t k = 0; k < sizeof mojibake / sizeof mojibake[0]; k++)
            if (len - r >= mojibake[k].n && memcmp(t + r, mojibake[k].tail, mojibake[k].n) == 0) {
                xx = mojibake[k].xx;
                r += mojibake[k].n;
                break;
            }
        t[w++] = 0xE2;
        t[w++] = 0x80;
        t[w++] = xx;
    }
    if (w < len)
        t[w] = '\0';
    return w;
}

int kvp_corpus_read(const char *const *paths, int n_paths, char **text, size_t *len,
                    struct kvp_err *err)
{
    int rc = read_paths(paths, n_paths, false, text, len, err);
    if (rc == 0)
        *len = kvp_text_fix_mojibake(*text, *len);
    return rc;
}

int kvp_corpus_read_filler(const char *const *paths, int n_paths, char **text, size_t *len,
                           struct kvp_err *err)
{
    return read_paths(paths, n_paths, true, text, len, err);
}

int kvp_corpus_passkey_only(struct kvp_corpus **out, struct kvp_err *err)
{
    /* enough sentences and words for kvp_corpus_init's checks; the prompt never shows them */
    static const char text[] = "The grass is green. The sky is blue. The sun is yellow. Here we "
                               "go. There and back again. The river runs past the old mill and "
                               "the quiet village sleeps.\n";
    int rc = kvp_corpus_init(out, text, sizeof(text) - 1, NULL, 0.0, err);
    if (rc == 0)
        (*out)->noise_only = true;
    return rc;
}

int kvp_corpus_add_hay(struct kvp_corpus *c, struct kvp_corpus *h, struct kvp_err *err)
{
    if (c->n_hay == KVP_HAY_MAX) {
        kvp_corpus_free(h);
        return kvp_err_set(err, KVP_EINVAL, "at most %d haystack corpora", KVP_HAY_MAX);
    }
    if (!c->hay && !(c->hay = calloc(KVP_HAY_MAX, sizeof(*c->hay)))) {
        kvp_corpus_free(h);
        return kvp_err_set(err, KVP_ENOMEM, "haystack corpora");
    }
    c->hay[c->n_hay++] = h;
    return 0;
}

void kvp_corpus_free(struct kvp_corpus *c)
{
    if (!c)
        return;
    free(c->text);
    free(c->sent_off);
    free(c->sent_tok);
    if (c->words)
        for (int i = 0; i < c->n_words; i++)
            free(c->words[i]);
    free(c->words);
    for (int i = 0; i < c->n_hay; i++)
        kvp_corpus_free(c->hay[i]);
    free(c->hay);
    free(c);
}

/* Collapse every whitespace run to one space; drop leading and trailing space. */
static size_t collapse_ws(char *dst, const char *src, size_t len)
{
    size_t k = 0;
    bool sp = false;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)src[i];
        if (isspace(ch)) {
            sp = k > 0;
            continue;
        }
        if (sp)
            dst[k++] = ' ';
        sp = false;
        dst[k++] = (char)ch;
    }
    return k;
}

/* Is text[i] (a '.', '!' or '?') the end of a sentence? Returns the index after it (and after a
 * closing quote) or 0. */
static size_t sentence_end(const char *t, size_t len, size_t i)
{
    size_t j = i + 1;
    if (j < len && (t[j] == '"' || t[j] == '\''))
        j++;
    if (j + 1 >= len || t[j] != ' ')
        return 0;
    unsigned char nx = (unsigned char)t[j + 1];
    if (!isupper(nx) && nx != '"' && nx != '\'')
        return 0;
    /* a short list of abbreviations */
    static const char *const abbr[] = {"Mr", "Mrs", "Dr", "Ms", "St", "etc", "e.g", "i.e"};
    for (size_t a = 0; a < sizeof(abbr) / sizeof(abbr[0]); a++) {
        size_t al = strlen(abbr[a]);
        if (t[i] == '.' && i >= al && !strncmp(t + i - al, abbr[a], al) &&
            (i == al || t[i - al - 1] == ' '))
            return 0;
    }
    return j;
}

static int add_word(struct kvp_corpus *c, const char *w, size_t n, int32_t *hash, size_t hcap)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)w[i]) * 1099511628211ULL;
    size_t i = h & (hcap - 1);
    for (; hash[i] >= 0; i = (i + 1) & (hcap - 1))
        if (strlen(c->words[hash[i]]) == n && !memcmp(c->words[hash[i]], w, n))
            return 0;
    char *p = malloc(n + 1);
    if (!p)
        return -1;
    memcpy(p, w, n);
    p[n] = 0;
    hash[i] = c->n_words;
    c->words[c->n_words++] = p;
    return 0;
}

/* Distinct lowercase words of 3..10 letters from the training sentences, in text order. */
static int collect_words(struct kvp_corpus *c)
{
    size_t end = c->sent_off[c->n_train];
    /* a word and the byte before it take 4 bytes, so a short text needs only a small table (the
     * word list is in text order whatever its size) */
    size_t max_words = end / 4 + 1 < MAX_WORDS ? end / 4 + 1 : MAX_WORDS, hcap = 16;
    while (hcap < 2 * max_words)
        hcap *= 2;
    int32_t *hash = malloc(hcap * sizeof(int32_t));
    c->words = calloc(max_words, sizeof(char *));
    if (!hash || !c->words) {
        free(hash);
        return -1;
    }
    memset(hash, 0xff, hcap * sizeof(int32_t));
    const char *t = c->text;
    for (size_t i = 0; i < end && (size_t)c->n_words < max_words;) {
        if (!islower((unsigned char)t[i]) || (i > 0 && isalpha((unsigned char)t[i - 1]))) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < end && islower((unsigned char)t[j]))
            j++;
        bool clean = j >= end || !isalpha((unsigned char)t[j]);
        if (clean && j - i >= 3 && j - i <= 10 && add_word(c, t + i, j - i, hash, hcap) < 0) {
            free(hash);
            return -1;
        }
        i = j;
    }
    free(hash);
    return 0;
}

int kvp_corpus_init(struct kvp_corpus **out, const char *raw, size_t len,
                    const struct kvp_task_tok *tok, double holdout, struct kvp_err *err)
{
    struct kvp_corpus *c = calloc(1, sizeof(*c));
    if (!c)
        return kvp_err_set(err, KVP_ENOMEM, "corpus");
    c->text = malloc(len + 2);
    if (!c->text)
        goto oom;
    c->len = collapse_ws(c->text, raw, len);
    c->text[c->len] = 0;
    /* sentences */
    size_t cap = c->len / 16 + 16;
    c->sent_off = malloc((cap + 1) * sizeof(uint32_t));
    if (!c->sent_off)
        goto oom;
    if (c->len >= UINT32_MAX) {
        kvp_corpus_free(c);
        return kvp_err_set(err, KVP_ERANGE, "corpus over 4 GB");
    }
    size_t start = 0;
    for (size_t i = 0; i < c->len; i++) {
        size_t e = 0;
        if (c->text[i] == '.' || c->text[i] == '!' || c->text[i] == '?')
            e = sentence_end(c->text, c->len, i);
        if (!e && i - start >= MAX_SENT_BYTES && c->text[i] == ' ')
            e = i; /* overlong sentence: cut at a space */
        if (!e && i + 1 == c->len)
            e = c->len;
        if (!e)
            continue;
        if ((size_t)c->n_sent + 1 >= cap) {
            uint32_t *np = realloc(c->sent_off, (cap * 2 + 1) * sizeof(uint32_t));
            if (!np)
                goto oom;
            c->sent_off = np;
            cap *= 2;
        }
        c->sent_off[c->n_sent++] = (uint32_t)start;
        if (e == c->len)
            break;
        start = c->text[e] == ' ' ? e + 1 : e;
        i = start - 1; /* the loop's i++ resumes at start */
    }
    if (c->n_sent < 4) {
        long n_sent = c->n_sent; /* the message needs it after the free */
        kvp_corpus_free(c);
        return kvp_err_set(err, KVP_EINVAL, "training text has %ld sentences; need 4 or more",
                           n_sent);
    }
    c->sent_off[c->n_sent] = (uint32_t)c->len + 1; /* as if a space followed the last one */
    c->sent_tok = malloc((size_t)c->n_sent * sizeof(uint16_t));
    if (!c->sent_tok)
        goto oom;
    for (long s = 0; s < c->n_sent; s++) {
        size_t b = c->sent_off[s], e = c->sent_off[s + 1] - 1;
        size_t n = (e - b) / 4 + 1; /* estimate without a vocabulary */
        if (tok)
            tok->encode(tok->ud, c->text + b, e - b, true, NULL, 0, &n, NULL);
        c->sent_tok[s] = (uint16_t)(n > 65535 ? 65535 : n);
    }
    c->n_train = c->n_sent - (long)(holdout * (double)c->n_sent);
    if (c->n_train < 2)
        c->n_train = 2;
    if (c->n_train > c->n_sent)
        c->n_train = c->n_sent;
    if (collect_words(c) < 0)
        goto oom;
    if (c->n_words < 16) {
        int n_words = c->n_words;
        kvp_corpus_free(c);
        return kvp_err_set(err, KVP_EINVAL,
                           "training text has %d distinct words (of 3-10 lowercase letters); "
                           "need 16 or more", n_words);
    }
    size_t nt = 0;
    if (tok)
        tok->encode(tok->ud, KVP_TASK_NOISE_LINE, strlen(KVP_TASK_NOISE_LINE), false, NULL, 0,
                    &nt, NULL);
    else
        nt = strlen(KVP_TASK_NOISE_LINE) / 4;
    c->noise_tok = (int)nt + 1;
    *out = c;
    return 0;

oom:
    kvp_corpus_free(c);
    return kvp_err_set(err, KVP_ENOMEM, "corpus");
}

