/* Fixtures of the fuzz targets (see fixtures.h). */
#include "fixtures.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/types.h"
#include "gguf/gguf.h"
#include "predictor/cnn.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"
#include "train/train.h"

int fz_write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* ---- vocabularies ---------------------------------------------------------------------------- */

/* About 48 KB of sentences drawn from a fixed word list: every multi-byte character below is seen
 * well over the trainer's 64 times, so it becomes a token and merges form across scripts. */
static char *training_text(size_t *len)
{
    static const char *const words[] = {
        "the", "a", "quiet", "river", "runs", "past", "old", "mill", "and", "village", "sleeps",
        "grass", "is", "green", "sky", "blue", "passkey", "number", "remember", "it", "there",
        "café", "naïve", "über", "straße", "fiancée", "año", "déjà", "vu", "Zürich", "São",
        "привет", "мир", "дом", "日本語", "東京", "中文", "你好", "emoji", "🙂", "🚀", "ok",
        "12", "345", "(x)", "x+y", "don't", "it's", "\"quoted\"", "end."};
    const size_t n_words = sizeof(words) / sizeof(words[0]);
    size_t cap = 56 * 1024, n = 0;
    char *t = malloc(cap);
    if (!t)
        return NULL;
    uint32_t s = 12345;
    while (n < 48 * 1024) {
        const char *w = words[lcg(&s) % n_words];
        size_t wl = strlen(w);
        memcpy(t + n, w, wl);
        n += wl;
        uint32_t r = lcg(&s) % 16;
        t[n++] = r == 0 ? '\n' : r == 1 ? '.' : ' ';
    }
    *len = n;
    return t;
}

struct kvp_tvocab *fz_tvocab(void)
{
    size_t len;
    char *text = training_text(&len);
    struct kvp_tvocab *tv = NULL;
    struct kvp_err err = {0};
    if (!text || kvp_tvocab_learn(text, len, 700, &tv, &err) < 0) {
        fprintf(stderr, "fixtures: training the vocabulary failed: %s\n", err.msg);
        tv = NULL;
    }
    free(text);
    return tv;
}

/* Serialize w, open it as GGUF and read its vocabulary. Frees w. */
static struct kvp_vocab *vocab_through_gguf(struct kvp_gguf_writer *w)
{
    uint8_t *buf = NULL;
    size_t size = 0;
    struct kvp_gguf *g = NULL;
    struct kvp_vocab *v = NULL;
    struct kvp_err err = {0};
    if (kvp_gguf_writer_to_memory(w, &buf, &size, &err) < 0 ||
        kvp_gguf_open_memory(buf, size, &g, &err) < 0 || kvp_vocab_load_gguf(g, &v, &err) < 0) {
        fprintf(stderr, "fixtures: vocabulary through GGUF failed: %s\n", err.msg);
        v = NULL;
    }
    kvp_gguf_close(g);
    free(buf);
    kvp_gguf_writer_free(w);
    return v;
}

struct kvp_vocab *fz_spm_vocab(const struct kvp_tvocab *tv)
{
    struct kvp_gguf_writer *w;
    if (!tv || kvp_gguf_writer_init(&w, NULL) < 0)
        return NULL;
    /* the tokenizer keys of every model the trainer exports */
    int rc = kvp_train_gguf_add_vocab(w, tv);
    if (rc) {
        kvp_gguf_writer_free(w);
        return NULL;
    }
    return vocab_through_gguf(w);
}

/* Byte-mapped form of raw bytes s[0..n) into out (room for 2n + 1); returns its length. */
static size_t byte_map(const char *s, size_t n, char *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += kvp_utf8_encode(kvp_byte_to_cp((uint8_t)s[i]), out + m);
    out[m] = 0;
    return m;
}

struct bpe_build {
    char **text; /* byte-mapped token texts */
    size_t *len;
    char **raw; /* raw bytes of each token (for splitting) */
    size_t *raw_len;
    int32_t *type;
    int n;
    char **merge;
    int n_merge;
};

static int bb_find_raw(const struct bpe_build *b, const char *s, size_t n)
{
    for (int i = 0; i < b->n; i++)
        if (b->type[i] == KVP_TOKEN_NORMAL && b->raw_len[i] == n && !memcmp(b->raw[i], s, n))
            return i;
    return -1;
}

static int bb_add(struct bpe_build *b, const char *raw, size_t n, int32_t type)
{
    char *r = malloc(n + 1), *t = malloc(2 * n + 1);
    if (!r || !t) {
        free(r);
        free(t);
        return -1;
    }
    memcpy(r, raw, n);
    r[n] = 0;
    if (type == KVP_TOKEN_NORMAL) {
        b->len[b->n] = byte_map(raw, n, t);
    } else { /* special tokens are stored as written */
        memcpy(t, raw, n + 1);
        b->len[b->n] = n;
    }
    b->raw[b->n] = r;
    b->raw_len[b->n] = n;
    b->text[b->n] = t;
    b->type[b->n] = type;
    return b->n++;
}

