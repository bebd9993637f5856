/* Load a model, tokenize a prompt, and generate greedily while quest reads 64 tokens of the
 * KV cache per (layer, KV head) at each step.  cc generate.c $(pkg-config --cflags --libs kvpred) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <kvpred.h>

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/kvpred-default.gguf";
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    struct kvp_err err = {0};
    kvp_model *model = NULL;
    kvp_ctx *ctx = NULL;
    if (kvp_model_open(path, NULL, &model, &err) != 0 ||
        kvp_ctx_init(model, &(struct kvp_ctx_params){.n_ctx = 1024}, &ctx, &err) != 0 ||
        kvp_ctx_set_policy(ctx, &(struct kvp_policy_params){.name = "quest", .budget = 64},
                           &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        kvp_model_close(model);
        return 1;
    }
    struct kvp_model_info info;
    kvp_model_get_info(model, &info);
    int32_t ids[256];
    size_t n = 0;
    float *logits = malloc(sizeof(float) * (size_t)info.n_vocab);
    int rc = logits ? kvp_tokenize(model, prompt, strlen(prompt), true, ids, 256, &n, &err) : -1;
    for (int step = 0; rc == 0 && step < 32; step++) {
        /* The first call runs the whole prompt; each later call one generated token. */
        rc = kvp_eval(ctx, step ? &ids[0] : ids, step ? 1 : (int)n, logits, false, &err);
        int best = 0;
        for (int v = 1; rc == 0 && v < info.n_vocab; v++)
            if (logits[v] > logits[best]) best = v;
        if (rc != 0 || kvp_token_is_eog(model, best)) break;
        char piece[64];
        size_t len = kvp_token_to_piece(model, step ? ids[0] : ids[n - 1], best, piece, sizeof piece);
        fwrite(piece, 1, len, stdout);
        ids[0] = best;
    }
    putchar('\n');
    if (rc != 0) fprintf(stderr, "error: %s\n", err.msg);
    free(logits);
    kvp_ctx_free(ctx);
    kvp_model_close(model);
    return rc != 0;
}
