/*
 * libFuzzer target for the policy option strings (`--policy-opts`, kvp_policy_params.opts),
 * driven through the highest-level entry point that takes them, kvp_ctx_set_policy, so it keeps
 * working whichever module ends up parsing them.
 *
 * A tiny random model (3 layers, GQA 2:1, blocks of 4) and a matching tiny predictor file are
 * built at start (fixtures.h). Input: byte 0 picks the policy (quest, predictor, catekv with
 * predictor-driven adaptive heads, catekv with Quest-driven ones), byte 1 the token budget
 * (0..63), the rest, up to the first NUL, is the option string. Options the parser accepts must
 * give a policy that runs: a 20-token prefill and 4 decode steps. Refusals must be KVP_EINVAL
 * with a message.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "kvpred.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvp_model *model;
static kvp_ctx *ctx;
static char pred_path[64];

static void remove_predictor(void)
{
    unlink(pred_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct kvp_err err = {0};
    model = fz_tiny_model();
    snprintf(pred_path, sizeof(pred_path), "/tmp/kvpred-fuzz-%ld.kvpp", (long)getpid());
    struct kvp_ctx_params cp = {.n_ctx = 64, .n_threads = 1, .block_size = 4};
    if (!model || fz_write_predictor(pred_path, 4) < 0 ||
        kvp_ctx_init(model, &cp, &ctx, &err) < 0) {
        fprintf(stderr, "fuzz_policy_opts: setup failed: %s\n", err.msg);
        abort();
    }
    atexit(remove_predictor);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    char *opts = malloc(size - 1);
    if (!opts)
        return 0;
    memcpy(opts, data + 2, size - 2);
    opts[size - 2] = 0;

    struct kvp_policy_params p = {.budget = data[1] & 63, .sink = 2, .local = 2, .window = 4,
                                  .dense_layers = 1, .opts = opts};
    switch (data[0] & 3) {
    case 0:
        p.name = "quest";
        break;
    case 1:
        p.name = "predictor";
        p.aux_path = pred_path;
        break;
    case 2:
        p.name = "catekv";
        p.adaptive_mode = KVP_ADAPTIVE_PREDICTOR;
        p.aux_path = pred_path;
        break;
    default:
        p.name = "catekv";
        p.adaptive_mode = KVP_ADAPTIVE_QUEST;
        break;
    }
    struct kvp_err err = {0};
    int rc = kvp_ctx_set_policy(ctx, &p, &err);
    if (rc < 0 && (rc != KVP_EINVAL || !err.msg[0]))
        abort();
    if (rc == 0) {
        int32_t toks[24];
        for (int i = 0; i < 24; i++)
            toks[i] = (i * 7 + 3) % 32;
        if (kvp_eval(ctx, toks, 20, NULL, false, &err) < 0)
            abort();
        for (int i = 20; i < 24; i++)
            if (kvp_eval(ctx, toks + i, 1, NULL, false, &err) < 0)
                abort();
    }
    kvp_ctx_set_policy(ctx, NULL, &err); /* release the policy's state before the next input */
    free(opts);
    return 0;
}
