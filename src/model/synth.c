/*
 * `kvpred synth` as a library function (see synth.h).
 *
 * Each weight row is drawn from its own counter-seeded generator (seed, tensor, row), so the
 * file does not depend on the thread count, then encoded with the type table's reference
 * quantizer (from_f32), the one `kvpred quantize` uses. Scaling: every matrix is uniform with
 * standard deviation 1/sqrt(cols), so a normalized input gives outputs of unit size; the two
 * matrices that add into the residual stream (attn_output, ffn_down) are further divided by
 * sqrt(2 · n_layer), as GPT-2 initializes them, so the stream grows by O(1) over the whole depth
 * and the logits stay finite. Norm weights are 1 and biases small.
 */
#include "model/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/err.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "kernels/types.h"
#include "gguf/gguf.h"
#include "model/quantize.h"
#include "tokenizer/vocab.h"

/* Shapes from each model's config.json (hidden_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings, rope_theta,
 * rms_norm_eps, tie_word_embeddings). Llama 3.x's rope scaling (rope_freqs) is not written: it
 * changes no shape and no cost. */
#define SHAPE(nm, ar, d, nl, nh, nkv, hd, ff, nv, ctx, base, eps, tie)                         \
    .name = nm, .arch = ar, .n_embd = d, .n_layer = nl, .n_head = nh, .n_head_kv = nkv,            \
    .head_dim = hd, .n_ff = ff, .n_vocab = nv, .n_ctx = ctx, .rope_base = base, .norm_eps = eps,   \
    .tied = tie
static const struct kvp_synth_shape shapes[] = {
    {SHAPE("SmolLM2-135M", "llama", 576, 30, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f, true)},
    {SHAPE("Qwen2.5-0.5B", "qwen2", 896, 24, 14, 2, 64, 4864, 151936, 32768, 1000000.0f, 1e-6f,
           true)},
    {SHAPE("Llama-3.2-1B", "llama", 2048, 16, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f,
           true)},
    {SHAPE("Llama-3.1-8B", "llama", 4096, 32, 32, 8, 128, 14336, 128256, 131072, 500000.0f, 1e-5f,
           false)},
    /* Qwen's model card extends Qwen2.5 to 128K by adding rope_scaling {"type": "yarn",
     * "factor": 4.0, "original_max_position_embeddings": 32768} to config.json */
    {SHAPE("Qwen2.5-0.5B-YaRN", "qwen2", 896, 24, 14, 2, 64, 4864, 151936, 131072, 1000000.0f,
           1e-6f, true),
     .rope_scaling = "yarn", .rope_factor = 4.0f, .n_ctx_orig = 32768},
    /* Phi-3.5-mini: LongRoPE from 4096 to 131072 tokens (rope_scaling.short_factor and
     * long_factor, 48 each); fused attn_qkv and gate-up in GGUF; a sliding window longer than
     * any context (llama.cpp requires the key) */
    {SHAPE("Phi-3.5-mini", "phi3", 3072, 32, 32, 32, 96, 8192, 32064, 131072, 10000.0f, 1e-5f,
           false),
     .rope_scaling = "longrope", .n_ctx_orig = 4096, .sliding_window = 262144},
    /* Gemma 2 2B: local (4096-token window) and global layers alternate, scores capped at 50
     * and logits at 30 (attn_logit_softcapping, final_logit_softcapping) */
    {SHAPE("Gemma-2-2B", "gemma2", 2304, 26, 8, 4, 256, 9216, 256000, 8192, 10000.0f, 1e-6f,
           true),
     .sliding_window = 4096, .attn_softcap = 50.0f, .final_softcap = 30.0f},
    /* Gemma 3 1B: five local layers (512-token window, RoPE base 10000) to each global one
     * (base 1e6) */
    {SHAPE("Gemma-3-1B", "gemma3", 1152, 26, 4, 1, 256, 6912, 262144, 32768, 1000000.0f, 1e-6f,
           true),
     .sliding_window = 512},
    {SHAPE("Qwen3-0.6B", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f,
           true)},
    {SHAPE("Qwen3-1.7B", "qwen3", 2048, 28, 16, 8, 128, 6144, 151936, 40960, 1000000.0f, 1e-6f,
           true)},
};
#undef SHAPE
#define N_SHAPES (int)(sizeof(shapes) / sizeof(shapes[0]))

