/*
 * GGUF export of a trained model: architecture `llama`, every tensor F32, the hyper-parameter
 * keys of docs/formats.md §2.2 and the tokenizer in SentencePiece form (§2.3, §5.2), so
 * the engine loads it like any Llama 2-style file. Shapes follow §3.1–3.2: a weight [out][in]
 * row-major is written with ne = [in, out]; output.weight is omitted when tied to token_embd. Q and
 * K rows are already in the adjacent-pair (NORM) order the engine's `llama` RoPE expects, because
 * the trainer rotates adjacent pairs itself; no permutation is needed.
 *
 * Import is the inverse, for files this exporter wrote (continued training of a shipped model
 * whose checkpoint is gone): the configuration from the same keys, the vocabulary from the
 * tokenizer arrays, every tensor F32 with exactly the trainer's name and shape. Anything else
 * (another architecture, quantised tensors, RoPE scaling, partial RoPE) is one error.
 */
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "train/train.h"

int kvp_train_gguf_add_vocab(struct kvp_gguf_writer *w, const struct kvp_tvocab *v)
{
    int rc = 0;
    rc |= kvp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    rc |= kvp_gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    rc |= kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->text,
                                      v->len, (size_t)v->n);
    rc |= kvp_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", v->score, (size_t)v->n);
    rc |= kvp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v->type, (size_t)v->n);
    rc |= kvp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    rc |= kvp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    rc |= kvp_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    rc |= kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    rc |= kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    rc |= kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", true);
    return rc;
}

int kvp_train_export_gguf(const char *path, const struct kvp_train_model *m,
                          const struct kvp_tvocab *v, const char *name, struct kvp_err *err)
{
    const struct kvp_train_config *c = &m->cfg;
    if (v->n != c->n_vocab)
        return kvp_err_set(err, KVP_EINVAL, "vocabulary has %d tokens, model %d", v->n,
                           c->n_vocab);
    struct kvp_gguf_writer *w;
    int rc = kvp_gguf_writer_init(&w, err);
    if (rc < 0)
        return rc;
    int bad = 0;
    bad |= kvp_gguf_writer_set_str(w, "general.architecture", "llama");
    bad |= kvp_gguf_writer_set_str(w, "general.name", name ? name : "kvpred-trained");
    bad |= kvp_gguf_writer_set_u32(w, "general.file_type", 0);
    bad |= kvp_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)c->n_ctx);
    bad |= kvp_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)c->n_embd);
    bad |= kvp_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)c->n_layer);
    bad |= kvp_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)c->n_ff);
    bad |= kvp_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)c->n_head);
    bad |= kvp_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_head_kv);
    bad |= kvp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps);
    bad |= kvp_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)m->head_dim);
    bad |= kvp_gguf_writer_set_f32(w, "llama.rope.freq_base", c->rope_base);
    bad |= kvp_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)c->n_vocab);
    bad |= kvp_train_gguf_add_vocab(w, v);
    for (int i = 0; i < m->n_tensors && !bad; i++) {
        const struct kvp_train_tensor *t = &m->tensors[i];
        bad |= kvp_gguf_writer_add_tensor(w, t->name, KVP_TYPE_F32, t->n_dims, t->ne,
                                          m->params + t->off);
    }
    if (bad) {
        kvp_gguf_writer_free(w);
        return kvp_err_set(err, KVP_ENOMEM, "%s: building the GGUF failed", path);
    }
    rc = kvp_gguf_writer_write_file(w, path, err);
    kvp_gguf_writer_free(w);
    return rc;
}

static int get_u(const struct kvp_gguf *g, const char *key, int lo, int hi, int *out,
                 struct kvp_err *err)
{
    int64_t x;
    int rc = kvp_gguf_get_int(g, key, &x, err);
    if (rc == KVP_ENOTFOUND)
        return kvp_err_set(err, KVP_EFORMAT, "key '%s' is missing", key);
    if (rc < 0)
        return rc;
    if (x < lo || x > hi)
        return kvp_err_set(err, KVP_EFORMAT, "key '%s' = %lld: outside %d..%d", key,
                           (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

static int import_config(const struct kvp_gguf *g, struct kvp_train_config *c,
                         struct kvp_err *err)
{
    const char *arch;
    size_t alen;
    if (kvp_gguf_get_str(g, "general.architecture", &arch, &alen, NULL) != 0 || alen != 5 ||
        memcmp(arch, "llama", 5))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "not a llama-architecture GGUF");
    memset(c, 0, sizeof(*c));
    int rc, rot;
    double eps = 0, base = 10000.0, scale = 1.0;
    if ((rc = get_u(g, "llama.context_length", 2, 65536, &c->n_ctx, err)) < 0 ||
        (rc = get_u(g, "llama.embedding_length", 2, 65536, &c->n_embd, err)) < 0 ||
        (rc = get_u(g, "llama.block_count", 1, 1024, &c->n_layer, err)) < 0 ||
        (rc = get_u(g, "llama.feed_forward_length", 1, 1 << 20, &c->n_ff, err)) < 0 ||
        (rc = get_u(g, "llama.attention.head_count", 1, 1024, &c->n_head, err)) < 0 ||
        (rc = get_u(g, "llama.attention.head_count_kv", 1, 1024, &c->n_head_kv, err)) < 0 ||
        (rc = get_u(g, "llama.rope.dimension_count", 2, 4096, &rot, err)) < 0)
        return rc;
    if (kvp_gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &eps, NULL) != 0 ||
        !(eps > 0.0 && eps < 1.0))
        return kvp_err_set(err, KVP_EFORMAT, "layer_norm_rms_epsilon missing or out of range");
    if ((rc = kvp_gguf_get_float(g, "llama.rope.freq_base", &base, err)) < 0 &&
        rc != KVP_ENOTFOUND)
        return rc;
    if ((rc = kvp_gguf_get_float(g, "llama.rope.scaling.factor", &scale, err)) < 0 &&
        rc != KVP_ENOTFOUND)
        return rc;
    if (scale != 1.0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "RoPE scaling factor %g: the trainer rotates "
                           "unscaled positions", scale);
    if (rot != c->n_embd / c->n_head)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "partial RoPE (%d of head_dim %d)", rot,
                           c->n_embd / c->n_head);
    c->rope_base = (float)base;
    c->norm_eps = (float)eps;
    c->tied = kvp_gguf_find_tensor(g, "output.weight") == NULL;
    return 0;
}

