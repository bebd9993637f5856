/*
 * The public encoder: special-token partitioning (docs/formats.md §5.1) in front of the
 * two algorithms, SentencePiece-style (spm.c) and byte-level BPE (bpe.c).
 *
 * The text is cut at the literal texts of special tokens, longest text first (ties: lower id),
 * as llama.cpp's tokenizer_st_partition does: every special token in turn splits the raw
 * fragments left by the longer ones. User-defined tokens always split; control and unknown
 * tokens only when the caller asks (parse_special, used for chat templates). Each special match
 * becomes its id; each raw fragment goes to the vocabulary's algorithm. SPM fragments that start
 * the text or follow a special token get the space prefix; BPE never adds one.
 *
 * The fragment list is rebuilt once per special token that occurs in the vocabulary. memmem
 * makes a miss cheap, so even Llama 3's 256 control tokens cost little next to the merging.
 */
#include "tokenizer/vocab_impl.h"

#include <stdlib.h>
#include <string.h>

struct fragment {
    int token;  /* special token id, or -1 for raw text */
    size_t off; /* raw text: byte range in the input */
    size_t len;
};

struct frag_list {
    struct fragment *a; /* owned [cap] */
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

/* Partition text[0..len) into *out (special matches and raw ranges, in order).
 * Returns 0 or KVP_ENOMEM; *out is the caller's to free either way. */
static int partition(const struct kvp_vocab *v, const char *text, size_t len, bool parse_special,
                     struct frag_list *out)
{
    struct frag_list b = {0};
    int rc = 0;
    out->n = 0;
    if (len > 0 && (rc = frag_push(out, (struct fragment){-1, 0, len})) < 0)
        goto out_free;
    for (int i = 0; i < v->n_special && out->n > 0; i++) {
        int id = v->special[i];
        int t = v->type[id];
        if (!parse_special && (t == KVP_TOKEN_CONTROL || t == KVP_TOKEN_UNKNOWN))
            continue;
        if (v->len[id] > len)
            continue; /* cannot occur */
        if ((rc = split_on(v, id, text, out, &b)) < 0)
            goto out_free;
        struct frag_list tmp = *out;
        *out = b;
        b = tmp;
    }
out_free:
    free(b.a);
    return rc;
}

/* See vocab.h. Errors: KVP_EINVAL for bad arguments, KVP_ENOMEM, and KVP_ERANGE when cap is
 * too small (*n_out still holds the full count) or the text is too long. */
int kvp_vocab_encode(const struct kvp_vocab *v, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *ids, size_t cap, size_t *n_out,
                     struct kvp_err *err)
{
    if (!v || (!text && len) || (!ids && cap) || !n_out)
        return kvp_err_set(err, KVP_EINVAL, "kvp_vocab_encode: NULL argument");
    bool bpe = v->kind == KVP_VOCAB_BPE;
    struct kvp_id_sink out = {ids, cap, 0};
    struct frag_list a = {0};
    int rc = partition(v, text, len, parse_special, &a);
    if (rc < 0)
        goto out_free;

    if (add_special && v->add_bos && v->bos >= 0)
        kvp_sink_emit(&out, v->bos);
    bool prev_special = true; /* SPM: the first fragment gets the space prefix too */
    for (size_t i = 0; i < a.n; i++) {
        if (a.a[i].token >= 0) {
            kvp_sink_emit(&out, a.a[i].token);
            prev_special = true;
            continue;
        }
        const char *frag = text + a.a[i].off;
        if (bpe)
            rc = kvp_bpe_encode_fragment(v, frag, a.a[i].len, &out);
        else
            rc = kvp_spm_encode_fragment(v, frag, a.a[i].len, v->add_space_prefix && prev_special,
                                         &out);
        if (rc < 0)
            goto out_free;
        prev_special = false;
    }
    if (add_special && v->add_eos && v->eos >= 0 && !bpe) /* §5.3: BPE never appends EOS */
        kvp_sink_emit(&out, v->eos);

out_free:
    free(a.a);
    *n_out = out.n;
    if (rc < 0)
        return kvp_err_set(err, rc, "tokenizer: %s",
                           rc == KVP_ENOMEM ? "out of memory" : "text too long");
    if (out.n > cap)
        return kvp_err_set(err, KVP_ERANGE, "tokenizer: %zu tokens do not fit in %zu", out.n, cap);
    return 0;
}
