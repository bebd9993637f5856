/*
 * Seed corpus generator for the fuzz targets (scripts/fuzz.sh runs it; nothing is checked in).
 *
 * `fuzz_seedgen DIR` writes DIR/gguf/: a small model-like GGUF with F32, F16 and Q8_0 tensors, a
 * vocab-only GGUF with no tensors, and one with a custom alignment and arrays of every element
 * type; and DIR/llama2c/: a tiny legacy llama2.c checkpoint and a tiny tokenizer.bin, each
 * prefixed by the 2-byte n_vocab that fuzz_llama2c reads first. All values are fixed, so the
 * corpus is the same on every run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/types.h"
#include "model/gguf.h"

static int write_bytes(const char *dir, const char *name, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static int save(struct kvp_gguf_writer *w, const char *dir, const char *name)
{
    uint8_t *buf;
    size_t n;
    struct kvp_err err;
    int rc = kvp_gguf_writer_to_memory(w, &buf, &n, &err);
    kvp_gguf_writer_free(w);
    if (rc < 0) {
        fprintf(stderr, "seedgen: %s: %s\n", name, err.msg);
        return rc;
    }
    rc = write_bytes(dir, name, buf, n);
    free(buf);
    return rc;
}

static int gguf_seeds(const char *dir)
{
    static float f32[64 * 2];
    static uint16_t f16[16];
    static uint8_t q8[2 * 34];
    for (int i = 0; i < 64 * 2; i++)
        f32[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 16; i++)
        f16[i] = kvp_f32_to_f16((float)i);
    kvp_quantize_row_q8_0_ref(f32, q8, 64);
    const char *toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81\x61", "b"};
    float scores[] = {0, 0, 0, -1, -2};
    int32_t types[] = {2, 3, 3, 1, 1};
    struct kvp_gguf_writer *w;
    struct kvp_err err;

    if (kvp_gguf_writer_init(&w, &err) < 0)
        return -1;
    kvp_gguf_writer_set_str(w, "general.architecture", "llama");
    kvp_gguf_writer_set_u32(w, "llama.block_count", 1);
    kvp_gguf_writer_set_u32(w, "llama.embedding_length", 64);
    kvp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 5);
    kvp_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, 5);
    int64_t ne_e[] = {64, 2}, ne_h[] = {16}, ne_q[] = {64};
    kvp_gguf_writer_add_tensor(w, "token_embd.weight", KVP_TYPE_F32, 2, ne_e, f32);
    kvp_gguf_writer_add_tensor(w, "output_norm.weight", KVP_TYPE_F16, 1, ne_h, f16);
    kvp_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", KVP_TYPE_Q8_0, 1, ne_q, q8);
    if (save(w, dir, "model.gguf") < 0)
        return -1;

    if (kvp_gguf_writer_init(&w, &err) < 0)
        return -1;
    kvp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 5);
    kvp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, 5);
    kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    kvp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (save(w, dir, "vocab.gguf") < 0)
        return -1;

    if (kvp_gguf_writer_init(&w, &err) < 0)
        return -1;
    kvp_gguf_writer_set_alignment(w, 64);
    uint8_t u8[] = {1, 2};
    int16_t i16[] = {-1, 1};
    uint64_t u64[] = {1, 2};
    double f64[] = {0.5, -0.5};
    bool bl[] = {true, false};
    kvp_gguf_writer_set_arr(w, "a.u8", KVP_GGUF_UINT8, u8, 2);
    kvp_gguf_writer_set_arr(w, "a.i16", KVP_GGUF_INT16, i16, 2);
    kvp_gguf_writer_set_arr(w, "a.u64", KVP_GGUF_UINT64, u64, 2);
    kvp_gguf_writer_set_arr(w, "a.f64", KVP_GGUF_FLOAT64, f64, 2);
    kvp_gguf_writer_set_arr(w, "a.bool", KVP_GGUF_BOOL, bl, 2);
    kvp_gguf_writer_set_scalar(w, "s.f64", KVP_GGUF_FLOAT64, &f64[0]);
    kvp_gguf_writer_set_scalar(w, "s.u16", KVP_GGUF_UINT16, &i16[1]);
    int64_t ne4[] = {2, 2, 2, 2};
    kvp_gguf_writer_add_tensor(w, "t4", KVP_TYPE_F32, 4, ne4, f32);
    kvp_gguf_writer_add_tensor(w, "t1", KVP_TYPE_F16, 1, ne_h, f16);
    return save(w, dir, "misc.gguf");
}

/* A legacy (headerless) llama2.c checkpoint: 7 int32 then the f32 arrays of run.c, shared
 * classifier. dim 8, hidden 16, 1 layer, 2 heads, vocab 4, seq_len 4. */
static int llama2c_seeds(const char *dir)
{
    const int32_t cfg[7] = {8, 16, 1, 2, 2, 4, 4};
    const size_t n_floats = 4 * 8 + 8 + 4 * 64 + 8 + 3 * 128 + 8 + 2 * 4 * 2;
    size_t n = 2 + sizeof(cfg) + n_floats * 4;
    uint8_t *buf = calloc(1, n);
    if (!buf)
        return -1;
    buf[0] = 4; /* n_vocab prefix for fuzz_llama2c */
    memcpy(buf + 2, cfg, sizeof(cfg));
    for (size_t i = 0; i < n_floats; i++) {
        float x = (float)(i % 5) * 0.25f;
        memcpy(buf + 2 + sizeof(cfg) + 4 * i, &x, 4);
    }
    int rc = write_bytes(dir, "legacy.bin", buf, n);
    free(buf);
    if (rc < 0)
        return rc;

    /* tokenizer.bin: max_token_length, then per token score, length, bytes */
    const char *toks[] = {"<unk>", "\n<s>\n", "\n</s>\n", " a"};
    uint8_t tb[256] = {4, 0};
    size_t pos = 2;
    int32_t maxlen = 6;
    memcpy(tb + pos, &maxlen, 4);
    pos += 4;
    for (int i = 0; i < 4; i++) {
        float score = -(float)i;
        int32_t len = (int32_t)strlen(toks[i]);
        memcpy(tb + pos, &score, 4);
        memcpy(tb + pos + 4, &len, 4);
        memcpy(tb + pos + 8, toks[i], (size_t)len);
        pos += 8 + (size_t)len;
    }
    return write_bytes(dir, "tokenizer.bin", tb, pos);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    char sub[4096];
    mkdir(argv[1], 0755);
    snprintf(sub, sizeof(sub), "%s/gguf", argv[1]);
    mkdir(sub, 0755);
    if (gguf_seeds(sub) < 0) {
        fprintf(stderr, "seedgen: cannot write GGUF seeds to %s\n", sub);
        return 1;
    }
    snprintf(sub, sizeof(sub), "%s/llama2c", argv[1]);
    mkdir(sub, 0755);
    if (llama2c_seeds(sub) < 0) {
        fprintf(stderr, "seedgen: cannot write llama2.c seeds to %s\n", sub);
        return 1;
    }
    return 0;
}
