/* `kvpred info`: architecture, shapes, tensor types, tokenizer and memory needs of a model. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "kernels/types.h"
#include "kv/kvcache.h"
#include "model/model.h"
#include "tokenizer/vocab.h"

static void help(void)
{
    printf("usage: kvpred info -m MODEL [--tokenizer TOK.bin] [-c CTX] [--block N] [-ctk T] "
           "[-ctv T] [--json]\n\n"
           "Show architecture, shapes, tensor types, tokenizer and memory needs.\n"
           "KV memory is for keys and values of the types -ctk / -ctv (default f16) at context\n"
           "CTX (default: the model's), block padding included. Sliding-window layers (Gemma)\n"
           "hold a ring of their window plus one batch of 512 tokens, whatever the context;\n"
           "under a tiered KV store (--kv-tier) those rings stay in RAM and the store holds\n"
           "the global layers alone (kv_tier_bytes_at_ctx, before padding to 4 KiB units).\n");
}

/* What the command reports besides the model's own info: the KV cache's size and the types of
 * the weight matrices. */
struct model_summary {
    struct kvp_model_info in;
    long n_ctx;
    double kv_per_token, kv_per_layer, kv_at_ctx;
    double kv_tier_at_ctx; /* of kv_at_ctx, what a tiered store holds: the global layers' */
    const char *tk, *tv; /* the KV cache's key and value types */
    int n_local;         /* sliding-window layers */
    long ring_tokens;    /* tokens a sliding-window layer holds at most */
    const char *tok_model;
    int n_tokens;
    long type_count[KVP_TYPE_COUNT]; /* weight matrices per type */
};

/* The KV cache of the context the flags give: each layer holds kv_per_layer bytes a token, a
 * sliding-window layer at most its ring. */
static void summarize_kv(const kvp_model *m, const struct cli_model_opts *mo,
                         struct model_summary *s)
{
    s->n_ctx = mo->n_ctx > 0 ? mo->n_ctx : s->in.n_ctx_train;
    s->kv_per_token =
        (double)kvp_kv_bytes_per_token(m, mo->type_k, mo->type_v, (int)mo->block_size);
    s->tk = kvp_kv_type_name(mo->type_k);
    s->tv = kvp_kv_type_name(mo->type_v);
    s->kv_per_layer = s->kv_per_token / s->in.n_layer;
    int bs = mo->block_size > 0 ? (int)mo->block_size : 16;
    for (int l = 0; l < s->in.n_layer; l++)
        s->n_local += kvp_layer_is_local(&m->hp, l);
    long max_blocks = (s->n_ctx + bs - 1) / bs;
    s->ring_tokens =
        s->n_local ? (long)kvp_kvcache_ring_blocks(m->hp.n_swa, 512, bs, (int)max_blocks) * bs : 0;
    long ring = s->ring_tokens < s->n_ctx ? s->ring_tokens : s->n_ctx;
    s->kv_tier_at_ctx = s->kv_per_layer * (double)(s->in.n_layer - s->n_local) * (double)s->n_ctx;
    s->kv_at_ctx = s->kv_tier_at_ctx + s->kv_per_layer * (double)s->n_local * (double)ring;
}

/* The tokenizer and the count of weight matrices per tensor type. */
static void summarize_weights(const kvp_model *m, struct model_summary *s)
{
    s->tok_model = "none";
    if (m->vocab) {
        s->tok_model = kvp_vocab_kind(m->vocab) == KVP_VOCAB_SPM ? "llama (SentencePiece)" : "gpt2";
        s->n_tokens = kvp_vocab_n_tokens(m->vocab);
    }
    for (int l = 0; l < s->in.n_layer; l++) {
        const struct kvp_layer_weights *L = &m->layers[l];
        const struct kvp_mat *mats[] = {&L->wq,     &L->wk,   &L->wv,    &L->wo,
                                        &L->w_gate, &L->w_up, &L->w_down};
        for (size_t k = 0; k < 7; k++)
            s->type_count[mats[k]->type]++;
    }
    s->type_count[m->tok_embd.type]++;
    if (!m->tied_output)
        s->type_count[m->output.type]++;
}