static int import_vocab(const struct kvp_gguf *g, struct kvp_tvocab **out, struct kvp_err *err)
{
    static const char *const keys[3] = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                        "tokenizer.ggml.token_type"};
    const struct kvp_gguf_kv *kv[3];
    uint64_t n = 0;
    for (int k = 0; k < 3; k++) {
        int64_t i = kvp_gguf_find_key(g, keys[k]);
        if (i < 0 || g->kv[i].type != KVP_GGUF_ARRAY || (k > 0 && g->kv[i].count != n))
            return kvp_err_set(err, KVP_EFORMAT, "'%s' missing or of the wrong length", keys[k]);
        kv[k] = &g->kv[i];
        n = kv[0]->count;
    }
    if (n < KVP_TVOCAB_BYTE0 + 256 || n > 65536)
        return kvp_err_set(err, KVP_EFORMAT, "vocabulary of %llu tokens", (unsigned long long)n);
    const char **text = calloc(n, sizeof(*text));
    char **copies = calloc(n, sizeof(*copies));
    size_t *len = calloc(n, sizeof(*len));
    float *score = calloc(n, sizeof(*score));
    int32_t *type = calloc(n, sizeof(*type));
    int rc = 0;
    if (!text || !copies || !len || !score || !type)
        rc = kvp_err_set(err, KVP_ENOMEM, "vocabulary");
    for (uint64_t i = 0; i < n && rc == 0; i++) {
        const char *s;
        double sc;
        int64_t ty;
        if (kvp_gguf_arr_str(kv[0], i, &s, &len[i]) || len[i] > 256 ||
            kvp_gguf_arr_float(kv[1], i, &sc) || kvp_gguf_arr_int(kv[2], i, &ty) || ty < 0 ||
            ty > 6) {
            rc = kvp_err_set(err, KVP_EFORMAT, "vocabulary token %llu", (unsigned long long)i);
            break;
        }
        if (!(copies[i] = malloc(len[i] + 1))) {
            rc = kvp_err_set(err, KVP_ENOMEM, "vocabulary");
            break;
        }
        memcpy(copies[i], s, len[i]);
        copies[i][len[i]] = 0;
        text[i] = copies[i];
        score[i] = (float)sc;
        type[i] = (int32_t)ty;
    }
    if (rc == 0)
        rc = kvp_tvocab_create((int)n, text, len, score, type, out, err);
    for (uint64_t i = 0; copies && i < n; i++)
        free(copies[i]);
    free(copies);
    free(text);
    free(len);
    free(score);
    free(type);
    return rc;
}

int kvp_train_import_gguf(const char *path, int n_ctx, float rope_base, long cap_tokens,
                          int n_threads, struct kvp_train_model **mout, struct kvp_tvocab **vout,
                          struct kvp_err *err)
{
    struct kvp_gguf *g;
    int rc = kvp_gguf_open(path, &g, err);
    if (rc < 0)
        return rc;
    struct kvp_train_config cfg;
    struct kvp_train_model *m = NULL;
    struct kvp_tvocab *v = NULL;
    if ((rc = import_config(g, &cfg, err)) < 0 || (rc = import_vocab(g, &v, err)) < 0)
        goto fail;
    cfg.n_vocab = v->n;
    if (n_ctx > 0)
        cfg.n_ctx = n_ctx;
    if (rope_base > 0.0f)
        cfg.rope_base = rope_base;
    if ((rc = kvp_train_config_check(&cfg, err)) < 0 ||
        (rc = kvp_train_model_init(&m, &cfg, cap_tokens, n_threads, 0, err)) < 0)
        goto fail;
    if (g->n_tensors != (uint64_t)m->n_tensors) {
        rc = kvp_err_set(err, KVP_EFORMAT, "%llu tensors, the configuration has %d",
                         (unsigned long long)g->n_tensors, m->n_tensors);
        goto fail;
    }
    for (int i = 0; i < m->n_tensors; i++) {
        const struct kvp_train_tensor *t = &m->tensors[i];
        const struct kvp_gguf_tensor *gt = kvp_gguf_find_tensor(g, t->name);
        size_t n = (size_t)t->ne[0] * (size_t)t->ne[1];
        if (!gt || gt->type != KVP_TYPE_F32 || gt->ne[0] != t->ne[0] ||
            gt->ne[1] != (t->n_dims == 2 ? t->ne[1] : 1) || gt->nbytes != n * sizeof(float)) {
            rc = kvp_err_set(err, KVP_EFORMAT, "tensor %s: missing, not F32 or not [%lld, %lld]",
                             t->name, (long long)t->ne[0], (long long)t->ne[1]);
            goto fail;
        }
        memcpy(m->params + t->off, gt->data, gt->nbytes);
    }
    kvp_gguf_close(g);
    *mout = m;
    *vout = v;
    return 0;
fail:
    kvp_train_model_free(m);
    kvp_tvocab_free(v);
    kvp_gguf_close(g);
    return err ? kvp_err_prefix(err, "%s", path) : rc;
}
