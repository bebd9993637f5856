/*
 * Model loading: GGUF (architectures `llama`, `qwen2`, `qwen3`, `phi3`, `gemma2`,
 * `gemma3`) and llama2.c checkpoints into struct kvp_model.
 *
 * Every tensor the forward pass reads is looked up by its GGUF name, and its type and shape are
 * checked against the hyperparameters before any pointer into the file is kept, so the forward
 * pass never needs to check bounds. Weights stay in the read-only mapping.
 */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "kernels/types.h"
#include "gguf/gguf.h"
#include "model/llama2c.h"
#include "tokenizer/chat.h"
#include "tokenizer/vocab.h"

/* ---- GGUF --------------------------------------------------------------------------------- */

static int get_hparam(const struct kvp_gguf *g, const char *arch, const char *suffix, bool required,
                      int64_t dflt, int64_t min, int64_t max, int *out, struct kvp_err *err)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    int64_t v;
    int rc = kvp_gguf_get_int(g, key, &v, err);
    if (rc == KVP_ENOTFOUND) {
        if (required)
            return kvp_err_set(err, KVP_EFORMAT, "missing required key %s", key);
        v = dflt;
    } else if (rc < 0) {
        /* per-layer arrays (allowed by the spec) are not supported yet */
        return kvp_err_set(err, KVP_EUNSUPPORTED, "key %s: %s", key, err ? err->msg : "bad type");
    }
    if (v < min || v > max)
        return kvp_err_set(err, KVP_EFORMAT, "key %s = %lld out of range %lld..%lld", key,
                           (long long)v, (long long)min, (long long)max);
    *out = (int)v;
    return 0;
}

static int get_fparam(const struct kvp_gguf *g, const char *arch, const char *suffix, bool required,
                      double dflt, double min, double max, float *out, struct kvp_err *err)
{
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    double v;
    int rc = kvp_gguf_get_float(g, key, &v, err);
    if (rc == KVP_ENOTFOUND) {
        if (required)
            return kvp_err_set(err, KVP_EFORMAT, "missing required key %s", key);
        v = dflt;
    } else if (rc < 0) {
        return rc;
    }
    if (!(v >= min && v <= max))
        return kvp_err_set(err, KVP_EFORMAT, "key %s = %g out of range", key, v);
    *out = (float)v;
    return 0;
}

/* Look up a 2-D weight [rows][cols] and check its type and shape. */
static int bind_mat(const struct kvp_gguf *g, const char *name, int64_t cols, int64_t rows,
                    struct kvp_mat *m, struct kvp_err *err)
{
    const struct kvp_gguf_tensor *t = kvp_gguf_find_tensor(g, name);
    if (!t)
        return kvp_err_set(err, KVP_EFORMAT, "missing tensor %s", name);
    const struct kvp_type_traits *tt = kvp_type_traits((int)t->type);
    if (!tt || !tt->supported)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor %s: type %s is not supported yet", name,
                           tt ? tt->name : "unknown");
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return kvp_err_set(err, KVP_EFORMAT,
                           "tensor %s: shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                           (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                           (long long)t->ne[3], (long long)cols, (long long)rows);
    m->type = (int)t->type;
    m->cols = cols;
    m->rows = rows;
    if (!kvp_type_row_bytes(m->type, cols, &m->row_bytes))
        return kvp_err_set(err, KVP_EFORMAT, "tensor %s: bad row size", name);
    m->data = t->data;
    return 0;
}

/* A fused weight (phi3's attn_qkv: q, k, v rows one after the other; its ffn_up: gate rows then
 * up rows) bound as views of consecutive rows: rows are quantized one by one, so each part is an
 * ordinary matrix of its own. c may be NULL (two parts). */
static int bind_fused(const struct kvp_gguf *g, const char *name, int64_t cols, int64_t rows_a,
                      int64_t rows_bc, struct kvp_mat *a, struct kvp_mat *b, struct kvp_mat *c,
                      struct kvp_err *err)
{
    struct kvp_mat all;
    int rc = bind_mat(g, name, cols, rows_a + rows_bc * (c ? 2 : 1), &all, err);
    if (rc < 0)
        return rc;
    struct kvp_mat *parts[3] = {a, b, c};
    int64_t rows[3] = {rows_a, rows_bc, rows_bc}, r0 = 0;
    for (int i = 0; i < 3 && parts[i]; i++) {
        *parts[i] = all;
        parts[i]->rows = rows[i];
        parts[i]->data = (const uint8_t *)all.data + (size_t)r0 * all.row_bytes;
        r0 += rows[i];
    }
    return 0;
}

