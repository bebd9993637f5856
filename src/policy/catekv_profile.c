/*
 * CateKV head profiles: allocation, the voting build, the text reader and writer (format in
 * catekv_profile.h), and the bridge to a running catekv policy used by `kvpred profile-heads`.
 *
 * The reader treats the file as hostile: it is read whole (at most 4 MiB), split into lines of at
 * most 64 KiB, every number must consume its whole token, every row must have exactly n_head_kv
 * values, every key may appear once, and the first problem ends parsing with one message that
 * names the file and line. Profiles are tiny (layers × KV heads), so clarity beats speed here.
 */
#include "policy/catekv_profile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "policy/catekv_classify.h"

#define LINE_MAX_BYTES 65536

/* ---- allocation ------------------------------------------------------------------------------ */

int kvp_head_profile_alloc(int n_layer, int n_head_kv, struct kvp_head_profile **out,
                           struct kvp_err *err)
{
    if (n_layer < 1 || n_layer > KVP_HEAD_PROFILE_MAX_DIM || n_head_kv < 1 ||
        n_head_kv > KVP_HEAD_PROFILE_MAX_DIM)
        return kvp_err_set(err, KVP_EINVAL, "head profile: shape %d x %d out of range 1..%d",
                           n_layer, n_head_kv, KVP_HEAD_PROFILE_MAX_DIM);
    struct kvp_head_profile *hp = calloc(1, sizeof(*hp));
    size_t n = (size_t)n_layer * n_head_kv;
    if (hp) {
        hp->adaptive = calloc(n, 1);
        hp->cv = calloc(n, sizeof(double));
    }
    if (!hp || !hp->adaptive || !hp->cv) {
        kvp_head_profile_free(hp);
        return kvp_err_set(err, KVP_ENOMEM, "head profile: out of memory");
    }
    hp->n_layer = n_layer;
    hp->n_head_kv = n_head_kv;
    *out = hp;
    return 0;
}

void kvp_head_profile_free(struct kvp_head_profile *hp)
{
    if (!hp)
        return;
    free(hp->adaptive);
    free(hp->cv);
    free(hp);
}

int kvp_head_profile_n_adaptive(const struct kvp_head_profile *hp)
{
    int n = 0;
    for (int i = 0; i < hp->n_layer * hp->n_head_kv; i++)
        n += hp->adaptive[i];
    return n;
}

/* ---- voting ------------------------------------------------------------------------------- */

int kvp_head_profile_vote(const double *cvs, int n_samples, int n_layer, int n_head_kv, double r,
                          struct kvp_head_profile **out, struct kvp_err *err)
{
    struct kvp_head_profile *hp;
    int rc = kvp_head_profile_alloc(n_layer, n_head_kv, &hp, err);
    if (rc < 0)
        return rc;
    int n = n_layer * n_head_kv;
    int *votes = malloc((size_t)n * sizeof(int));
    if (!votes) {
        kvp_head_profile_free(hp);
        return kvp_err_set(err, KVP_ENOMEM, "head profile: out of memory");
    }
    rc = kvp_catekv_vote(cvs, n_samples, n, r, votes, hp->adaptive, err);
    free(votes);
    if (rc < 0) {
        kvp_head_profile_free(hp);
        return rc;
    }
    for (int h = 0; h < n; h++) {
        double s = 0;
        for (int i = 0; i < n_samples; i++)
            s += cvs[(size_t)i * n + h];
        hp->cv[h] = s / n_samples;
    }
    hp->ratio = r;
    hp->n_samples = n_samples;
    *out = hp;
    return 0;
}

/* ---- writing ------------------------------------------------------------------------------ */

int kvp_head_profile_write(const struct kvp_head_profile *hp, const char *path, struct kvp_err *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return kvp_err_set(err, KVP_EIO, "%s: cannot open for writing: %s", path, strerror(errno));
    fprintf(f, "%s %d\n", KVP_HEAD_PROFILE_MAGIC, KVP_HEAD_PROFILE_VERSION);
    fprintf(f, "# CateKV head profile: rows = layers, columns = KV heads; adaptive 1 = full KV\n");
    if (hp->model[0])
        fprintf(f, "model %s\n", hp->model);
    fprintf(f, "n_layer %d\nn_head_kv %d\nratio %.9g\n", hp->n_layer, hp->n_head_kv, hp->ratio);
    const struct {
        const char *key;
        int v;
    } ints[] = {{"n_samples", hp->n_samples}, {"n_prompt", hp->n_prompt},
                {"chunk", hp->chunk},         {"tail_tokens", hp->tail_tokens},
                {"sink", hp->sink},           {"recent", hp->recent},
                {"window", hp->window}};
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
        if (ints[i].v > 0)
            fprintf(f, "%s %d\n", ints[i].key, ints[i].v);
    if (hp->percentile > 0)
        fprintf(f, "percentile %.9g\n", hp->percentile);
    if (hp->alpha > 0)
        fprintf(f, "alpha %.9g\n", hp->alpha);
    fprintf(f, "n_adaptive %d\nadaptive\n", kvp_head_profile_n_adaptive(hp));
    for (int l = 0; l < hp->n_layer; l++)
        for (int h = 0; h < hp->n_head_kv; h++)
            fprintf(f, "%d%c", hp->adaptive[l * hp->n_head_kv + h],
                    h + 1 < hp->n_head_kv ? ' ' : '\n');
    fprintf(f, "cv\n");
    for (int l = 0; l < hp->n_layer; l++)
        for (int h = 0; h < hp->n_head_kv; h++)
            fprintf(f, "%.9g%c", hp->cv[l * hp->n_head_kv + h], h + 1 < hp->n_head_kv ? ' ' : '\n');
    fprintf(f, "end\n");
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad)
        return kvp_err_set(err, KVP_EIO, "%s: write failed", path);
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------ */

