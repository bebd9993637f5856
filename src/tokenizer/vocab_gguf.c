/*
 * Vocabulary ↔ GGUF metadata (docs/formats.md §2.3, §5.4): reading tokenizer.ggml.* into
 * a struct kvp_vocab, and writing one back for `kvpred convert`. Kept apart from vocab.c so that
 * programs that only read llama2.c files do not pull in the GGUF reader.
 *
 * Two tokenizer models are read: "llama" (SentencePiece style) and "gpt2" (byte-level BPE,
 * which also needs tokenizer.ggml.merges and a known tokenizer.ggml.pre naming its
 * pre-tokenizer; an unknown or missing pre is refused with KVP_EUNSUPPORTED rather than guessed,
 * since a wrong split silently changes every prompt). Missing ids and flags take llama.cpp's
 * defaults for the model (§2.3, §5.4), and an id outside the vocabulary is ignored, as llama.cpp
 * does. Besides eos / eot / eom, every token spelled like a known end-of-turn marker joins the
 * end-of-generation set, so generation stops on both <|end_of_text|> and <|eot_id|> of Llama 3.
 * Only SPM vocabularies can be written back.
 */
#include "tokenizer/vocab_impl.h"

#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "tokenizer/pretok.h"

/* ============================== GGUF metadata ================================================= */

/* Read an optional id key; absent or out of range keeps *id. */
static int read_id(const struct kvp_gguf *g, const char *key, int n, int *id, struct kvp_err *err)
{
    int64_t x;
    int rc = kvp_gguf_get_int(g, key, &x, err);
    if (rc == KVP_ENOTFOUND)
        return 0;
    if (rc < 0)
        return rc;
    if (x >= 0 && x < n)
        *id = (int)x; /* docs/formats.md §2.3: an id >= n_vocab is ignored */
    return 0;
}

static int read_flag(const struct kvp_gguf *g, const char *key, bool *flag, struct kvp_err *err)
{
    bool b;
    int rc = kvp_gguf_get_bool(g, key, &b, err);
    if (rc == KVP_ENOTFOUND)
        return 0;
    if (rc < 0)
        return rc;
    *flag = b;
    return 0;
}

/* Fetch the array record for key, checking its element kind and count. Returns the record,
 * NULL with *rc = 0 when absent and optional, or NULL with *rc < 0 on error. */
static const struct kvp_gguf_kv *get_array(const struct kvp_gguf *g, const char *key, bool want_str,
                                           uint64_t want_n, int *rc, struct kvp_err *err)
{
    *rc = 0;
    int64_t idx = kvp_gguf_find_key(g, key);
    if (idx < 0)
        return NULL;
    const struct kvp_gguf_kv *kv = &g->kv[idx];
    if (kv->type != KVP_GGUF_ARRAY || (want_str != (kv->arr_type == KVP_GGUF_STRING))) {
        *rc = kvp_err_set(err, KVP_EFORMAT, "%s: wrong type (expected an array of %s)", key,
                          want_str ? "strings" : "numbers");
        return NULL;
    }
    if (want_n && kv->count != want_n) {
        *rc = kvp_err_set(err, KVP_EFORMAT, "%s: %llu entries but %llu tokens", key,
                          (unsigned long long)kv->count, (unsigned long long)want_n);
        return NULL;
    }
    return kv;
}

/* The eot id: from the key, else by text as llama.cpp does (docs/formats.md §2.3). */
static int find_eot(const struct kvp_gguf *g, struct kvp_vocab *v, struct kvp_err *err)
{
    int rc = read_id(g, "tokenizer.ggml.eot_token_id", v->n, &v->eot, err);
    if (rc < 0 || v->eot >= 0)
        return rc;
    static const char *const names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                        "<|endoftext|>"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && v->eot < 0; i++) {
        int id = kvp_vocab_find(v, names[i], strlen(names[i]));
        if (id >= 0 && id != v->eos)
            v->eot = id;
    }
    return 0;
}

/* Every token spelled like an end-of-turn marker ends generation too (llama.cpp's EOG set). */
static void find_eog(struct kvp_vocab *v)
{
    static const char *const names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                        "<|endoftext|>", "<|eom_id|>", "<|end_of_text|>"};
    v->n_eog = 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && v->n_eog < KVP_VOCAB_MAX_EOG;
         i++) {
        int id = kvp_vocab_find(v, names[i], strlen(names[i]));
        if (id >= 0)
            v->eog[v->n_eog++] = id;
    }
}