/* Look up a 1-D F32 vector of length n (norm weights are always F32). */
static int bind_vec(const struct kvp_gguf *g, const char *name, int64_t n, const float **out,
                    struct kvp_err *err)
{
    const struct kvp_gguf_tensor *t = kvp_gguf_find_tensor(g, name);
    if (!t)
        return kvp_err_set(err, KVP_EFORMAT, "missing tensor %s", name);
    if (t->type != KVP_TYPE_F32)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "tensor %s: type %s, expected F32", name,
                           kvp_type_name((int)t->type));
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return kvp_err_set(err, KVP_EFORMAT, "tensor %s: length %lld, expected %lld", name,
                           (long long)t->ne[0], (long long)n);
    if (((uintptr_t)t->data & 3) != 0)
        return kvp_err_set(err, KVP_EFORMAT, "tensor %s: misaligned data", name);
    *out = t->data;
    return 0;
}

/* RoPE scaling (rope.scaling.*, as llama.cpp's converter writes it): "linear" (or an older
 * scale_linear key) multiplies every angle by 1/factor; "yarn" mixes scaled and unscaled angles
 * per dimension and scales cos and sin (model/rope.h). Other types (longrope without its
 * factor tensors, ...) are refused rather than silently run wrong. */
static int load_rope_scaling(const struct kvp_gguf *g, const char *arch, struct kvp_hparams *hp,
                             struct kvp_err *err)
{
    char key[128];
    hp->rope_freq_scale = 1.0f;
    hp->rope_scaling = KVP_ROPE_SCALING_NONE;
    hp->n_ctx_orig = hp->n_ctx_train;
    hp->rope_attn_factor = 1.0f;
    hp->yarn_beta_fast = 32.0f; /* llama.cpp's defaults (not stored in most files) */
    hp->yarn_beta_slow = 1.0f;
    const char *stype = NULL;
    size_t slen = 0;
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    bool has_type = kvp_gguf_get_str(g, key, &stype, &slen, NULL) == 0;
    double factor = 0;
    snprintf(key, sizeof(key), "%s.rope.scaling.factor", arch);
    if (kvp_gguf_get_float(g, key, &factor, NULL) != 0) {
        snprintf(key, sizeof(key), "%s.rope.scale_linear", arch);
        kvp_gguf_get_float(g, key, &factor, NULL);
    }
    /* read for LongRoPE (phi3 files declare no type) as well as YaRN */
    int rc;
    if ((rc = get_hparam(g, arch, "rope.scaling.original_context_length", false, hp->n_ctx_train,
                         1, 1 << 24, &hp->n_ctx_orig, err)) < 0 ||
        (rc = get_fparam(g, arch, "rope.scaling.attn_factor", false, 1.0, 1e-3, 1e3,
                         &hp->rope_attn_factor, err)) < 0)
        return rc;
    bool none = has_type && slen == 4 && !memcmp(stype, "none", 4);
    bool linear = !has_type || (slen == 6 && !memcmp(stype, "linear", 6));
    bool yarn = has_type && slen == 4 && !memcmp(stype, "yarn", 4);
    if (none || factor == 0.0 || (factor == 1.0 && !yarn))
        return 0;
    if (!linear && !yarn)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "RoPE scaling type '%.*s' is not supported",
                           (int)(slen < 32 ? slen : 32), stype);
    if (!(factor > 0 && factor < 1e6))
        return kvp_err_set(err, KVP_EFORMAT, "bad RoPE scaling factor %g", factor);
    hp->rope_freq_scale = (float)(1.0 / factor);
    hp->rope_scaling = linear ? KVP_ROPE_SCALING_LINEAR : KVP_ROPE_SCALING_YARN;
    if (linear)
        return 0;
    if ((rc = get_fparam(g, arch, "rope.scaling.yarn_beta_fast", false, 32.0, 1e-3, 1e6,
                         &hp->yarn_beta_fast, err)) < 0 ||
        (rc = get_fparam(g, arch, "rope.scaling.yarn_beta_slow", false, 1.0, 1e-3, 1e6,
                         &hp->yarn_beta_slow, err)) < 0)
        return rc;
    double log_mul = 0;
    snprintf(key, sizeof(key), "%s.rope.scaling.yarn_log_multiplier", arch);
    if (kvp_gguf_get_float(g, key, &log_mul, NULL) == 0 && log_mul != 0.0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "YaRN with a log multiplier is not supported");
    return 0;
}