struct parser {
    const char *name; /* file name for messages */
    int line_no;
    struct kvp_err *err;
};

static int bad(struct parser *ps, const char *what)
{
    return kvp_err_set(ps->err, KVP_EFORMAT, "head profile %s line %d: %s", ps->name, ps->line_no,
                       what);
}

/* Parse the whole string s as an integer in [lo, hi]. */
static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v))
        return false;
    *out = v;
    return true;
}

enum section { SEC_HEADER, SEC_ADAPTIVE, SEC_CV, SEC_END };

/* Header keys: each may appear once; `seen` is a bitmask in this table's order. */
static const char *const header_keys[] = {"model",     "n_layer",    "n_head_kv", "ratio",
                                          "n_samples", "n_prompt",   "chunk",     "tail_tokens",
                                          "sink",      "recent",     "window",    "percentile",
                                          "alpha",     "n_adaptive", NULL};

struct header {
    unsigned seen;
    long n_layer, n_head_kv, n_adaptive;
    long ints[7]; /* n_samples .. window */
    double ratio, percentile, alpha;
    char model[128];
};

static int header_line(struct parser *ps, struct header *h, char *line)
{
    char *val = strchr(line, ' ');
    if (!val)
        return bad(ps, "expected `key value`");
    *val++ = 0;
    int k = 0;
    while (header_keys[k] && strcmp(header_keys[k], line))
        k++;
    if (!header_keys[k])
        return bad(ps, "unknown key");
    if (h->seen & (1u << k))
        return bad(ps, "duplicate key");
    h->seen |= 1u << k;
    if (k == 0) {
        if (strlen(val) >= sizeof(h->model))
            return bad(ps, "model name too long");
        strcpy(h->model, val);
        return 0;
    }
    bool ok;
    if (k == 1 || k == 2)
        ok = parse_int(val, 1, KVP_HEAD_PROFILE_MAX_DIM, k == 1 ? &h->n_layer : &h->n_head_kv);
    else if (k == 3)
        ok = parse_num(val, &h->ratio) && h->ratio >= 0 && h->ratio <= 1;
    else if (k >= 4 && k <= 10)
        ok = parse_int(val, 0, 1L << 30, &h->ints[k - 4]);
    else if (k == 11 || k == 12)
        ok = parse_num(val, k == 11 ? &h->percentile : &h->alpha);
    else
        ok = parse_int(val, 0, 1L << 30, &h->n_adaptive);
    return ok ? 0 : bad(ps, "bad value");
}

/* Parse one row of exactly n values into adaptive (0/1) or cv (finite, >= 0). */
static int row_line(struct parser *ps, char *line, int n, uint8_t *adaptive, double *cv)
{
    char *save = NULL, *tok = strtok_r(line, " \t", &save);
    for (int i = 0; i < n; i++, tok = strtok_r(NULL, " \t", &save)) {
        if (!tok)
            return bad(ps, "too few values in row");
        if (adaptive) {
            long v;
            if (!parse_int(tok, 0, 1, &v))
                return bad(ps, "class must be 0 or 1");
            adaptive[i] = (uint8_t)v;
        } else if (!parse_num(tok, &cv[i]) || cv[i] < 0) {
            return bad(ps, "CV must be a finite number >= 0");
        }
    }
    return tok ? bad(ps, "too many values in row") : 0;
}

/* Turn a finished header into a profile. */
static int header_done(struct parser *ps, const struct header *h, struct kvp_head_profile **out)
{
    if ((h->seen & 0xe) != 0xe)
        return bad(ps, "n_layer, n_head_kv and ratio must come before `adaptive`");
    int rc = kvp_head_profile_alloc((int)h->n_layer, (int)h->n_head_kv, out, ps->err);
    if (rc < 0)
        return rc;
    struct kvp_head_profile *hp = *out;
    memcpy(hp->model, h->model, sizeof(hp->model));
    hp->ratio = h->ratio;
    int *dst[] = {&hp->n_samples, &hp->n_prompt, &hp->chunk, &hp->tail_tokens,
                  &hp->sink,      &hp->recent,   &hp->window};
    for (int i = 0; i < 7; i++)
        *dst[i] = (int)h->ints[i];
    hp->percentile = h->percentile;
    hp->alpha = h->alpha;
    return 0;
}