static void bb_free(struct bpe_build *b)
{
    for (int i = 0; i < b->n; i++) {
        free(b->text[i]);
        free(b->raw[i]);
    }
    for (int i = 0; i < b->n_merge; i++)
        free(b->merge[i]);
    free(b->text);
    free(b->len);
    free(b->raw);
    free(b->raw_len);
    free(b->type);
    free(b->merge);
}

struct kvp_vocab *fz_bpe_vocab(const struct kvp_tvocab *tv, const char *pre)
{
    if (!tv)
        return NULL;
    int cap = 256 + tv->n + 2;
    struct bpe_build b = {0};
    b.text = calloc((size_t)cap, sizeof(char *));
    b.len = calloc((size_t)cap, sizeof(size_t));
    b.raw = calloc((size_t)cap, sizeof(char *));
    b.raw_len = calloc((size_t)cap, sizeof(size_t));
    b.type = calloc((size_t)cap, sizeof(int32_t));
    b.merge = calloc((size_t)cap, sizeof(char *));
    struct kvp_vocab *v = NULL;
    if (!b.text || !b.len || !b.raw || !b.raw_len || !b.type || !b.merge)
        goto out;
    for (int c = 0; c < 256; c++) { /* every byte, in byte order */
        char ch = (char)c;
        if (bb_add(&b, &ch, 1, KVP_TOKEN_NORMAL) < 0)
            goto out;
    }
    for (int i = 0; i < tv->n; i++) {
        if (tv->type[i] != KVP_TOKEN_NORMAL)
            continue;
        char raw[256];
        size_t n = 0;
        for (size_t j = 0; j < tv->len[i] && n < sizeof(raw);) { /* U+2581 back to a space */
            if (tv->len[i] - j >= 3 && !memcmp(tv->text[i] + j, "\xe2\x96\x81", 3)) {
                raw[n++] = ' ';
                j += 3;
            } else {
                raw[n++] = tv->text[i][j++];
            }
        }
        if (n < 2 || bb_find_raw(&b, raw, n) >= 0)
            continue;
        int split = -1;
        for (size_t k = 1; k < n && split < 0; k++)
            if (bb_find_raw(&b, raw, k) >= 0 && bb_find_raw(&b, raw + k, n - k) >= 0)
                split = (int)k;
        if (split < 0)
            continue; /* no merge could reach it */
        int l = bb_find_raw(&b, raw, (size_t)split), r = bb_find_raw(&b, raw + split, n - split);
        size_t ml = b.len[l] + 1 + b.len[r];
        char *m = malloc(ml + 1);
        if (!m)
            goto out;
        memcpy(m, b.text[l], b.len[l]);
        m[b.len[l]] = ' ';
        memcpy(m + b.len[l] + 1, b.text[r], b.len[r] + 1);
        b.merge[b.n_merge++] = m;
        if (bb_add(&b, raw, n, KVP_TOKEN_NORMAL) < 0)
            goto out;
    }
    int eot = bb_add(&b, "<|endoftext|>", 13, KVP_TOKEN_CONTROL);
    if (eot < 0 || bb_add(&b, FZ_BPE_USER_TOKEN, strlen(FZ_BPE_USER_TOKEN),
                          KVP_TOKEN_USER_DEFINED) < 0)
        goto out;

    struct kvp_gguf_writer *w;
    if (kvp_gguf_writer_init(&w, NULL) < 0)
        goto out;
    int rc = 0;
    rc |= kvp_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    rc |= kvp_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    rc |= kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)b.text,
                                      b.len, (size_t)b.n);
    rc |= kvp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", b.type, (size_t)b.n);
    rc |= kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)b.merge,
                                      NULL, (size_t)b.n_merge);
    rc |= kvp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)eot);
    rc |= kvp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eot);
    if (rc) {
        kvp_gguf_writer_free(w);
        goto out;
    }
    v = vocab_through_gguf(w); /* borrows b's strings until serialized */
out:
    bb_free(&b);
    return v;
}

/* ---- a tiny model and predictor ------------------------------------------------------------ */

enum { TM_VOCAB = 32, TM_EMBD = 16, TM_LAYER = 3, TM_HEAD = 2, TM_HEAD_KV = 1, TM_FF = 32 };