/* Gemma 2 and 3 (llama.cpp's keys; the converter already stores Gemma's RMS norm weights as
 * 1 + w, so they multiply as everywhere else). Gemma 2 alternates local and global layers, the
 * even ones local; Gemma 3 has five local layers to each global one, a RoPE base of 10000 on
 * the local ones (llama.cpp's constant; rope.freq_base is the global layers'), q/k norms and
 * no soft-capping. Query scale: 1/sqrt(head_dim), except the 27B models (Gemma 2: 46 layers,
 * Gemma 3: 62), whose query_pre_attn_scalar is n_embd / n_head (llama.cpp picks it by the layer
 * count too). */
static int load_gemma(const struct kvp_gguf *g, const char *arch, struct kvp_hparams *hp,
                      struct kvp_err *err)
{
    int rc;
    bool g2 = hp->arch_id == KVP_ARCH_GEMMA2;
    hp->embd_scale = true;
    hp->gelu = true;
    hp->swa_period = g2 ? 2 : 6;
    if ((rc = get_hparam(g, arch, "attention.sliding_window", true, 0, 1, 1 << 24, &hp->n_swa,
                         err)) < 0)
        return rc;
    if (g2 && ((rc = get_fparam(g, arch, "attn_logit_softcapping", false, 0.0, 0.0, 1e6,
                                &hp->attn_softcap, err)) < 0 ||
               (rc = get_fparam(g, arch, "final_logit_softcapping", false, 0.0, 0.0, 1e6,
                                &hp->final_softcap, err)) < 0))
        return rc;
    if (!g2)
        hp->rope_base_local = 10000.0f;
    if ((g2 && hp->n_layer == 46) || (!g2 && hp->n_layer == 62)) /* Gemma 2 / Gemma 3 27B */
        hp->attn_scale = (float)(1.0 / sqrt((double)hp->n_embd / hp->n_head));
    return 0;
}