/* Feed one line (NUL-terminated, without '\n') to the state machine. */
static int parse_line(struct parser *ps, struct header *h, enum section *sec, int *row, char *line,
                      struct kvp_head_profile **hp)
{
    if (line[0] == '#' || line[0] == 0)
        return 0;
    switch (*sec) {
    case SEC_HEADER:
        if (strcmp(line, "adaptive") != 0)
            return header_line(ps, h, line);
        *sec = SEC_ADAPTIVE;
        *row = 0;
        return header_done(ps, h, hp);
    case SEC_ADAPTIVE:
    case SEC_CV:
        if (*row == (*hp)->n_layer) {
            if (*sec == SEC_ADAPTIVE && !strcmp(line, "cv")) {
                *sec = SEC_CV;
                *row = 0;
                return 0;
            }
            if (*sec == SEC_CV && !strcmp(line, "end")) {
                *sec = SEC_END;
                return 0;
            }
            return bad(ps, *sec == SEC_ADAPTIVE ? "expected `cv` after the class rows"
                                                : "expected `end` after the CV rows");
        }
        {
            size_t off = (size_t)(*row)++ * (*hp)->n_head_kv;
            return row_line(ps, line, (*hp)->n_head_kv,
                            *sec == SEC_ADAPTIVE ? (*hp)->adaptive + off : NULL,
                            *sec == SEC_CV ? (*hp)->cv + off : NULL);
        }
    case SEC_END:
        return bad(ps, "data after `end`");
    }
    return bad(ps, "internal parser state");
}

int kvp_head_profile_parse(const char *data, size_t size, const char *name,
                           struct kvp_head_profile **out, struct kvp_err *err)
{
    struct parser ps = {.name = name, .line_no = 0, .err = err};
    if (size > KVP_HEAD_PROFILE_MAX_BYTES)
        return kvp_err_set(err, KVP_EFORMAT, "head profile %s: larger than %u bytes", name,
                           KVP_HEAD_PROFILE_MAX_BYTES);
    char *line = malloc(LINE_MAX_BYTES + 1);
    if (!line)
        return kvp_err_set(err, KVP_ENOMEM, "head profile: out of memory");
    struct header h = {0};
    struct kvp_head_profile *hp = NULL;
    enum section sec = SEC_HEADER;
    int row = 0, rc = 0;
    size_t pos = 0;
    while (pos < size && rc == 0) {
        const char *nl = memchr(data + pos, '\n', size - pos);
        size_t len = nl ? (size_t)(nl - (data + pos)) : size - pos;
        ps.line_no++;
        if (len > 0 && data[pos + len - 1] == '\r')
            len--;
        if (len > LINE_MAX_BYTES) {
            rc = bad(&ps, "line too long");
            break;
        }
        memcpy(line, data + pos, len);
        line[len] = 0;
        pos += (nl ? (size_t)(nl - (data + pos)) + 1 : size - pos);
        if (memchr(line, 0, len)) {
            rc = bad(&ps, "NUL byte");
        } else if (ps.line_no == 1) {
            char want[64];
            snprintf(want, sizeof(want), "%s %d", KVP_HEAD_PROFILE_MAGIC, KVP_HEAD_PROFILE_VERSION);
            size_t ml = strlen(KVP_HEAD_PROFILE_MAGIC);
            if (strncmp(line, KVP_HEAD_PROFILE_MAGIC, ml) != 0 || line[ml] != ' ')
                rc = kvp_err_set(err, KVP_EFORMAT,
                                 "head profile %s: not a kvpred head profile (the first line "
                                 "must be `%s`)",
                                 name, want);
            else if (strcmp(line, want) != 0)
                rc = kvp_err_set(err, KVP_EFORMAT,
                                 "head profile %s: unsupported version `%s` (this kvpred reads "
                                 "version %d)",
                                 name, line + ml + 1, KVP_HEAD_PROFILE_VERSION);
        } else {
            rc = parse_line(&ps, &h, &sec, &row, line, &hp);
        }
    }
    free(line);
    if (rc == 0 && ps.line_no == 0)
        rc = kvp_err_set(err, KVP_EFORMAT, "head profile %s: empty file", name);
    if (rc == 0 && sec != SEC_END)
        rc = kvp_err_set(err, KVP_EFORMAT, "head profile %s: truncated (no `end` line)", name);
    if (rc == 0 && (h.seen & (1u << 13)) && h.n_adaptive != kvp_head_profile_n_adaptive(hp))
        rc = kvp_err_set(err, KVP_EFORMAT,
                         "head profile %s: n_adaptive %ld but the class rows hold %d ones", name,
                         h.n_adaptive, kvp_head_profile_n_adaptive(hp));
    if (rc < 0) {
        kvp_head_profile_free(hp);
        return rc;
    }
    *out = hp;
    return 0;
}

int kvp_head_profile_read(const char *path, struct kvp_head_profile **out, struct kvp_err *err)
{
    struct kvp_file_map fm;
    int rc = kvp_file_map(path, &fm, err);
    if (rc < 0)
        return kvp_err_prefix(err, "head profile");
    rc = kvp_head_profile_parse((const char *)fm.data, fm.size, path, out, err);
    kvp_file_unmap(&fm);
    return rc;
}
