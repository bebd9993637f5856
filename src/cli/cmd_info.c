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
           "hold a ring of their window plus one batch of 512 tokens, whatever the context.\n");
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
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    long n_ctx = mo.n_ctx > 0 ? mo.n_ctx : in.n_ctx_train;
    double kv_per_token =
        (double)kvp_kv_bytes_per_token(m, mo.type_k, mo.type_v, (int)mo.block_size);
    const char *tk = kvp_kv_type_name(mo.type_k), *tv = kvp_kv_type_name(mo.type_v);
    /* each layer holds kv_per_layer bytes a token; a sliding-window layer at most its ring */
    double kv_per_layer = kv_per_token / in.n_layer;
    int n_local = 0, bs = mo.block_size > 0 ? (int)mo.block_size : 16;
    for (int l = 0; l < in.n_layer; l++)
        n_local += kvp_layer_is_local(&m->hp, l);
    long max_blocks = (n_ctx + bs - 1) / bs;
    long ring_tokens = n_local ? (long)kvp_kvcache_ring_blocks(m->hp.n_swa, 512, bs,
                                                               (int)max_blocks) * bs
                               : 0;
    double kv_at_ctx = kv_per_layer * ((double)(in.n_layer - n_local) * (double)n_ctx +
                                       (double)n_local * (double)(ring_tokens < n_ctx ? ring_tokens
                                                                                      : n_ctx));
    const char *tok_model = "none";
    int n_tokens = 0;
    if (m->vocab) {
        tok_model = kvp_vocab_kind(m->vocab) == KVP_VOCAB_SPM ? "llama (SentencePiece)" : "gpt2";
        n_tokens = kvp_vocab_n_tokens(m->vocab);
    }
    /* count tensor types over the weight matrices */
    long type_count[KVP_TYPE_COUNT] = {0};
    for (int l = 0; l < in.n_layer; l++) {
        const struct kvp_layer_weights *L = &m->layers[l];
        const struct kvp_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                        &L->w_down};
        for (size_t k = 0; k < 7; k++)
            type_count[mats[k]->type]++;
    }
    type_count[m->tok_embd.type]++;
    if (!m->tied_output)
        type_count[m->output.type]++;

    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "arch", in.arch);
        cJSON_AddStringToObject(o, "name", in.name);
        cJSON_AddNumberToObject(o, "n_vocab", in.n_vocab);
        cJSON_AddNumberToObject(o, "n_embd", in.n_embd);
        cJSON_AddNumberToObject(o, "n_layer", in.n_layer);
        cJSON_AddNumberToObject(o, "n_head", in.n_head);
        cJSON_AddNumberToObject(o, "n_head_kv", in.n_head_kv);
        cJSON_AddNumberToObject(o, "head_dim", in.head_dim);
        cJSON_AddNumberToObject(o, "n_ff", in.n_ff);
        cJSON_AddNumberToObject(o, "n_ctx_train", in.n_ctx_train);
        cJSON_AddNumberToObject(o, "norm_eps", in.norm_eps);
        cJSON_AddNumberToObject(o, "rope_base", in.rope_base);
        cJSON_AddBoolToObject(o, "tied_output", in.tied_output);
        cJSON_AddNumberToObject(o, "n_params", (double)in.n_params);
        cJSON_AddNumberToObject(o, "weight_bytes", (double)in.weight_bytes);
        cJSON *types = cJSON_AddObjectToObject(o, "matrix_types");
        for (int t = 0; t < KVP_TYPE_COUNT; t++)
            if (type_count[t])
                cJSON_AddNumberToObject(types, kvp_type_name(t), (double)type_count[t]);
        cJSON_AddStringToObject(o, "tokenizer", tok_model);
        cJSON_AddNumberToObject(o, "tokenizer_tokens", n_tokens);
        cJSON_AddStringToObject(o, "kv_type_k", tk);
        cJSON_AddStringToObject(o, "kv_type_v", tv);
        cJSON_AddNumberToObject(o, "kv_bytes_per_token", kv_per_token);
        cJSON_AddNumberToObject(o, "n_ctx", (double)n_ctx);
        cJSON_AddNumberToObject(o, "kv_bytes_at_ctx", kv_at_ctx);
        cJSON_AddNumberToObject(o, "kv_bytes_per_token_per_layer", kv_per_layer);
        cJSON_AddNumberToObject(o, "n_global_layers", in.n_layer - n_local);
        cJSON_AddNumberToObject(o, "n_local_layers", n_local);
        cJSON_AddNumberToObject(o, "sliding_window", n_local ? m->hp.n_swa : 0);
        cJSON_AddNumberToObject(o, "local_ring_tokens", (double)ring_tokens);
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(o);
    } else {
        printf("model          %s\n", in.name);
        printf("architecture   %s\n", in.arch);
        printf("parameters     %llu (%.2f MiB of weights)\n", (unsigned long long)in.n_params,
               in.weight_bytes / 1048576.0);
        printf("vocabulary     %d\n", in.n_vocab);
        printf("embedding      %d\n", in.n_embd);
        printf("layers         %d\n", in.n_layer);
        printf("heads          %d query, %d KV (GQA group %d), head_dim %d\n", in.n_head,
               in.n_head_kv, in.n_head / in.n_head_kv, in.head_dim);
        printf("feed-forward   %d\n", in.n_ff);
        printf("context        %d (training)\n", in.n_ctx_train);
        printf("rms_norm_eps   %g\n", in.norm_eps);
        printf("rope           %s, base %g%s\n",
               m->hp.rope_style == KVP_ROPE_NEOX ? "split halves" : "adjacent pairs",
               in.rope_base,
               m->hp.rope_scaling == KVP_ROPE_SCALING_YARN     ? ", YaRN"
               : m->hp.rope_scaling == KVP_ROPE_SCALING_LINEAR ? ", linear scaling"
               : m->rope_factors_short                         ? ", LongRoPE"
                                                               : "");
        printf("output         %s\n", in.tied_output ? "tied to token_embd" : "separate");
        printf("matrix types  ");
        for (int t = 0; t < KVP_TYPE_COUNT; t++)
            if (type_count[t])
                printf(" %s×%ld", kvp_type_name(t), type_count[t]);
        printf("\n");
        printf("tokenizer      %s, %d tokens\n", tok_model, n_tokens);
        printf("KV cache       %.0f bytes/token (K %s, V %s), %.2f MiB at context %ld\n",
               n_local ? kv_per_layer * (in.n_layer - n_local) : kv_per_token, tk, tv,
               kv_at_ctx / 1048576.0, n_ctx);
        if (n_local)
            printf("KV per layer   %.0f bytes/token; %d global layers grow with the context, %d "
                   "sliding-window layers (window %d) hold at most %ld tokens each (%.2f MiB at "
                   "context %ld where dense layers would take %.2f MiB)\n",
                   kv_per_layer, in.n_layer - n_local, n_local, m->hp.n_swa, ring_tokens,
                   kv_at_ctx / 1048576.0, n_ctx, kv_per_token * (double)n_ctx / 1048576.0);
    }
    kvp_model_close(m);
    return 0;
}