const struct kvp_synth_shape *kvp_synth_find_shape(const char *name)
{
    for (int i = 0; name && i < N_SHAPES; i++)
        if (strcasecmp(name, shapes[i].name) == 0)
            return &shapes[i];
    return NULL;
}

const struct kvp_synth_shape *kvp_synth_shape_at(int i)
{
    return i >= 0 && i < N_SHAPES ? &shapes[i] : NULL;
}

/* ---- random numbers (splitmix64: core/rng.h) ---------------------------------------------- */

/* n values uniform in [-a, a) from the generator of (seed, tensor, row). */
static void fill_row(uint64_t seed, int tensor, int64_t row, float a, float *dst, int64_t n)
{
    uint64_t s = seed ^ ((uint64_t)tensor << 40) ^ (uint64_t)row * 0x2545F4914F6CDD1Dull;
    kvp_splitmix64(&s);
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(kvp_splitmix64(&s) >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
        dst[i] = (float)((2.0 * u - 1.0) * a);
    }
}

/* ---- tensors ------------------------------------------------------------------------------ */

struct gen_job {
    const struct kvp_type_traits *dst;
    uint64_t seed;
    int tensor;
    float a;        /* half-width of the uniform distribution; 0: all ones (norm weights) */
    float mean;     /* added to every value drawn (a > 0) */
    int64_t cols, rows;
    size_t row_bytes;
    uint8_t *out;   /* [rows][row_bytes] */
    float *scratch; /* [nth][cols] */
};

static void gen_rows(void *ctx, int ith, int nth)
{
    struct gen_job *j = ctx;
    long r0, r1;
    kvp_split_range((long)j->rows, ith, nth, &r0, &r1);
    float *row = j->scratch + (size_t)ith * (size_t)j->cols;
    for (long r = r0; r < r1; r++) {
        if (j->a == 0.0f)
            for (int64_t i = 0; i < j->cols; i++)
                row[i] = 1.0f;
        else
            fill_row(j->seed, j->tensor, r, j->a, row, j->cols);
        for (int64_t i = 0; j->a != 0.0f && j->mean != 0.0f && i < j->cols; i++)
            row[i] += j->mean;
        j->dst->from_f32(row, j->out + (size_t)r * j->row_bytes, j->cols);
    }
}

struct synth {
    const struct kvp_synth_params *p;
    struct kvp_gguf_writer *w;
    struct kvp_pool *pool;
    void **bufs; /* every tensor's data, freed after the file is written */
    int n_bufs, cap_bufs;
    uint64_t bytes;
};

/* Add a tensor of rows × cols (rows == 0: a vector of cols) with values uniform of mean `mean`
 * and standard deviation sd (sd 0: all ones). Matrices take the requested type (or its
 * fallback), vectors F32. */
static int add_tensor_mean(struct synth *S, const char *name, int64_t cols, int64_t rows,
                           double mean, double sd, struct kvp_err *err)
{
    int type = rows > 0 ? kvp_quantize_pick_type(S->p->type, cols) : KVP_TYPE_F32;
    const struct kvp_type_traits *tt = kvp_type_traits(type);
    int nth = kvp_pool_size(S->pool);
    struct gen_job j = {.dst = tt,
                        .seed = S->p->seed,
                        .tensor = S->n_bufs,
                        .a = (float)(sd * sqrt(3.0)),
                        .mean = (float)mean,
                        .cols = cols,
                        .rows = rows > 0 ? rows : 1};
    size_t total;
    if (!tt || !tt->from_f32 || !kvp_type_row_bytes(type, cols, &j.row_bytes) ||
        __builtin_mul_overflow(j.row_bytes, (size_t)j.rows, &total))
        return kvp_err_set(err, KVP_EINVAL, "synth: %s: no %s encoding for rows of %lld", name,
                           kvp_type_name(type), (long long)cols);
    if (S->n_bufs == S->cap_bufs) {
        int cap = S->cap_bufs ? 2 * S->cap_bufs : 64;
        void **nb = realloc(S->bufs, (size_t)cap * sizeof(*nb));
        if (!nb)
            return kvp_err_set(err, KVP_ENOMEM, "synth: out of memory");
        S->bufs = nb;
        S->cap_bufs = cap;
    }
    j.out = malloc(total);
    j.scratch = malloc((size_t)nth * (size_t)cols * sizeof(float));
    if (!j.out || !j.scratch) {
        free(j.out);
        free(j.scratch);
        return kvp_err_set(err, KVP_ENOMEM, "synth: %s: out of memory (%zu bytes)", name, total);
    }
    kvp_pool_run(S->pool, gen_rows, &j);
    free(j.scratch);
    S->bufs[S->n_bufs++] = j.out;
    S->bytes += total;
    int64_t ne[2] = {cols, rows};
    int rc = kvp_gguf_writer_add_tensor(S->w, name, type, rows > 0 ? 2 : 1, ne, j.out);
    if (rc < 0)
        return kvp_err_set(err, rc, "synth: cannot add %s (%s)", name, kvp_strerror(rc));
    return 0;
}