/* Load the token arrays (either model) into a new kvp_vocab. */
static int load_gguf_arrays(const struct kvp_gguf *g, struct kvp_vocab **out, struct kvp_err *err)
{
    int rc;
    const struct kvp_gguf_kv *tok = get_array(g, "tokenizer.ggml.tokens", true, 0, &rc, err);
    if (!tok)
        return rc < 0 ? rc : kvp_err_set(err, KVP_EFORMAT, "tokenizer.ggml.tokens missing");
    if (tok->count == 0 || tok->count > KVP_VOCAB_MAX_TOKENS)
        return kvp_err_set(err, KVP_EFORMAT, "tokenizer.ggml.tokens: %llu tokens (must be 1 .. %d)",
                           (unsigned long long)tok->count, KVP_VOCAB_MAX_TOKENS);
    int n = (int)tok->count;
    const struct kvp_gguf_kv *sc = get_array(g, "tokenizer.ggml.scores", false, tok->count, &rc,
                                             err);
    if (rc < 0)
        return rc;
    const struct kvp_gguf_kv *ty = get_array(g, "tokenizer.ggml.token_type", false, tok->count,
                                             &rc, err);
    if (rc < 0)
        return rc;

    const char **texts = malloc((size_t)n * sizeof(*texts));
    size_t *lens = malloc((size_t)n * sizeof(*lens));
    float *scores = malloc((size_t)n * sizeof(*scores));
    int32_t *types = malloc((size_t)n * sizeof(*types));
    if (!texts || !lens || !scores || !types) {
        rc = kvp_err_set(err, KVP_ENOMEM, "vocabulary: out of memory for %d tokens", n);
        goto out_free;
    }
    for (int i = 0; i < n; i++) {
        double s = 0;
        int64_t t = KVP_TOKEN_NORMAL;
        if (kvp_gguf_arr_str(tok, (uint64_t)i, &texts[i], &lens[i]) < 0 ||
            (sc && kvp_gguf_arr_float(sc, (uint64_t)i, &s) < 0) ||
            (ty && kvp_gguf_arr_int(ty, (uint64_t)i, &t) < 0)) {
            rc = kvp_err_set(err, KVP_EFORMAT, "tokenizer.ggml.*: cannot read token %d", i);
            goto out_free;
        }
        if (t < 0 || t > KVP_TOKEN_BYTE) {
            rc = kvp_err_set(err, KVP_EFORMAT, "tokenizer.ggml.token_type: token %d has type %lld",
                             i, (long long)t);
            goto out_free;
        }
        scores[i] = (float)s;
        types[i] = (int32_t)t;
    }
    rc = kvp_vocab_build(n, texts, lens, scores, types, out, err);

out_free:
    free(types);
    free(scores);
    free(lens);
    free(texts);
    return rc;
}

/* gpt2 only: tokenizer.ggml.pre → pre-tokenizer and defaults. KVP_EUNSUPPORTED when it is
 * missing, empty or not one kvpred implements. */
static int read_pre(const struct kvp_gguf *g, struct kvp_pretok_info *info, char *name,
                    size_t name_cap, struct kvp_err *err)
{
    const char *pre;
    size_t len;
    int rc = kvp_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &len, err);
    if (rc == KVP_ENOTFOUND || (rc == 0 && len == 0))
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "BPE vocabulary without tokenizer.ggml.pre: the pre-tokenizer rules "
                           "are unknown (kvpred knows %s)", kvp_pretok_known_names());
    if (rc < 0)
        return rc;
    *info = kvp_pretok_lookup(pre, len);
    if (info->kind == KVP_PRETOK_NONE)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "BPE pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported; "
                           "kvpred knows %s", (int)(len > 64 ? 64 : len), pre,
                           kvp_pretok_known_names());
    size_t n = len < name_cap - 1 ? len : name_cap - 1;
    memcpy(name, pre, n);
    name[n] = 0;
    return 0;
}

/* gpt2 only: tokenizer.ggml.merges into the rank table. */
static int read_merges(const struct kvp_gguf *g, struct kvp_vocab *v, struct kvp_err *err)
{
    int rc;
    const struct kvp_gguf_kv *m = get_array(g, "tokenizer.ggml.merges", true, 0, &rc, err);
    if (!m)
        return rc < 0 ? rc : kvp_err_set(err, KVP_EFORMAT, "tokenizer.ggml.merges missing (a "
                                                           "gpt2 vocabulary needs it)");
    if ((rc = kvp_bpe_merges_init(v, (size_t)m->count, err)) < 0)
        return rc;
    for (uint64_t i = 0; i < m->count; i++) {
        const char *s;
        size_t len;
        if (kvp_gguf_arr_str(m, i, &s, &len) < 0)
            return kvp_err_set(err, KVP_EFORMAT, "tokenizer.ggml.merges: cannot read entry %llu",
                               (unsigned long long)i);
        if ((rc = kvp_bpe_merge_add(v, (int)i, s, len, err)) < 0)
            return rc;
    }
    return 0;
}

/* BPE defaults (§2.3, §5.4): bos = eos = 11 when that id exists, no unk, no space prefix, BOS
 * only for llama3-style pre-tokenizers. The keys read afterwards override them. */
static void set_bpe_defaults(struct kvp_vocab *v, const struct kvp_pretok_info *info)
{
    v->kind = KVP_VOCAB_BPE;
    v->pretok = info->kind;
    v->ignore_merges = info->ignore_merges;
    v->bos = v->n > 11 ? 11 : -1;
    v->eos = v->n > 11 ? 11 : -1;
    v->unk = -1;
    v->add_bos = info->add_bos;
    v->add_eos = false;
    v->add_space_prefix = false;
}