static int load_gguf_hparams(const struct kvp_gguf *g, struct kvp_model *m, struct kvp_err *err)
{
    const char *arch;
    size_t alen;
    if (kvp_gguf_get_str(g, "general.architecture", &arch, &alen, err) < 0)
        return kvp_err_set(err, KVP_EFORMAT, "missing key general.architecture");
    if (alen >= sizeof(m->arch))
        alen = sizeof(m->arch) - 1;
    memcpy(m->arch, arch, alen);
    m->arch[alen] = 0;
    static const struct {
        const char *name;
        int id;
    } archs[] = {{"llama", KVP_ARCH_LLAMA}, {"qwen2", KVP_ARCH_QWEN2}, {"qwen3", KVP_ARCH_QWEN3},
                  {"phi3", KVP_ARCH_PHI3},   {"gemma2", KVP_ARCH_GEMMA2},
                  {"gemma3", KVP_ARCH_GEMMA3}};
    m->hp.arch_id = -1;
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
        if (strcmp(m->arch, archs[i].name) == 0)
            m->hp.arch_id = archs[i].id;
    if (m->hp.arch_id < 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "architecture '%s' is not supported "
                           "(supported: llama, qwen2, qwen3, phi3, gemma2, gemma3)",
                           m->arch);
    const char *name;
    size_t nlen;
    if (kvp_gguf_get_str(g, "general.name", &name, &nlen, NULL) == 0) {
        if (nlen >= sizeof(m->name))
            nlen = sizeof(m->name) - 1;
        memcpy(m->name, name, nlen);
        m->name[nlen] = 0;
    }
    int64_t experts = 0;
    char key[96];
    snprintf(key, sizeof(key), "%s.expert_count", m->arch);
    if (kvp_gguf_get_int(g, key, &experts, NULL) == 0 && experts > 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "mixture-of-experts models are not supported");

    struct kvp_hparams *hp = &m->hp;
    const int big = 1 << 20;
    if (get_hparam(g, m->arch, "context_length", true, 0, 1, 1 << 24, &hp->n_ctx_train, err) ||
        get_hparam(g, m->arch, "embedding_length", true, 0, 1, big, &hp->n_embd, err) ||
        get_hparam(g, m->arch, "block_count", true, 0, 1, 4096, &hp->n_layer, err) ||
        get_hparam(g, m->arch, "feed_forward_length", true, 0, 1, big, &hp->n_ff, err) ||
        get_hparam(g, m->arch, "attention.head_count", true, 0, 1, 4096, &hp->n_head, err))
        return err ? err->code : KVP_EFORMAT;
    if (get_hparam(g, m->arch, "attention.head_count_kv", false, hp->n_head, 1, hp->n_head,
                   &hp->n_head_kv, err))
        return err ? err->code : KVP_EFORMAT;
    if (hp->n_head % hp->n_head_kv != 0)
        return kvp_err_set(err, KVP_EFORMAT, "head_count %d is not a multiple of head_count_kv %d",
                           hp->n_head, hp->n_head_kv);
    if (hp->n_embd % hp->n_head != 0)
        return kvp_err_set(err, KVP_EFORMAT, "embedding_length %d not divisible by head_count %d",
                           hp->n_embd, hp->n_head);
    int hd_default = hp->n_embd / hp->n_head;
    if (get_hparam(g, m->arch, "attention.key_length", false, hd_default, 1, 4096, &hp->head_dim,
                   err))
        return err ? err->code : KVP_EFORMAT;
    int vlen = 0, n_rot = 0;
    if (get_hparam(g, m->arch, "attention.value_length", false, hp->head_dim, 1, 4096, &vlen, err) ||
        get_hparam(g, m->arch, "rope.dimension_count", false, hp->head_dim, 1, 4096, &n_rot, err))
        return err ? err->code : KVP_EFORMAT;
    if (vlen != hp->head_dim)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "value_length %d != key_length %d", vlen,
                           hp->head_dim);
    if (n_rot != hp->head_dim)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "partial RoPE (dimension_count %d, head_dim %d) is not supported", n_rot,
                           hp->head_dim);
    if (n_rot != hp->head_dim && strcmp(m->arch, "qwen2") == 0)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "partial RoPE is not supported");
    if (hp->head_dim % 2 != 0)
        return kvp_err_set(err, KVP_EFORMAT, "head_dim %d is odd", hp->head_dim);
    if (get_fparam(g, m->arch, "attention.layer_norm_rms_epsilon", true, 0, 0, 1, &hp->norm_eps,
                   err) ||
        get_fparam(g, m->arch, "rope.freq_base", false, 10000.0, 1e-3, 1e12, &hp->rope_base, err))
        return err ? err->code : KVP_EFORMAT;
    int rc = load_rope_scaling(g, m->arch, hp, err);
    if (rc < 0)
        return rc;
    /* qwen2 and qwen3 rotate split halves; llama files were permuted by the converter to
     * adjacent pairs */
    hp->rope_style = hp->arch_id == KVP_ARCH_LLAMA ? KVP_ROPE_NORM : KVP_ROPE_NEOX;
    hp->attn_scale = (float)(1.0 / sqrt((double)hp->head_dim));
    hp->rope_base_local = hp->rope_base;
    if (hp->arch_id == KVP_ARCH_GEMMA2 || hp->arch_id == KVP_ARCH_GEMMA3) {
        if ((rc = load_gemma(g, m->arch, hp, err)) < 0)
            return rc;
        return 0;
    }
    /* a sliding window on every layer (some phi3 files declare one longer than any context)
     * is only run where it cannot take effect */
    int window = 0;
    if (hp->arch_id == KVP_ARCH_PHI3 &&
        get_hparam(g, m->arch, "attention.sliding_window", false, 0, 0, INT32_MAX, &window, err))
        return err ? err->code : KVP_EFORMAT;
    if (window > 0 && window < hp->n_ctx_train)
        return kvp_err_set(err, KVP_EUNSUPPORTED,
                           "a sliding window of %d tokens on every layer is not supported", window);
    return 0;
}