static int add_tensor(struct synth *S, const char *name, int64_t cols, int64_t rows, double sd,
                      struct kvp_err *err)
{
    return add_tensor_mean(S, name, cols, rows, 0.0, sd, err);
}

/* Which architectures have a tensor (bits of enum tensor_when). */
enum tensor_when {
    T_ALL = 1,      /* every architecture */
    T_SPLIT = 2,    /* separate q, k, v and gate, up (all but phi3) */
    T_FUSED = 4,    /* phi3's attn_qkv and gate-up ffn_up */
    T_BIAS = 8,     /* qwen2's q/k/v biases */
    T_QK_NORM = 16, /* qwen3's and gemma3's per-head q/k norms */
    T_POST_NORM = 32, /* Gemma's norms of the attention and feed-forward outputs */
};

static unsigned arch_tensors(const char *arch)
{
    if (strcmp(arch, "phi3") == 0)
        return T_ALL | T_FUSED;
    if (strcmp(arch, "qwen2") == 0)
        return T_ALL | T_SPLIT | T_BIAS;
    if (strcmp(arch, "qwen3") == 0)
        return T_ALL | T_SPLIT | T_QK_NORM;
    if (strcmp(arch, "gemma2") == 0)
        return T_ALL | T_SPLIT | T_POST_NORM;
    if (strcmp(arch, "gemma3") == 0)
        return T_ALL | T_SPLIT | T_QK_NORM | T_POST_NORM;
    return T_ALL | T_SPLIT;
}