kvp_model *fz_tiny_model(void)
{
    const int hd = TM_EMBD / TM_HEAD, kvd = TM_HEAD_KV * hd;
    struct kvp_gguf_writer *w;
    if (kvp_gguf_writer_init(&w, NULL) < 0)
        return NULL;
    kvp_gguf_writer_set_str(w, "general.architecture", "llama");
    kvp_gguf_writer_set_str(w, "general.name", "fuzz tiny");
    kvp_gguf_writer_set_u32(w, "llama.context_length", 256);
    kvp_gguf_writer_set_u32(w, "llama.embedding_length", TM_EMBD);
    kvp_gguf_writer_set_u32(w, "llama.block_count", TM_LAYER);
    kvp_gguf_writer_set_u32(w, "llama.feed_forward_length", TM_FF);
    kvp_gguf_writer_set_u32(w, "llama.attention.head_count", TM_HEAD);
    kvp_gguf_writer_set_u32(w, "llama.attention.head_count_kv", TM_HEAD_KV);
    kvp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    /* one pool of random weights backs every tensor (borrowed until written) */
    static float pool[TM_VOCAB * TM_EMBD + TM_LAYER * (4 * TM_EMBD * TM_EMBD + 3 * TM_EMBD * TM_FF)];
    static float ones[TM_EMBD];
    uint32_t s = 7;
    for (size_t i = 0; i < sizeof(pool) / sizeof(pool[0]); i++)
        pool[i] = ((float)(lcg(&s) & 0xffff) / 65535.0f - 0.5f) * 0.5f;
    for (int i = 0; i < TM_EMBD; i++)
        ones[i] = 1.0f;
    float *p = pool;
#define MAT(name, cols, rows)                                                                      \
    do {                                                                                           \
        int64_t ne_[2] = {cols, rows};                                                             \
        kvp_gguf_writer_add_tensor(w, name, KVP_TYPE_F32, 2, ne_, p);                              \
        p += (cols) * (rows);                                                                      \
    } while (0)
#define VEC(name)                                                                                  \
    do {                                                                                           \
        int64_t ne_[1] = {TM_EMBD};                                                                \
        kvp_gguf_writer_add_tensor(w, name, KVP_TYPE_F32, 1, ne_, ones);                           \
    } while (0)
    MAT("token_embd.weight", TM_EMBD, TM_VOCAB);
    for (int l = 0; l < TM_LAYER; l++) {
        char nm[64];
#define NAME(x) (snprintf(nm, sizeof(nm), "blk.%d." x, l), nm)
        VEC(NAME("attn_norm.weight"));
        MAT(NAME("attn_q.weight"), TM_EMBD, TM_EMBD);
        MAT(NAME("attn_k.weight"), TM_EMBD, kvd);
        MAT(NAME("attn_v.weight"), TM_EMBD, kvd);
        MAT(NAME("attn_output.weight"), TM_EMBD, TM_EMBD);
        VEC(NAME("ffn_norm.weight"));
        MAT(NAME("ffn_gate.weight"), TM_EMBD, TM_FF);
        MAT(NAME("ffn_up.weight"), TM_EMBD, TM_FF);
        MAT(NAME("ffn_down.weight"), TM_FF, TM_EMBD);
#undef NAME
    }
    VEC("output_norm.weight");
#undef MAT
#undef VEC
    char path[] = "/tmp/kvpred-fuzz-model-XXXXXX";
    int fd = mkstemp(path);
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    if (fd < 0 || close(fd) < 0 || kvp_gguf_writer_write_file(w, path, &err) < 0 ||
        kvp_model_open(path, NULL, &m, &err) < 0) {
        fprintf(stderr, "fixtures: tiny model: %s\n", fd < 0 ? "mkstemp failed" : err.msg);
        m = NULL;
    }
    kvp_gguf_writer_free(w);
    if (fd >= 0)
        unlink(path); /* weights stay mapped */
    return m;
}

int fz_write_predictor(const char *path, int block_size)
{
    return fz_write_predictor_ch(path, 1, block_size);
}

int fz_write_predictor_ch(const char *path, int cin, int block_size)
{
    struct kvp_cnn n;
    struct kvp_err err = {0};
    if (kvp_cnn_init_ch(&n, cin, 2, 2, 3, 4, block_size, &err) < 0)
        return -1;
    uint32_t s = 11;
    size_t np = kvp_cnn_n_params(&n);
    for (size_t i = 0; i < np; i++)
        n.params[i] = ((float)(lcg(&s) & 0xffff) / 65535.0f - 0.5f);
    kvp_cnn_prepare(&n);
    snprintf(n.meta.model, sizeof(n.meta.model), "fuzz tiny");
    n.meta.n_rec = 1;
    n.meta.rec_budget[0] = 64;
    n.meta.rec_rel[0] = 0.5f;
    int rc = kvp_cnn_save(&n, path, &err);
    if (rc < 0)
        fprintf(stderr, "fixtures: predictor: %s\n", err.msg);
    kvp_cnn_free(&n);
    return rc;
}