static int bind_gguf_weights(const struct kvp_gguf *g, struct kvp_model *m, struct kvp_err *err)
{
    const struct kvp_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    const struct kvp_gguf_tensor *emb = kvp_gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return kvp_err_set(err, KVP_EFORMAT, "missing tensor token_embd.weight");
    if (emb->ne[1] < 1 || emb->ne[1] > (1 << 24))
        return kvp_err_set(err, KVP_EFORMAT, "token_embd.weight: bad vocabulary size %lld",
                           (long long)emb->ne[1]);
    m->hp.n_vocab = (int)emb->ne[1];
    if (bind_mat(g, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->tok_embd, err) ||
        bind_vec(g, "output_norm.weight", hp->n_embd, &m->output_norm, err))
        return err ? err->code : KVP_EFORMAT;
    if (kvp_gguf_find_tensor(g, "output.weight")) {
        if (bind_mat(g, "output.weight", hp->n_embd, hp->n_vocab, &m->output, err))
            return err ? err->code : KVP_EFORMAT;
        m->tied_output = false;
    } else {
        m->output = m->tok_embd;
        m->tied_output = true;
    }
    if (kvp_gguf_find_tensor(g, "rope_freqs.weight") &&
        bind_vec(g, "rope_freqs.weight", hp->head_dim / 2, &m->rope_freqs, err))
        return err ? err->code : KVP_EFORMAT;
    /* LongRoPE (phi3): one set of frequency factors for contexts up to the original length, one
     * beyond; both or neither */
    if ((kvp_gguf_find_tensor(g, "rope_factors_short.weight") ||
         kvp_gguf_find_tensor(g, "rope_factors_long.weight")) &&
        (bind_vec(g, "rope_factors_short.weight", hp->head_dim / 2, &m->rope_factors_short, err) ||
         bind_vec(g, "rope_factors_long.weight", hp->head_dim / 2, &m->rope_factors_long, err)))
        return err ? err->code : KVP_EFORMAT;
    m->layers = calloc((size_t)hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for %d layers", hp->n_layer);
    for (int l = 0; l < hp->n_layer; l++) {
        struct kvp_layer_weights *L = &m->layers[l];
        char nm[KVP_GGUF_NAME_MAX];
#define NAME(s) (snprintf(nm, sizeof(nm), "blk.%d.%s", l, s), nm)
        bool fused = hp->arch_id == KVP_ARCH_PHI3;
        if (bind_vec(g, NAME("attn_norm.weight"), hp->n_embd, &L->attn_norm, err) ||
            (fused ? bind_fused(g, NAME("attn_qkv.weight"), hp->n_embd, q_dim, kv_dim, &L->wq,
                                &L->wk, &L->wv, err)
                   : bind_mat(g, NAME("attn_q.weight"), hp->n_embd, q_dim, &L->wq, err) ||
                         bind_mat(g, NAME("attn_k.weight"), hp->n_embd, kv_dim, &L->wk, err) ||
                         bind_mat(g, NAME("attn_v.weight"), hp->n_embd, kv_dim, &L->wv, err)) ||
            bind_mat(g, NAME("attn_output.weight"), q_dim, hp->n_embd, &L->wo, err) ||
            bind_vec(g, NAME("ffn_norm.weight"), hp->n_embd, &L->ffn_norm, err) ||
            (fused ? bind_fused(g, NAME("ffn_up.weight"), hp->n_embd, hp->n_ff, hp->n_ff,
                                &L->w_gate, &L->w_up, NULL, err)
                   : bind_mat(g, NAME("ffn_gate.weight"), hp->n_embd, hp->n_ff, &L->w_gate,
                              err) ||
                         bind_mat(g, NAME("ffn_up.weight"), hp->n_embd, hp->n_ff, &L->w_up, err)) ||
            bind_mat(g, NAME("ffn_down.weight"), hp->n_ff, hp->n_embd, &L->w_down, err))
            return err ? err->code : KVP_EFORMAT;
        bool qwen2 = hp->arch_id == KVP_ARCH_QWEN2;
        bool gemma = hp->arch_id == KVP_ARCH_GEMMA2 || hp->arch_id == KVP_ARCH_GEMMA3;
        if (gemma &&
            (bind_vec(g, NAME("post_attention_norm.weight"), hp->n_embd, &L->attn_post_norm,
                      err) ||
             bind_vec(g, NAME("post_ffw_norm.weight"), hp->n_embd, &L->ffn_post_norm, err)))
            return err ? err->code : KVP_EFORMAT;
        if ((hp->arch_id == KVP_ARCH_QWEN3 || hp->arch_id == KVP_ARCH_GEMMA3) &&
            (bind_vec(g, NAME("attn_q_norm.weight"), hp->head_dim, &L->q_norm, err) ||
             bind_vec(g, NAME("attn_k_norm.weight"), hp->head_dim, &L->k_norm, err)))
            return err ? err->code : KVP_EFORMAT;
        if ((qwen2 || kvp_gguf_find_tensor(g, NAME("attn_q.bias"))) &&
            (bind_vec(g, NAME("attn_q.bias"), q_dim, &L->bq, err) ||
             bind_vec(g, NAME("attn_k.bias"), kv_dim, &L->bk, err) ||
             bind_vec(g, NAME("attn_v.bias"), kv_dim, &L->bv, err)))
            return err ? err->code : KVP_EFORMAT;
        if (kvp_gguf_find_tensor(g, NAME("attn_output.bias")) &&
            bind_vec(g, NAME("attn_output.bias"), hp->n_embd, &L->bo, err))
            return err ? err->code : KVP_EFORMAT;
        if (kvp_gguf_find_tensor(g, NAME("ffn_gate.bias")) ||
            kvp_gguf_find_tensor(g, NAME("ffn_up.bias")) ||
            kvp_gguf_find_tensor(g, NAME("ffn_down.bias")))
            return kvp_err_set(err, KVP_EUNSUPPORTED, "feed-forward biases are not supported");
#undef NAME
    }
    return 0;
}

int kvp_model_from_gguf(struct kvp_gguf *g, struct kvp_model **out, struct kvp_err *err)
{
    struct kvp_model *m = calloc(1, sizeof(*m));
    if (!m) {
        kvp_gguf_close(g);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    m->gguf = g;
    int rc = load_gguf_hparams(g, m, err);
    if (rc < 0)
        goto fail;
    rc = bind_gguf_weights(g, m, err);
    if (rc < 0)
        goto fail;
    /* a file without tokenizer keys still runs on token ids (tests, converted tensors) */
    if (kvp_gguf_find_key(g, "tokenizer.ggml.model") < 0) {
        *out = m;
        return 0;
    }
    rc = kvp_vocab_load_gguf(g, &m->vocab, err);
    if (rc < 0)
        goto fail;
    if (kvp_vocab_n_tokens(m->vocab) > m->hp.n_vocab) {
        rc = kvp_err_set(err, KVP_EFORMAT, "tokenizer has %d tokens but the model only %d",
                         kvp_vocab_n_tokens(m->vocab), m->hp.n_vocab);
        goto fail;
    }
    *out = m;
    return 0;
fail:
    kvp_model_close(m);
    return rc;
}

/* ---- llama2.c ----------------------------------------------------------------------------- */

static struct kvp_mat f32_mat(const float *data, int64_t rows, int64_t cols)
{
    struct kvp_mat m = {.type = KVP_TYPE_F32, .cols = cols, .rows = rows,
                        .row_bytes = (size_t)cols * sizeof(float), .data = data};
    return m;
}

static int model_from_llama2c(struct kvp_llama2c *c, const char *path, struct kvp_model **out,
                              struct kvp_err *err)
{
    struct kvp_model *m = calloc(1, sizeof(*m));
    if (!m) {
        kvp_llama2c_close(c);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    m->l2c = c;
    snprintf(m->arch, sizeof(m->arch), "llama");
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof(m->name), "%s", base ? base + 1 : path);
    struct kvp_hparams *hp = &m->hp;
    hp->n_vocab = c->vocab_size;
    hp->n_embd = c->dim;
    hp->n_layer = c->n_layers;
    hp->n_head = c->n_heads;
    hp->n_head_kv = c->n_kv_heads;
    hp->head_dim = c->dim / c->n_heads;
    hp->n_ff = c->hidden_dim;
    hp->n_ctx_train = c->seq_len;
    hp->norm_eps = 1e-5f; /* llama2.c constants (docs/formats.md §6.1) */
    hp->rope_base = 10000.0f;
    hp->rope_style = KVP_ROPE_NORM;
    hp->rope_freq_scale = 1.0f;
    hp->arch_id = KVP_ARCH_LLAMA;
    hp->attn_scale = (float)(1.0 / sqrt((double)hp->head_dim));
    hp->rope_base_local = hp->rope_base;
    hp->n_ctx_orig = hp->n_ctx_train;
    hp->rope_attn_factor = 1.0f;
    int64_t d = hp->n_embd, kv = (int64_t)hp->n_head_kv * hp->head_dim, f = hp->n_ff;
    m->tok_embd = f32_mat(c->tok_embd, hp->n_vocab, d);
    m->output = f32_mat(c->wcls, hp->n_vocab, d);
    m->tied_output = c->shared_classifier;
    m->output_norm = c->rms_final;
    m->layers = calloc((size_t)hp->n_layer, sizeof(*m->layers));
    if (!m->layers) {
        kvp_model_close(m);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    for (int l = 0; l < hp->n_layer; l++) {
        struct kvp_layer_weights *L = &m->layers[l];
        L->attn_norm = c->rms_att + l * d;
        L->ffn_norm = c->rms_ffn + l * d;
        L->wq = f32_mat(c->wq + l * d * d, d, d);
        L->wk = f32_mat(c->wk + l * kv * d, kv, d);
        L->wv = f32_mat(c->wv + l * kv * d, kv, d);
        L->wo = f32_mat(c->wo + l * d * d, d, d);
        L->w_gate = f32_mat(c->w1 + l * f * d, f, d);
        L->w_down = f32_mat(c->w2 + l * d * f, d, f);
        L->w_up = f32_mat(c->w3 + l * f * d, f, d);
    }
    *out = m;
    return 0;
}

/* ---- public ------------------------------------------------------------------------------- */

int kvp_model_open(const char *path, const struct kvp_model_params *params, kvp_model **out,
                   struct kvp_err *err)
{
    if (!path || !out)
        return kvp_err_set(err, KVP_EINVAL, "model path missing");
    struct kvp_file_map probe;
    int rc = kvp_file_map(path, &probe, err);
    if (rc < 0)
        return rc;
    bool is_gguf = probe.size >= 4 && memcmp(probe.data, "GGUF", 4) == 0;
    kvp_file_unmap(&probe);
    struct kvp_model *m = NULL;
    if (is_gguf) {
        struct kvp_gguf *g;
        rc = kvp_gguf_load(path, params && params->no_mmap, &g, err);
        if (rc < 0)
            return kvp_err_prefix(err, "%s", path);
        rc = kvp_model_from_gguf(g, &m, err);
        if (rc < 0)
            return kvp_err_prefix(err, "%s", path);
        if (!m->name[0]) { /* no general.name: the file name stands for the model */
            const char *base = strrchr(path, '/');
            snprintf(m->name, sizeof(m->name), "%s", base ? base + 1 : path);
        }
        if (params && params->tokenizer_path) {
            /* an explicit tokenizer replaces the embedded one */
            struct kvp_vocab *v;
            rc = kvp_vocab_load_llama2c(params->tokenizer_path, m->hp.n_vocab, &v, err);
            if (rc < 0) {
                kvp_model_close(m);
                return rc;
            }
            kvp_vocab_free(m->vocab);
            m->vocab = v;
        }
    } else {
        struct kvp_llama2c *c;
        rc = kvp_llama2c_open(path, &c, err);
        if (rc < 0)
            return kvp_err_prefix(err, "%s", path);
        rc = model_from_llama2c(c, path, &m, err);
        if (rc < 0)
            return rc;
        if (params && params->tokenizer_path) {
            rc = kvp_vocab_load_llama2c(params->tokenizer_path, m->hp.n_vocab, &m->vocab, err);
            if (rc < 0) {
                kvp_model_close(m);
                return rc;
            }
        }
    }
    *out = m;
    return 0;
}

void kvp_model_close(kvp_model *m)
{
    if (!m)
        return;
    kvp_vocab_free(m->vocab);
    free(m->layers);
    kvp_gguf_close(m->gguf);
    kvp_llama2c_close(m->l2c);
    free(m);
}

static uint64_t mat_params(const struct kvp_mat *w)
{
    return (uint64_t)w->rows * (uint64_t)w->cols;
}

static uint64_t mat_bytes(const struct kvp_mat *w)
{
    return (uint64_t)w->rows * w->row_bytes;
}

void kvp_model_get_info(const kvp_model *m, struct kvp_model_info *info)
{
    const struct kvp_hparams *hp = &m->hp;
    memset(info, 0, sizeof(*info));
    info->arch = m->arch;
    info->name = m->name;
    info->n_vocab = hp->n_vocab;
    info->n_embd = hp->n_embd;
    info->n_layer = hp->n_layer;
    info->n_head = hp->n_head;
    info->n_head_kv = hp->n_head_kv;
    info->head_dim = hp->head_dim;
    info->n_ff = hp->n_ff;
    info->n_ctx_train = hp->n_ctx_train;
    info->norm_eps = hp->norm_eps;
    info->rope_base = hp->rope_base;
    info->tied_output = m->tied_output;
    uint64_t params = mat_params(&m->tok_embd) + (uint64_t)hp->n_embd;
    uint64_t bytes = mat_bytes(&m->tok_embd) + (uint64_t)hp->n_embd * 4;
    if (!m->tied_output) {
        params += mat_params(&m->output);
        bytes += mat_bytes(&m->output);
    }
    uint64_t per_type[KVP_TYPE_COUNT] = {0};
    for (int l = 0; l < hp->n_layer; l++) {
        const struct kvp_layer_weights *L = &m->layers[l];
        const struct kvp_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo,
                                        &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
            params += mat_params(mats[i]);
            bytes += mat_bytes(mats[i]);
            per_type[mats[i]->type] += mat_params(mats[i]);
        }
        params += 2 * (uint64_t)hp->n_embd;
        bytes += 8 * (uint64_t)hp->n_embd;
    }
    int best = KVP_TYPE_F32;
    for (int t = 0; t < KVP_TYPE_COUNT; t++)
        if (per_type[t] > per_type[best])
            best = t;
    info->n_params = params;
    info->weight_bytes = bytes;
    info->weight_type = best;
}

/* ---- tokenizer wrappers ------------------------------------------------------------------- */

int kvp_token_bos(const kvp_model *m)
{
    return m->vocab ? kvp_vocab_bos(m->vocab) : 1;
}

int kvp_token_eos(const kvp_model *m)
{
    return m->vocab ? kvp_vocab_eos(m->vocab) : 2;
}

bool kvp_token_is_eog(const kvp_model *m, int token)
{
    return m->vocab ? kvp_vocab_is_eog(m->vocab, token) : token == 2;
}

int kvp_tokenize(const kvp_model *m, const char *text, size_t len, bool add_bos, int32_t *ids,
                 size_t cap, size_t *n_out, struct kvp_err *err)
{
    if (!m->vocab)
        return kvp_err_set(err, KVP_EINVAL,
                           "this model has no tokenizer (llama2.c checkpoints need --tokenizer)");
    return kvp_vocab_encode(m->vocab, text, len, add_bos, false, ids, cap, n_out, err);
}

int kvp_tokenize_special(const kvp_model *m, const char *text, size_t len, bool add_bos,
                         bool parse_special, int32_t *ids, size_t cap, size_t *n_out,
                         struct kvp_err *err)
{
    if (!m->vocab)
        return kvp_err_set(err, KVP_EINVAL,
                           "this model has no tokenizer (llama2.c checkpoints need --tokenizer)");
    return kvp_vocab_encode(m->vocab, text, len, add_bos, parse_special, ids, cap, n_out, err);
}

/* The chat format each family's instruction-tuned models use (their templates' form). */
static int family_chat_format(int arch_id)
{
    switch (arch_id) {
    case KVP_ARCH_QWEN2:
    case KVP_ARCH_QWEN3:
        return KVP_CHAT_CHATML;
    case KVP_ARCH_PHI3:
        return KVP_CHAT_PHI3;
    case KVP_ARCH_GEMMA2:
    case KVP_ARCH_GEMMA3:
        return KVP_CHAT_GEMMA;
    default:
        return KVP_CHAT_PLAIN;
    }
}

int kvp_model_chat_format(const struct kvp_model *m)
{
    int fmt = m->gguf ? kvp_chat_detect_gguf(m->gguf) : KVP_CHAT_PLAIN;
    /* a file without a template (converted or synthetic): its family's format */
    if (fmt == KVP_CHAT_PLAIN && m->gguf &&
        kvp_gguf_find_key(m->gguf, "tokenizer.chat_template") < 0)
        fmt = family_chat_format(m->hp.arch_id);
    return fmt;
}

int kvp_chat_prompt(const kvp_model *m, const char *format_name, const char *system,
                    const char *user, char **text, size_t *len, struct kvp_err *err)
{
    int fmt;
    if (format_name) {
        fmt = kvp_chat_format_from_name(format_name);
        if (fmt < 0)
            return kvp_err_set(err, KVP_EINVAL, "unknown chat format '%s'", format_name);
    } else {
        fmt = kvp_model_chat_format(m);
    }
    struct kvp_chat_msg msgs[2];
    size_t n = 0;
    if (system)
        msgs[n++] = (struct kvp_chat_msg){.role = "system", .content = system};
    msgs[n++] = (struct kvp_chat_msg){.role = "user", .content = user};
    return kvp_chat_apply(fmt, msgs, n, true, text, len, err);
}

size_t kvp_token_to_piece(const kvp_model *m, int prev, int token, char *buf, size_t cap)
{
    if (!m->vocab)
        return 0;
    return kvp_vocab_piece(m->vocab, prev, token, buf, cap);
}
