/*
 * GGUF export of a trained model: architecture `llama`, every tensor F32, the hyper-parameter
 * keys of formats.md §2.2 and the tokenizer in SentencePiece form (§2.3, §5.2), so the engine
 * loads it like any Llama 2-style file. Shapes follow §3.1–3.2: a weight [out][in] row-major is
 * written with ne = [in, out]; output.weight is omitted when tied to token_embd. Q and K rows are
 * already in the adjacent-pair (NORM) order the engine's `llama` RoPE expects, because the
 * trainer rotates adjacent pairs itself; no permutation is needed.
 */
#include <string.h>

#include "model/gguf.h"
#include "train/train.h"

static int add_vocab(struct kvp_gguf_writer *w, const struct kvp_tvocab *v)
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
    bad |= add_vocab(w, v);
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