static int add_layer(struct synth *S, const struct kvp_synth_shape *s, int l, int n_layer,
                     struct kvp_err *err)
{
    int64_t D = s->n_embd, q_dim = (int64_t)s->n_head * s->head_dim;
    int64_t kv_dim = (int64_t)s->n_head_kv * s->head_dim, F = s->n_ff;
    double resid = 1.0 / sqrt(2.0 * n_layer), in_sd = 1.0 / sqrt((double)D);
    /* rows 0: a vector of cols. Norm weights: all ones (sd 0), except the q/k norms, drawn
     * around 1, since weights of exactly 1 would hide a norm applied with the wrong ones. */
    const struct {
        const char *what;
        int64_t cols, rows;
        double mean, sd;
        unsigned when;
    } t[] = {
        {"attn_norm.weight", D, 0, 0, 0.0, T_ALL},
        {"attn_q.weight", D, q_dim, 0, in_sd, T_SPLIT},
        {"attn_k.weight", D, kv_dim, 0, in_sd, T_SPLIT},
        {"attn_v.weight", D, kv_dim, 0, in_sd, T_SPLIT},
        {"attn_qkv.weight", D, q_dim + 2 * kv_dim, 0, in_sd, T_FUSED},
        {"attn_q.bias", q_dim, 0, 0, 0.02, T_BIAS},
        {"attn_k.bias", kv_dim, 0, 0, 0.02, T_BIAS},
        {"attn_v.bias", kv_dim, 0, 0, 0.02, T_BIAS},
        {"attn_q_norm.weight", s->head_dim, 0, 1.0, 0.2, T_QK_NORM},
        {"attn_k_norm.weight", s->head_dim, 0, 1.0, 0.2, T_QK_NORM},
        {"attn_output.weight", q_dim, D, 0, resid / sqrt((double)q_dim), T_ALL},
        {"ffn_norm.weight", D, 0, 0, 0.0, T_ALL},
        {"ffn_gate.weight", D, F, 0, in_sd, T_SPLIT},
        {"ffn_up.weight", D, F, 0, in_sd, T_SPLIT},
        {"ffn_up.weight", D, 2 * F, 0, in_sd, T_FUSED}, /* gate rows, then up rows */
        {"ffn_down.weight", F, D, 0, resid / sqrt((double)F), T_ALL},
        {"post_attention_norm.weight", D, 0, 1.0, 0.2, T_POST_NORM},
        {"post_ffw_norm.weight", D, 0, 1.0, 0.2, T_POST_NORM},
    };
    unsigned has = arch_tensors(s->arch);
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        if (!(t[i].when & has))
            continue;
        char name[KVP_GGUF_NAME_MAX];
        snprintf(name, sizeof(name), "blk.%d.%s", l, t[i].what);
        /* Gemma files store every norm weight as 1 + w (the converter adds the 1): all of
         * them around 1, so that a norm applied with the wrong convention shows */
        bool norm_around1 = (has & T_POST_NORM) && t[i].rows == 0 && t[i].sd == 0.0;
        int rc = add_tensor_mean(S, name, t[i].cols, t[i].rows, norm_around1 ? 1.0 : t[i].mean,
                                 norm_around1 ? 0.2 : t[i].sd, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- metadata and tokenizer --------------------------------------------------------------- */

static int add_metadata(struct synth *S, const struct kvp_synth_shape *s, int n_layer)
{
    struct kvp_gguf_writer *w = S->w;
    char name[96], key[128];
    snprintf(name, sizeof(name), "synth %s", s->name);
    int rc = 0;
#define ARCH_U32(suffix, v)                                                                        \
    (snprintf(key, sizeof(key), "%s." suffix, s->arch), kvp_gguf_writer_set_u32(w, key, (v)))
#define ARCH_F32(suffix, v)                                                                        \
    (snprintf(key, sizeof(key), "%s." suffix, s->arch), kvp_gguf_writer_set_f32(w, key, (v)))
    if ((rc = kvp_gguf_writer_set_str(w, "general.architecture", s->arch)) < 0 ||
        (rc = kvp_gguf_writer_set_str(w, "general.name", name)) < 0 ||
        (rc = ARCH_U32("context_length", (uint32_t)s->n_ctx)) < 0 ||
        (rc = ARCH_U32("embedding_length", (uint32_t)s->n_embd)) < 0 ||
        (rc = ARCH_U32("block_count", (uint32_t)n_layer)) < 0 ||
        (rc = ARCH_U32("feed_forward_length", (uint32_t)s->n_ff)) < 0 ||
        (rc = ARCH_U32("attention.head_count", (uint32_t)s->n_head)) < 0 ||
        (rc = ARCH_U32("attention.head_count_kv", (uint32_t)s->n_head_kv)) < 0 ||
        (rc = ARCH_U32("attention.key_length", (uint32_t)s->head_dim)) < 0 ||
        (rc = ARCH_U32("attention.value_length", (uint32_t)s->head_dim)) < 0 ||
        (rc = ARCH_U32("rope.dimension_count", (uint32_t)s->head_dim)) < 0 ||
        (rc = ARCH_F32("rope.freq_base", s->rope_base)) < 0 ||
        (rc = ARCH_F32("attention.layer_norm_rms_epsilon", s->norm_eps)) < 0 ||
        (rc = ARCH_U32("vocab_size", (uint32_t)S->p->n_vocab)) < 0 ||
        (rc = kvp_gguf_writer_set_u32(w, "general.file_type", kvp_quantize_ftype(S->p->type))) <
            0)
        return rc;
    if (s->attn_softcap > 0 && ((rc = ARCH_F32("attn_logit_softcapping", s->attn_softcap)) < 0 ||
                                (rc = ARCH_F32("final_logit_softcapping", s->final_softcap)) < 0))
        return rc;
    if (s->sliding_window > 0 &&
        (rc = ARCH_U32("attention.sliding_window", (uint32_t)s->sliding_window)) < 0)
        return rc;
    if (s->rope_scaling && strcmp(s->rope_scaling, "longrope") == 0) {
        /* as llama.cpp's converter writes Phi-3.5: no type, the original context and the
         * attention factor sqrt(1 + ln(context / original) / ln(original)) */
        double f = sqrt(1.0 + log((double)s->n_ctx / s->n_ctx_orig) / log((double)s->n_ctx_orig));
        if ((rc = ARCH_U32("rope.scaling.original_context_length", (uint32_t)s->n_ctx_orig)) < 0 ||
            (rc = ARCH_F32("rope.scaling.attn_factor", (float)f)) < 0)
            return rc;
    } else if (s->rope_scaling) {
        snprintf(key, sizeof(key), "%s.rope.scaling.type", s->arch);
        if ((rc = kvp_gguf_writer_set_str(w, key, s->rope_scaling)) < 0 ||
            (rc = ARCH_F32("rope.scaling.factor", s->rope_factor)) < 0 ||
            (rc = ARCH_U32("rope.scaling.original_context_length", (uint32_t)s->n_ctx_orig)) < 0)
            return rc;
    }
#undef ARCH_U32
#undef ARCH_F32
    const struct kvp_type_traits *tt = kvp_type_traits(S->p->type);
    if (tt && tt->blck_size > 1)
        rc = kvp_gguf_writer_set_u32(w, "general.quantization_version", 2);
    return rc;
}

/* The control tokens of a family's chat format, which its real vocabulary has and which
 * llama.cpp looks up by text when it loads the architecture (phi3's <|end|>). */
static const char *const *arch_specials(const char *arch)
{
    static const char *const phi3[] = {"<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>",
                                       "<|system|>", NULL};
    static const char *const gemma[] = {"<start_of_turn>", "<end_of_turn>", NULL};
    if (strcmp(arch, "phi3") == 0)
        return phi3;
    if (strncmp(arch, "gemma", 5) == 0)
        return gemma;
    return NULL;
}

/* <unk>, <s>, </s>, the 256 byte tokens, the architecture's control tokens, then single characters and letter pairs (with and
 * without the U+2581 space mark) up to n tokens; scores favour earlier (shorter) pieces. */
static int make_vocab(int n, const char *const *specials, struct kvp_vocab **out,
                      struct kvp_err *err)
{
    char (*text)[16] = calloc((size_t)n, sizeof(*text));
    const char **texts = calloc((size_t)n, sizeof(*texts));
    size_t *lens = calloc((size_t)n, sizeof(*lens));
    float *scores = calloc((size_t)n, sizeof(*scores));
    int32_t *types = calloc((size_t)n, sizeof(*types));
    int rc;
    if (!text || !texts || !lens || !scores || !types) {
        rc = kvp_err_set(err, KVP_ENOMEM, "synth: out of memory");
        goto out;
    }
    static const char alpha[] = "etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789";
    const int na = (int)sizeof(alpha) - 1;
    int i = 0;
    snprintf(text[i], 16, "<unk>");
    types[i++] = KVP_TOKEN_UNKNOWN;
    snprintf(text[i], 16, "<s>");
    types[i++] = KVP_TOKEN_CONTROL;
    snprintf(text[i], 16, "</s>");
    types[i++] = KVP_TOKEN_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(text[i], 16, "<0x%02X>", b);
        types[i++] = KVP_TOKEN_BYTE;
    }
    for (int k = 0; specials && specials[k] && i < n; k++) {
        snprintf(text[i], 16, "%s", specials[k]);
        types[i++] = KVP_TOKEN_CONTROL;
    }
    /* then "▁", "▁x", "x", "▁xy", "xy", "▁xyz", ... in a fixed order until n */
    long k = -1;
    while (i < n) {
        char piece[16];
        long m = k++;
        int len = 0;
        if (m >= 0) {
            long span = na, base = 0;
            while (m - base >= 2 * span) { /* find the length: 2·na^len pieces of each */
                base += 2 * span;
                span *= na;
                len++;
            }
            long r = (m - base) / 2;
            bool mark = ((m - base) % 2) == 0;
            int o = 0;
            if (mark) {
                memcpy(piece, "\xE2\x96\x81", 3);
                o = 3;
            }
            for (int c = 0; c <= len; c++) {
                piece[o++] = alpha[r % na];
                r /= na;
            }
            piece[o] = 0;
        } else {
            memcpy(piece, "\xE2\x96\x81", 4);
        }
        snprintf(text[i], 16, "%s", piece);
        scores[i] = -(float)(i - 259);
        types[i++] = KVP_TOKEN_NORMAL;
    }
    for (i = 0; i < n; i++) {
        texts[i] = text[i];
        lens[i] = strlen(text[i]);
    }
    rc = kvp_vocab_create_spm(n, texts, lens, scores, types, 1, 2, 0, out, err);
out:
    free(text);
    free(texts);
    free(lens);
    free(scores);
    free(types);
    return rc;
}

/* ---- the file ----------------------------------------------------------------------------- */

int kvp_synth_write(const struct kvp_synth_shape *s, const struct kvp_synth_params *p,
                    const char *path, uint64_t *bytes_out, struct kvp_err *err)
{
    struct kvp_err scratch;
    if (!err)
        err = &scratch;
    if (!s || !p || !path)
        return kvp_err_set(err, KVP_EINVAL, "synth: shape, parameters and path required");
    const struct kvp_type_traits *tt = kvp_type_traits(p->type);
    if (kvp_quantize_pick_type(p->type, s->n_embd) < 0 || !tt || !tt->supported)
        return kvp_err_set(err, KVP_EINVAL, "synth: %s is not a weight type",
                           kvp_type_name(p->type));
    if (p->n_vocab < KVP_SYNTH_MIN_VOCAB || p->n_vocab > 1 << 20)
        return kvp_err_set(err, KVP_EINVAL, "synth: vocabulary of %d tokens (must be %d .. %d)",
                           p->n_vocab, KVP_SYNTH_MIN_VOCAB, 1 << 20);
    int n_layer = p->n_layer > 0 ? p->n_layer : s->n_layer;
    struct synth S = {.p = p};
    struct kvp_vocab *v = NULL;
    int rc;
    if ((rc = make_vocab(p->n_vocab, arch_specials(s->arch), &v, err)) < 0)
        return rc;
    if ((rc = kvp_pool_init(p->n_threads > 0 ? p->n_threads : 1, &S.pool, err)) < 0)
        goto out_vocab;
    if ((rc = kvp_gguf_writer_init(&S.w, err)) < 0)
        goto out_pool;
    if ((rc = add_metadata(&S, s, n_layer)) < 0 || (rc = kvp_vocab_write_gguf(v, S.w, err)) < 0) {
        rc = kvp_err_set(err, rc, "synth: cannot write the metadata (%s)", kvp_strerror(rc));
        goto out_writer;
    }
    double emb_sd = 1.0 / sqrt((double)s->n_embd); /* tied: logits of unit size too */
    if ((rc = add_tensor(&S, "token_embd.weight", s->n_embd, p->n_vocab, emb_sd, err)) < 0)
        goto out_writer;
    /* LongRoPE's factors divide each pair's frequency: short ones near 1, long ones larger
     * (the real ones grow from 1 to tens over the pairs) */
    if (s->rope_scaling && strcmp(s->rope_scaling, "longrope") == 0 &&
        ((rc = add_tensor_mean(&S, "rope_factors_short.weight", s->head_dim / 2, 0, 1.0, 0.05,
                               err)) < 0 ||
         (rc = add_tensor_mean(&S, "rope_factors_long.weight", s->head_dim / 2, 0, 4.0, 1.0,
                               err)) < 0))
        goto out_writer;
    for (int l = 0; l < n_layer; l++)
        if ((rc = add_layer(&S, s, l, n_layer, err)) < 0)
            goto out_writer;
    if ((rc = add_tensor(&S, "output_norm.weight", s->n_embd, 0, 0.0, err)) < 0)
        goto out_writer;
    if (!s->tied &&
        (rc = add_tensor(&S, "output.weight", s->n_embd, p->n_vocab, emb_sd, err)) < 0)
        goto out_writer;
    rc = kvp_gguf_writer_write_file(S.w, path, err);
    if (rc == 0 && bytes_out)
        *bytes_out = S.bytes;

out_writer:
    kvp_gguf_writer_free(S.w);
out_pool:
    kvp_pool_free(S.pool);
out_vocab:
    kvp_vocab_free(v);
    for (int i = 0; i < S.n_bufs; i++)
        free(S.bufs[i]);
    free(S.bufs);
    return rc < 0 ? rc : 0;
}