/* Read tokenizer.ggml.* (docs/formats.md §2.3, defaults of §5.4). Returns 0,
 * KVP_ENOTFOUND when the file has no tokenizer, KVP_EUNSUPPORTED for models other than "llama" and
 * "gpt2" or an unknown BPE pre-tokenizer, or KVP_EFORMAT. */
int kvp_vocab_load_gguf(const struct kvp_gguf *g, struct kvp_vocab **out, struct kvp_err *err)
{
    struct kvp_err scratch;
    if (!err)
        err = &scratch;
    if (!g || !out)
        return kvp_err_set(err, KVP_EINVAL, "kvp_vocab_load_gguf: NULL argument");
    const char *model;
    size_t mlen;
    int rc = kvp_gguf_get_str(g, "tokenizer.ggml.model", &model, &mlen, err);
    if (rc == KVP_ENOTFOUND)
        return kvp_err_set(err, KVP_ENOTFOUND, "no tokenizer in this file (tokenizer.ggml.model "
                                               "missing)");
    if (rc < 0)
        return rc;
    bool bpe = mlen == 4 && memcmp(model, "gpt2", 4) == 0;
    if (!bpe && !(mlen == 5 && memcmp(model, "llama", 5) == 0))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tokenizer model '%.*s' not supported",
                           (int)(mlen > 64 ? 64 : mlen), model);
    struct kvp_pretok_info pre = {0};
    char pre_name[32] = "";
    if (bpe && (rc = read_pre(g, &pre, pre_name, sizeof(pre_name), err)) < 0)
        return rc;

    struct kvp_vocab *v = NULL;
    if ((rc = load_gguf_arrays(g, &v, err)) < 0)
        return rc;
    if (bpe) {
        set_bpe_defaults(v, &pre);
        memcpy(v->pre, pre_name, sizeof(v->pre));
        if ((rc = read_merges(g, v, err)) < 0)
            goto fail_free_vocab;
    }
    if ((rc = read_id(g, "tokenizer.ggml.bos_token_id", v->n, &v->bos, err)) < 0 ||
        (rc = read_id(g, "tokenizer.ggml.eos_token_id", v->n, &v->eos, err)) < 0 ||
        (rc = read_id(g, "tokenizer.ggml.unknown_token_id", v->n, &v->unk, err)) < 0 ||
        (rc = read_id(g, "tokenizer.ggml.eom_token_id", v->n, &v->eom, err)) < 0 ||
        (rc = find_eot(g, v, err)) < 0 ||
        (rc = read_flag(g, "tokenizer.ggml.add_bos_token", &v->add_bos, err)) < 0 ||
        (rc = read_flag(g, "tokenizer.ggml.add_eos_token", &v->add_eos, err)) < 0)
        goto fail_free_vocab;
    /* §2.3: BPE never adds a space prefix, whatever the key says */
    if (!bpe &&
        (rc = read_flag(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err)) < 0)
        goto fail_free_vocab;
    find_eog(v);
    if ((rc = kvp_vocab_finish(v, err)) < 0)
        goto fail_free_vocab;
    *out = v;
    return 0;

fail_free_vocab:
    kvp_vocab_free(v);
    return rc;
}

/* Add the tokenizer.ggml.* keys (docs/formats.md §2.3) describing v. Token strings are
 * borrowed from v until the writer is serialized. Returns 0 or a negative KVP_E* code. */
int kvp_vocab_write_gguf(const struct kvp_vocab *v, struct kvp_gguf_writer *w,
                         struct kvp_err *err)
{
    if (!v || !w)
        return kvp_err_set(err, KVP_EINVAL, "kvp_vocab_write_gguf: NULL argument");
    if (v->kind != KVP_VOCAB_SPM)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "only SentencePiece vocabularies can be written");
    int rc = 0;
    if ((rc = kvp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama")) < 0 ||
        (rc = kvp_gguf_writer_set_str(w, "tokenizer.ggml.pre", "default")) < 0 ||
        (rc = kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v->text, v->len,
                                          (size_t)v->n)) < 0 ||
        (rc = kvp_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", v->score, (size_t)v->n)) <
            0 ||
        (rc = kvp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v->type,
                                          (size_t)v->n)) < 0)
        goto fail;
    if (v->bos >= 0 &&
        (rc = kvp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos)) < 0)
        goto fail;
    if (v->eos >= 0 &&
        (rc = kvp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos)) < 0)
        goto fail;
    if (v->unk >= 0 &&
        (rc = kvp_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk)) < 0)
        goto fail;
    if ((rc = kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos)) < 0 ||
        (rc = kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos)) < 0 ||
        (rc = kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix",
                                       v->add_space_prefix)) < 0)
        goto fail;
    return 0;

fail:
    return kvp_err_set(err, rc, "writing tokenizer metadata: %s", kvp_strerror(rc));
}