/* --json: one object on stdout. */
static void print_json(const kvp_model *m, const struct model_summary *s)
{
    const struct kvp_model_info *in = &s->in;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arch", in->arch);
    cJSON_AddStringToObject(o, "name", in->name);
    cJSON_AddNumberToObject(o, "n_vocab", in->n_vocab);
    cJSON_AddNumberToObject(o, "n_embd", in->n_embd);
    cJSON_AddNumberToObject(o, "n_layer", in->n_layer);
    cJSON_AddNumberToObject(o, "n_head", in->n_head);
    cJSON_AddNumberToObject(o, "n_head_kv", in->n_head_kv);
    cJSON_AddNumberToObject(o, "head_dim", in->head_dim);
    cJSON_AddNumberToObject(o, "n_ff", in->n_ff);
    cJSON_AddNumberToObject(o, "n_ctx_train", in->n_ctx_train);
    cJSON_AddNumberToObject(o, "norm_eps", in->norm_eps);
    cJSON_AddNumberToObject(o, "rope_base", in->rope_base);
    cJSON_AddBoolToObject(o, "tied_output", in->tied_output);
    cJSON_AddNumberToObject(o, "n_params", (double)in->n_params);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)in->weight_bytes);
    cJSON *types = cJSON_AddObjectToObject(o, "matrix_types");
    for (int t = 0; t < KVP_TYPE_COUNT; t++)
        if (s->type_count[t])
            cJSON_AddNumberToObject(types, kvp_type_name(t), (double)s->type_count[t]);
    cJSON_AddStringToObject(o, "tokenizer", s->tok_model);
    cJSON_AddNumberToObject(o, "tokenizer_tokens", s->n_tokens);
    cJSON_AddStringToObject(o, "kv_type_k", s->tk);
    cJSON_AddStringToObject(o, "kv_type_v", s->tv);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", s->kv_per_token);
    cJSON_AddNumberToObject(o, "n_ctx", (double)s->n_ctx);
    cJSON_AddNumberToObject(o, "kv_bytes_at_ctx", s->kv_at_ctx);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token_per_layer", s->kv_per_layer);
    cJSON_AddNumberToObject(o, "n_global_layers", in->n_layer - s->n_local);
    cJSON_AddNumberToObject(o, "n_local_layers", s->n_local);
    cJSON_AddNumberToObject(o, "sliding_window", s->n_local ? m->hp.n_swa : 0);
    cJSON_AddNumberToObject(o, "local_ring_tokens", (double)s->ring_tokens);
    cJSON_AddNumberToObject(o, "kv_tier_bytes_at_ctx", s->kv_tier_at_ctx);
    char *txt = cJSON_Print(o);
    printf("%s\n", txt);
    cJSON_free(txt);
    cJSON_Delete(o);
}

/* The human-readable table. */
static void print_text(const kvp_model *m, const struct model_summary *s)
{
    const struct kvp_model_info *in = &s->in;
    printf("model          %s\n", in->name);
    printf("architecture   %s\n", in->arch);
    printf("parameters     %llu (%.2f MiB of weights)\n", (unsigned long long)in->n_params,
           in->weight_bytes / 1048576.0);
    printf("vocabulary     %d\n", in->n_vocab);
    printf("embedding      %d\n", in->n_embd);
    printf("layers         %d\n", in->n_layer);
    printf("heads          %d query, %d KV (GQA group %d), head_dim %d\n", in->n_head,
           in->n_head_kv, in->n_head / in->n_head_kv, in->head_dim);
    printf("feed-forward   %d\n", in->n_ff);
    printf("context        %d (training)\n", in->n_ctx_train);
    printf("rms_norm_eps   %g\n", in->norm_eps);
    printf("rope           %s, base %g%s\n",
           m->hp.rope_style == KVP_ROPE_NEOX ? "split halves" : "adjacent pairs", in->rope_base,
           m->hp.rope_scaling == KVP_ROPE_SCALING_YARN     ? ", YaRN"
           : m->hp.rope_scaling == KVP_ROPE_SCALING_LINEAR ? ", linear scaling"
           : m->rope_factors_short                         ? ", LongRoPE"
                                                           : "");
    printf("output         %s\n", in->tied_output ? "tied to token_embd" : "separate");
    printf("matrix types  ");
    for (int t = 0; t < KVP_TYPE_COUNT; t++)
        if (s->type_count[t])
            printf(" %s×%ld", kvp_type_name(t), s->type_count[t]);
    printf("\n");
    printf("tokenizer      %s, %d tokens\n", s->tok_model, s->n_tokens);
    printf("KV cache       %.0f bytes/token (K %s, V %s), %.2f MiB at context %ld\n",
           s->n_local ? s->kv_per_layer * (in->n_layer - s->n_local) : s->kv_per_token, s->tk,
           s->tv, s->kv_at_ctx / 1048576.0, s->n_ctx);
    if (s->n_local)
        printf("KV per layer   %.0f bytes/token; %d global layers grow with the context, %d "
               "sliding-window layers (window %d) hold at most %ld tokens each (%.2f MiB at "
               "context %ld where dense layers would take %.2f MiB)\n",
               s->kv_per_layer, in->n_layer - s->n_local, s->n_local, m->hp.n_swa, s->ring_tokens,
               s->kv_at_ctx / 1048576.0, s->n_ctx, s->kv_per_token * (double)s->n_ctx / 1048576.0);
    if (s->n_local)
        printf("KV tiers       a tiered store (--kv-tier) holds the %d global layers, %.2f MiB "
               "at context %ld; the sliding-window layers' rings (%.2f MiB) stay in RAM\n",
               in->n_layer - s->n_local, s->kv_tier_at_ctx / 1048576.0, s->n_ctx,
               (s->kv_at_ctx - s->kv_tier_at_ctx) / 1048576.0);
}

int cmd_info(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    bool json = false;
    const struct cli_flag flags[] = {CLI_BOOL("--json", &json), {0}};
    const struct cli_command cmd = {.name = "info", .mo = &mo, .flags = flags, .help = help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    kvp_model *m = cli_open_model(&mo);
    if (!m)
        return 1;
    struct model_summary s = {0};
    kvp_model_get_info(m, &s.in);
    summarize_kv(m, &mo, &s);
    summarize_weights(m, &s);
    if (json)
        print_json(m, &s);
    else
        print_text(m, &s);
    kvp_model_close(m);
    return 0;
}
