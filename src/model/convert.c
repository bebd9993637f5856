/*
 * llama2.c → GGUF converter (see convert.h).
 *
 * The checkpoint stays mapped while the writer borrows pointers into it, so no weight is copied
 * before serialization. Each llama2.c array holds all layers back to back ([L][out][in]), and
 * layer i of it becomes tensor blk.i.* with ne = [in, out] (GGUF lists the innermost dimension
 * first, docs/formats.md §3.1): the row-major bytes are identical, only the name and
 * shape are new. llama2.c names the SwiGLU matrices w1 (gate), w3 (up) and w2 (down).
 *
 * Metadata follows what llama.cpp's converter writes for a Llama model (u32 counts, f32 epsilon
 * and RoPE base), with context_length = the checkpoint's seq_len, the length it was trained at.
 */
#include "model/convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/llama2c.h"
#include "tokenizer/vocab.h"

/* general.name: the file name without directory and extension ("stories260K"). */
static void model_name(const char *path, char *name, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    const char *dot = strrchr(base, '.');
    if (dot && dot != base)
        n = (size_t)(dot - base);
    if (n >= cap)
        n = cap - 1;
    memcpy(name, base, n);
    name[n] = 0;
    if (n == 0)
        snprintf(name, cap, "llama2c");
}

/* Add one F32 tensor: a vector [ne0] when ne1 == 0, else a matrix [ne0, ne1]. */
static int add(struct kvp_gguf_writer *w, const char *name, const float *data, int64_t ne0,
               int64_t ne1)
{
    int64_t ne[2] = {ne0, ne1};
    return kvp_gguf_writer_add_tensor(w, name, KVP_TYPE_F32, ne1 > 0 ? 2 : 1, ne, data);
}

/* Add layer l of a stacked [L][out][in] array (out == 0: [L][in] vectors) as
 * blk.l.<what>.weight. */
static int add_layer(struct kvp_gguf_writer *w, int l, const char *what, const float *stack,
                     int64_t in, int64_t out)
{
    char name[KVP_GGUF_NAME_MAX];
    snprintf(name, sizeof(name), "blk.%d.%s.weight", l, what);
    size_t per_layer = (size_t)in * (size_t)(out > 0 ? out : 1);
    return add(w, name, stack + (size_t)l * per_layer, in, out);
}

static int add_metadata(struct kvp_gguf_writer *w, const struct kvp_llama2c *m, const char *name)
{
    int rc;
    if ((rc = kvp_gguf_writer_set_str(w, "general.architecture", "llama")) < 0 ||
        (rc = kvp_gguf_writer_set_str(w, "general.name", name)) < 0 ||
        (rc = kvp_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)m->seq_len)) < 0 ||
        (rc = kvp_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)m->dim)) < 0 ||
        (rc = kvp_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)m->n_layers)) < 0 ||
        (rc = kvp_gguf_writer_set_u32(w, "llama.feed_forward_length",
                                      (uint32_t)m->hidden_dim)) < 0 ||
        (rc = kvp_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)m->n_heads)) < 0 ||
        (rc = kvp_gguf_writer_set_u32(w, "llama.attention.head_count_kv",
                                      (uint32_t)m->n_kv_heads)) < 0 ||
        (rc = kvp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f)) < 0 ||
        (rc = kvp_gguf_writer_set_u32(w, "llama.rope.dimension_count",
                                      (uint32_t)(m->dim / m->n_heads))) < 0 ||
        (rc = kvp_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f)) < 0 ||
        (rc = kvp_gguf_writer_set_u32(w, "general.file_type", 0)) < 0) /* all F32 */
        return rc;
    return 0;
}

static int add_tensors(struct kvp_gguf_writer *w, const struct kvp_llama2c *m)
{
    int64_t dim = m->dim, hid = m->hidden_dim, vocab = m->vocab_size;
    int64_t kv_dim = dim / m->n_heads * m->n_kv_heads;
    int rc;
    if ((rc = add(w, "token_embd.weight", m->tok_embd, dim, vocab)) < 0)
        return rc;
    for (int l = 0; l < m->n_layers; l++) {
        if ((rc = add_layer(w, l, "attn_norm", m->rms_att, dim, 0)) < 0 ||
            (rc = add_layer(w, l, "attn_q", m->wq, dim, dim)) < 0 ||
            (rc = add_layer(w, l, "attn_k", m->wk, dim, kv_dim)) < 0 ||
            (rc = add_layer(w, l, "attn_v", m->wv, dim, kv_dim)) < 0 ||
            (rc = add_layer(w, l, "attn_output", m->wo, dim, dim)) < 0 ||
            (rc = add_layer(w, l, "ffn_norm", m->rms_ffn, dim, 0)) < 0 ||
            (rc = add_layer(w, l, "ffn_gate", m->w1, dim, hid)) < 0 ||
            (rc = add_layer(w, l, "ffn_down", m->w2, hid, dim)) < 0 ||
            (rc = add_layer(w, l, "ffn_up", m->w3, dim, hid)) < 0)
            return rc;
    }
    if ((rc = add(w, "output_norm.weight", m->rms_final, dim, 0)) < 0)
        return rc;
    if (!m->shared_classifier && (rc = add(w, "output.weight", m->wcls, dim, vocab)) < 0)
        return rc;
    return 0;
}

int kvp_convert_llama2c(const char *bin_path, const char *tok_path, const char *out_path,
                        struct kvp_err *err)
{
    struct kvp_err scratch;
    if (!err)
        err = &scratch;
    if (!bin_path || !tok_path || !out_path)
        return kvp_err_set(err, KVP_EINVAL, "convert: checkpoint, tokenizer and output paths "
                                            "are required");
    struct kvp_llama2c *m = NULL;
    struct kvp_vocab *v = NULL;
    struct kvp_gguf_writer *w = NULL;
    char name[256];
    int rc;

    if ((rc = kvp_llama2c_open(bin_path, &m, err)) < 0)
        return rc;
    if ((rc = kvp_vocab_load_llama2c(tok_path, m->vocab_size, &v, err)) < 0)
        goto out_close_model;
    if ((rc = kvp_gguf_writer_init(&w, err)) < 0)
        goto out_free_vocab;
    model_name(bin_path, name, sizeof(name));
    if ((rc = add_metadata(w, m, name)) < 0 || (rc = kvp_vocab_write_gguf(v, w, err)) < 0 ||
        (rc = add_tensors(w, m)) < 0) {
        /* the writer remembers the first failing call; serializing reports it */
        uint8_t *buf = NULL;
        size_t size;
        if (kvp_gguf_writer_to_memory(w, &buf, &size, err) == 0)
            kvp_err_set(err, rc, "convert: cannot build the GGUF (%s)", kvp_strerror(rc));
        free(buf);
        goto out_free_writer;
    }
    rc = kvp_gguf_writer_write_file(w, out_path, err);

out_free_writer:
    kvp_gguf_writer_free(w);
out_free_vocab:
    kvp_vocab_free(v);
out_close_model:
    kvp_llama2c_close(m);
    return rc < 0 ? rc : 0;
}
